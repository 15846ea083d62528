//! Drivers: what actually observes and upgrades clusters, behind one trait. `sim` simulates
//! clusters in-process with a time scale; `exec` runs the user's commands as subprocesses.

pub mod aks;
pub mod clock;
pub mod operation;

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use flotilla_engine::engine::{Rollback, Target, apply_target};
use flotilla_engine::error::from_json_value;
use flotilla_engine::fleet::{Catalog, CatalogSpec, Cluster, ClusterSpec, RollbackScope};
use flotilla_engine::release::{self, Published, Release, ReleaseSpec, parse_offset};
use flotilla_engine::time::Time;
use flotilla_engine::version::{ImageVersion, KubeVersion};

/// What a driver's failure means (API.md, "Driver errors and deadlines").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not an answer: asked again with backoff (a timeout, a command that crashed or could not
    /// be spawned, no file descriptors, output that does not parse).
    Transient,
    /// An answer: the member fails with the message (also a configuration that is not valid).
    Permanent,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DriverError {
    pub kind: ErrorKind,
    pub message: String,
}

impl DriverError {
    pub fn transient(message: impl Into<String>) -> DriverError {
        DriverError {
            kind: ErrorKind::Transient,
            message: message.into(),
        }
    }

    pub fn permanent(message: impl Into<String>) -> DriverError {
        DriverError {
            kind: ErrorKind::Permanent,
            message: message.into(),
        }
    }

    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }
}

/// How long an operation is followed after it was sent before the member fails with the last
/// error (`operationDeadlineSeconds`, API.md).
pub const DEFAULT_OPERATION_DEADLINE: Duration = Duration::from_secs(6 * 3600);

/// A number of seconds a user sent, checked against its bounds before it becomes a duration
/// (`Duration::from_secs_f64` panics on what does not fit).
fn bounded_seconds(value: f64, field: &str, min: f64, max: f64) -> Result<f64, DriverError> {
    if value.is_finite() && value >= min && value <= max {
        Ok(value)
    } else {
        Err(DriverError::permanent(format!(
            "{field} {value}: must be a number of seconds from {min} to {max}"
        )))
    }
}

/// The longest an upgrade may be followed: a week.
const MAX_DEADLINE_SECONDS: f64 = 7.0 * 86_400.0;

/// `operationDeadlineSeconds`, any driver's, checked.
fn operation_deadline(seconds: f64) -> Result<Duration, DriverError> {
    bounded_seconds(
        seconds,
        "properties.driver.operationDeadlineSeconds",
        1.0,
        MAX_DEADLINE_SECONDS,
    )
    .map(Duration::from_secs_f64)
}

/// How the engine names a member to a driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRef {
    pub name: String,
    pub cluster_resource_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperationState {
    Running,
    Succeeded,
    Failed(String),
    /// The driver never received this operation.
    Unknown,
}

#[async_trait]
pub trait Driver: Send + Sync {
    /// The cluster as it is now.
    async fn observe(&self, member: &MemberRef) -> Result<ClusterSpec, DriverError>;
    /// Sends an upgrade. `key` identifies the attempt; sending the same key twice must not
    /// start a second upgrade. Returns the operation id.
    async fn start_upgrade(
        &self,
        member: &MemberRef,
        target: &Target,
        key: &str,
    ) -> Result<String, DriverError>;
    /// The state of an operation: `operation_id` is what `start_upgrade` returned (the key when
    /// the driver named none), `key` the attempt's idempotency key.
    async fn poll(
        &self,
        member: &MemberRef,
        operation_id: &str,
        key: &str,
    ) -> Result<OperationState, DriverError>;
    /// The release catalog, per region.
    async fn catalog(&self) -> Result<Catalog, DriverError>;
    /// How often to poll an operation in flight.
    fn poll_interval(&self) -> Duration;

    /// How long an operation is followed after it was sent before the member fails with the
    /// last error.
    fn operation_deadline(&self) -> Duration {
        DEFAULT_OPERATION_DEADLINE
    }

    /// How long to wait before polling this operation next; drivers that know when an operation
    /// ends (the simulator) say so, the others poll at their interval.
    fn poll_after(&self, _operation_id: &str) -> Duration {
        self.poll_interval()
    }

    /// How long an upgrade of this member is expected to take, where the driver knows (the
    /// simulator's configured durations): a forecast's duration when no history says more.
    fn expected_duration(&self, _member: &MemberRef) -> Option<Duration> {
        None
    }

    /// Simulated seconds per real second: how much faster than real time this driver's world
    /// runs (the `sim` driver's `timeScale`). A run made over it shortens its waits and
    /// scheduled gates by as much, as its upgrades are; 1 for real clusters.
    fn time_scale(&self) -> f64 {
        1.0
    }

    /// The clusters this driver finds by itself (the `aks` driver's `discover`); `None` when it
    /// is not configured to find any.
    async fn discover(&self) -> Result<Option<Discovery>, DriverError> {
        Ok(None)
    }

    /// How often the server discovers by itself; `None`: only when asked.
    fn discover_every(&self) -> Option<Duration> {
        None
    }

    /// Whether the driver can upgrade node images to a version named exactly (a Custom
    /// selection): a promoted run pins them only then (SEMANTICS §14).
    fn pins_node_images(&self) -> bool {
        true
    }
}

/// What a discovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovery {
    pub clusters: Vec<Discovered>,
    /// The tag whose value is a cluster's update group.
    pub group_tag: Option<String>,
    /// Where it looked, as lowercase ARM id prefixes (`/subscriptions/s/` or
    /// `/subscriptions/s/resourcegroups/g/`): a member under one of them that was not found has
    /// vanished.
    pub scopes: Vec<String>,
}

/// A cluster a discovery found: its id, its name and its tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovered {
    pub cluster_resource_id: String,
    pub name: String,
    pub tags: BTreeMap<String, String>,
}

/// The directories `exec` commands may come from (`flotilla serve --exec-allow DIR`): a token
/// that may configure a fleet must not be a way to run any program on the server. Empty, every
/// `exec` driver is refused.
#[derive(Clone, Debug, Default)]
pub struct ExecAllow {
    dirs: Vec<std::path::PathBuf>,
}

impl ExecAllow {
    /// The directories, resolved (links followed); one that does not exist is an error.
    pub fn new(dirs: &[std::path::PathBuf]) -> Result<ExecAllow, String> {
        let dirs = dirs
            .iter()
            .map(|d| {
                d.canonicalize()
                    .map_err(|e| format!("--exec-allow {}: {e}", d.display()))
            })
            .collect::<Result<_, _>>()?;
        Ok(ExecAllow { dirs })
    }

    /// [`ExecAllow::check`], for the server's Exec health checks (SEMANTICS §10).
    pub fn resolve(&self, program: &str, field: &str) -> Result<String, DriverError> {
        self.check(program, field)
    }

    /// Checks that `program` (a path, or a name looked up in `PATH`) is a file in an allowed
    /// directory, after following links; `field` names it in the refusal. Returns the resolved
    /// path, which is what runs (a link cannot be pointed elsewhere afterwards).
    fn check(&self, program: &str, field: &str) -> Result<String, DriverError> {
        let how = "the server runs exec commands only from the directories it is started with (flotilla serve --exec-allow DIR); name your script itself as the command";
        let found = if program.contains('/') {
            std::path::PathBuf::from(program).canonicalize().ok()
        } else {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(program))
                    .find(|p| p.is_file())
                    .and_then(|p| p.canonicalize().ok())
            })
        };
        let Some(path) = found.filter(|p| p.is_file()) else {
            return Err(DriverError::permanent(format!(
                "{field} {program:?}: no such program"
            )));
        };
        if self.dirs.iter().any(|d| path.starts_with(d)) {
            Ok(path.display().to_string())
        } else if self.dirs.is_empty() {
            Err(DriverError::permanent(format!(
                "{field} {program:?}: this server allows no exec commands; {how}"
            )))
        } else {
            Err(DriverError::permanent(format!(
                "{field} {program:?} ({}) is not in a directory this server allows; {how}",
                path.display()
            )))
        }
    }
}

