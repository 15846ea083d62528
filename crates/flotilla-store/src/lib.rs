//! Durable storage behind one interface: resources with eTags, each run's input log, recorded
//! upgrade intents, the event log, API tokens, and what replicas sharing a database coordinate
//! with (fleet leases with a fencing epoch, actions handed to a fleet's owner, notices). SQLite
//! serves one replica; PostgreSQL ([`postgres::PgStore`]) several.
//!
//! Every write that drives a run (log entries, intents, events, the run's status, the results of
//! actions) goes in one transaction ([`RunBatch`]), so a crash leaves either all of a batch or
//! none of it; with a [`Fence`], the transaction first checks that its writer still holds the
//! fleet's lease at the same epoch.

mod migrate;
pub mod postgres;
mod shared;
mod sql;
pub mod sqlite;

pub use shared::SqlStore;
pub use sqlite::SqliteStore;

/// Rows one multi-row INSERT carries: well inside both backends' limits on bound parameters
/// (SQLite's 32,766, PostgreSQL's 65,535) at eight columns.
const ROWS_PER_INSERT: usize = 500;

/// The most events stored in one row ([`sql::Statements::events_after`]): reading the last
/// events of a run unpacks at most this many.
const EVENTS_PER_PACK: usize = 1000;

/// The store's traits, for callers holding a `dyn Store`.
pub mod prelude {
    pub use crate::{Audit, Coordination, Resources, RunLog, Store, Tokens, Webhooks};
}

use std::collections::HashMap;
use std::time::Duration;

use flotilla_engine::time::Time;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row;
use tokio::sync::broadcast;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// An `If-Match` / `If-None-Match` precondition did not hold.
    #[error("precondition failed: {0}")]
    Precondition(String),
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Unavailable(String),
    /// The writer no longer holds the fleet's lease at the epoch it wrote with.
    #[error("lease lost: {0}")]
    Fenced(String),
    /// The run was replaced or deleted since the writer loaded it.
    #[error("{0}")]
    Superseded(String),
    /// The database ended the write's transaction for a reason of its own, not the request's
    /// (a deadlock it broke, a serialization failure, a session it ended), again on every
    /// attempt: nothing was written, and the same request may be sent again.
    #[error("{0}")]
    Busy(String),
    /// A member write the fleet's data refuses: its cluster id is another member's, it would
    /// change a member's cluster id, or (creating only) the member exists. `item` is its index
    /// in the batch, `field` the path inside the item.
    #[error("{message}")]
    Refused {
        item: usize,
        field: &'static str,
        conflict: bool,
        message: String,
    },
}

impl StoreError {
    /// Whether the store was closed (the server is shutting down): a background loop that meets
    /// it ends quietly instead of warning of it.
    pub fn is_closed(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::PoolClosed))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Resource kinds, as they appear in paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Fleet,
    Member,
    Strategy,
    Run,
    Gate,
    Profile,
    /// What a run was created from (its members' clusters, the catalog): kept apart from the
    /// run so that the run's frequent status writes do not rewrite it.
    RunSnapshot,
    /// A check provider (SEMANTICS §10): server-wide, stored under the fleet `""`, which no
    /// fleet can be named.
    CheckProvider,
    /// A fleet's freeze (SEMANTICS §12).
    Freeze,
    /// A fleet's disruption budget (SEMANTICS §12).
    DisruptionBudget,
    /// An identity provider made through the API (server-wide, under the fleet `""`).
    IdentityProvider,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Fleet => "fleets",
            Kind::Member => "members",
            Kind::Strategy => "updateStrategies",
            Kind::Run => "updateRuns",
            Kind::Gate => "gates",
            Kind::Profile => "autoUpgradeProfiles",
            Kind::RunSnapshot => "updateRunSnapshots",
            Kind::CheckProvider => "checkProviders",
            Kind::Freeze => "freezes",
            Kind::DisruptionBudget => "disruptionBudgets",
            Kind::IdentityProvider => "identityProviders",
        }
    }
}

/// One member to register (API.md, "Batch registration").
#[derive(Clone, Debug)]
pub struct MemberWrite {
    pub name: String,
    /// The member's body; its `properties.status` is replaced by the stored member's, if any
    /// (what was observed of the cluster stays).
    pub body: Value,
    pub when: Precondition,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterMode {
    /// An existing member is refused.
    Create,
    /// An existing member is replaced (its cluster id cannot change).
    Upsert,
}

/// What a registration wrote: each item's new eTag and whether it created the member.
#[derive(Clone, Debug, Default)]
pub struct Registered {
    pub written: Vec<(String, bool)>,
}

/// How cluster ids are compared within a fleet: case-insensitively, as ARM ids are.
pub fn cluster_key(id: &str) -> String {
    id.to_ascii_lowercase()
}

/// The cluster id a member body carries.
pub fn member_cluster_id(body: &Value) -> &str {
    body["properties"]["clusterResourceId"]
        .as_str()
        .unwrap_or_default()
}

/// The stored member an item replaces, checked against the item: returns the body to store.
/// One rule for both backends.
fn merge_member(
    item: usize,
    write: &MemberWrite,
    current: Option<&str>,
    mode: RegisterMode,
) -> StoreResult<Value> {
    let mut body = write.body.clone();
    let Some(text) = current else {
        return Ok(body);
    };
    if mode == RegisterMode::Create {
        return Err(StoreError::Refused {
            item,
            field: "name",
            conflict: true,
            message: format!(
                "name {:?}: the member already exists (mode Create; Upsert replaces it)",
                write.name
            ),
        });
    }
    let stored = parse_body(text)?;
    let (old, new) = (member_cluster_id(&stored), member_cluster_id(&write.body));
    if cluster_key(old) != cluster_key(new) {
        return Err(StoreError::Refused {
            item,
            field: "properties.clusterResourceId",
            conflict: false,
            message: format!(
                "properties.clusterResourceId {new:?}: a member's cluster cannot be changed (it is {old:?})"
            ),
        });
    }
    body["properties"]["status"] = stored["properties"]["status"].clone();
    keep_creation(&mut body, &stored);
    Ok(body)
}

/// A registration decided against what the store holds of the members and cluster ids it
/// touches, item by item in order (an item sees the items before it): one rule for both
/// backends, which read what it needs in a few statements and write what it decides.
#[derive(Debug, Default)]
struct RegistrationPlan {
    /// Per item: the member's name, the body to store, and whether it creates the member.
    items: Vec<(String, String, bool)>,
    /// Cluster ids the registration claims: `(cluster key, member, item)`.
    claims: Vec<(String, String, usize)>,
}

impl RegistrationPlan {
    /// The cluster keys of the items, to read their holders with.
    fn keys(writes: &[MemberWrite]) -> Vec<String> {
        writes
            .iter()
            .map(|w| cluster_key(member_cluster_id(&w.body)))
            .collect()
    }

