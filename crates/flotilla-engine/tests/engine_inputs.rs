//! The engine driven directly through its door, for inputs the scenario format does not
//! express: another run holding a member, and a catalog that changes under a waiting member.

mod common;

use common::{catalog, control_plane, member_at, v};

use flotilla_engine::engine::{Command, Engine, Input, RunSpec};
use flotilla_engine::fleet::Member;
use flotilla_engine::status::State;
use flotilla_engine::time::Time;

fn member(name: &str, region: &str) -> Member {
    member_at(name, region, "1.30.5")
}

fn spec() -> RunSpec {
    control_plane("1.31.1")
}

fn started(engine: &mut Engine) -> Vec<String> {
    let mut names = Vec::new();
    while let Some(c) = engine.poll_command() {
        if let Command::StartUpgrade { member, .. } = c {
            names.push(member);
        }
    }
    names
}

fn member_state(engine: &Engine, name: &str) -> (State, Option<String>) {
    let status = engine.status();
    let m = status.stages[0].groups[0]
        .members
        .iter()
        .find(|m| m.name == name)
        .expect("member in run");
    (m.status.state, m.message.clone())
}

#[test]
fn a_member_locked_by_another_run_waits_and_the_slot_goes_to_the_next() {
    let fleet = [member("a", "eastus"), member("b", "eastus")];
    let (mut engine, _) = Engine::create(
        "r1",
        &spec(),
        &fleet,
        catalog(&[("eastus", &["1.30.5", "1.31.1"])]),
    )
    .expect("created");
    let t0 = Time::from_unix(1_000_000);
    engine
        .handle(
            t0,
            Input::MemberLocked {
                member: "a".into(),
                by_run: "other-run".into(),
            },
        )
        .expect("accepted");
    engine.handle(t0, Input::Start).expect("starts");
    engine.settle(t0);
    assert_eq!(started(&mut engine), vec!["b".to_string()]);
    let (state, message) = member_state(&engine, "a");
    assert_eq!(state, State::Pending);
    assert!(message.unwrap_or_default().contains("other-run"));
    let t1 = t0.plus(600);
    engine
        .handle(
            t1,
            Input::OperationFinished {
                member: "b".into(),
                attempt: 1,
                outcome: Ok(()),
            },
        )
        .expect("accepted");
    engine.settle(t1);
    assert!(started(&mut engine).is_empty(), "a is still locked");
    engine
        .handle(t1.plus(5), Input::MemberUnlocked { member: "a".into() })
        .expect("accepted");
    engine.settle(t1.plus(5));
    assert_eq!(started(&mut engine), vec!["a".to_string()]);
    engine.check_invariants(t1.plus(5)).expect("consistent");
}

#[test]
fn a_member_waits_for_an_unlisted_version_until_the_catalog_publishes_it() {
    let fleet = [member("w", "westus")];
    let (mut engine, _) =
        Engine::create("r1", &spec(), &fleet, catalog(&[("westus", &["1.30.5"])]))
            .expect("created");
    let t0 = Time::from_unix(1_000_000);
    engine.handle(t0, Input::Start).expect("starts");
    engine.settle(t0);
    assert!(started(&mut engine).is_empty());
    let (state, message) = member_state(&engine, "w");
    assert_eq!(state, State::Pending);
    let message = message.unwrap_or_default();
    assert!(
        message.contains("1.31.1") && message.contains("westus"),
        "{message}"
    );
    assert_eq!(
        engine.next_wakeup(),
        None,
        "nothing to wake for: the catalog must change first"
    );
    let t1 = t0.plus(3600);
    engine
        .handle(
            t1,
            Input::CatalogChanged(catalog(&[("westus", &["1.30.5", "1.31.1"])])),
        )
        .expect("accepted");
    engine.settle(t1);
    assert_eq!(started(&mut engine), vec!["w".to_string()]);
}

#[test]
fn a_second_result_for_the_same_attempt_changes_nothing() {
    let fleet = [member("a", "eastus"), member("b", "eastus")];
    let (mut engine, _) = Engine::create(
        "r1",
        &spec(),
        &fleet,
        catalog(&[("eastus", &["1.30.5", "1.31.1"])]),
    )
    .expect("created");
    let t0 = Time::from_unix(1_000_000);
    engine.handle(t0, Input::Start).expect("starts");
    engine.settle(t0);
    assert_eq!(started(&mut engine), vec!["a".to_string()]);
    let t1 = t0.plus(600);
    engine
        .handle(
            t1,
            Input::OperationFinished {
                member: "a".into(),
                attempt: 1,
                outcome: Ok(()),
            },
        )
        .expect("accepted");
    engine
        .handle(
            t1,
            Input::OperationFinished {
                member: "a".into(),
                attempt: 1,
                outcome: Err("late duplicate".into()),
            },
        )
        .expect("accepted");
    engine.settle(t1);
    assert_eq!(member_state(&engine, "a").0, State::Completed);
    assert_eq!(engine.status().failure_count, 0);
    assert_eq!(started(&mut engine), vec!["b".to_string()]);
}

