//! Freezes through the real binary (SEMANTICS §12): the CLI creates one over a fleet's prod
//! members while a run goes; nothing covered starts while it is in force, also across a SIGKILL
//! of the server (the freeze is read back from the store when the fleet is driven again); its
//! deletion lets them start; bad input is refused with the field and a non-zero exit.

mod common;

use std::time::Duration;

use common::{Api, Killed, Served, serve, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

fn members(api: &Api) -> Vec<Value> {
    api.call(Method::GET, "/v1/fleets/shop/updateRuns/r1", None)
        .map(|(_, v)| {
            v["properties"]["status"]["stages"][0]["groups"][0]["members"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

fn state_of(members: &[Value], name: &str) -> String {
    members
        .iter()
        .find(|m| m["name"] == name)
        .and_then(|m| m["status"]["state"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_freeze_holds_prod_across_a_restart_until_it_is_deleted() {
    let Served {
        dir: _dir,
        database,
        port,
        log,
        api,
        server,
    } = Served::start("freezes");
    let mut server = server;
    let names = ["dev-1", "dev-2", "prod-1", "prod-2"];
    let clusters: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| {
            (
                format!("c-{n}"),
                json!({"region": "eastus", "kubernetesVersion": "1.30.5", "nodePools": [],
                       "sim": {"durationSeconds": 1}}),
            )
        })
        .collect();
    api.must(
        Method::PUT,
        "/v1/fleets/shop",
        Some(
            &json!({"properties": {"driver": {"type": "sim", "timeScale": 1,
            "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}]}},
            "clusters": clusters}}}),
        ),
    );
    for n in names {
        let env = n.split('-').next().unwrap_or_default();
        api.must(
            Method::PUT,
            &format!("/v1/fleets/shop/members/{n}"),
            Some(
                &json!({"properties": {"clusterResourceId": format!("c-{n}"), "group": "g",
                "labels": {"env": env}}}),
            ),
        );
    }
    // Refused: a field and its value named, a non-zero exit, nothing created.
    let (ok, _, err) = api.cli(&[
        "freeze",
        "create",
        "-f",
        "shop",
        "-n",
        "peak",
        "--start",
        "tomorrow",
        "--end",
        "2026-12-01T00:00:00Z",
    ]);
    assert!(
        !ok && err.contains("properties.start") && err.contains("tomorrow"),
        "{err}"
    );
    let (ok, listed, err) = api.cli(&["freeze", "list", "-f", "shop"]);
    assert!(ok, "{err}");
    assert_eq!(listed, json!([]), "nothing was created");

    // In force from yesterday for 300 days, over prod.
    let day = |offset: i64| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64;
        flotilla_engine::time::Time::from_unix((now / 86_400 + offset) * 86_400).to_string()
    };
    let (start, end) = (day(-1), day(300));
    let (ok, made, err) = api.cli(&[
        "freeze",
        "create",
        "-f",
        "shop",
        "-n",
        "peak",
        "--start",
        &start,
        "--end",
        &end,
        "--selector",
        "env=prod",
        "--reason",
        "retail peak",
    ]);
    assert!(ok, "{err}");
    assert_eq!(made["status"]["active"], true, "{made}");
    assert_eq!(made["status"]["members"], 2, "{made}");

    api.must(
        Method::PUT,
        "/v1/fleets/shop/updateRuns/r1",
        Some(&json!({"properties": {
            "strategy": {"stages": [{"name": "all", "groups": [{"name": "g", "maxConcurrency": "4"}]}]},
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}}})),
    );
    api.must(Method::POST, "/v1/fleets/shop/updateRuns/r1/start", None);
    wait_for("dev done, prod held", Duration::from_secs(30), || {
        let m = members(&api);
        state_of(&m, "dev-1") == "Completed"
            && state_of(&m, "dev-2") == "Completed"
            && state_of(&m, "prod-1") == "Pending"
            && state_of(&m, "prod-2") == "Pending"
    });
    let held = members(&api);
    let message = held
        .iter()
        .find(|m| m["name"] == "prod-1")
        .and_then(|m| m["message"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("frozen by \"peak\" (retail peak)"),
        "{message}"
    );

    // SIGKILL, and serve the same file again: the freeze still holds.
    let _ = server.0.kill();
    let _ = server.0.wait();
    server = Killed(serve(&database, port, &log, &[]));
    api.wait_ready();
    // Driven again by the new server (it holds the fleet's lease, its runs resumed) before the
    // members are looked at.
    wait_for(
        "the fleet to be driven again",
        Duration::from_secs(30),
        || {
            api.call(Method::GET, "/v1/leases", None)
                .is_ok_and(|(_, v)| {
                    v["value"].as_array().is_some_and(|l| {
                        l.iter().any(|l| {
                            l["fleet"] == "shop"
                                && l["owner"] == v["replica"]
                                && l["expired"] != true
                        })
                    })
                })
        },
    );
    // A forecast goes through the fleet's task: it has taken the run back by then.
    api.must(Method::POST, "/v1/fleets/shop/updateRuns/r1/forecast", None);
    let after = members(&api);
    for name in ["prod-1", "prod-2"] {
        assert_eq!(state_of(&after, name), "Pending", "{name} after a restart");
    }
    let events = api.must(Method::GET, "/v1/fleets/shop/updateRuns/r1/events", None);
    let prod_started: Vec<&Value> = events["value"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| {
            e["type"] == "MemberStarted"
                && e["member"].as_str().is_some_and(|m| m.starts_with("prod"))
        })
        .collect();
    assert!(
        prod_started.is_empty(),
        "started during the freeze: {prod_started:?}"
    );

    let (ok, _, err) = api.cli(&["freeze", "delete", "-f", "shop", "-n", "peak"]);
    assert!(ok && err.contains("deleted freeze peak"), "{err}");
    wait_for("the run to complete", Duration::from_secs(30), || {
        api.call(Method::GET, "/v1/fleets/shop/updateRuns/r1", None)
            .is_ok_and(|(_, v)| v["properties"]["status"]["status"]["state"] == "Completed")
    });
    drop(server);
}
