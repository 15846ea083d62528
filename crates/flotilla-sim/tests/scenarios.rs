//! Runs every scenario of `tests/conformance/` (the shared suite, copied) and of the project's `tests/scenarios/`
//! through the simulator, with the engine's invariants recounted after every instant, and
//! checks each scenario's expectations. Also checks that a second run gives the same bytes.

use std::path::{Path, PathBuf};

use flotilla_sim::check::{check, check_scenario};
use flotilla_sim::simulator::simulate_checking_invariants;
use flotilla_sim::{Scenario, simulate};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn load(path: &Path) -> Scenario {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("run")
        .to_lowercase();
    Scenario::parse(&name, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn run_all(dir: &Path, at_least: usize) {
    let files = yaml_files(dir);
    assert!(
        files.len() >= at_least,
        "expected at least {at_least} scenarios in {}, found {}",
        dir.display(),
        files.len()
    );
    let mut failures = Vec::new();
    for path in &files {
        let scenario = load(path);
        let result = match simulate_checking_invariants(&scenario) {
            Ok(r) => r,
            Err(violation) => {
                failures.push(format!("{}: invariant broken {violation}", path.display()));
                continue;
            }
        };
        let document = serde_json::to_value(&result).expect("the result serializes");
        let expect = scenario.expect.clone().unwrap_or_default();
        assert!(
            expect.as_object().is_some_and(|o| !o.is_empty()),
            "{} has no expectations",
            path.display()
        );
        for difference in check_scenario(&scenario, &document) {
            failures.push(format!("{}: {difference}", path.display()));
        }
        let again = serde_json::to_string(&simulate(&scenario)).expect("serializes");
        if again != serde_json::to_string(&document).expect("serializes") {
            failures.push(format!(
                "{}: a second run gave a different result",
                path.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario expectations failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn shared_conformance_scenarios() {
    run_all(&workspace().join("tests/conformance"), 19);
}

#[test]
fn project_scenarios() {
    run_all(&workspace().join("tests/scenarios"), 35);
}

#[test]
fn the_example_in_the_readme_runs_to_completion() {
    for path in yaml_files(&workspace().join("examples")) {
        let scenario = load(&path);
        let result = simulate_checking_invariants(&scenario)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let document = serde_json::to_value(&result).expect("serializes");
        let expect = scenario.expect.clone().unwrap_or_default();
        let differences = check(&expect, &document);
        assert!(
            differences.is_empty(),
            "{}: {differences:?}",
            path.display()
        );
    }
}

/// The checker must be able to fail: a wrong expectation is reported.
#[test]
fn the_checker_reports_wrong_expectations() {
    let scenario = load(&workspace().join("tests/conformance/01-one-by-one.yaml"));
    let document = serde_json::to_value(simulate(&scenario)).expect("serializes");
    let wrong = serde_json::json!({
        "run": {"state": "Failed"},
        "startsInOrder": ["c", "a"],
        "runCompletedAt": "2026-03-02T00:20:00Z",
        "members": {"a": "Skipped", "zz": "Completed"},
        "maxInFlight": {"group:default": 2},
        "memberKubernetesVersion": {"a": "1.30.5"},
        "neverStarted": ["b"],
    });
    let differences = check(&wrong, &document);
    assert_eq!(differences.len(), 8, "{differences:#?}");
}

/// The profile expectations can fail too: wrong targets, statuses and generated-run keys.
#[test]
fn the_checker_reports_wrong_profile_expectations() {
    let scenario = load(&workspace().join("tests/scenarios/p01-rapid-new-patch.yaml"));
    let document = serde_json::to_value(simulate(&scenario)).expect("serializes");
    let wrong = serde_json::json!({
        "generatedRuns": {"rapid": ["1.31.4"]},
        "profiles": {"rapid": {"lastTriggerStatus": "Failed", "triggered": false}},
        "runs": {
            "rapid/1.31.4": {"members": {"a": "Skipped"}, "memberMessages": {"b": "minor"}},
            "rapid/1.31.9": {"run": {"state": "Completed"}},
        },
        "members": {"a": "Completed"},
    });
    let differences = check(&wrong, &document);
    assert_eq!(differences.len(), 7, "{differences:#?}");
}

/// SEMANTICS §11, §12: the forecast of a run some of whose members a freeze holds says they wait
/// for it (`waitsFor` Freeze) and ends when the simulated run does.
#[test]
fn a_forecast_waits_for_a_freeze_as_the_run_does() {
    use flotilla_engine::engine::WaitReason;
    use flotilla_engine::forecast::ForecastParams;
    let scenario = load(&workspace().join("tests/conformance/18-freeze-one-off.yaml"));
    let forecast =
        flotilla_sim::forecast_scenario(&scenario, &ForecastParams::default()).expect("a forecast");
    let simulated = simulate(&scenario);
    let end = simulated
        .status
        .as_ref()
        .and_then(|s| s.status.completed_time)
        .expect("the run ends");
    assert_eq!(forecast.completed, Some(end));
    for member in ["p1", "p2"] {
        assert!(
            forecast
                .waits_for
                .get(member)
                .is_some_and(|w| w.contains(&WaitReason::Freeze)),
            "{member}: {:?}",
            forecast.waits_for.get(member)
        );
    }
    assert!(forecast.waits_for.get("d1").is_none_or(|w| w.is_empty()));
}

/// SEMANTICS §11, §13: a forecast counts each hop of a chain as one upgrade of the member's
/// duration, so the forecast of scenario 19 (three hops, then a one-hop member) ends when the
/// simulated run does, member by member.
#[test]
fn a_forecast_of_a_chained_run_counts_each_hop() {
    use flotilla_engine::forecast::ForecastParams;
    use flotilla_engine::time::Time;
    for file in [
        "tests/conformance/19-chain-three-hops.yaml",
        "tests/scenarios/c01-preview-skipped-patch-arrives-between-hops.yaml",
    ] {
        let scenario = load(&workspace().join(file));
        let forecast = flotilla_sim::forecast_scenario(&scenario, &ForecastParams::default())
            .expect("a forecast");
        let simulated = simulate(&scenario);
        let status = simulated.status.as_ref().expect("a run");
        assert_eq!(forecast.completed, status.status.completed_time, "{file}");
        let times = |s: &flotilla_engine::status::UpdateRunStatus| -> Vec<(String, Option<Time>)> {
            s.stages
                .iter()
                .flat_map(|st| &st.groups)
                .flat_map(|g| &g.members)
                .map(|m| (m.name.clone(), m.status.completed_time))
                .collect()
        };
        assert_eq!(times(&forecast.status), times(status), "{file}");
    }
    let scenario = load(&workspace().join("tests/conformance/19-chain-three-hops.yaml"));
    let forecast =
        flotilla_sim::forecast_scenario(&scenario, &ForecastParams::default()).expect("a forecast");
    assert_eq!(
        forecast.completed,
        Some(Time::parse("2026-03-02T00:40:00Z").expect("a time"))
    );
}

/// A forecast holds members for a budget as the run does (SEMANTICS §11, §12): the run of
/// scenario 17 alone starts one member per region and waits for the budget for the others.
#[test]
fn a_forecast_waits_for_a_budget_as_the_run_does() {
    use flotilla_engine::engine::WaitReason;
    use flotilla_engine::forecast::{ForecastParams, PathKind};
    let scenario = load(&workspace().join("tests/conformance/17-budget-per-region.yaml"));
    let forecast =
        flotilla_sim::forecast_scenario(&scenario, &ForecastParams::default()).expect("a forecast");
    assert_eq!(
        forecast.completed,
        Some(flotilla_engine::time::Time::parse("2026-03-02T00:20:00Z").expect("a time"))
    );
    for member in ["e2", "w2"] {
        assert!(
            forecast
                .waits_for
                .get(member)
                .is_some_and(|w| w.contains(&WaitReason::Budget)),
            "{member}: {:?}",
            forecast.waits_for.get(member)
        );
    }
    assert!(
        forecast
            .critical_path
            .iter()
            .any(|step| step.kind == PathKind::Budget),
        "{:?}",
        forecast.critical_path
    );
}

/// SEMANTICS §12, `updateRuns`: an entry the API would refuse at creation (a bad strategy, a
/// bad name, a name already taken by the run of `update`) is listed in its place as
/// `{name, run: null, createError, events: []}`; the others are created and run.
#[test]
fn declared_runs_refused_at_creation_keep_their_error() {
    let scenario = load(&workspace().join("tests/scenarios/u03-refused-at-creation.yaml"));
    let document = serde_json::to_value(simulate(&scenario)).expect("serializes");
    let runs = document["updateRuns"].as_array().expect("updateRuns");
    let names: Vec<&str> = runs.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "bad-failures",
            "Not_A_Name",
            "u03-refused-at-creation",
            "images"
        ]
    );
    let refused = [
        ("InvalidMaxAllowedFailures", "maxAllowedFailures"),
        ("InvalidName", "name"),
        ("Conflict", "already exists"),
    ];
    for (run, (code, mentions)) in runs.iter().zip(refused) {
        assert!(run["run"].is_null(), "{run}");
        assert_eq!(run["events"], serde_json::json!([]), "{run}");
        assert_eq!(run["createError"]["code"], code, "{run}");
        assert!(run["createError"].to_string().contains(mentions), "{run}");
    }
    assert_eq!(runs[3]["run"]["name"], "images");
    assert!(runs[3].get("createError").is_none());
    // The checker reads a refused run's error under `runs`.
    let expect = serde_json::json!({"runs": {
        "bad-failures": {"createError": {"mentions": "maxAllowedFailures"}},
        "Not_A_Name": {"run": {"state": "Completed"}},
    }});
    let differences = check(&expect, &document);
    assert_eq!(differences.len(), 1, "{differences:#?}");
    assert!(
        differences[0].contains("rejected at creation"),
        "{differences:#?}"
    );
}

/// A scenario without `updateRuns` has no `updateRuns` key in its result document.
#[test]
fn a_scenario_without_declared_runs_has_no_update_runs_key() {
    let scenario = load(&workspace().join("tests/conformance/01-one-by-one.yaml"));
    let document = serde_json::to_value(simulate(&scenario)).expect("serializes");
    assert!(document.get("updateRuns").is_none());
}

/// An `updateRuns` entry that is not `{strategy?, update}` makes the file broken.
#[test]
fn a_malformed_declared_run_is_a_broken_scenario() {
    let base = "start: 2026-03-02T00:00:00Z\ncatalog: {eastus: {kubernetes: [{version: 1.30.5}]}}\nupdate: {upgrade: {type: NodeImageOnly}}\n";
    for entry in [
        "updateRuns: {second: {strategy: {}}}",
        "updateRuns: {second: {update: {upgrade: {type: NodeImageOnly}}, extra: 1}}",
    ] {
        let error = Scenario::parse("s", &format!("{base}{entry}\n"))
            .expect_err("a broken scenario")
            .to_string();
        assert!(error.contains("updateRuns.second"), "{error}");
    }
}

/// The expectations on declared runs and fleet-wide scopes can fail too: a wrong member of a
/// declared run, wrong fleet and `members:` peaks, a run that does not exist, the scope of a
/// budget the scenario does not declare (no member counts in it: its peak is 0).
#[test]
fn the_checker_reports_wrong_declared_run_and_fleet_expectations() {
    let scenario = load(&workspace().join("tests/scenarios/u01-two-runs-one-lock.yaml"));
    let document = serde_json::to_value(simulate(&scenario)).expect("serializes");
    let wrong = serde_json::json!({
        "maxInFlight": {"fleet": 2, "members:a,b": 1, "members:c": 1, "budget:zone": 1},
        "inFlightAtMost": {"fleet": 2, "budget:zone/east": 1},
        "runs": {
            "wide": {"members": {"a": "Completed"}, "maxInFlight": {"fleet": 4}},
            "narrow": {"run": {"state": "Completed"}},
        },
    });
    let differences = check_scenario(
        &Scenario {
            expect: Some(wrong),
            ..scenario
        },
        &document,
    );
    assert_eq!(differences.len(), 7, "{differences:#?}");
    assert!(
        differences
            .iter()
            .any(|d| d.starts_with("maxInFlight[budget:zone]")),
        "{differences:#?}"
    );
}

/// Budget scopes count the members each budget declared at `start` covers, per partition: a
/// wrong peak is reported, and the right ones hold.
#[test]
fn the_checker_counts_budget_scopes() {
    let scenario = load(&workspace().join("tests/conformance/17-budget-per-region.yaml"));
    let document = serde_json::to_value(simulate(&scenario)).expect("serializes");
    let right = serde_json::json!({
        "maxInFlight": {"budget:per-region": 2, "budget:per-region/eastus": 1},
        "inFlightAtMost": {"budget:per-region/westeurope": 1},
    });
    let differences = check_scenario(
        &Scenario {
            expect: Some(right),
            ..scenario.clone()
        },
        &document,
    );
    assert!(differences.is_empty(), "{differences:#?}");
    let wrong = serde_json::json!({
        "maxInFlight": {"budget:per-region/eastus": 2},
        "inFlightAtMost": {"budget:per-region": 1},
    });
    let differences = check_scenario(
        &Scenario {
            expect: Some(wrong),
            ..scenario
        },
        &document,
    );
    assert_eq!(differences.len(), 2, "{differences:#?}");
}

/// SEMANTICS §14: the checker of a scenario of several fleets reports wrong expectations per
/// fleet, on promotions and on profiles' upstream status.
#[test]
fn the_checker_reports_wrong_train_expectations() {
    let mut scenario = load(&workspace().join("tests/scenarios/t01-three-fleet-train.yaml"));
    let document = serde_json::to_value(simulate(&scenario)).expect("serializes");
    assert!(check_scenario(&scenario, &document).is_empty());
    let prod = scenario
        .fleets
        .iter_mut()
        .find(|f| f.fleet == "prod")
        .expect("a prod fleet");
    prod.expect = Some(serde_json::json!({
        "generatedRuns": {"rapid": ["1.31.5"]},
        "runs": {"rapid/1.31.4+AKSUbuntu-2204gen2containerd-202603.01.0": {
            "runStartedAt": "2026-03-06T00:00:00Z",
            "promotedFrom": {"runId": "/v1/fleets/dev/", "completedTime": "2026-03-04T00:00:00Z", "imagesPinned": false},
        }},
        "profiles": {"rapid": {"triggered": false, "upstream": {"validatedBy": "rapid-1-31-4", "soakEndsAt": "2026-03-06T00:40:00Z"}}},
    }));
    let differences = check_scenario(&scenario, &document);
    assert_eq!(differences.len(), 8, "{differences:#?}");
    assert!(
        differences.iter().all(|d| d.starts_with("fleets.prod.")),
        "{differences:#?}"
    );
    // A promoted run expected not promoted, and the dev run expected promoted.
    let dev = serde_json::json!({"runs": {"rapid/1.31.4": {"promotedFrom": {"completedTime": "2026-03-03T00:20:00Z"}}}});
    let dev_document = &document["fleets"]["dev"];
    assert_eq!(check(&dev, dev_document).len(), 1);
}

/// `flotilla simulate` prints each fleet of a train, then the promotions between them.
#[test]
fn a_train_is_rendered_fleet_by_fleet_with_its_promotions() {
    let scenario = load(&workspace().join("tests/scenarios/t01-three-fleet-train.yaml"));
    let result = simulate(&scenario);
    let text = flotilla_sim::render::report(&scenario.description, &result);
    let dev = text.find("=== fleet dev ===").expect("dev's section");
    let staging = text
        .find("=== fleet staging ===")
        .expect("staging's section");
    let prod = text.find("=== fleet prod ===").expect("prod's section");
    assert!(dev < staging && staging < prod, "{text}");
    let promotions = &text[text.find("\npromotions:\n").expect("promotions")..];
    let lines: Vec<&str> = promotions.lines().skip(2).collect();
    assert_eq!(lines.len(), 3, "{promotions}");
    assert!(
        lines[1].starts_with("  2026-03-06T00:40:00Z  prod: profile rapid promoted 1.31.4+AKSUbuntu-2204gen2containerd-202603.01.0 from /v1/fleets/staging/updateRuns/rapid-1-31-4-"),
        "{promotions}"
    );
    // The JSON document is the fleets' documents by name.
    let document = serde_json::to_value(&result).expect("serializes");
    let keys: Vec<&String> = document.as_object().expect("an object").keys().collect();
    assert_eq!(keys, ["fleets"]);
    assert_eq!(
        document["fleets"]["prod"]["profiles"]["rapid"]["id"],
        "/v1/fleets/prod/autoUpgradeProfiles/rapid"
    );
}
