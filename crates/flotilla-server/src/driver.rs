//! Drivers: what actually observes and upgrades clusters, behind one trait. `sim` simulates
//! clusters in-process with a time scale; `exec` runs the user's commands as subprocesses.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use flotilla_engine::engine::{Target, apply_target};
use flotilla_engine::error::from_json_value;
use flotilla_engine::fleet::{Catalog, CatalogSpec, Cluster, ClusterSpec};

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct DriverError(pub String);

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
    async fn poll(
        &self,
        member: &MemberRef,
        operation_id: &str,
    ) -> Result<OperationState, DriverError>;
    /// The release catalog, per region.
    async fn catalog(&self) -> Result<Catalog, DriverError>;
    /// How often to poll an operation in flight.
    fn poll_interval(&self) -> Duration;

    /// How long to wait before polling this operation next; drivers that know when an operation
    /// ends (the simulator) say so, the others poll at their interval.
    fn poll_after(&self, _operation_id: &str) -> Duration {
        self.poll_interval()
    }
}

/// Builds the driver a fleet's `properties.driver` describes.
pub fn driver_from_config(config: &Value) -> Result<Arc<dyn Driver>, DriverError> {
    match config.get("type").and_then(Value::as_str) {
        Some("sim") => Ok(Arc::new(SimDriver::new(config)?)),
        Some("exec") => Ok(Arc::new(ExecDriver::new(config)?)),
        Some(other) => Err(DriverError(format!(
            "properties.driver.type {other:?}: must be sim or exec"
        ))),
        None => Err(DriverError(
            "properties.driver.type is required (sim or exec)".into(),
        )),
    }
}

/// Checks a driver configuration without keeping the driver.
pub fn validate_driver_config(config: &Value) -> Result<(), DriverError> {
    driver_from_config(config).map(|_| ())
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
}

