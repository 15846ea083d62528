//! The update-run engine: a deterministic state machine for one run (SEMANTICS §2–§6).
//!
//! Contract (ENGINE-DESIGN.md): the shell calls [`Engine::handle`] for each input at an instant,
//! then [`Engine::settle`] once; it drains [`Engine::poll_command`] and [`Engine::poll_event`],
//! and calls again at [`Engine::next_wakeup`]. The engine reads no clock and does no I/O.
//!
//! Cost: membership is resolved once into dense indices. Each group keeps a queue of the members
//! it has not reached, ordered by (priority class, name); members reached that cannot start yet
//! are parked as Pending in a timer set keyed by the instant they may start. A scheduling pass
//! touches only the groups of the current stage (at most 50) and the members it reaches, so an
//! event costs O(changes × log n).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use crate::error::{ApiError, ErrorCode};
use crate::fleet::{Availability, Catalog, Cluster, Member, Os, SharedMember};
use crate::status::{
    EndedOn, ErrorDetail, Event, EventType, GateStatus, GroupStatus, MemberStatus,
    NodeImageSelectionStatus, SelectedNodeImageVersion, StageStatus, State, UpdateRunStatus,
    UpdateStatus, WaitStatus,
};
use crate::strategy::{
    DEFAULT_STAGE_CONCURRENCY, Gate, GateKind, Group, NodeImageSelection, Stage, Strategy, Upgrade,
    UpgradeType,
};
use crate::time::{SECONDS_PER_DAY, SECONDS_PER_HOUR, Time};
use crate::version::{ImageVersion, KubeVersion};
use crate::window::MaintenanceWindow;

mod actions;
mod budgets;
mod chains;
mod checkpoint;
mod create;
mod gates;
mod health;
mod inputs;
mod invariants;
mod readiness;
mod rollback;
mod scheduling;
mod status;

pub use checkpoint::CHECKPOINT_FORMAT;
pub use create::{RunMaking, RunOrigin};
pub use gates::next_scheduled_start;
use gates::{gates_done, gates_rt};
pub use health::{CheckSubject, answers};
use health::{Health, Subject};
pub use rollback::{Before, PoolBefore, RollbackPlan, offer_rollbacks};
use status::StatusRevisions;
pub use status::{STATUS_CHUNK, StatusChanges, StatusChunk, apply_target, cluster_at};

/// What a run applies, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// `None`: every member, one at a time, in one implicit stage and group.
    pub strategy: Option<Strategy>,
    pub upgrade: Upgrade,
    pub rules: RunRules,
}

/// Rules a run applies when it reaches a member, beside its upgrade: those of runs an
/// auto-upgrade profile generates (SEMANTICS §8), and chained minor upgrades (§13).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRules {
    /// A member more than one minor behind the target is Skipped, not upgraded across minors.
    #[serde(default)]
    pub skip_minor_jumps: bool,
    /// The target is kept only by long-term support: members without it fail.
    #[serde(default)]
    pub require_long_term_support: bool,
    /// Node images of Linux pools only (the SecurityPatch channel): Windows pools are left as
    /// they are, and a member with nothing else to do is Skipped saying so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub linux_node_pools_only: bool,
    /// `chainMinorVersions` (SEMANTICS §13): a target more than one minor ahead of a member is
    /// reached one minor at a time, a hop per minor.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chain_minor_versions: bool,
}

/// Why a member deleted from the fleet during the run is Skipped (SEMANTICS §2).
const REMOVED: &str = "member removed from fleet";

/// How the message of a member, group or stage a user skipped begins ("skipped by NAME").
const SKIPPED_BY: &str = "skipped by ";

/// Name of the implicit stage and group of a run without a strategy.
pub const DEFAULT_STAGE_NAME: &str = "default";

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Timing {
    Before,
    After,
}

