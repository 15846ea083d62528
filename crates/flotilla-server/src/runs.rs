//! The reconciler: one task per active update run. It feeds the engine what happened, records
//! the inputs, intents, events and status in one transaction, and only then carries out the
//! engine's commands through the fleet's driver (SEMANTICS §7). It sleeps until the engine's next
//! wake-up or the next input: no polling of the engine.
//!
//! A run is rebuilt after a restart by replaying its input log into a fresh engine; recorded
//! intents without a result are asked about before anything is sent again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};

use flotilla_engine::engine::{Command, Engine, Input, OperationProgress, RunSpec, Target};
use flotilla_engine::error::{ApiError, ErrorCode};
use flotilla_engine::fleet::{Catalog, Member, MemberRecord};
use flotilla_engine::status::{EventType, State};
use flotilla_engine::strategy::{
    DEFAULT_STAGE_CONCURRENCY_LIMIT, ManagedClusterUpdateSpec, StrategySpec, parse_strategy,
    parse_upgrade,
};
use flotilla_engine::time::Time;

use crate::driver::{Driver, MemberRef, driver_from_config};
use crate::metrics::Metrics;
use crate::store::{Fence, Intent, Kind, Notice, RunBatch, Store, StoreError};

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

/// The instant now, in the engine's resolution.
pub fn now() -> Time {
    Time::from_unix(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64),
    )
}

/// A run event for live streams: fleet, run and the event JSON.
#[derive(Clone, Debug)]
pub struct RunEvent {
    pub fleet: String,
    pub run: String,
    pub event: Value,
}

enum Msg {
    /// Something outside the run changed (another run let go of a member): look again.
    Nudge,
    /// This replica lost the fleet's lease: stop driving the run at once.
    Abandon,
    /// An action handed over through the store by another replica (or while this one was not
    /// the owner); its result is recorded with the step.
    Remote { id: i64, input: Input },
    Action {
        input: Input,
        reply: oneshot::Sender<Result<(), ApiError>>,
        at: Instant,
    },
    Input {
        input: Input,
        observed_at: Option<Instant>,
    },
}

/// How stale a running run's stored status may get while steps come fast.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// A field never shown in API bodies (older runs kept their snapshot there).
pub const SNAPSHOT: &str = "x-flotilla";

/// Member → the run and attempt upgrading it.
type MemberLocks = HashMap<String, (String, u64)>;

/// A run's task: the lease epoch it drives the run under, and its mailbox.
type RunTask = (i64, mpsc::UnboundedSender<Msg>);

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
        let allow = self
            .exec_allow
            .read()
            .map_err(|_| ApiError::conflict("exec allow list poisoned"))?
            .clone();
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

