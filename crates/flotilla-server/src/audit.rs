//! The audit trail (API.md, "Webhooks and audit"): every write the API accepted, with who made
//! it, when, what it asked (the request's body when small, its secrets redacted) and how it was
//! answered; read with `GET /v1/audit`, pruned past its retention by the store
//! (`prune_audit_forever`).
//!
//! Recorded by one layer around every route, once the caller is known and the write has been
//! answered with success: a rule in one place, whatever the handler. ARM paths reach it
//! rewritten to their `/v1` form. What changes nothing is not a write: a route the route table
//! lets a reader call (a forecast, a what-if) is not recorded, however often it is called.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use flotilla_engine::error::{ApiError, ErrorCode};

use crate::auth::{Caller, Role, require};
use crate::error::HttpResult;
use crate::state::Shared;
use crate::store::AuditEntry;

/// A request body up to this size is kept in the trail; a larger one (an import) is noted by
/// its size.
const BODY_KEPT: usize = 16 * 1024;
/// Entries a page holds by default, and at most.
const PAGE: usize = 100;
const PAGE_MAX: usize = 1000;

/// What stands in the trail for a secret's value (what the API shows in place of one).
pub const REDACTED: &str = "<redacted>";

/// Objects of a route's body whose every value is a secret, whatever its key (a check
/// provider's headers: `Authorization`, `X-Api-Key`, any credential a receiver takes), as the
/// resource's own GET hides them: (route, JSON pointer).
const SECRET_OBJECTS: &[(&str, &str)] = &[("/v1/checkProviders/{provider}", "/properties/headers")];

/// Whether `path` is an instance of the route `pattern` (`{name}` matches one segment).
fn matches(pattern: &str, path: &str) -> bool {
    let (mut parts, mut segments) = (pattern.split('/'), path.split('/'));
    loop {
        match (parts.next(), segments.next()) {
            (None, None) => return true,
            (Some(p), Some(s)) if p.starts_with('{') || p == s => {}
            _ => return false,
        }
    }
}

/// A route of the route table: method, path (with `{name}` segments), summary, role.
pub type Route = (&'static str, &'static str, &'static str, &'static str);

/// The layer's state: the server's, and the route table (`api::ROUTES`), which says what a
/// reader may call.
#[derive(Clone)]
pub struct Recorder {
    pub state: Shared,
    pub routes: &'static [Route],
}

impl Recorder {
    /// Whether `method path` changes nothing: the most specific route of the table that it
    /// matches is one a reader may call (a reader changes nothing, API.md "Authentication").
    /// A request no route matches is recorded.
    fn changes_nothing(&self, method: &Method, path: &str) -> bool {
        self.routes
            .iter()
            .filter(|(m, pattern, _, _)| {
                m.eq_ignore_ascii_case(method.as_str()) && matches(pattern, path)
            })
            .max_by_key(|(_, pattern, _, _)| {
                pattern.split('/').filter(|p| !p.starts_with('{')).count()
            })
            .is_some_and(|(_, _, _, role)| matches!(*role, "reader" | "none"))
    }
}

/// Whether a body's key names a secret: `secret`, `password`, `token`, `authorization`,
/// `apiKey`, `privateKey`, or a name ending in one of the first three (`clientSecret`,
/// `accessToken`), in any case, with or without `-`/`_`. A key that names where a secret is
/// kept (`clientSecretFile`, `clientSecretEnv`, `tokenFile`) is not one: it says nothing of the
/// secret.
fn names_a_secret(key: &str) -> bool {
    let key: String = key
        .chars()
        .filter(|c| !matches!(c, '-' | '_'))
        .flat_map(char::to_lowercase)
        .collect();
    ["secret", "password", "passwd", "token"]
        .iter()
        .any(|s| key.ends_with(s))
        || matches!(
            key.as_str(),
            "authorization" | "apikey" | "xapikey" | "privatekey"
        )
}

/// The body of a write to `path` with its secrets' values replaced by [`REDACTED`]: the value
/// of every key that names a secret ([`names_a_secret`]) at any depth, and every value of the
/// route's [`SECRET_OBJECTS`]. The trail keeps that one was sent, never what it was (the API
/// never shows a secret again, API.md "Webhooks and audit"). A true or false is kept (a
/// webhook's `hasSecret`, sent back as read): it holds no secret.
pub fn redacted(path: &str, mut body: Value) -> Value {
    for (route, pointer) in SECRET_OBJECTS {
        if matches(route, path)
            && let Some(object) = body.pointer_mut(pointer).and_then(Value::as_object_mut)
        {
            for value in object.values_mut() {
                *value = json!(REDACTED);
            }
        }
    }
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if names_a_secret(key) && !matches!(v, Value::Bool(_) | Value::Null) {
                        *v = json!(REDACTED);
                    } else {
                        walk(v);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut body);
    body
}

/// What the trail keeps of a body: nothing for none, the JSON with its secrets redacted when
/// small, else a note of its size (a body that is not JSON is noted by its size too: what
/// cannot be read cannot be redacted).
fn kept(path: &str, bytes: &[u8]) -> Option<String> {
    match bytes.len() {
        0 => None,
        n if n <= BODY_KEPT => Some(match serde_json::from_slice::<Value>(bytes) {
            Ok(body) => redacted(path, body).to_string(),
            Err(_) => format!("({n} bytes, not JSON)"),
        }),
        n => Some(format!("({n} bytes)")),
    }
}