/// Where a gate sits: stage, optional group, before or after, and its index in that list.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct GateRef {
    pub stage: u32,
    pub group: Option<u32>,
    pub timing: Timing,
    pub index: u32,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum SkipKind {
    Member,
    Group,
    Stage,
    AfterStageWait,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SkipTarget {
    pub kind: SkipKind,
    pub name: String,
}

/// What an earlier operation is doing, as observed when a stopped run starts again.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OperationProgress {
    InProgress,
    /// Finished (either way) or unknown to the driver: the cluster's state decides.
    NotRunning,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Input {
    Start,
    Stop,
    /// A skip with no authority recorded (the simulator's, and runs logged before
    /// [`Input::SkipBy`]): it may pass any gate.
    Skip(Vec<SkipTarget>),
    /// A skip by `subject`. Passing an Approval gate that is pending or not yet reached needs
    /// `may_approve` (API.md, "Security"); the skip is recorded with the subject.
    SkipBy {
        targets: Vec<SkipTarget>,
        subject: String,
        may_approve: bool,
    },
    ApproveGate {
        gate: GateRef,
        by: String,
    },
    /// Approves the gate with this id (the gate resource's name).
    ApproveGateById {
        id: String,
        by: String,
    },
    /// The driver accepted an upgrade and named its operation.
    OperationAccepted {
        member: String,
        attempt: u64,
        operation_id: String,
    },
    OperationFinished {
        member: String,
        attempt: u64,
        outcome: Result<(), String>,
    },
    /// A fresh observation of a member's cluster; `operation` answers a [`Command::Observe`].
    Observed {
        member: String,
        cluster: Arc<Cluster>,
        operation: Option<(u64, OperationProgress)>,
    },
    /// The fleet's freezes changed (SEMANTICS §12): members are held by them from now on.
    FreezesChanged(Arc<crate::freeze::Freezes>),
    /// The fleet's disruption budgets changed (SEMANTICS §12): their partitions, with the
    /// members in flight in each now.
    BudgetsChanged(Arc<crate::budget::Budgets>),
    /// The members in flight in each partition of the budgets last given, across the fleet's
    /// runs, now.
    BudgetRoom(Vec<u64>),
    MemberRemoved {
        member: String,
    },
    /// Another active run is upgrading this member (SEMANTICS §3, one operation per cluster).
    MemberLocked {
        member: String,
        /// Shared: a fleet's runs hear of the same holder for many members.
        by_run: Arc<str>,
    },
    MemberUnlocked {
        member: String,
    },
    CatalogChanged(Catalog),
    /// One evaluation of one check of a round [`Command::Evaluate`] asked for, made at the
    /// instant this input is handled (SEMANTICS §10).
    CheckEvaluated {
        subject: CheckSubject,
        round: u64,
        check: String,
        outcome: crate::checks::Outcome,
    },
    /// A rollback run of this run was created (SEMANTICS §15): this run cannot be started
    /// again.
    RolledBackBy {
        run: String,
    },
}

/// What one node pool is upgraded to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolTarget {
    pub pool: String,
    pub family: String,
    pub image: ImageVersion,
}

/// What a member is upgraded to. Pools absent from `node_images` are left as they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub upgrade_type: UpgradeType,
    pub kubernetes_version: Option<KubeVersion>,
    pub node_images: Vec<PoolTarget>,
    /// `Some`: not an upgrade but the provider's rollback of one scope (SEMANTICS §15), to
    /// exactly the versions above, which may be lower than the cluster's: the control plane to
    /// `kubernetes_version` (a ControlPlaneOnly target), or a node pool to its one entry of
    /// `node_images` and to `orchestrator_version` (a NodeImageOnly target).
    pub rollback: Option<Rollback>,
}

/// The scope a rollback operation takes back, and (node pools) their Kubernetes version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollback {
    pub scope: crate::fleet::RollbackScope,
    /// A node pool's orchestrator version after the rollback.
    pub orchestrator_version: Option<KubeVersion>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send an upgrade. The shell records `(member, attempt)` durably before calling the driver.
    StartUpgrade {
        member: String,
        attempt: u64,
        target: Target,
    },
    /// Ask the driver about `attempt`'s operation and the cluster; answer with `Input::Observed`.
    Observe { member: String, attempt: u64 },
    /// Evaluate every check of `checks` for `subject` now, each answered with
    /// [`Input::CheckEvaluated`] naming `round` (SEMANTICS §10). Placeholders are rendered
    /// with `context` ([`crate::checks::render`]).
    Evaluate {
        subject: CheckSubject,
        round: u64,
        checks: Arc<crate::checks::Checks>,
        context: crate::checks::Context,
    },
}

