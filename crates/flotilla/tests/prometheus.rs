//! Health checks against a real Prometheus (SEMANTICS §10), through a check provider an admin
//! declares: Debian's `prometheus` scrapes an exporter this test serves, whose error ratios the
//! test sets; the real server runs a staged
//! run over the exec driver (real subprocesses). A canary whose own check sees errors fails and
//! is counted; the next stage's HealthCheck gate sees the fleet's error rate and stops the run
//! there; once the errors are gone, a retry evaluates the gate again and the run finishes.
//!
//! Needs the `prometheus` binary (`PROMETHEUS`, else `/usr/bin/prometheus`); skipped with a
//! notice without one unless `FLOTILLA_REQUIRE_PROMETHEUS=1` (CI installs it:
//! `scripts/install-prometheus.sh`).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Api, create_token, free_port, scripts, serve};
use reqwest::Method;
use serde_json::{Value, json};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct TempDir(PathBuf);
impl TempDir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("prometheus: logs kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Members an upgrade was started on, as the example exec scripts log them.
fn upgraded(state: &str) -> Vec<String> {
    std::fs::read_to_string(std::path::Path::new(state).join("upgrades.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').next().map(str::to_string))
        .collect()
}

fn instant_query(prom: &str, query: &str) -> reqwest::Url {
    reqwest::Url::parse_with_params(&format!("{prom}/api/v1/query"), &[("query", query)])
        .expect("a query URL")
}

fn prometheus_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
    path.is_file().then_some(path)
}

/// Serves `/metrics` in Prometheus's text format: `flotilla_test_error_ratio{cluster=NAME}` for
/// each entry of `ratios`, as it is when scraped.
fn exporter(ratios: Arc<Mutex<BTreeMap<String, f64>>>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("exporter port");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = stream.read(&mut request);
            let mut body = String::from("# TYPE flotilla_test_error_ratio gauge\n");
            for (cluster, ratio) in ratios.lock().expect("ratios").iter() {
                body.push_str(&format!(
                    "flotilla_test_error_ratio{{cluster=\"{cluster}\"}} {ratio}\n"
                ));
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out waiting for {what}");
}

fn member<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["members"].as_array().into_iter().flatten())
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("member {name} in {status}"))
}

fn stage<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("stage {name} in {status}"))
}

