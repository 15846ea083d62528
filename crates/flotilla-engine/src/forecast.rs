//! Forecasts (SEMANTICS §11): a fleet's runs simulated forward from their current state by the
//! same engine, with no cluster touched, to predict when each member of one run is upgraded and
//! when the run ends.
//!
//! The forecast runs a copy of the fleet engine (every run of the fleet, so other runs' locks,
//! gates and waits play out as they will) in virtual time: an upgrade sent finishes after the
//! member's expected duration and succeeds; an upgrade in flight finishes after its expected
//! duration counted from its start (never before now); an Approval gate is approved a fixed
//! delay after it is reached; windows, scheduled gates, waits and versions known to arrive
//! later are the engine's own. Pure and deterministic: same fleet, parameters and durations,
//! same forecast.
//!
//! What it assumes is part of the answer: `assumptions.approvals` says how Approval gates are
//! taken (`IfApprovedNow`: each one pending at `now`, and each reached later, is approved the
//! moment it is pending; `IfApprovedAfterDelay`: `approvalDelaySeconds` after), and
//! `assumptions.pendingGates` lists every gate pending at `now` with what is assumed of it.
//! Each stage and group says what its start waits for (`waitsFor`, [`Hold`]): only what
//! actually holds it, with the instant each hold is predicted to end.
//!
//! No predicted time is before `now`. Times before `now` are what already happened (a member
//! that finished, a stage that started). An upgrade in flight that has already run longer than
//! its expected duration is predicted to finish at `now` — the earliest it can — and is
//! reported `overdue`, never as a finish in the past; a forecast read later than it was
//! computed says so by its `computedAt`, and a reader shows a predicted time that has since
//! passed as overdue, not as a time to come.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::checks::Outcome;
use crate::engine::{Command, Input, OperationProgress, WaitReason, apply_target};
use crate::error::{ApiError, ErrorCode};
use crate::fleet_engine::{FleetCommand, FleetEngine, FleetEvent, FleetInput};
use crate::status::{EventType, GateStatus, State, UpdateRunStatus, UpdateStatus};
use crate::time::{SECONDS_PER_DAY, Time};

/// The median of some durations, the upper middle one of an even count (SEMANTICS §11: a
/// member's last five upgrades, the fleet's last fifty). `None` for none.
pub fn median(values: &[i64]) -> Option<i64> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied()
}

/// A forecast's parameters (API.md, "Health checks and forecasts").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForecastParams {
    /// How long after it is reached an Approval gate is taken to be approved.
    pub approval_delay_seconds: i64,
    /// The duration of an upgrade with nothing better to go on.
    pub default_duration_seconds: i64,
}

impl Default for ForecastParams {
    fn default() -> Self {
        ForecastParams {
            approval_delay_seconds: 0,
            default_duration_seconds: 1800,
        }
    }
}

/// Where a forecast stops looking: a run that has not ended a year on never ends, as far as
/// the forecast can tell (it waits for something that does not come).
const HORIZON_SECONDS: i64 = 366 * SECONDS_PER_DAY;

/// What the critical path goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum PathKind {
    Member,
    Gate,
    Wait,
    Window,
    Version,
    Lock,
    /// A freeze covering the member (SEMANTICS §12).
    Freeze,
    /// A disruption budget full in the member's partition (SEMANTICS §12).
    Budget,
}

/// One step of the critical path.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PathStep {
    pub kind: PathKind,
    pub name: String,
    pub from: Time,
    pub to: Time,
}

/// A forecast of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Forecast {
    pub computed_at: Time,
    /// When the run ends; `None` when it does not within a year (it waits for a version that
    /// never arrives, a window that never opens, another run that never lets go).
    pub completed: Option<Time>,
    /// The run's status at the end of the forecast: predicted times of every stage, group,
    /// gate, wait and member (members already finished keep their actual times).
    pub status: UpdateRunStatus,
    /// What each member waited for before it started, from now on.
    pub waits_for: BTreeMap<String, BTreeSet<WaitReason>>,
    /// The chain of members, waits, gates, windows and versions that decides the end, first
    /// to last.
    pub critical_path: Vec<PathStep>,
    /// What each stage's start waits for, by stage name (only what actually holds it).
    pub stage_holds: BTreeMap<String, Vec<Hold>>,
    /// What each group's start waits for, by (stage, group).
    pub group_holds: BTreeMap<(String, String), Vec<Hold>>,
    /// The gates pending at `now`, with what the forecast assumes of each.
    pub pending_gates: Vec<PendingGate>,
    /// Members in flight whose upgrade has run longer than expected: predicted to finish at
    /// `now`, not before.
    pub overdue: BTreeSet<String>,
}

