//! `flotilla demo`: a server on the embedded store with a simulated fleet of 60 clusters in 3
//! regions; a few seconds in, the simulated release feed publishes a new patch, a Rapid
//! auto-upgrade profile is made for it and starts its staged run (a canary stage and an approval
//! gate) by itself: one upgrade, driven over real HTTP. The fleet also has a disruption budget
//! and a freeze coming in a few days (SEMANTICS §12), which the dashboard shows; neither holds
//! the demo's run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use flotilla_engine::time::Time;
use flotilla_server::Server;
use flotilla_server::auth::{Role, new_token};
use flotilla_server::store::Tokens as _;
use flotilla_server::store::{SqliteStore, Store};

const FLEET: &str = "demo";
const PROFILE: &str = "rapid";
/// The demo's disruption budget ([`demo_budget`]) and freeze ([`demo_freeze`]).
const BUDGET: &str = "prod-per-region";
const FREEZE: &str = "retail-peak";
/// The patch the simulated feed publishes a few seconds after the start.
const NEW_PATCH: &str = "1.31.2";
/// Real seconds after the start at which the feed publishes it in the first region.
const PUBLISHED_AFTER: f64 = 3.0;

/// The simulated fleet: the sim driver's configuration and the members to create.
pub fn demo_fleet(now: Time, time_scale: f64) -> (Value, Vec<(String, Value)>) {
    let regions = [
        ("eastus", 24, 0),
        ("westeurope", 20, 30),
        ("southeastasia", 16, 60),
    ];
    let family = "AKSUbuntu-2204gen2containerd";
    let mut catalog = serde_json::Map::new();
    let mut rollout = serde_json::Map::new();
    for (region, _, delay) in regions {
        catalog.insert(
            region.into(),
            json!({
                "kubernetes": [{"version": "1.29.9"}, {"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.32.0", "preview": true}],
                "nodeImages": {family: [{"version": "202602.10.0"}]},
            }),
        );
        // Region by region: `delay` real seconds after the first (simulated, then scaled).
        rollout.insert(region.into(), json!(delay as f64 * time_scale));
    }
    // The release feed: a new patch of the newest minor, a few seconds in. No new node image:
    // the profile's run for today's 1.31.1 must find every store at target (a newer image
    // would make it a second, real rollout of the same clusters).
    let at = PUBLISHED_AFTER * time_scale;
    let releases = json!([
        {"at": at, "kubernetesVersion": NEW_PATCH, "regions": rollout},
    ]);
    // A nightly-style window that opens one minute from now (UTC), for a few stores.
    let (_, second_of_day) = now.plus(60).civil(0);
    let window_start = format!(
        "{:02}:{:02}",
        second_of_day / 3600,
        (second_of_day / 60) % 60
    );
    let mut clusters = serde_json::Map::new();
    let mut members = Vec::new();
    for (region, count, _) in regions {
        let short = &region[..4];
        for i in 1..=count {
            let name = format!("{short}-store-{i:02}");
            let id = format!(
                "/subscriptions/demo/resourceGroups/retail/providers/Microsoft.ContainerService/managedClusters/{name}"
            );
            let group = if region == "eastus" && i <= 2 {
                "canary".to_string()
            } else {
                format!("prod-{region}")
            };
            // A few stores are two minors behind: the profile's run skips them (SEMANTICS §8).
            let version = if i % 8 == 6 { "1.29.9" } else { "1.31.1" };
            let mut cluster = json!({
                "region": region,
                "kubernetesVersion": version,
                "nodePools": [{"name": "system", "family": family, "os": "Linux", "nodeImageVersion": "202602.10.0"}],
                "sim": {"durationSeconds": 600 + 60 * (i % 5)},
            });
            if i % 7 == 3 {
                cluster["maintenance"] = json!({"kubernetes": {"schedule": {"daily": {"intervalDays": 1}}, "durationHours": 4, "startTime": window_start}});
            }
            if (region == "westeurope" && i == 11) || (region == "southeastasia" && i == 5) {
                cluster["sim"] = json!({"durationSeconds": 900, "outcome": "fail", "failMessage": "node drain timed out on pool system"});
            }
            clusters.insert(id.clone(), cluster);
            let geo = match region {
                "eastus" => "us",
                "westeurope" => "eu",
                _ => "asia",
            };
            members.push((
                name,
                json!({"properties": {"clusterResourceId": id, "group": group, "labels": {"env": if group == "canary" { "canary" } else { "prod" }, "geo": geo}}}),
            ));
        }
    }
    let driver = json!({"type": "sim", "timeScale": time_scale, "catalog": catalog, "clusters": clusters, "releases": releases});
    (driver, members)
}

