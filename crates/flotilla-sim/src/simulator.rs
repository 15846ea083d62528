//! The discrete-event simulator: simulated clusters and a virtual clock driving the engine
//! (conformance README, "Virtual time").
//!
//! At each instant it applies, in order: upgrades ending, what time brings to the engine
//! (gates, waits, windows, versions), releases coming out, the scenario's actions in file order,
//! then the auto-upgrade profiles' triggers; then it lets each run schedule once, in the order
//! the runs were created, answering its commands until it has nothing more to say.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use serde::{Serialize, Serializer};
use serde_json::{Value, json};

use flotilla_engine::engine::{
    Command, Engine, Input, OperationProgress, RunRules, RunSpec, SkipKind, SkipTarget,
    StatusChanges, Target, Timing, apply_target,
};
use flotilla_engine::error::{ApiError, ErrorCode, from_json_value};
use flotilla_engine::fleet::{Catalog, Cluster};
use flotilla_engine::fleet_engine::{FleetCommand, FleetEngine, FleetEvent, FleetInput};
use flotilla_engine::forecast::{Forecast, ForecastParams, forecast};
use flotilla_engine::profile::{
    GeneratedRun, NoRun, Profile, ProfileSpec, TriggerOutcome, plan_generation, trigger_status,
};
use flotilla_engine::release;
use flotilla_engine::status::{Event, PromotedFrom, UpdateRunStatus};
use flotilla_engine::strategy::{
    ManagedClusterUpdateSpec, StrategySpec, check_chain_minor_versions, parse_upgrade,
};
use flotilla_engine::time::Time;
use flotilla_engine::train::{self, Promotion, Validated};

use crate::scenario::{
    Action, DeclaredRun, Scenario, Scripted, SimBehaviour, scripted_at, wire_specs_of,
};
use flotilla_engine::checks::Check;
use flotilla_engine::checks::Outcome;
use flotilla_engine::engine::{CheckSubject, answers};

/// One simulated cluster.
#[derive(Clone, Debug)]
pub struct SimCluster {
    pub cluster: Cluster,
    pub behaviour: SimBehaviour,
    /// Upgrade operations received, in order: (run, attempt, ends at, succeeds).
    pub operations: Vec<(usize, u64, Time, bool)>,
    /// Removed from the fleet by a `removeMember` action; a cluster keeps running regardless.
    pub removed: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolOut {
    pub name: String,
    pub node_image_version: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOut {
    pub kubernetes_version: String,
    pub node_pools: Vec<PoolOut>,
}

/// The result document of `flotilla simulate --json`; for a scenario of several fleets,
/// `{fleets: {NAME: <the fleet's document>}}`.
#[derive(Clone, Debug)]
pub struct SimResult {
    pub run: Option<Value>,
    pub create_error: Option<ApiError>,
    pub clusters: BTreeMap<String, ClusterOut>,
    pub events: Vec<Event>,
    /// The further hand-made runs of `updateRuns` (SEMANTICS §12), in creation order; left out
    /// when the scenario declares none.
    pub update_runs: Vec<UpdateRunOut>,
    pub warnings: Vec<String>,
    /// Profile scenarios: each auto-upgrade profile as the API returns it, status included.
    pub profiles: BTreeMap<String, Value>,
    /// Profile scenarios: the runs profiles generated, in the order they were created.
    pub generated_runs: Vec<GeneratedRunOut>,
    /// The final status, typed, for renderers.
    pub status: Option<UpdateRunStatus>,
    /// A scenario of several fleets (SEMANTICS §14): each fleet's result, by name; the other
    /// fields are then empty.
    pub fleets: BTreeMap<String, SimResult>,
    /// The fleets in the order they were simulated (each after the fleets it follows).
    pub fleet_order: Vec<String>,
}

impl Serialize for SimResult {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        if !self.fleets.is_empty() {
            map.serialize_entry("fleets", &self.fleets)?;
            return map.end();
        }
        map.serialize_entry("run", &self.run)?;
        if let Some(error) = &self.create_error {
            map.serialize_entry("createError", error)?;
        }
        map.serialize_entry("clusters", &self.clusters)?;
        map.serialize_entry("events", &self.events)?;
        if !self.update_runs.is_empty() {
            map.serialize_entry("updateRuns", &self.update_runs)?;
        }
        if !self.warnings.is_empty() {
            map.serialize_entry("warnings", &self.warnings)?;
        }
        if !self.profiles.is_empty() {
            map.serialize_entry("profiles", &self.profiles)?;
        }
        if !self.generated_runs.is_empty() {
            map.serialize_entry("generatedRuns", &self.generated_runs)?;
        }
        map.end()
    }
}

/// What upstream profiles validated (SEMANTICS §14), by profile id: the runs of fleets
/// simulated before, each a run its profile generated that validated its target.
pub type Validations = BTreeMap<String, Vec<Validated>>;

/// A further hand-made run of `updateRuns`, with its own event log: `{name, run, events}`, or
/// `{name, run: null, createError, events: []}` when the API would have refused it at creation.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateRunOut {
    pub name: String,
    pub run: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_error: Option<ApiError>,
    pub events: Vec<Event>,
    #[serde(skip)]
    pub status: Option<UpdateRunStatus>,
}

/// A run a profile generated, with its own event log.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedRunOut {
    pub profile: String,
    /// `profile/versions`: how expectations name it without its hash.
    pub key: String,
    pub created_at: Time,
    pub run: Value,
    pub events: Vec<Event>,
    #[serde(skip)]
    pub status: Option<UpdateRunStatus>,
}

/// The run resource the API would return, envelope included.
pub fn run_resource(
    fleet: &str,
    name: &str,
    strategy: Option<&StrategySpec>,
    update: &ManagedClusterUpdateSpec,
    engine: &Engine,
) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert("provisioningState".into(), json!("Succeeded"));
    if let Some(s) = strategy {
        properties.insert(
            "strategy".into(),
            serde_json::to_value(s).unwrap_or(Value::Null),
        );
    }
    properties.insert(
        "managedClusterUpdate".into(),
        serde_json::to_value(update).unwrap_or(Value::Null),
    );
    if engine.rules().chain_minor_versions {
        properties.insert("chainMinorVersions".into(), json!(true));
    }
    properties.insert(
        "status".into(),
        serde_json::to_value(engine.status()).unwrap_or(Value::Null),
    );
    json!({
        "id": format!("/v1/fleets/{fleet}/updateRuns/{name}"),
        "name": name,
        "type": "Microsoft.ContainerService/fleets/updateRuns",
        "properties": properties,
    })
}

