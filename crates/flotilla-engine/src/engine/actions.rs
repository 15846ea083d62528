//! Skipping members, groups, stages and waits (SEMANTICS §5).

use super::*;

impl Engine {
    pub(super) fn skip(
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
                    let m = *self.member_index.get(t.name.as_str()).ok_or_else(|| unknown("member"))?;
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
                    // Completed, Failed and Skipped are terminal (SEMANTICS §6); Stopped is not.
                    if let Some(state) = self.groups[g as usize].outcome
                        && state != State::Stopped
                    {
                        return Err(ApiError::conflict(terminal_scope("group", &t.name, state)));
                    }
                    Resolved::Group(g)
                }
                SkipKind::Stage => {
                    let si = self.stages.iter().position(|s| s.name == t.name).ok_or_else(|| unknown("stage"))?;
                    if let Some(state) = self.stages[si].outcome
                        && state != State::Stopped
                    {
                        return Err(ApiError::conflict(terminal_scope("stage", &t.name, state)));
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
            Some(who) => format!("{SKIPPED_BY}{who}"),
            None => format!("{SKIPPED_BY}a user"),
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

    pub(super) fn skip_member(&mut self, now: Time, m: u32, why: &str) {
        self.unplace(m);
        self.touch(m);
        let member = &mut self.members[m as usize];
        member.state = State::Skipped;
        member.completed = Some(now);
        member.message = Some(why.into());
        let g = member.group;
        self.groups[g as usize].unfinished -= 1;
        self.emit_member(now, EventType::MemberSkipped, m, Some(why.to_string()));
        self.finish_group_if_skipped(now, g);
    }

    pub(super) fn finish_group_if_skipped(&mut self, now: Time, g: u32) {
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

    pub(super) fn skip_group(&mut self, now: Time, g: u32, why: &str) {
        let group = &mut self.groups[g as usize];
        group.user_skipped = true;
        if group.outcome == Some(State::Stopped) {
            // Skipped while stopped, or in a failed run, instead of being resumed.
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

    pub(super) fn skip_stage(&mut self, now: Time, si: usize, why: &str) {
        let stage = &mut self.stages[si];
        stage.user_skipped = true;
        if stage.outcome == Some(State::Stopped) {
            stage.outcome = None;
            stage.completed = None;
            stage.error = None;
        }
        stage.message = Some(why.to_string());
        self.skip_gates(now, si, None);
        self.skip_wait(now, si);
        let groups = self.stages[si].groups.clone();
        for g in groups {
            if matches!(self.groups[g as usize].outcome, None | Some(State::Stopped)) {
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

    pub(super) fn finish_stage_if_skipped(&mut self, now: Time, si: usize) {
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

    pub(super) fn skip_wait(&mut self, now: Time, si: usize) {
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
}

/// The 409 for a skip of a terminal group or stage: what it is, and what can be done instead.
fn terminal_scope(kind: &str, name: &str, state: State) -> String {
    let instead = if state == State::Failed {
        "; a Failed one cannot be skipped: start the run again to retry it, or create a new run"
    } else {
        ""
    };
    format!("{kind} {name:?} is already {state:?}{instead}")
}
