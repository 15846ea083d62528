//! The discrete-event simulator: simulated clusters and a virtual clock driving the engine
//! (conformance README, "Virtual time").
//!
//! At each instant it applies, in order: upgrades ending, what time brings to the engine
//! (gates, waits, windows, versions), the scenario's actions in file order; then it lets the
//! engine schedule once, answering its commands until it has nothing more to say.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use serde::Serialize;
use serde_json::{Value, json};

use flotilla_engine::engine::{
    Command, Engine, Input, OperationProgress, RunSpec, SkipKind, SkipTarget, Target, Timing,
    apply_target,
};
use flotilla_engine::error::{ApiError, ErrorCode};
use flotilla_engine::fleet::Cluster;
use flotilla_engine::status::{Event, UpdateRunStatus};
use flotilla_engine::strategy::{
    DEFAULT_STAGE_CONCURRENCY_LIMIT, ManagedClusterUpdateSpec, StrategySpec, parse_strategy,
    parse_upgrade,
};
use flotilla_engine::time::Time;

use crate::scenario::{Action, Scenario, SimBehaviour};

/// One simulated cluster.
#[derive(Clone, Debug)]
pub struct SimCluster {
    pub cluster: Cluster,
    pub behaviour: SimBehaviour,
    /// Upgrade operations received, in order: (attempt, ends at, succeeds).
    pub operations: Vec<(u64, Time, bool)>,
    /// Removed from the fleet by a `removeMember` action; a cluster keeps running regardless.
    pub removed: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolOut {
    pub name: String,
    pub node_image_version: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOut {
    pub kubernetes_version: String,
    pub node_pools: Vec<PoolOut>,
}

/// The result document of `flotilla simulate --json`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimResult {
    pub run: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_error: Option<ApiError>,
    pub clusters: BTreeMap<String, ClusterOut>,
    pub events: Vec<Event>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The final status, typed, for renderers.
    #[serde(skip)]
    pub status: Option<UpdateRunStatus>,
}

/// The run resource the API would return, envelope included.
pub fn run_resource(
    name: &str,
    strategy: Option<&StrategySpec>,
    update: &ManagedClusterUpdateSpec,
    engine: &Engine,
) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert("provisioningState".into(), json!("Succeeded"));
    if let Some(s) = strategy {
        properties.insert(
            "strategy".into(),
            serde_json::to_value(s).unwrap_or(Value::Null),
        );
    }
    properties.insert(
        "managedClusterUpdate".into(),
        serde_json::to_value(update).unwrap_or(Value::Null),
    );
    properties.insert(
        "status".into(),
        serde_json::to_value(engine.status()).unwrap_or(Value::Null),
    );
    json!({
        "id": format!("/v1/fleets/simulation/updateRuns/{name}"),
        "name": name,
        "type": "Microsoft.ContainerService/fleets/updateRuns",
        "properties": properties,
    })
}

fn cluster_out(cluster: &Cluster) -> ClusterOut {
    ClusterOut {
        kubernetes_version: cluster.kubernetes_version.to_string(),
        node_pools: cluster
            .node_pools
            .iter()
            .map(|p| PoolOut {
                name: p.name.clone(),
                node_image_version: format!("{}-{}", p.family, p.image),
            })
            .collect(),
    }
}

fn skip_kind(text: &str) -> Option<SkipKind> {
    match text {
        "Member" => Some(SkipKind::Member),
        "Group" => Some(SkipKind::Group),
        "Stage" => Some(SkipKind::Stage),
        "AfterStageWait" => Some(SkipKind::AfterStageWait),
        _ => None,
    }
}

/// Builds the engine for a scenario, as the API would at run creation.
pub fn create_engine(
    scenario: &Scenario,
) -> Result<
    (
        Engine,
        Vec<String>,
        Option<StrategySpec>,
        ManagedClusterUpdateSpec,
    ),
    ApiError,
> {
    let (strategy_spec, update_spec) = scenario.wire_specs()?;
    let strategy = strategy_spec
        .as_ref()
        .map(|s| parse_strategy(s, "properties.strategy", DEFAULT_STAGE_CONCURRENCY_LIMIT))
        .transpose()?;
    let upgrade = parse_upgrade(&update_spec, "properties.managedClusterUpdate")?;
    let spec = RunSpec {
        strategy,
        upgrade,
        rules: Default::default(),
    };
    let (engine, warnings) = Engine::create(
        &scenario.name,
        &spec,
        &scenario.members,
        scenario.catalog.clone(),
    )?;
    Ok((engine, warnings, strategy_spec, update_spec))
}

/// Runs a scenario to its end in virtual time.
pub fn simulate(scenario: &Scenario) -> SimResult {
    run(scenario, false).0
}

