//! An identity provider's configuration (from the configuration file or
//! `/v1/identityProviders`), parsed and checked, and what a verified token's claims grant: a
//! role per fleet pattern, from the provider's mappings of groups or subjects to roles.
//!
//! Nothing is granted by default: claims that match no mapping grant nothing (any CI system
//! can mint a token for any audience; only a mapping says whose tokens count).

use serde_json::{Map, Value};

use crate::principal::Role;

/// A rejected configuration: the field path and what is wrong with its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

fn error(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

/// Where a provider's configuration came from: a file-defined one is read-only in the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    File,
    Api,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Api => "api",
        }
    }
}

/// Where the client secret of a confidential client is read from (never the secret itself in
/// a configuration or an API body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretRef {
    Env(String),
    File(std::path::PathBuf),
}

impl SecretRef {
    /// The secret, read now (a rotated file is picked up without a restart).
    pub fn read(&self) -> Result<String, String> {
        match self {
            SecretRef::Env(name) => std::env::var(name)
                .map_err(|_| format!("the environment variable {name} is not set")),
            SecretRef::File(path) => std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .map_err(|e| format!("{}: {e}", path.display())),
        }
    }
}

/// A fleet name pattern: `*` matches any run of characters (`prod-*`, `*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetPattern(String);

impl FleetPattern {
    pub fn parse(field: &str, text: &str) -> Result<FleetPattern, ConfigError> {
        let ok = !text.is_empty()
            && text.len() <= 128
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.*".contains(c));
        if !ok {
            return Err(error(
                field,
                format!(
                    "{text:?}: a fleet name pattern is 1 to 128 letters, digits, '-', '_', '.' and '*' (any run of characters)"
                ),
            ));
        }
        Ok(FleetPattern(text.to_ascii_lowercase()))
    }

    pub fn is_everything(&self) -> bool {
        self.0 == "*"
    }

    pub fn matches(&self, fleet: &str) -> bool {
        glob(&self.0, &fleet.to_ascii_lowercase())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `*`-only glob matching (iterative, linear backtracking: no pattern makes it slow).
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// One mapping: members of any of `groups`, or tokens whose `sub` matches one of `subjects`,
/// get `role` on the fleets matching `fleets`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub groups: Vec<String>,
    pub subjects: Vec<String>,
    pub role: Role,
    pub fleets: Vec<FleetPattern>,
}

/// A role on the fleets a pattern matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub fleets: FleetPattern,
    pub role: Role,
}

/// An identity provider, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderConfig {
    pub name: String,
    pub source: Source,
    /// The issuer URL, exactly as tokens carry it in `iss`.
    pub issuer: String,
    /// What a token's `aud` must include for an API call.
    pub audience: String,
    /// The OAuth client people sign in through (the dashboard, `flotilla login --oidc`).
    pub client_id: Option<String>,
    pub client_secret: Option<SecretRef>,
    /// The public OAuth client `flotilla login --oidc` signs in through (the device flow;
    /// `clientId` unless told).
    pub cli_client_id: Option<String>,
    /// The claim that names a user (`sub` unless told: `preferred_username`, `email`).
    pub user_claim: String,
    /// The claim that lists a user's groups.
    pub groups_claim: String,
    /// Scopes asked for when people sign in, besides `openid`.
    pub scopes: Vec<String>,
    pub mappings: Vec<Mapping>,
}

/// The prefix of the environment variables an API-defined provider's secret may be read from.
pub const API_SECRET_PREFIX: &str = "FLOTILLA_OIDC_";

