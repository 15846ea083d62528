//! Health and readiness checks (SEMANTICS §10): a member's soak after its upgrade, readiness
//! before its upgrade is sent, and HealthCheck gates. Each is a *watch*: rounds of evaluations
//! (every check at once, then every `intervalSeconds`) asked of the shell with
//! [`Command::Evaluate`] and answered with [`Input::CheckEvaluated`] at the instant each was
//! made. Watches exist only while the run is Running (a member's soak also while the run is
//! Failed, since it holds its slot like an upgrade in flight); results are kept for the status.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;
use crate::checks::{Checks, Context, Judgement, Outcome, judge};
use crate::status::CheckResult;

/// What a watch is for, by the engine's own indices.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub(super) enum Subject {
    Soak(u32),
    Readiness(u32),
    Gate(GateRef),
}

/// What a round of evaluations is for, as the shell sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CheckSubject {
    /// A member's health checks during its soak.
    Soak { member: String },
    /// A member's readiness checks before its upgrade.
    Readiness { member: String },
    /// A HealthCheck gate, by id.
    Gate { id: String },
}

/// The inputs that answer a round of evaluations ([`Command::Evaluate`]), one per check, with
/// the outcome `outcome` gives each (a simulator's script, a forecast's assumption).
pub fn answers(
    subject: &CheckSubject,
    round: u64,
    checks: &Checks,
    mut outcome: impl FnMut(&crate::checks::Check) -> Outcome,
) -> Vec<Input> {
    checks
        .checks
        .iter()
        .map(|check| Input::CheckEvaluated {
            subject: subject.clone(),
            round,
            check: check.name.clone(),
            outcome: outcome(check),
        })
        .collect()
}

/// One check's answer in the current round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Answer {
    #[default]
    Awaited,
    Passed,
    Failed,
    Unavailable,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Watch {
    /// When the watch began.
    since: Time,
    /// Since when every round has passed (a soak; a before-gate's streak, restarted by a
    /// failing round); `None` after a failing round of a before-gate.
    streak: Option<Time>,
    round: u64,
    round_at: Time,
    answers: Vec<Answer>,
    /// Per check: its last evaluation that could be made (or the watch's start).
    last_ok: Vec<Time>,
    /// Per check: why its last evaluation could not be made.
    last_error: Vec<Option<String>>,
    /// A readiness watch that passed: when (valid for one interval).
    passed_at: Option<Time>,
    /// The watch's wake-up in the engine's timers.
    timer: Option<Time>,
}

/// Every watch of the run and the results its status shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Health {
    next_round: u64,
    #[serde(with = "pairs")]
    watches: BTreeMap<Subject, Watch>,
    /// Per subject: the latest result of each check and every failing one.
    #[serde(with = "pairs")]
    shown: BTreeMap<Subject, Vec<CheckResult>>,
}

/// A map with keys JSON cannot name, written as a list of pairs.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, K: Serialize, V: Serialize>(
        map: &BTreeMap<K, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        Vec::<(K, V)>::deserialize(d).map(|pairs| pairs.into_iter().collect())
    }
}

/// Failing results a subject keeps for its status per check, besides its latest (the run's
/// event log keeps them all).
const FAILURES_SHOWN: usize = 20;

/// How a watch ended.
enum Verdict {
    Continue,
    Passed,
    Failed(String),
}

impl Health {
    pub(super) fn is_empty(&self) -> bool {
        self.next_round == 0 && self.watches.is_empty() && self.shown.is_empty()
    }