/// Builds the driver a fleet's `properties.driver` describes.
pub fn driver_from_config(
    config: &Value,
    allow: &ExecAllow,
) -> Result<Arc<dyn Driver>, DriverError> {
    match config.get("type").and_then(Value::as_str) {
        Some("sim") => Ok(Arc::new(SimDriver::new(config)?)),
        Some("exec") => Ok(Arc::new(ExecDriver::with_allow(config, allow)?)),
        Some("aks") => Ok(Arc::new(aks::AksDriver::new(config)?)),
        Some(other) => Err(DriverError::permanent(format!(
            "properties.driver.type {other:?}: must be sim, exec or aks"
        ))),
        None => Err(DriverError::permanent(
            "properties.driver.type is required (sim, exec or aks)",
        )),
    }
}

/// Checks a driver configuration without keeping the driver.
pub fn validate_driver_config(config: &Value, allow: &ExecAllow) -> Result<(), ConfigError> {
    driver_from_config(config, allow)
        .map(|_| ())
        .map_err(|e| ConfigError {
            field: config_field(&e.message).to_string(),
            message: e.message,
        })
}

/// A driver configuration that cannot be used: the field it names, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    /// The full path of the field, `properties.driver.clusters.c1.region`.
    pub field: String,
    pub message: String,
}

/// The field a configuration error names. Every such message starts with the field's full
/// path (`properties.driver.timeScale 0: …`, `properties.driver.observe[0]: …`), so the path is
/// its first word, without the colon that may end it.
fn config_field(message: &str) -> &str {
    let word = message.split([' ', ':']).next().unwrap_or_default();
    if word.starts_with("properties.driver") {
        word
    } else {
        "properties.driver"
    }
}

