//! A run's checkpoint: everything about it that changes after its creation, as text, so a shell
//! can rebuild the run from its creation (the snapshot) and the checkpoint instead of
//! replaying its whole input log (FLEET-DESIGN.md, "snapshots so a restart replays a bounded
//! tail").
//!
//! What creation decides (membership, groups, thresholds, gates and their ids, the upgrade) is
//! not in it: [`Engine::restore`] lays a checkpoint over an engine just created from the same
//! snapshot, and refuses one whose shape (members, groups, stages, gates) differs. What can be
//! recomputed from the rest is not in it either: a group's queue is its members queued under
//! their class, the timers of members are their own timers. A checkpoint names its format
//! (`v`); any other format, an unknown field, or an index out of range is an error naming it,
//! and the restored engine is recounted ([`Engine::check_invariants`]) before it is used.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::*;

/// The format this engine writes, and the only one it reads.
pub const CHECKPOINT_FORMAT: u64 = 1;

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetCk {
    view: crate::budget::Budgets,
    in_flight: Vec<u64>,
    /// (partition, group, class, member) of each member parked for a budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    parked: Vec<(u32, u32, u8, u32)>,
    /// Members an older engine queued again for a partition's free places, and partitions
    /// whose places it had yet to hand out: read from older checkpoints and no longer written.
    /// Such members are queued in their groups (restored with them) and reached as any other;
    /// a member parked now is reached when its partition has room.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    reserved: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    opened: Vec<u32>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Checkpoint {
    v: u64,
    /// The instant of the last settle: invariants are checked as of it.
    at: Time,
    /// Each distinct cluster the run holds, once (equal clusters are one entry, whether or not
    /// the run shares them); members point at them by index.
    clusters: Vec<Box<RawValue>>,
    /// Runs that hold members of this one, once; members point at them by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    holders: Vec<Arc<str>>,
    members: Vec<MemberCk>,
    groups: Vec<GroupCk>,
    stages: Vec<StageCk>,
    catalog: Catalog,
    /// The fleet's freezes as last given (SEMANTICS §12).
    #[serde(default, skip_serializing_if = "crate::freeze::Freezes::is_empty")]
    freezes: crate::freeze::Freezes,
    /// The fleet's disruption budgets as last given, and the members held for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budgets: Option<BudgetCk>,
    phase: RunPhase,
    current: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run_start: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run_completed: Option<Time>,
    in_flight: u64,
    failure_count: u64,
    group_failures: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    selected_images: Option<BTreeMap<String, String>>,
    next_attempt: u64,
    /// Timers of gates and waits (members' timers are in the members).
    timers: Vec<(Time, TimerCk)>,
    revision: u64,
    /// Each status chunk's revision, in order.
    chunk_revisions: Vec<u64>,
    polled: u64,
    quiet_changes: u64,
    /// Health and readiness checks under way and their results (SEMANTICS §10).
    #[serde(default, skip_serializing_if = "Health::is_empty")]
    health: Health,
    /// Members between hops due to go on at the next settle (SEMANTICS §13).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    hops_due: Vec<u32>,
    /// Members' states before their first operation, members rolling back, and the rollback
    /// run of this run (SEMANTICS §15).
    #[serde(
        default,
        skip_serializing_if = "super::rollback::RollbackState::is_empty"
    )]
    rollback: super::rollback::RollbackState,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
enum TimerCk {
    Gate(GateRef),
    Wait(u32),
}

