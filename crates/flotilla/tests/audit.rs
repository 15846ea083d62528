//! The audit trail with the real binary (security review, issue #36): secrets sent in bodies
//! never reach it (nor the server's log).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use common::{Api, create_token, free_port};

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
