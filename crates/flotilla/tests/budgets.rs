//! Disruption budgets through the real binary (SEMANTICS §12): `flotilla budget create` over a
//! sim fleet's prod members per region, `show` with each partition's members and resolved
//! `maxUnavailable` (as JSON and as a table), refusals that name the field and the value with a
//! non-zero exit and create nothing, `list` and `delete`.

mod common;

use std::time::Duration;

use common::{Api, Killed, TempDir, create_token, free_port, serve, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// A budget's partitions as `(value, members, maxUnavailable)`, and whether each counts no
/// member in flight (`disrupted` is 0, or absent where another replica would count it).
fn partitions(shown: &Value) -> (Vec<(String, u64, u64)>, bool) {
    let parts = shown["status"]["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let idle = parts
        .iter()
        .all(|p| p["disrupted"].is_null() || p["disrupted"] == 0);
    let parts = parts
        .iter()
        .map(|p| {
            (
                p["value"].as_str().unwrap_or_default().to_string(),
                p["members"].as_u64().unwrap_or_default(),
                p["maxUnavailable"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    (parts, idle)
}

fn names(listed: &Value) -> Vec<&str> {
    listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["name"].as_str())
        .collect()
}

#[test]
fn the_cli_creates_shows_lists_and_deletes_budgets_and_refuses_bad_ones() {
    let dir = TempDir::new("budgets");
    let database = dir.0.join("flotilla.db").display().to_string();
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: create_token(&database),
    };
    let _server = Killed(serve(&database, port, &dir.0.join("server.log"), &[]));
    api.wait_ready();
    // Four prod members in eastus, one in westus, and a dev member in eastus.
    let members = [
        ("east-1", "eastus", "prod"),
        ("east-2", "eastus", "prod"),
        ("east-3", "eastus", "prod"),
        ("east-4", "eastus", "prod"),
        ("west-1", "westus", "prod"),
        ("east-dev", "eastus", "dev"),
    ];
    let clusters: serde_json::Map<String, Value> = members
        .iter()
        .map(|(name, region, _)| {
            (
                format!("c-{name}"),
                json!({"region": region, "kubernetesVersion": "1.30.5", "nodePools": []}),
            )
        })
        .collect();
    let version = json!({"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}]});
    api.must(
        Method::PUT,
        "/v1/fleets/shop",
        Some(
            &json!({"properties": {"driver": {"type": "sim", "timeScale": 1,
            "catalog": {"eastus": version, "westus": version}, "clusters": clusters}}}),
        ),
    );
    for (name, _, env) in members {
        api.must(
            Method::PUT,
            &format!("/v1/fleets/shop/members/{name}"),
            Some(
                &json!({"properties": {"clusterResourceId": format!("c-{name}"),
                "group": "g", "labels": {"env": env}}}),
            ),
        );
    }

    // Refused: a non-zero exit, the field and its value named, nothing created.
    let create = |name: &'static str, extra: &[&'static str]| {
        let mut args = vec!["budget", "create", "-f", "shop", "-n", name];
        args.extend(extra);
        api.cli(&args)
    };
    for (extra, field, value) in [
        (
            &["--max-unavailable", "0"][..],
            "properties.maxUnavailable",
            "\"0\"",
        ),
        (
            &["--max-unavailable", "1", "--per-value-of", "zone"][..],
            "properties.perValueOf",
            "\"zone\"",
        ),
    ] {
        let (ok, _, err) = create("prod-per-region", extra);
        assert!(!ok, "{extra:?} was accepted");
        assert!(
            err.contains(field) && err.contains(value),
            "{extra:?}: {err}"
        );
    }
    let (ok, listed, err) = api.cli(&["budget", "list", "-f", "shop"]);
    assert!(ok, "{err}");
    assert_eq!(listed, json!([]), "nothing was created");

    // Half of each region's prod members at once: 2 of eastus's 4, 1 of westus's 1 (rounded
    // down, never below 1); the dev member is not covered.
    let (ok, made, err) = create(
        "prod-per-region",
        &[
            "--max-unavailable",
            "50%",
            "--per-value-of",
            "region",
            "--selector",
            "env=prod",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(made["name"], "prod-per-region", "{made}");
    assert_eq!(made["maxUnavailable"], "50%", "{made}");
    assert_eq!(made["perValueOf"], "region", "{made}");
    assert_eq!(made["selector"], json!({"byLabel": "env=prod"}), "{made}");
    let expected = vec![("eastus".to_string(), 4, 2), ("westus".to_string(), 1, 1)];
    let show = ["budget", "show", "-f", "shop", "-n", "prod-per-region"];
    // Members' regions come from their clusters, observed when they are created.
    wait_for(
        "the budget's partitions by region",
        Duration::from_secs(20),
        || {
            let (ok, shown, _) = api.cli(&show);
            ok && partitions(&shown).0 == expected
        },
    );
    let (_, shown, _) = api.cli(&show);
    assert!(partitions(&shown).1, "nothing is in flight: {shown}");

    let (ok, table, err) = api.cli_text(&[&show[..], &["-o", "table"]].concat());
    assert!(ok, "{err}");
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for row in [
        &["NAME", "MAXUNAVAILABLE", "PERVALUEOF", "SELECTOR"][..],
        &["prod-per-region", "50%", "region", "env=prod"],
        &["VALUE", "MEMBERS", "MAXUNAVAILABLE", "DISRUPTED"],
    ] {
        assert!(lines.iter().any(|l| l == row), "{row:?} in\n{table}");
    }
    for (value, members, most) in &expected {
        let (members, most) = (members.to_string(), most.to_string());
        assert!(
            lines.iter().any(|l| l.len() >= 3
                && l[0] == value
                && l[1] == members
                && l[2] == most
                && l.get(3).is_none_or(|d| *d == "0")),
            "{value} {members} {most} in\n{table}"
        );
    }

    // A budget over the whole fleet has one partition, `(all)` in the table.
    let (ok, _, err) = create("one-at-a-time", &["--max-unavailable", "1"]);
    assert!(ok, "{err}");
    let one = ["budget", "show", "-f", "shop", "-n", "one-at-a-time"];
    wait_for("the fleet-wide partition", Duration::from_secs(20), || {
        let (ok, shown, _) = api.cli(&one);
        ok && partitions(&shown).0 == vec![(String::new(), 6, 1)]
    });
    let (ok, table, err) = api.cli_text(&[&one[..], &["-o", "table"]].concat());
    assert!(ok, "{err}");
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().eq(["(all)", "6", "1", "0"])
                || l.split_whitespace().eq(["(all)", "6", "1"])),
        "{table}"
    );

    let (ok, listed, err) = api.cli(&["budget", "list", "-f", "shop"]);
    assert!(ok, "{err}");
    assert_eq!(names(&listed), ["one-at-a-time", "prod-per-region"]);

    let (ok, _, err) = api.cli(&["budget", "delete", "-f", "shop", "-n", "prod-per-region"]);
    assert!(
        ok && err.contains("deleted disruption budget prod-per-region"),
        "{err}"
    );
    let (ok, _, err) = api.cli(&show);
    assert!(!ok && err.contains("does not exist"), "{err}");
    let (ok, listed, err) = api.cli(&["budget", "list", "-f", "shop"]);
    assert!(ok, "{err}");
    assert_eq!(names(&listed), ["one-at-a-time"]);
}