    /// `stored`: each existing member among the items' names, as `(body, eTag)`; `holders`:
    /// the member holding each cluster key among the items'.
    fn decide(
        writes: &[MemberWrite],
        mode: RegisterMode,
        stored: &HashMap<String, (String, String)>,
        holders: &HashMap<String, String>,
    ) -> StoreResult<RegistrationPlan> {
        let mut plan = RegistrationPlan::default();
        // What earlier items of this registration wrote: their eTag is not made yet, so it
        // matches no `If-Match` but the wildcard.
        let mut written: HashMap<&str, usize> = Default::default();
        let mut claimed: HashMap<String, &str> = Default::default();
        for (item, write) in writes.iter().enumerate() {
            let current = match written.get(write.name.as_str()) {
                Some(&earlier) => Some((plan.items[earlier].1.as_str(), "")),
                None => stored
                    .get(&write.name)
                    .map(|(body, etag)| (body.as_str(), etag.as_str())),
            };
            check(current.map(|c| c.1), &write.when)?;
            let body = merge_member(item, write, current.map(|c| c.0), mode)?;
            let id = member_cluster_id(&body);
            let key = cluster_key(id);
            let holder = claimed
                .get(&key)
                .copied()
                .or_else(|| holders.get(&key).map(String::as_str));
            match holder {
                Some(other) if other != write.name => return Err(cluster_taken(item, id, other)),
                Some(_) => {}
                None => {
                    claimed.insert(key.clone(), &write.name);
                    plan.claims.push((key, write.name.clone(), item));
                }
            }
            written.insert(&write.name, item);
            plan.items
                .push((write.name.clone(), body.to_string(), current.is_none()));
        }
        Ok(plan)
    }
}

/// The refusal of a cluster id another member already has.
fn cluster_taken(item: usize, id: &str, other: &str) -> StoreError {
    StoreError::Refused {
        item,
        field: "properties.clusterResourceId",
        conflict: true,
        message: format!(
            "properties.clusterResourceId {id:?}: member {other:?} of this fleet already has this cluster"
        ),
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub name: String,
    pub body: Value,
    pub etag: String,
}

/// A write's condition on the current eTag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Precondition {
    None,
    /// `If-Match`: the resource exists with this eTag (`*`: exists at all).
    IfMatch(String),
    /// `If-None-Match: *`: the resource does not exist.
    IfNoneMatchAny,
}

/// An upgrade the run decided to send, recorded before the driver is called (SEMANTICS §7).
#[derive(Clone, Debug, PartialEq)]
pub struct Intent {
    pub attempt: u64,
    pub member: String,
    pub target: Value,
    pub operation_id: Option<String>,
    pub finished: bool,
    /// When the intent was recorded, just before its send: an operation's deadline counts
    /// from here across restarts and takeovers. `None` for intents recorded before it was kept.
    pub recorded_at: Option<Time>,
}

/// Everything one reconciler step writes for a run, in one transaction.
#[derive(Clone, Debug, Default)]
pub struct RunBatch {
    pub fleet: String,
    pub run: String,
    /// Input-log entries, in order, as JSON text.
    pub log: Vec<String>,
    /// The run's checkpoint after this batch's last log entry, which replaces the log before
    /// it (a batch with a checkpoint carries log entries).
    pub checkpoint: Option<String>,
    pub intents: Vec<Intent>,
    pub finished_attempts: Vec<u64>,
    pub events: Vec<Value>,
    /// The run resource's new document (its status), if it changed: its frame and the chunks
    /// of its members that changed ([`RunDocument`]).
    pub run_body: Option<RunDocument>,
    /// The run's head (a small text the server reads instead of the whole document), written
    /// with its body.
    pub run_head: Option<String>,
    /// Gate resources created or changed.
    pub gates: Vec<(String, Value)>,
    /// Upgrades that succeeded in this batch, with how long each took: the history a
    /// forecast reads (SEMANTICS §11).
    pub durations: Vec<UpgradeDuration>,
    /// Results of actions handed over through the store ([`Store::submit_action`]).
    pub action_results: Vec<(i64, Value)>,
    /// Written only if the writer still holds the fleet's lease at this epoch.
    pub fence: Option<Fence>,
    /// Written only if the run's snapshot still has this eTag (the run was not replaced or
    /// deleted since its writer loaded it).
    pub snapshot_etag: Option<String>,
}

/// How long one member's upgrade of one type took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradeDuration {
    pub member: String,
    /// `Full`, `ControlPlaneOnly` or `NodeImageOnly`.
    pub upgrade_type: String,
    pub seconds: i64,
    pub finished_at: Time,
}

/// The durations a forecast reads for one upgrade type: each member's last five, newest
/// first, and the fleet's last fifty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurationHistory {
    pub members: HashMap<String, Vec<i64>>,
    pub fleet: Vec<i64>,
}

/// How many of its own upgrades a member's history keeps for a forecast, and the fleet's.
pub const MEMBER_HISTORY: usize = 5;
pub const FLEET_HISTORY: usize = 50;

/// A run's input log as read: the checkpoint and the entries after it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredLog {
    pub checkpoint: Option<String>,
    pub entries: Vec<String>,
}

/// Refuses a batch whose checkpoint covers no entry of its own: a checkpoint is taken after
/// the entries it is written with.
fn checkpoint_needs_entries(batch: &RunBatch) -> StoreResult<()> {
    if batch.checkpoint.is_some() && batch.log.is_empty() {
        return Err(StoreError::Unavailable(format!(
            "run {:?}: a checkpoint is written with the log entries it follows",
            batch.run
        )));
    }
    Ok(())
}

