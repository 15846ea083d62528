//! Rollback where the provider allows it (SEMANTICS §15).
//!
//! Every member's state just before its first operation is recorded (`before`). A member is
//! *rolling back* (kept in `RollbackState::rolling`, beside the members) either automatically
//! (its health check failed and its checks say `onFailure: RollBack`) or as a member of a
//! rollback run (whose target is its `before` in the original run). A rollback is one
//! operation per scope that differs from `before` — node pools first, then the control plane,
//! so no pool is ever newer than its control plane — each with its own attempt, recorded as
//! intended before it is sent, back to back in the member's slot. Before each step every
//! remaining scope must be offered by the driver with a `to` equal to `before` and an `until`
//! still ahead; otherwise nothing is sent and the rollback ends with the reason. Between two
//! steps the member holds its cluster, like a member between two hops of a chain; the next
//! step is decided at the next settle (`due`).

use serde::{Deserialize, Serialize};

use super::*;
use crate::fleet::{RollbackOffer, RollbackScope};
use crate::threshold::Amount;

/// A member's cluster as it was before the run's first operation on it (its status's
/// `before`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Before {
    pub kubernetes_version: KubeVersion,
    #[serde(default)]
    pub node_pools: Vec<PoolBefore>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolBefore {
    pub name: String,
    pub family: String,
    pub node_image_version: ImageVersion,
    pub orchestrator_version: KubeVersion,
}

impl Before {
    pub fn of(cluster: &Cluster) -> Before {
        Before {
            kubernetes_version: cluster.kubernetes_version,
            node_pools: cluster
                .node_pools
                .iter()
                .map(|p| PoolBefore {
                    name: p.name.clone(),
                    family: p.family.clone(),
                    node_image_version: p.image.clone(),
                    orchestrator_version: p.kubernetes_version(cluster),
                })
                .collect(),
        }
    }

    /// The operations that take `cluster` back to this state: one per node pool that differs
    /// (in this state's order), then the control plane if it differs. A pool the cluster no
    /// longer has is left out.
    pub fn steps(&self, cluster: &Cluster) -> Vec<Target> {
        let mut steps = Vec::new();
        for before in &self.node_pools {
            let Some(pool) = cluster.node_pools.iter().find(|p| p.name == before.name) else {
                continue;
            };
            if pool.image != before.node_image_version
                || pool.kubernetes_version(cluster) != before.orchestrator_version
            {
                steps.push(Target {
                    upgrade_type: UpgradeType::NodeImageOnly,
                    kubernetes_version: None,
                    node_images: vec![PoolTarget {
                        pool: before.name.clone(),
                        family: before.family.clone(),
                        image: before.node_image_version.clone(),
                    }],
                    rollback: Some(Rollback {
                        scope: RollbackScope::NodePool(before.name.clone()),
                        orchestrator_version: Some(before.orchestrator_version),
                    }),
                });
            }
        }
        if cluster.kubernetes_version != self.kubernetes_version {
            steps.push(Target {
                upgrade_type: UpgradeType::ControlPlaneOnly,
                kubernetes_version: Some(self.kubernetes_version),
                node_images: Vec::new(),
                rollback: Some(Rollback {
                    scope: RollbackScope::ControlPlane,
                    orchestrator_version: None,
                }),
            });
        }
        steps
    }

    /// The steps back to this state, if the driver offers every one of them now (SEMANTICS
    /// §15); else why not.
    pub fn offered_steps(&self, cluster: &Cluster, now: Time) -> Result<Vec<Target>, String> {
        let steps = self.steps(cluster);
        for step in &steps {
            offered(step, &cluster.rollback, now)?;
        }
        Ok(steps)
    }
}

/// What a step takes its scope back to, as text.
fn step_to(target: &Target) -> String {
    match target.rollback.as_ref().map(|r| &r.scope) {
        Some(RollbackScope::NodePool(_)) => {
            let image = target
                .node_images
                .first()
                .map_or_else(String::new, |p| format!("{}-{}", p.family, p.image));
            let version = target
                .rollback
                .as_ref()
                .and_then(|r| r.orchestrator_version)
                .map_or_else(String::new, |v| format!("Kubernetes {v}, "));
            format!("{version}node image {image}")
        }
        _ => target
            .kubernetes_version
            .map_or_else(String::new, |v| format!("Kubernetes {v}")),
    }
}