/// The instants after the start at which the scenario's release feed changes the catalog: a
/// release of the timeline coming out in a region, and, with profiles, a listed version's
/// `availableAt`. Profiles are checked then, at the start, and on `refreshCatalog`.
pub fn catalog_changes(scenario: &Scenario) -> Vec<Time> {
    let mut changes: Vec<Time> =
        release::change_instants(&scenario.catalog, &scenario.releases, scenario.start, 1.0);
    if !scenario.profiles.is_empty() {
        changes.extend(scenario.catalog.regions.values().flat_map(|r| {
            r.kubernetes.iter().filter_map(|k| k.available_at).chain(
                r.node_images
                    .values()
                    .flatten()
                    .filter_map(|i| i.available_at),
            )
        }));
    }
    changes.retain(|t| *t > scenario.start);
    changes.sort();
    changes.dedup();
    changes
}

/// A cluster as the result document shows it.
pub fn cluster_out(cluster: &Cluster) -> ClusterOut {
    ClusterOut {
        kubernetes_version: cluster.kubernetes_version.to_string(),
        node_pools: cluster
            .node_pools
            .iter()
            .map(|p| PoolOut {
                name: p.name.clone(),
                node_image_version: format!("{}-{}", p.family, p.image),
            })
            .collect(),
    }
}

fn skip_kind(text: &str) -> Option<SkipKind> {
    match text {
        "Member" => Some(SkipKind::Member),
        "Group" => Some(SkipKind::Group),
        "Stage" => Some(SkipKind::Stage),
        "AfterStageWait" => Some(SkipKind::AfterStageWait),
        _ => None,
    }
}

/// The hand-made run's specification, parsed as the API would at run creation.
pub fn run_spec(
    scenario: &Scenario,
) -> Result<(RunSpec, Option<StrategySpec>, ManagedClusterUpdateSpec), ApiError> {
    spec_of(
        scenario,
        scenario.strategy.as_ref(),
        scenario.update.as_ref(),
    )
}

/// A hand-made run's specification from its strategy and upgrade as written, parsed as the API
/// would at run creation (its checks name providers the scenario declares).
fn spec_of(
    scenario: &Scenario,
    strategy: Option<&Value>,
    update: Option<&Value>,
) -> Result<(RunSpec, Option<StrategySpec>, ManagedClusterUpdateSpec), ApiError> {
    let (strategy_spec, update_spec, chain) = wire_specs_of(strategy, update)?;
    let strategy = strategy_spec
        .as_ref()
        .map(|s| scenario.parse_strategy(s))
        .transpose()?;
    let upgrade = parse_upgrade(&update_spec, "properties.managedClusterUpdate")?;
    check_chain_minor_versions(chain, &upgrade, "properties.chainMinorVersions")?;
    let spec = RunSpec {
        strategy,
        upgrade,
        rules: RunRules {
            chain_minor_versions: chain,
            ..RunRules::default()
        },
    };
    Ok((spec, strategy_spec, update_spec))
}

/// The scenario's fleet at `start`: its members, its catalog, its freezes and budgets.
fn fleet_of(scenario: &Scenario) -> FleetEngine {
    let mut fleet = FleetEngine::new(&scenario.members, scenario.catalog.clone());
    for freeze in &scenario.freezes {
        let _ = fleet.handle(
            scenario.start,
            FleetInput::PutFreeze(Box::new(freeze.clone())),
        );
    }
    for budget in &scenario.budgets {
        let _ = fleet.handle(
            scenario.start,
            FleetInput::PutBudget(Box::new(budget.clone())),
        );
    }
    fleet
}

/// Runs a scenario to its end in virtual time.
/// Forecasts the scenario's hand-made run from the scenario's start (SEMANTICS §11), as the
/// server forecasts a run over the `sim` driver: each member's upgrade takes its behaviour's
/// duration (the duration the `sim` driver expects). The scenario's actions are not played.
pub fn forecast_scenario(
    scenario: &Scenario,
    params: &ForecastParams,
) -> Result<Forecast, ApiError> {
    let mut fleet = fleet_of(scenario);
    let (spec, _, _) = run_spec(scenario)?;
    fleet.create_run(&scenario.name, &spec, scenario.catalog.clone())?;
    let duration = |_: &str, member: &str| {
        scenario
            .behaviour
            .get(member)
            .map_or(default_behaviour().duration_seconds, |b| b.duration_seconds)
    };
    forecast(&fleet, &scenario.name, scenario.start, params, &duration)
}

pub fn simulate(scenario: &Scenario) -> SimResult {
    run_fleets(scenario, false, None).0
}

/// What [`simulate_observing`] calls after every instant.
pub type Observer<'a> = dyn FnMut(&FleetEngine, Time) + 'a;

/// Like [`simulate`], calling `observe` with the fleet engine after every instant (its
/// commands answered and events taken): a forecast made midway, say.
pub fn simulate_observing(scenario: &Scenario, observe: &mut Observer<'_>) -> SimResult {
    run_fleets(scenario, false, Some(observe)).0
}

/// Like [`simulate`], but recounts the fleet engine's state from scratch after every instant
/// ([`FleetEngine::check_invariants`]), checks that every change of a run's status is
/// reported ([`StatusChanges`]), and stops at the first violation. For tests.
pub fn simulate_checking_invariants(scenario: &Scenario) -> Result<SimResult, String> {
    match run_fleets(scenario, true, None) {
        (result, None) => Ok(result),
        (_, Some(violation)) => Err(violation),
    }
}

/// One run of the simulation: the scenario's hand-made run or one a profile generated.
struct SimRun {
    name: String,
    strategy: Option<StrategySpec>,
    update: ManagedClusterUpdateSpec,
    /// The profile that generated it, and its `profile/versions` key.
    generated: Option<(String, String)>,
    /// A further hand-made run of `updateRuns` (not the run of `update`).
    declared: bool,
    /// What the profile targeted (`lastTriggerUpgradeVersions`).
    versions: Vec<String>,
    created_at: Time,
    events: Vec<Event>,
}

/// A profile as the simulation goes: its definition and its status.
struct SimProfile {
    name: String,
    spec: ProfileSpec,
    profile: Profile,
    status: Option<Value>,
    /// A downstream profile's `upstream` status: what it waits for (SEMANTICS §14).
    upstream: Option<Value>,
}

