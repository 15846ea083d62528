//! Scenario files (`tests/conformance/FORMAT.md`): YAML or JSON text parsed into a scenario
//! and, when it is small, simulated with the engine's invariants recounted after every
//! instant, then checked against its expectations and rendered. Never panics; a simulation
//! never breaks an invariant.

#![no_main]

use libfuzzer_sys::fuzz_target;

use flotilla_sim::Scenario;
use flotilla_sim::simulator::simulate_checking_invariants;

/// Bounds on what is simulated: a scenario this size runs in well under a millisecond.
const MAX_MEMBERS: usize = 24;
const MAX_ACTIONS: usize = 48;
const MAX_RELEASES: usize = 12;
const MAX_PROFILES: usize = 4;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let scenario = match Scenario::parse("fuzz", text) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.0.is_empty());
            return;
        }
    };
    if scenario.members.len() > MAX_MEMBERS
        || scenario.actions.len() > MAX_ACTIONS
        || scenario.releases.len() > MAX_RELEASES
        || scenario.profiles.len() > MAX_PROFILES
    {
        return;
    }
    let result = simulate_checking_invariants(&scenario)
        .unwrap_or_else(|v| panic!("the simulation breaks an invariant: {v}"));
    let document = serde_json::to_value(&result).expect("a result serializes");
    if let Some(expect) = &scenario.expect {
        let _ = flotilla_sim::check::check(expect, &document);
    }
    let _ = flotilla_sim::render::report(&scenario.description, &result);
});