/// All active runs of the server.
pub struct Runs {
    pub store: Arc<dyn Store>,
    pub replica: Replica,
    pub drivers: Drivers,
    pub metrics: Arc<Metrics>,
    pub events: broadcast::Sender<RunEvent>,
    /// The task of each run this replica drives, with the lease epoch it drives it under.
    handles: Mutex<HashMap<(String, String), RunTask>>,
    /// One run task is built at a time, so two callers never build two for one run.
    loading: tokio::sync::Mutex<()>,
    /// Runs whose task ended on a store error, and fleets whose runs could not all be resumed:
    /// the coordinator tries again on its next pass.
    to_reload: Mutex<std::collections::HashSet<(String, String)>>,
    to_resume: Mutex<std::collections::HashSet<String>>,
    /// Live replicas at the last heartbeat.
    alive: std::sync::atomic::AtomicUsize,
    /// (fleet, member) → the runs told that member is locked: woken when it is let go.
    waiters: Mutex<HashMap<(String, String), std::collections::HashSet<String>>>,
    /// Fleet → member → the run (and attempt) upgrading it: one operation per cluster at a time,
    /// across runs (SEMANTICS §3).
    locks: Mutex<HashMap<String, MemberLocks>>,
    /// One scheduling turn per fleet at a time, so two runs never pick the same member.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What a run is created from, stored with it.
pub struct RunSnapshot {
    pub strategy: Option<StrategySpec>,
    pub update: ManagedClusterUpdateSpec,
    pub members: Vec<MemberRecord>,
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
    let members: Vec<Member> = snapshot.members.iter().cloned().map(Member::from).collect();
    Engine::create(
        run,
        &RunSpec {
            strategy,
            upgrade,
            rules: snapshot.rules,
        },
        &members,
        snapshot.catalog.clone(),
    )
}

fn read_snapshot(body: &Value, internal: &Value) -> Result<RunSnapshot, ApiError> {
    let bad = |e: serde_json::Error| {
        ApiError::conflict(format!("stored run snapshot is unreadable: {e}"))
    };
    Ok(RunSnapshot {
        strategy: match &body["properties"]["strategy"] {
            Value::Null => None,
            s => Some(serde_json::from_value(s.clone()).map_err(bad)?),
        },
        update: serde_json::from_value(body["properties"]["managedClusterUpdate"].clone())
            .map_err(bad)?,
        members: serde_json::from_value(internal["members"].clone()).map_err(bad)?,
        catalog: serde_json::from_value(internal["catalog"].clone()).map_err(bad)?,
        rules: serde_json::from_value(internal["rules"].clone()).unwrap_or_default(),
    })
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
            handles: Mutex::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            to_reload: Mutex::new(Default::default()),
            to_resume: Mutex::new(Default::default()),
            alive: std::sync::atomic::AtomicUsize::new(1),
            locks: Mutex::new(HashMap::new()),
            turns: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
        })
    }

    fn turn(&self, fleet: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        turns.entry(fleet.to_string()).or_default().clone()
    }

    /// Members of a fleet being upgraded by runs other than `run`, and by which.
    fn locked_by_others(&self, fleet: &str, run: &str) -> HashMap<String, String> {
        let locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks
            .get(fleet)
            .map(|m| {
                m.iter()
                    .filter(|(_, (holder, _))| holder != run)
                    .map(|(member, (holder, _))| (member.clone(), holder.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn acquire(&self, fleet: &str, member: &str, run: &str, attempt: u64) {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks
            .entry(fleet.to_string())
            .or_default()
            .insert(member.to_string(), (run.to_string(), attempt));
    }

    fn release(&self, fleet: &str, member: &str, run: &str, attempt: u64) {
        let released = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            match locks.get_mut(fleet) {
                Some(members)
                    if members
                        .get(member)
                        .is_some_and(|(r, a)| r == run && *a == attempt) =>
                {
                    members.remove(member);
                    true
                }
                _ => false,
            }
        };
        if released {
            self.wake_waiters(fleet, member);
        }
    }

    fn wait_for(&self, fleet: &str, member: &str, run: &str) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        waiters
            .entry((fleet.to_string(), member.to_string()))
            .or_default()
            .insert(run.to_string());
    }

    /// Wakes the runs waiting for a member that was just let go of.
    fn wake_waiters(&self, fleet: &str, member: &str) {
        let runs = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            waiters
                .remove(&(fleet.to_string(), member.to_string()))
                .unwrap_or_default()
        };
        let handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        for run in runs {
            if let Some((_, tx)) = handles.get(&(fleet.to_string(), run)) {
                let _ = tx.send(Msg::Nudge);
            }
        }
    }

    fn release_all(&self, fleet: &str, run: &str) {
        let mut released = Vec::new();
        {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(members) = locks.get_mut(fleet) {
                members.retain(|member, (holder, _)| {
                    let keep = holder != run;
                    if !keep {
                        released.push(member.clone());
                    }
                    keep
                });
            }
        }
        for member in released {
            self.wake_waiters(fleet, &member);
        }
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
                    input: input.clone(),
                    reply,
                    at: Instant::now(),
                })
                .is_err()
            {
                // The run's task ended (it finished): forget it and load it again.
                self.forget(fleet, run, &tx);
                continue;
            }
            return answer
                .await
                .map_err(|_| ApiError::conflict("the run's reconciler stopped; try again"))?;
        }
        Err(ApiError::conflict(
            "the run's reconciler is not available; try again",
        ))
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
                self.resume_fleet(fleet).await;
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
        let mut handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        handles.retain(|(f, _), (_, tx)| {
            if f == fleet {
                let _ = tx.send(Msg::Abandon);
            }
            f != fleet
        });
        drop(handles);
        if let Ok(mut locks) = self.locks.lock() {
            locks.remove(fleet);
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

    /// Forgets a run's task if it is still the one behind `tx` (a newer one is kept).
    fn forget(&self, fleet: &str, run: &str, tx: &mpsc::UnboundedSender<Msg>) {
        if let Ok(mut handles) = self.handles.lock() {
            let key = (fleet.to_string(), run.to_string());
            if handles.get(&key).is_some_and(|(_, t)| t.same_channel(tx)) {
                handles.remove(&key);
            }
        }
    }

    /// Ends a run's task at once (the run was replaced or deleted); it is loaded afresh when
    /// next needed.
    pub fn retire(&self, fleet: &str, run: &str) {
        if let Ok(mut handles) = self.handles.lock()
            && let Some((_, tx)) = handles.remove(&(fleet.to_string(), run.to_string()))
        {
            let _ = tx.send(Msg::Abandon);
        }
    }

    /// Loads every run of a fleet that is not finished and starts its reconciler (when this
    /// replica takes the fleet's lease). What cannot be loaded now is tried again by the
    /// coordinator.
    async fn resume_fleet(self: &Arc<Self>, fleet: &str) {
        let runs = match self
            .store
            .list(fleet, Kind::Run, None, usize::MAX >> 1)
            .await
        {
            Ok(runs) => runs,
            Err(e) => {
                tracing::error!(fleet, error = %e, "cannot list the fleet's runs; trying again");
                if let Ok(mut r) = self.to_resume.lock() {
                    r.insert(fleet.to_string());
                }
                return;
            }
        };
        {
            for run in runs {
                let state = run.body["properties"]["status"]["status"]["state"]
                    .as_str()
                    .unwrap_or("NotStarted");
                let completed =
                    run.body["properties"]["status"]["status"]["completedTime"].is_string();
                if matches!(state, "Completed" | "Skipped")
                    || (state == "Failed" && completed)
                    || state == "NotStarted"
                {
                    continue;
                }
                if let Err(e) = self.handle(fleet, &run.name).await {
                    tracing::error!(fleet, run = %run.name, error = %e.message, "cannot resume the run; trying again");
                    self.reload_later(fleet, &run.name);
                }
            }
        }
    }

    async fn handle(
        self: &Arc<Self>,
        fleet: &str,
        run: &str,
    ) -> Result<mpsc::UnboundedSender<Msg>, ApiError> {
        let key = (fleet.to_string(), run.to_string());
        let Some(fence) = self.replica.fence(fleet) else {
            return Err(ApiError::conflict(format!(
                "this replica does not drive fleet {fleet:?} now; try again"
            )));
        };
        let live = |runs: &Runs| -> Option<mpsc::UnboundedSender<Msg>> {
            runs.handles
                .lock()
                .ok()?
                .get(&key)
                .filter(|(epoch, tx)| *epoch == fence.epoch && !tx.is_closed())
                .map(|(_, tx)| tx.clone())
        };
        if let Some(tx) = live(self) {
            return Ok(tx);
        }
        let _loading = self.loading.lock().await;
        if let Some(tx) = live(self) {
            return Ok(tx);
        }
        let resource = self
            .store
            .get(fleet, Kind::Run, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NotFound,
                    format!("update run {run:?} does not exist"),
                    "updateRun",
                )
            })?;
        let internal = self
            .store
            .get(fleet, Kind::RunSnapshot, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?
            .ok_or_else(|| {
                ApiError::conflict(format!("update run {run:?} has no stored snapshot"))
            })?;
        let snapshot = read_snapshot(&resource.body, &internal.body)?;
        let (mut engine, _) = engine_from_snapshot(run, &snapshot)?;
        // Replay the input log: the engine is deterministic, so this rebuilds its state.
        for entry in self
            .store
            .run_log(fleet, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?
        {
            let at = entry["at"]
                .as_str()
                .and_then(|t| Time::parse(t).ok())
                .unwrap_or_default();
            if entry.get("settle").is_some() {
                engine.settle(at);
            } else if let Ok(input) = serde_json::from_value::<Input>(entry["input"].clone()) {
                let _ = engine.handle(at, input);
            }
        }
        while engine.poll_command().is_some() {}
        while engine.poll_event().is_some() {}
        let driver = self.drivers.for_fleet(self.store.as_ref(), fleet).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let members: HashMap<String, String> = snapshot
            .members
            .iter()
            .map(|m| (m.name.clone(), m.cluster_resource_id.clone()))
            .collect();
        let mut base = resource.body.clone();
        if let Some(props) = base.get_mut("properties").and_then(Value::as_object_mut) {
            props.remove("status");
        }
        let actor = Actor {
            fleet: fleet.to_string(),
            run: run.to_string(),
            engine,
            runs: self.clone(),
            driver,
            tx: tx.clone(),
            members,
            base,
            operations: HashMap::new(),
            outstanding: Default::default(),
            known_locked: HashMap::new(),
            status_dirty: false,
            last_status_write: None,
            fence: fence.clone(),
            snapshot_etag: internal.etag.clone(),
        };
        let intents = self
            .store
            .intents(fleet, run)
            .await
            .map_err(|e| ApiError::conflict(e.to_string()))?;
        {
            let mut handles = self
                .handles
                .lock()
                .map_err(|_| ApiError::conflict("poisoned"))?;
            // The lease may have been lost (or taken again) while the run was loading.
            if self.replica.fence(fleet) != Some(fence.clone()) {
                return Err(ApiError::conflict(format!(
                    "this replica does not drive fleet {fleet:?} now; try again"
                )));
            }
            if let Some((_, old)) = handles.insert(key, (fence.epoch, tx.clone())) {
                let _ = old.send(Msg::Abandon);
            }
        }
        tokio::spawn(actor.run(rx, intents));
        Ok(tx)
    }
}

