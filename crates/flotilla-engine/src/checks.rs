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

/// A check as written: it names a check provider an admin declared and carries only data
/// (SEMANTICS §10). `type` may be left out where the data says it (`query`: Prometheus, `path`:
/// Http, `args`: Exec). `endpoint`, `url`, `command`, `headers` and `caFile` are the form written
/// before providers existed: such a check stays readable and is never evaluated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckSpec {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub check_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_empty: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_contains: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

impl CheckSpec {
    /// The first field of the form written before check providers that this check carries.
    pub fn inline_field(&self) -> Option<&'static str> {
        [
            ("endpoint", self.endpoint.is_some()),
            ("url", self.url.is_some()),
            ("command", self.command.is_some()),
            ("headers", self.headers.is_some()),
            ("caFile", self.ca_file.is_some()),
        ]
        .into_iter()
        .find_map(|(field, given)| given.then_some(field))
    }

    /// The check's type: as written, else as its data says.
    pub fn kind_name(&self) -> Option<&str> {
        if let Some(t) = self.check_type.as_deref() {
            return Some(t);
        }
        if self.query.is_some() || self.condition.is_some() || self.on_empty.is_some() {
            Some("Prometheus")
        } else if self.path.is_some()
            || self.expect_status.is_some()
            || self.body_contains.is_some()
        {
            Some("Http")
        } else if self.args.is_some() {
            Some("Exec")
        } else {
            None
        }
    }
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
    /// Member health checks only: `"Fail"` (the default) or `"RollBack"` (SEMANTICS §15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<String>,
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

/// What a check asks of its provider: data only, never a URL, a header, a file or a program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckKind {
    Prometheus {
        query: String,
        condition: Condition,
        /// What an empty result means: passes when true.
        empty_passes: bool,
    },
    Http {
        /// Appended to the provider's `baseUrl`; starts with `/`.
        path: String,
        /// `None`: any 2xx.
        expect_status: Option<u16>,
        body_contains: Option<String>,
    },
    Exec {
        /// Appended to the provider's command, each one argument.
        args: Vec<String>,
    },
    /// Written before check providers (`field` is the first inline field it carries): readable,
    /// never evaluated; a run holding one is not started (SEMANTICS §10).
    Inline { field: String },
}

impl CheckKind {
    /// The provider type this check needs.
    pub fn provider_type(&self) -> Option<ProviderType> {
        match self {
            CheckKind::Prometheus { .. } => Some(ProviderType::Prometheus),
            CheckKind::Http { .. } => Some(ProviderType::Http),
            CheckKind::Exec { .. } => Some(ProviderType::Exec),
            CheckKind::Inline { .. } => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    /// The check provider it names (empty for [`CheckKind::Inline`]).
    pub provider: String,
    pub kind: CheckKind,
    pub request_timeout_seconds: i64,
}

/// A block of checks with its timings (a member soak, readiness, or a HealthCheck gate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checks {
    pub checks: Vec<Check>,
    pub soak_seconds: i64,
    pub interval_seconds: i64,
    pub timeout_seconds: i64,
    pub unavailable_after_seconds: i64,
    /// What a member whose health check fails undergoes (SEMANTICS §15).
    #[serde(default, skip_serializing_if = "is_fail")]
    pub on_failure: OnFailure,
}

/// What a member whose health check fails undergoes (SEMANTICS §15, `onFailure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnFailure {
    /// It fails.
    #[default]
    Fail,
    /// It is rolled back at once, where the driver offers it, and fails.
    RollBack,
}

