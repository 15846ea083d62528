//! The fleet engine driven through its door: several runs over one member table, one operation
//! per cluster across them, observations and removals reaching every run, and a deleted run
//! letting go of what it held.

use std::collections::BTreeMap;

use flotilla_engine::engine::{Command, Engine, Input, RunSpec};
use flotilla_engine::error::ErrorCode;
use flotilla_engine::fleet::{Catalog, Cluster, KubeRelease, Member, RegionCatalog};
use flotilla_engine::fleet_engine::{FleetCommand, FleetEngine, FleetInput};
use flotilla_engine::status::State;
use flotilla_engine::strategy::{NodeImageSelection, Upgrade, UpgradeType};
use flotilla_engine::time::Time;
use flotilla_engine::version::KubeVersion;

fn v(text: &str) -> KubeVersion {
    KubeVersion::parse(text).expect("valid version")
}

fn member(name: &str, version: &str) -> Member {
    Member {
        name: name.into(),
        cluster_resource_id: format!("/c/{name}"),
        group: None,
        labels: BTreeMap::new(),
        cluster: Cluster {
            region: "eastus".into(),
            kubernetes_version: v(version),
            node_pools: vec![],
            kubernetes_window: None,
            node_os_window: None,
            long_term_support: false,
        },
    }
}

fn catalog() -> Catalog {
    let mut rc = RegionCatalog::default();
    for version in ["1.30.5", "1.31.1", "1.32.0"] {
        rc.kubernetes.push(KubeRelease {
            version: v(version),
            preview: false,
            long_term_support: false,
            available_at: None,
        });
    }
    let mut c = Catalog::default();
    c.regions.insert("eastus".into(), rc);
    c
}

fn spec(version: &str) -> RunSpec {
    RunSpec {
        strategy: None,
        rules: Default::default(),
        upgrade: Upgrade {
            upgrade_type: UpgradeType::ControlPlaneOnly,
            kubernetes_version: Some(v(version)),
            node_images: NodeImageSelection::Latest,
        },
    }
}

fn fleet(names: &[&str]) -> FleetEngine {
    let members: Vec<Member> = names.iter().map(|n| member(n, "1.30.5")).collect();
    FleetEngine::new(&members, catalog())
}

fn input(run: &str, input: Input) -> FleetInput {
    FleetInput::Run {
        run: run.into(),
        input,
    }
}

/// Settles and returns the upgrades started, as (run, member, attempt).
fn settle(fleet: &mut FleetEngine, now: Time) -> Vec<(String, String, u64)> {
    fleet.settle(now);
    let mut started = Vec::new();
    while let Some(FleetCommand { run, command }) = fleet.poll_command() {
        if let Command::StartUpgrade {
            member, attempt, ..
        } = command
        {
            started.push((run, member, attempt));
        }
    }
    fleet.check_invariants(now).expect("fleet invariants");
    started
}

fn state(engine: &Engine, name: &str) -> (State, Option<String>) {
    let status = engine.status();
    let m = status.stages[0].groups[0]
        .members
        .iter()
        .find(|m| m.name == name)
        .expect("member in run");
    (m.status.state, m.message.clone())
}

fn finish(fleet: &mut FleetEngine, now: Time, run: &str, member: &str, attempt: u64) {
    fleet
        .handle(
            now,
            input(
                run,
                Input::OperationFinished {
                    member: member.into(),
                    attempt,
                    outcome: Ok(()),
                },
            ),
        )
        .expect("result accepted");
}

#[test]
fn one_operation_per_cluster_across_runs_and_the_second_run_decides_again() {
    let t0 = Time(1_000_000);
    let mut f = fleet(&["a"]);
    f.create_run("first", &spec("1.31.1"), catalog())
        .expect("created");
    f.create_run("second", &spec("1.31.1"), catalog())
        .expect("created");
    f.handle(t0, input("first", Input::Start)).expect("started");
    f.handle(t0, input("second", Input::Start))
        .expect("started");
    let started = settle(&mut f, t0);
    assert_eq!(started, vec![("first".into(), "a".into(), 1)]);
    // The second run waits, and says for whom.
    settle(&mut f, t0);
    let second = f.run("second").expect("run");
    let (st, message) = state(second, "a");
    assert_eq!(st, State::Pending);
    assert!(
        message.as_deref().is_some_and(|m| m.contains("first")),
        "{message:?}"
    );
    // The first run's upgrade ends: the cluster is at 1.31.1 for everyone, and the second run,
    // which targets the same version, skips it as already there.
    let t1 = t0.plus(600);
    finish(&mut f, t1, "first", "a", 1);
    assert_eq!(settle(&mut f, t1), Vec::<(String, String, u64)>::new());
    assert_eq!(
        f.cluster("a").map(|c| c.kubernetes_version),
        Some(v("1.31.1"))
    );
    let second = f.run("second").expect("run");
    assert_eq!(state(second, "a").0, State::Skipped);
    assert!(second.is_finished());
    assert!(f.is_finished());
}

