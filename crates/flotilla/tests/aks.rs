//! The `aks` driver in the real server, against the fake of Azure Resource Manager and its token
//! endpoint the driver's own tests use: a staged run over 20 clusters completes with every
//! cluster upgraded exactly once, while ARM throttles, someone else's upgrade holds one cluster,
//! and the server is killed with SIGKILL mid-operation and restarted; a staged chained run
//! (SEMANTICS §13) walks clusters two minors behind up one minor at a time, through throttling
//! and a SIGKILL between two hops, and never asks AKS for a skip; a member whose health check
//! fails is rolled back through AKS's node pool rollback, and one past AKS's seven days is
//! refused with AKS's reason (SEMANTICS §15).

mod common;

#[path = "../../flotilla-driver/tests/fake_arm/mod.rs"]
mod fake_arm;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use common::{Api, create_token, free_port, serve};

const SUB: &str = "00000000-0000-0000-0000-00000000bbbb";
const CLUSTERS: usize = 20;

/// A server over a database in `dir`, and fleet `aks` on the fake ARM at `arm` with `extra`
/// driver fields.
struct Setup {
    api: Api,
    server: std::process::Child,
    db: String,
    port: u16,
    log: std::path::PathBuf,
}

fn start(dir: &std::path::Path, arm: &str, extra: serde_json::Value) -> Setup {
    let db = dir.join("flotilla.db").display().to_string();
    let log = dir.join("server.log");
    let secret = dir.join("client-secret");
    std::fs::write(&secret, fake_arm::SECRET).expect("secret");
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: create_token(&db),
    };
    let server = serve(&db, port, &log, &[]);
    api.wait_ready();
    let mut driver = json!({
        "type": "aks",
        "credential": {"type": "ClientSecret", "tenantId": "tenant-1", "clientId": "client-1", "clientSecretFile": secret},
        "armEndpoint": arm, "authorityHost": arm,
    });
    if let (Some(d), Some(e)) = (driver.as_object_mut(), extra.as_object()) {
        d.extend(e.clone());
    }
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/aks",
        Some(&json!({"properties": {"driver": driver}})),
    );
    Setup {
        api,
        server,
        db,
        port,
        log,
    }
}

fn name(i: usize) -> String {
    format!("c{i:02}")
}

