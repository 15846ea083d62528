//! The `aks` driver (API.md, "Driver `aks`, in full"): Azure Kubernetes Service clusters upgraded
//! through Azure Resource Manager, with nothing else installed.
//!
//! - Credentials: a client secret, a managed identity, a workload identity (a federated token
//!   file) or the Azure CLI's token; a token is kept until shortly before it expires, and a 401
//!   gets a new one once.
//! - Observe: the managed cluster (its region, versions, agent pools with their own Kubernetes
//!   versions) and its two maintenance configurations as the member's windows.
//! - Upgrade: ControlPlaneOnly and Full are a PUT of the managed cluster (Full also moves every
//!   agent pool's `orchestratorVersion`); NodeImageOnly is each pool's `upgradeNodeImageVersion`.
//!   In a chained run (SEMANTICS §13) each hop is one such PUT to the hop's version, under the
//!   hop's own attempt key; AKS refuses a PUT that skips a minor (400 `OperationNotAllowed`),
//!   which is a permanent answer.
//!   The PUT carries the attempt's key as the tag `flotilla-operation`, so a resend finds the
//!   upgrade it started and attaches to it instead of starting another.
//! - Rollback (SEMANTICS §15; AKS's "Roll back node pool versions", API 2026-04-01): each
//!   agent pool's upgrade profile lists its `recentlyUsedVersions` (`orchestratorVersion`,
//!   `nodeImageVersion`, `timestamp`), which AKS keeps for seven days after the upgrade that left
//!   them; `observe` offers the newest as a NodePool rollback until its timestamp plus seven
//!   days. A node-pool rollback is a PUT of the agent pool with those two versions (the
//!   documented REST path: `nodeImageVersion` is writable for rollback from 2026-04-01), tagged
//!   with the attempt's key like a cluster PUT, and followed like any long-running operation.
//!   AKS rolls no control plane back: such a target is refused as a permanent error.
//! - Long-running operations are followed through `Azure-AsyncOperation` (or `Location`); 429
//!   waits for `Retry-After`; 409 because another operation runs attaches when it is ours and
//!   is otherwise transient (asked again later).
//! - Catalog: the Kubernetes versions and node images of every region a member was seen in,
//!   from ARM's listings, kept for `catalogRefreshSeconds`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use flotilla_engine::engine::{Rollback, Target};
use flotilla_engine::error::from_json_value;
use flotilla_engine::fleet::{
    Catalog, CatalogSpec, ClusterSpec, KubeReleaseSpec, MaintenanceSpec, NodePoolSpec,
    RegionCatalogSpec, RollbackOfferSpec, RollbackScope, RollbackToSpec,
};
use flotilla_engine::strategy::UpgradeType;
use flotilla_engine::time::Time;
use flotilla_engine::version::{ImageVersion, KubeVersion};
use flotilla_engine::window::MaintenanceWindowSpec;

use crate::{Driver, DriverError, MemberRef, OperationState, bounded_seconds, operation_deadline};

/// The AKS API version the driver speaks (stable).
const API_VERSION: &str = "2025-07-01";
/// The first stable API version with node pool rollback: an agent pool's upgrade profile lists
/// `recentlyUsedVersions`, and an agent pool's `nodeImageVersion` is writable (AKS's "Roll back
/// node pool versions" names 2026-04-01 or later). Only the rollback's requests use it.
const ROLLBACK_API_VERSION: &str = "2026-04-01";
/// How long after an upgrade AKS keeps the versions it left for a rollback ("available only
/// for seven days after upgrade completion").
const ROLLBACK_WINDOW_SECONDS: i64 = 7 * 86_400;
/// The tag a PUT carries with the attempt's key.
const OPERATION_TAG: &str = "flotilla-operation";
/// How many times a throttled (429) request is retried within one call before it is transient.
const THROTTLE_RETRIES: u32 = 3;
/// The longest a `Retry-After` is waited for within a call; longer, the call is transient.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// A token is renewed this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AksConfig {
    #[serde(rename = "type")]
    _kind: String,
    credential: Value,
    #[serde(default)]
    arm_endpoint: Option<String>,
    #[serde(default)]
    authority_host: Option<String>,
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default = "default_poll")]
    poll_interval_seconds: f64,
    #[serde(default = "default_catalog_refresh")]
    catalog_refresh_seconds: f64,
    #[serde(default = "crate::default_deadline")]
    operation_deadline_seconds: f64,
    #[serde(default)]
    discover: Option<DiscoverConfig>,
}

/// `discover`: where to look for clusters, which to take, and how often.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DiscoverConfig {
    subscriptions: Vec<String>,
    #[serde(default)]
    resource_groups: Vec<String>,
    #[serde(default)]
    tag_selector: Option<String>,
    #[serde(default)]
    group_tag: Option<String>,
    #[serde(default)]
    interval_seconds: f64,
}

/// `discover`, checked.
struct Discover {
    subscriptions: Vec<String>,
    resource_groups: Vec<String>,
    selector: Option<flotilla_engine::selector::Selector>,
    group_tag: Option<String>,
    every: Option<Duration>,
}

impl Discover {
    fn parse(config: &DiscoverConfig) -> Result<Discover, DriverError> {
        const P: &str = "properties.driver.discover";
        if config.subscriptions.is_empty() {
            return Err(DriverError::permanent(format!(
                "{P}.subscriptions: name at least one"
            )));
        }
        let segment = |v: &String, field: &str| {
            if v.is_empty() || v.contains(['/', '?', '#', '&']) || v.chars().any(char::is_control) {
                Err(DriverError::permanent(format!(
                    "{P}.{field} {v:?}: not a valid name"
                )))
            } else {
                Ok(())
            }
        };
        for s in &config.subscriptions {
            segment(s, "subscriptions")?;
        }
        for g in &config.resource_groups {
            segment(g, "resourceGroups")?;
        }
        let selector = config
            .tag_selector
            .as_deref()
            .map(flotilla_engine::selector::Selector::parse)
            .transpose()
            .map_err(|e| DriverError::permanent(format!("{P}.tagSelector: {e}")))?;
        let every = bounded_seconds(
            config.interval_seconds,
            &format!("{P}.intervalSeconds"),
            0.0,
            7.0 * 86_400.0,
        )?;
        Ok(Discover {
            subscriptions: config.subscriptions.clone(),
            resource_groups: config.resource_groups.clone(),
            selector,
            group_tag: config.group_tag.clone(),
            every: (every > 0.0).then(|| Duration::from_secs_f64(every.max(60.0))),
        })
    }
}

fn default_poll() -> f64 {
    30.0
}

fn default_catalog_refresh() -> f64 {
    3600.0
}

