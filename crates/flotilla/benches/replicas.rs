//! Replicas benchmark (#40): N real `flotilla serve` processes on one fresh PostgreSQL database,
//! F `sim` fleets of M members each, all registered at once (one client per fleet, the fleets
//! spread round-robin over the replicas), then one staged run per fleet started together. While
//! the runs go, a few clients read each run's document from every replica, and midway the
//! replica holding the most fleet leases is SIGKILLed. Measured: the registration rate, the
//! makespan against the strategy's lower bound, the takeover of the killed replica's fleets
//! against the lease TTL, read latency per replica, dispatch delay (from `/metrics`), memory and
//! CPU per replica, and the database's size. Every member must end Completed (its upgrade
//! succeeded) or Skipped.
//!
//! `cargo bench -p flotilla --bench replicas [-- --replicas N --fleets F --members M --lease-ttl S
//! --stages 3 --groups 10 --ceiling 1000 --upgrade-seconds 3 --readers 3 --kill-at 0.5 --keep]`
//! (defaults 3 replicas, 10 fleets × 100,000 members, a 10 s lease). `--kill-at` is the fraction
//! of all members upgraded at which the kill happens (above 1: no kill). PostgreSQL is
//! `FLOTILLA_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432`); the bench creates a
//! database of its own and drops it at the end (`--keep` or `FLOTILLA_BENCH_KEEP=1` keeps it and
//! the replicas' logs). Without PostgreSQL it says so and exits 0.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{create_token, free_port, serve};
use flotilla_server::store::postgres::test_support::{
    admin_sql, base as postgres_base, reachable as postgres_reachable,
};

const USAGE: &str = "cargo bench -p flotilla --bench replicas [-- --replicas N --fleets F --members M --lease-ttl SECONDS --stages S --groups G --ceiling C --upgrade-seconds U --readers R --kill-at FRACTION --keep]";

/// How long one batch of `importMembers` or a run's creation may take under load.
const LONG: Duration = Duration::from_secs(600);

/// The simulated duration of an upgrade; the time scale makes it `--upgrade-seconds` of real
/// time.
const SIM_UPGRADE_SECONDS: f64 = 600.0;

struct Config {
    replicas: usize,
    fleets: usize,
    members: usize,
    lease_ttl: f64,
    stages: usize,
    groups: usize,
    ceiling: u64,
    upgrade_seconds: f64,
    readers: usize,
    kill_at: f64,
    keep: bool,
}

fn parse_args() -> Config {
    let mut config = Config {
        replicas: 3,
        fleets: 10,
        members: 100_000,
        lease_ttl: 10.0,
        stages: 3,
        groups: 10,
        ceiling: 1000,
        upgrade_seconds: 3.0,
        readers: 3,
        kill_at: 0.5,
        keep: std::env::var_os("FLOTILLA_BENCH_KEEP").is_some_and(|v| v != "0"),
    };
    // `cargo bench` adds `--bench`.
    let mut words = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(word) = words.next() {
        if word == "--keep" {
            config.keep = true;
            continue;
        }
        if word == "--help" || word == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = words
            .next()
            .unwrap_or_else(|| panic!("{word} takes a value\n{USAGE}"));
        let bad = || -> ! { panic!("{word} {value}: not a valid value\n{USAGE}") };
        let count = || match value.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => bad(),
        };
        let seconds = || match value.parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 => s,
            _ => bad(),
        };
        match word.as_str() {
            "--replicas" => config.replicas = count(),
            "--fleets" => config.fleets = count(),
            "--members" => config.members = count(),
            "--stages" => config.stages = count(),
            "--groups" => config.groups = count(),
            "--readers" => config.readers = value.parse().unwrap_or_else(|_| bad()),
            "--ceiling" => config.ceiling = count() as u64,
            "--lease-ttl" => config.lease_ttl = seconds(),
            "--upgrade-seconds" => config.upgrade_seconds = seconds(),
            "--kill-at" => config.kill_at = seconds(),
            _ => panic!("unknown argument {word}\n{USAGE}"),
        }
    }
    assert!(
        config.groups <= 50,
        "--groups: a stage has at most 50 groups"
    );
    config
}

/// One admin statement (or a query of rows of a name and a size) on PostgreSQL.
fn postgres<T: Send + Unpin + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>>(
    database: &str,
    sql: String,
) -> Vec<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        use sqlx::Connection;
        let mut connection =
            sqlx::PgConnection::connect(&format!("{}/{database}", postgres_base()))
                .await
                .expect("PostgreSQL");
        sqlx::query_as::<_, T>(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut connection)
            .await
            .expect("statement")
    })
}

