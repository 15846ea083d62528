//! Engine scale benchmark: simulates update runs of 1,000, 10,000 and 100,000 members (three
//! stages, 50 groups per stage, percentage concurrency, maintenance windows, tolerated
//! failures) in virtual time, and prints wall time, events per second and peak memory.
//!
//! `cargo bench -p flotilla-sim --bench scale [-- SIZES...]`
//!
//! With `--runs N`, the same fleet with N runs of the same strategy over all of its members, in
//! one fleet engine (one operation per cluster across the runs): the time to create the runs,
//! memory, and the cost of each instant's step (results in, settle, commands out).
//!
//! `cargo bench -p flotilla-sim --bench scale -- --runs 10 100000`
//!
//! With `--budget N` as well, the fleet has a fleet-wide disruption budget (SEMANTICS §12,
//! `{"maxUnavailable": "N"}`, no selector, one partition) before the runs start: at most N
//! members in flight at once across all the runs (`-- --runs 100 --budget 500 10000`).
//!
//! With `--checks`, the same run with health checks (SEMANTICS §10): every member soaks five
//! minutes with a check evaluated each minute, and each later stage waits for a HealthCheck
//! gate (`-- --checks 10000 100000`).
//!
//! With `--forecast`, the time to forecast the fleet's run before its start, and how far the
//! forecast is from the run simulated (`-- --forecast 10000 100000`).
//!
//! With `--chain`, a chained run (SEMANTICS §13): every member on 1.28.9, three minors behind
//! the target 1.31.1, walked up with `chainMinorVersions` in three hops (1.29.8, 1.30.5,
//! 1.31.1), each hop one simulated upgrade of the member's duration (`-- --chain 1000 10000`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use serde_json::json;

use flotilla_engine::engine::{Command, Input};
use flotilla_engine::fleet::{
    Catalog, Cluster, ImageRelease, KubeRelease, Member, NodePool, Os, RegionCatalog,
};
use flotilla_engine::fleet_engine::{FleetCommand, FleetEngine, FleetInput};
use flotilla_engine::forecast::{ForecastParams, completions};
use flotilla_engine::time::Time;
use flotilla_engine::version::{ImageVersion, KubeVersion};
use flotilla_engine::window::{MaintenanceWindow, MaintenanceWindowSpec};
use flotilla_sim::scenario::{Action, SimBehaviour, TimedAction};
use flotilla_sim::simulator::{run_spec, simulate_observing};
use flotilla_sim::{Scenario, forecast_scenario, simulate};

const GROUPS_PER_STAGE: usize = 50;
const STAGES: [&str; 3] = ["canary", "wave-1", "wave-2"];

