//! A run's checkpoint: laid over the run as created it gives back the run, and anything else
//! is refused with a reason, leaving the engine as it was. (The simulator checks the round
//! trip after every instant of every scenario it runs checking invariants.)

mod common;

use common::{catalog, control_plane, member_at};

use flotilla_engine::engine::{Command, Engine, Input, RunSpec};
use flotilla_engine::fleet::Member;
use flotilla_engine::time::Time;

fn members(n: usize) -> Vec<Member> {
    (0..n)
        .map(|i| member_at(&format!("m{i:02}"), "eastus", "1.30.5"))
        .collect()
}

fn spec() -> RunSpec {
    control_plane("1.31.1")
}

fn created(n: usize) -> Engine {
    Engine::create(
        "run",
        &spec(),
        &members(n),
        catalog(&[("eastus", &["1.31.1"])]),
    )
    .expect("run created")
    .0
}

/// A run of `n` members started at `t0`, its first member's upgrade finished and the second
/// sent, every queue drained.
fn under_way(n: usize, t0: Time) -> Engine {
    let mut engine = created(n);
    engine.handle(t0, Input::Start).expect("started");
    engine.settle(t0);
    let mut attempt = 0;
    while let Some(c) = engine.poll_command() {
        if let Command::StartUpgrade { attempt: a, .. } = c {
            attempt = a;
        }
    }
    engine
        .handle(
            Time(t0.0 + 60),
            Input::OperationFinished {
                member: "m00".into(),
                attempt,
                outcome: Ok(()),
            },
        )
        .expect("finished");
    engine.settle(Time(t0.0 + 60));
    while engine.poll_command().is_some() {}
    while engine.poll_event().is_some() {}
    engine
}

fn t0() -> Time {
    Time::parse("2026-03-02T00:00:00Z").unwrap()
}

#[test]
fn a_checkpoint_restores_the_run_and_it_goes_on_the_same() {
    let mut engine = under_way(5, t0());
    let text = engine.checkpoint(Time(t0().0 + 60)).expect("checkpoint");
    let mut restored = created(5);
    assert!(
        restored.differences(&engine).is_some(),
        "a fresh run differs"
    );
    restored.restore(&text).expect("restored");
    assert_eq!(restored.differences(&engine), None);
    // Both go on the same way.
    for e in [&mut engine, &mut restored] {
        e.handle(
            Time(t0().0 + 120),
            Input::OperationFinished {
                member: "m01".into(),
                attempt: 2,
                outcome: Err("boom".into()),
            },
        )
        .expect("finished");
        e.settle(Time(t0().0 + 120));
    }
    assert_eq!(restored.differences(&engine), None);
    assert_eq!(
        serde_json::to_string(&restored.status()).unwrap(),
        serde_json::to_string(&engine.status()).unwrap()
    );
}

#[test]
fn a_run_with_commands_not_taken_is_not_checkpointed() {
    let mut engine = created(3);
    engine.handle(t0(), Input::Start).unwrap();
    engine.settle(t0());
    let error = engine.checkpoint(t0()).unwrap_err();
    assert!(error.contains("not yet taken"), "{error}");
}

