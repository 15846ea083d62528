//! Disruption budgets and a freeze across concurrent runs, through the real binary (SEMANTICS
//! §12): three runs over one 60-member fleet share a budget of one member in flight per region,
//! and a freeze is created while they run. The server is SIGKILLed twice on the way: once just
//! after the freeze is created (members in flight, the freeze not yet in force) and once while
//! the freeze is in force; it is served again on the same SQLite file each time. The runs' event
//! logs, merged, show that no region ever had two members in flight, that nothing started during
//! the freeze, and that every run completed after it, every member upgraded.
//!
//! Event times are whole seconds (the engine's clock). Within one run's log the order is exact;
//! across runs, two members are taken to have been in flight together when each started in a
//! second before the other's end: one that ends in the second the other starts may have handed
//! its place over (ends before starts at one instant, as the scenarios' `maxInFlight` counts).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Api, Killed, Served, serve, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

const FLEET: &str = "estate";
const MEMBERS: usize = 60;
const REGIONS: [&str; 4] = ["eastus", "westus", "northeurope", "westeurope"];
const FAMILY: &str = "AKSUbuntu-2204gen2containerd";
/// Simulated seconds per real second: the clusters' 9–11 minute upgrades take about a second.
const TIME_SCALE: f64 = 600.0;
const BUDGET: &str = "per-region";
const FREEZE: &str = "change-freeze";
/// Seconds between the freeze's creation and its start (so that the fleet's task knows of it
/// before it begins: a start at its first second is then a violation by the engine's own clock).
const FREEZE_LEAD: i64 = 3;
const FREEZE_SECONDS: i64 = 6;
/// Each run's members: r1 ControlPlaneOnly over the main ring, r2 NodeImageOnly over everyone,
/// r3 Full over the canary ring.
const RUNS: [&str; 3] = ["r1", "r2", "r3"];

fn name(i: usize) -> String {
    format!("m-{i:02}")
}

fn region(i: usize) -> &'static str {
    REGIONS[i % REGIONS.len()]
}

fn canary(i: usize) -> bool {
    i.is_multiple_of(5)
}

/// Update groups that cut across regions: four members of each in turn.
fn group(i: usize) -> &'static str {
    if (i / 4).is_multiple_of(2) { "a" } else { "b" }
}