/// A run's document as a status write stores it (FLEET-DESIGN.md, persistence by change): the
/// frame, which is the document with every group's `members` list empty, cut where those lists
/// go, and the members' statuses in chunks, of which a write carries only those that changed.
/// A run of 100,000 members is about 200 chunks; a step that changes a few members writes the
/// frame and a chunk or two. The stored document reads as [`assemble`] puts it together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunDocument {
    /// The document around the members' lists: one piece more than the lists (the status's
    /// groups), each list going between two pieces.
    pub frame: Vec<String>,
    /// How many chunks the document has in all; stored chunks from this index on are dropped.
    pub chunks: u32,
    /// The chunks written now: those that changed, or all of them.
    pub changed: Vec<Chunk>,
}

/// A part of one group's `members` list: member statuses as JSON, separated by commas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Its place among the document's chunks, which follow the document's order.
    pub index: u32,
    /// The list it belongs to: between `frame[slot]` and `frame[slot + 1]`.
    pub slot: u32,
    pub text: String,
}

/// A run's document from its frame and all its chunks, in index order: each list's chunks
/// joined by commas between its two pieces of the frame. Anything but chunks `0..count`, each
/// in a list of the frame and in the frame's order, is an error naming what is wrong.
pub fn assemble(
    frame: &[String],
    count: u32,
    chunks: impl IntoIterator<Item = (u32, u32, String)>,
) -> StoreResult<String> {
    let corrupt = |what: String| StoreError::Corrupt(format!("a run's stored document: {what}"));
    let lists = frame
        .len()
        .checked_sub(1)
        .ok_or_else(|| corrupt("an empty frame".into()))?;
    let chunks: Vec<(u32, u32, String)> = chunks.into_iter().collect();
    // Sized once: the document is megabytes, and growing it step by step copies it again.
    let size = frame.iter().map(String::len).sum::<usize>()
        + chunks
            .iter()
            .map(|(_, _, text)| text.len() + 1)
            .sum::<usize>();
    let mut out = String::with_capacity(size);
    out.push_str(&frame[0]);
    let mut list = 0usize;
    let mut in_list = 0usize;
    let mut expected = 0u32;
    for (index, slot, text) in chunks {
        if index != expected {
            return Err(corrupt(format!(
                "chunk {expected} is missing (found {index})"
            )));
        }
        expected += 1;
        let slot = slot as usize;
        if slot < list || slot >= lists {
            return Err(corrupt(format!(
                "chunk {index} is in list {slot}, out of order or past the frame's {lists}"
            )));
        }
        while list < slot {
            list += 1;
            in_list = 0;
            out.push_str(&frame[list]);
        }
        if in_list > 0 {
            out.push(',');
        }
        out.push_str(&text);
        in_list += 1;
    }
    if expected != count {
        return Err(corrupt(format!("{expected} chunks of {count}")));
    }
    for piece in &frame[list + 1..] {
        out.push_str(piece);
    }
    Ok(out)
}

/// One row of a read of runs with their chunks: the resource's name, body, packed body, eTag
/// and chunk count, then one chunk's index, list, body and packed body (all `None` when the
/// document is stored whole).
type PartRow = (
    String,
    String,
    Option<Vec<u8>>,
    String,
    Option<i64>,
    Option<(i64, i64, String, Option<Vec<u8>>)>,
);

/// Runs' `(name, text, etag)` from rows of [`PartRow`], ordered by name then chunk.
fn assemble_rows(rows: Vec<PartRow>) -> StoreResult<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    let mut rows = rows.into_iter().peekable();
    while let Some((name, body, packed, etag, count, first)) = rows.next() {
        let text = unpack(body, packed)?;
        let Some(count) = count else {
            out.push((name, text, etag));
            continue;
        };
        let frame: Vec<String> = serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("run {name}: its frame: {e}")))?;
        let mut chunks = Vec::new();
        let mut next = first;
        loop {
            if let Some((index, slot, body, packed)) = next {
                let number = |v: i64| {
                    u32::try_from(v).map_err(|_| {
                        StoreError::Corrupt(format!("run {name}: a chunk numbered {v}"))
                    })
                };
                chunks.push((number(index)?, number(slot)?, unpack(body, packed)?));
            }
            match rows.peek() {
                Some(row) if row.0 == name => next = rows.next().and_then(|r| r.5),
                _ => break,
            }
        }
        let count = u32::try_from(count)
            .map_err(|_| StoreError::Corrupt(format!("run {name}: {count} chunks")))?;
        let text = assemble(&frame, count, chunks)
            .map_err(|e| StoreError::Corrupt(format!("run {name}: {e}")))?;
        out.push((name, text, etag));
    }
    Ok(out)
}

/// A fleet lease as its holder knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub owner: String,
    pub epoch: i64,
}

/// A fleet's lease: which replica drives its runs, from which epoch, until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub fleet: String,
    pub owner: String,
    pub epoch: i64,
    /// Milliseconds until it expires, by the database's clock (negative: expired).
    pub expires_in_ms: i64,
}

/// An action on a run handed to the replica that drives its fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingAction {
    pub id: i64,
    pub run: String,
    pub input: Value,
}

/// Something changed in the store that other tasks (or replicas) may want to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A run's event log grew.
    Events { fleet: String, run: String },
    /// An action was handed to a fleet's owner.
    Actions { fleet: String },
    /// An action's result was recorded.
    Reply { id: i64 },
}

impl Notice {
    fn to_payload(&self) -> String {
        match self {
            Notice::Events { fleet, run } => serde_json::json!({"events": [fleet, run]}),
            Notice::Actions { fleet } => serde_json::json!({"actions": fleet}),
            Notice::Reply { id } => serde_json::json!({"reply": id}),
        }
        .to_string()
    }

    fn from_payload(text: &str) -> Option<Notice> {
        let v: Value = serde_json::from_str(text).ok()?;
        if let Some([fleet, run]) = v["events"].as_array().map(Vec::as_slice) {
            return Some(Notice::Events {
                fleet: fleet.as_str()?.to_string(),
                run: run.as_str()?.to_string(),
            });
        }
        if let Some(fleet) = v["actions"].as_str() {
            return Some(Notice::Actions {
                fleet: fleet.to_string(),
            });
        }
        v["reply"].as_i64().map(|id| Notice::Reply { id })
    }

    /// The notices a committed batch gives.
    fn of_batch(batch: &RunBatch) -> Vec<Notice> {
        let mut notices: Vec<Notice> = batch
            .action_results
            .iter()
            .map(|(id, _)| Notice::Reply { id: *id })
            .collect();
        if !batch.events.is_empty() {
            notices.push(Notice::Events {
                fleet: batch.fleet.clone(),
                run: batch.run.clone(),
            });
        }
        notices
    }
}