/// The database, the replicas and their logs: the replicas killed and the database dropped when
/// it goes, also on a panic (the logs are kept then).
struct Cluster {
    database: String,
    url: String,
    dir: PathBuf,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    pids: Vec<u32>,
    keep: bool,
}

impl Cluster {
    fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("replica-{i}.log"))
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
        if self.keep {
            println!(
                "kept: database {} and the replicas' logs in {}",
                self.url,
                self.dir.display()
            );
            return;
        }
        admin_sql(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.database
        ));
        if std::thread::panicking() {
            eprintln!(
                "database dropped; replicas' logs kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[derive(Clone)]
struct Client {
    http: reqwest::blocking::Client,
    token: String,
    bases: Arc<Vec<String>>,
}

impl Client {
    fn send(
        &self,
        method: reqwest::Method,
        replica: usize,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<(u16, String), String> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.bases[replica]))
            .bearer_auth(&self.token)
            .timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response.text().map_err(|e| e.to_string())?;
        Ok((status, text))
    }

    fn must(
        &self,
        method: reqwest::Method,
        replica: usize,
        path: &str,
        body: Option<&Value>,
    ) -> String {
        match self.send(method.clone(), replica, path, body, LONG) {
            Ok((status, text)) if (200..300).contains(&status) => text,
            Ok((status, text)) => panic!(
                "{method} {path} on replica {replica}: {status} {}",
                &text[..text.len().min(500)]
            ),
            Err(e) => panic!("{method} {path} on replica {replica}: {e}"),
        }
    }

    fn metrics(&self, replica: usize) -> Option<String> {
        match self.send(
            reqwest::Method::GET,
            replica,
            "/metrics",
            None,
            Duration::from_secs(30),
        ) {
            Ok((200, text)) => Some(text),
            _ => None,
        }
    }

    /// Each fleet's unexpired lease: its holder (a replica's index, by its port) and epoch.
    fn leases(&self, replica: usize, ports: &[u16]) -> Option<BTreeMap<String, (usize, i64)>> {
        let (status, text) = self
            .send(
                reqwest::Method::GET,
                replica,
                "/v1/leases",
                None,
                Duration::from_secs(5),
            )
            .ok()?;
        if status != 200 {
            return None;
        }
        let leases: Value = serde_json::from_str(&text).ok()?;
        let mut held = BTreeMap::new();
        for lease in leases["value"].as_array()? {
            if lease["expired"] != false {
                continue;
            }
            let owner = lease["owner"].as_str().unwrap_or_default();
            let port = owner
                .split('/')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok());
            let Some(i) = port.and_then(|p| ports.iter().position(|q| *q == p)) else {
                continue;
            };
            held.insert(
                lease["fleet"].as_str().unwrap_or_default().to_string(),
                (i, lease["epoch"].as_i64().unwrap_or_default()),
            );
        }
        Some(held)
    }
}

/// A sample line of the OpenMetrics text: its name, labels and value.
fn sample(line: &str) -> Option<(&str, BTreeMap<&str, &str>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (head, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (&line[..open], (&line[open + 1..close], &line[close + 1..]))
        }
        None => {
            let space = line.find(' ')?;
            (&line[..space], ("", &line[space..]))
        }
    };
    let labels = rest
        .0
        .split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
        .collect();
    let value = rest.1.split_whitespace().next()?.parse().ok()?;
    Some((head, labels, value))
}

fn sum_of(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(sample)
        .filter(|(n, _, _)| *n == name)
        .map(|(_, _, v)| v)
        .sum()
}

/// Each fleet's run's state (`flotilla_update_runs`, read from the store: the same on every
/// replica; one run per fleet here).
fn run_states(text: &str) -> BTreeMap<String, String> {
    let mut states = BTreeMap::new();
    for (name, labels, value) in text.lines().filter_map(sample) {
        if name == "flotilla_update_runs" && value > 0.0 {
            states.insert(
                labels.get("fleet").copied().unwrap_or("?").to_string(),
                labels.get("state").copied().unwrap_or("?").to_string(),
            );
        }
    }
    states
}

/// A quantile of the dispatch-delay histogram (all triggers, or one), interpolated inside its
/// bucket as Prometheus's `histogram_quantile` does: (count, estimate, the bucket's upper bound).
fn histogram_quantile(text: &str, trigger: Option<&str>, q: f64) -> Option<(f64, f64, f64)> {
    let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for (name, labels, value) in text.lines().filter_map(sample) {
        if name != "flotilla_dispatch_delay_seconds_bucket"
            || trigger.is_some_and(|t| labels.get("trigger") != Some(&t))
        {
            continue;
        }
        let le = labels.get("le").copied().unwrap_or("+Inf");
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        buckets.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += value;
    }
    let mut buckets: Vec<(f64, f64)> = buckets.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut below = (0.0, 0.0);
    for (bound, cumulative) in &buckets {
        if *cumulative >= rank {
            if bound.is_infinite() {
                return Some((total, below.0, *bound));
            }
            let inside = cumulative - below.1;
            let estimate = if inside > 0.0 {
                below.0 + (bound - below.0) * (rank - below.1) / inside
            } else {
                *bound
            };
            return Some((total, estimate, *bound));
        }
        below = (*bound, *cumulative);
    }
    None
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A process's resident memory (KiB) and CPU time (s), from /proc.
fn process_usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit(')').next()?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|x| x.parse::<f64>().ok());
    Some((rss, (tick(11)? + tick(12)?) / 100.0))
}

