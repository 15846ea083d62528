//! The fleet engine driven through its door: several runs over one member table, one operation
//! per cluster across them, observations and removals reaching every run, and a deleted run
//! letting go of what it held.

mod common;

use common::{control_plane, member_at, v};
use std::collections::BTreeMap;

use flotilla_engine::engine::{Command, Engine, Input, OperationProgress, RunSpec};
use flotilla_engine::error::ErrorCode;
use flotilla_engine::fleet::{Catalog, Cluster, Member};
use flotilla_engine::fleet_engine::{Delivered, FleetCommand, FleetEngine, FleetInput};
use flotilla_engine::status::State;
use flotilla_engine::time::Time;

fn member(name: &str, version: &str) -> Member {
    member_at(name, "eastus", version)
}

fn catalog() -> Catalog {
    common::catalog(&[("eastus", &["1.30.5", "1.31.1", "1.32.0"])])
}

fn spec(version: &str) -> RunSpec {
    control_plane(version)
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

/// Replays a run's journal into a fresh engine built as the run was.
fn replay(name: &str, spec: &RunSpec, members: &[Member], journal: &[Delivered]) -> Engine {
    let (mut engine, _) = Engine::create(name, spec, members, catalog()).expect("created");
    for entry in journal {
        match entry {
            Delivered::Input(at, input) => {
                engine.handle(*at, input.clone()).expect("recorded input");
            }
            Delivered::AdvanceClock(at) => engine.advance_clock(*at),
            Delivered::Settle(at) => engine.settle(*at),
        }
    }
    while engine.poll_command().is_some() {}
    while engine.poll_event().is_some() {}
    engine
}

/// Drives a fleet one instant: results of `finishing` due by `now` in, settle, starts out.
fn drive(
    fleet: &mut FleetEngine,
    now: Time,
    finishing: &mut Vec<(Time, String, String, u64)>,
    journals: &mut BTreeMap<String, Vec<Delivered>>,
) {
    finishing.sort();
    while finishing.first().is_some_and(|f| f.0 <= now) {
        let (_, run, member, attempt) = finishing.remove(0);
        finish(fleet, now, &run, &member, attempt);
    }
    fleet.advance_clock(now);
    loop {
        fleet.settle(now);
        let mut answered = false;
        while let Some(FleetCommand { run, command }) = fleet.poll_command() {
            match command {
                Command::StartUpgrade {
                    member, attempt, ..
                } => {
                    let length = 300 + 60 * (attempt as i64 % 5);
                    finishing.push((now.plus(length), run, member, attempt));
                }
                Command::Observe { member, attempt } => {
                    // Re-attaching after a start: still running if its result is to come.
                    let running = finishing
                        .iter()
                        .any(|f| f.1 == run && f.2 == member && f.3 == attempt);
                    let progress = if running {
                        OperationProgress::InProgress
                    } else {
                        OperationProgress::NotRunning
                    };
                    let cluster = fleet.cluster(&member).expect("member").clone();
                    let observed = Input::Observed {
                        member,
                        cluster: std::sync::Arc::new(cluster),
                        operation: Some((attempt, progress)),
                    };
                    fleet.handle(now, input(&run, observed)).expect("observed");
                    answered = true;
                }
                Command::Evaluate { .. } => panic!("these strategies carry no checks"),
            }
        }
        if !answered {
            break;
        }
    }
    while fleet.poll_event().is_some() {}
    let names: Vec<String> = fleet.run_names().map(str::to_string).collect();
    for name in names {
        journals
            .entry(name.clone())
            .or_default()
            .extend(fleet.take_journal(&name));
    }
    fleet.check_invariants(now).expect("fleet invariants");
}

#[test]
fn journals_replay_each_run_exactly_and_an_adopted_fleet_goes_on_the_same() {
    let names: Vec<String> = (0..12).map(|i| format!("m{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let members: Vec<Member> = refs.iter().map(|n| member(n, "1.30.5")).collect();
    let mut f = FleetEngine::new(&members, catalog()).recording();
    let specs = [
        ("a", spec("1.31.1")),
        ("b", spec("1.32.0")),
        ("c", spec("1.31.1")),
    ];
    for (name, s) in &specs {
        f.create_run(name, s, catalog()).expect("created");
    }
    let t0 = Time(1_000_000);
    for (name, _) in &specs {
        f.handle(t0, input(name, Input::Start)).expect("started");
    }
    let mut finishing = Vec::new();
    let mut journals = BTreeMap::new();
    let mut now = t0;
    for step in 0..40 {
        if step == 7 {
            f.handle(now, input("b", Input::Stop)).expect("stopped");
        }
        if step == 15 {
            f.handle(now, input("b", Input::Start))
                .expect("started again");
        }
        drive(&mut f, now, &mut finishing, &mut journals);
        now = now.plus(120);
    }
    // The runs did contend: locks were taken and let go through their inputs.
    let delivered = |want: fn(&Input) -> bool| {
        journals
            .values()
            .flatten()
            .any(|d| matches!(d, Delivered::Input(_, i) if want(i)))
    };
    assert!(delivered(|i| matches!(i, Input::MemberLocked { .. })));
    assert!(delivered(|i| matches!(i, Input::MemberUnlocked { .. })));
    // Every run replays from its journal alone to the state it is in, and is adopted by a
    // fleet whose table holds the clusters as they now are (as the server's is, loaded from
    // the members' recorded observations).
    let current: Vec<Member> = members
        .iter()
        .map(|m| Member {
            cluster: f.cluster(&m.name).expect("in the table").clone(),
            ..m.clone()
        })
        .collect();
    let mut adopted = FleetEngine::new(&current, catalog()).recording();
    for (name, s) in &specs {
        let replayed = replay(name, s, &members, &journals[*name]);
        assert_eq!(
            replayed.status(),
            f.run(name).expect("run").status(),
            "run {name} replays exactly"
        );
        adopted.adopt_run(now, name, replayed).expect("adopted");
    }
    adopted.check_invariants(now).expect("adopted invariants");
    // Both go on to the end; they end the same.
    let (mut fa, mut ja) = (finishing.clone(), BTreeMap::new());
    let (mut fb, mut jb) = (finishing, BTreeMap::new());
    for _ in 0..200 {
        drive(&mut f, now, &mut fa, &mut ja);
        drive(&mut adopted, now, &mut fb, &mut jb);
        now = now.plus(120);
    }
    for (name, _) in &specs {
        let (x, y) = (f.run(name).expect("run"), adopted.run(name).expect("run"));
        assert!(x.is_finished(), "run {name} finished");
        assert_eq!(x.state(), y.state(), "run {name}");
        let members_of = |e: &Engine| {
            e.status().stages[0].groups[0]
                .members
                .iter()
                .map(|m| (m.name.clone(), m.status.state))
                .collect::<Vec<_>>()
        };
        assert_eq!(members_of(x), members_of(y), "run {name}");
    }
}

#[test]
fn runs_adopted_without_a_member_table_still_hold_their_clusters() {
    // A shell may rebuild runs from their own snapshots and hand them over with no table: the
    // one-operation-per-cluster rule must not depend on the table knowing the member.
    let t0 = Time(1_000_000);
    let members = [member("a", "1.30.5")];
    let mut f = FleetEngine::default();
    for name in ["first", "second"] {
        let (engine, _) =
            Engine::create(name, &spec("1.31.1"), &members, catalog()).expect("created");
        f.adopt_run(t0, name, engine).expect("adopted");
        f.handle(t0, input(name, Input::Start)).expect("started");
    }
    assert_eq!(settle(&mut f, t0), vec![("first".into(), "a".into(), 1)]);
    assert_eq!(settle(&mut f, t0.plus(1)), vec![]);
    let (st, message) = state(f.run("second").expect("run"), "a");
    assert_eq!(st, State::Pending);
    assert!(message.is_some_and(|m| m.contains("first")));
    // Adopting a run again under the same name is refused.
    let (engine, _) = Engine::create("first", &spec("1.31.1"), &members, catalog()).expect("ok");
    assert_eq!(
        f.adopt_run(t0, "first", engine).expect_err("twice").code,
        ErrorCode::Conflict
    );
}

#[test]
fn runs_share_one_copy_of_each_cluster() {
    let members: Vec<Member> = ["a", "b"].iter().map(|n| member(n, "1.30.5")).collect();
    // Created from the table: the runs hold the table's clusters.
    let mut f = FleetEngine::new(&members, catalog());
    f.create_run("one", &spec("1.31.1"), catalog())
        .expect("created");
    f.create_run("two", &spec("1.31.1"), catalog())
        .expect("created");
    let (one, two) = (f.run("one").expect("run"), f.run("two").expect("run"));
    for m in ["a", "b"] {
        let (x, y) = (one.cluster_of(m).expect("a"), two.cluster_of(m).expect("b"));
        assert!(std::sync::Arc::ptr_eq(x, y), "{m} is held once");
    }
    // Rebuilt elsewhere, each with its own copies, then adopted without a table: equal clusters
    // are held once; a cluster that differs keeps its own copy.
    let mut g = FleetEngine::default();
    let mut changed = members.clone();
    changed[1].cluster.kubernetes_version = v("1.31.1");
    for (name, fleet) in [("x", &members), ("y", &members), ("z", &changed)] {
        let (engine, _) = Engine::create(name, &spec("1.31.1"), fleet, catalog()).expect("ok");
        g.adopt_run(Time(0), name, engine).expect("adopted");
    }
    let cluster = |run: &str, m: &str| g.run(run).and_then(|e| e.cluster_of(m)).cloned();
    let same = |a: Option<std::sync::Arc<Cluster>>, b: Option<std::sync::Arc<Cluster>>| {
        std::sync::Arc::ptr_eq(&a.expect("held"), &b.expect("held"))
    };
    assert!(same(cluster("x", "a"), cluster("y", "a")));
    assert!(same(cluster("x", "a"), cluster("z", "a")));
    assert!(same(cluster("x", "b"), cluster("y", "b")));
    assert!(!same(cluster("x", "b"), cluster("z", "b")));
    assert_eq!(
        cluster("z", "b").map(|c| c.kubernetes_version),
        Some(v("1.31.1"))
    );
}

#[test]
fn a_run_rebuilt_from_an_older_record_hears_what_the_fleet_saw_since() {
    // The server's case: a run's record (its creation snapshot, its log) can be older than the
    // member table, when another run upgraded a member since. Adopted, it decides on the
    // table's cluster and does not upgrade that member again.
    let t0 = Time(1_000_000);
    let members: Vec<Member> = ["a", "b"].iter().map(|n| member(n, "1.30.5")).collect();
    let mut f = FleetEngine::new(&members, catalog()).recording();
    f.create_run("first", &spec("1.31.1"), catalog())
        .expect("created");
    f.handle(t0, input("first", Input::Start)).expect("started");
    let upgraded = run_to_the_end(&mut f, t0, "first");
    assert_eq!(upgraded, 2);
    // What the shell persists of the table: both clusters, as upgraded.
    let mut changed = f.take_changed_members();
    changed.sort_by(|x, y| x.0.cmp(&y.0));
    let names: Vec<&str> = changed.iter().map(|(m, _)| &**m).collect();
    assert_eq!(names, ["a", "b"]);
    assert!(
        changed
            .iter()
            .all(|(_, c)| c.kubernetes_version == v("1.31.1"))
    );
    assert!(f.take_changed_members().is_empty(), "taken once");
    // A second run made from the members as they were before.
    let (late, _) = Engine::create("late", &spec("1.31.1"), &members, catalog()).expect("ok");
    f.adopt_run(t0.plus(120), "late", late).expect("adopted");
    f.handle(t0.plus(120), input("late", Input::Start))
        .expect("started");
    assert_eq!(
        settle(&mut f, t0.plus(120)),
        vec![],
        "nothing upgraded twice"
    );
    let late = f.run("late").expect("run");
    // Already at the target: skipped (SEMANTICS §1), as a run made now would be.
    assert_eq!(state(late, "a").0, State::Skipped);
    assert_eq!(late.state(), State::Skipped);
    assert_eq!(
        late.cluster_of("a").expect("a").kubernetes_version,
        v("1.31.1")
    );
    // The fleet saw nothing new: the adoption's news is not a change to persist.
    assert!(f.take_changed_members().is_empty());
}

#[test]
fn a_failed_run_started_again_hears_what_another_run_did_meanwhile() {
    // A finished run is told nothing (it decides nothing); a Failed one can be started again,
    // and then decides on the clusters as they are now.
    let t0 = Time(1_000_000);
    let mut f = fleet(&["a", "b"]);
    f.create_run("failing", &spec("1.31.1"), catalog())
        .expect("created");
    f.create_run("fast", &spec("1.31.1"), catalog())
        .expect("created");
    f.handle(t0, input("failing", Input::Start))
        .expect("started");
    for (run, m, attempt) in settle(&mut f, t0) {
        let failed = Input::OperationFinished {
            member: m,
            attempt,
            outcome: Err("the cluster refused".into()),
        };
        f.handle(t0.plus(10), input(&run, failed))
            .expect("answered");
    }
    settle(&mut f, t0.plus(10));
    assert_eq!(f.run("failing").expect("run").state(), State::Failed);
    assert!(f.run("failing").expect("run").is_finished());
    f.handle(t0.plus(20), input("fast", Input::Start))
        .expect("started");
    assert_eq!(run_to_the_end(&mut f, t0.plus(20), "fast"), 2);
    f.handle(t0.plus(600), input("failing", Input::Start))
        .expect("started again");
    assert_eq!(
        settle(&mut f, t0.plus(600)),
        vec![],
        "nothing upgraded twice"
    );
    let failing = f.run("failing").expect("run");
    assert_eq!(state(failing, "a").0, State::Skipped);
    assert_eq!(state(failing, "b").0, State::Skipped);
}

/// Settles, finishing every upgrade started a minute later, until `run` is finished; returns
/// how many upgrades were started (in any run).
fn run_to_the_end(f: &mut FleetEngine, t0: Time, run: &str) -> usize {
    let mut now = t0;
    let mut count = 0;
    for _ in 0..100 {
        let started = settle(f, now);
        count += started.len();
        now = now.plus(60);
        for (r, m, attempt) in &started {
            finish(f, now, r, m, *attempt);
        }
        if f.run(run).is_some_and(|e| e.is_finished()) {
            return count;
        }
    }
    panic!("run {run} did not finish");
}

/// A member a shell could not observe, but whose observation reached the table meanwhile, is
/// not unknown: the run is made over it once (it was refused as selected by two groups).
#[test]
fn a_member_observed_since_the_shell_asked_is_not_unknown() {
    use flotilla_engine::error::ApiError;
    use flotilla_engine::fleet::SharedMember;
    let fleet = fleet(&["a", "b"]);
    let stand_in = |name: &str| {
        let mut m = SharedMember::from(&member(name, "1.30.5"));
        m.cluster = std::sync::Arc::new(Cluster::unknown());
        m
    };
    let unknown = vec![
        (
            stand_in("b"),
            ApiError::conflict("member \"b\" cannot be observed"),
        ),
        (
            stand_in("c"),
            ApiError::conflict("member \"c\" cannot be observed"),
        ),
    ];
    // Both members of the table, and c, unknown, selected: refused with c's reason.
    let Err(refused) = fleet.plan_run("r1", &spec("1.31.1"), catalog(), &unknown) else {
        panic!("c is selected and cannot be observed");
    };
    assert!(refused.message.contains("\"c\""), "{refused:?}");
    // b alone is in the table already: the run is made over a and b.
    let (engine, _) = fleet
        .plan_run("r1", &spec("1.31.1"), catalog(), &unknown[..1])
        .expect("made");
    assert!(engine.has_member("a") && engine.has_member("b"));
}

/// A run made again from its origin (what a shell records when the fleet makes it) is the
/// run the fleet made, whatever the fleet became since: a spec run with its settings, and a
/// rollback run made from its plan.
#[test]
fn a_run_rebuilt_from_its_origin_is_the_run_the_fleet_made() {
    use flotilla_engine::engine::{RunMaking, RunOrigin};
    use flotilla_engine::fleet_engine::RollbackRequest;
    use flotilla_engine::status::PromotedFrom;
    let t0 = Time(1_000_000);
    let mut f = fleet(&["a", "b"]);
    let (mut made, _) = f
        .plan_run("first", &spec("1.31.1"), catalog(), &[])
        .expect("planned");
    let origin = RunOrigin {
        making: RunMaking::Spec(spec("1.31.1")),
        members: f.table().cloned().collect(),
        catalog: catalog(),
        promoted_from: Some(PromotedFrom {
            run_id: "/v1/fleets/staging/updateRuns/up".into(),
            completed_time: t0,
            images_pinned: true,
        }),
        time_scale: 50.0,
    };
    origin.apply_settings(&mut made);
    let expected = serde_json::to_value(made.status()).expect("status");
    f.take_run("first", made).expect("taken");
    // The fleet moves on: a member joins, one is removed. The rebuild does not see it.
    f.handle(t0, FleetInput::MemberAdded(member("c", "1.30.5")))
        .expect("added");
    f.handle(t0, FleetInput::MemberRemoved { member: "b".into() })
        .expect("removed");
    let (rebuilt, _) = Engine::rebuild("first", &origin).expect("rebuilt");
    assert_eq!(
        serde_json::to_value(rebuilt.status()).expect("status"),
        expected
    );
    assert_eq!(rebuilt.time_scale(), 50.0);

    // Run it to its end, then roll it back through plan and take, as a shell does.
    f.handle(t0, input("first", Input::Start)).expect("started");
    let started = settle(&mut f, t0);
    assert_eq!(started, vec![("first".into(), "a".into(), 1)]);
    finish(&mut f, t0.plus(600), "first", "a", 1);
    settle(&mut f, t0.plus(600));
    assert!(f.run("first").expect("run").is_finished());
    let Ok(RollbackRequest::New { name, plan }) = f.rollback_request("first") else {
        panic!("a finished run that upgraded a member can be rolled back");
    };
    let mut engine = f.plan_rollback_run(&name, &plan).expect("planned");
    let origin = RunOrigin {
        members: f.plan_members(&plan),
        making: RunMaking::Rollback(plan),
        catalog: f.catalog().clone(),
        promoted_from: None,
        time_scale: 1.0,
    };
    origin.apply_settings(&mut engine);
    let expected = serde_json::to_value(engine.status()).expect("status");
    let t1 = t0.plus(700);
    f.take_rollback_run(t1, "first", &name, engine)
        .expect("taken");
    assert_eq!(
        f.run("first").and_then(|r| r.rolled_back_by()),
        Some(name.as_str())
    );
    let (rebuilt, warnings) = Engine::rebuild(&name, &origin).expect("rebuilt");
    assert!(warnings.is_empty());
    assert_eq!(
        serde_json::to_value(rebuilt.status()).expect("status"),
        expected
    );
    // A second request answers the run already made, and nothing is made twice.
    assert_eq!(f.create_rollback_run(t1, "first").expect("answered"), name);
    assert!(
        f.plan_rollback_run(&name, &origin.rollback().cloned().expect("plan"))
            .is_err()
    );
}
