//! The fleet engine: one fleet's members, held once, and every run of the fleet, with the rules
//! that span runs (FLEET-DESIGN.md). Pure and deterministic, like the run engine it drives.
//!
//! - **One copy of each member.** The member table holds each cluster once, behind an `Arc`;
//!   runs point at it. An observation replaces the table's cluster and hands the same pointer to
//!   every run that selected the member.
//! - **One operation per cluster, across runs** (SEMANTICS §3). An upgrade a run starts makes
//!   the cluster busy until its operation's definitive answer (the result, or a re-observation
//!   that finds it not running), whether or not the run still tracks that attempt. Before its
//!   turn, each run is told which of its members another run holds (`MemberLocked`, naming the
//!   holder) and which were let go (the cluster as it now is, then `MemberUnlocked`), so it
//!   decides those members again on what the other run did.
//! - **Turns.** `settle` moves the runs one after another in creation order; a start in one run
//!   is a lock for every later run in the same pass.
//!
//! Cost: an event touches the runs that selected the member it concerns (a hash lookup per
//! run); nothing walks the member table after creation.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use crate::engine::{
    Command, Engine, Input, OperationProgress, RunSpec, StatusChanges, Target, apply_target,
};
use crate::error::{ApiError, ErrorCode};
use crate::fleet::{Catalog, Cluster, Member, SharedMember};
use crate::status::Event;
use crate::status::State;
use crate::time::Time;

/// What a fleet engine is told.
#[derive(Clone, Debug)]
pub enum FleetInput {
    /// An input for one run: a user's action or a driver's answer to that run's command.
    Run { run: String, input: Input },
    /// The cluster of a member as it now is: every run that selected it decides again on it.
    Observed { member: String, cluster: Cluster },
    /// A member joined the fleet, or was registered again; runs created later see it.
    MemberAdded(Member),
    /// A member left the fleet: the runs that selected it skip it where it has not started.
    MemberRemoved { member: String },
    /// The release catalog changed: every unfinished run sees the new one.
    CatalogChanged(Catalog),
    /// A freeze was created or changed (SEMANTICS §12): it holds members of every run from the
    /// next scheduling pass.
    PutFreeze(Box<crate::freeze::Freeze>),
    /// A freeze was deleted.
    DeleteFreeze { name: String },
    /// A disruption budget was created or changed (SEMANTICS §12): it holds members of every
    /// run from the next scheduling pass.
    PutBudget(Box<crate::budget::Budget>),
    /// A disruption budget was deleted.
    DeleteBudget { name: String },
}

/// A run's command, tagged with the run.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetCommand {
    pub run: String,
    pub command: Command,
}

/// A run's event, tagged with the run.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetEvent {
    pub run: String,
    pub event: Event,
}

/// What a run's engine was given, in order: replaying these into a fresh [`Engine`] built the
/// same way rebuilds the run exactly, whatever the other runs did (the fleet's rules reach a
/// run only through its inputs).
#[derive(Clone, Debug, PartialEq)]
pub enum Delivered {
    Input(Time, Input),
    AdvanceClock(Time),
    Settle(Time),
}

/// The operation a cluster is under: which run (by creation sequence) and attempt, and what it
/// upgrades the cluster to.
#[derive(Clone, Debug)]
struct Busy {
    run: u64,
    run_name: Arc<str>,
    attempt: u64,
    target: Target,
}

#[derive(Clone, Debug)]
struct RunSlot {
    name: String,
    /// The name again, shared by every lock of this run that other runs are told of.
    shared_name: Arc<str>,
    engine: Engine,
    /// Members this run was told another run holds, and by which.
    told: BTreeMap<Arc<str>, Arc<str>>,
    /// Members whose holder changed since this run's last turn.
    news: BTreeSet<Arc<str>>,
    /// Given something since its last settle: a settle of a run given nothing, with no timer
    /// due, changes nothing, so it is skipped.
    dirty: bool,
    /// What the engine was given since the shell last took it (when the fleet records).
    journal: Vec<Delivered>,
    /// The version of the fleet's freezes this run was last given.
    freezes_seen: u64,
    /// The versions of the fleet's budgets and of their counts in flight this run was last
    /// given.
    budgets_seen: u64,
    room_seen: u64,
}

impl RunSlot {
    fn new(name: &str, engine: Engine) -> RunSlot {
        RunSlot {
            name: name.to_string(),
            shared_name: Arc::from(name),
            engine,
            told: BTreeMap::new(),
            news: BTreeSet::new(),
            dirty: true,
            journal: Vec::new(),
            freezes_seen: 0,
            budgets_seen: 0,
            room_seen: 0,
        }
    }

    /// Gives the engine an input, recording it when it changed something (a refused input
    /// changes nothing, so replay need not see it).
    fn give(&mut self, now: Time, input: Input, record: bool) -> Result<(), ApiError> {
        let recorded = record.then(|| input.clone());
        self.engine.handle(now, input)?;
        self.dirty = true;
        if let Some(input) = recorded {
            self.journal.push(Delivered::Input(now, input));
        }
        Ok(())
    }
}

/// A member the table does not hold, as adopted runs brought it.
#[derive(Clone, Debug)]
struct Interned {
    id: Arc<str>,
    cluster: Arc<Cluster>,
    /// The fleet itself saw this cluster (an observation, an upgrade's end), after some run
    /// brought its copy: newer than what runs rebuilt from older records hold.
    seen: bool,
}

/// What a request to roll a run back comes to (SEMANTICS §15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RollbackRequest {
    /// The run is rolled back by this run already.
    Made(String),
    /// A new rollback run `name`, made from `plan`.
    New {
        name: String,
        plan: crate::engine::RollbackPlan,
    },
}