/// Each refusal names what is wrong, and the engine it was laid over is unchanged.
#[test]
fn a_checkpoint_that_does_not_fit_is_refused_and_changes_nothing() {
    let engine = under_way(5, t0());
    let text = engine.checkpoint(Time(t0().0 + 60)).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = value.clone();
        f(&mut v);
        v.to_string()
    };
    let cases: Vec<(String, &str)> = vec![
        (edit(&|v| v["v"] = 2.into()), "format Some(2)"),
        (
            edit(&|v| {
                v.as_object_mut().unwrap().remove("v");
            }),
            "format None",
        ),
        (
            edit(&|v| v["surprise"] = 1.into()),
            "unknown field `surprise`",
        ),
        (
            edit(&|v| {
                v["members"].as_array_mut().unwrap().pop();
            }),
            "4 members, the run 5",
        ),
        (
            edit(&|v| v["members"][2]["c"] = 9.into()),
            "cluster 9 out of range",
        ),
        (
            edit(&|v| v["members"][1]["l"] = 0.into()),
            "holder 0 out of range",
        ),
        (
            edit(&|v| v["members"][1]["t"]["k"] = "1.31".into()),
            "version \"1.31\"",
        ),
        (
            edit(&|v| v["current"] = 7.into()),
            "current stage 7 out of range",
        ),
        (
            edit(&|v| v["chunk_revisions"] = serde_json::json!([1, 2])),
            "2 status chunks, the run 1",
        ),
        (
            edit(&|v| v["timers"] = serde_json::json!([["2026-03-02T00:00:00Z", {"Wait": 4}]])),
            "stage 4, not in the run",
        ),
        // Counters that do not match the members are caught by the recount.
        (
            edit(&|v| v["in_flight"] = 3.into()),
            "does not hold together",
        ),
        (
            edit(&|v| v["members"][1]["s"] = "Completed".into()),
            "does not hold together",
        ),
        ("not json".into(), "checkpoint: expected"),
    ];
    for (text, expected) in cases {
        let mut target = created(5);
        let error = target.restore(&text).unwrap_err();
        assert!(
            error.contains(expected),
            "expected {expected:?} in {error:?}"
        );
        assert_eq!(target.differences(&created(5)), None, "{expected}: changed");
    }
    // Another run's checkpoint: a different number of members.
    let mut other = created(4);
    let error = other.restore(&text).unwrap_err();
    assert!(error.contains("not this run's checkpoint"), "{error}");
}

/// A checkpoint of a run holding members for a budget restores them held; one written by the
/// engine before 2026-12-05, with the members it had queued again for free places (`reserved`)
/// and the partitions it had yet to serve (`opened`), is still read, and those lists are not
/// written any more (a held member is reached when its group has a slot and its partition room).
#[test]
fn a_checkpoint_of_members_held_by_a_budget_restores_and_older_ones_are_read() {
    use flotilla_engine::budget::{BudgetSpec, parse_budget};
    use flotilla_engine::fleet_engine::{FleetEngine, FleetInput};
    let now = t0();
    let mut fleet = FleetEngine::new(&members(4), catalog(&[("eastus", &["1.31.1"])]));
    let spec = spec();
    for run in ["a", "b"] {
        fleet
            .create_run(run, &spec, catalog(&[("eastus", &["1.31.1"])]))
            .expect("created");
    }
    let created = fleet.run("b").expect("b").clone();
    let budget: BudgetSpec = serde_json::from_str(r#"{"maxUnavailable": "1"}"#).unwrap();
    fleet
        .handle(
            now,
            FleetInput::PutBudget(Box::new(parse_budget("one", &budget).unwrap())),
        )
        .unwrap();
    for run in ["a", "b"] {
        let input = Input::Start;
        let run = run.to_string();
        fleet.handle(now, FleetInput::Run { run, input }).unwrap();
    }
    fleet.settle(now);
    while fleet.poll_command().is_some() {}
    while fleet.poll_event().is_some() {}
    let b = fleet.run("b").expect("b");
    b.check_invariants(now).expect("invariants");
    let text = b.checkpoint(now).expect("checkpoint");
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let held = &value["budgets"]["parked"];
    assert!(
        held.as_array().is_some_and(|h| !h.is_empty()),
        "members held: {value}"
    );
    assert!(value["budgets"].get("reserved").is_none());
    assert!(value["budgets"].get("opened").is_none());
    let mut restored = created.clone();
    restored.restore(&text).expect("restored");
    assert_eq!(restored.differences(b), None);
    // As an older engine wrote it.
    let mut older = value.clone();
    older["budgets"]["reserved"] = serde_json::json!([1]);
    older["budgets"]["opened"] = serde_json::json!([0]);
    let mut restored = created.clone();
    restored.restore(&older.to_string()).expect("restored");
    assert_eq!(restored.differences(b), None);
    // A reserved member out of range is still refused.
    older["budgets"]["reserved"] = serde_json::json!([99]);
    let mut restored = created;
    let error = restored.restore(&older.to_string()).unwrap_err();
    assert!(error.contains("reserved member 99 out of range"), "{error}");
}