    pub(super) fn timers(&self) -> impl Iterator<Item = (Time, Subject)> + '_ {
        self.watches
            .iter()
            .filter_map(|(s, w)| Some((w.timer?, *s)))
    }

    pub(super) fn shown(&self, subject: Subject) -> &[CheckResult] {
        self.shown.get(&subject).map_or(&[], Vec::as_slice)
    }

    /// Whether `subject`'s watch holds one answer, time and error per check.
    pub(super) fn fits(&self, subject: Subject, checks: usize) -> bool {
        self.watches.get(&subject).is_none_or(|w| {
            w.answers.len() == checks && w.last_ok.len() == checks && w.last_error.len() == checks
        })
    }

    pub(super) fn watching(&self, subject: Subject) -> bool {
        self.watches.contains_key(&subject)
    }

    pub(super) fn subjects(&self) -> impl Iterator<Item = Subject> + '_ {
        self.watches.keys().copied()
    }

    fn show(&mut self, subject: Subject, result: CheckResult) {
        let list = self.shown.entry(subject).or_default();
        if let Some(i) = list
            .iter()
            .rposition(|r| r.name == result.name && r.passed != Some(false))
        {
            list.remove(i);
        }
        if result.passed == Some(false) {
            let failing = |r: &CheckResult| r.name == result.name && r.passed == Some(false);
            if list.iter().filter(|r| failing(r)).count() >= FAILURES_SHOWN
                && let Some(i) = list.iter().position(failing)
            {
                list.remove(i);
            }
        }
        list.push(result);
    }
}

impl Engine {
    /// The checks of a subject that may name a member or gate out of range (a checkpoint's).
    pub(super) fn checks_of_checked(&self, subject: Subject) -> Option<Arc<Checks>> {
        let in_range = match subject {
            Subject::Soak(m) | Subject::Readiness(m) => (m as usize) < self.members.len(),
            Subject::Gate(at) => {
                (at.stage as usize) < self.stages.len()
                    && at.group.is_none_or(|pos| {
                        (pos as usize) < self.stages[at.stage as usize].groups.len()
                    })
            }
        };
        if in_range {
            self.checks_of(subject)
        } else {
            None
        }
    }

    /// The first check of the run written before check providers, described for a message.
    pub(super) fn inline_check(&self) -> Option<String> {
        let inline = |checks: &Option<Arc<Checks>>| {
            checks.as_ref().and_then(|c| {
                c.checks.iter().find_map(|check| match &check.kind {
                    crate::checks::CheckKind::Inline { field } => {
                        Some(format!("check {:?} (it carries {field})", check.name))
                    }
                    _ => None,
                })
            })
        };
        let gates = |gates: &[GateRt]| {
            gates.iter().find_map(|g| match &g.gate.kind {
                GateKind::HealthCheck(checks) => inline(&Some(checks.clone())),
                _ => None,
            })
        };
        self.groups
            .iter()
            .find_map(|g| {
                inline(&g.member_health)
                    .or_else(|| inline(&g.readiness))
                    .or_else(|| gates(&g.before))
                    .or_else(|| gates(&g.after))
            })
            .or_else(|| {
                self.stages
                    .iter()
                    .find_map(|s| gates(&s.before).or_else(|| gates(&s.after)))
            })
    }

    /// The checks a subject evaluates.
    pub(super) fn checks_of(&self, subject: Subject) -> Option<Arc<Checks>> {
        match subject {
            Subject::Soak(m) => self.groups[self.members[m as usize].group as usize]
                .member_health
                .clone(),
            Subject::Readiness(m) => self.groups[self.members[m as usize].group as usize]
                .readiness
                .clone(),
            Subject::Gate(at) => {
                let (stage, group) = (at.stage as usize, at.group);
                let gates = match group {
                    None => self.stage_gates(stage, at.timing),
                    Some(pos) => {
                        self.group_gates(self.stages[stage].groups[pos as usize], at.timing)
                    }
                };
                match &gates.get(at.index as usize)?.gate.kind {
                    GateKind::HealthCheck(checks) => Some(checks.clone()),
                    _ => None,
                }
            }
        }
    }

    fn public_subject(&self, subject: Subject) -> CheckSubject {
        match subject {
            Subject::Soak(m) => CheckSubject::Soak {
                member: self.members[m as usize].name.to_string(),
            },
            Subject::Readiness(m) => CheckSubject::Readiness {
                member: self.members[m as usize].name.to_string(),
            },
            Subject::Gate(at) => CheckSubject::Gate {
                id: self.gate_id_of(at),
            },
        }
    }

