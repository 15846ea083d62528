//! An update strategy's PUT body, read as the server reads it (envelope, `properties.strategy`
//! into the wire shape, then validation with field paths). Never panics; every error names a
//! field under `properties.strategy`; a strategy read back from its stored form (what a run
//! made from `updateStrategyId` does) is the same strategy with the same validation outcome.

#![no_main]

use libfuzzer_sys::fuzz_target;

use flotilla_engine::error::from_json_value;
use flotilla_engine::strategy::{DEFAULT_STAGE_CONCURRENCY_LIMIT, StrategySpec, parse_strategy};
use flotilla_fuzz::{StrategyProperties, check_error, properties, request_json};

const ROOT: &str = "properties.strategy";

fuzz_target!(|data: &[u8]| {
    let Some(value) = request_json(data) else {
        return;
    };
    // A whole request body, or a strategy alone (`examples/fleet-stages.json`).
    let raw = if value.get("properties").is_some() {
        match properties::<StrategyProperties>(value).and_then(|p| p.strategy) {
            Some(raw) => raw,
            None => return,
        }
    } else {
        value
    };
    let spec: StrategySpec = match from_json_value(raw, ROOT) {
        Ok(spec) => spec,
        Err(e) => {
            check_error(&e, ROOT);
            return;
        }
    };
    let outcome = parse_strategy(&spec, ROOT, DEFAULT_STAGE_CONCURRENCY_LIMIT);
    if let Err(e) = &outcome {
        check_error(e, ROOT);
    }
    // Stored (the server stores the wire shape it read) and read back.
    let text = serde_json::to_string(&spec).expect("a strategy spec serializes");
    let stored: serde_json::Value = serde_json::from_str(&text).expect("its JSON parses");
    let again: StrategySpec = from_json_value(stored, ROOT)
        .unwrap_or_else(|e| panic!("the stored strategy {text} does not read back: {e:?}"));
    assert_eq!(
        again, spec,
        "the strategy changed in its round trip through {text}"
    );
    assert_eq!(
        parse_strategy(&again, ROOT, DEFAULT_STAGE_CONCURRENCY_LIMIT),
        outcome,
        "validation changed after the round trip through {text}"
    );
    // A lower server limit only ever refuses more.
    if outcome.is_err() {
        assert!(parse_strategy(&spec, ROOT, 1).is_err());
    }
});