/// The wall clock in Unix milliseconds: when an outbox row is made.
fn unix_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn millis(ttl: std::time::Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}

fn same_run(batch: &RunBatch, found: Option<String>) -> StoreResult<()> {
    match &batch.snapshot_etag {
        Some(expected) if found.as_ref() != Some(expected) => Err(StoreError::Superseded(format!(
            "update run {:?} was replaced or deleted",
            batch.run
        ))),
        _ => Ok(()),
    }
}

fn fenced(batch: &RunBatch, found: Option<(String, i64)>) -> StoreResult<()> {
    let Some(fence) = &batch.fence else {
        return Ok(());
    };
    match found {
        Some((owner, epoch)) if owner == fence.owner && epoch == fence.epoch => Ok(()),
        Some((owner, epoch)) => Err(StoreError::Fenced(format!(
            "fleet {:?} is held by {owner} at epoch {epoch}, not by {} at epoch {}",
            batch.fleet, fence.owner, fence.epoch
        ))),
        None => Err(StoreError::Fenced(format!(
            "fleet {:?} has no lease",
            batch.fleet
        ))),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    pub hash: String,
    pub role: String,
    pub subject: String,
    pub created_at: i64,
    pub revoked: bool,
}

/// Everything the server stores, by concern: resources, runs' logs, tokens, and what replicas
/// coordinate with. Both backends implement all four; the conformance suite runs on each.
pub trait Store: Resources + RunLog + Tokens + Coordination + Audit + Webhooks {}

impl<T: Resources + RunLog + Tokens + Coordination + Audit + Webhooks> Store for T {}

/// Resources with eTags: fleets, members, strategies, runs, profiles, gates.
#[async_trait]
pub trait Resources: Send + Sync {
    async fn get(&self, fleet: &str, kind: Kind, name: &str) -> StoreResult<Option<Resource>> {
        self.get_raw(fleet, kind, name)
            .await?
            .map(|(text, etag)| {
                Ok(Resource {
                    name: name.to_string(),
                    body: parse_body(&text)?,
                    etag,
                })
            })
            .transpose()
    }
    /// A resource's body as stored (JSON text) and its eTag, unparsed: large bodies (a run's
    /// status) are answered without building them in memory.
    async fn get_raw(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
    ) -> StoreResult<Option<(String, String)>>;
    /// A resource's eTag alone, its body not read: whether a copy of it is still current.
    async fn etag(&self, fleet: &str, kind: Kind, name: &str) -> StoreResult<Option<String>>;
    /// Like [`Resources::list`], bodies as stored (JSON text), unparsed: (name, body, eTag).
    async fn list_raw(
        &self,
        fleet: &str,
        kind: Kind,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<(String, String, String)>>;
    /// Resources of a kind in name order, after `after`, at most `limit`.
    async fn list(
        &self,
        fleet: &str,
        kind: Kind,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<Resource>>;
    /// Creates or replaces; returns the stored resource and whether it was created.
    async fn put(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
        body: &Value,
        when: &Precondition,
    ) -> StoreResult<(Resource, bool)> {
        let (etag, created) = self
            .put_raw(fleet, kind, name, &body.to_string(), when)
            .await?;
        let resource = Resource {
            name: name.to_string(),
            body: body.clone(),
            etag,
        };
        Ok((resource, created))
    }
    /// Creates or replaces with a body given as JSON text (a large run's document is rendered
    /// straight to text, never built as a tree); returns the new eTag and whether it was
    /// created.
    async fn put_raw(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
        text: &str,
        when: &Precondition,
    ) -> StoreResult<(String, bool)>;
    /// Deletes; returns whether it existed. A run's log, intents, events and gates go with it; a
    /// fleet's children go with the fleet.
    async fn delete(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
        when: &Precondition,
    ) -> StoreResult<bool>;
    /// Ends the store's use at a clean shutdown: SQLite moves its write-ahead log into the
    /// database file, so the `.db` file alone holds everything.
    async fn close(&self) {}
    /// Creates or replaces members in one transaction, all or nothing; a member's cluster id
    /// is unique in its fleet, compared case-insensitively (API.md, "Batch registration").
    async fn register_members(
        &self,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered>;
    /// Sets `properties.status` of existing resources of a kind, all in one transaction (a
    /// fleet's clusters as its engine now sees them, say); one that no longer exists is
    /// skipped. Each written resource gets a new eTag.
    async fn set_statuses(
        &self,
        fleet: &str,
        kind: Kind,
        statuses: &[(String, Value)],
    ) -> StoreResult<()>;
}

/// What a status keeps of the one it replaces unless it says otherwise: a member's last
/// operation outlives the observations that follow it.
const KEPT_STATUS_FIELDS: [&str; 3] = ["lastOperationId", "lastOperationError", "discovery"];

/// A stored body with its `properties.status` replaced, but for the fields the old status keeps
/// ([`KEPT_STATUS_FIELDS`]). One rule for both backends.
fn with_status(text: &str, status: &Value) -> StoreResult<Value> {
    let mut body = parse_body(text)?;
    let old = body["properties"]["status"].take();
    let mut status = status.clone();
    if let Some(new) = status.as_object_mut() {
        for key in KEPT_STATUS_FIELDS {
            if !new.contains_key(key)
                && let Some(v) = old.get(key)
            {
                new.insert(key.to_string(), v.clone());
            }
        }
    }
    body["properties"]["status"] = status;
    Ok(body)
}

/// `systemData`'s creation (who and when) kept from the stored body a new one replaces.
pub fn keep_creation(body: &mut Value, stored: &Value) {
    let old = &stored["systemData"];
    if old["createdAt"].is_string() && body["systemData"].is_object() {
        for key in ["createdBy", "createdByType", "createdAt"] {
            body["systemData"][key] = old[key].clone();
        }
    }
}

/// What drives a run: its input log, its recorded intents, its events, written in batches.
#[async_trait]
pub trait RunLog: Send + Sync {
    async fn write_run_batch(&self, batch: &RunBatch) -> StoreResult<()>;
    /// Several runs' batches in one transaction (one sync to disk): a batch whose run was
    /// replaced or deleted is refused alone (`Superseded`, in its place in the answer); any
    /// other error, the loss of the fleet's lease included, writes none of them.
    async fn write_run_batches(&self, batches: &[RunBatch]) -> StoreResult<Vec<StoreResult<()>>>;
    /// Every run of a fleet by name, with its head where one was written (runs stored before
    /// heads existed, and a run just created or replaced, have none).
    async fn run_heads(&self, fleet: &str) -> StoreResult<Vec<(String, Option<String>)>>;
    /// Sets a run's head if the run exists and has none: a head written with a batch is newer
    /// than one made from a document read earlier.
    async fn init_run_head(&self, fleet: &str, run: &str, head: &str) -> StoreResult<()>;
    /// A run's input log as stored: its last checkpoint, if one was written, and the entries
    /// written after it, in order (the server's journal codec reads them without building
    /// JSON trees). Both are read in one snapshot.
    async fn run_log(&self, fleet: &str, run: &str) -> StoreResult<StoredLog>;
    async fn run_events(
        &self,
        fleet: &str,
        run: &str,
        after: i64,
        limit: usize,
    ) -> StoreResult<Vec<(i64, Value)>>;
    async fn intents(&self, fleet: &str, run: &str) -> StoreResult<Vec<Intent>>;
    /// The recorded durations of a fleet's upgrades of one type ([`DurationHistory`]).
    async fn upgrade_durations(
        &self,
        fleet: &str,
        upgrade_type: &str,
    ) -> StoreResult<DurationHistory>;
    /// Records the operation ids drivers named for these attempts, all or none (one
    /// transaction, or one statement); of two ids for one attempt, the later is kept.
    async fn record_operations(&self, operations: &[OperationRecord]) -> StoreResult<()>;
}

/// The operation a driver named for an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRecord {
    pub fleet: String,
    pub run: String,
    pub attempt: u64,
    pub operation_id: String,
}

/// API tokens, stored by hash.
#[async_trait]
pub trait Tokens: Send + Sync {
    async fn create_token(&self, token: &TokenRecord) -> StoreResult<()>;
    async fn token_by_hash(&self, hash: &str) -> StoreResult<Option<TokenRecord>>;
    async fn list_tokens(&self) -> StoreResult<Vec<TokenRecord>>;
    async fn revoke_token(&self, id: &str) -> StoreResult<bool>;
}

/// A write the API accepted, as the audit trail keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    /// Its place in the trail (set by the store; 0 when appending).
    pub id: i64,
    /// When, in Unix milliseconds.
    pub at: i64,
    pub subject: String,
    pub role: String,
    pub method: String,
    pub path: String,
    pub fleet: Option<String>,
    pub status: u16,
    /// The request's body when it was small, else a note of its size.
    pub body: Option<String>,
}

/// The audit trail: every accepted write, oldest first, kept for a retention
/// ([`prune_audit_forever`]).
#[async_trait]
pub trait Audit: Send + Sync {
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()>;
    /// Deletes up to `limit` entries made before `before` (Unix milliseconds), oldest first,
    /// found through the trail's index on time; returns how many.
    async fn prune_audit(&self, before: i64, limit: usize) -> StoreResult<u64>;
    /// Entries after `after` (an id) made at or after `since` (Unix milliseconds), of `fleet`
    /// when given, at most `limit`, oldest first.
    async fn list_audit(
        &self,
        fleet: Option<&str>,
        after: i64,
        since: i64,
        limit: usize,
    ) -> StoreResult<Vec<AuditEntry>>;
}

/// How long the audit trail keeps an entry unless told otherwise (`flotilla serve
/// --audit-retention`): 400 days, a year and a season of any audit.
pub const AUDIT_RETENTION: Duration = Duration::from_secs(400 * 86_400);

/// Entries one statement of a prune deletes: a short write, so a large first prune does not
/// hold SQLite's one writer for long.
const AUDIT_PRUNE_BATCH: usize = 1000;

/// Keeps the audit trail within `retention`, forever: at once, then every quarter of the
/// retention (at least a second, at most an hour), the entries older than it are deleted, a
/// batch at a time. The one loop of both backends (every replica sharing a database runs it;
/// a delete is idempotent).
pub async fn prune_audit_forever(store: std::sync::Arc<dyn Store>, retention: Duration) {
    let every = (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let before = unix_millis().saturating_sub(millis(retention));
        loop {
            match store.prune_audit(before, AUDIT_PRUNE_BATCH).await {
                Ok(n) if n as usize == AUDIT_PRUNE_BATCH => tokio::task::yield_now().await,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot prune the audit trail; trying again later");
                    break;
                }
            }
        }
    }
}

/// A webhook (API.md, "Webhooks and audit") as stored: validated by the server, matched by the
/// store against each run event in the event's own transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Webhook {
    pub name: String,
    pub url: String,
    /// The key deliveries are signed with; never shown by the API.
    pub secret: String,
    /// Fleet names, or `*` for every fleet.
    pub fleets: Vec<String>,
    /// Event types (`RunCompleted`, ...), or `*` for every type.
    pub events: Vec<String>,
    /// `CloudEvents`, `Slack` or `Teams`.
    pub format: String,
    /// Who made it and who changed it last, as the API shows it.
    pub system_data: Value,
    /// Set by the store on every write (empty when writing).
    pub etag: String,
}

