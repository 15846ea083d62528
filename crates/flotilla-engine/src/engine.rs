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

use crate::error::{ApiError, ErrorCode};
use crate::fleet::{Availability, Catalog, Cluster, Member, Os};
use crate::status::{
    ErrorDetail, Event, EventType, GateStatus, GroupStatus, MemberStatus, NodeImageSelectionStatus,
    SelectedNodeImageVersion, StageStatus, State, UpdateRunStatus, UpdateStatus, WaitStatus,
};
use crate::strategy::{
    DEFAULT_STAGE_CONCURRENCY, Gate, GateKind, Group, NodeImageSelection, Stage, Strategy, Upgrade,
    UpgradeType,
};
use crate::time::{SECONDS_PER_DAY, SECONDS_PER_HOUR, Time};
use crate::version::{ImageVersion, KubeVersion};
use crate::window::MaintenanceWindow;

/// What a run applies, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// `None`: every member, one at a time, in one implicit stage and group.
    pub strategy: Option<Strategy>,
    pub upgrade: Upgrade,
    pub rules: RunRules,
}

/// Rules of runs an auto-upgrade profile generates (SEMANTICS §8).
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
}

/// Why a member deleted from the fleet during the run is Skipped (SEMANTICS §2).
const REMOVED: &str = "member removed from fleet";

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
        cluster: Box<Cluster>,
        operation: Option<(u64, OperationProgress)>,
    },
    MemberRemoved {
        member: String,
    },
    /// Another active run is upgrading this member (SEMANTICS §3, one operation per cluster).
    MemberLocked {
        member: String,
        by_run: String,
    },
    MemberUnlocked {
        member: String,
    },
    CatalogChanged(Catalog),
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    NotStarted,
    BeforeGates,
    Active,
    AfterGates,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
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
    name: String,
    cluster_resource_id: String,
    group: u32,
    cluster: Cluster,
    state: State,
    attempt: u64,
    target: Option<Target>,
    operation_id: Option<String>,
    start: Option<Time>,
    completed: Option<Time>,
    message: Option<String>,
    error: Option<ErrorDetail>,
    place: Place,
    timer: Option<Time>,
    reattaching: bool,
    removed: bool,
    locked_by: Option<String>,
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

/// One update run's engine.
#[derive(Clone, Debug)]
pub struct Engine {
    run_name: String,
    upgrade: Upgrade,
    rules: RunRules,
    catalog: Catalog,
    members: Vec<MemberRt>,
    member_index: HashMap<String, u32>,
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
    Wait { wake: Option<Time>, message: String },
}

