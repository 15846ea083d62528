//! The findings of a security and quality review (issue #36), each tested as its report
//! describes it, over real HTTP on loopback against the real router and a real SQLite file:
//! a fleet's driver changed by a PUT reaching its runs at once, a failing profile trigger
//! written once, error messages that name fields and values as the user wrote them, repeats
//! within one import, the bound of `afterStageWaitInSeconds`, and gates filtered by any state.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Harness, cluster, sim_fleet};

/// What these tests ask of the API's harness besides its own calls: an `If-Match`, the answer
/// without its headers, a wait on any resource, and a refusal's message.
impl Harness {
    /// A call with an `If-Match`, answered without its headers.
    async fn send(
        &self,
        who: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
        if_match: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = self.tokens.get(who) {
            request = request.bearer_auth(token);
        }
        if let Some(etag) = if_match {
            request = request.header("If-Match", etag);
        }
        if let Some(b) = body {
            request = request.json(&b);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A call answered without its headers.
    async fn answer(
        &self,
        who: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.send(who, method, path, body, None).await
    }

    /// Reads `path` until `done` holds, with a deadline (never a fixed sleep).
    async fn wait(&self, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let value = self.ok("reader", Method::GET, path, None).await;
            if done(&value) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {value}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The error message of a refused call, after checking its status and target.
    async fn refused(
        &self,
        who: &str,
        method: Method,
        path: &str,
        body: Value,
        status: StatusCode,
        target: &str,
    ) -> String {
        let (got, error) = self.answer(who, method, path, Some(body)).await;
        assert_eq!(got, status, "{error}");
        assert_eq!(error["error"]["target"], target, "{error}");
        let message = error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            !message.contains("Some(") && !message.contains("None"),
            "Rust internals in {message:?}"
        );
        message
    }
}

async fn member(h: &Harness, name: &str, cluster: &str, group: &str) {
    h.ok(
        "operator",
        Method::PUT,
        &format!("/v1/fleets/f1/members/{name}"),
        Some(json!({"properties": {"clusterResourceId": cluster, "group": group}})),
    )
    .await;
}

fn state_of(run: &Value) -> &str {
    run["properties"]["status"]["status"]["state"]
        .as_str()
        .unwrap_or_default()
}

/// A member's entry in a run's status.
fn member_in<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["properties"]["status"]["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["members"].as_array().into_iter().flatten())
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("member {name} in {run}"))
}

fn ended(run: &Value) -> bool {
    matches!(state_of(run), "Completed" | "Failed" | "Stopped")
}

const UPGRADE: &str = "1.31.1";

fn run_of(stages: Value) -> Value {
    json!({"properties": {
        "strategy": {"stages": stages},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": UPGRADE}},
    }})
}

/// Finding 1: a fleet's driver changed by a PUT reaches its runs at once, without a restart —
/// after a run (the fleet's reconciler already holds a driver) and while one is going (its next
/// upgrade uses the new driver).
#[tokio::test]
async fn a_driver_changed_by_put_reaches_the_runs_at_once() {
    let h = Harness::start("driver-change").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    member(&h, "m1", "c1", "first").await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(run_of(
            json!([{"name": "s", "groups": [{"name": "first"}]}]),
        )),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    let r1 = h
        .wait("/v1/fleets/f1/updateRuns/r1", "r1 to end", ended)
        .await;
    assert_eq!(state_of(&r1), "Completed", "{r1}");
    // A write of the fleet that leaves its driver as it was keeps the driver built (a sim
    // fleet's clusters keep what its runs did to them).
    let built = || async {
        h.state
            .runs
            .drivers
            .for_fleet(h.state.runs.store.as_ref(), "f1")
            .await
            .expect("the fleet's driver")
    };
    let before = built().await;
    h.ok(
        "admin",
        Method::PATCH,
        "/v1/fleets/f1",
        Some(json!({"tags": {"team": "platform"}})),
    )
    .await;
    assert!(Arc::ptr_eq(&before, &built().await), "the same driver");

    // After the run: a cluster added to the driver's configuration, and a member on it.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[
            ("c1", cluster(UPGRADE)),
            ("c2", cluster("1.30.5")),
        ])),
    )
    .await;
    member(&h, "m2", "c2", "second").await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r2",
        Some(run_of(
            json!([{"name": "s", "groups": [{"name": "second"}]}]),
        )),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r2/start",
        None,
    )
    .await;
    let r2 = h
        .wait("/v1/fleets/f1/updateRuns/r2", "r2 to end", ended)
        .await;
    assert_eq!(
        state_of(&r2),
        "Completed",
        "the new cluster is upgraded by the new driver: {}",
        member_in(&r2, "m2")
    );

    // While a run is going: its second stage's member fails under the driver the run started
    // with; the driver is changed while the run waits at the gate between the stages.
    let mut failing = cluster("1.30.5");
    failing["sim"] = json!({"outcome": "fail"});
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[
            ("c1", cluster(UPGRADE)),
            ("c2", cluster(UPGRADE)),
            ("c3", cluster("1.30.5")),
            ("c4", failing),
        ])),
    )
    .await;
    member(&h, "m3", "c3", "third").await;
    member(&h, "m4", "c4", "fourth").await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r3",
        Some(run_of(json!([
            {"name": "before", "groups": [{"name": "third"}],
             "afterGates": [{"type": "Approval", "displayName": "go on"}]},
            {"name": "after", "groups": [{"name": "fourth"}]},
        ]))),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r3/start",
        None,
    )
    .await;
    let waiting = h
        .wait("/v1/fleets/f1/updateRuns/r3", "r3's gate", |r| {
            r["properties"]["status"]["stages"][0]["afterGates"][0]["status"]["state"] == "Pending"
                || ended(r)
        })
        .await;
    assert!(!ended(&waiting), "{}", member_in(&waiting, "m3"));
    let gate = waiting["properties"]["status"]["stages"][0]["afterGates"][0]["gateId"]
        .as_str()
        .and_then(|id| id.rsplit('/').next())
        .expect("the gate's id")
        .to_string();
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[
            ("c1", cluster(UPGRADE)),
            ("c2", cluster(UPGRADE)),
            ("c3", cluster(UPGRADE)),
            ("c4", cluster("1.30.5")),
        ])),
    )
    .await;
    h.ok(
        "approver",
        Method::PATCH,
        &format!("/v1/fleets/f1/gates/{gate}"),
        Some(json!({"properties": {"state": "Completed"}})),
    )
    .await;
    let r3 = h
        .wait("/v1/fleets/f1/updateRuns/r3", "r3 to end", ended)
        .await;
    assert_eq!(
        state_of(&r3),
        "Completed",
        "the running run's next upgrade uses the new driver: {}",
        member_in(&r3, "m4")
    );
}

