//! What every write reads of its request besides its path: the JSON body (strict: a key given
//! twice is refused), the eTag conditions (`If-Match`, `If-None-Match: *`), and the
//! `systemData` stamped from the caller; and a page of a kind of resource, in name order. Shared
//! by the handlers of `api`, `webhooks`, `check_providers` and `freezes`.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};

use flotilla_engine::error::{ApiError, ErrorCode};

use crate::auth::Caller;
use crate::clock::now;
use crate::error::{HttpError, HttpResult};
use crate::state::BODY_LIMIT;
use crate::store::{Kind, Precondition, Resource, Store};

pub(crate) fn precondition(headers: &HeaderMap) -> Precondition {
    if let Some(tag) = headers.get(header::IF_MATCH).and_then(|v| v.to_str().ok()) {
        Precondition::IfMatch(tag.trim().to_string())
    } else if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() == "*")
    {
        Precondition::IfNoneMatchAny
    } else {
        Precondition::None
    }
}

pub(crate) async fn read_json(body: Body) -> HttpResult<Value> {
    read_json_limited(body, BODY_LIMIT).await
}

pub(crate) async fn read_json_limited(body: Body, limit: usize) -> HttpResult<Value> {
    let bytes: Bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PayloadTooLarge",
            format!("the request body is larger than {limit} bytes"),
        )
    })?;
    if bytes.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    flotilla_engine::body::strict_json(&bytes).map_err(|e| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("the body is not valid JSON: {e}"),
            "",
        ))
    })
}

/// `systemData` (API.md, "Fleet Manager (ARM) paths"): who created a resource and when, kept
/// from the body it replaces, and who changed it last, from the caller's token.
pub(crate) fn system_data(caller: &Caller, previous: Option<&Value>) -> Value {
    let at = now();
    let by_type = if caller.is_system() {
        "Application"
    } else {
        "User"
    };
    let mut body = json!({"systemData": {
        "createdBy": caller.subject,
        "createdByType": by_type,
        "createdAt": at,
        "lastModifiedBy": caller.subject,
        "lastModifiedByType": by_type,
        "lastModifiedAt": at,
    }});
    if let Some(stored) = previous {
        crate::store::keep_creation(&mut body, stored);
    }
    body["systemData"].take()
}

/// `$top` and `$skipToken` of a list, read as text: a malformed or repeated parameter is a 400
/// in the API's error shape naming it, never the framework's plain-text answer.
#[derive(serde::Deserialize)]
pub struct ListQuery {
    #[serde(rename = "$top")]
    top: Option<String>,
    #[serde(rename = "$skipToken")]
    skip_token: Option<String>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ListQuery {
    type Rejection = HttpError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<ListQuery>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(q)| q)
            .map_err(|e| {
                HttpError::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidQueryParameter",
                    format!(
                        "the query {:?}: {}",
                        parts.uri.query().unwrap_or_default(),
                        e.body_text()
                    ),
                )
            })
    }
}

/// A page of `kind` under `fleet` in name order, each item shown by `shown`, with a `nextLink`
/// under `path` when more follow; `$top` is 1 to `most` (`most` by default).
pub(crate) async fn page(
    store: &dyn Store,
    fleet: &str,
    kind: Kind,
    query: &ListQuery,
    most: usize,
    path: &str,
    shown: impl Fn(Resource) -> Value,
) -> HttpResult<Value> {
    let top = match query.top.as_deref() {
        None => most,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=most).contains(&n) => n,
            _ => {
                return Err(HttpError::from(ApiError::new(
                    ErrorCode::InvalidRequestContent,
                    format!("$top {text:?}: must be a whole number from 1 to {most}"),
                    "$top",
                )));
            }
        },
    };
    let mut items = store
        .list(fleet, kind, query.skip_token.as_deref(), top + 1)
        .await?;
    let more = items.len() > top;
    items.truncate(top);
    let next = more.then(|| items.last().map(|r| r.name.clone())).flatten();
    let mut body = json!({"value": items.into_iter().map(shown).collect::<Vec<_>>()});
    if let Some(token) = next {
        body["nextLink"] = json!(format!("{path}?$top={top}&$skipToken={token}"));
    }
    Ok(body)
}
