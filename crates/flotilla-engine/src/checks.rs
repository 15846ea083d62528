//! Health and readiness checks (SEMANTICS §10): their wire shapes, their validation into domain
//! values, placeholders, and what one evaluation's result means. Evaluations themselves are
//! made by a shell (HTTP to Prometheus, a GET, a subprocess) and handed to the engine as inputs;
//! nothing here performs I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};

/// Defaults of SEMANTICS §10.
pub const DEFAULT_SOAK_SECONDS: i64 = 300;
pub const DEFAULT_INTERVAL_SECONDS: i64 = 60;
pub const DEFAULT_READINESS_INTERVAL_SECONDS: i64 = 300;
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 3600;
pub const DEFAULT_GATE_SOAK_SECONDS: i64 = 600;
pub const DEFAULT_UNAVAILABLE_AFTER_SECONDS: i64 = 300;
pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: i64 = 10;
/// The most checks one block or gate carries.
pub const MAX_CHECKS: usize = 20;
/// Longest a duration of a check block may be: a week.
const MAX_SECONDS: i64 = 7 * 24 * 3600;

// ---------------------------------------------------------------------------------------------
// Wire shapes.

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckSpec {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type", default)]
    pub check_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_empty: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_contains: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// `memberHealthChecks` and `readinessChecks` of a stage or group, as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckBlockSpec {
    #[serde(default)]
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

// ---------------------------------------------------------------------------------------------
// Domain values.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Comparison {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// A Prometheus check's condition: every sample must satisfy `value <op> threshold`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    pub op: Comparison,
    pub threshold: f64,
    /// As written, for messages.
    pub text: String,
}

// The threshold is a finite number (parsing refuses NaN and infinities), so equality is total.
impl Eq for Condition {}

impl Condition {
    pub fn parse(text: &str) -> Option<Condition> {
        let t = text.trim();
        let (op, rest) = [
            ("<=", Comparison::Le),
            (">=", Comparison::Ge),
            ("==", Comparison::Eq),
            ("!=", Comparison::Ne),
            ("<", Comparison::Lt),
            (">", Comparison::Gt),
        ]
        .into_iter()
        .find_map(|(p, op)| t.strip_prefix(p).map(|rest| (op, rest)))?;
        let threshold: f64 = rest.trim().parse().ok()?;
        threshold.is_finite().then(|| Condition {
            op,
            threshold,
            text: t.to_string(),
        })
    }

    pub fn holds(&self, value: f64) -> bool {
        let t = self.threshold;
        match self.op {
            Comparison::Lt => value < t,
            Comparison::Le => value <= t,
            Comparison::Gt => value > t,
            Comparison::Ge => value >= t,
            Comparison::Eq => value == t,
            Comparison::Ne => value != t,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckKind {
    Prometheus {
        endpoint: String,
        query: String,
        condition: Condition,
        /// What an empty result means: passes when true.
        empty_passes: bool,
    },
    Http {
        url: String,
        /// `None`: any 2xx.
        expect_status: Option<u16>,
        body_contains: Option<String>,
    },
    Exec {
        command: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub kind: CheckKind,
    pub request_timeout_seconds: i64,
    pub headers: BTreeMap<String, String>,
    pub ca_file: Option<String>,
}

/// A block of checks with its timings (a member soak, readiness, or a HealthCheck gate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checks {
    pub checks: Vec<Check>,
    pub soak_seconds: i64,
    pub interval_seconds: i64,
    pub timeout_seconds: i64,
    pub unavailable_after_seconds: i64,
}

impl Checks {
    /// Whether any check's text holds `text` (a placeholder, say).
    pub fn uses(&self, text: &str) -> bool {
        self.checks
            .iter()
            .any(|c| serde_json::to_string(c).is_ok_and(|json| json.contains(text)))
    }
}

/// Where a block of checks sits, which decides its defaults and the placeholders it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    MemberHealth,
    Readiness,
    Gate,
}

/// Every placeholder a check's strings may hold, besides `{label:KEY}`.
const MEMBER_PLACEHOLDERS: &[&str] = &["member", "clusterResourceId", "region"];
const SCOPE_PLACEHOLDERS: &[&str] = &["group", "stage", "run"];

fn bad(path: &str, message: String) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidHealthCheck,
        format!("{path}: {message}"),
        path,
    )
}

