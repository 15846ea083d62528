//! Property tests of disruption budgets (SEMANTICS §12) on random fleets and concurrent runs:
//! the fleet engine's and every run's invariants hold after every instant; with the budgets
//! unchanged and no stop, no start ever finds its partition full (counted over every run's
//! events, ends before starts at one instant); every run ends; the same input gives the same
//! output. With budgets changed mid-run and stops, the invariants and the ends still hold.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use flotilla_sim::simulator::simulate_checking_invariants;
use flotilla_sim::{Scenario, simulate};

#[derive(Clone, Debug)]
struct MemberPlan {
    region: usize,
    group: usize,
    tier: usize,
    minutes: i64,
    fails: bool,
    /// A daily maintenance window of 4 hours starting at this hour.
    window: Option<u8>,
}

#[derive(Clone, Debug)]
struct BudgetPlan {
    per: usize,
    max: usize,
    web_only: bool,
}

#[derive(Clone, Debug)]
struct Plan {
    members: Vec<MemberPlan>,
    /// Per run: its upgrade (0: control plane, 1: node image, 2: full) and group concurrency.
    runs: Vec<(usize, usize)>,
    budgets: Vec<BudgetPlan>,
    /// Budget changes (minute, budget index, new plan or deletion) and a stop of the first run
    /// (minute, minutes stopped).
    changes: Vec<(i64, usize, Option<BudgetPlan>)>,
    stop: Option<(i64, i64)>,
}

fn member_plan() -> impl Strategy<Value = MemberPlan> {
    (
        0..3usize,
        0..3usize,
        0..3usize,
        1..40i64,
        prop::bool::weighted(0.1),
        prop::option::weighted(0.25, 0..24u8),
    )
        .prop_map(|(region, group, tier, minutes, fails, window)| MemberPlan {
            region,
            group,
            tier,
            minutes,
            fails,
            window,
        })
}

fn budget_plan() -> impl Strategy<Value = BudgetPlan> {
    (0..4usize, 0..5usize, any::<bool>()).prop_map(|(per, max, web_only)| BudgetPlan {
        per,
        max,
        web_only,
    })
}

fn plan(changing: bool) -> impl Strategy<Value = Plan> {
    (
        prop::collection::vec(member_plan(), 2..14),
        prop::collection::vec((0..3usize, 1..5usize), 2..4),
        prop::collection::vec(budget_plan(), 1..3),
        prop::collection::vec(
            (1..120i64, 0..2usize, prop::option::of(budget_plan())),
            0..3,
        ),
        prop::option::of((1..60i64, 1..60i64)),
    )
        .prop_map(move |(members, runs, budgets, changes, stop)| Plan {
            members,
            runs,
            budgets,
            changes: if changing { changes } else { Vec::new() },
            stop: if changing { stop } else { None },
        })
}

const REGIONS: [&str; 3] = ["eastus", "westeurope", "japaneast"];
const TIERS: [&str; 3] = ["web", "db", ""];

fn budget_properties(b: &BudgetPlan) -> Value {
    let max = ["1", "2", "3", "50%", "10%"][b.max];
    let mut p = json!({"maxUnavailable": max});
    match b.per {
        1 => p["perValueOf"] = json!("region"),
        2 => p["perValueOf"] = json!("group"),
        3 => p["perValueOf"] = json!("label:tier"),
        _ => {}
    }
    if b.web_only {
        p["selector"] = json!({"byLabel": "tier=web"});
    }
    p
}

fn upgrade(kind: usize) -> Value {
    match kind {
        0 => json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}),
        1 => json!({"upgrade": {"type": "NodeImageOnly"}}),
        _ => json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"}}),
    }
}