/// A gate the run has reached, as the gate resource shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateView {
    pub id: String,
    pub display_name: Option<String>,
    pub gate_type: &'static str,
    pub scheduled: Option<crate::strategy::ScheduledStartSpec>,
    pub absolute_start: Option<Time>,
    pub stage: String,
    pub group: Option<String>,
    pub timing: Timing,
    pub state: State,
    pub approved_by: Option<String>,
    pub approved_at: Option<Time>,
}

// ---------------------------------------------------------------------------------------------
// Internal state.

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Phase {
    NotStarted,
    BeforeGates,
    Active,
    AfterGates,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum RunPhase {
    NotStarted,
    Running,
    Stopped,
    /// Failed: no new work; `completed` is set once nothing is in flight.
    Failed,
    Completed,
    Skipped,
}

/// Where a member that has not started sits in its (active) group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Place {
    #[default]
    Nowhere,
    /// NotStarted, in the group's queue under its priority class, to be reached in order.
    Queued(u8),
    /// Pending: reached, will be upgraded, cannot start yet; woken by its timer or an input.
    Parked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKey {
    Gate(GateRef),
    Wait(u32),
    Member(u32),
    Watch(Subject),
}

#[derive(Clone, Debug)]
struct GateRt {
    gate: Gate,
    id: String,
    state: State,
    start: Option<Time>,
    completed: Option<Time>,
    absolute_start: Option<Time>,
    approved_by: Option<String>,
}

#[derive(Clone, Debug)]
struct MemberRt {
    name: Arc<str>,
    cluster_resource_id: Arc<str>,
    group: u32,
    /// The cluster as last observed, shared with the fleet's other runs.
    cluster: Arc<Cluster>,
    state: State,
    attempt: u64,
    /// Boxed, as are the error and the texts below: a run holds every member of its fleet and
    /// most of them never get one, so a member costs its pointers, not their contents.
    target: Option<Box<Target>>,
    operation_id: Option<Box<str>>,
    start: Option<Time>,
    completed: Option<Time>,
    message: Option<Box<str>>,
    error: Option<Box<ErrorDetail>>,
    place: Place,
    timer: Option<Time>,
    reattaching: bool,
    removed: bool,
    /// Running in its soak after its upgrade: health checks, no operation (SEMANTICS §10).
    verifying: bool,
    /// Failed its health checks and retried: verified again, not skipped at its target.
    reverify: bool,
    locked_by: Option<Arc<str>>,
    /// What it waits for while Pending (its status's `waitingFor`, with `timer` its end and
    /// `locked_by` or the fleet's freezes its name): a byte, as members are many.
    waiting: Option<WaitReason>,
}

#[derive(Clone, Debug)]
struct GroupRt {
    name: String,
    stage: u32,
    members: Vec<u32>,
    max_concurrency: u64,
    max_failures: u64,
    phase: Phase,
    outcome: Option<State>,
    user_skipped: bool,
    stopped: bool,
    before: Vec<GateRt>,
    after: Vec<GateRt>,
    in_flight: u64,
    /// Members not yet terminal (in flight, stopped, pending or not started).
    unfinished: u64,
    pending: u64,
    ready: BTreeSet<(u8, u32)>,
    /// The checks of its members: its own, else its stage's (SEMANTICS §10).
    member_health: Option<Arc<crate::checks::Checks>>,
    readiness: Option<Arc<crate::checks::Checks>>,
    start: Option<Time>,
    completed: Option<Time>,
    message: Option<String>,
    error: Option<ErrorDetail>,
}

#[derive(Clone, Debug)]
struct WaitRt {
    seconds: i64,
    state: State,
    start: Option<Time>,
    end: Option<Time>,
    completed: Option<Time>,
}

#[derive(Clone, Debug)]
struct StageRt {
    name: String,
    groups: Vec<u32>,
    size: u64,
    max_concurrency: u64,
    max_failures: u64,
    phase: Phase,
    outcome: Option<State>,
    user_skipped: bool,
    stopped: bool,
    before: Vec<GateRt>,
    after: Vec<GateRt>,
    wait: WaitRt,
    in_flight: u64,
    failure_count: u64,
    /// Round-robin pointer: the group that received the last slot (SEMANTICS §3).
    last_served: usize,
    start: Option<Time>,
    completed: Option<Time>,
    message: Option<String>,
    error: Option<ErrorDetail>,
}

/// A drained queue keeps at most this many slots: a burst (a stage's start parks thousands of
/// members, each an event) would otherwise leave every run holding megabytes of empty queue.
const QUEUE_KEPT: usize = 256;

pub(crate) fn release_drained<T>(queue: &mut VecDeque<T>) {
    if queue.is_empty() && queue.capacity() > QUEUE_KEPT {
        *queue = VecDeque::new();
    }
}

/// One update run's engine.
#[derive(Clone, Debug)]
pub struct Engine {
    run_name: String,
    /// Simulated seconds per real second of the fleet's driver when the run was made (the
    /// `sim` driver's `timeScale`; 1 for real clusters): the run's waits and scheduled gates
    /// are that much shorter, as its upgrades are. Set by the shell from the run's snapshot.
    time_scale: f64,
    upgrade: Upgrade,
    rules: RunRules,
    catalog: Catalog,
    /// The fleet's freezes, with the members each covers (SEMANTICS §12).
    freezes: Arc<crate::freeze::Freezes>,
    /// The fleet's disruption budgets and what this run knows of them (SEMANTICS §12).
    budget: BudgetState,
    /// Members that began (true) or ended (false) counting against budgets since the fleet
    /// engine last took them: MemberStarted or MemberReattached, then the member's end.
    disruptions: Vec<(Arc<str>, bool)>,
    members: Vec<MemberRt>,
    member_index: HashMap<Arc<str>, u32>,
    groups: Vec<GroupRt>,
    group_failures: Vec<u64>,
    stages: Vec<StageRt>,
    phase: RunPhase,
    current: usize,
    run_start: Option<Time>,
    run_completed: Option<Time>,
    in_flight: u64,
    failure_count: u64,
    selected_images: Option<BTreeMap<String, ImageVersion>>,
    next_attempt: u64,
    timers: BTreeSet<(Time, TimerKey)>,
    commands: VecDeque<Command>,
    events: VecDeque<Event>,
    /// Changes of a member's status so far, in all and per chunk of the status (see
    /// [`Engine::status_revision`], [`Engine::status_chunks`]).
    revisions: StatusRevisions,
    /// Events handed out by [`Engine::poll_event`] so far.
    polled: u64,
    /// Changes of the status outside the members that emit no event (a failed run's times
    /// settled once nothing is in flight).
    quiet_changes: u64,
    /// What the run's creation warned of, shown in its status.
    warnings: Vec<String>,
    /// Health and readiness checks under way, and their results.
    health: Health,
    /// The hops of members of a run with `chainMinorVersions` (SEMANTICS §13), by member:
    /// beside the members, which stay small.
    chains: BTreeMap<u32, chains::Chain>,
    /// Members between two hops of a chain that may go on now (SEMANTICS §13): decided at
    /// the next settle.
    hops_due: BTreeSet<u32>,
    /// Members between hops that let their cluster go without a further hop (stopped,
    /// failed, ended), with the attempt of their last hop, since the fleet engine last took
    /// them.
    released: Vec<(Arc<str>, u64)>,
    /// Rollbacks (SEMANTICS §15): members' states before their first operation, members
    /// rolling back, and the runs this one rolls back or is rolled back by.
    rollback: rollback::RollbackState,
    /// A promoted run's provenance (SEMANTICS §14), set by its creator: a fact of its creation,
    /// not of its progress, so a checkpoint does not carry it.
    promoted_from: Option<crate::status::PromotedFrom>,
}

/// What a run knows of the fleet's disruption budgets (SEMANTICS §12), and the members it
/// holds for them. A member held by a full partition is parked and indexed by partition and
/// group, so a group handed a slot finds its first member held on a partition with room, and a
/// place freed costs the member that takes it, not the members held (O(change)).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct BudgetState {
    pub(crate) view: Arc<crate::budget::Budgets>,
    /// Members in flight in each partition: as last given, plus this run's own starts since.
    pub(crate) in_flight: Vec<u64>,
    /// Members parked for a budget: (partition, group, class, member).
    pub(crate) parked: BTreeSet<(u32, u32, u8, u32)>,
    /// Member → its key in `parked`.
    pub(crate) held: BTreeMap<u32, (u32, u8)>,
}

