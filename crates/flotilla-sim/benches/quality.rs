//! Schedule quality: for random strategies and fleets without windows or gates, the ratio of the
//! simulated completion time to the lower bound the constraints allow. Per stage the bound is
//! the larger of the longest group's sequential work at its ceiling and the stage's total work
//! at its ceiling, plus the wait; with equal durations that is
//! `max(max_g ceil(n_g / c_g), ceil(N / c_s)) × d`.
//!
//! Then, for as many random runs of each, the error of the forecast made once the first stage
//! has completed (SEMANTICS §11): with mixed durations and no history before the run (every
//! remaining upgrade taken to last the median of those done so far, the fleet's; beside it the
//! mean, and the distribution's true mean as a yardstick: what a first stage could at best
//! reveal), and with recurring upgrades (each member's duration varying ±20 % around its own,
//! five earlier upgrades recorded: the median of the member's own, §11's first rule).
//!
//! `cargo bench -p flotilla-sim --bench quality [-- CASES]`

use std::collections::BTreeMap;

use serde_json::json;

use flotilla_engine::fleet::{Catalog, Cluster, KubeRelease, Member, RegionCatalog};
use flotilla_engine::fleet_engine::FleetEngine;
use flotilla_engine::forecast::{ForecastParams, forecast, median};
use flotilla_engine::status::State;
use flotilla_engine::time::Time;
use flotilla_engine::version::KubeVersion;
use flotilla_sim::scenario::{Action, SimBehaviour, TimedAction};
use flotilla_sim::simulator::simulate_observing;
use flotilla_sim::{Scenario, simulate};

struct Rng(u64);
impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

struct Case {
    scenario: Scenario,
    bound: i64,
    /// Each member's five earlier upgrades, seconds (recurring durations only).
    history: BTreeMap<String, Vec<i64>>,
}

/// How long the members' upgrades take.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durations {
    /// Ten minutes each.
    Equal,
    /// 5–24 minutes, drawn for each member; the fleet has upgraded nothing before.
    Mixed,
    /// Each member has its own duration (5–24 minutes) and each of its upgrades, this run's and
    /// its five earlier ones, lasts that ±20 %.
    Recurring,
}

/// The mean of `Durations::Mixed`'s draws, `300 + 60 × k` for k in 0..20.
const MIXED_MEAN: i64 = 870;