/// What holds a stage's or group's start in a forecast.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum HoldKind {
    /// An Approval gate not approved yet; assumed approved as `assumptions.approvals` says.
    Approval,
    /// A scheduled-start gate: it opens at its time.
    ScheduledStart,
    /// A HealthCheck gate: its checks are assumed to pass.
    HealthCheck,
    /// The wait after the previous stage.
    Wait,
    /// The previous stage's members, still upgrading (`until`: when the last one ends).
    Stage,
    /// Members of the stage or group wait for their maintenance window.
    Window,
    /// Members wait for their target version to arrive in their region.
    Version,
    /// Members are held by another run.
    Lock,
    /// Members are covered by a freeze (SEMANTICS §12).
    Freeze,
    /// Members wait for room in a disruption budget (SEMANTICS §12).
    Budget,
    /// Members wait for their readiness checks.
    Readiness,
}

/// One thing a stage's or group's start waits for, and when it is predicted to end (`None`:
/// not within the forecast's year).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    pub kind: HoldKind,
    /// The gate, for a gate's hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// A gate's state at `now` (`Pending`, or `NotStarted` for one not reached yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// The stage whose end or wait holds it, for `Stage` and `Wait`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// How many members wait, for a member's hold (`Window`, `Freeze`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<usize>,
    /// When the hold is predicted to end; never before `now`.
    pub until: Option<Time>,
}

impl Hold {
    fn new(kind: HoldKind, until: Option<Time>) -> Hold {
        Hold {
            kind,
            gate_id: None,
            display_name: None,
            state: None,
            stage: None,
            members: None,
            until,
        }
    }
}

/// A gate pending at `now`, and what the forecast assumes of it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingGate {
    pub gate_id: String,
    #[serde(rename = "type")]
    pub gate_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// `ApprovedNow`, `ApprovedAfterDelay`, `OpensAtItsTime` or `ChecksPass`.
    pub assumed: &'static str,
    /// When the forecast has it completed; `None`: not within a year.
    pub until: Option<Time>,
}

/// `assumptions.approvals`: how a forecast takes Approval gates.
pub fn approvals_assumed(params: &ForecastParams) -> &'static str {
    if params.approval_delay_seconds == 0 {
        "IfApprovedNow"
    } else {
        "IfApprovedAfterDelay"
    }
}

/// A member's waits for a reason, from when to when.
type Waited = Vec<(WaitReason, Time, Time)>;

/// Things that happen at an instant in the forecast, in the order they are applied.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// An upgrade finishes (run, member, attempt).
    Finish(String, String, u64),
    /// A member re-attaching after a stop is observed once its operation has ended.
    Reattached(String, String, u64),
    /// An Approval gate is approved (run, gate id).
    Approve(String, String),
}

