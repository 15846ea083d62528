//! Webhooks (API.md, "Webhooks and audit"): the `/v1/webhooks` resource (admin only), and the
//! delivery task that sends what the outbox holds. The store writes one outbox row per
//! (webhook, event) in the transaction of the run batch that records the event; this task
//! claims the rows that are due, renders each as CloudEvents, Slack or Teams JSON, signs it
//! with the webhook's secret, POSTs it, and records the answer: 2xx is delivered, anything
//! else is tried again with backoff (or after the receiver's `Retry-After`, where longer) until
//! 24 hours after the event. At least once: a server
//! killed between a send and its record sends the row again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::Sha256;

use flotilla_engine::error::{ApiError, ErrorCode, from_json_value};
use flotilla_engine::strategy::check_name;
use flotilla_engine::time::Time;

use crate::auth::{Caller, Role, require};
use crate::error::{HttpError, HttpResult};
use crate::request::{precondition, read_json, system_data};
use crate::run_head::RunHead;
use crate::state::Shared;
use crate::store::{
    AttemptOutcome, Delivery, DeliveryAttempt, DeliveryState, DueDelivery, Notice, Store, Webhook,
};

/// The formats a webhook sends in.
const FORMATS: [&str; 3] = ["CloudEvents", "Slack", "Teams"];
/// The longest URL and secret taken.
const URL_MAX: usize = 2048;
const SECRET_MAX: usize = 1024;
/// The most fleets or event types one webhook lists.
const LIST_MAX: usize = 100;
/// A page of webhooks or deliveries by default, and at most.
const PAGE: usize = 100;
const PAGE_MAX: usize = 1000;

// ---------------------------------------------------------------------------------------------
// The resource.

/// `properties` as sent. `hasSecret` is what a GET shows; it may be sent back and is ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WebhookProperties {
    url: Option<String>,
    secret: Option<String>,
    fleets: Option<Vec<String>>,
    events: Option<Vec<String>>,
    format: Option<String>,
    #[serde(default, rename = "hasSecret")]
    _has_secret: Option<Value>,
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequestContent, message, field)
}

/// A webhook from its `properties`, checked field by field (each refusal names its field and
/// value). A replacement sent without a secret keeps the stored one: the API never shows it.
fn parse(
    name: &str,
    properties: WebhookProperties,
    stored: Option<&Webhook>,
) -> Result<Webhook, ApiError> {
    let url = properties.url.ok_or_else(|| {
        invalid(
            "properties.url",
            "properties.url is required: where to POST the events".into(),
        )
    })?;
    check_url(&url)?;
    let secret = match (properties.secret, stored) {
        (Some(secret), _) => {
            if secret.is_empty() || secret.len() > SECRET_MAX {
                return Err(invalid(
                    "properties.secret",
                    format!(
                        "properties.secret: must be 1 to {SECRET_MAX} bytes (it is {})",
                        secret.len()
                    ),
                ));
            }
            secret
        }
        (None, Some(stored)) => stored.secret.clone(),
        (None, None) => {
            return Err(invalid(
                "properties.secret",
                "properties.secret is required: the key every delivery is signed with".into(),
            ));
        }
    };
    let fleets = properties.fleets.unwrap_or_else(|| vec!["*".into()]);
    check_list("properties.fleets", &fleets, |f| {
        check_name(f, 63).map_err(|m| format!("not a fleet name ({m}) or \"*\""))
    })?;
    let events = properties.events.unwrap_or_else(|| vec!["*".into()]);
    check_list("properties.events", &events, |e| {
        serde_json::from_value::<flotilla_engine::status::EventType>(json!(e))
            .map(|_| ())
            .map_err(|_| {
                "not an event type (RunStarted, RunCompleted, RunFailed, StageStarted, \
                 GatePending, MemberFailed, ...) or \"*\""
                    .into()
            })
    })?;
    let format = properties.format.unwrap_or_else(|| "CloudEvents".into());
    if !FORMATS.contains(&format.as_str()) {
        return Err(invalid(
            "properties.format",
            format!("properties.format {format:?}: must be CloudEvents, Slack or Teams"),
        ));
    }
    Ok(Webhook {
        name: name.to_string(),
        url,
        secret,
        fleets,
        events,
        format,
        system_data: Value::Null,
        etag: String::new(),
    })
}

