//! Creating a run: membership resolved into dense indices, thresholds, gates (SEMANTICS §2, §4).

use super::*;

/// How a run was made: from a spec (a user's run, or one a profile generated), or from a
/// rollback plan (SEMANTICS §15), which decides its stages, groups and targets.
#[derive(Clone, Debug, PartialEq)]
pub enum RunMaking {
    Spec(RunSpec),
    Rollback(RollbackPlan),
}

/// What a run is made from, recorded when it is made: how, over the fleet's members and
/// catalog as they were then (SEMANTICS §2), and the settings its shell gave it. A shell that
/// keeps runs makes a run again from this after a restart ([`Engine::rebuild`]), never from
/// the fleet as it is by then, and replays the run's log over it.
#[derive(Clone, Debug)]
pub struct RunOrigin {
    pub making: RunMaking,
    pub members: Vec<SharedMember>,
    pub catalog: Catalog,
    /// A run a downstream profile generated (SEMANTICS §14): where its target comes from.
    pub promoted_from: Option<crate::status::PromotedFrom>,
    /// The fleet driver's time scale when the run was made ([`Engine::set_time_scale`]).
    pub time_scale: f64,
}

impl RunOrigin {
    /// The run's rules (a rollback run has the defaults).
    pub fn rules(&self) -> RunRules {
        match &self.making {
            RunMaking::Spec(spec) => spec.rules,
            RunMaking::Rollback(_) => RunRules::default(),
        }
    }

    /// The rollback plan a rollback run was made from.
    pub fn rollback(&self) -> Option<&RollbackPlan> {
        match &self.making {
            RunMaking::Rollback(plan) => Some(plan),
            RunMaking::Spec(_) => None,
        }
    }

    /// Gives a run made from this origin the settings recorded with it: where a promoted
    /// run's target comes from, and its time scale. The fleet engine makes a new run, and
    /// [`Engine::rebuild`] makes it again; both end here.
    pub fn apply_settings(&self, engine: &mut Engine) {
        if let Some(from) = &self.promoted_from {
            engine.set_promoted_from(from.clone());
        }
        engine.set_time_scale(self.time_scale);
    }
}

impl Engine {
    /// Makes run `name` again from what was recorded when it was made: the same run, member
    /// for member, whatever the fleet is now; its log replayed over it brings it to where it
    /// was. Returns the creation warnings (none for a rollback run).
    pub fn rebuild(name: &str, origin: &RunOrigin) -> Result<(Engine, Vec<String>), ApiError> {
        let catalog = origin.catalog.clone();
        let (mut engine, warnings) = match &origin.making {
            RunMaking::Spec(spec) => Engine::create_shared(name, spec, &origin.members, catalog)?,
            RunMaking::Rollback(plan) => (
                Engine::create_rollback(name, plan, &origin.members, catalog)?,
                Vec::new(),
            ),
        };
        origin.apply_settings(&mut engine);
        Ok((engine, warnings))
    }
}

impl Engine {
    /// Creates a run: resolves membership and thresholds (SEMANTICS §2, §4). Returns the engine
    /// and warnings for the user (a threshold that tolerates the whole scope, say).
    pub fn create(
        run_name: &str,
        spec: &RunSpec,
        fleet: &[Member],
        catalog: Catalog,
    ) -> Result<(Engine, Vec<String>), ApiError> {
        let shared: Vec<SharedMember> = fleet.iter().map(SharedMember::from).collect();
        Engine::create_shared(run_name, spec, &shared, catalog)
    }