/// Forecasts run `run` of `fleet` from `now`. `duration(run, member)` is the expected duration
/// of the member's upgrade in that run, in seconds (the shell's history, the driver's
/// expectation, or the default). A run that has not started is started at `now`.
pub fn forecast(
    fleet: &FleetEngine,
    run: &str,
    now: Time,
    params: &ForecastParams,
    duration: &dyn Fn(&str, &str) -> i64,
) -> Result<Forecast, ApiError> {
    let Some(engine) = fleet.run(run) else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("update run {run:?} does not exist"),
            "updateRun",
        ));
    };
    if engine.is_finished() {
        return Err(ApiError::conflict(format!(
            "update run {run:?} has ended ({:?}); there is nothing to forecast",
            engine.state()
        )));
    }
    // The gates as they stand now: reached (`Pending`) or over; the others are not reached.
    let gates_now: BTreeMap<String, State> = engine
        .gate_views()
        .into_iter()
        .map(|g| (g.id, g.state))
        .collect();
    // The groups under way now (past their gates); the others are held by what comes first.
    let under_way: BTreeSet<(String, String)> = engine
        .status_skeleton()
        .stages
        .into_iter()
        .flat_map(|s| {
            let stage = s.name;
            s.groups
                .into_iter()
                .filter(|g| !matches!(g.status.state, State::NotStarted | State::Pending))
                .map(move |g| (stage.clone(), g.name))
        })
        .collect();
    let mut sim = fleet.clone().without_journal();
    if engine.state() == State::NotStarted {
        let input = FleetInput::Run {
            run: run.to_string(),
            input: Input::Start,
        };
        sim.handle(now, input)?;
    }
    let ended = |sim: &FleetEngine| sim.run(run).is_none_or(|e| e.is_finished());
    let Forward {
        sim,
        waited,
        overdue,
    } = forward(sim, now, params, duration, Some(run), &ended);
    let engine = sim
        .run(run)
        .ok_or_else(|| ApiError::conflict("the run left the forecast"))?;
    let status = engine.status();
    let completed = engine
        .is_finished()
        .then_some(status.status.completed_time)
        .flatten();
    let waits_for = waits_for(&status, &waited, now);
    let critical_path = critical_path(&status, &waited, now);
    let gates = Gates {
        types: engine.gate_types(),
        now: gates_now,
        under_way,
    };
    let (stage_holds, group_holds) = holds(&status, &waited, &gates, now);
    let pending_gates = pending_gates(&status, &gates, params);
    Ok(Forecast {
        computed_at: now,
        completed,
        status,
        waits_for,
        critical_path,
        stage_holds,
        group_holds,
        pending_gates,
        overdue: overdue
            .into_iter()
            .filter(|(r, _)| r == run)
            .map(|(_, m)| m)
            .collect(),
    })
}

/// When each moving run of the fleet ends (SEMANTICS §11, a running run's
/// `forecast.completedTime`): one forward simulation of all of them together. A run that does
/// not end within a year maps to `None`. Runs not started, stopped or ended are left out.
pub fn completions(
    fleet: &FleetEngine,
    now: Time,
    params: &ForecastParams,
    duration: &dyn Fn(&str, &str) -> i64,
) -> BTreeMap<String, Option<Time>> {
    let moving: Vec<String> = fleet
        .run_names()
        .filter(|name| {
            fleet.run(name).is_some_and(|e| {
                !e.is_finished() && !matches!(e.state(), State::NotStarted | State::Stopped)
            })
        })
        .map(String::from)
        .collect();
    if moving.is_empty() {
        return BTreeMap::new();
    }
    let ended = |sim: &FleetEngine| {
        moving
            .iter()
            .all(|r| sim.run(r).is_none_or(|e| e.is_finished()))
    };
    let sim = fleet.clone().without_journal();
    let Forward { sim, .. } = forward(sim, now, params, duration, None, &ended);
    moving
        .into_iter()
        .map(|run| {
            let end = sim
                .run(&run)
                .filter(|e| e.is_finished())
                .and_then(|e| e.status_skeleton().status.completed_time);
            (run, end)
        })
        .collect()
}

/// A fleet engine run forward, and what the focused run's members waited for.
struct Forward {
    sim: FleetEngine,
    waited: BTreeMap<String, Waited>,
    /// (run, member) in flight past their expected duration at `now`.
    overdue: BTreeSet<(String, String)>,
}

