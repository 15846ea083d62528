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
use flotilla_engine::forecast::{ForecastParams, completions, forecast};
use flotilla_engine::time::Time;
use flotilla_engine::version::{ImageVersion, KubeVersion};
use flotilla_engine::window::{MaintenanceWindow, MaintenanceWindowSpec};
use flotilla_sim::scenario::{
    Action, CheckScript, GateLocator, Scripted, SimBehaviour, TargetSpec, TimedAction,
};
use flotilla_sim::simulator::{simulate_checking_invariants, simulate_observing};
use flotilla_sim::{Scenario, forecast_scenario, simulate};

const START: i64 = 1_772_409_600; // 2026-03-02T00:00:00Z

#[derive(Clone, Debug)]
struct MemberPlan {
    group: usize,
    label: usize,
    minutes: i64,
    fails: bool,
    window_start_hour: Option<i64>,
    region: usize,
    /// 0: behind the target, 1: already on it, 2: ahead of it (a refused downgrade).
    version: usize,
    /// Whether its pool is already on the newest image.
    image_current: bool,
    /// Whether it also has a pool of a family only one region lists (Consistent skips it).
    arm_pool: bool,
    /// What its checks see (SEMANTICS §10): 0 passes, 1 fails from `.1` minutes, 2 fails
    /// until `.1` minutes, 3 cannot be evaluated until `.1` minutes.
    checks: (u8, i64),
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
    /// Checks (SEMANTICS §10): 0 none, 1 member health, 2 readiness, 3 both, 4 a HealthCheck
    /// before-gate, 5 a HealthCheck after-gate on the first group.
    checks: u8,
}

#[derive(Clone, Debug)]
struct Plan {
    members: Vec<MemberPlan>,
    /// 0: ControlPlaneOnly, 1: Full with Latest images, 2: Full with Consistent, 3: NodeImageOnly,
    /// 4: ControlPlaneOnly to 1.32.0 chained, 5: Full to 1.32.0 chained.
    upgrade: usize,
    /// Hours after the start at which the target reaches westus (never: not listed there).
    west_arrival_hours: Option<i64>,
    stages: Vec<StagePlan>,
    stop_at: Option<(i64, i64)>,
    skip_member: Option<(i64, usize)>,
    /// Gates' checks fail until this many minutes after the start (`None`: they pass).
    gate_fails_until: Option<i64>,
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
        0usize..3,
        prop_oneof![6 => Just(0usize), 2 => Just(1usize), 1 => Just(2usize)],
        proptest::bool::weighted(0.3),
        proptest::bool::weighted(0.1),
        (
            prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
            0i64..240,
        ),
    )
        .prop_map(
            |(
                group,
                label,
                minutes,
                fails,
                window_start_hour,
                region,
                version,
                image_current,
                arm_pool,
                checks,
            )| MemberPlan {
                group,
                label,
                minutes,
                fails,
                window_start_hour,
                region,
                version,
                image_current,
                arm_pool,
                checks,
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
        prop_oneof![5 => Just(0u8), 1 => 1u8..6],
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
                checks,
            )| StagePlan {
                groups,
                selector_label,
                concurrency,
                failures,
                group_concurrency: gc,
                group_failures: gf,
                wait_minutes,
                approval_before,
                checks,
            },
        );
    (
        proptest::collection::vec(member, 1..40),
        proptest::collection::vec(stage, 1..4),
        proptest::option::weighted(0.3, (1i64..120, 1i64..300)),
        proptest::option::weighted(0.3, (0i64..60, 0usize..40)),
        0usize..6,
        proptest::option::weighted(0.8, 0i64..72),
        proptest::option::weighted(0.4, 0i64..600),
    )
        .prop_map(
            |(
                members,
                stages,
                stop_at,
                skip_member,
                upgrade,
                west_arrival_hours,
                gate_fails_until,
            )| Plan {
                members,
                stages,
                stop_at,
                skip_member,
                upgrade,
                west_arrival_hours,
                gate_fails_until,
            },
        )
}

