//! Update strategies and upgrades: the Fleet Manager wire shapes (`UpdateRunStrategy`,
//! `ManagedClusterUpdate`) and their parsing into validated domain values (SEMANTICS §1–§5).
//!
//! Wire fields are optional where the reference API makes them optional *or* where a missing
//! value deserves a message of ours naming the field, rather than serde's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

use crate::checks::{BlockKind, CheckBlockSpec, CheckSpec, Checks};
use crate::error::{ApiError, ErrorCode};
use crate::selector::Selector;
use crate::threshold::Amount;
use crate::time::{Weekday, parse_clock, parse_utc_offset};
use crate::version::{ImageVersion, KubeVersion, split_family_version};

/// Most groups in one stage (SEMANTICS §2).
pub const MAX_GROUPS_PER_STAGE: usize = 50;
/// Default server limit on a stage's `maxConcurrency` (SEMANTICS §3).
pub const DEFAULT_STAGE_CONCURRENCY_LIMIT: u64 = 1000;
pub const DEFAULT_STAGE_CONCURRENCY: u64 = 50;
/// The longest wait after a stage, in seconds: Fleet Manager's `afterStageWaitInSeconds` is
/// an int32.
pub const MAX_STAGE_WAIT_SECONDS: i64 = i32::MAX as i64;

// ---------------------------------------------------------------------------------------------
// Wire shapes.

/// A threshold as written: a JSON string, or a bare number that means the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct AmountText(pub String);