fn is_fail(on_failure: &OnFailure) -> bool {
    *on_failure == OnFailure::Fail
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

fn parse_check(spec: &CheckSpec, path: &str, block: BlockKind) -> Result<Check, ApiError> {
    let name = required_text(&spec.name, &format!("{path}.name"))?;
    crate::strategy::check_name(name, 63).map_err(|m| bad(&format!("{path}.name"), m))?;
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
    if let Some(field) = spec.inline_field() {
        // Stored before check providers existed: kept readable, never evaluated. A write
        // refuses it (`refuse_inline`).
        return Ok(Check {
            name: name.to_string(),
            provider: String::new(),
            kind: CheckKind::Inline {
                field: field.to_string(),
            },
            request_timeout_seconds,
        });
    }
    let provider = required_text(&spec.provider, &format!("{path}.provider"))?;
    crate::strategy::check_name(provider, 63).map_err(|m| bad(&format!("{path}.provider"), m))?;
    let kind_path = format!("{path}.type");
    let kind_text = spec.kind_name().ok_or_else(|| {
        bad(
            &kind_path,
            "is required when the check carries none of query, path or args".into(),
        )
    })?;
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
        only("query", spec.query.is_some(), "Prometheus")?;
        only("condition", spec.condition.is_some(), "Prometheus")?;
        only("onEmpty", spec.on_empty.is_some(), "Prometheus")
    };
    let http_fields = |spec: &CheckSpec| {
        only("path", spec.path.is_some(), "Http")?;
        only("expectStatus", spec.expect_status.is_some(), "Http")?;
        only("bodyContains", spec.body_contains.is_some(), "Http")
    };
    let kind = match kind_text {
        "Prometheus" => {
            http_fields(spec)?;
            only("args", spec.args.is_some(), "Exec")?;
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
                query: query.to_string(),
                condition,
                empty_passes,
            }
        }
        "Http" => {
            prometheus_fields(spec)?;
            only("args", spec.args.is_some(), "Exec")?;
            let ppath = format!("{path}.path");
            let request_path = spec.path.clone().unwrap_or_else(|| "/".into());
            check_placeholders(&request_path, &ppath, block)?;
            check_request_path(&request_path).map_err(|why| bad(&ppath, why))?;
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
                path: request_path,
                expect_status,
                body_contains: spec.body_contains.clone(),
            }
        }
        "Exec" => {
            prometheus_fields(spec)?;
            http_fields(spec)?;
            let args = spec.args.clone().unwrap_or_default();
            if args.len() > MAX_ARGS {
                return Err(bad(
                    &format!("{path}.args"),
                    format!(
                        "has {} arguments; at most {MAX_ARGS} are allowed",
                        args.len()
                    ),
                ));
            }
            for (i, arg) in args.iter().enumerate() {
                let apath = format!("{path}.args[{i}]");
                check_placeholders(arg, &apath, block)?;
                if arg.bytes().any(|b| b == 0) {
                    return Err(bad(&apath, format!("{arg:?} holds a NUL byte")));
                }
            }
            CheckKind::Exec { args }
        }
        other => {
            return Err(bad(
                &kind_path,
                format!("{other:?} is not a check type: Prometheus, Http or Exec"),
            ));
        }
    };
    Ok(Check {
        name: name.to_string(),
        provider: provider.to_string(),
        kind,
        request_timeout_seconds,
    })
}

/// The most arguments an Exec check adds to its provider's command.
const MAX_ARGS: usize = 64;

/// An Http check's path as written (placeholders not yet filled): under the provider's base URL,
/// never a way out of it (SEMANTICS §10). Outside its placeholders it holds only letters,
/// digits and `-._~/` (and `=&,:` in a query after `?`): no escape (the server makes those),
/// no `;`, `\\`, `#` or non-ASCII, and no `.` or `..` segment.
fn check_request_path(text: &str) -> Result<(), String> {
    if !text.starts_with('/') {
        return Err(format!("{text:?} must start with /"));
    }
    if text.starts_with("//") {
        return Err(format!("{text:?} names an authority (it starts with //)"));
    }
    // Each placeholder stands for a value the server encodes: only the text around is judged.
    let mut plain = String::with_capacity(text.len());
    let mut last = 0;
    for (start, end, _) in placeholders(text) {
        plain.push_str(&text[last..start]);
        plain.push('x');
        last = end;
    }
    plain.push_str(&text[last..]);
    if plain.contains("://") {
        return Err(format!("{text:?} names a scheme"));
    }
    let (path, query) = plain.split_once('?').unwrap_or((plain.as_str(), ""));
    let path_ok = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b));
    let query_ok = query
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/=&,:".contains(&b));
    if !path_ok || !query_ok {
        return Err(format!(
            "{text:?} may hold only letters, digits and - . _ ~ / in its path (and = & , : in a query after ?), besides placeholders; escapes are made by the server"
        ));
    }
    if has_dot_segment(path) {
        return Err(format!("{text:?} holds a . or .. segment"));
    }
    Ok(())
}