fn offer_to(offer: &RollbackOffer) -> String {
    match (&offer.scope, &offer.node_image) {
        (RollbackScope::NodePool(_), Some(image)) => {
            format!(
                "Kubernetes {}, node image {image}",
                offer.kubernetes_version
            )
        }
        _ => format!("Kubernetes {}", offer.kubernetes_version),
    }
}

/// Whether `offers` hold a rollback of `step`'s scope to exactly its versions, not expired.
fn offered(step: &Target, offers: &[RollbackOffer], now: Time) -> Result<(), String> {
    let Some(rollback) = &step.rollback else {
        return Ok(());
    };
    let scope = &rollback.scope;
    let Some(offer) = offers.iter().find(|o| &o.scope == scope) else {
        return Err(format!(
            "the driver offers no rollback of {scope} (it was to go back to {})",
            step_to(step)
        ));
    };
    let matches = match scope {
        RollbackScope::ControlPlane => Some(offer.kubernetes_version) == step.kubernetes_version,
        RollbackScope::NodePool(_) => {
            Some(offer.kubernetes_version) == rollback.orchestrator_version
                && offer.node_image.as_ref() == step.node_images.first().map(|p| &p.image)
        }
    };
    if !matches {
        return Err(format!(
            "the driver offers to roll {scope} back to {}, not to its state before the run ({})",
            offer_to(offer),
            step_to(step)
        ));
    }
    if offer.until <= now {
        return Err(format!(
            "the rollback of {scope} was offered until {}, which has passed",
            offer.until
        ));
    }
    Ok(())
}

/// Applies a rollback step that succeeded: its scope is exactly at the step's versions, and
/// the driver offers that rollback no more.
pub(super) fn apply_rollback(cluster: &mut Cluster, target: &Target, rollback: &Rollback) {
    match &rollback.scope {
        RollbackScope::ControlPlane => {
            if let Some(v) = target.kubernetes_version {
                let current = cluster.kubernetes_version;
                for pool in &mut cluster.node_pools {
                    let at = pool.orchestrator_version.unwrap_or(current);
                    pool.orchestrator_version = (at != v).then_some(at);
                }
                cluster.kubernetes_version = v;
            }
        }
        RollbackScope::NodePool(name) => {
            let control_plane = cluster.kubernetes_version;
            if let Some(pool) = cluster.node_pools.iter_mut().find(|p| &p.name == name) {
                if let Some(t) = target.node_images.first() {
                    pool.image = t.image.clone();
                }
                if let Some(v) = rollback.orchestrator_version {
                    pool.orchestrator_version = (v != control_plane).then_some(v);
                }
            }
        }
    }
    cluster.rollback.retain(|o| o.scope != rollback.scope);
}

/// What a simulated cluster offers to roll back after an upgrade took it from `was` (SEMANTICS
/// §15): each scope that changed, to its state before its first change, until `until`. The
/// simulator and the `sim` driver both offer this.
pub fn offer_rollbacks(cluster: &mut Cluster, was: &Cluster, until: Time) {
    let mut offers = std::mem::take(&mut cluster.rollback);
    let mut offer = |scope: RollbackScope, kubernetes_version, node_image| {
        if !offers.iter().any(|o| o.scope == scope) {
            offers.push(RollbackOffer {
                scope,
                kubernetes_version,
                node_image,
                until,
            });
        }
    };
    if was.kubernetes_version != cluster.kubernetes_version {
        offer(RollbackScope::ControlPlane, was.kubernetes_version, None);
    }
    for before in &was.node_pools {
        let Some(pool) = cluster.node_pools.iter().find(|p| p.name == before.name) else {
            continue;
        };
        let version = before.kubernetes_version(was);
        if pool.image != before.image || pool.kubernetes_version(cluster) != version {
            offer(
                RollbackScope::NodePool(before.name.clone()),
                version,
                Some(before.image.clone()),
            );
        }
    }
    cluster.rollback = offers;
}

/// Whether a cluster is where a rollback step takes it.
pub(super) fn rolled_back_to(cluster: &Cluster, target: &Target, rollback: &Rollback) -> bool {
    match &rollback.scope {
        RollbackScope::ControlPlane => {
            target.kubernetes_version == Some(cluster.kubernetes_version)
        }
        RollbackScope::NodePool(name) => cluster.node_pools.iter().any(|p| {
            &p.name == name
                && target
                    .node_images
                    .first()
                    .is_none_or(|t| t.image == p.image)
                && rollback
                    .orchestrator_version
                    .is_none_or(|v| p.kubernetes_version(cluster) == v)
        }),
    }
}