/// An `http` or `https` URL with a host.
fn check_url(url: &str) -> Result<(), ApiError> {
    let bad = |why: &str| invalid("properties.url", format!("properties.url {url:?}: {why}"));
    if url.len() > URL_MAX {
        return Err(bad(&format!("longer than {URL_MAX} bytes")));
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&format!("not a URL ({e})")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("must be an http or https URL"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host"));
    }
    Ok(())
}

/// A non-empty list of at most [`LIST_MAX`] items, each `*` or what `check` accepts.
fn check_list(
    field: &str,
    items: &[String],
    check: impl Fn(&str) -> Result<(), String>,
) -> Result<(), ApiError> {
    if items.is_empty() || items.len() > LIST_MAX {
        return Err(invalid(
            field,
            format!(
                "{field}: must list 1 to {LIST_MAX} items (\"*\" for all); it lists {}",
                items.len()
            ),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        if item == "*" {
            continue;
        }
        if let Err(why) = check(item) {
            let target = format!("{field}[{i}]");
            return Err(invalid(&target, format!("{target} {item:?}: {why}")));
        }
    }
    Ok(())
}

/// A webhook as the API shows it: never its secret.
fn shown(hook: &Webhook) -> Value {
    json!({
        "id": format!("/v1/webhooks/{}", hook.name),
        "name": hook.name,
        "type": "Flotilla/webhooks",
        "eTag": hook.etag,
        "systemData": hook.system_data,
        "properties": {
            "url": hook.url,
            "hasSecret": !hook.secret.is_empty(),
            "fleets": hook.fleets,
            "events": hook.events,
            "format": hook.format,
        },
    })
}

fn answer(status: StatusCode, hook: &Webhook) -> Response {
    let mut response = (status, axum::Json(shown(hook))).into_response();
    if let Ok(etag) = HeaderValue::from_str(&hook.etag) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

fn not_found(name: &str) -> HttpError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("webhook {name:?} does not exist"),
        "webhook",
    )
    .into()
}

fn check_webhook_name(name: &str) -> HttpResult<()> {
    check_name(name, 50).map_err(|m| {
        ApiError::new(ErrorCode::InvalidName, format!("webhook name: {m}"), "name").into()
    })
}

/// The query of a list, as a map; a query that cannot be read, or a parameter the route does
/// not take, is a 400 in the API's error shape.
fn query(uri: &Uri, allowed: &[&str]) -> HttpResult<HashMap<String, String>> {
    let Query(query) = Query::<HashMap<String, String>>::try_from_uri(uri).map_err(|e| {
        HttpError::new(
            StatusCode::BAD_REQUEST,
            "InvalidQueryParameter",
            format!(
                "the query {:?}: {}",
                uri.query().unwrap_or_default(),
                e.body_text()
            ),
        )
    })?;
    if let Some(key) = query.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(invalid(
            key,
            format!(
                "{key}: unknown query parameter; this list takes {}",
                allowed.join(", ")
            ),
        )
        .into());
    }
    Ok(query)
}

fn top(query: &HashMap<String, String>) -> HttpResult<usize> {
    match query.get("$top") {
        None => Ok(PAGE),
        Some(t) => t
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| {
                invalid(
                    "$top",
                    format!("$top {t:?}: must be a whole number from 1 to {PAGE_MAX}"),
                )
                .into()
            }),
    }
}

/// `PUT /v1/webhooks/{name}` (admin): creates (201) or replaces (200) a webhook.
pub async fn put(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    check_webhook_name(&name)?;
    let body = read_json(body).await?;
    let properties: WebhookProperties = {
        let envelope: flotilla_engine::body::Envelope<WebhookProperties> =
            from_json_value(body, "")?;
        envelope.properties.ok_or_else(|| {
            invalid(
                "properties",
                "properties is required: {\"properties\": {\"url\", \"secret\", ...}}".into(),
            )
        })?
    };
    let store = &state.runs.store;
    let stored = store.get_webhook(&name).await?;
    let mut hook = parse(&name, properties, stored.as_ref())?;
    hook.system_data = system_data(
        &caller,
        stored
            .as_ref()
            .map(|s| json!({"systemData": s.system_data}))
            .as_ref(),
    );
    let (etag, created) = store.put_webhook(&hook, &precondition(&headers)).await?;
    hook.etag = etag;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(answer(status, &hook))
}

/// `GET /v1/webhooks/{name}` (admin).
pub async fn get(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let hook = state
        .runs
        .store
        .get_webhook(&name)
        .await?
        .ok_or_else(|| not_found(&name))?;
    Ok(answer(StatusCode::OK, &hook))
}

/// `DELETE /v1/webhooks/{name}` (admin): the webhook and its deliveries, sent or not.
pub async fn delete(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    if !state
        .runs
        .store
        .delete_webhook(&name, &precondition(&headers))
        .await?
    {
        return Err(not_found(&name));
    }
    Ok(StatusCode::OK.into_response())
}