fn strategy(concurrency: usize) -> Value {
    json!({"stages": [{"name": "all", "groups": [
        {"name": "g0", "maxConcurrency": concurrency.to_string(), "maxAllowedFailures": "100%"},
        {"name": "g1", "maxConcurrency": concurrency.to_string(), "maxAllowedFailures": "100%"},
        {"name": "g2", "maxConcurrency": concurrency.to_string(), "maxAllowedFailures": "100%"},
    ], "maxAllowedFailures": "100%"}]})
}

fn scenario(plan: &Plan) -> Scenario {
    let image = "AKSUbuntu-2204gen2containerd";
    let members: Vec<Value> = plan
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut labels = json!({});
            if !TIERS[m.tier].is_empty() {
                labels["tier"] = json!(TIERS[m.tier]);
            }
            let mut member = json!({
                "name": format!("m{i:02}"),
                "group": format!("g{}", m.group),
                "region": REGIONS[m.region],
                "kubernetesVersion": "1.30.5",
                "labels": labels,
                "nodePools": [{"name": "sys", "family": image, "os": "Linux", "nodeImageVersion": "202602.10.0"}],
                "sim": {"durationSeconds": m.minutes * 60, "outcome": if m.fails { "fail" } else { "succeed" }},
            });
            if let Some(hour) = m.window {
                let window = json!({"schedule": {"daily": {"intervalDays": 1}}, "durationHours": 4,
                                    "startTime": format!("{hour:02}:00")});
                member["maintenance"] = json!({"kubernetes": window, "nodeOS": window});
            }
            member
        })
        .collect();
    let region = json!({"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}],
                        "nodeImages": {image: [{"version": "202602.10.0"}, {"version": "202603.01.0"}]}});
    let catalog: serde_json::Map<String, Value> = REGIONS
        .iter()
        .map(|r| (r.to_string(), region.clone()))
        .collect();
    let budgets: serde_json::Map<String, Value> = plan
        .budgets
        .iter()
        .enumerate()
        .map(|(i, b)| (format!("b{i}"), budget_properties(b)))
        .collect();
    let mut update_runs = serde_json::Map::new();
    let mut actions = vec![json!({"at": "0s", "do": "start"})];
    for (i, (kind, concurrency)) in plan.runs.iter().enumerate().skip(1) {
        let name = format!("run{i}");
        update_runs.insert(
            name.clone(),
            json!({"strategy": strategy(*concurrency), "update": upgrade(*kind)}),
        );
        actions.push(json!({"at": "0s", "do": "start", "run": name}));
    }
    for (minute, b, change) in &plan.changes {
        let name = format!("b{}", b % plan.budgets.len());
        actions.push(match change {
            Some(p) => json!({"at": format!("{minute}m"), "do": "putDisruptionBudget",
                              "name": name, "properties": budget_properties(p)}),
            None => {
                json!({"at": format!("{minute}m"), "do": "deleteDisruptionBudget", "name": name})
            }
        });
    }
    if let Some((at, stopped)) = plan.stop {
        actions.push(json!({"at": format!("{at}m"), "do": "stop"}));
        actions.push(json!({"at": format!("{}m", at + stopped), "do": "start"}));
    }
    let (kind, concurrency) = plan.runs[0];
    let document = json!({
        "start": "2026-03-02T00:00:00Z",
        "until": "10d",
        "catalog": catalog,
        "members": members,
        "disruptionBudgets": budgets,
        "strategy": strategy(concurrency),
        "update": upgrade(kind),
        "updateRuns": update_runs,
        "actions": actions,
    });
    Scenario::parse("budgets", &document.to_string()).expect("a valid scenario")
}

/// Every run's events together, ends before starts at one instant.
fn all_events(result: &Value) -> Vec<Value> {
    let mut events: Vec<Value> = result["events"].as_array().cloned().unwrap_or_default();
    for run in result["updateRuns"].as_array().into_iter().flatten() {
        events.extend(run["events"].as_array().cloned().unwrap_or_default());
    }
    events.sort_by_key(|e| {
        let end = matches!(
            e["type"].as_str(),
            Some("MemberSucceeded" | "MemberFailed" | "MemberStopped")
        );
        (e["time"].as_str().unwrap_or_default().to_string(), !end)
    });
    events
}

