//! Server benchmarks over real HTTP on loopback, with the `sim` driver:
//! - dispatch latency: from a slot freeing (the driver reporting an upgrade's end), a gate being
//!   approved, or a version arriving (a timer) to the next upgrade being sent; p50/p99;
//! - API: requests per second and p99 for reading a large run and for listing runs, and the
//!   process's memory with that fleet and its runs.
//!
//! `cargo bench -p flotilla-server --bench server [-- MEMBERS RUNS [--budget N] [--seconds S]
//! [--timeline]]` (default 10000 10; `--budget N` gives the large fleet a fleet-wide disruption
//! budget of N; `--seconds S` makes each of its upgrades take S simulated seconds, 600 by
//! default, at a time scale of 100; `--timeline` prints, each second from the runs' start, the
//! process's CPU use, its RSS and the large fleet's upgrades started and succeeded, and marks
//! where each read load begins, so one sees whether the runs still work during the reads;
//! `--settled` waits for every run of the large fleet to end before reading, so that runs with
//! and without a budget are read in the same state);
//! `FLOTILLA_BENCH_POSTGRES=postgres://…/DB` runs it on PostgreSQL instead of a SQLite file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use flotilla_server::Server;
use flotilla_server::auth::{Role, new_token};
use flotilla_server::metrics::Metrics;
use flotilla_server::store::SqliteStore;
use flotilla_server::store::postgres::PgStore;
use flotilla_server::store::prelude::*;

/// The allocator the `flotilla` binary uses, so memory is measured as it ships.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: flotilla_server::CConf =
    flotilla_server::CConf(flotilla_server::JEMALLOC_CONF.as_ptr());

struct Bench {
    http: reqwest::Client,
    base: String,
    token: String,
    metrics: Arc<Metrics>,
}

impl Bench {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Value {
        let mut r = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(b);
        }
        let response = r.send().await.expect("sent");
        let status = response.status();
        let text = response.text().await.expect("body");
        assert!(
            status.is_success(),
            "{method} {path}: {status} {}",
            &text[..text.len().min(300)]
        );
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn wait_state(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let v = self.send(reqwest::Method::GET, path, None).await;
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out on {path}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn p99(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() - 1) as f64 * 0.99).round() as usize]
}

/// Requests per second, p99 latency (ms) and response size of `path` with `clients` concurrent
/// clients for `seconds`.
async fn load(bench: &Arc<Bench>, path: &str, clients: usize, seconds: u64) -> (f64, f64, usize) {
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let bench = bench.clone();
        let path = path.to_string();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut bytes = 0;
            while Instant::now() < end {
                let t = Instant::now();
                let response = bench
                    .http
                    .get(format!("{}{path}", bench.base))
                    .bearer_auth(&bench.token)
                    .send()
                    .await
                    .expect("sent");
                assert!(response.status().is_success());
                bytes = response.bytes().await.expect("body").len();
                times.push(t.elapsed().as_secs_f64());
            }
            (times, bytes)
        }));
    }
    let mut all = Vec::new();
    let mut size = 0;
    for t in tasks {
        let (times, bytes) = t.await.expect("task");
        all.extend(times);
        size = bytes;
    }
    let count = all.len();
    (count as f64 / seconds as f64, p99(all) * 1000.0, size)
}

fn catalog(west_arrives_at: i64) -> Value {
    json!({
        "eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}], "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202602.10.0"}]}},
        "westus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1", "availableAt": flotilla_engine::time::Time::from_unix(west_arrives_at).to_string()}],
                   "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202602.10.0"}]}},
    })
}

fn sim(region: &str, seconds: u64, west_arrives_at: i64) -> Value {
    json!({"properties": {"driver": {"type": "sim", "timeScale": 100, "catalog": catalog(west_arrives_at),
        "defaultCluster": {"region": region, "kubernetesVersion": "1.30.5", "sim": {"durationSeconds": seconds}}}}})
}