pub fn demo_strategy() -> Value {
    json!({"properties": {"strategy": {"stages": [
        {
            "name": "canary",
            "groups": [{"name": "canary", "maxConcurrency": "1"}],
            "afterStageWaitInSeconds": 20,
        },
        {
            "name": "production",
            "beforeGates": [{"type": "Approval", "displayName": "Canary looks healthy: go to production"}],
            "maxConcurrency": "6",
            "maxAllowedFailures": "10%",
            "groups": [
                {"name": "prod-eastus", "maxConcurrency": "3", "maxAllowedFailures": "2"},
                {"name": "prod-westeurope", "maxConcurrency": "3", "maxAllowedFailures": "2"},
                {"name": "prod-southeastasia", "maxConcurrency": "3", "maxAllowedFailures": "2"},
            ],
        },
    ]}}})
}

/// The demo's disruption budget: at most a fifth of each region's production stores in flight.
/// It shows partitions filling up without holding the run: a region's prod group upgrades at
/// most 3 at once, and a fifth of each region's prod stores (22, 20, 16) is 4, 4 and 3.
pub fn demo_budget() -> Value {
    json!({"properties": {
        "selector": {"byLabel": "env=prod"},
        "maxUnavailable": "20%",
        "perValueOf": "region",
    }})
}