    /// [`Engine::create`] over a fleet's member table: the run points at each member's name and
    /// cluster instead of copying them.
    pub fn create_shared<'a>(
        run_name: &str,
        spec: &RunSpec,
        fleet: impl IntoIterator<Item = &'a SharedMember>,
        catalog: Catalog,
    ) -> Result<(Engine, Vec<String>), ApiError> {
        Engine::create_assigned(run_name, spec, fleet, catalog, None)
    }

    /// [`Engine::create_shared`], with each member's stage (by index) and group given instead
    /// of selected (a rollback run, SEMANTICS §15).
    pub(super) fn create_assigned<'a>(
        run_name: &str,
        spec: &RunSpec,
        fleet: impl IntoIterator<Item = &'a SharedMember>,
        catalog: Catalog,
        assigned: Option<&HashMap<&str, (usize, &str)>>,
    ) -> Result<(Engine, Vec<String>), ApiError> {
        let mut sorted: Vec<&SharedMember> = fleet.into_iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        if let NodeImageSelection::Custom(versions) = &spec.upgrade.node_images {
            for (i, (family, version)) in versions.iter().enumerate() {
                if !catalog.lists_image(family, version) {
                    let target = format!(
                        "properties.managedClusterUpdate.nodeImageSelection.customNodeImageVersions[{i}].version"
                    );
                    return Err(ApiError::new(
                        ErrorCode::InvalidNodeImageSelection,
                        format!(
                            "{target}: node image {family}-{version} is not in the release catalog of any region"
                        ),
                        target,
                    ));
                }
            }
        }
        let implicit;
        let strategy = match &spec.strategy {
            Some(s) => s,
            None => {
                implicit = Strategy {
                    stages: vec![Stage {
                        name: DEFAULT_STAGE_NAME.into(),
                        groups: vec![],
                        selector: None,
                        wait_seconds: 0,
                        max_concurrency: None,
                        max_allowed_failures: None,
                        before_gates: vec![],
                        after_gates: vec![],
                        member_health: None,
                        readiness: None,
                    }],
                };
                &implicit
            }
        };
        let mut warnings = catalog_warnings(&spec.upgrade, &catalog);
        let mut engine = Engine {
            run_name: run_name.to_string(),
            upgrade: spec.upgrade.clone(),
            rules: spec.rules,
            catalog,
            freezes: Default::default(),
            budget: Default::default(),
            disruptions: Vec::new(),
            members: Vec::new(),
            member_index: HashMap::new(),
            groups: Vec::new(),
            group_failures: Vec::new(),
            stages: Vec::new(),
            phase: RunPhase::NotStarted,
            current: 0,
            run_start: None,
            run_completed: None,
            in_flight: 0,
            failure_count: 0,
            selected_images: None,
            next_attempt: 1,
            timers: BTreeSet::new(),
            commands: VecDeque::new(),
            events: VecDeque::new(),
            revisions: StatusRevisions::default(),
            polled: 0,
            quiet_changes: 0,
            warnings: Vec::new(),
            health: Health::default(),
            chains: BTreeMap::new(),
            hops_due: BTreeSet::new(),
            released: Vec::new(),
            rollback: Default::default(),
            promoted_from: None,
            time_scale: 1.0,
        };
        // Which group claimed each member, for the duplicate-membership rule.
        let mut claimed: HashMap<&str, String> = HashMap::new();
        for (si, stage) in strategy.stages.iter().enumerate() {
            let in_stage: Vec<&SharedMember> = sorted
                .iter()
                .copied()
                .filter(|m| stage.selector.as_ref().is_none_or(|s| s.matches(&m.labels)))
                .collect();
            // A stage without groups forms one implicit group named after it (SEMANTICS §2).
            let implicit_group;
            let groups: &[Group] = if stage.groups.is_empty() {
                implicit_group = [Group {
                    name: stage.name.clone(),
                    selector: None,
                    max_concurrency: None,
                    max_allowed_failures: None,
                    before_gates: vec![],
                    after_gates: vec![],
                    member_health: None,
                    readiness: None,
                }];
                &implicit_group
            } else {
                &stage.groups
            };
            // Members by the group they name, for groups without a selector: one pass over the
            // stage instead of one per group.
            let mut by_group: HashMap<&str, Vec<&SharedMember>> = HashMap::new();
            if groups.iter().any(|g| g.selector.is_none()) && !stage.groups.is_empty() {
                for m in &in_stage {
                    if let Some(group) = m.group.as_deref() {
                        by_group.entry(group).or_default().push(m);
                    }
                }
            }
            let group_defs: Vec<(&Group, Vec<&SharedMember>)> = groups
                .iter()
                .map(|g| {
                    if let Some(assigned) = assigned {
                        let chosen = in_stage
                            .iter()
                            .copied()
                            .filter(|m| assigned.get(&*m.name) == Some(&(si, g.name.as_str())))
                            .collect();
                        return (g, chosen);
                    }
                    let chosen = match &g.selector {
                        Some(s) => in_stage
                            .iter()
                            .copied()
                            .filter(|m| s.matches(&m.labels))
                            .collect(),
                        None if stage.groups.is_empty() => in_stage.clone(),
                        None => by_group.remove(g.name.as_str()).unwrap_or_default(),
                    };
                    (g, chosen)
                })
                .collect();
            let stage_size: u64 = group_defs.iter().map(|d| d.1.len() as u64).sum();
            let stage_concurrency = stage
                .max_concurrency
                .map_or(DEFAULT_STAGE_CONCURRENCY, |a| {
                    a.resolve_concurrency(stage_size)
                });
            let stage_failures = stage
                .max_allowed_failures
                .map_or(0, |a| a.resolve_failures(stage_size));
            if stage.max_allowed_failures.is_some()
                && stage_size > 0
                && stage_failures >= stage_size
            {
                warnings.push(format!(
                    "stage {:?}: maxAllowedFailures {} tolerates all {stage_size} of its members failing",
                    stage.name, stage_failures
                ));
            }
            let mut group_ids = Vec::new();
            for (gi, (group_def, chosen)) in group_defs.into_iter().enumerate() {
                let name = group_def.name.clone();
                let (concurrency, failures) =
                    (group_def.max_concurrency, group_def.max_allowed_failures);
                let (before, after) = (
                    group_def.before_gates.as_slice(),
                    group_def.after_gates.as_slice(),
                );
                let gid = engine.groups.len() as u32;
                let size = chosen.len() as u64;
                let mut ids = Vec::with_capacity(chosen.len());
                for m in chosen {
                    if let Some(other) = claimed.insert(&m.name, name.clone()) {
                        let target = if stage.groups.is_empty() {
                            format!("properties.strategy.stages[{si}].memberSelector")
                        } else {
                            format!("properties.strategy.stages[{si}].groups[{gi}]")
                        };
                        return Err(ApiError::new(
                            ErrorCode::DuplicateMembership,
                            format!(
                                "{target}: member {} is selected by two groups, {other} and {name}; a member may be in only one group of a run",
                                m.name
                            ),
                            target,
                        ));
                    }
                    let id = engine.members.len() as u32;
                    engine.member_index.insert(m.name.clone(), id);
                    engine.members.push(MemberRt {
                        name: m.name.clone(),
                        cluster_resource_id: m.cluster_resource_id.clone(),
                        group: gid,
                        cluster: m.cluster.clone(),
                        state: State::NotStarted,
                        attempt: 0,
                        target: None,
                        operation_id: None,
                        start: None,
                        completed: None,
                        message: None,
                        error: None,
                        place: Place::Nowhere,
                        timer: None,
                        reattaching: false,
                        removed: false,
                        verifying: false,
                        reverify: false,
                        locked_by: None,
                        waiting: None,
                    });
                    ids.push(id);
                }
                let own = concurrency.map_or(1, |a| a.resolve_concurrency(size));
                let group_failures = failures.map_or(0, |a| a.resolve_failures(size));
                if failures.is_some() && size > 0 && group_failures >= size {
                    warnings.push(format!(
                        "group {name:?}: maxAllowedFailures {group_failures} tolerates all {size} of its members failing"
                    ));
                }
                if assigned.is_none() {
                    if size == 0 && !stage.groups.is_empty() {
                        warnings.push(format!(
                            "group {name:?} of stage {:?} selects no member of the fleet",
                            stage.name
                        ));
                    }
                    // The stage's threshold (0 when not given) is reached first.
                    if group_failures > stage_failures {
                        warnings.push(format!(
                            "group {name:?} allows {group_failures} failures, but its stage {:?} allows {stage_failures}{}: the stage fails first",
                            stage.name,
                            if stage.max_allowed_failures.is_none() {
                                " (maxAllowedFailures not given)"
                            } else {
                                ""
                            }
                        ));
                    }
                }
                let gate_group = Some(gi as u32);
                engine.groups.push(GroupRt {
                    before: gates_rt(run_name, before, si as u32, gate_group, Timing::Before),
                    after: gates_rt(run_name, after, si as u32, gate_group, Timing::After),
                    name,
                    stage: si as u32,
                    unfinished: size,
                    members: ids,
                    max_concurrency: own.min(size).min(stage_concurrency).max(1),
                    max_failures: group_failures,
                    phase: Phase::NotStarted,
                    outcome: None,
                    user_skipped: false,
                    stopped: false,
                    in_flight: 0,
                    pending: 0,
                    ready: BTreeSet::new(),
                    member_health: group_def
                        .member_health
                        .clone()
                        .or_else(|| stage.member_health.clone()),
                    readiness: group_def
                        .readiness
                        .clone()
                        .or_else(|| stage.readiness.clone()),
                    start: None,
                    completed: None,
                    message: None,
                    error: None,
                });
                engine.group_failures.push(0);
                group_ids.push(gid);
            }
            engine.stages.push(StageRt {
                name: stage.name.clone(),
                last_served: group_ids.len().saturating_sub(1),
                groups: group_ids,
                size: stage_size,
                max_concurrency: stage_concurrency,
                max_failures: stage_failures,
                phase: Phase::NotStarted,
                outcome: None,
                user_skipped: false,
                stopped: false,
                before: gates_rt(
                    run_name,
                    &stage.before_gates,
                    si as u32,
                    None,
                    Timing::Before,
                ),
                after: gates_rt(run_name, &stage.after_gates, si as u32, None, Timing::After),
                wait: WaitRt {
                    seconds: stage.wait_seconds,
                    state: State::NotStarted,
                    start: None,
                    end: None,
                    completed: None,
                },
                in_flight: 0,
                failure_count: 0,
                start: None,
                completed: None,
                message: None,
                error: None,
            });
        }
        if assigned.is_none() {
            warnings.extend(plan_warnings(spec, &sorted, &engine));
        }
        // A run holds every member it selected for its whole life: no growth slack.
        engine.members.shrink_to_fit();
        engine.member_index.shrink_to_fit();
        engine.revisions = StatusRevisions::lay_out(&engine);
        engine.warnings = warnings.clone();
        Ok((engine, warnings))
    }
}