struct Actor {
    fleet: String,
    run: String,
    engine: Engine,
    runs: Arc<Runs>,
    driver: Arc<dyn Driver>,
    tx: mpsc::UnboundedSender<Msg>,
    /// Member name → cluster resource id.
    members: HashMap<String, String>,
    /// The run resource without its status.
    base: Value,
    /// Attempt → operation id, once the driver named it.
    operations: HashMap<u64, String>,
    /// Attempts a driver task is still following.
    outstanding: std::collections::HashSet<u64>,
    /// Members of this run that another run is upgrading, as last told to the engine.
    known_locked: HashMap<String, String>,
    /// The status changed since it was last written.
    status_dirty: bool,
    last_status_write: Option<Instant>,
    /// The fleet lease this run is driven under; every batch is written under it.
    fence: Fence,
    /// The eTag of the run's snapshot when this task loaded it: a batch is written only while
    /// it is the same, so a run replaced or deleted (through any replica) stops this task.
    snapshot_etag: String,
}

impl Actor {
    fn member_ref(&self, name: &str) -> MemberRef {
        MemberRef {
            name: name.to_string(),
            cluster_resource_id: self.members.get(name).cloned().unwrap_or_default(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>, intents: Vec<Intent>) {
        self.recover(intents);
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
            let flush_deadline = self.status_dirty.then(|| {
                self.last_status_write
                    .map_or_else(Instant::now, |t| t + STATUS_EVERY)
            });
            let deadline = match (engine_deadline, flush_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
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
            if self.engine.is_finished() && self.outstanding.is_empty() {
                break;
            }
        }
        self.runs.forget(&self.fleet, &self.run, &self.tx);
        self.runs.release_all(&self.fleet, &self.run);
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
                let _ = reply.send(Err(ApiError::conflict(
                    "the run's reconciler stopped; try again",
                )));
            }
            Msg::Remote { id, .. } => self.runs.undeliver(&self.fleet, id),
            _ => {}
        }
    }