fn case(rng: &mut Rng, kind: Durations) -> Case {
    let equal = kind == Durations::Equal;
    let mut history = BTreeMap::new();
    let start = Time::parse("2026-03-02T00:00:00Z").expect("valid");
    let mut catalog = Catalog::default();
    let mut rc = RegionCatalog::default();
    for v in ["1.30.5", "1.31.1"] {
        rc.kubernetes.push(KubeRelease {
            version: KubeVersion::parse(v).expect("v"),
            preview: false,
            long_term_support: false,
            available_at: None,
        });
    }
    catalog.regions.insert("eastus".into(), rc);
    let mut members = Vec::new();
    let mut behaviour = BTreeMap::new();
    let mut stages = Vec::new();
    let mut bound = 0;
    let stage_count = 1 + rng.next(3) as usize;
    for si in 0..stage_count {
        let group_count = 1 + rng.next(6) as usize;
        let sizes: Vec<u64> = (0..group_count).map(|_| 1 + rng.next(12)).collect();
        let total: u64 = sizes.iter().sum();
        let stage_cap = if rng.next(3) == 0 {
            50
        } else {
            1 + rng.next(8)
        };
        let wait = if rng.next(2) == 0 {
            0
        } else {
            60 * rng.next(30) as i64
        };
        let mut groups = Vec::new();
        let mut stage_work = 0i64;
        let mut longest = 0i64;
        for (gi, size) in sizes.iter().enumerate() {
            let name = format!("s{si}g{gi}");
            let own = 1 + rng.next(4);
            let cap = own.min(*size).min(stage_cap).max(1);
            let mut durations = Vec::new();
            for k in 0..*size {
                let member = format!("{name}m{k:02}");
                let seconds = match kind {
                    Durations::Equal => 600,
                    Durations::Mixed => 300 + 60 * rng.next(20) as i64,
                    Durations::Recurring => {
                        let own = 300 + 60 * rng.next(20) as i64;
                        let mut varied = || own * (80 + rng.next(41) as i64) / 100;
                        history.insert(member.clone(), (0..5).map(|_| varied()).collect());
                        varied()
                    }
                };
                durations.push(seconds);
                members.push(Member {
                    name: member.clone(),
                    cluster_resource_id: member.clone(),
                    group: Some(name.clone()),
                    labels: BTreeMap::new(),
                    cluster: Cluster {
                        rollback: Default::default(),
                        region: "eastus".into(),
                        kubernetes_version: KubeVersion::parse("1.30.5").expect("v"),
                        node_pools: vec![],
                        kubernetes_window: None,
                        node_os_window: None,
                        long_term_support: false,
                    },
                });
                behaviour.insert(
                    member,
                    SimBehaviour {
                        rollback_until: None,
                        duration_seconds: seconds,
                        fail: false,
                        fail_message: String::new(),
                        fail_attempts: None,
                        fail_operations: Vec::new(),
                    },
                );
            }
            let work: i64 = durations.iter().sum();
            let max = durations.iter().copied().max().unwrap_or(0);
            stage_work += work;
            // Sequential work at the group's ceiling; with equal durations, whole rounds.
            let group_bound = if equal {
                (size.div_ceil(cap) * 600) as i64
            } else {
                (work as f64 / cap as f64).ceil() as i64
            }
            .max(max);
            longest = longest.max(group_bound);
            groups.push(json!({"name": name, "maxConcurrency": own.to_string()}));
        }
        let stage_bound = if equal {
            (total.div_ceil(stage_cap.min(total)) * 600) as i64
        } else {
            (stage_work as f64 / stage_cap.min(total) as f64).ceil() as i64
        };
        bound += longest.max(stage_bound) + wait;
        stages.push(json!({"name": format!("s{si}"), "maxConcurrency": stage_cap.to_string(), "afterStageWaitInSeconds": wait, "groups": groups}));
    }
    let scenario = Scenario {
        name: "quality".into(),
        description: String::new(),
        start,
        until: start.plus(365 * 86_400),
        catalog,
        members,
        behaviour,
        strategy: Some(json!({"stages": stages})),
        update: Some(
            json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}}),
        ),
        strategies: Default::default(),
        profiles: Vec::new(),
        releases: Vec::new(),
        actions: vec![TimedAction {
            at: start,
            action: Action::Start,
            label: "start".into(),
            run: None,
        }],
        member_checks: Default::default(),
        gate_checks: Default::default(),
        freezes: Vec::new(),
        budgets: Vec::new(),
        fleet: flotilla_sim::scenario::SIM_FLEET.to_string(),
        pins_node_images: true,
        fleets: Vec::new(),
        providers: Default::default(),
        expect: None,
    };
    Case {
        scenario,
        bound,
        history,
    }
}

/// How a forecast made after the first stage takes the remaining upgrades' durations.
#[derive(Clone, Copy)]
enum Rule {
    /// The median of the upgrades done so far, the fleet's (§11 when members have no history).
    FleetMedian,
    /// Their mean.
    FleetMean,
    /// The mean of the distribution the durations are drawn from, known before the run.
    DistributionMean,
    /// §11 in full: the median of the member's own history, else the fleet's median.
    Own,
}

impl Rule {
    fn describe(self) -> &'static str {
        match self {
            Rule::FleetMedian => "the median of the durations so far (§11, no history)",
            Rule::FleetMean => "the mean of the durations so far",
            Rule::DistributionMean => "the distribution's mean, 870 s, known beforehand",
            Rule::Own => "the median of each member's last five (§11)",
        }
    }
}