/// Runs `sim` (a copy of a fleet engine) forward in virtual time from `now` until `ended` says
/// so or a year has passed: upgrades finish after their expected durations and succeed,
/// Approval gates are approved `approvalDelaySeconds` after they are reached. The waits of the
/// members of run `focus` are recorded.
fn forward(
    mut sim: FleetEngine,
    now: Time,
    params: &ForecastParams,
    duration: &dyn Fn(&str, &str) -> i64,
    focus: Option<&str>,
    ended: &dyn Fn(&FleetEngine) -> bool,
) -> Forward {
    let mut due: BinaryHeap<Reverse<(Time, u64, Due)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |due: &mut BinaryHeap<Reverse<(Time, u64, Due)>>, at: Time, what: Due| {
        seq += 1;
        due.push(Reverse((at, seq, what)));
    };
    // What is in flight now finishes after its expected duration, counted from its start.
    let names: Vec<String> = sim.run_names().map(String::from).collect();
    let mut overdue = BTreeSet::new();
    for name in &names {
        let Some(e) = sim.run(name) else { continue };
        let reattaching: BTreeSet<(String, u64)> = e.pending_observations().into_iter().collect();
        for (member, attempt, _) in e.operations_in_flight() {
            let started = e.operation_started(member).unwrap_or(now);
            let expected = Time(started.unix() + duration(name, member).max(0));
            if expected < now {
                overdue.insert((name.clone(), member.to_string()));
            }
            let end = expected.max(now);
            let what = if reattaching.contains(&(member.to_string(), attempt)) {
                Due::Reattached(name.clone(), member.to_string(), attempt)
            } else {
                Due::Finish(name.clone(), member.to_string(), attempt)
            };
            push(&mut due, end, what);
        }
        for gate in e.gate_views() {
            if gate.gate_type == "Approval" && gate.state == State::Pending {
                let at = Time(now.unix() + params.approval_delay_seconds.max(0));
                push(&mut due, at, Due::Approve(name.clone(), gate.id));
            }
        }
    }
    let horizon = Time(now.unix() + HORIZON_SECONDS);
    let mut pending: BTreeMap<String, (WaitReason, Time)> = BTreeMap::new();
    let mut waited: BTreeMap<String, Waited> = BTreeMap::new();
    let focused = |r: &str| focus == Some(r);
    let mut t = now;
    loop {
        while let Some(Reverse((at, _, _))) = due.peek() {
            if *at > t {
                break;
            }
            let Some(Reverse((_, _, what))) = due.pop() else {
                break;
            };
            let (run_name, input) = match what {
                Due::Finish(r, member, attempt) => (
                    r,
                    Input::OperationFinished {
                        member,
                        attempt,
                        outcome: Ok(()),
                    },
                ),
                Due::Reattached(r, member, attempt) => {
                    let Some(e) = sim.run(&r) else { continue };
                    let (Some(target), Some(cluster)) =
                        (e.member_target(&member), e.cluster_of(&member))
                    else {
                        continue;
                    };
                    let mut cluster = (**cluster).clone();
                    apply_target(&mut cluster, &target);
                    let input = Input::Observed {
                        member,
                        cluster: Arc::new(cluster),
                        operation: Some((attempt, OperationProgress::NotRunning)),
                    };
                    (r, input)
                }
                Due::Approve(r, id) => (
                    r,
                    Input::ApproveGateById {
                        id,
                        by: "forecast".into(),
                    },
                ),
            };
            // An input the run no longer takes (a gate skipped meanwhile) changes nothing.
            let _ = sim.handle(
                t,
                FleetInput::Run {
                    run: run_name,
                    input,
                },
            );
        }
        sim.advance_clock(t);
        sim.settle(t);
        loop {
            let mut answered = false;
            while let Some(FleetCommand { run: r, command }) = sim.poll_command() {
                let input = match command {
                    Command::StartUpgrade {
                        member, attempt, ..
                    } => {
                        let end = Time(t.unix() + duration(&r, &member).max(0));
                        push(
                            &mut due,
                            end,
                            Due::Finish(r.clone(), member.clone(), attempt),
                        );
                        Input::OperationAccepted {
                            member,
                            attempt,
                            operation_id: format!("forecast-{attempt}"),
                        }
                    }
                    // A stopped run started again: nothing is running on its members.
                    Command::Observe { member, attempt } => {
                        let Some(cluster) = sim.cluster(&member).cloned() else {
                            continue;
                        };
                        answered = true;
                        Input::Observed {
                            member,
                            cluster: Arc::new(cluster),
                            operation: Some((attempt, OperationProgress::NotRunning)),
                        }
                    }
                    // Checks are assumed to pass, each at once: a soak lasts its soakSeconds.
                    Command::Evaluate {
                        subject,
                        round,
                        checks,
                        ..
                    } => {
                        answered = true;
                        let assumed = |_: &crate::checks::Check| Outcome::Verdict {
                            passed: true,
                            value: "assumed to pass".into(),
                        };
                        for input in crate::engine::answers(&subject, round, &checks, assumed) {
                            let _ = sim.handle(
                                t,
                                FleetInput::Run {
                                    run: r.clone(),
                                    input,
                                },
                            );
                        }
                        continue;
                    }
                };
                let _ = sim.handle(t, FleetInput::Run { run: r, input });
            }
            if !answered {
                break;
            }
            sim.settle(t);
        }
        while let Some(FleetEvent { run: r, event }) = sim.poll_event() {
            match event.kind {
                EventType::GatePending => {
                    let Some(id) = event.gate else { continue };
                    let approval = sim.run(&r).is_some_and(|e| {
                        e.gate_views()
                            .iter()
                            .any(|g| g.id == id && g.gate_type == "Approval")
                    });
                    if approval {
                        let at = Time(t.unix() + params.approval_delay_seconds.max(0));
                        push(&mut due, at, Due::Approve(r, id));
                    }
                }
                EventType::MemberPending if focused(&r) => {
                    let Some(member) = event.member else { continue };
                    let reason = sim.run(&r).and_then(|e| e.waiting_for(&member, t));
                    if let Some(reason) = reason {
                        close(&mut pending, &mut waited, &member, t);
                        pending.insert(member, (reason, t));
                    }
                }
                EventType::MemberStarted
                | EventType::MemberSkipped
                | EventType::MemberFailed
                | EventType::MemberSucceeded
                    if focused(&r) =>
                {
                    if let Some(member) = event.member {
                        close(&mut pending, &mut waited, &member, t);
                    }
                }
                _ => {}
            }
        }
        let finished = ended(&sim);
        let next = [due.peek().map(|Reverse((at, ..))| *at), sim.next_wakeup()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(next) if !finished && next <= horizon => t = next.max(t),
            _ => break,
        }
    }
    // What members still wait for at the end (a version that never comes, say) is what they
    // wait for.
    let open: Vec<String> = pending.keys().cloned().collect();
    for member in open {
        close(&mut pending, &mut waited, &member, t);
    }
    Forward {
        sim,
        waited,
        overdue,
    }
}