/// Builds a scenario from a plan. Stages draw disjoint groups, so membership is unique.
fn scenario(plan: &Plan) -> Scenario {
    const FAMILY: &str = "AKSUbuntu-2204gen2containerd";
    const ARM: &str = "AKSUbuntu-2204gen2arm64containerd";
    let regions = ["eastus", "westus", "northeurope"];
    let versions = ["1.30.5", "1.31.1", "1.32.0"];
    let kube = |v: &str| KubeVersion::parse(v).expect("valid");
    let image = |v: &str| ImageVersion::parse(v).expect("valid");
    let mut catalog = Catalog::default();
    for region in regions {
        let mut rc = RegionCatalog::default();
        for v in versions {
            // The target rolls out region by region: westus gets it later, or never.
            let available_at = match (region, v) {
                ("westus", "1.31.1") => match plan.west_arrival_hours {
                    Some(h) => Some(Time::from_unix(START + h * 3600)),
                    None => continue,
                },
                _ => None,
            };
            rc.kubernetes.push(KubeRelease {
                version: kube(v),
                preview: false,
                long_term_support: false,
                available_at,
            });
        }
        let images = ["202602.10.0", "202603.01.0"]
            .map(|v| ImageRelease {
                version: image(v),
                available_at: None,
            })
            .to_vec();
        rc.node_images.insert(FAMILY.into(), images.clone());
        rc.family_order.push(FAMILY.into());
        if region == "eastus" {
            rc.node_images.insert(ARM.into(), images);
            rc.family_order.push(ARM.into());
        }
        catalog.regions.insert(region.into(), rc);
    }
    let start = Time::from_unix(START);
    let mut members = Vec::new();
    let mut behaviour = BTreeMap::new();
    let mut member_checks = BTreeMap::new();
    // A check's script: a Prometheus value under the condition `< 1` passes.
    let script = |kind: u8, minutes: i64| -> CheckScript {
        let at = start.plus(minutes * 60);
        match kind {
            1 => vec![(start, Scripted::Number(0.0)), (at, Scripted::Number(5.0))],
            2 => vec![(start, Scripted::Number(5.0)), (at, Scripted::Number(0.0))],
            3 => vec![(start, Scripted::Unavailable), (at, Scripted::Number(0.0))],
            _ => vec![(start, Scripted::Number(0.0))],
        }
    };
    let gate_checks: BTreeMap<String, CheckScript> = [(
        "c".to_string(),
        match plan.gate_fails_until {
            Some(minutes) => script(2, minutes),
            None => script(0, 0),
        },
    )]
    .into_iter()
    .collect();
    for (i, m) in plan.members.iter().enumerate() {
        let name = format!("m{i:02}");
        member_checks.insert(
            name.clone(),
            [("c".to_string(), script(m.checks.0, m.checks.1))]
                .into_iter()
                .collect(),
        );
        let window = m.window_start_hour.map(|h| {
            let spec: MaintenanceWindowSpec = serde_json::from_value(json!({
                "schedule": {"daily": {"intervalDays": 1}}, "durationHours": 4, "startTime": format!("{h:02}:00")
            }))
            .expect("valid window");
            std::sync::Arc::new(MaintenanceWindow::parse(&spec, "w").expect("valid window"))
        });
        let pool_image = image(if m.image_current {
            "202603.01.0"
        } else {
            "202602.10.0"
        });
        let mut node_pools = vec![NodePool {
            name: "nodepool1".into(),
            family: FAMILY.into(),
            os: Os::Linux,
            image: pool_image.clone(),
            orchestrator_version: None,
        }];
        if m.arm_pool && m.region == 0 {
            node_pools.push(NodePool {
                name: "arm".into(),
                family: ARM.into(),
                os: Os::Linux,
                image: pool_image,
                orchestrator_version: None,
            });
        }
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
                kubernetes_version: kube(versions[m.version]),
                node_pools,
                kubernetes_window: window.clone().filter(|_| m.label != 2),
                node_os_window: window.filter(|_| m.label != 1),
                long_term_support: false,
                rollback: Vec::new(),
            },
        });
        behaviour.insert(
            name,
            SimBehaviour {
                duration_seconds: m.minutes * 60,
                fail: m.fails,
                fail_message: "boom".into(),
                fail_attempts: None,
                fail_operations: Vec::new(),
                rollback_until: None,
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
        let check = json!([{"name": "c", "provider": "prom", "query": "q", "condition": "< 1"}]);
        let short = |mut block: Value| {
            block["checks"] = check.clone();
            block
        };
        match s.checks {
            1 | 3 => {
                stage.insert(
                    "memberHealthChecks".into(),
                    short(json!({"soakSeconds": 600, "intervalSeconds": 120, "unavailableAfterSeconds": 1800})),
                );
            }
            _ => {}
        }
        match s.checks {
            2 | 3 => {
                stage.insert(
                    "readinessChecks".into(),
                    short(json!({"intervalSeconds": 900, "timeoutSeconds": 7200})),
                );
            }
            4 => {
                let mut gates = stage
                    .remove("beforeGates")
                    .and_then(|g| g.as_array().cloned())
                    .unwrap_or_default();
                gates.push(short(json!({"type": "HealthCheck", "soakSeconds": 1200, "intervalSeconds": 300, "timeoutSeconds": 36000})));
                stage.insert("beforeGates".into(), Value::Array(gates));
            }
            5 => {
                stage.insert(
                    "afterGates".into(),
                    json!([short(
                        json!({"type": "HealthCheck", "soakSeconds": 900, "intervalSeconds": 300})
                    )]),
                );
            }
            _ => {}
        }
        stages.push(Value::Object(stage));
    }
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
        update: Some(match plan.upgrade {
            0 => json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}),
            1 => json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"}}),
            2 => json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"},
                         "nodeImageSelection": {"type": "Consistent"}}),
            3 => json!({"upgrade": {"type": "NodeImageOnly"}}),
            // Chained (SEMANTICS §13): members at 1.30.5 go through 1.31.1, which westus
            // gets later or never; the invariants check that no hop skips a minor.
            4 => json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.32.0"},
                         "chainMinorVersions": true}),
            _ => json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.32.0"},
                         "chainMinorVersions": true}),
        }),
        strategies: Default::default(),
        profiles: Vec::new(),
        releases: Vec::new(),
        member_checks,
        gate_checks,
        freezes: Vec::new(),
        budgets: Vec::new(),
        fleet: flotilla_sim::scenario::SIM_FLEET.to_string(),
        pins_node_images: true,
        fleets: Vec::new(),
        providers: [(
            "prom".to_string(),
            flotilla_engine::checks::parse_provider(
                "prom",
                &serde_json::from_value(json!({"type": "Prometheus", "endpoint": "http://p"}))
                    .expect("provider shape"),
            )
            .expect("valid provider"),
        )]
        .into(),
        actions,
        expect: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn random_runs_keep_every_invariant(plan in plan()) {
        keeps_every_invariant(&plan)?;
    }

    #[test]
    fn a_forecast_before_the_start_matches_the_run(plan in plan()) {
        forecast_matches_the_run(plan)?;
    }

    #[test]
    fn a_running_runs_status_forecast_is_its_forecast(plan in plan()) {
        status_forecast_is_the_forecast(plan)?;
    }
}

