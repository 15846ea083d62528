//! A fake of Azure Resource Manager for AKS and of Microsoft Entra's token endpoint, written from
//! their documented contracts, on loopback: managed clusters (GET, PUT as a long-running
//! operation with `Azure-AsyncOperation`), agent pools' `upgradeNodeImageVersion`, maintenance
//! configurations, the Kubernetes version and node image listings (paged with `nextLink`), the
//! operation status resource, and the failures ARM answers with: 409 `OperationNotAllowed` while
//! an operation runs, 400 `OperationNotAllowed` for a control-plane upgrade that skips a minor
//! version or goes down ("you can't skip Kubernetes minor versions", AKS's upgrade documentation
//! and its troubleshooting page for blocked upgrades) and for a pool asked to be newer than the
//! control plane, 429 with `Retry-After`, 401 for a token that has expired.
//!
//! A PUT that changes versions moves the control plane to `kubernetesVersion` and each pool
//! whose `orchestratorVersion` it changes to that version (a Full upgrade moves them all); the
//! cluster answers `currentKubernetesVersion` and each pool's `currentOrchestratorVersion` once
//! the operation ends. Every version-changing PUT is kept in `version_puts`, accepted or not.
//!
//! Node pool rollback, as AKS's "Roll back node pool versions" (API 2026-04-01) describes it:
//! every upgrade that changes a pool (its Kubernetes version or its node image) records, when it
//! completes, the versions the pool left; the pool's upgrade profile
//! (`agentPools/{p}/upgradeProfiles/default`) lists that record as `recentlyUsedVersions`
//! (`orchestratorVersion`, `nodeImageVersion`, `timestamp`) for seven days, and not at all
//! before API 2026-04-01. A PUT of the agent pool (`agentPools/{p}`) asking for exactly those
//! versions within the seven days is the rollback: long-running like the cluster's PUT, 409
//! while any operation runs on the cluster ("no concurrent operations allowed during
//! rollback"), and it uses the record up ("can't perform consecutive rollbacks"). Asked for a
//! node image that is neither the pool's nor its record's, AKS's documented refusal is
//! answered: `NodeImageVersion 'X' is not accepted. NodeImageVersion can only be current
//! version 'Y' or 'latest'` (the code, `InvalidParameter`, is ARM's convention for a refused
//! property value: the documentation does not name one). `nodeImageVersion` is read-only before
//! API 2026-04-01, so an older PUT's is ignored, as ARM ignores read-only properties. A test
//! ages a record with `age_last_upgrade`, so no test waits a week; every agent pool PUT is kept
//! in `pool_puts`, accepted or not.

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

pub const SECRET: &str = "s3cret";
pub const NEWEST_IMAGE: &str = "202603.01.0";

/// An operation in progress on a cluster.
#[derive(Clone, Debug)]
pub struct Op {
    pub cluster: String,
    /// Status reads left before it ends.
    pub polls_left: u32,
    /// Or, for someone else's, when it ends (looks before then find it running).
    pub until: Option<std::time::Instant>,
    pub change: Change,
    pub fails: Option<String>,
}

#[derive(Clone, Debug)]
pub enum Change {
    /// The control plane (and, with `pools`, every pool) to a version.
    Version {
        version: String,
        /// The pools that move, each to its version.
        pools: Vec<(String, String)>,
    },
    /// A pool to its region's newest image.
    Image { pool: String },
    /// A pool, through a PUT of the agent pool, to these versions (a rollback to its record).
    Pool {
        pool: String,
        orchestrator_version: String,
        node_image_version: String,
    },
}

/// What a pool left at its last upgrade, and when (the upgrade profile's
/// `recentlyUsedVersions` entry).
#[derive(Clone, Debug, PartialEq)]
pub struct Recent {
    pub orchestrator_version: String,
    pub node_image_version: String,
    /// Seconds since the epoch.
    pub timestamp: i64,
}

/// A PUT of an agent pool that asked for other versions than the pool's.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolPut {
    pub cluster: String,
    pub pool: String,
    pub orchestrator_version: String,
    pub node_image_version: String,
    /// Whether ARM accepted it (false: refused with 400, nothing changed).
    pub accepted: bool,
}

/// How long AKS keeps a pool's previous versions for a rollback.
pub const ROLLBACK_WINDOW_SECONDS: i64 = 7 * 86_400;

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// Whether a request's `api-version` is at least `date` (`YYYY-MM-DD`, previews after their
/// date).
fn api_at_least(query: &str, date: &str) -> bool {
    query
        .split('&')
        .find_map(|p| p.strip_prefix("api-version="))
        .is_some_and(|v| v.get(..10).is_some_and(|d| d >= date))
}