/// One member, short keys: a run of 100,000 members writes 100,000 of these.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberCk {
    #[serde(rename = "c")]
    cluster: u32,
    #[serde(rename = "s")]
    state: State,
    #[serde(rename = "a", default, skip_serializing_if = "is_default")]
    attempt: u64,
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    target: Option<TargetCk>,
    #[serde(rename = "o", default, skip_serializing_if = "Option::is_none")]
    operation_id: Option<Box<str>>,
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    start: Option<Time>,
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none")]
    completed: Option<Time>,
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    message: Option<Box<str>>,
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorDetail>,
    #[serde(rename = "p", default, skip_serializing_if = "is_default")]
    place: Place,
    #[serde(rename = "w", default, skip_serializing_if = "Option::is_none")]
    timer: Option<Time>,
    #[serde(rename = "r", default, skip_serializing_if = "is_default")]
    reattaching: bool,
    #[serde(rename = "d", default, skip_serializing_if = "is_default")]
    removed: bool,
    #[serde(rename = "v", default, skip_serializing_if = "is_default")]
    verifying: bool,
    #[serde(rename = "rv", default, skip_serializing_if = "is_default")]
    reverify: bool,
    /// Index into the checkpoint's `holders`.
    #[serde(rename = "l", default, skip_serializing_if = "Option::is_none")]
    locked_by: Option<u32>,
    /// What it waits for while Pending.
    #[serde(rename = "wf", default, skip_serializing_if = "Option::is_none")]
    waiting: Option<WaitReason>,
    /// Its hops (SEMANTICS §13).
    #[serde(rename = "ch", default, skip_serializing_if = "Option::is_none")]
    chain: Option<super::chains::Chain>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetCk {
    #[serde(rename = "u")]
    upgrade_type: UpgradeType,
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    kubernetes_version: Option<String>,
    /// `[pool, family, image]`.
    #[serde(rename = "n", default, skip_serializing_if = "Vec::is_empty")]
    node_images: Vec<(String, String, String)>,
    /// A rollback step (SEMANTICS §15): the node pool (none: the control plane) and its
    /// orchestrator version.
    #[serde(rename = "rb", default, skip_serializing_if = "Option::is_none")]
    rollback: Option<(Option<String>, Option<String>)>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateCk {
    state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completed: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    absolute_start: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approved_by: Option<String>,
}

/// What a group and a stage have in common that changes.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Progress {
    phase: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<State>,
    #[serde(default, skip_serializing_if = "is_default")]
    user_skipped: bool,
    #[serde(default, skip_serializing_if = "is_default")]
    stopped: bool,
    before: Vec<GateCk>,
    after: Vec<GateCk>,
    in_flight: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completed: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorDetail>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupCk {
    #[serde(flatten)]
    progress: Progress,
    unfinished: u64,
    pending: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StageCk {
    #[serde(flatten)]
    progress: Progress,
    failure_count: u64,
    last_served: usize,
    wait: WaitCk,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitCk {
    state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completed: Option<Time>,
}

fn gate_ck(gate: &GateRt) -> GateCk {
    GateCk {
        state: gate.state,
        start: gate.start,
        completed: gate.completed,
        absolute_start: gate.absolute_start,
        approved_by: gate.approved_by.clone(),
    }
}

fn target_ck(target: &Target) -> TargetCk {
    TargetCk {
        upgrade_type: target.upgrade_type,
        kubernetes_version: target.kubernetes_version.map(|v| v.to_string()),
        node_images: target
            .node_images
            .iter()
            .map(|p| (p.pool.clone(), p.family.clone(), p.image.to_string()))
            .collect(),
        rollback: target.rollback.as_ref().map(|r| {
            let pool = match &r.scope {
                crate::fleet::RollbackScope::ControlPlane => None,
                crate::fleet::RollbackScope::NodePool(pool) => Some(pool.clone()),
            };
            (pool, r.orchestrator_version.map(|v| v.to_string()))
        }),
    }
}

fn target_rt(target: TargetCk, at: &str) -> Result<Target, String> {
    let kubernetes_version = target
        .kubernetes_version
        .map(|v| KubeVersion::parse(&v).ok_or_else(|| format!("{at}: version {v:?}")))
        .transpose()?;
    let node_images = target
        .node_images
        .into_iter()
        .map(|(pool, family, image)| {
            let image = ImageVersion::parse(&image)
                .ok_or_else(|| format!("{at}: node image version {image:?}"))?;
            Ok(PoolTarget {
                pool,
                family,
                image,
            })
        })
        .collect::<Result<_, String>>()?;
    let rollback = target
        .rollback
        .map(|(pool, version)| {
            let orchestrator_version = version
                .map(|v| KubeVersion::parse(&v).ok_or_else(|| format!("{at}: version {v:?}")))
                .transpose()?;
            let scope = match pool {
                None => crate::fleet::RollbackScope::ControlPlane,
                Some(pool) => crate::fleet::RollbackScope::NodePool(pool),
            };
            Ok::<_, String>(Rollback {
                scope,
                orchestrator_version,
            })
        })
        .transpose()?;
    Ok(Target {
        upgrade_type: target.upgrade_type,
        kubernetes_version,
        node_images,
        rollback,
    })
}

/// A group's or a stage's progress (both have these fields).
macro_rules! progress_ck {
    ($x:expr) => {
        Progress {
            phase: $x.phase,
            outcome: $x.outcome,
            user_skipped: $x.user_skipped,
            stopped: $x.stopped,
            before: $x.before.iter().map(gate_ck).collect(),
            after: $x.after.iter().map(gate_ck).collect(),
            in_flight: $x.in_flight,
            start: $x.start,
            completed: $x.completed,
            message: $x.message.clone(),
            error: $x.error.clone(),
        }
    };
}

/// Lays a saved progress over a group or a stage.
macro_rules! restore_progress {
    ($x:expr, $p:expr, $at:expr) => {{
        let p = $p;
        restore_gates(&mut $x.before, p.before, $at)?;
        restore_gates(&mut $x.after, p.after, $at)?;
        $x.phase = p.phase;
        $x.outcome = p.outcome;
        $x.user_skipped = p.user_skipped;
        $x.stopped = p.stopped;
        $x.in_flight = p.in_flight;
        $x.start = p.start;
        $x.completed = p.completed;
        $x.message = p.message;
        $x.error = p.error;
    }};
}

/// Lays the gates' states over gates created from the same snapshot.
fn restore_gates(gates: &mut [GateRt], saved: Vec<GateCk>, at: &str) -> Result<(), String> {
    if gates.len() != saved.len() {
        return Err(format!(
            "{at}: {} gates in the checkpoint, {} in the run",
            saved.len(),
            gates.len()
        ));
    }
    for (gate, s) in gates.iter_mut().zip(saved) {
        gate.state = s.state;
        gate.start = s.start;
        gate.completed = s.completed;
        gate.absolute_start = s.absolute_start;
        gate.approved_by = s.approved_by;
    }
    Ok(())
}

impl Engine {
    /// The run's checkpoint as of `at`, the instant of its last settle. Commands and events
    /// not yet taken are not part of it: a shell checkpoints a run whose queues it drained.
    pub fn checkpoint(&self, at: Time) -> Result<String, String> {
        if !self.commands.is_empty() || !self.events.is_empty() {
            return Err(format!(
                "run {:?} has commands or events not yet taken",
                self.run_name
            ));
        }
        let mut clusters: Vec<Box<RawValue>> = Vec::new();
        // By pointer first (a cluster shared is written once), then by text.
        let mut cluster_at: HashMap<*const Cluster, u32> = HashMap::new();
        let mut text_at: HashMap<String, u32> = HashMap::new();
        let mut holders: Vec<Arc<str>> = Vec::new();
        let mut holder_at: HashMap<Arc<str>, u32> = HashMap::new();
        let members = self
            .members
            .iter()
            .enumerate()
            .map(|(index, m)| {
                let cluster = match cluster_at.get(&Arc::as_ptr(&m.cluster)) {
                    Some(&i) => i,
                    None => {
                        let text = serde_json::to_string(&*m.cluster).map_err(|e| e.to_string())?;
                        let i = match text_at.get(&text) {
                            Some(&i) => i,
                            None => {
                                let raw = RawValue::from_string(text.clone())
                                    .map_err(|e| e.to_string())?;
                                clusters.push(raw);
                                let i = clusters.len() as u32 - 1;
                                text_at.insert(text, i);
                                i
                            }
                        };
                        cluster_at.insert(Arc::as_ptr(&m.cluster), i);
                        i
                    }
                };
                let locked_by = m.locked_by.as_ref().map(|h| {
                    *holder_at.entry(h.clone()).or_insert_with(|| {
                        holders.push(h.clone());
                        holders.len() as u32 - 1
                    })
                });
                Ok(MemberCk {
                    cluster,
                    state: m.state,
                    attempt: m.attempt,
                    target: m.target.as_deref().map(target_ck),
                    operation_id: m.operation_id.clone(),
                    start: m.start,
                    completed: m.completed,
                    message: m.message.clone(),
                    error: m.error.as_deref().cloned(),
                    place: m.place,
                    timer: m.timer,
                    reattaching: m.reattaching,
                    removed: m.removed,
                    verifying: m.verifying,
                    reverify: m.reverify,
                    locked_by,
                    waiting: m.waiting,
                    chain: self.chains.get(&(index as u32)).cloned(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let checkpoint = Checkpoint {
            v: CHECKPOINT_FORMAT,
            at,
            clusters,
            holders,
            members,
            groups: self
                .groups
                .iter()
                .map(|g| GroupCk {
                    progress: progress_ck!(g),
                    unfinished: g.unfinished,
                    pending: g.pending,
                })
                .collect(),
            stages: self
                .stages
                .iter()
                .map(|s| StageCk {
                    progress: progress_ck!(s),
                    failure_count: s.failure_count,
                    last_served: s.last_served,
                    wait: WaitCk {
                        state: s.wait.state,
                        start: s.wait.start,
                        end: s.wait.end,
                        completed: s.wait.completed,
                    },
                })
                .collect(),
            catalog: self.catalog.clone(),
            freezes: (*self.freezes).clone(),
            budgets: (!self.budget.view.is_empty()).then(|| BudgetCk {
                view: (*self.budget.view).clone(),
                in_flight: self.budget.in_flight.clone(),
                parked: self.budget.parked.iter().copied().collect(),
                reserved: Vec::new(),
                opened: Vec::new(),
            }),
            phase: self.phase,
            current: self.current,
            run_start: self.run_start,
            run_completed: self.run_completed,
            in_flight: self.in_flight,
            failure_count: self.failure_count,
            group_failures: self.group_failures.clone(),
            selected_images: self.selected_images.as_ref().map(|images| {
                images
                    .iter()
                    .map(|(family, v)| (family.clone(), v.to_string()))
                    .collect()
            }),
            next_attempt: self.next_attempt,
            timers: self
                .timers
                .iter()
                .filter_map(|&(t, key)| match key {
                    TimerKey::Gate(g) => Some((t, TimerCk::Gate(g))),
                    TimerKey::Wait(s) => Some((t, TimerCk::Wait(s))),
                    // Kept by the members and the watches themselves.
                    TimerKey::Member(_) | TimerKey::Watch(_) => None,
                })
                .collect(),
            revision: self.revisions.members,
            chunk_revisions: self.revisions.chunk_revisions(),
            polled: self.polled,
            quiet_changes: self.quiet_changes,
            health: self.health.clone(),
            hops_due: self.hops_due.iter().copied().collect(),
            rollback: self.rollback.clone(),
        };
        serde_json::to_string(&checkpoint).map_err(|e| e.to_string())
    }

    /// Lays a checkpoint over this engine, which must have just been created from the run's
    /// snapshot. On an error the engine is left as it was.
    pub fn restore(&mut self, text: &str) -> Result<(), String> {
        let mut restored = self.clone();
        restored.restore_into(text)?;
        *self = restored;
        Ok(())
    }

    fn restore_into(&mut self, text: &str) -> Result<(), String> {
        #[derive(Deserialize)]
        struct Version {
            v: Option<u64>,
        }
        let version: Version =
            serde_json::from_str(text).map_err(|e| format!("checkpoint: {e}"))?;
        if version.v != Some(CHECKPOINT_FORMAT) {
            return Err(format!(
                "checkpoint of format {:?}; this server reads format {CHECKPOINT_FORMAT}",
                version.v
            ));
        }
        let ck: Checkpoint = serde_json::from_str(text).map_err(|e| format!("checkpoint: {e}"))?;
        let shape = |what: &str, saved: usize, here: usize| {
            if saved == here {
                Ok(())
            } else {
                Err(format!(
                    "checkpoint holds {saved} {what}, the run {here}: not this run's checkpoint"
                ))
            }
        };
        shape("members", ck.members.len(), self.members.len())?;
        shape("groups", ck.groups.len(), self.groups.len())?;
        shape("stages", ck.stages.len(), self.stages.len())?;
        shape(
            "group failure counts",
            ck.group_failures.len(),
            self.groups.len(),
        )?;
        if ck.current > self.stages.len() {
            return Err(format!(
                "checkpoint: current stage {} out of range",
                ck.current
            ));
        }
        let chunks = ck.chunk_revisions.len();
        self.revisions
            .set_chunk_revisions(ck.chunk_revisions)
            .map_err(|here| format!("checkpoint holds {chunks} status chunks, the run {here}"))?;
        self.revisions.members = ck.revision;
        self.timers.clear();
        for (t, key) in ck.timers {
            let key = match key {
                TimerCk::Gate(g) => {
                    if self.gate_mut(g).is_none() {
                        return Err(format!(
                            "checkpoint: a timer names gate {g:?}, not in the run"
                        ));
                    }
                    TimerKey::Gate(g)
                }
                TimerCk::Wait(s) => {
                    if s as usize >= self.stages.len() {
                        return Err(format!(
                            "checkpoint: a timer names stage {s}, not in the run"
                        ));
                    }
                    TimerKey::Wait(s)
                }
            };
            self.timers.insert((t, key));
        }
        for group in &mut self.groups {
            group.ready.clear();
        }
        let clusters = ck
            .clusters
            .iter()
            .enumerate()
            .map(|(i, raw)| {
                serde_json::from_str::<Arc<Cluster>>(raw.get())
                    .map_err(|e| format!("checkpoint: cluster {i}: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut chains = BTreeMap::new();
        for (i, (m, s)) in self.members.iter_mut().zip(ck.members).enumerate() {
            let at = format!("checkpoint: member {}", m.name);
            m.cluster = clusters
                .get(s.cluster as usize)
                .ok_or_else(|| format!("{at}: cluster {} out of range", s.cluster))?
                .clone();
            m.waiting = s.waiting;
            m.locked_by = s
                .locked_by
                .map(|h| {
                    ck.holders
                        .get(h as usize)
                        .cloned()
                        .ok_or_else(|| format!("{at}: holder {h} out of range"))
                })
                .transpose()?;
            m.target = s
                .target
                .map(|t| target_rt(t, &at).map(Box::new))
                .transpose()?;
            m.state = s.state;
            m.attempt = s.attempt;
            m.operation_id = s.operation_id;
            m.start = s.start;
            m.completed = s.completed;
            m.message = s.message;
            m.error = s.error.map(Box::new);
            if let Place::Queued(class) = s.place {
                self.groups[m.group as usize]
                    .ready
                    .insert((class, i as u32));
            }
            m.place = s.place;
            m.timer = s.timer;
            if let Some(t) = s.timer {
                self.timers.insert((t, TimerKey::Member(i as u32)));
            }
            m.reattaching = s.reattaching;
            m.removed = s.removed;
            m.verifying = s.verifying;
            m.reverify = s.reverify;
            if let Some(chain) = s.chain {
                chains.insert(i as u32, chain);
            }
        }
        self.chains = chains;
        for (g, (group, s)) in self.groups.iter_mut().zip(ck.groups).enumerate() {
            let at = format!("checkpoint: group {}", group.name);
            restore_progress!(group, s.progress, &at);
            group.unfinished = s.unfinished;
            group.pending = s.pending;
            self.group_failures[g] = ck.group_failures[g];
        }
        for (stage, s) in self.stages.iter_mut().zip(ck.stages) {
            let at = format!("checkpoint: stage {}", stage.name);
            if s.last_served >= stage.groups.len().max(1) {
                return Err(format!("{at}: group {} out of range", s.last_served));
            }
            restore_progress!(stage, s.progress, &at);
            stage.failure_count = s.failure_count;
            stage.last_served = s.last_served;
            stage.wait.state = s.wait.state;
            stage.wait.start = s.wait.start;
            stage.wait.end = s.wait.end;
            stage.wait.completed = s.wait.completed;
        }
        self.catalog = ck.catalog;
        self.freezes = Arc::new(ck.freezes);
        self.budget = match ck.budgets {
            None => BudgetState::default(),
            Some(b) => self.budget_from(b)?,
        };
        self.disruptions.clear();
        self.released.clear();
        if let Some(m) = ck
            .hops_due
            .iter()
            .find(|&&m| m as usize >= self.members.len())
        {
            return Err(format!(
                "checkpoint: member {m} due for a hop is out of range"
            ));
        }
        self.hops_due = ck.hops_due.into_iter().collect();
        let n = self.members.len() as u32;
        let r = &ck.rollback;
        if let Some(m) = r
            .befores
            .keys()
            .chain(r.rolling.keys())
            .chain(r.due.iter())
            .chain(r.rolled_back.keys())
            .find(|&&m| m >= n)
        {
            return Err(format!(
                "checkpoint: rollback state names member {m}, out of range"
            ));
        }
        // What creation decided (a rollback run's origin and targets) stays.
        let (of, targets) = (
            self.rollback.of.take(),
            std::mem::take(&mut self.rollback.targets),
        );
        self.rollback = ck.rollback;
        self.rollback.of = of;
        self.rollback.targets = targets;
        self.phase = ck.phase;
        self.current = ck.current;
        self.run_start = ck.run_start;
        self.run_completed = ck.run_completed;
        self.in_flight = ck.in_flight;
        self.failure_count = ck.failure_count;
        self.selected_images = ck
            .selected_images
            .map(|images| {
                images
                    .into_iter()
                    .map(|(family, v)| {
                        ImageVersion::parse(&v)
                            .map(|v| (family.clone(), v))
                            .ok_or_else(|| {
                                format!("checkpoint: selected image {family}-{v} is not a version")
                            })
                    })
                    .collect()
            })
            .transpose()?;
        self.next_attempt = ck.next_attempt;
        self.commands.clear();
        self.events.clear();
        self.polled = ck.polled;
        self.quiet_changes = ck.quiet_changes;
        self.health = ck.health;
        let subjects: Vec<_> = self.health.subjects().collect();
        for subject in subjects {
            let Some(checks) = self.checks_of_checked(subject) else {
                return Err(format!(
                    "checkpoint: checks are watched for {subject:?}, which has none in the run"
                ));
            };
            if !self.health.fits(subject, checks.checks.len()) {
                return Err(format!(
                    "checkpoint: the watch of {subject:?} holds answers for another number of checks than its {}",
                    checks.checks.len()
                ));
            }
        }
        let watch_timers: Vec<_> = self.health.timers().collect();
        for (t, subject) in watch_timers {
            self.timers.insert((t, TimerKey::Watch(subject)));
        }
        self.check_invariants(ck.at)
            .map_err(|why| format!("checkpoint does not hold together: {why}"))
    }

    /// Where this engine differs from `other`, field by field (for tests of checkpoints and
    /// replays): `None` when they are the same run in the same state.
    pub fn differences(&self, other: &Engine) -> Option<String> {
        // Every field is named (the destructuring has no `..`), so a field added later must
        // be decided on here. Fields are compared by their Debug text; the member index in
        // name order (a hash map's own order is its hasher's), members one by one below.
        macro_rules! same {
            ($($field:ident),*) => {
                // What the fleet engine has yet to take is not the run's state.
                let Engine { members: _, disruptions: _, released: _, member_index, $($field),* } = self;
                let mut index: Vec<_> = member_index.iter().collect();
                index.sort();
                let mut other_index: Vec<_> = other.member_index.iter().collect();
                other_index.sort();
                if format!("{index:?}") != format!("{other_index:?}") {
                    return Some(format!("run {:?}: member_index differs", self.run_name));
                }
                $(
                    if format!("{:?}", $field) != format!("{:?}", other.$field) {
                        return Some(format!("run {:?}: {} differs", self.run_name, stringify!($field)));
                    }
                )*
            };
        }
        same!(
            run_name,
            upgrade,
            rules,
            catalog,
            freezes,
            budget,
            groups,
            group_failures,
            stages,
            phase,
            current,
            run_start,
            run_completed,
            in_flight,
            failure_count,
            selected_images,
            next_attempt,
            timers,
            commands,
            events,
            revisions,
            polled,
            quiet_changes,
            warnings,
            health,
            chains,
            hops_due,
            rollback,
            promoted_from,
            time_scale
        );
        // Members one by one, so a difference names the member.
        for (a, b) in self.members.iter().zip(&other.members) {
            let (a, b) = (format!("{a:?}"), format!("{b:?}"));
            if a != b {
                return Some(format!(
                    "run {:?}: member differs:\n  {a}\n  {b}",
                    self.run_name
                ));
            }
        }
        (self.members.len() != other.members.len())
            .then(|| format!("run {:?}: member counts differ", self.run_name))
    }

    /// The budgets of a checkpoint, checked against the run.
    fn budget_from(&self, b: BudgetCk) -> Result<BudgetState, String> {
        let partitions = b.view.partitions.len();
        if b.in_flight.len() != partitions || b.view.in_flight.len() != partitions {
            return Err(format!(
                "checkpoint: budgets have {partitions} partitions but counts for {}",
                b.in_flight.len()
            ));
        }
        let members = self.members.len();
        let mut state = BudgetState {
            in_flight: b.in_flight,
            view: Arc::new(b.view),
            ..BudgetState::default()
        };
        for (p, g, class, m) in b.parked {
            if m as usize >= members
                || p as usize >= partitions
                || self.members[m as usize].group != g
            {
                return Err(format!(
                    "checkpoint: a member held by a budget is out of range ({p}, {g}, {m})"
                ));
            }
            state.parked.insert((p, g, class, m));
            state.held.insert(m, (p, class));
        }
        if let Some(m) = b.reserved.iter().find(|&&m| m as usize >= members) {
            return Err(format!("checkpoint: reserved member {m} out of range"));
        }
        Ok(state)
    }
}