/// The placeholders in `text`, as spans (start of `{`, end after `}`) and keys: every `{...}`
/// holding no `{` and none of PromQL's matcher characters (`=`, quotes, `~`, `!`, `,`), so a
/// selector like `up{job="x"}` or `sum(x{})` is text and `{member}`, `{label:env}` or a
/// misspelt `{cluster_id}` are placeholders (known or not).
fn placeholders(text: &str) -> Vec<(usize, usize, &str)> {
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(open) = text[i..].find('{').map(|o| o + i) {
        let Some(close) = text[open + 1..].find('}').map(|c| c + open + 1) else {
            break;
        };
        let key = &text[open + 1..close];
        let promql =
            key.is_empty() || key.contains('{') || key.contains(['=', '"', '\'', '~', '!', ',']);
        if promql {
            i = open + 1;
        } else {
            found.push((open, close + 1, key));
            i = close + 1;
        }
    }
    found
}

fn check_placeholders(text: &str, path: &str, block: BlockKind) -> Result<(), ApiError> {
    for (_, _, p) in placeholders(text) {
        let known = SCOPE_PLACEHOLDERS.contains(&p)
            || p.strip_prefix("label:").is_some_and(|k| !k.is_empty())
            || match block {
                BlockKind::Gate => p == "members",
                _ => MEMBER_PLACEHOLDERS.contains(&p),
            };
        if !known {
            let allowed = match block {
                BlockKind::Gate => "{group}, {stage}, {run}, {members}, {label:KEY}",
                _ => {
                    "{member}, {clusterResourceId}, {region}, {group}, {stage}, {run}, {label:KEY}"
                }
            };
            return Err(bad(
                path,
                format!("{text:?}: unknown placeholder {{{p}}}; allowed here: {allowed}"),
            ));
        }
    }
    Ok(())
}

fn duration(value: Option<i64>, default: i64, path: &str, min: i64) -> Result<i64, ApiError> {
    let v = value.unwrap_or(default);
    if !(min..=MAX_SECONDS).contains(&v) {
        return Err(bad(
            path,
            format!("{v} must be between {min} and {MAX_SECONDS} seconds"),
        ));
    }
    Ok(v)
}

fn required_text<'a>(value: &'a Option<String>, path: &str) -> Result<&'a str, ApiError> {
    match value.as_deref() {
        Some(v) if !v.trim().is_empty() => Ok(v),
        Some(v) => Err(bad(path, format!("{v:?} must not be empty"))),
        None => Err(bad(path, "is required".into())),
    }
}

fn parse_url(text: &str, path: &str, block: BlockKind) -> Result<String, ApiError> {
    check_placeholders(text, path, block)?;
    let lower = text.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
        .ok_or_else(|| bad(path, format!("{text:?} must be an http:// or https:// URL")))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad(path, format!("{text:?} names no host")));
    }
    Ok(text.to_string())
}