#[test]
fn generated_runs_skip_minor_jumps_and_require_long_term_support() {
    let mut behind = member("behind", "eastus");
    behind.cluster.kubernetes_version = v("1.29.9");
    let mut lts = member("lts", "eastus");
    lts.cluster.long_term_support = true;
    let fleet = [behind, member("plain", "eastus"), lts];
    let cat = catalog(&[("eastus", &["1.29.9", "1.30.5", "1.31.1"])]);
    let mut run = spec();
    run.rules = flotilla_engine::engine::RunRules {
        skip_minor_jumps: true,
        require_long_term_support: true,
        ..Default::default()
    };
    let (mut engine, _) = Engine::create("r1", &run, &fleet, cat).expect("created");
    let t0 = Time::from_unix(1_000_000);
    engine.handle(t0, Input::Start).expect("starts");
    engine.settle(t0);
    let (state, message) = member_state(&engine, "behind");
    assert_eq!(state, State::Skipped);
    assert!(
        message
            .unwrap_or_default()
            .contains("more than one minor behind")
    );
    assert_eq!(
        member_state(&engine, "lts").0,
        State::Running,
        "a cluster with long-term support is upgraded"
    );
    let t1 = t0.plus(600);
    engine
        .handle(
            t1,
            Input::OperationFinished {
                member: "lts".into(),
                attempt: 1,
                outcome: Ok(()),
            },
        )
        .expect("accepted");
    engine.settle(t1);
    let status = engine.status();
    let plain = status.stages[0].groups[0]
        .members
        .iter()
        .find(|m| m.name == "plain")
        .expect("in run");
    assert_eq!(plain.status.state, State::Failed);
    assert!(
        plain
            .status
            .error
            .as_ref()
            .is_some_and(|e| e.code == "LongTermSupportRequired")
    );
}

/// API.md "Security": a skip that passes an Approval gate pending or not yet reached needs the
/// approver's authority, decided by the engine with the skip; refused, it changes nothing.
/// Allowed, it records who skipped.
#[test]
fn skipping_past_an_approval_needs_the_approver() {
    let strategy: flotilla_engine::strategy::StrategySpec = serde_json::from_value(serde_json::json!({
        "stages": [
            {"name": "canary", "memberSelector": {"byLabel": "ring=0"}, "afterGates": [{"type": "Approval", "displayName": "canary ok"}]},
            {"name": "prod", "groups": [{"name": "east", "beforeGates": [{"type": "Approval"}]}, {"name": "west"}]},
        ]
    }))
    .expect("strategy");
    let strategy =
        flotilla_engine::strategy::parse_strategy(&strategy, "properties.strategy", 1000)
            .expect("valid");
    let mut members = vec![
        member("c1", "eastus"),
        member("e1", "eastus"),
        member("w1", "eastus"),
    ];
    members[0].labels.insert("ring".into(), "0".into());
    let mut spec = spec();
    members[1].group = Some("east".into());
    members[2].group = Some("west".into());
    spec.strategy = Some(strategy);
    let (mut engine, _) = Engine::create(
        "r1",
        &spec,
        &members,
        catalog(&[("eastus", &["1.30.5", "1.31.1"])]),
    )
    .expect("created");
    let t0 = Time::from_unix(1_772_409_600);
    engine.handle(t0, Input::Start).expect("starts");
    engine.settle(t0);
    started(&mut engine);
    let skip = |kind, name: &str, may_approve| Input::SkipBy {
        targets: vec![flotilla_engine::engine::SkipTarget {
            kind,
            name: name.into(),
        }],
        subject: if may_approve {
            "bob".into()
        } else {
            "olive".into()
        },
        may_approve,
    };
    use flotilla_engine::engine::SkipKind;
    // The canary stage holds a gate not reached yet; prod's group east one too.
    for (kind, name) in [
        (SkipKind::Stage, "canary"),
        (SkipKind::Stage, "prod"),
        (SkipKind::Group, "east"),
    ] {
        let before = serde_json::to_string(&engine.status()).expect("status");
        let error = engine
            .handle(t0, skip(kind, name, false))
            .expect_err("refused");
        assert_eq!(
            error.code,
            flotilla_engine::error::ErrorCode::Forbidden,
            "{}",
            error.message
        );
        assert!(error.message.contains("Approval gate"), "{}", error.message);
        assert_eq!(
            serde_json::to_string(&engine.status()).expect("status"),
            before,
            "changed nothing"
        );
    }
    // A group with no gate, a member and a wait need no approver.
    engine
        .handle(t0, skip(SkipKind::Group, "west", false))
        .expect("no gate to pass");
    // The approver may; the skip says who.
    engine
        .handle(t0, skip(SkipKind::Stage, "prod", true))
        .expect("approver");
    engine.settle(t0);
    let status = engine.status();
    assert_eq!(status.stages[1].status.state, State::Skipped);
    let events: Vec<_> = std::iter::from_fn(|| engine.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| e.message.as_deref() == Some("skipped by bob")),
        "{events:?}"
    );
}