fn default_behaviour() -> SimBehaviour {
    SimBehaviour {
        duration_seconds: 600,
        fail: false,
        fail_message: String::new(),
        fail_attempts: None,
        fail_operations: Vec::new(),
        rollback_until: None,
    }
}

/// What [`check_status_changes`] saw of a run last: its tracker, its status, and each chunk
/// of its members' statuses with the chunk's revision.
type SeenStatus = (StatusChanges, String, Vec<(u64, Vec<u8>)>);

/// Checks that a run whose [`StatusChanges`] reports no change shows the same status as
/// when it was last asked, and that a chunk of its members ([`Engine::status_chunks`]) whose
/// revision did not move shows the same text: so the server, which writes a status only on a
/// change and then only the chunks that changed, never leaves a stale one.
fn check_status_changes(
    fleet: &FleetEngine,
    seen: &mut BTreeMap<String, SeenStatus>,
) -> Result<(), String> {
    let names: Vec<String> = fleet.run_names().map(String::from).collect();
    for name in names {
        let (changes, before, chunks) = seen.entry(name.clone()).or_default();
        if let Some(engine) = fleet.run(&name) {
            let mut now = Vec::with_capacity(engine.status_chunks().len());
            for (c, chunk) in engine.status_chunks().iter().enumerate() {
                let mut text = Vec::new();
                engine
                    .write_status_chunk(c, &mut text)
                    .map_err(|e| e.to_string())?;
                if let Some((revision, old)) = chunks.get(c)
                    && *revision == chunk.revision
                    && *old != text
                {
                    return Err(format!(
                        "run {name}: chunk {c} of its members changed but its revision did not: {} → {}",
                        String::from_utf8_lossy(old),
                        String::from_utf8_lossy(&text)
                    ));
                }
                now.push((chunk.revision, text));
            }
            *chunks = now;
        }
        let Some(changed) = fleet.refresh_status(&name, changes) else {
            continue;
        };
        let now = fleet
            .run(&name)
            .map(|e| serde_json::to_string(&e.status()))
            .transpose()
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        if !changed && now != *before {
            let at = now
                .bytes()
                .zip(before.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(now.len().min(before.len()));
            let context = |t: &str| {
                t.get(at.saturating_sub(120)..(at + 60).min(t.len()))
                    .unwrap_or("")
                    .to_string()
            };
            return Err(format!(
                "run {name}: its status changed but the engine reported no change: {} → {}",
                context(before),
                context(&now)
            ));
        }
        *before = now;
    }
    Ok(())
}

fn keep_created(fleet: &FleetEngine, run: &str, created: &mut BTreeMap<String, Engine>) {
    if let Some(engine) = fleet.run(run) {
        created.insert(run.to_string(), engine.clone());
    }
}

/// Checks that every run's checkpoint, laid over the run's engine as created, gives back the
/// same engine, field by field: so a server that rebuilds a run from its checkpoint and the
/// log's tail drives the same run as one that replays the whole log.
fn check_checkpoints(
    fleet: &FleetEngine,
    created: &BTreeMap<String, Engine>,
    now: Time,
) -> Result<(), String> {
    for name in fleet.run_names() {
        let (Some(engine), Some(fresh)) = (fleet.run(name), created.get(name)) else {
            return Err(format!("run {name}: no engine as created to restore onto"));
        };
        let text = engine.checkpoint(now)?;
        let mut restored = fresh.clone();
        restored.restore(&text)?;
        if let Some(difference) = restored.differences(engine) {
            return Err(format!("restored from its checkpoint, {difference}"));
        }
    }
    Ok(())
}

/// Runs a scenario: one fleet, or several one after another (SEMANTICS §14). An upstream never
/// depends on its downstream, so each fleet is simulated over the whole horizon after the fleets
/// it follows, knowing what their profiles' runs validated and when.
fn run_fleets(
    scenario: &Scenario,
    check_invariants: bool,
    mut observe: Option<&mut Observer<'_>>,
) -> (SimResult, Option<String>) {
    if scenario.fleets.is_empty() {
        return run(scenario, check_invariants, observe, &Validations::new());
    }
    let mut validations = Validations::new();
    let mut fleets = BTreeMap::new();
    let mut order = Vec::new();
    let mut violation = None;
    for fleet in &scenario.fleets {
        let (result, broken) = run(
            fleet,
            check_invariants,
            observe.as_deref_mut(),
            &validations,
        );
        for g in &result.generated_runs {
            let id = g.run["id"].as_str().unwrap_or_default();
            if let Some(v) = g.status.as_ref().and_then(|s| train::validated(id, s)) {
                validations
                    .entry(train::profile_id(&fleet.fleet, &g.profile))
                    .or_default()
                    .push(v);
            }
        }
        fleets.insert(fleet.fleet.clone(), result);
        order.push(fleet.fleet.clone());
        if let Some(broken) = broken {
            violation = Some(format!("fleet {}: {broken}", fleet.fleet));
            break;
        }
    }
    let result = SimResult {
        run: None,
        create_error: None,
        clusters: BTreeMap::new(),
        events: Vec::new(),
        update_runs: Vec::new(),
        warnings: Vec::new(),
        profiles: BTreeMap::new(),
        generated_runs: Vec::new(),
        status: None,
        fleets,
        fleet_order: order,
    };
    (result, violation)
}

fn run(
    scenario: &Scenario,
    check_invariants: bool,
    mut observe: Option<&mut Observer<'_>>,
    upstream: &Validations,
) -> (SimResult, Option<String>) {
    let mut clusters: BTreeMap<String, SimCluster> = scenario
        .members
        .iter()
        .map(|m| {
            let behaviour = scenario
                .behaviour
                .get(&m.name)
                .cloned()
                .unwrap_or_else(default_behaviour);
            (
                m.name.clone(),
                SimCluster {
                    cluster: m.cluster.clone(),
                    behaviour,
                    operations: Vec::new(),
                    removed: false,
                },
            )
        })
        .collect();
    let outputs = |clusters: &BTreeMap<String, SimCluster>| {
        clusters
            .iter()
            .map(|(n, c)| (n.clone(), cluster_out(&c.cluster)))
            .collect()
    };
    let mut fleet = fleet_of(scenario);
    let mut runs: Vec<SimRun> = Vec::new();
    // Checking: each run's engine as created, to restore its checkpoints onto.
    let mut created: BTreeMap<String, Engine> = BTreeMap::new();
    let mut warnings = Vec::new();
    // The run of `update` refused at creation, when the scenario declares further runs.
    let mut main_error = None;
    if scenario.update.is_some() {
        let created = run_spec(scenario).and_then(|(spec, strategy, update)| {
            let w = fleet.create_run(&scenario.name, &spec, scenario.catalog.clone())?;
            if check_invariants {
                created.extend(
                    fleet
                        .run(&scenario.name)
                        .map(|e| (scenario.name.clone(), e.clone())),
                );
            }
            Ok((w, strategy, update))
        });
        match created {
            Ok((w, strategy, update)) => {
                warnings = w;
                runs.push(SimRun {
                    name: scenario.name.clone(),
                    strategy,
                    update,
                    generated: None,
                    declared: false,
                    versions: Vec::new(),
                    created_at: scenario.start,
                    events: Vec::new(),
                });
            }
            // Without further runs there is nothing to simulate.
            Err(error) if scenario.update_runs().next().is_none() => {
                let result = SimResult {
                    run: None,
                    create_error: Some(error),
                    clusters: outputs(&clusters),
                    events: Vec::new(),
                    update_runs: Vec::new(),
                    warnings: Vec::new(),
                    profiles: BTreeMap::new(),
                    generated_runs: Vec::new(),
                    status: None,
                    fleets: BTreeMap::new(),
                    fleet_order: Vec::new(),
                };
                return (result, None);
            }
            Err(error) => main_error = Some(error),
        }
    }
    let hand_made = scenario.update.is_some() && main_error.is_none();
    // The further hand-made runs, created in file order right after the run of `update`; one
    // the API would refuse keeps its error, in its place.
    let mut refused: Vec<(usize, String, ApiError)> = Vec::new();
    for (order, declared) in scenario.update_runs().enumerate() {
        match create_declared(scenario, &mut fleet, declared) {
            Ok((w, strategy, update)) => {
                warnings.extend(w.into_iter().map(|w| format!("{}: {w}", declared.name)));
                if check_invariants {
                    keep_created(&fleet, &declared.name, &mut created);
                }
                runs.push(SimRun {
                    name: declared.name.clone(),
                    strategy,
                    update,
                    generated: None,
                    declared: true,
                    versions: Vec::new(),
                    created_at: scenario.start,
                    events: Vec::new(),
                });
            }
            Err(error) => refused.push((order, declared.name.clone(), error)),
        }
    }
    let mut profiles: Vec<SimProfile> = scenario
        .profiles
        .iter()
        .map(|p| SimProfile {
            name: p.name.clone(),
            spec: p.spec.clone(),
            profile: p.profile.clone(),
            status: None,
            upstream: None,
        })
        .collect();
    let changes = catalog_changes(scenario);
    let mut next_change = 0;
    let trains = train_instants(scenario, upstream);
    let mut next_train = 0;
    let catalog_at = |now: Time| {
        release::published(
            &scenario.catalog,
            &scenario.releases,
            scenario.start,
            1.0,
            now,
        )
    };
    let mut sim = Sim {
        clusters: &mut clusters,
        finishing: BinaryHeap::new(),
        targets: BTreeMap::new(),
        seq: 0,
    };
    let mut feed_events: Vec<Event> = Vec::new();
    let mut violation = None;
    let mut seen: BTreeMap<String, SeenStatus> = BTreeMap::new();
    let mut next_action = 0;
    let actions = &scenario.actions;
    let mut now = scenario.start;
    let mut first = true;
    let index_of = |runs: &[SimRun], name: &str| runs.iter().position(|r| r.name == name);
    loop {
        let candidates = [
            sim.finishing.peek().map(|Reverse((t, _, _, _, _))| *t),
            actions.get(next_action).map(|a| a.at),
            changes.get(next_change).copied(),
            trains.get(next_train).copied(),
            fleet.next_wakeup(),
            first.then_some(scenario.start),
        ];
        let Some(next) = candidates.into_iter().flatten().min() else {
            break;
        };
        if next > scenario.until {
            break;
        }
        now = next.max(now);
        let mut check_profiles = std::mem::take(&mut first) && !profiles.is_empty();
        // 1. Upgrades ending. The fleet engine hands the cluster as it now is to every run.
        while let Some(Reverse((t, _, _, _, _))) = sim.finishing.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((_, _, index, member, attempt))) = sim.finishing.pop() else {
                break;
            };
            let outcome = sim.finish(index, &member, attempt);
            let offers = sim.offers_changed(&member);
            let _ = fleet.handle(
                now,
                FleetInput::Run {
                    run: runs[index].name.clone(),
                    input: Input::OperationFinished {
                        member: member.clone(),
                        attempt,
                        outcome,
                    },
                },
            );
            // What the cluster can now roll back is observed (SEMANTICS §15).
            if let Some(cluster) = offers {
                let _ = fleet.handle(now, FleetInput::Observed { member, cluster });
            }
        }
        // 2. What time brings, then releases coming out.
        fleet.advance_clock(now);
        // Without a feed the catalog never changes: no copy per instant.
        let feed = !profiles.is_empty() || !scenario.releases.is_empty();
        let catalog = if feed {
            catalog_at(now)
        } else {
            Catalog::default()
        };
        // What an upstream validated comes in, or a soak ends (SEMANTICS §14).
        let mut check_trains = false;
        while trains.get(next_train).is_some_and(|t| *t <= now) {
            next_train += 1;
            check_trains = true;
        }
        let mut released = false;
        while changes.get(next_change).is_some_and(|t| *t <= now) {
            next_change += 1;
            check_profiles = !profiles.is_empty();
            released = true;
        }
        // Runs learn of releases from the timeline as they come out; versions listed with
        // `availableAt` they knew in advance.
        if released && !scenario.releases.is_empty() {
            let _ = fleet.handle(now, FleetInput::CatalogChanged(catalog.clone()));
        }
        // 3. Actions, in file order.
        while let Some(a) = actions.get(next_action) {
            if a.at > now {
                break;
            }
            next_action += 1;
            // Declared runs were created before the loop.
            if matches!(a.action, Action::CreateRun(_)) {
                continue;
            }
            let index = match &a.run {
                None if hand_made => Some(0),
                None => None,
                Some(key) => runs.iter().position(|r| {
                    &r.name == key || r.generated.as_ref().is_some_and(|g| &g.1 == key)
                }),
            };
            let result = match &a.action {
                Action::RefreshCatalog => {
                    check_profiles = !profiles.is_empty();
                    Ok(())
                }
                Action::GenerateUpdateRun(name) => {
                    match profiles.iter().find(|p| &p.name == name) {
                        Some(p) => {
                            match generate(
                                scenario, &mut fleet, &mut runs, p, &catalog, now, upstream,
                            ) {
                                Ok(Err(no_run)) => Err(no_run.error(&p.name)),
                                Ok(Ok(Some(i))) => {
                                    if check_invariants {
                                        keep_created(&fleet, &runs[i].name, &mut created);
                                    }
                                    Ok(())
                                }
                                Ok(Ok(None)) => Ok(()),
                                Err(e) => Err(e),
                            }
                        }
                        None => Err(not_found("profile", name)),
                    }
                }
                // Fleet-wide: no run named (SEMANTICS §12).
                Action::PutFreeze(freeze) => {
                    fleet.handle(now, FleetInput::PutFreeze(freeze.clone()))
                }
                Action::DeleteFreeze(name) => {
                    fleet.handle(now, FleetInput::DeleteFreeze { name: name.clone() })
                }
                Action::PutBudget(budget) => {
                    fleet.handle(now, FleetInput::PutBudget(budget.clone()))
                }
                Action::DeleteBudget(name) => {
                    fleet.handle(now, FleetInput::DeleteBudget { name: name.clone() })
                }
                // A rollback run, made and started (SEMANTICS §15); a second request answers
                // the one made.
                Action::Rollback => match index {
                    Some(i) => {
                        let original = runs[i].name.clone();
                        fleet.create_rollback_run(now, &original).map(|name| {
                            if index_of(&runs, &name).is_none() {
                                if check_invariants {
                                    keep_created(&fleet, &name, &mut created);
                                }
                                let update = runs[i].update.clone();
                                runs.push(SimRun {
                                    name,
                                    strategy: None,
                                    update,
                                    generated: None,
                                    declared: true,
                                    versions: Vec::new(),
                                    created_at: now,
                                    events: Vec::new(),
                                });
                            }
                        })
                    }
                    None => Err(not_found(
                        "update run",
                        a.run
                            .as_deref()
                            .unwrap_or("(the scenario has no hand-made run)"),
                    )),
                },
                Action::UpdateProfile {
                    profile,
                    spec,
                    parsed,
                } => match profiles.iter_mut().find(|p| &p.name == profile) {
                    Some(p) => {
                        p.spec = spec.clone();
                        p.profile = parsed.clone();
                        Ok(())
                    }
                    None => Err(not_found("profile", profile)),
                },
                _ => match index {
                    Some(i) => act(&mut fleet, &runs[i].name, &mut sim, now, &a.action),
                    None => Err(not_found(
                        "update run",
                        a.run.as_deref().unwrap_or(if main_error.is_some() {
                            // The run of `update`, refused at creation.
                            &scenario.name
                        } else {
                            "(the scenario has no hand-made run)"
                        }),
                    )),
                },
            };
            if let Err(error) = result {
                let label = match &a.run {
                    Some(r) => format!("{} {r}", a.label),
                    None => a.label.clone(),
                };
                match index.filter(|_| a.run.is_some() || hand_made) {
                    Some(i) => fleet.record_rejection(now, &runs[i].name, &label, error),
                    None => feed_events.push(Event::rejected(now, &label, error)),
                }
            }
        }
        // 4. Profiles: a target an enabled profile has no run for gets one, created and started
        // (SEMANTICS §8).
        if check_profiles || check_trains {
            for p in profiles.iter_mut().filter(|p| !p.profile.disabled) {
                // A downstream profile only promotes what its upstream validated, at the end of
                // its soak (SEMANTICS §14); it never resolves its own channel.
                if let Some(up) = &p.profile.upstream {
                    let validated = upstream
                        .get(&up.profile_id())
                        .map_or(&[][..], Vec::as_slice);
                    let promotion = train::promotion_for(&p.profile, validated, now);
                    p.upstream = promotion.status();
                    let Promotion::Due { validated, .. } = &promotion else {
                        continue;
                    };
                    let (planned, from) = train::promoted_run(
                        &p.name,
                        &p.profile,
                        &catalog,
                        validated,
                        scenario.pins_node_images,
                    );
                    // Once: the run's name is deterministic.
                    if runs.iter().any(|r| r.name == planned.name) {
                        continue;
                    }
                    let made = create_generated(
                        scenario,
                        &mut fleet,
                        &mut runs,
                        p,
                        planned,
                        &catalog,
                        now,
                        Some(from),
                    );
                    let outcome = match made {
                        Ok(i) => {
                            if check_invariants {
                                keep_created(&fleet, &runs[i].name, &mut created);
                            }
                            start_generated(&mut fleet, &runs[i], now)
                        }
                        Err(e) => TriggerOutcome::not_created(format!("{:?}", e.code), e.message),
                    };
                    p.status = Some(trigger_status(now, &outcome));
                    continue;
                }
                if !check_profiles {
                    continue;
                }
                let outcome =
                    match generate(scenario, &mut fleet, &mut runs, p, &catalog, now, upstream) {
                        // Nothing selected yet is not a failure.
                        Ok(Err(_) | Ok(None)) => continue,
                        Ok(Ok(Some(i))) => {
                            if check_invariants {
                                keep_created(&fleet, &runs[i].name, &mut created);
                            }
                            start_generated(&mut fleet, &runs[i], now)
                        }
                        Err(e) => TriggerOutcome::not_created(format!("{:?}", e.code), e.message),
                    };
                p.status = Some(trigger_status(now, &outcome));
            }
        }
        // 5. The runs schedule in turn (the fleet engine keeps one operation per cluster);
        // commands are answered until the fleet has nothing more to say. (Checked, each run's
        // status changes are also taken before and after each settle, so what a settle alone
        // changes is checked against what it reported.)
        loop {
            if check_invariants && let Err(e) = check_status_changes(&fleet, &mut seen) {
                violation = Some(format!("at {now}: {e}"));
                break;
            }
            fleet.settle(now);
            if check_invariants && let Err(e) = check_status_changes(&fleet, &mut seen) {
                violation = Some(format!("at {now}: {e}"));
                break;
            }
            let mut answered = false;
            while let Some(FleetCommand { run, command }) = fleet.poll_command() {
                let Some(index) = index_of(&runs, &run) else {
                    continue;
                };
                let input = match command {
                    Command::StartUpgrade {
                        member,
                        attempt,
                        target,
                    } => {
                        let op = sim.start(now, index, &member, attempt, target);
                        Input::OperationAccepted {
                            member,
                            attempt,
                            operation_id: op,
                        }
                    }
                    Command::Evaluate {
                        subject,
                        round,
                        checks,
                        ..
                    } => {
                        answered = true;
                        let script =
                            |check: &Check| scripted_outcome(scenario, &subject, &check.name, now);
                        for input in answers(&subject, round, &checks, script) {
                            let _ = fleet.handle(
                                now,
                                FleetInput::Run {
                                    run: run.clone(),
                                    input,
                                },
                            );
                        }
                        continue;
                    }
                    Command::Observe { member, attempt } => {
                        let (cluster, progress) = sim.observe(now, index, &member, attempt);
                        let Some(cluster) = cluster else {
                            continue;
                        };
                        answered = true;
                        Input::Observed {
                            member,
                            cluster: std::sync::Arc::new(cluster),
                            operation: Some((attempt, progress)),
                        }
                    }
                };
                let _ = fleet.handle(now, FleetInput::Run { run, input });
            }
            if !answered {
                break;
            }
        }
        if violation.is_some() {
            break;
        }
        while let Some(FleetEvent { run, event }) = fleet.poll_event() {
            if let Some(i) = index_of(&runs, &run) {
                runs[i].events.push(event);
            }
        }
        if check_invariants && let Err(e) = fleet.check_invariants(now) {
            violation = Some(format!("at {now}: {e}"));
            break;
        }
        if check_invariants && let Err(e) = check_checkpoints(&fleet, &created, now) {
            violation = Some(format!("at {now}: {e}"));
            break;
        }
        if check_invariants && let Err(e) = check_status_changes(&fleet, &mut seen) {
            violation = Some(format!("at {now}: {e}"));
            break;
        }
        if let Some(observe) = observe.as_mut() {
            observe(&fleet, now);
        }
        if fleet.is_finished()
            && next_action >= actions.len()
            && next_change >= changes.len()
            && next_train >= trains.len()
        {
            break;
        }
    }
    while let Some(FleetEvent { run, event }) = fleet.poll_event() {
        if let Some(i) = index_of(&runs, &run) {
            runs[i].events.push(event);
        }
    }
    let mut result = SimResult {
        run: None,
        create_error: main_error,
        clusters: outputs(&clusters),
        events: Vec::new(),
        update_runs: Vec::new(),
        warnings,
        profiles: profiles
            .iter()
            .map(|p| (p.name.clone(), profile_resource(&scenario.fleet, p)))
            .collect(),
        generated_runs: Vec::new(),
        status: None,
        fleets: BTreeMap::new(),
        fleet_order: Vec::new(),
    };
    for r in runs {
        let Some(engine) = fleet.run(&r.name) else {
            continue;
        };
        let mut resource = run_resource(
            &scenario.fleet,
            &r.name,
            r.strategy.as_ref(),
            &r.update,
            engine,
        );
        match r.generated {
            None if r.declared => result.update_runs.push(UpdateRunOut {
                name: r.name,
                run: Some(resource),
                create_error: None,
                events: r.events,
                status: Some(engine.status()),
            }),
            None => {
                let mut events = r.events;
                // Rejected profile actions, in time order with the run's own events.
                events.append(&mut feed_events);
                events.sort_by_key(|e| e.time);
                result.run = Some(resource);
                result.status = Some(engine.status());
                result.events = events;
            }
            Some((profile, key)) => {
                resource["properties"]["autoUpgradeProfileId"] =
                    json!(train::profile_id(&scenario.fleet, &profile));
                result.generated_runs.push(GeneratedRunOut {
                    profile,
                    key,
                    created_at: r.created_at,
                    run: resource,
                    events: r.events,
                    status: Some(engine.status()),
                });
            }
        }
    }
    if !feed_events.is_empty() {
        result.events = feed_events;
    }
    for (order, name, error) in refused {
        result.update_runs.insert(
            order.min(result.update_runs.len()),
            UpdateRunOut {
                name,
                run: None,
                create_error: Some(error),
                events: Vec::new(),
                status: None,
            },
        );
    }
    (result, violation)
}