impl<'de> Deserialize<'de> for AmountText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(s) => Ok(AmountText(s)),
            serde_json::Value::Number(n) => Ok(AmountText(n.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "expected a string like \"2\" or \"25%\", got {other}"
            ))),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StrategySpec {
    #[serde(default)]
    pub stages: Option<Vec<StageSpec>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StageSpec {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<GroupSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_selector: Option<MemberSelectorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_stage_wait_in_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_allowed_failures: Option<AmountText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<AmountText>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before_gates: Vec<GateSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_gates: Vec<GateSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_health_checks: Option<CheckBlockSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_checks: Option<CheckBlockSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupSpec {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_selector: Option<MemberSelectorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_allowed_failures: Option<AmountText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<AmountText>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before_gates: Vec<GateSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_gates: Vec<GateSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_health_checks: Option<CheckBlockSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_checks: Option<CheckBlockSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberSelectorSpec {
    #[serde(default)]
    pub by_label: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GateSpec {
    #[serde(rename = "type", default)]
    pub gate_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_start_configuration: Option<ScheduledStartSpec>,
    /// A HealthCheck gate's checks and timings (SEMANTICS §10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_after_seconds: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduledStartSpec {
    #[serde(default)]
    pub start_day: Option<String>,
    #[serde(default)]
    pub start_time: Option<String>,
    #[serde(default)]
    pub utc_offset: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedClusterUpdateSpec {
    #[serde(default)]
    pub upgrade: Option<UpgradeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image_selection: Option<NodeImageSelectionSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeSpec {
    #[serde(rename = "type", default)]
    pub upgrade_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeImageSelectionSpec {
    #[serde(rename = "type", default)]
    pub selection_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_node_image_versions: Vec<NodeImageVersionSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeImageVersionSpec {
    #[serde(default)]
    pub version: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Domain values.

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateKind {
    Approval,
    /// Opens at the next `day` `time` (seconds after local midnight) at `utc_offset` seconds.
    ScheduledStart {
        day: Weekday,
        time: i64,
        utc_offset: i64,
        config: ScheduledStartSpec,
    },
    /// Pending until its checks pass for its soak (SEMANTICS §10).
    HealthCheck(Arc<Checks>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    pub kind: GateKind,
    pub display_name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub selector: Option<Selector>,
    pub max_concurrency: Option<Amount>,
    pub max_allowed_failures: Option<Amount>,
    pub before_gates: Vec<Gate>,
    pub after_gates: Vec<Gate>,
    /// Its own checks, which replace its stage's (SEMANTICS §10).
    pub member_health: Option<Arc<Checks>>,
    pub readiness: Option<Arc<Checks>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub name: String,
    /// Empty when the stage selects its members with `memberSelector` alone: one implicit group.
    pub groups: Vec<Group>,
    pub selector: Option<Selector>,
    pub wait_seconds: i64,
    pub max_concurrency: Option<Amount>,
    pub max_allowed_failures: Option<Amount>,
    pub before_gates: Vec<Gate>,
    pub after_gates: Vec<Gate>,
    pub member_health: Option<Arc<Checks>>,
    pub readiness: Option<Arc<Checks>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strategy {
    pub stages: Vec<Stage>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UpgradeType {
    Full,
    ControlPlaneOnly,
    NodeImageOnly,
}

impl UpgradeType {
    /// The API's name of the type, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeType::Full => "Full",
            UpgradeType::ControlPlaneOnly => "ControlPlaneOnly",
            UpgradeType::NodeImageOnly => "NodeImageOnly",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeImageSelection {
    Latest,
    Consistent,
    /// One version per image family; pools of other families are not upgraded.
    Custom(BTreeMap<String, ImageVersion>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    pub upgrade_type: UpgradeType,
    pub kubernetes_version: Option<KubeVersion>,
    pub node_images: NodeImageSelection,
}

impl Upgrade {
    pub fn changes_kubernetes(&self) -> bool {
        self.upgrade_type != UpgradeType::NodeImageOnly
    }

    pub fn changes_node_images(&self) -> bool {
        self.upgrade_type != UpgradeType::ControlPlaneOnly
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing.

/// The name pattern of the reference API: 1–50 chars, `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`.
pub fn check_name(name: &str, max_len: usize) -> Result<(), String> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= max_len
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name: 1-{max_len} lowercase letters, digits and '-', starting and ending with a letter or digit"
        ))
    }
}

fn required<'a, T>(value: &'a Option<T>, path: &str, code: ErrorCode) -> Result<&'a T, ApiError> {
    value
        .as_ref()
        .ok_or_else(|| ApiError::new(code, format!("{path} is required"), path))
}

fn parse_amount(
    text: &Option<AmountText>,
    path: &str,
    parse: fn(&str) -> Option<Amount>,
    code: ErrorCode,
    rule: &str,
) -> Result<Option<Amount>, ApiError> {
    match text {
        None => Ok(None),
        Some(AmountText(t)) => parse(t)
            .map(Some)
            .ok_or_else(|| ApiError::new(code, format!("{path} {t:?}: must be {rule}"), path)),
    }
}

fn parse_concurrency(text: &Option<AmountText>, path: &str) -> Result<Option<Amount>, ApiError> {
    parse_amount(
        text,
        path,
        Amount::parse_concurrency,
        ErrorCode::InvalidMaxConcurrency,
        "a whole number ≥ 1 or a percentage from 1% to 100%",
    )
}

fn parse_failures(text: &Option<AmountText>, path: &str) -> Result<Option<Amount>, ApiError> {
    parse_amount(
        text,
        path,
        Amount::parse_failures,
        ErrorCode::InvalidMaxAllowedFailures,
        "a whole number ≥ 0 or a percentage from 0% to 100%",
    )
}

pub(crate) fn parse_selector(
    spec: &Option<MemberSelectorSpec>,
    path: &str,
) -> Result<Option<Selector>, ApiError> {
    let Some(spec) = spec else { return Ok(None) };
    let by_label_path = format!("{path}.byLabel");
    let text = required(
        &spec.by_label,
        &by_label_path,
        ErrorCode::InvalidMemberSelector,
    )?;
    Selector::parse(text).map(Some).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidMemberSelector,
            format!("{by_label_path} {text:?}: {e}"),
            by_label_path,
        )
    })
}

fn parse_gates(specs: &[GateSpec], path: &str, after: bool) -> Result<Vec<Gate>, ApiError> {
    let mut gates = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let gpath = format!("{path}[{i}]");
        let bad = |field: &str, message: String| {
            let target = if field.is_empty() {
                gpath.clone()
            } else {
                format!("{gpath}.{field}")
            };
            ApiError::new(
                ErrorCode::InvalidGate,
                format!("{target}: {message}"),
                target,
            )
        };
        if let Some(name) = &spec.display_name
            && (name.is_empty() || name.chars().count() > 100)
        {
            return Err(bad(
                "displayName",
                format!("{name:?} must be 1 to 100 characters"),
            ));
        }
        let gate_type = spec
            .gate_type
            .as_deref()
            .ok_or_else(|| bad("type", "is required".into()))?;
        // The first HealthCheck setting given, named as written.
        let health_field = [
            ("checks", !spec.checks.is_empty()),
            ("soakSeconds", spec.soak_seconds.is_some()),
            ("intervalSeconds", spec.interval_seconds.is_some()),
            ("timeoutSeconds", spec.timeout_seconds.is_some()),
            (
                "unavailableAfterSeconds",
                spec.unavailable_after_seconds.is_some(),
            ),
        ]
        .into_iter()
        .find_map(|(field, given)| given.then_some(field));
        if let Some(field) = health_field
            && gate_type != "HealthCheck"
        {
            return Err(bad(field, "is only allowed on a HealthCheck gate".into()));
        }
        let kind = match gate_type {
            "HealthCheck" => {
                if spec.scheduled_start_configuration.is_some() {
                    return Err(bad(
                        "scheduledStartConfiguration",
                        "is only allowed on a ScheduledStart gate".into(),
                    ));
                }
                let checks = crate::checks::parse_check_list(
                    &spec.checks,
                    &format!("{gpath}.checks"),
                    BlockKind::Gate,
                )?;
                let (soak_seconds, interval_seconds, timeout_seconds, unavailable_after_seconds) =
                    crate::checks::parse_timings(
                        spec.soak_seconds,
                        spec.interval_seconds,
                        spec.timeout_seconds,
                        spec.unavailable_after_seconds,
                        &gpath,
                        BlockKind::Gate,
                    )?;
                if !after && soak_seconds > timeout_seconds {
                    return Err(bad(
                        "soakSeconds",
                        format!(
                            "{soak_seconds} is longer than timeoutSeconds {timeout_seconds}: the gate could never complete"
                        ),
                    ));
                }
                GateKind::HealthCheck(Arc::new(Checks {
                    checks,
                    soak_seconds,
                    interval_seconds,
                    timeout_seconds,
                    unavailable_after_seconds,
                    on_failure: crate::checks::OnFailure::Fail,
                }))
            }
            "Approval" => {
                if spec.scheduled_start_configuration.is_some() {
                    return Err(bad(
                        "scheduledStartConfiguration",
                        "is only allowed on a ScheduledStart gate".into(),
                    ));
                }
                GateKind::Approval
            }
            "ScheduledStart" => {
                if after {
                    return Err(bad(
                        "type",
                        "a ScheduledStart gate can only be a before-gate".into(),
                    ));
                }
                let config = spec.scheduled_start_configuration.as_ref().ok_or_else(|| {
                    bad(
                        "scheduledStartConfiguration",
                        "is required for a ScheduledStart gate".into(),
                    )
                })?;
                let day_text = config.start_day.as_deref().ok_or_else(|| {
                    bad("scheduledStartConfiguration.startDay", "is required".into())
                })?;
                let day = Weekday::parse(day_text).ok_or_else(|| {
                    bad(
                        "scheduledStartConfiguration.startDay",
                        format!("{day_text:?} is not a day of the week (Monday … Sunday)"),
                    )
                })?;
                let time_text = config.start_time.as_deref().ok_or_else(|| {
                    bad(
                        "scheduledStartConfiguration.startTime",
                        "is required".into(),
                    )
                })?;
                let time = parse_clock(time_text).ok_or_else(|| {
                    bad(
                        "scheduledStartConfiguration.startTime",
                        format!("{time_text:?} must be HH:mm, 00:00 to 23:59"),
                    )
                })?;
                let offset_text = config.utc_offset.as_deref().ok_or_else(|| {
                    bad(
                        "scheduledStartConfiguration.utcOffset",
                        "is required".into(),
                    )
                })?;
                let utc_offset = parse_utc_offset(offset_text).ok_or_else(|| {
                    bad(
                        "scheduledStartConfiguration.utcOffset",
                        format!("{offset_text:?} must be ±HH:mm between -14:00 and +14:00"),
                    )
                })?;
                GateKind::ScheduledStart {
                    day,
                    time,
                    utc_offset,
                    config: config.clone(),
                }
            }
            other => {
                return Err(bad(
                    "type",
                    format!(
                        "{other:?} is not a gate type: Approval, ScheduledStart or HealthCheck"
                    ),
                ));
            }
        };
        gates.push(Gate {
            kind,
            display_name: spec.display_name.clone(),
        });
    }
    Ok(gates)
}

fn parse_block(
    spec: &Option<CheckBlockSpec>,
    path: &str,
    block: BlockKind,
) -> Result<Option<Arc<Checks>>, ApiError> {
    spec.as_ref()
        .map(|spec| crate::checks::parse_block(spec, path, block).map(Arc::new))
        .transpose()
}

/// Parses and validates a strategy. `path` is where it sits in the request
/// (`properties.strategy`); `stage_concurrency_limit` is the server's cap on a stage's
/// `maxConcurrency`.
pub fn parse_strategy(
    spec: &StrategySpec,
    path: &str,
    stage_concurrency_limit: u64,
) -> Result<Strategy, ApiError> {
    let stages_path = format!("{path}.stages");
    let stage_specs = required(&spec.stages, &stages_path, ErrorCode::InvalidStrategy)?;
    if stage_specs.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidStrategy,
            format!("{stages_path}: needs at least one stage"),
            stages_path,
        ));
    }
    let mut stage_names = BTreeSet::new();
    let mut group_names: BTreeMap<String, String> = BTreeMap::new();
    let mut stages = Vec::with_capacity(stage_specs.len());
    for (si, s) in stage_specs.iter().enumerate() {
        let spath = format!("{stages_path}[{si}]");
        let name_path = format!("{spath}.name");
        let name = required(&s.name, &name_path, ErrorCode::InvalidName)?.clone();
        check_name(&name, 50).map_err(|m| {
            ApiError::new(
                ErrorCode::InvalidName,
                format!("{name_path}: {m}"),
                &name_path,
            )
        })?;
        if !stage_names.insert(name.clone()) {
            return Err(ApiError::new(
                ErrorCode::InvalidStrategy,
                format!(
                    "{name_path}: stage name {name:?} is used twice; stage names must be unique"
                ),
                name_path,
            ));
        }
        let selector = parse_selector(&s.member_selector, &format!("{spath}.memberSelector"))?;
        let group_specs = s.groups.as_deref().unwrap_or_default();
        if group_specs.is_empty() && selector.is_none() {
            return Err(ApiError::new(
                ErrorCode::InvalidStrategy,
                format!("{spath}: stage {name:?} needs at least one group, or a memberSelector"),
                format!("{spath}.groups"),
            ));
        }
        if group_specs.len() > MAX_GROUPS_PER_STAGE {
            return Err(ApiError::new(
                ErrorCode::InvalidStrategy,
                format!(
                    "{spath}.groups: stage {name:?} has {} groups; at most {MAX_GROUPS_PER_STAGE} are allowed",
                    group_specs.len()
                ),
                format!("{spath}.groups"),
            ));
        }
        let wait = s.after_stage_wait_in_seconds.unwrap_or(0);
        if !(0..=MAX_STAGE_WAIT_SECONDS).contains(&wait) {
            return Err(ApiError::new(
                ErrorCode::InvalidStrategy,
                format!(
                    "{spath}.afterStageWaitInSeconds {wait}: must be between 0 and {MAX_STAGE_WAIT_SECONDS} seconds"
                ),
                format!("{spath}.afterStageWaitInSeconds"),
            ));
        }
        let max_concurrency =
            parse_concurrency(&s.max_concurrency, &format!("{spath}.maxConcurrency"))?;
        if let Some(Amount::Count(n)) = max_concurrency
            && n > stage_concurrency_limit
        {
            let p = format!("{spath}.maxConcurrency");
            return Err(ApiError::new(
                ErrorCode::InvalidMaxConcurrency,
                format!(
                    "{p} \"{n}\": a stage may run at most {stage_concurrency_limit} members at once on this server"
                ),
                p,
            ));
        }
        let max_allowed_failures = parse_failures(
            &s.max_allowed_failures,
            &format!("{spath}.maxAllowedFailures"),
        )?;
        let mut groups = Vec::with_capacity(group_specs.len());
        for (gi, g) in group_specs.iter().enumerate() {
            let gpath = format!("{spath}.groups[{gi}]");
            let gname_path = format!("{gpath}.name");
            let gname = required(&g.name, &gname_path, ErrorCode::InvalidName)?.clone();
            check_name(&gname, 50).map_err(|m| {
                ApiError::new(
                    ErrorCode::InvalidName,
                    format!("{gname_path}: {m}"),
                    &gname_path,
                )
            })?;
            if let Some(other) = group_names.insert(gname.clone(), name.clone()) {
                return Err(ApiError::new(
                    ErrorCode::InvalidStrategy,
                    format!(
                        "{gname_path}: group name {gname:?} is used twice (also in stage {other:?}); group names must be unique in a strategy"
                    ),
                    gname_path,
                ));
            }
            groups.push(Group {
                selector: parse_selector(&g.member_selector, &format!("{gpath}.memberSelector"))?,
                max_concurrency: parse_concurrency(
                    &g.max_concurrency,
                    &format!("{gpath}.maxConcurrency"),
                )?,
                max_allowed_failures: parse_failures(
                    &g.max_allowed_failures,
                    &format!("{gpath}.maxAllowedFailures"),
                )?,
                before_gates: parse_gates(&g.before_gates, &format!("{gpath}.beforeGates"), false)?,
                after_gates: parse_gates(&g.after_gates, &format!("{gpath}.afterGates"), true)?,
                member_health: parse_block(
                    &g.member_health_checks,
                    &format!("{gpath}.memberHealthChecks"),
                    BlockKind::MemberHealth,
                )?,
                readiness: parse_block(
                    &g.readiness_checks,
                    &format!("{gpath}.readinessChecks"),
                    BlockKind::Readiness,
                )?,
                name: gname,
            });
        }
        stages.push(Stage {
            groups,
            selector,
            wait_seconds: wait,
            max_concurrency,
            max_allowed_failures,
            before_gates: parse_gates(&s.before_gates, &format!("{spath}.beforeGates"), false)?,
            after_gates: parse_gates(&s.after_gates, &format!("{spath}.afterGates"), true)?,
            member_health: parse_block(
                &s.member_health_checks,
                &format!("{spath}.memberHealthChecks"),
                BlockKind::MemberHealth,
            )?,
            readiness: parse_block(
                &s.readiness_checks,
                &format!("{spath}.readinessChecks"),
                BlockKind::Readiness,
            )?,
            name,
        });
    }
    // An implicit group is named after its stage; it must not collide with a named group.
    for stage in stages.iter().filter(|s| s.groups.is_empty()) {
        if let Some(other) = group_names.get(&stage.name) {
            return Err(ApiError::new(
                ErrorCode::InvalidStrategy,
                format!(
                    "{path}.stages: stage {:?} selects its members without groups, so its implicit group takes its name, which stage {other:?} also uses for a group",
                    stage.name
                ),
                format!("{path}.stages"),
            ));
        }
    }
    Ok(Strategy { stages })
}

/// Checks `chainMinorVersions` (SEMANTICS §13) against the upgrade it chains: only a Full or
/// ControlPlaneOnly upgrade changes minor versions. `path` names the field.
pub fn check_chain_minor_versions(
    chain: bool,
    upgrade: &Upgrade,
    path: &str,
) -> Result<(), ApiError> {
    if chain && !upgrade.changes_kubernetes() {
        return Err(ApiError::new(
            ErrorCode::InvalidUpgrade,
            format!(
                "{path} true: chained minor upgrades apply to Full and ControlPlaneOnly upgrades, not NodeImageOnly"
            ),
            path,
        ));
    }
    Ok(())
}

/// Parses and validates `managedClusterUpdate` (SEMANTICS §1). Catalog checks of custom images
/// happen at run creation, where the catalog is known.
pub fn parse_upgrade(spec: &ManagedClusterUpdateSpec, path: &str) -> Result<Upgrade, ApiError> {
    let upath = format!("{path}.upgrade");
    let upgrade = required(&spec.upgrade, &upath, ErrorCode::InvalidUpgrade)?;
    let type_path = format!("{upath}.type");
    let type_text = required(&upgrade.upgrade_type, &type_path, ErrorCode::InvalidUpgrade)?;
    let upgrade_type = match type_text.as_str() {
        "Full" => UpgradeType::Full,
        "ControlPlaneOnly" => UpgradeType::ControlPlaneOnly,
        "NodeImageOnly" => UpgradeType::NodeImageOnly,
        other => {
            return Err(ApiError::new(
                ErrorCode::InvalidUpgrade,
                format!("{type_path} {other:?}: must be Full, ControlPlaneOnly or NodeImageOnly"),
                type_path,
            ));
        }
    };
    let version_path = format!("{upath}.kubernetesVersion");
    let kubernetes_version = match (&upgrade.kubernetes_version, upgrade_type) {
        (Some(v), UpgradeType::NodeImageOnly) => {
            return Err(ApiError::new(
                ErrorCode::InvalidKubernetesVersion,
                format!(
                    "{version_path} {v:?}: cannot set a Kubernetes version when the upgrade type is NodeImageOnly"
                ),
                version_path,
            ));
        }
        (None, UpgradeType::NodeImageOnly) => None,
        (None, t) => {
            return Err(ApiError::new(
                ErrorCode::InvalidKubernetesVersion,
                format!("{version_path} is required when the upgrade type is {t:?}"),
                version_path,
            ));
        }
        (Some(v), _) => Some(KubeVersion::parse(v).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidKubernetesVersion,
                format!(
                    "{version_path} {v:?}: an update run needs a full version major.minor.patch, like 1.31.2 (a minor version like 1.31 is for an auto-upgrade profile's targetKubernetesVersion)"
                ),
                version_path.clone(),
            )
        })?),
    };
    let npath = format!("{path}.nodeImageSelection");
    let node_images = match &spec.node_image_selection {
        None => NodeImageSelection::Latest,
        Some(sel) => {
            let tpath = format!("{npath}.type");
            let kind = required(
                &sel.selection_type,
                &tpath,
                ErrorCode::InvalidNodeImageSelection,
            )?;
            let custom_path = format!("{npath}.customNodeImageVersions");
            match kind.as_str() {
                "Latest" | "Consistent" if !sel.custom_node_image_versions.is_empty() => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidNodeImageSelection,
                        format!("{custom_path}: only allowed when the type is Custom, not {kind}"),
                        custom_path,
                    ));
                }
                "Latest" => NodeImageSelection::Latest,
                "Consistent" => NodeImageSelection::Consistent,
                "Custom" => {
                    if sel.custom_node_image_versions.is_empty() {
                        return Err(ApiError::new(
                            ErrorCode::InvalidNodeImageSelection,
                            format!("{custom_path}: a Custom selection needs at least one version"),
                            custom_path,
                        ));
                    }
                    let mut versions = BTreeMap::new();
                    for (i, v) in sel.custom_node_image_versions.iter().enumerate() {
                        let vpath = format!("{custom_path}[{i}].version");
                        let text =
                            required(&v.version, &vpath, ErrorCode::InvalidNodeImageSelection)?;
                        let bad = |m: String| {
                            ApiError::new(
                                ErrorCode::InvalidNodeImageSelection,
                                format!("{vpath} {text:?}: {m}"),
                                &vpath,
                            )
                        };
                        let (family, version) = split_family_version(text)
                            .ok_or_else(|| bad("must be written <family>-<version>, like AKSUbuntu-2204gen2containerd-202602.20.0".into()))?;
                        let version = ImageVersion::parse(version).ok_or_else(|| {
                            bad(format!(
                                "{version:?} is not a node image version like 202602.20.0"
                            ))
                        })?;
                        if versions.insert(family.to_string(), version).is_some() {
                            return Err(bad(format!(
                                "a second version for image family {family}; at most one per family"
                            )));
                        }
                    }
                    NodeImageSelection::Custom(versions)
                }
                other => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidNodeImageSelection,
                        format!("{tpath} {other:?}: must be Latest, Consistent or Custom"),
                        tpath,
                    ));
                }
            }
        }
    };
    Ok(Upgrade {
        upgrade_type,
        kubernetes_version,
        node_images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(json: &str) -> Result<Strategy, ApiError> {
        let spec: StrategySpec = crate::error::from_json_value(
            serde_json::from_str(json).unwrap(),
            "properties.strategy",
        )?;
        parse_strategy(
            &spec,
            "properties.strategy",
            DEFAULT_STAGE_CONCURRENCY_LIMIT,
        )
    }

    #[test]
    fn accepts_the_fleet_manager_stages_file() {
        let json = r#"{"stages":[{"name":"canary-stage","maxConcurrency":"1","maxAllowedFailures":"0","groups":[{"name":"canary","maxConcurrency":"1","maxAllowedFailures":"0"}],"afterStageWaitInSeconds":1800},{"name":"production-stage","maxConcurrency":"4","maxAllowedFailures":"10%","groups":[{"name":"prod-east","maxConcurrency":"2","maxAllowedFailures":"1"},{"name":"prod-west","maxConcurrency":2,"maxAllowedFailures":"1"}]}]}"#;
        let s = strategy(json).unwrap();
        assert_eq!(s.stages.len(), 2);
        assert_eq!(
            s.stages[1].groups[1].max_concurrency,
            Some(Amount::Count(2))
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"stages":[{"name":"s","groups":[{"name":"g","maxConcurrency":"0"}]}]}"#,
                "properties.strategy.stages[0].groups[0].maxConcurrency",
                ErrorCode::InvalidMaxConcurrency,
            ),
            (
                r#"{"stages":[{"name":"s","maxConcurrency":"1001","groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[0].maxConcurrency",
                ErrorCode::InvalidMaxConcurrency,
            ),
            (
                r#"{"stages":[{"name":"s","groups":[{"name":"g","maxAllowedFailures":"-1"}]}]}"#,
                "properties.strategy.stages[0].groups[0].maxAllowedFailures",
                ErrorCode::InvalidMaxAllowedFailures,
            ),
            (
                r#"{"stages":[{"name":"S","groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[0].name",
                ErrorCode::InvalidName,
            ),
            (
                r#"{"stages":[{"name":"s","groups":[{"name":"g"}]},{"name":"s","groups":[{"name":"h"}]}]}"#,
                "properties.strategy.stages[1].name",
                ErrorCode::InvalidStrategy,
            ),
            (
                r#"{"stages":[{"name":"s","groups":[{"name":"g"}]},{"name":"t","groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[1].groups[0].name",
                ErrorCode::InvalidStrategy,
            ),
            (
                r#"{"stages":[]}"#,
                "properties.strategy.stages",
                ErrorCode::InvalidStrategy,
            ),
            (
                r#"{"stages":[{"name":"s"}]}"#,
                "properties.strategy.stages[0].groups",
                ErrorCode::InvalidStrategy,
            ),
            (
                r#"{"stages":[{"name":"s","afterStageWaitInSeconds":-5,"groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[0].afterStageWaitInSeconds",
                ErrorCode::InvalidStrategy,
            ),
            (
                r#"{"stages":[{"name":"s","memberSelector":{"byLabel":"env in ()"}}]}"#,
                "properties.strategy.stages[0].memberSelector.byLabel",
                ErrorCode::InvalidMemberSelector,
            ),
            (
                r#"{"stages":[{"name":"s","afterGates":[{"type":"ScheduledStart","scheduledStartConfiguration":{"startDay":"Monday","startTime":"10:00","utcOffset":"+00:00"}}],"groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[0].afterGates[0].type",
                ErrorCode::InvalidGate,
            ),
            (
                r#"{"stages":[{"name":"s","beforeGates":[{"type":"ScheduledStart"}],"groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[0].beforeGates[0].scheduledStartConfiguration",
                ErrorCode::InvalidGate,
            ),
            (
                r#"{"stages":[{"name":"s","beforeGates":[{"type":"ScheduledStart","scheduledStartConfiguration":{"startDay":"Someday","startTime":"10:00","utcOffset":"+00:00"}}],"groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[0].beforeGates[0].scheduledStartConfiguration.startDay",
                ErrorCode::InvalidGate,
            ),
            (
                r#"{"stages":[{"name":"s","beforeGates":[{"type":"Manual"}],"groups":[{"name":"g"}]}]}"#,
                "properties.strategy.stages[0].beforeGates[0].type",
                ErrorCode::InvalidGate,
            ),
            (
                r#"{"stages":[{"name":"s","groups":[{"name":"g","colour":"red"}]}]}"#,
                "properties.strategy.stages[0].groups[0].colour",
                ErrorCode::UnknownField,
            ),
        ];
        for (json, target, code) in cases {
            let err = strategy(json).unwrap_err();
            assert_eq!(err.target, target, "{json}: {err:?}");
            assert_eq!(err.code, code, "{json}: {err:?}");
        }
    }

    #[test]
    fn fifty_one_groups_are_refused() {
        let groups: Vec<String> = (0..51).map(|i| format!(r#"{{"name":"g{i}"}}"#)).collect();
        let json = format!(
            r#"{{"stages":[{{"name":"s","groups":[{}]}}]}}"#,
            groups.join(",")
        );
        let err = strategy(&json).unwrap_err();
        assert!(err.message.contains("at most 50"), "{err:?}");
    }

    fn upgrade(json: &str) -> Result<Upgrade, ApiError> {
        let spec: ManagedClusterUpdateSpec = serde_json::from_str(json).unwrap();
        parse_upgrade(&spec, "properties.managedClusterUpdate")
    }

    #[test]
    fn upgrade_rules() {
        assert!(upgrade(r#"{"upgrade":{"type":"Full","kubernetesVersion":"1.31.1"}}"#).is_ok());
        let e = upgrade(r#"{"upgrade":{"type":"Full"}}"#).unwrap_err();
        assert_eq!(
            e.target,
            "properties.managedClusterUpdate.upgrade.kubernetesVersion"
        );
        let e = upgrade(r#"{"upgrade":{"type":"NodeImageOnly","kubernetesVersion":"1.31.1"}}"#)
            .unwrap_err();
        assert!(e.message.contains("NodeImageOnly"));
        let e = upgrade(r#"{"upgrade":{"type":"Full","kubernetesVersion":"1.31"}}"#).unwrap_err();
        assert!(e.message.contains("major.minor.patch"));
        assert!(e.message.contains("an update run needs"));
        let e = upgrade(r#"{"upgrade":{"type":"Partial"}}"#).unwrap_err();
        assert_eq!(e.target, "properties.managedClusterUpdate.upgrade.type");
        let e = upgrade(
            r#"{"upgrade":{"type":"NodeImageOnly"},"nodeImageSelection":{"type":"Custom"}}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("at least one"));
        let e = upgrade(r#"{"upgrade":{"type":"NodeImageOnly"},"nodeImageSelection":{"type":"Custom","customNodeImageVersions":[{"version":"AKSUbuntu-2204gen2containerd-202602.20.0"},{"version":"AKSUbuntu-2204gen2containerd-202603.01.0"}]}}"#).unwrap_err();
        assert!(e.message.contains("one per family"), "{e:?}");
        let ok = upgrade(r#"{"upgrade":{"type":"NodeImageOnly"},"nodeImageSelection":{"type":"Custom","customNodeImageVersions":[{"version":"AKSUbuntu-2204gen2containerd-202602.20.0"}]}}"#).unwrap();
        assert!(matches!(ok.node_images, NodeImageSelection::Custom(_)));
    }
}
