//! Prometheus metrics: counters kept as events happen, gauges read from the store at scrape
//! time, in the text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use flotilla_engine::status::{Event, EventType};

/// Bucket bounds, seconds, of the dispatch-delay histogram.
const BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// A gauge to render: name, help text, and (labels, value) pairs.
pub type Gauge<'a> = (&'a str, &'a str, Vec<(String, f64)>);

#[derive(Default)]
struct Inner {
    /// (metric, fleet) → count.
    counters: BTreeMap<(&'static str, String), u64>,
    dispatch_buckets: [u64; BUCKETS.len()],
    dispatch_count: u64,
    dispatch_sum: f64,
    /// Recent dispatch delays per trigger, seconds.
    samples: BTreeMap<&'static str, Vec<f64>>,
}

/// How many recent delays are kept per trigger for quantiles.
const SAMPLES: usize = 20_000;

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn bump(&self, metric: &'static str, fleet: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            *inner
                .counters
                .entry((metric, fleet.to_string()))
                .or_default() += 1;
        }
    }

    pub fn count_started(&self, fleet: &str) {
        self.bump("flotilla_member_upgrades_started_total", fleet);
    }

    pub fn observe_event(&self, fleet: &str, event: &Event) {
        match event.kind {
            EventType::MemberSucceeded => {
                self.bump("flotilla_member_upgrades_succeeded_total", fleet)
            }
            EventType::MemberFailed => self.bump("flotilla_member_upgrades_failed_total", fleet),
            _ => {}
        }
    }

    /// The delay from what made an upgrade possible to it being sent: a slot freeing (the
    /// driver reporting an upgrade's end), a user action (an approval, a start), or a timer (a
    /// window opening, a wait ending).
    pub fn record_dispatch_delay(&self, trigger: &'static str, delay: Duration) {
        if let Ok(mut inner) = self.inner.lock() {
            let seconds = delay.as_secs_f64();
            if trigger == "slot" {
                for (i, bound) in BUCKETS.iter().enumerate() {
                    if seconds <= *bound {
                        inner.dispatch_buckets[i] += 1;
                    }
                }
                inner.dispatch_count += 1;
                inner.dispatch_sum += seconds;
            }
            let samples = inner.samples.entry(trigger).or_default();
            if samples.len() >= SAMPLES {
                samples.remove(0);
            }
            samples.push(seconds);
        }
    }

    /// Count, median, 99th percentile and maximum of the recent delays of one trigger, seconds.
    pub fn dispatch_quantiles(&self, trigger: &str) -> Option<(usize, f64, f64, f64)> {
        let inner = self.inner.lock().ok()?;
        let mut samples = inner.samples.get(trigger)?.clone();
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some((samples.len(), at(0.5), at(0.99), samples[samples.len() - 1]))
    }

    /// Renders counters plus the gauges given (name, help, labelled values).
    pub fn render(&self, gauges: &[Gauge]) -> String {
        let mut out = String::new();
        let Ok(inner) = self.inner.lock() else {
            return out;
        };
        let mut last = "";
        for ((metric, fleet), value) in &inner.counters {
            if *metric != last {
                let _ = writeln!(out, "# TYPE {metric} counter");
                last = metric;
            }
            let _ = writeln!(out, "{metric}{{fleet=\"{}\"}} {value}", escape(fleet));
        }
        let name = "flotilla_dispatch_delay_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from a member's upgrade ending to the next upgrade being sent."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (i, bound) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                inner.dispatch_buckets[i]
            );
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", inner.dispatch_count);
        let _ = writeln!(out, "{name}_sum {}", inner.dispatch_sum);
        let _ = writeln!(out, "{name}_count {}", inner.dispatch_count);
        let summary = "flotilla_dispatch_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {summary} Recent delays from a slot freeing, a user action or a timer to the upgrade it allowed being sent."
        );
        let _ = writeln!(out, "# TYPE {summary} summary");
        for (trigger, samples) in &inner.samples {
            let mut sorted = samples.clone();
            sorted.sort_by(f64::total_cmp);
            for q in [0.5, 0.99] {
                if let Some(v) =
                    sorted.get(((sorted.len().saturating_sub(1)) as f64 * q).round() as usize)
                {
                    let _ = writeln!(
                        out,
                        "{summary}{{trigger=\"{trigger}\",quantile=\"{q}\"}} {v}"
                    );
                }
            }
            let _ = writeln!(
                out,
                "{summary}_count{{trigger=\"{trigger}\"}} {}",
                sorted.len()
            );
        }
        for (name, help, values) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for (labels, value) in values {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
        out
    }
}

pub fn escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