    fn gate_id_of(&self, at: GateRef) -> String {
        let gates = match at.group {
            None => self.stage_gates(at.stage as usize, at.timing),
            Some(pos) => self.group_gates(
                self.stages[at.stage as usize].groups[pos as usize],
                at.timing,
            ),
        };
        gates
            .get(at.index as usize)
            .map(|g| g.id.clone())
            .unwrap_or_default()
    }

    fn private_subject(&self, subject: &CheckSubject) -> Option<Subject> {
        Some(match subject {
            CheckSubject::Soak { member } => {
                Subject::Soak(*self.member_index.get(member.as_str())?)
            }
            CheckSubject::Readiness { member } => {
                Subject::Readiness(*self.member_index.get(member.as_str())?)
            }
            CheckSubject::Gate { id } => Subject::Gate(self.find_gate_by_id(id)?),
        })
    }

    /// What the placeholders of a subject's checks stand for.
    fn context_of(&self, subject: Subject, checks: &Checks) -> Context {
        match subject {
            Subject::Soak(m) | Subject::Readiness(m) => {
                let member = &self.members[m as usize];
                let group = &self.groups[member.group as usize];
                Context {
                    run: self.run_name.clone(),
                    stage: self.stages[group.stage as usize].name.clone(),
                    group: Some(group.name.clone()),
                    member: Some(member.name.to_string()),
                    cluster_resource_id: Some(member.cluster_resource_id.to_string()),
                    region: Some(member.cluster.region.clone()),
                    members: Vec::new(),
                }
            }
            Subject::Gate(at) => {
                let stage = &self.stages[at.stage as usize];
                let groups: Vec<u32> = match at.group {
                    Some(pos) => vec![stage.groups[pos as usize]],
                    None => stage.groups.clone(),
                };
                Context {
                    run: self.run_name.clone(),
                    stage: stage.name.clone(),
                    group: at.group.map(|pos| {
                        self.groups[stage.groups[pos as usize] as usize]
                            .name
                            .clone()
                    }),
                    member: None,
                    cluster_resource_id: None,
                    region: None,
                    // Only for checks that name them: a stage may hold 100,000 members.
                    members: if checks.uses("{members}") {
                        groups
                            .iter()
                            .flat_map(|&g| self.groups[g as usize].members.iter())
                            .map(|&m| self.members[m as usize].name.to_string())
                            .collect()
                    } else {
                        Vec::new()
                    },
                }
            }
        }
    }

    fn set_watch_timer(&mut self, subject: Subject, at: Option<Time>) {
        let Some(watch) = self.health.watches.get_mut(&subject) else {
            return;
        };
        if let Some(old) = watch.timer.take() {
            self.timers.remove(&(old, TimerKey::Watch(subject)));
        }
        if let Some(t) = at {
            watch.timer = Some(t);
            self.timers.insert((t, TimerKey::Watch(subject)));
        }
    }

    /// Begins watching `subject` at `now` with a first round of evaluations.
    pub(super) fn begin_watch(&mut self, now: Time, subject: Subject) {
        let Some(checks) = self.checks_of(subject) else {
            return;
        };
        self.end_watch(subject);
        let n = checks.checks.len();
        self.health.watches.insert(
            subject,
            Watch {
                since: now,
                streak: Some(now),
                round: 0,
                round_at: now,
                answers: vec![Answer::Awaited; n],
                last_ok: vec![now; n],
                last_error: vec![None; n],
                passed_at: None,
                timer: None,
            },
        );
        self.begin_round(now, subject, &checks);
    }

    /// Stops watching `subject`; its results stay shown.
    pub(super) fn end_watch(&mut self, subject: Subject) {
        self.set_watch_timer(subject, None);
        self.health.watches.remove(&subject);
    }