/// Creates a further hand-made run of `updateRuns` as the API would (SEMANTICS §12): its name
/// checked, its strategy parsed with its checks' providers, its upgrade parsed; the fleet
/// refuses a name already taken.
fn create_declared(
    scenario: &Scenario,
    fleet: &mut FleetEngine,
    declared: &DeclaredRun,
) -> Result<(Vec<String>, Option<StrategySpec>, ManagedClusterUpdateSpec), ApiError> {
    flotilla_engine::strategy::check_name(&declared.name, 50).map_err(|m| {
        ApiError::new(
            ErrorCode::InvalidName,
            format!("updateRun name: {m}"),
            "name",
        )
    })?;
    let (spec, strategy, update) =
        spec_of(scenario, declared.strategy.as_ref(), Some(&declared.update))?;
    let warnings = fleet.create_run(&declared.name, &spec, scenario.catalog.clone())?;
    Ok((warnings, strategy, update))
}

fn not_found(what: &str, name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("{what} {name:?} does not exist"),
        what.replace(' ', ""),
    )
}

/// The profile resource as the API returns it: a downstream profile's status shows what it
/// waits for (`upstream`, SEMANTICS §14) beside its last trigger.
fn profile_resource(fleet: &str, p: &SimProfile) -> Value {
    let mut properties = serde_json::to_value(&p.spec).unwrap_or_else(|_| json!({}));
    properties["provisioningState"] = json!("Succeeded");
    let mut status = p.status.clone();
    if let Some(upstream) = &p.upstream {
        status.get_or_insert_with(|| json!({}))["upstream"] = upstream.clone();
    }
    if let Some(status) = status {
        properties["autoUpgradeProfileStatus"] = status;
    }
    json!({
        "id": train::profile_id(fleet, &p.name),
        "name": p.name,
        "type": "Microsoft.ContainerService/fleets/autoUpgradeProfiles",
        "properties": properties,
    })
}