impl Webhook {
    /// Whether an event of `event_type` in `fleet` is sent to this webhook.
    pub fn wants(&self, fleet: &str, event_type: &str) -> bool {
        let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
        any(&self.fleets, fleet) && any(&self.events, event_type)
    }
}

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryState {
    /// Not yet answered with success; tried again at `next_attempt_at`.
    Pending,
    Delivered,
    /// Given up on: the receiver did not accept it within the retry period.
    Abandoned,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "Pending",
            DeliveryState::Delivered => "Delivered",
            DeliveryState::Abandoned => "Abandoned",
        }
    }

    pub fn parse(text: &str) -> Option<DeliveryState> {
        Some(match text {
            "Pending" => DeliveryState::Pending,
            "Delivered" => DeliveryState::Delivered,
            "Abandoned" => DeliveryState::Abandoned,
            _ => return None,
        })
    }
}

/// One event to send to one webhook: a row of the outbox, written in the transaction of the
/// run batch that recorded the event. Times are Unix milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// Its place in the outbox (set by the store).
    pub id: i64,
    pub webhook: String,
    /// The event's id ([`event_id`]): the same for every attempt and every webhook.
    pub event_id: String,
    pub fleet: String,
    pub run: String,
    /// The event's place in its run's event log (its `seq`, counted from 1).
    pub seq: i64,
    pub event_type: String,
    pub event: Value,
    pub created_at: i64,
    pub state: DeliveryState,
    pub attempts: i64,
    /// When it is due next (Pending only).
    pub next_attempt_at: Option<i64>,
    pub last_attempt_at: Option<i64>,
    /// The receiver's last HTTP status, if it answered.
    pub last_status: Option<u16>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    pub delivered_at: Option<i64>,
}