    /// Ends the watches of gates and readiness (a run that stops or fails evaluates nothing
    /// new; a start or retry begins them again). Soaks go on: they hold their slots.
    pub(super) fn end_dormant_watches(&mut self) {
        let ended: Vec<Subject> = self
            .health
            .subjects()
            .filter(|s| !matches!(s, Subject::Soak(_)))
            .collect();
        for s in ended {
            self.end_watch(s);
        }
    }

    fn begin_round(&mut self, now: Time, subject: Subject, checks: &Arc<Checks>) {
        let round = self.health.next_round;
        self.health.next_round += 1;
        let Some(watch) = self.health.watches.get_mut(&subject) else {
            return;
        };
        watch.round = round;
        watch.round_at = now;
        watch.answers.fill(Answer::Awaited);
        let wake = self.watch_wakeup(subject, checks);
        self.set_watch_timer(subject, wake);
        let context = self.context_of(subject, checks);
        self.commands.push_back(Command::Evaluate {
            subject: self.public_subject(subject),
            round,
            checks: checks.clone(),
            context,
        });
    }

    /// When a watch must be looked at again: its next round, or the end of its soak or its
    /// timeout if sooner.
    fn watch_wakeup(&self, subject: Subject, checks: &Checks) -> Option<Time> {
        let watch = self.health.watches.get(&subject)?;
        let mut at = watch.round_at.plus(checks.interval_seconds);
        let soak_end = watch.streak.map(|s| s.plus(checks.soak_seconds));
        if let Some(end) = soak_end
            && end > watch.round_at
            && !matches!(subject, Subject::Readiness(_))
        {
            at = at.min(end);
        }
        let deadline = watch.since.plus(checks.timeout_seconds);
        if self.times_out(subject) && deadline > watch.round_at {
            at = at.min(deadline);
        }
        Some(at)
    }

    fn times_out(&self, subject: Subject) -> bool {
        match subject {
            Subject::Readiness(_) => true,
            Subject::Gate(at) => at.timing == Timing::Before,
            Subject::Soak(_) => false,
        }
    }

    /// An evaluation's result at `now`. A result of a round that is over, or for a subject no
    /// longer watched, changes nothing.
    pub(super) fn check_evaluated(
        &mut self,
        now: Time,
        subject: &CheckSubject,
        round: u64,
        check: &str,
        outcome: &Outcome,
    ) {
        let Some(subject) = self.private_subject(subject) else {
            return;
        };
        let Some(checks) = self.checks_of(subject) else {
            return;
        };
        let Some(i) = checks.checks.iter().position(|c| c.name == check) else {
            return;
        };
        let Some(watch) = self.health.watches.get_mut(&subject) else {
            return;
        };
        if watch.round != round || watch.answers[i] != Answer::Awaited {
            return;
        }
        let Judgement {
            passed,
            value,
            message,
        } = judge(&checks.checks[i], outcome);
        watch.answers[i] = match passed {
            Some(true) => Answer::Passed,
            Some(false) => Answer::Failed,
            None => Answer::Unavailable,
        };
        if passed.is_some() {
            watch.last_ok[i] = now;
            watch.last_error[i] = None;
        } else if let Outcome::Unavailable(why) = outcome {
            watch.last_error[i] = Some(why.clone());
        }
        self.health.show(
            subject,
            CheckResult {
                name: check.to_string(),
                time: now,
                value,
                passed,
                message: Some(message.clone()),
            },
        );
        self.emit_check(now, subject, message);
        self.assess(now, subject, &checks);
    }

    fn emit_check(&mut self, now: Time, subject: Subject, message: String) {
        match subject {
            Subject::Soak(m) | Subject::Readiness(m) => {
                self.touch(m);
                self.emit_member(now, EventType::HealthCheckEvaluated, m, Some(message));
            }
            Subject::Gate(at) => {
                self.quiet_changes += 1;
                self.emit_gate(now, EventType::HealthCheckEvaluated, at, Some(message));
            }
        }
    }

