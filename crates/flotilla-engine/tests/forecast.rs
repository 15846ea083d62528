//! Forecasts (SEMANTICS §11) say what they assume: what each stage's start waits for (only what
//! actually holds it), how pending gates are taken, and that no predicted time is before now
//! (an upgrade running longer than expected is overdue, predicted to end now).

mod common;

use common::{catalog, control_plane, member_at};

use flotilla_engine::engine::{Command, Input};
use flotilla_engine::fleet::Member;
use flotilla_engine::fleet_engine::{FleetCommand, FleetEngine, FleetInput};
use flotilla_engine::forecast::{Forecast, ForecastParams, HoldKind, forecast};
use flotilla_engine::status::State;
use flotilla_engine::strategy::{StrategySpec, parse_strategy};
use flotilla_engine::time::Time;
use serde_json::json;

const RUN: &str = "r";
/// Every upgrade takes this long in the forecasts here.
const DURATION: i64 = 100;

/// Two canary members and two production members; a canary stage with a 600 s wait after it,
/// then a production stage behind an Approval gate.
fn fleet() -> FleetEngine {
    let member = |name: &str, group: &str| Member {
        group: Some(group.into()),
        ..member_at(name, "eastus", "1.30.5")
    };
    let members = [
        member("c1", "canary"),
        member("c2", "canary"),
        member("p1", "prod"),
        member("p2", "prod"),
    ];
    let mut fleet = FleetEngine::new(&members, catalog(&[("eastus", &["1.30.5", "1.31.1"])]));
    let strategy: StrategySpec = serde_json::from_value(json!({"stages": [
        {"name": "canary", "groups": [{"name": "canary", "maxConcurrency": "2"}], "afterStageWaitInSeconds": 600},
        {"name": "production", "groups": [{"name": "prod", "maxConcurrency": "2"}],
         "beforeGates": [{"type": "Approval", "displayName": "go to production"}]},
    ]}))
    .expect("a strategy");
    let mut spec = control_plane("1.31.1");
    spec.strategy = Some(parse_strategy(&strategy, "strategy", 50).expect("valid"));
    fleet
        .create_run(RUN, &spec, Default::default())
        .expect("created");
    fleet
}

fn input(fleet: &mut FleetEngine, now: Time, input: Input) {
    fleet
        .handle(
            now,
            FleetInput::Run {
                run: RUN.into(),
                input,
            },
        )
        .expect("taken");
}

/// Settles and accepts every upgrade started; returns (member, attempt) of each.
fn settle(fleet: &mut FleetEngine, now: Time) -> Vec<(String, u64)> {
    fleet.settle(now);
    let mut started = Vec::new();
    while let Some(FleetCommand { command, .. }) = fleet.poll_command() {
        if let Command::StartUpgrade {
            member, attempt, ..
        } = command
        {
            started.push((member, attempt));
        }
    }
    for (member, attempt) in &started {
        let accepted = Input::OperationAccepted {
            member: member.clone(),
            attempt: *attempt,
            operation_id: format!("op-{member}"),
        };
        input(fleet, now, accepted);
    }
    fleet.settle(now);
    started
}

fn forecast_at(fleet: &FleetEngine, now: Time, params: &ForecastParams) -> Forecast {
    forecast(fleet, RUN, now, params, &|_, _| DURATION).expect("a forecast")
}