/// What a rollback run is made of (SEMANTICS §15): the original run, its upgrade's type, and
/// its stages in reverse order with their groups, ceilings, member health checks and the
/// members to roll back with their state before the original run. Serializable, so a shell
/// keeps it as the rollback run's snapshot and builds the same run again from it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackPlan {
    pub rollback_of: String,
    pub upgrade_type: UpgradeType,
    pub stages: Vec<PlanStage>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanStage {
    pub name: String,
    pub max_concurrency: u64,
    pub groups: Vec<PlanGroup>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanGroup {
    pub name: String,
    pub max_concurrency: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_health_checks: Option<crate::checks::Checks>,
    pub members: Vec<PlanMember>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanMember {
    pub name: String,
    pub before: Before,
}

impl RollbackPlan {
    /// The run's strategy: the plan's stages and groups, every threshold of failures 100 %,
    /// one Approval gate before the first stage, no other gate and no wait.
    pub(super) fn strategy(&self) -> Strategy {
        let all = Some(Amount::Percent(100));
        Strategy {
            stages: self
                .stages
                .iter()
                .enumerate()
                .map(|(si, stage)| Stage {
                    name: stage.name.clone(),
                    groups: stage
                        .groups
                        .iter()
                        .map(|g| Group {
                            name: g.name.clone(),
                            selector: None,
                            max_concurrency: Some(Amount::Count(g.max_concurrency.max(1))),
                            max_allowed_failures: all,
                            before_gates: Vec::new(),
                            after_gates: Vec::new(),
                            member_health: g.member_health_checks.clone().map(Arc::new),
                            readiness: None,
                        })
                        .collect(),
                    selector: None,
                    wait_seconds: 0,
                    max_concurrency: Some(Amount::Count(stage.max_concurrency.max(1))),
                    max_allowed_failures: all,
                    before_gates: if si == 0 {
                        vec![Gate {
                            kind: GateKind::Approval,
                            display_name: Some(format!("roll back {}", self.rollback_of)),
                        }]
                    } else {
                        Vec::new()
                    },
                    after_gates: Vec::new(),
                    member_health: None,
                    readiness: None,
                })
                .collect(),
        }
    }

    /// Each member's stage and group in the plan.
    pub(super) fn assignment(&self) -> HashMap<&str, (usize, &str)> {
        let mut at = HashMap::new();
        for (si, stage) in self.stages.iter().enumerate() {
            for group in &stage.groups {
                for m in &group.members {
                    at.insert(m.name.as_str(), (si, group.name.as_str()));
                }
            }
        }
        at
    }
}

/// A member rolling back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Rolling {
    /// Rolled back automatically: why its health check failed. `None`: in a rollback run.
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    pub(super) auto: Option<String>,
    /// Its last step succeeded and the next is not sent yet: it holds its cluster.
    #[serde(rename = "b", default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) between: bool,
}

/// What a run knows of rollbacks (SEMANTICS §15).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RollbackState {
    /// Each member's state before the run's first operation on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) befores: BTreeMap<u32, Before>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) rolling: BTreeMap<u32, Rolling>,
    /// Members rolling back whose next step the next settle decides.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(super) due: BTreeSet<u32>,
    /// Whether each member that was to be rolled back was.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) rolled_back: BTreeMap<u32, bool>,
    /// The rollback run made of this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) by: Option<String>,
    /// A rollback run: the original run (decided at creation, not checkpointed).
    #[serde(skip)]
    pub(super) of: Option<String>,
    /// A rollback run: each member's target, its state before the original run.
    #[serde(skip)]
    pub(super) targets: BTreeMap<u32, Before>,
}

impl RollbackState {
    pub(super) fn is_empty(&self) -> bool {
        self.befores.is_empty()
            && self.rolling.is_empty()
            && self.due.is_empty()
            && self.rolled_back.is_empty()
            && self.by.is_none()
    }
}