fn parse_check(spec: &CheckSpec, path: &str, block: BlockKind) -> Result<Check, ApiError> {
    let name = required_text(&spec.name, &format!("{path}.name"))?;
    crate::strategy::check_name(name, 63).map_err(|m| bad(&format!("{path}.name"), m))?;
    let kind_path = format!("{path}.type");
    let kind_text = required_text(&spec.check_type, &kind_path)?;
    let only = |field: &str, present: bool, kinds: &str| {
        if present {
            Err(bad(
                &format!("{path}.{field}"),
                format!("is only allowed on a {kinds} check"),
            ))
        } else {
            Ok(())
        }
    };
    let prometheus_fields = |spec: &CheckSpec| {
        only("endpoint", spec.endpoint.is_some(), "Prometheus")?;
        only("query", spec.query.is_some(), "Prometheus")?;
        only("condition", spec.condition.is_some(), "Prometheus")?;
        only("onEmpty", spec.on_empty.is_some(), "Prometheus")
    };
    let kind = match kind_text {
        "Prometheus" => {
            only("url", spec.url.is_some(), "Http")?;
            only("expectStatus", spec.expect_status.is_some(), "Http")?;
            only("bodyContains", spec.body_contains.is_some(), "Http")?;
            only("command", spec.command.is_some(), "Exec")?;
            let endpoint = required_text(&spec.endpoint, &format!("{path}.endpoint"))?;
            let endpoint = parse_url(endpoint, &format!("{path}.endpoint"), block)?;
            let query = required_text(&spec.query, &format!("{path}.query"))?;
            check_placeholders(query, &format!("{path}.query"), block)?;
            let cpath = format!("{path}.condition");
            let text = required_text(&spec.condition, &cpath)?;
            let condition = Condition::parse(text).ok_or_else(|| {
                bad(
                    &cpath,
                    format!("{text:?} must be an operator (<, <=, >, >=, ==, !=) and a number, like \"< 0.01\""),
                )
            })?;
            let empty_passes = match spec.on_empty.as_deref() {
                None | Some("Fail") => false,
                Some("Pass") => true,
                Some(other) => {
                    return Err(bad(
                        &format!("{path}.onEmpty"),
                        format!("{other:?} must be Fail or Pass"),
                    ));
                }
            };
            CheckKind::Prometheus {
                endpoint,
                query: query.to_string(),
                condition,
                empty_passes,
            }
        }
        "Http" => {
            prometheus_fields(spec)?;
            only("command", spec.command.is_some(), "Exec")?;
            let url = required_text(&spec.url, &format!("{path}.url"))?;
            let url = parse_url(url, &format!("{path}.url"), block)?;
            let expect_status = match spec.expect_status {
                None => None,
                Some(s) if (100..=599).contains(&s) => Some(s as u16),
                Some(s) => {
                    return Err(bad(
                        &format!("{path}.expectStatus"),
                        format!("{s} is not an HTTP status (100 to 599)"),
                    ));
                }
            };
            if let Some(text) = &spec.body_contains {
                check_placeholders(text, &format!("{path}.bodyContains"), block)?;
            }
            CheckKind::Http {
                url,
                expect_status,
                body_contains: spec.body_contains.clone(),
            }
        }
        "Exec" => {
            prometheus_fields(spec)?;
            only("url", spec.url.is_some(), "Http")?;
            only("expectStatus", spec.expect_status.is_some(), "Http")?;
            only("bodyContains", spec.body_contains.is_some(), "Http")?;
            only("headers", spec.headers.is_some(), "Prometheus or Http")?;
            only("caFile", spec.ca_file.is_some(), "Prometheus or Http")?;
            let cpath = format!("{path}.command");
            let command = spec
                .command
                .as_ref()
                .ok_or_else(|| bad(&cpath, "is required".into()))?;
            if command.first().is_none_or(|c| c.trim().is_empty()) {
                return Err(bad(&cpath, "must name a program first".into()));
            }
            for (i, arg) in command.iter().enumerate() {
                check_placeholders(arg, &format!("{cpath}[{i}]"), block)?;
            }
            CheckKind::Exec {
                command: command.clone(),
            }
        }
        other => {
            return Err(bad(
                &kind_path,
                format!("{other:?} is not a check type: Prometheus, Http or Exec"),
            ));
        }
    };
    let request_timeout_seconds = duration(
        spec.request_timeout_seconds,
        DEFAULT_REQUEST_TIMEOUT_SECONDS,
        &format!("{path}.requestTimeoutSeconds"),
        1,
    )?;
    if request_timeout_seconds > 300 {
        return Err(bad(
            &format!("{path}.requestTimeoutSeconds"),
            format!("{request_timeout_seconds} must be at most 300 seconds"),
        ));
    }
    let headers = spec.headers.clone().unwrap_or_default();
    for (key, value) in &headers {
        let hpath = format!("{path}.headers.{key}");
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        {
            return Err(bad(&hpath, format!("{key:?} is not a header name")));
        }
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(bad(&hpath, "holds a control character".into()));
        }
        if let Some(env) = env_reference(value) {
            if env.is_empty() || !env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(bad(
                    &hpath,
                    format!("{value:?} names no environment variable"),
                ));
            }
            // Whoever writes a strategy names where a check sends its headers: only the
            // variables an administrator set for checks may go there.
            if !env.starts_with(ENV_PREFIX) {
                return Err(bad(
                    &hpath,
                    format!(
                        "{value:?}: checks may read only environment variables named {ENV_PREFIX}*"
                    ),
                ));
            }
        } else {
            check_placeholders(value, &hpath, block)?;
        }
    }
    if let Some(ca) = &spec.ca_file
        && ca.trim().is_empty()
    {
        return Err(bad(&format!("{path}.caFile"), "must not be empty".into()));
    }
    Ok(Check {
        name: name.to_string(),
        kind,
        request_timeout_seconds,
        headers,
        ca_file: spec.ca_file.clone(),
    })
}

/// The environment variables a check's header may read start with this.
pub const ENV_PREFIX: &str = "FLOTILLA_CHECK_";

/// `{env:NAME}`: a header value read from the server's environment.
pub fn env_reference(value: &str) -> Option<&str> {
    value.strip_prefix("{env:")?.strip_suffix('}')
}

