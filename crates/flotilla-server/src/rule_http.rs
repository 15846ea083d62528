//! What the handlers of a fleet's rules (freezes, disruption budgets) share: the fleet must
//! exist; a write is validated by the engine, bounded in number, stored, handed to the fleet's
//! task and reported to webhooks; an answer carries the resource's eTag.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use flotilla_engine::error::{ApiError, ErrorCode};

use crate::auth::{Caller, Role, require};
use crate::error::{HttpError, HttpResult};
use crate::request::{precondition, read_json, system_data};
use crate::state::AppState;
use crate::store::{Kind, Resource};

/// The event that reports a change of a fleet's freeze or disruption budget to the webhooks that
/// want `FreezeChanged` or `DisruptionBudgetChanged` (API.md), and its id, for the change as
/// the store made it: created or updated (with the new eTag), or deleted (no eTag). The store
/// records it in the change's own transaction (`Store::write_reported`), so a server killed at
/// any instant keeps both or neither.
pub(crate) fn report(
    fleet: &str,
    kind: Kind,
    name: &str,
) -> impl Fn(bool, Option<&str>) -> (String, serde_json::Value) + Send + Sync + use<> {
    let (event_type, key, what) = match kind {
        Kind::Freeze => ("FreezeChanged", "freeze", "freeze"),
        _ => (
            "DisruptionBudgetChanged",
            "disruptionBudget",
            "disruption budget",
        ),
    };
    let (fleet, collection, name) = (fleet.to_string(), kind.as_str(), name.to_string());
    move |created, etag| {
        let now = crate::clock::now();
        let change = match (etag, created) {
            (None, _) => "Deleted",
            (Some(_), true) => "Created",
            (Some(_), false) => "Updated",
        };
        let event = serde_json::json!({
            "type": event_type,
            "time": now,
            key: name,
            "change": change,
            "resource": format!("/v1/fleets/{fleet}/{collection}/{name}"),
            "message": format!("{what} {name:?} {}", change.to_ascii_lowercase()),
        });
        let version = match etag {
            Some(etag) => etag.trim_matches('"').to_string(),
            None => format!("deleted-{}", now.unix()),
        };
        (format!("{fleet}/{collection}/{name}/{version}"), event)
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

/// A kind of fleet rule, as its writes name it.
pub(crate) struct RuleKind {
    pub kind: Kind,
    /// How messages name one: `freeze`, `disruption budget`.
    pub what: &'static str,
    /// The code of a refusal of its properties.
    pub code: ErrorCode,
    /// What `properties` holds, for the message when it is missing.
    pub shape: &'static str,
    /// The most a fleet holds.
    pub most: usize,
}

/// `PUT P/{rules}/{name}` (operator): the properties validated by `parse` (each refusal names
/// the field and the value, and changes nothing), the fleet's count bounded, the resource
/// stored, the fleet's task told (it decides from the next scheduling pass) and the webhooks.
/// Returns the rule, the stored resource and whether this created it.
pub(crate) async fn put_rule<S, T>(
    state: &AppState,
    caller: &Caller,
    (fleet, name): (&str, &str),
    headers: &HeaderMap,
    body: Body,
    rule: &RuleKind,
    parse: impl Fn(&str, &S) -> Result<T, ApiError>,
) -> HttpResult<(T, Resource, bool)>
where
    S: serde::de::DeserializeOwned + serde::Serialize,
{
    require(caller, Role::Operator)?;
    require_fleet(state, fleet).await?;
    flotilla_engine::strategy::check_name(name, 63).map_err(|m| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidName,
            format!("{} name: {m}", rule.what),
            "name",
        ))
    })?;
    let envelope: flotilla_engine::body::Envelope<S> =
        flotilla_engine::error::from_json_value(read_json(body).await?, "")?;
    let spec = envelope.properties.ok_or_else(|| {
        HttpError::from(ApiError::new(
            rule.code,
            format!("properties is required: {{\"properties\": {}}}", rule.shape),
            "properties",
        ))
    })?;
    let parsed = parse(name, &spec)?;
    let (store, kind, most) = (state.runs.store.as_ref(), rule.kind, rule.most);
    let stored = store.get(fleet, kind, name).await?;
    if stored.is_none() && store.list(fleet, kind, None, most).await?.len() >= most {
        return Err(HttpError::from(ApiError::conflict(format!(
            "fleet {fleet:?} has {most} {}s, the most it may hold; delete one first",
            rule.what
        ))));
    }
    let collection = kind.as_str();
    let mut body = serde_json::json!({
        "id": format!("/v1/fleets/{fleet}/{collection}/{name}"),
        "name": name,
        "type": format!("Flotilla/fleets/{collection}"),
        "properties": spec,
    });
    body["systemData"] = system_data(caller, stored.as_ref().map(|r| &r.body));
    let (etag, created) = store
        .write_reported(
            fleet,
            kind,
            name,
            Some(&body.to_string()),
            &precondition(headers),
            &report(fleet, kind, name),
        )
        .await?;
    let resource = Resource {
        name: name.to_string(),
        body,
        etag: etag.unwrap_or_default(),
    };
    state.runs.rules_changed(fleet).await;
    Ok((parsed, resource, created))
}

/// 201 for a rule created, 200 for one replaced.
pub(crate) fn written(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}
