//! An update run's PUT body, read as the server reads it (envelope, `properties.strategy` and
//! `properties.managedClusterUpdate` into their wire shapes, then validation), then the run
//! created over a small fixed fleet and simulated for three virtual days with every gate
//! approved. Never panics; errors name their field; the wire shapes survive a round trip; a
//! run the engine creates is also created by the simulator, and keeps every invariant.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

use flotilla_engine::engine::{Engine, RunSpec};
use flotilla_engine::error::from_json_value;
use flotilla_engine::strategy::{
    DEFAULT_STAGE_CONCURRENCY_LIMIT, ManagedClusterUpdateSpec, StrategySpec,
    parse_strategy, parse_upgrade,
};
use flotilla_fuzz::{RunProperties, check_error, fleet, properties, request_json};
use flotilla_sim::scenario::{Action, GateLocator, TimedAction};
use flotilla_sim::simulator::simulate_checking_invariants;

const STRATEGY: &str = "properties.strategy";
const UPDATE: &str = "properties.managedClusterUpdate";

fn round_trip<T>(spec: &T, root: &str) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let text = serde_json::to_string(spec).expect("a wire shape serializes");
    let stored: Value = serde_json::from_str(&text).expect("its JSON parses");
    let again: T = from_json_value(stored, root)
        .unwrap_or_else(|e| panic!("{text} does not read back: {e:?}"));
    assert_eq!(&again, spec, "changed in its round trip through {text}");
    again
}

fuzz_target!(|data: &[u8]| {
    let Some(value) = request_json(data) else {
        return;
    };
    let Some(props) = properties::<RunProperties>(value) else {
        return;
    };
    // A strategy by reference needs the store; only inline strategies are followed here.
    if props.update_strategy_id.is_some() {
        return;
    }
    let strategy_raw = props.strategy;
    let strategy_spec = match strategy_raw
        .clone()
        .map(|s| from_json_value::<StrategySpec>(s, STRATEGY))
        .transpose()
    {
        Ok(s) => s,
        Err(e) => return check_error(&e, STRATEGY),
    };
    let Some(update_raw) = props.managed_cluster_update else {
        return;
    };
    let update_spec: ManagedClusterUpdateSpec = match from_json_value(update_raw.clone(), UPDATE) {
        Ok(u) => u,
        Err(e) => return check_error(&e, UPDATE),
    };
    let strategy = match strategy_spec
        .as_ref()
        .map(|s| parse_strategy(s, STRATEGY, DEFAULT_STAGE_CONCURRENCY_LIMIT))
        .transpose()
    {
        Ok(s) => s,
        Err(e) => return check_error(&e, STRATEGY),
    };
    let upgrade = parse_upgrade(&update_spec, UPDATE);
    if let Some(s) = &strategy_spec {
        round_trip(s, STRATEGY);
    }
    let again = round_trip(&update_spec, UPDATE);
    assert_eq!(parse_upgrade(&again, UPDATE), upgrade);
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(e) => return check_error(&e, UPDATE),
    };

    let base = fleet();
    let spec = RunSpec {
        strategy: strategy.clone(),
        upgrade,
        rules: Default::default(),
    };
    let created = Engine::create("fuzz", &spec, &base.members, base.catalog.clone());
    let engine_ok = match &created {
        Ok((engine, warnings)) => {
            engine
                .check_invariants(base.start)
                .unwrap_or_else(|v| panic!("a new run breaks an invariant: {v}"));
            serde_json::to_string(&engine.status()).expect("a status serializes");
            for w in warnings {
                assert!(!w.is_empty());
            }
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    };

    // The same body through the simulator: started, every Approval gate approved each hour,
    // stopped and started again for some inputs.
    let mut scenario = base.clone();
    scenario.strategy = strategy_raw;
    scenario.update = Some(update_raw);
    let start = scenario.start;
    let mut actions = vec![TimedAction {
        at: start,
        action: Action::Start,
        label: "start".into(),
        run: None,
    }];
    // Every Approval gate of the run, as the engine lists them.
    let gates: Vec<GateLocator> = created
        .as_ref()
        .map(|(engine, _)| {
            engine
                .gate_views()
                .into_iter()
                .filter(|g| g.gate_type == "Approval")
                .map(|g| GateLocator {
                    stage: g.stage,
                    group: g.group,
                    timing: format!("{:?}", g.timing),
                })
                .collect()
        })
        .unwrap_or_default();
    for hour in 1..=12 {
        for gate in gates.iter().take(16) {
            actions.push(TimedAction {
                at: start.plus(hour * 3600),
                action: Action::Approve(gate.clone()),
                label: "approve".into(),
                run: None,
            });
        }
    }
    if data.len().is_multiple_of(3) {
        actions.push(TimedAction {
            at: start.plus(1200),
            action: Action::Stop,
            label: "stop".into(),
            run: None,
        });
        actions.push(TimedAction {
            at: start.plus(3000),
            action: Action::Start,
            label: "start".into(),
            run: None,
        });
    }
    actions.sort_by_key(|a| a.at);
    scenario.actions = actions;
    let result = simulate_checking_invariants(&scenario)
        .unwrap_or_else(|v| panic!("the simulated run breaks an invariant: {v}"));
    assert_eq!(
        result.create_error.is_none(),
        engine_ok,
        "the engine and the simulator disagree on creating the run: {:?} / {:?}",
        created.as_ref().err(),
        result.create_error
    );
    serde_json::to_string(&result).expect("a result serializes");
});
