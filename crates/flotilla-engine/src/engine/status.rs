//! The status tree in the API's shape, and targets applied to clusters.

use super::*;

/// Applies a finished upgrade to a cluster (the engine's own view until the next observation).
pub fn apply_target(cluster: &mut Cluster, target: &Target) {
    if let Some(rollback) = &target.rollback {
        rollback::apply_rollback(cluster, target, rollback);
        return;
    }
    if let Some(v) = target.kubernetes_version {
        let before = cluster.kubernetes_version;
        for pool in &mut cluster.node_pools {
            pool.orchestrator_version = match target.upgrade_type {
                // The pools stay where they were (AKS's skew rule, SEMANTICS §13).
                UpgradeType::ControlPlaneOnly => Some(pool.orchestrator_version.unwrap_or(before)),
                // The pools move with the control plane.
                _ => None,
            };
        }
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
    if let Some(rollback) = &target.rollback {
        return rollback::rolled_back_to(cluster, target, rollback);
    }
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

impl Engine {
    pub(super) fn run_state(&self) -> State {
        match self.phase {
            RunPhase::Running => match self.stages.get(self.current) {
                Some(_) if self.stage_state(self.current) == State::Pending => State::Pending,
                _ => State::Running,
            },
            other => self.state_of_phase(other),
        }
    }

    pub(super) fn group_state(&self, g: u32) -> State {
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

    pub(super) fn stage_state(&self, si: usize) -> State {
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

    pub(super) fn gate_status(gates: &[GateRt]) -> Vec<GateStatus> {
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

    /// The run's status tree as the API shows it. O(members): call it to render, not per event
    /// ([`StatusChanges`] tells whether it changed without rendering it).
    pub fn status(&self) -> UpdateRunStatus {
        self.status_tree(true)
    }

    /// The statuses of group `g`'s members, in the order the status shows them.
    fn group_members(&self, g: u32) -> Vec<MemberStatus> {
        self.groups[g as usize]
            .members
            .iter()
            .map(|&m| self.member_status(m))
            .collect()
    }

    /// A Pending member's `waitingFor`: what holds it, its name (the run holding the cluster,
    /// the freeze) and its end where known (the member's wake-up).
    fn waiting_for_of(&self, m: u32) -> Option<crate::status::WaitingFor> {
        let member = &self.members[m as usize];
        let kind = member.waiting.filter(|_| member.state == State::Pending)?;
        let name = match kind {
            WaitReason::Lock => member.locked_by.as_deref().map(String::from),
            WaitReason::Freeze => member.timer.and_then(|until| {
                self.freezes
                    .freezes
                    .iter()
                    .filter(|c| c.members.as_ref().is_none_or(|s| s.contains(&*member.name)))
                    .find(|c| {
                        c.freeze.active_until(Time::from_unix(until.unix() - 1)) == Some(until)
                    })
                    .map(|c| c.freeze.name.clone())
            }),
            WaitReason::Budget => self.budget_name(m),
            _ => None,
        };
        Some(crate::status::WaitingFor {
            kind,
            name,
            // A budget has no end to wait for (its timer is the window's closing).
            until: member.timer.filter(|_| kind != WaitReason::Budget),
        })
    }

    fn member_status(&self, m: u32) -> MemberStatus {
        let member = &self.members[m as usize];
        let (before, rolled_back) = self.rollback_status(m);
        MemberStatus {
            status: UpdateStatus {
                start_time: member.start,
                completed_time: member.completed,
                state: member.state,
                error: member.error.as_deref().cloned(),
            },
            name: member.name.to_string(),
            cluster_resource_id: member.cluster_resource_id.to_string(),
            operation_id: member.operation_id.as_deref().map(String::from),
            message: member.message.as_deref().map(String::from),
            waiting_for: self.waiting_for_of(m),
            health_checks: self.member_checks(m),
            hops: self.hops_of(m),
            before,
            rolled_back,
        }
    }

    /// The status tree without its members: every group's `members` is empty. A few hundred
    /// bytes a group, whatever the run's size.
    pub fn status_skeleton(&self) -> UpdateRunStatus {
        self.status_tree(false)
    }

    /// The chunks of the status's members, in the order the status shows them: the members of
    /// the status's `slot`-th group (stages in order, each stage's groups in order), at most
    /// [`STATUS_CHUNK`] to a chunk. Each carries the revision of its last change, so a writer
    /// renders and stores only the chunks that changed since it last wrote them.
    pub fn status_chunks(&self) -> &[StatusChunk] {
        &self.revisions.chunks
    }

    /// Appends chunk `c`'s members' statuses to `out` as JSON, separated by commas (the text
    /// between a group's `[` and `]`, or a part of it).
    pub fn write_status_chunk(&self, c: usize, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let Some(chunk) = self.revisions.chunks.get(c) else {
            return Ok(());
        };
        let members = &self.groups[chunk.group as usize].members;
        let range = chunk.first as usize..(chunk.first + chunk.len) as usize;
        for (i, &m) in members[range].iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut *out, &self.member_status(m))?;
        }
        Ok(())
    }

    fn status_tree(&self, with_members: bool) -> UpdateRunStatus {
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
                    .enumerate()
                    .map(|(pos, &g)| {
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
                            members: if with_members {
                                self.group_members(g)
                            } else {
                                Vec::new()
                            },
                            before_gates: Self::gate_status(&group.before),
                            after_gates: Self::gate_status(&group.after),
                            message: group.message.clone(),
                            health_checks: self.scope_checks(si, Some(pos as u32)),
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
                    ends_at: stage.wait.end.filter(|_| self.time_scale() != 1.0),
                }),
                message: stage.message.clone(),
                health_checks: self.scope_checks(si, None),
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
            forecast: None,
            warnings: self.warnings.clone(),
            rollback_of: self.rollback.of.clone(),
            rolled_back_by: self.rollback.by.clone(),
            promoted_from: self.promoted_from.clone(),
            ended_on: self.ended_on(),
        }
    }

    /// What a Completed run left its members on, and whether it validates its target
    /// (SEMANTICS §14); `None` for a run not Completed and for a rollback run.
    fn ended_on(&self) -> Option<EndedOn> {
        if self.run_state() != State::Completed || self.rollback.of.is_some() {
            return None;
        }
        let upgrade = self.upgrade();
        // What the run's operations produced: members it skipped (behind by more than a minor,
        // already newer) validate nothing of its target.
        let upgraded = || {
            self.members
                .iter()
                .filter(|m| !m.removed && m.state == State::Completed && m.operation_id.is_some())
        };
        let mut images: BTreeMap<&str, &ImageVersion> = BTreeMap::new();
        if upgrade.changes_node_images() {
            for pool in upgraded().flat_map(|m| m.cluster.node_pools.iter()) {
                let oldest = images.entry(&pool.family).or_insert(&pool.image);
                if pool.image < **oldest {
                    *oldest = &pool.image;
                }
            }
        }
        let user_skipped = self.stages.iter().any(|s| s.user_skipped)
            || self.groups.iter().any(|g| g.user_skipped)
            || self.members.iter().any(|m| {
                m.state == State::Skipped
                    && m.message
                        .as_deref()
                        .is_some_and(|t| t.starts_with(SKIPPED_BY))
            });
        let failed = self.members.iter().any(|m| m.state == State::Failed);
        let message = if let Some(by) = &self.rollback.by {
            Some(format!("rolled back by {by}"))
        } else if failed {
            Some("a member failed".to_string())
        } else if user_skipped {
            Some("a member, group or stage was skipped by a user".to_string())
        } else if upgraded().next().is_none() {
            Some("no member was upgraded by an operation".to_string())
        } else {
            None
        };
        Some(EndedOn {
            kubernetes_version: upgrade
                .kubernetes_version
                .filter(|_| upgrade.changes_kubernetes()),
            node_image_versions: images
                .into_iter()
                .map(|(family, v)| SelectedNodeImageVersion {
                    version: format!("{family}-{v}"),
                })
                .collect(),
            validates: message.is_none(),
            message,
        })
    }
}

/// How many members' statuses a chunk holds: a 100,000-member run's members are about 200
/// chunks of 40 KB, so a step that changes a few members writes a few chunks, not 8 MB.
pub const STATUS_CHUNK: usize = 512;

/// One chunk of a run's member statuses (see [`Engine::status_chunks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusChunk {
    /// The place of the chunk's group in the status tree (stages in order, each stage's groups
    /// in order): the `slot`-th `members` list.
    pub slot: u32,
    group: u32,
    first: u32,
    len: u32,
    /// The member revision ([`Engine::status_revision`]) at the last change of one of its
    /// members' statuses; 0 when none changed since the run was created.
    pub revision: u64,
}

/// Counts the changes of members' statuses: in all, and per chunk of the status.
#[derive(Clone, Debug, Default)]
pub(super) struct StatusRevisions {
    /// Changes of a member's status so far.
    pub(super) members: u64,
    /// The chunk that holds each member's status.
    chunk_of: Vec<u32>,
    chunks: Vec<StatusChunk>,
}

impl StatusRevisions {
    /// The chunks of a run just created, in the order its status shows its members.
    pub(super) fn lay_out(engine: &Engine) -> StatusRevisions {
        let mut chunk_of = vec![0; engine.members.len()];
        let mut chunks = Vec::new();
        let groups = engine.stages.iter().flat_map(|stage| &stage.groups);
        for (slot, &g) in groups.enumerate() {
            let members = &engine.groups[g as usize].members;
            for (k, part) in members.chunks(STATUS_CHUNK).enumerate() {
                for &m in part {
                    chunk_of[m as usize] = chunks.len() as u32;
                }
                chunks.push(StatusChunk {
                    slot: slot as u32,
                    group: g,
                    first: (k * STATUS_CHUNK) as u32,
                    len: part.len() as u32,
                    revision: 0,
                });
            }
        }
        StatusRevisions {
            members: engine.revisions.members,
            chunk_of,
            chunks,
        }
    }

    /// Each chunk's revision, in order (for a checkpoint).
    pub(super) fn chunk_revisions(&self) -> Vec<u64> {
        self.chunks.iter().map(|c| c.revision).collect()
    }

    /// Sets each chunk's revision from a checkpoint; `Err` with the number of chunks the run
    /// has when the checkpoint's count differs.
    pub(super) fn set_chunk_revisions(&mut self, revisions: Vec<u64>) -> Result<(), usize> {
        if revisions.len() != self.chunks.len() {
            return Err(self.chunks.len());
        }
        for (chunk, r) in self.chunks.iter_mut().zip(revisions) {
            chunk.revision = r;
        }
        Ok(())
    }

    /// Counts that member `m`'s status is about to change.
    pub(super) fn touch(&mut self, m: u32) {
        self.members += 1;
        if let Some(&c) = self.chunk_of.get(m as usize)
            && let Some(chunk) = self.chunks.get_mut(c as usize)
        {
            chunk.revision = self.members;
        }
    }
}

/// Whether a run's status changed, without rendering it (FLEET-DESIGN.md: a step costs what
/// it changed). Any change of a member's status shows in the engine's member revision. The rest
/// of the tree (the run, stages, groups, gates and waits: a few hundred bytes a group) changes
/// only with its own revision (an event, or one of the few changes that emit none), and is then
/// compared with the one seen last. The simulator checks the claim in every scenario it runs
/// checking invariants.
#[derive(Clone, Debug, Default)]
pub struct StatusChanges {
    /// The tree without members, as last seen.
    skeleton: Option<UpdateRunStatus>,
    /// The run's [`Engine::status_revision`] when last seen.
    revision: (u64, u64),
}

impl StatusChanges {
    pub fn new() -> StatusChanges {
        StatusChanges::default()
    }

    /// Whether `engine`'s status (always the same run's engine) changed since the last call:
    /// a member's, or the rest of the tree.
    pub fn refresh(&mut self, engine: &Engine) -> bool {
        let (members, rest) = engine.status_revision();
        let seen_members = self.revision.0;
        if self.skeleton.is_some() && (members, rest) == self.revision {
            return false;
        }
        self.revision = (members, rest);
        // Taken again after a member's change too: a group's state follows its members, and
        // the tree kept must be the one last written.
        let skeleton = engine.status_tree(false);
        let mut changed = members != seen_members;
        if self.skeleton.as_ref() != Some(&skeleton) {
            self.skeleton = Some(skeleton);
            changed = true;
        }
        changed
    }
}
