//! A fleet's rules across its runs as stored (SEMANTICS §12): its freezes and disruption
//! budgets, read by the fleet's task when it starts and whenever they change, and by their
//! resources.

use flotilla_engine::budget::{Budget, BudgetSpec, parse_budget};
use flotilla_engine::freeze::{Freeze, FreezeSpec, parse_freeze};
use serde_json::Value;

use crate::store::{Kind, Store, StoreResult};

/// The most freezes a fleet holds (each is looked at for every member a run reaches).
pub const MOST_FREEZES: usize = 100;

/// The most disruption budgets a fleet holds (each is looked at for every member a run starts).
pub const MOST_BUDGETS: usize = 100;

/// A fleet's freezes and budgets, as stored and parsed; one that no longer parses is left out.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub freezes: Vec<Freeze>,
    pub budgets: Vec<Budget>,
}

/// A fleet's rules as stored now.
pub async fn rules_of(store: &dyn Store, fleet: &str) -> StoreResult<Rules> {
    Ok(Rules {
        freezes: store
            .list(fleet, Kind::Freeze, None, MOST_FREEZES + 1)
            .await?
            .into_iter()
            .filter_map(|r| from_body(&r.name, &r.body))
            .collect(),
        budgets: store
            .list(fleet, Kind::DisruptionBudget, None, MOST_BUDGETS + 1)
            .await?
            .into_iter()
            .filter_map(|r| budget_from_body(&r.name, &r.body))
            .collect(),
    })
}

/// A stored freeze's body, parsed.
pub fn from_body(name: &str, body: &Value) -> Option<Freeze> {
    let spec: FreezeSpec = serde_json::from_value(body["properties"].clone()).ok()?;
    parse_freeze(name, &spec).ok()
}

/// A stored disruption budget's body, parsed.
pub fn budget_from_body(name: &str, body: &Value) -> Option<Budget> {
    let spec: BudgetSpec = serde_json::from_value(body["properties"].clone()).ok()?;
    parse_budget(name, &spec).ok()
}
