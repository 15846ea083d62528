//! Prometheus metrics through `prometheus-client`: counters and the dispatch-delay histogram
//! kept as events happen, gauges read from the runs' small heads at scrape time, in the
//! OpenMetrics text format.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use flotilla_engine::status::{Event, EventType};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The content type of what [`Metrics::render`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bucket bounds, seconds, of the dispatch-delay histogram.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// How many recent delays are kept per trigger for the benchmarks' exact quantiles.
const SAMPLES: usize = 20_000;

/// A metric's labels: name and value pairs, in the order they are printed.
pub type Labels = Vec<(&'static str, String)>;

type Delays = Family<Labels, Histogram, fn() -> Histogram>;

fn delay_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    started: Family<Labels, Counter>,
    succeeded: Family<Labels, Counter>,
    failed: Family<Labels, Counter>,
    dispatch: Delays,
    checkpoints: Counter,
    rebuilt: Family<Labels, Counter>,
    /// Recent dispatch delays per trigger, seconds: read by the benchmarks, not exported.
    samples: Mutex<BTreeMap<&'static str, VecDeque<f64>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let started = Family::<Labels, Counter>::default();
        let succeeded = Family::<Labels, Counter>::default();
        let failed = Family::<Labels, Counter>::default();
        let dispatch = Delays::new_with_constructor(delay_histogram);
        let checkpoints = Counter::default();
        let rebuilt = Family::<Labels, Counter>::default();
        registry.register(
            "flotilla_run_checkpoints",
            "Checkpoints of runs written (each replaces the run's log before it)",
            checkpoints.clone(),
        );
        registry.register(
            "flotilla_runs_rebuilt",
            "Runs rebuilt from the store (from: checkpoint, a checkpoint and the log after it; \
             log, the whole log)",
            rebuilt.clone(),
        );
        registry.register(
            "flotilla_member_upgrades_started",
            "Member upgrades sent to the driver",
            started.clone(),
        );
        registry.register(
            "flotilla_member_upgrades_succeeded",
            "Member upgrades that succeeded",
            succeeded.clone(),
        );
        registry.register(
            "flotilla_member_upgrades_failed",
            "Member upgrades that failed",
            failed.clone(),
        );
        registry.register(
            "flotilla_dispatch_delay_seconds",
            "Time from what made an upgrade possible (trigger: slot, a member's upgrade ending; \
             action, a user's start or approval; timer, a window opening or a wait ending) to \
             the upgrade being sent",
            dispatch.clone(),
        );
        Metrics {
            registry,
            started,
            succeeded,
            failed,
            dispatch,
            checkpoints,
            rebuilt,
            samples: Mutex::default(),
        }
    }
}

fn fleet(fleet: &str) -> Labels {
    vec![("fleet", fleet.to_string())]
}

impl Metrics {
    pub fn count_checkpoint(&self) {
        self.checkpoints.inc();
    }

    /// A run rebuilt from the store, from its checkpoint or from its whole log.
    pub fn count_rebuilt(&self, from_checkpoint: bool) {
        let from = if from_checkpoint { "checkpoint" } else { "log" };
        self.rebuilt
            .get_or_create(&vec![("from", from.into())])
            .inc();
    }

    pub fn count_started(&self, name: &str) {
        self.started.get_or_create(&fleet(name)).inc();
    }

    pub fn observe_event(&self, name: &str, event: &Event) {
        match event.kind {
            EventType::MemberSucceeded => {
                self.succeeded.get_or_create(&fleet(name)).inc();
            }
            EventType::MemberFailed => {
                self.failed.get_or_create(&fleet(name)).inc();
            }
            _ => {}
        }
    }

    /// The delay from what made an upgrade possible to it being sent: a slot freeing (the
    /// driver reporting an upgrade's end), a user action (an approval, a start), or a timer (a
    /// window opening, a wait ending).
    pub fn record_dispatch_delay(&self, trigger: &'static str, delay: Duration) {
        let seconds = delay.as_secs_f64();
        self.dispatch
            .get_or_create(&vec![("trigger", trigger.to_string())])
            .observe(seconds);
        if let Ok(mut samples) = self.samples.lock() {
            let samples = samples.entry(trigger).or_default();
            if samples.len() >= SAMPLES {
                samples.pop_front();
            }
            samples.push_back(seconds);
        }
    }

    /// Count, median, 99th percentile and maximum of the recent delays of one trigger, seconds.
    pub fn dispatch_quantiles(&self, trigger: &str) -> Option<(usize, f64, f64, f64)> {
        let mut samples: Vec<f64> = self
            .samples
            .lock()
            .ok()?
            .get(trigger)?
            .iter()
            .copied()
            .collect();
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some((samples.len(), at(0.5), at(0.99), samples[samples.len() - 1]))
    }

    /// The counters and histograms, then the gauges read at this scrape.
    pub fn render(&self, gauges: &ScrapeGauges) -> String {
        let mut out = String::new();
        let encoded = encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &gauges.registry))
            .and_then(|()| encode_eof(&mut out));
        if let Err(e) = encoded {
            tracing::warn!("metrics could not be encoded: {e}");
        }
        out
    }
}

/// A gauge family whose values are floats.
pub type FloatGauges = Family<Labels, Gauge<f64, AtomicU64>>;

/// Gauges read from the store for one scrape.
#[derive(Default)]
pub struct ScrapeGauges {
    registry: Registry,
}

impl ScrapeGauges {
    /// A new gauge family, registered for this scrape.
    pub fn family(&mut self, name: &str, help: &str) -> FloatGauges {
        let family = FloatGauges::default();
        self.registry.register(name, help, family.clone());
        family
    }
}