/// A plan as a forecast assumes its run goes: no failures, no approvals to wait for, no actions
/// but the start.
fn as_forecast_assumes(mut plan: Plan) -> Plan {
    for m in &mut plan.members {
        m.fails = false;
        m.checks = (0, 0);
    }
    plan.gate_fails_until = None;
    for s in &mut plan.stages {
        s.approval_before = false;
    }
    plan.stop_at = None;
    plan.skip_member = None;
    plan
}

/// SEMANTICS §11: the forecast a running run's status carries (one simulation of the fleet's
/// moving runs, `completions`) is the run's own forecast made at the same instant, and with
/// fixed durations and no failures it is the run's actual end (within 1 %).
fn status_forecast_is_the_forecast(plan: Plan) -> Result<(), TestCaseError> {
    let scenario = scenario(&as_forecast_assumes(plan));
    let params = ForecastParams::default();
    let duration = |_: &str, member: &str| {
        scenario
            .behaviour
            .get(member)
            .map_or(600, |b| b.duration_seconds)
    };
    // Midway: the first instant the run has moved on from its start.
    let mut seen: Option<(Time, Option<Time>, Option<Time>)> = None;
    let result = simulate_observing(&scenario, &mut |fleet, now| {
        let Some(run) = fleet.run(&scenario.name) else {
            return;
        };
        if seen.is_some() || run.is_finished() || now <= scenario.start {
            return;
        }
        let ends = completions(fleet, now, &params, &duration);
        let own = forecast(fleet, &scenario.name, now, &params, &duration)
            .ok()
            .and_then(|f| f.completed);
        seen = Some((now, ends.get(&scenario.name).copied().flatten(), own));
    });
    let Some((at, status, own)) = seen else {
        return Ok(());
    };
    prop_assert_eq!(status, own, "at {}", at);
    if let (Some(end), Some(predicted)) = (
        result.status.as_ref().and_then(|s| s.status.completed_time),
        status,
    ) {
        let duration = (end.unix() - scenario.start.unix()).max(1) as f64;
        let error = (predicted.unix() - end.unix()).abs() as f64 / duration;
        prop_assert!(error <= 0.01, "predicted {predicted}, actual {end}");
    }
    Ok(())
}

