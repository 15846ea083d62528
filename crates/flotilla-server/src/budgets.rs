//! Disruption budgets (SEMANTICS §12): the `P/disruptionBudgets/{name}` resource (operators
//! write, like strategies). A handler validates, stores, and tells the fleet's task
//! ([`crate::runs::Runs::rules_changed`]); the fleet engine decides what a budget holds. A
//! budget's `status` (its partitions: each value, the members it covers there, the resolved
//! `maxUnavailable` and the members in flight) is worked out when it is read: by the fleet's
//! task where it runs here, else from the stored members (and then the members in flight are
//! known only on the replica that drives the fleet's runs).

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use flotilla_engine::budget::{Budget, BudgetSpec, Budgets, parse_budget};
use flotilla_engine::error::{ApiError, ErrorCode};

use crate::auth::{Caller, Role, require};
use crate::error::{HttpError, HttpResult};
use crate::fleet_rules::{MOST_BUDGETS as MOST, budget_from_body};
use crate::request::{ListQuery, page};
use crate::rule_http::{RuleKind, answer, put_rule, require_fleet, written};

/// Disruption budgets as the shared rule handlers name them.
const RULE: RuleKind = RuleKind {
    kind: Kind::DisruptionBudget,
    what: "disruption budget",
    code: ErrorCode::InvalidDisruptionBudget,
    shape: "{\"maxUnavailable\", \"selector\", \"perValueOf\"}",
    most: MOST,
};
use crate::state::{AppState, Shared};
use crate::store::{Kind, Resource};

/// A budget's partitions now: `[{value, members, maxUnavailable, disrupted}]`.
async fn partitions(state: &AppState, fleet: &str, budget: &Budget) -> HttpResult<Value> {
    if let Some(parts) = state.runs.budget_partitions(fleet).await {
        let mine: Vec<Value> = parts
            .iter()
            .filter(|(p, _)| p.budget == budget.name)
            .map(|(p, n)| {
                json!({"value": p.value, "members": p.members, "maxUnavailable": p.limit, "disrupted": n})
            })
            .collect();
        // A budget the fleet's engine does not hold yet (it is being told) is counted below.
        if !mine.is_empty() || parts.iter().any(|(p, _)| p.budget == budget.name) {
            return Ok(Value::Array(mine));
        }
    }
    // No task drives the fleet here (another replica does, or none yet): the members in
    // flight are those with an operation recorded as sent and not finished, in any run that
    // can still move, as the store holds them.
    let table = crate::runs::member_table(&state.runs.store, fleet).await?;
    let in_flight = in_flight_as_stored(state, fleet).await?;
    let one = BTreeMap::from([(budget.name.clone(), budget.clone())]);
    let view = Budgets::cover(&one, table.iter(), in_flight.iter());
    Ok(view
        .partitions
        .iter()
        .zip(&view.in_flight)
        .map(|(p, n)| {
            json!({"value": p.value, "members": p.members, "maxUnavailable": p.limit, "disrupted": n})
        })
        .collect())
}

/// The members with an operation sent and not finished, in the fleet's runs that are not over.
async fn in_flight_as_stored(
    state: &AppState,
    fleet: &str,
) -> HttpResult<std::collections::BTreeSet<std::sync::Arc<str>>> {
    let store = state.runs.store.as_ref();
    let mut members = std::collections::BTreeSet::new();
    for (run, head) in crate::run_head::heads(store, fleet).await? {
        if head.is_over() || head.state() == "NotStarted" {
            continue;
        }
        for intent in store.intents(fleet, &run).await? {
            if !intent.finished {
                members.insert(std::sync::Arc::from(intent.member.as_str()));
            }
        }
    }
    Ok(members)
}

/// The resource as the API shows it, with its partitions where they were worked out.
fn shown(resource: Resource, partitions: Option<Value>) -> Value {
    let mut body = resource.body;
    if let Some(partitions) = partitions {
        body["properties"]["status"] = json!({"partitions": partitions});
    }
    if let Some(map) = body.as_object_mut() {
        map.insert("eTag".into(), json!(resource.etag));
    }
    body
}

fn not_found(name: &str) -> HttpError {
    HttpError::from(ApiError::new(
        ErrorCode::NotFound,
        format!("disruption budget {name:?} does not exist"),
        "disruptionBudget",
    ))
}

/// `PUT P/disruptionBudgets/{name}` (operator): creates or replaces a budget; it holds members
/// from the next scheduling pass.
pub async fn put(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    let (budget, resource, created) = put_rule(
        &state,
        &caller,
        (&fleet, &name),
        &headers,
        body,
        &RULE,
        |name, spec: &BudgetSpec| parse_budget(name, spec),
    )
    .await?;
    let parts = partitions(&state, &fleet, &budget).await?;
    let etag = resource.etag.clone();
    Ok(answer(
        written(created),
        shown(resource, Some(parts)),
        &etag,
    ))
}

/// `GET P/disruptionBudgets/{name}` (reader), with its partitions now.
pub async fn get(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, name)): Path<(String, String)>,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    let resource = state
        .runs
        .store
        .get(&fleet, Kind::DisruptionBudget, &name)
        .await?
        .ok_or_else(|| not_found(&name))?;
    let parts = match budget_from_body(&name, &resource.body) {
        Some(b) => Some(partitions(&state, &fleet, &b).await?),
        None => None,
    };
    let etag = resource.etag.clone();
    Ok(answer(StatusCode::OK, shown(resource, parts), &etag))
}

/// `GET P/disruptionBudgets` (reader), in name order (partitions are shown by `GET` of one).
pub async fn list(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    query: ListQuery,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    let path = format!("/v1/fleets/{fleet}/disruptionBudgets");
    let body = page(
        state.runs.store.as_ref(),
        &fleet,
        Kind::DisruptionBudget,
        &query,
        MOST,
        &path,
        |r| shown(r, None),
    )
    .await?;
    Ok(axum::Json(body).into_response())
}
