//! Inputs from users and clusters: start, stop, results of operations, observations (SEMANTICS §4, §6).

use super::*;

impl Engine {
    /// Applies one input at `now` without scheduling. User actions the API would refuse return
    /// the API error and change nothing.
    pub fn handle(&mut self, now: Time, input: Input) -> Result<(), ApiError> {
        self.handle_input(now, input)
    }

    fn handle_input(&mut self, now: Time, input: Input) -> Result<(), ApiError> {
        if matches!(
            input,
            Input::Start
                | Input::Stop
                | Input::Skip(_)
                | Input::SkipBy { .. }
                | Input::ApproveGate { .. }
                | Input::ApproveGateById { .. }
        ) {
            // A user's action may change the status without an event (a wait skipped before
            // it starts, say): the status is looked at again, whatever it did.
            self.quiet_changes += 1;
        }
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
                if let Some(&m) = self.member_index.get(member.as_str()) {
                    self.touch(m);
                    let member = &mut self.members[m as usize];
                    if member.attempt == attempt {
                        member.operation_id = Some(operation_id.into());
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
                self.observed(now, &member, cluster, operation);
                Ok(())
            }
            Input::MemberRemoved { member } => {
                self.member_removed(now, &member);
                Ok(())
            }
            Input::MemberLocked { member, by_run } => {
                if let Some(&m) = self.member_index.get(member.as_str()) {
                    self.members[m as usize].locked_by = Some(by_run);
                    self.repark(now, m);
                }
                Ok(())
            }
            Input::MemberUnlocked { member } => {
                if let Some(&m) = self.member_index.get(member.as_str()) {
                    self.members[m as usize].locked_by = None;
                    self.repark(now, m);
                }
                Ok(())
            }
            Input::CheckEvaluated {
                subject,
                round,
                check,
                outcome,
            } => {
                self.check_evaluated(now, &subject, round, &check, &outcome);
                self.roll_up(now);
                Ok(())
            }
            Input::FreezesChanged(freezes) => {
                self.freezes = freezes;
                self.repark_waiting(now);
                Ok(())
            }
            Input::BudgetsChanged(view) => {
                self.budgets_changed(now, view);
                Ok(())
            }
            Input::BudgetRoom(counts) => {
                self.budget_room(counts);
                Ok(())
            }
            Input::CatalogChanged(catalog) => {
                self.catalog = catalog;
                self.repark_waiting(now);
                Ok(())
            }
            Input::RolledBackBy { run } => {
                self.set_rolled_back_by(now, run);
                Ok(())
            }
        }
    }