/// Ends a member's open wait at `t`.
fn close(
    pending: &mut BTreeMap<String, (WaitReason, Time)>,
    waited: &mut BTreeMap<String, Waited>,
    member: &str,
    t: Time,
) {
    if let Some((reason, from)) = pending.remove(member) {
        waited
            .entry(member.to_string())
            .or_default()
            .push((reason, from, t));
    }
}

fn started_after(status: &UpdateStatus, now: Time, by: Time) -> bool {
    status.completed_time.is_some_and(|c| c > now && c <= by)
}

/// What each member that had not started at `now` waited for: its own waits (window,
/// version, lock), a gate or a stage's wait that ended after `now` and by its start, and a
/// slot when it started after its group did with nothing else holding it at that instant.
fn waits_for(
    status: &UpdateRunStatus,
    waited: &BTreeMap<String, Waited>,
    now: Time,
) -> BTreeMap<String, BTreeSet<WaitReason>> {
    let mut out = BTreeMap::new();
    let mut previous_wait: Option<&UpdateStatus> = None;
    for stage in &status.stages {
        for group in &stage.groups {
            for m in &group.members {
                let mut reasons: BTreeSet<WaitReason> = BTreeSet::new();
                let own = waited.get(&m.name).map(Vec::as_slice).unwrap_or_default();
                let Some(start) = m.status.start_time.filter(|s| *s > now) else {
                    // Never started within the forecast: what it was still waiting for.
                    if m.status.start_time.is_none() {
                        reasons.extend(own.iter().map(|(r, ..)| *r));
                    }
                    out.insert(m.name.clone(), reasons);
                    continue;
                };
                reasons.extend(own.iter().map(|(r, ..)| *r));
                let gates = stage.before_gates.iter().chain(&group.before_gates);
                if gates
                    .into_iter()
                    .any(|g| started_after(&g.status, now, start))
                {
                    reasons.insert(WaitReason::Gate);
                }
                if previous_wait.is_some_and(|w| started_after(w, now, start)) {
                    reasons.insert(WaitReason::Wait);
                }
                let held_until_start = own.iter().any(|(_, _, to)| *to == start);
                if group.status.start_time.is_some_and(|g| start > g) && !held_until_start {
                    reasons.insert(WaitReason::Slot);
                }
                out.insert(m.name.clone(), reasons);
            }
        }
        previous_wait = stage.after_stage_wait_status.as_ref().map(|w| &w.status);
    }
    out
}

