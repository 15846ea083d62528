//! Shared pieces of the fuzz targets: request bodies read as the server reads them (through
//! `flotilla_engine::body`), the checks every validation error must pass, and the fixed fleet
//! `run_body` creates runs over.

use std::sync::OnceLock;

use serde_json::Value;

use flotilla_engine::error::{ApiError, ErrorCode};
use flotilla_sim::Scenario;

pub use flotilla_engine::body::{RunProperties, StrategyProperties};

/// A request body as the server reads it: an empty body is `{}`, anything else must be JSON
/// with no key given twice in one object (`flotilla_engine::body::strict_json`, the server's
/// own reader).
pub fn request_json(data: &[u8]) -> Option<Value> {
    if data.is_empty() {
        return Some(Value::Object(Default::default()));
    }
    flotilla_engine::body::strict_json(data).ok()
}

/// The `properties` of a body: read through the server's envelope when the body has
/// `properties`, otherwise the body is taken as the properties themselves (so a corpus may hold
/// either).
pub fn properties<P: serde::de::DeserializeOwned>(value: Value) -> Option<P> {
    let read = if value.get("properties").is_some() {
        flotilla_engine::body::properties::<P>(value)
    } else {
        flotilla_engine::error::from_json_value::<P>(value, "properties")
    };
    match read {
        Ok(p) => Some(p),
        Err(e) => {
            check_error(&e, "");
            None
        }
    }
}

/// What every validation error must be: a 400 naming a field under `root`, with a message.
pub fn check_error(e: &ApiError, root: &str) {
    assert!(!e.message.is_empty(), "an error without a message: {e:?}");
    assert_eq!(
        e.code.http_status(),
        400,
        "a validation error that is not a 400: {e:?}"
    );
    assert_ne!(e.code, ErrorCode::Conflict, "{e:?}");
    if !root.is_empty() {
        assert!(
            e.target == root
                || e.target.starts_with(&format!("{root}."))
                || e.target.starts_with(&format!("{root}[")),
            "the error's target {:?} is not under {root:?}: {e:?}",
            e.target
        );
    }
    let _ = e.to_string();
    let _ = serde_json::to_string(e).expect("an error serializes");
}

/// The fixed fleet and catalog `run_body` creates its runs over: three regions (one of them
/// not in the catalog), groups and labels the corpus' strategies name, a maintenance window,
/// a member ahead of the target, one that fails.
const FLEET: &str = r#"
start: 2026-03-02T00:00:00Z
until: 3d
catalog:
  eastus:
    kubernetes:
      - {version: "1.29.9"}
      - {version: "1.30.5"}
      - {version: "1.31.1", lts: true}
      - {version: "1.32.0", preview: true}
    nodeImages:
      AKSUbuntu-2204gen2containerd:
        - {version: "202602.10.0"}
        - {version: "202603.01.0"}
      AKSWindows-2022-containerd:
        - {version: "20348.2026.02"}
  westus:
    kubernetes:
      - {version: "1.30.5"}
      - {version: "1.31.1", availableAt: "2026-03-02T06:00:00Z"}
    nodeImages:
      AKSUbuntu-2204gen2containerd:
        - {version: "202602.10.0"}
        - {version: "202603.01.0", availableAt: "2026-03-02T12:00:00Z"}
members:
  - {name: canary-1, group: canary, region: eastus, kubernetesVersion: "1.30.5", labels: {env: canary, ring: "0", geo: us}}
  - {name: east-1, group: prod-east, region: eastus, kubernetesVersion: "1.30.5", labels: {env: prod, ring: "1", geo: us}, sim: {durationSeconds: 1200}}
  - {name: east-2, group: prod-east, region: eastus, kubernetesVersion: "1.31.1", labels: {env: prod, ring: "1", geo: us, fleet.example.com/tier: web}}
  - name: west-1
    group: prod-west
    region: westus
    kubernetesVersion: "1.30.5"
    labels: {env: prod, ring: "2", geo: eu}
    maintenance:
      kubernetes: {schedule: {daily: {intervalDays: 1}}, durationHours: 4, startTime: "02:00", utcOffset: "+01:00"}
      nodeOS: {schedule: {weekly: {intervalWeeks: 1, dayOfWeek: Tuesday}}, durationHours: 6, startTime: "22:00"}
  - {name: west-2, group: prod-west, region: westus, kubernetesVersion: "1.29.9", labels: {env: prod, ring: "2"}, sim: {outcome: fail, failAttempts: 1}}
  - {name: g0-1, group: g0, region: eastus, kubernetesVersion: "1.32.0", labels: {ring: "0", grp: g0}}
  - name: win-1
    group: g1
    region: eastus
    kubernetesVersion: "1.30.5"
    labels: {ring: "1", grp: g1, os: windows}
    nodePools:
      - {name: sys, family: AKSUbuntu-2204gen2containerd, os: Linux, nodeImageVersion: "202602.10.0"}
      - {name: win, family: AKSWindows-2022-containerd, os: Windows, nodeImageVersion: "20348.2026.02"}
  - {name: asia-1, group: g2, region: southeastasia, kubernetesVersion: "1.30.5", labels: {ring: "3", grp: g2}}
update:
  upgrade: {type: ControlPlaneOnly, kubernetesVersion: "1.31.1"}
"#;

/// The fixed fleet as a parsed scenario (its `update` is replaced by each input's).
pub fn fleet() -> &'static Scenario {
    static FLEET_SCENARIO: OnceLock<Scenario> = OnceLock::new();
    FLEET_SCENARIO.get_or_init(|| Scenario::parse("fuzz", FLEET).expect("the fixed fleet parses"))
}

/// Splits fuzz input text into up to `n` parts at newlines; text without a newline is split
/// into two halves at a character boundary.
pub fn parts(text: &str, n: usize) -> Vec<&str> {
    if text.contains('\n') {
        return text.splitn(n, '\n').collect();
    }
    let mut mid = text.len() / 2;
    while !text.is_char_boundary(mid) {
        mid += 1;
    }
    let (a, b) = text.split_at(mid);
    vec![a, b]
}
