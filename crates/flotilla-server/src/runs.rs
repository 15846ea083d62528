//! The reconciler: one task per fleet, owning the fleet's [`FleetEngine`] and so every active
//! run of the fleet. It feeds the engine what happened, records for each run what its engine was
//! given, its intents, events and status in one transaction, and only then carries out the
//! engine's commands through the fleet's driver (SEMANTICS §7). It sleeps until the engine's
//! next wake-up or the next input: no polling of the engine.
//!
//! A run is rebuilt after a restart by replaying its input log into a fresh engine and handing
//! it to the fleet's engine; recorded intents without a result are asked about before anything
//! is sent again.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};

use flotilla_engine::engine::{
    Command, Engine, Input, OperationProgress, RunSpec, StatusChanges, Target,
};
use flotilla_engine::error::{ApiError, ErrorCode};
use flotilla_engine::fleet::{Catalog, Cluster, SharedMember};
use flotilla_engine::fleet_engine::{Delivered, FleetCommand, FleetEngine, FleetEvent, FleetInput};
use flotilla_engine::forecast::{ForecastParams, completions};
use flotilla_engine::status::{EventType, RunForecast, State};
use flotilla_engine::strategy::{
    DEFAULT_STAGE_CONCURRENCY_LIMIT, ManagedClusterUpdateSpec, StrategySpec, parse_strategy,
    parse_upgrade,
};
use flotilla_engine::time::Time;

use crate::durations::Durations;

use crate::driver::{Driver, MemberRef, driver_from_config};
use crate::metrics::Metrics;
use crate::store::{
    Fence, Intent, Kind, Notice, OperationRecord, RunBatch, Store, StoreError, UpgradeDuration,
};

/// How long a fleet's lease lasts without renewal, unless configured.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

/// This replica's share of the fleets: which leases it holds, and since when it may act on them.
pub struct Replica {
    /// Unique among the replicas sharing the database.
    pub id: String,
    pub ttl: Duration,
    held: Mutex<HashMap<String, Held>>,
    /// Serialises taking leases, so the coordinator and an API call do not race for one.
    taking: tokio::sync::Mutex<()>,
    /// Handed-over actions already given to a run, by fleet, until their result is recorded.
    delivered: Mutex<HashMap<String, std::collections::HashSet<i64>>>,
    /// Shutting down: take no more leases.
    closing: std::sync::atomic::AtomicBool,
}

#[derive(Clone, Copy, Debug)]
struct Held {
    epoch: i64,
    /// Upgrades are sent only before this instant: the lease's end by this process's monotonic
    /// clock, counted from before the renewal was asked for and cut short by a tenth, so it
    /// ends before the database lets another replica take over.
    valid_until: Instant,
    /// When this replica took the lease.
    taken_at: Instant,
}

impl Replica {
    pub fn new(id: String, ttl: Duration) -> Replica {
        Replica {
            id,
            ttl,
            held: Mutex::new(HashMap::new()),
            taking: tokio::sync::Mutex::new(()),
            delivered: Mutex::new(Default::default()),
            closing: Default::default(),
        }
    }

    /// A replica id: the listen address for people to read, the process, and 64 random bits,
    /// so that replicas in identical containers and restarts all differ.
    pub fn generated_id(hint: &str) -> String {
        use std::hash::{BuildHasher, Hasher};
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        format!("{hint}/pid{}/{:016x}", std::process::id(), random.finish())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn valid_after(&self, asked_at: Instant) -> Instant {
        asked_at + self.ttl.mul_f64(0.9)
    }

    pub fn holds(&self, fleet: &str) -> bool {
        self.held().contains_key(fleet)
    }

    pub fn fence(&self, fleet: &str) -> Option<Fence> {
        self.held().get(fleet).map(|h| Fence {
            owner: self.id.clone(),
            epoch: h.epoch,
        })
    }

    /// Whether an upgrade may be sent now under this epoch: `Some(true)` yes, `Some(false)` not
    /// yet (the lease is being renewed), `None` never (it was lost).
    fn may_send(&self, fleet: &str, epoch: i64) -> Option<bool> {
        match self.held().get(fleet) {
            Some(h) if h.epoch == epoch => Some(Instant::now() < h.valid_until),
            _ => None,
        }
    }

    /// The fleets held, with their epochs.
    /// The epoch held for a fleet, if any.
    fn epoch(&self, fleet: &str) -> Option<i64> {
        self.held().get(fleet).map(|h| h.epoch)
    }

    fn held_epochs(&self) -> Vec<(String, i64)> {
        self.held()
            .iter()
            .map(|(f, h)| (f.clone(), h.epoch))
            .collect()
    }

    /// How long until a lease taken at `epoch` is a full lease time old, if it is not yet.
    fn settling(&self, fleet: &str, epoch: i64) -> Option<Duration> {
        let held = self.held().get(fleet).copied()?;
        (held.epoch == epoch)
            .then(|| (held.taken_at + self.ttl).checked_duration_since(Instant::now()))
            .flatten()
    }

    pub fn held_fleets(&self) -> Vec<String> {
        self.held().keys().cloned().collect()
    }
}

use crate::clock::now;

/// A run event for live streams: fleet, run and the event JSON.
#[derive(Clone, Debug)]
pub struct RunEvent {
    pub fleet: String,
    pub run: String,
    pub event: Value,
}

/// What a fleet's task is told.
enum Msg {
    /// This replica lost the fleet's lease: stop driving its runs at once.
    Abandon,
    /// A run rebuilt from the store (by a caller, off the task), to drive from now on.
    Adopt {
        run: String,
        loaded: Box<LoadedRun>,
        reply: oneshot::Sender<Result<(), ApiError>>,
    },
    /// The run was replaced or deleted: stop driving it.
    Retire { run: String },
    /// An action handed over through the store by another replica (or while this one was not
    /// the owner); its result is recorded with the step.
    Remote { run: String, id: i64, input: Input },
    Action {
        run: String,
        input: Input,
        reply: Reply,
        at: Instant,
    },
    Input {
        run: String,
        input: Input,
        observed_at: Option<Instant>,
    },
    /// A member's cluster as the background observer found it: news for every run of the
    /// fleet that selected it, when it changed.
    Observed { member: String, cluster: Cluster },
    /// A copy of the fleet's engine, for a forecast made off the task.
    Copy {
        reply: oneshot::Sender<Box<FleetEngine>>,
    },
    /// The forecast of the fleet's moving runs, made off the task: when it was made and when
    /// each run ends (`None`: no forecast could be made).
    Forecast {
        made: Option<(Time, BTreeMap<String, Option<Time>>)>,
    },
    /// The fleet's driver as its configuration now says (it was changed): every operation sent
    /// from now on, for every run, goes through it.
    Driver(Arc<dyn Driver>),
    /// The fleet's freezes and budgets as stored now (SEMANTICS §12): the fleet engine is told
    /// of each that changed, and decides from the next scheduling pass.
    Rules(crate::fleet_rules::Rules),
    /// Each partition of the fleet's budgets with the members in flight in it now.
    Partitions {
        reply: oneshot::Sender<Vec<(flotilla_engine::budget::Partition, u64)>>,
    },
}

/// Tells the fleet engine of each freeze and budget that is new, changed or gone (SEMANTICS
/// §12); whether any was.
fn apply_rules(engine: &mut FleetEngine, now: Time, rules: crate::fleet_rules::Rules) -> bool {
    let crate::fleet_rules::Rules { freezes, budgets } = rules;
    let mut changed = false;
    let gone: Vec<String> = engine
        .budgets()
        .filter(|b| !budgets.iter().any(|n| n.name == b.name))
        .map(|b| b.name.clone())
        .collect();
    for name in gone {
        changed = true;
        let _ = engine.handle(now, FleetInput::DeleteBudget { name });
    }
    for budget in budgets {
        if !engine.budgets().any(|b| *b == budget) {
            changed = true;
            let _ = engine.handle(now, FleetInput::PutBudget(Box::new(budget)));
        }
    }
    let gone: Vec<String> = engine
        .freezes()
        .filter(|f| !freezes.iter().any(|n| n.name == f.name))
        .map(|f| f.name.clone())
        .collect();
    for name in gone {
        changed = true;
        let _ = engine.handle(now, FleetInput::DeleteFreeze { name });
    }
    for freeze in freezes {
        if !engine.freezes().any(|f| *f == freeze) {
            changed = true;
            let _ = engine.handle(now, FleetInput::PutFreeze(Box::new(freeze)));
        }
    }
    changed
}

/// How often a fleet's moving runs are forecast for their statuses, at most (SEMANTICS §11).
const FORECAST_EVERY: Duration = Duration::from_secs(60);

/// When a fleet's moving runs are next forecast for their statuses.
#[derive(Default)]
struct ForecastPace {
    /// Something that moves the forecast happened since it was last made.
    dirty: bool,
    /// One is being made now.
    running: bool,
    last: Option<Instant>,
}

impl ForecastPace {
    /// When the next forecast is due, if one is.
    fn due(&self) -> Option<Instant> {
        if !self.dirty || self.running {
            return None;
        }
        Some(self.last.map_or_else(Instant::now, |t| t + FORECAST_EVERY))
    }
}

/// Whether a run moves by itself (a forecast of its end means something): started, and neither
/// stopped nor ended.
fn moving(engine: &Engine) -> bool {
    !engine.is_finished() && !matches!(engine.state(), State::NotStarted | State::Stopped)
}

/// Where the answer to a user action goes.
type Reply = oneshot::Sender<Result<(), Refusal>>;

/// Why a fleet's task did not carry out an action.
enum Refusal {
    /// The engine (or the store) refused it: the caller's answer.
    Api(ApiError),
    /// The task does not drive that run now (it finished, or was dropped): load it and ask again.
    NotLoaded,
}

/// A run as loaded from the store: its engine after replaying its log, and what its task needs.
struct LoadedRun {
    engine: Engine,
    /// The run resource without its status.
    base: Value,
    snapshot_etag: String,
    intents: Vec<Intent>,
    /// What the log replayed after the run's checkpoint cost ([`log_cost`]), and the
    /// checkpoint's size: when to write the next one.
    log_cost: u64,
    checkpoint_bytes: u64,
}

/// A run is checkpointed when the log written since its last checkpoint costs more to replay
/// than the checkpoint costs to read, and at least this much: a restart then reads a
/// checkpoint and a tail of bounded size, never the run's whole history (FLEET-DESIGN.md).
pub const CHECKPOINT_AFTER: u64 = 1 << 20;

/// What replaying a log entry costs beyond its bytes, in bytes: each entry is a settle.
const ENTRY_COST: u64 = 256;

/// The cost of replaying these log entries, in bytes.
fn log_cost<'a>(entries: impl IntoIterator<Item = &'a String>) -> u64 {
    entries
        .into_iter()
        .map(|e| e.len() as u64 + ENTRY_COST)
        .sum()
}

/// How stale a running run's stored status may get while steps come fast, per started MiB of
/// its document: rendering and storing a status costs with its size, and ten runs over 100,000
/// members (8.6 MB each) rewritten every 250 ms took both cores from the readers.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// The most log entries a run holds back from steps that show nothing before writing them.
const UNWRITTEN_MAX: usize = 4096;

/// How long one step of a fleet spends writing statuses nobody waits for.
const STATUS_BUDGET: Duration = Duration::from_millis(25);

/// A field never shown in API bodies (older runs kept their snapshot there).
pub const SNAPSHOT: &str = "x-flotilla";

/// A fleet's task: the lease epoch it drives the fleet under, its mailbox, and the runs it
/// drives now (kept by the task).
#[derive(Clone)]
struct FleetTask {
    epoch: i64,
    tx: mpsc::UnboundedSender<Msg>,
    driving: Arc<Mutex<std::collections::HashSet<String>>>,
    /// The driver the task was last given.
    driver: Arc<dyn Driver>,
}

impl FleetTask {
    fn drives(&self, run: &str) -> bool {
        self.driving
            .lock()
            .map(|d| d.contains(run))
            .unwrap_or(false)
    }
}

/// A driver and the configuration it was built from.
type BuiltDriver = (Value, Arc<dyn Driver>);

/// Fleet drivers, built from each fleet's configuration and kept while it does not change.
#[derive(Default)]
pub struct Drivers {
    built: Mutex<HashMap<String, BuiltDriver>>,
    /// Where `exec` commands may come from.
    pub exec_allow: std::sync::RwLock<crate::driver::ExecAllow>,
}

impl Drivers {
    /// Where `exec` commands may come from, as the server was started. (The list is written
    /// once at start; were its lock poisoned, nothing is allowed.)
    pub fn exec_allowed(&self) -> crate::driver::ExecAllow {
        self.exec_allow
            .read()
            .map(|a| a.clone())
            .unwrap_or_default()
    }

