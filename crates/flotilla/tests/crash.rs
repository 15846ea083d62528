//! Crash safety (SEMANTICS §7) with the real binary on a real SQLite file: an update run over the
//! `exec` driver, whose scripts log every upgrade they start, while the server is killed with
//! SIGKILL at random moments and restarted. At the end the run completed, every member was
//! upgraded exactly once, and every write the API acknowledged is still there.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use common::{Api, Lcg, create_exec_run, create_token, free_port, member_name, serve};

const MEMBERS: usize = 16;

/// Started to checkpoint its runs every few batches, so that restarts rebuild the run from a
/// checkpoint and the log after it, as a long run's restart does.
fn start_server(db: &Path, port: u16, log: &Path) -> Child {
    serve(
        &db.display().to_string(),
        port,
        log,
        &["--checkpoint-after", "1"],
    )
}

/// How many runs this server rebuilt from a checkpoint, from its metrics.
fn rebuilt_from_checkpoints(api: &Api) -> u64 {
    let Ok((200, Value::String(text))) = api.call(reqwest::Method::GET, "/metrics", None) else {
        return 0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("flotilla_runs_rebuilt_total{from=\"checkpoint\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn killing_the_server_at_random_moments_loses_nothing_and_upgrades_nothing_twice() {
    let dir = std::env::temp_dir().join(format!("flotilla-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("state")).expect("state dir");
    let db = dir.join("flotilla.db");
    let server_log = dir.join("server.log");

    let token = create_token(&db.display().to_string());

    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    let mut server = start_server(&db, port, &server_log);
    api.wait_ready();

    create_exec_run(&api, &dir.join("state"), MEMBERS, 2, 600);
    api.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
        None,
    );

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    eprintln!("crash test seed {seed}");
    let mut rng = Lcg(seed);
    let mut acknowledged: Vec<String> = Vec::new();
    let mut kills = 0;
    let mut from_checkpoints = 0;
    let deadline = Instant::now() + Duration::from_secs(150);
    let final_state = loop {
        // Writes during the run: each acknowledged one must survive the kills.
        let name = format!("ack-{kills}");
        let body = json!({"properties": {"strategy": {"stages": [{"name": "s", "groups": [{"name": "g"}]}]}}});
        if let Ok((status, _)) = api.call(
            reqwest::Method::PUT,
            &format!("/v1/fleets/edge/updateStrategies/{name}"),
            Some(&body),
        ) && (200..300).contains(&status)
        {
            acknowledged.push(name);
        }
        std::thread::sleep(Duration::from_millis(50 + rng.next(900)));
        let (_, run) = api
            .call(reqwest::Method::GET, "/v1/fleets/edge/updateRuns/r1", None)
            .unwrap_or((0, Value::Null));
        let state = run["properties"]["status"]["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state == "Completed" || state == "Failed" {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not finish; last state {state:?}; see {}",
            server_log.display()
        );
        from_checkpoints += rebuilt_from_checkpoints(&api);
        // SIGKILL (Child::kill on Unix), then start again on the same file.
        server.kill().expect("kill");
        let _ = server.wait();
        kills += 1;
        server = start_server(&db, port, &server_log);
        api.wait_ready();
    };
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        kills >= 5,
        "only {kills} kills happened before the run ended; the test proves little"
    );
    assert!(
        from_checkpoints >= 1,
        "no restart rebuilt the run from a checkpoint; the test proves nothing of them"
    );
    assert_eq!(
        final_state["properties"]["status"]["status"]["state"], "Completed",
        "{}",
        final_state["properties"]["status"]
    );

    let log = std::fs::read_to_string(dir.join("state/upgrades.log"))
        .expect("the scripts logged upgrades");
    let mut per_member: BTreeMap<String, usize> = BTreeMap::new();
    for line in log.lines() {
        *per_member
            .entry(
                line.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            )
            .or_default() += 1;
    }
    for i in 0..MEMBERS {
        assert_eq!(
            per_member.get(&member_name(i)),
            Some(&1),
            "{} was not upgraded exactly once:\n{log}",
            member_name(i)
        );
    }
    assert_eq!(per_member.len(), MEMBERS, "{log}");

    // Restart once more and check every acknowledged write.
    let mut server = start_server(&db, port, &server_log);
    api.wait_ready();
    for name in &acknowledged {
        api.must(
            reqwest::Method::GET,
            &format!("/v1/fleets/edge/updateStrategies/{name}"),
            None,
        );
    }
    let run = api.must(reqwest::Method::GET, "/v1/fleets/edge/updateRuns/r1", None);
    assert_eq!(run["properties"]["status"]["status"]["state"], "Completed");
    let _ = server.kill();
    let _ = server.wait();
    eprintln!(
        "{kills} kills ({from_checkpoints} rebuilt the run from a checkpoint), {} acknowledged writes",
        acknowledged.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hardening items 5 and 6: after a clean shutdown (SIGTERM) the `.db` file alone holds
/// everything (the write-ahead log is checkpointed into it), and a second server on the same
/// file under another spelling (`sqlite:PATH`) is refused.
#[test]
fn a_clean_shutdown_leaves_everything_in_the_database_file() {
    let (dir, db, api, mut server) = server_with_fleet("wal", "kept");
    std::fs::create_dir_all(dir.join("copy")).expect("dirs");
    // Another spelling of the same file: refused while the first server runs.
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--database", &format!("sqlite:{}", db.display())])
        .output()
        .expect("runs");
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another flotilla server"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exited = server.wait().expect("exits");
    assert!(exited.success(), "{exited:?}");
    let wal = dir.join("flotilla.db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "the write-ahead log still holds data after a clean shutdown"
    );
    // The database file alone, copied elsewhere, has the fleet.
    let copy = dir.join("copy/flotilla.db");
    std::fs::copy(&db, &copy).expect("copy");
    let port = free_port();
    let api = Api {
        base: format!("http://127.0.0.1:{port}"),
        ..api
    };
    let mut server = start_server(&copy, port, &dir.join("copy.log"));
    api.wait_ready();
    let fleet = api.must(reqwest::Method::GET, "/v1/fleets/kept", None);
    assert_eq!(fleet["name"], "kept");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hardening item 7: a text column that is not UTF-8 (a damaged file, a hand edit) made the
/// server panic at startup. Now every column is decoded with an error instead of a panic:
/// damage in what the server needs to start (the tokens) refuses the start with one line and a
/// non-zero exit.
#[test]
fn a_damaged_database_gives_one_line_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("flotilla-damaged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("flotilla.db");
    create_token(&db.display().to_string());
    let damage = |sql: &str| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            use sqlx::Connection;
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
                .await
                .expect("opens");
            sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(&mut c)
                .await
                .expect("damaged");
        });
    };
    damage("UPDATE tokens SET subject = CAST(X'FFFE' AS TEXT)");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--database", &db.display().to_string()])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unreadable") && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `flotilla backup` copies a live database consistently: taken while the server runs, the copy
/// alone serves everything written before it. It refuses to overwrite a file.
#[test]
fn a_backup_of_a_live_database_serves_on_its_own() {
    let (dir, db, api, mut server) = server_with_fleet("backup", "saved");
    let copy = dir.join("backup.db");
    let backup = |to: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["backup", "--database", &db.display().to_string()])
            .arg(to)
            .output()
            .expect("runs")
    };
    let out = backup(&copy);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = backup(&copy);
    assert_eq!(
        again.status.code(),
        Some(2),
        "an existing file is not overwritten"
    );
    let _ = server.kill();
    let _ = server.wait();
    let port = free_port();
    let api = Api {
        base: format!("http://127.0.0.1:{port}"),
        ..api
    };
    let mut server = start_server(&copy, port, &dir.join("copy.log"));
    api.wait_ready();
    let fleet = api.must(reqwest::Method::GET, "/v1/fleets/saved", None);
    assert_eq!(fleet["name"], "saved");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server on a fresh SQLite file in a temporary directory named after `test`, with one fleet
/// `fleet` on the sim driver: the directory, the database, a client and the server.
fn server_with_fleet(
    test: &str,
    fleet: &str,
) -> (std::path::PathBuf, std::path::PathBuf, Api, Child) {
    let dir = std::env::temp_dir().join(format!("flotilla-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("flotilla.db");
    let token = create_token(&db.display().to_string());
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    let server = start_server(&db, port, &dir.join("server.log"));
    api.wait_ready();
    let driver = json!({"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}});
    api.must(
        reqwest::Method::PUT,
        &format!("/v1/fleets/{fleet}"),
        Some(&json!({"properties": {"driver": driver}})),
    );
    (dir, db, api, server)
}