/// Creates (does not start) the run for the profile's current target, as `generateUpdateRun`
/// does: `Ok(Ok(None))` when that run already exists, `Ok(Ok(Some(index)))` for a new one,
/// `Ok(Err(_))` when the profile generates nothing now. The name, upgrade and rules come from
/// the engine's `plan_generation`, as in the server. A downstream profile's current target is
/// what its upstream validated once the soak is over (SEMANTICS §14), pinned.
#[allow(clippy::too_many_arguments)]
fn generate(
    scenario: &Scenario,
    fleet: &mut FleetEngine,
    runs: &mut Vec<SimRun>,
    p: &SimProfile,
    catalog: &Catalog,
    now: Time,
    upstream: &Validations,
) -> Result<Result<Option<usize>, NoRun>, ApiError> {
    let (planned, promoted) = match &p.profile.upstream {
        _ if p.profile.disabled => return Ok(Err(NoRun::Disabled)),
        Some(up) => {
            let validated = upstream
                .get(&up.profile_id())
                .map_or(&[][..], Vec::as_slice);
            match train::promotion_for(&p.profile, validated, now) {
                Promotion::Due { validated, .. } => {
                    let (planned, from) = train::promoted_run(
                        &p.name,
                        &p.profile,
                        catalog,
                        &validated,
                        scenario.pins_node_images,
                    );
                    (planned, Some(from))
                }
                Promotion::Soaking { soak_ends_at, .. } => {
                    return Err(ApiError::conflict(format!(
                        "auto-upgrade profile {:?} follows {}: what it validated soaks until {soak_ends_at}",
                        p.name,
                        up.profile_id()
                    )));
                }
                Promotion::Nothing => {
                    return Err(ApiError::conflict(format!(
                        "auto-upgrade profile {:?} follows {}, which validated nothing yet",
                        p.name,
                        up.profile_id()
                    )));
                }
            }
        }
        None => match plan_generation(&p.name, &p.profile, catalog, now) {
            Ok(planned) => (planned, None),
            Err(no_run) => return Ok(Err(no_run)),
        },
    };
    if runs.iter().any(|r| r.name == planned.name) {
        return Ok(Ok(None));
    }
    create_generated(scenario, fleet, runs, p, planned, catalog, now, promoted).map(|i| Ok(Some(i)))
}