/// How the driver gets its tokens.
#[derive(Clone, Debug, PartialEq)]
enum Credential {
    ClientSecret {
        tenant: String,
        client: String,
        secret: Secret,
    },
    ManagedIdentity {
        client: Option<String>,
        endpoint: String,
    },
    WorkloadIdentity {
        tenant: String,
        client: String,
        token_file: String,
    },
    AzureCli,
}

/// Where a client secret is read from, at each token request (a rotated secret is picked up).
#[derive(Clone, Debug, PartialEq)]
enum Secret {
    File(String),
    Env(String),
}

impl Credential {
    fn parse(value: &Value) -> Result<Credential, DriverError> {
        const P: &str = "properties.driver.credential";
        let field = |name: &str| value.get(name).and_then(Value::as_str).map(String::from);
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let required = |name: &str, from_env: Option<&str>| {
            field(name)
                .or_else(|| from_env.and_then(env))
                .ok_or_else(|| {
                    DriverError::permanent(format!(
                        "{P}.{name}: required{}",
                        from_env
                            .map(|e| format!(" (or the environment variable {e})"))
                            .unwrap_or_default()
                    ))
                })
        };
        let allowed = |keys: &[&str]| -> Result<(), DriverError> {
            for key in value.as_object().into_iter().flat_map(|m| m.keys()) {
                if key != "type" && !keys.contains(&key.as_str()) {
                    return Err(DriverError::permanent(format!(
                        "{P}.{key}: unknown field; this credential takes {}",
                        keys.join(", ")
                    )));
                }
            }
            Ok(())
        };
        match value.get("type").and_then(Value::as_str) {
            Some("ClientSecret") => {
                allowed(&[
                    "tenantId",
                    "clientId",
                    "clientSecretFile",
                    "clientSecretEnv",
                ])?;
                let secret = match (field("clientSecretFile"), field("clientSecretEnv")) {
                    (Some(f), None) => Secret::File(f),
                    (None, Some(e)) => Secret::Env(e),
                    _ => {
                        return Err(DriverError::permanent(format!(
                            "{P}: give exactly one of clientSecretFile and clientSecretEnv (a secret is never written into a fleet)"
                        )));
                    }
                };
                Ok(Credential::ClientSecret {
                    tenant: required("tenantId", None)?,
                    client: required("clientId", None)?,
                    secret,
                })
            }
            Some("ManagedIdentity") => {
                allowed(&["clientId", "identityEndpoint"])?;
                Ok(Credential::ManagedIdentity {
                    client: field("clientId"),
                    endpoint: field("identityEndpoint").unwrap_or_else(|| {
                        "http://169.254.169.254/metadata/identity/oauth2/token".into()
                    }),
                })
            }
            Some("WorkloadIdentity") => {
                allowed(&["tenantId", "clientId", "tokenFile"])?;
                Ok(Credential::WorkloadIdentity {
                    tenant: required("tenantId", Some("AZURE_TENANT_ID"))?,
                    client: required("clientId", Some("AZURE_CLIENT_ID"))?,
                    token_file: required("tokenFile", Some("AZURE_FEDERATED_TOKEN_FILE"))?,
                })
            }
            Some("AzureCli") => {
                allowed(&[])?;
                Ok(Credential::AzureCli)
            }
            other => {
                const TYPES: &str = "ClientSecret, ManagedIdentity, WorkloadIdentity or AzureCli";
                Err(DriverError::permanent(match other {
                    Some(t) => format!("{P}.type: {t:?} is not a credential type: {TYPES}"),
                    None => format!("{P}.type is required: {TYPES}"),
                }))
            }
        }
    }
}

/// An endpoint the driver may call: `https://`, or `http://` to a loopback address only (a
/// token must not cross a network in the clear).
fn endpoint(text: &str, field: &str) -> Result<String, DriverError> {
    let url = reqwest::Url::parse(text)
        .map_err(|e| DriverError::permanent(format!("{field} {text:?}: not a URL: {e}")))?;
    let host = url.host_str().unwrap_or_default();
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => {
            return Err(DriverError::permanent(format!(
                "{field} {text:?}: must be https:// (http:// only to a loopback address)"
            )));
        }
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// A managed cluster's ARM id, split: `/subscriptions/{s}/resourceGroups/{g}/providers/
/// Microsoft.ContainerService/managedClusters/{name}`.
fn subscription_of(id: &str) -> Result<&str, DriverError> {
    let parts: Vec<&str> = id.trim_start_matches('/').split('/').collect();
    let ok = parts.len() == 8
        && parts[0].eq_ignore_ascii_case("subscriptions")
        && parts[2].eq_ignore_ascii_case("resourceGroups")
        && parts[4].eq_ignore_ascii_case("providers")
        && parts[5].eq_ignore_ascii_case("Microsoft.ContainerService")
        && parts[6].eq_ignore_ascii_case("managedClusters")
        && parts
            .iter()
            .all(|p| !p.is_empty() && !p.contains(['?', '#']));
    if ok {
        Ok(parts[1])
    } else {
        Err(DriverError::permanent(format!(
            "clusterResourceId {id:?}: not the ARM id of an AKS cluster (/subscriptions/…/resourceGroups/…/providers/Microsoft.ContainerService/managedClusters/NAME)"
        )))
    }
}

/// What `start_upgrade` answers and `poll` reads back: how to follow the operation.
#[derive(Debug, PartialEq, serde::Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Follow {
    /// ARM's operation status URLs (`Azure-AsyncOperation`, else `Location`), one per request.
    Async(Vec<String>),
    /// The cluster itself: upgrading under the attempt's tag, then at the target.
    Cluster {
        kubernetes_version: Option<String>,
        pools: bool,
    },
    /// One agent pool, rolled back: busy, then at exactly these versions.
    Pool {
        pool: String,
        orchestrator_version: String,
        node_image_version: String,
    },
}

/// A token and when to stop using it.
struct Token {
    value: String,
    renew_at: Instant,
}

pub struct AksDriver {
    http: reqwest::Client,
    arm: String,
    authority: String,
    credential: Credential,
    token: tokio::sync::Mutex<Option<Token>>,
    poll_interval: Duration,
    catalog_refresh: Duration,
    deadline: Duration,
    /// The catalog as last listed, and when.
    catalog: tokio::sync::Mutex<Option<(Instant, Catalog)>>,
    /// `(subscription, region)` of every cluster observed: where the catalog is listed.
    seen: Mutex<BTreeSet<(String, String)>>,
    discover: Option<Discover>,
}

/// An ARM answer: its status, headers and JSON body.
struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    /// ARM's error, `code: message`, or the status.
    fn error(&self) -> String {
        let e = &self.body["error"];
        match (e["code"].as_str(), e["message"].as_str()) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            _ => format!("HTTP {}", self.status),
        }
    }

    fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }
}