/// Members whose window opens within this long are priority class 2 (SEMANTICS §3).
const SOON: i64 = 4 * SECONDS_PER_HOUR;

/// Priority classes inside a group (SEMANTICS §3): the order in which a group reaches its
/// members. Only members of classes 1 and 3 can start; the others become Pending when reached.
const CLASS_OPEN: u8 = 1;
const CLASS_SOON: u8 = 2;
const CLASS_NO_WINDOW: u8 = 3;
const CLASS_CLOSED: u8 = 4;

enum Readiness {
    Ready,
    Wait {
        wake: Option<Time>,
        message: String,
        reason: WaitReason,
    },
}

/// What a member waits for before it starts (SEMANTICS §11, a forecast's `waitsFor`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum WaitReason {
    /// Its maintenance window.
    Window,
    /// Its target's arrival in its region.
    Version,
    /// Another run's operation on it.
    Lock,
    /// A free slot in its group and stage.
    Slot,
    /// A gate before its stage or group.
    Gate,
    /// The wait after an earlier stage.
    Wait,
    /// Its readiness checks.
    Readiness,
    /// A freeze covering it (SEMANTICS §12).
    Freeze,
    /// A disruption budget covering it (SEMANTICS §12).
    Budget,
}

pub(super) enum Decision {
    Upgrade(Target),
    Skip(String),
    Fail { code: &'static str, message: String },
}

impl Engine {
    /// Marks a run a downstream profile generated (SEMANTICS §14): its status says where its
    /// target comes from.
    pub fn set_promoted_from(&mut self, from: crate::status::PromotedFrom) {
        self.promoted_from = Some(from);
    }