/// The layer: runs the request, then records it if it was an accepted write.
pub async fn layer(State(recorder): State<Recorder>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    if matches!(method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(request).await;
    }
    let Some(caller) = request.extensions().get::<Caller>().cloned() else {
        return next.run(request).await;
    };
    let path = request.uri().path().to_string();
    if recorder.changes_nothing(&method, &path) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // The body was read whole by the body limit around this layer: this is a copy in memory.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return crate::error::HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!("cannot read the body: {e}"),
                "",
            ))
            .into_response();
        }
    };
    let kept = kept(&path, &bytes);
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if response.status().is_success() {
        let segments: Vec<&str> = path.split('/').collect();
        let fleet = (segments.len() > 3 && segments[1] == "v1" && segments[2] == "fleets")
            .then(|| segments[3].to_string());
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let entry = AuditEntry {
            id: 0,
            at,
            subject: caller.subject.clone(),
            role: caller.role.name().to_string(),
            method: method.to_string(),
            path,
            fleet,
            status: response.status().as_u16(),
            body: kept,
        };
        if let Err(e) = recorder.state.runs.store.append_audit(&entry).await {
            tracing::warn!(error = %e, subject = entry.subject, path = entry.path, "cannot record the write in the audit trail");
        }
    }
    response
}

/// An entry as the API shows it.
fn shown(e: &AuditEntry) -> Value {
    let time = flotilla_engine::time::Time(e.at.div_euclid(1000));
    let mut v = json!({
        "id": e.id, "time": time, "subject": e.subject, "role": e.role,
        "method": e.method, "path": e.path, "status": e.status,
    });
    if let Some(f) = &e.fleet {
        v["fleet"] = json!(f);
    }
    if let Some(b) = &e.body {
        // A JSON body is shown as JSON; anything else as its text.
        v["body"] = serde_json::from_str(b).unwrap_or_else(|_| json!(b));
    }
    v
}

/// `GET /v1/audit?fleet=F&since=TIME&$top=N` (admin): the trail, oldest first, a page at a
/// time (`nextLink` carries `after`, the last entry's id).
pub async fn list(
    State(state): State<Shared>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let bad = |field: &str, value: &str, why: &str| {
        ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("{field} {value:?}: {why}"),
            field,
        )
    };
    for key in query.keys() {
        if !matches!(key.as_str(), "fleet" | "since" | "$top" | "after") {
            return Err(bad(
                key,
                "",
                "unknown query parameter; audit takes fleet, since, $top and after",
            )
            .into());
        }
    }
    let top = match query.get("$top") {
        None => PAGE,
        Some(t) => t
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| bad("$top", t, "must be a number from 1 to 1000"))?,
    };
    let after = match query.get("after") {
        None => 0,
        Some(a) => a
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| bad("after", a, "must be an entry's id"))?,
    };
    let fleet = query.get("fleet").map(String::as_str);
    if let Some(f) = fleet
        && flotilla_engine::strategy::check_name(f, 63).is_err()
    {
        return Err(bad("fleet", f, "not a fleet name").into());
    }
    let since = match query.get("since") {
        None => 0,
        Some(t) => flotilla_engine::time::Time::parse(t)
            .map_err(|_| bad("since", t, "must be a time such as 2026-12-01T00:00:00Z"))?
            .0
            .saturating_mul(1000),
    };
    let entries = state
        .runs
        .store
        .list_audit(fleet, after, since, top)
        .await?;
    let mut answer = json!({"value": entries.iter().map(shown).collect::<Vec<_>>()});
    if entries.len() == top
        && let Some(last) = entries.last()
    {
        let mut next = format!("/v1/audit?$top={top}&after={}", last.id);
        if let Some(f) = fleet {
            next.push_str(&format!("&fleet={f}"));
        }
        if let Some(t) = query.get("since") {
            next.push_str(&format!("&since={t}"));
        }
        answer["nextLink"] = json!(next);
    }
    Ok(axum::Json(answer).into_response())
}

#[cfg(test)]
mod tests {
    use super::{REDACTED, redacted};
    use serde_json::json;

    #[test]
    fn secrets_are_redacted_wherever_they_are_and_nothing_else_is() {
        let body = json!({"properties": {
            "url": "https://hooks.example/x", "secret": "s3", "hasSecret": true,
            "driver": {"credential": {"type": "ClientSecret", "clientId": "c",
                "clientSecretFile": "/run/secret", "clientSecret": "cs"}},
            "list": [{"password": "p"}, {"Api_Key": 7}, {"token": null}],
            "headers": {"Authorization": "Bearer t", "X-Scope": "org-1"},
            "accessToken": {"nested": "t"},
        }});
        assert_eq!(
            redacted("/v1/webhooks/w", body.clone()),
            json!({"properties": {
                "url": "https://hooks.example/x", "secret": REDACTED, "hasSecret": true,
                "driver": {"credential": {"type": "ClientSecret", "clientId": "c",
                    "clientSecretFile": "/run/secret", "clientSecret": REDACTED}},
                "list": [{"password": REDACTED}, {"Api_Key": REDACTED}, {"token": null}],
                "headers": {"Authorization": REDACTED, "X-Scope": "org-1"},
                "accessToken": REDACTED,
            }})
        );
        // A check provider's headers are secrets whatever their names.
        let provider = redacted("/v1/checkProviders/prom", body);
        assert_eq!(
            provider["properties"]["headers"],
            json!({"Authorization": REDACTED, "X-Scope": REDACTED})
        );
    }
}