/// Creates (does not start) the run a profile planned, with the profile's strategy copied at
/// this moment (SEMANTICS §8) and, for a promoted run, its provenance (§14).
#[allow(clippy::too_many_arguments)]
fn create_generated(
    scenario: &Scenario,
    fleet: &mut FleetEngine,
    runs: &mut Vec<SimRun>,
    p: &SimProfile,
    planned: GeneratedRun,
    catalog: &Catalog,
    now: Time,
    promoted: Option<PromotedFrom>,
) -> Result<usize, ApiError> {
    let strategy_spec = p
        .profile
        .update_strategy_id
        .as_ref()
        .and_then(|id| scenario.strategies.get(id))
        .map(|s| from_json_value::<StrategySpec>(s.clone(), "properties.strategy"))
        .transpose()?;
    let strategy = strategy_spec
        .as_ref()
        .map(|s| scenario.parse_strategy(s))
        .transpose()?;
    let upgrade = parse_upgrade(&planned.update, "properties.managedClusterUpdate")?;
    let spec = RunSpec {
        strategy,
        upgrade,
        rules: planned.rules,
    };
    // Membership from the fleet as it is now.
    let (mut engine, _) = fleet.plan_run(&planned.name, &spec, catalog.clone(), &[])?;
    if let Some(from) = promoted {
        engine.set_promoted_from(from);
    }
    fleet.take_run(&planned.name, engine)?;
    let key = format!("{}/{}", p.name, planned.target.versions().join("+"));
    runs.push(SimRun {
        name: planned.name,
        strategy: strategy_spec,
        update: planned.update,
        generated: Some((p.name.clone(), key)),
        declared: false,
        versions: planned.target.versions(),
        created_at: now,
        events: Vec::new(),
    });
    Ok(runs.len() - 1)
}