/// The demo's freeze: no minor upgrades of production stores over a retail peak, from midnight
/// UTC three days after `now`, for two days. It is coming, not in force, and the demo's run is a
/// patch upgrade, which a `MinorUpgrades` freeze never holds, however long the demo stays up.
pub fn demo_freeze(now: Time) -> Value {
    let (_, second_of_day) = now.civil(0);
    let start = now.plus(3 * 86_400 - second_of_day);
    let end = start.plus(2 * 86_400);
    json!({"properties": {
        "start": start.to_string(),
        "end": end.to_string(),
        "selector": {"byLabel": "env=prod"},
        "scope": "MinorUpgrades",
        "reason": "retail peak weekend",
    }})
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            request = request.json(b);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("{method} {path}: {status}: {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

fn summary(run: &Value) -> String {
    let status = &run["properties"]["status"];
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for stage in status["stages"].as_array().into_iter().flatten() {
        for group in stage["groups"].as_array().into_iter().flatten() {
            for m in group["members"].as_array().into_iter().flatten() {
                *counts
                    .entry(m["status"]["state"].as_str().unwrap_or("?").to_string())
                    .or_default() += 1;
            }
        }
    }
    let stages: Vec<String> = status["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{} {}",
                s["name"].as_str().unwrap_or("?"),
                s["status"]["state"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(
        "run {}  failures {}  [{}]  members: {}",
        status["status"]["state"].as_str().unwrap_or("?"),
        status["failureCount"],
        stages.join(", "),
        counts.join(", ")
    )
}

/// Members the run skipped for being more than one minor behind, with the message.
fn skipped_behind(run: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for stage in run["properties"]["status"]["stages"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for group in stage["groups"].as_array().into_iter().flatten() {
            for m in group["members"].as_array().into_iter().flatten() {
                if let Some(message) = m["message"].as_str()
                    && m["status"]["state"] == "Skipped"
                    && message.contains("minor")
                {
                    out.push((
                        m["name"].as_str().unwrap_or("?").to_string(),
                        message.to_string(),
                    ));
                }
            }
        }
    }
    out
}

/// The run the profile generated for the new patch, once it has.
async fn profile_run(client: &Client) -> anyhow::Result<Option<String>> {
    let runs = client
        .send(
            reqwest::Method::GET,
            &format!("/v1/fleets/{FLEET}/updateRuns"),
            None,
        )
        .await?;
    Ok(runs["value"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| {
            r["properties"]["autoUpgradeProfileId"].is_string()
                && r["properties"]["managedClusterUpdate"]["upgrade"]["kubernetesVersion"]
                    == NEW_PATCH
        })
        .and_then(|r| r["name"].as_str().map(String::from)))
}

/// The demo until it ends: by itself (`--exit-when-done`), or on Ctrl-C or SIGTERM. Either
/// way the server stops and closes its store (SQLite's write-ahead log checkpointed into the
/// database file), and a database the demo made in a temporary directory goes with that
/// directory: nothing of the demo is left behind.
pub async fn run(
    listen: SocketAddr,
    database: Option<String>,
    time_scale: f64,
    approve_after: Option<u64>,
    exit_when_done: bool,
) -> anyhow::Result<ExitCode> {
    let temporary = database
        .is_none()
        .then(|| std::env::temp_dir().join(format!("flotilla-demo-{}", std::process::id())));
    let path = match (&database, &temporary) {
        (Some(d), _) => crate::database_path(Some(d))?,
        (None, Some(dir)) => dir.join("flotilla.db"),
        (None, None) => unreachable!("a temporary directory without a database"),
    };
    let result = serve_demo(&path, listen, time_scale, approve_after, exit_when_done).await;
    if let Some(dir) = temporary
        && let Err(e) = std::fs::remove_dir_all(&dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!("flotilla demo: cannot remove {}: {e}", dir.display());
    }
    result
}

async fn serve_demo(
    path: &std::path::Path,
    listen: SocketAddr,
    time_scale: f64,
    approve_after: Option<u64>,
    exit_when_done: bool,
) -> anyhow::Result<ExitCode> {
    let store = SqliteStore::open(path)
        .await
        .with_context(|| format!("database {}", path.display()))?;
    let (admin, admin_record) = new_token(Role::Admin, "demo-admin").map_err(anyhow::Error::msg)?;
    let (approver, approver_record) =
        new_token(Role::Approver, "demo-approver").map_err(anyhow::Error::msg)?;
    store.create_token(&admin_record).await?;
    store.create_token(&approver_record).await?;
    let store: Arc<dyn Store> = Arc::new(store);
    let server = Server::start(store, listen, false).await?;
    let addr = server.local_addr().unwrap_or(listen);
    // Set on Ctrl-C or SIGTERM, or when the demo is done and exits by itself.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signalled = stop_tx.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        let _ = signalled.send(true);
    });
    let mut server_stop = stop_rx.clone();
    let serving = tokio::spawn(server.serve(async move {
        let _ = server_stop.wait_for(|s| *s).await;
    }));
    let shown = show(
        path,
        addr,
        admin,
        approver,
        time_scale,
        approve_after,
        stop_rx,
    )
    .await;
    let code = match shown {
        // Ended by a signal: the server is stopping.
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(outcome)) => {
            let base = format!("http://{addr}");
            outln!(
                "the update run ended {outcome}; the server is still up at {base} (Ctrl-C to stop)"
            );
            if exit_when_done {
                let _ = stop_tx.send(true);
            }
            if outcome == "Completed" {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            let _ = stop_tx.send(true);
            serving.await??;
            return Err(e);
        }
    };
    // Until the server has stopped and closed its store.
    serving.await??;
    Ok(code)
}

/// Sets up the demo's fleet over the API and follows its run, printing as it goes; the run's
/// outcome once it ends, `None` once `stop` is set first.
async fn show(
    path: &std::path::Path,
    addr: SocketAddr,
    admin: String,
    approver: String,
    time_scale: f64,
    approve_after: Option<u64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<String>> {
    let base = format!("http://{addr}");
    let client = Client {
        http: reqwest::Client::new(),
        base: base.clone(),
        token: admin.clone(),
    };
    let now = flotilla_server::clock::now();
    let (driver, members) = demo_fleet(now, time_scale);
    client
        .send(
            reqwest::Method::PUT,
            &format!("/v1/fleets/{FLEET}"),
            Some(&json!({"properties": {"driver": driver}})),
        )
        .await?;
    for (name, body) in &members {
        client
            .send(
                reqwest::Method::PUT,
                &format!("/v1/fleets/{FLEET}/members/{name}"),
                Some(body),
            )
            .await?;
    }
    client
        .send(
            reqwest::Method::PUT,
            &format!("/v1/fleets/{FLEET}/updateStrategies/staged"),
            Some(&demo_strategy()),
        )
        .await?;
    client
        .send(
            reqwest::Method::PUT,
            &format!("/v1/fleets/{FLEET}/disruptionBudgets/{BUDGET}"),
            Some(&demo_budget()),
        )
        .await?;
    let freeze = demo_freeze(now);
    client
        .send(
            reqwest::Method::PUT,
            &format!("/v1/fleets/{FLEET}/freezes/{FREEZE}"),
            Some(&freeze),
        )
        .await?;
    outln!(
        "Flotilla demo: {} clusters in 3 regions; the {PROFILE} auto-upgrade profile upgrades them when Kubernetes {NEW_PATCH} comes out, region by region.",
        members.len()
    );
    outln!();
    outln!("  server:          {base}");
    outln!("  dashboard:       {base}/");
    // The fragment never reaches the server (or its logs); the page keeps the token in the
    // tab's session storage and drops it from the address bar.
    outln!("  sign in:         {base}/#token={approver}");
    outln!("  database:        {}", path.display());
    outln!("  admin token:     {admin}");
    outln!("  approver token:  {approver}");
    outln!();
    outln!(
        "  watch the runs:  curl -s -H 'Authorization: Bearer {admin}' {base}/v1/fleets/{FLEET}/updateRuns"
    );
    outln!(
        "  the profile:     curl -s -H 'Authorization: Bearer {admin}' {base}/v1/fleets/{FLEET}/autoUpgradeProfiles/{PROFILE}"
    );
    outln!(
        "  pending gates:   curl -s -H 'Authorization: Bearer {approver}' '{base}/v1/fleets/{FLEET}/gates?state=Pending'"
    );
    outln!("  use the CLI:     flotilla login --server {base} --token {approver}");
    outln!("                   flotilla gate list -f {FLEET} --state Pending");
    outln!(
        "  fleet rules:     budget {BUDGET} (at most 20% of each region's prod stores in flight); freeze {FREEZE} (no minor upgrades of prod stores from {} to {})",
        freeze["properties"]["start"].as_str().unwrap_or("?"),
        freeze["properties"]["end"].as_str().unwrap_or("?")
    );
    outln!();
    let approver_client = Client {
        http: reqwest::Client::new(),
        base: base.clone(),
        token: approver,
    };
    let mut gate_seen: Option<Instant> = None;
    let mut last = String::new();
    let mut generated: Option<String> = None;
    let mut profile_made = false;
    let mut told_skips = false;
    let outcome = loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.wait_for(|s| *s) => return Ok(None),
        }
        // The demo's run is the profile's, for the patch: the profile is made once the feed has
        // published it, so that its first trigger is that patch and the demo runs one upgrade
        // (made before, it would first make a run for today's 1.31.1 that skips every store
        // and waits at the approval gate).
        if !profile_made {
            let releases = client
                .send(
                    reqwest::Method::GET,
                    &format!("/v1/fleets/{FLEET}/releases"),
                    None,
                )
                .await?;
            if !releases.to_string().contains(&format!("\"{NEW_PATCH}\"")) {
                continue;
            }
            client
                .send(
                    reqwest::Method::PUT,
                    &format!("/v1/fleets/{FLEET}/autoUpgradeProfiles/{PROFILE}"),
                    Some(&json!({"properties": {
                        "channel": "Rapid",
                        "updateStrategyId": format!("/v1/fleets/{FLEET}/updateStrategies/staged"),
                        "nodeImageSelection": {"type": "Latest"},
                    }})),
                )
                .await?;
            profile_made = true;
            continue;
        }
        let Some(run_name) = &generated else {
            generated = profile_run(&client).await?;
            if let Some(name) = &generated {
                outln!(
                    "Kubernetes {NEW_PATCH} is out: profile {PROFILE} created and started update run {name}"
                );
                outln!("  watch it live:   {base}/#/fleets/{FLEET}/runs/{name}");
                // The same page with the approver's token: one click signs in and opens it (the
                // page takes the token out of the address bar).
                outln!(
                    "  or signed in:    {base}/#/fleets/{FLEET}/runs/{name}?token={}",
                    approver_client.token
                );
            }
            continue;
        };
        let run = client
            .send(
                reqwest::Method::GET,
                &format!("/v1/fleets/{FLEET}/updateRuns/{run_name}"),
                None,
            )
            .await?;
        if !told_skips {
            let skipped = skipped_behind(&run);
            if let Some((first, message)) = skipped.first() {
                told_skips = true;
                outln!("{} stores skipped, {first} first: {message}", skipped.len());
            }
        }
        let line = summary(&run);
        if line != last {
            outln!("{line}");
            last = line;
        }
        let gates = client
            .send(
                reqwest::Method::GET,
                &format!("/v1/fleets/{FLEET}/gates?state=Pending"),
                None,
            )
            .await?;
        // The gate of the announced run, not of any other run the profile made.
        let ours = gates["value"].as_array().into_iter().flatten().find(|g| {
            g["properties"]["target"]["updateRunProperties"]["name"].as_str()
                == Some(run_name.as_str())
        });
        if let Some(gate) = ours {
            let name = gate["name"].as_str().unwrap_or_default().to_string();
            let seen = *gate_seen.get_or_insert_with(|| {
                outln!(
                    "gate {name} of run {run_name} is waiting for approval: {}",
                    gate["properties"]["displayName"].as_str().unwrap_or("")
                );
                outln!("  approve it:      flotilla gate approve -f {FLEET} -n {name}");
                outln!("  or with curl:    curl -s -X PATCH -H 'Authorization: Bearer <approver token>' -H 'Content-Type: application/json' -d '{{\"properties\": {{\"state\": \"Completed\"}}}}' {base}/v1/fleets/{FLEET}/gates/{name}");
                Instant::now()
            });
            if approve_after.is_some_and(|s| seen.elapsed() >= Duration::from_secs(s)) {
                approver_client
                    .send(
                        reqwest::Method::PATCH,
                        &format!("/v1/fleets/{FLEET}/gates/{name}"),
                        Some(&json!({"properties": {"state": "Completed"}})),
                    )
                    .await?;
                outln!("gate {name} approved by demo-approver");
            }
        }
        let state = run["properties"]["status"]["status"]["state"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let done = run["properties"]["status"]["status"]["completedTime"].is_string();
        if done && matches!(state.as_str(), "Completed" | "Failed" | "Skipped") {
            break state;
        }
    };
    Ok(Some(outcome))
}