/// The checks of a block, validated: at least one, at most [`MAX_CHECKS`], names unique.
pub fn parse_check_list(
    specs: &[CheckSpec],
    path: &str,
    block: BlockKind,
) -> Result<Vec<Check>, ApiError> {
    if specs.is_empty() {
        return Err(bad(path, "needs at least one check".into()));
    }
    if specs.len() > MAX_CHECKS {
        return Err(bad(
            path,
            format!(
                "has {} checks; at most {MAX_CHECKS} are allowed",
                specs.len()
            ),
        ));
    }
    let mut names = BTreeSet::new();
    let mut checks = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let cpath = format!("{path}[{i}]");
        let check = parse_check(spec, &cpath, block)?;
        if !names.insert(check.name.clone()) {
            return Err(bad(
                &format!("{cpath}.name"),
                format!("{:?} is used twice; check names must be unique", check.name),
            ));
        }
        checks.push(check);
    }
    Ok(checks)
}

/// Timings of a block, with the defaults of its kind.
pub fn parse_timings(
    soak: Option<i64>,
    interval: Option<i64>,
    timeout: Option<i64>,
    unavailable_after: Option<i64>,
    path: &str,
    block: BlockKind,
) -> Result<(i64, i64, i64, i64), ApiError> {
    let (soak_default, interval_default) = match block {
        BlockKind::MemberHealth => (DEFAULT_SOAK_SECONDS, DEFAULT_INTERVAL_SECONDS),
        BlockKind::Readiness => (0, DEFAULT_READINESS_INTERVAL_SECONDS),
        BlockKind::Gate => (DEFAULT_GATE_SOAK_SECONDS, DEFAULT_INTERVAL_SECONDS),
    };
    let soak = duration(soak, soak_default, &format!("{path}.soakSeconds"), 0)?;
    let interval = duration(
        interval,
        interval_default,
        &format!("{path}.intervalSeconds"),
        1,
    )?;
    let timeout = duration(
        timeout,
        DEFAULT_TIMEOUT_SECONDS,
        &format!("{path}.timeoutSeconds"),
        1,
    )?;
    let unavailable = duration(
        unavailable_after,
        DEFAULT_UNAVAILABLE_AFTER_SECONDS,
        &format!("{path}.unavailableAfterSeconds"),
        1,
    )?;
    Ok((soak, interval, timeout, unavailable))
}

/// A stage's or group's `memberHealthChecks` or `readinessChecks`.
pub fn parse_block(
    spec: &CheckBlockSpec,
    path: &str,
    block: BlockKind,
) -> Result<Checks, ApiError> {
    match block {
        BlockKind::MemberHealth if spec.timeout_seconds.is_some() => {
            return Err(bad(
                &format!("{path}.timeoutSeconds"),
                "is not a member health check setting (a member fails at its first failing evaluation)".into(),
            ));
        }
        BlockKind::Readiness if spec.soak_seconds.is_some() => {
            return Err(bad(
                &format!("{path}.soakSeconds"),
                "is not a readiness check setting".into(),
            ));
        }
        _ => {}
    }
    let checks = parse_check_list(&spec.checks, &format!("{path}.checks"), block)?;
    let (soak_seconds, interval_seconds, timeout_seconds, unavailable_after_seconds) =
        parse_timings(
            spec.soak_seconds,
            spec.interval_seconds,
            spec.timeout_seconds,
            spec.unavailable_after_seconds,
            path,
            block,
        )?;
    Ok(Checks {
        checks,
        soak_seconds,
        interval_seconds,
        timeout_seconds,
        unavailable_after_seconds,
    })
}

// ---------------------------------------------------------------------------------------------
// Evaluations.

/// What one evaluation of one check found, as the shell reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// A Prometheus instant query's samples (the engine applies the condition).
    Samples(Vec<f64>),
    /// An Http or Exec check's verdict, with what was seen (`"200"`, `"exit 1"`).
    Verdict { passed: bool, value: String },
    /// The evaluation could not be made (unreachable, timed out, not allowed).
    Unavailable(String),
}

// Samples are finite or NaN as Prometheus reports them; equality is only used by tests.
impl Eq for Outcome {}

/// One evaluation judged: passed or failed, or `None` when it could not be made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judgement {
    pub passed: Option<bool>,
    /// What was seen, short (`"0.02"`, `"200"`, `"empty"`).
    pub value: Option<String>,
    pub message: String,
}