fn index(member: &str) -> usize {
    member
        .strip_prefix("m-")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a member of the test: {member}"))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

fn rfc3339(seconds: i64) -> String {
    flotilla_engine::time::Time::from_unix(seconds).to_string()
}

fn run_body(selector: Option<&str>, upgrade: Value) -> Value {
    let mut stage = json!({"name": "all", "groups": [
        {"name": "a", "maxConcurrency": "100%"},
        {"name": "b", "maxConcurrency": "100%"},
    ]});
    if let Some(s) = selector {
        stage["memberSelector"] = json!({"byLabel": s});
    }
    json!({"properties": {"strategy": {"stages": [stage]}, "managedClusterUpdate": upgrade}})
}

fn run_state(api: &Api, run: &str) -> String {
    api.call(
        Method::GET,
        &format!("/v1/fleets/{FLEET}/updateRuns/{run}"),
        None,
    )
    .ok()
    .and_then(|(_, v)| {
        v["properties"]["status"]["status"]["state"]
            .as_str()
            .map(str::to_string)
    })
    .unwrap_or_default()
}

/// Every member of a run with its state.
fn run_members(api: &Api, run: &str) -> BTreeMap<String, String> {
    let v = api.must(
        Method::GET,
        &format!("/v1/fleets/{FLEET}/updateRuns/{run}"),
        None,
    );
    let mut out = BTreeMap::new();
    for stage in v["properties"]["status"]["stages"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for group in stage["groups"].as_array().into_iter().flatten() {
            for m in group["members"].as_array().into_iter().flatten() {
                out.insert(
                    m["name"].as_str().unwrap_or_default().to_string(),
                    m["status"]["state"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
        }
    }
    out
}

#[derive(Clone, Debug)]
struct Event {
    run: &'static str,
    /// Position in its run's log.
    seq: usize,
    time: i64,
    kind: String,
    member: Option<String>,
    message: String,
}

fn events(api: &Api, run: &'static str) -> Vec<Event> {
    let v = api.must(
        Method::GET,
        &format!("/v1/fleets/{FLEET}/updateRuns/{run}/events"),
        None,
    );
    v["value"]
        .as_array()
        .expect("an event log")
        .iter()
        .enumerate()
        .map(|(seq, e)| Event {
            run,
            seq,
            time: flotilla_engine::time::Time::parse(e["time"].as_str().unwrap_or_default())
                .unwrap_or_else(|m| panic!("{m}: {e}"))
                .unix(),
            kind: e["type"].as_str().unwrap_or_default().to_string(),
            member: e["member"].as_str().map(str::to_string),
            message: e["message"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

fn all_events(api: &Api) -> Vec<Event> {
    RUNS.iter().flat_map(|r| events(api, r)).collect()
}

fn is_start(e: &Event) -> bool {
    matches!(e.kind.as_str(), "MemberStarted" | "MemberReattached")
}

fn is_end(e: &Event) -> bool {
    matches!(
        e.kind.as_str(),
        "MemberSucceeded" | "MemberFailed" | "MemberStopped" | "MemberSkipped"
    )
}

/// A member in flight in one run: from its start to that run's next end of it (none: to the
/// end of the log), each as (time, position in the run's log).
#[derive(Debug)]
struct Span<'a> {
    run: &'a str,
    member: &'a str,
    start: (i64, usize),
    end: Option<(i64, usize)>,
}

fn spans(events: &[Event]) -> Vec<Span<'_>> {
    let mut open: BTreeMap<(&str, &str), Span<'_>> = BTreeMap::new();
    let mut done = Vec::new();
    for e in events {
        let Some(member) = e.member.as_deref() else {
            continue;
        };
        if is_start(e) {
            let earlier = open.insert(
                (e.run, member),
                Span {
                    run: e.run,
                    member,
                    start: (e.time, e.seq),
                    end: None,
                },
            );
            assert!(earlier.is_none(), "{} started {member} twice", e.run);
        } else if is_end(e)
            && let Some(mut span) = open.remove(&(e.run, member))
        {
            span.end = Some((e.time, e.seq));
            done.push(span);
        }
    }
    done.extend(open.into_values());
    done
}

/// Whether two spans were in flight at one instant. In one run, the log's order is exact. Across
/// runs only the seconds are known: they overlap if each started in a second before the other's
/// end (one that ends in the second the other starts may have handed its place over: ends before
/// starts at one instant).
fn overlap(a: &Span<'_>, b: &Span<'_>) -> bool {
    let before = |start: (i64, usize), end: Option<(i64, usize)>, same_run: bool| match end {
        None => true,
        Some(end) if same_run => start.1 < end.1,
        Some(end) => start.0 < end.0,
    };
    let same = a.run == b.run;
    before(a.start, b.end, same) && before(b.start, a.end, same)
}

fn describe(s: &Span<'_>) -> String {
    let end = s.end.map_or("not ended".to_string(), |(t, seq)| {
        format!("to {} (event {seq})", rfc3339(t))
    });
    format!(
        "{} {} from {} (event {}) {end}",
        s.run,
        s.member,
        rfc3339(s.start.0),
        s.start.1
    )
}

/// The budget: no two members of one region in flight at once, in any runs.
fn check_budget(events: &[Event]) {
    let spans = spans(events);
    let mut by_region: BTreeMap<&str, Vec<&Span<'_>>> = BTreeMap::new();
    for s in &spans {
        by_region
            .entry(region(index(s.member)))
            .or_default()
            .push(s);
    }
    for (region, spans) in by_region {
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                assert!(
                    !overlap(a, b),
                    "two members in flight in {region} at once: {} and {}",
                    describe(a),
                    describe(b)
                );
            }
        }
    }
}

/// The budget's partitions as the server counts them now: each region's members in flight.
fn budget_disrupted(api: &Api) -> Vec<(String, i64)> {
    api.call(
        Method::GET,
        &format!("/v1/fleets/{FLEET}/disruptionBudgets/{BUDGET}"),
        None,
    )
    .ok()
    .and_then(|(_, v)| v["properties"]["status"]["partitions"].as_array().cloned())
    .unwrap_or_default()
    .iter()
    .map(|p| {
        (
            p["value"].as_str().unwrap_or_default().to_string(),
            p["disrupted"].as_i64().unwrap_or(0),
        )
    })
    .collect()
}

/// Kills the server with SIGKILL, serves the same file again, and waits until the new server
/// drives the fleet (it holds the fleet's lease: its runs are taken back).
fn kill_and_restart(
    server: &mut Killed,
    api: &Api,
    database: &str,
    port: u16,
    log: &std::path::Path,
) {
    let _ = server.0.kill();
    let _ = server.0.wait();
    *server = Killed(serve(database, port, log, &[]));
    api.wait_ready();
    wait_for(
        "the fleet to be driven again",
        Duration::from_secs(30),
        || {
            api.call(Method::GET, "/v1/leases", None)
                .is_ok_and(|(_, v)| {
                    v["value"].as_array().is_some_and(|l| {
                        l.iter().any(|l| {
                            l["fleet"] == FLEET
                                && l["owner"] == v["replica"]
                                && l["expired"] != true
                        })
                    })
                })
        },
    );
}

#[test]
fn a_budget_and_a_freeze_hold_three_runs_across_kills() {
    let begun = std::time::Instant::now();
    let Served {
        dir: _dir,
        database,
        port,
        log,
        api,
        server,
    } = Served::start("budgets");
    let mut server = server;

    // 60 clusters, 15 in each of 4 regions, at 1.30.5 with one node pool on an image the catalog
    // has a newer version of.
    let catalog: serde_json::Map<String, Value> = REGIONS
        .iter()
        .map(|r| {
            (
                r.to_string(),
                json!({"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}],
                       "nodeImages": {FAMILY: [{"version": "202602.10.0"}, {"version": "202602.20.0"}]}}),
            )
        })
        .collect();
    let clusters: serde_json::Map<String, Value> = (0..MEMBERS)
        .map(|i| {
            (
                format!("c-{}", name(i)),
                json!({"region": region(i), "kubernetesVersion": "1.30.5",
                       "nodePools": [{"name": "system", "family": FAMILY, "os": "Linux", "nodeImageVersion": "202602.10.0"}],
                       "sim": {"durationSeconds": 540 + 30 * (i % 5)}}),
            )
        })
        .collect();
    api.must(
        Method::PUT,
        &format!("/v1/fleets/{FLEET}"),
        Some(
            &json!({"properties": {"driver": {"type": "sim", "timeScale": TIME_SCALE,
            "catalog": catalog, "clusters": clusters}}}),
        ),
    );
    for i in 0..MEMBERS {
        api.must(
            Method::PUT,
            &format!("/v1/fleets/{FLEET}/members/{}", name(i)),
            Some(
                &json!({"properties": {"clusterResourceId": format!("c-{}", name(i)),
                "group": group(i), "labels": {"ring": if canary(i) { "canary" } else { "main" }}}}),
            ),
        );
    }
    api.must(
        Method::PUT,
        &format!("/v1/fleets/{FLEET}/disruptionBudgets/{BUDGET}"),
        Some(&json!({"properties": {"maxUnavailable": "1", "perValueOf": "region"}})),
    );
    let budget = api.must(
        Method::GET,
        &format!("/v1/fleets/{FLEET}/disruptionBudgets/{BUDGET}"),
        None,
    );
    let partitions = budget["properties"]["status"]["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(partitions.len(), REGIONS.len(), "{budget}");
    for p in &partitions {
        assert_eq!(p["members"], 15, "{budget}");
        assert_eq!(p["maxUnavailable"], 1, "{budget}");
    }

    // Three runs, created and started together; their groups' concurrency is the whole group,
    // so only the budget holds them.
    let bodies = [
        run_body(
            Some("ring=main"),
            json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}),
        ),
        run_body(
            None,
            json!({"upgrade": {"type": "NodeImageOnly"}, "nodeImageSelection": {"type": "Latest"}}),
        ),
        run_body(
            Some("ring=canary"),
            json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"},
                   "nodeImageSelection": {"type": "Latest"}}),
        ),
    ];
    for (run, body) in RUNS.iter().zip(&bodies) {
        api.must(
            Method::PUT,
            &format!("/v1/fleets/{FLEET}/updateRuns/{run}"),
            Some(body),
        );
    }
    for run in RUNS {
        api.must(
            Method::POST,
            &format!("/v1/fleets/{FLEET}/updateRuns/{run}/start"),
            None,
        );
    }

    // The budget as the server counts it, sampled while the test waits.
    let mut most_disrupted = 0;
    let mut sample = |api: &Api| {
        for (value, n) in budget_disrupted(api) {
            assert!(n <= 1, "{n} members disrupted in {value}");
            most_disrupted = most_disrupted.max(n);
        }
    };

    wait_for(
        "two upgrades done in each region",
        Duration::from_secs(60),
        || {
            sample(&api);
            all_events(&api)
                .iter()
                .filter(|e| e.kind == "MemberSucceeded")
                .count()
                >= 2 * REGIONS.len()
        },
    );

    // The freeze, over every member, starting a few seconds from now.
    let start = unix_now() + FREEZE_LEAD;
    let end = start + FREEZE_SECONDS;
    api.must(
        Method::PUT,
        &format!("/v1/fleets/{FLEET}/freezes/{FREEZE}"),
        Some(
            &json!({"properties": {"start": rfc3339(start), "end": rfc3339(end),
            "scope": "AllUpgrades", "reason": "process test"}}),
        ),
    );

    // Kill 1: members in flight, the freeze not yet in force. The server that comes back must
    // count them against the budget and hold everyone when the freeze begins.
    let running_at_kill: Vec<(&str, String)> = RUNS
        .iter()
        .flat_map(|r| {
            run_members(&api, r)
                .into_iter()
                .filter(|(_, s)| s == "Running")
                .map(move |(m, _)| (*r, m))
        })
        .collect();
    assert!(
        !running_at_kill.is_empty(),
        "members are in flight when the server is killed"
    );
    kill_and_restart(&mut server, &api, &database, port, &log);

    // Kill 2: while the freeze is in force (a member was held by it).
    wait_for(
        "a member held by the freeze",
        Duration::from_secs(30),
        || {
            sample(&api);
            all_events(&api)
                .iter()
                .any(|e| e.kind == "MemberPending" && e.message.contains("frozen by"))
        },
    );
    let killed_frozen = unix_now();
    assert!(
        (start..end).contains(&killed_frozen),
        "the second kill at {} is inside the freeze [{}, {})",
        rfc3339(killed_frozen),
        rfc3339(start),
        rfc3339(end)
    );
    kill_and_restart(&mut server, &api, &database, port, &log);

    wait_for("every run to complete", Duration::from_secs(120), || {
        sample(&api);
        RUNS.iter().all(|r| {
            let s = run_state(&api, r);
            assert!(
                !matches!(s.as_str(), "Failed" | "Stopped"),
                "run {r} ended {s}"
            );
            s == "Completed"
        })
    });

    let log_events = all_events(&api);
    let members: BTreeMap<&str, BTreeMap<String, String>> =
        RUNS.iter().map(|r| (*r, run_members(&api, r))).collect();
    drop(server);

    // Nothing failed; every member of a run upgraded by it exactly once (r2 may find a canary
    // member already at its image, r3's Full having moved it first). The runs' records are what
    // is checked, not the clusters' last observations: the sim driver keeps its clusters in the
    // server's memory, so a restart puts them back at their configured versions (an upgrade in
    // flight then is sent again under its key, and finishes).
    let failed: Vec<&Event> = log_events
        .iter()
        .filter(|e| e.kind == "MemberFailed")
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let expected: [Vec<usize>; 3] = [
        (0..MEMBERS).filter(|&i| !canary(i)).collect(),
        (0..MEMBERS).collect(),
        (0..MEMBERS).filter(|&i| canary(i)).collect(),
    ];
    for (run, wanted) in RUNS.iter().zip(&expected) {
        let states = &members[run];
        let names: BTreeSet<String> = wanted.iter().map(|&i| name(i)).collect();
        assert_eq!(
            states.keys().cloned().collect::<BTreeSet<_>>(),
            names,
            "{run}'s members"
        );
        for (member, state) in states {
            let upgraded = log_events
                .iter()
                .filter(|e| e.run == *run && e.member.as_deref() == Some(member.as_str()))
                .filter(|e| e.kind == "MemberStarted" || e.kind == "MemberSucceeded")
                .map(|e| e.kind.as_str())
                .collect::<Vec<_>>();
            match state.as_str() {
                "Completed" => assert_eq!(
                    upgraded,
                    ["MemberStarted", "MemberSucceeded"],
                    "{run} {member}"
                ),
                "Skipped" if *run == "r2" && canary(index(member)) => {
                    assert!(upgraded.is_empty(), "{run} {member}: {upgraded:?}");
                    assert!(
                        log_events.iter().any(|e| e.run == "r3"
                            && e.kind == "MemberSucceeded"
                            && e.member.as_deref() == Some(member.as_str())),
                        "{run} skipped {member}, which r3 did not upgrade"
                    );
                }
                other => panic!("{run} {member} ended {other}"),
            }
        }
    }

    // The budget, over the three logs together.
    check_budget(&log_events);
    assert!(
        most_disrupted <= 1,
        "the server counted {most_disrupted} in a region"
    );

    // The freeze: nothing started or re-attached in [start, end); every run started members
    // after it (it held them all), and the runs completed then.
    let during: Vec<&Event> = log_events
        .iter()
        .filter(|e| is_start(e) && (start..end).contains(&e.time))
        .collect();
    assert!(
        during.is_empty(),
        "started during the freeze [{}, {}): {during:?}",
        rfc3339(start),
        rfc3339(end)
    );
    // The engine woke when the freeze ended (its end is an instant it waits for), not at some
    // later pass: the first start after it comes within a few seconds.
    let resumed = log_events
        .iter()
        .filter(|e| is_start(e) && e.time >= end)
        .map(|e| e.time)
        .min()
        .expect("starts after the freeze");
    assert!(
        resumed - end <= 5,
        "the first start after the freeze ended at {} came at {}",
        rfc3339(end),
        rfc3339(resumed)
    );
    for run in RUNS {
        assert!(
            log_events
                .iter()
                .any(|e| e.run == run && e.kind == "MemberStarted" && e.time >= end),
            "{run} started nothing after the freeze"
        );
        let completed = log_events
            .iter()
            .find(|e| e.run == run && e.kind == "RunCompleted")
            .unwrap_or_else(|| panic!("{run} has no RunCompleted"));
        assert!(
            completed.time >= end,
            "{run} completed before the freeze ended"
        );
    }

    // Both rules acted, and said so.
    let pending = |text: &str| {
        log_events
            .iter()
            .any(|e| e.kind == "MemberPending" && e.message.contains(text))
    };
    assert!(
        pending(&format!("disruption budget \"{BUDGET}\"")),
        "no member was held by the budget"
    );
    assert!(
        pending(&format!("frozen by \"{FREEZE}\"")),
        "no member was held by the freeze"
    );
    eprintln!(
        "budgets: {} events, the first kill with {} in flight, {:.1}s",
        log_events.len(),
        running_at_kill.len(),
        begun.elapsed().as_secs_f64()
    );
}
