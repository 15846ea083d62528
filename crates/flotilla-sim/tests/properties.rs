//! Property tests on random fleets, strategies and action timelines (ENGINE-DESIGN.md,
//! "Testing the engine"): the engine's invariants hold after every instant, in-flight peaks
//! never exceed a resolved ceiling, no member is sent two upgrades unless a stop or retry
//! allowed it, failure counts equal failed members, and the same input gives the same output.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use serde_json::{Value, json};

use flotilla_engine::fleet::{
    Catalog, Cluster, ImageRelease, KubeRelease, Member, NodePool, Os, RegionCatalog,
};
use flotilla_engine::time::Time;
use flotilla_engine::version::{ImageVersion, KubeVersion};
use flotilla_engine::window::{MaintenanceWindow, MaintenanceWindowSpec};
use flotilla_sim::scenario::{Action, GateLocator, SimBehaviour, TargetSpec, TimedAction};
use flotilla_sim::simulator::simulate_checking_invariants;
use flotilla_sim::{Scenario, simulate};

const START: i64 = 1_772_409_600; // 2026-03-02T00:00:00Z

#[derive(Clone, Debug)]
struct MemberPlan {
    group: usize,
    label: usize,
    minutes: i64,
    fails: bool,
    window_start_hour: Option<i64>,
    region: usize,
}

#[derive(Clone, Debug)]
struct StagePlan {
    groups: Vec<usize>,
    selector_label: Option<usize>,
    concurrency: Option<String>,
    failures: Option<String>,
    group_concurrency: Vec<Option<String>>,
    group_failures: Vec<Option<String>>,
    wait_minutes: i64,
    approval_before: bool,
}

#[derive(Clone, Debug)]
struct Plan {
    members: Vec<MemberPlan>,
    stages: Vec<StagePlan>,
    stop_at: Option<(i64, i64)>,
    skip_member: Option<(i64, usize)>,
}

fn amount(percent_max: u32) -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        (1u32..6).prop_map(|n| Some(n.to_string())),
        (1u32..=percent_max).prop_map(|p| Some(format!("{p}%"))),
    ]
}

fn failures() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        (0u32..4).prop_map(|n| Some(n.to_string())),
        (0u32..=100).prop_map(|p| Some(format!("{p}%")))
    ]
}

fn plan() -> impl Strategy<Value = Plan> {
    let member = (
        0usize..6,
        0usize..3,
        1i64..40,
        proptest::bool::weighted(0.08),
        proptest::option::weighted(0.25, 0i64..24),
        0usize..2,
    )
        .prop_map(
            |(group, label, minutes, fails, window_start_hour, region)| MemberPlan {
                group,
                label,
                minutes,
                fails,
                window_start_hour,
                region,
            },
        );
    let stage = (
        proptest::sample::subsequence((0usize..6).collect::<Vec<_>>(), 0..=3),
        proptest::option::weighted(0.2, 0usize..3),
        amount(100),
        failures(),
        proptest::collection::vec(amount(100), 3),
        proptest::collection::vec(failures(), 3),
        prop_oneof![Just(0i64), 1i64..90],
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            |(
                groups,
                selector_label,
                concurrency,
                failures,
                gc,
                gf,
                wait_minutes,
                approval_before,
            )| StagePlan {
                groups,
                selector_label,
                concurrency,
                failures,
                group_concurrency: gc,
                group_failures: gf,
                wait_minutes,
                approval_before,
            },
        );
    (
        proptest::collection::vec(member, 1..40),
        proptest::collection::vec(stage, 1..4),
        proptest::option::weighted(0.3, (1i64..120, 1i64..300)),
        proptest::option::weighted(0.3, (0i64..60, 0usize..40)),
    )
        .prop_map(|(members, stages, stop_at, skip_member)| Plan {
            members,
            stages,
            stop_at,
            skip_member,
        })
}