#[derive(Default)]
pub struct Fake {
    pub base: String,
    pub clusters: BTreeMap<String, Value>,
    pub windows: BTreeMap<(String, String), Value>,
    pub ops: BTreeMap<String, Op>,
    next_op: u64,
    /// Tokens issued, and which are still accepted.
    pub tokens_issued: u32,
    pub valid_tokens: Vec<String>,
    /// The next this many ARM requests are answered 429 with `Retry-After: 1`.
    pub throttle_next: u32,
    /// How many status reads an operation takes.
    pub op_polls: u32,
    /// Every ARM request: method and path.
    pub requests: Vec<(String, String)>,
    /// Upgrades accepted (a PUT that started one, a pool's image upgrade), per cluster.
    pub upgrades: BTreeMap<String, u32>,
    /// Requests refused with 409 because an operation was in progress.
    pub conflicts: u32,
    /// Long-running PUTs answer 202 with `Location` instead of `Azure-AsyncOperation`.
    pub location_only: bool,
    /// Every PUT of a cluster that asked for another control-plane version, in order.
    pub version_puts: Vec<VersionPut>,
    /// When the next operation on this cluster ends, the next this many ARM requests are
    /// throttled (once): a test's way to hold a chain between two hops.
    pub throttle_when_done: Option<(String, u32)>,
    /// What each pool (cluster id, pool name) left at its last upgrade.
    pub recent: BTreeMap<(String, String), Recent>,
    /// Every agent pool PUT that asked for other versions, in order.
    pub pool_puts: Vec<PoolPut>,
}

/// A PUT that asked for a control-plane version other than the cluster's current one.
#[derive(Clone, Debug, PartialEq)]
pub struct VersionPut {
    pub cluster: String,
    pub from: String,
    pub to: String,
    /// Whether ARM accepted it (false: refused with 400, nothing changed).
    pub accepted: bool,
}