#[test]
fn a_real_prometheus_halts_the_run_at_the_gate_that_sees_the_errors() {
    let Some(prometheus) = prometheus_binary() else {
        assert!(
            std::env::var("FLOTILLA_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
            "FLOTILLA_REQUIRE_PROMETHEUS=1 but no prometheus binary (scripts/install-prometheus.sh)"
        );
        eprintln!("prometheus: no prometheus binary; skipping (scripts/install-prometheus.sh)");
        return;
    };
    let dir =
        TempDir(std::env::temp_dir().join(format!("flotilla-prometheus-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(dir.path());
    std::fs::create_dir_all(dir.path()).expect("temp dir");
    let members = ["store-00", "store-01", "store-02", "store-03"];
    let ratios = Arc::new(Mutex::new(
        members
            .iter()
            .map(|m| (m.to_string(), 0.0))
            .collect::<BTreeMap<_, _>>(),
    ));
    // The second canary breaks once upgraded: its error ratio is high from the start here, and
    // Prometheus has scraped it before the run begins.
    ratios
        .lock()
        .expect("ratios")
        .insert("store-01".into(), 0.5);
    let exporter_port = exporter(ratios.clone());

    let prom_port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: stores\n    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n"
        ),
    )
    .expect("config");
    let prom_log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let _prometheus = Killed(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdin(Stdio::null())
            .stdout(prom_log.try_clone().expect("log"))
            .stderr(prom_log)
            .spawn()
            .expect("prometheus starts"),
    );
    let prom = format!("http://127.0.0.1:{prom_port}");
    let http = reqwest::blocking::Client::new();
    wait_for(
        "Prometheus to scrape the exporter",
        Duration::from_secs(60),
        || {
            http.get(instant_query(
                &prom,
                "flotilla_test_error_ratio{cluster=\"store-01\"}",
            ))
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .is_some_and(|v| v["data"]["result"][0]["value"][1] == "0.5")
        },
    );

    let database = dir.path().join("flotilla.db").display().to_string();
    let port = free_port();
    let token = create_token(&database);
    let _server = Killed(serve(&database, port, &dir.path().join("server.log"), &[]));
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    api.wait_ready();

    let scripts = scripts().display().to_string();
    let state = dir.path().join("clusters").display().to_string();
    std::fs::create_dir_all(&state).expect("cluster state");
    let driver = json!({
        "type": "exec",
        "observe": [format!("{scripts}/observe.sh"), state, "{member}"],
        "upgrade": [format!("{scripts}/upgrade.sh"), state, "{member}", "{operationKey}", "{kubernetesVersion}"],
        "poll": [format!("{scripts}/poll.sh"), state, "{member}", "{operationId}", "300"],
        "pollIntervalSeconds": 0.1,
        "timeoutSeconds": 10,
    });
    api.must(
        Method::PUT,
        "/v1/fleets/edge",
        Some(&json!({"properties": {"driver": driver}})),
    );
    for (i, name) in members.iter().enumerate() {
        let group = if i < 2 { "canary" } else { "prod" };
        api.must(
            Method::PUT,
            &format!("/v1/fleets/edge/members/{name}"),
            Some(&json!({"properties": {"clusterResourceId": name, "group": group, "labels": {"site": name}}})),
        );
    }
    // An admin declares the Prometheus the checks may ask (SEMANTICS §10); the run's checks
    // name it and carry only their queries.
    api.must(
        Method::PUT,
        "/v1/checkProviders/prom",
        Some(&json!({"properties": {"type": "Prometheus", "endpoint": prom}})),
    );
    // The member's own series, named by its label (read from the member's resource).
    let member_check = json!({
        "name": "errors", "provider": "prom",
        "query": "flotilla_test_error_ratio{cluster=\"{label:site}\"}", "condition": "< 0.05",
    });
    let fleet_check = json!({
        "name": "fleet-errors", "provider": "prom",
        "query": "max(flotilla_test_error_ratio)", "condition": "< 0.05",
    });
    let run = json!({"properties": {
        "strategy": {"stages": [
            {"name": "canary", "maxAllowedFailures": "1",
             "groups": [{"name": "canary", "maxAllowedFailures": "1"}],
             "memberHealthChecks": {"checks": [member_check], "soakSeconds": 3, "intervalSeconds": 1}},
            {"name": "prod", "groups": [{"name": "prod", "maxConcurrency": "2"}],
             "beforeGates": [{"type": "HealthCheck", "displayName": "fleet error rate",
                              "checks": [fleet_check], "soakSeconds": 2, "intervalSeconds": 1, "timeoutSeconds": 8}]},
        ]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
    }});
    api.must(Method::PUT, "/v1/fleets/edge/updateRuns/r1", Some(&run));
    api.must(Method::POST, "/v1/fleets/edge/updateRuns/r1/start", None);

    let status = |api: &Api| {
        api.must(Method::GET, "/v1/fleets/edge/updateRuns/r1", None)["properties"]["status"].clone()
    };
    let state_of = |s: &Value| {
        s["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    wait_for(
        "the run to stop at the prod gate",
        Duration::from_secs(90),
        || state_of(&status(&api)) == "Failed",
    );
    let failed = status(&api);
    // The canary whose own check saw errors failed, named why, and was counted.
    let broken = member(&failed, "store-01");
    assert_eq!(state_of(broken), "Failed", "{broken}");
    assert_eq!(
        broken["status"]["error"]["code"], "HealthCheckFailed",
        "{broken}"
    );
    let why = broken["status"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("0.5") && why.contains("< 0.05"), "{why}");
    let seen = broken["healthChecks"].as_array().expect("its evaluations");
    assert!(
        seen.iter()
            .any(|e| e["name"] == "errors" && e["passed"] == false && e["value"] == "0.5"),
        "{broken}"
    );
    let healthy = member(&failed, "store-00");
    assert_eq!(state_of(healthy), "Completed", "{healthy}");
    assert!(
        healthy["healthChecks"]
            .as_array()
            .is_some_and(|e| e.iter().all(|e| e["passed"] == true) && !e.is_empty()),
        "{healthy}"
    );
    let canary = stage(&failed, "canary");
    assert_eq!(state_of(canary), "Completed", "{canary}");
    assert_eq!(canary["failureCount"], 1, "{canary}");
    // The prod stage's gate saw the fleet's error rate: the run stopped there, nothing sent.
    let prod = stage(&failed, "prod");
    assert_eq!(state_of(prod), "Failed", "{prod}");
    assert_eq!(
        prod["status"]["error"]["code"], "HealthCheckFailed",
        "{prod}"
    );
    assert_eq!(
        prod["beforeGates"][0]["status"]["state"], "Failed",
        "{prod}"
    );
    assert!(
        prod["healthChecks"].as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["name"] == "fleet-errors" && e["passed"] == false)),
        "{prod}"
    );
    // Its gate resource says so too (the dashboard and API clients read gates there).
    let gate_id = prod["beforeGates"][0]["gateId"]
        .as_str()
        .unwrap_or_default();
    let gate = api.must(
        Method::GET,
        &format!("/v1/fleets/edge/gates/{gate_id}"),
        None,
    );
    assert_eq!(gate["properties"]["gateType"], "HealthCheck", "{gate}");
    assert_eq!(gate["properties"]["state"], "Failed", "{gate}");
    for name in ["store-02", "store-03"] {
        assert_eq!(state_of(member(&failed, name)), "NotStarted");
    }
    assert_eq!(upgraded(&state), ["store-00", "store-01"], "upgrades sent");
    let events = api.must(Method::GET, "/v1/fleets/edge/updateRuns/r1/events", None);
    let text = events.to_string();
    assert!(
        text.contains("HealthCheckEvaluated") && text.contains("GateFailed"),
        "{text}"
    );

    // The errors are fixed; a retry (of the failed stage, prod) evaluates its gate again. The
    // canary's failure was tolerated in a stage that completed: it stays Failed, counted.
    ratios
        .lock()
        .expect("ratios")
        .insert("store-01".into(), 0.0);
    wait_for("Prometheus to see the fix", Duration::from_secs(30), || {
        http.get(instant_query(&prom, "max(flotilla_test_error_ratio)"))
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .is_some_and(|v| v["data"]["result"][0]["value"][1] == "0")
    });
    api.must(Method::POST, "/v1/fleets/edge/updateRuns/r1/start", None);
    wait_for(
        "the retried run to complete",
        Duration::from_secs(90),
        || state_of(&status(&api)) == "Completed",
    );
    let done = status(&api);
    for name in ["store-00", "store-02", "store-03"] {
        assert_eq!(state_of(member(&done, name)), "Completed", "{done}");
    }
    assert_eq!(state_of(member(&done, "store-01")), "Failed", "{done}");
    assert_eq!(done["failureCount"], 1, "{done}");
    assert_eq!(
        stage(&done, "prod")["beforeGates"][0]["status"]["state"],
        "Completed"
    );
    // One upgrade each: the retry sent nothing to the canaries again.
    let mut sent = upgraded(&state);
    sent.sort();
    assert_eq!(
        sent,
        ["store-00", "store-01", "store-02", "store-03"],
        "upgrades sent"
    );
}