    /// A watch's timer: its verdict as of now, then its next round if it goes on.
    pub(super) fn watch_due(&mut self, now: Time, subject: Subject) {
        if let Some(watch) = self.health.watches.get_mut(&subject) {
            watch.timer = None;
        }
        let Some(checks) = self.checks_of(subject) else {
            return;
        };
        let Some(watch) = self.health.watches.get(&subject) else {
            return;
        };
        // A round due now is made first, and judged as its answers come: at a soak's end or a
        // timeout, the evaluation of that instant decides. A timeout whose round was made
        // (its answers lost) is judged now.
        let soak_end = watch
            .streak
            .filter(|_| !matches!(subject, Subject::Readiness(_)))
            .map(|s| s.plus(checks.soak_seconds));
        let deadline = watch.since.plus(checks.timeout_seconds);
        let deadline_round_made = self.times_out(subject) && watch.round_at >= deadline;
        let due = now >= watch.round_at.plus(checks.interval_seconds)
            || soak_end.is_some_and(|end| end <= now && watch.round_at < end);
        if due && !deadline_round_made {
            self.begin_round(now, subject, &checks);
            return;
        }
        if self.assess(now, subject, &checks) {
            return;
        }
        let wake = self.watch_wakeup(subject, &checks);
        self.set_watch_timer(subject, wake);
    }

    /// Applies a watch's state at `now`; true when the watch ended.
    fn assess(&mut self, now: Time, subject: Subject, checks: &Checks) -> bool {
        let Some(watch) = self.health.watches.get(&subject) else {
            return true;
        };
        // A check whose evaluations could not be made for unavailableAfterSeconds counts as
        // failed; an answer still to come counts for nothing.
        let unavailable = (0..checks.checks.len()).find(|&i| {
            watch.answers[i] == Answer::Unavailable
                && now.unix() - watch.last_ok[i].unix() >= checks.unavailable_after_seconds
        });
        let failed = watch.answers.iter().position(|a| *a == Answer::Failed);
        let all_passed = watch.answers.iter().all(|a| *a == Answer::Passed);
        let failure = failed
            .map(|i| {
                self.health
                    .shown(subject)
                    .iter()
                    .rev()
                    .find(|r| r.name == checks.checks[i].name && r.passed == Some(false))
                    .and_then(|r| r.message.clone())
                    .unwrap_or_else(|| format!("check {:?} failed", checks.checks[i].name))
            })
            .or_else(|| {
                unavailable.map(|i| {
                    format!(
                        "check {:?} could not be evaluated for {} s: {}",
                        checks.checks[i].name,
                        checks.unavailable_after_seconds,
                        watch.last_error[i].as_deref().unwrap_or("no answer")
                    )
                })
            });
        let Some(watch) = self.health.watches.get_mut(&subject) else {
            return true;
        };
        // Timed out: past the deadline, with the deadline's round answered (or none made at it).
        let deadline = watch.since.plus(checks.timeout_seconds);
        let round_over = !watch.answers.contains(&Answer::Awaited);
        let timed_out = now >= deadline && (round_over || watch.round_at < deadline);
        let verdict = match subject {
            Subject::Soak(_) => match failure {
                Some(why) => Verdict::Failed(why),
                None if all_passed && watch.round_at >= watch.since.plus(checks.soak_seconds) => {
                    Verdict::Passed
                }
                None => Verdict::Continue,
            },
            Subject::Gate(at) if at.timing == Timing::After => match failure {
                Some(why) => Verdict::Failed(why),
                None if all_passed && watch.round_at >= watch.since.plus(checks.soak_seconds) => {
                    Verdict::Passed
                }
                None => Verdict::Continue,
            },
            Subject::Gate(_) => {
                if failure.is_some() {
                    watch.streak = None;
                } else if all_passed && watch.streak.is_none() {
                    watch.streak = Some(watch.round_at);
                }
                match watch.streak {
                    Some(s) if all_passed && watch.round_at >= s.plus(checks.soak_seconds) => {
                        Verdict::Passed
                    }
                    _ if timed_out => Verdict::Failed(format!(
                        "the checks did not pass for {} s within {} s{}",
                        checks.soak_seconds,
                        checks.timeout_seconds,
                        failure.map(|f| format!("; last: {f}")).unwrap_or_default()
                    )),
                    _ => Verdict::Continue,
                }
            }
            Subject::Readiness(m) => {
                if all_passed {
                    watch.passed_at = Some(now);
                    Verdict::Passed
                } else if timed_out {
                    Verdict::Failed(format!(
                        "readiness checks did not pass within {} s{}",
                        checks.timeout_seconds,
                        failure
                            .as_ref()
                            .map(|f| format!("; last: {f}"))
                            .unwrap_or_default()
                    ))
                } else {
                    if let Some(why) = failure {
                        let next = watch.round_at.plus(checks.interval_seconds);
                        let message =
                            format!("waiting for readiness: {why}; evaluated again at {next}");
                        if self.members[m as usize].place == Place::Parked {
                            let wake = self.members[m as usize].timer;
                            self.park(now, m, wake, message, WaitReason::Readiness);
                        } else if self.is_between(m) {
                            // Its message names the failing check at the next settle.
                            self.hops_due.insert(m);
                        }
                    }
                    Verdict::Continue
                }
            }
        };
        match verdict {
            Verdict::Continue => false,
            Verdict::Passed => {
                self.watch_passed(now, subject, checks);
                true
            }
            Verdict::Failed(why) => {
                self.watch_failed(now, subject, why);
                true
            }
        }
    }