enum Decision {
    Upgrade(Target),
    Skip(String),
    Fail { code: &'static str, message: String },
}

fn gate_id(run: &str, at: GateRef) -> String {
    // A deterministic GUID from the run and the gate's place: FNV-1a over two seeds.
    let key = format!(
        "{run}/{}/{:?}/{:?}/{}",
        at.stage, at.group, at.timing, at.index
    );
    let fnv = |seed: u64| {
        key.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

fn gates_rt(
    run: &str,
    gates: &[Gate],
    stage: u32,
    group: Option<u32>,
    timing: Timing,
) -> Vec<GateRt> {
    gates
        .iter()
        .enumerate()
        .map(|(i, g)| GateRt {
            gate: g.clone(),
            id: gate_id(
                run,
                GateRef {
                    stage,
                    group,
                    timing,
                    index: i as u32,
                },
            ),
            state: State::NotStarted,
            start: None,
            completed: None,
            absolute_start: None,
            approved_by: None,
        })
        .collect()
}

fn gates_done(gates: &[GateRt]) -> bool {
    gates
        .iter()
        .all(|g| matches!(g.state, State::Completed | State::Skipped))
}

/// The next `day` at `time` local (`offset` east of UTC) at or after `now`; a time already
/// passed today means next week's (reference §1.6).
pub fn next_scheduled_start(day: crate::time::Weekday, time: i64, offset: i64, now: Time) -> Time {
    let (date, second_of_day) = now.civil(offset);
    let mut ahead = (day.index() - date.weekday().index()).rem_euclid(7);
    if ahead == 0 && second_of_day > time {
        ahead = 7;
    }
    Time((date.days() + ahead) * SECONDS_PER_DAY + time - offset)
}

impl Engine {
    /// Creates a run: resolves membership and thresholds (SEMANTICS §2, §4). Returns the engine
    /// and warnings for the user (a threshold that tolerates the whole scope, say).
    pub fn create(
        run_name: &str,
        spec: &RunSpec,
        fleet: &[Member],
        catalog: Catalog,
    ) -> Result<(Engine, Vec<String>), ApiError> {
        let mut sorted: Vec<&Member> = fleet.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        if let NodeImageSelection::Custom(versions) = &spec.upgrade.node_images {
            for (i, (family, version)) in versions.iter().enumerate() {
                if !catalog.lists_image(family, version) {
                    let target = format!(
                        "properties.managedClusterUpdate.nodeImageSelection.customNodeImageVersions[{i}].version"
                    );
                    return Err(ApiError::new(
                        ErrorCode::InvalidNodeImageSelection,
                        format!(
                            "{target}: node image {family}-{version} is not in the release catalog of any region"
                        ),
                        target,
                    ));
                }
            }
        }
        let implicit;
        let strategy = match &spec.strategy {
            Some(s) => s,
            None => {
                implicit = Strategy {
                    stages: vec![Stage {
                        name: DEFAULT_STAGE_NAME.into(),
                        groups: vec![],
                        selector: None,
                        wait_seconds: 0,
                        max_concurrency: None,
                        max_allowed_failures: None,
                        before_gates: vec![],
                        after_gates: vec![],
                    }],
                };
                &implicit
            }
        };
        let mut warnings = Vec::new();
        let mut engine = Engine {
            run_name: run_name.to_string(),
            upgrade: spec.upgrade.clone(),
            rules: spec.rules,
            catalog,
            members: Vec::new(),
            member_index: HashMap::new(),
            groups: Vec::new(),
            group_failures: Vec::new(),
            stages: Vec::new(),
            phase: RunPhase::NotStarted,
            current: 0,
            run_start: None,
            run_completed: None,
            in_flight: 0,
            failure_count: 0,
            selected_images: None,
            next_attempt: 1,
            timers: BTreeSet::new(),
            commands: VecDeque::new(),
            events: VecDeque::new(),
        };
        // Which group claimed each member, for the duplicate-membership rule.
        let mut claimed: HashMap<&str, String> = HashMap::new();
        for (si, stage) in strategy.stages.iter().enumerate() {
            let in_stage: Vec<&Member> = sorted
                .iter()
                .copied()
                .filter(|m| stage.selector.as_ref().is_none_or(|s| s.matches(&m.labels)))
                .collect();
            // A stage without groups forms one implicit group named after it (SEMANTICS §2).
            let implicit_group;
            let groups: &[Group] = if stage.groups.is_empty() {
                implicit_group = [Group {
                    name: stage.name.clone(),
                    selector: None,
                    max_concurrency: None,
                    max_allowed_failures: None,
                    before_gates: vec![],
                    after_gates: vec![],
                }];
                &implicit_group
            } else {
                &stage.groups
            };
            let group_defs: Vec<(&Group, Vec<&Member>)> = groups
                .iter()
                .map(|g| {
                    let chosen = in_stage
                        .iter()
                        .copied()
                        .filter(|m| match &g.selector {
                            Some(s) => s.matches(&m.labels),
                            None if stage.groups.is_empty() => true,
                            None => m.group.as_deref() == Some(g.name.as_str()),
                        })
                        .collect();
                    (g, chosen)
                })
                .collect();
            let stage_size: u64 = group_defs.iter().map(|d| d.1.len() as u64).sum();
            let stage_concurrency = stage
                .max_concurrency
                .map_or(DEFAULT_STAGE_CONCURRENCY, |a| {
                    a.resolve_concurrency(stage_size)
                });
            let stage_failures = stage
                .max_allowed_failures
                .map_or(0, |a| a.resolve_failures(stage_size));
            if stage.max_allowed_failures.is_some()
                && stage_size > 0
                && stage_failures >= stage_size
            {
                warnings.push(format!(
                    "stage {:?}: maxAllowedFailures {} tolerates all {stage_size} of its members failing",
                    stage.name, stage_failures
                ));
            }
            let mut group_ids = Vec::new();
            for (gi, (group_def, chosen)) in group_defs.into_iter().enumerate() {
                let name = group_def.name.clone();
                let (concurrency, failures) =
                    (group_def.max_concurrency, group_def.max_allowed_failures);
                let (before, after) = (
                    group_def.before_gates.as_slice(),
                    group_def.after_gates.as_slice(),
                );
                let gid = engine.groups.len() as u32;
                let size = chosen.len() as u64;
                let mut ids = Vec::with_capacity(chosen.len());
                for m in chosen {
                    if let Some(other) = claimed.insert(m.name.as_str(), name.clone()) {
                        let target = if stage.groups.is_empty() {
                            format!("properties.strategy.stages[{si}].memberSelector")
                        } else {
                            format!("properties.strategy.stages[{si}].groups[{gi}]")
                        };
                        return Err(ApiError::new(
                            ErrorCode::DuplicateMembership,
                            format!(
                                "{target}: member {} is selected by two groups, {other} and {name}; a member may be in only one group of a run",
                                m.name
                            ),
                            target,
                        ));
                    }
                    let id = engine.members.len() as u32;
                    engine.member_index.insert(m.name.clone(), id);
                    engine.members.push(MemberRt {
                        name: m.name.clone(),
                        cluster_resource_id: m.cluster_resource_id.clone(),
                        group: gid,
                        cluster: m.cluster.clone(),
                        state: State::NotStarted,
                        attempt: 0,
                        target: None,
                        operation_id: None,
                        start: None,
                        completed: None,
                        message: None,
                        error: None,
                        place: Place::Nowhere,
                        timer: None,
                        reattaching: false,
                        removed: false,
                        locked_by: None,
                    });
                    ids.push(id);
                }
                let own = concurrency.map_or(1, |a| a.resolve_concurrency(size));
                let group_failures = failures.map_or(0, |a| a.resolve_failures(size));
                if failures.is_some() && size > 0 && group_failures >= size {
                    warnings.push(format!(
                        "group {name:?}: maxAllowedFailures {group_failures} tolerates all {size} of its members failing"
                    ));
                }
                let gate_group = Some(gi as u32);
                engine.groups.push(GroupRt {
                    before: gates_rt(run_name, before, si as u32, gate_group, Timing::Before),
                    after: gates_rt(run_name, after, si as u32, gate_group, Timing::After),
                    name,
                    stage: si as u32,
                    unfinished: size,
                    members: ids,
                    max_concurrency: own.min(size).min(stage_concurrency).max(1),
                    max_failures: group_failures,
                    phase: Phase::NotStarted,
                    outcome: None,
                    user_skipped: false,
                    stopped: false,
                    in_flight: 0,
                    pending: 0,
                    ready: BTreeSet::new(),
                    start: None,
                    completed: None,
                    message: None,
                    error: None,
                });
                engine.group_failures.push(0);
                group_ids.push(gid);
            }
            engine.stages.push(StageRt {
                name: stage.name.clone(),
                last_served: group_ids.len().saturating_sub(1),
                groups: group_ids,
                size: stage_size,
                max_concurrency: stage_concurrency,
                max_failures: stage_failures,
                phase: Phase::NotStarted,
                outcome: None,
                user_skipped: false,
                stopped: false,
                before: gates_rt(
                    run_name,
                    &stage.before_gates,
                    si as u32,
                    None,
                    Timing::Before,
                ),
                after: gates_rt(run_name, &stage.after_gates, si as u32, None, Timing::After),
                wait: WaitRt {
                    seconds: stage.wait_seconds,
                    state: State::NotStarted,
                    start: None,
                    end: None,
                    completed: None,
                },
                in_flight: 0,
                failure_count: 0,
                start: None,
                completed: None,
                message: None,
                error: None,
            });
        }
        // A run holds every member it selected for its whole life: no growth slack.
        engine.members.shrink_to_fit();
        engine.member_index.shrink_to_fit();
        Ok((engine, warnings))
    }

    pub fn run_name(&self) -> &str {
        &self.run_name
    }

    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
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

    /// Finds a gate by its place: stage name, optional group name, timing; the first gate there
    /// that is `Pending`, else the first.
    pub fn find_gate(&self, stage: &str, group: Option<&str>, timing: Timing) -> Option<GateRef> {
        let si = self.stages.iter().position(|s| s.name == stage)?;
        let (gates, group_pos) = match group {
            None => (self.stage_gates(si, timing), None),
            Some(name) => {
                let pos = self.stages[si]
                    .groups
                    .iter()
                    .position(|&g| self.groups[g as usize].name == name)?;
                (
                    self.group_gates(self.stages[si].groups[pos], timing),
                    Some(pos as u32),
                )
            }
        };
        let index = gates
            .iter()
            .position(|g| g.state == State::Pending)
            .or(if gates.is_empty() { None } else { Some(0) })?;
        Some(GateRef {
            stage: si as u32,
            group: group_pos,
            timing,
            index: index as u32,
        })
    }

    /// Finds a gate by its id (the gate resource's name).
    pub fn find_gate_by_id(&self, id: &str) -> Option<GateRef> {
        for (si, stage) in self.stages.iter().enumerate() {
            for timing in [Timing::Before, Timing::After] {
                if let Some(i) = self.stage_gates(si, timing).iter().position(|g| g.id == id) {
                    return Some(GateRef {
                        stage: si as u32,
                        group: None,
                        timing,
                        index: i as u32,
                    });
                }
                for (pos, &g) in stage.groups.iter().enumerate() {
                    if let Some(i) = self.group_gates(g, timing).iter().position(|g| g.id == id) {
                        return Some(GateRef {
                            stage: si as u32,
                            group: Some(pos as u32),
                            timing,
                            index: i as u32,
                        });
                    }
                }
            }
        }
        None
    }

    /// A member's state and current attempt, if it is part of the run.
    pub fn member_attempt(&self, name: &str) -> Option<(State, u64)> {
        let m = *self.member_index.get(name)?;
        let member = &self.members[m as usize];
        Some((member.state, member.attempt))
    }

    /// What a member's current attempt upgrades it to, if it has one.
    pub fn member_target(&self, name: &str) -> Option<Target> {
        let m = *self.member_index.get(name)?;
        self.members[m as usize].target.clone()
    }

    /// Members waiting for the answer to a [`Command::Observe`] (after a restart of the shell,
    /// the observation is asked again).
    pub fn pending_observations(&self) -> Vec<(String, u64)> {
        self.members
            .iter()
            .filter(|m| m.reattaching)
            .map(|m| (m.name.clone(), m.attempt))
            .collect()
    }

    /// Every gate the run has reached, for the gate resources of the API.
    pub fn gate_views(&self) -> Vec<GateView> {
        let mut views = Vec::new();
        for (si, stage) in self.stages.iter().enumerate() {
            let mut places: Vec<(Option<String>, Timing, &[GateRt])> = vec![
                (None, Timing::Before, &stage.before),
                (None, Timing::After, &stage.after),
            ];
            for &g in &stage.groups {
                let group = &self.groups[g as usize];
                places.push((Some(group.name.clone()), Timing::Before, &group.before));
                places.push((Some(group.name.clone()), Timing::After, &group.after));
            }
            for (group, timing, gates) in places {
                for gate in gates.iter().filter(|g| g.state != State::NotStarted) {
                    let (gate_type, scheduled) = match &gate.gate.kind {
                        GateKind::Approval => ("Approval", None),
                        GateKind::ScheduledStart { config, .. } => {
                            ("ScheduledStart", Some(config.clone()))
                        }
                    };
                    views.push(GateView {
                        id: gate.id.clone(),
                        display_name: gate.gate.display_name.clone(),
                        gate_type,
                        scheduled,
                        absolute_start: gate.absolute_start,
                        stage: self.stages[si].name.clone(),
                        group: group.clone(),
                        timing,
                        state: gate.state,
                        approved_by: gate.approved_by.clone(),
                        approved_at: gate.approved_by.as_ref().and(gate.completed),
                    });
                }
            }
        }
        views
    }

    /// The places of the gates before or after a stage (`group: None`) or one of its groups.
    fn gate_refs(&self, si: usize, group: Option<u32>, timing: Timing) -> Vec<GateRef> {
        let count = match group {
            None => self.stage_gates(si, timing).len(),
            Some(pos) => self
                .group_gates(self.stages[si].groups[pos as usize], timing)
                .len(),
        };
        (0..count as u32)
            .map(|index| GateRef {
                stage: si as u32,
                group,
                timing,
                index,
            })
            .collect()
    }

    fn stage_gates(&self, si: usize, timing: Timing) -> &[GateRt] {
        match timing {
            Timing::Before => &self.stages[si].before,
            Timing::After => &self.stages[si].after,
        }
    }

    fn group_gates(&self, g: u32, timing: Timing) -> &[GateRt] {
        match timing {
            Timing::Before => &self.groups[g as usize].before,
            Timing::After => &self.groups[g as usize].after,
        }
    }

    fn gate_mut(&mut self, at: GateRef) -> Option<&mut GateRt> {
        let stage = self.stages.get_mut(at.stage as usize)?;
        let list = match at.group {
            None => match at.timing {
                Timing::Before => &mut stage.before,
                Timing::After => &mut stage.after,
            },
            Some(pos) => {
                let g = *stage.groups.get(pos as usize)?;
                let group = &mut self.groups[g as usize];
                match at.timing {
                    Timing::Before => &mut group.before,
                    Timing::After => &mut group.after,
                }
            }
        };
        list.get_mut(at.index as usize)
    }

    fn gate_names(&self, at: GateRef) -> (Option<String>, Option<String>) {
        let stage = &self.stages[at.stage as usize];
        let group = at.group.map(|pos| {
            self.groups[stage.groups[pos as usize] as usize]
                .name
                .clone()
        });
        (Some(stage.name.clone()), group)
    }

    // -----------------------------------------------------------------------------------------
    // Events and timers.

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
        let member = &self.members[m as usize];
        let group = &self.groups[member.group as usize];
        let stage = self.stages[group.stage as usize].name.clone();
        self.events.push_back(Event {
            time: now,
            kind,
            stage: Some(stage),
            group: Some(group.name.clone()),
            member: Some(member.name.clone()),
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
        self.events.push_back(Event {
            time: now,
            kind: EventType::ActionRejected,
            stage: None,
            group: None,
            member: None,
            gate: None,
            message: Some(action.to_string()),
            error: Some(error),
        });
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

    /// Applies one input at `now` without scheduling. User actions the API would refuse return
    /// the API error and change nothing.
    pub fn handle(&mut self, now: Time, input: Input) -> Result<(), ApiError> {
        match input {
            Input::Start => self.start(now),
            Input::Stop => self.stop(now),
            Input::Skip(targets) => self.skip(now, &targets, None),
            Input::SkipBy {
                targets,
                subject,
                may_approve,
            } => {
                if !may_approve && let Some(passed) = self.approval_passed_by(&targets) {
                    return Err(ApiError::new(
                        ErrorCode::Forbidden,
                        format!(
                            "skipping {passed}, which is pending or not yet reached, needs the approver role, like approving it; {subject:?} may not approve"
                        ),
                        "targets",
                    ));
                }
                self.skip(now, &targets, Some(&subject))
            }
            Input::ApproveGate { gate, by } => self.approve(now, gate, by),
            Input::ApproveGateById { id, by } => {
                let gate = self.find_gate_by_id(&id).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::NotFound,
                        format!("gate {id} is not part of this update run"),
                        "gate",
                    )
                })?;
                self.approve(now, gate, by)
            }
            Input::OperationAccepted {
                member,
                attempt,
                operation_id,
            } => {
                if let Some(&m) = self.member_index.get(&member) {
                    let member = &mut self.members[m as usize];
                    if member.attempt == attempt {
                        member.operation_id = Some(operation_id);
                    }
                }
                Ok(())
            }
            Input::OperationFinished {
                member,
                attempt,
                outcome,
            } => {
                self.operation_finished(now, &member, attempt, outcome);
                self.roll_up(now);
                Ok(())
            }
            Input::Observed {
                member,
                cluster,
                operation,
            } => {
                self.observed(now, &member, *cluster, operation);
                Ok(())
            }
            Input::MemberRemoved { member } => {
                self.member_removed(now, &member);
                Ok(())
            }
            Input::MemberLocked { member, by_run } => {
                if let Some(&m) = self.member_index.get(&member) {
                    self.members[m as usize].locked_by = Some(by_run);
                    self.repark(now, m);
                }
                Ok(())
            }
            Input::MemberUnlocked { member } => {
                if let Some(&m) = self.member_index.get(&member) {
                    self.members[m as usize].locked_by = None;
                    self.repark(now, m);
                }
                Ok(())
            }
            Input::CatalogChanged(catalog) => {
                self.catalog = catalog;
                if self.phase == RunPhase::Running && self.current < self.stages.len() {
                    let waiting: Vec<u32> = self.stages[self.current]
                        .groups
                        .iter()
                        .flat_map(|&g| self.groups[g as usize].members.iter().copied())
                        .filter(|&m| self.members[m as usize].place == Place::Parked)
                        .collect();
                    for m in waiting {
                        self.repark(now, m);
                    }
                }
                Ok(())
            }
        }
    }

    fn start(&mut self, now: Time) -> Result<(), ApiError> {
        match self.phase {
            RunPhase::NotStarted => {
                self.phase = RunPhase::Running;
                self.run_start = Some(now);
                if self.upgrade.node_images == NodeImageSelection::Consistent
                    && self.upgrade.changes_node_images()
                {
                    self.select_consistent_images(now);
                }
                self.emit(now, EventType::RunStarted, None, None, None, None);
                Ok(())
            }
            RunPhase::Stopped => {
                self.phase = RunPhase::Running;
                self.emit(
                    now,
                    EventType::RunStarted,
                    None,
                    None,
                    None,
                    Some("started again after a stop".into()),
                );
                self.resume_current_stage(now);
                Ok(())
            }
            RunPhase::Failed => {
                if self.in_flight > 0 {
                    return Err(ApiError::conflict(format!(
                        "update run {:?} cannot be retried while {} member upgrade(s) are still in flight",
                        self.run_name, self.in_flight
                    )));
                }
                self.retry(now);
                Ok(())
            }
            other => Err(ApiError::conflict(format!(
                "update run {:?} is {:?}; only a NotStarted, Stopped or Failed run can be started",
                self.run_name,
                self.state_of_phase(other)
            ))),
        }
    }

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

    /// Consistent images: per family in the run, the newest version available in every region of
    /// the run's members at run start (SEMANTICS §1).
    fn select_consistent_images(&mut self, now: Time) {
        let regions: BTreeSet<&str> = self
            .members
            .iter()
            .map(|m| m.cluster.region.as_str())
            .collect();
        let families: BTreeSet<&str> = self
            .members
            .iter()
            .flat_map(|m| m.cluster.node_pools.iter().map(|p| p.family.as_str()))
            .collect();
        let mut selected = BTreeMap::new();
        for family in families {
            if let Some(v) = self
                .catalog
                .newest_common_image(family, regions.iter().copied(), now)
            {
                selected.insert(family.to_string(), v);
            }
        }
        self.selected_images = Some(selected);
    }

    /// After a stop: re-observe stopped members, re-place waiting ones.
    fn resume_current_stage(&mut self, now: Time) {
        let Some(stage) = self.stages.get_mut(self.current) else {
            return;
        };
        stage.stopped = false;
        let groups = stage.groups.clone();
        for g in groups {
            self.groups[g as usize].stopped = false;
            if self.groups[g as usize].phase != Phase::Active {
                continue;
            }
            let members = self.groups[g as usize].members.clone();
            for m in members {
                match self.members[m as usize].state {
                    State::Stopped => {
                        let member = &mut self.members[m as usize];
                        member.state = State::Running;
                        member.reattaching = true;
                        let attempt = member.attempt;
                        let name = member.name.clone();
                        self.add_in_flight(g, 1);
                        self.commands.push_back(Command::Observe {
                            member: name,
                            attempt,
                        });
                    }
                    State::NotStarted if !self.groups[g as usize].user_skipped => {
                        self.enqueue(now, m)
                    }
                    _ => {}
                }
            }
        }
    }

    fn add_in_flight(&mut self, g: u32, delta: i64) {
        let group = &mut self.groups[g as usize];
        group.in_flight = group.in_flight.saturating_add_signed(delta);
        let stage = &mut self.stages[group.stage as usize];
        stage.in_flight = stage.in_flight.saturating_add_signed(delta);
        self.in_flight = self.in_flight.saturating_add_signed(delta);
    }

    /// Starting a Failed run retries it (SEMANTICS §6).
    fn retry(&mut self, now: Time) {
        let si = self.current;
        self.phase = RunPhase::Running;
        self.run_completed = None;
        // A stage a user skipped while the run was Failed stays skipped; the run moves on.
        let resumable = self
            .stages
            .get(si)
            .is_some_and(|s| s.outcome != Some(State::Skipped));
        if resumable {
            let stage = &mut self.stages[si];
            stage.outcome = None;
            stage.stopped = false;
            stage.failure_count = 0;
            stage.completed = None;
            stage.message = None;
            stage.error = None;
            let groups = stage.groups.clone();
            for g in groups {
                // Every group's count restarts (SEMANTICS §6); a skipped group is otherwise left alone.
                self.group_failures[g as usize] = 0;
                let group = &mut self.groups[g as usize];
                if group.user_skipped {
                    continue;
                }
                group.stopped = false;
                let mut reset = 0;
                for &m in &group.members {
                    let member = &mut self.members[m as usize];
                    if member.state == State::Failed && member.removed {
                        // Deleted since it failed: nothing is sent to it again (SEMANTICS §2).
                        member.state = State::Skipped;
                        member.completed = Some(now);
                        member.error = None;
                        member.message = Some(REMOVED.into());
                        self.events.push_back(Event {
                            time: now,
                            kind: EventType::MemberSkipped,
                            stage: Some(self.stages[si].name.clone()),
                            group: Some(group.name.clone()),
                            member: Some(member.name.clone()),
                            gate: None,
                            message: Some(REMOVED.into()),
                            error: None,
                        });
                    } else if member.state == State::Failed {
                        member.state = State::NotStarted;
                        member.start = None;
                        member.completed = None;
                        if let Some(err) = member.error.take() {
                            member.message =
                                Some(format!("earlier attempt failed: {}", err.message));
                        }
                        reset += 1;
                    }
                }
                group.unfinished += reset;
                let was = group.outcome;
                if reset > 0 || matches!(was, Some(State::Failed) | Some(State::Stopped)) {
                    group.outcome = None;
                    group.completed = None;
                    group.message = None;
                    group.error = None;
                    if reset > 0 && group.phase == Phase::AfterGates {
                        group.phase = Phase::Active;
                    }
                }
                if group.outcome.is_none() && group.phase == Phase::Active {
                    let members = group.members.clone();
                    for m in members {
                        if self.members[m as usize].state == State::NotStarted {
                            self.enqueue(now, m);
                        }
                    }
                }
            }
            // Members parked while the run was Failed may have missed their wake-up.
            let parked: Vec<u32> = self.stages[si]
                .groups
                .iter()
                .flat_map(|&g| self.groups[g as usize].members.iter().copied())
                .filter(|&m| self.members[m as usize].place == Place::Parked)
                .collect();
            for m in parked {
                self.repark(now, m);
            }
            if self.stages[si].phase == Phase::AfterGates
                && self.stages[si]
                    .groups
                    .iter()
                    .any(|&g| self.groups[g as usize].outcome.is_none())
            {
                self.stages[si].phase = Phase::Active;
            }
        }
        self.failure_count = self.stages.iter().map(|s| s.failure_count).sum();
        self.emit(
            now,
            EventType::RunStarted,
            None,
            None,
            None,
            Some("retrying the failed run".into()),
        );
    }

    fn stop(&mut self, now: Time) -> Result<(), ApiError> {
        if self.phase != RunPhase::Running {
            return Err(ApiError::conflict(format!(
                "update run {:?} is {:?}; only a Running or Pending run can be stopped",
                self.run_name,
                self.run_state()
            )));
        }
        self.phase = RunPhase::Stopped;
        if let Some(stage) = self.stages.get(self.current) {
            let groups = stage.groups.clone();
            for g in groups {
                let members = self.groups[g as usize].members.clone();
                for m in members {
                    let member = &self.members[m as usize];
                    match member.state {
                        // Operations already sent are not aborted; the run stops tracking them.
                        State::Running => {
                            self.members[m as usize].state = State::Stopped;
                            self.members[m as usize].reattaching = false;
                            self.add_in_flight(g, -1);
                            self.emit_member(now, EventType::MemberStopped, m, None);
                        }
                        State::NotStarted | State::Pending => self.unplace(m),
                        _ => {}
                    }
                }
                let group = &mut self.groups[g as usize];
                if group.phase != Phase::NotStarted && group.outcome.is_none() {
                    group.stopped = true;
                }
            }
            let stage = &mut self.stages[self.current];
            if stage.phase != Phase::NotStarted && stage.outcome.is_none() {
                stage.stopped = true;
            }
        }
        self.emit(now, EventType::RunStopped, None, None, None, None);
        Ok(())
    }

    fn approve(&mut self, now: Time, at: GateRef, by: String) -> Result<(), ApiError> {
        let run_state = self.run_state();
        let gate = self
            .gate_mut(at)
            .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no such gate", "gate"))?;
        match gate.state {
            State::Pending => {}
            State::NotStarted => {
                return Err(ApiError::conflict(format!(
                    "gate {} has not been reached yet; approvals cannot be given before the run reaches the gate",
                    gate.id
                )));
            }
            other => {
                return Err(ApiError::conflict(format!(
                    "gate {} is already {other:?}",
                    gate.id
                )));
            }
        }
        if run_state.is_terminal() && run_state != State::Failed {
            return Err(ApiError::conflict(format!(
                "the update run is {run_state:?}"
            )));
        }
        gate.state = State::Completed;
        gate.completed = Some(now);
        gate.approved_by = Some(by.clone());
        self.emit_gate(
            now,
            EventType::GateCompleted,
            at,
            Some(format!("approved by {by}")),
        );
        Ok(())
    }

    fn operation_finished(
        &mut self,
        now: Time,
        name: &str,
        attempt: u64,
        outcome: Result<(), String>,
    ) {
        let Some(&m) = self.member_index.get(name) else {
            return;
        };
        let member = &self.members[m as usize];
        // A result for an attempt the run no longer tracks (stopped, superseded) is ignored. A
        // member re-attaching waits for its observation, unless the follower gave up on it.
        if member.state != State::Running
            || member.attempt != attempt
            || (member.reattaching && outcome.is_ok())
        {
            return;
        }
        self.members[m as usize].reattaching = false;
        let member = &self.members[m as usize];
        let g = member.group;
        self.add_in_flight(g, -1);
        self.groups[g as usize].unfinished -= 1;
        if self.members[m as usize].removed {
            // Deleted from the fleet while in flight: Skipped, whatever the operation did, and
            // not counted as a failure (SEMANTICS §2).
            let member = &mut self.members[m as usize];
            member.state = State::Skipped;
            member.completed = Some(now);
            member.message = Some(REMOVED.into());
            self.emit_member(now, EventType::MemberSkipped, m, Some(REMOVED.into()));
            self.finish_group_if_skipped(now, g);
            return;
        }
        match outcome {
            Ok(()) => {
                let member = &mut self.members[m as usize];
                member.state = State::Completed;
                member.completed = Some(now);
                if let Some(target) = &member.target {
                    apply_target(&mut member.cluster, target);
                }
                self.emit_member(now, EventType::MemberSucceeded, m, None);
            }
            Err(message) => self.fail_member(now, m, "UpgradeFailed", message),
        }
        // A group a user skipped ends Skipped when its last member in flight finishes.
        self.finish_group_if_skipped(now, g);
    }

    /// Records a member failure and applies the thresholds (SEMANTICS §4).
    fn fail_member(&mut self, now: Time, m: u32, code: &str, message: String) {
        let member = &mut self.members[m as usize];
        member.state = State::Failed;
        member.completed = Some(now);
        member.error = Some(ErrorDetail {
            code: code.into(),
            message: message.clone(),
        });
        let g = member.group;
        self.emit_member(now, EventType::MemberFailed, m, Some(message));
        self.group_failures[g as usize] += 1;
        let si = self.groups[g as usize].stage as usize;
        self.stages[si].failure_count += 1;
        self.failure_count += 1;
        let mut failed = false;
        let group = &mut self.groups[g as usize];
        if !group.user_skipped
            && group.outcome.is_none()
            && self.group_failures[g as usize] > group.max_failures
        {
            group.outcome = Some(State::Failed);
            // Members still in flight finish first; the run's end stamps the time then.
            if group.in_flight == 0 {
                group.completed = Some(now);
            }
            let msg = format!(
                "{} failures exceed maxAllowedFailures {}",
                self.group_failures[g as usize], group.max_failures
            );
            group.message = Some(msg.clone());
            group.error = Some(ErrorDetail {
                code: "MaxAllowedFailuresExceeded".into(),
                message: msg.clone(),
            });
            self.emit_group(now, EventType::GroupFailed, g, Some(msg));
            failed = true;
        }
        let stage = &mut self.stages[si];
        if !stage.user_skipped
            && stage.outcome.is_none()
            && (failed || stage.failure_count > stage.max_failures)
        {
            stage.outcome = Some(State::Failed);
            if stage.in_flight == 0 {
                stage.completed = Some(now);
            }
            let (code, msg) = if failed {
                (
                    "GroupFailed",
                    format!("group {:?} failed", self.groups[g as usize].name),
                )
            } else {
                (
                    "MaxAllowedFailuresExceeded",
                    format!(
                        "{} failures exceed maxAllowedFailures {}",
                        stage.failure_count, stage.max_failures
                    ),
                )
            };
            stage.message = Some(msg.clone());
            stage.error = Some(ErrorDetail {
                code: code.into(),
                message: msg.clone(),
            });
            self.emit_stage(now, EventType::StageFailed, si, Some(msg));
            failed = true;
        }
        if failed && self.phase == RunPhase::Running {
            // The run stops progressing; in-flight members finish (SEMANTICS §4).
            self.phase = RunPhase::Failed;
            self.emit(
                now,
                EventType::RunFailed,
                None,
                None,
                None,
                self.stages[si].message.clone(),
            );
        }
    }

    fn observed(
        &mut self,
        now: Time,
        name: &str,
        cluster: Cluster,
        operation: Option<(u64, OperationProgress)>,
    ) {
        let Some(&m) = self.member_index.get(name) else {
            return;
        };
        self.members[m as usize].cluster = cluster;
        let Some((attempt, progress)) = operation else {
            if let Place::Queued(_) = self.members[m as usize].place {
                // Its window may have changed: its class too.
                self.enqueue(now, m);
            }
            if self.members[m as usize].place == Place::Parked {
                // A Pending member is decided again with its latest observation when its group
                // next comes to it (SEMANTICS §1): queue it if that decision is no longer an
                // upgrade (another run upgraded it, say); otherwise its reason may have moved.
                if matches!(self.decide(m, now), Decision::Upgrade(_)) {
                    self.repark(now, m);
                } else {
                    self.enqueue(now, m);
                }
            }
            return;
        };
        let member = &self.members[m as usize];
        if !member.reattaching || member.attempt != attempt {
            return;
        }
        let g = member.group;
        self.members[m as usize].reattaching = false;
        match progress {
            OperationProgress::InProgress => {
                self.emit_member(now, EventType::MemberReattached, m, None)
            }
            OperationProgress::NotRunning => {
                self.add_in_flight(g, -1);
                let member = &mut self.members[m as usize];
                let at_target = member
                    .target
                    .as_ref()
                    .is_some_and(|t| cluster_at(&member.cluster, t));
                if at_target {
                    member.state = State::Completed;
                    member.completed = Some(now);
                    member.message = Some("found at target when the run started again".into());
                    self.groups[g as usize].unfinished -= 1;
                    self.emit_member(
                        now,
                        EventType::MemberSucceeded,
                        m,
                        Some("found at target when the run started again".into()),
                    );
                } else if member.removed {
                    // Deleted from the fleet while the run re-attached: nothing is sent to it.
                    member.state = State::Skipped;
                    member.completed = Some(now);
                    member.message = Some(REMOVED.into());
                    self.groups[g as usize].unfinished -= 1;
                    self.emit_member(now, EventType::MemberSkipped, m, Some(REMOVED.into()));
                    self.finish_group_if_skipped(now, g);
                } else {
                    // Not at target: attempted again.
                    member.state = State::NotStarted;
                    if self.phase == RunPhase::Running && !self.groups[g as usize].user_skipped {
                        self.enqueue(now, m);
                    }
                }
            }
        }
    }

    fn member_removed(&mut self, now: Time, name: &str) {
        let Some(&m) = self.member_index.get(name) else {
            return;
        };
        self.members[m as usize].removed = true;
        if matches!(
            self.members[m as usize].state,
            State::NotStarted | State::Pending | State::Stopped
        ) {
            self.skip_member(now, m, REMOVED);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Skips.

    /// The first Approval gate, pending or not yet reached, that skipping `targets` would pass:
    /// the gates of a skipped stage and of its groups, and those of a skipped group.
    fn approval_passed_by(&self, targets: &[SkipTarget]) -> Option<String> {
        let open = |gates: &[GateRt]| {
            gates
                .iter()
                .find(|g| {
                    matches!(g.gate.kind, GateKind::Approval)
                        && matches!(g.state, State::NotStarted | State::Pending)
                })
                .map(|g| {
                    format!(
                        "the Approval gate {}",
                        g.gate
                            .display_name
                            .clone()
                            .map_or_else(|| g.id.clone(), |n| format!("{n:?} ({})", g.id))
                    )
                })
        };
        let group_gates = |g: &GroupRt| open(&g.before).or_else(|| open(&g.after));
        for t in targets {
            let passed = match t.kind {
                SkipKind::Stage => self.stages.iter().find(|s| s.name == t.name).and_then(|s| {
                    open(&s.before).or_else(|| open(&s.after)).or_else(|| {
                        s.groups
                            .iter()
                            .find_map(|&g| group_gates(&self.groups[g as usize]))
                    })
                }),
                SkipKind::Group => self
                    .groups
                    .iter()
                    .find(|g| g.name == t.name)
                    .and_then(group_gates),
                SkipKind::Member | SkipKind::AfterStageWait => None,
            };
            if let Some(gate) = passed {
                return Some(format!("{:?} {:?} passes {gate}", t.kind, t.name));
            }
        }
        None
    }

    fn skip(
        &mut self,
        now: Time,
        targets: &[SkipTarget],
        subject: Option<&str>,
    ) -> Result<(), ApiError> {
        if matches!(self.phase, RunPhase::Completed | RunPhase::Skipped) {
            return Err(ApiError::conflict(format!(
                "update run {:?} is {:?}; nothing can be skipped",
                self.run_name,
                self.run_state()
            )));
        }
        if targets.is_empty() {
            return Err(ApiError::new(
                ErrorCode::InvalidSkipTarget,
                "targets: at least one target is required",
                "targets",
            ));
        }
        enum Resolved {
            Member(u32),
            Group(u32),
            Stage(usize),
            Wait(usize),
        }
        let mut resolved = Vec::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            let path = format!("targets[{i}].name");
            let unknown = |what: &str| {
                ApiError::new(
                    ErrorCode::InvalidSkipTarget,
                    format!("{path}: {what} {:?} is not part of this update run", t.name),
                    path.clone(),
                )
            };
            resolved.push(match t.kind {
                SkipKind::Member => {
                    let m = *self.member_index.get(&t.name).ok_or_else(|| unknown("member"))?;
                    let state = self.members[m as usize].state;
                    if !matches!(state, State::NotStarted | State::Pending) {
                        return Err(ApiError::conflict(format!(
                            "member {:?} is {state:?}; only a NotStarted or Pending member can be skipped",
                            t.name
                        )));
                    }
                    Resolved::Member(m)
                }
                SkipKind::Group => {
                    let g = self.groups.iter().position(|g| g.name == t.name).ok_or_else(|| unknown("group"))? as u32;
                    // Completed and Skipped are final; Failed and Stopped resume on retry.
                    if let Some(state @ (State::Completed | State::Skipped)) = self.groups[g as usize].outcome {
                        return Err(ApiError::conflict(format!("group {:?} is already {state:?}", t.name)));
                    }
                    Resolved::Group(g)
                }
                SkipKind::Stage => {
                    let si = self.stages.iter().position(|s| s.name == t.name).ok_or_else(|| unknown("stage"))?;
                    if let Some(state @ (State::Completed | State::Skipped)) = self.stages[si].outcome {
                        return Err(ApiError::conflict(format!("stage {:?} is already {state:?}", t.name)));
                    }
                    Resolved::Stage(si)
                }
                SkipKind::AfterStageWait => {
                    let si = self.stages.iter().position(|s| s.name == t.name).ok_or_else(|| unknown("stage"))?;
                    let state = self.stages[si].wait.state;
                    if state.is_terminal() || matches!(self.stages[si].outcome, Some(State::Completed | State::Skipped)) {
                        return Err(ApiError::conflict(format!("the wait after stage {:?} is already over", t.name)));
                    }
                    Resolved::Wait(si)
                }
            });
        }
        let by = match subject {
            Some(who) => format!("skipped by {who}"),
            None => "skipped by a user".to_string(),
        };
        for r in resolved {
            match r {
                Resolved::Member(m) => {
                    if matches!(
                        self.members[m as usize].state,
                        State::NotStarted | State::Pending
                    ) {
                        self.skip_member(now, m, &by);
                    }
                }
                Resolved::Group(g) => self.skip_group(now, g, &by),
                Resolved::Stage(si) => self.skip_stage(now, si, &by),
                Resolved::Wait(si) => self.skip_wait(now, si),
            }
        }
        Ok(())
    }

    fn skip_member(&mut self, now: Time, m: u32, why: &str) {
        self.unplace(m);
        let member = &mut self.members[m as usize];
        member.state = State::Skipped;
        member.completed = Some(now);
        member.message = Some(why.to_string());
        let g = member.group;
        self.groups[g as usize].unfinished -= 1;
        self.emit_member(now, EventType::MemberSkipped, m, Some(why.to_string()));
        self.finish_group_if_skipped(now, g);
    }

    fn finish_group_if_skipped(&mut self, now: Time, g: u32) {
        let group = &mut self.groups[g as usize];
        if group.user_skipped
            && group.outcome.is_none()
            && group.unfinished == 0
            && group.in_flight == 0
        {
            group.outcome = Some(State::Skipped);
            group.completed = Some(now);
            let why = group
                .message
                .clone()
                .unwrap_or_else(|| "skipped by a user".into());
            self.emit_group(now, EventType::GroupSkipped, g, Some(why));
        }
    }

    fn skip_gates(&mut self, now: Time, si: usize, group: Option<u32>) {
        for timing in [Timing::Before, Timing::After] {
            for at in self.gate_refs(si, group, timing) {
                let Some(gate) = self.gate_mut(at) else {
                    continue;
                };
                if matches!(gate.state, State::NotStarted | State::Pending) {
                    let was_pending = gate.state == State::Pending;
                    gate.state = State::Skipped;
                    gate.completed = Some(now);
                    if let Some(t) = gate.absolute_start {
                        self.timers.remove(&(t, TimerKey::Gate(at)));
                    }
                    if was_pending {
                        self.emit_gate(now, EventType::GateSkipped, at, None);
                    }
                }
            }
        }
    }

    fn skip_group(&mut self, now: Time, g: u32, why: &str) {
        let group = &mut self.groups[g as usize];
        group.user_skipped = true;
        if matches!(group.outcome, Some(State::Failed | State::Stopped)) {
            // Skipped in a failed run instead of being retried.
            group.outcome = None;
            group.completed = None;
            group.error = None;
        }
        group.message = Some(why.to_string());
        let si = self.groups[g as usize].stage as usize;
        let pos = self.stages[si]
            .groups
            .iter()
            .position(|&x| x == g)
            .map(|p| p as u32);
        self.skip_gates(now, si, pos);
        let members = self.groups[g as usize].members.clone();
        for m in members {
            if matches!(
                self.members[m as usize].state,
                State::NotStarted | State::Pending
            ) {
                self.skip_member(now, m, why);
            }
        }
        let group = &mut self.groups[g as usize];
        if group.phase == Phase::BeforeGates || group.phase == Phase::AfterGates {
            group.phase = Phase::Active;
        }
        self.finish_group_if_skipped(now, g);
    }

    fn skip_stage(&mut self, now: Time, si: usize, why: &str) {
        let stage = &mut self.stages[si];
        stage.user_skipped = true;
        if matches!(stage.outcome, Some(State::Failed | State::Stopped)) {
            stage.outcome = None;
            stage.completed = None;
            stage.error = None;
        }
        stage.message = Some(why.to_string());
        self.skip_gates(now, si, None);
        self.skip_wait(now, si);
        let groups = self.stages[si].groups.clone();
        for g in groups {
            if !matches!(
                self.groups[g as usize].outcome,
                Some(State::Completed | State::Skipped)
            ) {
                self.skip_group(now, g, &format!("stage {why}"));
            }
        }
        // A started stage waits for its members in flight; one not reached yet stays so.
        let stage = &mut self.stages[si];
        if matches!(stage.phase, Phase::BeforeGates | Phase::AfterGates) {
            stage.phase = Phase::Active;
        }
        self.finish_stage_if_skipped(now, si);
    }

    fn finish_stage_if_skipped(&mut self, now: Time, si: usize) {
        let stage = &self.stages[si];
        if stage.user_skipped
            && stage.outcome.is_none()
            && stage.in_flight == 0
            && stage
                .groups
                .iter()
                .all(|&g| self.groups[g as usize].outcome.is_some())
        {
            let stage = &mut self.stages[si];
            stage.outcome = Some(State::Skipped);
            stage.completed = Some(now);
            let why = stage
                .message
                .clone()
                .unwrap_or_else(|| "skipped by a user".into());
            self.emit_stage(now, EventType::StageSkipped, si, Some(why));
        }
    }

    fn skip_wait(&mut self, now: Time, si: usize) {
        let wait = &mut self.stages[si].wait;
        if wait.state.is_terminal() {
            return;
        }
        let was_running = wait.state == State::Running;
        wait.state = State::Skipped;
        wait.completed = Some(now);
        if let Some(end) = wait.end {
            self.timers.remove(&(end, TimerKey::Wait(si as u32)));
        }
        if was_running {
            self.emit_stage(now, EventType::WaitSkipped, si, None);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Placement: ready set or timer set.

    fn unplace(&mut self, m: u32) {
        let member = &mut self.members[m as usize];
        let g = member.group as usize;
        if let Place::Queued(class) = member.place {
            self.groups[g].ready.remove(&(class, m));
        }
        if member.state == State::Pending {
            member.state = State::NotStarted;
            member.message = None;
            self.groups[g].pending -= 1;
        }
        member.place = Place::Nowhere;
        self.set_member_timer(m, None);
    }

    /// The priority class of a member now (SEMANTICS §3) and the instant it changes.
    fn class_of(&self, m: u32, now: Time) -> (u8, Option<Time>) {
        let Some(window) = self.window_of(&self.members[m as usize].cluster) else {
            return (CLASS_NO_WINDOW, None);
        };
        match window.next_opening(now) {
            None => (CLASS_CLOSED, None),
            Some(o) if o.from == now => (CLASS_OPEN, Some(o.until)),
            Some(o) if o.from.unix() - now.unix() <= SOON => (CLASS_SOON, Some(o.from)),
            Some(o) => (CLASS_CLOSED, Some(Time::from_unix(o.from.unix() - SOON))),
        }
    }

    /// Queues a member for its group to reach, in priority order (SEMANTICS §1, §3). A queued
    /// member is NotStarted: a Pending one that may start now (its window opened, its version
    /// arrived, another run let go of it) goes back to waiting for its group to come to it.
    fn enqueue(&mut self, now: Time, m: u32) {
        let (class, changes) = self.class_of(m, now);
        let member = &mut self.members[m as usize];
        let g = member.group as usize;
        if let Place::Queued(old) = member.place {
            self.groups[g].ready.remove(&(old, m));
        }
        if member.state == State::Pending {
            member.state = State::NotStarted;
            self.groups[g].pending -= 1;
        }
        member.message = None;
        member.place = Place::Queued(class);
        self.groups[g].ready.insert((class, m));
        self.set_member_timer(m, changes);
    }

    /// A reached member that will be upgraded but cannot start yet: Pending, holding no slot,
    /// until `wake` (or an input) makes it worth reaching again (SEMANTICS §3).
    fn park(&mut self, now: Time, m: u32, wake: Option<Time>, message: String) {
        let member = &mut self.members[m as usize];
        let g = member.group as usize;
        if let Place::Queued(class) = member.place {
            self.groups[g].ready.remove(&(class, m));
        }
        let newly = member.state != State::Pending;
        let changed = member.message.as_deref() != Some(message.as_str());
        if newly {
            member.state = State::Pending;
            self.groups[g].pending += 1;
        }
        member.message = Some(message.clone());
        member.place = Place::Parked;
        self.set_member_timer(m, wake);
        if newly || changed {
            self.emit_member(now, EventType::MemberPending, m, Some(message));
        }
    }

    /// A Pending member's reason may have changed (a lock taken or released, the catalog): it
    /// stays Pending with the new reason, or is queued again if it may start now.
    fn repark(&mut self, now: Time, m: u32) {
        if self.phase != RunPhase::Running || self.members[m as usize].place != Place::Parked {
            return;
        }
        match self.readiness(m, now) {
            Readiness::Ready => self.enqueue(now, m),
            Readiness::Wait { wake, message } => self.park(now, m, wake, message),
        }
    }

    fn window_of<'a>(&self, cluster: &'a Cluster) -> Option<&'a MaintenanceWindow> {
        match self.upgrade.upgrade_type {
            UpgradeType::NodeImageOnly => cluster.node_os_window.as_deref(),
            _ => cluster.kubernetes_window.as_deref(),
        }
    }

    /// Whether a reached member that will be upgraded can start now, and if not, until when it
    /// waits (SEMANTICS §3): another run's operation, its target not yet in its region, its
    /// maintenance window.
    fn readiness(&self, m: u32, now: Time) -> Readiness {
        let member = &self.members[m as usize];
        if let Some(run) = &member.locked_by {
            return Readiness::Wait {
                wake: None,
                message: format!("waiting: update run {run:?} is upgrading this member"),
            };
        }
        let cluster = &member.cluster;
        let region = cluster.region.as_str();
        let mut needs = Availability::Now;
        let mut what = String::new();
        if self.upgrade.changes_kubernetes()
            && let Some(v) = self.upgrade.kubernetes_version
        {
            let a = self.catalog.kubernetes(region, v, now);
            if a != Availability::Now {
                what = format!("Kubernetes version {v} is not yet available in region {region:?}");
            }
            needs = needs.and(a);
        }
        if self.upgrade.changes_node_images() {
            for pool in &cluster.node_pools {
                let a = match &self.upgrade.node_images {
                    NodeImageSelection::Latest => {
                        self.catalog.first_image_arrival(region, &pool.family, now)
                    }
                    NodeImageSelection::Consistent => match self
                        .selected_images
                        .as_ref()
                        .and_then(|s| s.get(&pool.family))
                    {
                        Some(v) => self.catalog.image(region, &pool.family, v, now),
                        // No selection for this family: decided (Skipped) when picked.
                        None => Availability::Now,
                    },
                    NodeImageSelection::Custom(versions) => match versions.get(&pool.family) {
                        Some(v) => self.catalog.image(region, &pool.family, v, now),
                        None => Availability::Now,
                    },
                };
                if a != Availability::Now && what.is_empty() {
                    what = format!(
                        "no node image of family {} is available yet in region {region:?}",
                        pool.family
                    );
                    if let NodeImageSelection::Custom(versions) = &self.upgrade.node_images
                        && let Some(v) = versions.get(&pool.family)
                    {
                        what = format!(
                            "target node image version {}-{v} is not yet available in region {region:?}",
                            pool.family
                        );
                    }
                }
                needs = needs.and(a);
            }
        }
        let earliest = match needs {
            Availability::Now => now,
            Availability::At(t) => t,
            Availability::Unlisted => {
                return Readiness::Wait {
                    wake: None,
                    message: format!("{what}; waiting for it to be released there"),
                };
            }
        };
        let Some(window) = self.window_of(cluster) else {
            if earliest > now {
                return Readiness::Wait {
                    wake: Some(earliest),
                    message: format!("{what}; expected at {earliest}"),
                };
            }
            return Readiness::Ready;
        };
        match window.next_opening(earliest) {
            None => Readiness::Wait {
                wake: None,
                message: "the maintenance window never opens again".into(),
            },
            Some(o) if o.from == now => Readiness::Ready,
            Some(o) => {
                let message = if earliest > now {
                    format!(
                        "{what}; expected at {earliest}, then the maintenance window opens at {}",
                        o.from
                    )
                } else if o.from.unix() - now.unix() <= SOON {
                    format!("maintenance window opens soon, at {}", o.from)
                } else {
                    format!("maintenance window is closed; it opens next at {}", o.from)
                };
                Readiness::Wait {
                    wake: Some(o.from),
                    message,
                }
            }
        }
    }

    /// What to do with a member the run has reached (SEMANTICS §1): upgrade, skip (already at
    /// target, no Consistent image), or fail (downgrade).
    fn decide(&self, m: u32, now: Time) -> Decision {
        let member = &self.members[m as usize];
        if member.removed {
            return Decision::Skip(REMOVED.into());
        }
        let cluster = &member.cluster;
        let current = cluster.kubernetes_version;
        let kube_target = if self.upgrade.changes_kubernetes() {
            self.upgrade.kubernetes_version
        } else {
            None
        };
        if let Some(target) = kube_target {
            if self.rules.skip_minor_jumps
                && target.major == current.major
                && target.minor > current.minor + 1
            {
                return Decision::Skip(format!(
                    "the cluster is more than one minor behind the target ({}.{} → {}.{}); auto-upgrade does not skip minors",
                    current.major, current.minor, target.major, target.minor
                ));
            }
            if self.rules.require_long_term_support
                && !cluster.long_term_support
                && target != current
            {
                return Decision::Fail {
                    code: "LongTermSupportRequired",
                    message: format!(
                        "target Kubernetes version {target} is kept only by long-term support, which this cluster does not have enabled"
                    ),
                };
            }
        }
        if let Some(target) = kube_target
            && target < current
        {
            return Decision::Fail {
                code: "DowngradeNotSupported",
                message: format!(
                    "target Kubernetes version {target} is lower than the cluster's current version {current}; downgrades are not supported"
                ),
            };
        }
        let mut node_images = Vec::new();
        let mut left_alone = Vec::new();
        // A Latest pool whose family has no image in the region yet is not at target: the
        // member waits for one (readiness), then is decided again with the image it got.
        let mut awaiting_image = false;
        if self.upgrade.changes_node_images() {
            for pool in &cluster.node_pools {
                if self.rules.linux_node_pools_only && pool.os == Os::Windows {
                    left_alone.push(format!("{:?}", pool.name));
                    continue;
                }
                let chosen = match &self.upgrade.node_images {
                    NodeImageSelection::Latest => {
                        let newest = self
                            .catalog
                            .newest_image(&cluster.region, &pool.family, now)
                            .cloned();
                        awaiting_image |= newest.is_none();
                        newest
                    }
                    NodeImageSelection::Consistent => {
                        match self
                            .selected_images
                            .as_ref()
                            .and_then(|s| s.get(&pool.family))
                        {
                            Some(v) => Some(v.clone()),
                            None => {
                                return Decision::Skip(format!(
                                    "node pool {:?} uses image family {}, which has no version available in every region of this run (Consistent selection)",
                                    pool.name, pool.family
                                ));
                            }
                        }
                    }
                    NodeImageSelection::Custom(versions) => versions.get(&pool.family).cloned(),
                };
                if let Some(image) = chosen
                    && image > pool.image
                {
                    node_images.push(PoolTarget {
                        pool: pool.name.clone(),
                        family: pool.family.clone(),
                        image,
                    });
                }
            }
        }
        let kube_change = kube_target.filter(|t| *t != current);
        if kube_change.is_none() && node_images.is_empty() && !awaiting_image {
            if !left_alone.is_empty() {
                return Decision::Skip(format!(
                    "Windows node pool(s) {} skipped: security patches cover Linux node pools only; no Linux node pool needs an update",
                    left_alone.join(", ")
                ));
            }
            let what = match self.upgrade.upgrade_type {
                UpgradeType::ControlPlaneOnly => format!("already at Kubernetes version {current}"),
                UpgradeType::NodeImageOnly => {
                    "every node pool is already at or ahead of its target node image".into()
                }
                UpgradeType::Full => {
                    format!(
                        "already at Kubernetes version {current} with every node pool at or ahead of its target node image"
                    )
                }
            };
            return Decision::Skip(what);
        }
        Decision::Upgrade(Target {
            upgrade_type: self.upgrade.upgrade_type,
            kubernetes_version: kube_target,
            node_images,
        })
    }

    // -----------------------------------------------------------------------------------------
    // Scheduling.

    /// Processes timers due at `now`, moves the run forward, and hands out free slots. Call once
    /// after all inputs of an instant.
    pub fn settle(&mut self, now: Time) {
        self.fire_timers(now);
        loop {
            let mut changed = false;
            if self.phase == RunPhase::Running {
                changed |= self.advance(now);
                changed |= self.dispatch(now);
            }
            if self.phase == RunPhase::Failed && self.run_completed.is_none() && self.in_flight == 0
            {
                self.finalize_failed(now);
            }
            if !changed {
                break;
            }
        }
    }

    /// Applies what time alone brings at `now` (scheduled gates, waits ending, windows opening,
    /// versions arriving), before the instant's user actions (conformance README: same-instant
    /// order). [`Engine::settle`] does this too.
    pub fn advance_clock(&mut self, now: Time) {
        self.fire_timers(now);
        self.roll_up(now);
    }

    fn fire_timers(&mut self, now: Time) {
        while let Some(&(t, key)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            match key {
                TimerKey::Gate(at) => {
                    if let Some(gate) = self.gate_mut(at)
                        && gate.state == State::Pending
                    {
                        gate.state = State::Completed;
                        gate.completed = Some(t);
                        self.emit_gate(
                            t,
                            EventType::GateCompleted,
                            at,
                            Some("scheduled start time reached".into()),
                        );
                    }
                }
                TimerKey::Wait(si) => {
                    let wait = &mut self.stages[si as usize].wait;
                    if wait.state == State::Running {
                        wait.state = State::Completed;
                        wait.completed = Some(t);
                        self.emit_stage(t, EventType::WaitCompleted, si as usize, None);
                    }
                }
                TimerKey::Member(m) => {
                    self.members[m as usize].timer = None;
                    if self.phase == RunPhase::Running {
                        match self.members[m as usize].place {
                            // Its priority class changes now.
                            Place::Queued(_) => self.enqueue(now, m),
                            // What it waited for came: it may start, or waits for the next thing.
                            Place::Parked => self.repark(now, m),
                            Place::Nowhere => {}
                        }
                    }
                }
            }
        }
    }

    fn open_gates(&mut self, now: Time, si: usize, group: Option<u32>, timing: Timing) {
        for at in self.gate_refs(si, group, timing) {
            let Some(gate) = self.gate_mut(at) else {
                continue;
            };
            if gate.state != State::NotStarted {
                continue;
            }
            gate.state = State::Pending;
            gate.start = Some(now);
            let mut message = gate.gate.display_name.clone();
            if let GateKind::ScheduledStart {
                day,
                time,
                utc_offset,
                ..
            } = gate.gate.kind
            {
                let at_time = next_scheduled_start(day, time, utc_offset, now);
                gate.absolute_start = Some(at_time);
                message = Some(format!(
                    "{}opens at {at_time}",
                    message.map(|m| format!("{m}: ")).unwrap_or_default()
                ));
                self.timers.insert((at_time, TimerKey::Gate(at)));
            }
            self.emit_gate(now, EventType::GatePending, at, message);
        }
        // A scheduled time equal to now completes at once.
        self.fire_timers(now);
    }

    /// Moves the current stage (and the run) forward as far as it can go now.
    fn advance(&mut self, now: Time) -> bool {
        let si = self.current;
        if si >= self.stages.len() {
            return false;
        }
        if let Some(_outcome) = self.stages[si].outcome {
            // Skipped ahead of time, or just finished: move on.
            self.next_stage(now);
            return true;
        }
        match self.stages[si].phase {
            Phase::NotStarted => {
                let all_done = self.stages[si]
                    .groups
                    .iter()
                    .all(|&g| self.groups[g as usize].unfinished == 0);
                if all_done {
                    // Nothing to do in this stage: skipped, no gates, no wait (SEMANTICS §2).
                    let groups = self.stages[si].groups.clone();
                    for g in groups {
                        if self.groups[g as usize].outcome.is_none() {
                            let group = &mut self.groups[g as usize];
                            group.outcome = Some(State::Skipped);
                            group.completed = Some(now);
                            let why = if group.members.is_empty() {
                                "no members"
                            } else {
                                "all members skipped"
                            };
                            group.message = Some(why.into());
                            self.emit_group(now, EventType::GroupSkipped, g, Some(why.into()));
                        }
                    }
                    self.skip_gates(now, si, None);
                    let stage = &mut self.stages[si];
                    stage.wait.state = State::Skipped;
                    stage.outcome = Some(State::Skipped);
                    stage.completed = Some(now);
                    let why = if stage.size == 0 {
                        "no members"
                    } else {
                        "all members skipped"
                    };
                    stage.message = Some(why.into());
                    self.emit_stage(now, EventType::StageSkipped, si, Some(why.into()));
                    return true;
                }
                let stage = &mut self.stages[si];
                stage.phase = Phase::BeforeGates;
                stage.start = Some(now);
                self.emit_stage(now, EventType::StageStarted, si, None);
                // A group that selects no member is Skipped when its stage starts (SEMANTICS
                // §2), before-gates or not.
                for pos in 0..self.stages[si].groups.len() {
                    let g = self.stages[si].groups[pos];
                    if self.groups[g as usize].members.is_empty()
                        && self.groups[g as usize].outcome.is_none()
                    {
                        self.advance_group(now, si, pos as u32, g);
                    }
                }
                self.open_gates(now, si, None, Timing::Before);
                true
            }
            Phase::BeforeGates => {
                if !gates_done(&self.stages[si].before) {
                    return false;
                }
                self.stages[si].phase = Phase::Active;
                true
            }
            Phase::Active | Phase::AfterGates => self.advance_open_stage(now, si),
        }
    }

    /// Rolls a started stage forward: groups finishing, after-gates opening, the wait, the
    /// stage completing.
    fn advance_open_stage(&mut self, now: Time, si: usize) -> bool {
        match self.stages[si].phase {
            Phase::Active => {
                let mut changed = false;
                let groups = self.stages[si].groups.clone();
                for (pos, g) in groups.iter().enumerate() {
                    changed |= self.advance_group(now, si, pos as u32, *g);
                }
                let stage = &self.stages[si];
                if stage.in_flight == 0
                    && groups
                        .iter()
                        .all(|&g| self.groups[g as usize].outcome.is_some())
                {
                    if stage.user_skipped {
                        self.finish_stage_if_skipped(now, si);
                    } else if groups
                        .iter()
                        .all(|&g| self.groups[g as usize].outcome == Some(State::Skipped))
                    {
                        self.skip_gates(now, si, None);
                        let stage = &mut self.stages[si];
                        stage.wait.state = State::Skipped;
                        stage.outcome = Some(State::Skipped);
                        stage.completed = Some(now);
                        stage.message = Some("all groups skipped".into());
                        self.emit_stage(
                            now,
                            EventType::StageSkipped,
                            si,
                            Some("all groups skipped".into()),
                        );
                    } else {
                        self.stages[si].phase = Phase::AfterGates;
                        self.open_gates(now, si, None, Timing::After);
                        let wait = &mut self.stages[si].wait;
                        if wait.state == State::NotStarted {
                            if wait.seconds > 0 {
                                let end = now.plus(wait.seconds);
                                wait.state = State::Running;
                                wait.start = Some(now);
                                wait.end = Some(end);
                                self.timers.insert((end, TimerKey::Wait(si as u32)));
                                self.emit_stage(
                                    now,
                                    EventType::WaitStarted,
                                    si,
                                    Some(format!("until {end}")),
                                );
                            } else {
                                wait.state = State::Completed;
                                wait.start = Some(now);
                                wait.completed = Some(now);
                            }
                        }
                    }
                    return true;
                }
                changed
            }
            Phase::AfterGates => {
                let stage = &self.stages[si];
                if gates_done(&stage.after) && stage.wait.state.is_terminal() {
                    let stage = &mut self.stages[si];
                    stage.outcome = Some(State::Completed);
                    stage.completed = Some(now);
                    self.emit_stage(now, EventType::StageCompleted, si, None);
                    return true;
                }
                false
            }
            Phase::NotStarted | Phase::BeforeGates => false,
        }
    }

    /// Applies the consequences of an upgrade ending or of time passing: groups and stages
    /// finishing, the next stage being reached and its gates opening. Starts no member: that is
    /// the scheduling pass of [`Engine::settle`], after the instant's user actions.
    fn roll_up(&mut self, now: Time) {
        while self.phase == RunPhase::Running && self.advance(now) {}
    }

    fn next_stage(&mut self, now: Time) {
        self.current += 1;
        if self.current < self.stages.len() {
            return;
        }
        let all_skipped = self
            .stages
            .iter()
            .all(|s| s.outcome == Some(State::Skipped));
        self.phase = if all_skipped {
            RunPhase::Skipped
        } else {
            RunPhase::Completed
        };
        self.run_completed = Some(now);
        let kind = if all_skipped {
            EventType::RunSkipped
        } else {
            EventType::RunCompleted
        };
        self.emit(now, kind, None, None, None, None);
    }

    fn advance_group(&mut self, now: Time, si: usize, pos: u32, g: u32) -> bool {
        let group = &self.groups[g as usize];
        if group.outcome.is_some() {
            return false;
        }
        match group.phase {
            Phase::NotStarted => {
                if group.unfinished == 0 {
                    let why = if group.members.is_empty() {
                        "no members"
                    } else {
                        "all members skipped"
                    };
                    let group = &mut self.groups[g as usize];
                    group.outcome = Some(State::Skipped);
                    group.completed = Some(now);
                    group.message = Some(why.into());
                    self.emit_group(now, EventType::GroupSkipped, g, Some(why.into()));
                    return true;
                }
                let group = &mut self.groups[g as usize];
                group.phase = Phase::BeforeGates;
                group.start = Some(now);
                self.emit_group(now, EventType::GroupStarted, g, None);
                self.open_gates(now, si, Some(pos), Timing::Before);
                true
            }
            Phase::BeforeGates => {
                if !gates_done(&group.before) {
                    return false;
                }
                self.groups[g as usize].phase = Phase::Active;
                let members = self.groups[g as usize].members.clone();
                for m in members {
                    if self.members[m as usize].state == State::NotStarted {
                        self.enqueue(now, m);
                    }
                }
                true
            }
            Phase::Active => {
                if group.unfinished > 0 || group.in_flight > 0 {
                    return false;
                }
                if group.user_skipped {
                    self.finish_group_if_skipped(now, g);
                    return true;
                }
                let all_skipped = group
                    .members
                    .iter()
                    .all(|&m| self.members[m as usize].state == State::Skipped);
                if all_skipped {
                    let group = &mut self.groups[g as usize];
                    group.outcome = Some(State::Skipped);
                    group.completed = Some(now);
                    group.message = Some("all members skipped".into());
                    self.emit_group(
                        now,
                        EventType::GroupSkipped,
                        g,
                        Some("all members skipped".into()),
                    );
                    return true;
                }
                self.groups[g as usize].phase = Phase::AfterGates;
                self.open_gates(now, si, Some(pos), Timing::After);
                true
            }
            Phase::AfterGates => {
                if !gates_done(&group.after) {
                    return false;
                }
                let group = &mut self.groups[g as usize];
                group.outcome = Some(State::Completed);
                group.completed = Some(now);
                self.emit_group(now, EventType::GroupCompleted, g, None);
                true
            }
        }
    }

    /// Hands out free slots of the current stage round-robin across its groups (SEMANTICS §3).
    fn dispatch(&mut self, now: Time) -> bool {
        let si = self.current;
        if si >= self.stages.len()
            || self.stages[si].phase != Phase::Active
            || self.stages[si].outcome.is_some()
        {
            return false;
        }
        let mut changed = false;
        let n = self.stages[si].groups.len();
        'slots: while self.phase == RunPhase::Running
            && self.stages[si].in_flight < self.stages[si].max_concurrency
        {
            let start = self.stages[si].last_served;
            for k in 1..=n {
                let pos = (start + k) % n;
                let g = self.stages[si].groups[pos];
                let group = &self.groups[g as usize];
                if group.phase != Phase::Active
                    || group.outcome.is_some()
                    || group.user_skipped
                    || group.in_flight >= group.max_concurrency
                    || group.ready.is_empty()
                {
                    continue;
                }
                let (picked, touched) = self.reach(now, g);
                changed |= touched;
                if self.phase != RunPhase::Running {
                    // A failure in this pass ended the run: nobody else is started, skipped or
                    // failed in it (SEMANTICS §4).
                    return changed;
                }
                if let Some((m, target)) = picked {
                    self.start_member(now, m, target);
                    self.stages[si].last_served = pos;
                    changed = true;
                    continue 'slots;
                }
            }
            break;
        }
        changed
    }

    /// The group comes to its members in priority order (SEMANTICS §1, §3): each member reached
    /// is decided first (already at target or no Consistent image: Skipped; a downgrade:
    /// Failed), then, if it will be upgraded, either returned to start or parked as Pending
    /// (another run's operation, its target not in its region, its window). Skips, failures and
    /// Pending members use no slot, so the group goes on to its next member. Returns the member
    /// to start (if any) and whether anything changed. A failure that ends the run ends the
    /// walk (§4: the pass neither starts, skips nor fails anyone after it).
    fn reach(&mut self, now: Time, g: u32) -> (Option<(u32, Target)>, bool) {
        let mut touched = false;
        while let Some(&(class, m)) = self.groups[g as usize].ready.first() {
            touched = true;
            match self.decide(m, now) {
                Decision::Upgrade(target) => match self.readiness(m, now) {
                    Readiness::Ready => {
                        self.groups[g as usize].ready.remove(&(class, m));
                        self.members[m as usize].place = Place::Nowhere;
                        self.set_member_timer(m, None);
                        return (Some((m, target)), true);
                    }
                    Readiness::Wait { wake, message } => self.park(now, m, wake, message),
                },
                Decision::Skip(why) => {
                    self.unplace(m);
                    let member = &mut self.members[m as usize];
                    member.state = State::Skipped;
                    member.completed = Some(now);
                    member.message = Some(why.clone());
                    self.groups[g as usize].unfinished -= 1;
                    self.emit_member(now, EventType::MemberSkipped, m, Some(why));
                }
                Decision::Fail { code, message } => {
                    self.unplace(m);
                    self.groups[g as usize].unfinished -= 1;
                    self.fail_member(now, m, code, message);
                    if self.phase != RunPhase::Running || self.groups[g as usize].outcome.is_some()
                    {
                        return (None, true);
                    }
                }
            }
        }
        (None, touched)
    }

    fn start_member(&mut self, now: Time, m: u32, target: Target) {
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        let member = &mut self.members[m as usize];
        member.state = State::Running;
        member.attempt = attempt;
        member.start = Some(now);
        member.completed = None;
        member.message = None;
        member.error = None;
        member.operation_id = None;
        member.target = Some(target.clone());
        let g = member.group;
        let name = member.name.clone();
        self.add_in_flight(g, 1);
        self.commands.push_back(Command::StartUpgrade {
            member: name,
            attempt,
            target,
        });
        self.emit_member(now, EventType::MemberStarted, m, None);
    }

    /// The run failed and nothing is in flight any more: settle every state (SEMANTICS §4).
    fn finalize_failed(&mut self, now: Time) {
        self.run_completed = Some(now);
        let Some(stage) = self.stages.get(self.current) else {
            return;
        };
        let groups = stage.groups.clone();
        for g in groups {
            let members = self.groups[g as usize].members.clone();
            for &m in &members {
                if matches!(
                    self.members[m as usize].state,
                    State::NotStarted | State::Pending
                ) {
                    self.unplace(m);
                }
            }
            let group = &mut self.groups[g as usize];
            if group.outcome.is_some() && group.completed.is_none() {
                group.completed = Some(now);
            }
            if group.outcome.is_some() || group.phase == Phase::NotStarted {
                continue;
            }
            let all_done = group.unfinished == 0;
            let outcome = if group.user_skipped {
                // A skipped group never becomes Failed, and ends Skipped (SEMANTICS §6).
                State::Skipped
            } else if all_done
                && members
                    .iter()
                    .all(|&m| self.members[m as usize].state == State::Skipped)
            {
                State::Skipped
            } else if all_done
                && group.phase != Phase::BeforeGates
                && (group.after.is_empty() || gates_done(&group.after))
            {
                State::Completed
            } else {
                State::Stopped
            };
            let group = &mut self.groups[g as usize];
            group.outcome = Some(outcome);
            group.completed = Some(now);
            let kind = match outcome {
                State::Completed => EventType::GroupCompleted,
                State::Skipped => EventType::GroupSkipped,
                _ => EventType::GroupStopped,
            };
            self.emit_group(now, kind, g, None);
        }
        let si = self.current;
        if self.stages[si].outcome.is_some() && self.stages[si].completed.is_none() {
            self.stages[si].completed = Some(now);
        }
        if self.stages[si].outcome.is_none() && self.stages[si].user_skipped {
            self.stages[si].outcome = Some(State::Skipped);
            self.stages[si].completed = Some(now);
            let why = self.stages[si]
                .message
                .clone()
                .unwrap_or_else(|| "skipped by a user".into());
            self.emit_stage(now, EventType::StageSkipped, si, Some(why));
        }
        if self.stages[si].outcome.is_none() && self.stages[si].phase != Phase::NotStarted {
            let all_completed = self.stages[si].groups.iter().all(|&g| {
                matches!(
                    self.groups[g as usize].outcome,
                    Some(State::Completed) | Some(State::Skipped)
                )
            });
            let stage = &mut self.stages[si];
            stage.outcome = Some(if all_completed {
                State::Completed
            } else {
                State::Stopped
            });
            stage.completed = Some(now);
            if !all_completed {
                self.emit_stage(now, EventType::StageStopped, si, None);
            }
        }
    }

    /// Recounts everything from scratch and compares it with the incremental state: counters,
    /// ceilings, stage order, and that no slot is idle while a startable member waits. O(members);
    /// for tests, after [`Engine::settle`].
    pub fn check_invariants(&self, now: Time) -> Result<(), String> {
        let mut run_in_flight = 0;
        for (si, stage) in self.stages.iter().enumerate() {
            let mut stage_in_flight = 0;
            let mut stage_failures = 0;
            for &g in &stage.groups {
                let group = &self.groups[g as usize];
                let states: Vec<State> = group
                    .members
                    .iter()
                    .map(|&m| self.members[m as usize].state)
                    .collect();
                let in_flight = states.iter().filter(|s| **s == State::Running).count() as u64;
                let unfinished = states.iter().filter(|s| !s.is_terminal()).count() as u64;
                let pending = states.iter().filter(|s| **s == State::Pending).count() as u64;
                let failed = states.iter().filter(|s| **s == State::Failed).count() as u64;
                if in_flight != group.in_flight
                    || unfinished != group.unfinished
                    || pending != group.pending
                {
                    return Err(format!(
                        "group {}: counted in_flight {in_flight}, unfinished {unfinished}, pending {pending}; kept {}, {}, {}",
                        group.name, group.in_flight, group.unfinished, group.pending
                    ));
                }
                if in_flight > group.max_concurrency {
                    return Err(format!(
                        "group {}: {in_flight} in flight over its ceiling {}",
                        group.name, group.max_concurrency
                    ));
                }
                if self.group_failures[g as usize] > failed {
                    return Err(format!(
                        "group {}: failure count {} but {failed} failed members",
                        group.name, self.group_failures[g as usize]
                    ));
                }
                for &(class, m) in &group.ready {
                    let member = &self.members[m as usize];
                    if member.state != State::NotStarted || member.place != Place::Queued(class) {
                        return Err(format!(
                            "member {} is queued but {:?} at {:?}",
                            member.name, member.state, member.place
                        ));
                    }
                }
                stage_in_flight += in_flight;
                stage_failures += self.group_failures[g as usize];
            }
            if stage_in_flight != stage.in_flight || stage_in_flight > stage.max_concurrency {
                return Err(format!(
                    "stage {}: {stage_in_flight} in flight, kept {}, ceiling {}",
                    stage.name, stage.in_flight, stage.max_concurrency
                ));
            }
            if stage_failures != stage.failure_count {
                return Err(format!(
                    "stage {}: groups count {stage_failures} failures, the stage {}",
                    stage.name, stage.failure_count
                ));
            }
            if stage.phase != Phase::NotStarted && si > 0 {
                let before = &self.stages[si - 1];
                if !matches!(
                    before.outcome,
                    Some(State::Completed) | Some(State::Skipped)
                ) {
                    return Err(format!(
                        "stage {} started while {} is {:?}",
                        stage.name, before.name, before.outcome
                    ));
                }
            }
            run_in_flight += stage_in_flight;
        }
        if run_in_flight != self.in_flight {
            return Err(format!(
                "run: {run_in_flight} in flight, kept {}",
                self.in_flight
            ));
        }
        if self.failure_count != self.stages.iter().map(|s| s.failure_count).sum::<u64>() {
            return Err("run failure count is not the sum of its stages'".into());
        }
        if self.phase == RunPhase::Running {
            self.check_reaching(now)?;
        }
        Ok(())
    }

    /// In a running run's current stage: every member that has not started is queued in its
    /// class or parked as Pending for a reason that still holds, and no slot is idle while a
    /// member waits to be reached (SEMANTICS §1, §3).
    fn check_reaching(&self, now: Time) -> Result<(), String> {
        let Some(stage) = self.stages.get(self.current) else {
            return Ok(());
        };
        for &g in &stage.groups {
            let group = &self.groups[g as usize];
            let active = stage.phase == Phase::Active
                && group.phase == Phase::Active
                && group.outcome.is_none()
                && !group.user_skipped;
            for &m in &group.members {
                let member = &self.members[m as usize];
                let name = &member.name;
                match (member.state, member.place) {
                    (State::Pending, Place::Parked) => {
                        if !matches!(self.decide(m, now), Decision::Upgrade(_)) {
                            return Err(format!(
                                "member {name} is Pending although it is decided without an upgrade"
                            ));
                        }
                        if matches!(self.readiness(m, now), Readiness::Ready) {
                            return Err(format!("member {name} is Pending but could start"));
                        }
                    }
                    (State::Pending, place) => {
                        return Err(format!("member {name} is Pending but {place:?}"));
                    }
                    (State::NotStarted, Place::Queued(class))
                        if class != self.class_of(m, now).0 =>
                    {
                        return Err(format!("member {name} is queued in a stale class {class}"));
                    }
                    (State::NotStarted, Place::Queued(_)) => {}
                    (State::NotStarted, Place::Nowhere) if active => {
                        return Err(format!("member {name} of an active group is never reached"));
                    }
                    (state, place @ (Place::Parked | Place::Queued(_))) => {
                        return Err(format!(
                            "member {name} is {state:?} but placed at {place:?}"
                        ));
                    }
                    _ => {}
                }
            }
            if active
                && !group.ready.is_empty()
                && group.in_flight < group.max_concurrency
                && stage.in_flight < stage.max_concurrency
            {
                return Err(format!(
                    "group {}: a slot is idle while a member waits to be reached",
                    group.name
                ));
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Status.

    fn run_state(&self) -> State {
        match self.phase {
            RunPhase::Running => match self.stages.get(self.current) {
                Some(_) if self.stage_state(self.current) == State::Pending => State::Pending,
                _ => State::Running,
            },
            other => self.state_of_phase(other),
        }
    }

    fn group_state(&self, g: u32) -> State {
        let group = &self.groups[g as usize];
        if let Some(outcome) = group.outcome {
            return outcome;
        }
        if group.stopped {
            return State::Stopped;
        }
        match group.phase {
            Phase::NotStarted => State::NotStarted,
            Phase::BeforeGates => State::Pending,
            Phase::Active => {
                if group.in_flight > 0 || !group.ready.is_empty() {
                    State::Running
                } else if group.pending > 0 {
                    State::Pending
                } else {
                    State::Running
                }
            }
            Phase::AfterGates => {
                if group.after.iter().any(|g| g.state == State::Pending) {
                    State::Pending
                } else {
                    State::Running
                }
            }
        }
    }

    fn stage_state(&self, si: usize) -> State {
        let stage = &self.stages[si];
        if let Some(outcome) = stage.outcome {
            return outcome;
        }
        if stage.stopped {
            return State::Stopped;
        }
        match stage.phase {
            Phase::NotStarted => State::NotStarted,
            Phase::BeforeGates => State::Pending,
            Phase::Active => {
                let states: Vec<State> =
                    stage.groups.iter().map(|&g| self.group_state(g)).collect();
                if states.contains(&State::Running) {
                    State::Running
                } else if states.contains(&State::Pending) {
                    State::Pending
                } else {
                    State::Running
                }
            }
            Phase::AfterGates => {
                if stage.after.iter().any(|g| g.state == State::Pending) {
                    State::Pending
                } else {
                    State::Running
                }
            }
        }
    }

    fn gate_status(gates: &[GateRt]) -> Vec<GateStatus> {
        gates
            .iter()
            .map(|g| GateStatus {
                display_name: g.gate.display_name.clone(),
                gate_id: g.id.clone(),
                status: UpdateStatus {
                    start_time: g.start,
                    completed_time: g.completed,
                    state: g.state,
                    error: None,
                },
            })
            .collect()
    }

    /// The run's status tree as the API shows it. O(members): call it to render, not per event.
    pub fn status(&self) -> UpdateRunStatus {
        let stages = self
            .stages
            .iter()
            .enumerate()
            .map(|(si, stage)| StageStatus {
                status: UpdateStatus {
                    start_time: stage.start,
                    completed_time: stage.completed,
                    state: self.stage_state(si),
                    error: stage.error.clone(),
                },
                name: stage.name.clone(),
                failure_count: stage.failure_count,
                max_allowed_failures: stage.max_failures,
                max_concurrency: stage.max_concurrency,
                groups: stage
                    .groups
                    .iter()
                    .map(|&g| {
                        let group = &self.groups[g as usize];
                        GroupStatus {
                            status: UpdateStatus {
                                start_time: group.start,
                                completed_time: group.completed,
                                state: self.group_state(g),
                                error: group.error.clone(),
                            },
                            name: group.name.clone(),
                            failure_count: self.group_failures[g as usize],
                            max_allowed_failures: group.max_failures,
                            max_concurrency: group.max_concurrency,
                            members: group
                                .members
                                .iter()
                                .map(|&m| {
                                    let member = &self.members[m as usize];
                                    MemberStatus {
                                        status: UpdateStatus {
                                            start_time: member.start,
                                            completed_time: member.completed,
                                            state: member.state,
                                            error: member.error.clone(),
                                        },
                                        name: member.name.clone(),
                                        cluster_resource_id: member.cluster_resource_id.clone(),
                                        operation_id: member.operation_id.clone(),
                                        message: member.message.clone(),
                                    }
                                })
                                .collect(),
                            before_gates: Self::gate_status(&group.before),
                            after_gates: Self::gate_status(&group.after),
                            message: group.message.clone(),
                        }
                    })
                    .collect(),
                before_gates: Self::gate_status(&stage.before),
                after_gates: Self::gate_status(&stage.after),
                after_stage_wait_status: (stage.wait.seconds > 0).then_some(WaitStatus {
                    status: UpdateStatus {
                        start_time: stage.wait.start,
                        completed_time: stage.wait.completed,
                        state: stage.wait.state,
                        error: None,
                    },
                    wait_duration_in_seconds: stage.wait.seconds,
                }),
                message: stage.message.clone(),
            })
            .collect();
        UpdateRunStatus {
            status: UpdateStatus {
                start_time: self.run_start,
                completed_time: self.run_completed,
                state: self.run_state(),
                error: if self.phase == RunPhase::Failed {
                    self.stages.get(self.current).and_then(|s| s.error.clone())
                } else {
                    None
                },
            },
            stages,
            node_image_selection: self
                .selected_images
                .as_ref()
                .map(|s| NodeImageSelectionStatus {
                    selected_node_image_versions: s
                        .iter()
                        .map(|(family, v)| SelectedNodeImageVersion {
                            version: format!("{family}-{v}"),
                        })
                        .collect(),
                }),
            failure_count: self.failure_count,
        }
    }
}

/// Applies a finished upgrade to a cluster (the engine's own view until the next observation).
pub fn apply_target(cluster: &mut Cluster, target: &Target) {
    if let Some(v) = target.kubernetes_version {
        cluster.kubernetes_version = v;
    }
    for t in &target.node_images {
        if let Some(pool) = cluster.node_pools.iter_mut().find(|p| p.name == t.pool)
            && t.image > pool.image
        {
            pool.image = t.image.clone();
        }
    }
}

/// Whether a cluster is at a target (SEMANTICS §6, re-observation after a stop).
pub fn cluster_at(cluster: &Cluster, target: &Target) -> bool {
    target
        .kubernetes_version
        .is_none_or(|v| cluster.kubernetes_version == v)
        && target.node_images.iter().all(|t| {
            cluster
                .node_pools
                .iter()
                .any(|p| p.name == t.pool && p.image >= t.image)
        })
}