/// Whether something that starts at `start` and ends at `end` (predicted) is not over at `now`.
fn open_at(start: Option<Time>, end: Option<Time>, now: Time) -> bool {
    start.is_none_or(|s| s > now) || end.is_none_or(|e| e > now)
}

/// The run's gates: each one's type, and the state of those reached at `now`.
struct Gates {
    types: BTreeMap<String, &'static str>,
    now: BTreeMap<String, State>,
    /// (stage, group) of the groups under way at `now`.
    under_way: BTreeSet<(String, String)>,
}

impl Gates {
    fn type_of(&self, id: &str) -> &'static str {
        self.types.get(id).copied().unwrap_or("Approval")
    }
}

/// A hold for each gate of `list` not over at `now`.
fn gate_holds<'a>(list: impl Iterator<Item = &'a GateStatus>, gates: &Gates, out: &mut Vec<Hold>) {
    for g in list {
        let state = gates
            .now
            .get(&g.gate_id)
            .copied()
            .unwrap_or(State::NotStarted);
        if state.is_terminal() {
            continue;
        }
        let kind = match gates.type_of(&g.gate_id) {
            "ScheduledStart" => HoldKind::ScheduledStart,
            "HealthCheck" => HoldKind::HealthCheck,
            _ => HoldKind::Approval,
        };
        out.push(Hold {
            gate_id: Some(g.gate_id.clone()),
            display_name: g.display_name.clone(),
            state: Some(state),
            ..Hold::new(kind, g.status.completed_time)
        });
    }
}

