//! Release trains through the API (SEMANTICS §14), over real HTTP on loopback against the real
//! router, a real SQLite file and `sim` fleets: what a profile's upstream must be, what a profile
//! others follow may not do, and a promotion at its soak's end with exactly what its upstream
//! validated, its provenance, its events and its audit entry.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Harness, cluster, sim_fleet};

/// A `sim` fleet whose catalog lists 1.31.1 and newer images than its clusters have.
fn train_fleet(clusters: &[(&str, &str)], images: &[&str]) -> Value {
    let clusters: Vec<(&str, Value)> = clusters.iter().map(|(id, v)| (*id, cluster(v))).collect();
    let mut fleet = sim_fleet(&clusters);
    let images: Vec<Value> = std::iter::once("202602.10.0")
        .chain(images.iter().copied())
        .map(|v| json!({"version": v}))
        .collect();
    fleet["properties"]["driver"]["catalog"]["eastus"]["nodeImages"] =
        json!({"AKSUbuntu-2204gen2containerd": images});
    fleet
}

async fn member(h: &Harness, fleet: &str, name: &str, cluster: &str) {
    h.ok(
        "operator",
        Method::PUT,
        &format!("/v1/fleets/{fleet}/members/{name}"),
        Some(json!({"properties": {"clusterResourceId": cluster}})),
    )
    .await;
}