impl AksDriver {
    pub fn new(config: &Value) -> Result<AksDriver, DriverError> {
        let config: AksConfig = from_json_value(config.clone(), "properties.driver")
            .map_err(|e| DriverError::permanent(e.message))?;
        let credential = Credential::parse(&config.credential)?;
        let arm = endpoint(
            config
                .arm_endpoint
                .as_deref()
                .unwrap_or("https://management.azure.com"),
            "properties.driver.armEndpoint",
        )?;
        let authority = endpoint(
            config
                .authority_host
                .as_deref()
                .unwrap_or("https://login.microsoftonline.com"),
            "properties.driver.authorityHost",
        )?;
        if let Credential::ManagedIdentity { endpoint: e, .. } = &credential {
            // The instance metadata service is plain HTTP on a link-local address by design.
            if !e.starts_with("http://169.254.169.254/") {
                endpoint(e, "properties.driver.credential.identityEndpoint")?;
            }
        }
        let mut http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10));
        if let Some(path) = &config.ca_file {
            let field = "properties.driver.caFile";
            let pem = std::fs::read(path)
                .map_err(|e| DriverError::permanent(format!("{field} {path:?}: {e}")))?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                DriverError::permanent(format!("{field} {path:?}: not PEM certificates: {e}"))
            })?;
            for certificate in certificates {
                http = http.add_root_certificate(certificate);
            }
        }
        let http = http
            .build()
            .map_err(|e| DriverError::permanent(format!("cannot set up HTTPS: {e}")))?;
        let seconds = |v: f64, field: &str, min: f64, max: f64| {
            bounded_seconds(v, &format!("properties.driver.{field}"), min, max)
                .map(Duration::from_secs_f64)
        };
        Ok(AksDriver {
            http,
            arm,
            authority,
            credential,
            token: tokio::sync::Mutex::new(None),
            poll_interval: seconds(
                config.poll_interval_seconds,
                "pollIntervalSeconds",
                0.05,
                3600.0,
            )?,
            catalog_refresh: seconds(
                config.catalog_refresh_seconds,
                "catalogRefreshSeconds",
                0.0,
                7.0 * 86_400.0,
            )?,
            deadline: operation_deadline(config.operation_deadline_seconds)?,
            catalog: tokio::sync::Mutex::new(None),
            seen: Mutex::new(BTreeSet::new()),
            discover: config.discover.as_ref().map(Discover::parse).transpose()?,
        })
    }

    // -----------------------------------------------------------------------------------------
    // Tokens.

    /// A token for ARM: the one kept, or a new one.
    async fn token(&self) -> Result<String, DriverError> {
        let mut kept = self.token.lock().await;
        if let Some(t) = kept.as_ref().filter(|t| Instant::now() < t.renew_at) {
            return Ok(t.value.clone());
        }
        let (value, lifetime) = self.new_token().await?;
        *kept = Some(Token {
            value: value.clone(),
            renew_at: Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN),
        });
        Ok(value)
    }

    async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    /// Asks the credential's issuer: the token and how long it lives.
    async fn new_token(&self) -> Result<(String, Duration), DriverError> {
        let scope = format!("{}/.default", self.arm);
        let resource = format!("{}/", self.arm);
        let answer = match &self.credential {
            Credential::ClientSecret {
                tenant,
                client,
                secret,
            } => {
                let secret = match secret {
                    Secret::File(path) => std::fs::read_to_string(path)
                        .map(|s| s.trim().to_string())
                        .map_err(|e| {
                            DriverError::transient(format!("clientSecretFile {path:?}: {e}"))
                        })?,
                    Secret::Env(name) => std::env::var(name).map_err(|_| {
                        DriverError::transient(format!(
                            "clientSecretEnv: the environment variable {name} is not set"
                        ))
                    })?,
                };
                self.form_token(
                    tenant,
                    &[
                        ("grant_type", "client_credentials"),
                        ("client_id", client),
                        ("client_secret", &secret),
                        ("scope", &scope),
                    ],
                )
                .await?
            }
            Credential::WorkloadIdentity {
                tenant,
                client,
                token_file,
            } => {
                // Read at each request: the platform rotates the file.
                let assertion = std::fs::read_to_string(token_file)
                    .map(|s| s.trim().to_string())
                    .map_err(|e| {
                        DriverError::transient(format!("tokenFile {token_file:?}: {e}"))
                    })?;
                self.form_token(
                    tenant,
                    &[
                        ("grant_type", "client_credentials"),
                        ("client_id", client),
                        (
                            "client_assertion_type",
                            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                        ),
                        ("client_assertion", &assertion),
                        ("scope", &scope),
                    ],
                )
                .await?
            }
            Credential::ManagedIdentity { client, endpoint } => {
                let mut query = vec![("api-version", "2018-02-01"), ("resource", &*resource)];
                if let Some(c) = client {
                    query.push(("client_id", c));
                }
                let url = format!("{endpoint}?{}", form(&query));
                let response = self
                    .http
                    .get(url)
                    .header("Metadata", "true")
                    .send()
                    .await
                    .map_err(|e| DriverError::transient(format!("managed identity: {e}")))?;
                token_answer(response, "managed identity").await?
            }
            Credential::AzureCli => {
                let output = tokio::process::Command::new("az")
                    .args([
                        "account",
                        "get-access-token",
                        "--resource",
                        &resource,
                        "-o",
                        "json",
                    ])
                    .kill_on_drop(true)
                    .output()
                    .await
                    .map_err(|e| {
                        DriverError::transient(format!("az account get-access-token: {e}"))
                    })?;
                if !output.status.success() {
                    return Err(DriverError::transient(format!(
                        "az account get-access-token: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    )));
                }
                serde_json::from_slice(&output.stdout).map_err(|e| {
                    DriverError::transient(format!("az account get-access-token: {e}"))
                })?
            }
        };
        let value = answer["access_token"]
            .as_str()
            .or(answer["accessToken"].as_str())
            .ok_or_else(|| DriverError::transient("the token answer holds no access_token"))?
            .to_string();
        // `expires_in` is a number or a string of one; the CLI gives `expires_on` (epoch).
        let number = |v: &Value| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        };
        let lifetime = number(&answer["expires_in"])
            .or_else(|| {
                let on = number(&answer["expires_on"])?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()?
                    .as_secs();
                Some(on.saturating_sub(now))
            })
            .unwrap_or(3600);
        Ok((value, Duration::from_secs(lifetime)))
    }

    /// Microsoft Entra's token endpoint with a form.
    async fn form_token(
        &self,
        tenant: &str,
        fields: &[(&str, &str)],
    ) -> Result<Value, DriverError> {
        let url = format!("{}/{tenant}/oauth2/v2.0/token", self.authority);
        let response = self
            .http
            .post(url)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(form(fields))
            .send()
            .await
            .map_err(|e| DriverError::transient(format!("token endpoint: {e}")))?;
        token_answer(response, "token endpoint").await
    }

    // -----------------------------------------------------------------------------------------
    // ARM requests.

    /// One ARM request, with a token: a 401 gets a new token once, a 429 waits for its
    /// `Retry-After` (a few times, then transient), a 5xx or a network error is transient.
    /// Other answers, 404 and 409 included, are the caller's to read.
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, DriverError> {
        let mut refreshed = false;
        let mut throttled = 0;
        loop {
            let token = self.token().await?;
            let mut request = self.http.request(method.clone(), url).bearer_auth(token);
            if let Some(b) = body {
                request = request.json(b);
            }
            let response = request
                .send()
                .await
                .map_err(|e| DriverError::transient(format!("{method} {url}: {e}")))?;
            let status = response.status();
            let headers = response.headers().clone();
            let text = response.text().await.unwrap_or_default();
            let answer = Answer {
                status,
                headers,
                body: serde_json::from_str(&text).unwrap_or(Value::Null),
            };
            match status {
                StatusCode::UNAUTHORIZED if !refreshed => {
                    refreshed = true;
                    self.forget_token().await;
                }
                StatusCode::TOO_MANY_REQUESTS if throttled < THROTTLE_RETRIES => {
                    throttled += 1;
                    let wait = retry_after(&answer.headers).unwrap_or(Duration::from_secs(5));
                    if wait > MAX_RETRY_AFTER {
                        return Err(DriverError::transient(format!(
                            "{method} {url}: throttled for {}s",
                            wait.as_secs()
                        )));
                    }
                    tokio::time::sleep(wait).await;
                }
                s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                    return Err(DriverError::transient(format!(
                        "{method} {url}: {}",
                        answer.error()
                    )));
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    // Access is a configuration the user fixes; until then, asked again.
                    return Err(DriverError::transient(format!(
                        "{method} {url}: {} (does the identity have the role docs/drivers.md names?)",
                        answer.error()
                    )));
                }
                _ => return Ok(answer),
            }
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}?api-version={API_VERSION}", self.arm)
    }

    fn rollback_url(&self, path: &str) -> String {
        format!("{}{path}?api-version={ROLLBACK_API_VERSION}", self.arm)
    }

    /// What AKS would roll `pool` back to, and until when: the newest of its upgrade profile's
    /// `recentlyUsedVersions` (the one `az aks nodepool rollback` takes), until its timestamp
    /// plus seven days. AKS lists nothing once the window has passed. An entry that cannot be
    /// read offers nothing; an answer other than the profile (the pool gone, an API version
    /// this ARM does not serve) offers nothing either. A transient error is the caller's.
    async fn rollback_offer(
        &self,
        id: &str,
        pool: &str,
    ) -> Result<Option<RollbackOfferSpec>, DriverError> {
        let path = format!("{id}/agentPools/{pool}/upgradeProfiles/default");
        let answer = self
            .call(Method::GET, &self.rollback_url(&path), None)
            .await?;
        if !answer.status.is_success() {
            return Ok(None);
        }
        let newest = answer.body["properties"]["recentlyUsedVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| {
                let version = v["orchestratorVersion"].as_str()?;
                let image = v["nodeImageVersion"].as_str()?;
                let at = Time::parse(v["timestamp"].as_str()?).ok()?;
                // Only what the engine can read is offered.
                KubeVersion::parse(version)?;
                ImageVersion::parse(image.rsplit('-').next().unwrap_or(image))?;
                Some((at, version, image))
            })
            .max_by_key(|(at, _, _)| *at);
        Ok(newest.map(|(at, version, image)| RollbackOfferSpec {
            scope: "NodePool".into(),
            pool: Some(pool.to_string()),
            to: RollbackToSpec {
                kubernetes_version: None,
                orchestrator_version: Some(version.to_string()),
                node_image_version: Some(image.to_string()),
            },
            until: at.plus(ROLLBACK_WINDOW_SECONDS).to_string(),
        }))
    }

    /// The managed cluster as ARM has it.
    async fn cluster(&self, id: &str) -> Result<Value, DriverError> {
        subscription_of(id)?;
        let answer = self.call(Method::GET, &self.url(id), None).await?;
        match answer.status {
            s if s.is_success() => Ok(answer.body),
            StatusCode::NOT_FOUND => Err(DriverError::permanent(format!(
                "cluster {id} does not exist (or the identity cannot see it): {}",
                answer.error()
            ))),
            _ => Err(DriverError::permanent(format!(
                "GET {id}: {}",
                answer.error()
            ))),
        }
    }

    /// A maintenance configuration's window, if the cluster has that configuration.
    async fn window(
        &self,
        id: &str,
        name: &str,
    ) -> Result<Option<MaintenanceWindowSpec>, DriverError> {
        let answer = self
            .call(
                Method::GET,
                &self.url(&format!("{id}/maintenanceConfigurations/{name}")),
                None,
            )
            .await?;
        match answer.status {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => {
                let window = answer.body["properties"]["maintenanceWindow"].clone();
                if window.is_null() {
                    return Ok(None);
                }
                // A window that cannot be read is not ignored: upgrading outside it is worse
                // than not upgrading.
                from_json_value(
                    window,
                    &format!("maintenanceConfigurations/{name}.properties.maintenanceWindow"),
                )
                .map(Some)
                .map_err(|e| DriverError::permanent(e.message))
            }
            _ => Err(DriverError::permanent(format!(
                "GET {id}/maintenanceConfigurations/{name}: {}",
                answer.error()
            ))),
        }
    }

    /// The operation status URL of an accepted request.
    fn follow_url(answer: &Answer) -> Option<String> {
        ["azure-asyncoperation", "location"]
            .iter()
            .find_map(|h| answer.headers.get(*h)?.to_str().ok().map(String::from))
    }

    /// Sends the PUT of the cluster at `version` (every pool too for Full), tagged with `key`.
    async fn put_version(
        &self,
        id: &str,
        mut cluster: Value,
        version: &str,
        pools: bool,
        key: &str,
    ) -> Result<Follow, DriverError> {
        cluster["properties"]["kubernetesVersion"] = json!(version);
        if pools {
            for pool in cluster["properties"]["agentPoolProfiles"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                pool["orchestratorVersion"] = json!(version);
            }
        }
        if !cluster["tags"].is_object() {
            cluster["tags"] = json!({});
        }
        cluster["tags"][OPERATION_TAG] = json!(key);
        // What ARM computes is not sent back.
        if let Some(p) = cluster["properties"].as_object_mut() {
            for readonly in [
                "provisioningState",
                "powerState",
                "currentKubernetesVersion",
                "fqdn",
                "azurePortalFQDN",
                "maxAgentPools",
            ] {
                p.remove(readonly);
            }
        }
        let answer = self
            .call(Method::PUT, &self.url(id), Some(&cluster))
            .await?;
        let target = Follow::Cluster {
            kubernetes_version: Some(version.to_string()),
            pools,
        };
        match answer.status {
            s if s.is_success() => Ok(Self::follow_url(&answer)
                .map(|u| Follow::Async(vec![u]))
                .unwrap_or(target)),
            StatusCode::CONFLICT => self.conflict(id, key, version, &answer, target).await,
            _ => Err(DriverError::permanent(format!(
                "PUT {id}: {}",
                answer.error()
            ))),
        }
    }

    /// A 409: another operation runs on the cluster. Ours (`ours`): attach. Someone else's:
    /// asked again later.
    async fn conflict(
        &self,
        id: &str,
        key: &str,
        version: &str,
        answer: &Answer,
        target: Follow,
    ) -> Result<Follow, DriverError> {
        if ours(&self.cluster(id).await?, key, version) {
            return Ok(target);
        }
        Err(DriverError::transient(format!(
            "another operation is in progress on {id}; waiting for it ({}, {})",
            answer.error_code(),
            answer.error()
        )))
    }

    /// The newest node image of `family` in `region`, from the catalog.
    async fn newest_image(
        &self,
        region: &str,
        family: &str,
    ) -> Result<Option<String>, DriverError> {
        let catalog = self.catalog().await?;
        Ok(catalog
            .regions
            .get(region)
            .and_then(|r| r.node_images.get(family))
            .and_then(|list| list.iter().map(|i| &i.version).max())
            .map(ToString::to_string))
    }

    /// NodeImageOnly: each pool not at its region's newest image gets `upgradeNodeImageVersion`
    /// (pools upgrade side by side); a pool already upgrading is attached to, and one already at
    /// the newest is left alone, so a resend starts nothing twice.
    async fn upgrade_images(
        &self,
        id: &str,
        cluster: &Value,
        target: &Target,
    ) -> Result<Follow, DriverError> {
        let region = cluster["location"].as_str().unwrap_or_default();
        let pool_of = |cluster: &Value, name: &str| {
            cluster["properties"]["agentPoolProfiles"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == name)
                .cloned()
        };
        let upgrading = |pool: &Option<Value>| {
            pool.as_ref()
                .is_some_and(|p| p["provisioningState"] == "UpgradingNodeImageVersion")
        };
        let mut follow = Vec::new();
        let mut attached = false;
        for wanted in &target.node_images {
            // `upgradeNodeImageVersion` moves a pool to its region's newest image; a pinned
            // version other than that cannot be had from AKS.
            let newest = self.newest_image(region, &wanted.family).await?;
            if newest.as_deref() != Some(&*wanted.image.to_string()) {
                return Err(DriverError::permanent(format!(
                    "NodeImageSelectionUnsupported: AKS upgrades pool {} to the newest {} image of {region} ({}), not the {} this run selected; use the Latest selection for AKS clusters",
                    wanted.pool,
                    wanted.family,
                    newest.as_deref().unwrap_or("none listed"),
                    wanted.image
                )));
            }
            let pool = pool_of(cluster, &wanted.pool);
            let image = format!("{}-{}", wanted.family, wanted.image);
            if pool
                .as_ref()
                .is_some_and(|p| p["nodeImageVersion"] == image.as_str())
            {
                continue;
            }
            if upgrading(&pool) {
                attached = true;
                continue;
            }
            let path = format!("{id}/agentPools/{}/upgradeNodeImageVersion", wanted.pool);
            let answer = self.call(Method::POST, &self.url(&path), None).await?;
            match answer.status {
                s if s.is_success() => match Self::follow_url(&answer) {
                    Some(u) => follow.push(u),
                    None => attached = true,
                },
                StatusCode::CONFLICT => {
                    // Ours if the pool is upgrading its image now; else someone else's.
                    if !upgrading(&pool_of(&self.cluster(id).await?, &wanted.pool)) {
                        return Err(DriverError::transient(format!(
                            "another operation is in progress on {id}; waiting for it ({})",
                            answer.error()
                        )));
                    }
                    attached = true;
                }
                _ => {
                    return Err(DriverError::permanent(format!(
                        "POST {path}: {}",
                        answer.error()
                    )));
                }
            }
        }
        // Attached to a pool's upgrade, or nothing to send: the cluster tells when it is done.
        Ok(if attached || follow.is_empty() {
            Follow::Cluster {
                kubernetes_version: None,
                pools: true,
            }
        } else {
            Follow::Async(follow)
        })
    }

    /// A node pool's rollback (SEMANTICS §15): a PUT of the agent pool with the Kubernetes
    /// version and node image it goes back to, tagged with the attempt's key. A pool already
    /// there, or rolling back under this key, is attached to, so a resend starts nothing twice.
    /// AKS's refusal (the versions are not the pool's recorded ones, or the seven days have
    /// passed) is a permanent answer carrying AKS's own message; a 409 because another
    /// operation runs is asked again later, like any conflict.
    async fn roll_back_pool(
        &self,
        id: &str,
        cluster: &Value,
        target: &Target,
        rollback: &Rollback,
        key: &str,
    ) -> Result<Follow, DriverError> {
        let RollbackScope::NodePool(name) = &rollback.scope else {
            return Err(DriverError::permanent(
                "AKS offers no rollback of a control plane, only of node pools (to their previous Kubernetes version and node image, within seven days of their upgrade)",
            ));
        };
        let (Some(image), Some(version)) =
            (target.node_images.first(), rollback.orchestrator_version)
        else {
            return Err(DriverError::permanent(format!(
                "the rollback of node pool {name:?} names no node image or no Kubernetes version to go back to"
            )));
        };
        let wanted = Follow::Pool {
            pool: name.clone(),
            orchestrator_version: version.to_string(),
            node_image_version: format!("{}-{}", image.family, image.image),
        };
        let Some(pool) = pool_of(cluster, name) else {
            return Err(DriverError::permanent(format!(
                "cluster {id} has no node pool {name:?} to roll back"
            )));
        };
        if pool["tags"][OPERATION_TAG] == key || (pool_at(&pool, &wanted) && pool_idle(&pool)) {
            return Ok(wanted);
        }
        let path = format!("{id}/agentPools/{name}");
        let answer = self
            .call(Method::GET, &self.rollback_url(&path), None)
            .await?;
        if !answer.status.is_success() {
            return Err(DriverError::permanent(format!(
                "GET {path}: {}",
                answer.error()
            )));
        }
        let mut body = answer.body;
        let Some(properties) = body["properties"].as_object_mut() else {
            return Err(DriverError::permanent(format!(
                "GET {path}: the answer holds no properties"
            )));
        };
        // What ARM computes is not sent back.
        for readonly in ["provisioningState", "currentOrchestratorVersion"] {
            properties.remove(readonly);
        }
        properties.insert("orchestratorVersion".into(), json!(version.to_string()));
        if let Follow::Pool {
            node_image_version, ..
        } = &wanted
        {
            properties.insert("nodeImageVersion".into(), json!(node_image_version));
        }
        let tags = properties.entry("tags").or_insert_with(|| json!({}));
        if !tags.is_object() {
            *tags = json!({});
        }
        tags[OPERATION_TAG] = json!(key);
        let answer = self
            .call(Method::PUT, &self.rollback_url(&path), Some(&body))
            .await?;
        match answer.status {
            s if s.is_success() => Ok(Self::follow_url(&answer)
                .map(|u| Follow::Async(vec![u]))
                .unwrap_or(wanted)),
            StatusCode::CONFLICT => {
                // Ours if the pool carries our key now (an earlier send that arrived).
                let now = self.cluster(id).await?;
                if pool_of(&now, name).is_some_and(|p| p["tags"][OPERATION_TAG] == key) {
                    return Ok(wanted);
                }
                Err(DriverError::transient(format!(
                    "another operation is in progress on {id}; waiting for it before rolling node pool {name:?} back ({})",
                    answer.error()
                )))
            }
            _ => Err(DriverError::permanent(format!(
                "AKS refused to roll node pool {name:?} back to Kubernetes {version}, node image {}-{}: {}",
                image.family,
                image.image,
                answer.error()
            ))),
        }
    }

    /// The cluster's progress toward `follow`'s target, read from the cluster itself.
    async fn cluster_progress(
        &self,
        id: &str,
        follow: &Follow,
    ) -> Result<OperationState, DriverError> {
        let cluster = self.cluster(id).await?;
        if let Follow::Pool { pool, .. } = follow {
            let Some(p) = pool_of(&cluster, pool) else {
                return Ok(OperationState::Failed(format!(
                    "node pool {pool:?} of {id} is gone"
                )));
            };
            return Ok(match p["provisioningState"].as_str() {
                Some("Failed") => OperationState::Failed(format!(
                    "node pool {pool:?}'s provisioning state is Failed ({id})"
                )),
                _ if !pool_idle(&p) => OperationState::Running,
                _ if pool_at(&p, follow) => OperationState::Succeeded,
                _ => OperationState::Failed(format!(
                    "node pool {pool:?} of {id} is at Kubernetes {}, node image {}, not where its rollback was to take it",
                    p["currentOrchestratorVersion"]
                        .as_str()
                        .unwrap_or("unknown"),
                    p["nodeImageVersion"].as_str().unwrap_or("unknown")
                )),
            });
        }
        let state = cluster["properties"]["provisioningState"]
            .as_str()
            .unwrap_or_default();
        let pools_busy = cluster["properties"]["agentPoolProfiles"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| !matches!(p["provisioningState"].as_str(), None | Some("Succeeded")));
        Ok(match state {
            "Failed" => {
                OperationState::Failed(format!("the cluster's provisioning state is Failed ({id})"))
            }
            "Succeeded" if !pools_busy && at(&cluster, follow) => OperationState::Succeeded,
            _ => OperationState::Running,
        })
    }
}