/// What a run's plan leaves to chance (API.md, a run's plan at creation): fleet members in no
/// group of the strategy, members more than one minor behind a target without
/// `chainMinorVersions` (SEMANTICS §13), and a target some selected members' regions do not list
/// yet (they wait for it). Names are listed up to three.
fn plan_warnings(spec: &RunSpec, fleet: &[&SharedMember], engine: &Engine) -> Vec<String> {
    let mut warnings = Vec::new();
    let some = |names: &[&str]| {
        let mut text = names.iter().take(3).copied().collect::<Vec<_>>().join(", ");
        if names.len() > 3 {
            text.push_str(", …");
        }
        text
    };
    if spec.strategy.is_some() {
        let left_out: Vec<&str> = fleet
            .iter()
            .filter(|m| !engine.member_index.contains_key(&*m.name))
            .map(|m| &*m.name)
            .collect();
        if !left_out.is_empty() {
            warnings.push(format!(
                "{} of the fleet's {} members are in no group of the strategy and are left out of the run ({})",
                left_out.len(),
                fleet.len(),
                some(&left_out)
            ));
        }
    }
    let target = spec
        .upgrade
        .kubernetes_version
        .filter(|_| spec.upgrade.changes_kubernetes());
    if let Some(target) = target {
        if !spec.rules.chain_minor_versions {
            let behind: Vec<&str> = engine
                .members
                .iter()
                .filter(|m| {
                    let v = m.cluster.kubernetes_version;
                    v.major == target.major && v.minor + 1 < target.minor
                })
                .map(|m| &*m.name)
                .collect();
            if !behind.is_empty() {
                warnings.push(format!(
                    "{} members are more than one minor behind {target} ({}): each is asked to skip minors, which providers such as AKS refuse; properties.chainMinorVersions takes them one minor at a time",
                    behind.len(),
                    some(&behind)
                ));
            }
        }
        if !engine.catalog.is_unknown() && engine.catalog.lists_kubernetes(target) {
            let mut waiting: BTreeMap<&str, usize> = BTreeMap::new();
            for m in &engine.members {
                let region = m.cluster.region.as_str();
                let listed = engine
                    .catalog
                    .regions
                    .get(region)
                    .is_some_and(|r| r.kubernetes.iter().any(|k| k.version == target));
                if !listed {
                    *waiting.entry(region).or_default() += 1;
                }
            }
            if !waiting.is_empty() {
                let regions: Vec<String> = waiting
                    .iter()
                    .map(|(r, n)| format!("{r} ({n} members)"))
                    .collect();
                warnings.push(format!(
                    "{target} is not listed yet in {}: those members wait until it arrives in their region",
                    regions.join(", ")
                ));
            }
        }
    }
    warnings
}

/// What the catalog cannot vouch for in a run's target (First hour, safety rails): a version no
/// catalog lists is sent as given, or waited for in every region; node images are left to the
/// driver where no catalog names them.
fn catalog_warnings(upgrade: &Upgrade, catalog: &Catalog) -> Vec<String> {
    const FIELD: &str = "properties.managedClusterUpdate.upgrade.kubernetesVersion";
    let mut warnings = Vec::new();
    let version = upgrade
        .kubernetes_version
        .filter(|_| upgrade.changes_kubernetes());
    if catalog.is_unknown() {
        if let Some(v) = version {
            warnings.push(format!(
                "{FIELD} {v} cannot be checked: the fleet's driver lists no release catalog, so every member is sent {v} as given"
            ));
        }
        if upgrade.changes_node_images() {
            warnings.push(
                "node images cannot be chosen: the fleet's driver lists no release catalog, so each member's driver picks them"
                    .to_string(),
            );
        }
    } else if let Some(v) = version
        && !catalog.lists_kubernetes(v)
    {
        warnings.push(format!(
            "{FIELD} {v} is in no region's release catalog yet: every member waits until it arrives in its region"
        ));
    }
    warnings
}