/// The members' own waits after `now` (window, version, lock, freeze, budget, readiness), one
/// hold per reason: how many members, until the last of them ends.
fn member_holds<'a>(
    members: impl Iterator<Item = &'a crate::status::MemberStatus>,
    waited: &BTreeMap<String, Waited>,
    now: Time,
    out: &mut Vec<Hold>,
) {
    let mut by: BTreeMap<HoldKind, (usize, Option<Time>)> = BTreeMap::new();
    for m in members {
        if m.status.start_time.is_some_and(|s| s <= now) {
            continue;
        }
        let never_started = m.status.start_time.is_none();
        let mut seen = BTreeSet::new();
        for (reason, _, to) in waited.get(&m.name).map(Vec::as_slice).unwrap_or_default() {
            let kind = match reason {
                WaitReason::Window => HoldKind::Window,
                WaitReason::Version => HoldKind::Version,
                WaitReason::Lock => HoldKind::Lock,
                WaitReason::Freeze => HoldKind::Freeze,
                WaitReason::Budget => HoldKind::Budget,
                WaitReason::Readiness => HoldKind::Readiness,
                _ => continue,
            };
            let entry = by.entry(kind).or_insert((0, Some(now)));
            if seen.insert(kind) {
                entry.0 += 1;
            }
            // A member still waiting when the forecast stopped waits past its year.
            let end = (!never_started).then_some(*to);
            entry.1 = match (entry.1, end) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
    }
    for (kind, (count, until)) in by {
        out.push(Hold {
            members: Some(count),
            ..Hold::new(kind, until)
        });
    }
}

/// What each stage's and group's start waits for (SEMANTICS §11, "the assumptions used"): for
/// one that has not started by `now`, the gates before it not over (the previous stage's
/// after-gates, its own before-gates), the previous stage's wait and the previous stage itself
/// while they last; for every one, what its members not started yet wait for on their own.
#[allow(clippy::type_complexity)]
fn holds(
    status: &UpdateRunStatus,
    waited: &BTreeMap<String, Waited>,
    gates: &Gates,
    now: Time,
) -> (
    BTreeMap<String, Vec<Hold>>,
    BTreeMap<(String, String), Vec<Hold>>,
) {
    let mut stages = BTreeMap::new();
    let mut groups = BTreeMap::new();
    let mut previous: Option<&crate::status::StageStatus> = None;
    for stage in &status.stages {
        let mut out = Vec::new();
        // A stage at its before-gates has a start time; it starts, for what holds it, when its
        // first group is under way.
        let under_way = |group: &str| {
            gates
                .under_way
                .contains(&(stage.name.clone(), group.into()))
        };
        if !stage.groups.iter().any(|g| under_way(&g.name)) {
            if let Some(p) = previous {
                if open_at(p.status.start_time, p.status.completed_time, now)
                    && p.status.state != State::Skipped
                {
                    // Its members' end (the stage itself ends after its wait and gates).
                    let ends: Option<Vec<Time>> = p
                        .groups
                        .iter()
                        .flat_map(|g| &g.members)
                        .map(|m| m.status.completed_time)
                        .collect();
                    let until = match ends {
                        Some(ends) => ends.into_iter().max().or(p.status.completed_time),
                        None => None,
                    };
                    out.push(Hold {
                        stage: Some(p.name.clone()),
                        ..Hold::new(HoldKind::Stage, until)
                    });
                }
                gate_holds(p.after_gates.iter(), gates, &mut out);
                if let Some(w) = &p.after_stage_wait_status
                    && w.status.state != State::Skipped
                    && open_at(w.status.start_time, w.status.completed_time, now)
                {
                    out.push(Hold {
                        stage: Some(p.name.clone()),
                        ..Hold::new(HoldKind::Wait, w.status.completed_time)
                    });
                }
            }
            gate_holds(stage.before_gates.iter(), gates, &mut out);
        }
        member_holds(
            stage.groups.iter().flat_map(|g| &g.members),
            waited,
            now,
            &mut out,
        );
        for group in &stage.groups {
            let mut held = Vec::new();
            if !under_way(&group.name) {
                gate_holds(group.before_gates.iter(), gates, &mut held);
            }
            member_holds(group.members.iter(), waited, now, &mut held);
            groups.insert((stage.name.clone(), group.name.clone()), held);
        }
        stages.insert(stage.name.clone(), out);
        previous = Some(stage);
    }
    (stages, groups)
}

/// The gates pending at `now` and what the forecast assumes of each.
fn pending_gates(
    status: &UpdateRunStatus,
    gates: &Gates,
    params: &ForecastParams,
) -> Vec<PendingGate> {
    let mut out = Vec::new();
    for stage in &status.stages {
        let lists = [&stage.before_gates, &stage.after_gates].into_iter().chain(
            stage
                .groups
                .iter()
                .flat_map(|g| [&g.before_gates, &g.after_gates]),
        );
        for g in lists.flatten() {
            if gates.now.get(&g.gate_id) != Some(&State::Pending) {
                continue;
            }
            let gate_type = gates.type_of(&g.gate_id);
            let assumed = match gate_type {
                "ScheduledStart" => "OpensAtItsTime",
                "HealthCheck" => "ChecksPass",
                _ if params.approval_delay_seconds == 0 => "ApprovedNow",
                _ => "ApprovedAfterDelay",
            };
            out.push(PendingGate {
                gate_id: g.gate_id.clone(),
                gate_type,
                display_name: g.display_name.clone(),
                assumed,
                until: g.status.completed_time,
            });
        }
    }
    out
}

/// The chain that decides the run's end, walked back from it: the stage's wait and after-gates
/// ending last, the member finishing last, what held that member until it started (its own
/// wait, the member whose end gave it its slot), the gates before its group or stage, and so
/// on to the previous stage, until `now`.
fn critical_path(
    status: &UpdateRunStatus,
    waited: &BTreeMap<String, Waited>,
    now: Time,
) -> Vec<PathStep> {
    let mut path = Vec::new();
    let Some(mut cursor) = status.status.completed_time else {
        return path;
    };
    for stage in status.stages.iter().rev() {
        if cursor <= now {
            break;
        }
        if let Some(w) = &stage.after_stage_wait_status
            && w.status.completed_time == Some(cursor)
            && let Some(from) = w.status.start_time
        {
            path.push(PathStep {
                kind: PathKind::Wait,
                name: stage.name.clone(),
                from,
                to: cursor,
            });
            cursor = from;
        }
        back_over_gates(stage.after_gates.iter().rev(), &mut cursor, &mut path, now);
        let members: Vec<_> = stage.groups.iter().flat_map(|g| &g.members).collect();
        // The member of the stage that ends last, by the cursor.
        let mut current = members
            .iter()
            .filter(|m| m.status.completed_time.is_some_and(|c| c <= cursor))
            .filter(|m| m.status.start_time.is_some())
            .max_by_key(|m| m.status.completed_time);
        while let Some(m) = current {
            if cursor <= now {
                break;
            }
            let (Some(start), Some(end)) = (m.status.start_time, m.status.completed_time) else {
                break;
            };
            path.push(PathStep {
                kind: PathKind::Member,
                name: m.name.clone(),
                from: start,
                to: end,
            });
            cursor = start;
            if let Some((reason, from, _)) = waited
                .get(&m.name)
                .and_then(|w| w.iter().rev().find(|(_, _, to)| *to == start))
            {
                let kind = match reason {
                    WaitReason::Version => PathKind::Version,
                    WaitReason::Lock => PathKind::Lock,
                    WaitReason::Freeze => PathKind::Freeze,
                    WaitReason::Budget => PathKind::Budget,
                    _ => PathKind::Window,
                };
                path.push(PathStep {
                    kind,
                    name: m.name.clone(),
                    from: *from,
                    to: start,
                });
                cursor = *from;
            }
            // The member whose end freed the slot it took.
            current = members
                .iter()
                .filter(|o| o.name != m.name && o.status.completed_time == Some(cursor))
                .filter(|o| o.status.start_time.is_some_and(|s| s < cursor))
                .max_by_key(|o| o.status.start_time);
        }
        let gates = stage
            .groups
            .iter()
            .flat_map(|g| g.before_gates.iter().rev())
            .chain(stage.before_gates.iter().rev());
        back_over_gates(gates, &mut cursor, &mut path, now);
    }
    path.reverse();
    path
}

/// Steps back over the gates, last first, that ended at the cursor and after `now`.
fn back_over_gates<'a>(
    gates: impl Iterator<Item = &'a GateStatus>,
    cursor: &mut Time,
    path: &mut Vec<PathStep>,
    now: Time,
) {
    for g in gates {
        if g.status.completed_time == Some(*cursor)
            && *cursor > now
            && let Some(from) = g.status.start_time
        {
            path.push(PathStep {
                kind: PathKind::Gate,
                name: g.gate_id.clone(),
                from,
                to: *cursor,
            });
            *cursor = from;
        }
    }
}