/// Whether a path (no query) holds a `.` or `..` segment, `/` and `\\` both separating.
pub fn has_dot_segment(path: &str) -> bool {
    path.split(['/', '\\'])
        .any(|segment| segment == ".." || segment == ".")
}

/// `%XX` decoded byte by byte (invalid escapes left as they are), lossily as text.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every byte outside RFC 3986's unreserved set as `%XX` (`/` included): what a placeholder's
/// value becomes in an Http check's path, so it stays one segment's text.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The environment variables a check's header may read start with this.
pub const ENV_PREFIX: &str = "FLOTILLA_CHECK_";

/// `{env:NAME}`: a header value read from the server's environment.
pub fn env_reference(value: &str) -> Option<&str> {
    value.strip_prefix("{env:")?.strip_suffix('}')
}

// ---------------------------------------------------------------------------------------------
// Check providers: what checks may reach, declared by an admin.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderType {
    Prometheus,
    Http,
    Exec,
}

impl ProviderType {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderType::Prometheus => "Prometheus",
            ProviderType::Http => "Http",
            ProviderType::Exec => "Exec",
        }
    }
}

/// `properties` of a check provider (`/v1/checkProviders/{name}`), as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderSpec {
    #[serde(rename = "type", default)]
    pub provider_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_options: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleets: Option<Vec<String>>,
}

/// Where a provider's evaluations go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderTarget {
    /// A Prometheus server's base URL; instant queries go to `{endpoint}/api/v1/query`.
    Prometheus { endpoint: String },
    /// A base URL (no trailing `/`) that checks' paths are appended to.
    Http { base_url: String },
    /// A program and its fixed arguments; checks append theirs.
    Exec {
        command: Vec<String>,
        allow_options: bool,
    },
}

/// A check provider, validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provider {
    pub name: String,
    pub target: ProviderTarget,
    pub headers: BTreeMap<String, String>,
    pub ca_file: Option<String>,
    /// The fleets whose strategies and runs may name it; `None`: every fleet.
    pub fleets: Option<Vec<String>>,
}

impl Provider {
    pub fn provider_type(&self) -> ProviderType {
        match self.target {
            ProviderTarget::Prometheus { .. } => ProviderType::Prometheus,
            ProviderTarget::Http { .. } => ProviderType::Http,
            ProviderTarget::Exec { .. } => ProviderType::Exec,
        }
    }

    /// Whether a strategy or run of `fleet` may name it.
    pub fn serves(&self, fleet: &str) -> bool {
        self.fleets
            .as_ref()
            .is_none_or(|f| f.iter().any(|x| x == fleet))
    }
}

fn bad_provider(field: &str, message: String) -> ApiError {
    let path = format!("properties.{field}");
    ApiError::new(
        ErrorCode::InvalidCheckProvider,
        format!("{path}: {message}"),
        path,
    )
}

