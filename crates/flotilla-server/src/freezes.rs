//! Freezes (SEMANTICS §12): the `P/freezes/{name}` resource (operators write, like strategies).
//! A handler validates, stores, and tells the fleet's task ([`crate::runs::Runs::rules_changed`]);
//! the fleet engine decides what a freeze holds. A freeze's `status` (in force now, its next
//! span, the members it covers) is worked out when it is read.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use flotilla_engine::error::{ApiError, ErrorCode};
use flotilla_engine::freeze::{Freeze, FreezeSpec, parse_freeze};
use flotilla_engine::time::Time;

use crate::auth::{Caller, Role, require};
use crate::error::{HttpError, HttpResult};
use crate::request::{ListQuery, page};
use crate::state::{AppState, Shared};
use crate::store::{Kind, Resource, StoreResult};

use crate::fleet_rules::{MOST_FREEZES as MOST, from_body};
use crate::rule_http::{RuleKind, answer, put_rule, require_fleet, written};

/// Freezes as the shared rule handlers name them.
const RULE: RuleKind = RuleKind {
    kind: Kind::Freeze,
    what: "freeze",
    code: ErrorCode::InvalidFreeze,
    shape: "{\"start\", \"end\"} or {\"recurrence\"}",
    most: MOST,
};

/// The resource as the API shows it, with its status as of `now`.
fn shown(resource: Resource, members: Option<usize>, now: Time) -> Value {
    let mut body = resource.body;
    if let Some(freeze) = from_body(&resource.name, &body) {
        let active = freeze.active_until(now).is_some();
        let (next_start, next_end) = match freeze.next_span(now) {
            Some((s, e)) => (Some(s), Some(e)),
            None => (None, None),
        };
        let mut status = json!({"active": active});
        if let Some(s) = next_start.filter(|_| !active) {
            status["nextStart"] = json!(s);
        }
        if let Some(e) = next_end {
            status["nextEnd"] = json!(e);
        }
        if let Some(n) = members {
            status["members"] = json!(n);
        }
        body["properties"]["status"] = status;
    }
    if let Some(map) = body.as_object_mut() {
        map.insert("eTag".into(), json!(resource.etag));
    }
    body
}

/// How many of the fleet's members a freeze covers.
async fn covered(state: &AppState, fleet: &str, freeze: &Freeze) -> StoreResult<usize> {
    let selector = freeze.selector.as_ref();
    let mut n = 0;
    let mut after: Option<String> = None;
    loop {
        let page = state
            .runs
            .store
            .list(fleet, Kind::Member, after.as_deref(), 1000)
            .await?;
        for m in &page {
            let labels: std::collections::BTreeMap<String, String> =
                serde_json::from_value(m.body["properties"]["labels"].clone()).unwrap_or_default();
            n += usize::from(selector.is_none_or(|s| s.matches(&labels)));
        }
        match page.last() {
            Some(last) if page.len() == 1000 => after = Some(last.name.clone()),
            _ => return Ok(n),
        }
    }
}

fn not_found(name: &str) -> HttpError {
    HttpError::from(ApiError::new(
        ErrorCode::NotFound,
        format!("freeze {name:?} does not exist"),
        "freeze",
    ))
}

/// `PUT P/freezes/{name}` (operator): creates or replaces a freeze; it holds members from the
/// next scheduling pass.
pub async fn put(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    let (freeze, resource, created) = put_rule(
        &state,
        &caller,
        (&fleet, &name),
        &headers,
        body,
        &RULE,
        |name, spec: &FreezeSpec| parse_freeze(name, spec),
    )
    .await?;
    let members = covered(&state, &fleet, &freeze).await?;
    let etag = resource.etag.clone();
    Ok(answer(
        written(created),
        shown(resource, Some(members), crate::clock::now()),
        &etag,
    ))
}

/// `GET P/freezes/{name}` (reader), with its status as of now.
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
        .get(&fleet, Kind::Freeze, &name)
        .await?
        .ok_or_else(|| not_found(&name))?;
    let members = match from_body(&name, &resource.body) {
        Some(f) => Some(covered(&state, &fleet, &f).await?),
        None => None,
    };
    let etag = resource.etag.clone();
    Ok(answer(
        StatusCode::OK,
        shown(resource, members, crate::clock::now()),
        &etag,
    ))
}

/// `GET P/freezes` (reader), in name order, each with its status (members not counted).
pub async fn list(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    query: ListQuery,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    let now = crate::clock::now();
    let path = format!("/v1/fleets/{fleet}/freezes");
    let body = page(
        state.runs.store.as_ref(),
        &fleet,
        Kind::Freeze,
        &query,
        MOST,
        &path,
        |r| shown(r, None, now),
    )
    .await?;
    Ok(axum::Json(body).into_response())
}
