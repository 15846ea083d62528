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