#[test]
fn a_run_going_further_upgrades_after_the_other_lets_go() {
    let t0 = Time(1_000_000);
    let mut f = fleet(&["a", "b"]);
    f.create_run("to-31", &spec("1.31.1"), catalog())
        .expect("created");
    f.create_run("to-32", &spec("1.32.0"), catalog())
        .expect("created");
    f.handle(t0, input("to-31", Input::Start)).expect("started");
    f.handle(t0, input("to-32", Input::Start)).expect("started");
    // One member at a time in each run (no strategy): to-31 takes a, to-32 takes b.
    let started = settle(&mut f, t0);
    assert_eq!(
        started,
        vec![
            ("to-31".into(), "a".into(), 1),
            ("to-32".into(), "b".into(), 1)
        ]
    );
    let t1 = t0.plus(600);
    finish(&mut f, t1, "to-31", "a", 1);
    finish(&mut f, t1, "to-32", "b", 1);
    // Each now wants the member the other upgraded; b is at 1.32.0, ahead of to-31's target: a
    // downgrade, so to-31 fails it; to-32 upgrades a from 1.31.1.
    let started = settle(&mut f, t1);
    assert_eq!(started, vec![("to-32".into(), "a".into(), 2)]);
    assert_eq!(state(f.run("to-31").expect("run"), "b").0, State::Failed);
}

#[test]
fn an_observation_and_a_removal_reach_every_run() {
    let t0 = Time(1_000_000);
    let mut f = fleet(&["a", "b", "c"]);
    f.create_run("one", &spec("1.31.1"), catalog())
        .expect("created");
    f.create_run("two", &spec("1.31.1"), catalog())
        .expect("created");
    // Before either starts: b is found at the target, c leaves the fleet.
    let mut at_target = member("b", "1.31.1").cluster;
    at_target.region = "eastus".into();
    f.handle(
        t0,
        FleetInput::Observed {
            member: "b".into(),
            cluster: at_target,
        },
    )
    .expect("observed");
    f.handle(t0, FleetInput::MemberRemoved { member: "c".into() })
        .expect("removed");
    for run in ["one", "two"] {
        f.handle(t0, input(run, Input::Start)).expect("started");
    }
    let started = settle(&mut f, t0);
    assert_eq!(started, vec![("one".into(), "a".into(), 1)]);
    for run in ["one", "two"] {
        let engine = f.run(run).expect("run");
        assert_eq!(state(engine, "c").0, State::Skipped, "{run}: c removed");
    }
    // b is reached once a is done; both runs skip it as already at target.
    let t1 = t0.plus(600);
    finish(&mut f, t1, "one", "a", 1);
    settle(&mut f, t1);
    for run in ["one", "two"] {
        let engine = f.run(run).expect("run");
        assert_eq!(state(engine, "b").0, State::Skipped, "{run}: b at target");
        assert!(engine.is_finished(), "{run}");
    }
    // A run created now does not select the removed member.
    f.create_run("three", &spec("1.32.0"), catalog())
        .expect("created");
    assert!(!f.run("three").expect("run").has_member("c"));
}

#[test]
fn deleting_the_holding_run_lets_the_other_start() {
    let t0 = Time(1_000_000);
    let mut f = fleet(&["a"]);
    f.create_run("holder", &spec("1.31.1"), catalog())
        .expect("created");
    f.create_run("waiter", &spec("1.32.0"), catalog())
        .expect("created");
    f.handle(t0, input("holder", Input::Start))
        .expect("started");
    f.handle(t0, input("waiter", Input::Start))
        .expect("started");
    assert_eq!(settle(&mut f, t0).len(), 1);
    assert!(f.remove_run("holder").is_some());
    let t1 = t0.plus(5);
    assert_eq!(settle(&mut f, t1), vec![("waiter".into(), "a".into(), 1)]);
}

#[test]
fn inputs_for_unknown_runs_and_duplicate_names_are_refused() {
    let t0 = Time(1_000_000);
    let mut f = fleet(&["a"]);
    f.create_run("r", &spec("1.31.1"), catalog())
        .expect("created");
    let err = f
        .create_run("r", &spec("1.31.1"), catalog())
        .expect_err("duplicate");
    assert_eq!(err.code, ErrorCode::Conflict);
    let err = f
        .handle(t0, input("nope", Input::Start))
        .expect_err("unknown run");
    assert_eq!(err.code, ErrorCode::NotFound);
    assert!(err.message.contains("nope"), "{}", err.message);
    assert_eq!(f.run_names().collect::<Vec<_>>(), vec!["r"]);
    assert_eq!(f.run("r").expect("run").state(), State::NotStarted);
}