    /// Re-asks the driver about everything in flight when the run was last written.
    fn recover(&mut self, intents: Vec<Intent>) {
        for intent in intents.into_iter().filter(|i| !i.finished) {
            if self.engine.member_attempt(&intent.member) != Some((State::Running, intent.attempt))
            {
                continue;
            }
            if self
                .engine
                .pending_observations()
                .iter()
                .any(|(m, a)| *m == intent.member && *a == intent.attempt)
            {
                continue;
            }
            let Ok(target) = serde_json::from_value::<TargetRecord>(intent.target.clone()) else {
                continue;
            };
            let key = operation_key(&self.fleet, &self.run, intent.attempt);
            self.runs
                .acquire(&self.fleet, &intent.member, &self.run, intent.attempt);
            self.spawn_upgrade(
                intent.member.clone(),
                intent.attempt,
                target.into_target(),
                key,
                intent.operation_id.clone(),
                true,
            );
        }
        for (member, attempt) in self.engine.pending_observations() {
            self.spawn_observe(member, attempt);
        }
    }

    /// Applies a batch of messages at one instant, records it, then acts. Returns false if the
    /// store failed (the run is then reloaded from its log on next use).
    async fn step(&mut self, batch: Vec<Msg>, woke_at: Option<Instant>) -> bool {
        if batch.iter().any(|m| matches!(m, Msg::Abandon)) {
            // Told to stop: nothing of this batch is applied; actions are answered or handed
            // over again.
            for msg in batch {
                self.turn_away(msg);
            }
            return false;
        }
        // One run of a fleet schedules at a time, so that the locks it sees are current.
        let turn = self.runs.turn(&self.fleet);
        let guard = turn.lock().await;
        let now = now();
        let mut log = Vec::new();
        let mut replies = Vec::new();
        let mut finished_attempts = Vec::new();
        let mut finish_seen: Option<Instant> = None;
        let mut action_at: Option<Instant> = None;
        let mut observed = Vec::new();
        let mut action_results = Vec::new();
        for msg in batch {
            match msg {
                Msg::Nudge | Msg::Abandon => {}
                Msg::Remote { id, input } => {
                    action_at = Some(action_at.unwrap_or_else(Instant::now));
                    let result = self.engine.handle(now, input.clone());
                    if result.is_ok() {
                        log.push(json!({"at": now, "input": input}));
                    }
                    action_results.push((
                        id,
                        match result {
                            Ok(()) => json!({"ok": true}),
                            Err(e) => json!({"error": e}),
                        },
                    ));
                }
                Msg::Action { input, reply, at } => {
                    action_at = Some(action_at.map_or(at, |a: Instant| a.min(at)));
                    let result = self.engine.handle(now, input.clone());
                    if result.is_ok() {
                        log.push(json!({"at": now, "input": input}));
                    }
                    replies.push((reply, result));
                }
                Msg::Input { input, observed_at } => {
                    match &input {
                        Input::OperationFinished {
                            attempt, member, ..
                        } => {
                            finished_attempts.push(*attempt);
                            self.outstanding.remove(attempt);
                            self.runs.release(&self.fleet, member, &self.run, *attempt);
                            if let Some(t) = observed_at {
                                finish_seen = Some(finish_seen.map_or(t, |f| f.min(t)));
                            }
                        }
                        Input::Observed {
                            member, cluster, ..
                        } => {
                            observed.push((member.clone(), cluster.spec()));
                            if let Input::Observed {
                                operation: Some((attempt, OperationProgress::NotRunning)),
                                ..
                            } = &input
                            {
                                self.outstanding.remove(attempt);
                            }
                        }
                        Input::OperationAccepted {
                            attempt,
                            operation_id,
                            ..
                        } => {
                            self.operations.insert(*attempt, operation_id.clone());
                        }
                        _ => {}
                    }
                    let _ = self.engine.handle(now, input.clone());
                    log.push(json!({"at": now, "input": input}));
                }
            }
        }
        // Tell the engine which of its members other runs are upgrading now (SEMANTICS §3).
        let mut held = self.runs.locked_by_others(&self.fleet, &self.run);
        held.retain(|member, _| self.engine.member_attempt(member).is_some());
        let mut lock_inputs = Vec::new();
        for (member, holder) in &held {
            if self.known_locked.get(member) != Some(holder) {
                self.runs.wait_for(&self.fleet, member, &self.run);
                lock_inputs.push(Input::MemberLocked {
                    member: member.clone(),
                    by_run: holder.clone(),
                });
            }
        }
        for member in self.known_locked.keys() {
            if !held.contains_key(member) {
                lock_inputs.push(Input::MemberUnlocked {
                    member: member.clone(),
                });
            }
        }
        for input in lock_inputs {
            let _ = self.engine.handle(now, input.clone());
            log.push(json!({"at": now, "input": input}));
        }
        self.known_locked = held;
        self.engine.settle(now);
        log.push(json!({"at": now, "settle": true}));
        let mut commands = Vec::new();
        let mut intents = Vec::new();
        while let Some(command) = self.engine.poll_command() {
            if let Command::StartUpgrade {
                member,
                attempt,
                target,
            } = &command
            {
                self.runs.acquire(&self.fleet, member, &self.run, *attempt);
                intents.push(Intent {
                    attempt: *attempt,
                    member: member.clone(),
                    target: serde_json::to_value(TargetRecord::from(target)).unwrap_or_default(),
                    operation_id: None,
                    finished: false,
                });
            }
            commands.push(command);
        }
        drop(guard);
        let mut events = Vec::new();
        let mut gates_changed = false;
        let mut structural = false;
        while let Some(event) = self.engine.poll_event() {
            gates_changed |= matches!(
                event.kind,
                EventType::GatePending | EventType::GateCompleted | EventType::GateSkipped
            );
            // Runs, stages, groups, gates and waits changing are shown at once; member churn is
            // what gets batched.
            structural |= !matches!(
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
            events.push(serde_json::to_value(&event).unwrap_or_default());
        }
        // A step where nothing happened (a wake-up that changed nothing) leaves the stored status
        // as it is: rendering and rewriting a large run's status is the expensive part of a step.
        let changed = log.len() > 1 || !events.is_empty() || !commands.is_empty();
        self.status_dirty |= changed;
        // The status is a view of the log: written at once when someone waits for it (an API
        // action) or the run ends, otherwise at most every STATUS_EVERY, so a large run's many
        // small steps do not each rewrite its whole status.
        let urgent = structural
            || !replies.is_empty()
            || !action_results.is_empty()
            || self.engine.is_finished()
            || self
                .last_status_write
                .is_none_or(|t| t.elapsed() >= STATUS_EVERY);
        let write_status = self.status_dirty && urgent;
        if write_status {
            self.status_dirty = false;
            self.last_status_write = Some(Instant::now());
        }
        let body = write_status.then(|| {
            let mut body = self.base.clone();
            body["properties"]["status"] =
                serde_json::to_value(self.engine.status()).unwrap_or_default();
            body
        });
        let gates = if gates_changed {
            self.gate_resources()
        } else {
            Vec::new()
        };
        // Observations land in the members before the run's progress does, so whoever sees the
        // run move on sees the clusters it changed.
        for (member, spec) in &observed {
            record_observation(self.runs.store.as_ref(), &self.fleet, member, spec).await;
        }
        let write = RunBatch {
            fleet: self.fleet.clone(),
            run: self.run.clone(),
            log,
            intents,
            finished_attempts,
            events: events.clone(),
            run_body: body,
            gates,
            action_results,
            fence: Some(self.fence.clone()),
            snapshot_etag: Some(self.snapshot_etag.clone()),
        };
        let written = self.runs.store.write_run_batch(&write).await;
        // Handed-over actions are done with either way: answered now, or pending again.
        for (id, _) in &write.action_results {
            self.runs.undeliver(&self.fleet, *id);
        }
        if let Err(e) = written {
            let message = match &e {
                StoreError::Fenced(why) => {
                    tracing::warn!(fleet = %self.fleet, run = %self.run, why, "stopped driving the run");
                    self.runs.abandon(&self.fleet, self.fence.epoch);
                    "this replica lost the fleet's lease; try again".to_string()
                }
                StoreError::Superseded(why) => {
                    tracing::info!(fleet = %self.fleet, run = %self.run, why, "the run changed under its task; stopping it");
                    "the update run was replaced or deleted".to_string()
                }
                _ => {
                    tracing::error!(fleet = %self.fleet, run = %self.run, error = %e, "cannot record the run's progress; reloading it");
                    self.runs.reload_later(&self.fleet, &self.run);
                    format!("the change could not be recorded: {e}")
                }
            };
            for (reply, _) in replies {
                let _ = reply.send(Err(ApiError::conflict(message.clone())));
            }
            return false;
        }
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
        for event in events {
            let _ = self.runs.events.send(RunEvent {
                fleet: self.fleet.clone(),
                run: self.run.clone(),
                event,
            });
        }
        for command in commands {
            match command {
                Command::StartUpgrade {
                    member,
                    attempt,
                    target,
                } => {
                    // What made this start possible, and how long ago (SEMANTICS: no polling delay).
                    let trigger = finish_seen
                        .map(|t| ("slot", t))
                        .or(action_at.map(|t| ("action", t)))
                        .or(woke_at.map(|t| ("timer", t)));
                    if let Some((kind, since)) = trigger {
                        self.runs
                            .metrics
                            .record_dispatch_delay(kind, since.elapsed());
                    }
                    let key = operation_key(&self.fleet, &self.run, attempt);
                    self.spawn_upgrade(member, attempt, target, key, None, false);
                }
                Command::Observe { member, attempt } => self.spawn_observe(member, attempt),
            }
        }
        true
    }

    fn gate_resources(&self) -> Vec<(String, Value)> {
        let run_id = format!("/v1/fleets/{}/updateRuns/{}", self.fleet, self.run);
        self.engine
            .gate_views()
            .into_iter()
            .map(|g| {
                let mut properties = json!({
                    "provisioningState": "Succeeded",
                    "gateType": g.gate_type,
                    "target": {"id": run_id, "updateRunProperties": {"name": self.run, "stage": g.stage, "timing": format!("{:?}", g.timing)}},
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
                let body = json!({
                    "id": format!("/v1/fleets/{}/gates/{}", self.fleet, g.id),
                    "name": g.id,
                    "type": "Microsoft.ContainerService/fleets/gates",
                    "properties": properties,
                });
                (g.id, body)
            })
            .collect()
    }

    /// What lets an attempt's follower send: this run's fleet lease at the epoch held now.
    fn permit(&self, attempt: u64) -> LeasePermit {
        LeasePermit {
            runs: self.runs.clone(),
            fleet: self.fleet.clone(),
            run: self.run.clone(),
            epoch: self.fence.epoch,
            attempt,
        }
    }

    /// Sends an upgrade (unless recovering one the driver may already have) and follows it to a
    /// definitive answer (`crate::operation::drive`).
    fn spawn_upgrade(
        &mut self,
        member: String,
        attempt: u64,
        target: Target,
        key: String,
        known: Option<String>,
        recovering: bool,
    ) {
        let driver = self.driver.clone();
        let report = RunReport(self.tx.clone());
        let permit = self.permit(attempt);
        let who = self.member_ref(&member);
        self.outstanding.insert(attempt);
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
            };
            crate::operation::drive(driver, report, permit, attempt, begin).await;
        });
    }