    pub async fn for_fleet(
        &self,
        store: &dyn Store,
        fleet: &str,
    ) -> Result<Arc<dyn Driver>, ApiError> {
        let resource = store
            .get("", Kind::Fleet, fleet)
            .await
            .map_err(|e| ApiError::new(ErrorCode::Conflict, e.to_string(), ""))?
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NotFound,
                    format!("fleet {fleet:?} does not exist"),
                    "fleet",
                )
            })?;
        let config = resource.body["properties"]["driver"].clone();
        let mut built = self
            .built
            .lock()
            .map_err(|_| ApiError::conflict("driver registry poisoned"))?;
        if let Some((known, driver)) = built.get(fleet)
            && *known == config
        {
            return Ok(driver.clone());
        }
        let allow = self.exec_allowed();
        let driver = driver_from_config(&config, &allow).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidRequestContent,
                e.message,
                "properties.driver",
            )
        })?;
        built.insert(fleet.to_string(), (config, driver.clone()));
        Ok(driver)
    }

    pub fn forget(&self, fleet: &str) {
        if let Ok(mut built) = self.built.lock() {
            built.remove(fleet);
        }
    }
}

/// All active runs of the server, driven by one task per fleet.
pub struct Runs {
    pub store: Arc<dyn Store>,
    pub replica: Replica,
    pub drivers: Drivers,
    pub metrics: Arc<Metrics>,
    pub events: broadcast::Sender<RunEvent>,
    /// The task of each fleet this replica drives.
    fleets: Mutex<HashMap<String, FleetTask>>,
    /// One run is loaded at a time, so two callers never load one run twice.
    loading: tokio::sync::Mutex<()>,
    /// Runs dropped on a store error, and fleets whose runs could not all be resumed: the
    /// coordinator tries again on its next pass.
    to_reload: Mutex<std::collections::HashSet<(String, String)>>,
    to_resume: Mutex<std::collections::HashSet<String>>,
    /// Live replicas at the last heartbeat.
    alive: std::sync::atomic::AtomicUsize,
    /// A run is checkpointed once the log written since its last checkpoint costs this much
    /// to replay, in bytes, or the checkpoint's own size if larger ([`CHECKPOINT_AFTER`] unless
    /// the server was told otherwise).
    pub checkpoint_after: std::sync::atomic::AtomicU64,
    /// Makes the evaluations health and readiness checks ask for (SEMANTICS §10).
    pub evaluator: Arc<crate::evaluate::Evaluator>,
    /// The check providers evaluations go through, as last read (SEMANTICS §10).
    pub providers: crate::evaluate::Providers,
    /// The writer of operation ids drivers name, started on first use.
    operation_ids:
        std::sync::OnceLock<mpsc::UnboundedSender<(OperationRecord, oneshot::Sender<()>)>>,
}

/// Writes the operation ids drivers name, as many as have arrived to one transaction (one sync
/// to disk for a step's worth of upgrades, not one each), and tells each caller once its id
/// is stored.
async fn write_operation_ids(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<(OperationRecord, oneshot::Sender<()>)>,
) {
    const MOST: usize = 1000;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MOST {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let records: Vec<OperationRecord> = batch.iter().map(|(r, _)| r.clone()).collect();
        if let Err(e) = store.record_operations(&records).await {
            // The intents keep no id; a restart asks the driver again by the attempt's key.
            tracing::warn!(error = %e, count = records.len(), "cannot record operation ids");
        }
        for (_, done) in batch {
            let _ = done.send(());
        }
    }
}

/// What a run is created from, stored with it.
pub struct RunSnapshot {
    pub strategy: Option<StrategySpec>,
    pub update: ManagedClusterUpdateSpec,
    pub members: Vec<SharedMember>,
    pub catalog: Catalog,
    pub rules: flotilla_engine::engine::RunRules,
}

pub fn engine_from_snapshot(
    run: &str,
    snapshot: &RunSnapshot,
) -> Result<(Engine, Vec<String>), ApiError> {
    let strategy = snapshot
        .strategy
        .as_ref()
        .map(|s| parse_strategy(s, "properties.strategy", DEFAULT_STAGE_CONCURRENCY_LIMIT))
        .transpose()?;
    let upgrade = parse_upgrade(&snapshot.update, "properties.managedClusterUpdate")?;
    Engine::create_shared(
        run,
        &RunSpec {
            strategy,
            upgrade,
            rules: snapshot.rules,
        },
        &snapshot.members,
        snapshot.catalog.clone(),
    )
}

/// The fleet's release catalog from its driver; a driver that cannot list it is a conflict
/// the caller may retry.
pub async fn driver_catalog(driver: &dyn Driver) -> Result<Catalog, ApiError> {
    driver.catalog().await.map_err(|e| {
        ApiError::conflict(format!(
            "the fleet's driver cannot list releases: {}",
            e.message
        ))
    })
}

/// A run's snapshot as stored (the run's strategy and upgrade stay in the run's document):
/// each distinct cluster once, and each member pointing at its cluster by index (`c`). Most
/// members of a fleet share a few cluster shapes, so this is about half the size of a cluster
/// written out per member, which snapshots before this held (and are still read).
pub fn snapshot_document(snapshot: &RunSnapshot, created_at: Time) -> serde_json::Result<String> {
    use flotilla_engine::engine::RunRules;
    #[derive(serde::Serialize)]
    struct Stored<'a> {
        clusters: &'a [Arc<Cluster>],
        members: Vec<StoredMember<'a>>,
        catalog: &'a Catalog,
        rules: &'a RunRules,
        #[serde(rename = "createdAt")]
        created_at: Time,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct StoredMember<'a> {
        name: &'a str,
        cluster_resource_id: &'a str,
        labels: &'a std::collections::BTreeMap<String, String>,
        c: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        group: Option<&'a str>,
    }
    let mut clusters = crate::journal::ClusterList::default();
    let members = snapshot
        .members
        .iter()
        .map(|m| StoredMember {
            name: &m.name,
            cluster_resource_id: &m.cluster_resource_id,
            labels: &m.labels,
            c: clusters.index(m.cluster.clone()),
            group: m.group.as_deref(),
        })
        .collect();
    serde_json::to_string(&Stored {
        clusters: &clusters.list,
        members,
        catalog: &snapshot.catalog,
        rules: &snapshot.rules,
        created_at,
    })
}

fn read_snapshot(base: &Value, internal: &str) -> Result<RunSnapshot, ApiError> {
    let bad = |e: String| ApiError::conflict(format!("stored run snapshot is unreadable: {e}"));
    // Read straight into its types: a 10,000-member snapshot is never built as a JSON tree.
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct StoredMember {
        name: String,
        cluster_resource_id: String,
        #[serde(default)]
        group: Option<String>,
        #[serde(default)]
        labels: std::collections::BTreeMap<String, String>,
        /// Snapshots written before clusters were listed once.
        #[serde(default)]
        cluster: Option<Cluster>,
        #[serde(default)]
        c: Option<usize>,
    }
    #[derive(serde::Deserialize)]
    struct Stored {
        members: Vec<StoredMember>,
        #[serde(default)]
        clusters: Vec<Cluster>,
        catalog: Catalog,
        #[serde(default)]
        rules: flotilla_engine::engine::RunRules,
    }
    let stored: Stored = serde_json::from_str(internal).map_err(|e| bad(e.to_string()))?;
    let clusters: Vec<Arc<Cluster>> = stored.clusters.into_iter().map(Arc::new).collect();
    let members = stored
        .members
        .into_iter()
        .map(|m| {
            let cluster = match (m.cluster, m.c) {
                (Some(cluster), None) => Arc::new(cluster),
                (None, Some(k)) => clusters.get(k).cloned().ok_or_else(|| {
                    bad(format!(
                        "member {:?} names cluster {k} of {}",
                        m.name,
                        clusters.len()
                    ))
                })?,
                _ => return Err(bad(format!("member {:?} has no one cluster", m.name))),
            };
            Ok(SharedMember {
                name: m.name.into(),
                cluster_resource_id: m.cluster_resource_id.into(),
                group: m.group,
                labels: m.labels,
                cluster,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let json_bad = |e: serde_json::Error| bad(e.to_string());
    Ok(RunSnapshot {
        strategy: match &base["properties"]["strategy"] {
            Value::Null => None,
            s => Some(serde_json::from_value(s.clone()).map_err(json_bad)?),
        },
        update: serde_json::from_value(base["properties"]["managedClusterUpdate"].clone())
            .map_err(json_bad)?,
        members,
        catalog: stored.catalog,
        rules: stored.rules,
    })
}

/// A run's stored document without its status, read without building the status (the bulk of
/// a large run's document) as a JSON tree.
fn run_base(text: &str) -> Result<Value, ApiError> {
    let bad = |e: serde_json::Error| ApiError::conflict(format!("stored run is unreadable: {e}"));
    let fields: serde_json::Map<String, Value> = {
        let raw: raw_fields::Fields<'_> = serde_json::from_str(text).map_err(bad)?;
        let mut fields = serde_json::Map::new();
        for (key, value) in raw.0 {
            let value = if key == "properties" {
                let props: raw_fields::Fields<'_> =
                    serde_json::from_str(value.get()).map_err(bad)?;
                let mut out = serde_json::Map::new();
                for (k, v) in props.0 {
                    if k != "status" {
                        out.insert(k, serde_json::from_str(v.get()).map_err(bad)?);
                    }
                }
                Value::Object(out)
            } else {
                serde_json::from_str::<Value>(value.get()).map_err(bad)?
            };
            fields.insert(key, value);
        }
        fields
    };
    Ok(Value::Object(fields))
}

/// An object's fields in document order, each left as unparsed JSON.
mod raw_fields {
    use serde::de::{Deserializer, MapAccess, Visitor};
    use serde_json::value::RawValue;

    pub struct Fields<'a>(pub Vec<(String, &'a RawValue)>);

    impl<'de: 'a, 'a> serde::Deserialize<'de> for Fields<'a> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<'a>(std::marker::PhantomData<&'a ()>);
            impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
                type Value = Fields<'a>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Fields<'a>, M::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = m.next_entry::<String, &'de RawValue>()? {
                        out.push((k, v));
                    }
                    Ok(Fields(out))
                }
            }
            d.deserialize_map(V(std::marker::PhantomData))
        }
    }
}

