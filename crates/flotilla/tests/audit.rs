//! The audit trail with the real binary (security review, issue #36): secrets sent in bodies
//! never reach it (nor the server's log); a request that changes nothing (a forecast, which a
//! reader may ask for as often as it likes) is not written there; and entries older than
//! `--audit-retention` are pruned in the background, on SQLite and on PostgreSQL.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Api, create_token, free_port};

use flotilla_server::store::postgres::test_support::{
    admin_sql, base as postgres_base, reachable as postgres_reachable,
};

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// `flotilla serve` over `database` with `env` set, its output in `log`.
fn serve_with(database: &str, port: u16, log: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let out = std::fs::File::create(log).expect("log");
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--database", database])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("the server starts")
}

fn api(port: u16, token: &str) -> Api {
    Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: token.to_string(),
    }
}

/// The whole trail, oldest first.
fn audit(api: &Api) -> Vec<Value> {
    let page = api.must(reqwest::Method::GET, "/v1/audit?$top=1000", None);
    page["value"].as_array().expect("entries").clone()
}

/// A fleet `f` over the simulator with one member and run `r1` (not started).
fn fleet_with_run(api: &Api) -> Value {
    let driver = json!({"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}});
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/f",
        Some(&json!({"properties": {"driver": driver}})),
    );
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/f/members/m1",
        Some(&json!({"properties": {"clusterResourceId": "c1"}})),
    );
    let run = json!({"properties": {
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.30.6"}},
    }});
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/f/updateRuns/r1",
        Some(&run),
    );
    run
}

/// Audit rows in the SQLite file whose body holds `text`, read straight from the file.
fn stored_rows_holding(db: &Path, text: &str) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        use sqlx::{Connection, Row};
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=ro", db.display()))
            .await
            .expect("opens");
        sqlx::query("SELECT count(*) FROM audit WHERE instr(body, ?) > 0")
            .bind(text)
            .fetch_one(&mut c)
            .await
            .expect("counts")
            .get(0)
    })
}