/// CPU seconds used so far by every process named `postgres` (the server's backends: those
/// that ended since are not counted), and the machine's busy and total CPU seconds.
fn cpu_now() -> (f64, f64, f64) {
    let mut postgres = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != "postgres" {
            continue;
        }
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let tick = |i: usize| fields.get(i).and_then(|x| x.parse::<f64>().ok());
        postgres += tick(11).unwrap_or(0.0) + tick(12).unwrap_or(0.0);
    }
    let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = machine
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = ticks.iter().sum();
    // idle and iowait
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    (postgres / 100.0, (total - idle) / 100.0, total / 100.0)
}

#[derive(Clone, Copy, Default)]
struct Usage {
    peak_kib: u64,
    last_kib: u64,
    cpu_seconds: f64,
}

#[derive(Default)]
struct Reads {
    latencies: Vec<f64>,
    bytes: u64,
    errors: u64,
}

fn fleet_name(f: usize) -> String {
    format!("f{f:02}")
}

fn cell(stage: usize, group: usize) -> String {
    format!("s{stage}-g{group:02}")
}

/// The strategy's lower bound on a run's makespan, in rounds of upgrades, from the run as
/// created (the resolved integers of its status, SEMANTICS §3): per stage, at most
/// min(stage ceiling, Σ group ceilings) members in flight and at most a group's ceiling in
/// each group, so ceil(stage size / that) rounds, and no fewer than the slowest group's
/// ceil(size / its ceiling); stages one after another.
fn lower_bound_rounds(run: &Value) -> (u64, Vec<String>) {
    let mut rounds = 0;
    let mut shown = Vec::new();
    for stage in run["properties"]["status"]["stages"]
        .as_array()
        .expect("the run's stages")
    {
        let ceiling = stage["maxConcurrency"].as_u64().unwrap_or(1).max(1);
        let mut size = 0;
        let mut group_ceilings = 0;
        let mut slowest_group = 0;
        for group in stage["groups"].as_array().into_iter().flatten() {
            let members = group["members"].as_array().map_or(0, Vec::len) as u64;
            let own = group["maxConcurrency"].as_u64().unwrap_or(1).max(1);
            size += members;
            group_ceilings += own.min(members);
            slowest_group = slowest_group.max(members.div_ceil(own));
        }
        let in_flight = ceiling.min(group_ceilings).max(1);
        let stage_rounds = size.div_ceil(in_flight).max(slowest_group);
        shown.push(format!(
            "{} {size} members / {in_flight} at once = {stage_rounds} rounds",
            stage["name"].as_str().unwrap_or("?")
        ));
        rounds += stage_rounds;
    }
    (rounds, shown)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let config = parse_args();
    if !postgres_reachable() {
        println!(
            "replicas bench: no PostgreSQL at {}; nothing measured",
            postgres_base()
        );
        return;
    }
    let n = config.replicas;
    let total_members = config.fleets * config.members;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let database = format!("flotilla_bench_replicas_{}_{stamp}", std::process::id());
    admin_sql(format!("CREATE DATABASE {database}"));
    let dir = std::env::temp_dir().join(&database);
    std::fs::create_dir_all(&dir).expect("log dir");
    let mut cluster = Cluster {
        url: format!("{}/{database}", postgres_base()),
        database,
        dir,
        ports: (0..n).map(|_| free_port()).collect(),
        children: Vec::new(),
        pids: Vec::new(),
        keep: config.keep,
    };
    let token = create_token(&cluster.url);
    let ttl = config.lease_ttl.to_string();
    for i in 0..n {
        let child = serve(
            &cluster.url,
            cluster.ports[i],
            &cluster.log(i),
            &["--lease-ttl", &ttl],
        );
        cluster.pids.push(child.id());
        cluster.children.push(Some(child));
    }
    let client = Client {
        http: reqwest::blocking::Client::new(),
        token,
        bases: Arc::new(
            cluster
                .ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
        ),
    };
    for i in 0..n {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !client
            .send(
                reqwest::Method::GET,
                i,
                "/readyz",
                None,
                Duration::from_secs(5),
            )
            .is_ok_and(|(s, _)| s == 200)
        {
            assert!(
                Instant::now() < deadline,
                "replica {i} not ready after 60 s; logs in {}",
                cluster.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!(
        "{n} replicas on {} (lease TTL {} s); {} fleets × {} members, {} stages × {} groups, stage ceiling {}, upgrades of {} s",
        cluster.url,
        config.lease_ttl,
        config.fleets,
        config.members,
        config.stages,
        config.groups,
        config.ceiling,
        config.upgrade_seconds
    );

    // Memory and CPU of every replica, sampled until the end.
    let alive: Arc<Vec<AtomicBool>> = Arc::new((0..n).map(|_| AtomicBool::new(true)).collect());
    let usage = Arc::new(Mutex::new(vec![Usage::default(); n]));
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (alive, usage, stop, pids) = (
            alive.clone(),
            usage.clone(),
            stop_sampling.clone(),
            cluster.pids.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for (i, pid) in pids.iter().enumerate() {
                    if !alive[i].load(Ordering::Relaxed) {
                        continue;
                    }
                    if let Some((rss, cpu)) = process_usage(*pid) {
                        let mut usage = usage.lock().expect("usage");
                        usage[i].peak_kib = usage[i].peak_kib.max(rss);
                        usage[i].last_kib = rss;
                        usage[i].cpu_seconds = cpu;
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };

    // 1. Fleets, each created through its replica (which then drives it), then every fleet's
    // members imported at once, 10,000 a request, one client per fleet.
    let time_scale = SIM_UPGRADE_SECONDS / config.upgrade_seconds;
    let driver = json!({"properties": {"driver": {"type": "sim", "timeScale": time_scale,
        "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}]}},
        "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5",
            "sim": {"durationSeconds": SIM_UPGRADE_SECONDS}}}}});
    for f in 0..config.fleets {
        client.must(
            reqwest::Method::PUT,
            f % n,
            &format!("/v1/fleets/{}", fleet_name(f)),
            Some(&driver),
        );
    }
    let barrier = Arc::new(Barrier::new(config.fleets + 1));
    let importers: Vec<_> = (0..config.fleets)
        .map(|f| {
            let (client, barrier) = (client.clone(), barrier.clone());
            let (members, stages, groups) = (config.members, config.stages, config.groups);
            std::thread::spawn(move || {
                let fleet = fleet_name(f);
                barrier.wait();
                let t = Instant::now();
                for first in (0..members).step_by(10_000) {
                    let value: Vec<Value> = (first..(first + 10_000).min(members))
                        .map(|i| {
                            let (stage, group) = (i % stages, (i / stages) % groups);
                            json!({"name": format!("m{i:06}"), "properties": {
                                "clusterResourceId": format!("/sub/rg/{fleet}/c{i}"),
                                "labels": {"stage": format!("s{stage}"), "cell": cell(stage, group)}}})
                        })
                        .collect();
                    client.must(
                        reqwest::Method::POST,
                        f % client.bases.len(),
                        &format!("/v1/fleets/{fleet}/importMembers"),
                        Some(&json!({"value": value, "mode": "Create"})),
                    );
                }
                t.elapsed().as_secs_f64()
            })
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    let mut import_each: Vec<f64> = importers
        .into_iter()
        .map(|h| h.join().expect("an importer"))
        .collect();
    let import_seconds = t.elapsed().as_secs_f64();
    import_each.sort_by(f64::total_cmp);
    let import_rate = total_members as f64 / import_seconds;
    println!(
        "registered {total_members} members in {import_seconds:.1} s ({import_rate:.0} members/s; per fleet {:.1}–{:.1} s)",
        import_each[0],
        import_each[import_each.len() - 1]
    );

    // 2. One run per fleet: stages of groups selected by the `cell` label, each group as wide as
    // the stage lets it (100%), under the stage's ceiling; created through the fleet's replica,
    // all at once.
    let strategy_stages: Vec<Value> = (0..config.stages)
        .map(|s| {
            let groups: Vec<Value> = (0..config.groups)
                .map(|g| json!({"name": cell(s, g), "maxConcurrency": "100%",
                    "memberSelector": {"byLabel": format!("cell={}", cell(s, g))}}))
                .collect();
            json!({"name": format!("s{s}"), "maxConcurrency": config.ceiling.to_string(), "groups": groups})
        })
        .collect();
    let run = json!({"properties": {"strategy": {"stages": strategy_stages},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    let creators: Vec<_> = (0..config.fleets)
        .map(|f| {
            let (client, run) = (client.clone(), run.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                let created = client.must(
                    reqwest::Method::PUT,
                    f % client.bases.len(),
                    &format!("/v1/fleets/{}/updateRuns/r1", fleet_name(f)),
                    Some(&run),
                );
                (t.elapsed().as_secs_f64(), created)
            })
        })
        .collect();
    let t = Instant::now();
    let mut create_each = Vec::new();
    let mut bound_rounds = 0;
    let mut bound_shown = Vec::new();
    for creator in creators {
        let (seconds, created) = creator.join().expect("a run's creation");
        create_each.push(seconds);
        let created: Value = serde_json::from_str(&created).expect("the run as JSON");
        let (rounds, shown) = lower_bound_rounds(&created);
        if rounds > bound_rounds {
            bound_rounds = rounds;
            bound_shown = shown;
        }
    }
    let create_all = t.elapsed().as_secs_f64();
    create_each.sort_by(f64::total_cmp);
    let lower_bound = bound_rounds as f64 * config.upgrade_seconds;
    println!(
        "created {} runs in {create_all:.1} s (each {:.2}–{:.2} s); lower bound {bound_rounds} rounds × {} s = {lower_bound:.1} s ({})",
        config.fleets,
        create_each[0],
        create_each[create_each.len() - 1],
        config.upgrade_seconds,
        bound_shown.join("; ")
    );

    // 3. Readers: each run's document from every replica, in turn, while the runs go.
    let stop_reading = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..config.readers)
        .map(|r| {
            let (client, alive, stop) = (client.clone(), alive.clone(), stop_reading.clone());
            let (fleets, readers) = (config.fleets, config.readers);
            std::thread::spawn(move || {
                let mut reads: Vec<Reads> = (0..n).map(|_| Reads::default()).collect();
                let mut k = r;
                while !stop.load(Ordering::Relaxed) {
                    let (replica, fleet) = (k % n, (k / n) % fleets);
                    k += readers;
                    if !alive[replica].load(Ordering::Relaxed) {
                        continue;
                    }
                    let t = Instant::now();
                    let path = format!("/v1/fleets/{}/updateRuns/r1", fleet_name(fleet));
                    match client.send(reqwest::Method::GET, replica, &path, None, LONG) {
                        Ok((200, text)) => {
                            reads[replica].latencies.push(t.elapsed().as_secs_f64());
                            reads[replica].bytes += text.len() as u64;
                        }
                        // A read the kill cut short is not the server's error.
                        _ if !alive[replica].load(Ordering::Relaxed) => {}
                        _ => reads[replica].errors += 1,
                    }
                }
                reads
            })
        })
        .collect();

    // 4. Every run started at once through its fleet's replica; then watched until all are
    // Completed, with the kill midway.
    let barrier = Arc::new(Barrier::new(config.fleets + 1));
    let starters: Vec<_> = (0..config.fleets)
        .map(|f| {
            let (client, barrier) = (client.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                client.must(
                    reqwest::Method::POST,
                    f % client.bases.len(),
                    &format!("/v1/fleets/{}/updateRuns/r1/start", fleet_name(f)),
                    None,
                );
            })
        })
        .collect();
    let cpu_before = (
        cpu_now(),
        usage
            .lock()
            .expect("usage")
            .iter()
            .map(|u| u.cpu_seconds)
            .sum::<f64>(),
    );
    barrier.wait();
    let started_at = Instant::now();
    for starter in starters {
        starter.join().expect("a run's start");
    }
    let start_all = started_at.elapsed().as_secs_f64();
    println!("started every run in {start_all:.2} s");
    let limit = Duration::from_secs_f64((lower_bound * 20.0).max(300.0) + 10.0 * config.lease_ttl);
    let mut killed: Option<Kill> = None;
    let mut last_progress = Instant::now();
    let mut last_metrics: Vec<String> = vec![String::new(); n];
    // When each fleet's run was first seen Completed, from the first start.
    let mut completed_at: BTreeMap<String, f64> = BTreeMap::new();
    let makespan = loop {
        std::thread::sleep(Duration::from_millis(200));
        let mut succeeded = 0.0;
        let mut states = BTreeMap::new();
        for i in (0..n).filter(|i| alive[*i].load(Ordering::Relaxed)) {
            if let Some(text) = client.metrics(i) {
                succeeded += sum_of(&text, "flotilla_member_upgrades_succeeded_total");
                if states.is_empty() {
                    states = run_states(&text);
                }
                last_metrics[i] = text;
            }
        }
        for (fleet, state) in &states {
            if state == "Completed" && !completed_at.contains_key(fleet) {
                completed_at.insert(fleet.clone(), started_at.elapsed().as_secs_f64());
            }
        }
        let completed = completed_at.len();
        let ended_badly: Vec<_> = states
            .iter()
            .filter(|(_, s)| ["Failed", "Stopped"].contains(&s.as_str()))
            .collect();
        assert!(
            ended_badly.is_empty(),
            "runs ended badly: {ended_badly:?}; logs in {}",
            cluster.dir.display()
        );
        if completed >= config.fleets {
            break started_at.elapsed().as_secs_f64();
        }
        if killed.is_none() && n > 1 && succeeded >= config.kill_at * total_members as f64 {
            killed = Some(kill_busiest(
                &mut cluster,
                &client,
                &alive,
                &last_metrics,
                started_at,
                succeeded / total_members as f64,
                config.lease_ttl,
            ));
        }
        if last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            println!(
                "  {:6.1} s: {completed}/{} runs completed; {succeeded:.0} upgrades succeeded{}",
                started_at.elapsed().as_secs_f64(),
                config.fleets,
                if killed.is_some() {
                    " (on the survivors since they started)"
                } else {
                    ""
                }
            );
        }
        assert!(
            started_at.elapsed() < limit,
            "the runs did not complete within {limit:?}: {states:?}; logs in {}",
            cluster.dir.display()
        );
    };
    let cpu_after = cpu_now();
    stop_reading.store(true, Ordering::Relaxed);
    let mut reads: Vec<Reads> = (0..n).map(|_| Reads::default()).collect();
    for reader in readers {
        for (i, part) in reader.join().expect("a reader").into_iter().enumerate() {
            reads[i].latencies.extend(part.latencies);
            reads[i].bytes += part.bytes;
            reads[i].errors += part.errors;
        }
    }
    println!(
        "every run Completed {makespan:.1} s after the first start: {:.2}× the lower bound of {lower_bound:.1} s",
        makespan / lower_bound
    );

    // 5. What the survivors say: the dispatch delay, upgrades sent.
    let survivors: Vec<usize> = (0..n)
        .filter(|i| alive[*i].load(Ordering::Relaxed))
        .collect();
    let mut dispatch = Vec::new();
    let mut sent = 0.0;
    for &i in &survivors {
        let text = client.metrics(i).unwrap_or_default();
        sent += sum_of(&text, "flotilla_member_upgrades_started_total");
        dispatch.push((
            i,
            histogram_quantile(&text, Some("slot"), 0.5),
            histogram_quantile(&text, Some("slot"), 0.99),
            histogram_quantile(&text, None, 0.99),
        ));
    }
    if let Some(kill) = &killed {
        sent += kill.sent_before;
    }

    // 6. Every member of every run finished (a member whose upgrade succeeded is Completed):
    // read from a survivor.
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    let mut unfinished = Vec::new();
    for f in 0..config.fleets {
        let text = client.must(
            reqwest::Method::GET,
            survivors[0],
            &format!("/v1/fleets/{}/updateRuns/r1", fleet_name(f)),
            None,
        );
        let doc: Value = serde_json::from_str(&text).expect("a run as JSON");
        let state = doc["properties"]["status"]["status"]["state"].clone();
        if state != "Completed" {
            unfinished.push(format!("{}: run {state}", fleet_name(f)));
        }
        let mut members = 0;
        for stage in doc["properties"]["status"]["stages"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for group in stage["groups"].as_array().into_iter().flatten() {
                for member in group["members"].as_array().into_iter().flatten() {
                    members += 1;
                    let state = member["status"]["state"].as_str().unwrap_or("?");
                    *by_state.entry(state.to_string()).or_default() += 1;
                    if state != "Completed" && state != "Skipped" && unfinished.len() < 20 {
                        unfinished.push(format!(
                            "{}/{}: {state} {}",
                            fleet_name(f),
                            member["name"].as_str().unwrap_or("?"),
                            member["message"].as_str().unwrap_or_default()
                        ));
                    }
                }
            }
        }
        if members != config.members {
            unfinished.push(format!(
                "{}: {members} members in the run, not {}",
                fleet_name(f),
                config.members
            ));
        }
    }

    // 7. The database.
    let database_bytes: Vec<(i64,)> = postgres(
        &cluster.database,
        "SELECT pg_database_size(current_database())".into(),
    );
    let tables: Vec<(String, i64)> = postgres(
        &cluster.database,
        "SELECT c.relname::text, pg_total_relation_size(c.oid) FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
         ORDER BY 2 DESC LIMIT 5"
            .into(),
    );
    stop_sampling.store(true, Ordering::Relaxed);
    sampler.join().expect("the sampler");
    let usage = usage.lock().expect("usage").clone();
    let replicas_cpu = usage.iter().map(|u| u.cpu_seconds).sum::<f64>() - cpu_before.1;
    let (postgres_cpu, busy, total) = (
        cpu_after.0 - cpu_before.0.0,
        cpu_after.1 - cpu_before.0.1,
        cpu_after.2 - cpu_before.0.2,
    );

    // 8. The summary.
    println!();
    println!(
        "== replicas bench: {n} replicas, {} fleets × {} members ({total_members}), lease TTL {} s, {} stages × {} groups, ceiling {}, upgrades {} s",
        config.fleets,
        config.members,
        config.lease_ttl,
        config.stages,
        config.groups,
        config.ceiling,
        config.upgrade_seconds
    );
    println!(
        "registration      {total_members} members in {import_seconds:.1} s = {import_rate:.0} members/s (all fleets at once)"
    );
    println!(
        "run creation      {:.2} s median, {:.2} s slowest; every run started in {start_all:.2} s",
        percentile(&create_each, 0.5),
        create_each[create_each.len() - 1]
    );
    println!(
        "makespan          {makespan:.1} s; lower bound {lower_bound:.1} s ({bound_rounds} rounds × {} s); ratio {:.2}",
        config.upgrade_seconds,
        makespan / lower_bound
    );
    let taken_over = |fleet: &String| killed.as_ref().is_some_and(|k| k.fleets.contains(fleet));
    let slowest = |over: bool| {
        completed_at
            .iter()
            .filter(|(f, _)| taken_over(f) == over)
            .map(|(_, t)| *t)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))))
    };
    for (label, over) in [("other fleets", false), ("taken over", true)] {
        if let Some(t) = slowest(over) {
            println!(
                "  {label:<16}slowest run Completed at {t:.1} s, {:.2}× the lower bound",
                t / lower_bound
            );
        }
    }
    match &killed {
        Some(k) => println!(
            "kill              replica {} (pid {}, {} fleets) at {:.1} s, {:.0}% of the members done; takeover {:.2} s (lease TTL {} s, {:.2}× TTL); its fleets went to {}",
            k.replica,
            cluster.pids[k.replica],
            k.fleets.len(),
            k.at,
            k.done * 100.0,
            k.takeover,
            config.lease_ttl,
            k.takeover / config.lease_ttl,
            k.new_owners
        ),
        None => println!(
            "kill              none (one replica, or the runs completed before {:.0}% of the members were done)",
            config.kill_at * 100.0
        ),
    }
    println!(
        "upgrades sent     {sent:.0} for {total_members} members ({:.0} more: resent after the takeover, or counted on the killed replica after its last scrape)",
        sent - total_members as f64
    );
    for (i, slot50, slot99, all99) in &dispatch {
        let show = |q: &Option<(f64, f64, f64)>| match q {
            Some((_, v, b)) if b.is_infinite() => format!("> {:.0} ms", v * 1000.0),
            Some((_, v, b)) => format!("{:.1} ms (bucket ≤ {:.1} ms)", v * 1000.0, b * 1000.0),
            None => "n/a".into(),
        };
        println!(
            "dispatch r{i}       slot: {} upgrades, p50 {}, p99 {}; all triggers p99 {}",
            slot99.map_or(0.0, |q| q.0),
            show(slot50),
            show(slot99),
            show(all99)
        );
    }
    println!(
        "reads             GET of a run's document, {} clients, while the runs went (†: killed):",
        config.readers
    );
    for (i, r) in reads.iter_mut().enumerate() {
        r.latencies.sort_by(f64::total_cmp);
        let count = r.latencies.len();
        println!(
            "  {:<16}{count} reads, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, {:.2} MB each, {} errors",
            if killed.as_ref().is_some_and(|k| k.replica == i) {
                format!("replica {i} (†)")
            } else {
                format!("replica {i}")
            },
            percentile(&r.latencies, 0.5) * 1000.0,
            percentile(&r.latencies, 0.99) * 1000.0,
            r.latencies.last().copied().unwrap_or_default() * 1000.0,
            if count > 0 {
                r.bytes as f64 / count as f64 / 1e6
            } else {
                0.0
            },
            r.errors
        );
    }
    println!("memory and CPU    per replica (RSS sampled every 250 ms):");
    for (i, u) in usage.iter().enumerate() {
        let log = std::fs::read_to_string(cluster.log(i)).unwrap_or_default();
        let flagged: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        let errors = flagged.iter().filter(|l| l.contains(" ERROR ")).count();
        let warnings = flagged.len() - errors;
        let end = if alive[i].load(Ordering::Relaxed) {
            format!("{:.0} MiB at the end", mib(u.last_kib))
        } else {
            format!("{:.0} MiB when killed", mib(u.last_kib))
        };
        println!(
            "  replica {i}       peak {:.0} MiB, {end}; CPU {:.1} s; log: {warnings} warnings, {errors} errors",
            mib(u.peak_kib),
            u.cpu_seconds
        );
        // What they said, without the time stamp: each kind once, the first three kinds.
        let mut kinds: Vec<String> = Vec::new();
        for line in &flagged {
            let text = line.split_once(' ').map_or(*line, |(_, rest)| rest);
            let kind: String = text.chars().take(60).collect();
            if kinds.iter().all(|k| !k.starts_with(&kind)) && kinds.len() < 3 {
                kinds.push(text.chars().take(240).collect());
            }
        }
        for kind in kinds {
            println!("                    {kind}");
        }
    }
    println!(
        "CPU over the runs replicas {replicas_cpu:.1} s, postgres processes {postgres_cpu:.1} s, machine {:.0}% busy ({busy:.1} of {total:.1} CPU-seconds, anything else on it included)",
        busy / total.max(1e-9) * 100.0
    );
    println!(
        "database          {:.1} MiB; largest tables: {}",
        database_bytes
            .first()
            .map_or(0.0, |b| b.0 as f64 / 1048576.0),
        tables
            .iter()
            .map(|(t, b)| format!("{t} {:.1} MiB", *b as f64 / 1048576.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "members           {}",
        by_state
            .iter()
            .map(|(s, c)| format!("{c} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        unfinished.is_empty(),
        "members left unfinished:\n{}\nlogs in {}",
        unfinished.join("\n"),
        cluster.dir.display()
    );
    println!("check             every run Completed, every member Completed (upgraded) or Skipped");
}

/// The kill and the takeover after it.
struct Kill {
    replica: usize,
    fleets: Vec<String>,
    /// Seconds from the first start.
    at: f64,
    /// The fraction of all members upgraded by then.
    done: f64,
    takeover: f64,
    new_owners: String,
    /// Upgrades the killed replica had sent by its last scrape.
    sent_before: f64,
}

/// SIGKILLs the replica holding the most fleet leases and waits (polling `/v1/leases` every
/// 50 ms) until each of its fleets is held by a surviving replica.
fn kill_busiest(
    cluster: &mut Cluster,
    client: &Client,
    alive: &[AtomicBool],
    metrics: &[String],
    started_at: Instant,
    done: f64,
    lease_ttl: f64,
) -> Kill {
    let n = cluster.ports.len();
    let leases = (0..n)
        .find_map(|i| client.leases(i, &cluster.ports))
        .expect("the leases");
    let mut held = vec![0; n];
    for (owner, _) in leases.values() {
        held[*owner] += 1;
    }
    let victim = (0..n).max_by_key(|i| held[*i]).expect("a replica");
    let fleets: Vec<(String, i64)> = leases
        .iter()
        .filter(|(_, (owner, _))| *owner == victim)
        .map(|(fleet, (_, epoch))| (fleet.clone(), *epoch))
        .collect();
    // A takeover of nothing would be measured as instant.
    assert!(
        !fleets.is_empty(),
        "no replica holds a fleet's lease: nothing to take over"
    );
    let sent_before = sum_of(&metrics[victim], "flotilla_member_upgrades_started_total");
    alive[victim].store(false, Ordering::Relaxed);
    let killed_at = Instant::now();
    cluster.kill(victim);
    let at = started_at.elapsed().as_secs_f64();
    println!(
        "  {at:6.1} s: SIGKILL to replica {victim} holding {} fleets ({:.0}% of the members done)",
        fleets.len(),
        done * 100.0
    );
    let deadline = killed_at + Duration::from_secs_f64(lease_ttl * 5.0 + 30.0);
    let survivor = (0..n).find(|i| *i != victim).expect("a survivor");
    loop {
        if let Some(now) = client.leases(survivor, &cluster.ports) {
            let taken: Option<Vec<usize>> = fleets
                .iter()
                .map(|(fleet, epoch)| {
                    now.get(fleet)
                        .filter(|(owner, e)| *owner != victim && e > epoch)
                        .map(|(owner, _)| *owner)
                })
                .collect();
            if let Some(owners) = taken {
                let takeover = killed_at.elapsed().as_secs_f64();
                let mut count: BTreeMap<usize, usize> = BTreeMap::new();
                for o in owners {
                    *count.entry(o).or_default() += 1;
                }
                let new_owners = count
                    .iter()
                    .map(|(o, c)| format!("replica {o} ×{c}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                println!(
                    "  {:6.1} s: every fleet of replica {victim} taken over after {takeover:.2} s ({new_owners})",
                    started_at.elapsed().as_secs_f64()
                );
                return Kill {
                    replica: victim,
                    fleets: fleets.iter().map(|(f, _)| f.clone()).collect(),
                    at,
                    done,
                    takeover,
                    new_owners,
                    sent_before,
                };
            }
        }
        assert!(
            Instant::now() < deadline,
            "the killed replica's fleets were not taken over; logs in {}",
            cluster.dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
