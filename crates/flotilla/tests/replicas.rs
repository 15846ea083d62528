//! Several replicas on the machine's PostgreSQL (`FLOTILLA_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432`), each test in a database of its own: real `flotilla
//! serve` processes, an update run over the `exec` driver whose scripts log every upgrade
//! request they receive (with the sending process and the time), and the owner of the fleet
//! killed or paused under it. Nothing may be sent twice, and a paused owner sends nothing once
//! it has lost its lease.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use common::{Api, Lcg, create_exec_run, create_token, free_port, member_name, serve};

/// Lease time in these tests: short, so takeovers happen quickly.
const LEASE_TTL: &str = "2";

use flotilla_server::store::postgres::test_support::{
    admin_sql, base as postgres_base, reachable as postgres_reachable,
};

/// A database, a state directory for the scripts, and the replicas serving it.
struct Cluster {
    name: String,
    url: String,
    dir: PathBuf,
    ports: Vec<u16>,
    replicas: Vec<Option<Child>>,
    token: String,
}

impl Cluster {
    fn new(test: &str, replicas: usize) -> Cluster {
        let name = format!("flotilla_{test}_{}", std::process::id());
        admin_sql(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        admin_sql(format!("CREATE DATABASE {name}"));
        let url = format!("{}/{name}", postgres_base());
        let dir = std::env::temp_dir().join(format!("flotilla-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("state")).expect("state dir");
        let token = create_token(&url);
        let mut cluster = Cluster {
            name,
            url,
            dir,
            ports: (0..replicas).map(|_| free_port()).collect(),
            replicas: (0..replicas).map(|_| None).collect(),
            token,
        };
        for i in 0..replicas {
            cluster.start(i);
        }
        for i in 0..replicas {
            cluster.api(i).wait_ready();
        }
        cluster
    }

    fn start(&mut self, i: usize) {
        let log = self.dir.join(format!("replica-{i}.log"));
        self.replicas[i] = Some(serve(
            &self.url,
            self.ports[i],
            &log,
            &["--lease-ttl", LEASE_TTL],
        ));
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.replicas[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pid(&self, i: usize) -> u32 {
        self.replicas[i].as_ref().map_or(0, Child::id)
    }

    fn api(&self, i: usize) -> Api {
        Api {
            http: reqwest::blocking::Client::new(),
            base: format!("http://127.0.0.1:{}", self.ports[i]),
            token: self.token.clone(),
        }
    }

    /// Any replica that answers.
    fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> (u16, Value) {
        for i in 0..self.ports.len() {
            if self.replicas[i].is_none() {
                continue;
            }
            if let Ok(answer) = self.api(i).call(method.clone(), path, body) {
                return answer;
            }
        }
        (0, Value::Null)
    }

    /// The replica holding the fleet's unexpired lease, and its epoch.
    fn owner(&self, fleet: &str) -> Option<(usize, i64)> {
        let (_, leases) = self.call(reqwest::Method::GET, "/v1/leases", None);
        let lease = leases["value"]
            .as_array()?
            .iter()
            .find(|l| l["fleet"] == fleet && l["expired"] == false)?
            .clone();
        let owner = lease["owner"].as_str()?;
        let port: u16 = owner.split('/').next()?.rsplit(':').next()?.parse().ok()?;
        let i = self.ports.iter().position(|p| *p == port)?;
        Some((i, lease["epoch"].as_i64()?))
    }

    fn wait_owner(&self, fleet: &str, not: Option<(usize, i64)>, within: Duration) -> (usize, i64) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(owner) = self.owner(fleet)
                && Some(owner) != not
                && self.replicas[owner.0].is_some()
            {
                return owner;
            }
            assert!(
                Instant::now() < deadline,
                "no replica took fleet {fleet} over; logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn run_state(&self, fleet: &str, run: &str) -> String {
        let (_, body) = self.call(
            reqwest::Method::GET,
            &format!("/v1/fleets/{fleet}/updateRuns/{run}"),
            None,
        );
        body["properties"]["status"]["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Every upgrade request the scripts received: member, sending pid, time (ns since epoch).
    fn received(&self) -> Vec<(String, u32, u128)> {
        std::fs::read_to_string(self.dir.join("state/received.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                Some((
                    f.first()?.to_string(),
                    f.get(3)?.parse().ok()?,
                    f.get(4)?.parse().ok()?,
                ))
            })
            .collect()
    }

    /// A fleet of `members` over the exec driver, and a started run across them.
    fn start_run(&self, members: usize, concurrency: usize, upgrade_ms: u64) {
        self.create_run(members, concurrency, upgrade_ms);
        self.start_created_run();
    }

    fn create_run(&self, members: usize, concurrency: usize, upgrade_ms: u64) {
        create_exec_run(
            &self.api(0),
            &self.dir.join("state"),
            members,
            concurrency,
            upgrade_ms,
        );
    }

    /// Starts run r1 through another replica than the one that took the fleet.
    fn start_created_run(&self) {
        let (owner, _) = self.wait_owner("edge", None, Duration::from_secs(10));
        let other = (owner + 1) % self.ports.len();
        self.api(other).must(
            reqwest::Method::POST,
            "/v1/fleets/edge/updateRuns/r1/start",
            None,
        );
    }

    fn assert_each_member_received_once(&self, members: usize) {
        let mut per_member: BTreeMap<String, usize> = BTreeMap::new();
        for (member, _, _) in self.received() {
            *per_member.entry(member).or_default() += 1;
        }
        let log = std::fs::read_to_string(self.dir.join("state/received.log")).unwrap_or_default();
        for i in 0..members {
            assert_eq!(
                per_member.get(&member_name(i)),
                Some(&1),
                "{} was not sent its upgrade exactly once:\n{log}",
                member_name(i)
            );
        }
        assert_eq!(per_member.len(), members, "{log}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.replicas.len() {
            if let Some(child) = &self.replicas[i] {
                // A paused replica must be woken to die.
                let _ = std::process::Command::new("kill")
                    .args(["-CONT", &child.id().to_string()])
                    .status();
            }
            self.kill(i);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        admin_sql(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

#[test]
fn killing_the_owning_replica_again_and_again_upgrades_every_member_exactly_once() {
    if !postgres_reachable() {
        return;
    }
    const MEMBERS: usize = 30;
    let mut cluster = Cluster::new("kill", 3);
    cluster.start_run(MEMBERS, 2, 800);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    eprintln!("replica kill test seed {seed}");
    let mut rng = Lcg(seed);
    let mut kills = 0;
    let mut takeovers_ms = Vec::new();
    let mut next_upgrade_ms = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        std::thread::sleep(Duration::from_millis(200 + rng.next(1800)));
        let state = cluster.run_state("edge", "r1");
        if state == "Completed" || state == "Failed" {
            assert_eq!(state, "Completed");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not finish; last state {state:?}; logs in {}",
            cluster.dir.display()
        );
        let Some((owner, epoch)) = cluster.owner("edge") else {
            continue;
        };
        let killed_at = Instant::now();
        let killed_ns = now_ns();
        cluster.kill(owner);
        kills += 1;
        // Measured: from the owner's death to another replica holding the fleet, and to the next
        // upgrade request any replica sends.
        let (next_owner, next_epoch) =
            cluster.wait_owner("edge", Some((owner, epoch)), Duration::from_secs(20));
        assert!(next_epoch > epoch);
        assert_ne!(next_owner, owner);
        takeovers_ms.push(killed_at.elapsed().as_millis());
        cluster.start(owner);
        let wait_next = Instant::now() + Duration::from_secs(10);
        while Instant::now() < wait_next {
            if let Some(first) = cluster
                .received()
                .iter()
                .filter(|(_, _, t)| *t > killed_ns)
                .map(|(_, _, t)| *t)
                .min()
            {
                next_upgrade_ms.push((first - killed_ns) / 1_000_000);
                break;
            }
            if matches!(
                cluster.run_state("edge", "r1").as_str(),
                "Completed" | "Failed"
            ) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster.api(owner).wait_ready();
    }
    assert!(
        kills >= 5,
        "only {kills} kills before the run ended; the test proves little"
    );
    cluster.assert_each_member_received_once(MEMBERS);
    takeovers_ms.sort();
    next_upgrade_ms.sort();
    eprintln!(
        "{kills} kills; lease takeover ms (sorted) {takeovers_ms:?}; death to next upgrade ms (sorted) {next_upgrade_ms:?}"
    );
}

#[test]
fn a_paused_owner_sends_nothing_after_losing_its_lease() {
    if !postgres_reachable() {
        return;
    }
    const MEMBERS: usize = 12;
    let cluster = Cluster::new("pause", 3);
    cluster.start_run(MEMBERS, 2, 1500);
    // Wait for the run to be under way.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.received().len() < 2 {
        assert!(Instant::now() < deadline, "no upgrade was sent");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (owner, epoch) = cluster.owner("edge").expect("an owner");
    let paused = cluster.pid(owner);
    signal(paused, "-STOP");
    let paused_ns = now_ns();
    // Another replica takes over and moves the run on.
    let (next, _) = cluster.wait_owner("edge", Some((owner, epoch)), Duration::from_secs(20));
    assert_ne!(next, owner);
    let successor = cluster.pid(next);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster
        .received()
        .iter()
        .any(|(_, pid, t)| *pid == successor && *t > paused_ns)
    {
        assert!(
            Instant::now() < deadline,
            "the new owner sent nothing; logs in {}",
            cluster.dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Wake the paused one while the run goes on, and let it be for longer than a lease.
    signal(paused, "-CONT");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let state = cluster.run_state("edge", "r1");
        if state == "Completed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not finish; last state {state:?}; logs in {}",
            cluster.dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let late: Vec<_> = cluster
        .received()
        .into_iter()
        .filter(|(_, pid, t)| *pid == paused && *t > paused_ns)
        .collect();
    assert!(
        late.is_empty(),
        "the paused replica sent upgrades after losing its lease: {late:?}"
    );
    cluster.assert_each_member_received_once(MEMBERS);
    // It is alive and answers, and does not claim the fleet.
    cluster.api(owner).wait_ready();
    assert_ne!(cluster.owner("edge").map(|(i, _)| i), Some(owner));
}

/// The SQLite mode stays one replica, and says so.
#[test]
fn a_second_server_on_one_sqlite_file_is_refused_clearly() {
    let dir = std::env::temp_dir().join(format!("flotilla-sqlite-one-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("flotilla.db").display().to_string();
    let token = create_token(&db);
    let port = free_port();
    let mut first = serve(&db, port, &dir.join("first.log"), &[]);
    Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    }
    .wait_ready();
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--database",
            &db,
        ])
        .output()
        .expect("runs");
    let _ = first.kill();
    let _ = first.wait();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("SQLite mode serves one replica only") && stderr.contains("postgres://"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}

/// Reads run r1's event stream from a replica until the run completes: each event's id, type
/// and arrival instant.
fn stream_events(api: &Api, opened: std::sync::mpsc::Sender<()>) -> Vec<(i64, String, Instant)> {
    use std::io::BufRead;
    let response = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
        .get(format!("{}/v1/fleets/edge/updateRuns/r1/events", api.base))
        .bearer_auth(&api.token)
        .header("accept", "text/event-stream")
        .send()
        .expect("the stream opens");
    assert_eq!(response.status().as_u16(), 200);
    let _ = opened.send(());
    let mut events = Vec::new();
    let mut id = None;
    for line in std::io::BufReader::new(response).lines() {
        let line = line.expect("the stream goes on until the run completes");
        if let Some(value) = line.strip_prefix("id:") {
            id = Some(value.trim().parse::<i64>().expect("numeric ids"));
        } else if let Some(data) = line.strip_prefix("data:") {
            let event: Value = serde_json::from_str(data.trim()).expect("JSON events");
            let kind = event["type"].as_str().unwrap_or_default().to_string();
            events.push((
                id.take().expect("an id before each event"),
                kind,
                Instant::now(),
            ));
            if event["type"] == "RunCompleted" {
                break;
            }
        }
    }
    events
}

/// A client streaming a run's events from a replica that does not drive the run sees every
/// event the owner records, in order, ending with the run's completion. How much later it sees
/// each one than a client of the owner is printed (BENCHMARKS.md), not asserted.
#[test]
fn events_stream_from_any_replica() {
    if !postgres_reachable() {
        return;
    }
    const MEMBERS: usize = 4;
    let cluster = Cluster::new("events", 2);
    cluster.create_run(MEMBERS, 2, 200);
    let (owner, _) = cluster.wait_owner("edge", None, Duration::from_secs(10));
    let other = (owner + 1) % 2;
    let (opened, ready) = std::sync::mpsc::channel();
    let streams: Vec<_> = [owner, other]
        .into_iter()
        .map(|i| {
            let (api, opened) = (cluster.api(i), opened.clone());
            std::thread::spawn(move || stream_events(&api, opened))
        })
        .collect();
    for _ in 0..2 {
        ready
            .recv_timeout(Duration::from_secs(20))
            .expect("both streams open");
    }
    cluster.start_created_run();
    let mut seen: Vec<Vec<(i64, String, Instant)>> = streams
        .into_iter()
        .map(|t| t.join().expect("stream thread"))
        .collect();
    let (from_other, from_owner) = (seen.pop().expect("other"), seen.pop().expect("owner"));
    let ids: Vec<i64> = from_other.iter().map(|(id, _, _)| *id).collect();
    let types: Vec<String> = from_other.iter().map(|(_, t, _)| t.clone()).collect();
    // Everything the owner recorded, in order, with nothing missed or repeated.
    let stored = cluster.api(owner).must(
        reqwest::Method::GET,
        "/v1/fleets/edge/updateRuns/r1/events",
        None,
    );
    let stored_types: Vec<String> = stored["value"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids, (1..=ids.len() as i64).collect::<Vec<_>>());
    assert_eq!(types, stored_types[..types.len()]);
    assert_eq!(
        types.iter().filter(|t| *t == "MemberSucceeded").count(),
        MEMBERS,
        "{types:?}"
    );
    assert_eq!(
        from_owner.iter().map(|(id, _, _)| *id).collect::<Vec<_>>(),
        ids,
        "both streams carry the same events"
    );
    let mut lag_us: Vec<i128> = from_owner
        .iter()
        .zip(&from_other)
        .map(|((_, _, a), (_, _, b))| {
            let (a, b) = (*a, *b);
            if b >= a {
                b.duration_since(a).as_micros() as i128
            } else {
                -(a.duration_since(b).as_micros() as i128)
            }
        })
        .collect();
    lag_us.sort();
    eprintln!(
        "{} events; a non-owner's stream behind the owner's, µs (sorted): {lag_us:?}",
        lag_us.len()
    );
}

/// One door, whichever replica is asked (#37): a member registered and a member deleted
/// through a replica that does not drive the fleet reach the owner's table, and a run created
/// through it is decided by the owner over the fleet as it now is: the new member is in it, the
/// deleted one is not and is never sent an upgrade.
#[test]
fn members_and_runs_written_through_any_replica_reach_the_fleet_s_owner() {
    if !postgres_reachable() {
        return;
    }
    let cluster = Cluster::new("door", 2);
    cluster.create_run(3, 2, 200);
    let (owner, _) = cluster.wait_owner("edge", None, Duration::from_secs(10));
    let other = cluster.api((owner + 1) % 2);
    // Written through the replica that does not drive the fleet.
    other.must(
        reqwest::Method::PUT,
        "/v1/fleets/edge/members/late-1",
        Some(&json!({"properties": {"clusterResourceId": "late-1", "group": "stores"}})),
    );
    other.must(
        reqwest::Method::DELETE,
        &format!("/v1/fleets/edge/members/{}", member_name(0)),
        None,
    );
    let run = json!({"properties": {
        "strategy": {"stages": [{"name": "all", "groups": [{"name": "stores", "maxConcurrency": "2"}]}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
    }});
    let created = other.must(
        reqwest::Method::PUT,
        "/v1/fleets/edge/updateRuns/r2",
        Some(&run),
    );
    let mut selected: Vec<String> =
        created["properties"]["status"]["stages"][0]["groups"][0]["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["name"].as_str().map(String::from))
            .collect();
    selected.sort();
    let mut want = vec![member_name(1), member_name(2), "late-1".to_string()];
    want.sort();
    assert_eq!(selected, want, "{created}");
    // The same through the owner: the answer does not depend on who is asked.
    let (_, read) = cluster.call(reqwest::Method::GET, "/v1/fleets/edge/updateRuns/r2", None);
    assert_eq!(
        read["properties"]["status"],
        created["properties"]["status"]
    );
    // A budget of one: the replica that does not drive the fleet counts its members in flight
    // too, from what the store records of operations sent.
    other.must(
        reqwest::Method::PUT,
        "/v1/fleets/edge/disruptionBudgets/one",
        Some(&json!({"properties": {"maxUnavailable": "1"}})),
    );
    other.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r2/start",
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut counted = Vec::new();
    while cluster.run_state("edge", "r2") != "Completed" {
        assert!(
            Instant::now() < deadline,
            "r2 did not complete: {}; logs in {}",
            cluster.run_state("edge", "r2"),
            cluster.dir.display()
        );
        let budget = other.must(
            reqwest::Method::GET,
            "/v1/fleets/edge/disruptionBudgets/one",
            None,
        );
        let disrupted = &budget["properties"]["status"]["partitions"][0]["disrupted"];
        counted.push(
            disrupted
                .as_i64()
                .unwrap_or_else(|| panic!("counted: {budget}")),
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        counted.iter().all(|n| (0..=1).contains(n)) && counted.contains(&1),
        "in flight as the other replica counted it: {counted:?}"
    );
    let received: Vec<String> = cluster.received().into_iter().map(|(m, _, _)| m).collect();
    assert!(
        !received.contains(&member_name(0)),
        "the deleted member was upgraded: {received:?}"
    );
    assert_eq!(
        received.iter().filter(|m| *m == "late-1").count(),
        1,
        "{received:?}"
    );
}

/// A `sim` fleet whose clusters are all at 1.30.5, with 1.31.1 and two images listed.
fn sim_train_fleet(clusters: &[&str]) -> Value {
    let clusters: serde_json::Map<String, Value> = clusters
        .iter()
        .map(|id| {
            let cluster = json!({"region": "eastus", "kubernetesVersion": "1.30.5",
                "nodePools": [{"name": "sys", "family": "AKSUbuntu-2204gen2containerd", "os": "Linux", "nodeImageVersion": "202602.10.0"}]});
            (id.to_string(), cluster)
        })
        .collect();
    json!({"properties": {"driver": {
        "type": "sim",
        "timeScale": 6000,
        "catalog": {"eastus": {
            "kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}],
            "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202602.10.0"}, {"version": "202603.01.0"}]}}},
        "clusters": clusters,
    }}})
}

/// A release train across replicas (SEMANTICS §14): the upstream fleet driven by one replica,
/// the downstream by the other, which is SIGKILLed during the soak. The replica that takes the
/// downstream fleet over promotes at the soak's end (within a lease and a pass over profiles),
/// and exactly once, also after the killed replica is back.
#[test]
fn a_promotion_happens_once_at_the_soak_end_when_the_downstream_replica_dies_during_it() {
    if !postgres_reachable() {
        return;
    }
    let mut cluster = Cluster::new("trains", 2);
    // Each fleet made through its own replica, which takes it (its fair share is one).
    for (i, fleet, clusters) in [(0, "staging", &["s1"][..]), (1, "prod", &["p1", "p2"][..])] {
        let api = cluster.api(i);
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/{fleet}"),
            Some(&sim_train_fleet(clusters)),
        );
        for c in clusters {
            api.must(
                reqwest::Method::PUT,
                &format!("/v1/fleets/{fleet}/members/{c}"),
                Some(&json!({"properties": {"clusterResourceId": c}})),
            );
        }
    }
    let (upstream_owner, _) = cluster.wait_owner("staging", None, Duration::from_secs(10));
    let (downstream_owner, epoch) = cluster.wait_owner("prod", None, Duration::from_secs(10));
    assert_ne!(
        upstream_owner,
        downstream_owner,
        "one replica drives both fleets; logs in {}",
        cluster.dir.display()
    );
    // Written through the replica that does not drive prod; staging's profile first, as an
    // upstream must exist.
    let writer = cluster.api(upstream_owner);
    writer.must(
        reqwest::Method::PUT,
        "/v1/fleets/staging/autoUpgradeProfiles/rapid",
        Some(&json!({"properties": {"channel": "Rapid"}})),
    );
    writer.must(
        reqwest::Method::PUT,
        "/v1/fleets/prod/autoUpgradeProfiles/rapid",
        Some(&json!({"properties": {"channel": "Rapid", "upstream": {
            "profileId": "/v1/fleets/staging/autoUpgradeProfiles/rapid", "soakSeconds": 8}}})),
    );
    // Staging's run validates; prod's owner sees it soaking.
    let deadline = Instant::now() + Duration::from_secs(30);
    let soak_ends = loop {
        let (_, profile) = cluster.call(
            reqwest::Method::GET,
            "/v1/fleets/prod/autoUpgradeProfiles/rapid",
            None,
        );
        let ends = &profile["properties"]["autoUpgradeProfileStatus"]["upstream"]["soakEndsAt"];
        if let Some(ends) = ends.as_str() {
            break flotilla_engine::time::Time::parse(ends).expect("soakEndsAt is a time");
        }
        assert!(
            Instant::now() < deadline,
            "prod never saw staging's run validated: {profile}; logs in {}",
            cluster.dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // The downstream's replica dies during the soak.
    cluster.kill(downstream_owner);
    let killed_at = flotilla_server::clock::now();
    assert!(
        killed_at < soak_ends,
        "killed at {killed_at}, after the soak ended at {soak_ends}"
    );
    cluster.wait_owner(
        "prod",
        Some((downstream_owner, epoch)),
        Duration::from_secs(10),
    );
    let promoted = |cluster: &Cluster| {
        let (_, runs) = cluster.call(reqwest::Method::GET, "/v1/fleets/prod/updateRuns", None);
        runs["value"].as_array().cloned().unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let run = loop {
        let runs = promoted(&cluster);
        if let Some(run) = runs.first() {
            assert_eq!(runs.len(), 1, "{runs:?}");
            break run.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no promoted run; logs in {}",
            cluster.dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Never before the soak's end; after it within a lease and a pass over profiles (2 s each)
    // and a second of rounding.
    let created = flotilla_engine::time::Time::parse(
        run["systemData"]["createdAt"].as_str().unwrap_or_default(),
    )
    .expect("createdAt");
    assert!(
        created >= soak_ends,
        "created {created}, soak ends {soak_ends}"
    );
    assert!(
        created.unix() - soak_ends.unix() <= 2 + 2 + 1,
        "created {created}, soak ends {soak_ends}"
    );
    let from = &run["properties"]["status"]["promotedFrom"];
    assert!(
        from["runId"]
            .as_str()
            .is_some_and(|id| id.starts_with("/v1/fleets/staging/updateRuns/rapid-1-31-1")),
        "{from}"
    );
    // The killed replica comes back and takes its share again: nothing is promoted twice.
    cluster.start(downstream_owner);
    cluster.api(downstream_owner).wait_ready();
    let run_path = format!(
        "/v1/fleets/prod/updateRuns/{}",
        run["name"].as_str().unwrap_or_default()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.run_state("prod", run["name"].as_str().unwrap_or_default()) != "Completed" {
        assert!(
            Instant::now() < deadline,
            "{run_path} did not complete; logs in {}",
            cluster.dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Two passes over profiles later, still the one run.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(promoted(&cluster).len(), 1, "{:?}", promoted(&cluster));
}