/// SEMANTICS §11 on `sim` fleets with fixed durations and no failures (no actions but the
/// start, no approvals): the forecast made before the start predicts the run's completion
/// within 1 % of its duration, and each member's start and end.
fn forecast_matches_the_run(plan: Plan) -> Result<(), TestCaseError> {
    let scenario = scenario(&as_forecast_assumes(plan));
    let params = ForecastParams::default();
    let actual = simulate(&scenario);
    // A plan the API refuses (a member in two groups) has no run to forecast.
    let Some(status) = actual.status.as_ref() else {
        prop_assert!(forecast_scenario(&scenario, &params).is_err());
        return Ok(());
    };
    let forecast =
        forecast_scenario(&scenario, &params).map_err(|e| TestCaseError::fail(e.message))?;
    match status.status.completed_time {
        Some(end) => {
            let predicted = forecast.completed.ok_or_else(|| {
                TestCaseError::fail(format!("the run ended at {end}; the forecast says never"))
            })?;
            let duration = (end.unix() - scenario.start.unix()).max(1) as f64;
            let error = (predicted.unix() - end.unix()).abs() as f64 / duration;
            prop_assert!(
                error <= 0.01,
                "predicted {predicted}, actual {end}: {:.2} %",
                error * 100.0
            );
        }
        // Not ended within the scenario's 30 days: the forecast does not end before then.
        None => prop_assert!(
            forecast.completed.is_none_or(|t| t > scenario.until),
            "the run had not ended by {}; the forecast says {:?}",
            scenario.until,
            forecast.completed
        ),
    }
    // Member by member, the predicted times are the run's.
    let times = |s: &flotilla_engine::status::UpdateRunStatus| -> Vec<(String, Option<Time>, Option<Time>)> {
        s.stages
            .iter()
            .flat_map(|st| &st.groups)
            .flat_map(|g| &g.members)
            .map(|m| (m.name.clone(), m.status.start_time, m.status.completed_time))
            .collect()
    };
    if status.status.completed_time.is_some() {
        prop_assert_eq!(times(&forecast.status), times(status));
    }
    // The critical path ends at the predicted end and runs forward in time.
    if let (Some(end), Some(last)) = (forecast.completed, forecast.critical_path.last()) {
        prop_assert!(last.to <= end);
        for pair in forecast.critical_path.windows(2) {
            prop_assert!(
                pair[0].to <= pair[1].from || pair[0].from <= pair[1].from,
                "{:?}",
                pair
            );
        }
    }
    Ok(())
}