/// Finding 2: a profile whose trigger fails is written once, not at every pass: its eTag stays
/// the same across passes that fail the same way, so an `If-Match` edit made with the eTag read
/// earlier is not refused because the server rewrote the profile meanwhile.
#[tokio::test]
async fn a_profile_whose_trigger_fails_the_same_way_is_not_written_again() {
    // The server's own pass every 50 ms, and more run by the test: passes certainly happened.
    let h = Harness::start_with(
        "failing-trigger",
        flotilla_server::Timing {
            profiles_every: Duration::from_millis(50),
            ..Default::default()
        },
    )
    .await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    // A member whose cluster the driver cannot reach: a run selecting it cannot be created.
    member(&h, "m1", "c1", "all").await;
    member(&h, "m2", "c-gone", "all").await;
    let profile = json!({"properties": {"channel": "Rapid"}});
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/rapid",
        Some(profile.clone()),
    )
    .await;
    let failed = h
        .wait(
            "/v1/fleets/f1/autoUpgradeProfiles/rapid",
            "the trigger to fail",
            |p| p["properties"]["autoUpgradeProfileStatus"]["lastTriggerStatus"] == "Failed",
        )
        .await;
    let status = failed["properties"]["autoUpgradeProfileStatus"].clone();
    assert!(
        status["lastTriggerError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("m2")),
        "{status}"
    );
    let etag = failed["eTag"].as_str().expect("an eTag").to_string();
    for _ in 0..5 {
        flotilla_server::feed::trigger_profiles(&h.state).await;
    }
    let after = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/autoUpgradeProfiles/rapid",
            None,
        )
        .await;
    assert_eq!(after["eTag"], etag, "the same failure is not written again");
    assert_eq!(after["properties"]["autoUpgradeProfileStatus"], status);
    let (code, edited) = h
        .send(
            "admin",
            Method::PUT,
            "/v1/fleets/f1/autoUpgradeProfiles/rapid",
            Some(json!({"properties": {"channel": "Rapid", "disabled": true}})),
            Some(&etag),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "an edit with the eTag read: {edited}");
    // What changes is written: once the cluster can be reached, the trigger succeeds.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/rapid",
        Some(profile),
    )
    .await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[
            ("c1", cluster("1.30.5")),
            ("c-gone", cluster("1.30.5")),
        ])),
    )
    .await;
    h.wait(
        "/v1/fleets/f1/autoUpgradeProfiles/rapid",
        "the trigger to succeed",
        |p| p["properties"]["autoUpgradeProfileStatus"]["lastTriggerStatus"] == "Succeeded",
    )
    .await;
}

