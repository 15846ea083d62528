//! What the server reads of a stored run without building its document: the run's state, its
//! failure count and its gates. serde reads past the members (the bulk of a large run)
//! without allocating them.

use serde::{Deserialize, Serialize};

/// A stored run, as far as its state and gates.
#[derive(Deserialize, Serialize, Default)]
#[serde(default)]
pub struct RunHead {
    properties: Properties,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(default)]
struct Properties {
    status: Status,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Status {
    status: StateHead,
    failure_count: f64,
    stages: Vec<StageHead>,
}

/// A `status` object: a state and when it started and ended.
#[derive(Deserialize, Serialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct StateHead {
    pub state: Option<String>,
    pub start_time: Option<String>,
    pub completed_time: Option<String>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct StageHead {
    before_gates: Vec<GateHead>,
    after_gates: Vec<GateHead>,
    groups: Vec<GroupHead>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct GroupHead {
    before_gates: Vec<GateHead>,
    after_gates: Vec<GateHead>,
}

/// A gate of a run's status.
#[derive(Deserialize, Serialize, Default)]
#[serde(default)]
pub struct GateHead {
    pub status: StateHead,
}

impl RunHead {
    /// Reads a stored run's text; what cannot be read is left at its default.
    pub fn parse(text: &str) -> RunHead {
        serde_json::from_str(text).unwrap_or_default()
    }

    /// The head as text, to store beside the run.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
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

    /// The run can still move: it is not Completed or Skipped (a Failed run can be retried).
    /// Whatever it should hear of, it hears of now; a finished run holds nothing it could act on.
    pub fn may_move_again(&self) -> bool {
        !matches!(self.state(), "Completed" | "Skipped")
    }

    /// The run moves, or has members in flight: a delete of it, or of its fleet, waits for a
    /// stop (a Failed run is active until its last member in flight ends).
    pub fn is_active(&self) -> bool {
        match self.state() {
            "Running" | "Pending" | "Stopping" => true,
            "Failed" => self.properties.status.status.completed_time.is_none(),
            _ => false,
        }
    }

    /// The run's own status: its state and when it started and ended.
    pub fn status(&self) -> &StateHead {
        &self.properties.status.status
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

/// A run's head as stored beside it: its state, failure count and the gates waiting (the only
/// gates `/metrics` reports), in the shape of a run's document, so [`RunHead::parse`] reads a
/// head and a whole document alike.
pub fn head_of(status: &flotilla_engine::status::UpdateRunStatus) -> String {
    use flotilla_engine::status::State;
    let waiting: Vec<_> = status
        .stages
        .iter()
        .flat_map(|stage| {
            stage.before_gates.iter().chain(&stage.after_gates).chain(
                stage
                    .groups
                    .iter()
                    .flat_map(|g| g.before_gates.iter().chain(&g.after_gates)),
            )
        })
        .filter(|g| g.status.state == State::Pending)
        .collect();
    serde_json::json!({"properties": {"status": {
        "status": status.status,
        "failureCount": status.failure_count,
        "stages": [{"beforeGates": waiting}],
    }}})
    .to_string()
}

/// The head of every run of a fleet, by name: the stored head, or for a run without one (stored
/// before heads, or its head lost to a crash right after its creation) its document, read once
/// and its head written back.
pub async fn heads(
    store: &dyn flotilla_store::Store,
    fleet: &str,
) -> flotilla_store::StoreResult<Vec<(String, RunHead)>> {
    let mut heads = Vec::new();
    for (name, head) in store.run_heads(fleet).await? {
        let head = match head {
            Some(head) => RunHead::parse(&head),
            None => {
                let Some((text, _)) = store
                    .get_raw(fleet, flotilla_store::Kind::Run, &name)
                    .await?
                else {
                    continue;
                };
                let head = RunHead::parse(&text);
                store.init_run_head(fleet, &name, &head.to_text()).await?;
                head
            }
        };
        heads.push((name, head));
    }
    Ok(heads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_store::prelude::*;
    use flotilla_store::{Kind, Precondition};
    use serde_json::json;

    /// A run's document as the server stores it: waiting on a before-gate of its second stage,
    /// with an earlier gate done and one failure.
    fn document() -> serde_json::Value {
        let gate = |state: &str, start: Option<&str>| {
            let mut status = json!({"state": state});
            if let Some(start) = start {
                status["startTime"] = json!(start);
            }
            json!({"gateId": format!("g-{state}"), "status": status})
        };
        let group = json!({"name": "g", "status": {"state": "NotStarted"}, "failureCount": 0,
            "maxAllowedFailures": 0, "maxConcurrency": 1, "members": [],
            "afterGates": [gate("Completed", Some("2026-12-01T00:00:00Z"))]});
        json!({"name": "r", "properties": {"status": {
        "status": {"state": "Running", "startTime": "2026-12-01T00:00:00Z"},
        "failureCount": 1,
        "stages": [
            {"name": "a", "status": {"state": "Completed"}, "groups": [group],
             "failureCount": 1, "maxAllowedFailures": 1, "maxConcurrency": 1},
            {"name": "b", "status": {"state": "NotStarted"}, "groups": [],
             "failureCount": 0, "maxAllowedFailures": 0, "maxConcurrency": 1,
             "beforeGates": [gate("Pending", Some("2026-12-01T01:00:00Z"))]}
        ]}}})
    }

    /// A gate waiting: its state and since when.
    type Waiting = (Option<String>, Option<String>);

    fn seen(head: &RunHead) -> (String, bool, f64, Vec<Waiting>) {
        let waiting = head
            .gates()
            .filter(|g| g.status.state.as_deref() == Some("Pending"))
            .map(|g| (g.status.state.clone(), g.status.start_time.clone()))
            .collect();
        (
            head.state().to_string(),
            head.is_over(),
            head.failure_count(),
            waiting,
        )
    }

    #[test]
    fn a_head_reads_as_its_document_does() {
        let document = document();
        let status: flotilla_engine::status::UpdateRunStatus =
            serde_json::from_value(document["properties"]["status"].clone()).expect("a status");
        let whole = RunHead::parse(&document.to_string());
        let head = head_of(&status);
        assert!(head.len() < 400, "{head}");
        let from_head = RunHead::parse(&head);
        assert_eq!(seen(&from_head), seen(&whole));
        assert_eq!(
            seen(&whole).3,
            vec![(Some("Pending".into()), Some("2026-12-01T01:00:00Z".into()))]
        );
        assert_eq!(seen(&RunHead::parse(&whole.to_text())), seen(&whole));
    }

    /// A run stored without a head (before heads existed) is read from its document once, and
    /// its head written; a head there is what is read after.
    #[tokio::test]
    async fn runs_without_a_head_are_read_once_from_their_document() {
        let dir = std::env::temp_dir().join(format!("flotilla-heads-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let store = flotilla_store::sqlite::SqliteStore::open(&dir.join("f.db"))
            .await
            .expect("store");
        store
            .put("f", Kind::Run, "r", &document(), &Precondition::None)
            .await
            .expect("put");
        assert_eq!(store.run_heads("f").await.expect("heads")[0].1, None);
        let heads = heads(&store, "f").await.expect("heads");
        assert_eq!(heads.len(), 1);
        assert_eq!(
            seen(&heads[0].1),
            seen(&RunHead::parse(&document().to_string()))
        );
        let stored = store.run_heads("f").await.expect("heads")[0].1.clone();
        let stored = stored.expect("the head was written back");
        assert!(stored.len() < document().to_string().len());
        // The stored head is what is read now, not the document.
        store
            .write_run_batch(&flotilla_store::RunBatch {
                fleet: "f".into(),
                run: "r".into(),
                run_head: Some(
                    r#"{"properties":{"status":{"status":{"state":"Stopped"}}}}"#.into(),
                ),
                ..Default::default()
            })
            .await
            .expect("batch");
        let heads = super::heads(&store, "f").await.expect("heads");
        assert_eq!(heads[0].1.state(), "Stopped");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