impl Runs {
    pub fn new(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Arc<Runs> {
        Runs::with_replica(
            store,
            metrics,
            Replica::new(Replica::generated_id("flotilla"), LEASE_TTL),
        )
    }

    pub fn with_replica(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        replica: Replica,
    ) -> Arc<Runs> {
        let (events, _) = broadcast::channel(4096);
        Arc::new(Runs {
            store,
            replica,
            drivers: Drivers::default(),
            metrics,
            events,
            fleets: Mutex::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            to_reload: Mutex::new(Default::default()),
            to_resume: Mutex::new(Default::default()),
            alive: std::sync::atomic::AtomicUsize::new(1),
            checkpoint_after: std::sync::atomic::AtomicU64::new(CHECKPOINT_AFTER),
            operation_ids: std::sync::OnceLock::new(),
            evaluator: Arc::default(),
            providers: Default::default(),
        })
    }

    /// Sends a user action to a run and waits until it is recorded: directly if this replica
    /// drives the run's fleet (taking its lease if nobody holds it), otherwise through the store
    /// to the replica that does.
    pub async fn act(
        self: &Arc<Self>,
        fleet: &str,
        run: &str,
        input: Input,
    ) -> Result<(), ApiError> {
        if !self.own(fleet).await {
            return self.act_remotely(fleet, run, input).await;
        }
        for _ in 0..2 {
            let tx = self.handle(fleet, run).await?;
            let (reply, answer) = oneshot::channel();
            if tx
                .send(Msg::Action {
                    run: run.to_string(),
                    input: input.clone(),
                    reply,
                    at: Instant::now(),
                })
                .is_err()
            {
                continue;
            }
            match answer.await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(Refusal::Api(e))) => return Err(e),
                // The run finished (or was dropped) just before the action came: load it again.
                Ok(Err(Refusal::NotLoaded)) => continue,
                Err(_) => {
                    return Err(ApiError::conflict(
                        "the fleet's reconciler stopped; try again",
                    ));
                }
            }
        }
        Err(ApiError::conflict(
            "the run's reconciler is not available; try again",
        ))
    }

    /// A copy of the fleet's engine holding `run` (if one is named) and every other unfinished
    /// run, for a forecast: the driving task's own when this replica drives the fleet (taken between two
    /// of its steps), otherwise rebuilt from the store as a takeover would.
    pub async fn fleet_copy(
        self: &Arc<Self>,
        fleet: &str,
        run: Option<&str>,
    ) -> Result<FleetEngine, ApiError> {
        let stopped = || ApiError::conflict("the fleet's reconciler stopped; try again");
        if self.own(fleet).await {
            let tx = match run {
                Some(run) => self.handle(fleet, run).await?,
                None => self.fleet_task(fleet).await?.tx,
            };
            let (reply, answer) = oneshot::channel();
            tx.send(Msg::Copy { reply }).map_err(|_| stopped())?;
            return answer.await.map(|engine| *engine).map_err(|_| stopped());
        }
        let mut engine = FleetEngine::from_shared(member_table(&self.store, fleet).await?, {
            let driver = self.drivers.for_fleet(self.store.as_ref(), fleet).await?;
            driver_catalog(driver.as_ref()).await?
        });
        let heads = crate::run_head::heads(self.store.as_ref(), fleet)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?;
        for (name, head) in heads {
            let active = !head.is_over() && head.state() != "NotStarted";
            if active || Some(name.as_str()) == run {
                let loaded = self.load(fleet, &name).await?;
                engine.adopt_run(now(), &name, loaded.engine)?;
            }
        }
        Ok(engine)
    }

    /// Hands an action to the fleet's owner through the store and waits for its result.
    async fn act_remotely(&self, fleet: &str, run: &str, input: Input) -> Result<(), ApiError> {
        let store_error = |e: StoreError| ApiError::conflict(e.to_string());
        let mut notices = self.store.notices();
        let value = serde_json::to_value(&input).map_err(|e| ApiError::conflict(e.to_string()))?;
        let id = self
            .store
            .submit_action(fleet, run, &value)
            .await
            .map_err(store_error)?;
        // A takeover may have to wait for the lease to run out first.
        let patience = Duration::from_secs(30).max(self.replica.ttl * 2);
        let deadline = Instant::now() + patience;
        loop {
            if let Some(result) = self
                .store
                .take_action_result(id)
                .await
                .map_err(store_error)?
            {
                return match serde_json::from_value::<ApiError>(result["error"].clone()) {
                    Ok(e) => Err(e),
                    Err(_) => Ok(()),
                };
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(ApiError::conflict(format!(
                    "the replica driving fleet {fleet:?} did not answer within {} s; the action may still be carried out (action {id})",
                    patience.as_secs()
                )));
            };
            let reply = async {
                loop {
                    match notices.recv().await {
                        Ok(Notice::Reply { id: got }) if got == id => return,
                        Err(broadcast::error::RecvError::Lagged(_)) => return,
                        Err(broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await
                        }
                        Ok(_) => {}
                    }
                }
            };
            // The notice normally answers at once; the timeout covers a lost notice.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(500)), reply).await;
        }
    }

    /// Whether this replica drives `fleet`, taking its lease if nobody holds it.
    pub async fn own(self: &Arc<Self>, fleet: &str) -> bool {
        if self.replica.holds(fleet) {
            return true;
        }
        if self
            .replica
            .closing
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return false;
        }
        let _taking = self.replica.taking.lock().await;
        if self.replica.holds(fleet) {
            return true;
        }
        let asked_at = Instant::now();
        match self
            .store
            .acquire_lease(fleet, &self.replica.id, self.replica.ttl)
            .await
        {
            Ok(Some(epoch)) => {
                tracing::info!(fleet, epoch, replica = %self.replica.id, "took the fleet's lease");
                self.replica.held().insert(
                    fleet.to_string(),
                    Held {
                        epoch,
                        valid_until: self.replica.valid_after(asked_at),
                        taken_at: asked_at,
                    },
                );
                // The fleet's runs are loaded in the background: loading a hundred large runs
                // takes a while, and whoever took the lease (the start of the server, an
                // action) need not wait for it; an action loads the run it needs.
                let runs = self.clone();
                let fleet = fleet.to_string();
                tokio::spawn(async move { runs.resume_fleet(&fleet).await });
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(fleet, error = %e, "cannot take the fleet's lease");
                false
            }
        }
    }

    /// Stops driving a fleet whose lease was lost at `epoch`: its runs' tasks end before doing
    /// anything more, and whoever holds the lease now recovers them from the store. A later
    /// epoch this replica took since is left alone.
    pub fn abandon(&self, fleet: &str, epoch: i64) {
        {
            let mut held = self.replica.held();
            if held.get(fleet).map(|h| h.epoch) != Some(epoch) {
                return;
            }
            held.remove(fleet);
        }
        tracing::warn!(fleet, epoch, replica = %self.replica.id, "no longer driving the fleet's runs");
        let task = self
            .fleets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(fleet);
        if let Some(task) = task {
            let _ = task.tx.send(Msg::Abandon);
        }
        if let Ok(mut delivered) = self.replica.delivered.lock() {
            delivered.remove(fleet);
        }
    }

    /// Lets a fleet's lease go at once (the fleet was deleted, or this replica stops).
    pub async fn let_go(&self, fleet: &str) {
        if let Some(epoch) = self.replica.epoch(fleet) {
            self.abandon(fleet, epoch);
            let _ = self
                .store
                .release_lease(fleet, &self.replica.id, epoch)
                .await;
        }
    }

    /// Takes no more leases and lets every lease go (graceful shutdown), so other replicas take
    /// over at once.
    pub async fn release_leases(&self) {
        self.replica
            .closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for fleet in self.replica.held_fleets() {
            self.let_go(&fleet).await;
        }
    }

    /// One pass of the coordinator: says this replica is alive, renews its leases (letting go of
    /// lost ones), takes unheld fleets up to its fair share, and hands over pending actions.
    pub async fn coordinate_once(self: &Arc<Self>) {
        let Some(alive) = self.renew_once().await else {
            return;
        };
        self.balance_once(alive).await;
    }

    /// Says this replica is alive and renews its leases, letting go of lost ones; returns how
    /// many replicas are alive. Runs on a task of its own, so that slow work elsewhere (loading
    /// runs, handing over actions) never delays a renewal into a needless takeover.
    async fn renew_once(&self) -> Option<usize> {
        let ttl = self.replica.ttl;
        let alive = match self.store.heartbeat(&self.replica.id, ttl).await {
            Ok(n) => n.max(1),
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the store");
                return None;
            }
        };
        let held = self.replica.held_epochs();
        for (fleet, epoch) in held {
            let asked_at = Instant::now();
            match self
                .store
                .renew_lease(&fleet, &self.replica.id, epoch, ttl)
                .await
            {
                Ok(true) => {
                    if let Some(h) = self.replica.held().get_mut(&fleet)
                        && h.epoch == epoch
                    {
                        h.valid_until = self.replica.valid_after(asked_at);
                    }
                }
                Ok(false) => self.abandon(&fleet, epoch),
                // Not renewed: the lease runs out by itself, and sending stops with it.
                Err(e) => tracing::warn!(fleet, error = %e, "cannot renew the fleet's lease"),
            }
        }
        self.alive
            .store(alive, std::sync::atomic::Ordering::Relaxed);
        Some(alive)
    }

    /// Lets go of deleted fleets, takes unheld ones up to this replica's fair share, retries
    /// what could not be loaded, and hands over pending actions.
    async fn balance_once(self: &Arc<Self>, alive: usize) {
        let Ok(fleets) = self
            .store
            .list("", Kind::Fleet, None, usize::MAX >> 1)
            .await
        else {
            return;
        };
        // A fleet deleted (through any replica) is let go of, so it neither counts towards the
        // fair share nor stays leased forever.
        let existing: std::collections::HashSet<&str> =
            fleets.iter().map(|f| f.name.as_str()).collect();
        for fleet in self.replica.held_fleets() {
            if !existing.contains(fleet.as_str()) {
                self.let_go(&fleet).await;
            }
        }
        // A store for one replica gives it every fleet; a shared one, its share.
        let fair = if self.store.shared() {
            fleets.len().div_ceil(alive)
        } else {
            fleets.len()
        };
        for fleet in &fleets {
            if self.replica.held().len() >= fair {
                break;
            }
            if !self.replica.holds(&fleet.name) {
                self.own(&fleet.name).await;
            }
        }
        // Runs whose task ended on a store error, and fleets not fully resumed, are tried again.
        let resume: Vec<String> = self
            .to_resume
            .lock()
            .map(|mut r| r.drain().collect())
            .unwrap_or_default();
        for fleet in resume {
            if self.replica.holds(&fleet) {
                self.resume_fleet(&fleet).await;
            }
        }
        let reload: Vec<(String, String)> = self
            .to_reload
            .lock()
            .map(|mut r| r.drain().collect())
            .unwrap_or_default();
        for (fleet, run) in reload {
            if self.replica.holds(&fleet)
                && let Err(e) = self.handle(&fleet, &run).await
                && e.code != ErrorCode::NotFound
            {
                tracing::warn!(fleet, run, error = %e.message, "cannot reload the run; trying again");
                self.reload_later(&fleet, &run);
            }
        }
        for fleet in self.replica.held_fleets() {
            self.deliver_actions(&fleet).await;
        }
    }

    fn reload_later(&self, fleet: &str, run: &str) {
        if let Ok(mut r) = self.to_reload.lock() {
            r.insert((fleet.to_string(), run.to_string()));
        }
    }

    /// Gives a held fleet's pending handed-over actions to their runs.
    async fn deliver_actions(self: &Arc<Self>, fleet: &str) {
        let Ok(pending) = self.store.pending_actions(fleet).await else {
            return;
        };
        for action in pending {
            let fresh = self
                .replica
                .delivered
                .lock()
                .map(|mut d| d.entry(fleet.to_string()).or_default().insert(action.id))
                .unwrap_or(false);
            if !fresh {
                continue;
            }
            let input = serde_json::from_value::<Input>(action.input.clone()).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidRequestContent,
                    format!("unreadable action: {e}"),
                    "",
                )
            });
            let sent = match input {
                Ok(input) => match self.handle(fleet, &action.run).await {
                    Ok(tx) => tx
                        .send(Msg::Remote {
                            run: action.run.clone(),
                            id: action.id,
                            input,
                        })
                        .map_err(|_| ApiError::conflict("the run's reconciler stopped; try again")),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match sent {
                Ok(()) => {}
                // The run is gone or the action unreadable: that is the answer.
                Err(e) if e.code != ErrorCode::Conflict => {
                    let _ = self
                        .store
                        .finish_action(action.id, &json!({"error": e}))
                        .await;
                }
                // This replica cannot carry it out now (it lost the fleet, or the run's task is
                // being rebuilt): it stays pending for whoever drives the fleet next.
                Err(_) => self.undeliver(fleet, action.id),
            }
        }
    }

    /// Forgets that an action was handed to a run, so that it is handed over again.
    fn undeliver(&self, fleet: &str, id: i64) {
        if let Ok(mut delivered) = self.replica.delivered.lock()
            && let Some(ids) = delivered.get_mut(fleet)
        {
            ids.remove(&id);
        }
    }

    /// Runs the coordinator forever: a pass every third of the lease time, and at once when an
    /// action is handed to a fleet.
    pub async fn coordinate(self: Arc<Self>) {
        let mut notices = self.store.notices();
        let every = self.replica.ttl / 3;
        let renewing = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if renewing
                    .replica
                    .closing
                    .load(std::sync::atomic::Ordering::SeqCst)
                {
                    return;
                }
                renewing.renew_once().await;
            }
        });
        let mut next = Instant::now() + every;
        loop {
            if self
                .replica
                .closing
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                return;
            }
            let wait = tokio::time::sleep_until(next.into());
            tokio::select! {
                _ = wait => {
                    self.balance_once(self.alive.load(std::sync::atomic::Ordering::Relaxed).max(1)).await;
                    next = Instant::now() + every;
                }
                notice = notices.recv() => match notice {
                    // An action on a fleet nobody drives makes this replica take it.
                    Ok(Notice::Actions { fleet }) if self.own(&fleet).await => {
                        self.deliver_actions(&fleet).await;
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        notices = self.store.notices();
                    }
                    _ => {}
                },
            }
        }
    }

    /// Ends a run's driving at once (the run was replaced or deleted); it is loaded afresh when
    /// next needed.
    pub fn retire(&self, fleet: &str, run: &str) {
        let task = self.fleets.lock().ok().and_then(|f| f.get(fleet).cloned());
        if let Some(task) = task {
            if let Ok(mut driving) = task.driving.lock() {
                driving.remove(run);
            }
            let _ = task.tx.send(Msg::Retire {
                run: run.to_string(),
            });
        }
    }

    /// Hands the fleet's driver, as built from its configuration now, to the task driving the
    /// fleet, if one runs here and drives with another: a changed configuration reaches runs
    /// already going, without a restart.
    pub fn use_driver(&self, fleet: &str, driver: &Arc<dyn Driver>) {
        let Ok(mut fleets) = self.fleets.lock() else {
            return;
        };
        if let Some(task) = fleets.get_mut(fleet)
            && !Arc::ptr_eq(&task.driver, driver)
        {
            task.driver = driver.clone();
            let _ = task.tx.send(Msg::Driver(driver.clone()));
        }
    }

    /// Builds the fleet's driver again if its configuration changed, and hands it to the task
    /// driving the fleet ([`Runs::use_driver`]).
    pub async fn driver_changed(&self, fleet: &str) {
        if let Ok(driver) = self.drivers.for_fleet(self.store.as_ref(), fleet).await {
            self.use_driver(fleet, &driver);
        }
    }

    /// Reads the fleet's freezes and budgets and hands them to the task driving the fleet, if
    /// one runs here (a write on another replica reaches it at the next catalog pass, which
    /// calls this too).
    pub async fn rules_changed(&self, fleet: &str) {
        let Ok(rules) = crate::fleet_rules::rules_of(self.store.as_ref(), fleet).await else {
            return;
        };
        if let Ok(fleets) = self.fleets.lock()
            && let Some(task) = fleets.get(fleet)
        {
            let _ = task.tx.send(Msg::Rules(rules));
        }
    }

    /// Whether this replica holds the fleet's lease (drives its runs, if any).
    pub fn holds_lease(&self, fleet: &str) -> bool {
        self.replica.fence(fleet).is_some()
    }

    /// Each partition of the fleet's budgets with the members in flight in it, as the task
    /// driving the fleet counts them; `None` when no task drives it here.
    pub async fn budget_partitions(
        &self,
        fleet: &str,
    ) -> Option<Vec<(flotilla_engine::budget::Partition, u64)>> {
        let (reply, answer) = oneshot::channel();
        {
            let fleets = self.fleets.lock().ok()?;
            fleets.get(fleet)?.tx.send(Msg::Partitions { reply }).ok()?;
        }
        answer.await.ok()
    }

    /// Hands a member's observation to the task driving its fleet, if one runs here; false
    /// when none does (the caller records it itself).
    pub fn observed(&self, fleet: &str, member: &str, cluster: Cluster) -> bool {
        let Ok(fleets) = self.fleets.lock() else {
            return false;
        };
        fleets.get(fleet).is_some_and(|task| {
            task.tx
                .send(Msg::Observed {
                    member: member.to_string(),
                    cluster,
                })
                .is_ok()
        })
    }

    /// Loads every run of a fleet that is not finished and starts its reconciler (when this
    /// replica takes the fleet's lease). What cannot be loaded now is tried again by the
    /// coordinator.
    async fn resume_fleet(self: &Arc<Self>, fleet: &str) {
        let runs = match crate::run_head::heads(self.store.as_ref(), fleet).await {
            Ok(runs) => runs,
            Err(e) => {
                tracing::error!(fleet, error = %e, "cannot list the fleet's runs; trying again");
                if let Ok(mut r) = self.to_resume.lock() {
                    r.insert(fleet.to_string());
                }
                return;
            }
        };
        for (name, head) in runs {
            if head.is_over() || head.state() == "NotStarted" {
                continue;
            }
            if let Err(e) = self.handle(fleet, &name).await {
                tracing::error!(fleet, run = %name, error = %e.message, "cannot resume the run; trying again");
                self.reload_later(fleet, &name);
            }
        }
    }

    /// The task driving `fleet` under the lease held now, started if there is none.
    async fn fleet_task(self: &Arc<Self>, fleet: &str) -> Result<FleetTask, ApiError> {
        let Some(fence) = self.replica.fence(fleet) else {
            return Err(ApiError::conflict(format!(
                "this replica does not drive fleet {fleet:?} now; try again"
            )));
        };
        let live = |runs: &Runs| -> Option<FleetTask> {
            runs.fleets
                .lock()
                .ok()?
                .get(fleet)
                .filter(|t| t.epoch == fence.epoch && !t.tx.is_closed())
                .cloned()
        };
        if let Some(task) = live(self) {
            return Ok(task);
        }
        let driver = self.drivers.for_fleet(self.store.as_ref(), fleet).await?;
        // The member table: every run of the fleet decides on it, so a cluster another run
        // upgraded is never upgraded again.
        let table = member_table(&self.store, fleet).await?;
        let rules = crate::fleet_rules::rules_of(self.store.as_ref(), fleet)
            .await
            .map_err(|e| {
                ApiError::conflict(format!("cannot read the fleet's freezes and budgets: {e}"))
            })?;
        let mut fleets = self
            .fleets
            .lock()
            .map_err(|_| ApiError::conflict("poisoned"))?;
        if let Some(task) = fleets
            .get(fleet)
            .filter(|t| t.epoch == fence.epoch && !t.tx.is_closed())
        {
            return Ok(task.clone());
        }
        // The lease may have been lost (or taken again) meanwhile.
        if self.replica.fence(fleet) != Some(fence.clone()) {
            return Err(ApiError::conflict(format!(
                "this replica does not drive fleet {fleet:?} now; try again"
            )));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let task = FleetTask {
            epoch: fence.epoch,
            tx: tx.clone(),
            driving: Default::default(),
            driver: driver.clone(),
        };
        if let Some(old) = fleets.insert(fleet.to_string(), task.clone()) {
            let _ = old.tx.send(Msg::Abandon);
        }
        let mut engine = FleetEngine::from_shared(table, Catalog::default()).recording();
        let _ = apply_rules(&mut engine, now(), rules);
        let actor = FleetActor {
            fleet: fleet.to_string(),
            engine,
            meta: HashMap::new(),
            runs: self.clone(),
            driver,
            tx,
            fence,
            driving: task.driving.clone(),
            pace: ForecastPace::default(),
        };
        tokio::spawn(actor.run(rx));
        Ok(task)
    }

    /// The mailbox of the task driving `run`'s fleet, with the run loaded into it.
    async fn handle(
        self: &Arc<Self>,
        fleet: &str,
        run: &str,
    ) -> Result<mpsc::UnboundedSender<Msg>, ApiError> {
        let task = self.fleet_task(fleet).await?;
        if task.drives(run) {
            return Ok(task.tx);
        }
        let _loading = self.loading.lock().await;
        if task.drives(run) {
            return Ok(task.tx);
        }
        let loaded = self.load(fleet, run).await?;
        let (reply, answer) = oneshot::channel();
        task.tx
            .send(Msg::Adopt {
                run: run.to_string(),
                loaded: Box::new(loaded),
                reply,
            })
            .map_err(|_| ApiError::conflict("the fleet's reconciler stopped; try again"))?;
        answer
            .await
            .map_err(|_| ApiError::conflict("the fleet's reconciler stopped; try again"))??;
        Ok(task.tx)
    }

    /// Rebuilds a run from the store: its snapshot, then its input log replayed into a fresh
    /// engine (deterministic, so the state is the same), and its recorded intents.
    async fn load(&self, fleet: &str, run: &str) -> Result<LoadedRun, ApiError> {
        let (text, _) = self
            .store
            .get_raw(fleet, Kind::Run, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NotFound,
                    format!("update run {run:?} does not exist"),
                    "updateRun",
                )
            })?;
        let base = run_base(&text)?;
        drop(text);
        let (internal, snapshot_etag) = self
            .store
            .get_raw(fleet, Kind::RunSnapshot, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?
            .ok_or_else(|| {
                ApiError::conflict(format!("update run {run:?} has no stored snapshot"))
            })?;
        let snapshot = read_snapshot(&base, &internal)?;
        drop(internal);
        let (mut engine, _) = engine_from_snapshot(run, &snapshot)?;
        let log = self
            .store
            .run_log(fleet, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?;
        // The checkpoint, laid over the run as created, then the log written after it.
        if let Some(checkpoint) = &log.checkpoint {
            engine.restore(checkpoint).map_err(|why| {
                ApiError::conflict(format!(
                    "update run {run:?} cannot be rebuilt from its checkpoint: {why}"
                ))
            })?;
        }
        self.metrics.count_rebuilt(log.checkpoint.is_some());
        for entry in &log.entries {
            crate::journal::replay(&mut engine, entry).map_err(|why| {
                ApiError::conflict(format!(
                    "update run {run:?} cannot be rebuilt from its log: {why}"
                ))
            })?;
        }
        while engine.poll_command().is_some() {}
        while engine.poll_event().is_some() {}
        let intents = self
            .store
            .intents(fleet, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?;
        Ok(LoadedRun {
            engine,
            base,
            snapshot_etag,
            intents,
            log_cost: log_cost(&log.entries),
            checkpoint_bytes: log.checkpoint.map_or(0, |c| c.len() as u64),
        })
    }
}

/// What the fleet's task keeps for each run it drives, beside the run's engine.
struct RunMeta {
    /// The run resource without its status.
    base: Value,
    /// The run's end as last forecast, shown in its status while it moves.
    forecast: Option<RunForecast>,
    /// Where the status sits in the run's document, found at the first status write.
    around: Option<StatusPlace>,
    /// Attempt → operation id, once the driver named it.
    operations: HashMap<u64, String>,
    /// Attempts a driver task is still following.
    outstanding: std::collections::HashSet<u64>,
    /// The status changed since it was last written.
    status_dirty: bool,
    /// Tells whether what a reader sees of the run changed.
    status: StatusChanges,
    last_status_write: Option<Instant>,
    /// The size of the run's document as last written, in bytes: what a reader of each new
    /// version of it puts together and sends.
    status_bytes: usize,
    /// Each chunk of the run's members ([`Engine::status_chunks`]) at its revision and size
    /// when last written; empty until the task first writes them all.
    chunks_written: Vec<(u64, usize)>,
    /// The eTag of the run's snapshot when it was loaded: a batch is written only while it is
    /// the same, so a run replaced or deleted (through any replica) stops being driven.
    snapshot_etag: String,
    /// Log entries of steps that showed nothing, written with the run's next batch; held as the
    /// engine was given them (a cluster is a shared pointer, not a JSON tree) until written.
    unwritten: Vec<Delivered>,
    /// What the log written since the run's last checkpoint costs to replay ([`log_cost`]),
    /// and that checkpoint's size.
    log_cost: u64,
    checkpoint_bytes: u64,
    /// When the run was loaded: a finished run loaded for an action (a retry of a Failed run)
    /// stays until the action, which comes in the next message, has been applied.
    loaded_at: Instant,
}

/// How long a finished run loaded for an action is kept loaded at least.
const LOADED_KEPT: Duration = Duration::from_secs(10);

impl RunMeta {
    /// Counts log entries written, and whether the run is due a checkpoint after them.
    fn checkpoint_due(&mut self, entries: &[String], after: u64) -> bool {
        self.log_cost += log_cost(entries);
        !entries.is_empty() && self.log_cost >= after.max(self.checkpoint_bytes)
    }

    /// How often a status nobody waits for is written: [`STATUS_EVERY`] per started MiB of the
    /// document. A write stores only what changed, but every reader of a new version reads the
    /// whole document (the answer cache keeps one version), so the pace follows its size.
    fn status_every(&self) -> Duration {
        let mib = u32::try_from(self.status_bytes >> 20).unwrap_or(u32::MAX);
        STATUS_EVERY.saturating_mul(mib.saturating_add(1))
    }
}

/// What one step did to one run, to be written in the run's batch.
#[derive(Default)]
struct RunStep {
    replies: Vec<(Reply, Result<(), ApiError>)>,
    durations: Vec<UpgradeDuration>,
    action_results: Vec<(i64, Value)>,
    finished_attempts: Vec<u64>,
    intents: Vec<Intent>,
    commands: Vec<Command>,
    events: Vec<Value>,
    gates_changed: bool,
    structural: bool,
}

/// The task that drives every run of one fleet: it owns the fleet's [`FleetEngine`], so the
/// rules between runs (one operation per cluster) are the engine's, decided in one place.
struct FleetActor {
    fleet: String,
    engine: FleetEngine,
    meta: HashMap<String, RunMeta>,
    runs: Arc<Runs>,
    driver: Arc<dyn Driver>,
    tx: mpsc::UnboundedSender<Msg>,
    /// The fleet lease this task drives under; every batch is written under it.
    fence: Fence,
    /// The runs driven now, as the API sees them.
    driving: Arc<Mutex<std::collections::HashSet<String>>>,
    /// When the moving runs' statuses get their next forecast.
    pace: ForecastPace,
}

impl FleetActor {
    fn member_ref(&self, run: &str, name: &str) -> MemberRef {
        MemberRef {
            name: name.to_string(),
            cluster_resource_id: self
                .engine
                .run(run)
                .and_then(|e| e.cluster_resource_id(name))
                .unwrap_or_default()
                .to_string(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        loop {
            let mut woke_at = None;
            let engine_deadline = self.engine.next_wakeup().map(|at| {
                let wait = (at.unix() as f64
                    - SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64()))
                .max(0.0);
                Instant::now() + Duration::from_secs_f64(wait)
            });
            // A status left unwritten by a busy step is written at the latest this much later.
            let flush_deadline = self
                .meta
                .values()
                .filter(|m| m.status_dirty)
                .map(|m| {
                    m.last_status_write
                        .map_or_else(Instant::now, |t| t + m.status_every())
                })
                .min();
            let deadline = [engine_deadline, flush_deadline, self.pace.due()]
                .into_iter()
                .flatten()
                .min();
            let first = match deadline {
                Some(deadline) => {
                    tokio::select! {
                        m = rx.recv() => match m { Some(m) => Some(m), None => break },
                        _ = tokio::time::sleep_until(deadline.into()) => {
                            if engine_deadline == Some(deadline) {
                                woke_at = Some(deadline);
                            }
                            None
                        }
                    }
                }
                None => match rx.recv().await {
                    Some(m) => Some(m),
                    None => break,
                },
            };
            let mut batch: Vec<Msg> = first.into_iter().collect();
            while let Ok(m) = rx.try_recv() {
                batch.push(m);
            }
            if !self.step(batch, woke_at).await {
                break;
            }
            self.forecast_if_due();
        }
        if let Ok(mut driving) = self.driving.lock() {
            driving.clear();
        }
        // Whatever was queued is answered or handed over again, never silently dropped.
        rx.close();
        while let Ok(msg) = rx.try_recv() {
            self.turn_away(msg);
        }
    }

    /// Answers a message this task will not carry out: an action is refused, a handed-over
    /// action is handed over again.
    fn turn_away(&self, msg: Msg) {
        match msg {
            Msg::Action { reply, .. } => {
                let _ = reply.send(Err(Refusal::Api(ApiError::conflict(
                    "the fleet's reconciler stopped; try again",
                ))));
            }
            Msg::Adopt { reply, .. } => {
                let _ = reply.send(Err(ApiError::conflict(
                    "the fleet's reconciler stopped; try again",
                )));
            }
            Msg::Remote { id, .. } => self.runs.undeliver(&self.fleet, id),
            _ => {}
        }
    }

    /// Takes in a run loaded from the store and re-asks the driver about everything it had in
    /// flight when it was last written.
    fn adopt(&mut self, run: String, loaded: LoadedRun) -> Result<(), ApiError> {
        if self.meta.contains_key(&run) {
            return Ok(());
        }
        self.engine.adopt_run(now(), &run, loaded.engine)?;
        let mut status = StatusChanges::new();
        self.engine.refresh_status(&run, &mut status);
        self.meta.insert(
            run.clone(),
            RunMeta {
                base: loaded.base,
                forecast: None,
                operations: HashMap::new(),
                outstanding: Default::default(),
                // The stored status may be older than the log the run was rebuilt from.
                status_dirty: true,
                status,
                last_status_write: None,
                status_bytes: 0,
                chunks_written: Vec::new(),
                around: None,
                snapshot_etag: loaded.snapshot_etag,
                unwritten: Vec::new(),
                log_cost: loaded.log_cost,
                checkpoint_bytes: loaded.checkpoint_bytes,
                loaded_at: Instant::now(),
            },
        );
        if let Ok(mut driving) = self.driving.lock() {
            driving.insert(run.clone());
        }
        let Some(engine) = self.engine.run(&run) else {
            return Ok(());
        };
        let pending = engine.pending_observations();
        let mut follow = Vec::new();
        for intent in loaded.intents.into_iter().filter(|i| !i.finished) {
            if engine.member_attempt(&intent.member) != Some((State::Running, intent.attempt)) {
                continue;
            }
            if pending
                .iter()
                .any(|(m, a)| *m == intent.member && *a == intent.attempt)
            {
                continue;
            }
            let Ok(target) = serde_json::from_value::<TargetRecord>(intent.target.clone()) else {
                continue;
            };
            follow.push((intent, target.into_target()));
        }
        let now = now();
        for (intent, target) in follow {
            let key = operation_key(&self.fleet, &run, intent.attempt);
            // The deadline counts from the first send, not from this restart.
            let spent = intent.recorded_at.map_or(Duration::ZERO, |at| {
                Duration::from_secs(now.unix().saturating_sub(at.unix()).max(0) as u64)
            });
            self.spawn_upgrade(
                &run,
                intent.member.clone(),
                intent.attempt,
                target,
                key,
                intent.operation_id.clone(),
                true,
                spent,
            );
        }
        for (member, attempt) in pending {
            self.spawn_observe(&run, member, attempt);
        }
        Ok(())
    }

    /// Starts the forecast of the fleet's moving runs when one is due: on a copy of the fleet's
    /// engine, off the task, its answer coming back as [`Msg::Forecast`].
    fn forecast_if_due(&mut self) {
        if self.pace.due().is_none_or(|due| due > Instant::now()) {
            return;
        }
        self.pace.dirty = false;
        let any_moving = self
            .engine
            .run_names()
            .any(|r| self.engine.run(r).is_some_and(moving));
        if !any_moving {
            // Nothing to forecast, and nothing spent: a run that starts next is forecast at once.
            self.take_forecast(Some((now(), BTreeMap::new())));
            return;
        }
        self.pace.last = Some(Instant::now());
        self.pace.running = true;
        let copy = self.engine.clone().without_journal();
        let store = self.runs.store.clone();
        let (fleet, driver, tx) = (self.fleet.clone(), self.driver.clone(), self.tx.clone());
        tokio::spawn(async move {
            let params = ForecastParams::default();
            let made = match Durations::load(store.as_ref(), &fleet, &copy, driver, params).await {
                Ok(durations) => tokio::task::spawn_blocking(move || {
                    let at = now();
                    let duration = |r: &str, m: &str| durations.of(&copy, r, m);
                    (at, completions(&copy, at, &params, &duration))
                })
                .await
                .ok(),
                Err(e) => {
                    tracing::warn!(%fleet, error = %e, "cannot read upgrade durations for the runs' forecast");
                    None
                }
            };
            let _ = tx.send(Msg::Forecast { made });
        });
    }

    /// A forecast made off the task: each moving run's status shows it (a run it does not name
    /// shows none).
    fn take_forecast(&mut self, made: Option<(Time, BTreeMap<String, Option<Time>>)>) {
        self.pace.running = false;
        tracing::debug!(fleet = %self.fleet, made = ?made, "the runs' forecast");
        let Some((at, ends)) = made else {
            // Tried again when something next changes.
            return;
        };
        for (run, meta) in self.meta.iter_mut() {
            let forecast = ends.get(run).map(|end| RunForecast {
                completed_time: *end,
                computed_at: at,
            });
            if meta.forecast != forecast {
                meta.forecast = forecast;
                meta.status_dirty = true;
            }
        }
    }

    /// Stops driving a run (replaced, deleted, finished, or its batch could not be written).
    fn drop_run(&mut self, run: &str) {
        self.engine.remove_run(run);
        self.meta.remove(run);
        if let Ok(mut driving) = self.driving.lock() {
            driving.remove(run);
        }
    }

    /// Applies a batch of messages at one instant, records what each run was given, then acts.
    /// Returns false if the fleet's task must end (the lease was lost).
    async fn step(&mut self, batch: Vec<Msg>, woke_at: Option<Instant>) -> bool {
        if batch.iter().any(|m| matches!(m, Msg::Abandon)) {
            // Told to stop: nothing of this batch is applied; actions are answered or handed
            // over again.
            for msg in batch {
                self.turn_away(msg);
            }
            return false;
        }
        let now = now();
        let mut steps: HashMap<String, RunStep> = HashMap::new();
        let mut finish_seen: Option<Instant> = None;
        let mut action_at: Option<Instant> = None;
        // What users and clusters say can move the runs' ends.
        self.pace.dirty |= batch.iter().any(|m| {
            matches!(
                m,
                Msg::Action { .. }
                    | Msg::Remote { .. }
                    | Msg::Observed { .. }
                    | Msg::Adopt { .. }
                    | Msg::Driver(_)
            )
        });
        for msg in batch {
            match msg {
                Msg::Abandon => {}
                Msg::Observed { member, cluster } => {
                    let _ = self
                        .engine
                        .handle(now, FleetInput::Observed { member, cluster });
                }
                Msg::Adopt { run, loaded, reply } => {
                    let _ = reply.send(self.adopt(run, *loaded));
                }
                Msg::Copy { reply } => {
                    let _ = reply.send(Box::new(self.engine.clone().without_journal()));
                }
                Msg::Forecast { made } => self.take_forecast(made),
                Msg::Driver(driver) => self.driver = driver,
                Msg::Partitions { reply } => {
                    let _ = reply.send(
                        self.engine
                            .budget_partitions()
                            .map(|(p, n)| (p.clone(), n))
                            .collect(),
                    );
                }
                Msg::Rules(rules) => {
                    self.pace.dirty |= apply_rules(&mut self.engine, now, rules);
                }
                Msg::Retire { run } => self.drop_run(&run),
                Msg::Remote { run, id, input } => {
                    if !self.meta.contains_key(&run) {
                        // Handed over again on the next pass, when the run is loaded.
                        self.runs.undeliver(&self.fleet, id);
                        continue;
                    }
                    action_at = Some(action_at.unwrap_or_else(Instant::now));
                    let result = self.engine.handle(
                        now,
                        FleetInput::Run {
                            run: run.clone(),
                            input,
                        },
                    );
                    steps.entry(run).or_default().action_results.push((
                        id,
                        match result {
                            Ok(()) => json!({"ok": true}),
                            Err(e) => json!({"error": e}),
                        },
                    ));
                }
                Msg::Action {
                    run,
                    input,
                    reply,
                    at,
                } => {
                    if !self.meta.contains_key(&run) {
                        let _ = reply.send(Err(Refusal::NotLoaded));
                        continue;
                    }
                    action_at = Some(action_at.map_or(at, |a: Instant| a.min(at)));
                    let result = self.engine.handle(
                        now,
                        FleetInput::Run {
                            run: run.clone(),
                            input,
                        },
                    );
                    steps.entry(run).or_default().replies.push((reply, result));
                }
                Msg::Input {
                    run,
                    input,
                    observed_at,
                } => {
                    let Some(meta) = self.meta.get_mut(&run) else {
                        // A follower of a run no longer driven: its answer goes nowhere.
                        continue;
                    };
                    let step = steps.entry(run.clone()).or_default();
                    match &input {
                        Input::OperationFinished { attempt, .. } => {
                            step.finished_attempts.push(*attempt);
                            meta.outstanding.remove(attempt);
                            if let Some(t) = observed_at {
                                finish_seen = Some(finish_seen.map_or(t, |f| f.min(t)));
                            }
                        }
                        Input::Observed {
                            operation: Some((attempt, OperationProgress::NotRunning)),
                            ..
                        } => {
                            meta.outstanding.remove(attempt);
                        }
                        Input::OperationAccepted {
                            attempt,
                            operation_id,
                            ..
                        } => {
                            meta.operations.insert(*attempt, operation_id.clone());
                        }
                        _ => {}
                    }
                    let _ = self.engine.handle(now, FleetInput::Run { run, input });
                }
            }
        }
        self.engine.settle(now);
        // Members' last operations (API.md: `status.lastOperationId`, `lastOperationError`):
        // an upgrade sent names its operation and clears the error; a failure sets it.
        let mut operations: BTreeMap<String, Value> = BTreeMap::new();
        // The run each member's newest operation of this step belongs to.
        let mut sent_by: HashMap<String, String> = HashMap::new();
        while let Some(FleetCommand { run, command }) = self.engine.poll_command() {
            if let Command::StartUpgrade {
                member, attempt, ..
            } = &command
            {
                operations.insert(
                    member.clone(),
                    json!({"lastOperationId": operation_key(&self.fleet, &run, *attempt), "lastOperationError": null}),
                );
                sent_by.insert(member.clone(), run.clone());
            }
            let step = steps.entry(run).or_default();
            if let Command::StartUpgrade {
                member,
                attempt,
                target,
            } = &command
            {
                step.intents.push(Intent {
                    attempt: *attempt,
                    member: member.clone(),
                    target: serde_json::to_value(TargetRecord::from(target)).unwrap_or_default(),
                    operation_id: None,
                    finished: false,
                    recorded_at: Some(now),
                });
            }
            step.commands.push(command);
        }
        while let Some(FleetEvent { run, event }) = self.engine.poll_event() {
            // An upgrade that succeeded: how long it took, for forecasts.
            let duration = (event.kind == EventType::MemberSucceeded)
                .then(|| {
                    let member = event.member.clone()?;
                    let engine = self.engine.run(&run)?;
                    let start = engine.member_started(&member)?;
                    Some(UpgradeDuration {
                        member,
                        upgrade_type: engine.upgrade().upgrade_type.as_str().to_string(),
                        seconds: (event.time.unix() - start.unix()).max(0),
                        finished_at: event.time,
                    })
                })
                .flatten();
            // A failure belongs with the operation it ended, not with one another run sent
            // the member in the same step.
            if event.kind == EventType::MemberFailed
                && let Some(member) = &event.member
                && sent_by.get(member).is_none_or(|r| *r == run)
            {
                let error = match &event.error {
                    Some(e) => json!({"code": e.code, "message": e.message}),
                    None => json!({"code": "UpgradeFailed", "message": event.message}),
                };
                operations
                    .entry(member.clone())
                    .or_insert_with(|| json!({}))["lastOperationError"] = error;
            }
            self.pace.dirty |= matches!(
                event.kind,
                EventType::RunStarted
                    | EventType::RunStopped
                    | EventType::MemberSucceeded
                    | EventType::MemberFailed
                    | EventType::MemberSkipped
                    | EventType::GateCompleted
                    | EventType::GateSkipped
                    | EventType::WaitSkipped
            );
            let step = steps.entry(run).or_default();
            step.durations.extend(duration);
            // A HealthCheck gate that fails is a gate resource whose state changes too
            // (SEMANTICS §10): without it, GET …/gates answered Pending for a failed gate.
            step.gates_changed |= matches!(
                event.kind,
                EventType::GatePending
                    | EventType::GateCompleted
                    | EventType::GateSkipped
                    | EventType::GateFailed
            );
            // Runs, stages, groups, gates and waits changing are shown at once; member churn is
            // what gets batched.
            step.structural |= !matches!(
                event.kind,
                EventType::MemberPending
                    | EventType::MemberStarted
                    | EventType::MemberReattached
                    | EventType::MemberSucceeded
                    | EventType::MemberFailed
                    | EventType::MemberSkipped
                    | EventType::MemberStopped
            );
            self.runs.metrics.observe_event(&self.fleet, &event);
            step.events
                .push(serde_json::to_value(&event).unwrap_or_default());
        }
        // What the fleet now sees of its clusters (observations, upgrades that succeeded) lands
        // in the members before the runs' progress does, so whoever sees a run move on sees the
        // clusters it changed, and a task started later loads the table as it is.
        let mut statuses: Vec<(String, Value)> = self
            .engine
            .take_changed_members()
            .into_iter()
            .map(|(member, cluster)| {
                let operation = operations.remove(member.as_ref());
                (
                    member.to_string(),
                    member_status(&cluster.spec(), now, operation),
                )
            })
            .collect();
        for (member, operation) in operations {
            if let Some(cluster) = self.engine.cluster(&member) {
                let status = member_status(&cluster.spec(), now, Some(operation));
                statuses.push((member, status));
            }
        }
        if let Err(e) = self
            .runs
            .store
            .set_statuses(&self.fleet, Kind::Member, &statuses)
            .await
        {
            // The members show an older observation until the next change; the runs' own
            // records are unaffected, and a task started later observes again.
            tracing::warn!(fleet = %self.fleet, error = %e, "cannot record the members' clusters");
        }
        // Each run driven gets its batch when it was given something, has something to say,
        // or has a status left to write.
        // Runs with upgrades to send are written first, then those with callers waiting, then
        // the rest by how long their statuses have waited.
        let mut names: Vec<String> = self.meta.keys().cloned().collect();
        names.sort_by_key(|run| {
            let step = steps.get(run);
            (
                step.is_none_or(|s| s.commands.is_empty()),
                step.is_none_or(|s| s.replies.is_empty() && s.action_results.is_empty()),
                self.meta.get(run).and_then(|m| m.last_status_write),
            )
        });
        let budget = Instant::now() + STATUS_BUDGET;
        // What made this step's starts possible, and when (SEMANTICS: no polling delay).
        let trigger = finish_seen
            .map(|t| ("slot", t))
            .or(action_at.map(|t| ("action", t)))
            .or(woke_at.map(|t| ("timer", t)));
        let mut fenced = false;
        let mut later: Vec<(String, RunStep, RunBatch)> = Vec::new();
        for run in names {
            let fresh = self.engine.take_journal(&run);
            let mut step = steps.remove(&run).unwrap_or_default();
            let Some(meta) = self.meta.get_mut(&run) else {
                continue;
            };
            let mut log = std::mem::take(&mut meta.unwritten);
            log.extend(fresh);
            // Whether what a reader sees changed, for a run that was given anything (news of a
            // lock on a member the run has not reached changes nothing).
            let given = !log.is_empty() || !step.events.is_empty() || !step.commands.is_empty();
            if given && self.engine.refresh_status(&run, &mut meta.status) != Some(false) {
                meta.status_dirty = true;
            }
            let Some(engine) = self.engine.run(&run) else {
                continue;
            };
            // The status is a view of the log: written at once when someone waits for it (an
            // API action) or the run ends, otherwise at most every `status_every`, so a large
            // run's many small steps do not each rewrite its whole status.
            let urgent = step.structural
                || !step.replies.is_empty()
                || !step.action_results.is_empty()
                || engine.is_finished();
            // A status that is only due (nobody waits for it) is rendered while this step's
            // budget lasts, oldest first; the rest wait for a later step, so many large runs
            // rewriting their statuses never hold up the fleet's dispatch.
            let due = meta
                .last_status_write
                .is_none_or(|t| t.elapsed() >= meta.status_every())
                && Instant::now() < budget;
            let write_status = meta.status_dirty && (urgent || due);
            // What this step shows of the run: events, intents, results, answers, a status.
            // A step that shows nothing (a lock taken elsewhere that changed no message, say)
            // keeps its log entries for the run's next batch: nothing anyone saw depends on
            // them, and a run rebuilt without them is told the fleet's locks again at its
            // first turn. So a hundred runs hearing of one start cost no hundred writes.
            let shows = !step.events.is_empty()
                || !step.intents.is_empty()
                || !step.finished_attempts.is_empty()
                || !step.action_results.is_empty()
                || !step.replies.is_empty()
                || !step.commands.is_empty()
                || write_status
                || engine.is_finished();
            // Entries held back are bounded: past UNWRITTEN_MAX they are written anyway.
            if !shows && log.len() <= UNWRITTEN_MAX {
                meta.unwritten = log;
                continue;
            }
            if write_status {
                meta.status_dirty = false;
                meta.last_status_write = Some(Instant::now());
            }
            let (body, head) = match write_status.then(|| status_document(meta, engine)) {
                None => (None, None),
                Some(Ok((document, head))) => (Some(document), Some(head)),
                Some(Err(e)) => {
                    tracing::error!(fleet = %self.fleet, run, error = %e, "cannot render the run's status");
                    (None, None)
                }
            };
            let gates = if step.gates_changed {
                gate_resources(&self.fleet, &run, engine, &meta.base["systemData"])
            } else {
                Vec::new()
            };
            let log = crate::journal::encode(log);
            // A checkpoint after this batch's entries replaces the log before them.
            let after = self
                .runs
                .checkpoint_after
                .load(std::sync::atomic::Ordering::Relaxed);
            let checkpoint = if meta.checkpoint_due(&log, after) {
                match engine.checkpoint(now) {
                    Ok(text) => {
                        meta.log_cost = 0;
                        meta.checkpoint_bytes = text.len() as u64;
                        self.runs.metrics.count_checkpoint();
                        Some(text)
                    }
                    Err(e) => {
                        tracing::warn!(fleet = %self.fleet, run, error = %e, "cannot checkpoint the run");
                        None
                    }
                }
            } else {
                None
            };
            let mut batch = RunBatch {
                fleet: self.fleet.clone(),
                run: run.clone(),
                log,
                checkpoint,
                intents: std::mem::take(&mut step.intents),
                finished_attempts: std::mem::take(&mut step.finished_attempts),
                events: std::mem::take(&mut step.events),
                run_body: body,
                run_head: head,
                gates,
                action_results: std::mem::take(&mut step.action_results),
                durations: std::mem::take(&mut step.durations),
                fence: Some(self.fence.clone()),
                snapshot_etag: Some(meta.snapshot_etag.clone()),
            };
            // A batch someone waits for, or with upgrades to send, is written at once, so one
            // run's upgrades never wait for another's write; the step's other batches (the
            // news other runs heard) are written together after, with one sync to disk.
            if step.commands.is_empty()
                && step.replies.is_empty()
                && batch.action_results.is_empty()
            {
                later.push((run, step, batch));
                continue;
            }
            let result = self.runs.store.write_run_batch(&batch).await;
            if !self.written(&run, step, &mut batch, result, trigger, &mut steps) {
                fenced = true;
                break;
            }
        }
        if !fenced && !later.is_empty() {
            let (runs, (steps_later, mut batches)): (Vec<String>, (Vec<RunStep>, Vec<RunBatch>)) =
                later.into_iter().map(|(r, s, b)| (r, (s, b))).unzip();
            // Refused whole, every batch gets the refusal (a lost lease ends the step at the
            // first).
            let results = self
                .runs
                .store
                .write_run_batches(&batches)
                .await
                .unwrap_or_else(|e| {
                    let fence = matches!(e, StoreError::Fenced(_));
                    let why = e.to_string();
                    runs.iter()
                        .map(|_| {
                            Err(if fence {
                                StoreError::Fenced(why.clone())
                            } else {
                                StoreError::Unavailable(why.clone())
                            })
                        })
                        .collect()
                });
            for (((run, step), batch), result) in
                runs.iter().zip(steps_later).zip(&mut batches).zip(results)
            {
                if !self.written(run, step, batch, result, trigger, &mut steps) {
                    fenced = true;
                    break;
                }
            }
        }
        if fenced {
            return false;
        }
        // A run that is over, with nothing left to follow, is no longer driven.
        let done: Vec<String> = self
            .meta
            .iter()
            .filter(|(run, meta)| {
                meta.outstanding.is_empty()
                    && !meta.status_dirty
                    && meta.unwritten.is_empty()
                    && meta.loaded_at.elapsed() >= LOADED_KEPT
                    && self.engine.run(run).is_some_and(|e| e.is_finished())
            })
            .map(|(run, _)| run.clone())
            .collect();
        for run in done {
            self.drop_run(&run);
        }
        true
    }

    /// What follows a run's batch, written or refused. Returns false when the fleet's lease
    /// was lost (every waiting caller is answered so), and the step must end.
    fn written(
        &mut self,
        run: &str,
        mut step: RunStep,
        batch: &mut RunBatch,
        result: Result<(), StoreError>,
        trigger: Option<(&'static str, Instant)>,
        steps: &mut HashMap<String, RunStep>,
    ) -> bool {
        // The events go on to the live streams once written.
        step.events = std::mem::take(&mut batch.events);
        // Handed-over actions are done with either way: answered now, or pending again.
        for (id, _) in &batch.action_results {
            self.runs.undeliver(&self.fleet, *id);
        }
        match result {
            Ok(()) => self.carry_out(run, step, trigger),
            Err(StoreError::Fenced(why)) => {
                tracing::warn!(fleet = %self.fleet, run, why, "stopped driving the fleet");
                self.runs.abandon(&self.fleet, self.fence.epoch);
                let lost = || {
                    Err(Refusal::Api(ApiError::conflict(
                        "this replica lost the fleet's lease; try again",
                    )))
                };
                for (reply, _) in step.replies {
                    let _ = reply.send(lost());
                }
                for (_, step) in steps.drain() {
                    for (reply, _) in step.replies {
                        let _ = reply.send(lost());
                    }
                }
                return false;
            }
            Err(e) => {
                let message = if let StoreError::Superseded(why) = &e {
                    tracing::info!(fleet = %self.fleet, run, why, "the run changed under its task; no longer driving it");
                    "the update run was replaced or deleted".to_string()
                } else {
                    tracing::error!(fleet = %self.fleet, run, error = %e, "cannot record the run's progress; reloading it");
                    self.runs.reload_later(&self.fleet, run);
                    format!("the change could not be recorded: {e}")
                };
                for (reply, _) in step.replies {
                    let _ = reply.send(Err(Refusal::Api(ApiError::conflict(message.clone()))));
                }
                // Its engine went ahead of its log: it is dropped, and loaded again from the
                // log when next needed.
                self.drop_run(run);
            }
        }
        true
    }

    /// After a run's batch is written: answers its callers, publishes its events and sends
    /// its commands to the driver.
    fn carry_out(&mut self, run: &str, step: RunStep, trigger: Option<(&'static str, Instant)>) {
        for (reply, result) in step.replies {
            let _ = reply.send(result.map_err(Refusal::Api));
        }
        for event in step.events {
            let _ = self.runs.events.send(RunEvent {
                fleet: self.fleet.clone(),
                run: run.to_string(),
                event,
            });
        }
        for command in step.commands {
            match command {
                Command::StartUpgrade {
                    member,
                    attempt,
                    target,
                } => {
                    if let Some((kind, since)) = trigger {
                        self.runs
                            .metrics
                            .record_dispatch_delay(kind, since.elapsed());
                    }
                    let key = operation_key(&self.fleet, run, attempt);
                    self.spawn_upgrade(
                        run,
                        member,
                        attempt,
                        target,
                        key,
                        None,
                        false,
                        Duration::ZERO,
                    );
                }
                Command::Observe { member, attempt } => self.spawn_observe(run, member, attempt),
                Command::Evaluate {
                    subject,
                    round,
                    checks,
                    context,
                } => self.spawn_evaluate(run, subject, round, checks, context),
            }
        }
    }

    /// What lets an attempt's follower send: this fleet's lease at the epoch held now.
    fn permit(&self, run: &str, attempt: u64) -> LeasePermit {
        LeasePermit {
            runs: self.runs.clone(),
            fleet: self.fleet.clone(),
            run: run.to_string(),
            epoch: self.fence.epoch,
            attempt,
        }
    }

    fn report(&self, run: &str) -> RunReport {
        RunReport {
            tx: self.tx.clone(),
            run: run.to_string(),
        }
    }

    /// Sends an upgrade (unless recovering one the driver may already have) and follows it to a
    /// definitive answer (`crate::operation::drive`).
    #[allow(clippy::too_many_arguments)]
    fn spawn_upgrade(
        &mut self,
        run: &str,
        member: String,
        attempt: u64,
        target: Target,
        key: String,
        known: Option<String>,
        recovering: bool,
        spent: Duration,
    ) {
        let driver = self.driver.clone();
        let report = self.report(run);
        let permit = self.permit(run, attempt);
        let who = self.member_ref(run, &member);
        if let Some(meta) = self.meta.get_mut(run) {
            meta.outstanding.insert(attempt);
        }
        tokio::spawn(async move {
            let begin = match known {
                Some(id) => crate::operation::Begin::Follow(id),
                None if recovering => {
                    // Taken over from another replica: a send it began just before its lease ran
                    // out may still be on its way to the driver; give it a lease's time to land
                    // before asking the driver whether it knows the key (SEMANTICS §7).
                    if let Some(wait) = permit.runs.replica.settling(&permit.fleet, permit.epoch)
                        && permit.runs.store.shared()
                    {
                        tokio::time::sleep(wait).await;
                    }
                    crate::operation::Begin::Ask
                }
                None => crate::operation::Begin::Send,
            };
            let attempt = crate::operation::Attempt {
                who,
                member,
                attempt,
                target,
                key,
                spent,
            };
            crate::operation::drive(driver, report, permit, attempt, begin).await;
        });
    }

    /// Makes a round of evaluations for real, each check at once, and hands each result back
    /// as an input at the instant it comes (SEMANTICS §10).
    fn spawn_evaluate(
        &mut self,
        run: &str,
        subject: flotilla_engine::engine::CheckSubject,
        round: u64,
        checks: Arc<flotilla_engine::checks::Checks>,
        context: flotilla_engine::checks::Context,
    ) {
        use flotilla_engine::engine::CheckSubject;
        let report = self.report(run);
        let runs = self.runs.clone();
        let fleet = self.fleet.clone();
        let allow = self.runs.drivers.exec_allowed();
        tokio::spawn(async move {
            use crate::operation::Report;
            // `{label:KEY}` is the member's label, read from its resource when a check uses one.
            let member = match &subject {
                CheckSubject::Soak { member } | CheckSubject::Readiness { member } => Some(member),
                CheckSubject::Gate { .. } => None,
            };
            let mut labels = std::collections::BTreeMap::new();
            if checks.uses("{label:")
                && let Some(member) = member
                && let Ok(Some(resource)) = runs.store.get(&fleet, Kind::Member, member).await
                && let Some(found) = resource.body["properties"]["labels"].as_object()
            {
                labels = found
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect();
            }
            let (context, labels, allow) = (Arc::new(context), Arc::new(labels), Arc::new(allow));
            for check in checks.checks.iter().cloned() {
                let (runs, report, subject) = (runs.clone(), report.clone(), subject.clone());
                let (context, labels, allow) = (context.clone(), labels.clone(), allow.clone());
                let fleet = fleet.clone();
                tokio::spawn(async move {
                    // A provider that cannot be read now, is gone, or no longer serves this
                    // fleet makes the evaluation unavailable (SEMANTICS §10).
                    let provider = runs
                        .providers
                        .get(runs.store.as_ref(), &check.provider)
                        .await
                        .ok()
                        .flatten()
                        .filter(|p| p.serves(&fleet));
                    let outcome = runs
                        .evaluator
                        .evaluate_limited(&check, provider.as_deref(), &context, &labels, &allow)
                        .await;
                    report.input(
                        Input::CheckEvaluated {
                            subject,
                            round,
                            check: check.name,
                            outcome,
                        },
                        None,
                    );
                });
            }
        });
    }

    /// After a stop and start: is the earlier operation still running, and where is the cluster?
    /// Asked until answered (`crate::operation::reattach`); then followed if it still runs.
    fn spawn_observe(&mut self, run: &str, member: String, attempt: u64) {
        let driver = self.driver.clone();
        let report = self.report(run);
        let permit = self.permit(run, attempt);
        let who = self.member_ref(run, &member);
        let key = operation_key(&self.fleet, run, attempt);
        let Some(meta) = self.meta.get_mut(run) else {
            return;
        };
        let operation = meta
            .operations
            .get(&attempt)
            .cloned()
            .unwrap_or(key.clone());
        meta.outstanding.insert(attempt);
        let target = self.engine.run(run).and_then(|e| e.member_target(&member));
        tokio::spawn(async move {
            use crate::operation::Report;
            let (progress, cluster) =
                match crate::operation::reattach(&driver, &report, &who, &operation, &key).await {
                    crate::operation::Reattached::Answered(progress, cluster) => {
                        (progress, cluster)
                    }
                    crate::operation::Reattached::GaveUp(why) => {
                        report.input(
                            Input::OperationFinished {
                                member,
                                attempt,
                                outcome: Err(why),
                            },
                            Some(Instant::now()),
                        );
                        return;
                    }
                    crate::operation::Reattached::Gone => return,
                };
            let running = progress == OperationProgress::InProgress;
            report.input(
                Input::Observed {
                    member: member.clone(),
                    cluster: Arc::new(cluster),
                    operation: Some((attempt, progress)),
                },
                None,
            );
            if running && let Some(target) = target {
                let attempt = crate::operation::Attempt {
                    who,
                    member,
                    attempt,
                    target,
                    key,
                    spent: Duration::ZERO,
                };
                crate::operation::drive(
                    driver,
                    report,
                    permit,
                    attempt,
                    crate::operation::Begin::Follow(operation),
                )
                .await;
            }
        });
    }
}

/// A run's gates as API resources. A gate is created with its run (`run_system`, the run's
/// `systemData`) and last changed by whoever approved it.
fn gate_resources(
    fleet: &str,
    run: &str,
    engine: &Engine,
    run_system: &Value,
) -> Vec<(String, Value)> {
    let run_id = format!("/v1/fleets/{fleet}/updateRuns/{run}");
    engine
        .gate_views()
        .into_iter()
        .map(|g| {
            let mut properties = json!({
                "provisioningState": "Succeeded",
                "gateType": g.gate_type,
                "target": {"id": run_id, "updateRunProperties": {"name": run, "stage": g.stage, "timing": format!("{:?}", g.timing)}},
                "state": format!("{:?}", g.state),
            });
            if let Some(group) = &g.group {
                properties["target"]["updateRunProperties"]["group"] = json!(group);
            }
            if let Some(name) = &g.display_name {
                properties["displayName"] = json!(name);
            }
            if let Some(config) = &g.scheduled {
                let mut scheduled = serde_json::to_value(config).unwrap_or_default();
                if let Some(at) = g.absolute_start {
                    scheduled["absoluteStartTime"] = json!(at);
                }
                properties["scheduledStartProperties"] = scheduled;
            }
            if let Some(by) = &g.approved_by {
                properties["approvedBy"] = json!(by);
            }
            if let Some(at) = g.approved_at {
                properties["approvedAt"] = json!(at);
            }
            let mut system = run_system.clone();
            if let (Some(by), Some(at), Some(data)) =
                (&g.approved_by, g.approved_at, system.as_object_mut())
            {
                data.insert("lastModifiedBy".into(), json!(by));
                data.insert("lastModifiedByType".into(), json!("User"));
                data.insert("lastModifiedAt".into(), json!(at));
            }
            let body = json!({
                "id": format!("/v1/fleets/{fleet}/gates/{}", g.id),
                "name": g.id,
                "type": "Microsoft.ContainerService/fleets/gates",
                "systemData": system,
                "properties": properties,
            });
            (g.id, body)
        })
        .collect()
}

/// The follower's reports go to the fleet's task, tagged with the run.
#[derive(Clone)]
struct RunReport {
    tx: mpsc::UnboundedSender<Msg>,
    run: String,
}

impl crate::operation::Report for RunReport {
    fn input(&self, input: Input, finished_at: Option<Instant>) -> bool {
        self.tx
            .send(Msg::Input {
                run: self.run.clone(),
                input,
                observed_at: finished_at,
            })
            .is_ok()
    }

    fn listening(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// Sends only under the fleet's lease, as held when the attempt was made.
struct LeasePermit {
    runs: Arc<Runs>,
    fleet: String,
    run: String,
    epoch: i64,
    attempt: u64,
}

impl crate::operation::SendPermit for LeasePermit {
    fn may_send(&self) -> Option<bool> {
        self.runs.replica.may_send(&self.fleet, self.epoch)
    }

    async fn record(&self, operation_id: &str) {
        let writer = self.runs.operation_ids.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(write_operation_ids(self.runs.store.clone(), rx));
            tx
        });
        let record = OperationRecord {
            fleet: self.fleet.clone(),
            run: self.run.clone(),
            attempt: self.attempt,
            operation_id: operation_id.to_string(),
        };
        let (done, stored) = oneshot::channel();
        if writer.send((record, done)).is_ok() {
            let _ = stored.await;
        }
    }

    fn count_started(&self) {
        self.runs.metrics.count_started(&self.fleet);
    }
}

/// A fleet's members as last observed (`status.cluster`), for its fleet engine's table. A
/// member never observed is left out: the runs that selected it bring what they know of it.
pub(crate) async fn member_table(
    store: &Arc<dyn Store>,
    fleet: &str,
) -> Result<Vec<SharedMember>, ApiError> {
    Ok(stored_members(store, fleet)
        .await?
        .into_iter()
        .filter_map(|m| {
            let cluster = m.cluster.clone()?;
            Some(m.with_cluster(cluster))
        })
        .collect())
}

/// Every member of a fleet in name order, read straight into its type; the store fetches the
/// next page while this task reads the last (a fleet of 100,000 is 30 MB of text).
pub async fn stored_members(
    store: &Arc<dyn Store>,
    fleet: &str,
) -> Result<Vec<StoredMember>, ApiError> {
    const PAGE: usize = 2000;
    let (pages, mut fetched) = mpsc::channel(2);
    let fetcher = {
        let (store, fleet) = (store.clone(), fleet.to_string());
        tokio::spawn(async move {
            let mut after: Option<String> = None;
            loop {
                let page = store
                    .list_raw(&fleet, Kind::Member, after.as_deref(), PAGE)
                    .await
                    .map_err(|e| ApiError::conflict(e.to_string()));
                let last = page
                    .as_ref()
                    .ok()
                    .and_then(|p| p.last())
                    .map(|l| l.0.clone());
                let full = page.as_ref().is_ok_and(|p| p.len() == PAGE);
                if pages.send(page).await.is_err() || !full {
                    return;
                }
                after = last;
            }
        })
    };
    let mut reader = MemberReader::default();
    let mut members = Vec::new();
    while let Some(page) = fetched.recv().await {
        for (name, text, _) in page? {
            members.push(reader.read(&name, &text)?);
        }
    }
    fetcher
        .await
        .map_err(|e| ApiError::conflict(format!("cannot read the fleet's members: {e}")))?;
    Ok(members)
}

/// A member resource as the fleet's runs see it, read from its stored text: its cluster as last
/// observed (`status.cluster`), if it was and it reads as one.
pub struct StoredMember {
    pub name: Arc<str>,
    pub cluster_resource_id: Arc<str>,
    pub group: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub cluster: Option<Arc<Cluster>>,
}

impl StoredMember {
    pub fn with_cluster(self, cluster: Arc<Cluster>) -> SharedMember {
        SharedMember {
            name: self.name,
            cluster_resource_id: self.cluster_resource_id,
            group: self.group,
            labels: self.labels,
            cluster,
        }
    }
}

/// Reads member resources straight from their stored texts into their types, never as JSON
/// trees: a fleet of 100,000 is read to create a run or start the fleet's task. Clusters of the
/// same text are read once and shared, as most members of a fleet share a few shapes.
#[derive(Default)]
pub struct MemberReader {
    clusters: HashMap<String, Arc<Cluster>>,
}

impl MemberReader {
    /// A field that does not read as its type is left out (no group, no labels, not observed),
    /// as registration validated what it stored; text that is not JSON is an error.
    pub fn read(&mut self, name: &str, text: &str) -> Result<StoredMember, ApiError> {
        use serde_json::value::RawValue;
        #[derive(serde::Deserialize)]
        struct Document<'a> {
            #[serde(borrow, default)]
            properties: Option<&'a RawValue>,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Properties<'a> {
            #[serde(borrow, default)]
            cluster_resource_id: Option<&'a RawValue>,
            #[serde(borrow, default)]
            group: Option<&'a RawValue>,
            #[serde(borrow, default)]
            labels: Option<&'a RawValue>,
            #[serde(borrow, default)]
            status: Option<&'a RawValue>,
        }
        #[derive(serde::Deserialize)]
        struct Status<'a> {
            #[serde(borrow, default)]
            cluster: Option<&'a RawValue>,
        }
        fn field<'a, T: serde::Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
            serde_json::from_str(raw?.get()).ok()
        }
        let document: Document<'_> = serde_json::from_str(text).map_err(|e| {
            ApiError::conflict(format!("stored member {name:?} is unreadable: {e}"))
        })?;
        let props: Properties<'_> = field(document.properties).unwrap_or_default();
        let cluster = match field::<Status<'_>>(props.status).and_then(|s| s.cluster) {
            Some(raw) => match self.clusters.get(raw.get()) {
                Some(known) => Some(known.clone()),
                None => serde_json::from_str::<Cluster>(raw.get()).ok().map(|c| {
                    let c = Arc::new(c);
                    self.clusters.insert(raw.get().to_string(), c.clone());
                    c
                }),
            },
            None => None,
        };
        Ok(StoredMember {
            name: Arc::from(name),
            cluster_resource_id: Arc::from(
                field::<String>(props.cluster_resource_id).unwrap_or_default(),
            ),
            group: field(props.group),
            labels: field(props.labels).unwrap_or_default(),
            cluster,
        })
    }
}