/// A refused write's status and error, checked; answers the message.
async fn refused(
    h: &Harness,
    method: Method,
    path: &str,
    body: Option<Value>,
    status: StatusCode,
) -> String {
    let (got, answer, _) = h.call("admin", method.clone(), path, body).await;
    assert_eq!(got, status, "{method} {path}: {answer}");
    answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_downstream_profile_promotes_exactly_what_its_upstream_validated_after_the_soak() {
    let h = Harness::start_with(
        "trains",
        flotilla_server::Timing {
            profiles_every: std::time::Duration::from_millis(500),
            ..Default::default()
        },
    )
    .await;
    // Prod lists a newer image than staging ever saw: prod must get staging's.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/staging",
        Some(train_fleet(&[("s1", "1.30.5")], &["202603.01.0"])),
    )
    .await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/prod",
        Some(train_fleet(
            &[("p1", "1.30.5"), ("p2", "1.30.5")],
            &["202603.01.0", "202604.01.0"],
        )),
    )
    .await;
    member(&h, "staging", "m1", "s1").await;
    member(&h, "prod", "m1", "p1").await;
    member(&h, "prod", "m2", "p2").await;
    let upstream_id = "/v1/fleets/staging/autoUpgradeProfiles/rapid";
    let follow = |channel: &str, id: &str, soak: i64| json!({"properties": {"channel": channel, "upstream": {"profileId": id, "soakSeconds": soak}}});

    // An upstream that does not exist, a channel other than the upstream's, a soak out of range.
    let missing = refused(
        &h,
        Method::PUT,
        "/v1/fleets/prod/autoUpgradeProfiles/rapid",
        Some(follow("Rapid", upstream_id, 3)),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(
        missing.contains("properties.upstream.profileId") && missing.contains("does not exist"),
        "{missing}"
    );
    // Staging's profile, disabled until prod's is in place.
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/staging/autoUpgradeProfiles/rapid",
        Some(json!({"properties": {"channel": "Rapid", "disabled": true}})),
    )
    .await;
    let channel = refused(
        &h,
        Method::PUT,
        "/v1/fleets/prod/autoUpgradeProfiles/rapid",
        Some(follow("Stable", upstream_id, 3)),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(
        channel.contains("properties.channel") && channel.contains("Rapid"),
        "{channel}"
    );
    let soak = refused(
        &h,
        Method::PUT,
        "/v1/fleets/prod/autoUpgradeProfiles/rapid",
        Some(follow("Rapid", upstream_id, -5)),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(soak.contains("properties.upstream.soakSeconds"), "{soak}");
    // Only an admin makes a profile follow another.
    let (status, _, _) = h
        .call(
            "operator",
            Method::PUT,
            "/v1/fleets/prod/autoUpgradeProfiles/rapid",
            Some(follow("Rapid", upstream_id, 3)),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/prod/autoUpgradeProfiles/rapid",
        Some(follow("Rapid", upstream_id, 3)),
    )
    .await;

    // A cycle is named; the upstream keeps its channel, its profile and its fleet.
    let cycle = refused(
        &h,
        Method::PUT,
        upstream_id,
        Some(follow(
            "Rapid",
            "/v1/fleets/prod/autoUpgradeProfiles/rapid",
            0,
        )),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(
        cycle.contains("cycle")
            && cycle.contains(
                "/v1/fleets/staging/autoUpgradeProfiles/rapid → /v1/fleets/prod/autoUpgradeProfiles/rapid → /v1/fleets/staging/autoUpgradeProfiles/rapid"
            ),
        "{cycle}"
    );
    for (method, path, body) in [
        (Method::DELETE, upstream_id, None),
        (Method::DELETE, "/v1/fleets/staging", None),
        (
            Method::PUT,
            upstream_id,
            Some(json!({"properties": {"channel": "Stable"}})),
        ),
    ] {
        let message = refused(&h, method.clone(), path, body, StatusCode::CONFLICT).await;
        assert!(
            message.contains("/v1/fleets/prod/autoUpgradeProfiles/rapid"),
            "{method} {path}: {message}"
        );
    }
    // Asked by hand before anything is validated, the downstream profile says why not.
    let waiting = refused(
        &h,
        Method::POST,
        "/v1/fleets/prod/autoUpgradeProfiles/rapid/generateUpdateRun",
        None,
        StatusCode::CONFLICT,
    )
    .await;
    assert!(waiting.contains("validated nothing yet"), "{waiting}");

    // A webhook that wants the promotions (its receiver is not there: the deliveries wait).
    h.ok(
        "admin",
        Method::PUT,
        "/v1/webhooks/trains",
        Some(
            json!({"properties": {"url": "http://127.0.0.1:9/trains", "secret": "s3cret",
            "events": ["PromotionScheduled", "PromotionStarted"]}}),
        ),
    )
    .await;
    // Staging's run upgrades its member to 1.31.1 and the newest image it knows, and validates.
    h.ok(
        "admin",
        Method::PUT,
        upstream_id,
        Some(json!({"properties": {"channel": "Rapid"}})),
    )
    .await;
    let profile = h
        .wait_run(
            "/v1/fleets/prod/autoUpgradeProfiles/rapid",
            "prod's profile to see staging's validated run",
            |p| p["properties"]["autoUpgradeProfileStatus"]["upstream"]["soakEndsAt"].is_string(),
        )
        .await;
    let standing = profile["properties"]["autoUpgradeProfileStatus"]["upstream"].clone();
    assert_eq!(
        standing["validatedTarget"],
        json!(["1.31.1", "AKSUbuntu-2204gen2containerd-202603.01.0"]),
        "{standing}"
    );
    let upstream_run = standing["validatedBy"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let upstream = h.ok("reader", Method::GET, &upstream_run, None).await;
    let ended = &upstream["properties"]["status"]["endedOn"];
    assert_eq!(ended["validates"], true, "{ended}");
    let validated_at = upstream["properties"]["status"]["status"]["completedTime"].clone();
    assert_eq!(standing["validatedAt"], validated_at);
    let soak_ends =
        flotilla_engine::time::Time::parse(standing["soakEndsAt"].as_str().unwrap_or(""))
            .expect("soakEndsAt is a time");
    let completed = flotilla_engine::time::Time::parse(validated_at.as_str().unwrap_or(""))
        .expect("completedTime is a time");
    assert_eq!(soak_ends.unix() - completed.unix(), 3, "{standing}");

    // At the soak's end prod's run is created and started, pinned to staging's versions even
    // though prod's catalog has a newer image, and it says where they come from.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let runs = loop {
        let runs = h
            .ok("reader", Method::GET, "/v1/fleets/prod/updateRuns", None)
            .await;
        if runs["value"].as_array().is_some_and(|v| !v.is_empty()) {
            break runs;
        }
        if std::time::Instant::now() > deadline {
            let profile = h
                .ok(
                    "reader",
                    Method::GET,
                    "/v1/fleets/prod/autoUpgradeProfiles/rapid",
                    None,
                )
                .await;
            panic!("no promoted run; prod's profile: {profile}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let promoted = runs["value"][0].clone();
    assert_eq!(runs["value"].as_array().map(Vec::len), Some(1), "{runs}");
    let update = &promoted["properties"]["managedClusterUpdate"];
    assert_eq!(update["upgrade"]["kubernetesVersion"], "1.31.1", "{update}");
    assert_eq!(update["nodeImageSelection"]["type"], "Custom", "{update}");
    assert_eq!(
        update["nodeImageSelection"]["customNodeImageVersions"],
        json!([{"version": "AKSUbuntu-2204gen2containerd-202603.01.0"}]),
        "{update}"
    );
    let from = &promoted["properties"]["status"]["promotedFrom"];
    assert_eq!(from["runId"], upstream_run.as_str(), "{from}");
    assert_eq!(from["completedTime"], validated_at, "{from}");
    assert_eq!(from["imagesPinned"], true, "{from}");
    let started = flotilla_engine::time::Time::parse(
        promoted["systemData"]["createdAt"].as_str().unwrap_or(""),
    )
    .expect("createdAt");
    assert!(
        started >= soak_ends,
        "created {started}, soak ends {soak_ends}"
    );
    let path = format!(
        "/v1/fleets/prod/updateRuns/{}",
        promoted["name"].as_str().unwrap_or_default()
    );
    let done = h
        .wait_run(&path, "the promoted run to complete", |r| {
            r["properties"]["status"]["status"]["state"] == "Completed"
        })
        .await;
    assert_eq!(
        done["properties"]["status"]["endedOn"]["nodeImageVersions"],
        json!([{"version": "AKSUbuntu-2204gen2containerd-202603.01.0"}]),
        "prod's members end on staging's image, not the newer one prod lists"
    );
    // Each promotion event is queued once for the webhook.
    let deliveries = h
        .ok("admin", Method::GET, "/v1/webhooks/trains/deliveries", None)
        .await;
    let mut types: Vec<&str> = deliveries["value"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["type"].as_str().or(d["eventType"].as_str()))
        .collect();
    types.sort();
    assert_eq!(
        types,
        ["PromotionScheduled", "PromotionStarted"],
        "{deliveries}"
    );
    // The promotion is in the audit trail as the system's write.
    let audit = h
        .ok("admin", Method::GET, "/v1/audit?fleet=prod", None)
        .await;
    let entry = audit["value"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["subject"] == "system (release train)");
    let entry = entry.unwrap_or_else(|| panic!("no promotion in the audit trail: {audit}"));
    assert_eq!(
        entry["path"],
        "/v1/fleets/prod/autoUpgradeProfiles/rapid/generateUpdateRun"
    );
    assert_eq!(entry["body"]["updateRun"], path.as_str());
}

/// What a downstream profile will do, and when, before it does it: its create answer's
/// `nextTrigger` is the promoted run at the soak's end, not its channel's newest release, and
/// asked by hand it says when the soak ends.
#[tokio::test]
async fn a_soaking_downstream_profile_foresees_its_promotion_at_the_soak_end() {
    let h = Harness::start_with(
        "train-forecast",
        flotilla_server::Timing {
            profiles_every: std::time::Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    // Prod also lists 1.31.2, which its own channel would pick: it must not.
    let mut prod = train_fleet(&[("p1", "1.30.5")], &["202603.01.0"]);
    prod["properties"]["driver"]["catalog"]["eastus"]["kubernetes"] =
        json!([{"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.31.2"}]);
    h.ok("admin", Method::PUT, "/v1/fleets/prod", Some(prod))
        .await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/staging",
        Some(train_fleet(&[("s1", "1.30.5")], &["202603.01.0"])),
    )
    .await;
    member(&h, "staging", "m1", "s1").await;
    member(&h, "prod", "m1", "p1").await;
    h.ok(
        "admin",
        Method::PUT,
        "/v1/fleets/staging/autoUpgradeProfiles/rapid",
        Some(json!({"properties": {"channel": "Rapid"}})),
    )
    .await;
    // Written in the ARM form, kept in the /v1 form.
    let arm = "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ContainerService/fleets/staging/autoUpgradeProfiles/rapid";
    let body = json!({"properties": {"channel": "Rapid", "upstream": {
        "profileId": arm, "soakSeconds": 86400}}});
    let made = h
        .ok(
            "admin",
            Method::PUT,
            "/v1/fleets/prod/autoUpgradeProfiles/rapid",
            Some(body.clone()),
        )
        .await;
    assert_eq!(
        made["properties"]["upstream"]["profileId"], "/v1/fleets/staging/autoUpgradeProfiles/rapid",
        "{made}"
    );
    let profile = h
        .wait_run(
            "/v1/fleets/prod/autoUpgradeProfiles/rapid",
            "prod's profile to see staging's validated run",
            |p| p["properties"]["autoUpgradeProfileStatus"]["upstream"]["soakEndsAt"].is_string(),
        )
        .await;
    let ends = profile["properties"]["autoUpgradeProfileStatus"]["upstream"]["soakEndsAt"].clone();
    let again = h
        .ok(
            "admin",
            Method::PUT,
            "/v1/fleets/prod/autoUpgradeProfiles/rapid",
            Some(body),
        )
        .await;
    let next = &again["properties"]["autoUpgradeProfileStatus"]["nextTrigger"];
    assert_eq!(next["triggersAt"], ends, "{again}");
    assert_eq!(
        next["upgradeVersions"],
        json!(["1.31.1", "AKSUbuntu-2204gen2containerd-202603.01.0"]),
        "{again}"
    );
    // The status written by the server is kept by the PUT.
    assert_eq!(
        again["properties"]["autoUpgradeProfileStatus"]["upstream"]["soakEndsAt"], ends,
        "{again}"
    );
    let waiting = refused(
        &h,
        Method::POST,
        "/v1/fleets/prod/autoUpgradeProfiles/rapid/generateUpdateRun",
        None,
        StatusCode::CONFLICT,
    )
    .await;
    assert!(
        waiting.contains(&format!(
            "when the soak ends at {}",
            ends.as_str().unwrap_or("?")
        )),
        "{waiting}"
    );
    // Nothing was promoted, and prod's own channel (1.31.2) generated nothing.
    let runs = h
        .ok("reader", Method::GET, "/v1/fleets/prod/updateRuns", None)
        .await;
    assert_eq!(runs["value"].as_array().map(Vec::len), Some(0), "{runs}");
}
