//! The reconciler: one task per fleet, owning the fleet's [`FleetEngine`] and so every active
//! run of the fleet. It feeds the engine what happened, records for each run what its engine was
//! given, its intents, events and status in one transaction, and only then carries out the
//! engine's commands through the fleet's driver (SEMANTICS §7). It sleeps until the engine's
//! next wake-up or the next input: no polling of the engine.
//!
//! A run is rebuilt after a restart by replaying its input log into a fresh engine and handing
//! it to the fleet's engine; recorded intents without a result are asked about before anything
//! is sent again.
//!
//! This module holds `Runs` (what the server asks of the fleets' tasks: start one, hand it an
//! action, load a run) and the drivers; `replica` the leases this replica holds and the permit
//! an upgrade is sent under; `actor` a fleet's task; `codec` the documents of runs (snapshots,
//! the run document and its status, the member table as stored).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};

use flotilla_engine::engine::{
    Command, Engine, Input, OperationProgress, RunMaking, RunOrigin, RunSpec, StatusChanges, Target,
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

use crate::clock::{Busy, Phase, now};
use crate::durations::Durations;

use crate::driver::{Driver, MemberRef, driver_from_config};
use crate::metrics::Metrics;
use crate::store::{
    Fence, Intent, Kind, Notice, OperationRecord, Precondition, RunBatch, Store, StoreError,
    UpgradeDuration,
};

mod actor;
mod codec;
mod replica;

use actor::*;
pub use codec::*;
pub use replica::*;

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
    /// Create (or replace, before it starts) a run: the fleet's engine decides it over its
    /// member table, brought up to date with the members as stored (`members`), and the run is
    /// recorded before the engine takes it in.
    Create {
        request: Box<CreateRequest>,
        members: Vec<SharedMember>,
        answer: CreateAnswer,
    },
    /// Roll back run `original` (SEMANTICS §15): the fleet's engine decides, and a new
    /// rollback run is recorded before the engine takes it in.
    RollBack {
        original: String,
        system_data: Value,
        answer: Answer,
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
    /// Members written and observed: the fleet engine's member table holds them as they are
    /// now (what freezes and budgets cover), and runs that selected them see their clusters.
    Joined(Vec<flotilla_engine::fleet::Member>),
    /// A member deleted: the table no longer holds it, and the runs the task drives skip it
    /// where they have not started it.
    Left { member: String },
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

/// Who waits for an action's result: a caller of this replica, or another replica through the
/// store (the action's id).
enum Answer {
    Caller(Reply),
    Remote(i64),
}

/// Who waits for a run's creation: a caller of this replica, or another replica through the
/// store (the action's id).
enum CreateAnswer {
    Caller(oneshot::Sender<Result<CreatedRun, ApiError>>),
    Remote(i64),
}

/// What a handed-over action asks (the store keeps it as JSON): an input for the run, its
/// creation, or a rollback of it (SEMANTICS §15), which the fleet's engine decides.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum HandedOver {
    Create {
        create: Box<CreateRequest>,
    },
    Members {
        members: MemberNews,
    },
    /// The fleet's freezes and budgets changed: read them again.
    Rules {
        rules: bool,
    },
    RollBack {
        #[serde(rename = "rollBack")]
        system_data: Value,
    },
    Input(Input),
}

/// Members written (and observed) or deleted through a replica that does not drive their
/// fleet: the driving replica's table takes them, so its runs, freezes and budgets see the
/// fleet as it is (a member deleted is not upgraded).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemberNews {
    #[serde(default)]
    joined: Vec<JoinedMember>,
    #[serde(default)]
    left: Option<String>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct JoinedMember {
    name: String,
    cluster_resource_id: String,
    group: Option<String>,
    labels: std::collections::BTreeMap<String, String>,
    cluster: Cluster,
}

/// A run to create (SEMANTICS §2) as the API checked it, with what was read from the driver
/// for it: the fleet's actor decides it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRequest {
    pub run: String,
    pub strategy: Option<StrategySpec>,
    pub strategy_id: Option<String>,
    pub update: ManagedClusterUpdateSpec,
    pub rules: flotilla_engine::engine::RunRules,
    pub profile_id: Option<String>,
    /// A promoted run's provenance (SEMANTICS §14).
    #[serde(default)]
    pub promoted_from: Option<flotilla_engine::status::PromotedFrom>,
    /// Who creates it, and when.
    pub system_data: Value,
    /// `If-None-Match: *`: never replaces a run.
    pub create_only: bool,
    /// `If-Match`: the run's eTag.
    pub if_match: Option<String>,
    /// The release catalog the driver listed.
    pub catalog: Catalog,
    /// Members the driver could not observe now, and why: they refuse only a run that would
    /// select them.
    pub unobserved: Vec<Unobserved>,
}