/// A run's document as JSON text: its resource without status (`base`), with `status` as
/// `properties.status`. Rendered straight to text: a 10,000-member status is never built as a
/// JSON tree first.
pub fn run_document<T: serde::Serialize>(base: &Value, status: &T) -> serde_json::Result<String> {
    use serde::ser::{Serialize, SerializeMap, Serializer};
    struct Document<'a, T>(&'a Value, &'a T);
    struct Properties<'a, T>(&'a Value, &'a T);
    impl<T: Serialize> Serialize for Document<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let fields = self.0.as_object();
            let mut map = s.serialize_map(None)?;
            for (key, value) in fields.into_iter().flatten() {
                if key == "properties" {
                    map.serialize_entry(key, &Properties(value, self.1))?;
                } else {
                    map.serialize_entry(key, value)?;
                }
            }
            if !fields.is_some_and(|f| f.contains_key("properties")) {
                map.serialize_entry("properties", &Properties(&Value::Null, self.1))?;
            }
            map.end()
        }
    }
    impl<T: Serialize> Serialize for Properties<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(None)?;
            for (key, value) in self.0.as_object().into_iter().flatten() {
                if key != "status" {
                    map.serialize_entry(key, value)?;
                }
            }
            map.serialize_entry("status", self.1)?;
            map.end()
        }
    }
    serde_json::to_string(&Document(base, status))
}

