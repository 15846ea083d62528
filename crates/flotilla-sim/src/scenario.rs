//! Scenario files (`tests/conformance/FORMAT.md`): a fleet, a release catalog, a strategy,
//! an upgrade, a timeline of actions and the expectations, read from YAML.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use flotilla_engine::budget::{Budget, BudgetSpec, parse_budget};
use flotilla_engine::checks::{Provider, ProviderSpec, ProviderTarget, parse_provider};
use flotilla_engine::error::{ApiError, from_json_value};
use flotilla_engine::fleet::{Catalog, CatalogSpec, Cluster, Member, NodePool, NodePoolSpec, Os};
use flotilla_engine::freeze::{Freeze, FreezeSpec, parse_freeze};
use flotilla_engine::profile::{Profile, ProfileSpec, parse_profile};
use flotilla_engine::release::{Release, ReleaseSpec, parse_releases};
use flotilla_engine::strategy::{ManagedClusterUpdateSpec, Strategy, StrategySpec};
use flotilla_engine::time::{Time, parse_duration};
use flotilla_engine::version::KubeVersion;
use flotilla_engine::window::{MaintenanceWindow, MaintenanceWindowSpec};

/// The last instant a scenario simulates: the latest a timestamp can name (9999-12-30T22:00:00Z,
/// jiff's maximum). A later `until` stops here, so the clock never reaches instants near
/// `i64::MAX` seconds (where `start` plus a far offset saturates), on which calendar arithmetic
/// (windows, scheduled gates) overflows.
pub const LATEST: Time = Time::from_unix(253_402_207_200);

/// A scenario file that cannot be used: the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ScenarioError(pub String);

impl From<ApiError> for ScenarioError {
    fn from(e: ApiError) -> Self {
        ScenarioError(e.message)
    }
}

/// Accepts a YAML scalar of any type as text (`ring: 0`, `version: 1.30.5`).
fn scalar_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(serde::de::Error::custom(format!(
            "expected a scalar, got {other}"
        ))),
    }
}

fn optional_scalar_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    scalar_text(d).map(Some)
}

fn scalar_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let map = BTreeMap::<String, Value>::deserialize(d)?;
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            Value::Number(n) => Ok((k, n.to_string())),
            Value::Bool(b) => Ok((k, b.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "label {k}: expected a scalar, got {other}"
            ))),
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioSpec {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(deserialize_with = "scalar_text")]
    pub start: String,
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub until: Option<String>,
    #[serde(default)]
    pub catalog: serde_json::Map<String, Value>,
    #[serde(default)]
    pub members: Vec<MemberSpec>,
    #[serde(default)]
    pub strategy: Option<Value>,
    /// Optional when the scenario declares `autoUpgradeProfiles`: then there may be no
    /// hand-made run at all.
    #[serde(default)]
    pub update: Option<Value>,
    /// Update strategies by name, for profiles' `updateStrategyId`.
    #[serde(default)]
    pub strategies: BTreeMap<String, Value>,
    /// Profile name → the API's profile `properties`.
    #[serde(default)]
    pub auto_upgrade_profiles: BTreeMap<String, Value>,
    /// The release timeline: releases published at offsets from `start`, region by region.
    #[serde(default)]
    pub releases: Vec<ReleaseSpec>,
    #[serde(default)]
    pub actions: Vec<ActionSpec>,
    /// What HealthCheck gates' checks will see, by check name (SEMANTICS §10).
    #[serde(default)]
    pub checks: BTreeMap<String, Value>,
    /// Check providers by name: the API's `properties` (SEMANTICS §10).
    #[serde(default)]
    pub check_providers: BTreeMap<String, Value>,
    /// The fleet's freezes from `start`, by name: the API's `properties` (SEMANTICS §12).
    #[serde(default)]
    pub freezes: BTreeMap<String, Value>,
    /// The fleet's disruption budgets from `start`, by name: the API's `properties`.
    #[serde(default)]
    pub disruption_budgets: BTreeMap<String, Value>,
    /// Further hand-made runs, by name, in file order (SEMANTICS §12): each
    /// `{strategy?, update}`, created at `start` right after the run of `update`.
    #[serde(default)]
    pub update_runs: serde_json::Map<String, Value>,
    #[serde(default)]
    pub expect: Option<Value>,
    /// What the fleet's simulated driver can do (tests/scenarios/README.md).
    #[serde(default)]
    pub sim: Option<FleetSimSpec>,
}

/// `sim` at the top of a fleet: what its simulated driver can do.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetSimSpec {
    /// Whether the driver can pin node images (SEMANTICS §14); the `sim` driver can, AKS
    /// cannot (`NodeImageSelectionUnsupported`). Default true.
    #[serde(default)]
    pub pins_node_images: Option<bool>,
}

/// One entry of `updateRuns`: the strategy and upgrade of a further hand-made run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateRunEntry {
    #[serde(default)]
    strategy: Option<Value>,
    update: Value,
}