/// One fleet: its member table, its runs, and the rules between them.
#[derive(Clone, Debug, Default)]
pub struct FleetEngine {
    members: BTreeMap<Arc<str>, SharedMember>,
    catalog: Catalog,
    /// Runs by creation sequence: the order of turns.
    runs: BTreeMap<u64, RunSlot>,
    names: HashMap<String, u64>,
    next_run: u64,
    busy: BTreeMap<Arc<str>, Busy>,
    commands: VecDeque<FleetCommand>,
    /// Keep each run's [`Delivered`] journal for the shell to persist.
    record: bool,
    /// What adopted runs hold of members the table does not: one copy of each name and id,
    /// and the cluster as the fleet last saw it, so equal ones are held once.
    interned: HashMap<Arc<str>, Interned>,
    /// Members whose cluster the fleet saw change since the shell last took them.
    changed: BTreeSet<Arc<str>>,
    /// The fleet's freezes by name, and what each covers as every run is given it (SEMANTICS
    /// §12); the version counts changes, so each run is given each change once.
    freezes: BTreeMap<String, crate::freeze::Freeze>,
    covered: Arc<crate::freeze::Freezes>,
    freezes_version: u64,
    /// Members changed since `covered` was worked out.
    freezes_stale: bool,
    /// The fleet's disruption budgets by name, split into partitions as every run is given
    /// them, and the members in flight in each partition now (SEMANTICS §12).
    budgets: BTreeMap<String, crate::budget::Budget>,
    partitions: Arc<crate::budget::Budgets>,
    in_flight: Vec<u64>,
    /// Versions of `partitions` and of `in_flight`, so each run is given each change once.
    budgets_version: u64,
    room_version: u64,
    /// Members changed since `partitions` was worked out.
    budgets_stale: bool,
    /// Members in flight in some run, which count against budgets, and the run.
    disrupted: HashMap<Arc<str>, u64>,
    /// A member stopped counting against a budget during the runs' turns (a rollback that
    /// ended at its run's turn): runs holding members for budgets take their turn again.
    room_opened: bool,
}

fn no_run(run: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("update run {run:?} does not exist"),
        "updateRun",
    )
}

impl FleetEngine {
    /// A fleet with these members and this catalog, and no runs yet.
    pub fn new(members: &[Member], catalog: Catalog) -> FleetEngine {
        FleetEngine::from_shared(members.iter().map(SharedMember::from), catalog)
    }

    /// A fleet whose members' clusters are already shared (equal clusters held once, as a
    /// shell reading many members interns them).
    pub fn from_shared(
        members: impl IntoIterator<Item = SharedMember>,
        catalog: Catalog,
    ) -> FleetEngine {
        FleetEngine {
            members: members.into_iter().map(|m| (m.name.clone(), m)).collect(),
            catalog,
            ..FleetEngine::default()
        }
    }

    /// Keeps, for each run, what its engine is given ([`FleetEngine::take_journal`]).
    pub fn recording(mut self) -> FleetEngine {
        self.record = true;
        self
    }

    /// The same fleet keeping no journal (a forecast's copy: nothing it does is persisted).
    pub fn without_journal(mut self) -> FleetEngine {
        self.record = false;
        for slot in self.runs.values_mut() {
            slot.journal = Vec::new();
        }
        self
    }

    /// What a run's engine was given since the last call, to persist as its input log.
    pub fn take_journal(&mut self, run: &str) -> Vec<Delivered> {
        self.names
            .get(run)
            .and_then(|s| self.runs.get_mut(s))
            .map(|slot| std::mem::take(&mut slot.journal))
            .unwrap_or_default()
    }