/// Starts a run a profile's trigger just created: how the trigger ended.
fn start_generated(fleet: &mut FleetEngine, run: &SimRun, now: Time) -> TriggerOutcome {
    let start = fleet.handle(
        now,
        FleetInput::Run {
            run: run.name.clone(),
            input: Input::Start,
        },
    );
    TriggerOutcome::started(
        run.name.clone(),
        run.versions.clone(),
        start.map_err(|e| e.message),
    )
}

/// The instants after the start at which a downstream profile looks at its upstream
/// (SEMANTICS §14): when a run of the upstream that validated completes (the profile's status
/// shows it) and when its soak ends (the profile may promote then, exactly), for each soak the
/// profile has over the scenario.
pub fn train_instants(scenario: &Scenario, upstream: &Validations) -> Vec<Time> {
    let edited = scenario.actions.iter().filter_map(|a| match &a.action {
        Action::UpdateProfile { parsed, .. } => parsed.upstream.as_ref(),
        _ => None,
    });
    let mut instants: Vec<Time> = scenario
        .profiles
        .iter()
        .filter_map(|p| p.profile.upstream.as_ref())
        .chain(edited)
        .flat_map(|up| {
            upstream
                .get(&up.profile_id())
                .into_iter()
                .flatten()
                .flat_map(move |v| {
                    [
                        v.completed_time,
                        v.completed_time.plus(up.soak_seconds as i64),
                    ]
                })
        })
        .filter(|t| *t > scenario.start)
        .collect();
    instants.sort();
    instants.dedup();
    instants
}