impl Delivery {
    /// A delivery not yet tried of `event` (of `fleet`, `run` — empty for a fleet's event —
    /// and its place `seq` in the run's log) to `hook`, due at once (`now`, Unix ms).
    fn pending(
        hook: &Webhook,
        event_id: String,
        (fleet, run, seq): (&str, &str, i64),
        event: &Value,
        now: i64,
    ) -> Delivery {
        Delivery {
            id: 0,
            webhook: hook.name.clone(),
            event_id,
            fleet: fleet.to_string(),
            run: run.to_string(),
            seq,
            event_type: event["type"].as_str().unwrap_or_default().to_string(),
            event: event.clone(),
            created_at: now,
            state: DeliveryState::Pending,
            attempts: 0,
            next_attempt_at: Some(now),
            last_attempt_at: None,
            last_status: None,
            last_error: None,
            delivered_at: None,
        }
    }
}

/// A delivery claimed for sending, with what sending it needs: its webhook as it is now (a URL
/// or secret changed since the event is used), and the run's head as last written (the small
/// summary of the run's state; `None` for a run deleted since).
#[derive(Clone, Debug, PartialEq)]
pub struct DueDelivery {
    pub delivery: Delivery,
    pub webhook: Webhook,
    pub run_head: Option<String>,
}

/// What one attempt to send a delivery came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryAttempt {
    pub at: i64,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub outcome: AttemptOutcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    Delivered,
    /// Try again at this time (Unix milliseconds).
    RetryAt(i64),
    Abandoned,
}

/// The columns an attempt sets: the delivery's state, when it is due next, when it was
/// delivered.
fn attempt_columns(attempt: &DeliveryAttempt) -> (DeliveryState, Option<i64>, Option<i64>) {
    match attempt.outcome {
        AttemptOutcome::Delivered => (DeliveryState::Delivered, None, Some(attempt.at)),
        AttemptOutcome::RetryAt(at) => (DeliveryState::Pending, Some(at), None),
        AttemptOutcome::Abandoned => (DeliveryState::Abandoned, None, None),
    }
}

/// The id of the event at `seq` in a run's event log: its fleet, its run, the run's generation
/// (the number of its snapshot's eTag, so a run deleted and created again under the same name
/// gives new ids; `0` when unknown) and the event's place. Stable: every attempt of every
/// webhook sends the same id for the same event.
pub fn event_id(fleet: &str, run: &str, snapshot_etag: Option<&str>, seq: i64) -> String {
    let generation = snapshot_etag
        .map(|e| e.trim_matches('"'))
        .filter(|e| !e.is_empty())
        .unwrap_or("0");
    format!("{fleet}/{run}/{generation}/{seq}")
}

/// The outbox rows of a fleet's event that is in no run's log (a freeze or a budget written),
/// one per webhook that wants it; `run` is empty and `event_id` names the event.
fn fleet_event_rows(
    fleet: &str,
    event_id: &str,
    event: &Value,
    hooks: &[Webhook],
    now: i64,
) -> Vec<Delivery> {
    let event_type = event["type"].as_str().unwrap_or_default();
    hooks
        .iter()
        .filter(|h| h.wants(fleet, event_type))
        .map(|hook| Delivery::pending(hook, event_id.to_string(), (fleet, "", 0), event, now))
        .collect()
}

/// The outbox rows a batch's events make, one per webhook that wants each event: the one rule
/// both backends write with. `first_seq` is the `seq` the batch's first event was given.
fn outbox_rows(batch: &RunBatch, first_seq: i64, hooks: &[Webhook], now: i64) -> Vec<Delivery> {
    let mut rows = Vec::new();
    for (i, event) in batch.events.iter().enumerate() {
        let event_type = event["type"].as_str().unwrap_or_default();
        let seq = first_seq + i as i64;
        for hook in hooks.iter().filter(|h| h.wants(&batch.fleet, event_type)) {
            let id = event_id(
                &batch.fleet,
                &batch.run,
                batch.snapshot_etag.as_deref(),
                seq,
            );
            rows.push(Delivery::pending(
                hook,
                id,
                (&batch.fleet, &batch.run, seq),
                event,
                now,
            ));
        }
    }
    rows
}

/// A webhook from its stored columns: name, url, secret, fleets, events, format, system data,
/// eTag.
fn webhook_row<R: Row>(r: &R) -> StoreResult<Webhook>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let list = |text: String| {
        serde_json::from_str::<Vec<String>>(&text)
            .map_err(|e| StoreError::Corrupt(format!("a webhook's list {text:?}: {e}")))
    };
    Ok(Webhook {
        name: r.col(0)?,
        url: r.col(1)?,
        secret: r.col(2)?,
        fleets: list(r.col(3)?)?,
        events: list(r.col(4)?)?,
        format: r.col(5)?,
        system_data: parse_body(&r.col::<String>(6)?)?,
        etag: r.col(7)?,
    })
}

/// The columns [`webhook_row`] reads, in its order (a macro, so statements are `concat!`ed
/// constants).
macro_rules! webhook_columns {
    () => {
        "name, url, secret, fleets, events, format, system_data, etag"
    };
}

/// The columns [`delivery_row`] reads, in its order.
macro_rules! delivery_columns {
    () => {
        "id, webhook, event_id, fleet, run, seq, event_type, event, created_at, state, attempts, next_attempt_at, last_attempt_at, last_status, last_error, delivered_at"
    };
}
pub(crate) use {delivery_columns, webhook_columns};

/// A delivery from the columns of [`delivery_columns`].
fn delivery_row<R: Row>(r: &R) -> StoreResult<Delivery>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let state: String = r.col(9)?;
    Ok(Delivery {
        id: r.col(0)?,
        webhook: r.col(1)?,
        event_id: r.col(2)?,
        fleet: r.col(3)?,
        run: r.col(4)?,
        seq: r.col(5)?,
        event_type: r.col(6)?,
        event: parse_body(&r.col::<String>(7)?)?,
        created_at: r.col(8)?,
        state: DeliveryState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("a delivery in state {state:?}")))?,
        attempts: r.col(10)?,
        next_attempt_at: r.col(11)?,
        last_attempt_at: r.col(12)?,
        last_status: r
            .col::<Option<i64>>(13)?
            .and_then(|s| u16::try_from(s).ok()),
        last_error: r.col(14)?,
        delivered_at: r.col(15)?,
    })
}