    pub fn run_name(&self) -> &str {
        &self.run_name
    }

    pub fn poll_command(&mut self) -> Option<Command> {
        let command = self.commands.pop_front();
        release_drained(&mut self.commands);
        command
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        let event = self.events.pop_front();
        release_drained(&mut self.events);
        self.polled += u64::from(event.is_some());
        event
    }

    /// The status's revisions: the members' (grows with every change of a member's status)
    /// and the rest of the tree's (grows with each event the run emits, and with the few
    /// changes outside the members that emit none, when that rest may have changed).
    pub fn status_revision(&self) -> (u64, u64) {
        (
            self.revisions.members,
            self.polled + self.events.len() as u64 + self.quiet_changes,
        )
    }

    /// The earliest instant at which the engine must be settled again.
    pub fn next_wakeup(&self) -> Option<Time> {
        self.timers.first().map(|(t, _)| *t)
    }

    /// Terminal and nothing left in flight.
    pub fn is_finished(&self) -> bool {
        match self.phase {
            RunPhase::Completed | RunPhase::Skipped => true,
            RunPhase::Failed => self.run_completed.is_some(),
            _ => false,
        }
    }

    pub fn state(&self) -> State {
        self.run_state()
    }

    pub fn members_in_flight(&self) -> u64 {
        self.in_flight
    }