/// Finding 3: error messages name the field and the value as the user wrote it, never Rust's
/// rendering of an optional or internal value (`Some("stage")`, `None`, a struct).
#[tokio::test]
async fn error_messages_show_values_as_written() {
    let h = Harness::start("messages").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    member(&h, "m1", "c1", "all").await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(run_of(json!([{"name": "s", "groups": [{"name": "all"}]}]))),
    )
    .await;
    let skip = "/v1/fleets/f1/updateRuns/r1/skip";
    let message = h
        .refused(
            "operator",
            Method::POST,
            skip,
            json!({"targets": [{"type": "stage", "name": "s"}]}),
            StatusCode::BAD_REQUEST,
            "targets[0].type",
        )
        .await;
    assert_eq!(
        message,
        r#"targets[0].type: "stage" is not a skip target type: Member, Group, Stage or AfterStageWait"#
    );
    let message = h
        .refused(
            "operator",
            Method::POST,
            skip,
            json!({"targets": [{"type": "Stage", "name": "s"}, {"name": "all"}]}),
            StatusCode::BAD_REQUEST,
            "targets[1].type",
        )
        .await;
    assert_eq!(
        message,
        "targets[1].type is required: Member, Group, Stage or AfterStageWait"
    );

    // A gate's PATCH with another state, or none.
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/gated",
        Some(run_of(json!([{"name": "s", "groups": [{"name": "all"}],
            "beforeGates": [{"type": "Approval"}]}]))),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/gated/start",
        None,
    )
    .await;
    let gates = h
        .wait("/v1/fleets/f1/gates", "the gate", |g| {
            g["value"].as_array().is_some_and(|v| !v.is_empty())
        })
        .await;
    let gate = gates["value"][0]["id"]
        .as_str()
        .expect("a gate")
        .to_string();
    let message = h
        .refused(
            "approver",
            Method::PATCH,
            &gate,
            json!({"properties": {"state": "Pending"}}),
            StatusCode::BAD_REQUEST,
            "properties.state",
        )
        .await;
    assert_eq!(
        message,
        r#"properties.state: "Pending" cannot be set; the only change allowed is Completed (approve)"#
    );
    let message = h
        .refused(
            "approver",
            Method::PATCH,
            &gate,
            json!({"properties": {}}),
            StatusCode::BAD_REQUEST,
            "properties.state",
        )
        .await;
    assert_eq!(
        message,
        "properties.state is required; the only change allowed is Completed (approve)"
    );

    // An aks driver's credential of an unknown type, or of none.
    for (credential, said) in [
        (
            json!({"type": "Password"}),
            r#"properties.driver.credential.type: "Password" is not a credential type: ClientSecret, ManagedIdentity, WorkloadIdentity or AzureCli"#,
        ),
        (
            json!({}),
            "properties.driver.credential.type is required: ClientSecret, ManagedIdentity, WorkloadIdentity or AzureCli",
        ),
    ] {
        let message = h
            .refused(
                "admin",
                Method::PUT,
                "/v1/fleets/azure",
                json!({"properties": {"driver": {"type": "aks", "credential": credential}}}),
                StatusCode::BAD_REQUEST,
                "properties.driver.credential.type",
            )
            .await;
        assert_eq!(message, said);
    }

    // A profile whose channel selects nothing says which channel, as written.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/pinned",
        Some(json!({"properties": {"channel": "TargetKubernetesVersion", "targetKubernetesVersion": "1.35"}})),
    )
    .await;
    let (status, error) = h
        .answer(
            "admin",
            Method::POST,
            "/v1/fleets/f1/autoUpgradeProfiles/pinned/generateUpdateRun",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(
        error["error"]["message"],
        "the TargetKubernetesVersion channel (targetKubernetesVersion 1.35) selects nothing from the fleet's releases yet"
    );
    // A profile's node image selection without a type.
    let message = h
        .refused(
            "admin",
            Method::PUT,
            "/v1/fleets/f1/autoUpgradeProfiles/images",
            json!({"properties": {"channel": "Rapid", "nodeImageSelection": {}}}),
            StatusCode::BAD_REQUEST,
            "properties.nodeImageSelection.type",
        )
        .await;
    assert_eq!(
        message,
        "properties.nodeImageSelection.type: is required (Latest or Consistent)"
    );
}

