//! Engine scale benchmark: simulates update runs of 1,000, 10,000 and 100,000 members (three
//! stages, 50 groups per stage, percentage concurrency, maintenance windows, tolerated
//! failures) in virtual time, and prints wall time, events per second and peak memory.
//!
//! `cargo bench -p flotilla-sim --bench scale [-- SIZES...]`

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::json;

use flotilla_engine::fleet::{
    Catalog, Cluster, ImageRelease, KubeRelease, Member, NodePool, Os, RegionCatalog,
};
use flotilla_engine::time::Time;
use flotilla_engine::version::{ImageVersion, KubeVersion};
use flotilla_engine::window::{MaintenanceWindow, MaintenanceWindowSpec};
use flotilla_sim::scenario::{Action, SimBehaviour, TimedAction};
use flotilla_sim::{Scenario, simulate};

const GROUPS_PER_STAGE: usize = 50;
const STAGES: [&str; 3] = ["canary", "wave-1", "wave-2"];

/// A deterministic pseudo-random sequence (xorshift), so every run simulates the same fleet.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn fleet(size: usize) -> Scenario {
    let regions = ["eastus", "westeurope", "southeastasia"];
    let family = "AKSUbuntu-2204gen2containerd";
    let start = Time::parse("2026-03-02T00:00:00Z").expect("valid");
    let mut catalog = Catalog::default();
    for (i, region) in regions.iter().enumerate() {
        let mut rc = RegionCatalog::default();
        rc.kubernetes.push(KubeRelease {
            version: KubeVersion::parse("1.30.5").expect("v"),
            preview: false,
            long_term_support: false,
            available_at: None,
        });
        rc.kubernetes.push(KubeRelease {
            version: KubeVersion::parse("1.31.1").expect("v"),
            preview: false,
            long_term_support: false,
            available_at: Some(start.plus(i as i64 * 6 * 3600)),
        });
        rc.node_images.insert(
            family.into(),
            vec![ImageRelease {
                version: ImageVersion::parse("202602.10.0").expect("v"),
                available_at: None,
            }],
        );
        rc.family_order.push(family.into());
        catalog.regions.insert(region.to_string(), rc);
    }
    let window_spec: MaintenanceWindowSpec =
        serde_json::from_value(json!({"schedule": {"daily": {"intervalDays": 1}}, "durationHours": 8, "startTime": "22:00"})).expect("valid");
    let window = std::sync::Arc::new(MaintenanceWindow::parse(&window_spec, "w").expect("valid"));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut members = Vec::with_capacity(size);
    let mut behaviour = BTreeMap::new();
    for i in 0..size {
        // 2% canary, 30% wave 1, the rest wave 2; 50 groups in each stage.
        let stage = if i.is_multiple_of(50) {
            0
        } else if i % 10 < 3 {
            1
        } else {
            2
        };
        let group = format!(
            "{}-{:02}",
            STAGES[stage],
            rng.next() as usize % GROUPS_PER_STAGE
        );
        let name = format!("c{i:06}");
        members.push(Member {
            name: name.clone(),
            cluster_resource_id: format!("/sim/{name}"),
            group: Some(group),
            labels: BTreeMap::new(),
            cluster: Cluster {
                region: regions[i % 3].into(),
                kubernetes_version: KubeVersion::parse("1.30.5").expect("v"),
                node_pools: vec![NodePool {
                    name: "nodepool1".into(),
                    family: family.into(),
                    os: Os::Linux,
                    image: ImageVersion::parse("202602.10.0").expect("v"),
                }],
                kubernetes_window: rng.next().is_multiple_of(4).then(|| window.clone()),
                node_os_window: None,
                long_term_support: false,
            },
        });
        behaviour.insert(
            name,
            SimBehaviour {
                duration_seconds: 600 + (rng.next() % 1800) as i64,
                fail: rng.next().is_multiple_of(200),
                fail_message: "simulated failure".into(),
                fail_attempts: None,
            },
        );
    }
    let stages: Vec<_> = STAGES
        .iter()
        .enumerate()
        .map(|(si, stage)| {
            let groups: Vec<_> = (0..GROUPS_PER_STAGE)
                .map(|g| json!({"name": format!("{stage}-{g:02}"), "maxConcurrency": "20%", "maxAllowedFailures": "5%"}))
                .collect();
            json!({
                "name": stage,
                "maxConcurrency": if si == 0 { "10%" } else { "1000" },
                "maxAllowedFailures": "5%",
                "afterStageWaitInSeconds": 1800,
                "groups": groups,
            })
        })
        .collect();
    Scenario {
        name: format!("scale-{size}"),
        description: String::new(),
        start,
        until: start.plus(60 * 86_400),
        catalog,
        members,
        behaviour,
        strategy: Some(json!({"stages": stages})),
        update: Some(json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.1"}})),
        strategies: Default::default(),
        profiles: Vec::new(),
        releases: Vec::new(),
        actions: vec![TimedAction {
            at: start,
            action: Action::Start,
            label: "start".into(),
            run: None,
        }],
        expect: None,
    }
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    println!(
        "{:>8} {:>10} {:>10} {:>14} {:>12} {:>14} {:>10}",
        "members", "build s", "sim s", "events", "events/s", "virtual days", "peak MiB"
    );
    for size in sizes {
        let t0 = Instant::now();
        let scenario = fleet(size);
        let built = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let result = simulate(&scenario);
        let simulated = t1.elapsed().as_secs_f64();
        let status = result.status.as_ref().expect("the run was created");
        let days = status.status.completed_time.map_or(f64::NAN, |end| {
            (end.unix() - scenario.start.unix()) as f64 / 86_400.0
        });
        println!(
            "{size:>8} {built:>10.2} {simulated:>10.2} {:>14} {:>12.0} {days:>14.2} {:>10.0}   ({:?}, {} failures)",
            result.events.len(),
            result.events.len() as f64 / simulated,
            peak_rss_mib(),
            status.status.state,
            status.failure_count
        );
    }
}
