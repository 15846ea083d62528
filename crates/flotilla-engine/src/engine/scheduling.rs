//! Settling: what time brings, stage and group progress, and handing out free slots (SEMANTICS §3, §4).

use super::*;

impl Engine {
    /// Processes timers due at `now`, moves the run forward, and hands out free slots. Call once
    /// after all inputs of an instant.
    pub fn settle(&mut self, now: Time) {
        self.fire_timers(now);
        loop {
            // Chains first: a member between hops holds its slot (SEMANTICS §13).
            let mut changed = self.continue_chains(now);
            // Rollbacks too: a member rolling back holds its slot (SEMANTICS §15).
            changed |= self.continue_rollbacks(now);
            if self.phase == RunPhase::Running {
                changed |= self.advance(now);
                changed |= self.dispatch(now);
            }
            if self.phase == RunPhase::Failed && self.run_completed.is_none() {
                changed |= self.finish_groups_after_failure(now);
                if self.in_flight == 0 {
                    self.finalize_failed(now);
                }
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

    pub(super) fn fire_timers(&mut self, now: Time) {
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
                TimerKey::Watch(subject) => self.watch_due(now, subject),
                TimerKey::Member(m) => {
                    self.members[m as usize].timer = None;
                    if self.is_between(m) {
                        // What held its next hop may have ended.
                        self.hops_due.insert(m);
                    }
                    if self.members[m as usize].state == State::Pending {
                        // Its `waitingFor.until` was this timer.
                        self.touch(m);
                    }
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

    /// Moves the current stage (and the run) forward as far as it can go now.
    pub(super) fn advance(&mut self, now: Time) -> bool {
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
    pub(super) fn advance_open_stage(&mut self, now: Time, si: usize) -> bool {
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
                        let real = self.scaled(self.stages[si].wait.seconds);
                        let wait = &mut self.stages[si].wait;
                        if wait.state == State::NotStarted {
                            if wait.seconds > 0 {
                                let end = now.plus(real);
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
    pub(super) fn roll_up(&mut self, now: Time) {
        while self.phase == RunPhase::Running && self.advance(now) {}
    }

    pub(super) fn next_stage(&mut self, now: Time) {
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

    pub(super) fn advance_group(&mut self, now: Time, si: usize, pos: u32, g: u32) -> bool {
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
    pub(super) fn dispatch(&mut self, now: Time) -> bool {
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
            // Partitions with room and members held on them: their groups have someone to
            // reach even with an empty queue.
            let open = self.budget_open();
            let start = self.stages[si].last_served;
            for k in 1..=n {
                let pos = (start + k) % n;
                let g = self.stages[si].groups[pos];
                let group = &self.groups[g as usize];
                if group.phase != Phase::Active
                    || group.outcome.is_some()
                    || group.user_skipped
                    || group.in_flight >= group.max_concurrency
                    || (group.ready.is_empty() && self.budget_candidate(g, &open).is_none())
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
                    match target {
                        Some(target) => self.start_member(now, m, target),
                        None => self.start_verifying(now, m),
                    }
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
    pub(super) fn reach(&mut self, now: Time, g: u32) -> (Option<(u32, Option<Target>)>, bool) {
        let mut touched = false;
        let open = self.budget_open();
        loop {
            // A member held by a budget whose partition has room now is reached in its place
            // in the group's order, as if it had been queued (SEMANTICS §12: reached again at
            // the next pass): queued now, then decided like the rest.
            if let Some((class, m)) = self.budget_candidate(g, &open)
                && self.groups[g as usize]
                    .ready
                    .first()
                    .is_none_or(|&first| (class, m) < first)
            {
                self.enqueue(now, m);
            }
            let Some(&(class, m)) = self.groups[g as usize].ready.first() else {
                break;
            };
            touched = true;
            let decision = self.decide(m, now);
            if self.members[m as usize].reverify && matches!(decision, Decision::Skip(_)) {
                // At its target after failing its health checks: verified again, in a slot,
                // with no operation sent (SEMANTICS §10).
                self.groups[g as usize].ready.remove(&(class, m));
                self.members[m as usize].place = Place::Nowhere;
                self.set_member_timer(m, None);
                return (Some((m, None)), true);
            }
            match decision {
                Decision::Upgrade(target) => match self.readiness(m, now) {
                    Readiness::Ready => {
                        self.groups[g as usize].ready.remove(&(class, m));
                        self.members[m as usize].place = Place::Nowhere;
                        self.set_member_timer(m, None);
                        return (Some((m, Some(target))), true);
                    }
                    Readiness::Wait {
                        wake,
                        message,
                        reason,
                    } => {
                        self.park_for(now, m, wake, message, reason);
                    }
                },
                Decision::Skip(why) => {
                    self.unplace(m);
                    self.touch(m);
                    let member = &mut self.members[m as usize];
                    member.state = State::Skipped;
                    member.completed = Some(now);
                    member.message = Some(why.as_str().into());
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

    /// Starts an attempt of member `m`: one operation, or in a chained run the first of its
    /// hops (SEMANTICS §13).
    pub(super) fn start_member(&mut self, now: Time, m: u32, target: Target) {
        self.touch(m);
        self.end_watch(Subject::Readiness(m));
        let member = &mut self.members[m as usize];
        member.state = State::Running;
        member.start = Some(now);
        member.completed = None;
        member.message = None;
        member.error = None;
        let g = member.group;
        self.add_in_flight(g, 1);
        self.record_before(m);
        self.emit_member(now, EventType::MemberStarted, m, None);
        if target.rollback.is_some() {
            self.send_rollback_step(now, m, target);
        } else if self.chains() {
            let target = self.first_hop(now, m, target);
            self.send_hop(now, m, target);
        } else {
            self.send_operation(m, target);
        }
    }

    /// Sends member `m` one operation to `target`, under a new attempt: the shell records it
    /// as intended before the driver is called (SEMANTICS §7).
    pub(super) fn send_operation(&mut self, m: u32, target: Target) {
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        let member = &mut self.members[m as usize];
        member.attempt = attempt;
        member.operation_id = None;
        member.target = Some(Box::new(target.clone()));
        let name = member.name.to_string();
        self.commands.push_back(Command::StartUpgrade {
            member: name,
            attempt,
            target,
        });
    }

    /// While a failed run waits for its members in flight (SEMANTICS §4): a group of the current
    /// stage whose members have all finished reaches its after-gates (HealthCheck ones are not
    /// evaluated while the run is Failed), and completes once they are done. Nothing starts.
    pub(super) fn finish_groups_after_failure(&mut self, now: Time) -> bool {
        let Some(stage) = self.stages.get(self.current) else {
            return false;
        };
        if stage.outcome.is_some() && stage.outcome != Some(State::Failed) {
            return false;
        }
        let mut changed = false;
        let groups = stage.groups.clone();
        for (pos, g) in groups.into_iter().enumerate() {
            if matches!(
                self.groups[g as usize].phase,
                Phase::Active | Phase::AfterGates
            ) {
                changed |= self.advance_group(now, self.current, pos as u32, g);
            }
        }
        changed
    }

    /// The run failed and nothing is in flight any more: settle every state (SEMANTICS §4).
    pub(super) fn finalize_failed(&mut self, now: Time) {
        self.run_completed = Some(now);
        self.quiet_changes += 1;
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
}