/// A base URL an admin declared: http or https, a host, no query, fragment or credentials, no
/// placeholders. Returned without a trailing `/`.
fn parse_base_url(text: &str, field: &str) -> Result<String, ApiError> {
    let lower = text.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
        .ok_or_else(|| {
            bad_provider(
                field,
                format!("{text:?} must be an http:// or https:// URL"),
            )
        })?;
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() {
        return Err(bad_provider(field, format!("{text:?} names no host")));
    }
    if authority.contains('@') {
        return Err(bad_provider(
            field,
            format!("{text:?} holds credentials; put them in headers"),
        ));
    }
    if text.contains(['?', '#', '{', '}', ' ', '\\']) || text.bytes().any(|b| b.is_ascii_control())
    {
        return Err(bad_provider(
            field,
            format!("{text:?} must be a plain base URL: no query, fragment, placeholder or space"),
        ));
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// Validates a provider's properties (SEMANTICS §10). What needs the machine (a CA file
/// readable, a command allowed) is the server's to check besides.
pub fn parse_provider(name: &str, spec: &ProviderSpec) -> Result<Provider, ApiError> {
    let kind = spec
        .provider_type
        .as_deref()
        .ok_or_else(|| bad_provider("type", "is required: Prometheus, Http or Exec".into()))?;
    let only = |field: &str, present: bool, kinds: &str| {
        if present {
            Err(bad_provider(
                field,
                format!("is only allowed on a {kinds} provider"),
            ))
        } else {
            Ok(())
        }
    };
    let target = match kind {
        "Prometheus" => {
            only("baseUrl", spec.base_url.is_some(), "Http")?;
            only("command", spec.command.is_some(), "Exec")?;
            only("allowOptions", spec.allow_options.is_some(), "Exec")?;
            let endpoint = spec
                .endpoint
                .as_deref()
                .ok_or_else(|| bad_provider("endpoint", "is required".into()))?;
            ProviderTarget::Prometheus {
                endpoint: parse_base_url(endpoint, "endpoint")?,
            }
        }
        "Http" => {
            only("endpoint", spec.endpoint.is_some(), "Prometheus")?;
            only("command", spec.command.is_some(), "Exec")?;
            only("allowOptions", spec.allow_options.is_some(), "Exec")?;
            let base = spec
                .base_url
                .as_deref()
                .ok_or_else(|| bad_provider("baseUrl", "is required".into()))?;
            ProviderTarget::Http {
                base_url: parse_base_url(base, "baseUrl")?,
            }
        }
        "Exec" => {
            only("endpoint", spec.endpoint.is_some(), "Prometheus")?;
            only("baseUrl", spec.base_url.is_some(), "Http")?;
            only("headers", spec.headers.is_some(), "Prometheus or Http")?;
            only("caFile", spec.ca_file.is_some(), "Prometheus or Http")?;
            let command = spec
                .command
                .as_ref()
                .ok_or_else(|| bad_provider("command", "is required".into()))?;
            if command.first().is_none_or(|c| c.trim().is_empty()) {
                return Err(bad_provider("command", "must name a program first".into()));
            }
            if command.len() > MAX_ARGS {
                return Err(bad_provider(
                    "command",
                    format!(
                        "has {} words; at most {MAX_ARGS} are allowed",
                        command.len()
                    ),
                ));
            }
            for (i, word) in command.iter().enumerate() {
                if word.bytes().any(|b| b == 0) || !placeholders(word).is_empty() {
                    return Err(bad_provider(
                        &format!("command[{i}]"),
                        format!("{word:?} must be plain text (no placeholder, no NUL byte)"),
                    ));
                }
            }
            ProviderTarget::Exec {
                command: command.clone(),
                allow_options: spec.allow_options.unwrap_or(false),
            }
        }
        other => {
            return Err(bad_provider(
                "type",
                format!("{other:?} is not a provider type: Prometheus, Http or Exec"),
            ));
        }
    };
    let headers = spec.headers.clone().unwrap_or_default();
    if headers.len() > MAX_CHECKS {
        return Err(bad_provider(
            "headers",
            format!(
                "has {} headers; at most {MAX_CHECKS} are allowed",
                headers.len()
            ),
        ));
    }
    for (key, value) in &headers {
        let field = format!("headers.{key}");
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        {
            return Err(bad_provider(
                &field,
                format!("{key:?} is not a header name"),
            ));
        }
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(bad_provider(&field, "holds a control character".into()));
        }
        if let Some(env) = env_reference(value) {
            if env.is_empty() || !env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(bad_provider(
                    &field,
                    format!("{value:?} names no environment variable"),
                ));
            }
            if !env.starts_with(ENV_PREFIX) {
                return Err(bad_provider(
                    &field,
                    format!(
                        "{value:?}: providers may read only environment variables named {ENV_PREFIX}*"
                    ),
                ));
            }
        } else if !placeholders(value).is_empty() {
            return Err(bad_provider(
                &field,
                format!("{value:?}: a header is fixed text or {{env:NAME}}, never a placeholder"),
            ));
        }
    }
    if let Some(ca) = &spec.ca_file
        && ca.trim().is_empty()
    {
        return Err(bad_provider("caFile", "must not be empty".into()));
    }
    if let Some(fleets) = &spec.fleets {
        if fleets.is_empty() || fleets.len() > 100 {
            return Err(bad_provider(
                "fleets",
                format!(
                    "lists {} fleets; 1 to 100 (leave it out for every fleet)",
                    fleets.len()
                ),
            ));
        }
        for (i, fleet) in fleets.iter().enumerate() {
            crate::strategy::check_name(fleet, 63)
                .map_err(|m| bad_provider(&format!("fleets[{i}]"), m))?;
        }
    }
    Ok(Provider {
        name: name.to_string(),
        target,
        headers,
        ca_file: spec.ca_file.clone(),
        fleets: spec.fleets.clone(),
    })
}

