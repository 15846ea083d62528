//! The HTTP API over real HTTP on loopback, against the real router and a real SQLite file:
//! authentication and roles, validation errors with field paths, eTags, paging, a full run to
//! completion with the sim driver (gate approval included), events and their live stream.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use flotilla_server::Server;
use flotilla_server::auth::{Role, new_token};
use flotilla_server::store::SqliteStore;
use flotilla_server::store::prelude::*;

struct Harness {
    base: String,
    http: reqwest::Client,
    tokens: std::collections::HashMap<&'static str, String>,
    /// The server's store, for what the server itself writes beside the API.
    store: Arc<dyn Store>,
    /// The server's shared state, for its settings.
    state: flotilla_server::state::Shared,
    _dir: TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "flotilla-test-{name}-{}-{:?}",
        std::process::id(),
        Instant::now()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    TempDir(dir)
}

impl Harness {
    async fn start(name: &str) -> Harness {
        Harness::start_with(
            name,
            flotilla_server::Timing {
                profiles_every: Duration::from_secs(3600),
                ..Default::default()
            },
        )
        .await
    }

    async fn start_with(name: &str, timing: flotilla_server::Timing) -> Harness {
        Harness::start_arm(name, timing, None).await
    }

    /// With the ARM paths' settings (a default driver, say).
    async fn start_arm(
        name: &str,
        timing: flotilla_server::Timing,
        arm: Option<flotilla_server::home::Settings>,
    ) -> Harness {
        let dir = temp_dir(name);
        let store = SqliteStore::open(&dir.0.join("flotilla.db"))
            .await
            .expect("store opens");
        let mut tokens = std::collections::HashMap::new();
        for (label, role) in [
            ("admin", Role::Admin),
            ("approver", Role::Approver),
            ("operator", Role::Operator),
            ("reader", Role::Reader),
        ] {
            let (secret, record) = new_token(role, &format!("{label}-user")).expect("token");
            store.create_token(&record).await.expect("token stored");
            tokens.insert(label, secret);
        }
        let store: Arc<dyn Store> = Arc::new(store);
        let server = Server::start_with(
            store.clone(),
            "127.0.0.1:0".parse().expect("addr"),
            false,
            timing,
        )
        .await
        .expect("server starts");
        if let Some(arm) = arm {
            *server.state.arm.write().expect("settings") = Arc::new(arm);
        }
        let addr = server.local_addr().expect("bound");
        let state = server.state.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.serve(async move {
            let _ = stopped.await;
        }));
        Harness {
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            tokens,
            store,
            state,
            _dir: dir,
            stop: Some(stop),
        }
    }

    async fn call(
        &self,
        who: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = self.tokens.get(who) {
            request = request.bearer_auth(token);
        }
        if let Some(b) = body {
            request = request.json(&b);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            headers,
        )
    }

    /// The status a call is answered with.
    async fn status(
        &self,
        who: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> StatusCode {
        self.call(who, method, path, body).await.0
    }

    async fn ok(&self, who: &str, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, value, _) = self.call(who, method.clone(), path, body).await;
        assert!(status.is_success(), "{method} {path}: {status} {value}");
        value
    }

    /// Waits for a condition on a run, with a deadline (no sleeping to a fixed time).
    async fn wait_run(&self, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let run = self.ok("reader", Method::GET, path, None).await;
            if done(&run) {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {}",
                run["properties"]["status"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn sim_fleet(clusters: &[(&str, Value)]) -> Value {
    let mut map = serde_json::Map::new();
    for (id, c) in clusters {
        map.insert(id.to_string(), c.clone());
    }
    json!({"properties": {"driver": {
        "type": "sim",
        "timeScale": 6000,
        "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}],
                               "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202602.10.0"}]}}},
        "clusters": map,
    }}})
}

/// Fleet `f1` over the sim driver, with members `(name, group, version)` on clusters `c-{name}`.
async fn fleet_of(h: &Harness, members: &[(&str, &str, &str)]) {
    let clusters: Vec<(String, Value)> = members
        .iter()
        .map(|(name, _, version)| (format!("c-{name}"), cluster(version)))
        .collect();
    let clusters: Vec<(&str, Value)> = clusters
        .iter()
        .map(|(id, c)| (id.as_str(), c.clone()))
        .collect();
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&clusters)),
    )
    .await;
    for (name, group, _) in members {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/{name}"),
            Some(json!({"properties": {"clusterResourceId": format!("c-{name}"), "group": group}})),
        )
        .await;
    }
}

fn cluster(version: &str) -> Value {
    json!({"region": "eastus", "kubernetesVersion": version,
           "nodePools": [{"name": "sys", "family": "AKSUbuntu-2204gen2containerd", "os": "Linux", "nodeImageVersion": "202602.10.0"}]})
}