/// Builds a scenario from a plan. Stages draw disjoint groups, so membership is unique.
fn scenario(plan: &Plan) -> Scenario {
    let regions = ["eastus", "westus"];
    let mut catalog = Catalog::default();
    for region in regions {
        let mut rc = RegionCatalog::default();
        for v in ["1.30.5", "1.31.1"] {
            rc.kubernetes.push(KubeRelease {
                version: KubeVersion::parse(v).expect("valid"),
                preview: false,
                long_term_support: false,
                available_at: None,
            });
        }
        rc.node_images.insert(
            "AKSUbuntu-2204gen2containerd".into(),
            vec![ImageRelease {
                version: ImageVersion::parse("202602.10.0").expect("valid"),
                available_at: None,
            }],
        );
        rc.family_order.push("AKSUbuntu-2204gen2containerd".into());
        catalog.regions.insert(region.into(), rc);
    }
    let mut members = Vec::new();
    let mut behaviour = BTreeMap::new();
    for (i, m) in plan.members.iter().enumerate() {
        let name = format!("m{i:02}");
        let window = m.window_start_hour.map(|h| {
            let spec: MaintenanceWindowSpec = serde_json::from_value(json!({
                "schedule": {"daily": {"intervalDays": 1}}, "durationHours": 4, "startTime": format!("{h:02}:00")
            }))
            .expect("valid window");
            std::sync::Arc::new(MaintenanceWindow::parse(&spec, "w").expect("valid window"))
        });
        members.push(Member {
            name: name.clone(),
            cluster_resource_id: format!("/sim/{name}"),
            group: Some(format!("g{}", m.group)),
            labels: [
                ("ring".to_string(), m.label.to_string()),
                ("grp".to_string(), format!("g{}", m.group)),
            ]
            .into_iter()
            .collect(),
            cluster: Cluster {
                region: regions[m.region].into(),
                kubernetes_version: KubeVersion::parse("1.30.5").expect("valid"),
                node_pools: vec![NodePool {
                    name: "nodepool1".into(),
                    family: "AKSUbuntu-2204gen2containerd".into(),
                    os: Os::Linux,
                    image: ImageVersion::parse("202602.10.0").expect("valid"),
                }],
                kubernetes_window: window,
                node_os_window: None,
                long_term_support: false,
            },
        });
        behaviour.insert(
            name,
            SimBehaviour {
                duration_seconds: m.minutes * 60,
                fail: m.fails,
                fail_message: "boom".into(),
                fail_attempts: None,
            },
        );
    }
    // Groups are claimed by the first stage that names them; selector-only stages take the
    // members of a ring whose group no stage names, so membership stays unique.
    let mut used = std::collections::BTreeSet::new();
    let claimed: Vec<Vec<usize>> = plan
        .stages
        .iter()
        .map(|s| {
            s.groups
                .iter()
                .copied()
                .filter(|g| used.insert(*g))
                .collect()
        })
        .collect();
    let named: Vec<String> = used.iter().map(|g| format!("g{g}")).collect();
    let mut stages = Vec::new();
    for (si, (s, groups)) in plan.stages.iter().zip(&claimed).enumerate() {
        let mut stage = serde_json::Map::new();
        stage.insert("name".into(), json!(format!("s{si}")));
        if groups.is_empty() {
            let label = s.selector_label.unwrap_or(si % 3);
            let mut selector = format!("ring={label}");
            if !named.is_empty() {
                selector += &format!(", grp notin ({})", named.join(", "));
            }
            stage.insert("memberSelector".into(), json!({"byLabel": selector}));
        } else {
            if let Some(label) = s.selector_label {
                stage.insert(
                    "memberSelector".into(),
                    json!({"byLabel": format!("ring!={label}")}),
                );
            }
            stage.insert(
                "groups".into(),
                Value::Array(
                    groups
                        .iter()
                        .enumerate()
                        .map(|(k, g)| {
                            let mut group = serde_json::Map::new();
                            group.insert("name".into(), json!(format!("g{g}")));
                            if let Some(c) = &s.group_concurrency[k % 3] {
                                group.insert("maxConcurrency".into(), json!(c));
                            }
                            if let Some(f) = &s.group_failures[k % 3] {
                                group.insert("maxAllowedFailures".into(), json!(f));
                            }
                            Value::Object(group)
                        })
                        .collect(),
                ),
            );
        }
        if let Some(c) = &s.concurrency {
            stage.insert("maxConcurrency".into(), json!(c));
        }
        if let Some(f) = &s.failures {
            stage.insert("maxAllowedFailures".into(), json!(f));
        }
        if s.wait_minutes > 0 {
            stage.insert("afterStageWaitInSeconds".into(), json!(s.wait_minutes * 60));
        }
        if s.approval_before {
            stage.insert("beforeGates".into(), json!([{"type": "Approval"}]));
        }
        stages.push(Value::Object(stage));
    }
    let start = Time::from_unix(START);
    let mut actions = vec![TimedAction {
        at: start,
        action: Action::Start,
        label: "start".into(),
        run: None,
    }];
    // Approve every stage's before-gate every six hours (a rejection is fine).
    for hour in (6..30 * 24).step_by(6) {
        for (si, s) in plan.stages.iter().enumerate() {
            if s.approval_before {
                actions.push(TimedAction {
                    at: start.plus(hour * 3600),
                    action: Action::Approve(GateLocator {
                        stage: format!("s{si}"),
                        group: None,
                        timing: "Before".into(),
                    }),
                    label: "approve".into(),
                    run: None,
                });
            }
        }
    }
    if let Some((stop, restart)) = plan.stop_at {
        actions.push(TimedAction {
            at: start.plus(stop * 60),
            action: Action::Stop,
            label: "stop".into(),
            run: None,
        });
        actions.push(TimedAction {
            at: start.plus((stop + restart) * 60),
            action: Action::Start,
            label: "start".into(),
            run: None,
        });
    }
    if let Some((at, m)) = plan.skip_member {
        actions.push(TimedAction {
            at: start.plus(at * 60),
            action: Action::Skip(vec![TargetSpec {
                kind: "Member".into(),
                name: format!("m{:02}", m % plan.members.len()),
            }]),
            label: "skip".into(),
            run: None,
        });
    }
    actions.sort_by_key(|a| a.at);
    Scenario {
        name: "property".into(),
        description: String::new(),
        start,
        until: start.plus(30 * 86_400),
        catalog,
        members,
        behaviour,
        strategy: (!stages.is_empty()).then(|| json!({"stages": stages})),
        update: Some(
            json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}),
        ),
        strategies: Default::default(),
        profiles: Vec::new(),
        releases: Vec::new(),
        actions,
        expect: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_runs_keep_every_invariant(plan in plan()) {
        let scenario = scenario(&plan);
        let result = simulate_checking_invariants(&scenario).map_err(TestCaseError::fail)?;
        let Some(run) = &result.run else {
            // Rejected at creation: only for reasons the API gives (e.g. a selector-only stage
            // claiming a member another stage has).
            prop_assert!(result.create_error.is_some());
            return Ok(());
        };
        let status = &run["properties"]["status"];

        // Resolved ceilings from the status.
        let mut ceiling: HashMap<String, u64> = HashMap::new();
        for stage in status["stages"].as_array().into_iter().flatten() {
            ceiling.insert(format!("stage:{}", stage["name"].as_str().unwrap_or_default()), stage["maxConcurrency"].as_u64().unwrap_or(0));
            for group in stage["groups"].as_array().into_iter().flatten() {
                ceiling.insert(format!("group:{}", group["name"].as_str().unwrap_or_default()), group["maxConcurrency"].as_u64().unwrap_or(0));
            }
        }
        // Peaks in flight, from the events; starts per member.
        let mut current: HashMap<String, u64> = HashMap::new();
        let mut place: HashMap<String, Vec<String>> = HashMap::new();
        let mut starts: HashMap<String, u32> = HashMap::new();
        for e in &result.events {
            let kind = format!("{:?}", e.kind);
            let member = e.member.clone().unwrap_or_default();
            if kind == "MemberStarted" || kind == "MemberReattached" {
                let keys = vec![format!("stage:{}", e.stage.clone().unwrap_or_default()), format!("group:{}", e.group.clone().unwrap_or_default())];
                for k in &keys {
                    let c = current.entry(k.clone()).or_default();
                    *c += 1;
                    prop_assert!(*c <= ceiling[k], "{} in flight in {} over its ceiling {}", c, k, ceiling[k]);
                }
                place.insert(member.clone(), keys);
                if kind == "MemberStarted" {
                    *starts.entry(member).or_default() += 1;
                }
            } else if matches!(kind.as_str(), "MemberSucceeded" | "MemberFailed" | "MemberStopped")
                && let Some(keys) = place.remove(&member)
            {
                for k in keys {
                    *current.entry(k).or_default() -= 1;
                }
            }
        }
        // Without a stop there is no second attempt (failed runs are not retried here).
        if plan.stop_at.is_none() {
            for (member, n) in &starts {
                prop_assert_eq!(*n, 1, "{} was sent {} upgrades", member, n);
            }
        }
        // Failure counts equal failed members, per group, per stage and for the run.
        let mut run_failed = 0;
        for stage in status["stages"].as_array().into_iter().flatten() {
            let mut stage_failed = 0;
            for group in stage["groups"].as_array().into_iter().flatten() {
                let failed = group["members"].as_array().into_iter().flatten().filter(|m| m["status"]["state"] == "Failed").count() as u64;
                prop_assert_eq!(group["failureCount"].as_u64(), Some(failed));
                stage_failed += failed;
            }
            prop_assert_eq!(stage["failureCount"].as_u64(), Some(stage_failed));
            run_failed += stage_failed;
        }
        prop_assert_eq!(status["failureCount"].as_u64(), Some(run_failed));
        // Every run ends: Completed, Failed or Skipped, within the 30 simulated days.
        let state = status["status"]["state"].as_str().unwrap_or_default();
        prop_assert!(matches!(state, "Completed" | "Failed" | "Skipped"), "run ended {}", state);
        // Same input, same output.
        let again = serde_json::to_string(&simulate(&scenario)).expect("serializes");
        prop_assert_eq!(again, serde_json::to_string(&result).expect("serializes"));
    }
}