/// Every check a strategy names, with where it sits (`{path}.stages[0].memberHealthChecks.checks[1]`).
pub fn strategy_checks<'a>(
    spec: &'a crate::strategy::StrategySpec,
    path: &str,
) -> Vec<(String, &'a CheckSpec)> {
    let mut found = Vec::new();
    let block = |at: String, block: &'a Option<CheckBlockSpec>, found: &mut Vec<_>| {
        if let Some(b) = block {
            for (i, c) in b.checks.iter().enumerate() {
                found.push((format!("{at}.checks[{i}]"), c));
            }
        }
    };
    let gates = |at: String, gates: &'a [crate::strategy::GateSpec], found: &mut Vec<_>| {
        for (k, g) in gates.iter().enumerate() {
            for (i, c) in g.checks.iter().enumerate() {
                found.push((format!("{at}[{k}].checks[{i}]"), c));
            }
        }
    };
    for (si, stage) in spec.stages.iter().flatten().enumerate() {
        let sp = format!("{path}.stages[{si}]");
        block(
            format!("{sp}.memberHealthChecks"),
            &stage.member_health_checks,
            &mut found,
        );
        block(
            format!("{sp}.readinessChecks"),
            &stage.readiness_checks,
            &mut found,
        );
        gates(format!("{sp}.beforeGates"), &stage.before_gates, &mut found);
        gates(format!("{sp}.afterGates"), &stage.after_gates, &mut found);
        for (gi, group) in stage.groups.iter().flatten().enumerate() {
            let gp = format!("{sp}.groups[{gi}]");
            block(
                format!("{gp}.memberHealthChecks"),
                &group.member_health_checks,
                &mut found,
            );
            block(
                format!("{gp}.readinessChecks"),
                &group.readiness_checks,
                &mut found,
            );
            gates(format!("{gp}.beforeGates"), &group.before_gates, &mut found);
            gates(format!("{gp}.afterGates"), &group.after_gates, &mut found);
        }
    }
    found
}

