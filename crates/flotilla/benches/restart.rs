//! Restart benchmark: the real `flotilla serve` process on a SQLite file, a `sim` fleet of N
//! members registered in one batch, R runs over all of them started at once; the process is
//! killed (SIGKILL) while they run and started again on the same file. Measured from the
//! second spawn: until it answers `/readyz`, until it sends its first upgrade, and until it has
//! sent again as many upgrades as were in flight at the kill (every run loaded and driving).
//!
//! `cargo bench -p flotilla --bench restart [-- MEMBERS RUNS]` (default 10000 100);
//! `FLOTILLA_BENCH_POSTGRES=postgres://…/DB` runs it on PostgreSQL instead of a SQLite file.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Api, create_token, free_port, serve};

/// The upgrades sent since the process started, from `/metrics`.
fn started(api: &Api) -> u64 {
    let Ok(response) = api
        .http
        .get(format!("{}/metrics", api.base))
        .bearer_auth(&api.token)
        .timeout(Duration::from_secs(600))
        .send()
    else {
        return 0;
    };
    let text = response.text().unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("flotilla_member_upgrades_started_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A call without the shared client's 5 s limit: under load, creating and starting runs is
/// what is being measured.
fn send_long(api: &Api, method: reqwest::Method, path: &str, body: Option<&Value>) {
    let mut request = api
        .http
        .request(method.clone(), format!("{}{path}", api.base))
        .bearer_auth(&api.token)
        .timeout(Duration::from_secs(600));
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().expect("sent");
    assert!(
        response.status().is_success(),
        "{method} {path}: {}",
        response.status()
    );
}

/// A counter's value from `/metrics`, summed over its labels that contain `labels`.
fn counter(api: &Api, name: &str, labels: &str) -> u64 {
    let Ok((200, Value::String(text))) = api.call(reqwest::Method::GET, "/metrics", None) else {
        return 0;
    };
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn main() {
    // Numbers are the sizes; what follows the first flag is given to `flotilla serve`
    // (`-- 10000 100 --checkpoint-after 1073741824`).
    // (`cargo bench` adds `--bench`, which is not for the server.)
    let all: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let flags_at = all
        .iter()
        .position(|a| a.starts_with("--") && a.len() > 2)
        .unwrap_or(all.len());
    let serve_args: Vec<&str> = all[flags_at..].iter().map(String::as_str).collect();
    let args: Vec<usize> = all[..flags_at]
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let members = args.first().copied().unwrap_or(10_000);
    let runs = args.get(1).copied().unwrap_or(100);
    let dir = std::env::temp_dir().join(format!("flotilla-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    // `FLOTILLA_BENCH_POSTGRES=postgres://…/DB`: the same on PostgreSQL (an empty database the
    // bench may fill); otherwise a SQLite file.
    let postgres = std::env::var("FLOTILLA_BENCH_POSTGRES").ok();
    let db = postgres
        .clone()
        .unwrap_or_else(|| dir.join("flotilla.db").display().to_string());
    let log = dir.join("server.log");
    let token = create_token(&db);
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    let mut server = serve(&db, port, &log, &serve_args);
    api.wait_ready();
    // Upgrades of 6,000 simulated seconds at 10x: ten minutes each, so many are in flight at the
    // kill.
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/big",
        Some(&json!({"properties": {"driver": {"type": "sim", "timeScale": 10,
            "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}]}},
            "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5", "sim": {"durationSeconds": 6000}}}}})),
    );
    for chunk in (0..members).collect::<Vec<_>>().chunks(10_000) {
        let value: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"name": format!("m{i:06}"), "properties": {"clusterResourceId": format!("big{i}"), "group": format!("g{:02}", i % 50)}}))
            .collect();
        api.must(
            reqwest::Method::POST,
            "/v1/fleets/big/importMembers",
            Some(&json!({ "value": value })),
        );
    }
    let groups: Vec<Value> = (0..50)
        .map(|g| json!({"name": format!("g{g:02}"), "maxConcurrency": "5%"}))
        .collect();
    let run = json!({"properties": {"strategy": {"stages": [{"name": "all", "maxConcurrency": "200", "maxAllowedFailures": "5%", "groups": groups}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    let t = Instant::now();
    for r in 0..runs {
        // The first run observes the members the import has not observed yet: it takes a while.
        let path = format!("/v1/fleets/big/updateRuns/r{r:03}");
        send_long(&api, reqwest::Method::PUT, &path, Some(&run));
    }
    let create_all = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut each = Vec::new();
    for r in 0..runs {
        let path = format!("/v1/fleets/big/updateRuns/r{r:03}/start");
        let one = Instant::now();
        send_long(&api, reqwest::Method::POST, &path, None);
        each.push(one.elapsed().as_secs_f64());
    }
    let start_all = t.elapsed().as_secs_f64();
    let first_start = each.first().copied().unwrap_or_default();
    each.sort_by(f64::total_cmp);
    let median_start = each.get(each.len() / 2).copied().unwrap_or_default();
    let slowest_start = each.last().copied().unwrap_or_default();
    // Let them run for a while, then count what is in flight and kill the process.
    std::thread::sleep(Duration::from_secs(15));
    let memory = |field: &str| -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", server.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(field))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .map_or(0.0, |kib| kib / 1024.0)
    };
    let (rss, peak) = (memory("VmRSS:"), memory("VmHWM:"));
    let mut in_flight = 0;
    for r in 0..runs {
        let body: Value = api
            .http
            .get(format!("{}/v1/fleets/big/updateRuns/r{r:03}", api.base))
            .bearer_auth(&api.token)
            .timeout(Duration::from_secs(600))
            .send()
            .and_then(|r| r.json())
            .expect("the run");
        in_flight += body["properties"]["status"]["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["groups"].as_array().into_iter().flatten())
            .flat_map(|g| g["members"].as_array().into_iter().flatten())
            .filter(|m| m["status"]["state"] == "Running")
            .count() as u64;
    }
    let sent_before = started(&api);
    let checkpoints = counter(&api, "flotilla_run_checkpoints_total", "");
    server.kill().expect("killed");
    let _ = server.wait();
    let db_mib = match &postgres {
        Some(url) => std::process::Command::new("psql")
            .args([
                url.as_str(),
                "-tAc",
                "SELECT pg_database_size(current_database())",
            ])
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map_or(0.0, |bytes| bytes / 1048576.0),
        None => {
            std::fs::metadata(&db).map_or(0.0, |m| m.len() as f64 / 1048576.0)
                + std::fs::metadata(format!("{db}-wal")).map_or(0.0, |m| m.len() as f64 / 1048576.0)
        }
    };
    println!(
        "{members} members, {runs} runs: creating all {runs} took {create_all:.1} s; starting all {runs} took {start_all:.1} s (the first {first_start:.2} s, median {median_start:.2} s, slowest {slowest_start:.2} s); {sent_before} upgrades sent before the kill, {in_flight} in flight at it; {checkpoints} checkpoints written; database {db_mib:.0} MiB; server RSS {rss:.0} MiB (peak {peak:.0} MiB) with every run active"
    );
    let spawned = Instant::now();
    let mut server = serve(&db, port, &log, &serve_args);
    let ready_by = Instant::now() + Duration::from_secs(600);
    while api
        .call(reqwest::Method::GET, "/readyz", None)
        .map_or(true, |(s, _)| s != 200)
    {
        assert!(Instant::now() < ready_by, "not ready after 600 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ready = spawned.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut first = None;
    let resumed = loop {
        let sent = started(&api);
        if sent > 0 && first.is_none() {
            first = Some(spawned.elapsed().as_secs_f64());
        }
        if sent >= in_flight {
            break Some(spawned.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let from_checkpoint = counter(&api, "flotilla_runs_rebuilt_total", "checkpoint");
    let from_log = counter(&api, "flotilla_runs_rebuilt_total", "\"log\"");
    let _ = server.kill();
    let _ = server.wait();
    println!(
        "after SIGKILL and a restart: ready in {ready:.2} s, first upgrade sent at {}, all {in_flight} in flight sent again at {} ({from_checkpoint} runs rebuilt from a checkpoint, {from_log} from their whole log)",
        first.map_or("never".to_string(), |t| format!("{t:.2} s")),
        resumed.map_or("never (300 s)".to_string(), |t| format!("{t:.2} s"))
    );
    // FLOTILLA_BENCH_KEEP=1 keeps the database, to look at what it holds.
    if std::env::var_os("FLOTILLA_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("database kept: {db}");
    }
}