#[tokio::test]
async fn authentication_and_roles() {
    let h = Harness::start("auth").await;
    let (status, body, _) = h.call("nobody", Method::GET, "/v1/fleets", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "Unauthorized");
    let (status, _, _) = h
        .http
        .get(format!("{}/v1/fleets", h.base))
        .bearer_auth("flt_bogus")
        .send()
        .await
        .map(|r| (r.status(), (), ()))
        .expect("sent");
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body, _) = h
        .call("reader", Method::PUT, "/v1/fleets/f1", Some(sim_fleet(&[])))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("admin")
    );
    let (status, _, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1",
            Some(sim_fleet(&[])),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(sim_fleet(&[])))
        .await;
    h.ok("reader", Method::GET, "/v1/fleets/f1", None).await;
    // Open endpoints.
    let (status, spec, _) = h.call("nobody", Method::GET, "/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(spec["paths"]["/v1/fleets/{fleet}/updateRuns/{run}/skip"]["post"].is_object());
    let (status, _, _) = h.call("nobody", Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = h.call("nobody", Method::GET, "/readyz", None).await;
    assert_eq!(status, StatusCode::OK);
    // Tokens: only admins manage them; a revoked token stops working.
    let created = h
        .ok(
            "admin",
            Method::POST,
            "/v1/tokens",
            Some(json!({"role": "reader", "subject": "ci"})),
        )
        .await;
    let secret = created["token"].as_str().expect("shown once").to_string();
    let status = h
        .http
        .get(format!("{}/v1/fleets", h.base))
        .bearer_auth(&secret)
        .send()
        .await
        .expect("sent")
        .status();
    assert_eq!(status, StatusCode::OK);
    h.ok(
        "admin",
        Method::DELETE,
        &format!("/v1/tokens/{}", created["id"].as_str().expect("id")),
        None,
    )
    .await;
    let status = h
        .http
        .get(format!("{}/v1/fleets", h.base))
        .bearer_auth(&secret)
        .send()
        .await
        .expect("sent")
        .status();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let listed = h.ok("admin", Method::GET, "/v1/tokens", None).await;
    assert!(
        listed.to_string().find(&secret).is_none(),
        "secrets are never listed"
    );
    let (status, _, _) = h.call("operator", Method::GET, "/v1/tokens", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn validation_etags_and_paging() {
    let h = Harness::start("validation").await;
    // Bad input: 400 naming the field, nothing stored.
    let (status, body, _) = h
        .call(
            "admin",
            Method::PUT,
            "/v1/fleets/f1",
            Some(json!({"properties": {"driver": {"type": "teleport"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("teleport")
    );
    let (status, _, _) = h.call("admin", Method::GET, "/v1/fleets/f1", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body, _) = h
        .call(
            "admin",
            Method::PUT,
            "/v1/fleets/Bad_Name",
            Some(sim_fleet(&[])),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body, _) = h
        .call(
            "admin",
            Method::PUT,
            "/v1/fleets/f1",
            Some(json!({"properties": {"driver": {"type": "sim"}}, "colour": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "UnknownField");
    assert_eq!(body["error"]["target"], "colour");
    let (status, body, _) = h.call("admin", Method::PUT, "/v1/fleets/f1", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // eTags.
    let (status, created, headers) = h
        .call("admin", Method::PUT, "/v1/fleets/f1", Some(sim_fleet(&[])))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let etag = headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .expect("ETag header")
        .to_string();
    assert_eq!(created["eTag"], etag);
    let put_if = |tag: &str, header: &'static str| {
        h.http
            .put(format!("{}/v1/fleets/f1", h.base))
            .bearer_auth(&h.tokens["admin"])
            .header(header, tag.to_string())
            .json(&sim_fleet(&[]))
    };
    assert_eq!(
        put_if("\"999\"", "If-Match")
            .send()
            .await
            .expect("sent")
            .status(),
        StatusCode::PRECONDITION_FAILED
    );
    assert_eq!(
        put_if("*", "If-None-Match")
            .send()
            .await
            .expect("sent")
            .status(),
        StatusCode::PRECONDITION_FAILED
    );
    assert_eq!(
        put_if(&etag, "If-Match")
            .send()
            .await
            .expect("sent")
            .status(),
        StatusCode::OK
    );
    // The old eTag no longer matches: a lost-update race is caught.
    assert_eq!(
        put_if(&etag, "If-Match")
            .send()
            .await
            .expect("sent")
            .status(),
        StatusCode::PRECONDITION_FAILED
    );
    // Members: validation and paging.
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/members/m1",
            Some(json!({"properties": {"group": "g"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["target"], "properties.clusterResourceId");
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/members/m1",
            Some(json!({"properties": {"clusterResourceId": "c1", "labels": {"bad key!": "x"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    for i in 0..5 {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/m{i}"),
            Some(json!({"properties": {"clusterResourceId": format!("c{i}"), "group": "g"}})),
        )
        .await;
    }
    let page = h
        .ok("reader", Method::GET, "/v1/fleets/f1/members?$top=2", None)
        .await;
    assert_eq!(page["value"].as_array().map(Vec::len), Some(2));
    let mut names: Vec<String> = page["value"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["name"].as_str().unwrap_or_default().to_string())
        .collect();
    let mut next = page["nextLink"].as_str().map(String::from);
    while let Some(link) = next {
        let page = h.ok("reader", Method::GET, &link, None).await;
        names.extend(
            page["value"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| m["name"].as_str().unwrap_or_default().to_string()),
        );
        next = page["nextLink"].as_str().map(String::from);
    }
    assert_eq!(names, ["m0", "m1", "m2", "m3", "m4"]);
    let (status, _, _) = h
        .call("reader", Method::GET, "/v1/fleets/f1/members?$top=0", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Strategies: the Fleet Manager stages file is accepted as is; errors name the path.
    let stages: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/fleet-stages.json"
        ))
        .expect("shared example"),
    )
    .expect("json");
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateStrategies/walkthrough",
        Some(json!({"properties": {"strategy": stages}})),
    )
    .await;
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateStrategies/bad",
            Some(json!({"properties": {"strategy": {"stages": [{"name": "s", "groups": [{"name": "g", "maxConcurrency": "0"}]}]}}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "InvalidMaxConcurrency");
    assert_eq!(
        body["error"]["target"],
        "properties.strategy.stages[0].groups[0].maxConcurrency"
    );
    // A too-large body is refused with 413.
    let huge = json!({"properties": {"clusterResourceId": "x".repeat(2 << 20)}});
    let (status, _, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/members/big",
            Some(huge),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _, _) = h
        .call("reader", Method::GET, "/v1/fleets/f1/members/big", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_staged_run_with_an_approval_gate_runs_to_completion() {
    let h = Harness::start("run").await;
    fleet_of(
        &h,
        &[
            ("a1", "canary", "1.30.5"),
            ("a2", "canary", "1.30.5"),
            ("b1", "prod", "1.30.5"),
            ("b2", "prod", "1.31.1"),
        ],
    )
    .await;
    let strategy = json!({"stages": [
        {"name": "canary", "groups": [{"name": "canary"}]},
        {"name": "prod", "beforeGates": [{"type": "Approval", "displayName": "go"}], "groups": [{"name": "prod", "maxConcurrency": "2"}]},
    ]});
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateStrategies/staged",
        Some(json!({"properties": {"strategy": strategy}})),
    )
    .await;
    // Both a strategy id and a strategy, as every run the service returns carries them: the
    // strategy is used as given, the id records where it came from.
    let one_stage = json!({"stages": [{"name": "only", "groups": [{"name": "canary"}]}]});
    let both = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/both",
            Some(json!({"properties": {"updateStrategyId": "/v1/fleets/F1/updateStrategies/staged", "strategy": one_stage,
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
        )
        .await;
    assert_eq!(
        both["properties"]["updateStrategyId"],
        "/v1/fleets/f1/updateStrategies/staged"
    );
    assert_eq!(
        both["properties"]["strategy"]["stages"][0]["name"], "only",
        "{both}"
    );
    h.ok(
        "operator",
        Method::DELETE,
        "/v1/fleets/f1/updateRuns/both",
        None,
    )
    .await;
    let azure_id = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/fleets/f1/updateStrategies/staged";
    let created = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(json!({"properties": {"updateStrategyId": azure_id, "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
        )
        .await;
    assert_eq!(
        created["properties"]["status"]["status"]["state"],
        "NotStarted"
    );
    assert_eq!(
        created["properties"]["strategy"]["stages"][1]["name"], "prod",
        "the strategy is copied into the run"
    );
    assert!(
        created.get("x-flotilla").is_none(),
        "internal fields are not shown"
    );
    // Editing the strategy later does not change the run.
    h.ok("operator", Method::PUT, "/v1/fleets/f1/updateStrategies/staged", Some(json!({"properties": {"strategy": {"stages": [{"name": "all", "groups": [{"name": "canary"}]}]}}})))
        .await;
    let (status, _, _) = h
        .call(
            "reader",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/start",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    let (status, body, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/start",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let path = "/v1/fleets/f1/updateRuns/r1";
    h.wait_run(path, "the production gate", |r| {
        r["properties"]["status"]["stages"][1]["beforeGates"][0]["status"]["state"] == "Pending"
    })
    .await;
    // A moving run's status carries when it is forecast to end (SEMANTICS §11), made off the
    // fleet's task: the gate taken as approved now, the rest at the sim driver's durations.
    let waiting = h
        .wait_run(path, "the run's forecast", |r| {
            r["properties"]["status"]["forecast"]["completedTime"].is_string()
        })
        .await;
    let forecast = &waiting["properties"]["status"]["forecast"];
    let at =
        |v: &Value| flotilla_engine::time::Time::parse(v.as_str().unwrap_or("")).expect("a time");
    assert!(
        at(&forecast["completedTime"]) >= at(&forecast["computedAt"]),
        "{forecast}"
    );
    // The metrics see the run running, its failures, and its gate waiting.
    let metrics = h.call("reader", Method::GET, "/metrics", None).await.1;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    for line in [
        "flotilla_update_runs{fleet=\"f1\",state=\"Pending\"} 1",
        "flotilla_update_run_failure_count{fleet=\"f1\",run=\"r1\"} 0",
        "flotilla_gates_pending{fleet=\"f1\"} 1",
        "flotilla_gate_longest_wait_seconds{fleet=\"f1\"}",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    let gates = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/gates?state=Pending",
            None,
        )
        .await;
    let gate = gates["value"][0]["name"]
        .as_str()
        .expect("a pending gate")
        .to_string();
    assert_eq!(
        gates["value"][0]["properties"]["target"]["updateRunProperties"]["stage"],
        "prod"
    );
    let approve = json!({"properties": {"state": "Completed"}});
    let (status, _, _) = h
        .call(
            "operator",
            Method::PATCH,
            &format!("/v1/fleets/f1/gates/{gate}"),
            Some(approve.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "an operator cannot approve");
    // Nor skip past the gate (API.md, "Security"): the run is unchanged.
    let (status, error, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/skip",
            Some(json!({"targets": [{"type": "Stage", "name": "prod"}]})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("approver")),
        "{error}"
    );
    let still = h.ok("reader", Method::GET, path, None).await;
    assert_eq!(
        still["properties"]["status"]["stages"][1]["status"]["state"],
        "Pending"
    );
    let (status, _, _) = h
        .call(
            "approver",
            Method::PATCH,
            &format!("/v1/fleets/f1/gates/{gate}"),
            Some(json!({"properties": {"state": "Pending"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = h.call("reader", Method::DELETE, path, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = h.call("operator", Method::DELETE, path, None).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a running run cannot be deleted"
    );
    let approved = h
        .ok(
            "approver",
            Method::PATCH,
            &format!("/v1/fleets/f1/gates/{gate}"),
            Some(approve.clone()),
        )
        .await;
    assert_eq!(approved["properties"]["state"], "Completed");
    assert_eq!(approved["properties"]["approvedBy"], "approver-user");
    assert!(approved["properties"]["approvedAt"].is_string());
    let (status, _, _) = h
        .call(
            "approver",
            Method::PATCH,
            &format!("/v1/fleets/f1/gates/{gate}"),
            Some(approve),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "a gate is approved once");
    let done = h
        .wait_run(path, "completion", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    assert!(
        done["properties"]["status"].get("forecast").is_none(),
        "an ended run shows no forecast: {}",
        done["properties"]["status"]
    );
    let members: Vec<(String, String)> = done["properties"]["status"]["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| {
            s["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["members"].as_array().into_iter().flatten())
        })
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_string(),
                m["status"]["state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        members,
        [
            ("a1".into(), "Completed".into()),
            ("a2".into(), "Completed".into()),
            ("b1".into(), "Completed".into()),
            ("b2".into(), "Skipped".into())
        ]
    );
    // The member observations follow the upgrades.
    let member = h
        .wait_run("/v1/fleets/f1/members/a1", "the observation", |m| {
            m["properties"]["status"]["cluster"]["kubernetesVersion"] == "1.31.1"
        })
        .await;
    assert_eq!(member["properties"]["group"], "canary");
    // The event log, as JSON and as a live stream.
    let events = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateRuns/r1/events",
            None,
        )
        .await;
    let kinds: Vec<&str> = events["value"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert!(
        kinds.contains(&"GatePending")
            && kinds.contains(&"GateCompleted")
            && kinds.last() == Some(&"RunCompleted"),
        "{kinds:?}"
    );
    let mut stream = h
        .http
        .get(format!("{}/v1/fleets/f1/updateRuns/r1/events", h.base))
        .bearer_auth(&h.tokens["reader"])
        .header("Accept", "text/event-stream")
        .send()
        .await
        .expect("stream opens");
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    while !text.contains("RunCompleted") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.chunk())
            .await
            .expect("the stream delivers")
            .expect("no error");
        text.push_str(&String::from_utf8_lossy(&chunk.expect("more data")));
    }
    assert!(
        text.contains("data: {") && text.contains("MemberStarted"),
        "{text}"
    );
    drop(stream);
    // A stream opened with a token ends within a second of the token's revocation (it kept
    // streaming before).
    let created = h
        .ok(
            "admin",
            Method::POST,
            "/v1/tokens",
            Some(json!({"role": "reader", "subject": "watcher"})),
        )
        .await;
    let mut stream = h
        .http
        .get(format!("{}/v1/fleets/f1/updateRuns/r1/events", h.base))
        .bearer_auth(created["token"].as_str().expect("secret"))
        .header("Accept", "text/event-stream")
        .send()
        .await
        .expect("stream opens");
    let first = tokio::time::timeout(Duration::from_secs(10), stream.chunk())
        .await
        .expect("the stream delivers")
        .expect("no error");
    assert!(first.is_some());
    h.ok(
        "admin",
        Method::DELETE,
        &format!("/v1/tokens/{}", created["id"].as_str().expect("id")),
        None,
    )
    .await;
    // It checks every 400 ms; the bound here is loose so a loaded machine does not fail it.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream went on after its token was revoked"
    );
    // Terminal now: start is refused, delete works.
    let (status, _, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/start",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let metrics = h.call("reader", Method::GET, "/metrics", None).await.1;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        metrics.contains("flotilla_member_upgrades_succeeded_total{fleet=\"f1\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("flotilla_update_runs{fleet=\"f1\",state=\"Completed\"} 1"),
        "{metrics}"
    );
    check_dispatch_histogram(&metrics, 3);
    h.ok("operator", Method::DELETE, path, None).await;
    let (status, _, _) = h.call("reader", Method::GET, path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let gates = h
        .ok("reader", Method::GET, "/v1/fleets/f1/gates", None)
        .await;
    assert_eq!(
        gates["value"].as_array().map(Vec::len),
        Some(0),
        "a run's gates go with it"
    );
    // The audit trail says who did what to the run, and when: every accepted write, by its
    // caller; no read, no refused write.
    let mut trail = Vec::new();
    let mut next = Some("/v1/audit?fleet=f1&$top=5".to_string());
    while let Some(page) = next.take() {
        let answer = h.ok("admin", Method::GET, &page, None).await;
        trail.extend(answer["value"].as_array().cloned().unwrap_or_default());
        next = answer["nextLink"].as_str().map(String::from);
    }
    let did = |subject: &str, method: &str, path: &str| {
        trail.iter().any(|e| {
            e["subject"] == subject
                && e["method"] == method
                && e["path"].as_str().is_some_and(|p| p.starts_with(path))
                && e["time"].is_string()
                && e["status"]
                    .as_u64()
                    .is_some_and(|s| (200..300).contains(&s))
        })
    };
    assert!(
        did("operator-user", "POST", "/v1/fleets/f1/updateRuns/r1/start"),
        "{trail:?}"
    );
    assert!(
        did("approver-user", "PATCH", "/v1/fleets/f1/gates/"),
        "{trail:?}"
    );
    assert!(
        did("operator-user", "DELETE", "/v1/fleets/f1/updateRuns/r1"),
        "{trail:?}"
    );
    assert!(did("admin-user", "PUT", "/v1/fleets/f1"), "{trail:?}");
    let approval = trail
        .iter()
        .find(|e| e["method"] == "PATCH" && e["subject"] == "approver-user")
        .expect("the approval");
    assert_eq!(approval["body"]["properties"]["state"], "Completed");
    assert!(
        trail
            .iter()
            .all(|e| e["subject"] != "reader-user" && e["method"] != "GET"),
        "{trail:?}"
    );
    assert!(
        trail
            .windows(2)
            .all(|w| w[0]["id"].as_i64() < w[1]["id"].as_i64()),
        "oldest first"
    );
    let (status, body, _) = h.call("admin", Method::GET, "/v1/audit?$top=0", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _, _) = h.call("operator", Method::GET, "/v1/audit", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "the trail is the admins'");
    let later = h
        .ok(
            "admin",
            Method::GET,
            "/v1/audit?since=2999-01-01T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(later["value"], json!([]));
}

#[tokio::test]
async fn skip_and_stop_actions_follow_the_engine() {
    let h = Harness::start("actions").await;
    let clusters = [
        ("c1", cluster("1.30.5")),
        ("c2", cluster("1.30.5")),
        ("c3", cluster("1.30.5")),
    ];
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&clusters)),
    )
    .await;
    for i in 1..=3 {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/m{i}"),
            Some(json!({"properties": {"clusterResourceId": format!("c{i}")}})),
        )
        .await;
    }
    let update = json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(update),
    )
    .await;
    let (status, body, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/skip",
            Some(json!({"targets": [{"type": "Member", "name": "ghost"}]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/skip",
            Some(json!({"targets": [{"type": "Planet", "name": "m1"}]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let skipped = h
        .ok(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/skip",
            Some(json!({"targets": [{"type": "Member", "name": "m3"}]})),
        )
        .await;
    assert_eq!(
        skipped["properties"]["status"]["stages"][0]["groups"][0]["members"][2]["status"]["state"],
        "Skipped"
    );
    let (status, _, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/stop",
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a run that has not started cannot be stopped"
    );
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    let done = h
        .wait_run("/v1/fleets/f1/updateRuns/r1", "completion", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    assert_eq!(done["properties"]["status"]["stages"][0]["name"], "default");
    assert_eq!(
        done["properties"]["status"]["stages"][0]["groups"][0]["members"][0]["status"]["state"],
        "Completed"
    );
    let (status, _, _) = h.call("operator", Method::PUT, "/v1/fleets/f1/updateRuns/r1", Some(json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "NodeImageOnly"}}}}))).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a started run cannot be changed"
    );
}

/// `/openapi.json` is generated from the route table; every route in it is served, answers
/// with a status its entry lists (Hardening, item 10), and every write documents its body.
#[tokio::test]
async fn every_documented_route_is_served() {
    let h = Harness::start("routes").await;
    let spec = flotilla_server::api::openapi();
    for (method, path, _, _) in flotilla_server::api::ROUTES {
        let entry = &spec["paths"][*path][*method];
        if matches!(*method, "put" | "patch") {
            assert!(
                entry["requestBody"]["content"]["application/json"]["schema"]["$ref"].is_string(),
                "{method} {path} documents no body"
            );
        }
        let answers = entry["responses"].as_object().expect("responses");
        // A delete answers 200 with no body; a sign-in step redirects (303, with Location).
        assert!(
            *method == "delete"
                || answers.contains_key("303")
                || answers
                    .iter()
                    .any(|(code, r)| code.starts_with('2') && r["content"].is_object()),
            "{method} {path} documents no answer's content"
        );
        let concrete = path
            .replace("{fleet}", "nofleet")
            .replace("{run}", "r")
            .replace("{member}", "m")
            .replace("{strategy}", "s")
            .replace("{gate}", "g")
            .replace("{webhook}", "w")
            .replace("{id}", "i");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
        let (status, body, _) = h
            .call("admin", method.clone(), &concrete, Some(json!({})))
            .await;
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(
            body["error"]["message"], "no such path",
            "{method} {path} is documented but not routed"
        );
        assert!(
            answers.contains_key(status.as_str()),
            "{method} {path} answered {status}, which its entry does not list: {body}"
        );
    }
    // A repeated query parameter is a 400 in the API's error shape, not plain text.
    let (status, body, _) = h
        .call("admin", Method::GET, "/v1/fleets?$top=1&$top=2", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "InvalidQueryParameter", "{body}");
    let (_, body, _) = h.call("admin", Method::GET, "/v1/nothing-here", None).await;
    assert_eq!(body["error"]["message"], "no such path");
}

#[tokio::test]
async fn serving_without_authentication_binds_loopback_only() {
    let dir = temp_dir("insecure");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(&dir.0.join("flotilla.db"))
            .await
            .expect("store"),
    );
    let refused = Server::start(store.clone(), "0.0.0.0:0".parse().expect("addr"), true).await;
    assert!(refused.is_err_and(|e| e.0.contains("loopback")));
    let server = Server::start(store, "127.0.0.1:0".parse().expect("addr"), true)
        .await
        .expect("loopback is fine");
    assert!(server.local_addr().is_some_and(|a| a.ip().is_loopback()));
}

#[tokio::test]
async fn a_second_server_on_the_same_sqlite_file_is_refused() {
    let dir = temp_dir("lock");
    let first = SqliteStore::open(&dir.0.join("flotilla.db"))
        .await
        .expect("first opens");
    let second = SqliteStore::open(&dir.0.join("flotilla.db")).await;
    assert!(second.is_err_and(|e| e.to_string().contains("one replica")));
    // The lock is on the file, not its name: another spelling, a symbolic link and a hard
    // link find it taken (each started a second server before, the hard link on a second,
    // diverging database).
    std::fs::create_dir_all(dir.0.join("sub")).expect("dir");
    std::os::unix::fs::symlink(dir.0.join("flotilla.db"), dir.0.join("symlink.db"))
        .expect("symlink");
    std::fs::hard_link(dir.0.join("flotilla.db"), dir.0.join("hardlink.db")).expect("hard link");
    for other in [
        dir.0.join("sub/../flotilla.db"),
        dir.0.join("symlink.db"),
        dir.0.join("hardlink.db"),
    ] {
        let again = SqliteStore::open(&other).await;
        assert!(
            again.is_err_and(|e| e.to_string().contains("one replica")),
            "{} opened a second server",
            other.display()
        );
    }
    drop(first);
    assert!(
        SqliteStore::open(&dir.0.join("flotilla.db")).await.is_ok(),
        "the lock goes with the first server"
    );
}

/// One operation per cluster at a time, across runs (SEMANTICS §3): a member another run is
/// upgrading waits as Pending, with a message naming that run, and starts when it is let go.
#[tokio::test]
async fn a_member_upgraded_by_another_run_waits_for_it() {
    let h = Harness::start("locks").await;
    // 10 s of wall time at 6000x: long enough for the test to see m1 in flight, start b and
    // see m1 wait in b on a loaded machine (0.5 s was not).
    let mut slow = cluster("1.30.5");
    slow["sim"] = json!({"durationSeconds": 60000});
    let clusters = [("c1", slow), ("c2", cluster("1.30.5"))];
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&clusters)),
    )
    .await;
    for i in 1..=2 {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/m{i}"),
            Some(json!({"properties": {"clusterResourceId": format!("c{i}")}})),
        )
        .await;
    }
    let control_plane = json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    let full = json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"}}}});
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/a",
        Some(control_plane),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/b",
        Some(full),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/a/start",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/a", "m1 in flight in a", |r| {
        r["properties"]["status"]["stages"][0]["groups"][0]["members"][0]["status"]["state"]
            == "Running"
    })
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/b/start",
        None,
    )
    .await;
    let waiting = h
        .wait_run("/v1/fleets/f1/updateRuns/b", "m1 pending in b", |r| {
            r["properties"]["status"]["stages"][0]["groups"][0]["members"][0]["status"]["state"]
                == "Pending"
        })
        .await;
    let message =
        waiting["properties"]["status"]["stages"][0]["groups"][0]["members"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    assert!(message.contains("\"a\""), "{message}");
    h.wait_run("/v1/fleets/f1/updateRuns/a", "a completes", |r| {
        r["properties"]["status"]["status"]["state"] == "Completed"
    })
    .await;
    let b = h
        .wait_run("/v1/fleets/f1/updateRuns/b", "b completes", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    // Never two operations on one cluster at once: m1's upgrade in b started after a's ended.
    let events = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateRuns/a/events",
            None,
        )
        .await;
    let a_end = events["value"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["type"] == "MemberSucceeded" && e["member"] == "m1")
        .expect("m1 done in a")["time"]
        .clone();
    let b_events = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateRuns/b/events",
            None,
        )
        .await;
    if let Some(b_start) = b_events["value"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["type"] == "MemberStarted" && e["member"] == "m1")
    {
        assert!(
            b_start["time"].as_str() >= a_end.as_str(),
            "b started m1 at {} before a finished it at {a_end}",
            b_start["time"]
        );
    }
    assert_eq!(b["properties"]["status"]["failureCount"], 0);
}

#[tokio::test]
async fn a_cluster_another_run_upgraded_is_not_upgraded_again() {
    // Three runs made at once from the same members, all to the same version: the first to
    // reach a cluster upgrades it; the others, running alongside or started afterwards from
    // their older records, find it at the target and skip it (SEMANTICS §1, §3).
    let h = Harness::start("once").await;
    let clusters = [
        ("c1", cluster("1.30.5")),
        ("c2", cluster("1.30.5")),
        ("c3", cluster("1.30.5")),
    ];
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&clusters)),
    )
    .await;
    for i in 1..=3 {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/m{i}"),
            Some(json!({"properties": {"clusterResourceId": format!("c{i}")}})),
        )
        .await;
    }
    let body = json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    for run in ["a", "b", "c"] {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/updateRuns/{run}"),
            Some(body.clone()),
        )
        .await;
    }
    for run in ["a", "b"] {
        h.ok(
            "operator",
            Method::POST,
            &format!("/v1/fleets/f1/updateRuns/{run}/start"),
            None,
        )
        .await;
    }
    let ended = |r: &Value| {
        matches!(
            r["properties"]["status"]["status"]["state"].as_str(),
            Some("Completed" | "Skipped")
        )
    };
    for run in ["a", "b"] {
        h.wait_run(&format!("/v1/fleets/f1/updateRuns/{run}"), run, ended)
            .await;
    }
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/c/start",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/c", "c", ended).await;
    let mut started = Vec::new();
    for run in ["a", "b", "c"] {
        let events = h
            .ok(
                "reader",
                Method::GET,
                &format!("/v1/fleets/f1/updateRuns/{run}/events"),
                None,
            )
            .await;
        for e in events["value"].as_array().into_iter().flatten() {
            if e["type"] == "MemberStarted" {
                started.push(e["member"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    started.sort();
    assert_eq!(started, ["m1", "m2", "m3"], "each member upgraded once");
    // The members show the clusters as upgraded.
    for i in 1..=3 {
        let m = h
            .ok(
                "reader",
                Method::GET,
                &format!("/v1/fleets/f1/members/m{i}"),
                None,
            )
            .await;
        assert_eq!(
            m["properties"]["status"]["cluster"]["kubernetesVersion"], "1.31.1",
            "m{i}: {m}"
        );
    }
}

#[tokio::test]
async fn auto_upgrade_profiles_generate_runs_for_their_channel() {
    let h = Harness::start("profiles").await;
    let mut driver = sim_fleet(&[("c1", cluster("1.30.5")), ("c2", cluster("1.29.9"))]);
    driver["properties"]["driver"]["catalog"]["eastus"]["kubernetes"] = json!([{"version": "1.29.9"}, {"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.31.2"}, {"version": "1.32.0", "preview": true}]);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(driver))
        .await;
    for i in 1..=2 {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/m{i}"),
            Some(json!({"properties": {"clusterResourceId": format!("c{i}")}})),
        )
        .await;
    }
    // Validation names the field; only admins manage profiles.
    let (status, body, _) = h
        .call(
            "admin",
            Method::PUT,
            "/v1/fleets/f1/autoUpgradeProfiles/p1",
            Some(json!({"properties": {"channel": "Rapid", "targetKubernetesVersion": "1.30"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"]["target"],
        "properties.targetKubernetesVersion"
    );
    let (status, _, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/autoUpgradeProfiles/p1",
            Some(json!({"properties": {"channel": "Rapid"}})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/rapid",
        Some(json!({"properties": {"channel": "Rapid"}})),
    )
    .await;
    let first = h
        .ok(
            "admin",
            Method::POST,
            "/v1/fleets/f1/autoUpgradeProfiles/rapid/generateUpdateRun",
            None,
        )
        .await;
    let again = h
        .ok(
            "admin",
            Method::POST,
            "/v1/fleets/f1/autoUpgradeProfiles/rapid/generateUpdateRun",
            None,
        )
        .await;
    assert_eq!(first["id"], again["id"], "nothing new: the same run");
    let run_path = first["id"].as_str().expect("a run id").to_string();
    let run = h.ok("reader", Method::GET, &run_path, None).await;
    assert_eq!(
        run["properties"]["managedClusterUpdate"]["upgrade"]["kubernetesVersion"], "1.31.2",
        "previews never count"
    );
    assert_eq!(
        run["properties"]["status"]["status"]["state"], "NotStarted",
        "generated, not started"
    );
    assert_eq!(
        run["properties"]["autoUpgradeProfileId"],
        "/v1/fleets/f1/autoUpgradeProfiles/rapid"
    );
    h.ok("operator", Method::POST, &format!("{run_path}/start"), None)
        .await;
    let done = h
        .wait_run(&run_path, "completion", |r| {
            r["properties"]["status"]["status"]["completedTime"].is_string()
        })
        .await;
    let members = &done["properties"]["status"]["stages"][0]["groups"][0]["members"];
    assert_eq!(members[0]["status"]["state"], "Completed");
    assert_eq!(
        members[1]["status"]["state"], "Skipped",
        "two minors behind: skipped"
    );
    assert!(
        members[1]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("more than one minor behind")
    );
    // A disabled profile generates nothing; Stable targets the minor before Rapid's.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/off",
        Some(json!({"properties": {"channel": "Stable", "disabled": true}})),
    )
    .await;
    let (status, _, _) = h
        .call(
            "admin",
            Method::POST,
            "/v1/fleets/f1/autoUpgradeProfiles/off/generateUpdateRun",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    // A channel that selects nothing from the fleet's releases generates nothing either.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/future",
        Some(json!({"properties": {"channel": "TargetKubernetesVersion", "targetKubernetesVersion": "1.99"}})),
    )
    .await;
    let (status, body, _) = h
        .call(
            "admin",
            Method::POST,
            "/v1/fleets/f1/autoUpgradeProfiles/future/generateUpdateRun",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("selects nothing"),
        "{body}"
    );
    h.ok(
        "admin",
        Method::DELETE,
        "/v1/fleets/f1/autoUpgradeProfiles/future",
        None,
    )
    .await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/stable",
        Some(json!({"properties": {"channel": "Stable"}})),
    )
    .await;
    let stable = h
        .ok(
            "admin",
            Method::POST,
            "/v1/fleets/f1/autoUpgradeProfiles/stable/generateUpdateRun",
            None,
        )
        .await;
    let run = h
        .ok(
            "reader",
            Method::GET,
            stable["id"].as_str().expect("id"),
            None,
        )
        .await;
    assert_eq!(
        run["properties"]["managedClusterUpdate"]["upgrade"]["kubernetesVersion"],
        "1.30.5"
    );
    let listed = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/autoUpgradeProfiles",
            None,
        )
        .await;
    assert_eq!(listed["value"].as_array().map(Vec::len), Some(3));
    h.ok(
        "admin",
        Method::DELETE,
        "/v1/fleets/f1/autoUpgradeProfiles/stable",
        None,
    )
    .await;
    h.ok(
        "reader",
        Method::GET,
        stable["id"].as_str().expect("id"),
        None,
    )
    .await;
}

/// The release feed: a profile on the Rapid channel starts a run by itself when a new patch is
/// published, once per target, and its status records the trigger.
#[tokio::test]
async fn a_profile_triggers_a_run_when_its_channel_selects_a_new_release() {
    let h = Harness::start_with(
        "feed",
        flotilla_server::Timing {
            profiles_every: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .await;
    // Published some seconds from now: time for the PUTs below and the profile's first pass
    // (which starts the 1.31.1 run) on a loaded machine, before 1.31.2 is out.
    let published =
        flotilla_engine::time::Time::from_unix(flotilla_server::clock::now().unix() + 8)
            .to_string();
    let mut driver = sim_fleet(&[("c1", cluster("1.30.5")), ("c2", cluster("1.29.9"))]);
    driver["properties"]["driver"]["catalog"]["eastus"]["kubernetes"] = json!([{"version": "1.29.9"}, {"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.31.2", "availableAt": published}]);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(driver))
        .await;
    for i in 1..=2 {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/m{i}"),
            Some(json!({"properties": {"clusterResourceId": format!("c{i}")}})),
        )
        .await;
    }
    let created = h
        .ok(
            "admin",
            Method::PUT,
            "/v1/fleets/f1/autoUpgradeProfiles/rapid",
            Some(json!({"properties": {"channel": "Rapid"}})),
        )
        .await;
    // The answer says what the profile will start and when: the run for 1.31.1 now, or (were
    // the server's pass over profiles quicker than the answer) the one for 1.31.2 when it is
    // published.
    let next = &created["properties"]["autoUpgradeProfileStatus"]["nextTrigger"];
    let now_run = next["upgradeVersions"] == json!(["1.31.1"])
        && next["updateRunName"]
            .as_str()
            .is_some_and(|r| r.starts_with("rapid-1-31-1"));
    let later_run = next["upgradeVersions"] == json!(["1.31.2"]) && next["triggersAt"] == published;
    assert!(now_run || later_run, "{created}");
    // First the current target (1.31.1), then the published patch (1.31.2), each once.
    let profile = h
        .wait_run(
            "/v1/fleets/f1/autoUpgradeProfiles/rapid",
            "the trigger for 1.31.2",
            |p| {
                p["properties"]["autoUpgradeProfileStatus"]["lastTriggerUpgradeVersions"]
                    == json!(["1.31.2"])
            },
        )
        .await;
    let status = &profile["properties"]["autoUpgradeProfileStatus"];
    assert_eq!(status["lastTriggerStatus"], "Succeeded", "{status}");
    assert!(status["lastTriggeredAt"].is_string());
    let runs = h
        .ok("reader", Method::GET, "/v1/fleets/f1/updateRuns", None)
        .await;
    let versions: Vec<&str> = runs["value"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            r["properties"]["managedClusterUpdate"]["upgrade"]["kubernetesVersion"].as_str()
        })
        .collect();
    let mut sorted = versions.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["1.31.1", "1.31.2"],
        "one run per target: {versions:?}"
    );
    for run in runs["value"].as_array().into_iter().flatten() {
        assert_eq!(
            run["properties"]["autoUpgradeProfileId"],
            "/v1/fleets/f1/autoUpgradeProfiles/rapid"
        );
        assert_ne!(
            run["properties"]["status"]["status"]["state"], "NotStarted",
            "a triggered run is started"
        );
    }
    // Both runs exist and nothing more is announced: the answer foresees no trigger.
    let again = h
        .ok(
            "admin",
            Method::PUT,
            "/v1/fleets/f1/autoUpgradeProfiles/rapid",
            Some(json!({"properties": {"channel": "Rapid"}})),
        )
        .await;
    assert!(
        again["properties"]["autoUpgradeProfileStatus"]["nextTrigger"].is_null(),
        "{again}"
    );
    // Disabling the profile touches nothing already created, and generates nothing more.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/rapid",
        Some(json!({"properties": {"channel": "Rapid", "disabled": true}})),
    )
    .await;
    let after = h
        .ok("reader", Method::GET, "/v1/fleets/f1/updateRuns", None)
        .await;
    assert_eq!(after["value"].as_array().map(Vec::len), Some(2));
}

/// The done-when of the release feed: a Rapid profile over a fleet whose `sim` driver publishes
/// a new patch (time-scaled, region by region) starts a run by itself; the run follows the
/// profile's strategy, a member two minors behind is Skipped with a message, and a member in
/// the region the patch reaches later is upgraded once it is out there.
#[tokio::test]
async fn the_sim_feed_publishing_a_patch_triggers_a_rapid_profile() {
    let h = Harness::start_with(
        "simfeed",
        flotilla_server::Timing {
            profiles_every: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .await;
    let mut west = cluster("1.31.1");
    west["region"] = json!("westeurope");
    let mut driver = sim_fleet(&[
        ("c1", cluster("1.31.1")),
        ("c2", west),
        ("c3", cluster("1.29.9")),
    ]);
    let catalog = driver["properties"]["driver"]["catalog"]["eastus"].clone();
    driver["properties"]["driver"]["catalog"]["westeurope"] = catalog;
    // 6000x: the patch is out in eastus after 12 simulated hours (7 s: time for the writes
    // below and the read that finds it unpublished on a loaded machine), westeurope 3 h later
    // (2 s).
    driver["properties"]["driver"]["releases"] = json!([
        {"at": "+12h", "kubernetesVersion": "1.31.2", "regions": {"eastus": "0s", "westeurope": "+3h"}},
    ]);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(driver))
        .await;
    for i in 1..=3 {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/m{i}"),
            Some(json!({"properties": {"clusterResourceId": format!("c{i}"), "group": "all"}})),
        )
        .await;
    }
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/updateStrategies/rings",
        Some(json!({"properties": {"strategy": {"stages": [{"name": "everyone", "groups": [{"name": "all"}]}]}}})),
    )
    .await;
    let releases = h
        .ok("reader", Method::GET, "/v1/fleets/f1/releases", None)
        .await;
    assert!(
        !releases.to_string().contains("1.31.2"),
        "not published yet: {releases}"
    );
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1/autoUpgradeProfiles/rapid",
        Some(json!({"properties": {"channel": "Rapid", "updateStrategyId": "/v1/fleets/f1/updateStrategies/rings"}})),
    )
    .await;
    let profile = h
        .wait_run(
            "/v1/fleets/f1/autoUpgradeProfiles/rapid",
            "the trigger for 1.31.2",
            |p| {
                p["properties"]["autoUpgradeProfileStatus"]["lastTriggerUpgradeVersions"]
                    == json!(["1.31.2"])
            },
        )
        .await;
    let message = profile["properties"]["autoUpgradeProfileStatus"]["lastTriggerMessage"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = message.rsplit(' ').next().unwrap_or_default().to_string();
    let run = h
        .wait_run(
            &format!("/v1/fleets/f1/updateRuns/{name}"),
            "the generated run to complete",
            |r| r["properties"]["status"]["status"]["state"] == "Completed",
        )
        .await;
    assert_eq!(
        run["properties"]["updateStrategyId"], "/v1/fleets/f1/updateStrategies/rings",
        "{run}"
    );
    assert_eq!(
        run["properties"]["status"]["stages"][0]["name"], "everyone",
        "the profile's strategy"
    );
    let members: Vec<&Value> = run["properties"]["status"]["stages"][0]["groups"][0]["members"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let member = |n: &str| {
        members
            .iter()
            .find(|m| m["name"] == n)
            .copied()
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(member("m1")["status"]["state"], "Completed");
    assert_eq!(
        member("m2")["status"]["state"],
        "Completed",
        "after westeurope got it"
    );
    assert_eq!(member("m3")["status"]["state"], "Skipped");
    assert!(
        member("m3")["message"]
            .as_str()
            .is_some_and(|m| m.contains("more than one minor behind")),
        "{}",
        member("m3")
    );
}

/// The dashboard is served at `/` without a token, with its assets under `/ui/` and their
/// content types, and a content security policy that allows no inline script; the page learns
/// the caller's role from `/v1/me`.
#[tokio::test]
async fn the_dashboard_and_its_assets_are_served() {
    let h = Harness::start("dashboard").await;
    let get = |path: &str| h.http.get(format!("{}{path}", h.base)).send();
    let page = get("/").await.expect("GET /");
    assert_eq!(page.status(), StatusCode::OK);
    let headers = page.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().expect("ascii");
    assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"));
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let html = page.text().await.expect("body");
    assert!(html.contains("<script type=\"module\" src=\"/ui/app.js\">"));
    for (asset, content_type) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("run.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ] {
        let response = get(&format!("/ui/{asset}")).await.expect("asset");
        assert_eq!(response.status(), StatusCode::OK, "{asset}");
        assert_eq!(response.headers()["content-type"], content_type, "{asset}");
        assert!(!response.text().await.expect("body").is_empty(), "{asset}");
    }
    let missing = get("/ui/nothing.js").await.expect("missing asset");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let traversal = get("/ui/..%2FCargo.toml").await.expect("traversal");
    assert_eq!(traversal.status(), StatusCode::NOT_FOUND);
    // The data is not open: the API still wants a token.
    let (status, _, _) = h.call("nobody", Method::GET, "/v1/fleets", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    for (who, subject, role) in [
        ("reader", "reader-user", "reader"),
        ("approver", "approver-user", "approver"),
    ] {
        let me = h.ok(who, Method::GET, "/v1/me", None).await;
        assert_eq!(
            me,
            json!({"subject": subject, "role": role, "grants": [{"fleets": "*", "role": role}],
                "arm": {"subscription": "00000000-0000-0000-0000-000000000000", "resourceGroup": "flotilla"}})
        );
    }
}

/// Members show their next maintenance opening, worked out from their observed window.
#[tokio::test]
async fn members_show_their_next_maintenance_opening() {
    let h = Harness::start("openings").await;
    let window = json!({"kubernetes": {"schedule": {"daily": {"intervalDays": 1}}, "durationHours": 4, "startTime": "00:00"}});
    let driver = json!({"type": "sim", "clusters": {"/c/1": {"region": "eastus", "kubernetesVersion": "1.30.5", "maintenance": window}}, "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}]}}});
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(json!({"properties": {"driver": driver}})),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/members/m1",
        Some(json!({"properties": {"clusterResourceId": "/c/1"}})),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let member = loop {
        let m = h
            .ok("reader", Method::GET, "/v1/fleets/f1/members/m1", None)
            .await;
        if !m["properties"]["status"]["cluster"].is_null() {
            break m;
        }
        assert!(Instant::now() < deadline, "member never observed: {m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let opening = &member["properties"]["status"]["maintenanceOpenings"]["kubernetes"];
    let from = opening["from"].as_str().expect("from");
    let until = opening["until"].as_str().expect("until");
    assert!(
        from.ends_with("Z") && until > from,
        "{opening} should be an opening in UTC"
    );
    let listed = h
        .ok("reader", Method::GET, "/v1/fleets/f1/members", None)
        .await;
    let listed = &listed["value"][0]["properties"]["status"]["maintenanceOpenings"]["kubernetes"];
    assert_eq!(listed["until"], opening["until"], "{listed} vs {opening}");
    // While the window is open (00:00–04:00 UTC) an opening starts now: the two reads may be a
    // second or so apart.
    assert!(
        (unix_of(&listed["from"]) - unix_of(&opening["from"])).abs() <= 5,
        "{listed} vs {opening}"
    );
}

/// A member's PATCH without If-Match lands even while the server keeps rewriting the member's
/// status (what it observes of the cluster): the read-modify-write is tried again, not answered
/// 412 for an eTag the client never named. With If-Match, a stale eTag is still refused.
#[tokio::test]
async fn a_member_patch_is_not_refused_for_the_servers_own_writes() {
    let h = Harness::start("patch-race").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("/c/1", cluster("1.30.5"))])),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/members/m1",
        Some(json!({"properties": {"clusterResourceId": "/c/1"}})),
    )
    .await;
    let store = h.store.clone();
    let writer = tokio::spawn(async move {
        for i in 0..400 {
            let status = json!({"lastObservedAt": format!("2026-03-02T00:00:{:02}Z", i % 60)});
            store
                .set_statuses(
                    "f1",
                    flotilla_server::store::Kind::Member,
                    &[("m1".to_string(), status)],
                )
                .await
                .expect("status written");
            tokio::task::yield_now().await;
        }
    });
    for i in 0..40 {
        let (status, body, _) = h
            .call(
                "operator",
                Method::PATCH,
                "/v1/fleets/f1/members/m1",
                Some(json!({"properties": {"group": format!("g{i}")}})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "patch {i}: {body}");
        assert_eq!(body["properties"]["group"], format!("g{i}"));
    }
    writer.await.expect("writer");
    let stale = h
        .http
        .patch(format!("{}/v1/fleets/f1/members/m1", h.base))
        .bearer_auth(&h.tokens["operator"])
        .header("If-Match", "\"1\"")
        .json(&json!({"properties": {"group": "late"}}))
        .send()
        .await
        .expect("sent");
    assert_eq!(stale.status(), StatusCode::PRECONDITION_FAILED);
}

/// SQLite serves one replica, which drives every fleet: after a crash its successor takes every
/// lease at once, however long the dead one's were, and counts no dead replica in the share. A
/// deleted fleet's lease is let go of.
#[tokio::test]
async fn a_restarted_sqlite_server_drives_every_fleet_and_lets_deleted_ones_go() {
    let dir = temp_dir("leases");
    let path = dir.0.join("flotilla.db");
    {
        let store = SqliteStore::open(&path).await.expect("store opens");
        for fleet in ["f1", "f2", "f3", "f4"] {
            store
                .put(
                    "",
                    flotilla_server::store::Kind::Fleet,
                    fleet,
                    &json!({"name": fleet, "properties": {"driver": {"type": "sim"}}}),
                    &flotilla_server::store::Precondition::None,
                )
                .await
                .expect("fleet stored");
            // A replica that then died, holding every fleet for an hour.
            assert!(
                store
                    .acquire_lease(fleet, "ghost", Duration::from_secs(3600))
                    .await
                    .expect("lease")
                    .is_some()
            );
        }
        store
            .heartbeat("ghost", Duration::from_secs(3600))
            .await
            .expect("heartbeat");
    }
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await.expect("reopens"));
    let server = Server::start(store.clone(), "127.0.0.1:0".parse().expect("addr"), true)
        .await
        .expect("server starts");
    let mut held = server.state.runs.replica.held_fleets();
    held.sort();
    assert_eq!(held, ["f1", "f2", "f3", "f4"]);
    let me = server.state.runs.replica.id.clone();
    let addr = server.local_addr().expect("bound");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async move {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    let deleted = http
        .delete(format!("http://{addr}/v1/fleets/f4"))
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), StatusCode::OK);
    let leases: Value = http
        .get(format!("http://{addr}/v1/leases"))
        .send()
        .await
        .expect("leases")
        .json()
        .await
        .expect("json");
    for lease in leases["value"].as_array().expect("leases") {
        assert_eq!(lease["owner"], json!(me), "{lease}");
        let expired = lease["fleet"] == "f4";
        assert_eq!(lease["expired"], json!(expired), "{lease}");
        // Taken at a new epoch, which fences off anything the dead replica had in flight.
        assert_eq!(lease["epoch"], json!(2), "{lease}");
    }
    let _ = stop.send(());
}

/// API.md "Batch registration": members imported in one transaction, all or nothing, a
/// rejection naming the item; a cluster id unique in its fleet, compared case-insensitively,
/// on imports and on single PUTs alike.
#[tokio::test]
async fn members_are_imported_in_batches_and_cluster_ids_are_unique() {
    let h = Harness::start("import").await;
    let fleet = json!({"properties": {"driver": {"type": "sim", "timeScale": 6000,
        "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}}}});
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(fleet))
        .await;
    let item = |i: usize, id: &str| json!({"name": format!("m{i:04}"), "properties": {"clusterResourceId": id, "group": "g", "labels": {"ring": (i % 3).to_string()}}});
    let batch: Vec<Value> = (0..2000)
        .map(|i| item(i, &format!("/sub/rg/c{i}")))
        .collect();
    let (status, answer, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/importMembers",
            Some(json!({"value": batch})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, json!({"created": 2000, "updated": 0}));
    let page = h
        .ok("reader", Method::GET, "/v1/fleets/f1/members?$top=5", None)
        .await;
    assert_eq!(page["value"][0]["name"], "m0000");
    assert_eq!(page["value"][0]["properties"]["labels"]["ring"], "0");

    // All or nothing: a bad item, a duplicate inside the batch, a clash with a member already
    // registered (another case), each refused with the item's path, and nothing written.
    for (items, status, target) in [
        (
            vec![
                item(5000, "/sub/rg/new"),
                json!({"name": "m5001", "properties": {"group": "g"}}),
            ],
            StatusCode::BAD_REQUEST,
            "value[1].properties.clusterResourceId",
        ),
        (
            vec![item(5000, "/sub/rg/x"), item(5001, "/SUB/rg/X")],
            StatusCode::BAD_REQUEST,
            "value[1].properties.clusterResourceId",
        ),
        (
            vec![item(5000, "/sub/rg/y"), item(5001, "/sub/RG/C7")],
            StatusCode::CONFLICT,
            "value[1].properties.clusterResourceId",
        ),
        (
            vec![item(5000, "/sub/rg/z"), item(3, "/sub/rg/c3")],
            StatusCode::CONFLICT,
            "value[1].name",
        ),
        (
            vec![json!({"name": "Bad Name", "properties": {"clusterResourceId": "x"}})],
            StatusCode::BAD_REQUEST,
            "value[0].name",
        ),
    ] {
        let (got, error, _) = h
            .call(
                "operator",
                Method::POST,
                "/v1/fleets/f1/importMembers",
                Some(json!({"value": items})),
            )
            .await;
        assert_eq!(got, status, "{error}");
        assert_eq!(error["error"]["target"], target, "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(target)),
            "{error}"
        );
        assert_eq!(
            count_members(&h).await,
            2000,
            "a refused import wrote nothing"
        );
    }

    // Upsert replaces (keeping what was observed) and cannot move a member to another cluster.
    let (status, answer, _) = h
        .call("operator", Method::POST, "/v1/fleets/f1/importMembers",
              Some(json!({"mode": "Upsert", "value": [item(1, "/sub/rg/c1"), item(9000, "/sub/rg/c9000")]})))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, json!({"created": 1, "updated": 1}));
    let (status, error, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/importMembers",
            Some(json!({"mode": "Upsert", "value": [item(1, "/sub/rg/elsewhere")]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(
        error["error"]["target"],
        "value[0].properties.clusterResourceId"
    );
    for (body, status) in [
        (
            json!({"value": [], "mode": "Merge"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"value": (0..10_001).map(|i| item(i, &format!("/s/{i}"))).collect::<Vec<_>>()}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"members": []}), StatusCode::BAD_REQUEST),
    ] {
        let (got, error, _) = h
            .call(
                "operator",
                Method::POST,
                "/v1/fleets/f1/importMembers",
                Some(body),
            )
            .await;
        assert_eq!(got, status, "{error}");
    }
    let (status, _, _) = h
        .call(
            "reader",
            Method::POST,
            "/v1/fleets/f1/importMembers",
            Some(json!({"value": []})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // A single PUT follows the same rule; deleting the holder frees the id.
    let (status, error, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/members/other",
            Some(json!({"properties": {"clusterResourceId": "/Sub/Rg/C2"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error["error"]["target"], "properties.clusterResourceId");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("m0002")),
        "{error}"
    );
    h.ok(
        "operator",
        Method::DELETE,
        "/v1/fleets/f1/members/m0002",
        None,
    )
    .await;
    let (status, _, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/members/other",
            Some(json!({"properties": {"clusterResourceId": "/Sub/Rg/C2"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
}

/// Every member of fleet `f1`, page after page.
async fn count_members(h: &Harness) -> usize {
    let mut n = 0;
    let mut next = Some("/v1/fleets/f1/members?$top=1000".to_string());
    while let Some(path) = next {
        let page = h.ok("reader", Method::GET, &path, None).await;
        n += page["value"].as_array().map_or(0, Vec::len);
        next = page["nextLink"]
            .as_str()
            .map(|l| l.trim_start_matches(&h.base).to_string());
    }
    n
}

/// Hardening item 3: in `--insecure-no-auth` a page on another site could mint an admin token
/// with a `text/plain` POST (a CORS simple request), and a DNS-rebinding page could read
/// answers. The server now refuses other hosts (421), state changes from other origins (403)
/// and bodies that are not JSON (415), in every mode; its own pages and the CLI are unaffected.
#[tokio::test]
async fn cross_site_requests_and_foreign_hosts_are_refused() {
    let dir = temp_dir("origin");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(&dir.0.join("flotilla.db"))
            .await
            .expect("store"),
    );
    let server = Server::start(store.clone(), "127.0.0.1:0".parse().expect("addr"), true)
        .await
        .expect("server");
    let addr = server.local_addr().expect("bound");
    tokio::spawn(server.serve(std::future::pending()));
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let raw = |method: Method, path: &str| http.request(method, format!("{base}{path}"));
    // A cross-site simple request: text/plain, the page's Origin.
    let response = raw(Method::POST, "/v1/tokens")
        .header("Origin", "http://evil.example")
        .header("Content-Type", "text/plain")
        .body(r#"{"role": "admin"}"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // A page served from any IP address is another site too (DNS rebinding needs a name, but a
    // page on a public IP needs none).
    let response = raw(Method::POST, "/v1/fleets/f1/updateRuns/r1/stop")
        .header("Origin", "http://203.0.113.7")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // The same without an Origin (a script, not a browser) still needs JSON.
    let response = raw(Method::POST, "/v1/tokens")
        .header("Content-Type", "text/plain")
        .body(r#"{"role": "admin"}"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        store.list_tokens().await.expect("tokens").is_empty(),
        "no token was minted"
    );
    // A rebinding page reaches the server under its own name.
    let response = raw(Method::GET, "/v1/fleets")
        .header("Host", "rebind.evil.example:8080")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);
    // The server's own page (same origin), localhost, and a bodiless action are fine.
    let response = raw(Method::PUT, "/v1/fleets/f1")
        .header("Origin", base.as_str())
        .json(&json!({"properties": {"driver": {"type": "sim", "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}]}},
            "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}}}}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
    let response = raw(Method::GET, "/v1/fleets")
        .header("Host", format!("localhost:{}", addr.port()))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let response = raw(Method::PUT, "/v1/fleets/f1/members/m1")
        .json(&json!({"properties": {"clusterResourceId": "c1"}}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
    let run = json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    let response = raw(Method::PUT, "/v1/fleets/f1/updateRuns/r1")
        .json(&run)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
    let response = raw(Method::POST, "/v1/fleets/f1/updateRuns/r1/stop")
        .send()
        .await
        .expect("sent");
    assert_eq!(
        response.status(),
        StatusCode::CONFLICT,
        "a bodiless action reaches the run (which is not running)"
    );
}

/// Hardening items 9 and 12 over HTTP: a key given twice, a cluster id that could split a log
/// line or read as an option, a token subject with terminal escapes or of 900 KB, and an exec
/// driver on a server that allows no exec commands are each refused with a 400 naming what,
/// and change nothing.
#[tokio::test]
async fn input_hygiene() {
    let h = Harness::start("hygiene").await;
    let raw = |method: Method, path: &str, who: &str, body: &str| {
        h.http
            .request(method, format!("{}{path}", h.base))
            .bearer_auth(&h.tokens[who])
            .header("Content-Type", "application/json")
            .body(body.to_string())
    };
    let fleet = r#"{"properties": {"driver": {"type": "sim", "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}}}}"#;
    let response = raw(Method::PUT, "/v1/fleets/f1", "admin", fleet)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
    let twice = r#"{"properties": {"clusterResourceId": "c1", "clusterResourceId": "c2"}}"#;
    let response = raw(Method::PUT, "/v1/fleets/f1/members/m1", "operator", twice)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("twice")),
        "{body}"
    );
    for id in ["c1\nINJECTED", "--help", "c1\u{1b}[2J"] {
        let (status, error, _) = h
            .call(
                "operator",
                Method::PUT,
                "/v1/fleets/f1/members/m1",
                Some(json!({"properties": {"clusterResourceId": id}})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{id:?}: {error}");
        assert_eq!(error["error"]["target"], "properties.clusterResourceId");
    }
    for subject in ["\u{1b}]0;owned\u{7}".to_string(), "x".repeat(900_000)] {
        let (status, error, _) = h
            .call(
                "admin",
                Method::POST,
                "/v1/tokens",
                Some(json!({"role": "reader", "subject": subject})),
            )
            .await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE,
            "{status} {error}"
        );
    }
    let (status, error, _) = h
        .call(
            "admin",
            Method::POST,
            "/v1/tokens",
            Some(json!({"role": "reader", "subject": "\u{1b}[31mred"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["target"], "subject");
    let exec = json!({"properties": {"driver": {"type": "exec", "observe": ["/bin/sh", "-c", "rm -rf ~"], "upgrade": ["/bin/true"], "poll": ["/bin/true"]}}});
    let (status, error, _) = h
        .call("admin", Method::PUT, "/v1/fleets/f2", Some(exec))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--exec-allow")),
        "{error}"
    );
    let (status, _, _) = h.call("reader", Method::GET, "/v1/fleets/f2", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let tokens = h.ok("admin", Method::GET, "/v1/tokens", None).await;
    assert_eq!(
        tokens["value"].as_array().map(Vec::len),
        Some(4),
        "{tokens}"
    );
}

#[tokio::test]
async fn a_member_that_cannot_be_observed_refuses_only_the_runs_that_select_it() {
    let h = Harness::start("unobservable").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    // m2's cluster is not one the driver can reach.
    for (member, id, group) in [("m1", "c1", "ok"), ("m2", "c-gone", "broken")] {
        let (status, body, _) = h
            .call(
                "operator",
                Method::PUT,
                &format!("/v1/fleets/f1/members/{member}"),
                Some(json!({"properties": {"clusterResourceId": id, "group": group}})),
            )
            .await;
        assert!(status.is_success(), "{member}: {status} {body}");
    }
    let run = |group: &str| {
        json!({"properties": {
            "strategy": {"stages": [{"name": "s", "groups": [{"name": group}]}]},
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
        }})
    };
    // A run that does not select m2 is made, and runs to its end.
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/fine",
        Some(run("ok")),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/fine/start",
        None,
    )
    .await;
    let done = h
        .wait_run("/v1/fleets/f1/updateRuns/fine", "the run completes", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    let members = &done["properties"]["status"]["stages"][0]["groups"][0]["members"];
    assert_eq!(members.as_array().map(Vec::len), Some(1), "{members}");
    // A run that selects it is refused, naming it, and nothing is created.
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/stuck",
            Some(run("broken")),
        )
        .await;
    assert!(status.is_client_error(), "{status} {body}");
    assert!(body.to_string().contains("m2"), "{body}");
    let (status, _, _) = h
        .call(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateRuns/stuck",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn pages_of_stored_resources_carry_etags_and_link_to_the_next() {
    let h = Harness::start("pages").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    for name in ["a", "b", "c"] {
        h.ok(
            "admin",
            Method::PUT,
            &format!("/v1/fleets/f1/updateStrategies/{name}"),
            Some(json!({"properties": {"strategy": {"stages": [{"name": name, "groups": [{"name": format!("g-{name}")}]}]}}})),
        )
        .await;
    }
    let first = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateStrategies?$top=2",
            None,
        )
        .await;
    let names: Vec<&str> = first["value"]
        .as_array()
        .expect("value")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(names, ["a", "b"], "{first}");
    // Each item's eTag is the one a GET of it answers.
    let (_, _, headers) = h
        .call(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateStrategies/a",
            None,
        )
        .await;
    assert_eq!(
        first["value"][0]["eTag"].as_str(),
        headers.get("etag").and_then(|v| v.to_str().ok())
    );
    let link = first["nextLink"].as_str().expect("a next page");
    let second = h.ok("reader", Method::GET, link, None).await;
    assert_eq!(second["value"].as_array().map(Vec::len), Some(1));
    assert_eq!(second["value"][0]["name"], "c");
    assert!(second.get("nextLink").is_none(), "{second}");
}

/// The dispatch delays are a histogram per trigger (Hardening, item 13): cumulative buckets
/// ending in `+Inf` equal to `_count`, a `_sum`, and counts that add up to no more than the
/// upgrades sent, at least one of them sent on the run's start.
fn check_dispatch_histogram(metrics: &str, started: u64) {
    let name = "flotilla_dispatch_delay_seconds";
    assert!(
        metrics.contains(&format!("# TYPE {name} histogram")),
        "{metrics}"
    );
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");
    let mut buckets: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with(name)) {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().expect("a number");
        let labels = &series[series.find('{').expect("labels") + 1..series.len() - 1];
        let trigger = labels
            .split(',')
            .find_map(|l| l.strip_prefix("trigger=\""))
            .expect("a trigger label")
            .trim_end_matches('"')
            .to_string();
        if series.starts_with(&format!("{name}_bucket")) {
            let le = labels
                .split(',')
                .find_map(|l| l.strip_prefix("le=\""))
                .expect("le");
            buckets
                .entry(trigger)
                .or_default()
                .push((le.trim_end_matches('"').to_string(), value));
        } else if series.starts_with(&format!("{name}_count")) {
            counts.insert(trigger, value);
        } else if series.starts_with(&format!("{name}_sum")) {
            sums.insert(trigger, value);
        }
    }
    assert!(counts.contains_key("action"), "{metrics}");
    for (trigger, count) in &counts {
        let b = &buckets[trigger];
        assert!(b.windows(2).all(|w| w[0].1 <= w[1].1), "{trigger}: {b:?}");
        assert_eq!(
            b.last().map(|(le, v)| (le.as_str(), *v)),
            Some(("+Inf", *count))
        );
        assert!(
            sums.get(trigger).is_some_and(|s| *s >= 0.0),
            "{trigger} has no sum"
        );
    }
    let total: f64 = counts.values().sum();
    assert!(
        total >= 1.0 && total <= started as f64,
        "{total} of {started}: {metrics}"
    );
}

/// A run created right after an import, before the server's own observation of the imported
/// members is done, observes the rest itself (many at once, recorded in batches) and selects
/// every member; a large run's answer is kept by eTag, and a read after any change sees the new
/// document, never the kept one.
#[tokio::test]
async fn a_run_made_right_after_an_import_selects_every_member_and_reads_stay_current() {
    let h = Harness::start("import-run").await;
    let mut fleet = sim_fleet(&[]);
    fleet["properties"]["driver"]["defaultCluster"] = cluster("1.30.5");
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(fleet))
        .await;
    let members = 3000;
    let batch: Vec<Value> = (0..members)
        .map(|i| json!({"name": format!("m{i:04}"), "properties": {"clusterResourceId": format!("/sub/rg/c{i}"), "group": format!("g{}", i % 3)}}))
        .collect();
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/importMembers",
        Some(json!({"value": batch})),
    )
    .await;
    let groups: Vec<Value> = (0..3)
        .map(|g| json!({"name": format!("g{g}"), "maxConcurrency": "50%"}))
        .collect();
    let run = json!({"properties": {
        "strategy": {"stages": [{"name": "s", "groups": groups}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
    }});
    let (status, created, headers) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r",
            Some(run),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let selected: usize = created["properties"]["status"]["stages"][0]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["members"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(selected, members, "every imported member is selected");
    // Every member's cluster is recorded, whoever observed it.
    for name in ["m0000", "m1500", "m2999"] {
        let member = h
            .ok(
                "reader",
                Method::GET,
                &format!("/v1/fleets/f1/members/{name}"),
                None,
            )
            .await;
        assert_eq!(
            member["properties"]["status"]["cluster"]["kubernetesVersion"], "1.30.5",
            "{name}: {member}"
        );
    }
    // The answer to the creation is the stored document; reads of it, unchanged, are the same.
    let etag = headers["etag"].to_str().expect("eTag").to_string();
    let path = "/v1/fleets/f1/updateRuns/r";
    for _ in 0..2 {
        let (status, read, headers) = h.call("reader", Method::GET, path, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["etag"].to_str().expect("eTag"), etag);
        assert_eq!(read, created);
    }
    // Every later read shows the run as stored at that moment: a kept answer is never served
    // once the run changed.
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r/start",
        None,
    )
    .await;
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, read, headers) = h.call("reader", Method::GET, path, None).await;
        let read_etag = headers["etag"].to_str().expect("eTag").to_string();
        let (text, stored_etag) = h
            .store
            .get_raw("f1", flotilla_server::store::Kind::Run, "r")
            .await
            .expect("store")
            .expect("run");
        if stored_etag == read_etag {
            let mut stored: Value = serde_json::from_str(&text).expect("JSON");
            stored["eTag"] = json!(stored_etag);
            assert_eq!(
                read, stored,
                "the read at eTag {read_etag} is the stored document"
            );
        } else {
            // Written between the two reads: the store's is newer.
            let number = |e: &str| e.trim_matches('"').parse::<u64>().expect("a numbered eTag");
            assert!(number(&read_etag) < number(&stored_etag));
        }
        seen.insert(read_etag);
        let state = read["properties"]["status"]["status"]["state"].clone();
        if state == "Completed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not complete: {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.len() > 1, "the run's reads followed its changes");
    assert!(!seen.contains(&etag));
}

/// SEMANTICS §11 through the API: a run that has not started is forecast from now with the
/// durations the `sim` driver expects, an Approval gate approved `approvalDelaySeconds` after
/// it is reached, one member at a time in the second stage; the answer gives every time, what
/// each member waits for and the critical path. Bad parameters are refused by name.
#[tokio::test]
async fn a_run_is_forecast_before_it_starts() {
    let h = Harness::start("forecast").await;
    let sim = |version: &str, seconds: u64| {
        let mut c = cluster(version);
        c["sim"] = json!({"durationSeconds": seconds});
        c
    };
    let mut fleet = sim_fleet(&[
        ("c-a1", sim("1.30.5", 600)),
        ("c-b1", sim("1.30.5", 1200)),
        ("c-b2", sim("1.30.5", 300)),
    ]);
    fleet["properties"]["driver"]["timeScale"] = json!(1);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(fleet))
        .await;
    for (name, group) in [("a1", "canary"), ("b1", "prod"), ("b2", "prod")] {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/{name}"),
            Some(json!({"properties": {"clusterResourceId": format!("c-{name}"), "group": group}})),
        )
        .await;
    }
    let strategy = json!({"stages": [
        {"name": "canary", "groups": [{"name": "canary"}]},
        {"name": "prod", "beforeGates": [{"type": "Approval"}], "groups": [{"name": "prod", "maxConcurrency": "1"}]},
    ]});
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(json!({"properties": {"strategy": strategy,
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
    )
    .await;
    let path = "/v1/fleets/f1/updateRuns/r1/forecast";
    let forecast = h
        .ok(
            "reader",
            Method::POST,
            path,
            Some(json!({"approvalDelaySeconds": 900})),
        )
        .await;
    let at = unix_of;
    let t0 = at(&forecast["computedAt"]);
    assert_eq!(at(&forecast["completedTime"]) - t0, 3000, "{forecast}");
    let member = |stage: usize, i: usize| &forecast["stages"][stage]["groups"][0]["members"][i];
    let times = |m: &Value| (at(&m["startTime"]) - t0, at(&m["completedTime"]) - t0);
    assert_eq!(times(member(0, 0)), (0, 600));
    assert_eq!(
        times(member(1, 0)),
        (1500, 2700),
        "approved 900 s after 600"
    );
    assert_eq!(times(member(1, 1)), (2700, 3000), "one at a time");
    assert_eq!(member(0, 0)["waitsFor"], json!([]));
    assert_eq!(member(1, 0)["waitsFor"], json!(["Gate"]));
    assert_eq!(member(1, 1)["waitsFor"], json!(["Slot", "Gate"]));
    let path_kinds: Vec<(&str, i64, i64)> = forecast["criticalPath"]
        .as_array()
        .expect("a critical path")
        .iter()
        .map(|s| {
            (
                s["kind"].as_str().unwrap_or_default(),
                at(&s["from"]) - t0,
                at(&s["to"]) - t0,
            )
        })
        .collect();
    assert_eq!(
        path_kinds,
        [
            ("Member", 0, 600),
            ("Gate", 600, 1500),
            ("Member", 1500, 2700),
            ("Member", 2700, 3000)
        ]
    );
    assert_eq!(forecast["assumptions"]["durations"]["driver"], 3);
    assert_eq!(forecast["assumptions"]["approvalDelaySeconds"], 900);
    // Nothing was started: the forecast touched no cluster.
    let run = h
        .ok("reader", Method::GET, "/v1/fleets/f1/updateRuns/r1", None)
        .await;
    assert_eq!(run["properties"]["status"]["status"]["state"], "NotStarted");
    // Bad parameters and unknown runs.
    for (body, field) in [
        (
            json!({"defaultDurationSeconds": 0}),
            "defaultDurationSeconds 0",
        ),
        (
            json!({"approvalDelaySeconds": -1}),
            "approvalDelaySeconds -1",
        ),
        (
            json!({"approvalDelaySeconds": 99_999_999}),
            "approvalDelaySeconds 99999999",
        ),
        (json!({"horizon": 1}), "horizon"),
    ] {
        let (status, answer, _) = h.call("reader", Method::POST, path, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(field),
            "{answer}"
        );
    }
    let (status, _, _) = h
        .call(
            "reader",
            Method::POST,
            "/v1/fleets/f1/updateRuns/nope/forecast",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // What if both groups went in one stage? A run body, not created.
    let what_if = h
        .ok(
            "reader",
            Method::POST,
            "/v1/fleets/f1/forecast",
            Some(json!({"run": {"properties": {
                "strategy": {"stages": [{"name": "all", "groups": [{"name": "canary"}, {"name": "prod"}]}]},
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}}})),
        )
        .await;
    let t0 = at(&what_if["computedAt"]);
    // Both groups at once, each one member at a time: prod's 1200 + 300 s decide.
    assert_eq!(at(&what_if["completedTime"]) - t0, 1500, "{what_if}");
    let runs = h
        .ok("reader", Method::GET, "/v1/fleets/f1/updateRuns", None)
        .await;
    assert_eq!(
        runs["value"].as_array().map(Vec::len),
        Some(1),
        "nothing was created"
    );
    for (body, needle) in [
        (json!({"approvalDelaySeconds": 1}), "run is required"),
        (
            json!({"run": {"properties": {"strategy": {"stages": []},
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}}}),
            "run.properties.strategy",
        ),
        (
            json!({"run": {"properties": {"managedClusterUpdate": {"upgrade": {"type": "Sideways"}}}}}),
            "run.properties.managedClusterUpdate",
        ),
    ] {
        let (status, answer, _) = h
            .call("reader", Method::POST, "/v1/fleets/f1/forecast", Some(body))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(needle),
            "{answer}"
        );
    }
}

/// Durations of upgrades that succeeded are recorded per member and upgrade type, and a later
/// forecast of the same type takes each member's from them (SEMANTICS §11).
#[tokio::test]
async fn a_forecast_reads_the_fleets_upgrade_history() {
    let h = Harness::start("forecast-history").await;
    let mut fleet = sim_fleet(&[("c-a1", cluster("1.30.5")), ("c-a2", cluster("1.30.5"))]);
    fleet["properties"]["driver"]["catalog"]["eastus"]["kubernetes"] =
        json!([{"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.32.0"}]);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(fleet))
        .await;
    for name in ["a1", "a2"] {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/{name}"),
            Some(json!({"properties": {"clusterResourceId": format!("c-{name}")}})),
        )
        .await;
    }
    let upgrade = |version: &str| json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": version}}}});
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(upgrade("1.31.1")),
    )
    .await;
    let before = h
        .ok(
            "reader",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/forecast",
            None,
        )
        .await;
    assert_eq!(before["assumptions"]["durations"]["history"], 0, "{before}");
    assert_eq!(before["assumptions"]["durations"]["driver"], 2, "{before}");
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/r1", "r1 to complete", |r| {
        r["properties"]["status"]["status"]["state"] == "Completed"
    })
    .await;
    // The run that ended has nothing to forecast.
    let (status, _, _) = h
        .call(
            "reader",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/forecast",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r2",
        Some(upgrade("1.32.0")),
    )
    .await;
    let after = h
        .ok(
            "reader",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r2/forecast",
            None,
        )
        .await;
    assert_eq!(after["assumptions"]["durations"]["history"], 2, "{after}");
    assert_eq!(after["assumptions"]["durations"]["driver"], 0, "{after}");
    // Each took about 0.1 s (600 simulated seconds at 6000x), recorded in whole seconds of
    // event times (a second or two on a loaded machine): the run ends within seconds, not after
    // the driver's 600 s or the default 1800 s.
    assert!(
        unix_of(&after["completedTime"]) - unix_of(&after["computedAt"]) <= 30,
        "{after}"
    );
}

/// A chained member's history is its hops (SEMANTICS §11, §13): the forecast counts each hop
/// as one upgrade of the run's type, so each hop's duration is recorded as it ends (its own
/// start to its own end, as the run's status shows it), and the chain as a whole is not, which
/// would count a chain of three as one upgrade three times as long.
#[tokio::test]
async fn a_chained_member_s_history_is_one_upgrade_per_hop() {
    let h = Harness::start("forecast-hops").await;
    // A hop of 7200 simulated seconds lasts 1.2 s at 6000x: the hops of a member end in
    // different seconds, which the history tells apart (it keys by the second of the end).
    let mut slow = cluster("1.29.9");
    slow["sim"] = json!({"durationSeconds": 7200});
    let mut fleet = sim_fleet(&[("c-a1", slow.clone()), ("c-a2", slow)]);
    fleet["properties"]["driver"]["catalog"]["eastus"]["kubernetes"] = json!([
        {"version": "1.29.9"}, {"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.32.0"}
    ]);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(fleet))
        .await;
    for name in ["a1", "a2"] {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/{name}"),
            Some(json!({"properties": {"clusterResourceId": format!("c-{name}")}})),
        )
        .await;
    }
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(json!({"properties": {
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.32.0"}},
            "chainMinorVersions": true,
        }})),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    let run = h
        .wait_run("/v1/fleets/f1/updateRuns/r1", "r1 to complete", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    let history = h
        .store
        .upgrade_durations("f1", "ControlPlaneOnly")
        .await
        .expect("history");
    for name in ["a1", "a2"] {
        let member = run["properties"]["status"]["stages"][0]["groups"][0]["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {run}"));
        let hops = member["hops"].as_array().expect("hops");
        assert_eq!(hops.len(), 3, "{member}");
        // Newest first, as the history keeps them.
        let expected: Vec<i64> = hops
            .iter()
            .rev()
            .map(|hop| unix_of(&hop["completedTime"]) - unix_of(&hop["startTime"]))
            .collect();
        assert_eq!(
            history.members.get(name),
            Some(&expected),
            "{name}: one duration per hop, each the hop's own: {member}"
        );
    }
    assert_eq!(
        history.fleet.len(),
        6,
        "six hops, six upgrades: {history:?}"
    );
}

/// The Unix seconds of an RFC 3339 time in a document.
fn unix_of(v: &Value) -> i64 {
    flotilla_engine::time::Time::parse(v.as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{v}: {e}"))
        .unix()
}

/// What a resource says, with what a write itself changes (its eTag, who changed it last and
/// when) left out.
fn content(v: &Value) -> Value {
    let mut v = v.clone();
    // A member's PUT observes its cluster again (as `member reconcile` does): when, is not
    // content.
    if let Some(status) = v
        .get_mut("properties")
        .and_then(|p| p.get_mut("status"))
        .and_then(Value::as_object_mut)
    {
        status.remove("lastObservedAt");
    }
    if let Some(map) = v.as_object_mut() {
        map.remove("eTag");
        if let Some(system) = map.get_mut("systemData").and_then(Value::as_object_mut) {
            for key in ["lastModifiedAt", "lastModifiedBy", "lastModifiedByType"] {
                system.remove(key);
            }
        }
    }
    v
}

/// Fleet Manager's ARM paths (API.md): the same resources under
/// `/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.ContainerService/fleets`,
/// matched case-insensitively, with ARM ids, absolute links, ARM status codes and a default
/// driver; a GET→PUT round trip of every kind on both path styles changes nothing.
#[tokio::test]
async fn fleet_managers_arm_paths_serve_the_same_resources() {
    let clusters: Vec<(String, Value)> = (1..=5)
        .map(|i| (format!("/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c{i}"), cluster("1.30.5")))
        .collect();
    let as_refs: Vec<(&str, Value)> = clusters
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let driver = sim_fleet(&as_refs)["properties"]["driver"].clone();
    let settings = flotilla_server::home::Settings {
        default_driver: Some(driver),
        ..Default::default()
    };
    let h = Harness::start_arm(
        "arm",
        flotilla_server::Timing {
            profiles_every: Duration::from_secs(3600),
            ..Default::default()
        },
        Some(settings),
    )
    .await;
    let v = "api-version=2026-06-01";
    let arm = "/subscriptions/s1/resourceGroups/RG1/providers/Microsoft.ContainerService/fleets";
    // api-version is required; no other subscription's paths than Fleet Manager's.
    let (status, body, _) = h
        .call("admin", Method::GET, &format!("{arm}/f1"), None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "MissingApiVersionParameter");
    assert_eq!(
        h.status(
            "admin",
            Method::GET,
            &format!("{arm}/f1/listCredentials?{v}"),
            None
        )
        .await,
        StatusCode::NOT_FOUND
    );
    // Unauthenticated: refused before anything is looked up.
    assert_eq!(
        h.status("nobody", Method::GET, &format!("{arm}/f1?{v}"), None)
            .await,
        StatusCode::UNAUTHORIZED
    );
    // A fleet as Fleet Manager's clients create it: no driver (the server's default), a
    // location, tags, identity, a hub profile; the name's case is not the fleet's.
    let (status, fleet, _) = h
        .call(
            "admin",
            Method::PUT,
            &format!("{arm}/F1?{v}"),
            Some(json!({"location": "eastus", "tags": {"team": "platform"},
                "identity": {"type": "None"}, "properties": {"hubProfile": {"dnsPrefix": "f1"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{fleet}");
    let fleet_id = format!("{arm}/f1");
    assert_eq!(fleet["id"], fleet_id);
    assert_eq!(fleet["location"], "eastus");
    assert_eq!(fleet["properties"]["driver"]["type"], "sim");
    assert_eq!(fleet["systemData"]["createdBy"], "admin-user");
    assert!(fleet.get("x-flotilla").is_none(), "{fleet}");
    // Paths match case-insensitively; under another subscription or group the fleet is absent.
    let upper =
        "/SUBSCRIPTIONS/s1/RESOURCEGROUPS/rg1/PROVIDERS/microsoft.containerservice/FLEETS/f1";
    let got = h
        .ok("reader", Method::GET, &format!("{upper}?{v}"), None)
        .await;
    assert_eq!(got["id"], fleet_id);
    assert_eq!(
        got["tags"],
        json!({"team": "platform"}),
        "a tag is the user's, as written"
    );
    let other =
        "/subscriptions/s2/resourceGroups/RG1/providers/Microsoft.ContainerService/fleets/f1";
    assert_eq!(
        h.status("reader", Method::GET, &format!("{other}?{v}"), None)
            .await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.status(
            "admin",
            Method::PUT,
            &format!("{other}?{v}"),
            Some(json!({}))
        )
        .await,
        StatusCode::CONFLICT
    );
    assert_eq!(
        h.status("admin", Method::DELETE, &format!("{other}?{v}"), None)
            .await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        h.ok("reader", Method::GET, "/v1/fleets/f1", None).await["name"],
        "f1"
    );
    // Roles hold there too: a reader deletes nothing, creates nothing, of any home.
    assert_eq!(
        h.status(
            "reader",
            Method::DELETE,
            &format!("{other}/members/m0?{v}"),
            None
        )
        .await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        h.status(
            "reader",
            Method::PUT,
            &format!("{other}?{v}"),
            Some(json!({}))
        )
        .await,
        StatusCode::FORBIDDEN
    );
    // A fleet's name spelt otherwise (percent-encoded) is no fleet: it cannot slip past its home.
    assert_eq!(h.status("admin", Method::DELETE, &format!("/subscriptions/s2/resourceGroups/RG1/providers/Microsoft.ContainerService/fleets/%66%31?{v}"), None).await, StatusCode::NOT_FOUND);
    assert_eq!(
        h.ok("reader", Method::GET, "/v1/fleets/f1", None).await["name"],
        "f1"
    );
    // A raw non-ASCII path is answered, not a dropped connection.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = h.base.trim_start_matches("http://");
        let mut socket = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        socket
            .write_all(
                "GET /subscriptions/é HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                    .as_bytes(),
            )
            .await
            .expect("sent");
        let mut answer = Vec::new();
        socket.read_to_end(&mut answer).await.expect("an answer");
        assert!(
            answer.starts_with(b"HTTP/1.1 "),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    // The fleet lists of the subscription and the resource group; /v1 shows /v1 ids.
    for scope in ["/subscriptions/S1", "/subscriptions/s1/resourceGroups/rg1"] {
        let list = h
            .ok(
                "reader",
                Method::GET,
                &format!("{scope}/providers/Microsoft.ContainerService/fleets?{v}"),
                None,
            )
            .await;
        assert_eq!(list["value"][0]["id"], fleet_id, "{scope}");
    }
    let list = h
        .ok(
            "reader",
            Method::GET,
            &format!("/subscriptions/s2/providers/Microsoft.ContainerService/fleets?{v}"),
            None,
        )
        .await;
    assert_eq!(list["value"], json!([]));
    assert_eq!(
        h.ok("reader", Method::GET, "/v1/fleets/f1", None).await["id"],
        "/v1/fleets/f1"
    );
    // PATCH of tags.
    let patched = h
        .ok(
            "admin",
            Method::PATCH,
            &format!("{fleet_id}?{v}"),
            Some(json!({"tags": {"team": "edge"}})),
        )
        .await;
    assert_eq!(patched["tags"], json!({"team": "edge"}));
    assert_eq!(patched["location"], "eastus");
    // Members, a strategy, a run, a profile, by ARM ids.
    for (i, (id, _)) in clusters.iter().enumerate() {
        let group = if i == 0 { "canary" } else { "prod" };
        let (status, member, _) = h
            .call(
                "operator",
                Method::PUT,
                &format!("{fleet_id}/Members/m{i}?{v}"),
                Some(json!({"properties": {"clusterResourceId": id, "group": group}})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{member}");
        assert_eq!(member["id"], format!("{fleet_id}/members/m{i}"));
    }
    let strategy = json!({"stages": [
        {"name": "canary", "groups": [{"name": "canary"}], "afterGates": [{"type": "Approval", "displayName": "ok?"}]},
        {"name": "prod", "groups": [{"name": "prod"}]}]});
    h.ok(
        "operator",
        Method::PUT,
        &format!("{fleet_id}/updateStrategies/staged?{v}"),
        Some(json!({"properties": {"strategy": strategy}})),
    )
    .await;
    let strategy_id = format!("{fleet_id}/updateStrategies/staged");
    let upgrade = json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"}});
    let run = h
        .ok("operator", Method::PUT, &format!("{fleet_id}/updateRuns/r1?{v}"),
            Some(json!({"properties": {"updateStrategyId": strategy_id.to_uppercase().replace("STAGED", "staged"), "managedClusterUpdate": upgrade}})))
        .await;
    assert_eq!(run["properties"]["updateStrategyId"], strategy_id, "{run}");
    assert_eq!(run["id"], format!("{fleet_id}/updateRuns/r1"));
    h.ok("admin", Method::PUT, &format!("{fleet_id}/autoUpgradeProfiles/p1?{v}"),
        Some(json!({"properties": {"channel": "Stable", "updateStrategyId": strategy_id, "disabled": true}}))).await;
    // Child names match in any case too (Flotilla's names are lowercase).
    let upper_member = h
        .ok(
            "reader",
            Method::GET,
            &format!("{fleet_id}/MEMBERS/M0?{v}"),
            None,
        )
        .await;
    assert_eq!(upper_member["name"], "m0");
    // Paging: an absolute nextLink with the api-version, followed to the end.
    let mut seen = Vec::new();
    let mut link = format!("{fleet_id}/members?{v}&$top=2");
    loop {
        let page = h.ok("reader", Method::GET, &link, None).await;
        for m in page["value"].as_array().expect("value") {
            seen.push(m["name"].as_str().expect("name").to_string());
        }
        match page["nextLink"].as_str() {
            Some(next) => {
                assert!(
                    next.starts_with(&format!(
                        "{}{fleet_id}/members?api-version=2026-06-01&",
                        h.base
                    )),
                    "{next}"
                );
                link = next.strip_prefix(&h.base).expect("absolute").to_string();
            }
            None => break,
        }
    }
    assert_eq!(seen, ["m0", "m1", "m2", "m3", "m4"]);
    // GET→PUT of every kind, on both path styles: 200, nothing changed.
    for (kind, name) in [
        ("members", "m0"),
        ("updateStrategies", "staged"),
        ("updateRuns", "r1"),
        ("autoUpgradeProfiles", "p1"),
    ] {
        for prefix in [
            format!("/v1/fleets/f1/{kind}/{name}"),
            format!("{fleet_id}/{kind}/{name}?{v}"),
        ] {
            let before = h.ok("admin", Method::GET, &prefix, None).await;
            let (status, after, _) = h
                .call("admin", Method::PUT, &prefix, Some(before.clone()))
                .await;
            assert_eq!(status, StatusCode::OK, "{prefix}: {after}");
            assert_eq!(content(&after), content(&before), "{prefix}");
            let again = h.ok("admin", Method::GET, &prefix, None).await;
            assert_eq!(content(&again), content(&before), "{prefix}");
        }
    }
    for prefix in ["/v1/fleets/f1".to_string(), format!("{fleet_id}?{v}")] {
        let before = h.ok("admin", Method::GET, &prefix, None).await;
        let (status, after, _) = h
            .call("admin", Method::PUT, &prefix, Some(before.clone()))
            .await;
        assert_eq!(status, StatusCode::OK, "{prefix}: {after}");
        assert_eq!(content(&after), content(&before), "{prefix}");
    }
    // Start (an action with no body), approve the gate by its ARM id, run to the end.
    assert_eq!(
        h.status(
            "operator",
            Method::POST,
            &format!("{fleet_id}/updateRuns/r1/START?{v}"),
            None
        )
        .await,
        StatusCode::OK
    );
    let run_path = format!("{fleet_id}/updateRuns/r1?{v}");
    h.wait_run(&run_path, "the gate", |r| {
        r["properties"]["status"]["stages"][0]["afterGates"][0]["status"]["state"] == "Pending"
    })
    .await;
    let gates = h
        .ok(
            "reader",
            Method::GET,
            &format!("{fleet_id}/gates?{v}&$filter=properties/state eq 'Pending'"),
            None,
        )
        .await;
    let gate = &gates["value"][0];
    assert!(
        gate["id"]
            .as_str()
            .is_some_and(|id| id.starts_with(&format!("{fleet_id}/gates/"))),
        "{gate}"
    );
    assert_eq!(
        gate["properties"]["target"]["id"],
        format!("{fleet_id}/updateRuns/r1")
    );
    let approved = h
        .ok(
            "approver",
            Method::PATCH,
            &format!("{}?{v}", gate["id"].as_str().expect("id")),
            Some(json!({"properties": {"state": "Completed"}})),
        )
        .await;
    assert_eq!(
        approved["systemData"]["lastModifiedBy"], "approver-user",
        "{approved}"
    );
    let done = h
        .wait_run(&run_path, "the end", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    assert_eq!(
        done["properties"]["status"]["stages"][0]["afterGates"][0]["gateId"]
            .as_str()
            .map(|g| g.starts_with(&format!("{fleet_id}/gates/"))),
        Some(true),
        "{done}"
    );
    // Each member names its last operation, with no error.
    let member = h
        .ok(
            "reader",
            Method::GET,
            &format!("{fleet_id}/members/m3?{v}"),
            None,
        )
        .await;
    assert_eq!(
        member["properties"]["status"]["lastOperationId"], "f1.r1.4",
        "{member}"
    );
    assert!(member["properties"]["status"]["lastOperationError"].is_null());
    // A finished run, sent back as read: 200, as it is.
    let (status, same, _) = h
        .call("operator", Method::PUT, &run_path, Some(done.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{same}");
    assert_eq!(same["properties"]["status"]["status"]["state"], "Completed");
    // Deleting: profiles answer 202 (their swagger lists no 200), what is gone 204.
    assert_eq!(
        h.status(
            "admin",
            Method::DELETE,
            &format!("{fleet_id}/autoUpgradeProfiles/p1?{v}"),
            None
        )
        .await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        h.status(
            "admin",
            Method::DELETE,
            &format!("{fleet_id}/autoUpgradeProfiles/p1?{v}"),
            None
        )
        .await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        h.status(
            "operator",
            Method::DELETE,
            &format!("{fleet_id}/members/m4?{v}"),
            None
        )
        .await,
        StatusCode::OK
    );
    assert_eq!(
        h.status(
            "operator",
            Method::DELETE,
            &format!("{fleet_id}/members/m4?{v}"),
            None
        )
        .await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        h.status("operator", Method::DELETE, "/v1/fleets/f1/members/m4", None)
            .await,
        StatusCode::NOT_FOUND,
        "/v1 keeps its own answers"
    );
    // No default driver: a fleet without one is refused, naming the field.
    *h.state.arm.write().expect("settings") = Default::default();
    assert!(h.state.arm_settings().default_driver.is_none());
    let (status, body, _) = h
        .call(
            "admin",
            Method::PUT,
            &format!("{arm}/f2?{v}"),
            Some(json!({"location": "eastus"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["target"], "properties.driver");
}

/// A target the catalog cannot vouch for is warned of, in the answer's header and the run's
/// status (First hour, safety rails): a version no region lists yet is waited for, and with no
/// catalog at all it is sent as given.
#[tokio::test]
async fn a_target_no_catalog_can_vouch_for_is_warned_of() {
    let h = Harness::start("catalogwarn").await;
    let mut unknown = sim_fleet(&[("c2", cluster("1.30.5"))]);
    unknown["properties"]["driver"]["catalog"] = json!({});
    for (fleet, driver, cluster) in [
        ("f1", sim_fleet(&[("c1", cluster("1.30.5"))]), "c1"),
        ("f2", unknown, "c2"),
    ] {
        h.ok(
            "admin",
            Method::PUT,
            &format!("/v1/fleets/{fleet}"),
            Some(driver),
        )
        .await;
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/{fleet}/members/m1"),
            Some(json!({"properties": {"clusterResourceId": cluster}})),
        )
        .await;
    }
    let run = |version: &str| json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "Full", "kubernetesVersion": version}}}});
    let warnings = |v: &Value| v["properties"]["status"]["warnings"].clone();
    // Listed: nothing to warn of.
    let listed = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/listed",
            Some(run("1.31.1")),
        )
        .await;
    assert!(warnings(&listed).is_null(), "{listed}");
    // In no region's catalog: the members would wait for it.
    let (status, typo, headers) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/typo",
            Some(run("1.99.0")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{typo}");
    let said = warnings(&typo);
    assert!(
        said[0]
            .as_str()
            .is_some_and(|w| w.contains("1.99.0 is in no region's release catalog")),
        "{said}"
    );
    let header = headers
        .get("x-flotilla-warning")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(header.contains("1.99.0"), "{header:?}");
    // Kept: a GET shows it too.
    let got = h
        .ok("reader", Method::GET, "/v1/fleets/f1/updateRuns/typo", None)
        .await;
    assert_eq!(warnings(&got), said);
    // No catalog at all: sent as given, and node images left to the driver.
    let blind = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f2/updateRuns/blind",
            Some(run("1.99.0")),
        )
        .await;
    let said = warnings(&blind);
    assert!(
        said[0]
            .as_str()
            .is_some_and(|w| w.contains("cannot be checked")),
        "{said}"
    );
    assert!(
        said[1]
            .as_str()
            .is_some_and(|w| w.contains("node images cannot be chosen")),
        "{said}"
    );
}

/// The audit trail of a whole run (issue "Rollouts that watch what they break"): who started
/// it, stopped it, started it again, skipped a member and approved its gate, each with its
/// time, in order.
#[tokio::test]
async fn the_audit_trail_says_who_started_stopped_skipped_and_approved_a_run() {
    let h = Harness::start("audit-run").await;
    fleet_of(
        &h,
        &[
            ("a1", "canary", "1.30.5"),
            ("b1", "prod", "1.30.5"),
            ("b2", "prod", "1.30.5"),
        ],
    )
    .await;
    let path = "/v1/fleets/f1/updateRuns/r1";
    h.ok(
        "operator",
        Method::PUT,
        path,
        Some(json!({"properties": {
            "strategy": {"stages": [
                {"name": "canary", "groups": [{"name": "canary"}]},
                {"name": "prod", "beforeGates": [{"type": "Approval"}], "groups": [{"name": "prod"}]}]},
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
    )
    .await;
    h.ok("operator", Method::POST, &format!("{path}/start"), None)
        .await;
    h.wait_run(path, "the production gate", |r| {
        r["properties"]["status"]["stages"][1]["beforeGates"][0]["status"]["state"] == "Pending"
    })
    .await;
    h.ok("operator", Method::POST, &format!("{path}/stop"), None)
        .await;
    h.ok("operator", Method::POST, &format!("{path}/start"), None)
        .await;
    h.ok(
        "approver",
        Method::POST,
        &format!("{path}/skip"),
        Some(json!({"targets": [{"type": "Member", "name": "b2"}]})),
    )
    .await;
    let gates = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/gates?state=Pending",
            None,
        )
        .await;
    let gate = gates["value"][0]["name"]
        .as_str()
        .expect("the gate")
        .to_string();
    h.ok(
        "approver",
        Method::PATCH,
        &format!("/v1/fleets/f1/gates/{gate}"),
        Some(json!({"properties": {"state": "Completed"}})),
    )
    .await;
    h.wait_run(path, "the end", |r| {
        r["properties"]["status"]["status"]["state"] == "Completed"
    })
    .await;
    let trail = h
        .ok("admin", Method::GET, "/v1/audit?fleet=f1&$top=1000", None)
        .await;
    let actions: Vec<(String, String, String)> = trail["value"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| {
            let p = e["path"].as_str().unwrap_or_default();
            p.starts_with(path) && p != path || p.starts_with("/v1/fleets/f1/gates/")
        })
        .map(|e| {
            assert!(
                flotilla_engine::time::Time::parse(e["time"].as_str().unwrap_or("")).is_ok(),
                "{e}"
            );
            (
                e["subject"].as_str().unwrap_or_default().to_string(),
                e["method"].as_str().unwrap_or_default().to_string(),
                e["path"]
                    .as_str()
                    .unwrap_or_default()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let want = [
        ("operator-user", "POST", "start"),
        ("operator-user", "POST", "stop"),
        ("operator-user", "POST", "start"),
        ("approver-user", "POST", "skip"),
        ("approver-user", "PATCH", gate.as_str()),
    ];
    let got: Vec<(&str, &str, &str)> = actions
        .iter()
        .map(|(s, m, p)| (s.as_str(), m.as_str(), p.as_str()))
        .collect();
    assert_eq!(got, want, "{trail}");
}

/// Webhooks (API.md, "Webhooks and audit") are the admins': every other role is refused; a bad
/// body is a 400 naming its field and value and changes nothing; the secret is never shown.
#[tokio::test]
async fn webhooks_are_for_admins_and_bad_bodies_change_nothing() {
    let h = Harness::start("webhooks").await;
    let good = json!({"properties": {"url": "https://hooks.example/flotilla", "secret": "s3cret",
        "fleets": ["retail"], "events": ["RunCompleted", "GatePending"], "format": "Slack"}});
    for who in ["reader", "operator", "approver"] {
        for (method, path) in [
            (Method::PUT, "/v1/webhooks/ops"),
            (Method::GET, "/v1/webhooks/ops"),
            (Method::GET, "/v1/webhooks"),
            (Method::DELETE, "/v1/webhooks/ops"),
            (Method::GET, "/v1/webhooks/ops/deliveries"),
        ] {
            let body = (method == Method::PUT).then(|| good.clone());
            assert_eq!(
                h.status(who, method.clone(), path, body).await,
                StatusCode::FORBIDDEN,
                "{who} {method} {path}"
            );
        }
    }
    assert_eq!(
        h.status("nobody", Method::GET, "/v1/webhooks", None).await,
        StatusCode::UNAUTHORIZED
    );
    let (status, created, headers) = h
        .call("admin", Method::PUT, "/v1/webhooks/ops", Some(good.clone()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        created["properties"],
        json!({"url": "https://hooks.example/flotilla", "hasSecret": true, "fleets": ["retail"],
            "events": ["RunCompleted", "GatePending"], "format": "Slack"})
    );
    assert_eq!(created["id"], "/v1/webhooks/ops");
    assert_eq!(created["systemData"]["createdBy"], "admin-user");
    assert_eq!(
        headers
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        created["eTag"].as_str().map(String::from)
    );
    // Each bad body names its field; the webhook is as it was.
    let with = |key: &str, value: Value| {
        let mut body = good.clone();
        body["properties"][key] = value;
        body
    };
    for (body, target, value) in [
        (
            with("events", json!(["RunCompleted", "RunExploded"])),
            "properties.events[1]",
            "RunExploded",
        ),
        (
            with("url", json!("ftp://hooks.example/")),
            "properties.url",
            "ftp://",
        ),
        (
            with("format", json!("Discord")),
            "properties.format",
            "Discord",
        ),
        (
            with("fleets", json!(["Retail!"])),
            "properties.fleets[0]",
            "Retail!",
        ),
        (with("secret", json!("")), "properties.secret", ""),
        (with("colour", json!("red")), "properties.colour", "colour"),
        (json!({"url": "https://x.example"}), "url", "url"),
        (json!({}), "properties", "properties"),
    ] {
        let (status, error, _) = h
            .call("admin", Method::PUT, "/v1/webhooks/ops", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert_eq!(error["error"]["target"], target, "{body}: {error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(value)),
            "{body}: {error}"
        );
    }
    let (status, error, _) = h
        .call(
            "admin",
            Method::PUT,
            "/v1/webhooks/Not_A_Name",
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["target"], "name");
    // A new webhook needs a secret.
    let (status, error, _) = h
        .call(
            "admin",
            Method::PUT,
            "/v1/webhooks/other",
            Some(json!({"properties": {"url": "https://x.example"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["target"], "properties.secret");
    let shown = h.ok("admin", Method::GET, "/v1/webhooks/ops", None).await;
    assert_eq!(shown, created);
    assert!(!shown.to_string().contains("s3cret"), "{shown}");
    // Sent back as shown, without the secret: replaced, the secret kept.
    let (status, replaced, _) = h
        .call(
            "admin",
            Method::PUT,
            "/v1/webhooks/ops",
            Some(shown.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    assert_eq!(
        h.store
            .get_webhook("ops")
            .await
            .expect("read")
            .expect("kept")
            .secret,
        "s3cret"
    );
    assert_eq!(
        replaced["systemData"]["createdAt"],
        created["systemData"]["createdAt"]
    );
    // eTags: a stale If-Match and an If-None-Match on an existing webhook are refused.
    let mut stale = h
        .http
        .put(format!("{}/v1/webhooks/ops", h.base))
        .bearer_auth(&h.tokens["admin"])
        .header("If-Match", created["eTag"].as_str().unwrap_or_default())
        .json(&good);
    assert_eq!(
        stale.send().await.expect("sent").status(),
        StatusCode::PRECONDITION_FAILED
    );
    stale = h
        .http
        .put(format!("{}/v1/webhooks/ops", h.base))
        .bearer_auth(&h.tokens["admin"])
        .header("If-None-Match", "*")
        .json(&good);
    assert_eq!(
        stale.send().await.expect("sent").status(),
        StatusCode::PRECONDITION_FAILED
    );
    // Listed by name a page at a time; deliveries of an unknown webhook are a 404; bad queries
    // a 400 naming the parameter.
    for name in ["a", "b"] {
        h.ok(
            "admin",
            Method::PUT,
            &format!("/v1/webhooks/{name}"),
            Some(good.clone()),
        )
        .await;
    }
    let page = h
        .ok("admin", Method::GET, "/v1/webhooks?$top=2", None)
        .await;
    assert_eq!(page["value"].as_array().map(Vec::len), Some(2));
    let next = page["nextLink"].as_str().expect("a next page").to_string();
    let rest = h.ok("admin", Method::GET, &next, None).await;
    assert_eq!(rest["value"][0]["name"], "ops");
    assert!(rest.get("nextLink").is_none(), "{rest}");
    let deliveries = h
        .ok("admin", Method::GET, "/v1/webhooks/ops/deliveries", None)
        .await;
    assert_eq!(deliveries, json!({"value": []}));
    for (query, target) in [
        ("state=Lost", "state"),
        ("$top=0", "$top"),
        ("after=-1", "after"),
        ("colour=red", "colour"),
    ] {
        let (status, error, _) = h
            .call(
                "admin",
                Method::GET,
                &format!("/v1/webhooks/ops/deliveries?{query}"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
        assert_eq!(error["error"]["target"], target, "{query}: {error}");
    }
    assert_eq!(
        h.status("admin", Method::GET, "/v1/webhooks/none/deliveries", None)
            .await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.status("admin", Method::DELETE, "/v1/webhooks/ops", None)
            .await,
        StatusCode::OK
    );
    assert_eq!(
        h.status("admin", Method::GET, "/v1/webhooks/ops", None)
            .await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.status("admin", Method::DELETE, "/v1/webhooks/ops", None)
            .await,
        StatusCode::NOT_FOUND
    );
}

/// A strategy stored with checks written before check providers (they carry their own URL or
/// program) stays readable, but no run is created from it (400 naming the check) until it is
/// saved again with providers; such a body is refused as a new write too (SEMANTICS §10).
#[tokio::test]
async fn a_strategy_stored_with_inline_checks_makes_no_run() {
    let h = Harness::start("inline-checks").await;
    fleet_of(&h, &[("m1", "g", "1.30.5")]).await;
    let inline = json!({"stages": [{"name": "all", "groups": [{"name": "g"}],
        "memberHealthChecks": {"checks": [{"name": "probe", "type": "Exec",
            "command": ["/bin/sh", "-c", "id"]}]}}]});
    h.store
        .put(
            "f1",
            flotilla_server::store::Kind::Strategy,
            "old",
            &json!({"id": "/v1/fleets/f1/updateStrategies/old", "name": "old",
                "type": "Microsoft.ContainerService/fleets/updateStrategies",
                "properties": {"provisioningState": "Succeeded", "strategy": inline}}),
            &flotilla_server::store::Precondition::None,
        )
        .await
        .expect("stored as an older server wrote it");
    let read = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateStrategies/old",
            None,
        )
        .await;
    assert_eq!(
        read["properties"]["strategy"]["stages"][0]["memberHealthChecks"]["checks"][0]["command"]
            [0],
        "/bin/sh"
    );
    let at = "properties.strategy.stages[0].memberHealthChecks.checks[0].command";
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(json!({"properties": {"updateStrategyId": "/v1/fleets/f1/updateStrategies/old",
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["target"], at, "{body}");
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateStrategies/old",
            Some(json!({"properties": {"strategy": inline}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["target"], at, "{body}");
    assert_eq!(
        h.status("reader", Method::GET, "/v1/fleets/f1/updateRuns/r1", None)
            .await,
        StatusCode::NOT_FOUND
    );
}

/// Freezes (SEMANTICS §12) through the API: refused properties name the field and the value
/// and change nothing; a freeze holds the members it covers Pending, naming it, in a run
/// already going; deleting it lets them start at once.
#[tokio::test]
async fn a_freeze_holds_the_members_it_covers_until_it_is_deleted() {
    let h = Harness::start("freezes").await;
    fleet_of(&h, &[("d1", "g", "1.30.5"), ("p1", "g", "1.30.5")]).await;
    h.ok(
        "operator",
        Method::PATCH,
        "/v1/fleets/f1/members/p1",
        Some(json!({"properties": {"labels": {"env": "prod"}}})),
    )
    .await;
    for (body, target, says) in [
        (json!({"properties": {}}), "properties.start", "required"),
        (
            json!({"properties": {"start": "2026-03-02T00:00:00Z", "end": "2026-03-01T00:00:00Z"}}),
            "properties.end",
            "2026-03-01T00:00:00Z",
        ),
        (
            json!({"properties": {"start": "2026-03-02T00:00:00Z", "end": "2026-03-03T00:00:00Z", "scope": "Most"}}),
            "properties.scope",
            "Most",
        ),
        (
            json!({"properties": {"recurrence": {"schedule": {"daily": {"intervalDays": 1}}, "startTime": "00:00", "durationHours": 200}}}),
            "properties.recurrence.durationHours",
            "200",
        ),
    ] {
        let (status, answer, _) = h
            .call(
                "operator",
                Method::PUT,
                "/v1/fleets/f1/freezes/peak",
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["target"], target, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(says),
            "{answer}"
        );
    }
    assert_eq!(
        h.status("reader", Method::GET, "/v1/fleets/f1/freezes/peak", None)
            .await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.status(
            "reader",
            Method::PUT,
            "/v1/fleets/f1/freezes/peak",
            Some(json!({"properties": {"start": "2026-03-02T00:00:00Z", "end": "2026-03-03T00:00:00Z"}}))
        )
        .await,
        StatusCode::FORBIDDEN
    );
    let made = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/freezes/peak",
            Some(json!({"properties": {"start": "2020-01-01T00:00:00Z", "end": "2020-12-31T00:00:00Z",
                "selector": {"byLabel": "env=prod"}, "reason": "retail peak"}})),
        )
        .await;
    assert_eq!(made["properties"]["status"]["active"], false, "{made}");
    assert_eq!(made["properties"]["status"]["members"], 1, "{made}");
    // In force now (from yesterday for 300 days), over prod only.
    let day = |offset: i64| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64;
        flotilla_engine::time::Time::from_unix((now / 86_400 + offset) * 86_400).to_string()
    };
    let (start, end) = (day(-1), day(300));
    let made = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/freezes/peak",
            Some(json!({"properties": {"start": start, "end": end,
                "selector": {"byLabel": "env=prod"}, "reason": "retail peak"}})),
        )
        .await;
    assert_eq!(made["properties"]["status"]["active"], true, "{made}");
    assert_eq!(
        made["properties"]["status"]["nextEnd"],
        end.as_str(),
        "{made}"
    );
    let listed = h
        .ok("reader", Method::GET, "/v1/fleets/f1/freezes", None)
        .await;
    assert_eq!(listed["value"][0]["name"], "peak", "{listed}");
    // A malformed or repeated list parameter is a 400 in the API's shape, naming it.
    for path in [
        "/v1/fleets/f1/freezes?$top=null&$top=null",
        "/v1/fleets/f1/freezes?$top=0",
        "/v1/checkProviders?$top=x",
    ] {
        let (status, answer, headers) = h.call("reader", Method::GET, path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
        assert!(answer["error"]["code"].is_string(), "{path}: {answer}");
        assert_eq!(headers["content-type"], "application/json", "{path}");
    }
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(json!({"properties": {
            "strategy": {"stages": [{"name": "all", "groups": [{"name": "g", "maxConcurrency": "2"}]}]},
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    let member = |run: &Value, name: &str| -> Value {
        run["properties"]["status"]["stages"][0]["groups"][0]["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == name)
            .cloned()
            .unwrap_or_default()
    };
    let run = h
        .wait_run("/v1/fleets/f1/updateRuns/r1", "d1 done and p1 held", |r| {
            member(r, "d1")["status"]["state"] == "Completed"
                && member(r, "p1")["status"]["state"] == "Pending"
        })
        .await;
    let held = member(&run, "p1");
    assert!(
        held["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("frozen by \"peak\" (retail peak) until {end}"))),
        "{held}"
    );
    assert_eq!(
        held["waitingFor"],
        json!({"kind": "Freeze", "name": "peak", "until": end}),
        "{held}"
    );
    h.ok(
        "operator",
        Method::DELETE,
        "/v1/fleets/f1/freezes/peak",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/r1", "the run to complete", |r| {
        r["properties"]["status"]["status"]["state"] == "Completed"
    })
    .await;
}

/// Disruption budgets (SEMANTICS §12) through the API: refused properties name the field and
/// the value and change nothing; a budget's status shows its partitions; a run of three
/// members at a concurrency of three never has two in flight under a budget of one, and the
/// members it holds say so; deleting the budget removes it.
#[tokio::test]
async fn a_budget_holds_a_run_to_its_size_and_says_so() {
    let h = Harness::start("budgets").await;
    fleet_of(
        &h,
        &[
            ("a", "g", "1.30.5"),
            ("b", "g", "1.30.5"),
            ("c", "g", "1.30.5"),
        ],
    )
    .await;
    for (body, target, says) in [
        (
            json!({"properties": {}}),
            "properties.maxUnavailable",
            "required",
        ),
        (
            json!({"properties": {"maxUnavailable": "0"}}),
            "properties.maxUnavailable",
            "\"0\"",
        ),
        (
            json!({"properties": {"maxUnavailable": "1", "perValueOf": "zone"}}),
            "properties.perValueOf",
            "zone",
        ),
        (
            json!({"properties": {"maxUnavailable": "1", "selector": {"byLabel": "a in ()"}}}),
            "properties.selector.byLabel",
            "a in ()",
        ),
        (
            json!({"properties": {"maxUnavailable": "1", "maxUnavialable": "2"}}),
            "properties",
            "maxUnavialable",
        ),
    ] {
        let (status, answer, _) = h
            .call(
                "operator",
                Method::PUT,
                "/v1/fleets/f1/disruptionBudgets/one",
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(
            answer["error"]["target"]
                .as_str()
                .is_some_and(|t| t.starts_with(target)),
            "{body}: {answer}"
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(says),
            "{answer}"
        );
    }
    assert_eq!(
        h.status(
            "reader",
            Method::GET,
            "/v1/fleets/f1/disruptionBudgets/one",
            None
        )
        .await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.status(
            "reader",
            Method::PUT,
            "/v1/fleets/f1/disruptionBudgets/one",
            Some(json!({"properties": {"maxUnavailable": "1"}}))
        )
        .await,
        StatusCode::FORBIDDEN
    );
    // A webhook that wants the fleet's rule events hears of each write that was accepted.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/webhooks/rules",
        Some(json!({"properties": {"url": "https://hooks.example/flotilla", "secret": "s3cret", "fleets": ["f1"],
            "events": ["DisruptionBudgetChanged", "FreezeChanged"]}})),
    )
    .await;
    let made = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/disruptionBudgets/one",
            Some(json!({"properties": {"maxUnavailable": "1"}})),
        )
        .await;
    assert_eq!(
        made["properties"]["status"]["partitions"],
        json!([{"value": "", "members": 3, "maxUnavailable": 1, "disrupted": 0}]),
        "{made}"
    );
    let listed = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/disruptionBudgets",
            None,
        )
        .await;
    assert_eq!(listed["value"][0]["name"], "one", "{listed}");
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(json!({"properties": {
            "strategy": {"stages": [{"name": "all", "groups": [{"name": "g", "maxConcurrency": "3"}]}]},
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/r1", "the run to complete", |r| {
        r["properties"]["status"]["status"]["state"] == "Completed"
    })
    .await;
    let events = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateRuns/r1/events",
            None,
        )
        .await;
    let (mut flying, mut peak, mut held) = (0i64, 0i64, 0);
    for e in events["value"].as_array().into_iter().flatten() {
        match e["type"].as_str().unwrap_or_default() {
            "MemberStarted" => {
                flying += 1;
                peak = peak.max(flying);
            }
            "MemberSucceeded" | "MemberFailed" => flying -= 1,
            "MemberPending" => {
                let message = e["message"].as_str().unwrap_or_default();
                assert_eq!(
                    message, "disruption budget \"one\": 1 of 1 in flight",
                    "{e}"
                );
                held += 1;
            }
            _ => {}
        }
    }
    assert_eq!(peak, 1, "{events}");
    assert!(held >= 2, "b and c were held: {events}");
    h.ok(
        "operator",
        Method::DELETE,
        "/v1/fleets/f1/disruptionBudgets/one",
        None,
    )
    .await;
    assert_eq!(
        h.status(
            "reader",
            Method::GET,
            "/v1/fleets/f1/disruptionBudgets/one",
            None
        )
        .await,
        StatusCode::NOT_FOUND
    );
    let deliveries = h
        .ok("admin", Method::GET, "/v1/webhooks/rules/deliveries", None)
        .await;
    let seen: Vec<(Value, Value)> = deliveries["value"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| (d["eventType"].clone(), d["run"].clone()))
        .collect();
    // Created, then deleted: the refused writes made none.
    assert_eq!(
        seen,
        vec![
            (json!("DisruptionBudgetChanged"), json!("")),
            (json!("DisruptionBudgetChanged"), json!(""))
        ],
        "{deliveries}"
    );
}

/// The findings of a review (issue #36), each tested as its report describes it, on this file's
/// harness.
#[path = "api/review_findings.rs"]
mod review_findings;

#[path = "api/forecast_honesty.rs"]
mod forecast_honesty;

/// `If-None-Match: *` creates a run or is refused: a run not yet started is never replaced by
/// it (found by playing scenario u03 through the server, where such a write replaced the run).
#[tokio::test]
async fn a_create_only_put_never_replaces_a_run_not_started() {
    let h = Harness::start("create-only-run").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/members/m1",
        Some(json!({"properties": {"clusterResourceId": "c1"}})),
    )
    .await;
    let put = |upgrade: Value| {
        h.http
            .put(format!("{}/v1/fleets/f1/updateRuns/r1", h.base))
            .bearer_auth(&h.tokens["operator"])
            .header("If-None-Match", "*")
            .json(&json!({"properties": {"managedClusterUpdate": {"upgrade": upgrade}}}))
            .send()
    };
    let first = put(json!({"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}))
        .await
        .expect("sent");
    assert_eq!(first.status(), StatusCode::CREATED);
    let second = put(json!({"type": "NodeImageOnly"})).await.expect("sent");
    assert_eq!(second.status(), StatusCode::PRECONDITION_FAILED);
    let body: Value = second.json().await.expect("error body");
    assert!(
        body.to_string().contains("If-None-Match"),
        "the error says which condition failed: {body}"
    );
    let run = h
        .ok("reader", Method::GET, "/v1/fleets/f1/updateRuns/r1", None)
        .await;
    assert_eq!(
        run["properties"]["managedClusterUpdate"]["upgrade"]["type"], "ControlPlaneOnly",
        "the run is as first created: {run}"
    );
}

/// `chainMinorVersions` on a run (SEMANTICS §13): refused on a NodeImageOnly upgrade with the
/// field named and nothing stored; kept on the run and shown when accepted, and a PUT of the
/// same run without it is a change, not the same run.
#[tokio::test]
async fn a_chained_run_is_checked_and_keeps_its_chain() {
    let h = Harness::start("chained-run").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[("c1", cluster("1.30.5"))])),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/members/m1",
        Some(json!({"properties": {"clusterResourceId": "c1"}})),
    )
    .await;
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(json!({"properties": {
                "managedClusterUpdate": {"upgrade": {"type": "NodeImageOnly"}},
                "chainMinorVersions": true,
            }})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["target"], "properties.chainMinorVersions");
    assert_eq!(
        h.status("reader", Method::GET, "/v1/fleets/f1/updateRuns/r1", None)
            .await,
        StatusCode::NOT_FOUND,
        "nothing was stored"
    );
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(json!({"properties": {
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
                "chainMinorVersions": "yes",
            }})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let chained = json!({"properties": {
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
        "chainMinorVersions": true,
    }});
    let (status, run, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(chained.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["properties"]["chainMinorVersions"], true);
    // The same body again is the same run; without the chain it is a change.
    let (status, _, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(chained),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let plain = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(json!({"properties": {
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
            }})),
        )
        .await;
    assert!(
        plain["properties"].get("chainMinorVersions").is_none(),
        "{plain}"
    );
}

/// A member registered while its fleet's runs are driven is in the fleet engine's table at once
/// (what freezes and budgets cover, SEMANTICS §12): a freeze over its label holds it in the next
/// run, though the fleet's task read its table before the member existed.
#[tokio::test]
async fn a_member_registered_while_runs_are_driven_is_covered_by_freezes() {
    let h = Harness::start("member-joins-freeze").await;
    let slow = |version: &str| {
        let mut c = cluster(version);
        // 600 simulated hours at 6,000×: the first run holds its member for the whole test.
        c["sim"] = json!({"durationSeconds": 2_160_000});
        c
    };
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[
            ("c1", slow("1.30.5")),
            ("c2", cluster("1.30.5")),
        ])),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/members/m1",
        Some(json!({"properties": {"clusterResourceId": "c1", "labels": {"env": "dev"}}})),
    )
    .await;
    let upgrade = json!({"properties": {"managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/first",
        Some(upgrade.clone()),
    )
    .await;
    // The fleet's task starts with this run, its member table holding m1 alone.
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/first/start",
        None,
    )
    .await;
    let now = flotilla_server::clock::now();
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/freezes/peak",
        Some(json!({"properties": {
            "start": now.plus(-3600).to_string(),
            "end": now.plus(86_400).to_string(),
            "selector": {"byLabel": "env=prod"},
            "scope": "AllUpgrades",
        }})),
    )
    .await;
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/members/m2",
        Some(json!({"properties": {"clusterResourceId": "c2", "labels": {"env": "prod"}}})),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while h
        .ok("reader", Method::GET, "/v1/fleets/f1/members/m2", None)
        .await["properties"]["status"]["cluster"]
        .is_null()
    {
        assert!(Instant::now() < deadline, "m2 was never observed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/second",
        Some(upgrade),
    )
    .await;
    let second = h
        .ok(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/second/start",
            None,
        )
        .await;
    let m2 = second["properties"]["status"]["stages"][0]["groups"][0]["members"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == "m2")
        .cloned()
        .unwrap_or_default();
    assert_eq!(m2["status"]["state"], "Pending", "{m2}");
    assert!(
        m2["message"].as_str().unwrap_or_default().contains("peak"),
        "the freeze holds it by name: {m2}"
    );
}

/// A finished run rolled back through the API (SEMANTICS §15): an approver's POST makes and
/// starts its rollback run (reverse stages, one Approval gate, members that were never changed
/// left out), a second POST answers the same run, the original cannot be started again, the
/// rollback run cannot be rolled back, written or cloned, and it takes the clusters back.
#[tokio::test]
async fn a_finished_run_is_rolled_back_by_its_rollback_run() {
    let h = Harness::start("rollback-run").await;
    let offers = |version: &str| {
        let mut c = cluster(version);
        c["sim"] = json!({"durationSeconds": 60, "rollback": {"untilSeconds": 7 * 86_400}});
        c
    };
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(sim_fleet(&[
            ("c-a", offers("1.30.5")),
            ("c-b", offers("1.30.5")),
            ("c-c", offers("1.31.1")),
        ])),
    )
    .await;
    for (name, group) in [("a", "first"), ("b", "second"), ("c", "second")] {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/{name}"),
            Some(json!({"properties": {"clusterResourceId": format!("c-{name}"), "group": group}})),
        )
        .await;
    }
    let strategy = json!({"stages": [
        {"name": "s1", "groups": [{"name": "first"}]},
        {"name": "s2", "groups": [{"name": "second"}]}]});
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r1",
        Some(json!({"properties": {"strategy": strategy,
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
    )
    .await;
    let rollback = "/v1/fleets/f1/updateRuns/r1/rollback";
    // Not before it is finished or stopped.
    let (status, body, _) = h.call("approver", Method::POST, rollback, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/r1", "r1 completed", |r| {
        r["properties"]["status"]["status"]["state"] == "Completed"
    })
    .await;
    // An operator may not; an approver may.
    let (status, _, _) = h.call("operator", Method::POST, rollback, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body, _) = h
        .call("approver", Method::POST, rollback, Some(json!({"x": 1})))
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a rollback takes no body: {body}"
    );
    let made = h.ok("approver", Method::POST, rollback, None).await;
    assert_eq!(made["name"], "rollback-of-r1", "{made}");
    assert_eq!(made["properties"]["rollbackOf"], "r1");
    let status = &made["properties"]["status"];
    assert_eq!(status["rollbackOf"], "r1", "{status}");
    // Started, and waiting at its one Approval gate.
    assert_eq!(status["status"]["state"], "Pending", "{status}");
    assert_eq!(
        status["stages"][0]["beforeGates"][0]["status"]["state"], "Pending",
        "{status}"
    );
    let stages: Vec<&str> = status["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(stages, ["s2", "s1"], "reverse order: {status}");
    let members: Vec<&str> = status["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .flat_map(|s| s["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["members"].as_array().into_iter().flatten())
        .map(|m| m["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(members, ["b", "a"], "c was never changed: {status}");
    // A second request answers the same run; the original names it and cannot start again.
    let again = h.ok("approver", Method::POST, rollback, None).await;
    assert_eq!(again["name"], "rollback-of-r1");
    assert_eq!(again["eTag"], made["eTag"], "nothing changed");
    let original = h
        .ok("reader", Method::GET, "/v1/fleets/f1/updateRuns/r1", None)
        .await;
    assert_eq!(
        original["properties"]["status"]["rolledBackBy"], "rollback-of-r1",
        "{original}"
    );
    let (status, body, _) = h
        .call(
            "operator",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r1/start",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // Read-only: neither field is written, and a rollback run is not cloned.
    for field in ["rollbackOf", "rolledBackBy"] {
        let (status, body, _) = h
            .call(
                "operator",
                Method::PUT,
                "/v1/fleets/f1/updateRuns/copy",
                Some(json!({"properties": {field: "r1",
                    "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["target"], format!("properties.{field}"));
    }
    assert_eq!(
        h.status("reader", Method::GET, "/v1/fleets/f1/updateRuns/copy", None)
            .await,
        StatusCode::NOT_FOUND,
        "nothing was stored"
    );
    // What a GET of the rollback run answered, sent back to it, is the run as it is.
    let path = "/v1/fleets/f1/updateRuns/rollback-of-r1";
    let current = h.ok("reader", Method::GET, path, None).await;
    let (status, same, _) = h
        .call("operator", Method::PUT, path, Some(current.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{same}");
    assert_eq!(same["eTag"], current["eTag"]);
    // Its forecast: the approval, then b and a one after the other, in reverse stage order.
    let forecast = h
        .ok(
            "reader",
            Method::POST,
            &format!("{path}/forecast"),
            Some(json!({"approvalDelaySeconds": 600})),
        )
        .await;
    let forecast_stages: Vec<&str> = forecast["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(forecast_stages, ["s2", "s1"], "{forecast}");
    assert!(forecast["completedTime"].is_string(), "{forecast}");
    // The rollback is in the audit trail, with who asked.
    let trail = h
        .ok("admin", Method::GET, "/v1/audit?fleet=f1&$top=1000", None)
        .await;
    assert!(
        trail["value"].as_array().into_iter().flatten().any(|e| {
            e["path"] == "/v1/fleets/f1/updateRuns/r1/rollback" && e["subject"] == "approver-user"
        }),
        "{trail}"
    );
    // The rollback run waits at its Approval gate, then takes b and a back.
    let gates = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/gates?state=Pending",
            None,
        )
        .await;
    let gate = gates["value"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["properties"]["target"]["updateRunProperties"]["name"] == "rollback-of-r1")
        .and_then(|g| g["name"].as_str())
        .expect("the rollback run's gate")
        .to_string();
    h.ok(
        "approver",
        Method::PATCH,
        &format!("/v1/fleets/f1/gates/{gate}"),
        Some(json!({"properties": {"state": "Completed"}})),
    )
    .await;
    h.wait_run(path, "the rollback run completed", |r| {
        r["properties"]["status"]["status"]["state"] == "Completed"
    })
    .await;
    for (member, version) in [("a", "1.30.5"), ("b", "1.30.5"), ("c", "1.31.1")] {
        let m = h
            .ok(
                "reader",
                Method::GET,
                &format!("/v1/fleets/f1/members/{member}"),
                None,
            )
            .await;
        assert_eq!(
            m["properties"]["status"]["cluster"]["kubernetesVersion"], version,
            "{member}: {m}"
        );
    }
    // A rollback run is not rolled back in turn.
    let (status, body, _) = h
        .call("approver", Method::POST, &format!("{path}/rollback"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let events = h
        .ok(
            "reader",
            Method::GET,
            "/v1/fleets/f1/updateRuns/r1/events",
            None,
        )
        .await;
    assert!(
        events["value"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["type"] == "RollbackRunCreated"),
        "{events}"
    );
    // A run that changed nothing has nothing to roll back.
    h.ok(
        "operator",
        Method::PUT,
        "/v1/fleets/f1/updateRuns/r2",
        Some(json!({"properties": {"strategy": {"stages": [{"name": "s", "groups": [{"name": "second"}]}]},
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.30.5"}}}})),
    )
    .await;
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r2/start",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/r2", "r2 finished", |r| {
        matches!(
            r["properties"]["status"]["status"]["state"].as_str(),
            Some("Completed" | "Failed")
        )
    })
    .await;
    let (status, body, _) = h
        .call(
            "approver",
            Method::POST,
            "/v1/fleets/f1/updateRuns/r2/rollback",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

/// A run's plan at creation (#42): what it leaves to chance is said in its warnings, without
/// refusing it: a group that selects nobody, a stage threshold stricter than its group's,
/// fleet members in no group, members more than one minor behind without a chain, and a target
/// some members' regions do not list yet.
#[tokio::test]
async fn a_run_s_plan_says_what_it_leaves_to_chance() {
    let h = Harness::start("plan-warnings").await;
    let clusters = json!({
        "c-a": {"region": "eastus", "kubernetesVersion": "1.29.9"},
        "c-b": {"region": "eastus", "kubernetesVersion": "1.30.5"},
        "c-c": {"region": "westus", "kubernetesVersion": "1.30.5"},
    });
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/f1",
        Some(json!({"properties": {"driver": {"type": "sim", "timeScale": 6000,
            "catalog": {"eastus": {"kubernetes": [{"version": "1.29.9"}, {"version": "1.30.5"}, {"version": "1.31.1"}]},
                        "westus": {"kubernetes": [{"version": "1.30.5"}]}},
            "clusters": clusters}}})),
    )
    .await;
    for (name, group) in [("a", "g1"), ("b", "elsewhere"), ("c", "g2")] {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/{name}"),
            Some(json!({"properties": {"clusterResourceId": format!("c-{name}"), "group": group}})),
        )
        .await;
    }
    let (status, run, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(json!({"properties": {
                "strategy": {"stages": [{"name": "s", "groups": [
                    {"name": "g1", "maxAllowedFailures": "1"},
                    {"name": "g2"},
                    {"name": "nobody"}]}]},
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
            }})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let warnings: Vec<&str> = run["properties"]["status"]["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for expected in [
        r#"group "nobody" of stage "s" selects no member of the fleet"#,
        r#"group "g1" allows 1 failures, but its stage "s" allows 0 (maxAllowedFailures not given): the stage fails first"#,
        "1 of the fleet's 3 members are in no group of the strategy and are left out of the run (b)",
        "1 members are more than one minor behind 1.31.1 (a)",
        "1.31.1 is not listed yet in westus (1 members)",
    ] {
        assert!(
            warnings.iter().any(|w| w.starts_with(expected)),
            "{expected:?} in {warnings:#?}"
        );
    }
    // With the chain, the minor skip is no longer a surprise.
    let chained = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r2",
            Some(json!({"properties": {
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
                "chainMinorVersions": true,
            }})),
        )
        .await;
    let text = chained["properties"]["status"]["warnings"].to_string();
    assert!(!text.contains("minor behind"), "{text}");
    assert!(
        !text.contains("no group"),
        "no strategy, no group to miss: {text}"
    );
}

/// A gate its run lists but has not reached yet (SEMANTICS §5: its resource appears when the
/// run reaches it) is answered as not reached, where it is, never "does not exist"; approving
/// it is a conflict. An id no run holds still does not exist.
#[tokio::test]
async fn a_gate_not_reached_yet_says_so() {
    let h = Harness::start("gate-not-reached").await;
    fleet_of(&h, &[("a", "canary", "1.30.5"), ("b", "prod", "1.30.5")]).await;
    let run = h
        .ok(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateRuns/r1",
            Some(json!({"properties": {
                "strategy": {"stages": [
                    {"name": "canary", "groups": [{"name": "canary"}]},
                    {"name": "prod", "beforeGates": [{"type": "Approval", "displayName": "Go to production"}],
                     "groups": [{"name": "prod"}]}]},
                "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
        )
        .await;
    let gate = run["properties"]["status"]["stages"][1]["beforeGates"][0]["gateId"]
        .as_str()
        .expect("the run's status lists its gate")
        .to_string();
    let (status, body, _) = h
        .call(
            "reader",
            Method::GET,
            &format!("/v1/fleets/f1/gates/{gate}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("gate {gate} is not reached yet"))
            && message.contains(r#"the before-gate "Go to production" of stage "prod" of update run "r1" (NotStarted)"#)
            && !message.contains("does not exist"),
        "{body}"
    );
    let (status, body, _) = h
        .call(
            "approver",
            Method::PATCH,
            &format!("/v1/fleets/f1/gates/{gate}"),
            Some(json!({"properties": {"state": "Completed"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot be approved yet") && m.contains("not reached yet")),
        "{body}"
    );
    let (status, body, _) = h
        .call(
            "reader",
            Method::GET,
            "/v1/fleets/f1/gates/00000000-0000-4000-8000-000000000000",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not exist")),
        "{body}"
    );
    // Once the run reaches it, the gate is there, Pending.
    h.ok(
        "operator",
        Method::POST,
        "/v1/fleets/f1/updateRuns/r1/start",
        None,
    )
    .await;
    h.wait_run("/v1/fleets/f1/updateRuns/r1", "the gate", |r| {
        r["properties"]["status"]["stages"][1]["beforeGates"][0]["status"]["state"] == "Pending"
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body, _) = h
            .call(
                "reader",
                Method::GET,
                &format!("/v1/fleets/f1/gates/{gate}"),
                None,
            )
            .await;
        if status == StatusCode::OK {
            assert_eq!(body["properties"]["state"], "Pending", "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "{status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A stages body written as a bare array, and a cron expression as a freeze's recurring
/// schedule: 400, naming the field and the value and saying what is expected.
#[tokio::test]
async fn bare_stages_and_cron_schedules_are_refused_clearly() {
    let h = Harness::start("shapes").await;
    fleet_of(&h, &[("a", "canary", "1.30.5")]).await;
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/updateStrategies/s",
            Some(json!({"properties": {"strategy": [{"name": "canary", "groups": [{"name": "canary"}]}]}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["target"], "properties.strategy", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(r#"expected an object {"stages": [...]}"#)
            && message.contains("not an array")
            && !message.contains("expected a sequence"),
        "{body}"
    );
    let (status, body, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/f1/freezes/nights",
            Some(
                json!({"properties": {"recurrence": {"schedule": "0 3 * * 1", "durationHours": 4,
                "startTime": "03:00", "utcOffset": "+00:00"}}}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("properties.recurrence.schedule")
            && message.contains(r#"not the string "0 3 * * 1""#)
            && message.contains(r#"{"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}"#)
            && !message.contains("ScheduleSpec"),
        "{body}"
    );
}

#[path = "api/trains.rs"]
mod trains;