    /// The Pending members of the current stage are decided again on what changed (the
    /// catalog, the fleet's freezes), and so are the next hops of its members between hops.
    pub(super) fn repark_waiting(&mut self, now: Time) {
        if self.phase == RunPhase::Running && self.current < self.stages.len() {
            let between: Vec<u32> = self.stages[self.current]
                .groups
                .iter()
                .flat_map(|&g| self.groups[g as usize].members.iter().copied())
                .filter(|&m| self.is_between(m))
                .collect();
            self.hops_due.extend(between);
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
    }

    pub(super) fn start(&mut self, now: Time) -> Result<(), ApiError> {
        if matches!(
            self.phase,
            RunPhase::NotStarted | RunPhase::Stopped | RunPhase::Failed
        ) && let Some(by) = &self.rollback.by
        {
            // Rolled back: what it did is being undone (SEMANTICS §15).
            return Err(ApiError::conflict(format!(
                "update run {:?} was rolled back by update run {by:?} and cannot be started again",
                self.run_name
            )));
        }
        if matches!(
            self.phase,
            RunPhase::NotStarted | RunPhase::Stopped | RunPhase::Failed
        ) && let Some(check) = self.inline_check()
        {
            // Written before check providers: never evaluated, so never started (SEMANTICS §10).
            return Err(ApiError::conflict(format!(
                "update run {:?} holds {check}, written before check providers existed and never evaluated; \
                 save the strategy again with checks that name a provider, and create a new run",
                self.run_name
            )));
        }
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

    /// Consistent images: per family in the run, the newest version available in every region of
    /// the run's members at run start (SEMANTICS §1).
    pub(super) fn select_consistent_images(&mut self, now: Time) {
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
    pub(super) fn resume_current_stage(&mut self, now: Time) {
        self.restart_gate_watches(now);
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
                        self.touch(m);
                        let member = &mut self.members[m as usize];
                        member.state = State::Running;
                        member.reattaching = true;
                        let attempt = member.attempt;
                        let name = member.name.to_string();
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

    /// Starting a Failed run retries it (SEMANTICS §6).
    pub(super) fn retry(&mut self, now: Time) {
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
                if group.outcome == Some(State::Stopped) && group.phase == Phase::AfterGates {
                    // Its members were all done and its after-gates reached: it completes once
                    // they are done, its members kept, Failed ones included (SEMANTICS §4).
                    group.outcome = None;
                    group.completed = None;
                    group.message = None;
                    group.error = None;
                    continue;
                }
                let mut reset = 0;
                for &m in &group.members {
                    let member = &mut self.members[m as usize];
                    if member.state == State::Failed {
                        self.revisions.touch(m);
                        // Attempted again: whether it was rolled back is its last attempt's.
                        self.rollback.rolled_back.remove(&m);
                    }
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
                            member: Some(member.name.to_string()),
                            gate: None,
                            message: Some(REMOVED.into()),
                            error: None,
                        });
                    } else if member.state == State::Stopped {
                        // A chain the run's failure ended between hops (§13): attempted again,
                        // its hops planned from where its cluster is. It is still unfinished.
                        self.revisions.touch(m);
                        member.state = State::NotStarted;
                        member.start = None;
                        member.completed = None;
                        member.message = member
                            .message
                            .take()
                            .map(|msg| format!("earlier attempt {msg}").into());
                    } else if member.state == State::Failed {
                        // A member that failed its health checks is verified again, not
                        // skipped at its target (SEMANTICS §10).
                        member.reverify = member
                            .error
                            .as_ref()
                            .is_some_and(|e| e.code == "HealthCheckFailed");
                        member.state = State::NotStarted;
                        member.start = None;
                        member.completed = None;
                        if let Some(err) = member.error.take() {
                            member.message =
                                Some(format!("earlier attempt failed: {}", err.message).into());
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
            self.reopen_failed_gates(now);
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
        self.restart_gate_watches(now);
    }

    pub(super) fn stop(&mut self, now: Time) -> Result<(), ApiError> {
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
                            self.touch(m);
                            // Between hops: nothing is in flight; the cluster is let go. A hop
                            // in flight goes on on the cluster, observed again on start.
                            self.end_between(m);
                            // A rollback between two steps lets its cluster go; it goes on
                            // when the run starts again (SEMANTICS §15).
                            self.end_rollback_between(m);
                            self.rollback.due.remove(&m);
                            if let Some(hop) = self.hop_in_flight(m) {
                                hop.state = State::Stopped;
                            }
                            if self.members[m as usize].verifying {
                                // Its soak restarts when the run starts again (SEMANTICS §10).
                                self.end_watch(Subject::Soak(m));
                                self.members[m as usize].verifying = false;
                            }
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
        self.end_dormant_watches();
        self.emit(now, EventType::RunStopped, None, None, None, None);
        Ok(())
    }

    pub(super) fn operation_finished(
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
            || self.is_between(m)
            || self.rollback_between(m)
        {
            return;
        }
        self.members[m as usize].reattaching = false;
        self.touch(m);
        if self.is_rolling(m) {
            self.rollback_step_finished(now, m, outcome);
            return;
        }
        let chain_goes_on = self.chains() && self.end_hop(now, m, &outcome);
        let member = &self.members[m as usize];
        let g = member.group;
        if chain_goes_on && !member.removed {
            // Between hops; once the run failed (§4), the next settle ends it there.
            self.hop_succeeded(m);
            return;
        }
        if outcome.is_ok() && !member.removed && self.needs_soak(m) {
            // Upgraded: verified by its health checks, still in its slot (SEMANTICS §10).
            let member = &mut self.members[m as usize];
            if let Some(target) = &member.target {
                apply_target(Arc::make_mut(&mut member.cluster), target);
            }
            self.begin_soak(now, m);
            return;
        }
        self.add_in_flight(g, -1);
        self.groups[g as usize].unfinished -= 1;
        if self.members[m as usize].removed {
            // Deleted from the fleet while in flight: Skipped, whatever the operation did, and
            // not counted as a failure (SEMANTICS §2).
            self.end_removed(now, m, g);
            return;
        }
        match outcome {
            Ok(()) => {
                let member = &mut self.members[m as usize];
                member.state = State::Completed;
                member.completed = Some(now);
                if let Some(target) = &member.target {
                    apply_target(Arc::make_mut(&mut member.cluster), target);
                }
                self.emit_member(now, EventType::MemberSucceeded, m, None);
            }
            Err(message) => {
                let message = self.hop_failure(m, message);
                self.fail_member(now, m, "UpgradeFailed", message)
            }
        }
        // A group a user skipped ends Skipped when its last member in flight finishes.
        self.finish_group_if_skipped(now, g);
    }

    /// Records a member failure and applies the thresholds (SEMANTICS §4).
    pub(super) fn fail_member(&mut self, now: Time, m: u32, code: &str, message: String) {
        self.touch(m);
        let member = &mut self.members[m as usize];
        member.state = State::Failed;
        member.completed = Some(now);
        member.error = Some(Box::new(ErrorDetail {
            code: code.into(),
            message: message.clone(),
        }));
        let g = member.group;
        self.emit_member(now, EventType::MemberFailed, m, Some(message));
        self.group_failures[g as usize] += 1;
        let si = self.groups[g as usize].stage as usize;
        self.stages[si].failure_count += 1;
        self.failure_count += 1;
        let (count, max) = (
            self.group_failures[g as usize],
            self.groups[g as usize].max_failures,
        );
        let group_failed = count > max
            && self.fail_group(
                now,
                g,
                "MaxAllowedFailuresExceeded",
                format!("{count} failures exceed maxAllowedFailures {max}"),
            );
        let stage = &self.stages[si];
        let (count, max) = (stage.failure_count, stage.max_failures);
        let stage_failed = if group_failed {
            let msg = format!("group {:?} failed", self.groups[g as usize].name);
            self.fail_stage(now, si, "GroupFailed", msg)
        } else {
            count > max
                && self.fail_stage(
                    now,
                    si,
                    "MaxAllowedFailuresExceeded",
                    format!("{count} failures exceed maxAllowedFailures {max}"),
                )
        };
        if group_failed || stage_failed {
            self.fail_run(now, si);
        }
    }

    /// A HealthCheck gate of a stage (`g: None`) or of group `g` failed (SEMANTICS §10): its
    /// group fails, which fails its stage, or its stage fails; the run stops progressing.
    pub(super) fn fail_scope(
        &mut self,
        now: Time,
        si: usize,
        g: Option<u32>,
        code: &str,
        message: String,
    ) {
        let failed = match g {
            Some(g) => {
                let group_failed = self.fail_group(now, g, code, message);
                if group_failed {
                    let msg = format!("group {:?} failed", self.groups[g as usize].name);
                    self.fail_stage(now, si, "GroupFailed", msg);
                }
                group_failed
            }
            None => self.fail_stage(now, si, code, message),
        };
        if failed {
            self.fail_run(now, si);
        }
    }

    /// Fails group `g` unless a user skipped it or it already ended; true if it failed now.
    fn fail_group(&mut self, now: Time, g: u32, code: &str, msg: String) -> bool {
        let group = &mut self.groups[g as usize];
        if group.user_skipped || group.outcome.is_some() {
            return false;
        }
        group.outcome = Some(State::Failed);
        // Members still in flight finish first; the run's end stamps the time then.
        if group.in_flight == 0 {
            group.completed = Some(now);
        }
        group.message = Some(msg.clone());
        group.error = Some(ErrorDetail {
            code: code.into(),
            message: msg.clone(),
        });
        self.emit_group(now, EventType::GroupFailed, g, Some(msg));
        true
    }

    /// Fails stage `si` unless a user skipped it or it already ended; true if it failed now.
    fn fail_stage(&mut self, now: Time, si: usize, code: &str, msg: String) -> bool {
        let stage = &mut self.stages[si];
        if stage.user_skipped || stage.outcome.is_some() {
            return false;
        }
        stage.outcome = Some(State::Failed);
        if stage.in_flight == 0 {
            stage.completed = Some(now);
        }
        stage.message = Some(msg.clone());
        stage.error = Some(ErrorDetail {
            code: code.into(),
            message: msg.clone(),
        });
        self.emit_stage(now, EventType::StageFailed, si, Some(msg));
        true
    }

    /// The run stops progressing; in-flight members (and soaks) finish (SEMANTICS §4).
    fn fail_run(&mut self, now: Time, si: usize) {
        if self.phase != RunPhase::Running {
            return;
        }
        self.phase = RunPhase::Failed;
        self.end_dormant_watches();
        // Members between hops send no further hop: each ends Stopped at the next settle.
        let between: Vec<u32> = self.stages[si]
            .groups
            .iter()
            .flat_map(|&g| self.groups[g as usize].members.iter().copied())
            .filter(|&m| self.is_between(m))
            .collect();
        self.hops_due.extend(between);
        self.emit(
            now,
            EventType::RunFailed,
            None,
            None,
            None,
            self.stages[si].message.clone(),
        );
    }

    pub(super) fn observed(
        &mut self,
        now: Time,
        name: &str,
        cluster: Arc<Cluster>,
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
        let final_version = self.upgrade.kubernetes_version;
        let chains = self.chains();
        match progress {
            OperationProgress::InProgress => {
                self.touch(m);
                if let Some(hop) = self.hop_in_flight(m) {
                    hop.state = State::Running;
                }
                self.emit_member(now, EventType::MemberReattached, m, None)
            }
            OperationProgress::NotRunning if self.is_rolling(m) => {
                // Rolling back (SEMANTICS §15): still in its slot; the next settle decides
                // its next step from where its cluster is.
                self.touch(m);
                self.rollback.due.insert(m);
                self.emit_member(
                    now,
                    EventType::MemberReattached,
                    m,
                    Some("its rollback goes on".into()),
                );
            }
            OperationProgress::NotRunning => {
                self.add_in_flight(g, -1);
                self.touch(m);
                let member = &self.members[m as usize];
                let at_hop = member
                    .target
                    .as_ref()
                    .is_some_and(|t| cluster_at(&member.cluster, t));
                // In a chain, at target means at the run's target, not an intermediate
                // version: a member short of it is attempted again from where it is (§13).
                let at_target = at_hop
                    && (!chains
                        || member
                            .target
                            .as_ref()
                            .is_some_and(|t| t.kubernetes_version == final_version));
                let removed = member.removed;
                if let Some(hop) = self.hop_in_flight(m) {
                    hop.completed_time = Some(now);
                    hop.state = if at_hop {
                        State::Completed
                    } else {
                        State::Failed
                    };
                }
                if at_target && !removed && self.needs_soak(m) {
                    // Upgraded, not yet verified: its soak starts (again), in its slot.
                    self.add_in_flight(g, 1);
                    self.emit_member(
                        now,
                        EventType::MemberReattached,
                        m,
                        Some("found at target: verified again".into()),
                    );
                    self.begin_soak(now, m);
                    return;
                }
                let member = &mut self.members[m as usize];
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

    /// A member deleted from the fleet, its operation over (its slot already given back):
    /// Skipped, not counted as a failure (SEMANTICS §2).
    pub(super) fn end_removed(&mut self, now: Time, m: u32, g: u32) {
        let member = &mut self.members[m as usize];
        member.state = State::Skipped;
        member.completed = Some(now);
        member.message = Some(REMOVED.into());
        self.emit_member(now, EventType::MemberSkipped, m, Some(REMOVED.into()));
        self.finish_group_if_skipped(now, g);
    }

    pub(super) fn member_removed(&mut self, now: Time, name: &str) {
        let Some(&m) = self.member_index.get(name) else {
            return;
        };
        self.members[m as usize].removed = true;
        if self.is_between(m) {
            // Skipped at the next settle, with no further hop.
            self.hops_due.insert(m);
        }
        if matches!(
            self.members[m as usize].state,
            State::NotStarted | State::Pending | State::Stopped
        ) {
            self.skip_member(now, m, REMOVED);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Skips.
}