/// What a status write stores of a run (FLEET-DESIGN.md, persistence by change): the frame
/// around its members' lists, small whatever the run's size, and the chunks of its members
/// that changed since `meta` last wrote them (all of them the first time); and the run's head.
fn status_document(
    meta: &mut RunMeta,
    engine: &Engine,
) -> serde_json::Result<(flotilla_store::RunDocument, String)> {
    let mut skeleton = engine.status_skeleton();
    if moving(engine) {
        skeleton.forecast = meta.forecast;
    }
    let around = match &meta.around {
        Some(around) => around,
        None => meta.around.insert(StatusPlace::of(&meta.base)?),
    };
    let frame = run_frame(around, &skeleton)?;
    let chunks = engine.status_chunks();
    let all = meta.chunks_written.len() != chunks.len();
    let mut changed = Vec::new();
    for (c, chunk) in chunks.iter().enumerate() {
        if !all && meta.chunks_written[c].0 == chunk.revision {
            continue;
        }
        let mut text = Vec::new();
        engine.write_status_chunk(c, &mut text)?;
        let text = String::from_utf8(text).map_err(serde::ser::Error::custom)?;
        changed.push(flotilla_store::Chunk {
            index: c as u32,
            slot: chunk.slot,
            text,
        });
    }
    if all {
        meta.chunks_written = vec![(0, 0); chunks.len()];
    }
    for chunk in &changed {
        meta.chunks_written[chunk.index as usize] =
            (chunks[chunk.index as usize].revision, chunk.text.len());
    }
    meta.status_bytes = frame.iter().map(String::len).sum::<usize>()
        + meta.chunks_written.iter().map(|&(_, n)| n).sum::<usize>();
    let document = flotilla_store::RunDocument {
        frame,
        chunks: chunks.len() as u32,
        changed,
    };
    Ok((document, crate::run_head::head_of(&skeleton)))
}