/// Webhooks and their outbox. The outbox is written by [`RunLog::write_run_batch`], in the
/// transaction of the events it carries, so an event recorded is an event to deliver, across
/// any crash (at least once).
#[async_trait]
pub trait Webhooks: Send + Sync {
    /// Creates or replaces a webhook; returns its new eTag and whether this created it.
    async fn put_webhook(
        &self,
        webhook: &Webhook,
        when: &Precondition,
    ) -> StoreResult<(String, bool)>;
    async fn get_webhook(&self, name: &str) -> StoreResult<Option<Webhook>>;
    /// Webhooks by name after `after`, at most `limit`.
    async fn list_webhooks(&self, after: Option<&str>, limit: usize) -> StoreResult<Vec<Webhook>>;
    /// Deletes a webhook and its deliveries (those not yet sent are never sent); false if it
    /// did not exist.
    async fn delete_webhook(&self, name: &str, when: &Precondition) -> StoreResult<bool>;
    /// Claims up to `limit` deliveries due at `now` (Unix milliseconds), oldest due first, for
    /// `claim_ms`: until then no other caller (no other replica) is given them, unless their
    /// attempt is recorded first. A claim that lapses (its claimer died) makes them due again.
    async fn claim_deliveries(
        &self,
        now: i64,
        claim_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<DueDelivery>>;
    /// Records an attempt of a pending delivery and lets its claim go; a delivery no longer
    /// pending (deleted, or recorded by another claimer) is left as it is.
    async fn record_delivery(&self, id: i64, attempt: &DeliveryAttempt) -> StoreResult<()>;
    /// A webhook's deliveries after `after` (an id), of one state when given, at most `limit`,
    /// oldest first.
    async fn list_deliveries(
        &self,
        webhook: &str,
        state: Option<DeliveryState>,
        after: i64,
        limit: usize,
    ) -> StoreResult<Vec<Delivery>>;
    /// Deletes deliveries no longer pending that were made before `before` (Unix
    /// milliseconds); returns how many.
    async fn prune_deliveries(&self, before: i64) -> StoreResult<u64>;
    /// Writes (`text`) or deletes (`None`) one of a fleet's rule resources (a freeze, a
    /// disruption budget) and records the event that reports it for the webhooks, in one
    /// transaction: a change is never kept without its report, nor reported without being kept.
    /// `report(created, eTag)` gives the event's id and the event for the change as made (for a
    /// deletion, `eTag` is `None`). Returns the new eTag and whether the resource was created,
    /// or (a deletion) `None` and whether it existed; nothing is reported when it did not.
    async fn write_reported(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
        text: Option<&str>,
        when: &Precondition,
        report: &(dyn for<'e> Fn(bool, Option<&'e str>) -> (String, Value) + Send + Sync),
    ) -> StoreResult<(Option<String>, bool)>;
    /// Records a fleet's event that is in no run's log (a freeze or a disruption budget
    /// written, SEMANTICS §12) in the outbox of every webhook that wants it; `event_id` names
    /// it (the same id twice is one delivery).
    async fn record_fleet_event(
        &self,
        fleet: &str,
        event_id: &str,
        event: &Value,
    ) -> StoreResult<()>;
}

/// What replicas sharing a database coordinate with: liveness, fleet leases with a fencing
/// epoch, actions handed to a fleet's owner, notices of change.
#[async_trait]
pub trait Coordination: Send + Sync {
    /// Says this replica is alive for `ttl`; returns how many replicas are alive, itself included.
    async fn heartbeat(&self, replica: &str, ttl: Duration) -> StoreResult<usize>;
    /// How many replicas are alive now, without saying this one is: a replica's heartbeat is
    /// written only before it renews its leases, so it never outlives them.
    async fn alive_replicas(&self) -> StoreResult<usize>;
    /// Takes a fleet's lease if nobody holds it or its holder let it expire, with the next
    /// epoch; returns that epoch, or `None` if another holder's lease is still running.
    async fn acquire_lease(
        &self,
        fleet: &str,
        owner: &str,
        ttl: Duration,
    ) -> StoreResult<Option<i64>>;
    /// Extends a lease still held at `epoch`; false if it was lost.
    async fn renew_lease(
        &self,
        fleet: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
    ) -> StoreResult<bool>;
    /// Lets a lease go at once (on shutdown), so another replica takes over without waiting.
    async fn release_lease(&self, fleet: &str, owner: &str, epoch: i64) -> StoreResult<()>;
    async fn leases(&self) -> StoreResult<Vec<Lease>>;
    /// Hands an action to whoever drives the run's fleet; returns its id.
    async fn submit_action(&self, fleet: &str, run: &str, input: &Value) -> StoreResult<i64>;
    /// Actions on a fleet's runs without a result yet, oldest first.
    async fn pending_actions(&self, fleet: &str) -> StoreResult<Vec<PendingAction>>;
    /// Records an action's result outside a run's batch (the run could not be loaded).
    async fn finish_action(&self, id: i64, result: &Value) -> StoreResult<()>;
    /// An action's result, once recorded; it is then forgotten.
    async fn take_action_result(&self, id: i64) -> StoreResult<Option<Value>>;
    /// Notices of changes, from this process and, for a shared database, from other replicas.
    fn notices(&self) -> broadcast::Receiver<Notice>;
    /// Whether several replicas may share this store.
    fn shared(&self) -> bool;
}

/// Reads a column; a value that cannot be decoded (text that is not UTF-8, say) is
/// `StoreError::Corrupt`, never a panic.
trait Col {
    fn col<'r, T>(&'r self, index: usize) -> StoreResult<T>
    where
        T: sqlx::Decode<'r, <Self as Row>::Database> + sqlx::Type<<Self as Row>::Database>,
        Self: Row;
}

impl<R: Row> Col for R
where
    usize: sqlx::ColumnIndex<R>,
{
    fn col<'r, T>(&'r self, index: usize) -> StoreResult<T>
    where
        T: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        self.try_get(index)
            .map_err(|e| StoreError::Corrupt(format!("column {index}: {e}")))
    }
}