/// A deterministic pseudo-random sequence (xorshift), so every run simulates the same fleet.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn fleet(size: usize) -> Scenario {
    let regions = ["eastus", "westeurope", "southeastasia"];
    let family = "AKSUbuntu-2204gen2containerd";
    let start = Time::parse("2026-03-02T00:00:00Z").expect("valid");
    let mut catalog = Catalog::default();
    for (i, region) in regions.iter().enumerate() {
        let mut rc = RegionCatalog::default();
        rc.kubernetes.push(KubeRelease {
            version: KubeVersion::parse("1.30.5").expect("v"),
            preview: false,
            long_term_support: false,
            available_at: None,
        });
        rc.kubernetes.push(KubeRelease {
            version: KubeVersion::parse("1.31.1").expect("v"),
            preview: false,
            long_term_support: false,
            available_at: Some(start.plus(i as i64 * 6 * 3600)),
        });
        rc.node_images.insert(
            family.into(),
            vec![ImageRelease {
                version: ImageVersion::parse("202602.10.0").expect("v"),
                available_at: None,
            }],
        );
        rc.family_order.push(family.into());
        catalog.regions.insert(region.to_string(), rc);
    }
    let window_spec: MaintenanceWindowSpec =
        serde_json::from_value(json!({"schedule": {"daily": {"intervalDays": 1}}, "durationHours": 8, "startTime": "22:00"})).expect("valid");
    let window = std::sync::Arc::new(MaintenanceWindow::parse(&window_spec, "w").expect("valid"));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut members = Vec::with_capacity(size);
    let mut behaviour = BTreeMap::new();
    for i in 0..size {
        // 2% canary, 30% wave 1, the rest wave 2; 50 groups in each stage.
        let stage = if i.is_multiple_of(50) {
            0
        } else if i % 10 < 3 {
            1
        } else {
            2
        };
        let group = format!(
            "{}-{:02}",
            STAGES[stage],
            rng.next() as usize % GROUPS_PER_STAGE
        );
        let name = format!("c{i:06}");
        members.push(Member {
            name: name.clone(),
            cluster_resource_id: format!("/sim/{name}"),
            group: Some(group),
            labels: BTreeMap::new(),
            cluster: Cluster {
                rollback: Default::default(),
                region: regions[i % 3].into(),
                kubernetes_version: KubeVersion::parse("1.30.5").expect("v"),
                node_pools: vec![NodePool {
                    name: "nodepool1".into(),
                    family: family.into(),
                    os: Os::Linux,
                    image: ImageVersion::parse("202602.10.0").expect("v"),
                    orchestrator_version: None,
                }],
                kubernetes_window: rng.next().is_multiple_of(4).then(|| window.clone()),
                node_os_window: None,
                long_term_support: false,
            },
        });
        behaviour.insert(
            name,
            SimBehaviour {
                rollback_until: None,
                duration_seconds: 600 + (rng.next() % 1800) as i64,
                fail: rng.next().is_multiple_of(200),
                fail_message: "simulated failure".into(),
                fail_attempts: None,
                fail_operations: Vec::new(),
            },
        );
    }
    let stages: Vec<_> = STAGES
        .iter()
        .enumerate()
        .map(|(si, stage)| {
            let groups: Vec<_> = (0..GROUPS_PER_STAGE)
                .map(|g| json!({"name": format!("{stage}-{g:02}"), "maxConcurrency": "20%", "maxAllowedFailures": "5%"}))
                .collect();
            json!({
                "name": stage,
                "maxConcurrency": if si == 0 { "10%" } else { "1000" },
                "maxAllowedFailures": "5%",
                "afterStageWaitInSeconds": 1800,
                "groups": groups,
            })
        })
        .collect();
    Scenario {
        name: format!("scale-{size}"),
        description: String::new(),
        start,
        until: start.plus(60 * 86_400),
        catalog,
        members,
        behaviour,
        strategy: Some(json!({"stages": stages})),
        update: Some(json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"}})),
        strategies: Default::default(),
        profiles: Vec::new(),
        releases: Vec::new(),
        actions: vec![TimedAction {
            at: start,
            action: Action::Start,
            label: "start".into(),
            run: None,
        }],
        member_checks: Default::default(),
        gate_checks: Default::default(),
        freezes: Vec::new(),
        budgets: Vec::new(),
        fleet: flotilla_sim::scenario::SIM_FLEET.to_string(),
        pins_node_images: true,
        fleets: Vec::new(),
        providers: Default::default(),
        expect: None,
    }
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// An upgrade in flight: (ends at, sequence, run, member, attempt, fails).
type Finishing = (i64, u64, String, String, u64, bool);

/// N runs over one fleet in one fleet engine, driven to their end in virtual time; with
/// `budget`, under a fleet-wide disruption budget of that many members in flight.
fn fleet_bench(scenario: &Scenario, runs: usize, budget: Option<u64>) {
    let (spec, _, _) = run_spec(scenario).expect("valid strategy");
    let before = rss_mib();
    let mut fleet = FleetEngine::new(&scenario.members, scenario.catalog.clone());
    let table = rss_mib() - before;
    let t = Instant::now();
    let names: Vec<String> = (0..runs).map(|r| format!("run-{r:03}")).collect();
    for name in &names {
        fleet
            .create_run(name, &spec, scenario.catalog.clone())
            .expect("created");
    }
    let created = t.elapsed().as_secs_f64();
    let after_create = rss_mib() - before;
    // The first run as created, to restore its checkpoint onto midway.
    let fresh = fleet.run(&names[0]).expect("created").clone();
    let mut checkpoint: Option<String> = None;
    let mut now = scenario.start;
    if let Some(n) = budget {
        let spec =
            serde_json::from_value(json!({"maxUnavailable": n.to_string()})).expect("budget shape");
        let budget =
            flotilla_engine::budget::parse_budget("fleet-wide", &spec).expect("a valid budget");
        fleet
            .handle(now, FleetInput::PutBudget(Box::new(budget)))
            .expect("budget put");
    }
    for name in &names {
        fleet
            .handle(
                now,
                FleetInput::Run {
                    run: name.clone(),
                    input: Input::Start,
                },
            )
            .expect("started");
    }
    let mut finishing: BinaryHeap<Reverse<Finishing>> = BinaryHeap::new();
    let mut seq = 0u64;
    let (mut events, mut upgrades, mut steps) = (0u64, 0u64, Vec::new());
    // The most members the budget counted in flight after any instant.
    let mut peak_in_flight = 0u64;
    let wall = Instant::now();
    loop {
        let step = Instant::now();
        while let Some(Reverse((end, ..))) = finishing.peek() {
            if *end > now.unix() {
                break;
            }
            let Some(Reverse((_, _, run, member, attempt, fails))) = finishing.pop() else {
                break;
            };
            let outcome = if fails {
                Err("simulated failure".to_string())
            } else {
                Ok(())
            };
            let input = Input::OperationFinished {
                member,
                attempt,
                outcome,
            };
            let _ = fleet.handle(now, FleetInput::Run { run, input });
        }
        fleet.advance_clock(now);
        fleet.settle(now);
        while let Some(FleetCommand { run, command }) = fleet.poll_command() {
            if let Command::StartUpgrade {
                member, attempt, ..
            } = command
            {
                let b = &scenario.behaviour[&member];
                seq += 1;
                upgrades += 1;
                let end = now.unix() + b.duration_seconds;
                finishing.push(Reverse((end, seq, run, member, attempt, b.fail)));
            }
        }
        while fleet.poll_event().is_some() {
            events += 1;
        }
        steps.push(step.elapsed().as_secs_f64() * 1000.0);
        if budget.is_some() {
            let n = fleet.budget_partitions().map(|(_, n)| n).max();
            peak_in_flight = peak_in_flight.max(n.unwrap_or_default());
        }
        // Midway through the first run (half its members' upgrades sent): what a checkpoint of
        // it costs to write and to restore.
        if checkpoint.is_none()
            && let Some(run) = fleet.run(&names[0])
            && upgrades as usize * 2 >= scenario.members.len()
        {
            let t = Instant::now();
            let text = run.checkpoint(now).expect("drained run");
            let written = t.elapsed().as_secs_f64() * 1000.0;
            let t = Instant::now();
            let mut restored = fresh.clone();
            restored.restore(&text).expect("restores");
            let restored_ms = t.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(restored.differences(run), None);
            let t = Instant::now();
            let packed = zstd::bulk::compress(text.as_bytes(), 1).expect("compresses");
            let packed_ms = t.elapsed().as_secs_f64() * 1000.0;
            println!(
                "  checkpoint of {} midway: {:.1} MB ({:.2} MB compressed), written in {written:.0} ms (+{packed_ms:.0} ms compressing), restored in {restored_ms:.0} ms (over the run as created; recount included)",
                names[0],
                text.len() as f64 / 1e6,
                packed.len() as f64 / 1e6,
            );
            checkpoint = Some(text);
        }
        let next = [
            finishing.peek().map(|Reverse((t, ..))| Time(*t)),
            fleet.next_wakeup(),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(next) if next <= scenario.until => now = next.max(now),
            _ => break,
        }
    }
    let simulated = wall.elapsed().as_secs_f64();
    steps.sort_by(f64::total_cmp);
    let pct = |p: f64| steps[((steps.len() as f64 - 1.0) * p) as usize];
    let finished = names
        .iter()
        .filter(|n| fleet.run(n).is_some_and(|r| r.is_finished()))
        .count();
    println!(
        "{} members, {runs} runs: member table {table:.0} MiB; creating the runs {created:.2} s, {after_create:.0} MiB",
        scenario.members.len()
    );
    if let Some(n) = budget {
        println!("  fleet-wide disruption budget of {n}: at most {peak_in_flight} in flight");
    }
    println!(
        "  simulated in {simulated:.2} s: {upgrades} upgrades, {events} events, {} instants; step p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {finished}/{runs} runs finished; peak RSS {:.0} MiB",
        steps.len(),
        pct(0.5),
        pct(0.99),
        pct(1.0),
        peak_rss_mib()
    );
}

/// A forecast of the fleet's run before its start (SEMANTICS §11), timed, and compared with the
/// run simulated (which has its 0.5 % of failures; the forecast assumes none).
fn forecast_bench(scenario: &Scenario) {
    let params = ForecastParams::default();
    let t = Instant::now();
    let forecast = forecast_scenario(scenario, &params).expect("forecast");
    let took = t.elapsed().as_secs_f64();
    let actual = simulate(scenario);
    let end = actual.status.as_ref().and_then(|s| s.status.completed_time);
    let (Some(predicted), Some(end)) = (forecast.completed, end) else {
        println!(
            "{} members: forecast in {took:.2} s; predicted {:?}, actual {end:?}",
            scenario.members.len(),
            forecast.completed
        );
        return;
    };
    let span = (end.unix() - scenario.start.unix()) as f64;
    println!(
        "{} members: forecast in {took:.2} s (peak RSS {:.0} MiB); predicted end {predicted}, actual {end}: off by {:.3} % of the run's {:.1} days; critical path of {} steps",
        scenario.members.len(),
        peak_rss_mib(),
        (predicted.unix() - end.unix()).abs() as f64 * 100.0 / span,
        span / 86_400.0,
        forecast.critical_path.len()
    );
    status_forecast_bench(scenario);
}

/// What a running run's status forecast costs the server (SEMANTICS §11): the copy of the fleet
/// engine its task makes (on the task), and the forward simulation of every moving run (off it),
/// at the first instant after the run's first stage ended.
fn status_forecast_bench(scenario: &Scenario) {
    let params = ForecastParams::default();
    let duration = |_: &str, member: &str| {
        scenario
            .behaviour
            .get(member)
            .map_or(600, |b| b.duration_seconds)
    };
    let mut measured: Option<(f64, f64)> = None;
    simulate_observing(scenario, &mut |fleet, now| {
        let Some(run) = fleet.run(&scenario.name) else {
            return;
        };
        let first_done = run
            .status_skeleton()
            .stages
            .first()
            .is_some_and(|s| s.status.state == flotilla_engine::status::State::Completed);
        if measured.is_some() || run.is_finished() || !first_done {
            return;
        }
        let t = Instant::now();
        let copy = fleet.clone().without_journal();
        let cloned = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let ends = completions(&copy, now, &params, &duration);
        let simulated = t.elapsed().as_secs_f64();
        assert!(ends.contains_key(&scenario.name), "the run is forecast");
        measured = Some((cloned, simulated));
    });
    if let Some((cloned, simulated)) = measured {
        println!(
            "{} members: status forecast after the first stage: copy on the fleet's task {:.1} ms, simulation off it {simulated:.2} s",
            scenario.members.len(),
            cloned * 1000.0
        );
    }
}

/// The run of [`fleet`] chained (SEMANTICS §13): every member on 1.28.9, each region's catalog
/// with a generally available 1.28 and 1.29 beside the 1.30 and the target 1.31.1, and the run
/// with `chainMinorVersions`: three hops a member, each its own operation.
fn chained(mut scenario: Scenario) -> Scenario {
    let v = |s: &str| KubeVersion::parse(s).expect("v");
    for member in &mut scenario.members {
        member.cluster.kubernetes_version = v("1.28.9");
    }
    for region in scenario.catalog.regions.values_mut() {
        for version in ["1.28.9", "1.29.8"] {
            region.kubernetes.push(KubeRelease {
                version: v(version),
                preview: false,
                long_term_support: false,
                available_at: None,
            });
        }
        region.kubernetes.sort_by_key(|r| r.version);
    }
    if let Some(update) = scenario.update.as_mut() {
        update["chainMinorVersions"] = json!(true);
    }
    scenario
}

/// The run of [`fleet`] with health checks: a five-minute soak per member (a check each
/// minute, all passing) and a HealthCheck before-gate on each later stage.
fn with_checks(mut scenario: Scenario) -> Scenario {
    use flotilla_sim::scenario::Scripted;
    let check = json!({"name": "errors", "provider": "prom",
                       "query": "errors{cluster=\"{member}\"}", "condition": "< 0.01"});
    if let Some(stages) = scenario
        .strategy
        .as_mut()
        .and_then(|s| s["stages"].as_array_mut())
    {
        for (si, stage) in stages.iter_mut().enumerate() {
            stage["memberHealthChecks"] =
                json!({"checks": [check], "soakSeconds": 300, "intervalSeconds": 60});
            if si > 0 {
                stage["beforeGates"] = json!([{"type": "HealthCheck", "soakSeconds": 600, "intervalSeconds": 60,
                    "checks": [{"name": "fleet", "provider": "prom",
                                "query": "max(errors)", "condition": "< 0.01"}]}]);
            }
        }
    }
    let prom =
        serde_json::from_value(json!({"type": "Prometheus", "endpoint": "http://prometheus:9090"}))
            .expect("provider shape");
    scenario.providers.insert(
        "prom".into(),
        flotilla_engine::checks::parse_provider("prom", &prom).expect("a valid provider"),
    );
    let start = scenario.start;
    for m in &scenario.members {
        scenario.member_checks.insert(
            m.name.clone(),
            [("errors".to_string(), vec![(start, Scripted::Number(0.001))])].into(),
        );
    }
    scenario
        .gate_checks
        .insert("fleet".into(), vec![(start, Scripted::Number(0.0))]);
    scenario
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // `--budget N` (with `--runs`): taken out first, so N is not read as a size.
    let budget = args.iter().position(|a| a == "--budget").map(|i| {
        let n = args
            .get(i + 1)
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|&n| n >= 1)
            .expect("--budget N: a whole number ≥ 1");
        args.drain(i..i + 2);
        n
    });
    let checks = args.iter().any(|a| a == "--checks");
    let chain = args.iter().any(|a| a == "--chain");
    if args.iter().any(|a| a == "--forecast") {
        let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
        for size in if sizes.is_empty() {
            vec![10_000]
        } else {
            sizes
        } {
            forecast_bench(&fleet(size));
        }
        return;
    }
    assert!(
        budget.is_none() || args.iter().any(|a| a == "--runs"),
        "--budget N goes with --runs"
    );
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        let runs = args.get(i + 1).and_then(|n| n.parse().ok()).unwrap_or(10);
        let sizes: Vec<usize> = args[i + 2..]
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        for size in if sizes.is_empty() {
            vec![100_000]
        } else {
            sizes
        } {
            fleet_bench(&fleet(size), runs, budget);
        }
        return;
    }
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    println!(
        "{:>8} {:>10} {:>10} {:>14} {:>12} {:>10} {:>14} {:>10}",
        "members", "build s", "sim s", "events", "events/s", "µs/event", "virtual days", "peak MiB"
    );
    for size in sizes {
        let t0 = Instant::now();
        let scenario = match (checks, chain) {
            (true, _) => with_checks(fleet(size)),
            (false, true) => chained(fleet(size)),
            (false, false) => fleet(size),
        };
        let built = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let result = simulate(&scenario);
        let simulated = t1.elapsed().as_secs_f64();
        let status = result.status.as_ref().expect("the run was created");
        let days = status.status.completed_time.map_or(f64::NAN, |end| {
            (end.unix() - scenario.start.unix()) as f64 / 86_400.0
        });
        let hops = result
            .events
            .iter()
            .filter(|e| e.kind == flotilla_engine::status::EventType::MemberHopStarted)
            .count();
        println!(
            "{size:>8} {built:>10.2} {simulated:>10.2} {:>14} {:>12.0} {:>10.2} {days:>14.2} {:>10.0}   ({:?}, {} failures{})",
            result.events.len(),
            result.events.len() as f64 / simulated,
            simulated * 1e6 / result.events.len() as f64,
            peak_rss_mib(),
            status.status.state,
            status.failure_count,
            if chain {
                format!(", {hops} hops, {:.2} a member", hops as f64 / size as f64)
            } else {
                String::new()
            }
        );
    }
}