fn parse_sim_cluster(body: &Value, path: &str) -> Result<SimCluster, DriverError> {
    // The cluster's fields and its `sim` knobs side by side.
    let mut fields = body
        .as_object()
        .cloned()
        .ok_or_else(|| DriverError(format!("{path}: must be an object")))?;
    let knobs: SimKnobs = match fields.remove("sim") {
        Some(k) => {
            from_json_value(k, &format!("{path}.sim")).map_err(|e| DriverError(e.message))?
        }
        None => SimKnobs::default(),
    };
    let spec: ClusterSpec =
        from_json_value(Value::Object(fields), path).map_err(|e| DriverError(e.message))?;
    let cluster = Cluster::parse(&spec, path).map_err(|e| DriverError(e.message))?;
    if let Some(o) = knobs.outcome.as_deref()
        && o != "succeed"
        && o != "fail"
    {
        return Err(DriverError(format!(
            "{path}.sim.outcome {o:?}: must be succeed or fail"
        )));
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
    ends: Instant,
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
    state: Mutex<(HashMap<String, SimCluster>, HashMap<String, SimOperation>)>,
}

impl SimDriver {
    pub fn new(config: &Value) -> Result<SimDriver, DriverError> {
        let config: SimConfig = from_json_value(config.clone(), "properties.driver")
            .map_err(|e| DriverError(e.message))?;
        if !(config.time_scale > 0.0 && config.time_scale.is_finite()) {
            return Err(DriverError(format!(
                "properties.driver.timeScale {}: must be a positive number",
                config.time_scale
            )));
        }
        let catalog = Catalog::parse(&config.catalog, "properties.driver.catalog")
            .map_err(|e| DriverError(e.message))?;
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
        Ok(SimDriver {
            scale: config.time_scale,
            catalog,
            state: Mutex::new((clusters, HashMap::new())),
            default,
        })
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

    /// Applies finished operations to their clusters.
    /// Applies an operation to its cluster once it is due (the simulated cluster changes then).
    fn settle_one(
        state: &mut (HashMap<String, SimCluster>, HashMap<String, SimOperation>),
        key: &str,
    ) {
        let (clusters, ops) = state;
        if let Some(op) = ops.get_mut(key)
            && !op.applied
            && op.ends <= Instant::now()
        {
            op.applied = true;
            if op.succeeds
                && let Some(c) = clusters.get_mut(&op.member)
            {
                apply_target(&mut c.cluster, &op.target);
            }
        }
    }
}

#[async_trait]
impl Driver for SimDriver {
    async fn observe(&self, member: &MemberRef) -> Result<ClusterSpec, DriverError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| DriverError("simulator state poisoned".into()))?;
        let key = self.key(member, &mut state.0).ok_or_else(|| {
            DriverError(format!(
                "no simulated cluster {:?} in the fleet's sim driver",
                member.cluster_resource_id
            ))
        })?;
        for op in state.0[&key].operations.clone() {
            SimDriver::settle_one(&mut state, &op);
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
            .map_err(|_| DriverError("simulator state poisoned".into()))?;
        if state.1.contains_key(key) {
            return Ok(key.to_string());
        }
        let cluster_key = self.key(member, &mut state.0).ok_or_else(|| {
            DriverError(format!(
                "no simulated cluster {:?} in the fleet's sim driver",
                member.cluster_resource_id
            ))
        })?;
        let c = state
            .0
            .get_mut(&cluster_key)
            .ok_or_else(|| DriverError("cluster vanished".into()))?;
        c.attempts += 1;
        c.operations.push(key.to_string());
        let fails = c.knobs.outcome.as_deref() == Some("fail")
            && c.knobs.fail_attempts.is_none_or(|n| c.attempts <= n);
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
                ends: Instant::now() + Duration::from_secs_f64(seconds),
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
    ) -> Result<OperationState, DriverError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| DriverError("simulator state poisoned".into()))?;
        SimDriver::settle_one(&mut state, operation_id);
        Ok(match state.1.get(operation_id) {
            None => OperationState::Unknown,
            Some(op) if !op.applied => OperationState::Running,
            Some(op) if op.succeeds => OperationState::Succeeded,
            Some(op) => OperationState::Failed(op.message.clone()),
        })
    }

    async fn catalog(&self) -> Result<Catalog, DriverError> {
        Ok(self.catalog.clone())
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(20)
    }

    fn poll_after(&self, operation_id: &str) -> Duration {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.1.get(operation_id) {
            Some(op) if !op.applied => op
                .ends
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
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
    #[serde(default)]
    catalog: Option<Vec<String>>,
    #[serde(default = "default_timeout")]
    timeout_seconds: f64,
    #[serde(default = "default_poll")]
    poll_interval_seconds: f64,
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
}

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
    pub fn new(config: &Value) -> Result<ExecDriver, DriverError> {
        let config: ExecConfig = from_json_value(config.clone(), "properties.driver")
            .map_err(|e| DriverError(e.message))?;
        for (field, argv) in [
            ("observe", &config.observe),
            ("upgrade", &config.upgrade),
            ("poll", &config.poll),
        ] {
            if argv.is_empty() {
                return Err(DriverError(format!(
                    "properties.driver.{field}: needs at least the program to run"
                )));
            }
        }
        if !(config.timeout_seconds > 0.0 && config.poll_interval_seconds > 0.0) {
            return Err(DriverError(
                "properties.driver.timeoutSeconds and pollIntervalSeconds must be positive".into(),
            ));
        }
        Ok(ExecDriver { config })
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
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| DriverError(format!("{what}: cannot run {:?}: {e}", argv[0])))?;
        let limit = Duration::from_secs_f64(self.config.timeout_seconds);
        let output = tokio::time::timeout(limit, child.wait_with_output())
            .await
            .map_err(|_| {
                DriverError(format!(
                    "{what}: {:?} timed out after {}s",
                    argv[0], self.config.timeout_seconds
                ))
            })?
            .map_err(|e| DriverError(format!("{what}: {e}")))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim();
        if !output.status.success() {
            return Err(DriverError(format!(
                "{what}: {:?} exited with {}{}",
                argv[0],
                output
                    .status
                    .code()
                    .map_or("a signal".to_string(), |c| format!("code {c}")),
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {}", truncate(stderr))
                }
            )));
        }
        serde_json::from_slice(&output.stdout).map_err(|e| {
            DriverError(format!(
                "{what}: {:?} printed something that is not JSON ({e}): {}",
                argv[0],
                truncate(&String::from_utf8_lossy(&output.stdout))
            ))
        })
    }

    fn member_vars(member: &MemberRef) -> Vec<(&'static str, String)> {
        vec![
            ("member", member.name.clone()),
            ("clusterResourceId", member.cluster_resource_id.clone()),
        ]
    }
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
        serde_json::from_value(value)
            .map_err(|e| DriverError(format!("observe: the cluster JSON is not valid: {e}")))
    }

    async fn start_upgrade(
        &self,
        member: &MemberRef,
        target: &Target,
        key: &str,
    ) -> Result<String, DriverError> {
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
    ) -> Result<OperationState, DriverError> {
        let mut vars = ExecDriver::member_vars(member);
        vars.push(("operationId", operation_id.to_string()));
        vars.push(("operationKey", operation_id.to_string()));
        let reply: PollReply =
            serde_json::from_value(self.run("poll", &self.config.poll, &vars).await?)
                .map_err(|e| DriverError(format!("poll: expected {{\"state\": …}}: {e}")))?;
        Ok(match reply.state.as_str() {
            "Running" | "InProgress" => OperationState::Running,
            "Succeeded" => OperationState::Succeeded,
            "Failed" => {
                OperationState::Failed(reply.message.unwrap_or_else(|| "the upgrade failed".into()))
            }
            "Unknown" | "NotFound" => OperationState::Unknown,
            other => return Err(DriverError(format!("poll: unknown state {other:?}"))),
        })
    }

    async fn catalog(&self) -> Result<Catalog, DriverError> {
        let Some(argv) = &self.config.catalog else {
            return Ok(Catalog::default());
        };
        let value = self.run("catalog", argv, &[]).await?;
        let spec: CatalogSpec =
            serde_json::from_value(value).map_err(|e| DriverError(format!("catalog: {e}")))?;
        Catalog::parse(&spec, "catalog").map_err(|e| DriverError(e.message))
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs_f64(self.config.poll_interval_seconds)
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
            driver.poll(&who(), &id).await.expect("polls"),
            OperationState::Failed("drain timed out".into())
        );
    }

    #[tokio::test]
    async fn exec_failures_carry_the_exit_code_and_stderr() {
        let err = exec("echo 'quota exceeded in eastus' >&2; exit 3", 10.0)
            .start_upgrade(&who(), &target(), "k1")
            .await
            .unwrap_err();
        assert!(
            err.0.contains("code 3") && err.0.contains("quota exceeded"),
            "{err}"
        );
        let err = exec("echo not json", 10.0)
            .start_upgrade(&who(), &target(), "k1")
            .await
            .unwrap_err();
        assert!(err.0.contains("not JSON"), "{err}");
        let err = exec("sleep 5", 0.2)
            .start_upgrade(&who(), &target(), "k1")
            .await
            .unwrap_err();
        assert!(err.0.contains("timed out"), "{err}");
        let err = ExecDriver::new(
            &json!({"type": "exec", "observe": [], "upgrade": ["x"], "poll": ["x"]}),
        )
        .err()
        .expect("refused");
        assert!(err.0.contains("properties.driver.observe"), "{err}");
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
            driver.poll(&who(), "a1").await.expect("polls"),
            OperationState::Failed(_)
        ));
        assert_eq!(
            driver.poll(&who(), "never-sent").await.expect("polls"),
            OperationState::Unknown
        );
        driver
            .start_upgrade(&who(), &target(), "a2")
            .await
            .expect("second attempt");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            driver.poll(&who(), "a2").await.expect("polls"),
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
}