/// The one environment variable an API-defined provider's secret may be read from:
/// `FLOTILLA_OIDC_<NAME>_SECRET` for its own name (uppercased, `-` as `_`), so that no admin
/// can point a provider at another provider's secret.
pub fn api_secret_variable(name: &str) -> String {
    format!(
        "{API_SECRET_PREFIX}{}_SECRET",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

const KEYS: &[&str] = &[
    "issuer",
    "audience",
    "clientId",
    "clientSecret",
    "cliClientId",
    "userClaim",
    "groupsClaim",
    "scopes",
    "roles",
    "source",
];

/// A name of a provider: as fleet names, lowercase letters, digits and '-'.
pub fn check_name(field: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(error(
            field,
            format!("{name:?}: 1 to 63 lowercase letters, digits and '-', not starting with '-'"),
        ))
    }
}

/// The scheme rule of an issuer and of every endpoint its discovery document names: `https://`,
/// or `http://` on a loopback host only (a test provider).
pub fn https_or_loopback(url: &reqwest::Url) -> bool {
    let loopback = url.host_str().is_some_and(|host| {
        host == "localhost"
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    match url.scheme() {
        "https" => true,
        "http" => loopback,
        _ => false,
    }
}

/// An issuer URL: `https://`, or `http://` on a loopback host only (a test provider); no query
/// or fragment (OpenID Connect Discovery §4).
pub fn check_issuer(field: &str, issuer: &str) -> Result<(), ConfigError> {
    let url = reqwest::Url::parse(issuer)
        .map_err(|e| error(field, format!("{issuer:?}: not a URL ({e})")))?;
    if !https_or_loopback(&url) {
        return Err(error(
            field,
            format!("{issuer:?}: must be https:// (http:// only on a loopback address)"),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(error(
            field,
            format!("{issuer:?}: an issuer URL has no query, fragment or user"),
        ));
    }
    Ok(())
}

fn string(map: &Map<String, Value>, path: &str, key: &str) -> Result<Option<String>, ConfigError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= 2048 => Ok(Some(s.clone())),
        Some(other) => Err(error(
            format!("{path}{key}"),
            format!("{other}: must be a non-empty string of at most 2048 characters"),
        )),
    }
}

fn strings(map: &Map<String, Value>, path: &str, key: &str) -> Result<Vec<String>, ConfigError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) if !s.is_empty() && s.len() <= 1024 => Ok(s.clone()),
                other => Err(error(
                    format!("{path}{key}[{i}]"),
                    format!("{other}: must be a non-empty string"),
                )),
            })
            .collect(),
        Some(other) => Err(error(
            format!("{path}{key}"),
            format!("{other}: must be a list of strings"),
        )),
    }
}

fn claim_name(
    map: &Map<String, Value>,
    path: &str,
    key: &str,
    default: &str,
) -> Result<String, ConfigError> {
    let name = string(map, path, key)?.unwrap_or_else(|| default.to_string());
    if name.len() > 256 || name.chars().any(char::is_control) {
        return Err(error(
            format!("{path}{key}"),
            format!("{name:?}: not a claim name"),
        ));
    }
    Ok(name)
}