/// The members of fleet `f1`, by name.
async fn member_names(h: &Harness) -> Vec<String> {
    let page = h
        .ok("reader", Method::GET, "/v1/fleets/f1/members", None)
        .await;
    page["value"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["name"].as_str().map(String::from))
        .collect()
}

/// Finding 4: a name or a cluster id repeated within one import is refused as a repeat,
/// naming both items (400), not as a member that "already exists"; nothing is created.
#[tokio::test]
async fn an_import_that_repeats_a_name_or_a_cluster_says_so() {
    let h = Harness::start("import-repeats").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(
            json!({"properties": {"driver": {"type": "sim", "timeScale": 6000,
            "defaultCluster": cluster("1.30.5")}}}),
        ),
    )
    .await;
    let item =
        |name: &str, id: &str| json!({"name": name, "properties": {"clusterResourceId": id}});
    for mode in ["Create", "Upsert"] {
        let message = h
            .refused(
                "operator",
                Method::POST,
                "/v1/fleets/f1/importMembers",
                json!({"mode": mode, "value": [
                    item("a", "/sub/rg/a"), item("x", "/sub/rg/x1"),
                    item("b", "/sub/rg/b"), item("x", "/sub/rg/x2"),
                ]}),
                StatusCode::BAD_REQUEST,
                "value[3].name",
            )
            .await;
        assert_eq!(
            message, r#"value[3].name "x" repeats value[1].name"#,
            "mode {mode}"
        );
        let message = h
            .refused(
                "operator",
                Method::POST,
                "/v1/fleets/f1/importMembers",
                json!({"mode": mode, "value": [
                    item("a", "/sub/rg/X"), item("b", "/sub/rg/b"), item("c", "/SUB/rg/x"),
                ]}),
                StatusCode::BAD_REQUEST,
                "value[2].properties.clusterResourceId",
            )
            .await;
        assert_eq!(
            message,
            r#"value[2].properties.clusterResourceId "/SUB/rg/x" repeats value[0].properties.clusterResourceId "/sub/rg/X" (cluster ids are compared case-insensitively)"#,
            "mode {mode}"
        );
        assert_eq!(
            member_names(&h).await,
            Vec::<String>::new(),
            "nothing created"
        );
    }
    // Without the repeat, the same import is taken.
    let taken = h
        .ok(
            "operator",
            Method::POST,
            "/v1/fleets/f1/importMembers",
            Some(json!({"value": [item("a", "/sub/rg/a"), item("x", "/sub/rg/x1")]})),
        )
        .await;
    assert_eq!(taken, json!({"created": 2, "updated": 0}));
}

/// Finding 5: `afterStageWaitInSeconds` out of range is refused with the actual bound.
#[tokio::test]
async fn a_stage_wait_out_of_range_is_refused_with_its_bound() {
    let h = Harness::start("wait-bound").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    let strategy = |wait: i64| {
        json!({"properties": {"strategy": {"stages": [
            {"name": "s", "groups": [{"name": "g"}], "afterStageWaitInSeconds": wait}]}}})
    };
    for wait in [3_162_240_000, 2_147_483_648, -1] {
        let message = h
            .refused(
                "operator",
                Method::PUT,
                "/v1/fleets/f1/updateStrategies/slow",
                strategy(wait),
                StatusCode::BAD_REQUEST,
                "properties.strategy.stages[0].afterStageWaitInSeconds",
            )
            .await;
        assert_eq!(
            message,
            format!(
                "properties.strategy.stages[0].afterStageWaitInSeconds {wait}: must be between 0 and 2147483647 seconds"
            )
        );
    }
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateStrategies/slow",
        Some(strategy(2_147_483_647)),
    )
    .await;
}