/// SEMANTICS §2: a member deleted while the run re-attaches to it after a stop is Skipped when
/// the answer comes, and nothing is sent to it (it was attempted again before).
#[test]
fn a_member_removed_while_reattaching_is_skipped_not_upgraded() {
    let (mut engine, _) = Engine::create(
        "r1",
        &spec(),
        &[member("m1", "eastus")],
        catalog(&[("eastus", &["1.30.5", "1.31.1"])]),
    )
    .expect("created");
    let t0 = Time::from_unix(1_772_409_600);
    engine.handle(t0, Input::Start).expect("starts");
    engine.settle(t0);
    assert_eq!(started(&mut engine), vec!["m1".to_string()]);
    engine.handle(t0.plus(60), Input::Stop).expect("stops");
    engine
        .handle(t0.plus(120), Input::Start)
        .expect("starts again");
    engine.settle(t0.plus(120));
    let attempt = match engine.poll_command() {
        Some(Command::Observe { member, attempt }) if member == "m1" => attempt,
        other => panic!("expected an observation of m1, got {other:?}"),
    };
    engine
        .handle(
            t0.plus(130),
            Input::MemberRemoved {
                member: "m1".into(),
            },
        )
        .expect("removed");
    engine
        .handle(
            t0.plus(140),
            Input::Observed {
                member: "m1".into(),
                cluster: std::sync::Arc::new(member("m1", "eastus").cluster),
                operation: Some((
                    attempt,
                    flotilla_engine::engine::OperationProgress::NotRunning,
                )),
            },
        )
        .expect("observed");
    engine.settle(t0.plus(140));
    assert!(
        started(&mut engine).is_empty(),
        "nothing is sent to a removed member"
    );
    let (state, message) = member_state(&engine, "m1");
    assert_eq!(state, State::Skipped);
    assert_eq!(message.as_deref(), Some("member removed from fleet"));
    engine.check_invariants(t0.plus(140)).expect("invariants");
}