fn one_stage(group: &str, concurrency: &str, gate: bool) -> Value {
    let mut stage =
        json!({"name": "s", "groups": [{"name": group, "maxConcurrency": concurrency}]});
    if gate {
        stage["beforeGates"] = json!([{"type": "Approval"}]);
    }
    json!({"properties": {"strategy": {"stages": [stage]}, "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})
}

fn completed(r: &Value) -> bool {
    r["properties"]["status"]["status"]["state"] == "Completed"
}

#[tokio::main]
async fn main() {
    // `--budget N`: the large fleet has a fleet-wide disruption budget of N (SEMANTICS §12).
    let mut budget: Option<usize> = None;
    let mut seconds: u64 = 600;
    let mut timeline = false;
    let mut settled = false;
    let mut args: Vec<usize> = Vec::new();
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        if word == "--budget" {
            budget = words.next().and_then(|n| n.parse().ok());
            assert!(budget.is_some(), "--budget takes a number");
        } else if word == "--seconds" {
            seconds = words
                .next()
                .and_then(|n| n.parse().ok())
                .expect("--seconds takes a number");
        } else if word == "--timeline" {
            timeline = true;
        } else if word == "--settled" {
            settled = true;
        } else if let Ok(n) = word.parse() {
            args.push(n);
        }
    }
    let members = args.first().copied().unwrap_or(10_000);
    let runs = args.get(1).copied().unwrap_or(10).max(1);
    let dir = std::env::temp_dir().join(format!("flotilla-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // `FLOTILLA_BENCH_POSTGRES=postgres://…/DB` measures the same on PostgreSQL (an empty
    // database the bench may fill); otherwise a SQLite file.
    let store: Arc<dyn Store> = match std::env::var("FLOTILLA_BENCH_POSTGRES") {
        Ok(url) => {
            println!("store: PostgreSQL ({url})");
            Arc::new(PgStore::open(&url).await.expect("PostgreSQL store"))
        }
        Err(_) => Arc::new(
            SqliteStore::open(&dir.join("bench.db"))
                .await
                .expect("store"),
        ),
    };
    let (token, record) = new_token(Role::Admin, "bench").expect("token");
    store.create_token(&record).await.expect("token");
    let server = Server::start(store, "127.0.0.1:0".parse().expect("addr"), false)
        .await
        .expect("server");
    let addr = server.local_addr().expect("addr");
    let metrics = server.state.runs.metrics.clone();
    tokio::spawn(server.serve(std::future::pending()));
    let bench = Arc::new(Bench {
        http: reqwest::Client::new(),
        base: format!("http://{addr}"),
        token,
        metrics,
    });
    let now = flotilla_server::clock::now().unix();

    // 1. Slots: 400 upgrades of 60 ms, 20 at a time.
    bench
        .send(
            reqwest::Method::PUT,
            "/v1/fleets/latency",
            Some(&sim("eastus", 6, now)),
        )
        .await;
    for i in 0..400 {
        let body = json!({"properties": {"clusterResourceId": format!("c{i}"), "group": "g"}});
        bench
            .send(
                reqwest::Method::PUT,
                &format!("/v1/fleets/latency/members/m{i:04}"),
                Some(&body),
            )
            .await;
    }
    bench
        .send(
            reqwest::Method::PUT,
            "/v1/fleets/latency/updateRuns/slots",
            Some(&one_stage("g", "20", false)),
        )
        .await;
    let t = Instant::now();
    bench
        .send(
            reqwest::Method::POST,
            "/v1/fleets/latency/updateRuns/slots/start",
            None,
        )
        .await;
    bench
        .wait_state("/v1/fleets/latency/updateRuns/slots", completed)
        .await;
    let wall = t.elapsed().as_secs_f64();
    let slot = bench
        .metrics
        .dispatch_quantiles("slot")
        .expect("slot samples");
    println!(
        "dispatch after a slot frees: {} upgrades, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (400 upgrades of 60 ms, 20 at a time: {wall:.2} s; back to back it would be {:.2} s)",
        slot.0,
        slot.1 * 1000.0,
        slot.2 * 1000.0,
        slot.3 * 1000.0,
        400.0 / 20.0 * 0.06
    );

    // 2. Gate approvals: 20 runs each waiting at a before-gate.
    bench
        .send(
            reqwest::Method::PUT,
            "/v1/fleets/gates",
            Some(&sim("eastus", 1, now)),
        )
        .await;
    for i in 0..20 {
        let group = format!("g{i}");
        let body = json!({"properties": {"clusterResourceId": format!("g{i}"), "group": group}});
        bench
            .send(
                reqwest::Method::PUT,
                &format!("/v1/fleets/gates/members/m{i:02}"),
                Some(&body),
            )
            .await;
        bench
            .send(
                reqwest::Method::PUT,
                &format!("/v1/fleets/gates/updateRuns/r{i}"),
                Some(&one_stage(&group, "1", true)),
            )
            .await;
        bench
            .send(
                reqwest::Method::POST,
                &format!("/v1/fleets/gates/updateRuns/r{i}/start"),
                None,
            )
            .await;
        let gates = bench
            .wait_state("/v1/fleets/gates/gates?state=Pending", |g| {
                g["value"].as_array().is_some_and(|v| !v.is_empty())
            })
            .await;
        let gate = gates["value"][0]["name"]
            .as_str()
            .expect("gate")
            .to_string();
        bench
            .send(
                reqwest::Method::PATCH,
                &format!("/v1/fleets/gates/gates/{gate}"),
                Some(&json!({"properties": {"state": "Completed"}})),
            )
            .await;
        bench
            .wait_state(&format!("/v1/fleets/gates/updateRuns/r{i}"), completed)
            .await;
    }
    let action = bench
        .metrics
        .dispatch_quantiles("action")
        .expect("action samples");
    println!(
        "dispatch after a user action (start, gate approval): {} upgrades, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        action.0,
        action.1 * 1000.0,
        action.2 * 1000.0,
        action.3 * 1000.0
    );

    // 3. A version arriving in a region three seconds from now: the run wakes at that instant.
    let arrives = flotilla_server::clock::now().unix() + 3;
    bench
        .send(
            reqwest::Method::PUT,
            "/v1/fleets/west",
            Some(&sim("westus", 1, arrives)),
        )
        .await;
    for i in 0..5 {
        let body = json!({"properties": {"clusterResourceId": format!("w{i}"), "group": "west"}});
        bench
            .send(
                reqwest::Method::PUT,
                &format!("/v1/fleets/west/members/w{i}"),
                Some(&body),
            )
            .await;
    }
    bench
        .send(
            reqwest::Method::PUT,
            "/v1/fleets/west/updateRuns/arrival",
            Some(&one_stage("west", "5", false)),
        )
        .await;
    bench
        .send(
            reqwest::Method::POST,
            "/v1/fleets/west/updateRuns/arrival/start",
            None,
        )
        .await;
    bench
        .wait_state("/v1/fleets/west/updateRuns/arrival", completed)
        .await;
    if let Some(timer) = bench.metrics.dispatch_quantiles("timer") {
        println!(
            "dispatch after a version arrives (a timer): {} upgrades, p50 {:.2} ms, p99 {:.2} ms",
            timer.0,
            timer.1 * 1000.0,
            timer.2 * 1000.0
        );
    }

    // 4. The API with a large fleet and several runs over it.
    let rss_before = status_mib("VmRSS:");
    let t = Instant::now();
    bench
        .send(
            reqwest::Method::PUT,
            "/v1/fleets/big",
            Some(&sim("eastus", seconds, now)),
        )
        .await;
    // Registered in batches (`importMembers`, 10,000 a request, as a large fleet is); one `PUT`
    // per member is measured by the `register` bench.
    let mut first = 0;
    while first < members {
        let last = (first + 10_000).min(members);
        let value: Vec<Value> = (first..last)
            .map(|i| json!({"name": format!("m{i:06}"), "properties": {"clusterResourceId": format!("big{i}"), "group": format!("g{:02}", i % 50)}}))
            .collect();
        bench
            .send(
                reqwest::Method::POST,
                "/v1/fleets/big/importMembers",
                Some(&json!({"value": value, "mode": "Create"})),
            )
            .await;
        first = last;
    }
    let create_members = t.elapsed().as_secs_f64();
    // The server observes imported members in the background; a run created before that ends
    // observes the rest itself. Measured apart: creation over a fleet already observed.
    bench
        .wait_state(
            &format!("/v1/fleets/big/members/m{:06}", members - 1),
            |m| m["properties"]["status"]["cluster"].is_object(),
        )
        .await;
    let observed_members = t.elapsed().as_secs_f64();
    let groups: Vec<Value> = (0..50)
        .map(|g| json!({"name": format!("g{g:02}"), "maxConcurrency": "5%"}))
        .collect();
    let run = json!({"properties": {"strategy": {"stages": [{"name": "all", "maxConcurrency": "200", "maxAllowedFailures": "5%", "groups": groups}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    let t = Instant::now();
    for r in 0..runs {
        bench
            .send(
                reqwest::Method::PUT,
                &format!("/v1/fleets/big/updateRuns/r{r:03}"),
                Some(&run),
            )
            .await;
    }
    let create_runs = t.elapsed().as_secs_f64() / runs as f64;
    if let Some(n) = budget {
        bench
            .send(
                reqwest::Method::PUT,
                "/v1/fleets/big/disruptionBudgets/fleet-wide",
                Some(&json!({"properties": {"maxUnavailable": n.to_string()}})),
            )
            .await;
        println!("a fleet-wide disruption budget of {n} over the large fleet");
    }
    if timeline {
        let b = bench.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let mut last_cpu = cpu_seconds();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let text = b
                    .http
                    .get(format!("{}/metrics", b.base))
                    .bearer_auth(&b.token)
                    .send()
                    .await
                    .expect("sent")
                    .text()
                    .await
                    .unwrap_or_default();
                let grab = |name: &str| {
                    text.lines()
                        .find(|l| l.starts_with(name) && l.contains("fleet=\"big\""))
                        .and_then(|l| l.split_whitespace().last())
                        .unwrap_or("0")
                        .to_string()
                };
                let cpu = cpu_seconds();
                println!(
                    "timeline {:5.1} s: CPU {:4.0} %, RSS {:5.0} MiB, upgrades started {}, succeeded {}",
                    t0.elapsed().as_secs_f64(),
                    (cpu - last_cpu) * 100.0,
                    status_mib("VmRSS:"),
                    grab("flotilla_member_upgrades_started_total"),
                    grab("flotilla_member_upgrades_succeeded_total")
                );
                last_cpu = cpu;
            }
        });
    }
    // Every run started: they share the members, so one upgrades a member while the others
    // wait for it (one operation per cluster).
    for r in 0..runs {
        bench
            .send(
                reqwest::Method::POST,
                &format!("/v1/fleets/big/updateRuns/r{r:03}/start"),
                None,
            )
            .await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    println!(
        "RSS with {runs} runs started over {members} members, before any large read: {:.0} MiB",
        status_mib("VmRSS:")
    );
    if settled {
        // Equal states: with or without a budget, the reads find the same 100 runs ended.
        let t = Instant::now();
        for r in 0..runs {
            bench
                .wait_state(&format!("/v1/fleets/big/updateRuns/r{r:03}"), |v| {
                    let state = v["properties"]["status"]["status"]["state"].as_str();
                    matches!(state, Some("Completed" | "Failed" | "Skipped" | "Stopped"))
                })
                .await;
        }
        println!(
            "every run ended {:.1} s after the reads would have begun; reading from 5 s after",
            t.elapsed().as_secs_f64()
        );
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        println!(
            "RSS with the {runs} runs ended, before any large read: {:.0} MiB",
            status_mib("VmRSS:")
        );
    }
    if budget.is_some() {
        let b = bench
            .send(
                reqwest::Method::GET,
                "/v1/fleets/big/disruptionBudgets/fleet-wide",
                None,
            )
            .await;
        println!(
            "the budget's partitions as its fleet's task counts them: {}",
            b["properties"]["status"]["partitions"]
        );
    }
    if timeline {
        println!("timeline: reading (a run)");
    }
    let (rps, latency, bytes) = load(&bench, "/v1/fleets/big/updateRuns/r000", 8, 10).await;
    println!(
        "GET a {members}-member run ({:.1} MB) while {runs} runs run: {rps:.1} requests/s, p99 {latency:.0} ms (8 clients, 10 s)",
        bytes as f64 / 1e6
    );
    if timeline {
        println!("timeline: reading (a page of runs)");
    }
    let (rps, latency, bytes) = load(&bench, "/v1/fleets/big/updateRuns?$top=10", 4, 10).await;
    println!(
        "list runs ($top=10, {:.1} MB): {rps:.1} requests/s, p99 {latency:.0} ms (4 clients, 10 s)",
        bytes as f64 / 1e6
    );
    if timeline {
        println!("timeline: reading (a member)");
    }
    let (rps, latency, _) = load(&bench, "/v1/fleets/big/members/m000001", 8, 5).await;
    println!("GET a member: {rps:.0} requests/s, p99 {latency:.1} ms (8 clients, 5 s)");
    println!(
        "{members} members registered over HTTP (importMembers) in {create_members:.1} s, all observed after {observed_members:.1} s; {runs} runs of them, {create_runs:.2} s each to create, all started; RSS {:.0} MiB ({:.0} MiB before the large fleet), peak {:.0} MiB",
        status_mib("VmRSS:"),
        rss_before,
        status_mib("VmHWM:")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