impl Forecast {
    /// The forecast in the API's shape (API.md, "Health checks and forecasts").
    pub fn to_json(&self, params: &ForecastParams, durations: Value) -> Value {
        let times = |s: &UpdateStatus| (s.start_time, s.completed_time);
        let stages: Vec<Value> = self
            .status
            .stages
            .iter()
            .map(|stage| {
                let (start, end) = times(&stage.status);
                let groups: Vec<Value> = stage
                    .groups
                    .iter()
                    .map(|group| {
                        let (start, end) = times(&group.status);
                        let members: Vec<Value> = group
                            .members
                            .iter()
                            .map(|m| {
                                let (start, end) = times(&m.status);
                                let mut member = json!({
                                    "name": m.name,
                                    "state": m.status.state,
                                    "startTime": start,
                                    "completedTime": end,
                                    "waitsFor": self.waits_for.get(&m.name).cloned().unwrap_or_default(),
                                });
                                if self.overdue.contains(&m.name) {
                                    member["overdue"] = json!(true);
                                }
                                member
                            })
                            .collect();
                        let held = self
                            .group_holds
                            .get(&(stage.name.clone(), group.name.clone()))
                            .cloned()
                            .unwrap_or_default();
                        json!({"name": group.name, "startTime": start, "completedTime": end, "waitsFor": held, "members": members})
                    })
                    .collect();
                let held = self.stage_holds.get(&stage.name).cloned().unwrap_or_default();
                json!({"name": stage.name, "startTime": start, "completedTime": end, "waitsFor": held, "groups": groups})
            })
            .collect();
        json!({
            "completedTime": self.completed,
            "computedAt": self.computed_at,
            "stages": stages,
            "criticalPath": self.critical_path,
            "assumptions": {
                "approvals": approvals_assumed(params),
                "pendingGates": self.pending_gates,
                "checks": "Pass",
                "failures": "None",
                "durations": durations,
                "approvalDelaySeconds": params.approval_delay_seconds,
                "defaultDurationSeconds": params.default_duration_seconds,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_is_the_upper_middle() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[5]), Some(5));
        assert_eq!(median(&[9, 1, 5]), Some(5));
        assert_eq!(median(&[4, 1, 3, 2]), Some(3));
    }
}