/// What a write of `fleet` must hold of its checks (SEMANTICS §10): each names a provider that
/// exists, is of the check's type and serves the fleet; none carries an endpoint, a URL, a
/// header, a file or a program itself; an Exec check's arguments are not options unless its
/// provider allows them. `provider` looks a provider up by name. The strategy was parsed.
pub fn check_providers(
    spec: &crate::strategy::StrategySpec,
    path: &str,
    fleet: &str,
    provider: &dyn Fn(&str) -> Option<Provider>,
) -> Result<(), ApiError> {
    for (at, check) in strategy_checks(spec, path) {
        if let Some(field) = check.inline_field() {
            return Err(bad(
                &format!("{at}.{field}"),
                format!(
                    "a check names a check provider and carries only data; {field} is not allowed here \
                     (an admin declares where checks go: PUT /v1/checkProviders/NAME, then \"provider\": NAME)"
                ),
            ));
        }
        let name = check.provider.as_deref().unwrap_or_default();
        let ppath = format!("{at}.provider");
        let Some(found) = provider(name) else {
            return Err(bad(
                &ppath,
                format!(
                    "{name:?} is not a check provider (an admin declares them: /v1/checkProviders)"
                ),
            ));
        };
        let wanted = check.kind_name().unwrap_or_default();
        if found.provider_type().as_str() != wanted {
            return Err(bad(
                &ppath,
                format!(
                    "{name:?} is a {} provider; this is a {wanted} check",
                    found.provider_type().as_str()
                ),
            ));
        }
        if !found.serves(fleet) {
            return Err(bad(
                &ppath,
                format!("{name:?} may not be named by fleet {fleet:?} (its fleets list it not)"),
            ));
        }
        if let ProviderTarget::Exec {
            allow_options: false,
            ..
        } = found.target
        {
            for (i, arg) in check.args.iter().flatten().enumerate() {
                if arg.starts_with('-') {
                    return Err(bad(
                        &format!("{at}.args[{i}]"),
                        format!("{arg:?} is an option; provider {name:?} does not allow options"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The first check written before check providers in a strategy, with where it sits: such a run
/// is not created from it, nor started or retried (SEMANTICS §10).
pub fn first_inline(spec: &crate::strategy::StrategySpec, path: &str) -> Option<String> {
    strategy_checks(spec, path)
        .into_iter()
        .find_map(|(at, c)| c.inline_field().map(|f| format!("{at}.{f}")))
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
    let on_failure = match (spec.on_failure.as_deref(), block) {
        (None | Some("Fail"), _) => OnFailure::Fail,
        (Some("RollBack"), BlockKind::MemberHealth) => OnFailure::RollBack,
        (Some("RollBack"), _) => {
            return Err(bad(
                &format!("{path}.onFailure"),
                "\"RollBack\" is for member health checks only".into(),
            ));
        }
        (Some(other), _) => {
            return Err(bad(
                &format!("{path}.onFailure"),
                format!("{other:?} must be \"Fail\" or \"RollBack\""),
            ));
        }
    };
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
        on_failure,
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
    render_with(text, context, label, &|v| v.to_string())
}

/// [`render`] for a Prometheus query: each value a placeholder stands for is escaped as a PromQL
/// string's content (`\\`, `"`, `'`, a newline), so a value cannot end the string it is put in.
pub fn render_query(
    text: &str,
    context: &Context,
    label: &dyn Fn(&str) -> Option<String>,
) -> String {
    render_with(text, context, label, &|v| {
        let mut out = String::with_capacity(v.len());
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\'' => out.push_str("\\'"),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out
    })
}

/// [`render`] for an Http check's path: each value a placeholder stands for is percent-encoded
/// outside the unreserved set, `/` included, so it stays within its segment (SEMANTICS §10).
pub fn render_path(
    text: &str,
    context: &Context,
    label: &dyn Fn(&str) -> Option<String>,
) -> String {
    render_with(text, context, label, &percent_encode)
}

fn render_with(
    text: &str,
    context: &Context,
    label: &dyn Fn(&str) -> Option<String>,
    encode: &dyn Fn(&str) -> String,
) -> String {
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
            out.push_str(&encode(&v));
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
                r#"{"name":"a","provider":"p","query":"up","condition":"about 1"}"#,
                "c.condition",
                "about 1",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/{nope}"}"#,
                "c.path",
                "{nope}",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/{members}"}"#,
                "c.path",
                "{members}",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x","expectStatus":99}"#,
                "c.expectStatus",
                "99",
            ),
            (
                r#"{"name":"a","provider":"p","args":["x"],"path":"/x"}"#,
                "c.args",
                "Exec",
            ),
            (
                r#"{"name":"a","provider":"p","type":"Ping"}"#,
                "c.type",
                "Ping",
            ),
            (r#"{"name":"a","provider":"p"}"#, "c.type", "required"),
            (r#"{"provider":"p","args":["x"]}"#, "c.name", "required"),
            (r#"{"name":"a","args":["x"]}"#, "c.provider", "required"),
            (
                r#"{"name":"a","provider":"P","args":["x"]}"#,
                "c.provider",
                "\"P\"",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x","requestTimeoutSeconds":0}"#,
                "c.requestTimeoutSeconds",
                "0",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/{cluster_id}"}"#,
                "c.path",
                "{cluster_id}",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/{label:}"}"#,
                "c.path",
                "{label:}",
            ),
            (
                r#"{"name":"a","provider":"p","args":["x","{env:TOKEN}"]}"#,
                "c.args[1]",
                "{env:TOKEN}",
            ),
            (
                r#"{"name":"a","provider":"p","path":"x"}"#,
                "c.path",
                "start with /",
            ),
            (
                r#"{"name":"a","provider":"p","path":"//evil.example/x"}"#,
                "c.path",
                "authority",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/../admin"}"#,
                "c.path",
                "..",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/%2e%2E/admin"}"#,
                "c.path",
                "escapes are made by the server",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x%3F/%2e%2e/%2e%2e/apix"}"#,
                "c.path",
                "escapes are made by the server",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/..;/..;/admin"}"#,
                "c.path",
                "only letters",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x/./y"}"#,
                "c.path",
                ". or ..",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/redirect?to=http://127.0.0.1/"}"#,
                "c.path",
                "scheme",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x\\..\\y"}"#,
                "c.path",
                "only letters",
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
            r#"{"name":"a","provider":"p","query":"x{m=~\"{members}\"}","condition":"< 1"}"#,
            BlockKind::Gate,
        )
        .unwrap();
        let err = check(
            r#"{"name":"a","provider":"p","path":"/x/{member}"}"#,
            BlockKind::Gate,
        )
        .unwrap_err();
        assert!(err.message.contains("{member}"), "{}", err.message);
        // The type is read from the data; an explicit one must agree with it.
        let http = check(
            r#"{"name":"a","provider":"p","path":"/h/{member}"}"#,
            BlockKind::MemberHealth,
        )
        .unwrap();
        assert!(matches!(http.kind, CheckKind::Http { .. }));
        let exec = check(
            r#"{"name":"a","provider":"p","type":"Exec"}"#,
            BlockKind::MemberHealth,
        )
        .unwrap();
        assert_eq!(exec.kind, CheckKind::Exec { args: vec![] });
        let err = check(
            r#"{"name":"a","provider":"p","type":"Exec","query":"q"}"#,
            BlockKind::MemberHealth,
        )
        .unwrap_err();
        assert_eq!(err.target, "c.query");
    }

    #[test]
    fn checks_written_before_providers_are_read_as_inline() {
        for (json, field) in [
            (
                r#"{"name":"a","type":"Prometheus","endpoint":"http://p","query":"q","condition":"< 1"}"#,
                "endpoint",
            ),
            (
                r#"{"name":"a","type":"Http","url":"http://x/{member}"}"#,
                "url",
            ),
            (
                r#"{"name":"a","type":"Exec","command":["exec/upgrade.sh","e0"]}"#,
                "command",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x","headers":{"Metadata":"true"}}"#,
                "headers",
            ),
            (
                r#"{"name":"a","provider":"p","path":"/x","caFile":"/etc/shadow"}"#,
                "caFile",
            ),
        ] {
            let c = check(json, BlockKind::MemberHealth).unwrap();
            assert_eq!(
                c.kind,
                CheckKind::Inline {
                    field: field.into()
                },
                "{json}"
            );
        }
    }

    fn provider(json: &str) -> Result<Provider, ApiError> {
        parse_provider("p", &serde_json::from_str(json).unwrap())
    }

    #[test]
    fn providers_are_validated_field_by_field() {
        let ok = provider(r#"{"type":"Http","baseUrl":"https://health.example.com/base/","headers":{"Authorization":"{env:FLOTILLA_CHECK_TOKEN}"}}"#).unwrap();
        assert_eq!(
            ok.target,
            ProviderTarget::Http {
                base_url: "https://health.example.com/base".into()
            }
        );
        provider(r#"{"type":"Exec","command":["/opt/checks/probe","--fixed"],"fleets":["prod"]}"#)
            .unwrap();
        provider(r#"{"type":"Prometheus","endpoint":"http://prom:9090"}"#).unwrap();
        let cases = [
            (r#"{"type":"Ping"}"#, "properties.type"),
            (r#"{"endpoint":"http://p"}"#, "properties.type"),
            (r#"{"type":"Prometheus"}"#, "properties.endpoint"),
            (
                r#"{"type":"Prometheus","endpoint":"ftp://p"}"#,
                "properties.endpoint",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://u:pw@h/"}"#,
                "properties.baseUrl",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://h/{member}"}"#,
                "properties.baseUrl",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://h/?a=b"}"#,
                "properties.baseUrl",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://h","command":["x"]}"#,
                "properties.command",
            ),
            (r#"{"type":"Exec","command":[]}"#, "properties.command"),
            (
                r#"{"type":"Exec","command":["x","{member}"]}"#,
                "properties.command[1]",
            ),
            (
                r#"{"type":"Exec","command":["x"],"headers":{"A":"b"}}"#,
                "properties.headers",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://h","headers":{"A":"{env:HOME}"}}"#,
                "properties.headers.A",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://h","headers":{"A":"{member}"}}"#,
                "properties.headers.A",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://h","fleets":[]}"#,
                "properties.fleets",
            ),
            (
                r#"{"type":"Http","baseUrl":"http://h","fleets":["Prod"]}"#,
                "properties.fleets[0]",
            ),
        ];
        for (json, target) in cases {
            let err = provider(json).unwrap_err();
            assert_eq!(err.target, target, "{json}: {}", err.message);
            assert_eq!(err.code, ErrorCode::InvalidCheckProvider);
        }
    }

    #[test]
    fn a_strategy_names_only_providers_of_its_type_that_serve_its_fleet() {
        let providers = [
            provider(r#"{"type":"Prometheus","endpoint":"http://prom"}"#)
                .map(|p| Provider {
                    name: "prom".into(),
                    ..p
                })
                .unwrap(),
            provider(r#"{"type":"Exec","command":["/opt/probe"],"fleets":["prod"]}"#)
                .map(|p| Provider {
                    name: "probe".into(),
                    ..p
                })
                .unwrap(),
        ];
        let lookup = |name: &str| providers.iter().find(|p| p.name == name).cloned();
        let strategy = |check: &str| -> crate::strategy::StrategySpec {
            serde_json::from_str(&format!(
                r#"{{"stages":[{{"name":"s","groups":[{{"name":"g","memberHealthChecks":{{"checks":[{check}]}}}}]}}]}}"#
            ))
            .unwrap()
        };
        let verdict = |check: &str, fleet: &str| {
            check_providers(&strategy(check), "p.strategy", fleet, &lookup)
                .map_err(|e| (e.target, e.message))
        };
        verdict(
            r#"{"name":"e","provider":"prom","query":"q","condition":"< 1"}"#,
            "dev",
        )
        .unwrap();
        verdict(
            r#"{"name":"e","provider":"probe","args":["{member}"]}"#,
            "prod",
        )
        .unwrap();
        let at = "p.strategy.stages[0].groups[0].memberHealthChecks.checks[0]";
        for (check, fleet, field, says) in [
            (
                r#"{"name":"e","provider":"nope","path":"/x"}"#,
                "dev",
                "provider",
                "not a check provider",
            ),
            (
                r#"{"name":"e","provider":"prom","path":"/x"}"#,
                "dev",
                "provider",
                "Prometheus provider",
            ),
            (
                r#"{"name":"e","provider":"probe","args":["x"]}"#,
                "dev",
                "provider",
                "fleet \"dev\"",
            ),
            (
                r#"{"name":"e","provider":"probe","args":["x","--state-dir=/etc"]}"#,
                "prod",
                "args[1]",
                "option",
            ),
            (
                r#"{"name":"e","type":"Exec","command":["exec/upgrade.sh","exec-state","e0"]}"#,
                "prod",
                "command",
                "not allowed",
            ),
            (
                r#"{"name":"e","type":"Http","url":"http://169.254.169.254/","headers":{"Metadata":"true"}}"#,
                "dev",
                "url",
                "not allowed",
            ),
        ] {
            let (target, message) = verdict(check, fleet).unwrap_err();
            assert_eq!(target, format!("{at}.{field}"), "{check}: {message}");
            assert!(message.contains(says), "{check}: {message}");
        }
        assert_eq!(
            first_inline(
                &strategy(r#"{"name":"e","type":"Http","url":"http://x"}"#),
                "s"
            )
            .as_deref(),
            Some("s.stages[0].groups[0].memberHealthChecks.checks[0].url")
        );
    }

    #[test]
    fn placeholder_values_stay_one_segment() {
        assert_eq!(percent_encode("a/b?c#d e%"), "a%2Fb%3Fc%23d%20e%25");
        assert_eq!(percent_encode("node-1.eastus_~"), "node-1.eastus_~");
        assert_eq!(percent_decode("%2e%2E/%zz"), "../%zz");
        assert!(has_dot_segment("/a/../b"));
        assert!(has_dot_segment("/a\\..\\b"));
        assert!(!has_dot_segment("/a/..b/c"));
        let context = Context {
            member: Some("x\"} or vector(0) or e{c=\"".into()),
            ..Context::default()
        };
        assert_eq!(
            render_query(r#"max(e{cluster="{member}"})"#, &context, &|_| None),
            r#"max(e{cluster="x\"} or vector(0) or e{c=\""})"#
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