    /// A member's state and current attempt, if it is part of the run.
    pub fn member_attempt(&self, name: &str) -> Option<(State, u64)> {
        let m = *self.member_index.get(name)?;
        let member = &self.members[m as usize];
        Some((member.state, member.attempt))
    }

    /// Sets the run's time scale (simulated seconds per real second, see [`Engine`]); a scale
    /// that is not a positive finite number is taken as 1.
    pub fn set_time_scale(&mut self, scale: f64) {
        self.time_scale = if scale.is_finite() && scale > 0.0 {
            scale
        } else {
            1.0
        };
    }

    /// The run's time scale: 1 unless the shell set another.
    pub fn time_scale(&self) -> f64 {
        self.time_scale
    }

    /// `seconds` of the run's simulated time, in real seconds: divided by its time scale and
    /// rounded up (a wait of any length lasts at least a second when the scale shortens it).
    pub(crate) fn scaled(&self, seconds: i64) -> i64 {
        if self.time_scale == 1.0 || seconds <= 0 {
            return seconds;
        }
        (seconds as f64 / self.time_scale).ceil() as i64
    }

    /// Why a Pending member cannot start at `now`, if it is Pending.
    pub fn waiting_for(&self, name: &str, now: Time) -> Option<WaitReason> {
        let m = *self.member_index.get(name)?;
        if self.members[m as usize].state != State::Pending {
            return None;
        }
        match self.readiness(m, now) {
            Readiness::Wait { reason, .. } => Some(reason),
            Readiness::Ready => None,
        }
    }

    /// What the run upgrades its members to.
    pub fn upgrade(&self) -> &Upgrade {
        &self.upgrade
    }

    /// The rules it applies when it reaches a member (`chainMinorVersions` among them).
    pub fn rules(&self) -> RunRules {
        self.rules
    }

    /// When a member's current attempt started, if it did.
    pub fn member_started(&self, name: &str) -> Option<Time> {
        let m = *self.member_index.get(name)?;
        self.members[m as usize].start
    }

    /// A member's cluster resource id, if the run selected it.
    pub fn cluster_resource_id(&self, name: &str) -> Option<&str> {
        let m = *self.member_index.get(name)?;
        Some(&self.members[m as usize].cluster_resource_id)
    }

    /// A member's state before the run's first operation on it, and whether it was rolled
    /// back (SEMANTICS §15).
    pub fn member_before(&self, name: &str) -> Option<&Before> {
        let m = *self.member_index.get(name)?;
        self.rollback.befores.get(&m)
    }