/// A member that could not be observed when a run was created.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unobserved {
    pub name: String,
    pub cluster_resource_id: String,
    pub group: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub why: ApiError,
}

/// A run just created or replaced: its document as stored, and its eTag.
pub struct CreatedRun {
    pub text: String,
    pub etag: String,
    pub created: bool,
    pub warnings: Vec<String>,
}

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

/// How long after another replica's lease runs out (by the database's clock, read a moment
/// before) the coordinator looks for it: a lease looked at a little early is still held.
const LEASE_MARGIN_MS: u64 = 20;

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

/// A fleet task's mailbox. Each message holds a [`crate::clock::Busy`] until the task has
/// handled it: a virtual clock does not move on while a message is on its way.
#[derive(Clone)]
pub(crate) struct Inbox(mpsc::UnboundedSender<(Msg, crate::clock::Busy)>);

impl Inbox {
    /// Queues a message; `Err` once the task has ended (the message is dropped).
    fn send(&self, msg: Msg) -> Result<(), TaskEnded> {
        self.0
            .send((msg, crate::clock::busy()))
            .map_err(|_| TaskEnded)
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// A fleet's task ended: it takes no more messages.
#[derive(Debug)]
struct TaskEnded;

/// A fleet's task: the lease epoch it drives the fleet under, its mailbox, and the runs it
/// drives now (kept by the task).
#[derive(Clone)]
struct FleetTask {
    epoch: i64,
    tx: Inbox,
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

/// Writes the operation ids drivers name, as many as have arrived in one write (one sync to
/// disk for a step's worth of upgrades, not one each), and tells each caller once its id is
/// stored.
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
            return self
                .act_remotely(fleet, run, HandedOver::Input(input))
                .await
                .map(|_| ());
        }
        let make = |reply| Msg::Action {
            run: run.to_string(),
            input: input.clone(),
            reply,
            at: Instant::now(),
        };
        self.ask_loaded(fleet, run, None, make).await
    }