#[test]
fn a_stage_behind_a_running_stage_its_wait_and_a_gate_says_so_and_the_forecast_is_honest_about_approvals()
 {
    let mut fleet = fleet();
    let t0 = Time::from_unix(1_800_000_000);
    input(&mut fleet, t0, Input::Start);
    let started = settle(&mut fleet, t0);
    assert_eq!(started.len(), 2, "both canary members start: {started:?}");

    // Midway through the canary stage: production waits for the canary stage, its wait and
    // the Approval gate (not reached yet); nothing else.
    let now = t0.plus(40);
    let params = ForecastParams::default();
    let f = forecast_at(&fleet, now, &params);
    let holds = &f.stage_holds["production"];
    let kinds: Vec<HoldKind> = holds.iter().map(|h| h.kind).collect();
    assert_eq!(
        kinds,
        [HoldKind::Stage, HoldKind::Wait, HoldKind::Approval],
        "{holds:?}"
    );
    let canary_end = t0.plus(DURATION);
    assert_eq!(holds[0].stage.as_deref(), Some("canary"));
    assert_eq!(holds[0].until, Some(canary_end));
    assert_eq!(holds[1].until, Some(canary_end.plus(600)));
    assert_eq!(holds[2].state, Some(State::NotStarted));
    assert_eq!(holds[2].display_name.as_deref(), Some("go to production"));
    // Approved the moment it is reached: at the wait's end.
    assert_eq!(holds[2].until, Some(canary_end.plus(600)));
    assert!(f.stage_holds["canary"].is_empty(), "{:?}", f.stage_holds);
    assert!(f.pending_gates.is_empty(), "no gate is pending yet");
    assert!(f.overdue.is_empty());
    let doc = f.to_json(&params, json!({}));
    assert_eq!(doc["assumptions"]["approvals"], "IfApprovedNow");
    assert_eq!(doc["stages"][1]["waitsFor"][0]["kind"], "Stage");
    assert_eq!(
        doc["stages"][1]["waitsFor"][2]["gateId"],
        json!(holds[2].gate_id)
    );
    assert_eq!(
        doc["stages"][1]["waitsFor"][2]["until"],
        json!(canary_end.plus(600))
    );
    assert_eq!(doc["stages"][0]["groups"][0]["waitsFor"], json!([]));

    // The canary members finish; the wait runs out; the gate is pending.
    for (member, attempt) in started {
        let finished = Input::OperationFinished {
            member,
            attempt,
            outcome: Ok(()),
        };
        input(&mut fleet, canary_end, finished);
    }
    settle(&mut fleet, canary_end);
    let later = canary_end.plus(600);
    fleet.advance_clock(later);
    settle(&mut fleet, later);
    let now = later.plus(300);
    fleet.advance_clock(now);
    settle(&mut fleet, now);

    // With the gate pending, production waits for it alone, approved now by assumption.
    let f = forecast_at(&fleet, now, &params);
    let holds = &f.stage_holds["production"];
    assert_eq!(holds.len(), 1, "only the gate holds production: {holds:?}");
    assert_eq!(holds[0].kind, HoldKind::Approval);
    assert_eq!(holds[0].state, Some(State::Pending));
    assert_eq!(holds[0].until, Some(now));
    assert_eq!(f.pending_gates.len(), 1);
    assert_eq!(f.pending_gates[0].assumed, "ApprovedNow");
    assert_eq!(
        f.pending_gates[0].gate_id,
        holds[0].gate_id.clone().unwrap()
    );
    assert_eq!(f.completed, Some(now.plus(DURATION)));

    // With a delay, the assumption says so and the gate ends after it.
    let delayed = ForecastParams {
        approval_delay_seconds: 3600,
        ..params
    };
    let f = forecast_at(&fleet, now, &delayed);
    assert_eq!(f.pending_gates[0].assumed, "ApprovedAfterDelay");
    assert_eq!(f.stage_holds["production"][0].until, Some(now.plus(3600)));
    let doc = f.to_json(&delayed, json!({}));
    assert_eq!(doc["assumptions"]["approvals"], "IfApprovedAfterDelay");
    assert_eq!(
        doc["assumptions"]["pendingGates"][0]["type"],
        json!("Approval")
    );
}

#[test]
fn an_upgrade_running_past_its_expected_duration_is_overdue_and_predicted_now_not_in_the_past() {
    let mut fleet = fleet();
    let t0 = Time::from_unix(1_800_000_000);
    input(&mut fleet, t0, Input::Start);
    settle(&mut fleet, t0);
    // Expected to take 100 s; 250 s on, both canary members are still upgrading.
    let now = t0.plus(250);
    fleet.advance_clock(now);
    let params = ForecastParams::default();
    let f = forecast_at(&fleet, now, &params);
    assert_eq!(
        f.overdue.iter().map(String::as_str).collect::<Vec<_>>(),
        ["c1", "c2"]
    );
    let doc = f.to_json(&params, json!({}));
    for m in doc["stages"][0]["groups"][0]["members"].as_array().unwrap() {
        assert_eq!(m["overdue"], true, "{m}");
        assert_eq!(m["completedTime"], json!(now), "never before now: {m}");
    }
    for m in doc["stages"][1]["groups"][0]["members"].as_array().unwrap() {
        assert!(m.get("overdue").is_none(), "{m}");
    }
    // Nothing predicted lies before now: every stage's end is now or later.
    for stage in &f.status.stages {
        let end = stage.status.completed_time.expect("each stage ends");
        assert!(end >= now, "{}: {end} before {now}", stage.name);
    }
    // The production stage starts after the wait, once its gate is approved (assumed at once).
    assert_eq!(
        f.stage_holds["production"]
            .iter()
            .map(|h| h.until)
            .collect::<Vec<_>>(),
        [Some(now), Some(now.plus(600)), Some(now.plus(600))]
    );
}