/// `GET /v1/webhooks?$top=N&$skipToken=NAME` (admin): webhooks by name.
pub async fn list(State(state): State<Shared>, caller: Caller, uri: Uri) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let query = query(&uri, &["$top", "$skipToken"])?;
    let top = top(&query)?;
    let mut hooks = state
        .runs
        .store
        .list_webhooks(query.get("$skipToken").map(String::as_str), top + 1)
        .await?;
    let more = hooks.len() > top;
    hooks.truncate(top);
    let mut body = json!({"value": hooks.iter().map(shown).collect::<Vec<_>>()});
    if more && let Some(last) = hooks.last() {
        body["nextLink"] = json!(format!("/v1/webhooks?$top={top}&$skipToken={}", last.name));
    }
    Ok(axum::Json(body).into_response())
}

/// A delivery as the API shows it. Times are those of the outbox row: when the event was
/// written, last tried, delivered, due next.
fn shown_delivery(d: &Delivery) -> Value {
    let time = |ms: i64| Time(ms.div_euclid(1000));
    let mut v = json!({
        "id": d.id,
        "time": time(d.created_at),
        "eventId": d.event_id,
        "eventType": d.event_type,
        "fleet": d.fleet,
        "run": d.run,
        "state": d.state.as_str(),
        "attempts": d.attempts,
    });
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            v[key] = value;
        }
    };
    put("statusCode", d.last_status.map(|s| json!(s)));
    put("lastError", d.last_error.as_ref().map(|e| json!(e)));
    put("lastAttemptTime", d.last_attempt_at.map(|t| json!(time(t))));
    put("deliveredTime", d.delivered_at.map(|t| json!(time(t))));
    if d.state == DeliveryState::Pending {
        put("nextAttemptTime", d.next_attempt_at.map(|t| json!(time(t))));
    }
    v
}

/// `GET /v1/webhooks/{name}/deliveries?state=&$top=&after=` (admin): the webhook's deliveries,
/// oldest first, a page at a time (`nextLink` carries `after`, the last one's id).
pub async fn deliveries(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    uri: Uri,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let query = query(&uri, &["$top", "after", "state"])?;
    let top = top(&query)?;
    let after = match query.get("after") {
        None => 0,
        Some(a) => a
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| invalid("after", format!("after {a:?}: must be a delivery's id")))?,
    };
    let wanted = match query.get("state") {
        None => None,
        Some(s) => Some(DeliveryState::parse(s).ok_or_else(|| {
            invalid(
                "state",
                format!("state {s:?}: must be Pending, Delivered or Abandoned"),
            )
        })?),
    };
    let store = &state.runs.store;
    if store.get_webhook(&name).await?.is_none() {
        return Err(not_found(&name));
    }
    let page = store.list_deliveries(&name, wanted, after, top).await?;
    let mut body = json!({"value": page.iter().map(shown_delivery).collect::<Vec<_>>()});
    if page.len() == top
        && let Some(last) = page.last()
    {
        let mut next = format!(
            "/v1/webhooks/{name}/deliveries?$top={top}&after={}",
            last.id
        );
        if let Some(s) = wanted {
            next.push_str(&format!("&state={}", s.as_str()));
        }
        body["nextLink"] = json!(next);
    }
    Ok(axum::Json(body).into_response())
}

// ---------------------------------------------------------------------------------------------
// What is sent.

/// A delivery's request body and content type.
#[derive(Debug, PartialEq)]
pub struct Rendered {
    pub content_type: &'static str,
    pub body: String,
}

/// `RunCompleted` → `["Run", "Completed"]`.
fn words(camel: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in camel.char_indices().skip(1) {
        if c.is_ascii_uppercase() {
            out.push(&camel[start..i]);
            start = i;
        }
    }
    if start < camel.len() {
        out.push(&camel[start..]);
    }
    out
}

/// The CloudEvents `type` of an event type: `MemberFailed` → `io.flotilla.member.failed`.
pub fn cloud_event_type(event_type: &str) -> String {
    let words: Vec<String> = words(event_type)
        .iter()
        .map(|w| w.to_ascii_lowercase())
        .collect();
    format!("io.flotilla.{}", words.join("."))
}

/// The run's path on `/v1`: the CloudEvents `source`.
fn run_path(fleet: &str, run: &str) -> String {
    format!("/v1/fleets/{fleet}/updateRuns/{run}")
}

/// The dashboard's page of the run (`ui/app.js`'s routes), when users reach the server at a
/// known address.
fn dashboard_link(public_url: Option<&str>, fleet: &str, run: &str) -> Option<String> {
    public_url.map(|base| format!("{}/#/fleets/{fleet}/runs/{run}", base.trim_end_matches('/')))
}

/// What is known of the run without reading its document: its names and, from its head as last
/// written, its state, failure count and times.
fn run_summary(d: &Delivery, head: Option<&str>) -> Value {
    let mut summary = json!({
        "fleet": d.fleet,
        "name": d.run,
        "id": run_path(&d.fleet, &d.run),
    });
    if let Some(head) = head.map(RunHead::parse) {
        summary["state"] = json!(head.state());
        // Stored as a JSON number; a count is whole.
        summary["failureCount"] = json!(head.failure_count() as u64);
        let status = head.status();
        if let Some(t) = &status.start_time {
            summary["startTime"] = json!(t);
        }
        if let Some(t) = &status.completed_time {
            summary["completedTime"] = json!(t);
        }
    }
    summary
}