    /// Gives a message made around a reply to the task driving run `run` (loaded first, with
    /// run `also` if the store holds it) and waits for the answer: a run dropped just before
    /// the message came (it finished) is loaded again once.
    async fn ask_loaded(
        self: &Arc<Self>,
        fleet: &str,
        run: &str,
        also: Option<&str>,
        make: impl Fn(Reply) -> Msg,
    ) -> Result<(), ApiError> {
        for _ in 0..2 {
            let tx = self.handle(fleet, run).await?;
            if let Some(also) = also {
                let recorded = self
                    .store
                    .get_raw(fleet, Kind::Run, also)
                    .await
                    .map_err(|e| ApiError::conflict(e.to_string()))?;
                if recorded.is_some() {
                    self.handle(fleet, also).await?;
                }
            }
            let (reply, answer) = oneshot::channel();
            if tx.send(make(reply)).is_err() {
                continue;
            }
            match answer.await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(Refusal::Api(e))) => return Err(e),
                // The run finished (or was dropped) just before the message came: load it again.
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

    /// Rolls back run `original` (SEMANTICS §15) and answers the rollback run's name, once
    /// recorded: the fleet's engine decides (a second request answers the run already made),
    /// on this replica if it drives the fleet, otherwise on the one that does.
    pub async fn roll_back(
        self: &Arc<Self>,
        fleet: &str,
        original: &str,
        system_data: Value,
    ) -> Result<String, ApiError> {
        let name = FleetEngine::rollback_run_name(original);
        if !self.own(fleet).await {
            let asked = HandedOver::RollBack { system_data };
            return self
                .act_remotely(fleet, original, asked)
                .await
                .map(|_| name);
        }
        // A rollback run recorded before a restart is driven again: it is the answer.
        let make = |reply| Msg::RollBack {
            original: original.to_string(),
            system_data: system_data.clone(),
            answer: Answer::Caller(reply),
            at: Instant::now(),
        };
        self.ask_loaded(fleet, original, Some(&name), make).await?;
        Ok(name)
    }

    /// Creates (or replaces, before it starts) run `request.run` and answers it as recorded:
    /// the fleet's engine decides it, over its member table brought up to date with the
    /// members as stored (`members`: those the caller read, each with its cluster), on this
    /// replica if it drives the fleet, otherwise on the one that does.
    pub async fn create(
        self: &Arc<Self>,
        fleet: &str,
        request: CreateRequest,
        members: Vec<SharedMember>,
    ) -> Result<CreatedRun, ApiError> {
        let name = request.run.clone();
        if !self.own(fleet).await {
            drop(members);
            let asked = HandedOver::Create {
                create: Box::new(request),
            };
            let result = self.act_remotely(fleet, &name, asked).await?;
            let (text, etag) = self
                .store
                .get_raw(fleet, Kind::Run, &name)
                .await
                .map_err(|e| ApiError::conflict(e.to_string()))?
                .ok_or_else(|| {
                    ApiError::conflict(format!("update run {name:?} was not recorded"))
                })?;
            return Ok(CreatedRun {
                text,
                etag,
                created: result["created"].as_bool().unwrap_or(false),
                warnings: serde_json::from_value(result["warnings"].clone()).unwrap_or_default(),
            });
        }
        let task = self.fleet_task(fleet).await?;
        let (reply, answer) = oneshot::channel();
        let asked = Msg::Create {
            request: Box::new(request),
            members,
            answer: CreateAnswer::Caller(reply),
        };
        let stopped = || ApiError::conflict("the fleet's reconciler stopped; try again");
        task.tx.send(asked).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Hands an action to the fleet's owner through the store and waits for its result.
    async fn act_remotely(
        &self,
        fleet: &str,
        run: &str,
        action: HandedOver,
    ) -> Result<Value, ApiError> {
        let store_error = |e: StoreError| ApiError::conflict(e.to_string());
        let mut notices = self.store.notices();
        let value = serde_json::to_value(&action).map_err(|e| ApiError::conflict(e.to_string()))?;
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
                    Err(_) => Ok(result),
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
        // Letting go at a clean shutdown is what was asked for; losing the lease is not.
        if self
            .replica
            .closing
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            tracing::info!(fleet, epoch, replica = %self.replica.id, "let the fleet's runs go at shutdown");
        } else {
            tracing::warn!(fleet, epoch, replica = %self.replica.id, "no longer driving the fleet's runs");
        }
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
            let asked = serde_json::from_value::<HandedOver>(action.input.clone()).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidRequestContent,
                    format!("unreadable action: {e}"),
                    "",
                )
            });
            // A creation is decided over the members as stored, read here, off the fleet's task.
            let asked = match asked {
                Ok(HandedOver::Rules { .. }) => {
                    let rules = crate::fleet_rules::rules_of(self.store.as_ref(), fleet)
                        .await
                        .map_err(|e| ApiError::conflict(e.to_string()));
                    let told = match (rules, self.fleet_task(fleet).await) {
                        (Ok(rules), Ok(task)) => task
                            .tx
                            .send(Msg::Rules(rules))
                            .map_err(|_| ApiError::conflict("the fleet's reconciler stopped")),
                        (Err(e), _) | (_, Err(e)) => Err(e),
                    };
                    let finished = told.is_ok()
                        && self
                            .store
                            .finish_action(action.id, &json!({"ok": true}))
                            .await
                            .is_ok();
                    if !finished {
                        self.undeliver(fleet, action.id);
                    }
                    continue;
                }
                Ok(HandedOver::Members { members }) => {
                    let told = self.fleet_task(fleet).await.and_then(|task| {
                        let stopped = || ApiError::conflict("the fleet's reconciler stopped");
                        if !members.joined.is_empty() {
                            let joined = members
                                .joined
                                .into_iter()
                                .map(|m| flotilla_engine::fleet::Member {
                                    name: m.name,
                                    cluster_resource_id: m.cluster_resource_id,
                                    group: m.group,
                                    labels: m.labels,
                                    cluster: m.cluster,
                                })
                                .collect();
                            task.tx.send(Msg::Joined(joined)).map_err(|_| stopped())?;
                        }
                        if let Some(member) = members.left {
                            task.tx.send(Msg::Left { member }).map_err(|_| stopped())?;
                        }
                        Ok(())
                    });
                    let finished = match told {
                        Ok(()) => self
                            .store
                            .finish_action(action.id, &json!({"ok": true}))
                            .await
                            .is_ok(),
                        Err(_) => false,
                    };
                    if !finished {
                        self.undeliver(fleet, action.id);
                    }
                    continue;
                }
                Ok(HandedOver::Create { create }) => {
                    let members = stored_members(&self.store, fleet).await.map(|members| {
                        members
                            .into_iter()
                            .filter_map(|m| {
                                let cluster = m.cluster.clone()?;
                                Some(m.with_cluster(cluster))
                            })
                            .collect::<Vec<_>>()
                    });
                    let sent = match (members, self.fleet_task(fleet).await) {
                        (Ok(members), Ok(task)) => task
                            .tx
                            .send(Msg::Create {
                                request: create,
                                members,
                                answer: CreateAnswer::Remote(action.id),
                            })
                            .map_err(|_| ApiError::conflict("the fleet's reconciler stopped")),
                        (Err(e), _) | (_, Err(e)) => Err(e),
                    };
                    if sent.is_err() {
                        self.undeliver(fleet, action.id);
                    }
                    continue;
                }
                other => other,
            };
            let sent = match asked {
                Ok(
                    HandedOver::Create { .. }
                    | HandedOver::Members { .. }
                    | HandedOver::Rules { .. },
                ) => continue,
                Ok(asked) => match self.handle(fleet, &action.run).await {
                    Ok(tx) => {
                        let msg = match asked {
                            HandedOver::Create { .. }
                            | HandedOver::Members { .. }
                            | HandedOver::Rules { .. } => continue,
                            HandedOver::Input(input) => Msg::Remote {
                                run: action.run.clone(),
                                id: action.id,
                                input,
                            },
                            HandedOver::RollBack { system_data } => Msg::RollBack {
                                original: action.run.clone(),
                                system_data,
                                answer: Answer::Remote(action.id),
                                at: Instant::now(),
                            },
                        };
                        tx.send(msg).map_err(|_| {
                            ApiError::conflict("the run's reconciler stopped; try again")
                        })
                    }
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

    /// When the coordinator should look again for fleets to take: at the next pass (a third of
    /// the lease time from now), or just after the first lease another replica holds runs
    /// out, if sooner, so that a dead replica's fleets are taken when its leases end and not
    /// up to a pass later (#40: takeover within the lease time and a little).
    async fn next_look(&self, every: Duration) -> Instant {
        let pass = Instant::now() + every;
        // A store for one replica has no other replica's lease to wait for.
        if !self.store.shared() {
            return pass;
        }
        let Ok(leases) = self.store.leases().await else {
            return pass;
        };
        leases
            .iter()
            .filter(|l| l.owner != self.replica.id && l.expires_in_ms >= 0)
            .map(|l| {
                Instant::now() + Duration::from_millis(l.expires_in_ms as u64 + LEASE_MARGIN_MS)
            })
            .min()
            .map_or(pass, |ends| ends.min(pass))
    }

    /// Runs the coordinator forever: a pass every third of the lease time, just after another
    /// replica's lease runs out, and at once when an action is handed to a fleet.
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
        let mut next = self.next_look(every).await;
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
                    // Counted afresh (read only: the heartbeat is written only before leases are
                    // renewed, so a replica's never outlives its leases): a replica whose leases
                    // just ran out is gone, and the fair share grows by its fleets at once.
                    if let Ok(n) = self.store.alive_replicas().await {
                        self.alive.store(n, std::sync::atomic::Ordering::Relaxed);
                    }
                    self.balance_once(self.alive.load(std::sync::atomic::Ordering::Relaxed).max(1)).await;
                    next = self.next_look(every).await;
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

    /// Reads the fleet's freezes and budgets and hands them to the task driving the fleet: here,
    /// or on the replica that drives it, told through the store before the caller is answered
    /// (the next catalog pass, which calls this too, would tell it later).
    pub async fn rules_changed(&self, fleet: &str) {
        let Some(inbox) = self.task_here(fleet) else {
            // The replica driving the fleet reads them again (handed over before the caller is
            // answered, so what the caller does next reaches it after them).
            if self.driven_elsewhere(fleet).await {
                self.hand_over(fleet, &HandedOver::Rules { rules: true })
                    .await;
            }
            return;
        };
        let Ok(rules) = crate::fleet_rules::rules_of(self.store.as_ref(), fleet).await else {
            return;
        };
        let _ = inbox.send(Msg::Rules(rules));
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

    /// Hands members just written and observed to the task driving their fleet, if one runs
    /// here (a task started later reads them from the store).
    pub async fn members_joined(&self, fleet: &str, members: Vec<flotilla_engine::fleet::Member>) {
        if members.is_empty() {
            return;
        }
        if let Some(inbox) = self.task_here(fleet) {
            let _ = inbox.send(Msg::Joined(members));
            return;
        }
        let joined = members
            .into_iter()
            .map(|m| JoinedMember {
                name: m.name,
                cluster_resource_id: m.cluster_resource_id,
                group: m.group,
                labels: m.labels,
                cluster: m.cluster,
            })
            .collect();
        let news = MemberNews { joined, left: None };
        self.hand_over_members(fleet, news).await;
    }

    /// Tells the task driving a fleet that a member was deleted: here, or through the store
    /// on the replica that drives it.
    pub async fn member_left(&self, fleet: &str, member: &str) {
        let member = member.to_string();
        match self.task_here(fleet) {
            Some(inbox) => {
                let _ = inbox.send(Msg::Left { member });
            }
            None => {
                let news = MemberNews {
                    joined: Vec::new(),
                    left: Some(member),
                };
                self.hand_over_members(fleet, news).await;
            }
        }
    }

    /// The inbox of the task driving a fleet here, under the lease this replica holds now.
    fn task_here(&self, fleet: &str) -> Option<Inbox> {
        let fence = self.replica.fence(fleet)?;
        let fleets = self.fleets.lock().ok()?;
        fleets
            .get(fleet)
            .filter(|t| t.epoch == fence.epoch && !t.tx.is_closed())
            .map(|t| t.tx.clone())
    }

    /// Members written or deleted here while another replica drives their fleet reach its
    /// table through the store. When no other replica holds the fleet's lease, whoever takes
    /// it loads the table from the store as its task starts.
    async fn hand_over_members(&self, fleet: &str, news: MemberNews) {
        if self.driven_elsewhere(fleet).await {
            // Handed over before the caller is answered: what it does next (create a run, say)
            // reaches the owner after this.
            self.hand_over(fleet, &HandedOver::Members { members: news })
                .await;
        }
    }

    /// Whether another replica holds the fleet's lease (not knowing: it may).
    async fn driven_elsewhere(&self, fleet: &str) -> bool {
        match self.store.leases().await {
            Ok(leases) => leases
                .iter()
                .any(|l| l.fleet == fleet && l.owner != self.replica.id && l.expires_in_ms > 0),
            // News given twice changes nothing.
            Err(_) => true,
        }
    }

    /// Hands news about a fleet to the replica driving it, through the store, without waiting.
    async fn hand_over(&self, fleet: &str, news: &HandedOver) {
        let Ok(value) = serde_json::to_value(news) else {
            return;
        };
        if let Err(e) = self.store.submit_action(fleet, "", &value).await {
            tracing::warn!(fleet, error = %e, "cannot hand news to the fleet's replica");
        }
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
        let tx = Inbox(tx);
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
    async fn handle(self: &Arc<Self>, fleet: &str, run: &str) -> Result<Inbox, ApiError> {
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
        let (mut engine, _) = Engine::rebuild(run, &snapshot)?;
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
        let status = |s: &RunOrigin| {
            let (engine, _) = Engine::rebuild("r", s).expect("engine");
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

    /// A run keeps the time scale its fleet's driver had when it was made (issue #42: a
    /// simulated fleet's waits scale as its upgrades do): the snapshot records it, a restart
    /// rebuilds the run with it, and an older snapshot (or a real fleet's, not written) reads 1.
    #[test]
    fn a_snapshot_keeps_the_runs_time_scale_across_a_restart() {
        let members: Vec<Value> = (0..2)
            .map(|i| {
                json!({"name": format!("m{i}"), "clusterResourceId": format!("/c/{i}"),
                    "cluster": cluster("1.30.5")})
            })
            .collect();
        let older = json!({"members": members, "catalog": catalog()}).to_string();
        let mut read = read_snapshot(&base(), &older).expect("an older snapshot reads");
        assert_eq!(read.time_scale, 1.0, "a snapshot without a scale ran at 1");
        let text = snapshot_document(&read, Time::from_unix(0)).expect("written");
        let written: Value = serde_json::from_str(&text).expect("JSON");
        assert!(written.get("timeScale").is_none(), "1 is not written");
        read.time_scale = 300.0;
        let text = snapshot_document(&read, Time::from_unix(0)).expect("written");
        let again = read_snapshot(&base(), &text).expect("reads");
        assert_eq!(again.time_scale, 300.0);
        let (engine, _) = Engine::rebuild("r", &again).expect("engine");
        assert_eq!(
            engine.time_scale(),
            300.0,
            "rebuilt with the recorded scale"
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
        let (mut engine, _) = Engine::rebuild("r", &snapshot).expect("engine");
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