/// A HealthCheck gate's evaluation names its scope's members for `{members}` (SEMANTICS §10),
/// and a result for a round that is over changes nothing.
#[test]
fn a_gate_evaluation_names_its_scope_and_stale_results_are_ignored() {
    use flotilla_engine::checks::{Outcome, render};
    use flotilla_engine::engine::CheckSubject;
    use flotilla_engine::strategy::{StrategySpec, parse_strategy};
    let strategy: StrategySpec = serde_json::from_value(serde_json::json!({"stages": [{
        "name": "prod",
        "memberSelector": {"byLabel": "ring=prod"},
        "beforeGates": [{"type": "HealthCheck", "soakSeconds": 0, "intervalSeconds": 60, "checks": [{
            "name": "errors", "provider": "prom",
            "query": "max(errors{cluster=~\"{members}\"})", "condition": "< 0.1"}]}]}]}))
    .expect("wire shape");
    let mut spec = spec();
    spec.strategy = Some(parse_strategy(&strategy, "s", 1000).expect("valid"));
    let mut fleet = vec![
        member("a", "eastus"),
        member("b", "eastus"),
        member("c", "eastus"),
    ];
    for m in &mut fleet[..2] {
        m.labels.insert("ring".into(), "prod".into());
    }
    let (mut engine, _) = Engine::create(
        "r1",
        &spec,
        &fleet,
        catalog(&[("eastus", &["1.30.5", "1.31.1"])]),
    )
    .expect("created");
    let t0 = Time::from_unix(1_000_000);
    engine.handle(t0, Input::Start).expect("started");
    engine.settle(t0);
    let evaluation = std::iter::from_fn(|| engine.poll_command())
        .find_map(|c| match c {
            Command::Evaluate {
                subject,
                round,
                checks,
                context,
            } => Some((subject, round, checks, context)),
            _ => None,
        })
        .expect("the gate is evaluated when reached");
    let (subject, round, checks, context) = evaluation;
    assert!(matches!(subject, CheckSubject::Gate { .. }), "{subject:?}");
    assert_eq!(context.members, ["a", "b"]);
    let rendered = match &checks.checks[0].kind {
        flotilla_engine::checks::CheckKind::Prometheus { query, .. } => {
            render(query, &context, &|_| None)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(rendered, "max(errors{cluster=~\"a|b\"})");
    // The next round begins at the interval; an answer to the first one is stale then.
    let t1 = t0.plus(60);
    engine.advance_clock(t1);
    engine.settle(t1);
    let evaluated = |engine: &mut Engine, round: u64, value: f64| {
        engine
            .handle(
                t1,
                Input::CheckEvaluated {
                    subject: subject.clone(),
                    round,
                    check: "errors".into(),
                    outcome: Outcome::Samples(vec![value]),
                },
            )
            .expect("taken");
        engine.settle(t1);
    };
    evaluated(&mut engine, round, 0.0);
    assert_eq!(
        engine.status().stages[0].before_gates[0].status.state,
        State::Pending,
        "a stale round's pass completes nothing"
    );
    evaluated(&mut engine, round + 1, 0.0);
    assert_eq!(
        engine.status().stages[0].before_gates[0].status.state,
        State::Completed
    );
    // One at a time (an implicit group's concurrency).
    assert_eq!(started(&mut engine), ["a"]);
}

#[test]
fn a_failed_group_or_stage_cannot_be_skipped_and_the_refusal_says_what_to_do() {
    use flotilla_engine::engine::{SkipKind, SkipTarget};
    let fleet = [member("a", "eastus"), member("b", "eastus")];
    let (mut engine, _) = Engine::create(
        "r1",
        &spec(),
        &fleet,
        catalog(&[("eastus", &["1.30.5", "1.31.1"])]),
    )
    .expect("created");
    let t0 = Time::from_unix(1_000_000);
    engine.handle(t0, Input::Start).expect("starts");
    engine.settle(t0);
    let first = started(&mut engine);
    assert_eq!(first, vec!["a".to_string()]);
    let t1 = t0.plus(600);
    engine
        .handle(
            t1,
            Input::OperationFinished {
                member: "a".into(),
                attempt: 1,
                outcome: Err("drain timed out".into()),
            },
        )
        .expect("accepted");
    engine.settle(t1);
    let before = serde_json::to_string(&engine.status()).expect("serializes");
    for kind in [SkipKind::Group, SkipKind::Stage] {
        let err = engine
            .handle(
                t1.plus(86_400),
                Input::Skip(vec![SkipTarget {
                    kind,
                    name: "default".into(),
                }]),
            )
            .expect_err("a Failed scope is terminal");
        assert!(
            err.message.contains("is already Failed")
                && err.message.contains("start the run again")
                && err.message.contains("create a new run"),
            "{}",
            err.message
        );
    }
    engine.settle(t1.plus(86_400));
    assert_eq!(
        serde_json::to_string(&engine.status()).expect("serializes"),
        before,
        "a refused skip changes nothing"
    );
    engine
        .check_invariants(t1.plus(86_400))
        .expect("consistent");
}

/// A run stored with a check written before check providers (it carries its own URL) is read,
/// never evaluated, and never started or retried (SEMANTICS §10).
#[test]
fn a_run_holding_a_check_written_before_providers_is_not_started() {
    use flotilla_engine::strategy::{StrategySpec, parse_strategy};
    let strategy: StrategySpec = serde_json::from_value(serde_json::json!({"stages": [{
        "name": "prod",
        "groups": [{"name": "g", "memberHealthChecks": {"checks": [{
            "name": "probe", "type": "Http", "url": "http://169.254.169.254/latest"}]}}]}]}))
    .expect("wire shape");
    let mut spec = spec();
    spec.strategy = Some(parse_strategy(&strategy, "s", 1000).expect("read as stored"));
    let fleet = [member("a", "eastus")];
    let (mut engine, _) = Engine::create(
        "r1",
        &spec,
        &fleet,
        catalog(&[("eastus", &["1.30.5", "1.31.1"])]),
    )
    .expect("created (as a stored run is restored)");
    let t0 = Time::from_unix(1_000_000);
    let err = engine.handle(t0, Input::Start).expect_err("never started");
    assert_eq!(
        err.code,
        flotilla_engine::error::ErrorCode::Conflict,
        "{err:?}"
    );
    assert!(
        err.message.contains("check \"probe\" (it carries url)")
            && err.message.contains("provider"),
        "{}",
        err.message
    );
    engine.settle(t0);
    assert!(started(&mut engine).is_empty(), "nothing sent");
    assert_eq!(engine.status().status.state, State::NotStarted);
}