/// A run's document (as [`run_document`] renders it) around its status: the text before the
/// status's value and after it. The resource without its status never changes while a task
/// drives the run, so this is found once per run, not per write.
pub struct StatusPlace {
    before: String,
    after: String,
}

impl StatusPlace {
    pub fn of(base: &Value) -> serde_json::Result<StatusPlace> {
        // Two renderings that differ only in the status: where they part is where it sits.
        let zero = run_document(base, &0u8)?;
        let one = run_document(base, &1u8)?;
        let at = zero
            .bytes()
            .zip(one.bytes())
            .position(|(a, b)| a != b)
            .ok_or_else(|| {
                serde::ser::Error::custom("a run's document does not show its status")
            })?;
        Ok(StatusPlace {
            before: zero[..at].to_string(),
            after: zero[at + 1..].to_string(),
        })
    }
}

/// The run's document (as [`run_document`] renders it) with `skeleton` as its status, cut
/// right after the `[` of every group's empty `members` list: the frame of a
/// [`flotilla_store::RunDocument`]. Every key of a status is the engine's and a user's text is
/// only ever a string value, in which a `"` is escaped, so `"members":[]` in the status's text
/// is a group's list and nothing else; the count is checked all the same.
pub fn run_frame(
    around: &StatusPlace,
    skeleton: &flotilla_engine::status::UpdateRunStatus,
) -> serde_json::Result<Vec<String>> {
    const LIST: &str = r#""members":[]"#;
    let status = serde_json::to_string(skeleton)?;
    let mut frame = Vec::new();
    let mut piece = around.before.clone();
    let mut from = 0;
    for (i, _) in status.match_indices(LIST) {
        let cut = i + LIST.len() - 1;
        piece.push_str(&status[from..cut]);
        frame.push(std::mem::take(&mut piece));
        from = cut;
    }
    piece.push_str(&status[from..]);
    piece.push_str(&around.after);
    frame.push(piece);
    let groups: usize = skeleton.stages.iter().map(|s| s.groups.len()).sum();
    if frame.len() != groups + 1 {
        return Err(serde::ser::Error::custom(format!(
            "a status of {groups} groups shows {} member lists",
            frame.len() - 1
        )));
    }
    Ok(frame)
}