/// Run documents and snapshots at least this long are stored compressed: a 10,000-member run
/// is 1.4 MB of JSON and 80 KB packed.
const PACK_FROM: usize = 16 * 1024;

/// What the `body` column holds for a row whose text is in `packed` (valid JSON, so that a
/// query reading `body` as JSON never fails on it).
const PACKED_BODY: &str = "{}";

/// The `(body, packed)` columns to store for a resource's text.
fn pack(kind: Kind, body: &str) -> StoreResult<(&str, Option<Vec<u8>>)> {
    if !matches!(kind, Kind::Run | Kind::RunSnapshot) || body.len() < PACK_FROM {
        return Ok((body, None));
    }
    Ok((PACKED_BODY, Some(compress(body)?)))
}

/// The `(body, packed)` columns of a chunk of a run's members: always compressed, so that a
/// chunk's row stays small as its members' statuses grow and shrink (a row stored as text at
/// first and packed later left SQLite a page per row).
fn pack_chunk(text: &str) -> StoreResult<(&'static str, Option<Vec<u8>>)> {
    Ok((PACKED_BODY, Some(compress(text)?)))
}

fn compress(body: &str) -> StoreResult<Vec<u8>> {
    thread_local! {
        // One context per thread, made once: a context is megabytes, and making one per write
        // left the allocator holding hundreds of them.
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let packed = COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let compressor = match cell.as_mut() {
            Some(c) => c,
            None => cell.insert(zstd::bulk::Compressor::new(1)?),
        };
        compressor.compress(body.as_bytes())
    });
    packed.map_err(|e| StoreError::Unavailable(format!("cannot compress a resource: {e}")))
}

/// A resource's text from its stored `(body, packed)` columns. A `body` other than the
/// placeholder wins: a Flotilla from before packing, still running beside this one on a shared
/// database, writes `body` alone and leaves an older `packed` behind.
fn unpack(body: String, packed: Option<Vec<u8>>) -> StoreResult<String> {
    let Some(packed) = packed.filter(|_| body == PACKED_BODY) else {
        return Ok(body);
    };
    let corrupt = |e: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!("a packed resource cannot be read: {e}"))
    };
    // Written whole by `pack`, so the frame says its size.
    let size = zstd::decompressed_size(&packed).ok_or_else(|| corrupt(&"no size in its frame"))?;
    let size = usize::try_from(size)
        .ok()
        .filter(|&n| n <= 1 << 30)
        .ok_or_else(|| corrupt(&format!("a frame claiming {size} bytes")))?;
    thread_local! {
        // One context per thread, as for packing: a run read in chunks is hundreds of frames.
        static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let bytes = DECOMPRESSOR
        .with(|cell| {
            let mut cell = cell.borrow_mut();
            let decompressor = match cell.as_mut() {
                Some(d) => d,
                None => cell.insert(zstd::bulk::Decompressor::new()?),
            };
            decompressor.decompress(&packed, size)
        })
        .map_err(|e| corrupt(&e))?;
    String::from_utf8(bytes)
        .map_err(|e| StoreError::Corrupt(format!("a packed resource is not text: {e}")))
}

fn parse_body(text: &str) -> StoreResult<Value> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn check(current: Option<&str>, when: &Precondition) -> StoreResult<()> {
    match (when, current) {
        (Precondition::None, _) => Ok(()),
        (Precondition::IfMatch(tag), Some(etag)) if tag == "*" || tag == etag => Ok(()),
        (Precondition::IfMatch(tag), Some(etag)) => Err(StoreError::Precondition(format!(
            "If-Match {tag} does not match the current eTag {etag}"
        ))),
        (Precondition::IfMatch(tag), None) => Err(StoreError::Precondition(format!(
            "If-Match {tag}: the resource does not exist"
        ))),
        (Precondition::IfNoneMatchAny, Some(_)) => Err(StoreError::Precondition(
            "If-None-Match *: the resource already exists".into(),
        )),
        (Precondition::IfNoneMatchAny, None) => Ok(()),
    }
}

/// A [`PartRow`] from a row of `name, body, packed, etag, chunks, chunk, slot, chunk body,
/// chunk packed`, as both backends read runs.
fn part_row<R: Row>(r: &R) -> StoreResult<PartRow>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<Vec<u8>>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let chunk: Option<i64> = r.col(5)?;
    let chunk = match chunk {
        None => None,
        Some(index) => Some((index, r.col(6)?, r.col(7)?, r.col(8)?)),
    };
    Ok((r.col(0)?, r.col(1)?, r.col(2)?, r.col(3)?, r.col(4)?, chunk))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame() -> Vec<String> {
        ["[", "],[", "]"].map(String::from).to_vec()
    }

    fn chunks(parts: &[(u32, u32, &str)]) -> Vec<(u32, u32, String)> {
        parts
            .iter()
            .map(|&(i, s, t)| (i, s, t.to_string()))
            .collect()
    }

    #[test]
    fn a_document_is_its_frame_with_each_list_joined_in() {
        let text = assemble(
            &frame(),
            3,
            chunks(&[(0, 0, "1,2"), (1, 0, "3"), (2, 1, "4")]),
        );
        assert_eq!(text.unwrap(), "[1,2,3],[4]");
        assert_eq!(
            assemble(&frame(), 1, chunks(&[(0, 1, "4")])).unwrap(),
            "[],[4]"
        );
        assert_eq!(assemble(&frame(), 0, Vec::new()).unwrap(), "[],[]");
    }

    #[test]
    fn chunks_missing_out_of_order_or_past_the_frame_are_refused() {
        let refused = |count: u32, parts: &[(u32, u32, &str)], says: &str| {
            let Err(StoreError::Corrupt(why)) = assemble(&frame(), count, chunks(parts)) else {
                panic!("{parts:?} of {count} was put together");
            };
            assert!(why.contains(says), "{why}");
        };
        refused(2, &[(1, 0, "1")], "chunk 0 is missing");
        refused(2, &[(0, 0, "1")], "1 chunks of 2");
        refused(2, &[(0, 1, "1"), (1, 0, "2")], "out of order");
        refused(1, &[(0, 2, "1")], "past the frame");
        assert!(matches!(
            assemble(&[], 0, Vec::new()),
            Err(StoreError::Corrupt(_))
        ));
    }
}