// ---------------------------------------------------------------------------------------------
// sim

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SimKnobs {
    #[serde(default)]
    duration_seconds: Option<f64>,
    #[serde(default)]
    outcome: Option<String>,
    #[serde(default)]
    fail_message: Option<String>,
    #[serde(default)]
    fail_attempts: Option<u32>,
    /// These operations fail whatever `outcome` says: the Nth sent to the cluster, from 1,
    /// across runs and chained hops (SEMANTICS §13).
    #[serde(default)]
    fail_operations: Vec<u32>,
    /// What the cluster can roll back after an upgrade (SEMANTICS §15): each scope the upgrade
    /// changed, back to where it was, until this many simulated seconds after the driver was
    /// configured (the scenario format's `sim.rollback.until`). Absent: nothing.
    #[serde(default)]
    rollback: Option<SimRollback>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SimRollback {
    until_seconds: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SimConfig {
    #[serde(rename = "type")]
    _kind: String,
    /// Simulated seconds per real second: 300 turns a 600 s upgrade into 2 s.
    #[serde(default = "default_scale")]
    time_scale: f64,
    #[serde(default)]
    catalog: CatalogSpec,
    /// Cluster resource id (or member name) → cluster and its `sim` knobs.
    #[serde(default)]
    clusters: serde_json::Map<String, Value>,
    /// A cluster (and `sim` knobs) for every id `clusters` does not name: large simulated fleets.
    #[serde(default)]
    default_cluster: Option<Value>,
    /// The release feed: releases published at simulated offsets from when the driver was
    /// configured, region by region (the scenario format's `releases`).
    #[serde(default)]
    releases: Vec<ReleaseSpec>,
    /// A generated feed: a new patch, minor or node image every so often.
    #[serde(default)]
    feed: Option<FeedSpec>,
    #[serde(default = "default_deadline")]
    operation_deadline_seconds: f64,
}

pub(crate) fn default_deadline() -> f64 {
    DEFAULT_OPERATION_DEADLINE.as_secs_f64()
}

/// `feed`: every `patchEvery` a new patch of the newest generally available minor, every
/// `minorEvery` a new minor (`.0`), every `nodeImageEvery` a new version of each node image
/// family (last part + 1); region by region in name order, each `regionDelay` after the one
/// before. Durations are simulated time (`"7d"`, `"+2m"`, seconds).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FeedSpec {
    #[serde(default)]
    patch_every: Option<Value>,
    #[serde(default)]
    minor_every: Option<Value>,
    #[serde(default)]
    node_image_every: Option<Value>,
    #[serde(default)]
    region_delay: Option<Value>,
}

/// The validated `feed`, in simulated seconds.
#[derive(Clone, Debug)]
struct Feed {
    patch_every: Option<i64>,
    minor_every: Option<i64>,
    node_image_every: Option<i64>,
    region_delay: i64,
}

impl Feed {
    fn parse(spec: &FeedSpec) -> Result<Feed, DriverError> {
        let every = |v: &Option<Value>, field: &str| -> Result<Option<i64>, DriverError> {
            let path = format!("properties.driver.feed.{field}");
            match v {
                None => Ok(None),
                Some(v) => {
                    match parse_offset(v, &path).map_err(|e| DriverError::permanent(e.message))? {
                        0 => Err(DriverError::permanent(format!(
                            "{path} {v}: must be longer than zero"
                        ))),
                        s => Ok(Some(s)),
                    }
                }
            }
        };
        Ok(Feed {
            patch_every: every(&spec.patch_every, "patchEvery")?,
            minor_every: every(&spec.minor_every, "minorEvery")?,
            node_image_every: every(&spec.node_image_every, "nodeImageEvery")?,
            region_delay: match &spec.region_delay {
                None => 0,
                Some(v) => parse_offset(v, "properties.driver.feed.regionDelay")
                    .map_err(|e| DriverError::permanent(e.message))?,
            },
        })
    }

    /// The releases the feed has begun by `elapsed` simulated seconds, in order.
    fn releases(&self, base: &Catalog, elapsed: i64) -> Vec<Release> {
        let regions: BTreeMap<String, i64> = base
            .regions
            .keys()
            .enumerate()
            .map(|(i, r)| (r.clone(), self.region_delay.saturating_mul(i as i64)))
            .collect();
        // (when, kind): 0 minor, 1 patch, 2 images; a minor before a patch at the same time.
        let mut ticks: Vec<(i64, u8)> = Vec::new();
        for (every, kind) in [
            (self.minor_every, 0u8),
            (self.patch_every, 1),
            (self.node_image_every, 2),
        ] {
            if let Some(every) = every {
                ticks.extend(
                    (1..=elapsed / every)
                        .take(10_000)
                        .map(|k| (k * every, kind)),
                );
            }
        }
        ticks.sort();
        let mut newest: Option<KubeVersion> = base
            .regions
            .values()
            .flat_map(|r| r.kubernetes.iter())
            .filter(|k| !k.preview && !k.long_term_support)
            .map(|k| k.version)
            .max();
        let mut images: BTreeMap<String, ImageVersion> = BTreeMap::new();
        for r in base.regions.values() {
            for (family, list) in &r.node_images {
                if let Some(v) = list.iter().map(|i| &i.version).max() {
                    let e = images.entry(family.clone()).or_insert_with(|| v.clone());
                    if v > e {
                        *e = v.clone();
                    }
                }
            }
        }
        let mut out = Vec::new();
        for (at, kind) in ticks {
            let release = |what| Release {
                what,
                regions: regions.iter().map(|(r, d)| (r.clone(), at + d)).collect(),
                at,
            };
            match kind {
                0 | 1 => {
                    let Some(v) = newest.as_mut() else { continue };
                    if kind == 0 {
                        v.minor += 1;
                        v.patch = 0;
                    } else {
                        v.patch += 1;
                    }
                    out.push(release(Published::Kubernetes {
                        version: *v,
                        preview: false,
                        lts: false,
                    }));
                }
                _ => {
                    for (family, version) in images.iter_mut() {
                        let text = version.to_string();
                        let bumped = match text.rsplit_once('.') {
                            Some((head, last)) => last
                                .parse::<u64>()
                                .ok()
                                .map(|n| format!("{head}.{}", n + 1)),
                            None => text.parse::<u64>().ok().map(|n| (n + 1).to_string()),
                        };
                        let Some(next) = bumped.and_then(|b| ImageVersion::parse(&b)) else {
                            continue;
                        };
                        *version = next.clone();
                        out.push(release(Published::NodeImage {
                            family: family.clone(),
                            version: next,
                        }));
                    }
                }
            }
        }
        out
    }
}

fn parse_sim_cluster(body: &Value, path: &str) -> Result<SimCluster, DriverError> {
    // The cluster's fields and its `sim` knobs side by side.
    let mut fields = body
        .as_object()
        .cloned()
        .ok_or_else(|| DriverError::permanent(format!("{path}: must be an object")))?;
    let knobs: SimKnobs = match fields.remove("sim") {
        Some(k) => from_json_value(k, &format!("{path}.sim"))
            .map_err(|e| DriverError::permanent(e.message))?,
        None => SimKnobs::default(),
    };
    let spec: ClusterSpec = from_json_value(Value::Object(fields), path)
        .map_err(|e| DriverError::permanent(e.message))?;
    let cluster = Cluster::parse(&spec, path).map_err(|e| DriverError::permanent(e.message))?;
    if let Some(d) = knobs.duration_seconds {
        bounded_seconds(
            d,
            &format!("{path}.sim.durationSeconds"),
            0.0,
            30.0 * 86_400.0,
        )?;
    }
    if let Some(o) = knobs.outcome.as_deref()
        && o != "succeed"
        && o != "fail"
    {
        return Err(DriverError::permanent(format!(
            "{path}.sim.outcome {o:?}: must be succeed or fail"
        )));
    }
    if let Some(r) = &knobs.rollback {
        bounded_seconds(
            r.until_seconds,
            &format!("{path}.sim.rollback.untilSeconds"),
            0.0,
            10.0 * 365.0 * 86_400.0,
        )?;
    }
    Ok(SimCluster {
        cluster,
        knobs,
        attempts: 0,
        operations: Vec::new(),
    })
}

fn default_scale() -> f64 {
    1.0
}

struct SimOperation {
    member: String,
    /// When it ends, in [`clock::monotonic_millis`].
    ends: i64,
    succeeds: bool,
    message: String,
    target: Target,
    applied: bool,
}

#[derive(Clone)]
struct SimCluster {
    cluster: Cluster,
    knobs: SimKnobs,
    attempts: u32,
    /// Keys of the operations sent to this cluster.
    operations: Vec<String>,
}

pub struct SimDriver {
    /// The cluster every id not configured gets, if any.
    default: Option<SimCluster>,
    scale: f64,
    catalog: Catalog,
    /// The release feed, from `origin` (when the driver was configured) in simulated time.
    releases: Vec<Release>,
    feed: Option<Feed>,
    origin: Time,
    clock: fn() -> Time,
    state: Mutex<(HashMap<String, SimCluster>, HashMap<String, SimOperation>)>,
    deadline: Duration,
}

impl SimDriver {
    pub fn new(config: &Value) -> Result<SimDriver, DriverError> {
        let config: SimConfig = from_json_value(config.clone(), "properties.driver")
            .map_err(|e| DriverError::permanent(e.message))?;
        if !(config.time_scale.is_finite() && (1e-3..=1e6).contains(&config.time_scale)) {
            return Err(DriverError::permanent(format!(
                "properties.driver.timeScale {}: must be a number from 0.001 to 1000000",
                config.time_scale
            )));
        }
        let deadline = operation_deadline(config.operation_deadline_seconds)?;
        let catalog = Catalog::parse(&config.catalog, "properties.driver.catalog")
            .map_err(|e| DriverError::permanent(e.message))?;
        let mut clusters = HashMap::new();
        for (id, body) in &config.clusters {
            let entry = parse_sim_cluster(body, &format!("properties.driver.clusters.{id}"))?;
            clusters.insert(id.clone(), entry);
        }
        let default = config
            .default_cluster
            .as_ref()
            .map(|body| parse_sim_cluster(body, "properties.driver.defaultCluster"))
            .transpose()?;
        let releases = release::parse_releases(&config.releases, "properties.driver.releases")
            .map_err(|e| DriverError::permanent(e.message))?;
        for (i, r) in releases.iter().enumerate() {
            if let Some(region) = r.regions.keys().find(|g| !catalog.regions.contains_key(*g)) {
                return Err(DriverError::permanent(format!(
                    "properties.driver.releases[{i}].regions.{region}: not a region of the catalog"
                )));
            }
        }
        let feed = config.feed.as_ref().map(Feed::parse).transpose()?;
        Ok(SimDriver {
            deadline,
            scale: config.time_scale,
            catalog,
            releases,
            feed,
            origin: crate::clock::now(),
            clock: crate::clock::now,
            state: Mutex::new((clusters, HashMap::new())),
            default,
        })
    }

    /// The catalog as published by `now`: the configured one, plus the releases of the
    /// timeline and the feed that have come out (simulated offsets divided by `timeScale`).
    fn published_at(&self, now: Time) -> Catalog {
        if self.releases.is_empty() && self.feed.is_none() {
            return self.catalog.clone();
        }
        let mut releases = self.releases.clone();
        if let Some(feed) = &self.feed {
            let elapsed = ((now.unix() - self.origin.unix()) as f64 * self.scale).min(1e15) as i64;
            releases.extend(feed.releases(&self.catalog, elapsed));
        }
        // The simulated feed announces each release's regional rollout (SEMANTICS §11: a
        // forecast knows when a version arrives where the driver reports it).
        release::announced(&self.catalog, &releases, self.origin, self.scale, now)
    }

    /// The simulated cluster of a member, created from the default cluster if there is one.
    fn key(
        &self,
        member: &MemberRef,
        clusters: &mut HashMap<String, SimCluster>,
    ) -> Option<String> {
        if let Some(k) = [&member.cluster_resource_id, &member.name]
            .into_iter()
            .find(|k| clusters.contains_key(*k))
        {
            return Some(k.clone());
        }
        let default = self.default.clone()?;
        clusters.insert(member.cluster_resource_id.clone(), default);
        Some(member.cluster_resource_id.clone())
    }

    /// Applies an operation to its cluster once it is due (the simulated cluster changes then):
    /// an upgrade leaves what it changed offered for rollback where the cluster is configured
    /// to offer it.
    fn settle_one(
        &self,
        state: &mut (HashMap<String, SimCluster>, HashMap<String, SimOperation>),
        key: &str,
    ) {
        let (clusters, ops) = state;
        if let Some(op) = ops.get_mut(key)
            && !op.applied
            && op.ends <= clock::monotonic_millis()
        {
            op.applied = true;
            if op.succeeds
                && let Some(c) = clusters.get_mut(&op.member)
            {
                let was = c.cluster.clone();
                apply_target(&mut c.cluster, &op.target);
                if let Some(r) = &c.knobs.rollback
                    && op.target.rollback.is_none()
                {
                    let until = self
                        .origin
                        .plus((r.until_seconds / self.scale).round() as i64);
                    flotilla_engine::engine::offer_rollbacks(&mut c.cluster, &was, until);
                }
            }
        }
    }
}

#[async_trait]
impl Driver for SimDriver {
    fn time_scale(&self) -> f64 {
        self.scale
    }

    fn expected_duration(&self, member: &MemberRef) -> Option<Duration> {
        let state = self.state.lock().ok()?;
        let cluster = [&member.cluster_resource_id, &member.name]
            .into_iter()
            .find_map(|k| state.0.get(k))
            .or(self.default.as_ref())?;
        let seconds = cluster.knobs.duration_seconds.unwrap_or(600.0).max(0.0) / self.scale;
        Some(Duration::from_secs_f64(seconds))
    }

    async fn observe(&self, member: &MemberRef) -> Result<ClusterSpec, DriverError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| DriverError::permanent("simulator state poisoned"))?;
        let key = self.key(member, &mut state.0).ok_or_else(|| {
            DriverError::permanent(format!(
                "no simulated cluster {:?} in the fleet's sim driver",
                member.cluster_resource_id
            ))
        })?;
        for op in state.0[&key].operations.clone() {
            self.settle_one(&mut state, &op);
        }
        Ok(state.0[&key].cluster.spec())
    }

    async fn start_upgrade(
        &self,
        member: &MemberRef,
        target: &Target,
        key: &str,
    ) -> Result<String, DriverError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| DriverError::permanent("simulator state poisoned"))?;
        if state.1.contains_key(key) {
            return Ok(key.to_string());
        }
        let cluster_key = self.key(member, &mut state.0).ok_or_else(|| {
            DriverError::permanent(format!(
                "no simulated cluster {:?} in the fleet's sim driver",
                member.cluster_resource_id
            ))
        })?;
        let c = state
            .0
            .get_mut(&cluster_key)
            .ok_or_else(|| DriverError::permanent("cluster vanished"))?;
        c.attempts += 1;
        c.operations.push(key.to_string());
        let fails = (c.knobs.outcome.as_deref() == Some("fail")
            && c.knobs.fail_attempts.is_none_or(|n| c.attempts <= n))
            || c.knobs.fail_operations.contains(&c.attempts);
        let seconds = c.knobs.duration_seconds.unwrap_or(600.0).max(0.0) / self.scale;
        let message = c
            .knobs
            .fail_message
            .clone()
            .unwrap_or_else(|| "simulated upgrade failure".into());
        state.1.insert(
            key.to_string(),
            SimOperation {
                member: cluster_key,
                ends: clock::monotonic_millis().saturating_add((seconds * 1000.0).round() as i64),
                succeeds: !fails,
                message,
                target: target.clone(),
                applied: false,
            },
        );
        Ok(key.to_string())
    }

    async fn poll(
        &self,
        _member: &MemberRef,
        operation_id: &str,
        _key: &str,
    ) -> Result<OperationState, DriverError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| DriverError::permanent("simulator state poisoned"))?;
        self.settle_one(&mut state, operation_id);
        Ok(match state.1.get(operation_id) {
            None => OperationState::Unknown,
            Some(op) if !op.applied => OperationState::Running,
            Some(op) if op.succeeds => OperationState::Succeeded,
            Some(op) => OperationState::Failed(op.message.clone()),
        })
    }

    async fn catalog(&self) -> Result<Catalog, DriverError> {
        Ok(self.published_at((self.clock)()))
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(20)
    }

    fn operation_deadline(&self) -> Duration {
        self.deadline
    }

    fn poll_after(&self, operation_id: &str) -> Duration {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.1.get(operation_id) {
            Some(op) if !op.applied => Duration::from_millis(
                op.ends.saturating_sub(clock::monotonic_millis()).max(1) as u64,
            ),
            _ => Duration::from_millis(1),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// exec

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExecConfig {
    #[serde(rename = "type")]
    _kind: String,
    observe: Vec<String>,
    upgrade: Vec<String>,
    poll: Vec<String>,
    /// Run instead of `upgrade` for the provider's rollback of one scope (SEMANTICS §15);
    /// absent, the driver rolls nothing back.
    #[serde(default)]
    rollback: Option<Vec<String>>,
    #[serde(default)]
    catalog: Option<Vec<String>>,
    #[serde(default = "default_timeout")]
    timeout_seconds: f64,
    #[serde(default = "default_poll")]
    poll_interval_seconds: f64,
    #[serde(default = "default_deadline")]
    operation_deadline_seconds: f64,
}

fn default_timeout() -> f64 {
    120.0
}

fn default_poll() -> f64 {
    2.0
}

/// Runs the user's argv templates as subprocesses; they print JSON on stdout.
pub struct ExecDriver {
    config: ExecConfig,
    timeout: Duration,
    poll_interval: Duration,
    deadline: Duration,
}

/// The exit code with which an `exec` command says a definitive no (API.md).
const PERMANENT_EXIT: i32 = 2;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpgradeReply {
    #[serde(default)]
    operation_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PollReply {
    state: String,
    #[serde(default)]
    message: Option<String>,
}

impl ExecDriver {
    /// An exec driver whose commands are not checked against allowed directories: for tests
    /// of the driver itself. The server builds drivers with [`ExecDriver::with_allow`].
    pub fn new(config: &Value) -> Result<ExecDriver, DriverError> {
        ExecDriver::build(config, None)
    }

    pub fn with_allow(config: &Value, allow: &ExecAllow) -> Result<ExecDriver, DriverError> {
        ExecDriver::build(config, Some(allow))
    }

    fn build(config: &Value, allow: Option<&ExecAllow>) -> Result<ExecDriver, DriverError> {
        let mut config: ExecConfig = from_json_value(config.clone(), "properties.driver")
            .map_err(|e| DriverError::permanent(e.message))?;
        let member = ["member", "clusterResourceId"];
        let upgrade = [
            "member",
            "clusterResourceId",
            "operationKey",
            "upgradeType",
            "kubernetesVersion",
            "nodeImageVersion",
            "nodeImages",
        ];
        let poll = ["member", "clusterResourceId", "operationId", "operationKey"];
        let rollback = [
            "member",
            "clusterResourceId",
            "operationKey",
            "rollbackScope",
            "pool",
            "kubernetesVersion",
            "nodeImageVersion",
        ];
        let catalog_argv = config.catalog.clone();
        let rollback_argv = config.rollback.clone();
        let none = Vec::new();
        for (field, argv, known) in [
            ("observe", &config.observe, &member[..]),
            ("upgrade", &config.upgrade, &upgrade[..]),
            ("poll", &config.poll, &poll[..]),
            ("catalog", catalog_argv.as_ref().unwrap_or(&none), &[][..]),
            (
                "rollback",
                rollback_argv.as_ref().unwrap_or(&none),
                &rollback[..],
            ),
        ] {
            // An optional command may be absent, never present and empty (there would be no
            // program to run).
            let absent = match field {
                "catalog" => catalog_argv.is_none(),
                "rollback" => rollback_argv.is_none(),
                _ => false,
            };
            if argv.is_empty() && !absent {
                return Err(DriverError::permanent(format!(
                    "properties.driver.{field}: needs at least the program to run"
                )));
            }
            for (i, arg) in argv.iter().enumerate() {
                if let Some(unknown) = placeholders(arg).find(|p| !known.contains(p)) {
                    return Err(DriverError::permanent(format!(
                        "properties.driver.{field}[{i}] {arg:?}: unknown placeholder {{{unknown}}}; {field} knows {}",
                        known
                            .iter()
                            .map(|k| format!("{{{k}}}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
            if let Some(program) = argv.first()
                && placeholders(program).next().is_some()
            {
                return Err(DriverError::permanent(format!(
                    "properties.driver.{field}[0] {program:?}: the program cannot hold a placeholder"
                )));
            }
        }
        if let Some(allow) = allow {
            for (field, argv) in [
                ("observe", &mut config.observe),
                ("upgrade", &mut config.upgrade),
                ("poll", &mut config.poll),
            ] {
                if let Some(program) = argv.first_mut() {
                    *program = allow.check(program, &format!("properties.driver.{field}[0]"))?;
                }
            }
            if let Some(program) = config.catalog.as_mut().and_then(|c| c.first_mut()) {
                *program = allow.check(program, "properties.driver.catalog[0]")?;
            }
            if let Some(program) = config.rollback.as_mut().and_then(|c| c.first_mut()) {
                *program = allow.check(program, "properties.driver.rollback[0]")?;
            }
        }
        let timeout = bounded_seconds(
            config.timeout_seconds,
            "properties.driver.timeoutSeconds",
            0.01,
            86_400.0,
        )?;
        let poll_interval = bounded_seconds(
            config.poll_interval_seconds,
            "properties.driver.pollIntervalSeconds",
            0.01,
            3_600.0,
        )?;
        let deadline = operation_deadline(config.operation_deadline_seconds)?;
        Ok(ExecDriver {
            config,
            timeout: Duration::from_secs_f64(timeout),
            poll_interval: Duration::from_secs_f64(poll_interval),
            deadline,
        })
    }

    async fn run(
        &self,
        what: &str,
        template: &[String],
        vars: &[(&str, String)],
    ) -> Result<Value, DriverError> {
        let argv: Vec<String> = template
            .iter()
            .map(|arg| {
                vars.iter()
                    .fold(arg.clone(), |a, (k, v)| a.replace(&format!("{{{k}}}"), v))
            })
            .collect();
        let Some(program) = argv.first() else {
            return Err(DriverError::permanent(format!(
                "properties.driver.{what}: needs at least the program to run"
            )));
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // The server's own resources running out (no file descriptors, no processes) is never
        // the member's failure: transient.
        let child = command.spawn().map_err(|e| {
            DriverError::transient(format!("{what}: cannot run {:?}: {e}", program))
        })?;
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                DriverError::transient(format!(
                    "{what}: {:?} timed out after {}s",
                    program,
                    self.timeout.as_secs_f64()
                ))
            })?
            .map_err(|e| DriverError::transient(format!("{what}: {e}")))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim();
        if !output.status.success() {
            let code = output.status.code();
            let text = match code {
                // Exit 2 is the command's definitive "no": its output is the message.
                Some(PERMANENT_EXIT) => {
                    let stdout = String::from_utf8_lossy(&output.stdout);
                    let said = [stdout.trim(), stderr]
                        .into_iter()
                        .filter(|t| !t.is_empty())
                        .collect::<Vec<_>>()
                        .join(": ");
                    return Err(DriverError::permanent(if said.is_empty() {
                        format!("{what}: {:?} refused it (exit 2)", program)
                    } else {
                        format!("{what}: {}", truncate(&said))
                    }));
                }
                Some(c) => format!("code {c}"),
                None => "a signal".to_string(),
            };
            return Err(DriverError::transient(format!(
                "{what}: {:?} exited with {text}{}",
                program,
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {}", truncate(stderr))
                }
            )));
        }
        serde_json::from_slice(&output.stdout).map_err(|e| {
            DriverError::transient(format!(
                "{what}: {:?} printed something that is not JSON ({e}): {}",
                program,
                truncate(&String::from_utf8_lossy(&output.stdout))
            ))
        })
    }

    /// The provider's rollback of one scope (SEMANTICS §15): the `rollback` command with the
    /// scope, the pool and the versions to go back to; its reply is an upgrade's, and the
    /// operation is polled like any other.
    async fn start_rollback(
        &self,
        member: &MemberRef,
        target: &Target,
        rollback: &Rollback,
        key: &str,
    ) -> Result<String, DriverError> {
        let Some(argv) = &self.config.rollback else {
            return Err(DriverError::permanent(format!(
                "the exec driver has no rollback command (properties.driver.rollback), so it cannot roll back {}",
                rollback.scope
            )));
        };
        let mut vars = ExecDriver::member_vars(member);
        vars.push(("operationKey", key.to_string()));
        let (scope, pool, version, image) = match &rollback.scope {
            RollbackScope::ControlPlane => (
                "ControlPlane",
                String::new(),
                target.kubernetes_version,
                String::new(),
            ),
            RollbackScope::NodePool(pool) => {
                let image = target
                    .node_images
                    .iter()
                    .find(|p| &p.pool == pool)
                    .or(target.node_images.first())
                    .map(|p| format!("{}-{}", p.family, p.image))
                    .unwrap_or_default();
                (
                    "NodePool",
                    pool.clone(),
                    rollback.orchestrator_version.or(target.kubernetes_version),
                    image,
                )
            }
        };
        vars.push(("rollbackScope", scope.to_string()));
        vars.push(("pool", pool));
        vars.push((
            "kubernetesVersion",
            version.map(|v| v.to_string()).unwrap_or_default(),
        ));
        vars.push(("nodeImageVersion", image));
        let reply = self.run("rollback", argv, &vars).await?;
        let reply: UpgradeReply =
            serde_json::from_value(reply).unwrap_or(UpgradeReply { operation_id: None });
        Ok(reply.operation_id.unwrap_or_else(|| key.to_string()))
    }

    fn member_vars(member: &MemberRef) -> Vec<(&'static str, String)> {
        vec![
            ("member", member.name.clone()),
            ("clusterResourceId", member.cluster_resource_id.clone()),
        ]
    }
}

/// The `{name}` placeholders of an argument: a name in braces (other braces, JSON in a shell
/// script say, are text).
fn placeholders(arg: &str) -> impl Iterator<Item = &str> {
    arg.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .filter(|name| {
            name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

fn truncate(text: &str) -> String {
    let t: String = text.chars().take(400).collect();
    if t.len() < text.len() {
        format!("{t}…")
    } else {
        t
    }
}

#[async_trait]
impl Driver for ExecDriver {
    async fn observe(&self, member: &MemberRef) -> Result<ClusterSpec, DriverError> {
        let value = self
            .run(
                "observe",
                &self.config.observe,
                &ExecDriver::member_vars(member),
            )
            .await?;
        serde_json::from_value(value).map_err(|e| {
            DriverError::permanent(format!("observe: the cluster JSON is not valid: {e}"))
        })
    }

    async fn start_upgrade(
        &self,
        member: &MemberRef,
        target: &Target,
        key: &str,
    ) -> Result<String, DriverError> {
        if let Some(rollback) = &target.rollback {
            return self.start_rollback(member, target, rollback, key).await;
        }
        let mut vars = ExecDriver::member_vars(member);
        let images: Vec<Value> = target
            .node_images
            .iter()
            .map(|p| json!({"pool": p.pool, "nodeImageVersion": format!("{}-{}", p.family, p.image)}))
            .collect();
        vars.push(("operationKey", key.to_string()));
        vars.push(("upgradeType", format!("{:?}", target.upgrade_type)));
        vars.push((
            "kubernetesVersion",
            target
                .kubernetes_version
                .map(|v| v.to_string())
                .unwrap_or_default(),
        ));
        vars.push((
            "nodeImageVersion",
            target
                .node_images
                .first()
                .map(|p| format!("{}-{}", p.family, p.image))
                .unwrap_or_default(),
        ));
        vars.push(("nodeImages", Value::Array(images).to_string()));
        let reply = self.run("upgrade", &self.config.upgrade, &vars).await?;
        let reply: UpgradeReply =
            serde_json::from_value(reply).unwrap_or(UpgradeReply { operation_id: None });
        Ok(reply.operation_id.unwrap_or_else(|| key.to_string()))
    }

    async fn poll(
        &self,
        member: &MemberRef,
        operation_id: &str,
        key: &str,
    ) -> Result<OperationState, DriverError> {
        let mut vars = ExecDriver::member_vars(member);
        vars.push(("operationId", operation_id.to_string()));
        vars.push(("operationKey", key.to_string()));
        let reply: PollReply = serde_json::from_value(
            self.run("poll", &self.config.poll, &vars).await?,
        )
        .map_err(|e| DriverError::permanent(format!("poll: expected {{\"state\": …}}: {e}")))?;
        Ok(match reply.state.as_str() {
            "Running" | "InProgress" => OperationState::Running,
            "Succeeded" => OperationState::Succeeded,
            "Failed" => {
                OperationState::Failed(reply.message.unwrap_or_else(|| "the upgrade failed".into()))
            }
            "Unknown" | "NotFound" => OperationState::Unknown,
            other => {
                return Err(DriverError::permanent(format!(
                    "poll: unknown state {other:?}"
                )));
            }
        })
    }

    async fn catalog(&self) -> Result<Catalog, DriverError> {
        let Some(argv) = &self.config.catalog else {
            return Ok(Catalog::default());
        };
        let value = self.run("catalog", argv, &[]).await?;
        let spec: CatalogSpec = serde_json::from_value(value)
            .map_err(|e| DriverError::permanent(format!("catalog: {e}")))?;
        Catalog::parse(&spec, "catalog").map_err(|e| DriverError::permanent(e.message))
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
    use flotilla_engine::strategy::UpgradeType;

    fn exec(upgrade: &str, timeout: f64) -> ExecDriver {
        ExecDriver::new(&json!({
            "type": "exec",
            "observe": ["sh", "-c", "echo '{\"region\":\"eastus\",\"kubernetesVersion\":\"1.30.5\",\"nodePools\":[]}'"],
            "upgrade": ["sh", "-c", upgrade, "upgrade", "{member}", "{operationKey}", "{kubernetesVersion}"],
            "poll": ["sh", "-c", "echo '{\"state\":\"Failed\",\"message\":\"drain timed out\"}'"],
            "timeoutSeconds": timeout,
        }))
        .expect("valid config")
    }

    fn target() -> Target {
        Target {
            rollback: None,
            upgrade_type: UpgradeType::ControlPlaneOnly,
            kubernetes_version: flotilla_engine::version::KubeVersion::parse("1.31.1"),
            node_images: vec![],
        }
    }

    fn who() -> MemberRef {
        MemberRef {
            name: "m1".into(),
            cluster_resource_id: "/c/m1".into(),
        }
    }

    #[tokio::test]
    async fn exec_passes_placeholders_and_reads_json() {
        let driver = exec(
            "printf '{\"operationId\":\"%s-%s-%s\"}' \"$1\" \"$2\" \"$3\"",
            10.0,
        );
        let id = driver
            .start_upgrade(&who(), &target(), "k1")
            .await
            .expect("starts");
        assert_eq!(id, "m1-k1-1.31.1");
        let cluster = driver.observe(&who()).await.expect("observes");
        assert_eq!(cluster.kubernetes_version, "1.30.5");
        assert_eq!(
            driver.poll(&who(), &id, &id).await.expect("polls"),
            OperationState::Failed("drain timed out".into())
        );
    }

    #[tokio::test]
    async fn exec_poll_gets_the_operation_id_and_the_attempt_key_apart() {
        // The poll answers Succeeded only when given the driver's id and the attempt's key,
        // each in its own placeholder.
        let poll = r#"if [ "$1" = "op-77" ] && [ "$2" = "f.r.1" ]; then echo '{"state":"Succeeded"}'; else echo "got $1 $2" >&2; exit 2; fi"#;
        let driver = ExecDriver::new(&json!({
            "type": "exec",
            "observe": ["sh", "-c", "echo '{\"region\":\"eastus\",\"kubernetesVersion\":\"1.30.5\",\"nodePools\":[]}'"],
            "upgrade": ["sh", "-c", "echo '{\"operationId\":\"op-77\"}'"],
            "poll": ["sh", "-c", poll, "poll", "{operationId}", "{operationKey}"],
        }))
        .expect("valid config");
        let id = driver
            .start_upgrade(&who(), &target(), "f.r.1")
            .await
            .expect("starts");
        assert_eq!(id, "op-77");
        assert_eq!(
            driver.poll(&who(), &id, "f.r.1").await.expect("polls"),
            OperationState::Succeeded
        );
    }

    #[tokio::test]
    async fn exec_failures_carry_the_exit_code_and_stderr() {
        let err = exec("echo 'quota exceeded in eastus' >&2; exit 3", 10.0)
            .start_upgrade(&who(), &target(), "k1")
            .await
            .unwrap_err();
        assert!(
            err.message.contains("code 3") && err.message.contains("quota exceeded"),
            "{err}"
        );
        let err = exec("echo not json", 10.0)
            .start_upgrade(&who(), &target(), "k1")
            .await
            .unwrap_err();
        assert!(err.message.contains("not JSON"), "{err}");
        let err = exec("sleep 5", 0.2)
            .start_upgrade(&who(), &target(), "k1")
            .await
            .unwrap_err();
        assert!(err.message.contains("timed out"), "{err}");
        let err = ExecDriver::new(
            &json!({"type": "exec", "observe": [], "upgrade": ["x"], "poll": ["x"]}),
        )
        .err()
        .expect("refused");
        assert!(err.message.contains("properties.driver.observe"), "{err}");
    }

    /// A driver whose `rollback` command prints what it was given, one placeholder per
    /// argument, as its operation id.
    fn exec_with_rollback() -> ExecDriver {
        ExecDriver::new(&json!({
            "type": "exec",
            "observe": ["sh", "-c", "echo '{\"region\":\"eastus\",\"kubernetesVersion\":\"1.31.1\",\"nodePools\":[]}'"],
            "upgrade": ["sh", "-c", "echo upgrade was called >&2; exit 2"],
            "rollback": ["sh", "-c", "printf '{\"operationId\":\"%s|%s|%s|%s|%s|%s\"}' \"$1\" \"$2\" \"$3\" \"$4\" \"$5\" \"$6\"", "rollback",
                         "{member}", "{operationKey}", "{rollbackScope}", "{pool}", "{kubernetesVersion}", "{nodeImageVersion}"],
            "poll": ["sh", "-c", "echo '{\"state\":\"Succeeded\"}'"],
        }))
        .expect("valid config")
    }

    fn control_plane_rollback() -> Target {
        Target {
            upgrade_type: UpgradeType::ControlPlaneOnly,
            kubernetes_version: KubeVersion::parse("1.30.5"),
            node_images: vec![],
            rollback: Some(Rollback {
                scope: RollbackScope::ControlPlane,
                orchestrator_version: None,
            }),
        }
    }

    fn node_pool_rollback() -> Target {
        Target {
            upgrade_type: UpgradeType::NodeImageOnly,
            kubernetes_version: None,
            node_images: vec![flotilla_engine::engine::PoolTarget {
                pool: "np1".into(),
                family: "AKSUbuntu-2204gen2containerd".into(),
                image: ImageVersion::parse("202601.05.0").expect("image"),
            }],
            rollback: Some(Rollback {
                scope: RollbackScope::NodePool("np1".into()),
                orchestrator_version: KubeVersion::parse("1.30.5"),
            }),
        }
    }

    /// SEMANTICS §15: a rollback target runs the `rollback` command, never `upgrade`, with the
    /// scope, the pool and the versions to go back to; its operation is polled like any other.
    #[tokio::test]
    async fn exec_rollback_runs_its_own_command_with_the_scope() {
        let driver = exec_with_rollback();
        let id = driver
            .start_upgrade(&who(), &control_plane_rollback(), "k-cp")
            .await
            .expect("starts");
        assert_eq!(id, "m1|k-cp|ControlPlane||1.30.5|");
        let id = driver
            .start_upgrade(&who(), &node_pool_rollback(), "k-np")
            .await
            .expect("starts");
        assert_eq!(
            id,
            "m1|k-np|NodePool|np1|1.30.5|AKSUbuntu-2204gen2containerd-202601.05.0"
        );
        assert_eq!(
            driver.poll(&who(), &id, "k-np").await.expect("polls"),
            OperationState::Succeeded
        );
        // An upgrade target still runs `upgrade` (which refuses here).
        let err = driver
            .start_upgrade(&who(), &target(), "k-up")
            .await
            .unwrap_err();
        assert!(err.message.contains("upgrade was called"), "{err}");
    }

    /// Without a `rollback` command a rollback target is a definitive no that says so; nothing
    /// runs (the `upgrade` command would take the cluster the wrong way).
    #[tokio::test]
    async fn exec_without_a_rollback_command_refuses_a_rollback() {
        let driver = exec("echo upgrade was called >&2; exit 3", 10.0);
        for target in [control_plane_rollback(), node_pool_rollback()] {
            let err = driver
                .start_upgrade(&who(), &target, "k1")
                .await
                .unwrap_err();
            assert_eq!(err.kind, ErrorKind::Permanent, "{err}");
            assert!(
                err.message.contains("no rollback command")
                    && err.message.contains("properties.driver.rollback")
                    && !err.message.contains("upgrade was called"),
                "{err}"
            );
        }
        assert!(
            driver
                .start_upgrade(&who(), &node_pool_rollback(), "k1")
                .await
                .unwrap_err()
                .message
                .contains("node pool \"np1\""),
        );
    }

    /// The `rollback` command is checked like the others: known placeholders only (an
    /// upgrade's `{upgradeType}` is not one), a program, from an allowed directory; the error
    /// names the field and the value.
    #[test]
    fn a_rollback_command_is_validated_like_the_others() {
        let allow = ExecAllow::default();
        let config = |rollback: Value| json!({"type": "exec", "observe": ["x"], "upgrade": ["x"], "poll": ["x"], "rollback": rollback});
        for (rollback, field, value) in [
            (
                json!(["x", "{upgradeType}"]),
                "properties.driver.rollback[1]",
                "{upgradeType}",
            ),
            (
                json!(["x", "--to={kubernetesVersion}", "{scope}"]),
                "properties.driver.rollback[2]",
                "{scope}",
            ),
            (
                json!([]),
                "properties.driver.rollback",
                "needs at least the program",
            ),
            (
                json!(["{pool}"]),
                "properties.driver.rollback[0]",
                "cannot hold a placeholder",
            ),
            (
                json!("rollback.sh"),
                "properties.driver.rollback",
                "rollback.sh",
            ),
        ] {
            let err = ExecDriver::new(&config(rollback.clone()))
                .err()
                .expect("refused");
            assert!(
                err.message.contains(field) && err.message.contains(value),
                "{rollback}: {err}"
            );
            let err =
                validate_driver_config(&config(rollback.clone()), &allow).expect_err("refused");
            assert_eq!(err.field, field, "{rollback}: {}", err.message);
        }
        let every = json!([
            "x",
            "{member}",
            "{clusterResourceId}",
            "{operationKey}",
            "{rollbackScope}",
            "{pool}",
            "{kubernetesVersion}",
            "{nodeImageVersion}"
        ]);
        assert!(ExecDriver::new(&config(every)).is_ok());
        // An empty catalog command is refused too (it had no program to run).
        let err = ExecDriver::new(&json!({"type": "exec", "observe": ["x"], "upgrade": ["x"], "poll": ["x"], "catalog": []}))
            .err()
            .expect("refused");
        assert!(err.message.contains("properties.driver.catalog:"), "{err}");
        // From an allowed directory only, like every exec command.
        let dir = std::env::temp_dir().join(format!("flotilla-allow-rb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let script = dir.join("s.sh");
        std::fs::write(&script, "#!/bin/sh\n").expect("script");
        let script = script.display().to_string();
        let allowed = ExecAllow::new(std::slice::from_ref(&dir)).expect("allow");
        let with = |rollback: &str| json!({"type": "exec", "observe": [script], "upgrade": [script], "poll": [script], "rollback": [rollback, "{operationKey}"]});
        assert!(ExecDriver::with_allow(&with(&script), &allowed).is_ok());
        let err = ExecDriver::with_allow(&with("/bin/sh"), &allowed)
            .err()
            .expect("refused");
        assert!(
            err.message.contains("properties.driver.rollback[0]")
                && err.message.contains("not in a directory"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// API.md: exit 2 is a permanent failure with its output as the message; any other exit, a
    /// timeout, output that is not JSON and a command that cannot be spawned are transient.
    #[tokio::test]
    async fn exec_errors_are_transient_except_exit_2() {
        let err = exec("echo 'cluster is on an unsupported SKU'; exit 2", 10.0)
            .start_upgrade(&who(), &target(), "k1")
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Permanent, "{err}");
        assert!(err.message.contains("unsupported SKU"), "{err}");
        for script in ["exit 1", "exit 3", "echo not json", "sleep 5", "kill -9 $$"] {
            let err = exec(script, 0.3)
                .start_upgrade(&who(), &target(), "k1")
                .await
                .unwrap_err();
            assert_eq!(err.kind, ErrorKind::Transient, "{script}: {err}");
        }
        let missing = ExecDriver::new(&json!({
            "type": "exec", "observe": ["/nonexistent/observe"], "upgrade": ["x"], "poll": ["x"],
        }))
        .expect("valid");
        let err = missing.observe(&who()).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Transient, "{err}");
    }

    /// Hardening items 9 and 12: an unknown `{placeholder}` is refused with its field (it was
    /// passed literally), and an exec command runs only from a directory the server allows (any
    /// admin token could make the server run any program).
    #[test]
    fn exec_commands_come_from_allowed_directories_with_known_placeholders() {
        let dir = std::env::temp_dir().join(format!("flotilla-allow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let script = dir.join("observe.sh");
        std::fs::write(&script, "#!/bin/sh\necho '{}'\n").expect("script");
        let script = script.display().to_string();
        let config = |observe: Vec<String>| json!({"type": "exec", "observe": observe, "upgrade": [script.clone(), "{operationKey}"], "poll": [script.clone(), "{operationId}"]});
        let allow = ExecAllow::new(std::slice::from_ref(&dir)).expect("allow");
        assert!(
            ExecDriver::with_allow(&config(vec![script.clone(), "{member}".into()]), &allow)
                .is_ok()
        );
        let err = ExecDriver::with_allow(&config(vec![script.clone(), "{membr}".into()]), &allow)
            .err()
            .expect("refused");
        assert!(
            err.message.contains("properties.driver.observe[1]") && err.message.contains("{membr}"),
            "{err}"
        );
        let err = ExecDriver::with_allow(&config(vec!["sh".into(), script.clone()]), &allow)
            .err()
            .expect("refused");
        assert!(
            err.message.contains("properties.driver.observe[0]")
                && err.message.contains("--exec-allow"),
            "{err}"
        );
        let err = ExecDriver::with_allow(&config(vec![script.clone()]), &ExecAllow::default())
            .err()
            .expect("refused");
        assert!(err.message.contains("allows no exec commands"), "{err}");
        // A link into an allowed directory from outside is followed: the target decides.
        let outside = std::env::temp_dir().join(format!("flotilla-outside-{}", std::process::id()));
        std::fs::create_dir_all(&outside).expect("dir");
        let link = dir.join("sh-link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/bin/sh", &link).expect("link");
        let err = ExecDriver::with_allow(&config(vec![link.display().to_string()]), &allow)
            .err()
            .expect("refused");
        assert!(err.message.contains("not in a directory"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&outside);
    }

    /// A refused configuration names its field in full, not only `properties.driver`
    /// (Hardening, item 10).
    #[test]
    fn a_refused_driver_config_names_its_field() {
        let allow = ExecAllow::default();
        for (config, field) in [
            (
                json!({"type": "sim", "timeScale": "x"}),
                "properties.driver.timeScale",
            ),
            (
                json!({"type": "sim", "timeScale": 0}),
                "properties.driver.timeScale",
            ),
            (
                json!({"type": "sim", "clusters": {"c1": {"region": 5}}}),
                "properties.driver.clusters.c1.region",
            ),
            (
                json!({"type": "exec", "observe": ["x"], "upgrade": ["x"], "poll": ["x"], "timeoutSeconds": "x"}),
                "properties.driver.timeoutSeconds",
            ),
            (json!({"type": "nope"}), "properties.driver.type"),
            (json!({}), "properties.driver.type"),
        ] {
            let err = validate_driver_config(&config, &allow).expect_err("refused");
            assert_eq!(err.field, field, "{config}: {}", err.message);
        }
    }

    /// Every number of seconds a user sends is bounded before it becomes a duration, and the
    /// error names the field and the value (a panic in `Duration::from_secs_f64` before).
    #[test]
    fn unbounded_numbers_in_driver_configs_are_refused_with_their_field() {
        let exec = |extra: Value| {
            let mut config =
                json!({"type": "exec", "observe": ["x"], "upgrade": ["x"], "poll": ["x"]});
            config
                .as_object_mut()
                .expect("object")
                .extend(extra.as_object().expect("object").clone());
            ExecDriver::new(&config).err()
        };
        for (extra, field) in [
            (
                json!({"timeoutSeconds": 1e20}),
                "properties.driver.timeoutSeconds 100000000000000000000",
            ),
            (
                json!({"timeoutSeconds": 0}),
                "properties.driver.timeoutSeconds 0",
            ),
            (
                json!({"pollIntervalSeconds": 1e20}),
                "properties.driver.pollIntervalSeconds",
            ),
            (
                json!({"pollIntervalSeconds": -1}),
                "properties.driver.pollIntervalSeconds -1",
            ),
            (
                json!({"operationDeadlineSeconds": 1e300}),
                "properties.driver.operationDeadlineSeconds",
            ),
        ] {
            let err = exec(extra.clone()).expect("refused");
            assert!(err.message.contains(field), "{extra}: {err}");
        }
        assert!(exec(json!({"timeoutSeconds": 30, "operationDeadlineSeconds": 3600})).is_none());
        for (config, field) in [
            (
                json!({"type": "sim", "timeScale": 1e-300}),
                "properties.driver.timeScale",
            ),
            (
                json!({"type": "sim", "timeScale": 1e300}),
                "properties.driver.timeScale",
            ),
            (
                json!({"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5", "sim": {"durationSeconds": 1e300}}}),
                "properties.driver.defaultCluster.sim.durationSeconds",
            ),
            (
                json!({"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5", "sim": {"durationSeconds": -5}}}),
                "properties.driver.defaultCluster.sim.durationSeconds -5",
            ),
        ] {
            let err = SimDriver::new(&config).err().expect("refused");
            assert!(err.message.contains(field), "{config}: {err}");
        }
    }

    #[tokio::test]
    async fn sim_is_idempotent_per_key_and_fails_as_configured() {
        let driver = SimDriver::new(&json!({
            "type": "sim", "timeScale": 1000,
            "clusters": {"/c/m1": {"region": "eastus", "kubernetesVersion": "1.30.5", "sim": {"durationSeconds": 1, "outcome": "fail", "failAttempts": 1}}},
        }))
        .expect("valid");
        let first = driver
            .start_upgrade(&who(), &target(), "a1")
            .await
            .expect("starts");
        let again = driver
            .start_upgrade(&who(), &target(), "a1")
            .await
            .expect("same key");
        assert_eq!(first, again);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(matches!(
            driver.poll(&who(), "a1", "a1").await.expect("polls"),
            OperationState::Failed(_)
        ));
        assert_eq!(
            driver
                .poll(&who(), "never-sent", "never-sent")
                .await
                .expect("polls"),
            OperationState::Unknown
        );
        driver
            .start_upgrade(&who(), &target(), "a2")
            .await
            .expect("second attempt");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            driver.poll(&who(), "a2", "a2").await.expect("polls"),
            OperationState::Succeeded
        );
        assert_eq!(
            driver
                .observe(&who())
                .await
                .expect("observes")
                .kubernetes_version,
            "1.31.1"
        );
    }

    fn with_feed(extra: Value) -> Result<SimDriver, DriverError> {
        let mut config = json!({
            "type": "sim", "timeScale": 60,
            "catalog": {
                "eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.2"}], "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202602.10.0"}]}},
                "westeurope": {"kubernetes": [{"version": "1.31.2"}]},
            },
        });
        if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        SimDriver::new(&config)
    }

    /// The versions available in a region at `now`: listed, and arrived (a version announced
    /// for later is listed with its `availableAt`).
    fn kube_in(catalog: &Catalog, region: &str, now: Time) -> Vec<String> {
        catalog.regions[region]
            .kubernetes
            .iter()
            .filter(|k| k.available_at.is_none_or(|t| t <= now))
            .map(|k| k.version.to_string())
            .collect()
    }

    #[test]
    fn the_release_timeline_comes_out_time_scaled_region_by_region() {
        let driver = with_feed(json!({"releases": [
            {"at": "+2m", "kubernetesVersion": "1.31.4", "regions": {"eastus": "0s", "westeurope": "1h"}},
        ]}))
        .expect("valid");
        let at = |s: i64| driver.origin.plus(s);
        let kube = |s: i64, region: &str| kube_in(&driver.published_at(at(s)), region, at(s));
        // 60 simulated seconds per second: 2 minutes are 2 seconds, an hour a minute.
        assert_eq!(kube(1, "eastus"), ["1.30.5", "1.31.2"]);
        assert_eq!(kube(2, "eastus"), ["1.30.5", "1.31.2", "1.31.4"]);
        assert_eq!(kube(2, "westeurope"), ["1.31.2"]);
        assert_eq!(kube(62, "westeurope"), ["1.31.2", "1.31.4"]);
        // Once out in eastus, its arrival in westeurope is announced (SEMANTICS §11: what a
        // forecast knows); before it is out anywhere, nothing is.
        let later = |s: i64| {
            driver.published_at(at(s)).regions["westeurope"]
                .kubernetes
                .iter()
                .find(|k| k.version.to_string() == "1.31.4")
                .map(|k| k.available_at)
        };
        assert_eq!(later(1), None);
        assert_eq!(later(2), Some(Some(at(62))));
    }

    #[test]
    fn the_generated_feed_publishes_patches_minors_and_images() {
        let driver = with_feed(json!({"feed": {"patchEvery": "7d", "minorEvery": "30d", "nodeImageEvery": "7d", "regionDelay": "1d"}}))
            .expect("valid");
        // 60x: a simulated week is 10080 seconds.
        let week = 7 * 86_400 / 60;
        let now = driver.origin.plus(week);
        let c = driver.published_at(now);
        assert_eq!(kube_in(&c, "eastus", now), ["1.30.5", "1.31.2", "1.31.3"]);
        assert_eq!(
            kube_in(&c, "westeurope", now),
            ["1.31.2"],
            "a day later there"
        );
        let images: Vec<String> = c.regions["eastus"].node_images["AKSUbuntu-2204gen2containerd"]
            .iter()
            .map(|i| i.version.to_string())
            .collect();
        assert_eq!(images, ["202602.10.0", "202602.10.1"]);
        // After 30 simulated days: patches on 7, 14, 21, 28 and the minor 1.32.0 on 30.
        let now = driver.origin.plus(30 * 86_400 / 60);
        let c = driver.published_at(now);
        assert_eq!(
            kube_in(&c, "eastus", now),
            [
                "1.30.5", "1.31.2", "1.31.3", "1.31.4", "1.31.5", "1.31.6", "1.32.0"
            ]
        );
    }

    #[test]
    fn bad_release_feeds_name_the_field() {
        for (extra, field) in [
            (
                json!({"releases": [{"at": "soon", "kubernetesVersion": "1.31.4"}]}),
                "properties.driver.releases[0].at",
            ),
            (
                json!({"releases": [{"at": 0, "kubernetesVersion": "1.31"}]}),
                "properties.driver.releases[0].kubernetesVersion",
            ),
            (
                json!({"releases": [{"at": 0, "kubernetesVersion": "1.31.4", "regions": {"mars": 0}}]}),
                "properties.driver.releases[0].regions.mars",
            ),
            (
                json!({"feed": {"patchEvery": "0s"}}),
                "properties.driver.feed.patchEvery",
            ),
            (json!({"feed": {"patchEvry": "7d"}}), "properties.driver"),
        ] {
            let err = with_feed(extra.clone()).err().expect("refused");
            assert!(err.message.contains(field), "{extra}: {err}");
        }
    }
}