impl Engine {
    /// Creates a rollback run from its plan over the fleet's members (SEMANTICS §15): the
    /// plan's members only, each in its plan's group.
    pub fn create_rollback<'a>(
        run_name: &str,
        plan: &RollbackPlan,
        fleet: impl IntoIterator<Item = &'a SharedMember>,
        catalog: Catalog,
    ) -> Result<Engine, ApiError> {
        let assignment = plan.assignment();
        let spec = RunSpec {
            strategy: Some(plan.strategy()),
            upgrade: Upgrade {
                upgrade_type: plan.upgrade_type,
                kubernetes_version: None,
                node_images: NodeImageSelection::Latest,
            },
            rules: RunRules::default(),
        };
        let members: Vec<&SharedMember> = fleet
            .into_iter()
            .filter(|m| assignment.contains_key(&*m.name))
            .collect();
        let (mut engine, _) =
            Engine::create_assigned(run_name, &spec, members, catalog, Some(&assignment))?;
        engine.warnings.clear();
        engine.rollback.of = Some(plan.rollback_of.clone());
        for stage in &plan.stages {
            for group in &stage.groups {
                for member in &group.members {
                    if let Some(&m) = engine.member_index.get(member.name.as_str()) {
                        engine.rollback.targets.insert(m, member.before.clone());
                    }
                }
            }
        }
        Ok(engine)
    }

    /// The plan of a rollback run of this run (SEMANTICS §15): its members that an operation
    /// changed and that are not rolled back yet (their cluster, as `current` says it is now,
    /// differs from their `before`), in its stages in reverse order; stages left with no such
    /// member are left out. `None`: the run changed nothing that is not rolled back.
    pub fn rollback_plan(
        &self,
        current: impl Fn(&str) -> Option<Arc<Cluster>>,
    ) -> Option<RollbackPlan> {
        let mut stages = Vec::new();
        for stage in self.stages.iter().rev() {
            let groups: Vec<PlanGroup> = stage
                .groups
                .iter()
                .map(|&g| {
                    let group = &self.groups[g as usize];
                    let members = group
                        .members
                        .iter()
                        .filter(|&&m| self.rollback.rolled_back.get(&m) != Some(&true))
                        .filter_map(|&m| {
                            let before = self.rollback.befores.get(&m)?;
                            let name = &self.members[m as usize].name;
                            let cluster = current(name)
                                .unwrap_or_else(|| self.members[m as usize].cluster.clone());
                            (!before.steps(&cluster).is_empty()).then(|| PlanMember {
                                name: name.to_string(),
                                before: before.clone(),
                            })
                        })
                        .collect();
                    PlanGroup {
                        name: group.name.clone(),
                        max_concurrency: group.max_concurrency,
                        member_health_checks: group.member_health.as_deref().cloned(),
                        members,
                    }
                })
                .collect();
            if groups.iter().any(|g| !g.members.is_empty()) {
                stages.push(PlanStage {
                    name: stage.name.clone(),
                    max_concurrency: stage.max_concurrency,
                    groups,
                });
            }
        }
        (!stages.is_empty()).then(|| RollbackPlan {
            rollback_of: self.run_name.clone(),
            upgrade_type: self.upgrade.upgrade_type,
            stages,
        })
    }

    /// The original run, if this is a rollback run.
    pub fn rollback_of(&self) -> Option<&str> {
        self.rollback.of.as_deref()
    }

    /// The rollback run made of this run, if any.
    pub fn rolled_back_by(&self) -> Option<&str> {
        self.rollback.by.as_deref()
    }

    /// Records that `by` is the rollback run of this run: it cannot be started again.
    pub(super) fn set_rolled_back_by(&mut self, now: Time, by: String) {
        if self.rollback.by.is_some() {
            return;
        }
        self.rollback.by = Some(by.clone());
        self.emit(
            now,
            EventType::RollbackRunCreated,
            None,
            None,
            None,
            Some(format!("update run {by:?} rolls this run back")),
        );
    }

    /// A member's state before its first operation, recorded once.
    pub(super) fn record_before(&mut self, m: u32) {
        if !self.rollback.befores.contains_key(&m) {
            let before = Before::of(&self.members[m as usize].cluster);
            self.rollback.befores.insert(m, before);
        }
    }

    /// Whether a member whose health check fails is rolled back (SEMANTICS §15): its checks
    /// say so, and this is not a rollback run.
    pub(super) fn rolls_back_on_failure(&self, m: u32) -> bool {
        self.rollback.of.is_none()
            && self.groups[self.members[m as usize].group as usize]
                .member_health
                .as_ref()
                .is_some_and(|c| c.on_failure == crate::checks::OnFailure::RollBack)
    }

    /// Member `m` failed its health check `why` and is rolled back at once, in its slot.
    pub(super) fn begin_auto_rollback(&mut self, m: u32, why: String) {
        self.touch(m);
        let member = &mut self.members[m as usize];
        member.verifying = false;
        member.message = Some(format!("{why}; rolling back").into());
        self.rollback.rolling.insert(
            m,
            Rolling {
                auto: Some(why),
                between: false,
            },
        );
        self.rollback.due.insert(m);
    }

    /// Whether member `m` is between two rollback steps (it holds its cluster).
    pub(super) fn rollback_between(&self, m: u32) -> bool {
        self.rollback.rolling.get(&m).is_some_and(|r| r.between)
    }

    /// Whether member `m` is rolling back.
    pub(super) fn is_rolling(&self, m: u32) -> bool {
        self.rollback.rolling.contains_key(&m)
    }

    /// A rollback run's decision for a member (SEMANTICS §15): at its `before` it is done;
    /// otherwise its first step, if the driver offers every step.
    pub(super) fn decide_rollback(&self, m: u32, before: &Before, now: Time) -> Decision {
        let cluster = &self.members[m as usize].cluster;
        match before.offered_steps(cluster, now) {
            Ok(steps) => match steps.into_iter().next() {
                Some(step) => Decision::Upgrade(step),
                None => Decision::Skip(format!(
                    "already at its state before update run {:?}",
                    self.rollback.of.as_deref().unwrap_or_default()
                )),
            },
            Err(why) => Decision::Fail {
                code: "RollbackNotAvailable",
                message: why,
            },
        }
    }

    /// Sends a rollback step: its attempt, its command, its event.
    pub(super) fn send_rollback_step(&mut self, now: Time, m: u32, step: Target) {
        let label = match &step.rollback {
            Some(r) => format!("rolling back {} to {}", r.scope, step_to(&step)),
            None => String::new(),
        };
        self.touch(m);
        let rolling = self.rollback.rolling.entry(m).or_insert(Rolling {
            auto: None,
            between: false,
        });
        rolling.between = false;
        self.send_operation(m, step);
        self.emit_member(now, EventType::MemberRollingBack, m, Some(label));
    }

    /// A rollback step of member `m` ended.
    pub(super) fn rollback_step_finished(
        &mut self,
        now: Time,
        m: u32,
        outcome: Result<(), String>,
    ) {
        match outcome {
            Ok(()) => {
                let member = &mut self.members[m as usize];
                if let Some(target) = &member.target {
                    apply_target(Arc::make_mut(&mut member.cluster), target);
                }
                if let Some(r) = self.rollback.rolling.get_mut(&m) {
                    r.between = true;
                }
                self.rollback.due.insert(m);
            }
            Err(why) => {
                let scope = self.members[m as usize]
                    .target
                    .as_ref()
                    .and_then(|t| t.rollback.as_ref())
                    .map_or_else(|| "its cluster".to_string(), |r| r.scope.to_string());
                self.end_rollback(
                    now,
                    m,
                    Err(format!("the rollback of {scope} failed: {why}")),
                );
            }
        }
    }

    /// Members rolling back that are due: each sends its next step or ends. True if any was.
    pub(super) fn continue_rollbacks(&mut self, now: Time) -> bool {
        if self.rollback.due.is_empty() {
            return false;
        }
        for m in std::mem::take(&mut self.rollback.due) {
            self.next_rollback_step(now, m);
        }
        true
    }

    fn next_rollback_step(&mut self, now: Time, m: u32) {
        let member = &self.members[m as usize];
        if member.state != State::Running || member.reattaching || !self.is_rolling(m) {
            return;
        }
        if member.removed {
            let g = member.group;
            self.end_rollback_between(m);
            self.rollback.rolling.remove(&m);
            self.add_in_flight(g, -1);
            self.groups[g as usize].unfinished -= 1;
            self.end_removed(now, m, g);
            return;
        }
        let before = match self.rollback.targets.get(&m) {
            Some(before) => before.clone(),
            None => match self.rollback.befores.get(&m) {
                Some(before) => before.clone(),
                None => {
                    self.end_rollback(now, m, Err("its state before the run is unknown".into()));
                    return;
                }
            },
        };
        if !self.rollback_between(m)
            && let Some(holder) = self.members[m as usize].locked_by.clone()
        {
            let why = format!("update run {holder:?} is upgrading its cluster");
            self.end_rollback(now, m, Err(why));
            return;
        }
        match before.offered_steps(&self.members[m as usize].cluster, now) {
            Ok(steps) => match steps.into_iter().next() {
                Some(step) => self.send_rollback_step(now, m, step),
                None => self.end_rollback(now, m, Ok(())),
            },
            Err(why) => self.end_rollback(now, m, Err(why)),
        }
    }

    /// Leaves the between-steps state without a further step: the cluster is let go.
    pub(super) fn end_rollback_between(&mut self, m: u32) {
        let Some(r) = self.rollback.rolling.get_mut(&m).filter(|r| r.between) else {
            return;
        };
        r.between = false;
        let member = &self.members[m as usize];
        self.released.push((member.name.clone(), member.attempt));
    }

    /// A rollback ends: rolled back, or not with the reason. An automatic one fails its member
    /// either way (`HealthCheckFailed`); in a rollback run a member rolled back is verified by
    /// its health checks or Completed, and one that is not is Failed.
    pub(super) fn end_rollback(&mut self, now: Time, m: u32, result: Result<(), String>) {
        self.end_rollback_between(m);
        self.rollback.due.remove(&m);
        let Some(rolling) = self.rollback.rolling.remove(&m) else {
            return;
        };
        self.touch(m);
        self.rollback.rolled_back.insert(m, result.is_ok());
        if result.is_ok() {
            let to = self
                .rollback
                .targets
                .get(&m)
                .or_else(|| self.rollback.befores.get(&m))
                .map_or_else(String::new, |b| {
                    format!(" (Kubernetes {})", b.kubernetes_version)
                });
            self.emit_member(
                now,
                EventType::MemberRolledBack,
                m,
                Some(format!("rolled back to its state before the run{to}")),
            );
        }
        let g = self.members[m as usize].group;
        if rolling.auto.is_none() && result.is_ok() && self.needs_soak(m) {
            let member = &mut self.members[m as usize];
            member.message = None;
            self.begin_soak(now, m);
            return;
        }
        self.add_in_flight(g, -1);
        self.groups[g as usize].unfinished -= 1;
        match (rolling.auto, result) {
            (Some(why), Ok(())) => {
                self.members[m as usize].message = None;
                self.fail_member(
                    now,
                    m,
                    "HealthCheckFailed",
                    format!("{why}; rolled back to its state before the run"),
                );
            }
            (Some(why), Err(reason)) => {
                self.members[m as usize].message = None;
                self.fail_member(
                    now,
                    m,
                    "HealthCheckFailed",
                    format!("{why}; not rolled back: {reason}"),
                );
            }
            (None, Ok(())) => {
                let member = &mut self.members[m as usize];
                member.state = State::Completed;
                member.completed = Some(now);
                member.message = Some("rolled back".into());
                self.emit_member(
                    now,
                    EventType::MemberSucceeded,
                    m,
                    Some("rolled back".into()),
                );
            }
            (None, Err(reason)) => {
                self.members[m as usize].message = None;
                self.fail_member(now, m, "RollbackFailed", reason);
            }
        }
        self.finish_group_if_skipped(now, g);
    }

    /// A member's `before` and `rolledBack`, for its status.
    pub(super) fn rollback_status(&self, m: u32) -> (Option<Before>, Option<bool>) {
        (
            self.rollback.befores.get(&m).cloned(),
            self.rollback.rolled_back.get(&m).copied(),
        )
    }

    /// The rollback state's own invariants.
    pub(super) fn check_rollbacks(&self) -> Result<(), String> {
        for (&m, r) in &self.rollback.rolling {
            let Some(member) = self.members.get(m as usize) else {
                return Err(format!("a rollback names member {m}, not in the run"));
            };
            let idle = matches!(member.state, State::Stopped);
            if !idle && (member.state != State::Running || member.verifying) {
                return Err(format!(
                    "member {} is rolling back but {:?}",
                    member.name, member.state
                ));
            }
            if r.between && member.reattaching {
                return Err(format!(
                    "member {} is between rollback steps while re-attaching",
                    member.name
                ));
            }
        }
        Ok(())
    }
}