    /// Takes in a run rebuilt elsewhere (by replaying its journal into an engine). The clusters
    /// its operations in flight are on become busy, unless another run already holds them, and
    /// its locks are checked again at its first turn.
    pub fn adopt_run(&mut self, now: Time, name: &str, engine: Engine) -> Result<(), ApiError> {
        if self.names.contains_key(name) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("update run {name:?} is already driven"),
                "updateRun",
            ));
        }
        let seq = self.next_run;
        self.next_run += 1;
        let mut engine = engine;
        self.share(&mut engine);
        // What it was given before is not news: what it holds in flight is.
        engine.take_disruptions();
        let in_flight: Vec<Arc<str>> = engine.disrupted_members().cloned().collect();
        for member in in_flight {
            self.disruption(seq, member, true);
        }
        let mut slot = RunSlot::new(name, engine);
        // Its record may hold freezes and budgets the fleet no longer has: it is given the
        // fleet's own at its first turn.
        slot.freezes_seen = u64::MAX;
        slot.budgets_seen = u64::MAX;
        let shared_name = slot.shared_name.clone();
        let mut holders: HashMap<Box<str>, Arc<str>> = HashMap::new();
        for (member, holder) in slot.engine.locked_members() {
            let holder = match holders.get(holder) {
                Some(shared) => shared.clone(),
                None => {
                    let shared: Arc<str> = Arc::from(holder);
                    holders.insert(holder.into(), shared.clone());
                    shared
                }
            };
            slot.told.insert(self.key(member), holder);
        }
        let held: Vec<(Arc<str>, u64, Target)> = slot
            .engine
            .clusters_held()
            .map(|(member, attempt, target)| (self.key(member), attempt, target.clone()))
            .collect();
        let mut news: BTreeSet<Arc<str>> = slot.told.keys().cloned().collect();
        news.extend(
            self.busy
                .keys()
                .filter(|m| slot.engine.has_member(m))
                .cloned(),
        );
        slot.news = news;
        self.runs.insert(seq, slot);
        self.names.insert(name.to_string(), seq);
        // Another run may have upgraded its members since the run's record was made.
        self.refresh(now, seq)?;
        for (member, attempt, target) in held {
            if self.busy.contains_key(&member) {
                continue;
            }
            self.busy.insert(
                member.clone(),
                Busy {
                    run: seq,
                    run_name: shared_name.clone(),
                    attempt,
                    target,
                },
            );
            self.tell_others(seq, &member);
        }
        Ok(())
    }

    /// Points a run rebuilt elsewhere at the copies the fleet already holds: the table's
    /// member where it is the same, or what an earlier adopted run brought.
    fn share(&mut self, engine: &mut Engine) {
        let (table, interned) = (&self.members, &mut self.interned);
        engine.share_members(|name, id, cluster| {
            let (key, known_id, known_cluster) = match table.get(&**name) {
                Some(t) => (
                    t.name.clone(),
                    t.cluster_resource_id.clone(),
                    t.cluster.clone(),
                ),
                None => match interned.get_key_value(name) {
                    Some((k, i)) => (k.clone(), i.id.clone(), i.cluster.clone()),
                    None => {
                        let first = Interned {
                            id: id.clone(),
                            cluster: cluster.clone(),
                            seen: false,
                        };
                        interned.insert(name.clone(), first);
                        (name.clone(), id.clone(), cluster.clone())
                    }
                },
            };
            let id = if known_id == *id {
                known_id
            } else {
                id.clone()
            };
            let cluster = if known_cluster == *cluster {
                known_cluster
            } else {
                cluster.clone()
            };
            (key, id, cluster)
        });
    }

    /// Tells run `seq` of every member whose cluster the fleet has seen change since the run
    /// last heard (a run rebuilt from an older record, or a finished run started again), but
    /// not of those it is upgrading itself: it decides them again on what they are now.
    fn refresh(&mut self, now: Time, seq: u64) -> Result<(), ApiError> {
        let Some(slot) = self.runs.get(&seq) else {
            return Ok(());
        };
        let stale: Vec<(Arc<str>, Arc<Cluster>)> = slot
            .engine
            .member_clusters()
            .filter(|(_, _, state)| *state != State::Running)
            .filter_map(|(name, cluster, _)| {
                let current = self.seen(name)?;
                (!Arc::ptr_eq(&current, cluster) && *current != **cluster)
                    .then(|| (name.clone(), current))
            })
            .collect();
        let record = self.record;
        let Some(slot) = self.runs.get_mut(&seq) else {
            return Ok(());
        };
        for (member, cluster) in stale {
            let input = Input::Observed {
                member: member.to_string(),
                cluster,
                operation: None,
            };
            slot.give(now, input, record)?;
        }
        Ok(())
    }

    /// A member's cluster as the fleet last saw it: the table's, or for a member the table
    /// does not hold, what its runs last saw.
    fn current(&self, member: &str) -> Option<Arc<Cluster>> {
        self.members
            .get(member)
            .map(|m| m.cluster.clone())
            .or_else(|| self.interned.get(member).map(|i| i.cluster.clone()))
    }

    /// A member's cluster as the fleet itself saw it, which a run's older record yields to.
    fn seen(&self, member: &str) -> Option<Arc<Cluster>> {
        self.members
            .get(member)
            .map(|m| m.cluster.clone())
            .or_else(|| {
                self.interned
                    .get(member)
                    .filter(|i| i.seen)
                    .map(|i| i.cluster.clone())
            })
    }

    /// Records that `member`'s cluster is now `cluster`. Returns false when the fleet already
    /// saw exactly that, so the runs, which hold the same, need not hear it again.
    fn set_current(&mut self, member: &str, cluster: &Arc<Cluster>) -> bool {
        let held = match self.members.get_mut(member) {
            Some(entry) => Some((entry.name.clone(), &mut entry.cluster)),
            None => self
                .interned
                .get_key_value(member)
                .map(|(k, _)| k.clone())
                .and_then(|k| {
                    let entry = self.interned.get_mut(&k)?;
                    entry.seen = true;
                    Some((k, &mut entry.cluster))
                }),
        };
        let Some((name, held)) = held else {
            return true;
        };
        if **held == **cluster {
            return false;
        }
        if held.region != cluster.region && !self.budgets.is_empty() {
            // Its partition by region may change.
            self.budgets_stale = true;
        }
        *held = cluster.clone();
        self.changed.insert(name);
        true
    }

    /// Members whose cluster changed since the last call (an observation, an upgrade that
    /// succeeded), with the cluster as it now is: what the shell persists of the member table.
    pub fn take_changed_members(&mut self) -> Vec<(Arc<str>, Arc<Cluster>)> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|m| Some((m.clone(), self.current(&m)?)))
            .collect()
    }

    /// The shared name of a member: the table's, or a new one for a member it does not hold.
    fn key(&self, member: &str) -> Arc<str> {
        self.members
            .get_key_value(member)
            .map_or_else(|| Arc::from(member), |(k, _)| k.clone())
    }

    /// The release catalog the fleet last saw.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// A member's cluster as the fleet last saw it.
    pub fn cluster(&self, member: &str) -> Option<&Cluster> {
        self.members.get(member).map(|m| &*m.cluster)
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// A member joins the table, or is written again: runs created later see it; a cluster
    /// that changed is news for the runs that selected it.
    fn join(&mut self, now: Time, shared: SharedMember) {
        let (name, cluster) = (shared.name.clone(), shared.cluster.clone());
        let before = self.current(&name);
        self.interned.remove(&name);
        self.members.insert(name.clone(), shared);
        if !self.freezes.is_empty() {
            // Its labels may put it under a freeze's selector, or take it out: worked out once
            // before the next turns, not once per member of an import.
            self.freezes_stale = true;
        }
        // Likewise for budgets: its partitions, and their sizes.
        self.budgets_stale |= !self.budgets.is_empty();
        if before.is_some_and(|b| b != cluster) {
            self.changed.insert(name.clone());
            self.fan_out(now, &name, cluster, None);
        }
    }

    /// The fleet's members as stored, read by a shell before it creates a run: a member the
    /// table lacks joins it (its observation has not reached the fleet yet), and one whose
    /// group, labels or cluster id were written since takes them, keeping the cluster the
    /// fleet last saw, which is never older than the stored one.
    pub fn take_stored_members(&mut self, now: Time, stored: Vec<SharedMember>) {
        for member in stored {
            match self.members.get(&member.name) {
                None => self.join(now, member),
                Some(held)
                    if held.group != member.group
                        || held.labels != member.labels
                        || held.cluster_resource_id != member.cluster_resource_id =>
                {
                    let cluster = held.cluster.clone();
                    self.join(now, SharedMember { cluster, ..member });
                }
                Some(_) => {}
            }
        }
    }

    /// Every member of the table, in name order, as a run created now would see them.
    pub fn table(&self) -> impl Iterator<Item = &SharedMember> {
        self.members.values()
    }

    /// Decides run `name` over the fleet's members as they are now (SEMANTICS §2) with the
    /// catalog given, without taking it in: the run and its creation warnings, or why it is
    /// refused. `unknown`: members whose clusters cannot be observed now (standing in with an
    /// unknown cluster) and why; a run that would select one is refused with that reason, one
    /// that does not is made from the others.
    pub fn plan_run(
        &self,
        name: &str,
        spec: &RunSpec,
        catalog: Catalog,
        unknown: &[(SharedMember, ApiError)],
    ) -> Result<(Engine, Vec<String>), ApiError> {
        self.name_is_free(name)?;
        // A member the table holds was observed since (its observation reached the fleet
        // first): it is not unknown.
        let unknown: Vec<&(SharedMember, ApiError)> = unknown
            .iter()
            .filter(|(m, _)| !self.members.contains_key(&m.name))
            .collect();
        if !unknown.is_empty() {
            let mut all: Vec<&SharedMember> = self
                .members
                .values()
                .chain(unknown.iter().map(|(m, _)| m))
                .collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            let (probe, _) = Engine::create_shared(name, spec, all, catalog.clone())?;
            if let Some((_, why)) = unknown.iter().find(|(m, _)| probe.has_member(&m.name)) {
                return Err(why.clone());
            }
        }
        Engine::create_shared(name, spec, self.members.values(), catalog)
    }

    /// Takes in run `name` as [`FleetEngine::plan_run`] decided it.
    pub fn take_run(&mut self, name: &str, engine: Engine) -> Result<(), ApiError> {
        self.name_is_free(name)?;
        self.add_new_run(name, engine);
        Ok(())
    }

    /// Creates a run over the fleet's members as they are now (SEMANTICS §2) with the catalog
    /// given (the fleet's own, or a run-specific view of it). Returns the creation warnings.
    pub fn create_run(
        &mut self,
        name: &str,
        spec: &RunSpec,
        catalog: Catalog,
    ) -> Result<Vec<String>, ApiError> {
        let (engine, warnings) = self.plan_run(name, spec, catalog, &[])?;
        self.add_new_run(name, engine);
        Ok(warnings)
    }

    /// Takes in a run just made here; its sequence, the order of its turns.
    fn add_new_run(&mut self, name: &str, engine: Engine) -> u64 {
        let seq = self.next_run;
        self.next_run += 1;
        // What other runs hold now is news for the new run at its first turn.
        let news = self
            .busy
            .keys()
            .filter(|m| engine.has_member(m))
            .cloned()
            .collect();
        let mut slot = RunSlot::new(name, engine);
        slot.news = news;
        self.runs.insert(seq, slot);
        self.names.insert(name.to_string(), seq);
        seq
    }

    /// The name of the rollback run of run `name` (SEMANTICS §15).
    pub fn rollback_run_name(name: &str) -> String {
        format!("rollback-of-{name}")
    }

    /// What a request to roll back run `original` comes to (SEMANTICS §15), decided without
    /// changing anything: the rollback run already made, or the plan of a new one, over the
    /// original's members that an operation changed and that are not rolled back yet, as the
    /// fleet sees their clusters now. Refused (409) while the original is neither finished nor
    /// Stopped, when it changed nothing, and for a rollback run. A shell that keeps runs
    /// elsewhere records the new run (see [`FleetEngine::plan_rollback_run`]), then takes it in.
    pub fn rollback_request(&self, original: &str) -> Result<RollbackRequest, ApiError> {
        let seq = *self.names.get(original).ok_or_else(|| no_run(original))?;
        let engine = &self.runs[&seq].engine;
        if let Some(by) = engine.rolled_back_by() {
            return Ok(RollbackRequest::Made(by.to_string()));
        }
        if let Some(of) = engine.rollback_of() {
            return Err(ApiError::conflict(format!(
                "update run {original:?} is the rollback run of {of:?}; it cannot be rolled back in turn"
            )));
        }
        let name = FleetEngine::rollback_run_name(original);
        if let Some(made) = self.run(&name) {
            // Made, but the original was not told before a restart: it is the answer.
            return match made.rollback_of() {
                Some(of) if of == original => Ok(RollbackRequest::Made(name)),
                _ => Err(ApiError::conflict(format!(
                    "update run {name:?} already exists and does not roll back {original:?}"
                ))),
            };
        }
        if !engine.is_finished() && engine.state() != State::Stopped {
            return Err(ApiError::conflict(format!(
                "update run {original:?} is {:?}{}; only a finished or Stopped run can be rolled back",
                engine.state(),
                if engine.members_in_flight() > 0 {
                    " with members in flight"
                } else {
                    ""
                }
            )));
        }
        engine
            .rollback_plan(|member| self.current(member))
            .map(|plan| RollbackRequest::New { name, plan })
            .ok_or_else(|| {
                ApiError::conflict(format!(
                    "update run {original:?} changed nothing that is not rolled back already"
                ))
            })
    }

    /// Creates and starts the rollback run of run `original` (SEMANTICS §15), as
    /// [`FleetEngine::rollback_request`] decides, and answers its name; the original is told
    /// which run rolls it back, so it cannot be started again. A second request answers the
    /// rollback run already made.
    pub fn create_rollback_run(&mut self, now: Time, original: &str) -> Result<String, ApiError> {
        match self.rollback_request(original)? {
            RollbackRequest::Made(name) => {
                self.tell_rolled_back(now, original, &name)?;
                Ok(name)
            }
            RollbackRequest::New { name, plan } => {
                let engine = self.plan_rollback_run(&name, &plan)?;
                self.take_rollback_run(now, original, &name, engine)?;
                Ok(name)
            }
        }
    }

    /// The members of the fleet's table that a rollback plan names, as the run made from it
    /// now would hold them: what a shell records with the plan.
    pub fn plan_members(&self, plan: &crate::engine::RollbackPlan) -> Vec<SharedMember> {
        plan.stages
            .iter()
            .flat_map(|s| &s.groups)
            .flat_map(|g| &g.members)
            .filter_map(|m| self.members.get(m.name.as_str()).cloned())
            .collect()
    }

    /// Makes rollback run `name` from its plan over the fleet's members, without taking it in:
    /// a shell that keeps runs records it first, then hands it to
    /// [`FleetEngine::take_rollback_run`].
    pub fn plan_rollback_run(
        &self,
        name: &str,
        plan: &crate::engine::RollbackPlan,
    ) -> Result<Engine, ApiError> {
        self.name_is_free(name)?;
        Engine::create_rollback(name, plan, self.members.values(), self.catalog.clone())
    }

    /// Takes in rollback run `name` of run `original` as [`FleetEngine::plan_rollback_run`]
    /// made it, starts it, and tells the original which run rolls it back.
    pub fn take_rollback_run(
        &mut self,
        now: Time,
        original: &str,
        name: &str,
        engine: Engine,
    ) -> Result<(), ApiError> {
        self.name_is_free(name)?;
        let seq = self.add_new_run(name, engine);
        self.run_input(now, seq, Input::Start)?;
        self.tell_rolled_back(now, original, name)
    }

    /// Tells run `original` that run `by` rolls it back, once.
    fn tell_rolled_back(&mut self, now: Time, original: &str, by: &str) -> Result<(), ApiError> {
        let record = self.record;
        if let Some(&seq) = self.names.get(original)
            && let Some(slot) = self.runs.get_mut(&seq)
            && slot.engine.rolled_back_by().is_none()
        {
            let input = Input::RolledBackBy {
                run: by.to_string(),
            };
            slot.give(now, input, record)?;
        }
        Ok(())
    }

    fn name_is_free(&self, name: &str) -> Result<(), ApiError> {
        if self.names.contains_key(name) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("update run {name:?} already exists"),
                "updateRun",
            ));
        }
        Ok(())
    }

    /// Drops a run (deleted): the clusters it held are let go.
    pub fn remove_run(&mut self, name: &str) -> Option<Engine> {
        let seq = self.names.remove(name)?;
        let slot = self.runs.remove(&seq)?;
        let held: Vec<Arc<str>> = self
            .busy
            .iter()
            .filter(|(_, b)| b.run == seq)
            .map(|(m, _)| m.clone())
            .collect();
        for member in held {
            self.busy.remove(&member);
            self.tell_others(seq, &member);
        }
        let counted: Vec<Arc<str>> = self
            .disrupted
            .iter()
            .filter(|(_, run)| **run == seq)
            .map(|(m, _)| m.clone())
            .collect();
        for member in counted {
            self.disruption(seq, member, false);
        }
        Some(slot.engine)
    }

    pub fn run(&self, name: &str) -> Option<&Engine> {
        self.names
            .get(name)
            .and_then(|s| self.runs.get(s))
            .map(|s| &s.engine)
    }

    /// Whether run `name`'s status changed since `changes` last looked (see
    /// [`StatusChanges::refresh`]); `None` when the fleet has no such run.
    pub fn refresh_status(&self, name: &str, changes: &mut StatusChanges) -> Option<bool> {
        Some(changes.refresh(self.run(name)?))
    }

    /// Run names in creation order.
    pub fn run_names(&self) -> impl Iterator<Item = &str> {
        self.runs.values().map(|s| s.name.as_str())
    }

    /// Applies one input at `now`. A user action the API would refuse returns its error and
    /// changes nothing.
    pub fn handle(&mut self, now: Time, input: FleetInput) -> Result<(), ApiError> {
        match input {
            FleetInput::Run { run, input } => {
                let seq = *self.names.get(&run).ok_or_else(|| no_run(&run))?;
                self.run_input(now, seq, input)
            }
            FleetInput::Observed { member, cluster } => {
                self.observed(now, &member, Arc::new(cluster), None);
                Ok(())
            }
            FleetInput::MemberAdded(member) => {
                self.join(now, SharedMember::from(&member));
                Ok(())
            }
            FleetInput::MemberRemoved { member } => {
                self.members.remove(member.as_str());
                self.budgets_stale |= !self.budgets.is_empty();
                let record = self.record;
                for slot in self.runs.values_mut() {
                    if slot.engine.has_member(&member) {
                        let input = Input::MemberRemoved {
                            member: member.clone(),
                        };
                        let _ = slot.give(now, input, record);
                    }
                }
                Ok(())
            }
            FleetInput::PutFreeze(freeze) => {
                self.freezes.insert(freeze.name.clone(), *freeze);
                self.cover_freezes();
                Ok(())
            }
            FleetInput::DeleteFreeze { name } => {
                if self.freezes.remove(&name).is_some() {
                    self.cover_freezes();
                }
                Ok(())
            }
            FleetInput::PutBudget(budget) => {
                self.budgets.insert(budget.name.clone(), *budget);
                self.cover_budgets();
                Ok(())
            }
            FleetInput::DeleteBudget { name } => {
                if self.budgets.remove(&name).is_some() {
                    self.cover_budgets();
                }
                Ok(())
            }
            FleetInput::CatalogChanged(catalog) => {
                self.catalog = catalog.clone();
                let record = self.record;
                for slot in self.runs.values_mut() {
                    if !slot.engine.is_finished() {
                        let _ = slot.give(now, Input::CatalogChanged(catalog.clone()), record);
                    }
                }
                Ok(())
            }
        }
    }

    fn run_input(&mut self, now: Time, seq: u64, input: Input) -> Result<(), ApiError> {
        // The definitive answers about an operation let its cluster go, whether or not the run
        // still tracks the attempt.
        let ended = match &input {
            Input::OperationFinished {
                member,
                attempt,
                outcome,
            } => Some((member.clone(), *attempt, outcome.is_ok())),
            Input::Observed {
                member,
                operation: Some((attempt, OperationProgress::NotRunning)),
                ..
            } => Some((member.clone(), *attempt, false)),
            _ => None,
        };
        let observed = match &input {
            Input::Observed {
                member, cluster, ..
            } => Some((member.clone(), cluster.clone())),
            _ => None,
        };
        if matches!(input, Input::Start)
            && self.runs.get(&seq).is_some_and(|s| s.engine.is_finished())
        {
            // A finished run hears nothing; one started again hears what it missed first.
            self.refresh(now, seq)?;
        }
        let record = self.record;
        let slot = self.runs.get_mut(&seq).ok_or_else(|| no_run(""))?;
        slot.give(now, input, record)?;
        self.collect(seq);
        if let Some((member, cluster)) = observed {
            // A re-observation answers this run's question; every other run sees it too.
            self.observed(now, &member, cluster, Some(seq));
        }
        if let Some((member, attempt, succeeded)) = ended {
            self.operation_ended(now, seq, &member, attempt, succeeded);
        }
        Ok(())
    }

    /// An operation of run `seq` on `member` ended; if it held the cluster, the cluster is let
    /// go, and an upgrade that succeeded is what the cluster now is, for every run.
    fn operation_ended(&mut self, now: Time, seq: u64, member: &str, attempt: u64, ok: bool) {
        let holds = self
            .busy
            .get(member)
            .is_some_and(|b| b.run == seq && b.attempt == attempt);
        if !holds {
            return;
        }
        let between = self
            .runs
            .get(&seq)
            .is_some_and(|s| s.engine.holds_between_hops(member, attempt));
        if between {
            // A hop of a chain that goes on (SEMANTICS §13): the run keeps the cluster until
            // its last hop ends; every run sees where this hop took it.
            if let (true, Some(current), Some(busy)) =
                (ok, self.current(member), self.busy.get(member))
            {
                let mut cluster = (*current).clone();
                apply_target(&mut cluster, &busy.target);
                self.observed(now, member, Arc::new(cluster), None);
            }
            return;
        }
        let Some((name, busy)) = self.busy.remove_entry(member) else {
            return;
        };
        self.tell_others(seq, &name);
        if ok && let Some(current) = self.current(member) {
            let mut cluster = (*current).clone();
            apply_target(&mut cluster, &busy.target);
            self.observed(now, member, Arc::new(cluster), None);
        }
    }

    /// The fleet sees `member`'s cluster as `cluster` now; every run that selected it is told,
    /// except `answered` (which was told by its own input). Seeing again what the fleet already
    /// saw tells no one: every run holds it already.
    fn observed(&mut self, now: Time, member: &str, cluster: Arc<Cluster>, answered: Option<u64>) {
        if self.set_current(member, &cluster) {
            self.fan_out(now, member, cluster, answered);
        }
    }

    fn fan_out(&mut self, now: Time, member: &str, cluster: Arc<Cluster>, answered: Option<u64>) {
        let record = self.record;
        for (seq, slot) in &mut self.runs {
            if Some(*seq) == answered
                || slot.engine.is_finished()
                || !slot.engine.has_member(member)
            {
                continue;
            }
            let input = Input::Observed {
                member: member.to_string(),
                cluster: cluster.clone(),
                operation: None,
            };
            let _ = slot.give(now, input, record);
        }
    }

    /// The holder of `member` changed: news for every other run that selected it.
    fn tell_others(&mut self, holder: u64, member: &Arc<str>) {
        for (seq, slot) in &mut self.runs {
            if *seq != holder && slot.engine.has_member(member) {
                slot.news.insert(member.clone());
            }
        }
    }

    /// Drains a run's commands: a start makes its cluster busy at once.
    fn collect(&mut self, seq: u64) {
        self.take_disruptions(seq);
        let Some(slot) = self.runs.get_mut(&seq) else {
            return;
        };
        // A chain that ended between hops lets its cluster go (SEMANTICS §13).
        for (member, attempt) in slot.engine.take_released() {
            if self
                .busy
                .get(&member)
                .is_some_and(|b| b.run == seq && b.attempt == attempt)
                && let Some((name, _)) = self.busy.remove_entry(&member)
            {
                self.tell_others(seq, &name);
            }
        }
        let Some(slot) = self.runs.get_mut(&seq) else {
            return;
        };
        let run_name = slot.shared_name.clone();
        let mut started = Vec::new();
        while let Some(command) = slot.engine.poll_command() {
            if let Command::StartUpgrade {
                member,
                attempt,
                target,
            } = &command
            {
                started.push((member.clone(), *attempt, target.clone()));
            }
            self.commands.push_back(FleetCommand {
                run: slot.name.clone(),
                command,
            });
        }
        for (member, attempt, target) in started {
            // The cluster is busy whether or not the table knows the member (a shell may drive
            // runs without one, and a member may have left the fleet meanwhile).
            let name = self.key(&member);
            self.busy.insert(
                name.clone(),
                Busy {
                    run: seq,
                    run_name: run_name.clone(),
                    attempt,
                    target,
                },
            );
            self.tell_others(seq, &name);
        }
    }

    /// What time alone brings, in every run.
    pub fn advance_clock(&mut self, now: Time) {
        for slot in self.runs.values_mut() {
            if slot.engine.next_wakeup().is_some_and(|t| t <= now) {
                slot.engine.advance_clock(now);
                slot.dirty = true;
                if self.record {
                    slot.journal.push(Delivered::AdvanceClock(now));
                }
            }
        }
        let seqs: Vec<u64> = self.runs.keys().copied().collect();
        for seq in seqs {
            self.collect(seq);
        }
    }

    /// Moves every run forward, one after another in creation order. Before its turn a run
    /// learns which of its members other runs now hold or let go.
    pub fn settle(&mut self, now: Time) {
        if self.freezes_stale {
            self.cover_freezes();
        }
        let seqs: Vec<u64> = self.runs.keys().copied().collect();
        // Whatever the runs were given since their last turn counts before anyone's turn.
        for &seq in &seqs {
            self.take_disruptions(seq);
        }
        if self.budgets_stale {
            self.cover_budgets();
        }
        self.room_opened = false;
        for seq in seqs {
            self.turn(now, seq);
        }
        // A member whose rollback ended at its run's turn (SEMANTICS §15) left room after the
        // turns of runs that hold members for it: they take it now, as they take the room an
        // upgrade's end leaves before anyone's turn. Each pass only starts members, so it ends.
        for _ in 0..=self.runs.len() {
            if !std::mem::take(&mut self.room_opened) {
                break;
            }
            let holding: Vec<u64> = self
                .runs
                .iter()
                .filter(|(_, s)| s.engine.holds_for_budgets() && !s.engine.is_finished())
                .map(|(&seq, _)| seq)
                .collect();
            for seq in holding {
                self.turn(now, seq);
            }
        }
    }

    /// Run `seq`'s turn: the fleet's news, then its settle if anything is due.
    fn turn(&mut self, now: Time, seq: u64) {
        self.deliver_news(now, seq);
        let record = self.record;
        if let Some(slot) = self.runs.get_mut(&seq) {
            if !slot.dirty && slot.engine.next_wakeup().is_none_or(|t| t > now) {
                return;
            }
            slot.engine.settle(now);
            slot.dirty = false;
            if record {
                slot.journal.push(Delivered::Settle(now));
            }
        }
        self.collect(seq);
    }

    /// What each freeze covers, worked out again against the member table; every run is given
    /// it at its next turn.
    fn cover_freezes(&mut self) {
        self.covered = Arc::new(crate::freeze::Freezes::cover(
            &self.freezes,
            self.members.iter().map(|(name, m)| (name, &m.labels)),
        ));
        self.freezes_version += 1;
        self.freezes_stale = false;
    }

    /// The fleet's freezes, by name.
    pub fn freezes(&self) -> impl Iterator<Item = &crate::freeze::Freeze> {
        self.freezes.values()
    }

    /// The fleet's disruption budgets split into partitions again, against the member table
    /// and the members in flight now; every run is given it at its next turn.
    fn cover_budgets(&mut self) {
        self.partitions = Arc::new(crate::budget::Budgets::cover(
            &self.budgets,
            self.members.values(),
            self.disrupted.keys(),
        ));
        self.in_flight = self.partitions.in_flight.clone();
        self.budgets_version += 1;
        self.room_version += 1;
        self.budgets_stale = false;
    }

    /// The fleet's disruption budgets, by name.
    pub fn budgets(&self) -> impl Iterator<Item = &crate::budget::Budget> {
        self.budgets.values()
    }

    /// Each partition of the fleet's budgets (as of the last scheduling pass), with the
    /// members in flight in it now.
    pub fn budget_partitions(&self) -> impl Iterator<Item = (&crate::budget::Partition, u64)> {
        self.partitions
            .partitions
            .iter()
            .zip(self.in_flight.iter().copied())
    }

    /// Takes what run `seq` says began or ended counting against budgets.
    fn take_disruptions(&mut self, seq: u64) {
        let Some(slot) = self.runs.get_mut(&seq) else {
            return;
        };
        let changes = slot.engine.take_disruptions();
        if changes.is_empty() {
            return;
        }
        for (member, begins) in changes {
            self.disruption(seq, member, begins);
        }
        // The run decided on what it now is: counting its own starts is no news to it.
        if let Some(slot) = self.runs.get_mut(&seq)
            && slot.budgets_seen == self.budgets_version
            && slot.engine.budget_counts() == self.in_flight.as_slice()
        {
            slot.room_seen = self.room_version;
        }
    }

    /// Member `member` begins or ends being in flight in run `seq`.
    fn disruption(&mut self, seq: u64, member: Arc<str>, begins: bool) {
        let counts = if begins {
            // Counted once, whichever run says so.
            self.disrupted.insert(member.clone(), seq).is_none()
        } else if self.disrupted.get(&member) == Some(&seq) {
            self.disrupted.remove(&member);
            true
        } else {
            false
        };
        if !counts || self.partitions.is_empty() {
            return;
        }
        for &p in self.partitions.partitions_of(&member) {
            let n = &mut self.in_flight[p as usize];
            *n = if begins { *n + 1 } else { n.saturating_sub(1) };
        }
        self.room_version += 1;
        self.room_opened |= !begins;
    }

    fn deliver_news(&mut self, now: Time, seq: u64) {
        let record = self.record;
        let (version, covered) = (self.freezes_version, self.covered.clone());
        // A finished run hears it when started again (its turn comes before it reaches anyone).
        if let Some(slot) = self.runs.get_mut(&seq)
            && slot.freezes_seen != version
            && !slot.engine.is_finished()
        {
            slot.freezes_seen = version;
            let _ = slot.give(now, Input::FreezesChanged(covered), record);
        }
        if let Some(slot) = self.runs.get_mut(&seq)
            && !slot.engine.is_finished()
        {
            if slot.budgets_seen != self.budgets_version {
                slot.budgets_seen = self.budgets_version;
                let input = Input::BudgetsChanged(self.partitions.clone());
                let _ = slot.give(now, input, record);
            }
            // The counts now, for a run that will decide at this turn or holds members for a
            // budget; the others hear them when they next do.
            let decides = slot.dirty
                || !slot.news.is_empty()
                || slot.engine.next_wakeup().is_some_and(|t| t <= now)
                || slot.engine.holds_for_budgets();
            if slot.room_seen != self.room_version && decides {
                slot.room_seen = self.room_version;
                if slot.engine.budget_counts() != self.in_flight.as_slice() {
                    let input = Input::BudgetRoom(self.in_flight.clone());
                    let _ = slot.give(now, input, record);
                }
            }
        }
        let Some(news) = self.runs.get_mut(&seq).map(|s| std::mem::take(&mut s.news)) else {
            return;
        };
        for member in news {
            let holder = self
                .busy
                .get(&member)
                .filter(|b| b.run != seq)
                .map(|b| b.run_name.clone());
            let current = self.current(&member);
            let Some(slot) = self.runs.get_mut(&seq) else {
                return;
            };
            match holder {
                Some(holder) => {
                    if slot.told.get(&member) != Some(&holder) {
                        let input = Input::MemberLocked {
                            member: member.to_string(),
                            by_run: holder.clone(),
                        };
                        let _ = slot.give(now, input, record);
                        slot.told.insert(member, holder);
                    }
                }
                None => {
                    if slot.told.remove(&member).is_some() {
                        // The other run may have upgraded it: decided again on what the cluster
                        // is now (SEMANTICS §1), unless the run heard of that already.
                        if let Some(cluster) = current
                            && slot.engine.cluster_of(&member) != Some(&cluster)
                        {
                            let input = Input::Observed {
                                member: member.to_string(),
                                cluster,
                                operation: None,
                            };
                            let _ = slot.give(now, input, record);
                        }
                        let input = Input::MemberUnlocked {
                            member: member.to_string(),
                        };
                        let _ = slot.give(now, input, record);
                    }
                }
            }
        }
    }

    pub fn poll_command(&mut self) -> Option<FleetCommand> {
        let command = self.commands.pop_front();
        crate::engine::release_drained(&mut self.commands);
        command
    }

    /// The next event of any run, runs in creation order.
    pub fn poll_event(&mut self) -> Option<FleetEvent> {
        self.runs.values_mut().find_map(|slot| {
            slot.engine.poll_event().map(|event| FleetEvent {
                run: slot.name.clone(),
                event,
            })
        })
    }

    /// Records a user action the API refused, in the run's event log.
    pub fn record_rejection(&mut self, now: Time, run: &str, action: &str, error: ApiError) {
        if let Some(slot) = self.names.get(run).and_then(|s| self.runs.get_mut(s)) {
            slot.engine.record_rejection(now, action, error);
        }
    }

    /// The earliest instant at which some run must be settled again.
    pub fn next_wakeup(&self) -> Option<Time> {
        self.runs
            .values()
            .filter_map(|s| s.engine.next_wakeup())
            .min()
    }

    /// Every run is finished.
    pub fn is_finished(&self) -> bool {
        self.runs.values().all(|s| s.engine.is_finished())
    }

    /// Recounts each run's state from scratch, and checks the rules between runs: every
    /// operation a run has in flight holds its cluster, and no cluster has two.
    pub fn check_invariants(&self, now: Time) -> Result<(), String> {
        self.check_budgets()?;
        for (seq, slot) in &self.runs {
            slot.engine
                .check_invariants(now)
                .map_err(|e| format!("run {}: {e}", slot.name))?;
            for (member, attempt) in slot.engine.running_members() {
                match self.busy.get(member) {
                    Some(b) if b.run == *seq && b.attempt == attempt => {}
                    Some(b) => {
                        return Err(format!(
                            "member {member} is in flight in run {} (attempt {attempt}) while run {} holds it (attempt {})",
                            slot.name, b.run_name, b.attempt
                        ));
                    }
                    None => {
                        return Err(format!(
                            "member {member} is in flight in run {} (attempt {attempt}) but holds no lock",
                            slot.name
                        ));
                    }
                }
            }
            if !slot.engine.is_finished() {
                for (member, cluster, state) in slot.engine.member_clusters() {
                    let current = self.seen(member);
                    if state != State::Running && current.is_some_and(|c| *c != **cluster) {
                        return Err(format!(
                            "run {} holds an older copy of {member}'s cluster than the fleet saw",
                            slot.name
                        ));
                    }
                }
            }
            for (member, holder) in &slot.told {
                if !slot.engine.has_member(member) {
                    return Err(format!(
                        "run {} was told about {member}, which it did not select",
                        slot.name
                    ));
                }
                let current = self.busy.get(member).map(|b| b.run_name.clone());
                if current.as_ref() != Some(holder) && !slot.news.contains(member) {
                    return Err(format!(
                        "run {} believes {holder} holds {member}, but it is {current:?}, and no news is pending",
                        slot.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// The members counted against budgets are those in flight in some run, each counted in
    /// every partition it is in (after a turn: what runs say is taken at each).
    fn check_budgets(&self) -> Result<(), String> {
        let mut recount = vec![0u64; self.in_flight.len()];
        let mut seen = 0;
        for (seq, slot) in &self.runs {
            for member in slot.engine.disrupted_members() {
                if self.disrupted.get(member) != Some(seq) {
                    return Err(format!(
                        "member {member} is in flight in run {} but not counted against budgets for it",
                        slot.name
                    ));
                }
                seen += 1;
                for &p in self.partitions.partitions_of(member) {
                    recount[p as usize] += 1;
                }
            }
        }
        if seen != self.disrupted.len() {
            return Err(format!(
                "{} members are counted against budgets, {seen} are in flight",
                self.disrupted.len()
            ));
        }
        if !self.budgets_stale && recount != self.in_flight {
            return Err(format!(
                "budget partitions count {:?} in flight, the runs {recount:?}",
                self.in_flight
            ));
        }
        Ok(())
    }
}