/// A short human line for chat: `Member aks-east-2 failed in update run r1 of fleet edge: node
/// drain timed out`; for a fleet's event in no run, `Fleet edge: freeze "peak" created`.
pub fn human_message(d: &Delivery) -> String {
    if d.run.is_empty() {
        let what = d.event["message"].as_str().unwrap_or(&d.event_type);
        return format!("Fleet {}: {what}", d.fleet);
    }
    let words = words(&d.event_type);
    let (noun, verb) = match words.split_first() {
        Some((noun, rest)) if !rest.is_empty() => (*noun, rest.join(" ").to_ascii_lowercase()),
        _ => ("Event", d.event_type.clone()),
    };
    let name = d.event[noun.to_ascii_lowercase()]
        .as_str()
        .map(|n| format!(" {n}"))
        .unwrap_or_default();
    let mut text = if noun == "Run" {
        format!("Update run {} of fleet {} {verb}", d.run, d.fleet)
    } else {
        format!(
            "{noun}{name} {verb} in update run {} of fleet {}",
            d.run, d.fleet
        )
    };
    let detail = d.event["error"]["message"]
        .as_str()
        .or_else(|| d.event["message"].as_str());
    if let Some(detail) = detail {
        text.push_str(": ");
        text.push_str(detail);
    }
    text
}

/// The body of a delivery in its webhook's format.
pub fn render(due: &DueDelivery, public_url: Option<&str>) -> Rendered {
    let d = &due.delivery;
    // A fleet's event in no run (a freeze or a budget written) links to its fleet's page.
    let link = if d.run.is_empty() {
        public_url.map(|base| format!("{}/#/fleets/{}", base.trim_end_matches('/'), d.fleet))
    } else {
        dashboard_link(public_url, &d.fleet, &d.run)
    };
    match due.webhook.format.as_str() {
        "Slack" => {
            let mut text = human_message(d);
            if let Some(link) = &link {
                text.push_str(&format!(" (<{link}|open in Flotilla>)"));
            }
            Rendered {
                content_type: "application/json",
                body: json!({"text": text}).to_string(),
            }
        }
        // An Adaptive Card in a message: what Teams' Workflows webhooks take, and its older
        // incoming webhooks too (Microsoft retires the MessageCard connectors).
        "Teams" => {
            let mut card = json!({
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [{"type": "TextBlock", "text": human_message(d), "wrap": true}],
            });
            if let Some(link) = &link {
                card["actions"] =
                    json!([{"type": "Action.OpenUrl", "title": "Open in Flotilla", "url": link}]);
            }
            Rendered {
                content_type: "application/json",
                body: json!({"type": "message", "attachments": [{
                    "contentType": "application/vnd.microsoft.card.adaptive",
                    "content": card,
                }]})
                .to_string(),
            }
        }
        _ => {
            let time = d.event["time"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| Time(d.created_at.div_euclid(1000)).to_string());
            let fleet_event = d.run.is_empty();
            let mut data = json!({"event": d.event});
            if !fleet_event {
                data["sequence"] = json!(d.seq);
                data["run"] = run_summary(d, due.run_head.as_deref());
            }
            if let Some(link) = link {
                data["link"] = json!(link);
            }
            let source = match d.event["resource"].as_str() {
                Some(resource) if fleet_event => resource.to_string(),
                _ => run_path(&d.fleet, &d.run),
            };
            let mut event = json!({
                "specversion": "1.0",
                "id": d.event_id,
                "source": source,
                "type": cloud_event_type(&d.event_type),
                "time": time,
                "datacontenttype": "application/json",
            });
            // What the event is about inside the run, if anything: its member, gate, group or
            // stage.
            if let Some(subject) = [
                "member",
                "gate",
                "group",
                "stage",
                "freeze",
                "disruptionBudget",
            ]
            .iter()
            .find_map(|k| d.event[*k].as_str())
            {
                event["subject"] = json!(subject);
            }
            event["data"] = data;
            Rendered {
                content_type: "application/cloudevents+json",
                body: event.to_string(),
            }
        }
    }
}

/// `X-Flotilla-Signature`'s value: `sha256=` and the lowercase hex HMAC-SHA256 of
/// `{timestamp}.{body}` keyed with the secret.
pub fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let mut out = String::from("sha256=");
    for byte in mac.finalize().into_bytes() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Delivery.