    /// After a stop and start: is the earlier operation still running, and where is the cluster?
    /// Asked until answered (`crate::operation::reattach`); then followed if it still runs.
    fn spawn_observe(&mut self, member: String, attempt: u64) {
        let driver = self.driver.clone();
        let report = RunReport(self.tx.clone());
        let permit = self.permit(attempt);
        let who = self.member_ref(&member);
        let key = operation_key(&self.fleet, &self.run, attempt);
        let operation = self
            .operations
            .get(&attempt)
            .cloned()
            .unwrap_or(key.clone());
        let target = self.engine.member_target(&member);
        self.outstanding.insert(attempt);
        tokio::spawn(async move {
            use crate::operation::Report;
            let (progress, cluster) =
                match crate::operation::reattach(&driver, &report, &who, &operation).await {
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
                    cluster: std::sync::Arc::new(cluster),
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

/// The follower's reports go to the run task's channel.
struct RunReport(mpsc::UnboundedSender<Msg>);

impl crate::operation::Report for RunReport {
    fn input(&self, input: Input, finished_at: Option<Instant>) -> bool {
        self.0
            .send(Msg::Input {
                input,
                observed_at: finished_at,
            })
            .is_ok()
    }

    fn listening(&self) -> bool {
        !self.0.is_closed()
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
        let _ = self
            .runs
            .store
            .record_operation(&self.fleet, &self.run, self.attempt, operation_id)
            .await;
    }

    fn count_started(&self) {
        self.runs.metrics.count_started(&self.fleet);
    }
}

/// Writes a member's latest observation into its resource (`status.cluster`).
pub async fn record_observation(
    store: &dyn Store,
    fleet: &str,
    member: &str,
    spec: &flotilla_engine::fleet::ClusterSpec,
) {
    for _ in 0..3 {
        let Ok(Some(current)) = store.get(fleet, Kind::Member, member).await else {
            return;
        };
        let mut body = current.body.clone();
        body["properties"]["status"] = json!({"cluster": spec, "lastObservedAt": now()});
        match store
            .put(
                fleet,
                Kind::Member,
                member,
                &body,
                &crate::store::Precondition::IfMatch(current.etag),
            )
            .await
        {
            Err(crate::store::StoreError::Precondition(_)) => continue,
            _ => return,
        }
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