/// A budget's partition: the budget's index and the value.
type Part = (usize, String);

/// The partitions a member is in, and each partition's limit.
fn partitions(plan: &Plan) -> (BTreeMap<String, Vec<Part>>, BTreeMap<Part, u64>) {
    let mut of = BTreeMap::new();
    let mut sizes: BTreeMap<(usize, String), u64> = BTreeMap::new();
    for (i, m) in plan.members.iter().enumerate() {
        let mut parts = Vec::new();
        for (b, budget) in plan.budgets.iter().enumerate() {
            if budget.web_only && TIERS[m.tier] != "web" {
                continue;
            }
            let value = match budget.per {
                1 => REGIONS[m.region].to_string(),
                2 => format!("g{}", m.group),
                3 => TIERS[m.tier].to_string(),
                _ => String::new(),
            };
            *sizes.entry((b, value.clone())).or_default() += 1;
            parts.push((b, value));
        }
        of.insert(format!("m{i:02}"), parts);
    }
    let limits = sizes
        .into_iter()
        .map(|((b, v), size)| {
            let limit = match plan.budgets[b].max {
                0 => 1,
                1 => 2,
                2 => 3,
                3 => (size * 50 / 100).max(1),
                _ => (size * 10 / 100).max(1),
            };
            ((b, v), limit)
        })
        .collect();
    (of, limits)
}

fn holds(plan: &Plan) -> Result<(), TestCaseError> {
    let scenario = scenario(plan);
    let result = simulate_checking_invariants(&scenario).map_err(TestCaseError::fail)?;
    let document = serde_json::to_value(&result).expect("serializes");
    let mut states = vec![document["run"]["properties"]["status"]["status"]["state"].clone()];
    for run in document["updateRuns"].as_array().into_iter().flatten() {
        states.push(run["run"]["properties"]["status"]["status"]["state"].clone());
    }
    for state in &states {
        prop_assert!(
            matches!(state.as_str(), Some("Completed" | "Failed" | "Skipped")),
            "a run did not end: {states:?}"
        );
    }
    if plan.changes.is_empty() && plan.stop.is_none() {
        let (of, limits) = partitions(plan);
        let mut in_flight: BTreeMap<(usize, String), u64> = BTreeMap::new();
        let mut flying: BTreeMap<String, bool> = BTreeMap::new();
        for e in all_events(&document) {
            let member = e["member"].as_str().unwrap_or_default().to_string();
            match e["type"].as_str().unwrap_or_default() {
                "MemberStarted" | "MemberReattached" => {
                    prop_assert!(
                        !flying.contains_key(&member),
                        "{member} started twice at once"
                    );
                    for part in of.get(&member).into_iter().flatten() {
                        let n = in_flight.entry(part.clone()).or_default();
                        prop_assert!(
                            *n < limits[part],
                            "{member} started at {} with {n} of {} in flight in {part:?}",
                            e["time"],
                            limits[part]
                        );
                        *n += 1;
                    }
                    flying.insert(member, true);
                }
                "MemberSucceeded" | "MemberFailed" | "MemberStopped"
                    if flying.remove(&member).is_some() =>
                {
                    for part in of.get(&member).into_iter().flatten() {
                        *in_flight.entry(part.clone()).or_default() -= 1;
                    }
                }
                _ => {}
            }
        }
    }
    let again = serde_json::to_string(&simulate(&scenario)).expect("serializes");
    prop_assert_eq!(again, document.to_string(), "a second run differs");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn budgets_are_never_exceeded_by_a_start(plan in plan(false)) {
        holds(&plan)?;
    }

    #[test]
    fn budgets_changed_mid_run_and_stops_keep_every_invariant(plan in plan(true)) {
        holds(&plan)?;
    }
}
