//! Recounting the incremental state from scratch, for tests.

use super::*;

impl Engine {
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
        self.check_watches()?;
        self.check_chains()?;
        self.check_rollbacks()?;
        if self.phase == RunPhase::Running {
            self.check_reaching(now)?;
        }
        Ok(())
    }

    /// Every watch of checks belongs to what it watches (SEMANTICS §10): a soak to a member
    /// Running in it, readiness to a member waiting to start, a gate's to a Pending gate of a
    /// running run; and every member in its soak is watched.
    fn check_watches(&self) -> Result<(), String> {
        for subject in self.health.subjects() {
            let fits = match subject {
                Subject::Soak(m) => {
                    let member = &self.members[m as usize];
                    member.state == State::Running && member.verifying
                }
                Subject::Readiness(m) => {
                    (matches!(
                        self.members[m as usize].state,
                        State::Pending | State::NotStarted
                    ) || self.is_between(m))
                        && self.phase == RunPhase::Running
                }
                Subject::Gate(at) => {
                    self.phase == RunPhase::Running
                        && self.gate_ref_state(at) == Some(State::Pending)
                }
            };
            if !fits {
                return Err(format!(
                    "checks are watched for {subject:?}, which is not waiting for them"
                ));
            }
        }
        for (m, member) in self.members.iter().enumerate() {
            if member.verifying && !self.health.watching(Subject::Soak(m as u32)) {
                return Err(format!(
                    "member {} is in its soak but nothing watches it",
                    member.name
                ));
            }
        }
        Ok(())
    }

    fn gate_ref_state(&self, at: GateRef) -> Option<State> {
        let gates = match at.group {
            None => self.stage_gates(at.stage as usize, at.timing),
            Some(pos) => self.group_gates(
                *self.stages[at.stage as usize].groups.get(pos as usize)?,
                at.timing,
            ),
        };
        gates.get(at.index as usize).map(|g| g.state)
    }

    /// In a running run's current stage: every member that has not started is queued in its
    /// class or parked as Pending for a reason that still holds, and no slot is idle while a
    /// member waits to be reached (SEMANTICS §1, §3).
    pub(super) fn check_reaching(&self, now: Time) -> Result<(), String> {
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
                        // A member held by a budget whose partition has room since waits for its
                        // group to be handed a slot (then it is reached first, see below).
                        if matches!(self.readiness(m, now), Readiness::Ready)
                            && !self.budget.held.contains_key(&m)
                        {
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
                && (!group.ready.is_empty()
                    || self.budget_candidate(g, &self.budget_open()).is_some())
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
}
