//! Batch registration on PostgreSQL with the real binary (issue #36, finding 8). Ten fleets
//! importing 10,000-member batches at once over three replicas saw a batch refused with `503
//! Broken pipe`: an import does work of its own between its statements and waits for its
//! turn on a busy server, and the database ended its transaction once it had waited on the
//! server for a second (`idle_in_transaction_session_timeout`, set on every session to keep
//! a paused lease holder from blocking takeovers). The test injects that wait: it stops the
//! server (SIGSTOP) while an import's transaction is open, until the database has seen the
//! transaction idle for longer than a second, then lets it go on. The import is written whole.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Api, create_token, free_port, serve};

use flotilla_server::store::postgres::test_support::{
    admin_sql, base as postgres_base, reachable as postgres_reachable,
};

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// A stopped server, let go on again however the test ends.
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

/// What became of the import's transaction while its server was stopped.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Idle in its transaction for longer than a second: the wait was injected.
    IdleInTransaction,
    /// Its session is gone: the database ended it.
    Ended,
    /// It had committed before the server stopped: nothing was injected.
    Committed,
}

#[test]
fn an_import_waiting_on_its_server_for_more_than_a_second_is_written_whole() {
    if !postgres_reachable() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let name = format!("flotilla_registration_{}", std::process::id());
    admin_sql(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    admin_sql(format!("CREATE DATABASE {name}"));
    let url = format!("{}/{name}", postgres_base());
    let dir = std::env::temp_dir().join(format!("flotilla-registration-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let token = create_token(&url);
    let port = free_port();
    let mut server = serve(&url, port, &dir.join("server.log"), &[]);
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: token.clone(),
    };
    api.wait_ready();
    let mut watcher = runtime.block_on(async {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&url).await.expect("watcher")
    });
    let driver = json!({"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}});
    // Until a stop lands inside an import's transaction (one may commit first); a few tries.
    let mut injected = None;
    for attempt in 0..5 {
        let fleet = format!("fleet-{attempt}");
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/{fleet}"),
            Some(&json!({"properties": {"driver": driver}})),
        );
        let value: Vec<Value> = (0..10_000)
            .map(|i| json!({"name": format!("m{i:05}"), "properties": {"clusterResourceId": format!("/sub/rg/c{i}"), "group": format!("g{}", i % 20)}}))
            .collect();
        let importing = {
            let (base, token, fleet) = (api.base.clone(), token.clone(), fleet.clone());
            std::thread::spawn(move || {
                let response = reqwest::blocking::Client::new()
                    .post(format!("{base}/v1/fleets/{fleet}/importMembers"))
                    .bearer_auth(token)
                    .timeout(Duration::from_secs(120))
                    .json(&json!({"value": value}))
                    .send()
                    .expect("answered");
                let retry_after = response.headers().get("retry-after").cloned();
                (
                    response.status().as_u16(),
                    retry_after,
                    response.text().unwrap_or_default(),
                )
            })
        };
        // The import's transaction is open once it claims its cluster ids.
        let deadline = Instant::now() + Duration::from_secs(60);
        let backend: i32 = loop {
            let found: Option<i32> = runtime.block_on(async {
                use sqlx::Row;
                sqlx::query(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                     AND application_name = 'flotilla' AND xact_start IS NOT NULL \
                     AND query LIKE '%member_clusters%'",
                )
                .fetch_optional(&mut watcher)
                .await
                .expect("watch")
                .map(|r| r.get(0))
            });
            if let Some(pid) = found {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "no import transaction seen; {:?}",
                importing.is_finished()
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        signal(server.id(), "-STOP");
        let stopped = Stopped(server.id());
        // Stopped until the database has seen the transaction wait on it for more than a
        // second, or ended it.
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            let state: Option<(String, bool, f64)> = runtime.block_on(async {
                use sqlx::Row;
                sqlx::query(
                    "SELECT state, xact_start IS NOT NULL, \
                     extract(epoch FROM now() - state_change)::float8 \
                     FROM pg_stat_activity WHERE pid = $1",
                )
                .bind(backend)
                .fetch_optional(&mut watcher)
                .await
                .expect("watch")
                .map(|r| (r.get(0), r.get(1), r.get(2)))
            });
            match state {
                None => break Seen::Ended,
                Some((_, false, _)) => break Seen::Committed,
                Some((s, true, idle)) if s == "idle in transaction" && idle > 1.5 => {
                    break Seen::IdleInTransaction;
                }
                Some(_) => {}
            }
            assert!(Instant::now() < deadline, "the transaction never went idle");
            std::thread::sleep(Duration::from_millis(10));
        };
        drop(stopped);
        let (status, retry_after, text) = importing.join().expect("import thread");
        if seen == Seen::Committed {
            assert_eq!(status, 200, "{text}");
            continue;
        }
        injected = Some((fleet, seen, status, retry_after, text));
        break;
    }
    let (fleet, seen, status, retry_after, text) =
        injected.expect("no stop landed inside an import's transaction in five tries");
    assert_eq!(
        (status, &seen),
        (200, &Seen::IdleInTransaction),
        "the import's transaction: {seen:?}; answered {status} (Retry-After {retry_after:?}): {text}"
    );
    let members: i64 = runtime.block_on(async {
        use sqlx::Row;
        sqlx::query("SELECT count(*) FROM resources WHERE fleet = $1 AND kind = 'members'")
            .bind(&fleet)
            .fetch_one(&mut watcher)
            .await
            .expect("count")
            .get(0)
    });
    assert_eq!(members, 10_000);
    let _ = server.kill();
    let _ = server.wait();
    drop(watcher);
    admin_sql(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    let _ = std::fs::remove_dir_all(&dir);
}