#[test]
fn a_staged_run_over_twenty_aks_clusters_survives_throttling_conflicts_and_sigkill() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the fake");
    let (arm, fake) = runtime.block_on(fake_arm::start());
    {
        let mut f = fake.lock().expect("fake");
        // An upgrade lasts a dozen looks, so that the server is killed with some in flight.
        f.op_polls = 12;
        for i in 0..CLUSTERS {
            let id = fake_arm::cluster_id(SUB, &name(i));
            f.clusters
                .insert(id.clone(), fake_arm::cluster(&id, "eastus", "1.30.5"));
        }
    }
    // ARM throttles now and then, all run long.
    let done = Arc::new(AtomicBool::new(false));
    let throttler = {
        let (fake, done) = (fake.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                fake.lock().expect("fake").throttle_next = 2;
                std::thread::sleep(Duration::from_millis(4000));
            }
        })
    };

    let dir = std::env::temp_dir().join(format!("flotilla-aks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let Setup {
        api,
        mut server,
        db,
        port,
        log,
    } = start(
        &dir,
        &arm,
        json!({"pollIntervalSeconds": 0.05, "catalogRefreshSeconds": 5}),
    );
    for i in 0..CLUSTERS {
        let group = if i < 2 { "canary" } else { "prod" };
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/aks/members/{}", name(i)),
            Some(&json!({"properties": {"clusterResourceId": fake_arm::cluster_id(SUB, &name(i)), "group": group}})),
        );
    }
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/aks/updateRuns/r1",
        Some(&json!({"properties": {
            "strategy": {"stages": [
                {"name": "canary", "groups": [{"name": "canary"}]},
                {"name": "prod", "maxConcurrency": "5", "groups": [{"name": "prod", "maxConcurrency": "5"}]},
            ]},
            "managedClusterUpdate": {"upgrade": {"type": "Full", "kubernetesVersion": "1.31.2"}},
        }})),
    );
    api.must(
        reqwest::Method::POST,
        "/v1/fleets/aks/updateRuns/r1/start",
        None,
    );
    // Someone upgrades c19's control plane from a laptop: the run, reaching it, meets ARM's
    // conflict and waits for it. The laptop's upgrade ends once the run has met it (whenever
    // the run gets there: a loaded machine reaches c19 later).
    fake.lock().expect("fake").start_foreign(
        &fake_arm::cluster_id(SUB, "c19"),
        "1.30.6",
        Duration::from_secs(3600),
    );

    // Kill the server while upgrades are in flight, twice: once in the canary, once in prod.
    let upgraded = || -> u32 { fake.lock().expect("fake").upgrades.values().sum() };
    // One of the run's upgrades (not the laptop's, which has an end time) is in flight.
    let in_flight = || {
        let f = fake.lock().expect("fake");
        f.ops.values().any(|o| o.until.is_none())
    };
    for at_least in [1, 6] {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(upgraded() >= at_least && in_flight()) {
            assert!(
                Instant::now() < deadline,
                "no upgrade in flight to kill the server over"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        server.kill().expect("SIGKILL");
        server.wait().expect("reaped");
        server = serve(&db, port, &log, &[]);
        api.wait_ready();
    }

    let deadline = Instant::now() + Duration::from_secs(180);
    let run = loop {
        {
            let mut f = fake.lock().expect("fake");
            if f.conflicts >= 1 {
                f.end_foreign();
            }
        }
        let run = api.must(reqwest::Method::GET, "/v1/fleets/aks/updateRuns/r1", None);
        let state = run["properties"]["status"]["status"]["state"].clone();
        if state == "Completed" || state == "Failed" || state == "Stopped" {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not end: {state}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    done.store(true, Ordering::Relaxed);
    throttler.join().expect("throttler");
    let _ = server.kill();
    let _ = server.wait();

    let status = &run["properties"]["status"];
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    assert_eq!(
        status["failureCount"], 0,
        "throttling and conflicts fail nothing: {status}"
    );
    let f = fake.lock().expect("fake");
    for i in 0..CLUSTERS {
        let id = fake_arm::cluster_id(SUB, &name(i));
        let c = &f.clusters[&id];
        assert_eq!(
            c["properties"]["currentKubernetesVersion"],
            "1.31.2",
            "{}",
            name(i)
        );
        assert_eq!(
            f.upgrades.get(&id),
            Some(&1),
            "{} upgraded exactly once",
            name(i)
        );
    }
    assert!(f.conflicts >= 1, "the run met the laptop's upgrade");
    assert!(
        f.requests.len() > CLUSTERS * 3,
        "the driver did the work through ARM"
    );
    drop(f);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Chained minor upgrades through the real server and the `aks` driver (SEMANTICS §13, issue
/// #38): ten clusters on 1.29.9, a staged Full run to 1.31.2 with `chainMinorVersions`. AKS
/// refuses a skipped minor (the fake answers 400 `OperationNotAllowed`, as AKS documents), so
/// every cluster must be walked 1.29.9 → 1.30.6 → 1.31.2. ARM throttles now and then; the server
/// is killed with SIGKILL while a canary cluster is between its two hops (held there by ARM
/// throttling every request from the instant its first hop ends), and again while a prod
/// cluster's second hop is in flight. The fake's own record says what each cluster was sent.
#[test]
fn a_staged_chained_run_walks_aks_clusters_one_minor_at_a_time_through_throttling_and_sigkill() {
    const CHAINED: usize = 10;
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the fake");
    let (arm, fake) = runtime.block_on(fake_arm::start());
    let id = |i: usize| fake_arm::cluster_id(SUB, &name(i));
    {
        let mut f = fake.lock().expect("fake");
        f.op_polls = 12;
        for i in 0..CHAINED {
            f.clusters
                .insert(id(i), fake_arm::cluster(&id(i), "eastus", "1.29.9"));
        }
        // When c00's first hop ends, ARM throttles everything until the test lets it go.
        f.throttle_when_done = Some((id(0), u32::MAX));
    }
    let done = Arc::new(AtomicBool::new(false));
    let throttler = {
        let (fake, done) = (fake.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                {
                    let mut f = fake.lock().expect("fake");
                    f.throttle_next = f.throttle_next.max(2);
                }
                std::thread::sleep(Duration::from_millis(3000));
            }
        })
    };

    let dir = std::env::temp_dir().join(format!("flotilla-aks-chain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let Setup {
        api,
        mut server,
        db,
        port,
        log,
    } = start(
        &dir,
        &arm,
        json!({"pollIntervalSeconds": 0.05, "catalogRefreshSeconds": 5}),
    );
    for i in 0..CHAINED {
        let group = if i < 2 { "canary" } else { "prod" };
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/aks/members/{}", name(i)),
            Some(&json!({"properties": {"clusterResourceId": id(i), "group": group}})),
        );
    }
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/aks/updateRuns/chain",
        Some(&json!({"properties": {
            "strategy": {"stages": [
                {"name": "canary", "groups": [{"name": "canary"}]},
                {"name": "prod", "groups": [{"name": "prod", "maxConcurrency": "4"}]},
            ]},
            "managedClusterUpdate": {"upgrade": {"type": "Full", "kubernetesVersion": "1.31.2"}},
            "chainMinorVersions": true,
        }})),
    );
    api.must(
        reqwest::Method::POST,
        "/v1/fleets/aks/updateRuns/chain/start",
        None,
    );
    let member = |run: &serde_json::Value, n: &str| -> serde_json::Value {
        run["properties"]["status"]["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["groups"].as_array().into_iter().flatten())
            .flat_map(|g| g["members"].as_array().into_iter().flatten())
            .find(|m| m["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no member {n} in {run}"))
    };
    let accepted = |f: &fake_arm::Fake, i: usize| {
        f.version_puts
            .iter()
            .filter(|p| p.cluster == id(i) && p.accepted)
            .count()
    };

    // Between two hops: c00's first hop has ended, its second is not sent (ARM throttles it).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        {
            let f = fake.lock().expect("fake");
            let refused: Vec<_> = f.version_puts.iter().filter(|p| !p.accepted).collect();
            assert!(refused.is_empty(), "AKS was asked for a skip: {refused:?}");
            if f.throttle_when_done.is_none() {
                assert_eq!(accepted(&f, 0), 1, "c00 is between its hops");
                assert!(!f.ops.values().any(|o| o.cluster == id(0)));
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "c00's first hop did not end\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let run = api.must(
        reqwest::Method::GET,
        "/v1/fleets/aks/updateRuns/chain",
        None,
    );
    let c00 = member(&run, "c00");
    assert_eq!(
        c00["status"]["state"], "Running",
        "in flight between hops: {c00}"
    );
    server.kill().expect("SIGKILL");
    server.wait().expect("reaped");
    assert_eq!(
        accepted(&fake.lock().expect("fake"), 0),
        1,
        "no second hop reached ARM before the kill"
    );
    server = serve(&db, port, &log, &[]);
    api.wait_ready();
    fake.lock().expect("fake").throttle_next = 0;

    // A prod cluster's second hop in flight: kill again.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        {
            let f = fake.lock().expect("fake");
            if (2..CHAINED)
                .any(|i| accepted(&f, i) == 2 && f.ops.values().any(|o| o.cluster == id(i)))
            {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no second hop in prod\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    server.kill().expect("SIGKILL");
    server.wait().expect("reaped");
    server = serve(&db, port, &log, &[]);
    api.wait_ready();

    let deadline = Instant::now() + Duration::from_secs(240);
    let run = loop {
        let run = api.must(
            reqwest::Method::GET,
            "/v1/fleets/aks/updateRuns/chain",
            None,
        );
        let state = run["properties"]["status"]["status"]["state"].clone();
        if state == "Completed" || state == "Failed" || state == "Stopped" {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not end: {state}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    done.store(true, Ordering::Relaxed);
    throttler.join().expect("throttler");
    let _ = server.kill();
    let _ = server.wait();

    let status = &run["properties"]["status"];
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    assert_eq!(status["failureCount"], 0, "{status}");
    let f = fake.lock().expect("fake");
    // Never a skip: AKS would have refused it, and the fake records refusals too.
    for p in &f.version_puts {
        assert!(p.accepted, "AKS was asked for a skip: {p:?}");
        let (from, to) = (
            fake_arm::minor_of(&p.from).expect("from"),
            fake_arm::minor_of(&p.to).expect("to"),
        );
        assert_eq!(
            (to.0, to.1),
            (from.0, from.1 + 1),
            "one minor per PUT: {p:?}"
        );
    }
    for i in 0..CHAINED {
        // Each minor exactly once, in order.
        let walked: Vec<(&str, &str)> = f
            .version_puts
            .iter()
            .filter(|p| p.cluster == id(i))
            .map(|p| (p.from.as_str(), p.to.as_str()))
            .collect();
        assert_eq!(
            walked,
            [("1.29.9", "1.30.6"), ("1.30.6", "1.31.2")],
            "{}",
            name(i)
        );
        let c = &f.clusters[&id(i)];
        assert_eq!(c["properties"]["currentKubernetesVersion"], "1.31.2");
        for pool in c["properties"]["agentPoolProfiles"]
            .as_array()
            .expect("pools")
        {
            assert_eq!(
                pool["currentOrchestratorVersion"], "1.31.2",
                "Full moves the pools: {pool}"
            );
        }
        // The run says the same: two hops, both completed.
        let m = member(&run, &name(i));
        let hops: Vec<(&str, &str, &str)> = m["hops"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| {
                (
                    h["from"].as_str().unwrap_or_default(),
                    h["to"].as_str().unwrap_or_default(),
                    h["state"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            hops,
            [
                ("1.29.9", "1.30.6", "Completed"),
                ("1.30.6", "1.31.2", "Completed")
            ],
            "{m}"
        );
    }
    drop(f);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Discovery (`flotilla member discover`): the clusters of a resource group that match the tag
/// selector become members, named after them, labelled from their tags and grouped by the
/// group tag, across pages of ARM's list; a changed tag updates the member; a cluster that
/// vanished is reported in its member's status and the member is kept.
#[test]
fn discovery_registers_the_clusters_it_finds_and_reports_those_that_vanish() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the fake");
    let (arm, fake) = runtime.block_on(fake_arm::start());
    {
        let mut f = fake.lock().expect("fake");
        for i in 0..7 {
            let id = fake_arm::cluster_id(SUB, &format!("Store_{i}"));
            let mut c = fake_arm::cluster(&id, "eastus", "1.30.5");
            c["tags"] = json!({"env": if i == 6 { "dev" } else { "prod" }, "update-group": if i < 2 { "canary" } else { "prod" }, "Cost Center": "42"});
            f.clusters.insert(id, c);
        }
    }
    let dir = std::env::temp_dir().join(format!("flotilla-aks-discover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let Setup {
        api, mut server, ..
    } = start(
        &dir,
        &arm,
        json!({"discover": {"subscriptions": [SUB], "resourceGroups": ["rg"], "tagSelector": "env in (prod)", "groupTag": "update-group"}}),
    );
    // A member registered by hand before, for one of the clusters: it is found, not added again.
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/aks/members/by-hand",
        Some(&json!({"properties": {"clusterResourceId": fake_arm::cluster_id(SUB, "Store_0")}})),
    );
    let discover = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["member", "discover", "-f", "aks", "-o", "json"])
            .env("FLOTILLA_SERVER", &api.base)
            .env("FLOTILLA_TOKEN", &api.token)
            .env("FLOTILLA_CONFIG", dir.join("cli.json"))
            .output()
            .expect("the CLI runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let first = discover();
    assert_eq!(
        first,
        json!({"added": ["store-1", "store-2", "store-3", "store-4", "store-5"], "updated": ["by-hand"], "vanished": []}),
        "six prod clusters over two pages, one already a member; the dev one left out"
    );
    // Observed in the background like any new member; what discovery said of it stays.
    let deadline = Instant::now() + Duration::from_secs(30);
    let member = loop {
        let member = api.must(reqwest::Method::GET, "/v1/fleets/aks/members/store-1", None);
        if member["properties"]["status"]["cluster"].is_object() {
            break member;
        }
        assert!(
            Instant::now() < deadline,
            "store-1 was not observed: {member}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let p = &member["properties"];
    assert_eq!(p["group"], "canary");
    assert_eq!(p["labels"], json!({"env": "prod"}));
    assert_eq!(
        p["status"]["discovery"]["tagsNotLabels"],
        json!(["Cost Center"]),
        "{member}"
    );
    // Nothing changed: nothing to do.
    assert_eq!(
        discover(),
        json!({"added": [], "updated": [], "vanished": []})
    );
    // A tag changes, a cluster goes away.
    {
        let mut f = fake.lock().expect("fake");
        f.clusters
            .get_mut(&fake_arm::cluster_id(SUB, "Store_2"))
            .expect("c")["tags"]["update-group"] = json!("canary");
        f.clusters.remove(&fake_arm::cluster_id(SUB, "Store_3"));
    }
    assert_eq!(
        discover(),
        json!({"added": [], "updated": ["store-2"], "vanished": ["store-3"]})
    );
    let kept = api.must(reqwest::Method::GET, "/v1/fleets/aks/members/store-3", None);
    assert_eq!(
        kept["properties"]["status"]["discovery"]["vanished"], true,
        "{kept}"
    );
    assert_eq!(
        api.must(reqwest::Method::GET, "/v1/fleets/aks/members/store-2", None)["properties"]["group"],
        "canary"
    );
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loopback health endpoint for an Http check provider: `GET /health/{member}` answers 200
/// while the member is in `healthy`, 503 otherwise.
fn health_endpoint(healthy: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let member = first
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.strip_prefix("/health/"))
                .unwrap_or_default()
                .to_string();
            let ok = healthy.lock().expect("healthy").contains(&member);
            let (status, body) = if ok {
                ("200 OK", "healthy")
            } else {
                ("503 Service Unavailable", "broken")
            };
            let mut stream = stream;
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    port
}

/// Rollback through AKS (SEMANTICS §15, issue #39), the real server and the `aks` driver: a
/// NodeImageOnly run over two clusters whose member health checks say `onFailure: RollBack`.
/// `back` fails its check at once and is rolled back at once, pool by pool, through AKS's
/// rollback operation (a PUT of each agent pool with the versions its upgrade profile
/// recorded); it ends Failed, `rolledBack: true`, its pools on their old image. `late` passes
/// its checks at first; then its upgrade is made eight days old in the fake (a week is not
/// waited for) and its check fails: the offer the server observed after the upgrade is still
/// in its hands, so the rollback is sent, and AKS refuses it with its own reason, which the
/// member's message carries (Failed, `rolledBack: false`). ARM throttles now and then
/// throughout.
#[test]
fn a_failing_health_check_rolls_aks_node_pools_back_and_aks_refuses_one_past_seven_days() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the fake");
    let (arm, fake) = runtime.block_on(fake_arm::start());
    let id = |n: &str| fake_arm::cluster_id(SUB, n);
    {
        let mut f = fake.lock().expect("fake");
        f.op_polls = 3;
        for n in ["back", "late"] {
            f.clusters
                .insert(id(n), fake_arm::cluster(&id(n), "eastus", "1.30.5"));
        }
    }
    let old_image = "AKSUbuntu-2204gen2containerd-202602.10.0";
    let new_image = format!("AKSUbuntu-2204gen2containerd-{}", fake_arm::NEWEST_IMAGE);
    let done = Arc::new(AtomicBool::new(false));
    let throttler = {
        let (fake, done) = (fake.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                fake.lock().expect("fake").throttle_next = 2;
                std::thread::sleep(Duration::from_millis(2500));
            }
        })
    };
    let healthy = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::from([
        "late".to_string(),
    ])));
    let health = health_endpoint(healthy.clone());

    let dir = std::env::temp_dir().join(format!("flotilla-aks-rollback-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let Setup {
        api,
        mut server,
        log,
        ..
    } = start(
        &dir,
        &arm,
        json!({"pollIntervalSeconds": 0.05, "catalogRefreshSeconds": 5}),
    );
    api.must(
        reqwest::Method::PUT,
        "/v1/checkProviders/health",
        Some(&json!({"properties": {"type": "Http", "baseUrl": format!("http://127.0.0.1:{health}")}})),
    );
    for n in ["back", "late"] {
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/aks/members/{n}"),
            Some(&json!({"properties": {"clusterResourceId": id(n), "group": "g"}})),
        );
    }
    // Their first observations (made in the background, slowed by ARM's throttling) are in
    // before the run starts: only the run's own observations of `late` follow.
    for n in ["back", "late"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !api.must(
            reqwest::Method::GET,
            &format!("/v1/fleets/aks/members/{n}"),
            None,
        )["properties"]["status"]["cluster"]
            .is_object()
        {
            assert!(Instant::now() < deadline, "{n} was not observed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/aks/updateRuns/images",
        Some(&json!({"properties": {
            "strategy": {"stages": [{"name": "all", "maxAllowedFailures": "100%",
                "groups": [{"name": "g", "maxConcurrency": "2", "maxAllowedFailures": "100%"}],
                "memberHealthChecks": {
                    "checks": [{"name": "health", "provider": "health", "path": "/health/{member}"}],
                    "soakSeconds": 3600, "intervalSeconds": 1, "onFailure": "RollBack"}}]},
            "managedClusterUpdate": {"upgrade": {"type": "NodeImageOnly"}, "nodeImageSelection": {"type": "Latest"}},
        }})),
    );
    api.must(
        reqwest::Method::POST,
        "/v1/fleets/aks/updateRuns/images/start",
        None,
    );
    let run = || {
        api.must(
            reqwest::Method::GET,
            "/v1/fleets/aks/updateRuns/images",
            None,
        )
    };
    let member = |run: &serde_json::Value, n: &str| -> serde_json::Value {
        run["properties"]["status"]["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["groups"].as_array().into_iter().flatten())
            .flat_map(|g| g["members"].as_array().into_iter().flatten())
            .find(|m| m["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no member {n} in {run}"))
    };

    // `late` upgraded and verifying: its checks pass, and the server holds AKS's offer.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let late = member(&run(), "late");
        let passed = late["healthChecks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["passed"] == true);
        if passed {
            assert_eq!(late["status"]["state"], "Running", "{late}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "late did not reach its soak: {late}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    {
        let mut f = fake.lock().expect("fake");
        for pool in ["system", "user"] {
            assert!(
                f.rollback_record(&id("late"), pool).is_some(),
                "AKS recorded late's {pool} pool's versions"
            );
            f.age_last_upgrade(&id("late"), pool, 8 * 86_400);
        }
    }
    healthy.lock().expect("healthy").clear();

    let deadline = Instant::now() + Duration::from_secs(120);
    let run = loop {
        let run = run();
        let state = run["properties"]["status"]["status"]["state"].clone();
        if state == "Completed" || state == "Failed" || state == "Stopped" {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not end: {state}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    done.store(true, Ordering::Relaxed);
    throttler.join().expect("throttler");
    let _ = server.kill();
    let _ = server.wait();

    // `back`: rolled back through AKS's rollback, pool by pool.
    let back = member(&run, "back");
    assert_eq!(back["status"]["state"], "Failed", "{back}");
    assert_eq!(
        back["status"]["error"]["code"], "HealthCheckFailed",
        "{back}"
    );
    assert_eq!(back["rolledBack"], true, "{back}");
    let message = back["status"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("rolled back to its state before the run"),
        "{back}"
    );
    assert_eq!(
        back["before"]["nodePools"][0]["nodeImageVersion"], "202602.10.0",
        "{back}"
    );
    // `late`: AKS refused, and said why.
    let late = member(&run, "late");
    assert_eq!(late["status"]["state"], "Failed", "{late}");
    assert_eq!(
        late["status"]["error"]["code"], "HealthCheckFailed",
        "{late}"
    );
    assert_eq!(late["rolledBack"], false, "{late}");
    let message = late["status"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("not rolled back")
            && message.contains(&format!(
                "NodeImageVersion '{old_image}' is not accepted. NodeImageVersion can only be current version '{new_image}' or 'latest'"
            )),
        "AKS's reason in the member's message: {late}"
    );

    let f = fake.lock().expect("fake");
    let puts = |cluster: &str| -> Vec<(&str, &str, &str, bool)> {
        f.pool_puts
            .iter()
            .filter(|p| p.cluster == id(cluster))
            .map(|p| {
                (
                    p.pool.as_str(),
                    p.orchestrator_version.as_str(),
                    p.node_image_version.as_str(),
                    p.accepted,
                )
            })
            .collect()
    };
    assert_eq!(
        puts("back"),
        [
            ("system", "1.30.5", old_image, true),
            ("user", "1.30.5", old_image, true),
        ],
        "ARM saw one rollback per pool of back"
    );
    assert_eq!(
        puts("late"),
        [("system", "1.30.5", old_image, false)],
        "late's first rollback was sent, and refused"
    );
    for (cluster, image) in [("back", old_image), ("late", new_image.as_str())] {
        for pool in f.clusters[&id(cluster)]["properties"]["agentPoolProfiles"]
            .as_array()
            .expect("pools")
        {
            assert_eq!(pool["nodeImageVersion"], image, "{cluster}: {pool}");
            assert_eq!(pool["currentOrchestratorVersion"], "1.30.5", "{pool}");
            assert_eq!(pool["provisioningState"], "Succeeded", "{pool}");
        }
    }
    assert_eq!(
        f.count("POST", "/upgradeNodeImageVersion"),
        4,
        "each pool upgraded once"
    );
    drop(f);
    let _ = std::fs::remove_dir_all(&dir);
}