    /// Points this run's members' names, cluster ids and clusters at the ones `share` returns
    /// for them, which must be equal to the run's own: so a fleet holds one copy of what its
    /// runs have in common.
    pub fn share_members(
        &mut self,
        mut share: impl FnMut(&Arc<str>, &Arc<str>, &Arc<Cluster>) -> (Arc<str>, Arc<str>, Arc<Cluster>),
    ) {
        for m in &mut self.members {
            let (name, id, cluster) = share(&m.name, &m.cluster_resource_id, &m.cluster);
            debug_assert!(name == m.name && id == m.cluster_resource_id && cluster == m.cluster);
            (m.name, m.cluster_resource_id, m.cluster) = (name, id, cluster);
        }
        self.member_index = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.clone(), i as u32))
            .collect();
    }

    /// A member's cluster as this run last saw it.
    pub fn cluster_of(&self, name: &str) -> Option<&Arc<Cluster>> {
        let m = *self.member_index.get(name)?;
        Some(&self.members[m as usize].cluster)
    }

    /// Every member the run selected: its name, its cluster as the run last saw it, its state.
    pub fn member_clusters(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<Cluster>, State)> {
        self.members.iter().map(|m| (&m.name, &m.cluster, m.state))
    }

    /// Whether the run selected this member.
    pub fn has_member(&self, name: &str) -> bool {
        self.member_index.contains_key(name)
    }

    /// Members whose cluster this run holds, and the attempt of their operation (for the
    /// fleet's invariants: one operation per cluster): those with an operation in flight, and
    /// those between two hops of a chain (SEMANTICS §13).
    pub fn running_members(&self) -> impl Iterator<Item = (&str, u64)> {
        self.members
            .iter()
            .filter(|m| m.state == State::Running && !m.reattaching && !m.verifying)
            .filter(|m| {
                // A member whose next rollback step is not sent yet, and which holds no
                // cluster between steps, holds none (SEMANTICS §15).
                let i = self.member_index.get(&m.name).copied().unwrap_or(u32::MAX);
                !self.rollback.due.contains(&i) || self.rollback_between(i)
            })
            .map(|m| (&*m.name, m.attempt))
    }

    /// Members this run was told another run is upgrading, and by which.
    pub fn locked_members(&self) -> impl Iterator<Item = (&str, &str)> {
        self.members
            .iter()
            .filter_map(|m| Some((&*m.name, m.locked_by.as_deref()?)))
    }

    /// Every operation this run has in flight or is re-attaching to: member, attempt, target.
    pub fn operations_in_flight(&self) -> impl Iterator<Item = (&str, u64, &Target)> {
        self.clusters_held().filter(|(name, _, _)| {
            !self
                .member_index
                .get(*name)
                .is_some_and(|&m| self.is_between(m) || self.rollback_between(m))
        })
    }

    /// Every cluster this run holds: its operations in flight or re-attached to, and its
    /// members between two hops of a chain (SEMANTICS §13), with their last operation.
    pub fn clusters_held(&self) -> impl Iterator<Item = (&str, u64, &Target)> {
        self.members
            .iter()
            .filter(|m| m.state == State::Running && !m.verifying)
            .filter_map(|m| Some((&*m.name, m.attempt, &**m.target.as_ref()?)))
    }

    /// Whether `attempt` was a hop of member `name` whose chain goes on: its run keeps the
    /// cluster between the two hops (SEMANTICS §13).
    pub fn holds_between_hops(&self, name: &str, attempt: u64) -> bool {
        self.member_index.get(name).is_some_and(|&m| {
            self.members[m as usize].attempt == attempt
                && (self.is_between(m) || self.rollback_between(m))
        })
    }

    /// Members between hops that let their cluster go since this was last asked, each with
    /// the attempt of its last hop (the fleet engine frees those clusters).
    pub fn take_released(&mut self) -> Vec<(Arc<str>, u64)> {
        std::mem::take(&mut self.released)
    }

    /// When a member's operation in flight was sent: its current hop's start in a chain, else
    /// its attempt's.
    pub fn operation_started(&self, name: &str) -> Option<Time> {
        let m = *self.member_index.get(name)?;
        let member = &self.members[m as usize];
        match self.chains.get(&m).and_then(|c| c.hops.last()) {
            Some(hop) if member.state == State::Running && !member.verifying => {
                Some(hop.start_time)
            }
            _ => member.start,
        }
    }

    /// Every hop sent to a member in this run, retries included, in order (SEMANTICS §13);
    /// empty outside a chain. The shell records each hop's duration from it, for forecasts.
    pub fn member_hops(&self, name: &str) -> &[crate::status::Hop] {
        self.member_index
            .get(name)
            .and_then(|m| self.chains.get(m))
            .map_or(&[], |c| &c.hops)
    }

    /// What a member's current attempt upgrades it to, if it has one.
    pub fn member_target(&self, name: &str) -> Option<Target> {
        let m = *self.member_index.get(name)?;
        self.members[m as usize].target.as_deref().cloned()
    }

    /// Members waiting for the answer to a [`Command::Observe`] (after a restart of the shell,
    /// the observation is asked again).
    pub fn pending_observations(&self) -> Vec<(String, u64)> {
        self.members
            .iter()
            .filter(|m| m.reattaching)
            .map(|m| (m.name.to_string(), m.attempt))
            .collect()
    }

    fn emit(
        &mut self,
        now: Time,
        kind: EventType,
        stage: Option<String>,
        group: Option<String>,
        member: Option<String>,
        message: Option<String>,
    ) {
        self.events.push_back(Event {
            time: now,
            kind,
            stage,
            group,
            member,
            gate: None,
            message,
            error: None,
        });
    }

    fn emit_member(&mut self, now: Time, kind: EventType, m: u32, message: Option<String>) {
        match kind {
            EventType::MemberStarted | EventType::MemberReattached => {
                self.budget_disruption(m, true)
            }
            // A member removed from the fleet while in flight ends Skipped.
            EventType::MemberSucceeded
            | EventType::MemberFailed
            | EventType::MemberStopped
            | EventType::MemberSkipped => self.budget_disruption(m, false),
            _ => {}
        }
        let member = &self.members[m as usize];
        let group = &self.groups[member.group as usize];
        let stage = self.stages[group.stage as usize].name.clone();
        self.events.push_back(Event {
            time: now,
            kind,
            stage: Some(stage),
            group: Some(group.name.clone()),
            member: Some(member.name.to_string()),
            gate: None,
            message,
            error: None,
        });
    }

    fn emit_group(&mut self, now: Time, kind: EventType, g: u32, message: Option<String>) {
        let group = &self.groups[g as usize];
        let stage = self.stages[group.stage as usize].name.clone();
        self.emit(
            now,
            kind,
            Some(stage),
            Some(group.name.clone()),
            None,
            message,
        );
    }

    fn emit_stage(&mut self, now: Time, kind: EventType, si: usize, message: Option<String>) {
        let stage = self.stages[si].name.clone();
        self.emit(now, kind, Some(stage), None, None, message);
    }

    fn emit_gate(&mut self, now: Time, kind: EventType, at: GateRef, message: Option<String>) {
        let (stage, group) = self.gate_names(at);
        let id = self.gate_mut(at).map(|g| g.id.clone());
        self.events.push_back(Event {
            time: now,
            kind,
            stage,
            group,
            member: None,
            gate: id,
            message,
            error: None,
        });
    }

    /// Records a refused action in the event log (the simulator's `ActionRejected`).
    pub fn record_rejection(&mut self, now: Time, action: &str, error: ApiError) {
        self.events.push_back(Event::rejected(now, action, error));
    }

    /// Counts that member `m`'s status (state, times, message, error, operation id) is about
    /// to change.
    fn touch(&mut self, m: u32) {
        self.revisions.touch(m);
    }

    fn set_member_timer(&mut self, m: u32, at: Option<Time>) {
        let member = &mut self.members[m as usize];
        if let Some(old) = member.timer.take() {
            self.timers.remove(&(old, TimerKey::Member(m)));
        }
        if let Some(t) = at {
            member.timer = Some(t);
            self.timers.insert((t, TimerKey::Member(m)));
        }
    }

    // -----------------------------------------------------------------------------------------
    // Inputs.

    fn state_of_phase(&self, phase: RunPhase) -> State {
        match phase {
            RunPhase::NotStarted => State::NotStarted,
            RunPhase::Running => State::Running,
            RunPhase::Stopped => State::Stopped,
            RunPhase::Failed => State::Failed,
            RunPhase::Completed => State::Completed,
            RunPhase::Skipped => State::Skipped,
        }
    }

    fn add_in_flight(&mut self, g: u32, delta: i64) {
        let group = &mut self.groups[g as usize];
        group.in_flight = group.in_flight.saturating_add_signed(delta);
        let stage = &mut self.stages[group.stage as usize];
        stage.in_flight = stage.in_flight.saturating_add_signed(delta);
        self.in_flight = self.in_flight.saturating_add_signed(delta);
    }
}
/// Every run holds every member of its fleet: 100 runs over 10,000 members are a million of
/// these, so their size is the server's memory.
#[cfg(all(test, target_pointer_width = "64"))]
#[test]
fn a_member_of_a_run_stays_small() {
    assert!(
        std::mem::size_of::<MemberRt>() <= 176,
        "{}",
        std::mem::size_of::<MemberRt>()
    );
}