fn number(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Judges an outcome against its check (SEMANTICS §10): every sample must satisfy the
/// condition; an empty result follows `onEmpty`.
pub fn judge(check: &Check, outcome: &Outcome) -> Judgement {
    match (outcome, &check.kind) {
        (Outcome::Unavailable(why), _) => Judgement {
            passed: None,
            value: None,
            message: format!("check {:?} could not be evaluated: {why}", check.name),
        },
        (
            Outcome::Samples(samples),
            CheckKind::Prometheus {
                condition,
                empty_passes,
                ..
            },
        ) => {
            if samples.is_empty() {
                let verdict = if *empty_passes { "passes" } else { "fails" };
                return Judgement {
                    passed: Some(*empty_passes),
                    value: Some("empty".into()),
                    message: format!(
                        "check {:?}: the query returned no sample, which {verdict} (onEmpty)",
                        check.name
                    ),
                };
            }
            let failing = samples.iter().copied().find(|&v| !condition.holds(v));
            let shown = failing.unwrap_or_else(|| {
                // The sample nearest to failing: the largest for < and <=, the smallest for > and >=.
                let pick = match condition.op {
                    Comparison::Gt | Comparison::Ge => f64::min,
                    _ => f64::max,
                };
                samples.iter().copied().fold(samples[0], pick)
            });
            let passed = failing.is_none();
            Judgement {
                passed: Some(passed),
                value: Some(number(shown)),
                message: format!(
                    "check {:?}: value {} {} condition {}",
                    check.name,
                    number(shown),
                    if passed { "meets" } else { "does not meet" },
                    condition.text
                ),
            }
        }
        (Outcome::Verdict { passed, value }, _) => Judgement {
            passed: Some(*passed),
            value: Some(value.clone()),
            message: format!(
                "check {:?}: {value}, {}",
                check.name,
                if *passed { "passed" } else { "failed" }
            ),
        },
        (Outcome::Samples(_), _) => Judgement {
            passed: None,
            value: None,
            message: format!(
                "check {:?} is not a Prometheus check; a number is not its result",
                check.name
            ),
        },
    }
}

/// What the placeholders of a check stand for in one evaluation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Context {
    pub run: String,
    pub stage: String,
    pub group: Option<String>,
    /// A member's checks.
    pub member: Option<String>,
    pub cluster_resource_id: Option<String>,
    pub region: Option<String>,
    /// A gate's: the names of its scope's members.
    pub members: Vec<String>,
}