/// The pacing of deliveries.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// How long a claimed row is kept from other senders: longer than a request may take.
    pub claim: Duration,
    /// How long a receiver has to answer.
    pub request_timeout: Duration,
    /// The first retry's delay, doubled each time up to `backoff_cap`.
    pub backoff_start: Duration,
    pub backoff_cap: Duration,
    /// The longest wait a receiver's `Retry-After` is granted (a longer one is cut to this).
    pub retry_after_cap: Duration,
    /// How long after its event a delivery is given up on.
    pub give_up_after: Duration,
    /// How often the outbox is looked at when nothing says it grew.
    pub poll: Duration,
    /// Deliveries sent at once.
    pub in_flight: usize,
    /// Delivered and abandoned rows older than this are deleted.
    pub keep: Duration,
}

impl Default for Pacing {
    fn default() -> Pacing {
        Pacing {
            claim: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            backoff_start: Duration::from_secs(1),
            // A receiver down for a minute gets everything within half a minute of coming back.
            backoff_cap: Duration::from_secs(30),
            retry_after_cap: Duration::from_secs(3600),
            give_up_after: Duration::from_secs(24 * 3600),
            poll: Duration::from_secs(1),
            in_flight: 32,
            keep: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn unix_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}

/// What to do after a failed attempt: try again after the backoff of its attempt number (1 for
/// the first), or later where the receiver asked for more (`asked`, milliseconds from `now`, up
/// to `retry_after_cap`), or give up once the event is older than `give_up_after`.
pub fn after_failure(
    pacing: &Pacing,
    created_at: i64,
    attempt: i64,
    now: i64,
    asked: Option<i64>,
) -> AttemptOutcome {
    if now.saturating_sub(created_at) >= millis(pacing.give_up_after) {
        return AttemptOutcome::Abandoned;
    }
    let doublings = u32::try_from(attempt.saturating_sub(1).clamp(0, 30)).unwrap_or(30);
    let backoff = millis(pacing.backoff_start)
        .saturating_mul(1i64 << doublings)
        .min(millis(pacing.backoff_cap));
    let asked = asked.unwrap_or(0).clamp(0, millis(pacing.retry_after_cap));
    AttemptOutcome::RetryAt(now.saturating_add(backoff.max(asked)))
}

/// How long a receiver asked to be left alone, in milliseconds from `now_ms`: its `Retry-After`
/// (RFC 9110 §10.2.3), a number of seconds or an HTTP date. `None` without one, or with one
/// that says neither.
fn retry_after(headers: &header::HeaderMap, now_ms: i64) -> Option<i64> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u32>() {
        return Some(i64::from(seconds) * 1000);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let at = millis(at.duration_since(std::time::UNIX_EPOCH).ok()?);
    Some(at.saturating_sub(now_ms).max(0))
}

/// Sends one delivery and records what came of it.
async fn send(
    client: reqwest::Client,
    store: Arc<dyn Store>,
    pacing: Pacing,
    due: DueDelivery,
    public_url: Option<String>,
) {
    let rendered = render(&due, public_url.as_deref());
    let timestamp = unix_millis().div_euclid(1000);
    let request = client
        .post(&due.webhook.url)
        .header(header::CONTENT_TYPE, rendered.content_type)
        .header(
            header::USER_AGENT,
            concat!("flotilla/", env!("CARGO_PKG_VERSION")),
        )
        .header("X-Flotilla-Timestamp", timestamp.to_string())
        .header(
            "X-Flotilla-Signature",
            signature(&due.webhook.secret, timestamp, &rendered.body),
        )
        .header("X-Flotilla-Event-Id", &due.delivery.event_id)
        .body(rendered.body);
    let mut asked = None;
    let (status, error) = match request.send().await {
        Ok(response) if response.status().is_success() => (Some(response.status().as_u16()), None),
        Ok(response) => {
            let status = response.status();
            asked = retry_after(response.headers(), unix_millis());
            // A little of what the receiver said, for the deliveries list.
            let said: String = response
                .text()
                .await
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect();
            (
                Some(status.as_u16()),
                Some(format!("HTTP {status}: {said}")),
            )
        }
        Err(e) => (None, Some(error_chain(&e))),
    };
    let at = unix_millis();
    let d = &due.delivery;
    let outcome = match &error {
        None => AttemptOutcome::Delivered,
        Some(_) => after_failure(&pacing, d.created_at, d.attempts + 1, at, asked),
    };
    if let Some(e) = &error {
        tracing::info!(webhook = %due.webhook.name, event = %d.event_id, attempt = d.attempts + 1, error = %e, "a webhook delivery failed");
    }
    let attempt = DeliveryAttempt {
        at,
        status,
        error,
        outcome,
    };
    if let Err(e) = store.record_delivery(d.id, &attempt).await {
        // Its claim lapses and it is sent again: at least once.
        tracing::warn!(webhook = %due.webhook.name, event = %d.event_id, error = %e, "cannot record a webhook delivery");
    }
}

/// An error with its causes (reqwest's own message says little: "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The delivery task: forever, claims the deliveries that are due (at once when the store
/// says events were written, else every `poll`), sends them, up to `in_flight` at a time, and
/// prunes old rows once an hour.
pub async fn deliver(state: Shared, pacing: Pacing) {
    let client = match reqwest::Client::builder()
        .timeout(pacing.request_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot make the webhooks' HTTP client; no webhook will be sent");
            return;
        }
    };
    let store = state.runs.store.clone();
    let mut notices = Some(store.notices());
    let mut sending = tokio::task::JoinSet::new();
    let mut pruned = tokio::time::Instant::now();
    loop {
        let room = pacing.in_flight.saturating_sub(sending.len());
        if room > 0 {
            match store
                .claim_deliveries(unix_millis(), millis(pacing.claim), room)
                .await
            {
                Ok(due) => {
                    let public_url = state.arm_settings().public_url.clone();
                    for d in due {
                        sending.spawn(send(
                            client.clone(),
                            store.clone(),
                            pacing,
                            d,
                            public_url.clone(),
                        ));
                    }
                }
                // The server is shutting down: nothing more to send from this replica.
                Err(e) if e.is_closed() => return,
                Err(e) => tracing::warn!(error = %e, "cannot read the webhooks' outbox"),
            }
        }
        let events_written = async {
            match notices.as_mut() {
                Some(n) => loop {
                    match n.recv().await {
                        Ok(Notice::Events { .. }) => return true,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return true,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
                    }
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(_) = sending.join_next(), if !sending.is_empty() => {}
            open = events_written => {
                if !open {
                    notices = None;
                }
                // Many batches in a row are one look at the outbox.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ = tokio::time::sleep(pacing.poll) => {}
        }
        while sending.try_join_next().is_some() {}
        if pruned.elapsed() >= Duration::from_secs(3600) {
            pruned = tokio::time::Instant::now();
            match store
                .prune_deliveries(unix_millis().saturating_sub(millis(pacing.keep)))
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "old webhook deliveries deleted"),
                Err(e) => tracing::warn!(error = %e, "cannot delete old webhook deliveries"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(event_type: &str, event: Value) -> Delivery {
        Delivery {
            id: 7,
            webhook: "ops".into(),
            event_id: "edge/r1/12/3".into(),
            fleet: "edge".into(),
            run: "r1".into(),
            seq: 3,
            event_type: event_type.into(),
            event,
            created_at: 1_796_083_200_000,
            state: DeliveryState::Pending,
            attempts: 0,
            next_attempt_at: Some(1_796_083_200_000),
            last_attempt_at: None,
            last_status: None,
            last_error: None,
            delivered_at: None,
        }
    }

    fn due(format: &str, d: Delivery, head: Option<&str>) -> DueDelivery {
        DueDelivery {
            delivery: d,
            webhook: Webhook {
                name: "ops".into(),
                url: "https://hooks.example/x".into(),
                secret: "s3cret".into(),
                fleets: vec!["*".into()],
                events: vec!["*".into()],
                format: format.into(),
                system_data: Value::Null,
                etag: "\"1\"".into(),
            },
            run_head: head.map(String::from),
        }
    }

    #[test]
    fn event_types_become_dotted_cloud_event_types() {
        for (from, to) in [
            ("RunCompleted", "io.flotilla.run.completed"),
            ("MemberFailed", "io.flotilla.member.failed"),
            ("GatePending", "io.flotilla.gate.pending"),
            ("ActionRejected", "io.flotilla.action.rejected"),
            ("MemberReattached", "io.flotilla.member.reattached"),
            ("Run", "io.flotilla.run"),
        ] {
            assert_eq!(cloud_event_type(from), to);
        }
    }

    #[test]
    fn a_cloud_event_carries_the_event_a_run_summary_and_a_link() {
        let event = json!({"time": "2026-12-01T00:00:00Z", "type": "MemberFailed", "member": "m1",
            "error": {"code": "UpgradeFailed", "message": "node drain timed out", "target": ""}});
        let head = r#"{"properties":{"status":{"status":{"state":"Running","startTime":"2026-11-30T23:00:00Z"},"failureCount":1.0,"stages":[]}}}"#;
        let rendered = render(
            &due(
                "CloudEvents",
                delivery("MemberFailed", event.clone()),
                Some(head),
            ),
            Some("https://flotilla.example/"),
        );
        assert_eq!(rendered.content_type, "application/cloudevents+json");
        let body: Value = serde_json::from_str(&rendered.body).unwrap();
        assert_eq!(
            body,
            json!({
                "specversion": "1.0",
                "id": "edge/r1/12/3",
                "source": "/v1/fleets/edge/updateRuns/r1",
                "type": "io.flotilla.member.failed",
                "time": "2026-12-01T00:00:00Z",
                "datacontenttype": "application/json",
                "subject": "m1",
                "data": {
                    "event": event,
                    "sequence": 3,
                    "run": {"fleet": "edge", "name": "r1", "id": "/v1/fleets/edge/updateRuns/r1",
                        "state": "Running", "failureCount": 1, "startTime": "2026-11-30T23:00:00Z"},
                    "link": "https://flotilla.example/#/fleets/edge/runs/r1",
                },
            })
        );
        // Without a public URL or a head: no link, only the names.
        let rendered = render(
            &due(
                "CloudEvents",
                delivery("RunStarted", json!({"type": "RunStarted"})),
                None,
            ),
            None,
        );
        let body: Value = serde_json::from_str(&rendered.body).unwrap();
        assert_eq!(
            body["data"]["run"],
            json!({"fleet": "edge", "name": "r1", "id": "/v1/fleets/edge/updateRuns/r1"})
        );
        assert!(body["data"].get("link").is_none());
        assert!(body.get("subject").is_none());
        assert_eq!(body["time"], "2026-12-01T00:00:00Z");
    }

    #[test]
    fn a_fleet_event_names_its_resource_and_links_to_its_fleet() {
        let event = json!({"type": "FreezeChanged", "time": "2026-12-01T00:00:00Z",
            "freeze": "peak", "change": "Created", "resource": "/v1/fleets/edge/freezes/peak",
            "message": "freeze \"peak\" created"});
        let mut d = delivery("FreezeChanged", event);
        d.run = String::new();
        let cloud = render(
            &due("CloudEvents", d.clone(), None),
            Some("https://f.example"),
        );
        let body: Value = serde_json::from_str(&cloud.body).expect("JSON");
        assert_eq!(body["source"], "/v1/fleets/edge/freezes/peak", "{body}");
        assert_eq!(body["type"], "io.flotilla.freeze.changed", "{body}");
        assert_eq!(body["subject"], "peak", "{body}");
        assert_eq!(
            body["data"]["link"], "https://f.example/#/fleets/edge",
            "{body}"
        );
        assert!(body["data"].get("run").is_none(), "{body}");
        assert_eq!(human_message(&d), "Fleet edge: freeze \"peak\" created");
    }

    #[test]
    fn chat_formats_say_what_happened_in_a_line() {
        let failed = delivery(
            "MemberFailed",
            json!({"type": "MemberFailed", "member": "m1", "error": {"message": "node drain timed out"}}),
        );
        assert_eq!(
            human_message(&failed),
            "Member m1 failed in update run r1 of fleet edge: node drain timed out"
        );
        let done = delivery("RunCompleted", json!({"type": "RunCompleted"}));
        assert_eq!(
            human_message(&done),
            "Update run r1 of fleet edge completed"
        );
        let gate = delivery("GatePending", json!({"type": "GatePending", "gate": "g-1"}));
        assert_eq!(
            human_message(&gate),
            "Gate g-1 pending in update run r1 of fleet edge"
        );
        let slack = render(&due("Slack", done.clone(), None), Some("https://f.example"));
        assert_eq!(slack.content_type, "application/json");
        assert_eq!(
            serde_json::from_str::<Value>(&slack.body).unwrap(),
            json!({"text": "Update run r1 of fleet edge completed (<https://f.example/#/fleets/edge/runs/r1|open in Flotilla>)"})
        );
        let teams: Value =
            serde_json::from_str(&render(&due("Teams", done, None), None).body).unwrap();
        assert_eq!(teams["type"], "message");
        let card = &teams["attachments"][0];
        assert_eq!(
            card["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(card["content"]["type"], "AdaptiveCard");
        assert_eq!(
            card["content"]["body"][0]["text"],
            "Update run r1 of fleet edge completed"
        );
        assert!(card["content"].get("actions").is_none());
    }

    #[test]
    fn signatures_are_hmac_sha256_of_the_timestamp_and_body() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            signature("Jefe", 0, "what do ya want for nothing?").len(),
            "sha256=".len() + 64
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let known: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            known,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // The signed text is "{timestamp}.{body}".
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"1700000000.{\"a\":1}");
        let expected: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            signature("Jefe", 1_700_000_000, "{\"a\":1}"),
            format!("sha256={expected}")
        );
    }

    #[test]
    fn failures_back_off_to_the_cap_then_give_up_after_a_day() {
        let pacing = Pacing::default();
        let created = 1_000_000;
        let retry = |attempt: i64, now: i64| after_failure(&pacing, created, attempt, now, None);
        assert_eq!(retry(1, created), AttemptOutcome::RetryAt(created + 1_000));
        assert_eq!(retry(2, created), AttemptOutcome::RetryAt(created + 2_000));
        assert_eq!(retry(5, created), AttemptOutcome::RetryAt(created + 16_000));
        assert_eq!(retry(6, created), AttemptOutcome::RetryAt(created + 30_000));
        assert_eq!(
            retry(4000, created),
            AttemptOutcome::RetryAt(created + 30_000)
        );
        let day = 24 * 3600 * 1000;
        assert_eq!(
            retry(9, created + day - 1),
            AttemptOutcome::RetryAt(created + day - 1 + 30_000)
        );
        assert_eq!(retry(9, created + day), AttemptOutcome::Abandoned);
    }

    #[test]
    fn a_receivers_retry_after_is_waited_for_up_to_an_hour() {
        let pacing = Pacing::default();
        let created = 1_000_000;
        let retry = |attempt: i64, asked: Option<i64>| {
            after_failure(&pacing, created, attempt, created, asked)
        };
        // Longer than the backoff: the receiver's; shorter: the backoff's.
        assert_eq!(
            retry(1, Some(20_000)),
            AttemptOutcome::RetryAt(created + 20_000)
        );
        assert_eq!(
            retry(6, Some(5_000)),
            AttemptOutcome::RetryAt(created + 30_000)
        );
        assert_eq!(retry(1, Some(-5)), AttemptOutcome::RetryAt(created + 1_000));
        assert_eq!(
            retry(1, Some(86_400_000)),
            AttemptOutcome::RetryAt(created + 3_600_000)
        );
        // A day after the event, given up on whatever was asked.
        let late = after_failure(&pacing, created, 3, created + 24 * 3600 * 1000, Some(1_000));
        assert_eq!(late, AttemptOutcome::Abandoned);
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        use axum::http::{HeaderMap, HeaderValue, header::RETRY_AFTER};
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                RETRY_AFTER,
                HeaderValue::from_str(v).expect("a header value"),
            );
            h
        };
        // 2015-10-21T07:28:00Z, as RFC 9110's example date.
        let now = 1_445_412_480_000;
        assert_eq!(retry_after(&with("120"), now), Some(120_000));
        assert_eq!(retry_after(&with(" 0 "), now), Some(0));
        assert_eq!(
            retry_after(&with("Wed, 21 Oct 2015 07:29:00 GMT"), now),
            Some(60_000)
        );
        // A date already past: at once (the backoff still applies).
        assert_eq!(
            retry_after(&with("Wed, 21 Oct 2015 07:00:00 GMT"), now),
            Some(0)
        );
        for bad in ["-1", "soon", "1.5", ""] {
            assert_eq!(retry_after(&with(bad), now), None, "{bad:?}");
        }
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    fn properties(value: Value) -> WebhookProperties {
        from_json_value(value, "properties").unwrap()
    }

    #[test]
    fn bodies_are_checked_field_by_field() {
        let refused = |value: Value, target: &str| {
            let error = match from_json_value::<WebhookProperties>(value.clone(), "properties") {
                Err(e) => e,
                Ok(p) => parse("ops", p, None).expect_err(&value.to_string()),
            };
            assert_eq!(error.target, target, "{value}: {}", error.message);
        };
        let ok = json!({"url": "https://hooks.example/x", "secret": "s"});
        let with = |key: &str, v: Value| {
            let mut body = ok.clone();
            body[key] = v;
            body
        };
        refused(json!({"secret": "s"}), "properties.url");
        refused(with("url", json!("ftp://x.example/")), "properties.url");
        refused(with("url", json!("not a url")), "properties.url");
        refused(with("url", json!("https://")), "properties.url");
        refused(
            with("url", json!("mailto:ops@example.com")),
            "properties.url",
        );
        refused(
            json!({"url": "https://hooks.example/x"}),
            "properties.secret",
        );
        refused(with("secret", json!("")), "properties.secret");
        refused(
            with("events", json!(["RunCompleted", "RunExploded"])),
            "properties.events[1]",
        );
        refused(with("events", json!([])), "properties.events");
        refused(
            with("fleets", json!(["edge", "Bad_Name"])),
            "properties.fleets[1]",
        );
        refused(with("format", json!("Discord")), "properties.format");
        refused(with("colour", json!("red")), "properties.colour");
        refused(with("events", json!("RunCompleted")), "properties.events");
        let hook = parse("ops", properties(ok.clone()), None).unwrap();
        assert_eq!(
            (hook.fleets, hook.events, hook.format),
            (
                vec!["*".to_string()],
                vec!["*".to_string()],
                "CloudEvents".to_string()
            )
        );
        // A replacement without a secret keeps the stored one.
        let stored = Webhook {
            secret: "kept".into(),
            ..parse("ops", properties(ok.clone()), None).unwrap()
        };
        let replaced = parse(
            "ops",
            properties(json!({"url": "http://127.0.0.1:9/x", "hasSecret": true, "events": ["GatePending"]})),
            Some(&stored),
        )
        .unwrap();
        assert_eq!(replaced.secret, "kept");
        assert_eq!(replaced.events, ["GatePending"]);
    }
}