/// A health endpoint that answers every request 503: a check against it fails.
fn failing_endpoint() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("bound").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = stream.read(&mut [0u8; 4096]);
            let _ = stream.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndown",
            );
        }
    });
    port
}

/// The gates of fleet `f1` a list answers: `(gate type, state)`.
fn gates_of(list: &Value) -> Vec<(String, String)> {
    list["value"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            let field = |f: &str| g["properties"][f].as_str().unwrap_or_default().to_string();
            (field("gateType"), field("state"))
        })
        .collect()
}

/// Finding 6: gates are filtered by any state a gate can have (a HealthCheck gate can fail), by
/// `state` or `$filter`; an unknown state is refused naming it; the OpenAPI document lists them.
#[tokio::test]
async fn gates_are_filtered_by_every_state_they_can_have() {
    let h = Harness::start("gate-states").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[
            ("c1", cluster("1.30.5")),
            ("c2", cluster("1.30.5")),
        ])),
    )
    .await;
    member(&h, "m1", "c1", "checked").await;
    member(&h, "m2", "c2", "approved").await;
    let port = failing_endpoint();
    h.ok(
        "admin",
        Method::PUT,
        "/v1/checkProviders/failing",
        Some(
            json!({"properties": {"type": "Http", "baseUrl": format!("http://127.0.0.1:{port}")}}),
        ),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/checked",
        Some(run_of(
            json!([{"name": "s", "groups": [{"name": "checked"}],
            "afterGates": [{"type": "HealthCheck", "soakSeconds": 1, "intervalSeconds": 1,
                "checks": [{"name": "up", "provider": "failing", "path": "/health"}]}]}]),
        )),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/approved",
        Some(run_of(
            json!([{"name": "s", "groups": [{"name": "approved"}],
            "beforeGates": [{"type": "Approval"}]}]),
        )),
    )
    .await;
    for run in ["checked", "approved"] {
        h.ok(
            "operator",
            Method::POST,
            &format!("/v1/fleets/f1/updateRuns/{run}/start"),
            None,
        )
        .await;
    }
    let checked = h
        .wait(
            "/v1/fleets/f1/updateRuns/checked",
            "the check to fail",
            ended,
        )
        .await;
    assert_eq!(
        checked["properties"]["status"]["stages"][0]["afterGates"][0]["status"]["state"], "Failed",
        "{checked}"
    );
    h.wait("/v1/fleets/f1/gates", "both gates", |g| {
        gates_of(g).len() == 2
    })
    .await;
    let failed = [("HealthCheck".to_string(), "Failed".to_string())];
    let pending = [("Approval".to_string(), "Pending".to_string())];
    for (query, wanted) in [
        ("state=Failed", &failed),
        ("state=Pending", &pending),
        ("$filter=state eq 'Failed'", &failed),
        ("$filter=properties/state eq 'Failed'", &failed),
        ("$filter=properties/state eq 'Pending'", &pending),
    ] {
        let (status, list) = h
            .answer(
                "reader",
                Method::GET,
                &format!("/v1/fleets/f1/gates?{query}"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{query}: {list}");
        assert_eq!(gates_of(&list), wanted, "{query}: {list}");
    }
    for query in ["state=Bogus", "$filter=properties/state eq 'Bogus'"] {
        let (status, error) = h
            .answer(
                "reader",
                Method::GET,
                &format!("/v1/fleets/f1/gates?{query}"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
        assert_eq!(error["error"]["target"], "state", "{error}");
        assert_eq!(
            error["error"]["message"],
            r#"state "Bogus": must be Pending, Completed, Skipped or Failed"#,
            "{query}"
        );
    }
    let spec = h.ok("reader", Method::GET, "/openapi.json", None).await;
    let parameters = spec["paths"]["/v1/fleets/{fleet}/gates"]["get"]["parameters"].clone();
    let state = parameters
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "state")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        state["schema"]["enum"],
        json!(["Pending", "Completed", "Skipped", "Failed"]),
        "{parameters}"
    );
}