#[test]
fn secrets_sent_in_bodies_never_reach_the_audit_trail_nor_the_log() {
    let dir = temp_dir("audit-secrets");
    let db = dir.join("f.db");
    let token = create_token(&db.display().to_string());
    let port = free_port();
    let log = dir.join("server.log");
    let mut server = serve_with(
        &db.display().to_string(),
        port,
        &log,
        &[],
        &[("FLOTILLA_LOG", "debug")],
    );
    let admin = api(port, &token);
    admin.wait_ready();
    let secrets = ["whsec-first-3f9c2a41", "whsec-second-77d1e0b5"];
    for secret in secrets {
        admin.must(
            reqwest::Method::PUT,
            "/v1/webhooks/w1",
            Some(&json!({"properties": {"url": "http://127.0.0.1:9/hook", "secret": secret, "events": ["RunCompleted"]}})),
        );
    }
    // A token's value is answered once; the request that made it is in the trail, the value
    // is not.
    let made = admin.must(
        reqwest::Method::POST,
        "/v1/tokens",
        Some(&json!({"role": "reader", "subject": "bob"})),
    );
    let reader_token = made["token"].as_str().expect("token").to_string();
    let shown = admin.must(reqwest::Method::GET, "/v1/webhooks/w1", None);
    assert!(shown["properties"].get("secret").is_none(), "{shown}");

    let entries = audit(&admin);
    let hooks: Vec<&Value> = entries
        .iter()
        .filter(|e| e["path"] == "/v1/webhooks/w1")
        .collect();
    assert_eq!(hooks.len(), 2, "{entries:?}");
    for entry in &hooks {
        // What was sent is recorded, the secret's value is not.
        assert_eq!(
            entry["body"]["properties"]["url"],
            "http://127.0.0.1:9/hook"
        );
        assert_eq!(
            entry["body"]["properties"]["secret"], "<redacted>",
            "{entry}"
        );
    }
    assert!(
        entries
            .iter()
            .any(|e| e["path"] == "/v1/tokens" && e["method"] == "POST"),
        "{entries:?}"
    );
    let trail = serde_json::to_string(&entries).expect("JSON");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    for secret in secrets.iter().copied().chain([reader_token.as_str()]) {
        assert!(!trail.contains(secret), "the trail shows {secret}: {trail}");
        assert_eq!(
            stored_rows_holding(&db, secret),
            0,
            "the stored trail holds {secret}"
        );
    }
    let _ = server.kill();
    let _ = server.wait();
    for secret in secrets.iter().copied().chain([reader_token.as_str()]) {
        assert!(!log_text().contains(secret), "the log shows {secret}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn forecasts_change_nothing_and_are_not_audited() {
    let dir = temp_dir("audit-forecasts");
    let db = dir.join("f.db");
    let token = create_token(&db.display().to_string());
    let port = free_port();
    let mut server = serve_with(
        &db.display().to_string(),
        port,
        &dir.join("server.log"),
        &[],
        &[],
    );
    let admin = api(port, &token);
    admin.wait_ready();
    let run = fleet_with_run(&admin);
    let made = admin.must(
        reqwest::Method::POST,
        "/v1/tokens",
        Some(&json!({"role": "reader", "subject": "reader"})),
    );
    let reader = api(port, made["token"].as_str().expect("token"));
    let before = audit(&admin);
    // A reader asks again and again.
    for _ in 0..20 {
        reader.must(
            reqwest::Method::POST,
            "/v1/fleets/f/forecast",
            Some(&json!({"run": run, "defaultDurationSeconds": 600})),
        );
        reader.must(
            reqwest::Method::POST,
            "/v1/fleets/f/updateRuns/r1/forecast",
            Some(&json!({"approvalDelaySeconds": 0})),
        );
    }
    let after = audit(&admin);
    let grown: Vec<String> = after[before.len().min(after.len())..]
        .iter()
        .map(|e| format!("{} {} by {}", e["method"], e["path"], e["role"]))
        .collect();
    assert!(
        grown.is_empty(),
        "40 forecasts grew the trail by {} entries, the first: {:?}",
        grown.len(),
        &grown[..grown.len().min(2)]
    );
    // A write is still recorded.
    admin.must(
        reqwest::Method::POST,
        "/v1/fleets/f/updateRuns/r1/start",
        None,
    );
    let last = audit(&admin).pop().expect("an entry");
    assert_eq!(last["path"], "/v1/fleets/f/updateRuns/r1/start", "{last}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Entries older than the retention (set through the environment, as the other flags) are
/// pruned by the server in the background, a fresh one is kept.
fn pruned_past_retention(database: &str, token: &str, dir: &Path) {
    let port = free_port();
    let mut server = serve_with(
        database,
        port,
        &dir.join("server.log"),
        &[],
        &[("FLOTILLA_AUDIT_RETENTION", "3s")],
    );
    let admin = api(port, token);
    admin.wait_ready();
    let driver = json!({"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}});
    for fleet in ["a", "b", "c"] {
        admin.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/{fleet}"),
            Some(&json!({"properties": {"driver": driver}})),
        );
    }
    let written = audit(&admin);
    assert_eq!(written.len(), 3, "{written:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = audit(&admin);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "entries older than the retention are still there: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A new entry is kept: only what is older than the retention goes.
    admin.must(
        reqwest::Method::PUT,
        "/v1/fleets/d",
        Some(&json!({"properties": {"driver": driver}})),
    );
    let fresh = audit(&admin);
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    assert_eq!(fresh[0]["path"], "/v1/fleets/d");
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn the_audit_is_pruned_past_its_retention_on_sqlite() {
    let dir = temp_dir("audit-retention");
    let db = dir.join("f.db").display().to_string();
    let token = create_token(&db);
    pruned_past_retention(&db, &token, &dir);
    // The flag is checked.
    for bad in ["0s", "forever", "5x"] {
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--database", &db, "--audit-retention", bad])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2) && stderr.contains("--audit-retention"),
            "{bad}: {:?} {stderr}",
            out.status
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_audit_is_pruned_past_its_retention_on_postgres() {
    if !postgres_reachable() {
        return;
    }
    let name = format!("flotilla_audit_retention_{}", std::process::id());
    admin_sql(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    admin_sql(format!("CREATE DATABASE {name}"));
    let url = format!("{}/{name}", postgres_base());
    let dir = temp_dir("audit-retention-pg");
    let token = create_token(&url);
    pruned_past_retention(&url, &token, &dir);
    admin_sql(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    let _ = std::fs::remove_dir_all(&dir);
}