/// A further hand-made run of `updateRuns` (SEMANTICS §12), as written: its strategy and
/// upgrade are parsed when it is created, as the API parses a run's body, so a run the API
/// would refuse is a `createError` of that run rather than a broken scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredRun {
    pub name: String,
    pub strategy: Option<Value>,
    pub update: Value,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    pub name: String,
    pub family: String,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(deserialize_with = "scalar_text")]
    pub node_image_version: String,
    /// The pool's Kubernetes version (SEMANTICS §13); absent: the member's.
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub orchestrator_version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaintenanceSpec {
    #[serde(default)]
    pub kubernetes: Option<MaintenanceWindowSpec>,
    #[serde(default, rename = "nodeOS")]
    pub node_os: Option<MaintenanceWindowSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimSpec {
    #[serde(default)]
    pub duration_seconds: Option<i64>,
    #[serde(default)]
    pub outcome: Option<String>,
    #[serde(default)]
    pub fail_message: Option<String>,
    #[serde(default)]
    pub fail_attempts: Option<u32>,
    /// The operations sent to this cluster that fail, counted from 1 across runs and hops
    /// (SEMANTICS §13).
    #[serde(default)]
    pub fail_operations: Vec<u32>,
    /// What the cluster can roll back (SEMANTICS §15): every scope an upgrade changed, to its
    /// state before that first change, until the scenario's start plus `until`.
    #[serde(default)]
    pub rollback: Option<SimRollbackSpec>,
    /// What this member's health and readiness checks will see, by check name (SEMANTICS §10).
    #[serde(default)]
    pub checks: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimRollbackSpec {
    #[serde(deserialize_with = "scalar_text")]
    pub until: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberSpec {
    pub name: String,
    pub region: String,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default, deserialize_with = "scalar_map")]
    pub labels: BTreeMap<String, String>,
    #[serde(deserialize_with = "scalar_text")]
    pub kubernetes_version: String,
    #[serde(default)]
    pub long_term_support: bool,
    #[serde(default)]
    pub node_pools: Option<Vec<PoolSpec>>,
    #[serde(default)]
    pub maintenance: Option<MaintenanceSpec>,
    #[serde(default)]
    pub sim: Option<SimSpec>,
    #[serde(default)]
    pub cluster_resource_id: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GateLocator {
    pub stage: String,
    #[serde(default)]
    pub group: Option<String>,
    pub timing: String,
}

impl GateLocator {
    /// What an approve action says when the run has no such gate: the place in words, never
    /// Rust's spelling of an absent group (`None`, `Some("g")`).
    pub fn not_found_message(&self) -> String {
        match &self.group {
            Some(group) => format!(
                "no {} gate at stage {:?}, group {group:?}",
                self.timing, self.stage
            ),
            None => format!("no {} gate of stage {:?}", self.timing, self.stage),
        }
    }
}

#[cfg(test)]
mod locator_tests {
    use super::GateLocator;

    #[test]
    fn a_missing_gate_is_named_in_words() {
        let at = |group: Option<&str>| GateLocator {
            stage: "prod".into(),
            group: group.map(String::from),
            timing: "Before".into(),
        };
        assert_eq!(
            at(None).not_found_message(),
            r#"no Before gate of stage "prod""#
        );
        assert_eq!(
            at(Some("eu")).not_found_message(),
            r#"no Before gate at stage "prod", group "eu""#
        );
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TargetSpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActionSpec {
    #[serde(deserialize_with = "scalar_text")]
    pub at: String,
    #[serde(rename = "do")]
    pub action: String,
    #[serde(default)]
    pub gate: Option<GateLocator>,
    #[serde(default)]
    pub targets: Option<Vec<TargetSpec>>,
    #[serde(default)]
    pub member: Option<String>,
    #[serde(default)]
    pub pool: Option<PoolSpec>,
    /// The generated run an action is for (its name, or `profile/versions`); the hand-made run
    /// when absent.
    #[serde(default)]
    pub run: Option<String>,
    #[serde(default)]
    pub profile: Option<String>,
    /// `updateProfile`, `putFreeze`: the new `properties`.
    #[serde(default)]
    pub properties: Option<Value>,
    /// `putFreeze`, `deleteFreeze`: the freeze's name.
    #[serde(default)]
    pub name: Option<String>,
}

/// How a simulated cluster behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimBehaviour {
    pub duration_seconds: i64,
    pub fail: bool,
    pub fail_message: String,
    /// With `fail`: only the first N operations fail; `None` means all do.
    pub fail_attempts: Option<u32>,
    /// These operations fail whatever `fail` says (the Nth sent to the cluster, from 1).
    pub fail_operations: Vec<u32>,
    /// Until when the cluster can roll back what upgrades changed (SEMANTICS §15); `None`:
    /// it offers no rollback.
    pub rollback_until: Option<Time>,
}

#[derive(Clone, Debug)]
pub enum Action {
    Start,
    Stop,
    Approve(GateLocator),
    Skip(Vec<TargetSpec>),
    RemoveMember(String),
    /// `rollback`: creates and starts the rollback run of the run (SEMANTICS §15).
    Rollback,
    AddNodePool {
        member: String,
        pool: NodePool,
    },
    /// The release feed reads the catalog again: every enabled profile is checked.
    RefreshCatalog,
    /// `generateUpdateRun`: creates (does not start) the profile's run for its current target.
    GenerateUpdateRun(String),
    /// Replaces a profile's properties (to disable it, say); runs it created stay.
    UpdateProfile {
        profile: String,
        spec: ProfileSpec,
        parsed: Profile,
    },
    /// Creates or replaces a freeze (SEMANTICS §12).
    PutFreeze(Box<Freeze>),
    /// Deletes a freeze.
    DeleteFreeze(String),
    /// Creates or replaces a disruption budget (SEMANTICS §12).
    PutBudget(Box<Budget>),
    /// Deletes a disruption budget.
    DeleteBudget(String),
    /// Creates (does not start) a further hand-made run of `updateRuns`. Only at `start`,
    /// right after the run of `update` and before any other action: the simulator creates
    /// these itself and never plays them as actions ([`Scenario::update_runs`]).
    CreateRun(Box<DeclaredRun>),
}

#[derive(Clone, Debug)]
pub struct TimedAction {
    pub at: Time,
    pub action: Action,
    /// The action as written, for the event log.
    pub label: String,
    /// The generated run it is for, if not the hand-made run.
    pub run: Option<String>,
}

/// An auto-upgrade profile of a scenario.
#[derive(Clone, Debug)]
pub struct ScenarioProfile {
    pub name: String,
    pub spec: ProfileSpec,
    pub profile: Profile,
}

/// A scenario, parsed and checked.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub start: Time,
    pub until: Time,
    pub catalog: Catalog,
    pub members: Vec<Member>,
    pub behaviour: BTreeMap<String, SimBehaviour>,
    pub strategy: Option<Value>,
    /// `None`: no hand-made run (a profile scenario).
    pub update: Option<Value>,
    pub strategies: BTreeMap<String, Value>,
    pub profiles: Vec<ScenarioProfile>,
    pub releases: Vec<Release>,
    pub actions: Vec<TimedAction>,
    /// Scripted results of members' checks: member → check → script.
    pub member_checks: BTreeMap<String, BTreeMap<String, CheckScript>>,
    /// Scripted results of gates' checks: check → script.
    pub gate_checks: BTreeMap<String, CheckScript>,
    /// Check providers by name (nothing is evaluated for real: checks' results are scripted).
    pub providers: BTreeMap<String, Provider>,
    /// The fleet's freezes at `start` (SEMANTICS §12).
    pub freezes: Vec<Freeze>,
    /// The fleet's disruption budgets at `start`.
    pub budgets: Vec<Budget>,
    /// The fleet's name, as resource ids say: [`SIM_FLEET`] for a scenario of one fleet.
    pub fleet: String,
    /// Whether the fleet's simulated driver pins node images (`sim.pinsNodeImages`).
    pub pins_node_images: bool,
    /// A scenario of several fleets (`fleets`): each fleet's scenario, in the order they are
    /// simulated (every fleet after the fleets whose profiles its profiles follow). Empty for a
    /// scenario of one fleet.
    pub fleets: Vec<Scenario>,
    pub expect: Option<Value>,
}

/// What one evaluation of a scripted check sees.
#[derive(Clone, Debug, PartialEq)]
pub enum Scripted {
    /// A Prometheus result.
    Number(f64),
    /// An Http or Exec check's verdict.
    Passed(bool),
    /// The evaluation cannot be made.
    Unavailable,
}

/// A check's results over time: each from its instant on, the earliest first.
pub type CheckScript = Vec<(Time, Scripted)>;

/// What a script gives at `now`: the last entry from `now` or earlier.
pub fn scripted_at(script: &CheckScript, now: Time) -> Option<&Scripted> {
    script
        .iter()
        .rev()
        .find(|(from, _)| *from <= now)
        .map(|(_, v)| v)
}

fn scripted_value(path: &str, value: &Value) -> Result<Scripted, ScenarioError> {
    match value {
        Value::Bool(b) => Ok(Scripted::Passed(*b)),
        Value::Number(n) => n
            .as_f64()
            .map(Scripted::Number)
            .ok_or_else(|| bad(path, format!("{n} is not a number"))),
        Value::String(s) if s == "unavailable" => Ok(Scripted::Unavailable),
        other => Err(bad(
            path,
            format!("{other} must be a number, true, false or \"unavailable\""),
        )),
    }
}

/// `{"CHECK": VALUE | [{"from": OFFSET, "value": VALUE}, ...]}` (SEMANTICS §10).
fn check_scripts(
    path: &str,
    start: Time,
    checks: &BTreeMap<String, Value>,
) -> Result<BTreeMap<String, CheckScript>, ScenarioError> {
    let mut scripts = BTreeMap::new();
    for (name, value) in checks {
        let cpath = format!("{path}.{name}");
        let script = match value {
            Value::Array(entries) => {
                let mut script = Vec::with_capacity(entries.len());
                for (i, entry) in entries.iter().enumerate() {
                    let epath = format!("{cpath}[{i}]");
                    let Some(obj) = entry.as_object() else {
                        return Err(bad(&epath, "must be {from, value}"));
                    };
                    if let Some(key) = obj.keys().find(|k| *k != "from" && *k != "value") {
                        return Err(bad(&epath, format!("unknown field {key:?}")));
                    }
                    let from = match obj.get("from") {
                        None => start,
                        Some(Value::String(text)) => {
                            let offset = parse_duration(text).ok_or_else(|| {
                                bad(
                                    &format!("{epath}.from"),
                                    format!("{text:?} is not a duration like 2h"),
                                )
                            })?;
                            start.plus(offset)
                        }
                        Some(Value::Number(n)) => start.plus(n.as_i64().ok_or_else(|| {
                            bad(
                                &format!("{epath}.from"),
                                format!("{n} is not whole seconds"),
                            )
                        })?),
                        Some(other) => {
                            return Err(bad(
                                &format!("{epath}.from"),
                                format!("{other} is not a duration"),
                            ));
                        }
                    };
                    if script.last().is_some_and(|(t, _)| *t >= from) {
                        return Err(bad(
                            &format!("{epath}.from"),
                            "must come after the entry before it",
                        ));
                    }
                    let v = obj
                        .get("value")
                        .ok_or_else(|| bad(&format!("{epath}.value"), "is required"))?;
                    script.push((from, scripted_value(&format!("{epath}.value"), v)?));
                }
                script
            }
            v => vec![(start, scripted_value(&cpath, v)?)],
        };
        scripts.insert(name.clone(), script);
    }
    Ok(scripts)
}

pub(crate) fn profile_from(
    path: &str,
    properties: &Value,
    strategies: &BTreeMap<String, Value>,
) -> Result<(ProfileSpec, Profile), ScenarioError> {
    let spec: ProfileSpec = from_json_value(properties.clone(), path)?;
    let profile = parse_profile(&spec).map_err(|e| {
        bad(
            &e.target.replacen("properties", path, 1),
            e.message
                .split_once(": ")
                .map_or(e.message.as_str(), |(_, m)| m),
        )
    })?;
    if let Some(id) = &profile.update_strategy_id
        && !strategies.contains_key(id)
    {
        return Err(bad(
            &format!("{path}.updateStrategyId"),
            format!("{id:?} is not one of the scenario's strategies"),
        ));
    }
    Ok((spec, profile))
}

pub(crate) fn bad(path: &str, message: impl std::fmt::Display) -> ScenarioError {
    ScenarioError(format!("{path}: {message}"))
}

fn time_at(path: &str, text: &str) -> Result<Time, ScenarioError> {
    Time::parse(text).map_err(|e| bad(path, e))
}

fn kube(path: &str, text: &str) -> Result<KubeVersion, ScenarioError> {
    KubeVersion::parse(text).ok_or_else(|| {
        bad(
            path,
            format!("{text:?} is not a Kubernetes version major.minor.patch"),
        )
    })
}

fn pool(path: &str, p: &PoolSpec) -> Result<NodePool, ScenarioError> {
    let spec = NodePoolSpec {
        name: p.name.clone(),
        family: p.family.clone(),
        os: p.os.clone(),
        node_image_version: p.node_image_version.clone(),
        orchestrator_version: p.orchestrator_version.clone(),
    };
    Ok(NodePool::parse(&spec, path)?)
}

/// A freeze of the scenario, validated as the API does.
fn freeze_from(path: &str, name: &str, properties: Value) -> Result<Freeze, ScenarioError> {
    flotilla_engine::strategy::check_name(name, 63).map_err(|e| bad(path, e))?;
    let spec: FreezeSpec = from_json_value(properties, path)?;
    parse_freeze(name, &spec).map_err(|e| bad(path, e.message))
}

/// A disruption budget of the scenario, validated as the API does.
fn budget_from(path: &str, name: &str, properties: Value) -> Result<Budget, ScenarioError> {
    flotilla_engine::strategy::check_name(name, 63).map_err(|e| bad(path, e))?;
    let spec: BudgetSpec = from_json_value(properties, path)?;
    parse_budget(name, &spec).map_err(|e| bad(path, e.message))
}

/// Rewrites every check of a strategy written in the form before providers (`endpoint`, `url`,
/// `command`, `headers`, `caFile`) as one naming a provider `inline-<type>` of its type, which
/// is declared if the scenario has none of that name.
fn inline_to_providers(strategy: &mut Value, providers: &mut BTreeMap<String, Provider>) {
    match strategy {
        Value::Object(map) => {
            let inline = ["endpoint", "url", "command", "headers", "caFile"]
                .iter()
                .any(|k| map.contains_key(*k));
            if inline
                && map.contains_key("name")
                && !map.contains_key("provider")
                && !map.contains_key("checks")
            {
                let kind = map
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("Http")
                    .to_string();
                let command = map.remove("command");
                for key in ["endpoint", "url", "headers", "caFile"] {
                    map.remove(key);
                }
                let target = match kind.as_str() {
                    "Prometheus" => ProviderTarget::Prometheus {
                        endpoint: "http://prometheus.invalid".into(),
                    },
                    "Exec" => {
                        let args: Vec<Value> = command
                            .and_then(|c| c.as_array().cloned())
                            .unwrap_or_default()
                            .into_iter()
                            .skip(1)
                            .collect();
                        map.insert("args".into(), Value::Array(args));
                        ProviderTarget::Exec {
                            command: vec!["check".into()],
                            allow_options: true,
                        }
                    }
                    _ => {
                        map.entry("path")
                            .or_insert_with(|| Value::String("/".into()));
                        ProviderTarget::Http {
                            base_url: "http://health.invalid".into(),
                        }
                    }
                };
                let name = format!("inline-{}", kind.to_ascii_lowercase());
                map.insert("provider".into(), Value::String(name.clone()));
                providers.entry(name.clone()).or_insert(Provider {
                    name,
                    target,
                    headers: BTreeMap::new(),
                    ca_file: None,
                    fleets: None,
                });
                return;
            }
            for v in map.values_mut() {
                inline_to_providers(v, providers);
            }
        }
        Value::Array(items) => {
            for v in items {
                inline_to_providers(v, providers);
            }
        }
        _ => {}
    }
}

/// The fleet a scenario's runs belong to (as their resource ids say).
pub const SIM_FLEET: &str = "simulation";

impl Scenario {
    /// Parses a strategy as the API does at run creation: its checks name providers the
    /// scenario declares (SEMANTICS §10).
    pub fn parse_strategy(&self, spec: &StrategySpec) -> Result<Strategy, ApiError> {
        let strategy = flotilla_engine::strategy::parse_strategy(
            spec,
            "properties.strategy",
            flotilla_engine::strategy::DEFAULT_STAGE_CONCURRENCY_LIMIT,
        )?;
        flotilla_engine::checks::check_providers(
            spec,
            "properties.strategy",
            SIM_FLEET,
            &|name| self.providers.get(name).cloned(),
        )?;
        Ok(strategy)
    }

    /// Parses scenario YAML. `name` becomes the run's name. A scenario with `fleets` is one of
    /// several fleets (SEMANTICS §14, tests/scenarios/README.md): each fleet is parsed as a
    /// scenario of its own, and the release trains between them are checked as the API checks
    /// a profile's `upstream`.
    pub fn parse(name: &str, yaml: &str) -> Result<Scenario, ScenarioError> {
        let value: Value = serde_saphyr::from_str(yaml)
            .map_err(|e| ScenarioError(format!("not valid YAML: {e}")))?;
        if value.get("fleets").is_some() {
            return crate::fleets::parse_fleets(name, value);
        }
        let scenario = Scenario::parse_value(name, value)?;
        if let Some(p) = scenario
            .profiles
            .iter()
            .find(|p| p.profile.upstream.is_some())
        {
            return Err(bad(
                &format!("autoUpgradeProfiles.{}.upstream", p.name),
                "a scenario of one fleet has no other fleet to follow: give `fleets` (tests/scenarios/README.md)",
            ));
        }
        Ok(scenario)
    }

    /// Parses one fleet's scenario from its document.
    pub(crate) fn parse_value(name: &str, value: Value) -> Result<Scenario, ScenarioError> {
        let spec: ScenarioSpec = from_json_value(value, "")?;
        let start = time_at("start", &spec.start)?;
        let until = match &spec.until {
            None => start.plus(240 * 3600),
            Some(text) => start.plus(
                parse_duration(text)
                    .ok_or_else(|| bad("until", format!("{text:?} is not a duration like 72h")))?,
            ),
        }
        .min(LATEST);
        let mut spec = spec;
        let mut providers = BTreeMap::new();
        for (name, properties) in &spec.check_providers {
            let path = format!("checkProviders.{name}");
            flotilla_engine::strategy::check_name(name, 63).map_err(|e| bad(&path, e))?;
            let provider_spec: ProviderSpec = from_json_value(properties.clone(), &path)?;
            let provider =
                parse_provider(name, &provider_spec).map_err(|e| bad(&path, e.message))?;
            providers.insert(name.clone(), provider);
        }
        // Checks written in the form before providers still run here (their results are
        // scripted): each is given a provider of its type.
        if let Some(strategy) = spec.strategy.as_mut() {
            inline_to_providers(strategy, &mut providers);
        }
        for strategy in spec.strategies.values_mut() {
            inline_to_providers(strategy, &mut providers);
        }
        let mut declared = Vec::new();
        for (name, entry) in &spec.update_runs {
            let path = format!("updateRuns.{name}");
            let entry: UpdateRunEntry = from_json_value(entry.clone(), &path)?;
            let mut strategy = entry.strategy;
            if let Some(strategy) = strategy.as_mut() {
                inline_to_providers(strategy, &mut providers);
            }
            declared.push(TimedAction {
                at: start,
                action: Action::CreateRun(Box::new(DeclaredRun {
                    name: name.clone(),
                    strategy,
                    update: entry.update,
                })),
                label: "createRun".into(),
                run: Some(name.clone()),
            });
        }
        let catalog_spec: CatalogSpec =
            from_json_value(Value::Object(spec.catalog.clone()), "catalog")?;
        let catalog = Catalog::parse(&catalog_spec, "catalog")?;
        let mut members = Vec::new();
        let mut behaviour = BTreeMap::new();
        let mut member_checks = BTreeMap::new();
        for (i, m) in spec.members.iter().enumerate() {
            let mpath = format!("members[{i}]");
            flotilla_engine::strategy::check_name(&m.name, 50)
                .map_err(|e| bad(&format!("{mpath}.name"), e))?;
            if behaviour.contains_key(&m.name) {
                return Err(bad(
                    &format!("{mpath}.name"),
                    format!("member {:?} is listed twice", m.name),
                ));
            }
            let node_pools = match &m.node_pools {
                Some(pools) => pools
                    .iter()
                    .enumerate()
                    .map(|(j, p)| pool(&format!("{mpath}.nodePools[{j}]"), p))
                    .collect::<Result<Vec<_>, _>>()?,
                // Default: one Linux pool of the region's first listed family at its first version.
                None => catalog
                    .regions
                    .get(&m.region)
                    .and_then(|r| {
                        let family = r.family_order.first()?;
                        let first = r.node_images.get(family)?.first()?;
                        Some(vec![NodePool {
                            name: "nodepool1".into(),
                            family: family.clone(),
                            os: Os::Linux,
                            image: first.version.clone(),
                            orchestrator_version: None,
                        }])
                    })
                    .unwrap_or_default(),
            };
            let maintenance = m.maintenance.as_ref();
            let window = |spec: Option<&MaintenanceWindowSpec>, field: &str| {
                spec.map(|s| MaintenanceWindow::parse(s, &format!("{mpath}.maintenance.{field}")))
                    .transpose()
                    .map(|w| w.map(std::sync::Arc::new))
            };
            let cluster = Cluster {
                region: m.region.clone(),
                kubernetes_version: kube(
                    &format!("{mpath}.kubernetesVersion"),
                    &m.kubernetes_version,
                )?,
                node_pools,
                kubernetes_window: window(
                    maintenance.and_then(|x| x.kubernetes.as_ref()),
                    "kubernetes",
                )?,
                node_os_window: window(maintenance.and_then(|x| x.node_os.as_ref()), "nodeOS")?,
                long_term_support: m.long_term_support,
                rollback: Vec::new(),
            };
            let sim = m.sim.clone().unwrap_or_default();
            let rollback_until = sim
                .rollback
                .as_ref()
                .map(|r| {
                    parse_duration(&r.until)
                        .map(|offset| start.plus(offset))
                        .ok_or_else(|| {
                            bad(
                                &format!("{mpath}.sim.rollback.until"),
                                format!("{:?} is not a duration like 7d", r.until),
                            )
                        })
                })
                .transpose()?;
            if !sim.checks.is_empty() {
                member_checks.insert(
                    m.name.clone(),
                    check_scripts(&format!("{mpath}.sim.checks"), start, &sim.checks)?,
                );
            }
            let fail = match sim.outcome.as_deref() {
                None | Some("succeed") => false,
                Some("fail") => true,
                Some(other) => {
                    return Err(bad(
                        &format!("{mpath}.sim.outcome"),
                        format!("{other:?} must be succeed or fail"),
                    ));
                }
            };
            let duration_seconds = sim.duration_seconds.unwrap_or(600);
            if duration_seconds < 0 {
                return Err(bad(
                    &format!("{mpath}.sim.durationSeconds"),
                    "must not be negative",
                ));
            }
            behaviour.insert(
                m.name.clone(),
                SimBehaviour {
                    duration_seconds,
                    fail,
                    fail_message: sim
                        .fail_message
                        .unwrap_or_else(|| "simulated upgrade failure".into()),
                    fail_attempts: sim.fail_attempts,
                    fail_operations: sim.fail_operations,
                    rollback_until,
                },
            );
            members.push(Member {
                name: m.name.clone(),
                cluster_resource_id: m
                    .cluster_resource_id
                    .clone()
                    .unwrap_or_else(|| format!("/sim/clusters/{}", m.name)),
                group: m.group.clone(),
                labels: m.labels.clone(),
                cluster,
            });
        }
        let mut actions = Vec::new();
        for (i, a) in spec.actions.iter().enumerate() {
            let apath = format!("actions[{i}]");
            let offset = parse_duration(&a.at).ok_or_else(|| {
                bad(
                    &format!("{apath}.at"),
                    format!("{:?} is not a duration like 2h", a.at),
                )
            })?;
            let action = match a.action.as_str() {
                "start" => Action::Start,
                "stop" => Action::Stop,
                "approve" => Action::Approve(
                    a.gate
                        .clone()
                        .ok_or_else(|| bad(&format!("{apath}.gate"), "approve needs a gate"))?,
                ),
                "skip" => Action::Skip(
                    a.targets
                        .clone()
                        .ok_or_else(|| bad(&format!("{apath}.targets"), "skip needs targets"))?,
                ),
                "rollback" => Action::Rollback,
                "removeMember" => Action::RemoveMember(a.member.clone().ok_or_else(|| {
                    bad(&format!("{apath}.member"), "removeMember needs a member")
                })?),
                "addNodePool" => {
                    let member = a.member.clone().ok_or_else(|| {
                        bad(&format!("{apath}.member"), "addNodePool needs a member")
                    })?;
                    let p = a
                        .pool
                        .as_ref()
                        .ok_or_else(|| bad(&format!("{apath}.pool"), "addNodePool needs a pool"))?;
                    Action::AddNodePool {
                        member,
                        pool: pool(&format!("{apath}.pool"), p)?,
                    }
                }
                "refreshCatalog" => Action::RefreshCatalog,
                "putFreeze" | "deleteFreeze" => {
                    let name = a.name.clone().ok_or_else(|| {
                        bad(
                            &format!("{apath}.name"),
                            format!("{} needs a name", a.action),
                        )
                    })?;
                    if a.action == "deleteFreeze" {
                        Action::DeleteFreeze(name)
                    } else {
                        let properties = a.properties.clone().ok_or_else(|| {
                            bad(&format!("{apath}.properties"), "putFreeze needs properties")
                        })?;
                        Action::PutFreeze(Box::new(freeze_from(
                            &format!("{apath}.properties"),
                            &name,
                            properties,
                        )?))
                    }
                }
                "putDisruptionBudget" | "deleteDisruptionBudget" => {
                    let name = a.name.clone().ok_or_else(|| {
                        bad(
                            &format!("{apath}.name"),
                            format!("{} needs a name", a.action),
                        )
                    })?;
                    if a.action == "deleteDisruptionBudget" {
                        Action::DeleteBudget(name)
                    } else {
                        let properties = a.properties.clone().ok_or_else(|| {
                            bad(
                                &format!("{apath}.properties"),
                                "putDisruptionBudget needs properties",
                            )
                        })?;
                        Action::PutBudget(Box::new(budget_from(
                            &format!("{apath}.properties"),
                            &name,
                            properties,
                        )?))
                    }
                }
                "generateUpdateRun" | "updateProfile" => {
                    let profile = a.profile.clone().ok_or_else(|| {
                        bad(
                            &format!("{apath}.profile"),
                            format!("{} needs a profile", a.action),
                        )
                    })?;
                    if !spec.auto_upgrade_profiles.contains_key(&profile) {
                        return Err(bad(
                            &format!("{apath}.profile"),
                            format!("{profile:?} is not one of the scenario's autoUpgradeProfiles"),
                        ));
                    }
                    if a.action == "generateUpdateRun" {
                        Action::GenerateUpdateRun(profile)
                    } else {
                        let properties = a.properties.as_ref().ok_or_else(|| {
                            bad(
                                &format!("{apath}.properties"),
                                "updateProfile needs properties",
                            )
                        })?;
                        let (spec, parsed) = profile_from(
                            &format!("{apath}.properties"),
                            properties,
                            &spec.strategies,
                        )?;
                        Action::UpdateProfile {
                            profile,
                            spec,
                            parsed,
                        }
                    }
                }
                other => {
                    return Err(bad(
                        &format!("{apath}.do"),
                        format!(
                            "unknown action {other:?}: start, stop, approve, skip, removeMember, addNodePool, refreshCatalog, generateUpdateRun, updateProfile, putFreeze, deleteFreeze, putDisruptionBudget or deleteDisruptionBudget"
                        ),
                    ));
                }
            };
            actions.push(TimedAction {
                at: start.plus(offset),
                action,
                label: a.action.clone(),
                run: a.run.clone(),
            });
        }
        // Actions run in time order, and in file order at the same time; the declared runs
        // come first (they are created before any action).
        declared.append(&mut actions);
        let mut actions = declared;
        actions.sort_by_key(|a| a.at);
        let mut profiles = Vec::new();
        for (name, properties) in &spec.auto_upgrade_profiles {
            let path = format!("autoUpgradeProfiles.{name}");
            flotilla_engine::strategy::check_name(name, 50).map_err(|e| bad(&path, e))?;
            let (profile_spec, profile) = profile_from(&path, properties, &spec.strategies)?;
            profiles.push(ScenarioProfile {
                name: name.clone(),
                spec: profile_spec,
                profile,
            });
        }
        if spec.update.is_none() && profiles.is_empty() {
            return Err(bad(
                "update",
                "is required (only a scenario with autoUpgradeProfiles may leave it out)",
            ));
        }
        let releases = parse_releases(&spec.releases, "releases")?;
        for (i, r) in releases.iter().enumerate() {
            for region in r.regions.keys() {
                if !catalog.regions.contains_key(region) {
                    return Err(bad(
                        &format!("releases[{i}].regions.{region}"),
                        "is not a region of the catalog",
                    ));
                }
            }
        }
        Ok(Scenario {
            name: name.to_string(),
            description: spec.description.unwrap_or_default(),
            start,
            until,
            catalog,
            members,
            behaviour,
            strategy: spec.strategy,
            update: spec.update,
            strategies: spec.strategies,
            profiles,
            releases,
            actions,
            member_checks,
            gate_checks: check_scripts("checks", start, &spec.checks)?,
            providers,
            freezes: spec
                .freezes
                .iter()
                .map(|(name, p)| freeze_from(&format!("freezes.{name}"), name, p.clone()))
                .collect::<Result<_, _>>()?,
            budgets: spec
                .disruption_budgets
                .iter()
                .map(|(name, p)| budget_from(&format!("disruptionBudgets.{name}"), name, p.clone()))
                .collect::<Result<_, _>>()?,
            expect: spec.expect,
            fleet: SIM_FLEET.to_string(),
            pins_node_images: spec.sim.and_then(|s| s.pins_node_images).unwrap_or(true),
            fleets: Vec::new(),
        })
    }

    /// The strategy and upgrade of the scenario's hand-made run as wire shapes, checked for
    /// unknown fields, and its `chainMinorVersions`.
    pub fn wire_specs(
        &self,
    ) -> Result<(Option<StrategySpec>, ManagedClusterUpdateSpec, bool), ApiError> {
        wire_specs_of(self.strategy.as_ref(), self.update.as_ref())
    }

    /// The further hand-made runs of `updateRuns`, in file order (the order they are created).
    pub fn update_runs(&self) -> impl Iterator<Item = &DeclaredRun> {
        self.actions.iter().filter_map(|a| match &a.action {
            Action::CreateRun(run) => Some(run.as_ref()),
            _ => None,
        })
    }
}

/// A run's strategy and upgrade as wire shapes, checked for unknown fields as the API checks a
/// run's body, and its `chainMinorVersions` (SEMANTICS §13: written beside `upgrade` in a
/// scenario, a run property in the API).
pub fn wire_specs_of(
    strategy: Option<&Value>,
    update: Option<&Value>,
) -> Result<(Option<StrategySpec>, ManagedClusterUpdateSpec, bool), ApiError> {
    let strategy = strategy
        .cloned()
        .map(|s| from_json_value::<StrategySpec>(s, "properties.strategy"))
        .transpose()?;
    let mut update = update.cloned().unwrap_or(Value::Null);
    let chain = match update
        .as_object_mut()
        .and_then(|o| o.remove("chainMinorVersions"))
    {
        None => false,
        Some(Value::Bool(chain)) => chain,
        Some(other) => {
            return Err(ApiError::new(
                flotilla_engine::error::ErrorCode::InvalidRequestContent,
                format!("properties.chainMinorVersions: {other} must be true or false"),
                "properties.chainMinorVersions",
            ));
        }
    };
    let update =
        from_json_value::<ManagedClusterUpdateSpec>(update, "properties.managedClusterUpdate")?;
    Ok((strategy, update, chain))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fuzz/regressions/scenario/far-until-scheduled-gate.yaml`: an `until` and an action offset
    /// that took the clock to `i64::MAX` seconds, where a scheduled gate's calendar arithmetic
    /// overflowed (`Time::civil`, "attempt to add with overflow").
    #[test]
    fn a_far_until_stops_at_the_last_instant_a_timestamp_names() {
        let yaml = r#"
start: 2026-03-02T00:00:00Z
until: 9223372036854775807s
catalog:
  eastus:
    kubernetes: [{version: "1.30.5"}, {version: "1.31.1"}]
members:
  - {name: a, region: eastus, kubernetesVersion: "1.30.5"}
strategy:
  stages:
    - name: s
      memberSelector: {byLabel: "x!=y"}
      beforeGates: [{type: ScheduledStart, scheduledStartConfiguration: {startDay: Monday, startTime: "10:00", utcOffset: "+01:00"}}]
update:
  upgrade: {type: ControlPlaneOnly, kubernetesVersion: "1.31.1"}
actions:
  - {at: 9223372036854775807s, do: start}
"#;
        let scenario = Scenario::parse("far", yaml).expect("parses");
        let result = crate::simulate(&scenario);
        assert!(result.create_error.is_none());
        assert_eq!(scenario.until, LATEST);
        assert_eq!(Time::parse(&LATEST.to_string()), Ok(LATEST));
        assert!(Time::parse(&LATEST.plus(1).to_string()).is_err());
    }
}
