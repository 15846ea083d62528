//! Gates: their ids, lookup, opening and approval (SEMANTICS §5).

use super::*;

pub(super) fn gate_id(run: &str, at: GateRef) -> String {
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

pub(super) fn gates_rt(
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

pub(super) fn gates_done(gates: &[GateRt]) -> bool {
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

    /// Every gate of the run, reached or not, by id, with its type (`Approval`,
    /// `ScheduledStart`, `HealthCheck`): what a forecast needs to say what it assumes of each.
    pub fn gate_types(&self) -> std::collections::BTreeMap<String, &'static str> {
        let mut types = std::collections::BTreeMap::new();
        for stage in &self.stages {
            let groups = stage.groups.iter().map(|&g| &self.groups[g as usize]);
            let lists = [&stage.before, &stage.after]
                .into_iter()
                .chain(groups.flat_map(|g| [&g.before, &g.after]));
            for gate in lists.flatten() {
                let kind = match &gate.gate.kind {
                    GateKind::Approval => "Approval",
                    GateKind::ScheduledStart { .. } => "ScheduledStart",
                    GateKind::HealthCheck(_) => "HealthCheck",
                };
                types.insert(gate.id.clone(), kind);
            }
        }
        types
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
                        GateKind::HealthCheck(_) => ("HealthCheck", None),
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
    pub(super) fn gate_refs(&self, si: usize, group: Option<u32>, timing: Timing) -> Vec<GateRef> {
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

    pub(super) fn stage_gates(&self, si: usize, timing: Timing) -> &[GateRt] {
        match timing {
            Timing::Before => &self.stages[si].before,
            Timing::After => &self.stages[si].after,
        }
    }

    pub(super) fn group_gates(&self, g: u32, timing: Timing) -> &[GateRt] {
        match timing {
            Timing::Before => &self.groups[g as usize].before,
            Timing::After => &self.groups[g as usize].after,
        }
    }

    pub(super) fn gate_mut(&mut self, at: GateRef) -> Option<&mut GateRt> {
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

    pub(super) fn gate_names(&self, at: GateRef) -> (Option<String>, Option<String>) {
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

    pub(super) fn approve(&mut self, now: Time, at: GateRef, by: String) -> Result<(), ApiError> {
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
        // A pending HealthCheck gate completed by hand evaluates nothing more.
        self.end_watch(Subject::Gate(at));
        self.emit_gate(
            now,
            EventType::GateCompleted,
            at,
            Some(format!("approved by {by}")),
        );
        Ok(())
    }

    /// The first Approval gate, pending or not yet reached, that skipping `targets` would pass:
    /// the gates of a skipped stage and of its groups, and those of a skipped group.
    pub(super) fn approval_passed_by(&self, targets: &[SkipTarget]) -> Option<String> {
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

    pub(super) fn skip_gates(&mut self, now: Time, si: usize, group: Option<u32>) {
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
                    self.end_watch(Subject::Gate(at));
                    if was_pending {
                        self.emit_gate(now, EventType::GateSkipped, at, None);
                    }
                }
            }
        }
    }

    pub(super) fn open_gates(&mut self, now: Time, si: usize, group: Option<u32>, timing: Timing) {
        let scale = self.time_scale();
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
            let checks = matches!(gate.gate.kind, GateKind::HealthCheck(_));
            if let GateKind::ScheduledStart {
                day,
                time,
                utc_offset,
                ..
            } = gate.gate.kind
            {
                let mut at_time = next_scheduled_start(day, time, utc_offset, now);
                // A run with a time scale (a simulated fleet) reaches the time that much sooner.
                if scale != 1.0 {
                    let real = ((at_time.unix() - now.unix()) as f64 / scale).ceil() as i64;
                    at_time = now.plus(real);
                }
                gate.absolute_start = Some(at_time);
                message = Some(format!(
                    "{}opens at {at_time}",
                    message.map(|m| format!("{m}: ")).unwrap_or_default()
                ));
                self.timers.insert((at_time, TimerKey::Gate(at)));
            }
            self.emit_gate(now, EventType::GatePending, at, message);
            // A failed run evaluates no gate; a retry begins its watch (SEMANTICS §4).
            if checks && self.phase != RunPhase::Failed {
                self.begin_watch(now, Subject::Gate(at));
            }
        }
        // A scheduled time equal to now completes at once.
        self.fire_timers(now);
    }
}