/// Like [`simulate`], but recounts the engine's state from scratch after every instant
/// ([`Engine::check_invariants`]) and stops at the first violation. For tests.
pub fn simulate_checking_invariants(scenario: &Scenario) -> Result<SimResult, String> {
    match run(scenario, true) {
        (result, None) => Ok(result),
        (_, Some(violation)) => Err(violation),
    }
}

fn run(scenario: &Scenario, check_invariants: bool) -> (SimResult, Option<String>) {
    let mut clusters: BTreeMap<String, SimCluster> = scenario
        .members
        .iter()
        .map(|m| {
            let behaviour = scenario
                .behaviour
                .get(&m.name)
                .cloned()
                .unwrap_or(SimBehaviour {
                    duration_seconds: 600,
                    fail: false,
                    fail_message: String::new(),
                    fail_attempts: None,
                });
            (
                m.name.clone(),
                SimCluster {
                    cluster: m.cluster.clone(),
                    behaviour,
                    operations: Vec::new(),
                    removed: false,
                },
            )
        })
        .collect();
    let outputs = |clusters: &BTreeMap<String, SimCluster>| {
        clusters
            .iter()
            .map(|(n, c)| (n.clone(), cluster_out(&c.cluster)))
            .collect()
    };
    let (mut engine, warnings, strategy_spec, update_spec) = match create_engine(scenario) {
        Ok(x) => x,
        Err(error) => {
            let result = SimResult {
                run: None,
                create_error: Some(error),
                clusters: outputs(&clusters),
                events: Vec::new(),
                warnings: Vec::new(),
                status: None,
            };
            return (result, None);
        }
    };
    let mut sim = Sim {
        clusters: &mut clusters,
        finishing: BinaryHeap::new(),
        targets: BTreeMap::new(),
        seq: 0,
    };
    let mut events = Vec::new();
    let mut violation = None;
    let mut next_action = 0;
    let actions = &scenario.actions;
    let mut now = scenario.start;
    loop {
        let candidates = [
            sim.finishing.peek().map(|Reverse((t, _, _, _))| *t),
            actions.get(next_action).map(|a| a.at),
            engine.next_wakeup(),
        ];
        let Some(next) = candidates.into_iter().flatten().min() else {
            break;
        };
        if next > scenario.until {
            break;
        }
        now = next.max(now);
        // 1. Upgrades ending.
        while let Some(Reverse((t, _, _, _))) = sim.finishing.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((_, _, member, attempt))) = sim.finishing.pop() else {
                break;
            };
            let outcome = sim.finish(&member, attempt);
            let _ = engine.handle(
                now,
                Input::OperationFinished {
                    member: member.clone(),
                    attempt,
                    outcome,
                },
            );
            if let Some(c) = sim.clusters.get(&member) {
                let _ = engine.handle(
                    now,
                    Input::Observed {
                        member,
                        cluster: Box::new(c.cluster.clone()),
                        operation: None,
                    },
                );
            }
        }
        // 2. What time brings.
        engine.advance_clock(now);
        // 3. Actions, in file order.
        while let Some(a) = actions.get(next_action) {
            if a.at > now {
                break;
            }
            next_action += 1;
            let result = match &a.action {
                Action::Start => engine.handle(now, Input::Start),
                Action::Stop => engine.handle(now, Input::Stop),
                Action::Approve(locator) => {
                    let timing = match locator.timing.as_str() {
                        "Before" => Some(Timing::Before),
                        "After" => Some(Timing::After),
                        _ => None,
                    };
                    match timing
                        .and_then(|t| engine.find_gate(&locator.stage, locator.group.as_deref(), t))
                    {
                        Some(gate) => engine.handle(
                            now,
                            Input::ApproveGate {
                                gate,
                                by: "scenario".into(),
                            },
                        ),
                        None => Err(ApiError::new(
                            ErrorCode::NotFound,
                            format!(
                                "no {} gate at stage {:?} group {:?}",
                                locator.timing, locator.stage, locator.group
                            ),
                            "gate",
                        )),
                    }
                }
                Action::Skip(targets) => {
                    let parsed: Result<Vec<SkipTarget>, ApiError> = targets
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            skip_kind(&t.kind).map(|kind| SkipTarget { kind, name: t.name.clone() }).ok_or_else(|| {
                                ApiError::new(
                                    ErrorCode::InvalidSkipTarget,
                                    format!("targets[{i}].type {:?}: must be Member, Group, Stage or AfterStageWait", t.kind),
                                    format!("targets[{i}].type"),
                                )
                            })
                        })
                        .collect();
                    parsed.and_then(|targets| engine.handle(now, Input::Skip(targets)))
                }
                Action::RemoveMember(member) => match sim.clusters.get_mut(member) {
                    Some(c) if !c.removed => {
                        c.removed = true;
                        engine.handle(
                            now,
                            Input::MemberRemoved {
                                member: member.clone(),
                            },
                        )
                    }
                    _ => Err(ApiError::new(
                        ErrorCode::NotFound,
                        format!("member {member:?} is not in the fleet"),
                        "member",
                    )),
                },
                Action::AddNodePool { member, pool } => {
                    match sim.clusters.get_mut(member).filter(|c| !c.removed) {
                        Some(c) => {
                            c.cluster.node_pools.push(pool.clone());
                            let cluster = c.cluster.clone();
                            engine.handle(
                                now,
                                Input::Observed {
                                    member: member.clone(),
                                    cluster: Box::new(cluster),
                                    operation: None,
                                },
                            )
                        }
                        None => Err(ApiError::new(
                            ErrorCode::NotFound,
                            format!("member {member:?} is not in the fleet"),
                            "member",
                        )),
                    }
                }
            };
            if let Err(error) = result {
                engine.record_rejection(now, &a.label, error);
            }
        }
        // 4. Schedule, answering commands until the engine is quiet.
        loop {
            engine.settle(now);
            let mut answered = false;
            while let Some(command) = engine.poll_command() {
                match command {
                    Command::StartUpgrade {
                        member,
                        attempt,
                        target,
                    } => {
                        let op = sim.start(now, &member, attempt, target);
                        let _ = engine.handle(
                            now,
                            Input::OperationAccepted {
                                member,
                                attempt,
                                operation_id: op,
                            },
                        );
                    }
                    Command::Observe { member, attempt } => {
                        let (cluster, progress) = sim.observe(now, &member, attempt);
                        if let Some(cluster) = cluster {
                            let _ = engine.handle(
                                now,
                                Input::Observed {
                                    member,
                                    cluster: Box::new(cluster),
                                    operation: Some((attempt, progress)),
                                },
                            );
                            answered = true;
                        }
                    }
                }
            }
            if !answered {
                break;
            }
        }
        while let Some(e) = engine.poll_event() {
            events.push(e);
        }
        if check_invariants && let Err(e) = engine.check_invariants(now) {
            violation = Some(format!("at {now}: {e}"));
            break;
        }
        if engine.is_finished() && next_action >= actions.len() {
            break;
        }
    }
    while let Some(e) = engine.poll_event() {
        events.push(e);
    }
    let run = run_resource(
        &scenario.name,
        strategy_spec.as_ref(),
        &update_spec,
        &engine,
    );
    let result = SimResult {
        run: Some(run),
        create_error: None,
        clusters: outputs(&clusters),
        events,
        warnings,
        status: Some(engine.status()),
    };
    (result, violation)
}