impl ProviderConfig {
    /// Parses a provider's properties (the API's `properties` object, or a configuration
    /// file's table less its `name`). `path` prefixes every field named in an error
    /// (`properties.`, or `identity-provider[0].`).
    pub fn parse(
        name: &str,
        source: Source,
        properties: &Value,
        path: &str,
    ) -> Result<ProviderConfig, ConfigError> {
        check_name(&format!("{path}name"), name)?;
        let map = properties
            .as_object()
            .ok_or_else(|| error(path.trim_end_matches('.'), "must be an object"))?;
        if let Some(key) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(error(
                format!("{path}{key}"),
                format!("unknown field; the fields are {}", KEYS.join(", ")),
            ));
        }
        let issuer = string(map, path, "issuer")?
            .ok_or_else(|| error(format!("{path}issuer"), "is required"))?;
        check_issuer(&format!("{path}issuer"), &issuer)?;
        let audience = string(map, path, "audience")?.ok_or_else(|| {
            error(
                format!("{path}audience"),
                "is required (what a token's aud must include)",
            )
        })?;
        let client_id = string(map, path, "clientId")?;
        let client_secret = match map.get("clientSecret") {
            None | Some(Value::Null) => None,
            Some(Value::Object(secret)) => {
                let field = format!("{path}clientSecret");
                // Through the API an admin names where the server reads a secret it then sends
                // to the provider's token endpoint (which the same admin chose): only variables
                // meant for it, never a file (the configuration file's author is the server's
                // operator, who may name either).
                match (secret.get("env"), secret.get("file"), secret.len()) {
                    (Some(Value::String(env)), None, 1)
                        if source == Source::Api && *env != api_secret_variable(name) =>
                    {
                        return Err(error(
                            format!("{field}.env"),
                            format!(
                                "{env:?}: through the API, only {:?}, this provider's own variable (another's secret would be sent to the issuer this admin chose)",
                                api_secret_variable(name)
                            ),
                        ));
                    }
                    (Some(Value::String(env)), None, 1) if !env.is_empty() => {
                        Some(SecretRef::Env(env.clone()))
                    }
                    (None, Some(Value::String(_)), 1) if source == Source::Api => {
                        return Err(error(
                            format!("{field}.file"),
                            format!(
                                "a file is named in the configuration file only; through the API use {{\"env\": \"{}\"}}",
                                api_secret_variable(name)
                            ),
                        ));
                    }
                    (None, Some(Value::String(file)), 1) if !file.is_empty() => {
                        Some(SecretRef::File(file.into()))
                    }
                    _ => {
                        return Err(error(
                            field,
                            "must be {\"env\": \"VARIABLE\"} or {\"file\": \"/path\"}: a reference to the secret, never the secret",
                        ));
                    }
                }
            }
            Some(Value::String(_)) => {
                return Err(error(
                    format!("{path}clientSecret"),
                    "must be {\"env\": \"VARIABLE\"} or {\"file\": \"/path\"}: a reference to the secret, never the secret",
                ));
            }
            Some(other) => {
                return Err(error(
                    format!("{path}clientSecret"),
                    format!("{other}: must be an object"),
                ));
            }
        };
        if client_secret.is_some() && client_id.is_none() {
            return Err(error(format!("{path}clientSecret"), "needs clientId"));
        }
        let cli_client_id = string(map, path, "cliClientId")?;
        let user_claim = claim_name(map, path, "userClaim", "sub")?;
        let groups_claim = claim_name(map, path, "groupsClaim", "groups")?;
        let scopes = strings(map, path, "scopes")?;
        if let Some((i, s)) = scopes.iter().enumerate().find(|(_, s)| {
            !s.chars()
                .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\')
        }) {
            return Err(error(
                format!("{path}scopes[{i}]"),
                format!("{s:?}: not a scope"),
            ));
        }
        let roles = match map.get("roles") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items.clone(),
            Some(other) => {
                return Err(error(
                    format!("{path}roles"),
                    format!("{other}: must be a list"),
                ));
            }
        };
        let mut mappings = Vec::new();
        for (i, item) in roles.iter().enumerate() {
            let at = format!("{path}roles[{i}].");
            let entry = item
                .as_object()
                .ok_or_else(|| error(format!("{path}roles[{i}]"), "must be an object"))?;
            if let Some(key) = entry
                .keys()
                .find(|k| !["groups", "subjects", "role", "fleets"].contains(&k.as_str()))
            {
                return Err(error(
                    format!("{at}{key}"),
                    "unknown field; the fields are groups, subjects, role, fleets",
                ));
            }
            let groups = strings(entry, &at, "groups")?;
            let subjects = strings(entry, &at, "subjects")?;
            if groups.is_empty() && subjects.is_empty() {
                return Err(error(
                    format!("{path}roles[{i}]"),
                    "needs groups or subjects: a mapping that names nobody would grant nothing (there is no default role)",
                ));
            }
            let role_text = string(entry, &at, "role")?
                .ok_or_else(|| error(format!("{at}role"), "is required"))?;
            let role = Role::parse(&role_text).ok_or_else(|| {
                error(
                    format!("{at}role"),
                    format!("{role_text:?}: must be reader, operator, approver or admin"),
                )
            })?;
            let fleets = match entry.get("fleets") {
                None | Some(Value::Null) => vec![FleetPattern::parse(&format!("{at}fleets"), "*")?],
                Some(Value::String(one)) => vec![FleetPattern::parse(&format!("{at}fleets"), one)?],
                Some(_) => {
                    let texts = strings(entry, &at, "fleets")?;
                    if texts.is_empty() {
                        return Err(error(
                            format!("{at}fleets"),
                            "must name at least one fleet pattern",
                        ));
                    }
                    texts
                        .iter()
                        .enumerate()
                        .map(|(j, t)| FleetPattern::parse(&format!("{at}fleets[{j}]"), t))
                        .collect::<Result<_, _>>()?
                }
            };
            mappings.push(Mapping {
                groups,
                subjects,
                role,
                fleets,
            });
        }
        Ok(ProviderConfig {
            name: name.to_string(),
            source,
            issuer,
            audience,
            client_id,
            client_secret,
            cli_client_id,
            user_claim,
            groups_claim,
            scopes,
            mappings,
        })
    }

    /// The properties as the API shows them (the secret's reference, never a secret).
    pub fn to_properties(&self) -> Value {
        let mut map = Map::new();
        map.insert("issuer".into(), self.issuer.clone().into());
        map.insert("audience".into(), self.audience.clone().into());
        if let Some(id) = &self.client_id {
            map.insert("clientId".into(), id.clone().into());
        }
        match &self.client_secret {
            Some(SecretRef::Env(name)) => {
                map.insert("clientSecret".into(), serde_json::json!({"env": name}));
            }
            Some(SecretRef::File(path)) => {
                map.insert(
                    "clientSecret".into(),
                    serde_json::json!({"file": path.display().to_string()}),
                );
            }
            None => {}
        }
        if let Some(id) = &self.cli_client_id {
            map.insert("cliClientId".into(), id.clone().into());
        }
        map.insert("userClaim".into(), self.user_claim.clone().into());
        map.insert("groupsClaim".into(), self.groups_claim.clone().into());
        map.insert("scopes".into(), self.scopes.clone().into());
        let roles: Vec<Value> = self
            .mappings
            .iter()
            .map(|m| {
                let mut entry = Map::new();
                if !m.groups.is_empty() {
                    entry.insert("groups".into(), m.groups.clone().into());
                }
                if !m.subjects.is_empty() {
                    entry.insert("subjects".into(), m.subjects.clone().into());
                }
                entry.insert("role".into(), m.role.name().into());
                entry.insert(
                    "fleets".into(),
                    m.fleets
                        .iter()
                        .map(|f| f.as_str().to_string())
                        .collect::<Vec<_>>()
                        .into(),
                );
                Value::Object(entry)
            })
            .collect();
        map.insert("roles".into(), roles.into());
        map.insert("source".into(), self.source.name().into());
        Value::Object(map)
    }

    /// The groups a token's claims list (a list of strings, or one string).
    pub fn groups(&self, claims: &Map<String, Value>) -> Vec<String> {
        match claims.get(&self.groups_claim) {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            Some(Value::String(one)) => vec![one.clone()],
            _ => Vec::new(),
        }
    }

    /// What verified claims grant: every mapping whose groups hold one of the token's groups,
    /// or whose subjects match its `sub`, gives its role on its fleet patterns. Empty: nothing.
    pub fn grants(&self, claims: &Map<String, Value>) -> Vec<Grant> {
        let groups = self.groups(claims);
        let sub = claims.get("sub").and_then(Value::as_str).unwrap_or("");
        let mut grants = Vec::new();
        for mapping in &self.mappings {
            let by_group = mapping.groups.iter().any(|g| groups.contains(g));
            let by_subject = !sub.is_empty() && mapping.subjects.iter().any(|s| glob(s, sub));
            if by_group || by_subject {
                for fleets in &mapping.fleets {
                    grants.push(Grant {
                        fleets: fleets.clone(),
                        role: mapping.role,
                    });
                }
            }
        }
        grants
    }

    /// Who the claims name, for the audit trail, gates and logs: the user claim, the `sub`
    /// and the issuer (`alice (sub 1234, https://idp.example)`), at most 256 characters
    /// without control characters.
    pub fn subject(&self, claims: &Map<String, Value>) -> String {
        let sub = claims.get("sub").and_then(Value::as_str).unwrap_or("");
        let user = claims
            .get(&self.user_claim)
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .unwrap_or(sub);
        let text = if user == sub {
            format!("{sub} ({})", self.issuer)
        } else {
            format!("{user} (sub {sub}, {})", self.issuer)
        };
        let clean: String = text
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        clean.chars().take(crate::principal::SUBJECT_MAX).collect()
    }
}
