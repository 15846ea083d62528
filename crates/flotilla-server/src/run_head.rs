//! What the server reads of a stored run without building its document: the run's state, its
//! failure count and its gates. serde reads past the members (the bulk of a large run)
//! without allocating them.

use serde::Deserialize;

/// A stored run, as far as its state and gates.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct RunHead {
    properties: Properties,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Properties {
    status: Status,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Status {
    status: StateHead,
    failure_count: f64,
    stages: Vec<StageHead>,
}

/// A `status` object: a state and when it started and ended.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct StateHead {
    pub state: Option<String>,
    pub start_time: Option<String>,
    pub completed_time: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct StageHead {
    before_gates: Vec<GateHead>,
    after_gates: Vec<GateHead>,
    groups: Vec<GroupHead>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct GroupHead {
    before_gates: Vec<GateHead>,
    after_gates: Vec<GateHead>,
}

/// A gate of a run's status.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct GateHead {
    pub status: StateHead,
}

impl RunHead {
    /// Reads a stored run's text; what cannot be read is left at its default.
    pub fn parse(text: &str) -> RunHead {
        serde_json::from_str(text).unwrap_or_default()
    }

    /// The run's state (`NotStarted` when it has none yet).
    pub fn state(&self) -> &str {
        self.properties
            .status
            .status
            .state
            .as_deref()
            .unwrap_or("NotStarted")
    }

    /// The run is over: nothing of it is left to drive.
    pub fn is_over(&self) -> bool {
        match self.state() {
            "Completed" | "Skipped" => true,
            "Failed" => self.properties.status.status.completed_time.is_some(),
            _ => false,
        }
    }

    pub fn failure_count(&self) -> f64 {
        self.properties.status.failure_count
    }

    /// Every gate of the run: each stage's, then its groups'.
    pub fn gates(&self) -> impl Iterator<Item = &GateHead> {
        self.properties.status.stages.iter().flat_map(|stage| {
            stage.before_gates.iter().chain(&stage.after_gates).chain(
                stage
                    .groups
                    .iter()
                    .flat_map(|g| g.before_gates.iter().chain(&g.after_gates)),
            )
        })
    }
}