/// `(major, minor)` of a `major.minor.patch` version.
pub fn minor_of(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// A version's parts as numbers, for ordering.
fn version_parts(version: &str) -> Vec<u64> {
    version.split('.').filter_map(|p| p.parse().ok()).collect()
}

/// The region's Kubernetes versions, as `kubernetesVersions` lists them.
fn kubernetes_versions() -> Value {
    json!({"values": [
        {"version": "1.29", "capabilities": {"supportPlan": ["KubernetesOfficial", "AKSLongTermSupport"]},
         "patchVersions": {"1.29.9": {"upgrades": ["1.30.5", "1.30.6"]}}},
        {"version": "1.30", "capabilities": {"supportPlan": ["KubernetesOfficial", "AKSLongTermSupport"]},
         "patchVersions": {"1.30.5": {"upgrades": ["1.31.1", "1.31.2"]}, "1.30.6": {"upgrades": ["1.31.2"]}}},
        {"version": "1.31", "capabilities": {"supportPlan": ["KubernetesOfficial"]},
         "patchVersions": {"1.31.1": {"upgrades": ["1.31.2"]}, "1.31.2": {"upgrades": []}}},
        {"version": "1.32", "isPreview": true, "capabilities": {"supportPlan": ["KubernetesOfficial"]},
         "patchVersions": {"1.32.0": {"upgrades": []}}},
        {"version": "1.27", "capabilities": {"supportPlan": ["AKSLongTermSupport"]},
         "patchVersions": {"1.27.102": {"upgrades": []}}},
    ]})
}

/// Why AKS refuses to move a control plane from `from` to `to`, if it does: a minor skipped
/// or a downgrade (400 `OperationNotAllowed`, naming the upgrades it would take: the newer
/// patches of the same minor and those of the next one).
fn refused_upgrade(from: &str, to: &str) -> Option<String> {
    let (Some(a), Some(b)) = (minor_of(from), minor_of(to)) else {
        return Some(format!("Version {to} is not supported in this region."));
    };
    let skips = b.0 != a.0 || b.1 > a.1 + 1;
    if !skips && version_parts(to) >= version_parts(from) {
        return None;
    }
    let mut available: Vec<String> = kubernetes_versions()["values"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| {
            m["patchVersions"]
                .as_object()
                .into_iter()
                .flat_map(|p| p.keys())
        })
        .filter(|v| {
            minor_of(v).is_some_and(|m| m.0 == a.0 && (m.1 == a.1 || m.1 == a.1 + 1))
                && version_parts(v) > version_parts(from)
        })
        .cloned()
        .collect();
    available.sort_by_key(|v| std::cmp::Reverse(version_parts(v)));
    Some(format!(
        "Upgrading Kubernetes version {from} to {to} is not allowed. Available upgrades: [{}]. For more information, see AKS supported Kubernetes versions for version details.",
        available.join(" ")
    ))
}

impl Op {
    /// One look at the operation: whether it has ended.
    fn advance(&mut self) -> bool {
        if let Some(until) = self.until {
            return std::time::Instant::now() >= until;
        }
        if self.polls_left > 0 {
            self.polls_left -= 1;
            false
        } else {
            true
        }
    }
}

impl Fake {
    pub fn count(&self, method: &str, suffix: &str) -> usize {
        self.requests
            .iter()
            .filter(|(m, p)| m == method && p.ends_with(suffix))
            .count()
    }

    /// Starts an operation of someone else's on a cluster (as `az aks upgrade` from a laptop).
    /// It lasts `lasts`.
    pub fn start_foreign(&mut self, cluster: &str, version: &str, lasts: std::time::Duration) {
        let c = self.clusters.get_mut(cluster).expect("cluster");
        c["properties"]["provisioningState"] = json!("Upgrading");
        c["properties"]["kubernetesVersion"] = json!(version);
        let id = self.op(
            cluster,
            Change::Version {
                version: version.into(),
                pools: Vec::new(),
            },
        );
        self.ops.get_mut(&id).expect("op").until = Some(std::time::Instant::now() + lasts);
    }

    /// Ends every operation of someone else's now.
    pub fn end_foreign(&mut self) {
        let now = std::time::Instant::now();
        for op in self.ops.values_mut() {
            if let Some(until) = op.until.as_mut() {
                *until = (*until).min(now);
            }
        }
    }

    fn op(&mut self, cluster: &str, change: Change) -> String {
        self.next_op += 1;
        let id = format!("op-{}", self.next_op);
        self.ops.insert(
            id.clone(),
            Op {
                cluster: cluster.into(),
                polls_left: self.op_polls,
                until: None,
                change,
                fails: None,
            },
        );
        id
    }

    /// A test's knob: the last upgrade of `pool` happened `seconds` earlier than recorded.
    pub fn age_last_upgrade(&mut self, cluster: &str, pool: &str, seconds: i64) {
        if let Some(r) = self
            .recent
            .get_mut(&(cluster.to_string(), pool.to_string()))
        {
            r.timestamp -= seconds;
        }
    }

    /// The record a pool can be rolled back to now, if its seven days have not passed.
    pub fn rollback_record(&self, cluster: &str, pool: &str) -> Option<&Recent> {
        self.recent
            .get(&(cluster.to_string(), pool.to_string()))
            .filter(|r| now_seconds() < r.timestamp + ROLLBACK_WINDOW_SECONDS)
    }

    /// A pool about to change: what it runs now is its record.
    fn remember(&mut self, cluster: &str, pool: &Value) {
        let (Some(name), Some(image)) = (pool["name"].as_str(), pool["nodeImageVersion"].as_str())
        else {
            return;
        };
        let version = pool["currentOrchestratorVersion"]
            .as_str()
            .or(pool["orchestratorVersion"].as_str())
            .unwrap_or_default();
        self.recent.insert(
            (cluster.to_string(), name.to_string()),
            Recent {
                orchestrator_version: version.to_string(),
                node_image_version: image.to_string(),
                timestamp: now_seconds(),
            },
        );
    }

    fn busy(&self, cluster: &str) -> bool {
        self.ops.values().any(|o| o.cluster == cluster)
    }

    /// A pool's image upgrade conflicts with an operation on the cluster or on that pool;
    /// different pools upgrade their images side by side.
    fn pool_busy(&self, cluster: &str, pool: &str) -> bool {
        self.ops.values().any(|o| {
            o.cluster == cluster
                && match &o.change {
                    Change::Version { .. } | Change::Pool { .. } => true,
                    Change::Image { pool: p } => p == pool,
                }
        })
    }

    /// Time passes for a cluster's operations: each look at the cluster is one step of them.
    fn step(&mut self, cluster: &str) {
        let ids: Vec<String> = self
            .ops
            .iter()
            .filter(|(_, o)| o.cluster == cluster)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if self.ops.get_mut(&id).expect("op").advance() {
                self.finish(&id);
            }
        }
    }

    /// An operation's end: the cluster changed as it asked.
    fn finish(&mut self, id: &str) {
        let Some(op) = self.ops.remove(id) else {
            return;
        };
        if let Some((cluster, n)) = self.throttle_when_done.clone()
            && cluster == op.cluster
        {
            self.throttle_when_done = None;
            self.throttle_next = n;
        }
        if op.fails.is_some() {
            let c = self.clusters.get_mut(&op.cluster).expect("cluster");
            c["properties"]["provisioningState"] = json!("Failed");
            if let Change::Pool { pool, .. } = &op.change {
                for p in c["properties"]["agentPoolProfiles"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if p["name"] == pool.as_str() {
                        p["provisioningState"] = json!("Failed");
                    }
                }
            }
            return;
        }
        // What each pool the operation changes leaves is its record (a rollback uses it up).
        let profiles: Vec<Value> = self.clusters[&op.cluster]["properties"]["agentPoolProfiles"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for p in &profiles {
            let name = p["name"].as_str().unwrap_or_default();
            match &op.change {
                Change::Version { pools, .. } if pools.iter().any(|(n, _)| n == name) => {
                    self.remember(&op.cluster, p)
                }
                Change::Image { pool } if pool == name => self.remember(&op.cluster, p),
                Change::Pool { pool, .. } if pool == name => {
                    self.recent.remove(&(op.cluster.clone(), name.to_string()));
                }
                _ => {}
            }
        }
        let c = self.clusters.get_mut(&op.cluster).expect("cluster");
        match op.change {
            Change::Version { version, pools } => {
                c["properties"]["currentKubernetesVersion"] = json!(version);
                for p in c["properties"]["agentPoolProfiles"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    let Some((_, to)) = pools.iter().find(|(name, _)| p["name"] == name.as_str())
                    else {
                        continue;
                    };
                    // A pool's version upgrade reimages its nodes with the newest image.
                    p["currentOrchestratorVersion"] = json!(to);
                    p["provisioningState"] = json!("Succeeded");
                    let family = family(p);
                    p["nodeImageVersion"] = json!(format!("{family}-{NEWEST_IMAGE}"));
                }
            }
            Change::Image { pool } => {
                for p in c["properties"]["agentPoolProfiles"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if p["name"] == pool.as_str() {
                        p["provisioningState"] = json!("Succeeded");
                        let family = family(p);
                        p["nodeImageVersion"] = json!(format!("{family}-{NEWEST_IMAGE}"));
                    }
                }
            }
            Change::Pool {
                pool,
                orchestrator_version,
                node_image_version,
            } => {
                for p in c["properties"]["agentPoolProfiles"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if p["name"] == pool.as_str() {
                        p["provisioningState"] = json!("Succeeded");
                        p["orchestratorVersion"] = json!(orchestrator_version);
                        p["currentOrchestratorVersion"] = json!(orchestrator_version);
                        p["nodeImageVersion"] = json!(node_image_version);
                    }
                }
            }
        }
        if !self.busy(&op.cluster) {
            self.clusters.get_mut(&op.cluster).expect("cluster")["properties"]["provisioningState"] =
                json!("Succeeded");
        }
    }
}

fn family(pool: &Value) -> String {
    let image = pool["nodeImageVersion"].as_str().unwrap_or_default();
    image.rsplit_once('-').map_or(image, |(f, _)| f).to_string()
}

pub fn cluster_id(sub: &str, name: &str) -> String {
    format!(
        "/subscriptions/{sub}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/{name}"
    )
}

/// A managed cluster as ARM answers it.
pub fn cluster(id: &str, location: &str, version: &str) -> Value {
    let name = id.rsplit('/').next().unwrap_or_default();
    let pool = |n: &str, os: &str, image: &str| {
        json!({"name": n, "count": 3, "vmSize": "Standard_D4s_v5", "osType": os, "osSKU": "Ubuntu",
            "orchestratorVersion": version, "currentOrchestratorVersion": version,
            "nodeImageVersion": image, "provisioningState": "Succeeded", "powerState": {"code": "Running"}, "mode": "System"})
    };
    json!({
        "id": id, "name": name, "type": "Microsoft.ContainerService/ManagedClusters", "location": location,
        "tags": {"env": "prod"},
        "properties": {
            "provisioningState": "Succeeded", "powerState": {"code": "Running"},
            "kubernetesVersion": version, "currentKubernetesVersion": version, "dnsPrefix": name,
            "fqdn": format!("{name}.hcp.{location}.azmk8s.io"),
            "agentPoolProfiles": [
                pool("system", "Linux", "AKSUbuntu-2204gen2containerd-202602.10.0"),
                pool("user", "Linux", "AKSUbuntu-2204gen2containerd-202602.10.0"),
            ],
        },
    })
}

/// A pool of a cluster, as the cluster lists it.
fn pool_profile(cluster: &Value, pool: &str) -> Option<Value> {
    cluster["properties"]["agentPoolProfiles"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == pool)
        .cloned()
}

/// An agent pool as ARM answers it on its own path: its profile under `properties`.
fn agent_pool(cluster: &str, profile: &Value) -> Value {
    let name = profile["name"].as_str().unwrap_or_default();
    let mut properties = profile.clone();
    if let Some(p) = properties.as_object_mut() {
        p.remove("name");
    }
    json!({"id": format!("{cluster}/agentPools/{name}"), "name": name,
        "type": "Microsoft.ContainerService/managedClusters/agentPools", "properties": properties})
}

pub type Shared = Arc<Mutex<Fake>>;

/// Serves the fake on a loopback port; answers its base URL and state.
pub async fn start() -> (String, Shared) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let fake: Shared = Arc::new(Mutex::new(Fake {
        base: base.clone(),
        op_polls: 2,
        ..Fake::default()
    }));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(fake.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, fake)
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

async fn handle(
    State(fake): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or_default().to_string();
    let mut f = fake.lock().expect("fake");
    // Microsoft Entra: client credentials, with a secret or a federated assertion.
    if method == Method::POST && path.ends_with("/oauth2/v2.0/token") {
        let form = String::from_utf8_lossy(&body).to_string();
        let has = |pair: &str| form.split('&').any(|p| p == pair);
        let assertion = form
            .split('&')
            .any(|p| p.starts_with("client_assertion=ey"));
        if !has("grant_type=client_credentials")
            || !(has(&format!("client_secret={SECRET}")) || assertion)
        {
            return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}))).into_response();
        }
        f.tokens_issued += 1;
        let token = format!("token-{}", f.tokens_issued);
        f.valid_tokens.push(token.clone());
        return axum::Json(
            json!({"token_type": "Bearer", "expires_in": 3599, "access_token": token}),
        )
        .into_response();
    }
    // The instance metadata service.
    if method == Method::GET && path == "/metadata/identity/oauth2/token" {
        if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true")
            || !query.contains("resource=")
        {
            return StatusCode::BAD_REQUEST.into_response();
        }
        f.tokens_issued += 1;
        let token = format!("token-{}", f.tokens_issued);
        f.valid_tokens.push(token.clone());
        return axum::Json(
            json!({"access_token": token, "expires_in": "3599", "token_type": "Bearer"}),
        )
        .into_response();
    }
    f.requests.push((method.to_string(), path.clone()));
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string();
    if !f.valid_tokens.contains(&token) {
        return error(
            StatusCode::UNAUTHORIZED,
            "ExpiredAuthenticationToken",
            "The access token expiry UTC time is earlier than current UTC time.",
        );
    }
    if !query.contains("api-version=") {
        return error(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        );
    }
    if f.throttle_next > 0 {
        f.throttle_next -= 1;
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "The request is being throttled.",
        );
        r.headers_mut()
            .insert("retry-after", "1".parse().expect("header"));
        return r;
    }
    let lower = path.to_ascii_lowercase();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // Listings of a region.
    if lower.contains("/locations/") {
        let location = parts.get(5).copied().unwrap_or_default();
        if lower.ends_with("/kubernetesversions") {
            return axum::Json(kubernetes_versions()).into_response();
        }
        if lower.ends_with("/nodeimageversions") {
            // Two pages: the second one through nextLink.
            if query.contains("$skipToken=2") {
                return axum::Json(json!({"value": [
                    {"os": "AKSWindows", "sku": "2022-containerd", "version": "20348.3091.250210", "fullName": "AKSWindows-2022-containerd-20348.3091.250210"},
                ]})).into_response();
            }
            let next = format!("{}{path}?api-version=2025-07-01&$skipToken=2", f.base);
            return axum::Json(json!({"value": [
                {"os": "AKSUbuntu", "sku": "2204gen2containerd", "version": NEWEST_IMAGE, "fullName": format!("AKSUbuntu-2204gen2containerd-{NEWEST_IMAGE}")},
                {"os": "AKSAzureLinux", "sku": "V2gen2", "version": "202603.01.0", "fullName": "AKSAzureLinux-V2gen2-202603.01.0"},
            ], "nextLink": next})).into_response();
        }
        // The status of an operation.
        if let Some(id) = lower.split("/operations/").nth(1).map(String::from) {
            let Some(op) = f.ops.get_mut(&id) else {
                return axum::Json(json!({"name": id, "status": "Succeeded"})).into_response();
            };
            let location = query.contains("result=location");
            if !op.advance() {
                if location {
                    return StatusCode::ACCEPTED.into_response();
                }
                return axum::Json(json!({"name": id, "status": "InProgress", "startTime": "2026-12-03T00:00:00Z"})).into_response();
            }
            if let Some(message) = op.fails.clone() {
                f.finish(&id);
                return axum::Json(json!({"name": id, "status": "Failed", "error": {"code": "UpgradeFailed", "message": message}})).into_response();
            }
            f.finish(&id);
            if location {
                return StatusCode::OK.into_response();
            }
            return axum::Json(json!({"name": id, "status": "Succeeded"})).into_response();
        }
        let _ = location;
        return error(StatusCode::NOT_FOUND, "NotFound", "no such listing");
    }
    // The clusters of a subscription or of a resource group, five to a page.
    if lower.ends_with("/providers/microsoft.containerservice/managedclusters") {
        let scope = lower
            .trim_end_matches("providers/microsoft.containerservice/managedclusters")
            .to_string();
        let skip: usize = query
            .split('&')
            .find_map(|p| p.strip_prefix("$skipToken="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let all: Vec<Value> = f
            .clusters
            .iter()
            .filter(|(id, _)| id.to_ascii_lowercase().starts_with(&scope))
            .map(|(_, c)| c.clone())
            .collect();
        let page: Vec<Value> = all.iter().skip(skip).take(5).cloned().collect();
        let mut answer = json!({"value": page});
        if skip + 5 < all.len() {
            answer["nextLink"] = json!(format!(
                "{}{path}?api-version=2025-07-01&$skipToken={}",
                f.base,
                skip + 5
            ));
        }
        return axum::Json(answer).into_response();
    }
    // /subscriptions/{s}/resourceGroups/{g}/providers/Microsoft.ContainerService/managedClusters/{n}[/...]
    if parts.len() < 8 || !lower.contains("/managedclusters/") {
        return error(StatusCode::NOT_FOUND, "NotFound", "no such path");
    }
    let id = format!("/{}", parts[..8].join("/"));
    let location = match f.clusters.get(&id) {
        Some(c) => c["location"].as_str().unwrap_or_default().to_string(),
        None => {
            return error(
                StatusCode::NOT_FOUND,
                "ResourceNotFound",
                &format!("The Resource '{}' was not found.", parts[7]),
            );
        }
    };
    let operation_url = |op: &str, base: &str| {
        format!(
            "{base}/subscriptions/{}/providers/Microsoft.ContainerService/locations/{location}/operations/{op}?api-version=2025-07-01",
            parts[1]
        )
    };
    let rest: Vec<&str> = parts[8..].to_vec();
    match (method.as_str(), rest.as_slice()) {
        ("GET", []) => {
            f.step(&id);
            axum::Json(f.clusters[&id].clone()).into_response()
        }
        ("PUT", []) => {
            if f.busy(&id) {
                f.conflicts += 1;
                return error(
                    StatusCode::CONFLICT,
                    "OperationNotAllowed",
                    "Operation is not allowed because there's an in progress update managed cluster operation on the managed cluster started at 2026-12-03T00:00:00Z.",
                );
            }
            let Ok(sent) = serde_json::from_slice::<Value>(&body) else {
                return error(StatusCode::BAD_REQUEST, "InvalidRequestContent", "not JSON");
            };
            let version = sent["properties"]["kubernetesVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let current = f.clusters[&id]["properties"]["currentKubernetesVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if version != current {
                let refused = refused_upgrade(&current, &version);
                f.version_puts.push(VersionPut {
                    cluster: id.clone(),
                    from: current.clone(),
                    to: version.clone(),
                    accepted: refused.is_none(),
                });
                if let Some(message) = refused {
                    return error(StatusCode::BAD_REQUEST, "OperationNotAllowed", &message);
                }
            }
            // The pools whose version the PUT changes; none may pass the control plane.
            let mut pools = Vec::new();
            for p in sent["properties"]["agentPoolProfiles"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let (Some(name), Some(to)) =
                    (p["name"].as_str(), p["orchestratorVersion"].as_str())
                else {
                    continue;
                };
                if version_parts(to) > version_parts(&version) {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "OperationNotAllowed",
                        &format!(
                            "Node pool {name} version {to} cannot be greater than the control plane version {version}."
                        ),
                    );
                }
                let running = f.clusters[&id]["properties"]["agentPoolProfiles"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|q| q["name"] == name)
                    .and_then(|q| q["currentOrchestratorVersion"].as_str())
                    .map(String::from);
                if running.as_deref() != Some(to) {
                    pools.push((name.to_string(), to.to_string()));
                }
            }
            let c = f.clusters.get_mut(&id).expect("cluster");
            c["tags"] = sent["tags"].clone();
            c["properties"]["kubernetesVersion"] = json!(version);
            c["properties"]["provisioningState"] = json!("Upgrading");
            for p in c["properties"]["agentPoolProfiles"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if let Some((_, to)) = pools.iter().find(|(name, _)| p["name"] == name.as_str()) {
                    p["orchestratorVersion"] = json!(to);
                    p["provisioningState"] = json!("Upgrading");
                }
            }
            let op = f.op(&id, Change::Version { version, pools });
            *f.upgrades.entry(id.clone()).or_default() += 1;
            // ARM's other long-running pattern: 202 with a Location that answers 202 until
            // the operation is done, then 200.
            let (status, header, url) = if f.location_only {
                (
                    StatusCode::ACCEPTED,
                    "location",
                    format!("{}&result=location", operation_url(&op, &f.base)),
                )
            } else {
                (
                    StatusCode::OK,
                    "azure-asyncoperation",
                    operation_url(&op, &f.base),
                )
            };
            let mut r = (status, axum::Json(f.clusters[&id].clone())).into_response();
            r.headers_mut().insert(header, url.parse().expect("header"));
            r
        }
        ("POST", ["agentPools", pool, "upgradeNodeImageVersion"]) => {
            if f.pool_busy(&id, pool) {
                f.conflicts += 1;
                return error(
                    StatusCode::CONFLICT,
                    "OperationNotAllowed",
                    "Operation is not allowed because there's an in progress upgrade node image version operation.",
                );
            }
            let pool = pool.to_string();
            let c = f.clusters.get_mut(&id).expect("cluster");
            let Some(p) = c["properties"]["agentPoolProfiles"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == pool.as_str())
            else {
                return error(StatusCode::NOT_FOUND, "NotFound", "no such agent pool");
            };
            p["provisioningState"] = json!("UpgradingNodeImageVersion");
            let op = f.op(&id, Change::Image { pool });
            *f.upgrades.entry(id.clone()).or_default() += 1;
            let mut r = StatusCode::ACCEPTED.into_response();
            r.headers_mut().insert(
                "azure-asyncoperation",
                operation_url(&op, &f.base).parse().expect("header"),
            );
            r
        }
        ("GET", ["agentPools", pool, "upgradeProfiles", "default"]) => {
            f.step(&id);
            let Some(p) = pool_profile(&f.clusters[&id], pool) else {
                return error(StatusCode::NOT_FOUND, "NotFound", "no such agent pool");
            };
            let mut properties = json!({
                "kubernetesVersion": p["currentOrchestratorVersion"], "osType": p["osType"],
                "upgrades": [], "latestNodeImageVersion": format!("{}-{NEWEST_IMAGE}", family(&p)),
            });
            if api_at_least(&query, "2026-04-01") {
                let recent: Vec<Value> = f
                    .rollback_record(&id, pool)
                    .map(|r| {
                        json!({"orchestratorVersion": r.orchestrator_version,
                            "nodeImageVersion": r.node_image_version,
                            "timestamp": flotilla_engine::time::Time::from_unix(r.timestamp).to_string()})
                    })
                    .into_iter()
                    .collect();
                properties["recentlyUsedVersions"] = json!(recent);
            }
            axum::Json(json!({"id": format!("{id}/agentPools/{pool}/upgradeProfiles/default"),
                "name": "default", "type": "Microsoft.ContainerService/managedClusters/agentPools/upgradeProfiles",
                "properties": properties}))
            .into_response()
        }
        ("GET", ["agentPools", pool]) => {
            f.step(&id);
            match pool_profile(&f.clusters[&id], pool) {
                Some(p) => axum::Json(agent_pool(&id, &p)).into_response(),
                None => error(StatusCode::NOT_FOUND, "NotFound", "no such agent pool"),
            }
        }
        ("PUT", ["agentPools", pool]) => {
            let pool = pool.to_string();
            let Some(current) = pool_profile(&f.clusters[&id], &pool) else {
                return error(StatusCode::NOT_FOUND, "NotFound", "no such agent pool");
            };
            if f.busy(&id) {
                f.conflicts += 1;
                return error(
                    StatusCode::CONFLICT,
                    "OperationNotAllowed",
                    "Operation is not allowed because there's an in progress update managed cluster operation on the managed cluster started at 2026-12-03T00:00:00Z.",
                );
            }
            let Ok(sent) = serde_json::from_slice::<Value>(&body) else {
                return error(StatusCode::BAD_REQUEST, "InvalidRequestContent", "not JSON");
            };
            let running = current["currentOrchestratorVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let image = current["nodeImageVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let to_version = sent["properties"]["orchestratorVersion"]
                .as_str()
                .unwrap_or(&running)
                .to_string();
            // Read-only before 2026-04-01: ignored, as ARM ignores read-only properties.
            let to_image = sent["properties"]["nodeImageVersion"]
                .as_str()
                .filter(|_| api_at_least(&query, "2026-04-01"))
                .unwrap_or(&image)
                .to_string();
            let tags = sent["properties"]["tags"].clone();
            let set_tags = |f: &mut Fake| {
                if let Some(p) = f.clusters.get_mut(&id).and_then(|c| {
                    c["properties"]["agentPoolProfiles"]
                        .as_array_mut()
                        .into_iter()
                        .flatten()
                        .find(|p| p["name"] == pool.as_str())
                }) {
                    p["tags"] = tags.clone();
                }
            };
            if to_version == running && to_image == image {
                // Nothing to move: the tags, at once.
                set_tags(&mut f);
                let p = pool_profile(&f.clusters[&id], &pool).expect("pool");
                return axum::Json(agent_pool(&id, &p)).into_response();
            }
            let record = f.rollback_record(&id, &pool).cloned();
            let refused = match &record {
                Some(r)
                    if r.orchestrator_version == to_version && r.node_image_version == to_image =>
                {
                    None
                }
                _ if to_image != image
                    && record
                        .as_ref()
                        .is_none_or(|r| r.node_image_version != to_image) =>
                {
                    Some((
                        "InvalidParameter",
                        format!(
                            "NodeImageVersion '{to_image}' is not accepted. NodeImageVersion can only be current version '{image}' or 'latest'"
                        ),
                    ))
                }
                _ => Some((
                    "OperationNotAllowed",
                    format!(
                        "Changing the orchestrator version of agent pool {pool} from {running} to {to_version} is not allowed: it is not the version recorded for a rollback within the last 7 days."
                    ),
                )),
            };
            f.pool_puts.push(PoolPut {
                cluster: id.clone(),
                pool: pool.clone(),
                orchestrator_version: to_version.clone(),
                node_image_version: to_image.clone(),
                accepted: refused.is_none(),
            });
            if let Some((code, message)) = refused {
                return error(StatusCode::BAD_REQUEST, code, &message);
            }
            set_tags(&mut f);
            {
                let c = f.clusters.get_mut(&id).expect("cluster");
                c["properties"]["provisioningState"] = json!("Updating");
                for p in c["properties"]["agentPoolProfiles"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if p["name"] == pool.as_str() {
                        p["orchestratorVersion"] = json!(to_version);
                        p["provisioningState"] = json!("Upgrading");
                    }
                }
            }
            let op = f.op(
                &id,
                Change::Pool {
                    pool: pool.clone(),
                    orchestrator_version: to_version,
                    node_image_version: to_image,
                },
            );
            let (status, header, url) = if f.location_only {
                (
                    StatusCode::ACCEPTED,
                    "location",
                    format!("{}&result=location", operation_url(&op, &f.base)),
                )
            } else {
                (
                    StatusCode::OK,
                    "azure-asyncoperation",
                    operation_url(&op, &f.base),
                )
            };
            let p = pool_profile(&f.clusters[&id], &pool).expect("pool");
            let mut r = (status, axum::Json(agent_pool(&id, &p))).into_response();
            r.headers_mut().insert(header, url.parse().expect("header"));
            r
        }
        ("GET", ["maintenanceConfigurations", name]) => {
            match f.windows.get(&(id.clone(), name.to_string())) {
                Some(window) => {
                    axum::Json(json!({"name": name, "properties": {"maintenanceWindow": window}}))
                        .into_response()
                }
                None => error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "maintenance configuration not found",
                ),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "NotFound", "no such path"),
    }
}
