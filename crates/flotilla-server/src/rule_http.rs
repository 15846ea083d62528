//! What the handlers of a fleet's rules (freezes, disruption budgets) share: the fleet must
//! exist, and an answer carries the resource's eTag.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use flotilla_engine::error::{ApiError, ErrorCode};

use crate::error::{HttpError, HttpResult};
use crate::state::AppState;
use crate::store::Kind;

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