struct Sim<'a> {
    clusters: &'a mut BTreeMap<String, SimCluster>,
    /// (ends at, sequence, member, attempt), earliest first.
    finishing: BinaryHeap<Reverse<(Time, u64, String, u64)>>,
    targets: BTreeMap<u64, Target>,
    seq: u64,
}

impl Sim<'_> {
    fn start(&mut self, now: Time, member: &str, attempt: u64, target: Target) -> String {
        let Some(c) = self.clusters.get_mut(member) else {
            // A cluster that left the fleet: the operation fails at once.
            self.seq += 1;
            self.finishing
                .push(Reverse((now, self.seq, member.to_string(), attempt)));
            return format!("sim-op-{attempt}");
        };
        let number = c.operations.len() as u32 + 1;
        let fails = c.behaviour.fail && c.behaviour.fail_attempts.is_none_or(|n| number <= n);
        let end = now.plus(c.behaviour.duration_seconds);
        c.operations.push((attempt, end, !fails));
        self.targets.insert(attempt, target);
        self.seq += 1;
        self.finishing
            .push(Reverse((end, self.seq, member.to_string(), attempt)));
        format!("sim-op-{attempt}")
    }

    fn finish(&mut self, member: &str, attempt: u64) -> Result<(), String> {
        let Some(c) = self.clusters.get_mut(member) else {
            return Err("the cluster is no longer in the fleet".into());
        };
        let succeeds = c
            .operations
            .iter()
            .find(|o| o.0 == attempt)
            .is_some_and(|o| o.2);
        if succeeds {
            if let Some(target) = self.targets.get(&attempt) {
                apply_target(&mut c.cluster, target);
            }
            Ok(())
        } else {
            Err(c.behaviour.fail_message.clone())
        }
    }

    fn observe(
        &self,
        now: Time,
        member: &str,
        attempt: u64,
    ) -> (Option<Cluster>, OperationProgress) {
        let Some(c) = self.clusters.get(member) else {
            return (None, OperationProgress::NotRunning);
        };
        let running = c.operations.iter().any(|o| o.0 == attempt && o.1 > now);
        (
            Some(c.cluster.clone()),
            if running {
                OperationProgress::InProgress
            } else {
                OperationProgress::NotRunning
            },
        )
    }
}