/// SEMANTICS §11 accuracy: the run forecast once its first stage has completed, by each rule,
/// each compared with how the run actually ends: |predicted − actual| / the run's duration.
/// `None` for a run of one stage.
fn forecast_errors(case: &Case, rules: &[Rule]) -> Option<Vec<f64>> {
    let scenario = &case.scenario;
    let mut captured: Option<(FleetEngine, Time)> = None;
    let result = simulate_observing(scenario, &mut |fleet, now| {
        let Some(run) = fleet.run(&scenario.name) else {
            return;
        };
        let skeleton = run.status_skeleton();
        if captured.is_none()
            && skeleton.stages.len() > 1
            && skeleton.stages[0].status.state == State::Completed
            && !run.is_finished()
        {
            captured = Some((fleet.clone(), now));
        }
    });
    let (fleet, at) = captured?;
    let end = result.status?.status.completed_time?;
    let done = fleet.run(&scenario.name)?.status();
    let durations: Vec<i64> = done
        .stages
        .iter()
        .flat_map(|s| &s.groups)
        .flat_map(|g| &g.members)
        .filter(|m| m.status.state == State::Completed)
        .filter_map(|m| Some(m.status.completed_time?.unix() - m.status.start_time?.unix()))
        .collect();
    let fleet_median = median(&durations)?;
    let fleet_mean = durations.iter().sum::<i64>() / durations.len() as i64;
    let span = (end.unix() - scenario.start.unix()).max(1) as f64;
    rules
        .iter()
        .map(|rule| {
            let duration = |_: &str, member: &str| match rule {
                Rule::FleetMedian => fleet_median,
                Rule::FleetMean => fleet_mean,
                Rule::DistributionMean => MIXED_MEAN,
                Rule::Own => case
                    .history
                    .get(member)
                    .and_then(|own| median(own))
                    .unwrap_or(fleet_median),
            };
            let f = forecast(
                &fleet,
                &scenario.name,
                at,
                &ForecastParams::default(),
                &duration,
            )
            .ok()?;
            Some((f.completed?.unix() - end.unix()).abs() as f64 / span)
        })
        .collect()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let cases: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for equal in [true, false] {
        let mut ratios = Vec::with_capacity(cases);
        let mut worst = (0.0, String::new());
        let durations = if equal {
            Durations::Equal
        } else {
            Durations::Mixed
        };
        for _ in 0..cases {
            let c = case(&mut rng, durations);
            let result = simulate(&c.scenario);
            let status = result.status.expect("created");
            let end = status.status.completed_time.expect("finished");
            let ratio = (end.unix() - c.scenario.start.unix()) as f64 / c.bound as f64;
            if ratio > worst.0 {
                worst = (
                    ratio,
                    serde_json::to_string(&c.scenario.strategy).unwrap_or_default(),
                );
            }
            ratios.push(ratio);
        }
        ratios.sort_by(f64::total_cmp);
        let above = ratios.iter().filter(|r| **r > 1.0 + 1e-9).count();
        println!(
            "{} durations, {cases} random runs: ratio to lower bound min {:.3} p50 {:.3} p90 {:.3} p99 {:.3} max {:.3}; {above} above 1.00",
            if equal { "equal" } else { "mixed" },
            ratios[0],
            quantile(&ratios, 0.5),
            quantile(&ratios, 0.9),
            quantile(&ratios, 0.99),
            ratios[ratios.len() - 1]
        );
        if above > 0 {
            println!("  worst case ({:.3}): {}", worst.0, worst.1);
        }
    }
    // Forecasts made after the first stage.
    for (durations, rules) in [
        (
            Durations::Mixed,
            &[Rule::FleetMedian, Rule::FleetMean, Rule::DistributionMean][..],
        ),
        (Durations::Recurring, &[Rule::Own, Rule::FleetMedian][..]),
    ] {
        let t = std::time::Instant::now();
        let runs: Vec<Vec<f64>> = (0..cases)
            .filter_map(|_| forecast_errors(&case(&mut rng, durations), rules))
            .collect();
        let elapsed = t.elapsed().as_secs_f64();
        println!(
            "forecast after the first stage, {} durations, {} runs of 2+ stages ({elapsed:.1} s):",
            if durations == Durations::Mixed {
                "mixed"
            } else {
                "recurring"
            },
            runs.len()
        );
        for (i, rule) in rules.iter().enumerate() {
            let mut errors: Vec<f64> = runs.iter().map(|e| e[i]).collect();
            errors.sort_by(f64::total_cmp);
            if errors.is_empty() {
                continue;
            }
            let within = errors.iter().filter(|e| **e <= 0.10).count();
            println!(
                "  {}: error p50 {:.2} % p90 {:.2} % p99 {:.2} % max {:.2} %; {within} within 10 % ({:.0} %)",
                rule.describe(),
                100.0 * quantile(&errors, 0.5),
                100.0 * quantile(&errors, 0.9),
                100.0 * quantile(&errors, 0.99),
                100.0 * errors[errors.len() - 1],
                100.0 * within as f64 / errors.len() as f64,
            );
        }
    }
}