    fn watch_passed(&mut self, now: Time, subject: Subject, checks: &Checks) {
        match subject {
            Subject::Soak(m) => {
                self.end_watch(subject);
                self.end_soak(now, m, None);
            }
            Subject::Readiness(m) => {
                // Kept, passed, until the member starts or its pass grows stale.
                self.set_watch_timer(subject, None);
                if self.is_between(m) {
                    // Its next hop may go (SEMANTICS §13).
                    self.hops_due.insert(m);
                }
                self.repark(now, m);
            }
            Subject::Gate(at) => {
                self.end_watch(subject);
                if let Some(gate) = self.gate_mut(at)
                    && gate.state == State::Pending
                {
                    gate.state = State::Completed;
                    gate.completed = Some(now);
                    self.emit_gate(
                        now,
                        EventType::GateCompleted,
                        at,
                        Some(format!(
                            "health checks passed for {} s",
                            checks.soak_seconds
                        )),
                    );
                }
                self.roll_up(now);
            }
        }
    }

    fn watch_failed(&mut self, now: Time, subject: Subject, why: String) {
        self.end_watch(subject);
        match subject {
            Subject::Soak(m) => self.end_soak(now, m, Some(why)),
            Subject::Readiness(m) => {
                if self.members[m as usize].state == State::Pending {
                    let g = self.members[m as usize].group;
                    self.unplace(m);
                    self.groups[g as usize].unfinished -= 1;
                    self.fail_member(now, m, "ReadinessCheckFailed", why);
                } else if self.is_between(m) {
                    // Between two hops, in its slot: its timeout fails it (SEMANTICS §13).
                    let why = format!("before its next hop: {why}");
                    self.fail_between(now, m, "ReadinessCheckFailed", why);
                }
            }
            Subject::Gate(at) => {
                let Some(gate) = self.gate_mut(at) else {
                    return;
                };
                if gate.state != State::Pending {
                    return;
                }
                gate.state = State::Failed;
                gate.completed = Some(now);
                let name = gate
                    .gate
                    .display_name
                    .as_ref()
                    .map_or_else(|| gate.id.clone(), |n| format!("{n:?}"));
                self.emit_gate(now, EventType::GateFailed, at, Some(why.clone()));
                let why = format!("the HealthCheck gate {name} failed: {why}");
                let g = at
                    .group
                    .map(|pos| self.stages[at.stage as usize].groups[pos as usize]);
                self.fail_scope(now, at.stage as usize, g, "HealthCheckFailed", why);
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Member soaks.

    /// A member whose upgrade succeeded (or whose cluster was found at target) is verified
    /// when its group has member health checks: it stays Running, holding its slot.
    pub(super) fn needs_soak(&self, m: u32) -> bool {
        self.groups[self.members[m as usize].group as usize]
            .member_health
            .is_some()
    }

    /// Begins member `m`'s soak: it is Running (in flight) and stays so until its checks end.
    pub(super) fn begin_soak(&mut self, now: Time, m: u32) {
        let soak = self.groups[self.members[m as usize].group as usize]
            .member_health
            .as_ref()
            .map_or(0, |c| c.soak_seconds);
        self.touch(m);
        let member = &mut self.members[m as usize];
        member.verifying = true;
        let message = format!("verifying: health checks until {}", now.plus(soak));
        member.message = Some(message.as_str().into());
        self.emit_member(now, EventType::MemberVerifying, m, Some(message));
        self.begin_watch(now, Subject::Soak(m));
    }

    /// Ends a soak: Completed, or Failed with `HealthCheckFailed` (counted like any failure).
    fn end_soak(&mut self, now: Time, m: u32, failure: Option<String>) {
        let member = &mut self.members[m as usize];
        if member.state != State::Running || !member.verifying {
            return;
        }
        if let Some(why) = failure.as_ref().filter(|_| !member.removed)
            && self.rolls_back_on_failure(m)
        {
            // Rolled back at once, in its slot, before anything else is decided (§15).
            self.begin_auto_rollback(m, why.clone());
            return;
        }
        let member = &mut self.members[m as usize];
        member.verifying = false;
        let g = member.group;
        self.touch(m);
        self.add_in_flight(g, -1);
        self.groups[g as usize].unfinished -= 1;
        let member = &mut self.members[m as usize];
        if member.removed {
            member.state = State::Skipped;
            member.completed = Some(now);
            member.message = Some(REMOVED.into());
            self.emit_member(now, EventType::MemberSkipped, m, Some(REMOVED.into()));
        } else {
            match failure {
                None => {
                    member.state = State::Completed;
                    member.completed = Some(now);
                    member.message = Some("health checks passed".into());
                    self.emit_member(
                        now,
                        EventType::MemberSucceeded,
                        m,
                        Some("health checks passed".into()),
                    );
                }
                Some(why) => {
                    member.message = None;
                    self.fail_member(now, m, "HealthCheckFailed", why);
                }
            }
        }
        self.finish_group_if_skipped(now, g);
        self.roll_up(now);
    }

    /// A member retried after `HealthCheckFailed`, at its target, starts its soak again in a
    /// slot, with no operation sent.
    pub(super) fn start_verifying(&mut self, now: Time, m: u32) {
        let member = &mut self.members[m as usize];
        member.reverify = false;
        member.state = State::Running;
        member.start = Some(now);
        member.completed = None;
        member.error = None;
        let g = member.group;
        self.add_in_flight(g, 1);
        // Back in flight with no operation sent: re-attached, as a start after a stop is.
        self.emit_member(
            now,
            EventType::MemberReattached,
            m,
            Some("at its target: verified again".into()),
        );
        self.begin_soak(now, m);
    }

    // -----------------------------------------------------------------------------------------
    // Readiness.

    /// Whether member `m` passed its readiness checks recently enough to start now; `None`
    /// when its group has none.
    pub(super) fn readiness_checks(&self, m: u32, now: Time) -> Option<Readiness> {
        let checks = self.groups[self.members[m as usize].group as usize]
            .readiness
            .as_ref()?;
        let watch = self.health.watches.get(&Subject::Readiness(m));
        if let Some(at) = watch.and_then(|w| w.passed_at)
            && now < at.plus(checks.interval_seconds)
        {
            return Some(Readiness::Ready);
        }
        let message = self.members[m as usize]
            .message
            .as_deref()
            .filter(|msg| msg.starts_with("waiting for readiness"))
            .map_or_else(|| "waiting for readiness checks".to_string(), String::from);
        Some(Readiness::Wait {
            wake: None,
            message,
            reason: WaitReason::Readiness,
        })
    }

    /// A member parked for its readiness checks is being evaluated: a new watch unless one is
    /// under way (a pass grown stale is evaluated again).
    pub(super) fn ensure_readiness(&mut self, now: Time, m: u32) {
        let subject = Subject::Readiness(m);
        let under_way = self
            .health
            .watches
            .get(&subject)
            .is_some_and(|w| w.passed_at.is_none());
        if !under_way {
            self.begin_watch(now, subject);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Gates.

    /// Begins the watch of every Pending HealthCheck gate of the current stage (a start after
    /// a stop, a retry): evaluated again from the start.
    pub(super) fn restart_gate_watches(&mut self, now: Time) {
        for at in self.current_stage_gates() {
            let pending_check = self.gate_mut(at).is_some_and(|g| {
                g.state == State::Pending && matches!(g.gate.kind, GateKind::HealthCheck(_))
            });
            if pending_check {
                self.begin_watch(now, Subject::Gate(at));
            }
        }
    }

    /// Every gate of the current stage: its own and its groups', before and after.
    fn current_stage_gates(&self) -> Vec<GateRef> {
        let si = self.current;
        if si >= self.stages.len() {
            return Vec::new();
        }
        let groups = (0..self.stages[si].groups.len() as u32).map(Some);
        std::iter::once(None)
            .chain(groups)
            .flat_map(|group| {
                [Timing::Before, Timing::After]
                    .into_iter()
                    .flat_map(move |timing| self.gate_refs(si, group, timing))
            })
            .collect()
    }

    /// A failed HealthCheck gate of the current stage is Pending again (a retry evaluates it
    /// from the start).
    pub(super) fn reopen_failed_gates(&mut self, now: Time) {
        for at in self.current_stage_gates() {
            let Some(gate) = self.gate_mut(at) else {
                continue;
            };
            if gate.state == State::Failed {
                gate.state = State::Pending;
                gate.start = Some(now);
                gate.completed = None;
                let message = gate.gate.display_name.clone();
                self.emit_gate(now, EventType::GatePending, at, message);
            }
        }
    }

    /// The latest failing readiness evaluation of member `m`'s watch under way, if any.
    pub(super) fn readiness_failure(&self, m: u32) -> Option<String> {
        let since = self.health.watches.get(&Subject::Readiness(m))?.since;
        self.health
            .shown(Subject::Readiness(m))
            .iter()
            .rev()
            .find(|r| r.time >= since && r.passed == Some(false))
            .map(|r| {
                format!(
                    "readiness check {:?} failed: {}",
                    r.name,
                    r.message.as_deref().unwrap_or("no detail")
                )
            })
    }

    /// The results a status shows for a member (its soak's and its readiness's).
    pub(super) fn member_checks(&self, m: u32) -> Vec<CheckResult> {
        let mut all = self.health.shown(Subject::Readiness(m)).to_vec();
        all.extend_from_slice(self.health.shown(Subject::Soak(m)));
        all
    }

    /// The results a status shows for a stage (`group: None`) or a group: its gates'.
    pub(super) fn scope_checks(&self, si: usize, group: Option<u32>) -> Vec<CheckResult> {
        if self.health.shown.is_empty() {
            return Vec::new();
        }
        let mut all = Vec::new();
        for timing in [Timing::Before, Timing::After] {
            for at in self.gate_refs(si, group, timing) {
                all.extend_from_slice(self.health.shown(Subject::Gate(at)));
            }
        }
        all
    }
}