/// `text` with its placeholders replaced; `label` answers `{label:KEY}` (empty when the
/// member has no such label). Placeholders were checked at creation; one that does not apply
/// is left as it is.
pub fn render(text: &str, context: &Context, label: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (start, end, key) in placeholders(text) {
        let value = match key {
            "run" => Some(context.run.clone()),
            "stage" => Some(context.stage.clone()),
            "group" => Some(context.group.clone().unwrap_or_default()),
            "member" => context.member.clone(),
            "clusterResourceId" => context.cluster_resource_id.clone(),
            "region" => context.region.clone(),
            "members" => Some(context.members.join("|")),
            k => k
                .strip_prefix("label:")
                .map(|k| label(k).unwrap_or_default()),
        };
        if let Some(v) = value {
            out.push_str(&text[last..start]);
            out.push_str(&v);
            last = end;
        }
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str, block: BlockKind) -> Result<Check, ApiError> {
        let spec: CheckSpec = serde_json::from_str(json).unwrap();
        parse_check(&spec, "c", block)
    }

    #[test]
    fn conditions_parse_and_hold() {
        let c = Condition::parse("< 0.01").unwrap();
        assert!(c.holds(0.001) && !c.holds(0.01));
        assert!(Condition::parse(">=5").unwrap().holds(5.0));
        assert!(Condition::parse("!= 0").unwrap().holds(1.0));
        assert!(Condition::parse("== 1").unwrap().holds(1.0));
        for bad in ["0.01", "< x", "<", "=< 1", "< NaN", "> inf", ""] {
            assert!(Condition::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_field_and_value() {
        let cases = [
            (
                r#"{"name":"a","type":"Prometheus","endpoint":"http://p","query":"up","condition":"about 1"}"#,
                "c.condition",
                "about 1",
            ),
            (
                r#"{"name":"a","type":"Prometheus","endpoint":"ftp://p","query":"up","condition":"< 1"}"#,
                "c.endpoint",
                "ftp://p",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x/{nope}"}"#,
                "c.url",
                "{nope}",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x/{members}"}"#,
                "c.url",
                "{members}",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x","expectStatus":99}"#,
                "c.expectStatus",
                "99",
            ),
            (
                r#"{"name":"a","type":"Exec","command":[]}"#,
                "c.command",
                "program",
            ),
            (
                r#"{"name":"a","type":"Exec","command":["x"],"url":"http://x"}"#,
                "c.url",
                "Http",
            ),
            (r#"{"name":"a","type":"Ping"}"#, "c.type", "Ping"),
            (r#"{"type":"Exec","command":["x"]}"#, "c.name", "required"),
            (
                r#"{"name":"a","type":"Http","url":"http://x","headers":{"A":"{env:}"}}"#,
                "c.headers.A",
                "{env:}",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x","requestTimeoutSeconds":0}"#,
                "c.requestTimeoutSeconds",
                "0",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x/{cluster_id}"}"#,
                "c.url",
                "{cluster_id}",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x/{ member }"}"#,
                "c.url",
                "{ member }",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x/{label:}"}"#,
                "c.url",
                "{label:}",
            ),
            (
                r#"{"name":"a","type":"Exec","command":["x","{env:TOKEN}"]}"#,
                "c.command[1]",
                "{env:TOKEN}",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x","headers":{"A":"{env:HOME}"}}"#,
                "c.headers.A",
                "FLOTILLA_CHECK_",
            ),
        ];
        for (json, target, shown) in cases {
            let err = check(json, BlockKind::MemberHealth).unwrap_err();
            assert_eq!(err.target, target, "{json}");
            assert!(err.message.contains(shown), "{json}: {}", err.message);
            assert_eq!(err.code, ErrorCode::InvalidHealthCheck);
        }
        // A gate has {members} but no {member}.
        check(
            r#"{"name":"a","type":"Prometheus","endpoint":"http://p","query":"x{m=~\"{members}\"}","condition":"< 1"}"#,
            BlockKind::Gate,
        )
        .unwrap();
        let err = check(
            r#"{"name":"a","type":"Http","url":"http://x/{member}"}"#,
            BlockKind::Gate,
        )
        .unwrap_err();
        assert!(err.message.contains("{member}"), "{}", err.message);
    }

    #[test]
    fn judging_follows_the_condition_and_on_empty() {
        let c = check(
            r#"{"name":"err","type":"Prometheus","endpoint":"http://p","query":"q","condition":"< 0.01"}"#,
            BlockKind::Gate,
        )
        .unwrap();
        let j = judge(&c, &Outcome::Samples(vec![0.001, 0.002]));
        assert_eq!((j.passed, j.value.as_deref()), (Some(true), Some("0.002")));
        let j = judge(&c, &Outcome::Samples(vec![0.001, 0.5]));
        assert_eq!((j.passed, j.value.as_deref()), (Some(false), Some("0.5")));
        assert!(j.message.contains("< 0.01"), "{}", j.message);
        assert_eq!(judge(&c, &Outcome::Samples(vec![])).passed, Some(false));
        assert_eq!(
            judge(&c, &Outcome::Unavailable("refused".into())).passed,
            None
        );
        let pass_empty = check(
            r#"{"name":"e","type":"Prometheus","endpoint":"http://p","query":"q","condition":"< 1","onEmpty":"Pass"}"#,
            BlockKind::Gate,
        )
        .unwrap();
        assert_eq!(
            judge(&pass_empty, &Outcome::Samples(vec![])).passed,
            Some(true)
        );
    }

    #[test]
    fn placeholders_render() {
        let context = Context {
            run: "r".into(),
            stage: "s".into(),
            group: Some("g".into()),
            member: Some("m1".into()),
            cluster_resource_id: Some("/sub/x".into()),
            region: Some("eastus".into()),
            members: vec!["a".into(), "b".into()],
        };
        let label = |k: &str| (k == "env").then(|| "prod".to_string());
        assert_eq!(
            render(
                "{run}/{stage}/{group}/{member}/{clusterResourceId}/{region}/{members}/{label:env}/{label:x}",
                &context,
                &label
            ),
            "r/s/g/m1//sub/x/eastus/a|b/prod/"
        );
        // PromQL's own braces are text.
        assert_eq!(
            render(
                r#"rate(errors{cluster="{member}",x=~"{members}"}[5m])"#,
                &context,
                &label
            ),
            r#"rate(errors{cluster="m1",x=~"a|b"}[5m])"#
        );
        assert_eq!(render("sum(up{})", &context, &label), "sum(up{})");
    }
}