/// A user action on one run.
fn act(
    fleet: &mut FleetEngine,
    run: &str,
    sim: &mut Sim<'_>,
    now: Time,
    action: &Action,
) -> Result<(), ApiError> {
    let mut input = |input: Input| {
        fleet.handle(
            now,
            FleetInput::Run {
                run: run.to_string(),
                input,
            },
        )
    };
    match action {
        Action::Start => input(Input::Start),
        Action::Stop => input(Input::Stop),
        Action::Approve(locator) => {
            let timing = match locator.timing.as_str() {
                "Before" => Some(Timing::Before),
                "After" => Some(Timing::After),
                _ => None,
            };
            let gate = timing.and_then(|t| {
                fleet
                    .run(run)?
                    .find_gate(&locator.stage, locator.group.as_deref(), t)
            });
            match gate {
                Some(gate) => fleet.handle(
                    now,
                    FleetInput::Run {
                        run: run.to_string(),
                        input: Input::ApproveGate {
                            gate,
                            by: "scenario".into(),
                        },
                    },
                ),
                None => Err(ApiError::new(
                    ErrorCode::NotFound,
                    locator.not_found_message(),
                    "gate",
                )),
            }
        }
        Action::Skip(targets) => {
            let parsed: Result<Vec<SkipTarget>, ApiError> = targets
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    skip_kind(&t.kind)
                        .map(|kind| SkipTarget {
                            kind,
                            name: t.name.clone(),
                        })
                        .ok_or_else(|| {
                            ApiError::new(
                                ErrorCode::InvalidSkipTarget,
                                format!(
                                    "targets[{i}].type {:?}: must be Member, Group, Stage or AfterStageWait",
                                    t.kind
                                ),
                                format!("targets[{i}].type"),
                            )
                        })
                })
                .collect();
            parsed.and_then(|targets| input(Input::Skip(targets)))
        }
        Action::RemoveMember(member) => match sim.clusters.get_mut(member) {
            Some(c) if !c.removed => {
                c.removed = true;
                fleet.handle(
                    now,
                    FleetInput::MemberRemoved {
                        member: member.clone(),
                    },
                )
            }
            _ => Err(not_found_member(member)),
        },
        Action::AddNodePool { member, pool } => {
            match sim.clusters.get_mut(member).filter(|c| !c.removed) {
                Some(c) => {
                    c.cluster.node_pools.push(pool.clone());
                    let cluster = c.cluster.clone();
                    fleet.handle(
                        now,
                        FleetInput::Observed {
                            member: member.clone(),
                            cluster,
                        },
                    )
                }
                None => Err(not_found_member(member)),
            }
        }
        // Profile and fleet-wide actions are handled by the caller.
        Action::RefreshCatalog
        | Action::GenerateUpdateRun(_)
        | Action::UpdateProfile { .. }
        | Action::PutFreeze(_)
        | Action::DeleteFreeze(_)
        | Action::PutBudget(_)
        | Action::DeleteBudget(_)
        | Action::Rollback
        | Action::CreateRun(_) => Ok(()),
    }
}

fn not_found_member(member: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("member {member:?} is not in the fleet"),
        "member",
    )
}

/// What a check evaluated now sees, as the scenario scripts it (SEMANTICS §10, `sim.checks`):
/// a member's checks read its own script, a gate's the scenario's `checks`. A check with no
/// script cannot be evaluated.
fn scripted_outcome(
    scenario: &Scenario,
    subject: &CheckSubject,
    check: &str,
    now: Time,
) -> Outcome {
    let scripts = match subject {
        CheckSubject::Soak { member } | CheckSubject::Readiness { member } => {
            scenario.member_checks.get(member)
        }
        CheckSubject::Gate { .. } => Some(&scenario.gate_checks),
    };
    match scripts
        .and_then(|s| s.get(check))
        .and_then(|script| scripted_at(script, now))
    {
        Some(Scripted::Number(v)) => Outcome::Samples(vec![*v]),
        Some(Scripted::Passed(passed)) => Outcome::Verdict {
            passed: *passed,
            value: passed.to_string(),
        },
        Some(Scripted::Unavailable) => Outcome::Unavailable("scripted unavailable".into()),
        None => Outcome::Unavailable(format!(
            "the scenario scripts no result for check {check:?}"
        )),
    }
}

/// An operation in flight: (ends at, sequence, run, member, attempt).
type Finishing = (Time, u64, usize, String, u64);

struct Sim<'a> {
    clusters: &'a mut BTreeMap<String, SimCluster>,
    /// (ends at, sequence, run, member, attempt), earliest first.
    finishing: BinaryHeap<Reverse<Finishing>>,
    targets: BTreeMap<(usize, u64), Target>,
    seq: u64,
}

impl Sim<'_> {
    fn start(
        &mut self,
        now: Time,
        run: usize,
        member: &str,
        attempt: u64,
        target: Target,
    ) -> String {
        let Some(c) = self.clusters.get_mut(member) else {
            // A cluster that left the fleet: the operation fails at once.
            self.seq += 1;
            self.finishing
                .push(Reverse((now, self.seq, run, member.to_string(), attempt)));
            return format!("sim-op-{attempt}");
        };
        let number = c.operations.len() as u32 + 1;
        let fails = (c.behaviour.fail && c.behaviour.fail_attempts.is_none_or(|n| number <= n))
            || c.behaviour.fail_operations.contains(&number);
        let end = now.plus(c.behaviour.duration_seconds);
        c.operations.push((run, attempt, end, !fails));
        self.targets.insert((run, attempt), target);
        self.seq += 1;
        self.finishing
            .push(Reverse((end, self.seq, run, member.to_string(), attempt)));
        format!("sim-op-{attempt}")
    }

    fn finish(&mut self, run: usize, member: &str, attempt: u64) -> Result<(), String> {
        let Some(c) = self.clusters.get_mut(member) else {
            return Err("the cluster is no longer in the fleet".into());
        };
        let succeeds = c
            .operations
            .iter()
            .find(|o| o.0 == run && o.1 == attempt)
            .is_some_and(|o| o.3);
        if succeeds {
            if let Some(target) = self.targets.get(&(run, attempt)) {
                let was = c.cluster.clone();
                apply_target(&mut c.cluster, target);
                if let Some(until) = c.behaviour.rollback_until
                    && target.rollback.is_none()
                {
                    flotilla_engine::engine::offer_rollbacks(&mut c.cluster, &was, until);
                }
            }
            Ok(())
        } else {
            Err(c.behaviour.fail_message.clone())
        }
    }

    /// The cluster, if it offers rollbacks (SEMANTICS §15) and its offers differ from what
    /// applying its operations alone gives: the fleet must observe it.
    fn offers_changed(&self, member: &str) -> Option<Cluster> {
        let c = self.clusters.get(member)?;
        (c.behaviour.rollback_until.is_some() && !c.cluster.rollback.is_empty())
            .then(|| c.cluster.clone())
    }

    fn observe(
        &self,
        now: Time,
        run: usize,
        member: &str,
        attempt: u64,
    ) -> (Option<Cluster>, OperationProgress) {
        let Some(c) = self.clusters.get(member) else {
            return (None, OperationProgress::NotRunning);
        };
        let running = c
            .operations
            .iter()
            .any(|o| o.0 == run && o.1 == attempt && o.2 > now);
        (
            Some(c.cluster.clone()),
            if running {
                OperationProgress::InProgress
            } else {
                OperationProgress::NotRunning
            },
        )
    }
}