/// The property: the run keeps every invariant, ends, and is the same when simulated again.
fn keeps_every_invariant(plan: &Plan) -> Result<(), TestCaseError> {
    let scenario = scenario(plan);
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
        ceiling.insert(
            format!("stage:{}", stage["name"].as_str().unwrap_or_default()),
            stage["maxConcurrency"].as_u64().unwrap_or(0),
        );
        for group in stage["groups"].as_array().into_iter().flatten() {
            ceiling.insert(
                format!("group:{}", group["name"].as_str().unwrap_or_default()),
                group["maxConcurrency"].as_u64().unwrap_or(0),
            );
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
            let keys = vec![
                format!("stage:{}", e.stage.clone().unwrap_or_default()),
                format!("group:{}", e.group.clone().unwrap_or_default()),
            ];
            for k in &keys {
                let c = current.entry(k.clone()).or_default();
                *c += 1;
                prop_assert!(
                    *c <= ceiling[k],
                    "{} in flight in {} over its ceiling {}",
                    c,
                    k,
                    ceiling[k]
                );
            }
            place.insert(member.clone(), keys);
            if kind == "MemberStarted" {
                *starts.entry(member).or_default() += 1;
            }
        } else if matches!(
            kind.as_str(),
            "MemberSucceeded" | "MemberFailed" | "MemberStopped"
        ) && let Some(keys) = place.remove(&member)
        {
            for k in keys {
                *current.entry(k).or_default() -= 1;
            }
        }
    }
    // A failure ends the pass (SEMANTICS §4): after RunFailed, the same instant holds no
    // member event but the results of members already in flight, unless a user action at
    // that instant (a skip, a stop, a start) has effects of its own.
    let acted: std::collections::BTreeSet<Time> = scenario
        .actions
        .iter()
        .filter(|a| !matches!(a.action, Action::Approve(_)))
        .map(|a| a.at)
        .collect();
    let mut in_flight = std::collections::BTreeSet::new();
    let mut failed_at = None;
    for e in &result.events {
        let kind = format!("{:?}", e.kind);
        let member = e.member.clone().unwrap_or_default();
        if failed_at == Some(e.time) && !acted.contains(&e.time) && e.member.is_some() {
            // A member in flight may also go on with its soak: its upgrade ending, its
            // health checks evaluated (SEMANTICS §10); a chain's hop ending, the member
            // Stopped there since no further hop is sent (§13).
            let a_result = matches!(
                kind.as_str(),
                "MemberSucceeded"
                    | "MemberFailed"
                    | "MemberVerifying"
                    | "HealthCheckEvaluated"
                    | "MemberHopSucceeded"
                    | "MemberHopFailed"
                    | "MemberStopped"
            ) && in_flight.contains(&member);
            prop_assert!(
                a_result,
                "{} {} at {} after the run failed in that instant",
                kind,
                member,
                e.time
            );
        }
        match kind.as_str() {
            "RunFailed" => failed_at = Some(e.time),
            "MemberStarted" | "MemberReattached" | "MemberVerifying" => {
                in_flight.insert(member);
            }
            "MemberSucceeded" | "MemberFailed" | "MemberStopped" => {
                in_flight.remove(&member);
            }
            _ => {}
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
            let failed = group["members"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["status"]["state"] == "Failed")
                .count() as u64;
            prop_assert_eq!(group["failureCount"].as_u64(), Some(failed));
            stage_failed += failed;
        }
        prop_assert_eq!(stage["failureCount"].as_u64(), Some(stage_failed));
        run_failed += stage_failed;
    }
    prop_assert_eq!(status["failureCount"].as_u64(), Some(run_failed));
    // Every run ends: Completed, Failed or Skipped, within the 30 simulated days.
    let state = status["status"]["state"].as_str().unwrap_or_default();
    // Except a run whose target never reaches a member's region: that member waits for it.
    let waits_for_version = status["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["members"].as_array().into_iter().flatten())
        .any(|m| {
            m["status"]["state"] == "Pending"
                && m["message"]
                    .as_str()
                    .is_some_and(|t| t.contains("not yet available"))
        });
    prop_assert!(
        matches!(state, "Completed" | "Failed" | "Skipped")
            || (plan.west_arrival_hours.is_none() && waits_for_version),
        "run ended {}",
        state
    );
    // Same input, same output.
    let again = serde_json::to_string(&simulate(&scenario)).expect("serializes");
    prop_assert_eq!(again, serde_json::to_string(&result).expect("serializes"));
    Ok(())
}