/// A member's status: its cluster as last seen, and when; and what is new of its last operation
/// (what it does not say, the store keeps).
fn member_status(
    spec: &flotilla_engine::fleet::ClusterSpec,
    at: Time,
    operation: Option<Value>,
) -> Value {
    let mut status = json!({"cluster": spec, "lastObservedAt": at});
    if let (Some(s), Some(Value::Object(op))) = (status.as_object_mut(), operation) {
        s.extend(op);
    }
    status
}

/// Writes a member's latest observation into its resource (`status.cluster`).
pub async fn record_observation(
    store: &dyn Store,
    fleet: &str,
    member: &str,
    spec: &flotilla_engine::fleet::ClusterSpec,
) {
    let status = [(member.to_string(), member_status(spec, now(), None))];
    if let Err(e) = store.set_statuses(fleet, Kind::Member, &status).await {
        tracing::warn!(fleet, member, error = %e, "cannot record the member's cluster");
    }
}

/// The idempotency key of an attempt, given to the driver with the upgrade.
pub fn operation_key(fleet: &str, run: &str, attempt: u64) -> String {
    format!("{fleet}.{run}.{attempt}")
}

/// A target as stored with its intent.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TargetRecord {
    upgrade_type: flotilla_engine::strategy::UpgradeType,
    #[serde(default)]
    kubernetes_version: Option<String>,
    #[serde(default)]
    node_images: Vec<(String, String, String)>,
}

