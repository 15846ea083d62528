//! Issue #42, "Forecast and dashboard honesty", over real HTTP on loopback against the real
//! router and a real SQLite file: a forecast says what it assumes at each pending gate
//! (`assumptions.approvals`, `assumptions.pendingGates`) and what each stage's start actually
//! waits for (`waitsFor`), and its answer is exactly what `/openapi.json` describes.

use reqwest::Method;
use serde_json::{Value, json};

use super::{Harness, cluster, sim_fleet, unix_of};

/// Checks `value` against `schema` of the OpenAPI document `spec`: types, `required`, `enum`,
/// nullability, and no property the schema does not name (where it names its properties).
fn conforms(spec: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return conforms(spec, &spec["components"]["schemas"][name], value, at);
    }
    if value.is_null() {
        return if schema["nullable"] == true || schema.get("type").is_none() {
            Ok(())
        } else {
            Err(format!("{at}: null, but not nullable in {schema}"))
        };
    }
    let fits = match schema["type"].as_str() {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some(other) => return Err(format!("{at}: unknown type {other}")),
    };
    if !fits {
        return Err(format!("{at}: {value} is not a {}", schema["type"]));
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let Some(object) = value.as_object() {
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            if !object.contains_key(key) {
                return Err(format!("{at}: required {key} is missing from {value}"));
            }
        }
        if let Some(properties) = schema["properties"].as_object() {
            for (key, v) in object {
                let Some(s) = properties.get(key) else {
                    return Err(format!("{at}: {key} is not described by the schema"));
                };
                conforms(spec, s, v, &format!("{at}.{key}"))?;
            }
        }
    }
    if let Some(items) = value.as_array() {
        for (i, v) in items.iter().enumerate() {
            conforms(spec, &schema["items"], v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

/// A canary stage, then production behind an Approval gate. While the canary upgrades,
/// production waits for it and for the gate (not reached yet), and nothing is assumed of a
/// pending gate; once the gate is pending, production waits for it alone, and the end holds
/// "if approved now". Each answer conforms to the schema `/openapi.json` serves.
#[tokio::test]
async fn a_forecast_says_what_each_stage_waits_for_and_what_it_assumes_of_pending_gates() {
    let h = Harness::start("forecast-honesty").await;
    let sim = |seconds: u64| {
        let mut c = cluster("1.30.5");
        c["sim"] = json!({"durationSeconds": seconds});
        c
    };
    // One simulated second per real second: the canary's upgrade takes 3 s.
    let mut fleet = sim_fleet(&[("c-a1", sim(3)), ("c-b1", sim(600))]);
    fleet["properties"]["driver"]["timeScale"] = json!(1);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(fleet))
        .await;
    for (name, group) in [("a1", "canary"), ("b1", "prod")] {
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
        {"name": "production", "beforeGates": [{"type": "Approval", "displayName": "Canary looks healthy"}],
         "groups": [{"name": "prod"}]},
    ]});
    let body = json!({"properties": {"strategy": strategy,
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    // A what-if forecast of the run waits as the created run will: 2 s, not 20 minutes.
    let what_if = h
        .ok(
            "reader",
            Method::POST,
            "/v1/fleets/f1/forecast",
            Some(json!({"run": body.clone()})),
        )
        .await;
    let span = unix_of(&what_if["completedTime"]) - unix_of(&what_if["computedAt"]);
    assert!(
        span < 1200,
        "the what-if waits the unscaled 1,200 s: {what_if}"
    );
    let run = "/v1/fleets/f1/updateRuns/r1";
    h.ok("operator", Method::PUT, run, Some(body)).await;
    h.ok("operator", Method::POST, &format!("{run}/start"), None)
        .await;
    let spec = h.ok("reader", Method::GET, "/openapi.json", None).await;
    let schema = json!({"$ref": "#/components/schemas/Forecast"});

    let forecast = h
        .ok("reader", Method::POST, &format!("{run}/forecast"), None)
        .await;
    conforms(&spec, &schema, &forecast, "forecast").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(forecast["assumptions"]["approvals"], "IfApprovedNow");
    assert_eq!(
        forecast["assumptions"]["pendingGates"],
        json!([]),
        "no gate is pending while the canary upgrades: {forecast}"
    );
    let holds = &forecast["stages"][1]["waitsFor"];
    let kinds: Vec<&str> = holds
        .as_array()
        .expect("production's waitsFor")
        .iter()
        .map(|h| h["kind"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(kinds, ["Stage", "Approval"], "only what holds it: {holds}");
    assert_eq!(holds[0]["stage"], "canary");
    assert_eq!(holds[1]["state"], "NotStarted");
    assert_eq!(holds[1]["displayName"], "Canary looks healthy");
    let computed = unix_of(&forecast["computedAt"]);
    for hold in holds.as_array().into_iter().flatten() {
        assert!(
            unix_of(&hold["until"]) >= computed,
            "never before now: {hold}"
        );
    }
    assert_eq!(forecast["stages"][0]["waitsFor"], json!([]));

    // The canary is done; the gate is pending.
    h.wait_run(run, "the gate to be pending", |r| {
        r["properties"]["status"]["stages"][1]["beforeGates"][0]["status"]["state"] == "Pending"
    })
    .await;
    let forecast = h
        .ok("reader", Method::POST, &format!("{run}/forecast"), None)
        .await;
    conforms(&spec, &schema, &forecast, "forecast").unwrap_or_else(|e| panic!("{e}"));
    let now = unix_of(&forecast["computedAt"]);
    let holds = &forecast["stages"][1]["waitsFor"];
    assert_eq!(
        holds.as_array().map(Vec::len),
        Some(1),
        "the gate alone: {holds}"
    );
    assert_eq!(holds[0]["kind"], "Approval");
    assert_eq!(holds[0]["state"], "Pending");
    assert_eq!(
        unix_of(&holds[0]["until"]),
        now,
        "approved now, by assumption"
    );
    let pending = &forecast["assumptions"]["pendingGates"];
    assert_eq!(pending.as_array().map(Vec::len), Some(1), "{pending}");
    assert_eq!(pending[0]["type"], "Approval");
    assert_eq!(pending[0]["assumed"], "ApprovedNow");
    assert_eq!(pending[0]["gateId"], holds[0]["gateId"]);
    // Production's upgrade takes what the fleet's history says (the canary's 3 s).
    let upgrade = unix_of(&forecast["completedTime"]) - now;
    assert!(upgrade > 0, "{forecast}");

    // With a delay, it says so.
    let forecast = h
        .ok(
            "reader",
            Method::POST,
            &format!("{run}/forecast"),
            Some(json!({"approvalDelaySeconds": 3600})),
        )
        .await;
    conforms(&spec, &schema, &forecast, "forecast").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(forecast["assumptions"]["approvals"], "IfApprovedAfterDelay");
    assert_eq!(
        forecast["assumptions"]["pendingGates"][0]["assumed"],
        "ApprovedAfterDelay"
    );
    let now = unix_of(&forecast["computedAt"]);
    assert_eq!(unix_of(&forecast["completedTime"]), now + 3600 + upgrade);
}

/// Issue #42, "Demo": on a `sim` fleet a stage's wait is shortened by the driver's `timeScale`
/// as its upgrades are. At 600 simulated seconds per real second, a 1,200 s wait takes about
/// 2 real seconds, not 20 minutes; the status still says what the strategy asked for.
#[tokio::test]
async fn a_wait_on_a_simulated_fleet_scales_with_its_time_scale() {
    let h = Harness::start("wait-scaled").await;
    let mut fleet = sim_fleet(&[("c-a1", cluster("1.30.5")), ("c-b1", cluster("1.30.5"))]);
    fleet["properties"]["driver"]["timeScale"] = json!(600);
    h.ok("admin", Method::PUT, "/v1/fleets/f1", Some(fleet))
        .await;
    for (name, group) in [("a1", "canary"), ("b1", "prod")] {
        h.ok(
            "operator",
            Method::PUT,
            &format!("/v1/fleets/f1/members/{name}"),
            Some(json!({"properties": {"clusterResourceId": format!("c-{name}"), "group": group}})),
        )
        .await;
    }
    let strategy = json!({"stages": [
        {"name": "canary", "groups": [{"name": "canary"}], "afterStageWaitInSeconds": 1200},
        {"name": "production", "groups": [{"name": "prod"}]},
    ]});
    let body = json!({"properties": {"strategy": strategy,
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}});
    // A what-if forecast of the run waits as the created run will: 2 s, not 20 minutes.
    let what_if = h
        .ok(
            "reader",
            Method::POST,
            "/v1/fleets/f1/forecast",
            Some(json!({"run": body.clone()})),
        )
        .await;
    let span = unix_of(&what_if["completedTime"]) - unix_of(&what_if["computedAt"]);
    assert!(
        span < 1200,
        "the what-if waits the unscaled 1,200 s: {what_if}"
    );
    let run = "/v1/fleets/f1/updateRuns/r1";
    h.ok("operator", Method::PUT, run, Some(body)).await;
    h.ok("operator", Method::POST, &format!("{run}/start"), None)
        .await;
    // wait_run's deadline is 30 s: far less than the 20 minutes of an unscaled wait.
    let done = h
        .wait_run(run, "the run to complete", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    let wait = &done["properties"]["status"]["stages"][0]["afterStageWaitStatus"];
    assert_eq!(wait["waitDurationInSeconds"], 1200, "{wait}");
    assert_eq!(wait["status"]["state"], "Completed", "{wait}");
    let lasted = unix_of(&wait["status"]["completedTime"]) - unix_of(&wait["status"]["startTime"]);
    assert!(
        (1..=3).contains(&lasted),
        "1,200 simulated seconds at 600 per real second: {lasted} s"
    );
    // The status says when the scaled wait ends (the dashboard counts down to it): 1,200 s at
    // 600 per second is 2 s after its start.
    assert_eq!(
        unix_of(&wait["endsAt"]) - unix_of(&wait["status"]["startTime"]),
        2,
        "{wait}"
    );
}
