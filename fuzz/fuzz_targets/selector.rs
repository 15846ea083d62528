//! Label selectors (`memberSelector.byLabel`), as a string or as the `memberSelector` JSON:
//! parsing never panics, errors point inside the text, and a parsed selector written back in a
//! canonical form parses to the same requirements and matches the same label sets, which are
//! the ones SEMANTICS §2 gives for each operator.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

use flotilla_engine::selector::{
    MAX_SELECTOR_LENGTH, Requirement, Selector, validate_label_key, validate_label_value,
};
use flotilla_engine::strategy::MemberSelectorSpec;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn canonical(requirements: &[Requirement]) -> String {
    requirements
        .iter()
        .map(|r| match r {
            Requirement::Equals(k, v) => format!("{k}={v}"),
            Requirement::NotEquals(k, v) => format!("{k}!={v}"),
            Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
            Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(", ")),
            Requirement::Exists(k) => k.clone(),
            Requirement::NotExists(k) => format!("!{k}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// SEMANTICS §2, written out again.
fn holds(r: &Requirement, l: &BTreeMap<String, String>) -> bool {
    match r {
        Requirement::Equals(k, v) => l.get(k) == Some(v),
        Requirement::NotEquals(k, v) => l.get(k) != Some(v),
        Requirement::In(k, vs) => l.get(k).is_some_and(|x| vs.contains(x)),
        Requirement::NotIn(k, vs) => !l.get(k).is_some_and(|x| vs.contains(x)),
        Requirement::Exists(k) => l.contains_key(k),
        Requirement::NotExists(k) => !l.contains_key(k),
    }
}

fn key_of(r: &Requirement) -> &str {
    match r {
        Requirement::Equals(k, _)
        | Requirement::NotEquals(k, _)
        | Requirement::In(k, _)
        | Requirement::NotIn(k, _)
        | Requirement::Exists(k)
        | Requirement::NotExists(k) => k,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let text = match serde_json::from_str::<MemberSelectorSpec>(input) {
        Ok(MemberSelectorSpec { by_label: Some(t) }) => t,
        Ok(_) => return,
        Err(_) => input.to_string(),
    };
    let _ = validate_label_key(&text);
    let _ = validate_label_value(&text);
    let selector = match Selector::parse(&text) {
        Ok(s) => s,
        Err(e) => {
            assert!(
                e.position <= text.len().max(MAX_SELECTOR_LENGTH),
                "{e:?} in {text:?}"
            );
            assert!(!e.problem.is_empty());
            let _ = e.to_string();
            return;
        }
    };
    assert!(text.len() <= MAX_SELECTOR_LENGTH);
    assert_eq!(selector.as_str(), text);
    let requirements = selector.requirements();
    assert!(!requirements.is_empty());
    for r in requirements {
        validate_label_key(key_of(r)).unwrap_or_else(|e| panic!("{r:?} from {text:?}: {e}"));
        match r {
            Requirement::Equals(_, v) | Requirement::NotEquals(_, v) => {
                validate_label_value(v).unwrap_or_else(|e| panic!("{r:?}: {e}"))
            }
            Requirement::In(_, vs) | Requirement::NotIn(_, vs) => {
                assert!(!vs.is_empty());
                for v in vs {
                    assert!(!v.is_empty());
                    validate_label_value(v).unwrap_or_else(|e| panic!("{r:?}: {e}"));
                }
            }
            _ => {}
        }
    }
    let written = canonical(requirements);
    if written.len() <= MAX_SELECTOR_LENGTH {
        let again = Selector::parse(&written)
            .unwrap_or_else(|e| panic!("{text:?} written as {written:?} does not parse: {e}"));
        assert_eq!(
            again.requirements(),
            requirements,
            "{text:?} written as {written:?}"
        );
    }
    // Fixed label sets, and two made from the selector itself: one satisfying each positive
    // requirement, one holding each key with a value no requirement names.
    let mut sets = vec![
        labels(&[]),
        labels(&[("env", "prod"), ("geo", "east")]),
        labels(&[("env", "dev"), ("ring", "0")]),
        labels(&[
            ("fleet.example.com/tier", "web"),
            ("env", "canary"),
            ("ring", "1"),
        ]),
    ];
    let mut positive = BTreeMap::new();
    let mut other = BTreeMap::new();
    for r in requirements {
        match r {
            Requirement::Equals(k, v) => {
                positive.insert(k.clone(), v.clone());
            }
            Requirement::In(k, vs) => {
                positive.insert(k.clone(), vs[0].clone());
            }
            Requirement::Exists(k) => {
                positive.entry(k.clone()).or_insert_with(|| "x".to_string());
            }
            _ => {}
        }
        other.insert(key_of(r).to_string(), "zz-not-named".to_string());
    }
    sets.push(positive);
    sets.push(other);
    for l in &sets {
        let want = requirements.iter().all(|r| holds(r, l));
        assert_eq!(selector.matches(l), want, "{text:?} on {l:?}");
    }
});