impl From<&Target> for TargetRecord {
    fn from(t: &Target) -> TargetRecord {
        TargetRecord {
            upgrade_type: t.upgrade_type,
            kubernetes_version: t.kubernetes_version.map(|v| v.to_string()),
            node_images: t
                .node_images
                .iter()
                .map(|p| (p.pool.clone(), p.family.clone(), p.image.to_string()))
                .collect(),
        }
    }
}

impl TargetRecord {
    fn into_target(self) -> Target {
        Target {
            upgrade_type: self.upgrade_type,
            kubernetes_version: self
                .kubernetes_version
                .and_then(|v| flotilla_engine::version::KubeVersion::parse(&v)),
            node_images: self
                .node_images
                .into_iter()
                .filter_map(|(pool, family, image)| {
                    flotilla_engine::version::ImageVersion::parse(&image).map(|image| {
                        flotilla_engine::engine::PoolTarget {
                            pool,
                            family,
                            image,
                        }
                    })
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({"properties": {"managedClusterUpdate": {
            "upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})
    }

    fn cluster(version: &str) -> Value {
        json!({"region": "eastus", "kubernetesVersion": version, "nodePools": [],
            "longTermSupport": false})
    }

    fn catalog() -> Value {
        json!({"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}]}})
    }

    /// A snapshot lists each distinct cluster once; one written before (a cluster per member)
    /// reads the same, and both build the same run.
    #[test]
    fn snapshots_list_each_cluster_once_and_older_ones_read_the_same() {
        let members: Vec<Value> = (0..30)
            .map(|i| {
                let version = if i % 3 == 0 { "1.31.1" } else { "1.30.5" };
                json!({"name": format!("m{i:02}"), "clusterResourceId": format!("/c/{i}"),
                    "group": "g", "labels": {"i": i.to_string()}, "cluster": cluster(version)})
            })
            .collect();
        let older = json!({"members": members, "catalog": catalog()}).to_string();
        let read = read_snapshot(&base(), &older).expect("an older snapshot reads");
        let text = snapshot_document(&read, Time::from_unix(0)).expect("written");
        let written: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(written["clusters"].as_array().map(Vec::len), Some(2));
        assert!(written["members"][1].get("cluster").is_none());
        let again = read_snapshot(&base(), &text).expect("reads");
        assert_eq!(again.members, read.members);
        // Members with one shape hold one copy of it.
        assert!(Arc::ptr_eq(
            &again.members[1].cluster,
            &again.members[2].cluster
        ));
        let status = |s: &RunSnapshot| {
            let (engine, _) = engine_from_snapshot("r", s).expect("engine");
            serde_json::to_value(engine.status()).expect("status")
        };
        assert_eq!(status(&again), status(&read));
        assert_eq!(
            status(&again)["stages"][0]["groups"][0]["members"]
                .as_array()
                .map(Vec::len),
            Some(30)
        );
    }

    /// What a status write stores, put together as the store does, is the run's document
    /// rendered whole, at every step of a run: with groups of several chunks, an empty group,
    /// and writes that carry only the chunks that changed.
    #[test]
    fn a_status_written_by_change_reads_as_the_whole_document() {
        let mut base = base();
        base["properties"]["strategy"] = json!({"stages": [
            {"name": "one", "groups": [
                {"name": "a", "maxConcurrency": "300", "maxAllowedFailures": "10%"},
                {"name": "none"}],
             "maxConcurrency": "300", "maxAllowedFailures": "10%"},
            {"name": "two", "groups": [{"name": "b", "maxConcurrency": "300"}],
             "maxAllowedFailures": "10%"},
        ]});
        let members: Vec<Value> = (0..1_300)
            .map(|i| {
                let group = if i < 1_100 { "a" } else { "b" };
                json!({"name": format!("m{i:04}"), "clusterResourceId": format!("/c/{i}"),
                    "group": group, "cluster": cluster("1.30.5")})
            })
            .collect();
        let text = json!({"members": members, "catalog": catalog()}).to_string();
        let snapshot = read_snapshot(&base, &text).expect("snapshot");
        let (mut engine, _) = engine_from_snapshot("r", &snapshot).expect("engine");
        let mut meta = RunMeta {
            base: base.clone(),
            forecast: None,
            operations: HashMap::new(),
            outstanding: Default::default(),
            status_dirty: false,
            status: StatusChanges::new(),
            last_status_write: None,
            status_bytes: 0,
            chunks_written: Vec::new(),
            around: None,
            snapshot_etag: String::new(),
            unwritten: Vec::new(),
            log_cost: 0,
            checkpoint_bytes: 0,
            loaded_at: Instant::now(),
        };
        // The store's rows: each chunk's list and text, by index.
        let mut stored: std::collections::BTreeMap<u32, (u32, String)> = Default::default();
        let mut written = Vec::new();
        let mut check = |engine: &Engine, meta: &mut RunMeta| {
            let (document, _) = status_document(meta, engine).expect("rendered");
            written.push(document.changed.len());
            for chunk in document.changed {
                stored.insert(chunk.index, (chunk.slot, chunk.text));
            }
            let rows = stored
                .iter()
                .take(document.chunks as usize)
                .map(|(&i, (slot, text))| (i, *slot, text.clone()));
            let read = flotilla_store::assemble(&document.frame, document.chunks, rows)
                .expect("assembled");
            assert_eq!(read, run_document(&base, &engine.status()).expect("whole"));
        };
        let mut now = Time::from_unix(1_000);
        check(&engine, &mut meta);
        engine.handle(now, Input::Start).expect("started");
        engine.settle(now);
        check(&engine, &mut meta);
        while !engine.is_finished() {
            assert!(now.unix() < 100_000, "the run never ended");
            now = Time::from_unix(now.unix() + 60);
            let mut finished = Vec::new();
            while let Some(command) = engine.poll_command() {
                if let Command::StartUpgrade {
                    member, attempt, ..
                } = command
                {
                    finished.push((member, attempt));
                }
            }
            for (i, (member, attempt)) in finished.into_iter().enumerate() {
                let outcome = if i % 97 == 3 {
                    Err("boom".into())
                } else {
                    Ok(())
                };
                let _ = engine.handle(
                    now,
                    Input::OperationFinished {
                        member,
                        attempt,
                        outcome,
                    },
                );
            }
            engine.settle(now);
            check(&engine, &mut meta);
        }
        // The first write carries every chunk (1,100 members of a in three, 200 of b in one);
        // the steps after carry those that changed: the start touches a's first chunk alone,
        // 300 members at a time span one or two of a's, and b's start comes with a's end.
        assert_eq!(written[0], 4);
        assert_eq!(written[1], 1);
        assert!(written[1..].iter().all(|&n| n < 4), "{written:?}");
        assert!(written.contains(&2), "{written:?}");
        // Both stages ran, and some members failed.
        let status = engine.status();
        assert_ne!(status.stages[1].status.state, State::NotStarted);
        assert!(status.failure_count > 0);
    }

    #[test]
    fn a_snapshot_naming_no_cluster_or_a_missing_one_is_refused() {
        let member = |extra: Value| {
            let mut m = json!({"name": "m", "clusterResourceId": "/c/m"});
            m.as_object_mut()
                .expect("object")
                .extend(extra.as_object().expect("object").clone());
            json!({"clusters": [cluster("1.30.5")], "members": [m], "catalog": catalog()})
                .to_string()
        };
        let refused = |text: String, says: &str| {
            let Err(e) = read_snapshot(&base(), &text) else {
                panic!("{text} was read");
            };
            assert!(e.message.contains(says), "{}", e.message);
        };
        refused(member(json!({"c": 1})), "names cluster 1 of 1");
        refused(member(json!({})), "no one cluster");
        refused(
            member(json!({"c": 0, "cluster": cluster("1.30.5")})),
            "no one cluster",
        );
        assert!(read_snapshot(&base(), &member(json!({"c": 0}))).is_ok());
    }
}
