//! How long a member's upgrade is expected to take, for forecasts (SEMANTICS §11): the median
//! of its own last five of the type, else of the fleet's last fifty, else what the driver
//! expects, else the forecast's default. One rule for the forecasts the API answers and those
//! a running run's status carries. A chained member's history holds its hops, each one
//! upgrade of the run's type (SEMANTICS §13: the forecast counts hops), recorded by the run's
//! task as each hop ends.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use flotilla_engine::fleet_engine::FleetEngine;
use flotilla_engine::forecast::{ForecastParams, median};

use crate::driver::{Driver, MemberRef};
use crate::store::{DurationHistory, Store, StoreResult};

/// Where a forecast took a member's duration from (SEMANTICS §11, in this order).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The median of the member's last five upgrades of the type.
    History,
    /// The median of the fleet's last fifty.
    FleetMedian,
    /// What the fleet's driver expects.
    Driver,
    Default,
}

/// An upgrade type's recorded durations, with the fleet's median worked out once.
struct History {
    recorded: DurationHistory,
    fleet_median: Option<i64>,
}

/// The durations of a fleet's members in a copy of its engine, each decided once.
pub struct Durations {
    /// The recorded durations of each upgrade type the copy's runs apply.
    histories: HashMap<String, History>,
    driver: Arc<dyn Driver>,
    params: ForecastParams,
    known: RefCell<HashMap<(String, String), (i64, Source)>>,
}

impl Durations {
    /// Reads the history of every upgrade type `copy`'s runs apply.
    pub async fn load(
        store: &dyn Store,
        fleet: &str,
        copy: &FleetEngine,
        driver: Arc<dyn Driver>,
        params: ForecastParams,
    ) -> StoreResult<Durations> {
        let kinds: BTreeSet<String> = copy
            .run_names()
            .filter_map(|name| Some(copy.run(name)?.upgrade().upgrade_type.as_str().to_string()))
            .collect();
        let mut histories = HashMap::new();
        for kind in kinds {
            let recorded = store.upgrade_durations(fleet, &kind).await?;
            let fleet_median = median(&recorded.fleet);
            histories.insert(
                kind,
                History {
                    recorded,
                    fleet_median,
                },
            );
        }
        Ok(Durations {
            histories,
            driver,
            params,
            known: Default::default(),
        })
    }

    /// The expected duration of `member`'s upgrade in run `run` of `copy`, in seconds.
    pub fn of(&self, copy: &FleetEngine, run: &str, member: &str) -> i64 {
        let key = (run.to_string(), member.to_string());
        if let Some((d, _)) = self.known.borrow().get(&key) {
            return *d;
        }
        let engine = copy.run(run);
        let history = engine.and_then(|e| self.histories.get(e.upgrade().upgrade_type.as_str()));
        let member_ref = MemberRef {
            name: member.to_string(),
            cluster_resource_id: engine
                .and_then(|e| e.cluster_resource_id(member))
                .unwrap_or(member)
                .to_string(),
        };
        let (d, source) = self.decide(history, &member_ref);
        self.known.borrow_mut().insert(key, (d, source));
        d
    }

    fn decide(&self, history: Option<&History>, member: &MemberRef) -> (i64, Source) {
        if let Some(d) = history
            .and_then(|h| h.recorded.members.get(&member.name))
            .and_then(|own| median(own))
        {
            return (d, Source::History);
        }
        if let Some(d) = history.and_then(|h| h.fleet_median) {
            return (d, Source::FleetMedian);
        }
        match self.driver.expected_duration(member) {
            Some(d) => (
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                Source::Driver,
            ),
            None => (self.params.default_duration_seconds, Source::Default),
        }
    }

    /// How many members' durations came from where (a forecast's `assumptions.durations`).
    pub fn counts(&self) -> Value {
        let known = self.known.borrow();
        let count = |s: Source| known.values().filter(|(_, got)| *got == s).count();
        json!({
            "history": count(Source::History),
            "fleetMedian": count(Source::FleetMedian),
            "driver": count(Source::Driver),
            "default": count(Source::Default),
        })
    }
}
