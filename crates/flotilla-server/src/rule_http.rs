//! What the handlers of a fleet's rules (freezes, disruption budgets) share: the fleet must
//! exist, and an answer carries the resource's eTag.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use flotilla_engine::error::{ApiError, ErrorCode};

use crate::error::{HttpError, HttpResult};
use crate::state::AppState;
use crate::store::Kind;

/// Records that a fleet's freeze or disruption budget was created, changed or deleted, for the
/// webhooks that want `FreezeChanged` or `DisruptionBudgetChanged` (API.md). After the write it
/// reports: a server killed between the two sends no event for that write.
pub(crate) async fn changed(
    state: &AppState,
    fleet: &str,
    kind: Kind,
    name: &str,
    change: &str,
    etag: Option<&str>,
) {
    let (event_type, key, what) = match kind {
        Kind::Freeze => ("FreezeChanged", "freeze", "freeze"),
        Kind::DisruptionBudget => (
            "DisruptionBudgetChanged",
            "disruptionBudget",
            "disruption budget",
        ),
        _ => return,
    };
    let now = crate::clock::now();
    let resource = format!("/v1/fleets/{fleet}/{}/{name}", kind.as_str());
    let event = serde_json::json!({
        "type": event_type,
        "time": now,
        key: name,
        "change": change,
        "resource": resource,
        "message": format!("{what} {name:?} {}", change.to_ascii_lowercase()),
    });
    let version = match etag {
        Some(etag) => etag.trim_matches('"').to_string(),
        None => format!("deleted-{}", now.unix()),
    };
    let id = format!("{fleet}/{}/{name}/{version}", kind.as_str());
    if let Err(e) = state
        .runs
        .store
        .record_fleet_event(fleet, &id, &event)
        .await
    {
        tracing::warn!(fleet, name, error = %e, "cannot record the event for webhooks");
    }
}

/// The fleet exists (404 naming it otherwise).
pub(crate) async fn require_fleet(state: &AppState, fleet: &str) -> HttpResult<()> {
    match state.runs.store.get("", Kind::Fleet, fleet).await? {
        Some(_) => Ok(()),
        None => Err(HttpError::from(ApiError::new(
            ErrorCode::NotFound,
            format!("fleet {fleet:?} does not exist"),
            "fleet",
        ))),
    }
}

/// A resource's answer, with its eTag as a header too.
pub(crate) fn answer(status: StatusCode, body: Value, etag: &str) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(header::ETAG, v);
    }
    response
}