// The failures proptest recorded (`properties.proptest-regressions`), pinned as plain tests so
// they run whatever proptest's seed file holds.

/// The property on one plan, failing the test with proptest's message.
fn check(plan: Plan) {
    if let Err(e) = keeps_every_invariant(&plan) {
        panic!("{e}\nplan: {plan:?}");
    }
}

/// A member as the recorded plans have them: a one-minute upgrade that succeeds, no window,
/// its pool on the older image.
fn member(group: usize, label: usize, region: usize, version: usize, arm_pool: bool) -> MemberPlan {
    MemberPlan {
        group,
        label,
        minutes: 1,
        fails: false,
        window_start_hour: None,
        region,
        version,
        image_current: false,
        arm_pool,
        checks: (0, 0),
    }
}

/// A stage naming `groups` (a selector-only stage when empty), with no thresholds, wait or gate.
fn stage(groups: &[usize]) -> StagePlan {
    StagePlan {
        groups: groups.to_vec(),
        selector_label: None,
        concurrency: None,
        failures: None,
        group_concurrency: vec![None, None, None],
        group_failures: vec![None, None, None],
        wait_minutes: 0,
        approval_before: false,
        checks: 0,
    }
}

/// `cc 53629d9d…`: a selector-only stage over two eastus members and one in westus, where the
/// ControlPlaneOnly target is never listed; the westus member waits for it.
#[test]
fn regression_53629d9d_member_waits_for_a_version_never_in_its_region() {
    check(Plan {
        members: vec![
            member(0, 0, 0, 0, false),
            member(0, 0, 0, 0, false),
            member(1, 0, 1, 0, false),
        ],
        upgrade: 0,
        west_arrival_hours: None,
        stages: vec![stage(&[])],
        stop_at: None,
        skip_member: None,
        gate_fails_until: None,
    });
}

/// `cc e0f9424f…`: one westus member in a Full run with Latest images, the target arriving
/// in westus at the start.
#[test]
fn regression_e0f9424f_full_run_target_arrives_at_start() {
    check(Plan {
        members: vec![member(0, 0, 1, 0, true)],
        upgrade: 1,
        west_arrival_hours: Some(0),
        stages: vec![stage(&[])],
        stop_at: None,
        skip_member: None,
        gate_fails_until: None,
    });
}

/// `cc 18230eac…`: two named groups in westus, one member ahead of the target (a refused
/// downgrade) and one behind it, the target arriving an hour after the start.
#[test]
fn regression_18230eac_downgrade_and_late_version_in_named_groups() {
    check(Plan {
        members: vec![member(3, 2, 1, 2, false), member(4, 0, 1, 0, false)],
        upgrade: 0,
        west_arrival_hours: Some(1),
        stages: vec![stage(&[3, 4])],
        stop_at: None,
        skip_member: None,
        gate_fails_until: None,
    });
}
