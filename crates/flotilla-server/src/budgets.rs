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
use flotilla_engine::error::{ApiError, ErrorCode, from_json_value};

use crate::auth::{Caller, Role, require};
use crate::error::{HttpError, HttpResult};
use crate::fleet_rules::{MOST_BUDGETS as MOST, budget_from_body};
use crate::request::{ListQuery, page, precondition, read_json, system_data};
use crate::rule_http::{answer, require_fleet};
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
    // No task drives the fleet here: nothing is in flight if this replica holds its lease;
    // otherwise the replica that does counts them.
    let known = state.runs.holds_lease(fleet);
    let table = crate::runs::member_table(&state.runs.store, fleet).await?;
    let one = BTreeMap::from([(budget.name.clone(), budget.clone())]);
    let view = Budgets::cover(&one, table.iter(), std::iter::empty());
    Ok(view
        .partitions
        .iter()
        .map(|p| {
            let mut shown =
                json!({"value": p.value, "members": p.members, "maxUnavailable": p.limit});
            if known {
                shown["disrupted"] = json!(0);
            }
            shown
        })
        .collect())
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
    require(&caller, Role::Operator)?;
    require_fleet(&state, &fleet).await?;
    flotilla_engine::strategy::check_name(&name, 63).map_err(|m| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidName,
            format!("disruption budget name: {m}"),
            "name",
        ))
    })?;
    let envelope: flotilla_engine::body::Envelope<BudgetSpec> =
        from_json_value(read_json(body).await?, "")?;
    let spec = envelope.properties.ok_or_else(|| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidDisruptionBudget,
            "properties is required: {\"properties\": {\"maxUnavailable\", \"selector\", \"perValueOf\"}}",
            "properties",
        ))
    })?;
    let budget = parse_budget(&name, &spec)?;
    let store = state.runs.store.as_ref();
    let stored = store.get(&fleet, Kind::DisruptionBudget, &name).await?;
    if stored.is_none()
        && store
            .list(&fleet, Kind::DisruptionBudget, None, MOST)
            .await?
            .len()
            >= MOST
    {
        return Err(HttpError::from(ApiError::conflict(format!(
            "fleet {fleet:?} has {MOST} disruption budgets, the most it may hold; delete one first"
        ))));
    }
    let mut body = json!({
        "id": format!("/v1/fleets/{fleet}/disruptionBudgets/{name}"),
        "name": name,
        "type": "Flotilla/fleets/disruptionBudgets",
        "properties": spec,
    });
    body["systemData"] = system_data(&caller, stored.as_ref().map(|r| &r.body));
    let (resource, created) = store
        .put(
            &fleet,
            Kind::DisruptionBudget,
            &name,
            &body,
            &precondition(&headers),
        )
        .await?;
    state.runs.rules_changed(&fleet).await;
    let change = if created { "Created" } else { "Updated" };
    crate::rule_http::changed(
        &state,
        &fleet,
        Kind::DisruptionBudget,
        &name,
        change,
        Some(&resource.etag),
    )
    .await;
    let parts = partitions(&state, &fleet, &budget).await?;
    let etag = resource.etag.clone();
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(answer(status, shown(resource, Some(parts)), &etag))
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