/// `k=v&k2=v2`, each part percent-encoded.
fn form(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A token endpoint's JSON answer, or why not (a 4xx is a configuration to fix: transient,
/// so a run waits for the fix rather than failing its members).
async fn token_answer(response: reqwest::Response, what: &str) -> Result<Value, DriverError> {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(body);
    }
    let why = body["error_description"]
        .as_str()
        .or(body["error"].as_str())
        .map(String::from)
        .unwrap_or(text);
    Err(DriverError::transient(format!("{what}: {status}: {why}")))
}

/// `Retry-After` in seconds (ARM sends seconds).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get("retry-after")?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// Whether the upgrade to `version` on this cluster is ours to attach to: sent under our key,
/// or the cluster already moving there (the same target is the same upgrade, whoever asked).
fn ours(cluster: &Value, key: &str, version: &str) -> bool {
    let moving = matches!(
        cluster["properties"]["provisioningState"].as_str(),
        Some("Upgrading" | "Updating")
    );
    cluster["tags"][OPERATION_TAG] == key
        || (moving && cluster["properties"]["kubernetesVersion"] == version)
}

/// Whether the cluster is at `follow`'s target.
fn at(cluster: &Value, follow: &Follow) -> bool {
    match follow {
        Follow::Cluster {
            kubernetes_version: Some(v),
            pools,
        } => {
            cluster["properties"]["currentKubernetesVersion"] == v.as_str()
                && (!pools
                    || cluster["properties"]["agentPoolProfiles"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .all(|p| p["currentOrchestratorVersion"] == v.as_str()))
        }
        // Node images: the pools are done when none is busy (checked by the caller).
        Follow::Cluster {
            kubernetes_version: None,
            ..
        } => true,
        Follow::Async(_) | Follow::Pool { .. } => false,
    }
}

/// The agent pool `name` of a cluster as ARM answers it.
fn pool_of(cluster: &Value, name: &str) -> Option<Value> {
    cluster["properties"]["agentPoolProfiles"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .cloned()
}

/// Whether no operation runs on an agent pool.
fn pool_idle(pool: &Value) -> bool {
    matches!(pool["provisioningState"].as_str(), None | Some("Succeeded"))
}

/// Whether an agent pool runs exactly the versions a `Follow::Pool` takes it to.
fn pool_at(pool: &Value, follow: &Follow) -> bool {
    let Follow::Pool {
        orchestrator_version,
        node_image_version,
        ..
    } = follow
    else {
        return false;
    };
    let running = pool["currentOrchestratorVersion"]
        .as_str()
        .or(pool["orchestratorVersion"].as_str());
    running == Some(orchestrator_version.as_str())
        && pool["nodeImageVersion"] == node_image_version.as_str()
}

/// A pool's Kubernetes version where it differs from the control plane's `control_plane`
/// (SEMANTICS §13: a ControlPlaneOnly upgrade leaves pools behind, and the engine's skew rule
/// reads them). `currentOrchestratorVersion` is what the pool runs, always `major.minor.patch`;
/// `orchestratorVersion` is what was asked for, possibly `major.minor` only, so it is read
/// only when ARM gives no current version.
fn pool_version(pool: &Value, control_plane: &str) -> Option<String> {
    let version = pool["currentOrchestratorVersion"]
        .as_str()
        .or(pool["orchestratorVersion"].as_str())?;
    (version != control_plane).then(|| version.to_string())
}

/// The family of an AKS node image (`AKSUbuntu-2204gen2containerd-202602.10.0` →
/// `AKSUbuntu-2204gen2containerd`).
fn family_of(image: &str) -> &str {
    image.rsplit_once('-').map_or(image, |(family, _)| family)
}

#[async_trait]
impl Driver for AksDriver {
    async fn observe(&self, member: &MemberRef) -> Result<ClusterSpec, DriverError> {
        let id = &member.cluster_resource_id;
        let subscription = subscription_of(id)?.to_string();
        let cluster = self.cluster(id).await?;
        let p = &cluster["properties"];
        let region = cluster["location"].as_str().unwrap_or_default().to_string();
        let version = p["currentKubernetesVersion"]
            .as_str()
            .or(p["kubernetesVersion"].as_str())
            .unwrap_or_default()
            .to_string();
        let node_pools = p["agentPoolProfiles"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|pool| {
                let image = pool["nodeImageVersion"].as_str()?;
                Some(NodePoolSpec {
                    name: pool["name"].as_str().unwrap_or_default().to_string(),
                    family: family_of(image).to_string(),
                    os: pool["osType"].as_str().map(String::from),
                    node_image_version: image.to_string(),
                    orchestrator_version: pool_version(pool, &version),
                })
            })
            .collect();
        let mut rollback = Vec::new();
        for pool in p["agentPoolProfiles"].as_array().into_iter().flatten() {
            if let Some(name) = pool["name"].as_str()
                && let Some(offer) = self.rollback_offer(id, name).await?
            {
                rollback.push(offer);
            }
        }
        let kubernetes = self.window(id, "aksManagedAutoUpgradeSchedule").await?;
        let node_os = self.window(id, "aksManagedNodeOSUpgradeSchedule").await?;
        let maintenance = (kubernetes.is_some() || node_os.is_some()).then_some(MaintenanceSpec {
            kubernetes,
            node_os,
        });
        if let Ok(mut seen) = self.seen.lock() {
            seen.insert((subscription, region.to_ascii_lowercase()));
        }
        Ok(ClusterSpec {
            region: region.to_ascii_lowercase(),
            kubernetes_version: version,
            node_pools,
            maintenance,
            long_term_support: p["supportPlan"] == "AKSLongTermSupport",
            rollback,
        })
    }

    async fn start_upgrade(
        &self,
        member: &MemberRef,
        target: &Target,
        key: &str,
    ) -> Result<String, DriverError> {
        let id = &member.cluster_resource_id;
        let cluster = self.cluster(id).await?;
        if let Some(rollback) = &target.rollback {
            let follow = self
                .roll_back_pool(id, &cluster, target, rollback, key)
                .await?;
            return serde_json::to_string(&follow)
                .map_err(|e| DriverError::permanent(format!("cannot record the operation: {e}")));
        }
        let follow = match (target.upgrade_type, target.kubernetes_version) {
            (UpgradeType::NodeImageOnly, _) => self.upgrade_images(id, &cluster, target).await?,
            (kind, Some(version)) => {
                let version = version.to_string();
                let pools = kind == UpgradeType::Full;
                let wanted = Follow::Cluster {
                    kubernetes_version: Some(version.clone()),
                    pools,
                };
                // Sent before (the same key), already moving there, or already there: attach.
                if ours(&cluster, key, &version)
                    || (at(&cluster, &wanted)
                        && cluster["properties"]["provisioningState"] == "Succeeded")
                {
                    wanted
                } else {
                    self.put_version(id, cluster, &version, pools, key).await?
                }
            }
            (kind, None) => {
                return Err(DriverError::permanent(format!(
                    "a {kind:?} upgrade needs a Kubernetes version"
                )));
            }
        };
        serde_json::to_string(&follow)
            .map_err(|e| DriverError::permanent(format!("cannot record the operation: {e}")))
    }

    async fn poll(
        &self,
        member: &MemberRef,
        operation_id: &str,
        key: &str,
    ) -> Result<OperationState, DriverError> {
        let id = &member.cluster_resource_id;
        let Ok(follow) = serde_json::from_str::<Follow>(operation_id) else {
            // The key itself: the send's answer was lost. The cluster tells whether it arrived.
            let cluster = self.cluster(id).await?;
            if cluster["tags"][OPERATION_TAG] != key {
                // A node pool's rollback carries the key on its pool.
                let tagged = cluster["properties"]["agentPoolProfiles"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["tags"][OPERATION_TAG] == key);
                return Ok(match tagged {
                    None => OperationState::Unknown,
                    Some(p) if p["provisioningState"] == "Failed" => {
                        OperationState::Failed(format!(
                            "node pool {}'s provisioning state is Failed ({id})",
                            p["name"]
                        ))
                    }
                    Some(p) if pool_idle(p) => OperationState::Succeeded,
                    Some(_) => OperationState::Running,
                });
            }
            return Ok(match cluster["properties"]["provisioningState"].as_str() {
                Some("Succeeded") => OperationState::Succeeded,
                Some("Failed") => OperationState::Failed(format!(
                    "the cluster's provisioning state is Failed ({id})"
                )),
                _ => OperationState::Running,
            });
        };
        let Follow::Async(urls) = &follow else {
            return self.cluster_progress(id, &follow).await;
        };
        let mut running = false;
        for url in urls {
            if !url.starts_with(&self.arm) {
                return Err(DriverError::permanent(format!(
                    "operation {url:?} is not on the configured ARM endpoint"
                )));
            }
            let answer = self.call(Method::GET, url, None).await?;
            if !answer.status.is_success() {
                return Err(DriverError::transient(format!(
                    "GET {url}: {}",
                    answer.error()
                )));
            }
            // `Azure-AsyncOperation` answers a status; a `Location` answers 202 until done.
            match answer.body["status"].as_str() {
                Some("Succeeded") => {}
                Some("Failed" | "Canceled") => {
                    return Ok(OperationState::Failed(answer.error()));
                }
                Some(_) => running = true,
                None if answer.status == StatusCode::ACCEPTED => running = true,
                None => {}
            }
        }
        Ok(if running {
            OperationState::Running
        } else {
            OperationState::Succeeded
        })
    }

    async fn catalog(&self) -> Result<Catalog, DriverError> {
        let mut kept = self.catalog.lock().await;
        let seen: Vec<(String, String)> = self
            .seen
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        if let Some((at, catalog)) = kept.as_ref()
            && at.elapsed() < self.catalog_refresh
            && seen.iter().all(|(_, r)| catalog.regions.contains_key(r))
        {
            return Ok(catalog.clone());
        }
        let mut spec = CatalogSpec::new();
        for (subscription, region) in &seen {
            let entry: &mut RegionCatalogSpec = spec.entry(region.clone()).or_default();
            let base = format!(
                "/subscriptions/{subscription}/providers/Microsoft.ContainerService/locations/{region}"
            );
            let versions = self
                .call(
                    Method::GET,
                    &self.url(&format!("{base}/kubernetesVersions")),
                    None,
                )
                .await?;
            if !versions.status.is_success() {
                return Err(DriverError::transient(format!(
                    "kubernetesVersions of {region}: {}",
                    versions.error()
                )));
            }
            let mut listed = BTreeSet::new();
            for minor in versions.body["values"].as_array().into_iter().flatten() {
                let plans: Vec<&str> = minor["capabilities"]["supportPlan"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let lts_only =
                    plans.contains(&"AKSLongTermSupport") && !plans.contains(&"KubernetesOfficial");
                for patch in minor["patchVersions"]
                    .as_object()
                    .into_iter()
                    .flat_map(|m| m.keys())
                {
                    if listed.insert(patch.clone()) {
                        entry.kubernetes.push(KubeReleaseSpec {
                            version: patch.clone(),
                            preview: minor["isPreview"] == true,
                            lts: lts_only,
                            available_at: None,
                        });
                    }
                }
            }
            let mut images: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            let mut next = Some(self.url(&format!("{base}/nodeImageVersions")));
            while let Some(url) = next.take() {
                let page = self.call(Method::GET, &url, None).await?;
                if !page.status.is_success() {
                    return Err(DriverError::transient(format!(
                        "nodeImageVersions of {region}: {}",
                        page.error()
                    )));
                }
                for image in page.body["value"].as_array().into_iter().flatten() {
                    if let (Some(os), Some(sku), Some(version)) = (
                        image["os"].as_str(),
                        image["sku"].as_str(),
                        image["version"].as_str(),
                    ) {
                        images
                            .entry(format!("{os}-{sku}"))
                            .or_default()
                            .push(json!({"version": version}));
                    }
                }
                next = page.body["nextLink"]
                    .as_str()
                    .filter(|n| n.starts_with(&self.arm))
                    .map(String::from);
            }
            for (family, list) in images {
                entry.node_images.insert(family, Value::Array(list));
            }
        }
        let catalog = Catalog::parse(&spec, "the AKS catalog")
            .map_err(|e| DriverError::transient(e.message))?;
        *kept = Some((Instant::now(), catalog.clone()));
        Ok(catalog)
    }

    async fn discover(&self) -> Result<Option<crate::Discovery>, DriverError> {
        let Some(config) = &self.discover else {
            return Ok(None);
        };
        let mut clusters = Vec::new();
        let mut scopes = Vec::new();
        for subscription in &config.subscriptions {
            let lists: Vec<(String, String)> = if config.resource_groups.is_empty() {
                vec![(
                    format!(
                        "/subscriptions/{subscription}/providers/Microsoft.ContainerService/managedClusters"
                    ),
                    format!("/subscriptions/{subscription}/"),
                )]
            } else {
                config
                    .resource_groups
                    .iter()
                    .map(|g| {
                        (
                            format!("/subscriptions/{subscription}/resourceGroups/{g}/providers/Microsoft.ContainerService/managedClusters"),
                            format!("/subscriptions/{subscription}/resourcegroups/{g}/"),
                        )
                    })
                    .collect()
            };
            for (list, scope) in lists {
                scopes.push(scope.to_ascii_lowercase());
                let mut next = Some(self.url(&list));
                while let Some(url) = next.take() {
                    let page = self.call(Method::GET, &url, None).await?;
                    if !page.status.is_success() {
                        return Err(DriverError::transient(format!(
                            "GET {list}: {}",
                            page.error()
                        )));
                    }
                    for cluster in page.body["value"].as_array().into_iter().flatten() {
                        let (Some(id), Some(name)) =
                            (cluster["id"].as_str(), cluster["name"].as_str())
                        else {
                            continue;
                        };
                        let tags: BTreeMap<String, String> = cluster["tags"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect();
                        if config.selector.as_ref().is_some_and(|s| !s.matches(&tags)) {
                            continue;
                        }
                        clusters.push(crate::Discovered {
                            cluster_resource_id: id.to_string(),
                            name: name.to_string(),
                            tags,
                        });
                    }
                    next = page.body["nextLink"]
                        .as_str()
                        .filter(|n| n.starts_with(&self.arm))
                        .map(String::from);
                }
            }
        }
        Ok(Some(crate::Discovery {
            clusters,
            group_tag: config.group_tag.clone(),
            scopes,
        }))
    }

    /// AKS upgrades a pool to its region's newest image only (`NodeImageSelectionUnsupported`).
    fn pins_node_images(&self) -> bool {
        false
    }

    fn discover_every(&self) -> Option<Duration> {
        self.discover.as_ref().and_then(|d| d.every)
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn operation_deadline(&self) -> Duration {
        self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_are_checked_field_by_field() {
        let refused = |config: Value, needle: &str| {
            let e = AksDriver::new(&config).err().expect("refused");
            assert!(e.message.contains(needle), "{needle}: {}", e.message);
        };
        let secret = json!({"type": "ClientSecret", "tenantId": "t", "clientId": "c", "clientSecretEnv": "S"});
        assert!(AksDriver::new(&json!({"type": "aks", "credential": secret})).is_ok());
        refused(
            json!({"type": "aks", "credential": secret, "discoverEvery": 1}),
            "discoverEvery",
        );
        refused(
            json!({"type": "aks", "credential": secret, "armEndpoint": "http://arm.example"}),
            "properties.driver.armEndpoint",
        );
        assert!(
            AksDriver::new(
                &json!({"type": "aks", "credential": secret, "armEndpoint": "http://127.0.0.1:9"})
            )
            .is_ok()
        );
        refused(
            json!({"type": "aks", "credential": {"type": "ClientSecret", "tenantId": "t", "clientId": "c", "clientSecret": "plain"}}),
            "credential.clientSecret",
        );
        refused(
            json!({"type": "aks", "credential": {"type": "ClientSecret", "tenantId": "t", "clientId": "c"}}),
            "exactly one of clientSecretFile and clientSecretEnv",
        );
        refused(
            json!({"type": "aks", "credential": {"type": "Password"}}),
            "credential.type",
        );
        refused(
            json!({"type": "aks", "credential": secret, "pollIntervalSeconds": -1}),
            "pollIntervalSeconds",
        );
    }

    #[test]
    fn cluster_ids_are_aks_arm_ids() {
        let id = "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1";
        assert_eq!(subscription_of(id).ok(), Some("s1"));
        for bad in [
            "aks-canary",
            "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/v",
            "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1/agentPools/p",
        ] {
            assert!(subscription_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn forms_are_percent_encoded() {
        assert_eq!(
            form(&[
                ("scope", "https://management.azure.com/.default"),
                ("a b", "x&y=z")
            ]),
            "scope=https%3A%2F%2Fmanagement.azure.com%2F.default&a%20b=x%26y%3Dz"
        );
    }
}
