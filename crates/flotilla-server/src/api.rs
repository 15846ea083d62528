//! The HTTP API of `docs/spec/API.md`: resources with eTags and paging, run actions, gates,
//! the event log and its live stream, releases, tokens, health and metrics.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use flotilla_engine::engine::{Input, SkipKind, SkipTarget};
use flotilla_engine::error::{ApiError, ErrorCode, from_json_value};
use flotilla_engine::fleet::Cluster;
use flotilla_engine::selector::{validate_label_key, validate_label_value};
use flotilla_engine::strategy::{
    DEFAULT_STAGE_CONCURRENCY_LIMIT, ManagedClusterUpdateSpec, StrategySpec, check_name,
    parse_strategy, parse_upgrade,
};

use crate::auth::{Caller, Role, authenticate, require};
use crate::clock::now;
use crate::driver::{MemberRef, validate_driver_config};
use crate::error::{HttpError, HttpResult};
use crate::request::{precondition, read_json, read_json_limited, system_data};
use crate::runs::{RunSnapshot, SNAPSHOT, engine_from_snapshot};
use crate::state::{AppState, IMPORT_BODY_LIMIT, Shared};
use crate::store::{
    Kind, MemberWrite, Notice, Precondition, RegisterMode, Resource, StoreError, cluster_key,
    member_cluster_id,
};
use flotilla_engine::body::{RunProperties, StrategyProperties};
use flotilla_engine::engine::{RunRules, RunSpec};
use flotilla_engine::fleet_engine::FleetEngine;
use flotilla_engine::forecast::{ForecastParams, forecast};
use flotilla_engine::profile::{
    NoRun, Profile, ProfileSpec, TriggerOutcome, already_recorded, next_generation, parse_profile,
    plan_generation, trigger_status,
};

/// The most members one import may carry (API.md, "Batch registration").
const IMPORT_MAX_MEMBERS: usize = 10_000;

fn not_found(what: &str, name: &str) -> HttpError {
    HttpError::from(ApiError::new(
        ErrorCode::NotFound,
        format!("{what} {name:?} does not exist"),
        what,
    ))
}

/// For actions on an existing resource (POST, gate PATCH): `If-Match` must name its eTag.
fn check_if_match(headers: &HeaderMap, etag: &str) -> HttpResult<()> {
    match precondition(headers) {
        Precondition::IfMatch(tag) if tag != "*" && tag != etag => Err(HttpError::new(
            StatusCode::PRECONDITION_FAILED,
            "PreconditionFailed",
            format!("If-Match {tag} does not match the current eTag {etag}"),
        )),
        _ => Ok(()),
    }
}

/// For a write that finds the resource already as sent: the preconditions a write would have
/// been held to (`If-Match`, `If-None-Match: *`).
fn check_precondition(headers: &HeaderMap, etag: &str) -> HttpResult<()> {
    check_if_match(headers, etag)?;
    if precondition(headers) == Precondition::IfNoneMatchAny {
        return Err(HttpError::new(
            StatusCode::PRECONDITION_FAILED,
            "PreconditionFailed",
            format!("If-None-Match: * but the resource exists (eTag {etag})"),
        ));
    }
    Ok(())
}

pub(crate) fn check_resource_name(name: &str, what: &str, max: usize) -> HttpResult<()> {
    check_name(name, max).map_err(|m| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidName,
            format!("{what} name: {m}"),
            "name",
        ))
    })
}

fn envelope<P: serde::de::DeserializeOwned>(value: Value) -> HttpResult<P> {
    Ok(flotilla_engine::body::properties(value)?)
}

/// A stored resource as the API shows it: the body, its eTag, no internal fields.
/// A stored resource as the API shows it. It takes the resource: a run's body is large, and a
/// copy of it per read was most of a busy server's memory.
pub(crate) fn present(resource: Resource) -> Value {
    let mut body = resource.body;
    if let Some(map) = body.as_object_mut() {
        map.remove(SNAPSHOT);
        map.insert("eTag".into(), json!(resource.etag));
    }
    if body["type"] == "Microsoft.ContainerService/fleets/members" {
        add_maintenance_openings(&mut body, now());
    }
    body
}

/// A member's next maintenance openings (`status.maintenanceOpenings.{kubernetes,nodeOS}` with
/// `from` and `until`), worked out at read time from its last observed windows, so a client need
/// not reimplement the window rules (SEMANTICS §3a). `null` when a window never opens again.
fn add_maintenance_openings(body: &mut Value, at: flotilla_engine::time::Time) {
    use flotilla_engine::window::{MaintenanceWindow, MaintenanceWindowSpec};
    let maintenance = &body["properties"]["status"]["cluster"]["maintenance"];
    let mut openings = serde_json::Map::new();
    for field in ["kubernetes", "nodeOS"] {
        let Ok(spec) = serde_json::from_value::<MaintenanceWindowSpec>(maintenance[field].clone())
        else {
            continue;
        };
        let Ok(window) = MaintenanceWindow::parse(&spec, field) else {
            continue;
        };
        let opening = window
            .next_opening(at)
            .map(|o| json!({"from": o.from, "until": o.until}));
        openings.insert(field.into(), opening.unwrap_or(Value::Null));
    }
    if !openings.is_empty()
        && let Some(status) = body["properties"]["status"].as_object_mut()
    {
        status.insert("maintenanceOpenings".into(), Value::Object(openings));
    }
}

fn respond(resource: Resource, created: bool) -> Response {
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let etag = HeaderValue::from_str(&resource.etag).ok();
    let mut response = (status, axum::Json(present(resource))).into_response();
    if let Some(v) = etag {
        response.headers_mut().insert(header::ETAG, v);
    }
    response
}

#[derive(Deserialize, Default)]
pub(crate) struct Paging {
    #[serde(rename = "$top")]
    top: Option<String>,
    #[serde(rename = "$skipToken")]
    pub(crate) skip_token: Option<String>,
    state: Option<String>,
    #[serde(rename = "$filter")]
    filter: Option<String>,
    region: Option<String>,
}

impl Paging {
    /// A list's query, decoded.
    pub(crate) fn of(uri: &axum::http::Uri) -> HttpResult<Paging> {
        Query::<Paging>::try_from_uri(uri)
            .map(|Query(paging)| paging)
            .map_err(|e| {
                HttpError::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidQueryParameter",
                    format!(
                        "the query {:?}: {}",
                        uri.query().unwrap_or_default(),
                        e.body_text()
                    ),
                )
            })
    }

    /// The state a list is filtered by: `state=X`, or `$filter=state eq 'X'` (also
    /// `properties/state eq 'X'`, as Fleet Manager's clients write it).
    fn wanted_state(&self) -> Option<String> {
        self.state.clone().or_else(|| {
            let filter = self.filter.as_deref()?.trim();
            let value = filter
                .strip_prefix("properties/state eq ")
                .or_else(|| filter.strip_prefix("state eq "))?;
            Some(value.trim().trim_matches('\'').to_string())
        })
    }

    /// How many items a page holds: `$top`, 100 unless told, at most 1000.
    pub(crate) fn top(&self) -> HttpResult<usize> {
        match &self.top {
            None => Ok(100),
            Some(t) => match t.parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => Ok(n),
                _ => Err(ApiError::new(
                    ErrorCode::InvalidRequestContent,
                    format!("$top {t:?}: must be a whole number from 1 to 1000"),
                    "$top",
                )
                .into()),
            },
        }
    }
}

/// The query of a list, refused like any bad input: a 400 in the API's error shape (a repeated
/// or malformed parameter), never the framework's plain-text answer.
pub(crate) struct Paged(pub(crate) Paging);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Paged {
    type Rejection = HttpError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Paging::of(&parts.uri).map(Paged)
    }
}

async fn list(
    state: &AppState,
    fleet: &str,
    kind: Kind,
    paging: &Paging,
    path: &str,
) -> HttpResult<Response> {
    let top = paging.top()?;
    let wanted_state = paging.wanted_state();
    // Kinds shown as stored, unfiltered: the page is made of the stored texts, never parsed
    // (a page of runs carries their whole statuses).
    if kind != Kind::Member && wanted_state.is_none() {
        return list_stored(state, fleet, kind, top, paging.skip_token.as_deref(), path).await;
    }
    let mut items = Vec::new();
    let mut after = paging.skip_token.clone();
    let mut next = None;
    // Filtered lists read on until a page is full.
    loop {
        let page = state
            .runs
            .store
            .list(fleet, kind, after.as_deref(), top + 1)
            .await?;
        let more = page.len() > top;
        for r in page.into_iter().take(top) {
            after = Some(r.name.clone());
            if wanted_state
                .as_ref()
                .is_none_or(|s| r.body["properties"]["state"].as_str() == Some(s))
            {
                items.push(present(r));
                if items.len() == top {
                    break;
                }
            }
        }
        if items.len() == top {
            if more || after.is_some() {
                next = after.clone();
            }
            break;
        }
        if !more {
            break;
        }
    }
    if let Some(token) = &next {
        let probe = state.runs.store.list(fleet, kind, Some(token), 1).await?;
        if probe.is_empty() {
            next = None;
        }
    }
    let mut body = json!({"value": items});
    if let Some(token) = next {
        let mut link = format!("{path}?$top={top}&$skipToken={token}");
        if let Some(s) = &wanted_state {
            link.push_str(&format!("&state={s}"));
        }
        body["nextLink"] = json!(link);
    }
    Ok(axum::Json(body).into_response())
}

/// A page of resources shown as stored, written from their stored texts with their eTags
/// added; an item that needs more than that (an older run carrying its snapshot inline) is
/// parsed and shown as [`present`] does.
async fn list_stored(
    state: &AppState,
    fleet: &str,
    kind: Kind,
    top: usize,
    after: Option<&str>,
    path: &str,
) -> HttpResult<Response> {
    let mut page = state
        .runs
        .store
        .list_raw(fleet, kind, after, top + 1)
        .await?;
    let more = page.len() > top;
    page.truncate(top);
    let size: usize = page
        .iter()
        .map(|(_, body, etag)| body.len() + etag.len() + 12)
        .sum();
    let mut text = String::with_capacity(size + 64);
    text.push_str("{\"value\":[");
    for (i, (name, body, etag)) in page.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        if !push_with_etag(&mut text, body, etag) {
            let parsed = serde_json::from_str::<Value>(body).map_err(|e| {
                ApiError::conflict(format!(
                    "stored {} {name:?} is unreadable: {e}",
                    kind_name(kind)
                ))
            })?;
            let item = present(Resource {
                name: name.clone(),
                body: parsed,
                etag: etag.clone(),
            });
            text.push_str(&item.to_string());
        }
    }
    text.push(']');
    if more && let Some((last, _, _)) = page.last() {
        let link = format!("{path}?$top={top}&$skipToken={last}");
        text.push_str(",\"nextLink\":");
        text.push_str(&json!(link).to_string());
    }
    text.push('}');
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        text,
    )
        .into_response())
}

async fn get_one(
    state: &AppState,
    fleet: &str,
    kind: Kind,
    name: &str,
    what: &str,
) -> HttpResult<Resource> {
    state
        .runs
        .store
        .get(fleet, kind, name)
        .await?
        .ok_or_else(|| not_found(what, name))
}

pub(crate) async fn require_fleet(state: &AppState, fleet: &str) -> HttpResult<Resource> {
    get_one(state, "", Kind::Fleet, fleet, "fleet").await
}

/// Lists a fleet's resources of one kind (members, strategies, runs).
async fn list_child(
    state: Shared,
    caller: Caller,
    fleet: String,
    paging: Paging,
    kind: Kind,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    list(
        &state,
        &fleet,
        kind,
        &paging,
        &format!("/v1/fleets/{fleet}/{}", kind.as_str()),
    )
    .await
}

/// What the API calls a resource of this kind in messages.
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Member => "member",
        Kind::Strategy => "updateStrategy",
        Kind::Run | Kind::RunSnapshot => "updateRun",
        Kind::Gate => "gate",
        Kind::Profile => "autoUpgradeProfile",
        Kind::Fleet => "fleet",
        Kind::CheckProvider => "checkProvider",
        Kind::Freeze => "freeze",
        Kind::DisruptionBudget => "disruptionBudget",
    }
}

/// Gets one resource of a fleet.
async fn get_child(
    state: Shared,
    caller: Caller,
    fleet: String,
    name: String,
    kind: Kind,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    // Members get computed fields (their next maintenance openings); everything else is shown
    // as stored, so it is answered from the stored text without parsing it.
    if kind != Kind::Member {
        // A large document read before and unchanged since is answered as it was.
        if state.answers.holds(&fleet, kind, &name)
            && let Some(etag) = state.runs.store.etag(&fleet, kind, &name).await?
            && let Some(body) = state.answers.get(&fleet, kind, &name, &etag)
        {
            return Ok(json_answer(body, &etag));
        }
        let (text, etag) = state
            .runs
            .store
            .get_raw(&fleet, kind, &name)
            .await?
            .ok_or_else(|| not_found(kind_name(kind), &name))?;
        if let Some(body) = with_etag(&text, &etag) {
            drop(text);
            let body = axum::body::Bytes::from(body);
            state.answers.put(&fleet, kind, &name, &etag, &body);
            return Ok(json_answer(body, &etag));
        }
    }
    Ok(respond(
        get_one(&state, &fleet, kind, &name, kind_name(kind)).await?,
        false,
    ))
}

/// A stored resource answered as it is stored, with its eTag, without parsing it; `None` when
/// it needs more than that ([`with_etag`]).
fn stored_response(text: &str, etag: &str) -> Option<Response> {
    Some(json_answer(with_etag(text, etag)?, etag))
}

/// A JSON document already written as text (its `eTag` in it), with its eTag header.
fn json_answer(body: impl Into<Body>, etag: &str) -> Response {
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.into(),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(header::ETAG, v);
    }
    response
}

/// A stored JSON object with `eTag` added, as text; `None` when it needs more than that (not an
/// object, or an older run carrying its snapshot inline).
fn with_etag(text: &str, etag: &str) -> Option<String> {
    let mut out = String::new();
    push_with_etag(&mut out, text, etag).then_some(out)
}

/// Appends [`with_etag`]'s answer to `out`, written straight into it (a page of runs is tens
/// of megabytes: no copy per item); false, with `out` unchanged, where it has none.
fn push_with_etag(out: &mut String, text: &str, etag: &str) -> bool {
    let Some(inner) = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
    else {
        return false;
    };
    if text.contains(&format!("\"{SNAPSHOT}\"")) || text.contains("\"eTag\"") {
        return false;
    }
    let Ok(tag) = serde_json::to_string(etag) else {
        return false;
    };
    // Last, as in lists, where it is added to the parsed body.
    let separator = if inner.trim().is_empty() { "" } else { "," };
    // Sized once: a run's answer is megabytes, and growing it step by step copies it again.
    out.reserve(inner.len() + tag.len() + 10);
    for part in ["{", inner, separator, "\"eTag\":", &tag, "}"] {
        out.push_str(part);
    }
    true
}

/// Deletes one resource of a fleet (strategies, profiles: nothing else depends on them; runs a
/// profile generated stay, SEMANTICS §8).
async fn delete_child(
    state: Shared,
    caller: Caller,
    fleet: String,
    name: String,
    headers: HeaderMap,
    kind: Kind,
    role: Role,
) -> HttpResult<Response> {
    require(&caller, role)?;
    if !state
        .runs
        .store
        .delete(&fleet, kind, &name, &precondition(&headers))
        .await?
    {
        return Err(not_found(kind_name(kind), &name));
    }
    if matches!(kind, Kind::Freeze | Kind::DisruptionBudget) {
        // Members it held may start at the next scheduling pass (SEMANTICS §12).
        state.runs.rules_changed(&fleet).await;
    }
    Ok(StatusCode::OK.into_response())
}
/// The list and get handlers of one kind of fleet child.
fn lister(kind: Kind) -> axum::routing::MethodRouter<Shared> {
    get(
        move |State(s): State<Shared>, c: Caller, Path(f): Path<String>, Paged(p): Paged| {
            list_child(s, c, f, p, kind)
        },
    )
}

fn deleter(kind: Kind, role: Role) -> axum::routing::MethodRouter<Shared> {
    axum::routing::delete(
        move |State(s): State<Shared>,
              c: Caller,
              Path((f, n)): Path<(String, String)>,
              h: HeaderMap| { delete_child(s, c, f, n, h, kind, role) },
    )
}

fn getter(kind: Kind) -> axum::routing::MethodRouter<Shared> {
    get(
        move |State(s): State<Shared>, c: Caller, Path((f, n)): Path<(String, String)>| {
            get_child(s, c, f, n, kind)
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Fleets.

/// A fleet as sent: Flotilla's `properties.driver`, and what Fleet Manager's fleets carry
/// (`location`, `tags`, `identity`, `properties.hubProfile`), kept as given.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FleetBody {
    #[serde(default)]
    location: Option<String>,
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    identity: Option<serde_json::Map<String, Value>>,
}

impl FleetBody {
    /// A fleet as sent: its tracked-resource fields, and its envelope's `properties`.
    fn split(mut value: Value) -> HttpResult<(FleetBody, FleetProperties)> {
        let mut tracked = serde_json::Map::new();
        if let Some(map) = value.as_object_mut() {
            for key in ["location", "tags", "identity"] {
                if let Some(v) = map.remove(key) {
                    tracked.insert(key.into(), v);
                }
            }
        }
        let tracked: FleetBody = from_json_value(Value::Object(tracked), "")?;
        let envelope: flotilla_engine::body::Envelope<FleetProperties> =
            from_json_value(value, "")?;
        Ok((tracked, envelope.properties.unwrap_or_default()))
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FleetProperties {
    driver: Option<Value>,
    #[serde(default)]
    hub_profile: Option<serde_json::Map<String, Value>>,
    #[serde(default, rename = "provisioningState")]
    _state: Option<Value>,
    #[serde(default, rename = "status")]
    _status: Option<Value>,
}

/// A fleet's `PATCH`: its tags and identity (Fleet Manager's `FleetPatch`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetPatch {
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    identity: Option<serde_json::Map<String, Value>>,
}

/// ARM's limits on tags: at most 50, names up to 512 characters, values up to 256.
fn check_tags(tags: &BTreeMap<String, String>) -> HttpResult<()> {
    if tags.len() > 50 {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("tags: {} tags; at most 50", tags.len()),
            "tags",
        )
        .into());
    }
    for (k, v) in tags {
        if k.is_empty()
            || k.len() > 512
            || v.len() > 256
            || k.contains(['<', '>', '%', '&', '\\', '?', '/'])
        {
            return Err(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!("tags.{k}: a tag's name must be 1 to 512 characters without < > % & \\ ? /, its value at most 256 characters"),
                format!("tags.{k}"),
            )
            .into());
        }
    }
    Ok(())
}

/// Writes a resource's new body stamped with `systemData` (its creation kept from `stored`).
/// Returns the resource and whether it was created.
#[allow(clippy::too_many_arguments)]
async fn write_resource(
    state: &Shared,
    fleet: &str,
    kind: Kind,
    name: &str,
    mut body: Value,
    stored: Option<Resource>,
    caller: &Caller,
    when: &Precondition,
) -> HttpResult<(Resource, bool)> {
    body["systemData"] = system_data(caller, stored.as_ref().map(|r| &r.body));
    Ok(state.runs.store.put(fleet, kind, name, &body, when).await?)
}

async fn list_fleets(
    State(state): State<Shared>,
    caller: Caller,
    Paged(paging): Paged,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    list(&state, "", Kind::Fleet, &paging, "/v1/fleets").await
}

async fn get_fleet(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    Ok(respond(require_fleet(&state, &fleet).await?, false))
}

async fn put_fleet(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    arm: Option<axum::Extension<crate::home::Arm>>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    check_resource_name(&fleet, "fleet", 63)?;
    let (sent, props) = FleetBody::split(read_json(body).await?)?;
    if let Some(tags) = &sent.tags {
        check_tags(tags)?;
    }
    let stored = state.runs.store.get("", Kind::Fleet, &fleet).await?;
    let settings = state.arm_settings();
    // The driver sent, else the one the fleet has, else the server's default.
    let driver = props
        .driver
        .or_else(|| {
            stored
                .as_ref()
                .map(|f| f.body["properties"]["driver"].clone())
        })
        .or_else(|| settings.default_driver.clone())
        .ok_or_else(|| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                "properties.driver is required (this server has no --default-driver)",
                "properties.driver",
            ))
        })?;
    let allow = state.runs.drivers.exec_allowed();
    validate_driver_config(&driver, &allow).map_err(|e| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidRequestContent,
            e.message,
            e.field,
        ))
    })?;
    let mut properties = json!({"provisioningState": "Succeeded", "driver": driver});
    if let Some(hub) = props.hub_profile {
        properties["hubProfile"] = Value::Object(hub);
    }
    let mut body = json!({
        "id": format!("/v1/fleets/{fleet}"),
        "name": fleet,
        "type": "Microsoft.ContainerService/fleets",
        "properties": properties,
    });
    for (key, value) in [
        ("location", sent.location.map(Value::String)),
        ("tags", sent.tags.map(|t| json!(t))),
        ("identity", sent.identity.map(Value::Object)),
    ] {
        if let Some(v) = value {
            body[key] = v;
        }
    }
    // A fleet keeps the subscription and resource group it was created under.
    let home = match (&stored, arm) {
        (Some(f), _) => f.body.get(crate::home::HOME).cloned(),
        (None, Some(axum::Extension(arm))) => Some(arm.home.to_json()),
        (None, None) => None,
    };
    if let Some(home) = home {
        body[crate::home::HOME] = home;
    }
    write_fleet(&state, &fleet, stored, body, &caller, &headers).await
}

/// Stores a fleet's new body and answers it.
async fn write_fleet(
    state: &Shared,
    fleet: &str,
    stored: Option<Resource>,
    body: Value,
    caller: &Caller,
    headers: &HeaderMap,
) -> HttpResult<Response> {
    // Written over what was read, unless the client names its own condition: a fleet's
    // recorded home and driver are never lost to a write that raced this one.
    let when = match (precondition(headers), &stored) {
        (Precondition::None, Some(current)) => Precondition::IfMatch(current.etag.clone()),
        (Precondition::None, None) => Precondition::IfNoneMatchAny,
        (given, _) => given,
    };
    let (resource, created) =
        write_resource(state, "", Kind::Fleet, fleet, body, stored, caller, &when).await?;
    // A changed driver configuration is built again (and kept while it does not change) and
    // reaches the fleet's runs at once, those going included.
    state.runs.driver_changed(fleet).await;
    if created {
        // The replica a new fleet is created on drives it, unless another took it already.
        state.runs.own(fleet).await;
    }
    Ok(respond(resource, created))
}

/// `PATCH` of a fleet: its `tags` and `identity`, the rest as it is.
async fn patch_fleet(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let patch: FleetPatch = from_json_value(read_json(body).await?, "")?;
    if let Some(tags) = &patch.tags {
        check_tags(tags)?;
    }
    let stored = require_fleet(&state, &fleet).await?;
    let mut body = stored.body.clone();
    if let Some(tags) = patch.tags {
        body["tags"] = json!(tags);
    }
    if let Some(identity) = patch.identity {
        body["identity"] = Value::Object(identity);
    }
    write_fleet(&state, &fleet, Some(stored), body, &caller, &headers).await
}

async fn delete_fleet(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let runs = crate::run_head::heads(state.runs.store.as_ref(), &fleet).await?;
    if let Some((active, _)) = runs.iter().find(|(_, head)| head.is_active()) {
        return Err(ApiError::conflict(format!(
            "fleet {fleet:?} has an active update run {active:?}; stop it first"
        ))
        .into());
    }
    if !state
        .runs
        .store
        .delete("", Kind::Fleet, &fleet, &precondition(&headers))
        .await?
    {
        return Err(not_found("fleet", &fleet));
    }
    state.runs.drivers.forget(&fleet);
    state.runs.let_go(&fleet).await;
    Ok(StatusCode::OK.into_response())
}

// ---------------------------------------------------------------------------------------------
// Members.

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MemberProperties {
    cluster_resource_id: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "provisioningState")]
    _state: Option<Value>,
    #[serde(default, rename = "status")]
    _status: Option<Value>,
    /// Read-only (2026-06-02-preview): accepted back, never stored.
    #[serde(default, rename = "meshProperties")]
    _mesh: Option<Value>,
}

fn check_group_and_labels(
    group: &Option<String>,
    labels: &Option<BTreeMap<String, String>>,
) -> HttpResult<()> {
    if let Some(g) = group {
        check_name(g, 50).map_err(|m| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidName,
                format!("properties.group: {m}"),
                "properties.group",
            ))
        })?;
    }
    for (k, v) in labels.iter().flatten() {
        let target = format!("properties.labels.{k}");
        validate_label_key(k).map_err(|m| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!("{target}: {m}"),
                &target,
            ))
        })?;
        validate_label_value(v).map_err(|m| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!("{target}: {m}"),
                &target,
            ))
        })?;
    }
    Ok(())
}

fn member_body(
    fleet: &str,
    name: &str,
    id: &str,
    group: &Option<String>,
    labels: &BTreeMap<String, String>,
    status: Value,
) -> Value {
    let mut properties = json!({"provisioningState": "Succeeded", "clusterResourceId": id, "labels": labels, "status": status});
    if let Some(g) = group {
        properties["group"] = json!(g);
    }
    json!({
        "id": format!("/v1/fleets/{fleet}/members/{name}"),
        "name": name,
        "type": "Microsoft.ContainerService/fleets/members",
        "properties": properties,
    })
}

/// A member as sent (`{"properties": {...}}`), validated into what the store writes. The same
/// rules for a PUT and for every item of an import.
fn member_write(
    fleet: &str,
    name: &str,
    value: Value,
    when: Precondition,
    caller: &Caller,
) -> HttpResult<MemberWrite> {
    check_resource_name(name, "member", 50)?;
    let props: MemberProperties = envelope(value)?;
    let id = props
        .cluster_resource_id
        .clone()
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                "properties.clusterResourceId is required",
                "properties.clusterResourceId",
            ))
        })?;
    // The id is passed to drivers' commands: no control characters (a newline splits a log
    // line or a script's input), no leading '-' (it would read as an option).
    if id.len() > 1024 || id.starts_with('-') || id.chars().any(char::is_control) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!(
                "properties.clusterResourceId {:?}: must be at most 1024 characters, without control characters, and not start with '-'",
                id.chars().take(80).collect::<String>()
            ),
            "properties.clusterResourceId",
        )
        .into());
    }
    check_group_and_labels(&props.group, &props.labels)?;
    let mut body = member_body(
        fleet,
        name,
        &id,
        &props.group,
        &props.labels.unwrap_or_default(),
        json!({}),
    );
    // The store keeps the creation of a member it replaces.
    body["systemData"] = system_data(caller, None);
    Ok(MemberWrite {
        name: name.to_string(),
        body,
        when,
    })
}

async fn put_member(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, member)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    require_fleet(&state, &fleet).await?;
    let write = member_write(
        &fleet,
        &member,
        read_json(body).await?,
        precondition(&headers),
        &caller,
    )?;
    let id = member_cluster_id(&write.body).to_string();
    let registered = state
        .runs
        .store
        .register_members(&fleet, &[write], RegisterMode::Upsert)
        .await?;
    let created = registered.written.first().is_some_and(|w| w.1);
    let resource = get_one(&state, &fleet, Kind::Member, &member, "member").await?;
    spawn_observe(state.clone(), fleet, member, id);
    Ok(respond(resource, created))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportRequest {
    value: Vec<Value>,
    #[serde(default)]
    mode: Option<String>,
}

/// `POST /v1/fleets/{fleet}/discoverMembers`: the clusters the fleet's driver finds become
/// members (`crate::discovery`).
async fn discover_members(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    require_fleet(&state, &fleet).await?;
    let outcome = discover(&state, &fleet, &caller).await?;
    Ok(axum::Json(outcome).into_response())
}

/// Runs the fleet's discovery: asks its driver, writes what `discovery::plan` makes of it,
/// observes the members it wrote.
pub async fn discover(
    state: &Shared,
    fleet: &str,
    caller: &Caller,
) -> HttpResult<crate::discovery::Outcome> {
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await?;
    let found = driver.discover().await.map_err(|e| {
        ApiError::conflict(format!(
            "the fleet's driver cannot discover now: {}",
            e.message
        ))
    })?;
    let Some(found) = found else {
        return Err(ApiError::conflict(
            "the fleet's driver discovers nothing: configure its discover (an aks driver's properties.driver.discover)",
        )
        .into());
    };
    let members = state
        .runs
        .store
        .list(fleet, Kind::Member, None, usize::MAX)
        .await?;
    let plan = crate::discovery::plan(&found, &members, now());
    let writes = plan
        .upserts
        .into_iter()
        .map(|(name, body)| member_write(fleet, &name, body, Precondition::None, caller))
        .collect::<HttpResult<Vec<_>>>()?;
    if !writes.is_empty() {
        state
            .runs
            .store
            .register_members(fleet, &writes, RegisterMode::Upsert)
            .await?;
        // The new and changed members' clusters are observed, as after an import.
        let observe: Vec<(String, String)> = writes
            .iter()
            .map(|w| (w.name.clone(), member_cluster_id(&w.body).to_string()))
            .collect();
        let (state, fleet) = (state.clone(), fleet.to_string());
        tokio::spawn(async move {
            if let Err(e) = observe_members(&state, &fleet, observe).await {
                tracing::warn!(fleet, error = %e.message, "cannot observe discovered members");
            }
        });
    }
    if !plan.statuses.is_empty() {
        state
            .runs
            .store
            .set_statuses(fleet, Kind::Member, &plan.statuses)
            .await?;
    }
    Ok(plan.outcome)
}

/// The server's own discoveries: every fleet this replica drives whose driver discovers on an
/// interval, when its interval has passed since the last.
pub async fn discover_due(
    state: &Shared,
    last: &mut std::collections::HashMap<String, std::time::Instant>,
) {
    let Ok(fleets) = state.runs.store.list("", Kind::Fleet, None, 100_000).await else {
        return;
    };
    for fleet in fleets {
        if !state.runs.replica.holds(&fleet.name) {
            continue;
        }
        let Ok(driver) = state
            .runs
            .drivers
            .for_fleet(state.runs.store.as_ref(), &fleet.name)
            .await
        else {
            continue;
        };
        let Some(every) = driver.discover_every() else {
            continue;
        };
        if last.get(&fleet.name).is_some_and(|t| t.elapsed() < every) {
            continue;
        }
        last.insert(fleet.name.clone(), std::time::Instant::now());
        match discover(state, &fleet.name, &Caller::system()).await {
            Ok(o) => tracing::info!(
                fleet = fleet.name,
                added = o.added.len(),
                updated = o.updated.len(),
                vanished = o.vanished.len(),
                "discovered members"
            ),
            Err(e) => tracing::warn!(fleet = fleet.name, error = ?e, "discovery failed"),
        }
    }
}

/// `POST /v1/fleets/{fleet}/importMembers`: up to 10,000 members in one transaction, all or
/// nothing; a rejection names the item.
async fn import_members(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    require_fleet(&state, &fleet).await?;
    let request: ImportRequest =
        from_json_value(read_json_limited(body, IMPORT_BODY_LIMIT).await?, "")?;
    let mode = match request.mode.as_deref() {
        None | Some("Create") => RegisterMode::Create,
        Some("Upsert") => RegisterMode::Upsert,
        Some(other) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!("mode {other:?}: must be Create or Upsert"),
                "mode",
            )
            .into());
        }
    };
    if request.value.len() > IMPORT_MAX_MEMBERS {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!(
                "value: {} members in one import; at most {IMPORT_MAX_MEMBERS}",
                request.value.len()
            ),
            "value",
        )
        .into());
    }
    let mut writes = Vec::with_capacity(request.value.len());
    for (i, item) in request.value.into_iter().enumerate() {
        let prefix = format!("value[{i}].");
        let name = item["name"].as_str().map(String::from).ok_or_else(|| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                "name is required",
                "name",
            ))
            .under(&prefix)
        })?;
        writes.push(
            member_write(&fleet, &name, item, Precondition::None, &caller)
                .map_err(|e| e.under(&prefix))?,
        );
    }
    check_no_repeats(&writes)?;
    let registered = state
        .runs
        .store
        .register_members(&fleet, &writes, mode)
        .await
        .map_err(|e| match e {
            StoreError::Refused { item, .. } => {
                HttpError::from(e).under(&format!("value[{item}]."))
            }
            other => other.into(),
        })?;
    let created = registered.written.iter().filter(|w| w.1).count();
    let members: Vec<(String, String)> = writes
        .iter()
        .map(|w| (w.name.clone(), member_cluster_id(&w.body).to_string()))
        .collect();
    // Observed in the background, a few at a time and recorded in batches: an import is large.
    let observer = state.clone();
    tokio::spawn(async move {
        if let Err(e) = observe_members(&observer, &fleet, members).await {
            tracing::warn!(fleet, error = %e.message, "cannot observe the imported members");
        }
    });
    Ok(
        axum::Json(json!({"created": created, "updated": registered.written.len() - created}))
            .into_response(),
    )
}

/// An import names each member and each cluster once: a repeat within the request is refused
/// as one, naming both items (it is neither a member that exists nor another's cluster, and
/// which of the two items was meant cannot be told). Cluster ids compare case-insensitively.
fn check_no_repeats(writes: &[MemberWrite]) -> HttpResult<()> {
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut clusters: HashMap<String, usize> = HashMap::new();
    for (i, write) in writes.iter().enumerate() {
        if let Some(first) = names.insert(&write.name, i) {
            return Err(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!(
                    "value[{i}].name {:?} repeats value[{first}].name",
                    write.name
                ),
                format!("value[{i}].name"),
            )
            .into());
        }
        let id = member_cluster_id(&write.body);
        if let Some(first) = clusters.insert(cluster_key(id), i) {
            let field = "properties.clusterResourceId";
            return Err(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!(
                    "value[{i}].{field} {id:?} repeats value[{first}].{field} {:?} (cluster ids are compared case-insensitively)",
                    member_cluster_id(&writes[first].body)
                ),
                format!("value[{i}].{field}"),
            )
            .into());
        }
    }
    Ok(())
}

async fn patch_member(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, member)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Patch {
        #[serde(default)]
        group: Option<String>,
        #[serde(default)]
        labels: Option<BTreeMap<String, String>>,
    }
    let patch: Patch = envelope(read_json(body).await?)?;
    check_group_and_labels(&patch.group, &patch.labels)?;
    // Changed between the read and the write by someone else (the server recording what it
    // observed of the cluster, say): read and apply again, unless the client named the eTag.
    let mut tries = 0;
    loop {
        let current = get_one(&state, &fleet, Kind::Member, &member, "member").await?;
        let mut body = current.body.clone();
        if let Some(g) = &patch.group {
            body["properties"]["group"] = json!(g);
        }
        if let Some(l) = &patch.labels {
            body["properties"]["labels"] = json!(l);
        }
        body["systemData"] = system_data(&caller, Some(&current.body));
        // Always written under the eTag read (a client's own If-Match is checked first), so a
        // member deleted and registered again meanwhile is not overwritten with the old cluster.
        check_if_match(&headers, &current.etag)?;
        let when = Precondition::IfMatch(current.etag.clone());
        match state
            .runs
            .store
            .put(&fleet, Kind::Member, &member, &body, &when)
            .await
        {
            Ok((resource, _)) => return Ok(respond(resource, false)),
            // The server's own writes never fail a client's patch: tried again, a little later
            // each time (at most about 1.3 s in all), while they keep coming.
            Err(StoreError::Precondition(_))
                if tries < 50 && !headers.contains_key(header::IF_MATCH) =>
            {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(tries)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn delete_member(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, member)): Path<(String, String)>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    if !state
        .runs
        .store
        .delete(&fleet, Kind::Member, &member, &precondition(&headers))
        .await?
    {
        return Err(not_found("member", &member));
    }
    // Runs that are not over skip it where it has not started (SEMANTICS §2); which those are
    // is read from their typed heads, by the rule the engine keeps (`RunHead::is_over`).
    for (run, head) in crate::run_head::heads(state.runs.store.as_ref(), &fleet).await? {
        if !head.is_over() {
            let input = Input::MemberRemoved {
                member: member.clone(),
            };
            let _ = state.runs.act(&fleet, &run, input).await;
        }
    }
    Ok(StatusCode::OK.into_response())
}

/// Observes a member's cluster through the fleet's driver and records it in `status.cluster`.
fn spawn_observe(state: Shared, fleet: String, member: String, id: String) {
    tokio::spawn(async move {
        let _ = observe_member(&state, &fleet, &member, &id).await;
    });
}

async fn observe_member(
    state: &AppState,
    fleet: &str,
    member: &str,
    id: &str,
) -> Result<Cluster, ApiError> {
    let asked = vec![(member.to_string(), id.to_string())];
    observe_members(state, fleet, asked)
        .await?
        .pop()
        .map(|(_, result)| result)
        .unwrap_or_else(|| {
            Err(ApiError::conflict(format!(
                "member {member:?} was not observed"
            )))
        })
}

/// How many members' clusters are asked of the driver at once.
const OBSERVE_AT_ONCE: usize = 16;

/// Observes members' clusters through the fleet's driver, [`OBSERVE_AT_ONCE`] at a time, and
/// records each answer in its member's `status` (`cluster` and `lastObservedAt`, or
/// `lastObservationError` beside a cluster observed before). Answers, in the order asked; the
/// clusters observed are recorded many to a transaction, so a fleet registered in a batch is
/// observed in seconds, not one sync to disk a member.
async fn observe_members(
    state: &AppState,
    fleet: &str,
    members: Vec<(String, String)>,
) -> Result<Vec<(String, Result<Cluster, ApiError>)>, ApiError> {
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await?;
    let mut answers = Vec::with_capacity(members.len());
    for chunk in members.chunks(1000) {
        let mut asking = tokio::task::JoinSet::new();
        // By position, so every member asked gets an answer in its place, even one whose call
        // ended without one (a panic in the driver).
        let mut specs: Vec<Option<_>> = (0..chunk.len()).map(|_| None).collect();
        for (i, (name, id)) in chunk.iter().enumerate() {
            if asking.len() >= OBSERVE_AT_ONCE
                && let Some(Ok((k, spec))) = asking.join_next().await
            {
                specs[k] = Some(spec);
            }
            let (driver, member) = (
                driver.clone(),
                MemberRef {
                    name: name.clone(),
                    cluster_resource_id: id.clone(),
                },
            );
            asking.spawn(async move { (i, driver.observe(&member).await) });
        }
        while let Some(done) = asking.join_next().await {
            if let Ok((k, spec)) = done {
                specs[k] = Some(spec);
            }
        }
        let at = now();
        let mut observed = Vec::new();
        let mut failed = Vec::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let name = &chunk[i].0;
            let spec = spec.unwrap_or_else(|| {
                Err(crate::driver::DriverError::transient(
                    "the driver's call ended without an answer",
                ))
            });
            let (error, result) = match spec {
                Ok(spec) => match Cluster::parse(&spec, "cluster") {
                    Ok(cluster) => {
                        observed
                            .push((name.clone(), json!({"cluster": spec, "lastObservedAt": at})));
                        answers.push((name.clone(), Ok(cluster)));
                        continue;
                    }
                    Err(e) => (
                        json!({"code": "InvalidObservation", "message": e.message}),
                        Err(e),
                    ),
                },
                Err(e) => (
                    json!({"code": "ObservationFailed", "message": e.message}),
                    Err(ApiError::conflict(format!(
                        "member {name:?} cannot be observed: {}",
                        e.message
                    ))),
                ),
            };
            failed.push((name.clone(), error));
            answers.push((name.clone(), result));
        }
        if let Err(e) = state
            .runs
            .store
            .set_statuses(fleet, Kind::Member, &observed)
            .await
        {
            tracing::warn!(fleet, error = %e, "cannot record the members' clusters");
        }
        for (name, error) in failed {
            record_observation_error(state, fleet, &name, error, at).await;
        }
    }
    Ok(answers)
}

/// Records why a member could not be observed, keeping the cluster observed before if any.
async fn record_observation_error(
    state: &AppState,
    fleet: &str,
    member: &str,
    error: Value,
    at: flotilla_engine::time::Time,
) {
    let Ok(Some(current)) = state.runs.store.get(fleet, Kind::Member, member).await else {
        return;
    };
    let mut body = current.body;
    if body["properties"]["status"].get("cluster").is_none() {
        body["properties"]["status"] = json!({"lastObservationError": error, "lastObservedAt": at});
    } else {
        body["properties"]["status"]["lastObservationError"] = error;
    }
    let _ = state
        .runs
        .store
        .put(
            fleet,
            Kind::Member,
            member,
            &body,
            &Precondition::IfMatch(current.etag),
        )
        .await;
}

// ---------------------------------------------------------------------------------------------
// Update strategies.

async fn put_strategy(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    require_fleet(&state, &fleet).await?;
    check_resource_name(&name, "updateStrategy", 50)?;
    let props: StrategyProperties = envelope(read_json(body).await?)?;
    let raw = props.strategy.ok_or_else(|| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidStrategy,
            "properties.strategy is required",
            "properties.strategy",
        ))
    })?;
    let spec: StrategySpec = from_json_value(raw, "properties.strategy")?;
    parse_strategy(
        &spec,
        "properties.strategy",
        DEFAULT_STAGE_CONCURRENCY_LIMIT,
    )?;
    crate::check_providers::check_strategy(&state, &fleet, &spec).await?;
    let body = json!({
        "id": strategy_id(&fleet, &name),
        "name": name,
        "type": "Microsoft.ContainerService/fleets/updateStrategies",
        "properties": {"provisioningState": "Succeeded", "strategy": spec},
    });
    let stored = state.runs.store.get(&fleet, Kind::Strategy, &name).await?;
    let (resource, created) = write_resource(
        &state,
        &fleet,
        Kind::Strategy,
        &name,
        body,
        stored,
        &caller,
        &precondition(&headers),
    )
    .await?;
    Ok(respond(resource, created))
}

// ---------------------------------------------------------------------------------------------
// Update runs.

/// A strategy's id as stored (answered as an ARM id on the ARM paths).
fn strategy_id(fleet: &str, name: &str) -> String {
    format!("/v1/fleets/{fleet}/updateStrategies/{name}")
}

/// `/v1/fleets/{f}/updateStrategies/{s}` or a full Azure id ending the same way; the fleet's
/// name compares case-insensitively, as Azure's do.
fn strategy_name(id: &str, fleet: &str) -> HttpResult<String> {
    let parts: Vec<&str> = id.trim_end_matches('/').split('/').collect();
    let n = parts.len();
    let ok = n >= 4
        && parts[n - 4].eq_ignore_ascii_case("fleets")
        && parts[n - 2].eq_ignore_ascii_case("updateStrategies");
    if !ok {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("properties.updateStrategyId {id:?}: must be /v1/fleets/{{fleet}}/updateStrategies/{{name}} or an Azure resource id ending that way"),
            "properties.updateStrategyId",
        )
        .into());
    }
    if !parts[n - 3].eq_ignore_ascii_case(fleet) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("properties.updateStrategyId {id:?}: the strategy belongs to fleet {:?}, not {fleet:?}", parts[n - 3]),
            "properties.updateStrategyId",
        )
        .into());
    }
    Ok(parts[n - 1].to_string())
}

/// A run's body, as a PUT or a what-if forecast sends it: its strategy (inline, or copied from
/// the strategy it names), and its upgrade, both checked.
async fn run_body(
    state: &Shared,
    fleet: &str,
    props: RunProperties,
) -> HttpResult<(
    Option<StrategySpec>,
    Option<String>,
    ManagedClusterUpdateSpec,
)> {
    let (strategy, strategy_id) = match (&props.update_strategy_id, props.strategy) {
        // As every run the service returns: the strategy is used as given, the id records where
        // it came from (API.md, "Fleet Manager (ARM) paths").
        (Some(id), Some(s)) => (
            Some(from_json_value::<StrategySpec>(s, "properties.strategy")?),
            Some(strategy_id(fleet, &strategy_name(id, fleet)?)),
        ),
        (Some(id), None) => {
            let name = strategy_name(id, fleet)?;
            let found = state.runs.store.get(fleet, Kind::Strategy, &name).await?.ok_or_else(|| {
                HttpError::from(ApiError::new(
                    ErrorCode::InvalidRequestContent,
                    format!("properties.updateStrategyId {id:?}: update strategy {name:?} does not exist"),
                    "properties.updateStrategyId",
                ))
            })?;
            // The strategy is copied into the run at creation (SEMANTICS §6).
            (
                Some(from_json_value::<StrategySpec>(
                    found.body["properties"]["strategy"].clone(),
                    "properties.strategy",
                )?),
                Some(strategy_id(fleet, &name)),
            )
        }
        (None, Some(s)) => (
            Some(from_json_value::<StrategySpec>(s, "properties.strategy")?),
            None,
        ),
        (None, None) => (None, None),
    };
    let update_raw = props.managed_cluster_update.ok_or_else(|| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidUpgrade,
            "properties.managedClusterUpdate is required",
            "properties.managedClusterUpdate",
        ))
    })?;
    let update: ManagedClusterUpdateSpec =
        from_json_value(update_raw, "properties.managedClusterUpdate")?;
    if let Some(s) = &strategy {
        parse_strategy(s, "properties.strategy", DEFAULT_STAGE_CONCURRENCY_LIMIT)?;
        crate::check_providers::check_strategy(state, fleet, s).await?;
    }
    parse_upgrade(&update, "properties.managedClusterUpdate")?;
    Ok((strategy, strategy_id, update))
}

async fn put_run(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, run)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    require_fleet(&state, &fleet).await?;
    check_resource_name(&run, "updateRun", 50)?;
    let props: RunProperties = envelope(read_json(body).await?)?;
    let (strategy, strategy_id, update) = run_body(&state, &fleet, props).await?;
    // What a GET answered, sent back: the run as it is, whatever its state.
    if let Some((text, etag)) = state.runs.store.get_raw(&fleet, Kind::Run, &run).await?
        && same_run(&text, &strategy, &strategy_id, &update)
    {
        check_precondition(&headers, &etag)?;
        if let Some(response) = stored_response(&text, &etag) {
            return Ok(response);
        }
    }
    let made = create_run(
        &state,
        &fleet,
        &run,
        NewRun {
            strategy,
            strategy_id,
            update,
            rules: RunRules::default(),
            profile_id: None,
            system_data: system_data(&caller, None),
        },
        precondition(&headers),
    )
    .await?;
    let Some(mut response) = stored_response(&made.text, &made.etag) else {
        return Err(ApiError::conflict("the run's document cannot be answered").into());
    };
    if made.created {
        *response.status_mut() = StatusCode::CREATED;
    }
    if !made.warnings.is_empty()
        && let Ok(v) = HeaderValue::from_str(&made.warnings.join("; ").replace(['\n', '\r'], " "))
    {
        response.headers_mut().insert("x-flotilla-warning", v);
    }
    Ok(response)
}

/// Whether a stored run's document says what a PUT sends: its strategy, where it came from, and
/// its upgrade (read without building the run's status).
fn same_run(
    text: &str,
    strategy: &Option<StrategySpec>,
    strategy_id: &Option<String>,
    update: &ManagedClusterUpdateSpec,
) -> bool {
    #[derive(Deserialize)]
    struct Stored {
        properties: StoredProperties,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct StoredProperties {
        strategy: Option<Value>,
        update_strategy_id: Option<String>,
        managed_cluster_update: Option<Value>,
    }
    let Ok(stored) = serde_json::from_str::<Stored>(text) else {
        return false;
    };
    let p = stored.properties;
    p.strategy == strategy.as_ref().map(|s| json!(s))
        && p.update_strategy_id == *strategy_id
        && p.managed_cluster_update == Some(json!(update))
}

/// What a new run is made of.
pub struct NewRun {
    pub strategy: Option<StrategySpec>,
    pub strategy_id: Option<String>,
    pub update: ManagedClusterUpdateSpec,
    pub rules: RunRules,
    pub profile_id: Option<String>,
    /// Who creates it, and when.
    pub system_data: Value,
}

/// The longest delay or duration a forecast takes: a year.
const FORECAST_SECONDS_MAX: i64 = 366 * 86_400;

/// A forecast's parameters as sent (API.md, "Health checks and forecasts"); all optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ForecastBody {
    approval_delay_seconds: Option<i64>,
    default_duration_seconds: Option<i64>,
}

fn forecast_params(body: Value) -> HttpResult<ForecastParams> {
    let body: ForecastBody = from_json_value(body, "")?;
    let mut params = ForecastParams::default();
    for (field, value, min, into) in [
        (
            "approvalDelaySeconds",
            body.approval_delay_seconds,
            0,
            &mut params.approval_delay_seconds,
        ),
        (
            "defaultDurationSeconds",
            body.default_duration_seconds,
            1,
            &mut params.default_duration_seconds,
        ),
    ] {
        match value {
            None => {}
            Some(v) if (min..=FORECAST_SECONDS_MAX).contains(&v) => *into = v,
            Some(v) => {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequestContent,
                    format!("{field} {v}: must be from {min} to {FORECAST_SECONDS_MAX} seconds"),
                    field,
                )
                .into());
            }
        }
    }
    Ok(params)
}

/// A forecast of `run` in `copy`, durations as §11 says, in the API's shape; computed on a
/// blocking thread.
async fn forecast_answer(
    state: &Shared,
    fleet: &str,
    copy: FleetEngine,
    run: String,
    params: ForecastParams,
    driver: std::sync::Arc<dyn crate::driver::Driver>,
) -> HttpResult<Value> {
    let durations =
        crate::durations::Durations::load(state.runs.store.as_ref(), fleet, &copy, driver, params)
            .await?;
    let answer = tokio::task::spawn_blocking(move || {
        let duration = |r: &str, m: &str| durations.of(&copy, r, m);
        let forecast = forecast(&copy, &run, now(), &params, &duration)?;
        Ok::<_, ApiError>(forecast.to_json(&params, durations.counts()))
    })
    .await
    .map_err(|e| ApiError::conflict(format!("the forecast did not finish: {e}")))??;
    Ok(answer)
}

/// A what-if forecast (`POST /v1/fleets/{fleet}/forecast`): `{"run": <an update run body>,
/// "approvalDelaySeconds", "defaultDurationSeconds"}`. The run is made in a copy of the fleet's
/// engine, as its creation would make it now, and forecast from now; nothing is stored.
async fn forecast_what_if(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    let mut body = read_json(body).await?;
    let run = body
        .as_object_mut()
        .and_then(|b| b.remove("run"))
        .ok_or_else(|| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                "run is required: the update run body to forecast",
                "run",
            ))
        })?;
    let params = forecast_params(body)?;
    let props: RunProperties = envelope(run).map_err(|e| prefixed(e, "run"))?;
    let (strategy, _, update) = run_body(&state, &fleet, props)
        .await
        .map_err(|e| prefixed(e, "run"))?;
    let spec = RunSpec {
        strategy: strategy
            .as_ref()
            .map(|s| parse_strategy(s, "properties.strategy", DEFAULT_STAGE_CONCURRENCY_LIMIT))
            .transpose()?,
        upgrade: parse_upgrade(&update, "properties.managedClusterUpdate")?,
        rules: RunRules::default(),
    };
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), &fleet)
        .await?;
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    let mut copy = state.runs.fleet_copy(&fleet, None).await?;
    copy.create_run(WHAT_IF, &spec, catalog)
        .map_err(|e| prefixed(e.into(), "run"))?;
    let answer = forecast_answer(&state, &fleet, copy, WHAT_IF.to_string(), params, driver).await?;
    Ok(axum::Json(answer).into_response())
}

/// The name of a what-if run in a forecast's copy: not a name a run can have.
const WHAT_IF: &str = "(what-if)";

/// An error about part of a body, its field path put under `prefix`.
fn prefixed(mut e: HttpError, prefix: &str) -> HttpError {
    e.target = if e.target.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix}.{}", e.target)
    };
    if !e.message.starts_with(prefix) {
        e.message = format!("{prefix}.{}", e.message);
    }
    e
}

/// `POST …/updateRuns/{run}/forecast` (SEMANTICS §11): the fleet's engine copied and run
/// forward off the fleet's task. Durations: the median of the member's last five upgrades of
/// the run's type, else of the fleet's last fifty, else what the fleet's driver expects (the
/// `sim` driver's configured durations), else `defaultDurationSeconds`.
async fn forecast_run(
    state: &Shared,
    caller: &Caller,
    fleet: &str,
    run: &str,
    body: Body,
) -> HttpResult<Response> {
    require(caller, Role::Reader)?;
    let params = forecast_params(read_json(body).await?)?;
    let Some((text, _)) = state.runs.store.get_raw(fleet, Kind::Run, run).await? else {
        return Err(not_found("updateRun", run));
    };
    let head = crate::run_head::RunHead::parse(&text);
    drop(text);
    if head.is_over() {
        return Err(ApiError::conflict(format!(
            "update run {run:?} has ended ({}); there is nothing to forecast",
            head.state()
        ))
        .into());
    }
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await?;
    let copy = state.runs.fleet_copy(fleet, Some(run)).await?;
    if copy.run(run).is_none() {
        // It ended between the look at its head and the copy.
        return Err(ApiError::conflict(format!(
            "update run {run:?} has ended; there is nothing to forecast"
        ))
        .into());
    }
    let answer = forecast_answer(state, fleet, copy, run.to_string(), params, driver).await?;
    Ok(axum::Json(answer).into_response())
}

/// Creates (or replaces, before it starts) a run: resolves membership from each member's latest
/// observation, takes the catalog from the driver, and stores the run and its snapshot.
async fn create_run(
    state: &Shared,
    fleet: &str,
    run: &str,
    new: NewRun,
    when: Precondition,
) -> HttpResult<CreatedRun> {
    let (strategy, strategy_id, update) = (new.strategy, new.strategy_id, new.update);
    if let Some((existing, _)) = state.runs.store.get_raw(fleet, Kind::Run, run).await? {
        let head = crate::run_head::RunHead::parse(&existing);
        let current = head.state();
        if current != "NotStarted" {
            return Err(ApiError::conflict(format!(
                "update run {run:?} is {current}; a run can be changed only before it starts"
            ))
            .into());
        }
    }
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await?;
    let mut members = Vec::new();
    // Members the driver could not observe now, with why: they refuse only a run that selects
    // them (an unobservable member affects only itself).
    let mut unobserved: Vec<(String, ApiError)> = Vec::new();
    let mut never_observed = Vec::new();
    for stored in crate::runs::stored_members(&state.runs.store, fleet).await? {
        match stored.cluster.clone() {
            Some(c) => members.push(stored.with_cluster(c)),
            None => never_observed.push(stored),
        }
    }
    if !never_observed.is_empty() {
        let asked = never_observed
            .iter()
            .map(|m| (m.name.to_string(), m.cluster_resource_id.to_string()))
            .collect();
        let answers = observe_members(state, fleet, asked).await?;
        for (stored, (_, answer)) in never_observed.into_iter().zip(answers) {
            let cluster = match answer {
                Ok(c) => std::sync::Arc::new(c),
                Err(e) => {
                    unobserved.push((stored.name.to_string(), e));
                    // Stands in only to learn whether the run selects the member.
                    std::sync::Arc::new(Cluster::unknown())
                }
            };
            members.push(stored.with_cluster(cluster));
        }
        // The engine orders members by name; the snapshot keeps the order they were read in.
        members.sort_by(|a, b| a.name.cmp(&b.name));
    }
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    let mut snapshot = RunSnapshot {
        strategy: strategy.clone(),
        update: update.clone(),
        members,
        catalog,
        rules: new.rules,
    };
    let (mut engine, mut warnings) = engine_from_snapshot(run, &snapshot)?;
    if !unobserved.is_empty() {
        if let Some((_, error)) = unobserved.iter().find(|(m, _)| engine.has_member(m)) {
            return Err(error.clone().into());
        }
        // None of them is selected: the run is made from the others alone.
        snapshot
            .members
            .retain(|m| !unobserved.iter().any(|(u, _)| u.as_str() == &*m.name));
        (engine, warnings) = engine_from_snapshot(run, &snapshot)?;
    }
    let status = engine.status();
    let head = crate::run_head::head_of(&status);
    let mut properties = json!({
        "provisioningState": "Succeeded",
        "managedClusterUpdate": update,
    });
    if let Some(s) = &strategy {
        properties["strategy"] = json!(s);
    }
    if let Some(id) = strategy_id {
        properties["updateStrategyId"] = json!(id);
    }
    if let Some(id) = new.profile_id {
        properties["autoUpgradeProfileId"] = json!(id);
    }
    let base = json!({
        "id": format!("/v1/fleets/{fleet}/updateRuns/{run}"),
        "name": run,
        "type": "Microsoft.ContainerService/fleets/updateRuns",
        "systemData": new.system_data,
        "properties": properties,
    });
    // Rendered straight to text, as the run's task writes it: a large run's status is never
    // built as a JSON tree.
    let unwritable =
        |e: serde_json::Error| ApiError::conflict(format!("cannot write the run: {e}"));
    let text = crate::runs::run_document(&base, &status).map_err(unwritable)?;
    drop(status);
    let internal = crate::runs::snapshot_document(&snapshot, now()).map_err(unwritable)?;
    drop((engine, snapshot));
    state.runs.retire(fleet, run);
    // A run replaced before it started starts from a clean log.
    let mut when = when;
    if state
        .runs
        .store
        .get_raw(fleet, Kind::Run, run)
        .await?
        .is_some()
    {
        state
            .runs
            .store
            .delete(fleet, Kind::Run, run, &when)
            .await?;
        when = Precondition::None;
    }
    state
        .runs
        .store
        .put_raw(
            fleet,
            Kind::RunSnapshot,
            run,
            &internal,
            &Precondition::None,
        )
        .await?;
    drop(internal);
    let (etag, created) = state
        .runs
        .store
        .put_raw(fleet, Kind::Run, run, &text, &when)
        .await?;
    // Were this lost (a crash between the two writes), the run's document is read instead.
    state.runs.store.init_run_head(fleet, run, &head).await?;
    Ok(CreatedRun {
        text,
        etag,
        created,
        warnings,
    })
}

/// A run just created or replaced: its document as stored, and its eTag.
pub struct CreatedRun {
    pub text: String,
    pub etag: String,
    pub created: bool,
    pub warnings: Vec<String>,
}

async fn delete_run(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, run)): Path<(String, String)>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    let (text, _) = state
        .runs
        .store
        .get_raw(&fleet, Kind::Run, &run)
        .await?
        .ok_or_else(|| not_found("updateRun", &run))?;
    if crate::run_head::RunHead::parse(&text).is_active() {
        return Err(ApiError::conflict(format!(
            "update run {run:?} is running; stop it before deleting it"
        ))
        .into());
    }
    state.runs.retire(&fleet, &run);
    state
        .runs
        .store
        .delete(&fleet, Kind::Run, &run, &precondition(&headers))
        .await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkipBody {
    targets: Option<Vec<SkipTargetBody>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkipTargetBody {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: Option<String>,
}

async fn run_action(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, run, action)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    if action == "forecast" {
        return forecast_run(&state, &caller, &fleet, &run, body).await;
    }
    require(&caller, Role::Operator)?;
    // Only the eTag is needed: a large run's document is not parsed, before or after.
    let (_, etag) = state
        .runs
        .store
        .get_raw(&fleet, Kind::Run, &run)
        .await?
        .ok_or_else(|| not_found("updateRun", &run))?;
    check_if_match(&headers, &etag)?;
    let input = match action.as_str() {
        "start" => Input::Start,
        "stop" => Input::Stop,
        "skip" => {
            let skip: SkipBody = from_json_value(read_json(body).await?, "")?;
            let targets = skip.targets.ok_or_else(|| {
                HttpError::from(ApiError::new(
                    ErrorCode::InvalidSkipTarget,
                    "targets is required",
                    "targets",
                ))
            })?;
            let mut parsed = Vec::new();
            for (i, t) in targets.into_iter().enumerate() {
                let kind = match t.kind.as_deref() {
                    Some("Member") => SkipKind::Member,
                    Some("Group") => SkipKind::Group,
                    Some("Stage") => SkipKind::Stage,
                    Some("AfterStageWait") => SkipKind::AfterStageWait,
                    other => {
                        const KINDS: &str = "Member, Group, Stage or AfterStageWait";
                        return Err(ApiError::new(
                            ErrorCode::InvalidSkipTarget,
                            match other {
                                Some(t) => format!(
                                    "targets[{i}].type: {t:?} is not a skip target type: {KINDS}"
                                ),
                                None => format!("targets[{i}].type is required: {KINDS}"),
                            },
                            format!("targets[{i}].type"),
                        )
                        .into());
                    }
                };
                let name = t.name.filter(|n| !n.is_empty()).ok_or_else(|| {
                    HttpError::from(ApiError::new(
                        ErrorCode::InvalidSkipTarget,
                        format!("targets[{i}].name is required"),
                        format!("targets[{i}].name"),
                    ))
                })?;
                parsed.push(SkipTarget { kind, name });
            }
            // Passing a pending Approval gate needs the approver role; the engine decides
            // whether this skip does, atomically with the skip (API.md, "Security").
            Input::SkipBy {
                targets: parsed,
                subject: caller.subject.clone(),
                may_approve: caller.role >= Role::Approver,
            }
        }
        other => return Err(not_found("action", other)),
    };
    state.runs.act(&fleet, &run, input).await?;
    if let Some((text, etag)) = state.runs.store.get_raw(&fleet, Kind::Run, &run).await?
        && let Some(response) = stored_response(&text, &etag)
    {
        return Ok(response);
    }
    Ok(respond(
        get_one(&state, &fleet, Kind::Run, &run, "updateRun").await?,
        false,
    ))
}

/// How often an open event stream checks that its token is still valid.
const TOKEN_RECHECK: std::time::Duration = std::time::Duration::from_millis(400);

async fn run_events(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, run)): Path<(String, String)>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    get_one(&state, &fleet, Kind::Run, &run, "updateRun").await?;
    let streaming = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let after: i64 = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if !streaming {
        let events = state
            .runs
            .store
            .run_events(&fleet, &run, after, 100_000)
            .await?;
        return Ok(axum::Json(
            json!({"value": events.into_iter().map(|(_, e)| e).collect::<Vec<_>>()}),
        )
        .into_response());
    }
    // The stream reads the run's event log, from whichever replica wrote it, and reads again
    // whenever the store says the log grew: subscribe first, so nothing falls between the two.
    let store = state.runs.store.clone();
    let mut notices = store.notices();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(256);
    let token = caller.token_hash.clone();
    tokio::spawn(async move {
        let mut last = after;
        // The token is checked again while the stream is open: revoking it ends the stream.
        let mut checked = tokio::time::Instant::now();
        loop {
            if let Some(hash) = &token
                && checked.elapsed() >= TOKEN_RECHECK
            {
                match store.token_by_hash(hash).await {
                    Ok(Some(t)) if !t.revoked => {}
                    // Revoked or gone; a store that cannot answer is asked again.
                    Ok(_) => return,
                    Err(_) => {}
                }
                checked = tokio::time::Instant::now();
            }
            let page = store
                .run_events(&fleet, &run, last, 1000)
                .await
                .unwrap_or_default();
            let full = page.len() == 1000;
            for (seq, event) in page {
                last = seq;
                let sse = SseEvent::default()
                    .id(seq.to_string())
                    .data(event.to_string());
                if tx.send(Ok(sse)).await.is_err() {
                    return;
                }
            }
            if full {
                continue;
            }
            let grew = async {
                loop {
                    match notices.recv().await {
                        Ok(Notice::Events { fleet: f, run: r }) if f == fleet && r == run => {
                            return;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await
                        }
                        Ok(_) => {}
                    }
                }
            };
            tokio::select! {
                _ = grew => {}
                // A lost notice costs at most this much delay.
                _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(checked + TOKEN_RECHECK), if token.is_some() => {}
            }
        }
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}

// ---------------------------------------------------------------------------------------------
// Gates.

async fn list_gates(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    Paged(paging): Paged,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    // Every state a gate resource can have (a HealthCheck gate can fail, SEMANTICS §10).
    if let Some(s) = paging.wanted_state()
        && !matches!(s.as_str(), "Pending" | "Completed" | "Skipped" | "Failed")
    {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("state {s:?}: must be Pending, Completed, Skipped or Failed"),
            "state",
        )
        .into());
    }
    list(
        &state,
        &fleet,
        Kind::Gate,
        &paging,
        &format!("/v1/fleets/{fleet}/gates"),
    )
    .await
}

async fn patch_gate(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, gate)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Approver)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct GatePatch {
        state: Option<String>,
    }
    let patch: GatePatch = envelope(read_json(body).await?)?;
    if patch.state.as_deref() != Some("Completed") {
        const ONLY: &str = "the only change allowed is Completed (approve)";
        return Err(ApiError::new(
            ErrorCode::InvalidGate,
            match &patch.state {
                Some(s) => format!("properties.state: {s:?} cannot be set; {ONLY}"),
                None => format!("properties.state is required; {ONLY}"),
            },
            "properties.state",
        )
        .into());
    }
    let current = get_one(&state, &fleet, Kind::Gate, &gate, "gate").await?;
    check_if_match(&headers, &current.etag)?;
    let run = current.body["properties"]["target"]["updateRunProperties"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    state
        .runs
        .act(
            &fleet,
            &run,
            Input::ApproveGateById {
                id: gate.clone(),
                by: caller.subject.clone(),
            },
        )
        .await?;
    get_child(state, caller, fleet, gate, Kind::Gate).await
}

// ---------------------------------------------------------------------------------------------
// Auto-upgrade profiles.

async fn put_profile(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    require_fleet(&state, &fleet).await?;
    check_resource_name(&name, "autoUpgradeProfile", 50)?;
    let mut props: Value = envelope::<Value>(read_json(body).await?)?;
    // Read-only fields a client may send back.
    if let Some(map) = props.as_object_mut() {
        map.remove("provisioningState");
        map.remove("autoUpgradeProfileStatus");
    }
    let spec: ProfileSpec = from_json_value(props, "properties")?;
    let mut spec = spec;
    let profile = parse_profile(&spec)?;
    if let Some(id) = &profile.update_strategy_id {
        let strategy = strategy_name(id, &fleet)?;
        spec.update_strategy_id = Some(strategy_id(&fleet, &strategy));
        state.runs.store.get(&fleet, Kind::Strategy, &strategy).await?.ok_or_else(|| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                format!("properties.updateStrategyId {id:?}: update strategy {strategy:?} does not exist"),
                "properties.updateStrategyId",
            ))
        })?;
    }
    let existing = state.runs.store.get(&fleet, Kind::Profile, &name).await?;
    let mut properties = serde_json::to_value(&spec).unwrap_or_default();
    properties["provisioningState"] = json!("Succeeded");
    if let Some(status) = existing
        .as_ref()
        .map(|e| e.body["properties"]["autoUpgradeProfileStatus"].clone())
        .filter(|v| !v.is_null())
    {
        properties["autoUpgradeProfileStatus"] = status;
    }
    let body = json!({
        "id": format!("/v1/fleets/{fleet}/autoUpgradeProfiles/{name}"),
        "name": name,
        "type": "Microsoft.ContainerService/fleets/autoUpgradeProfiles",
        "properties": properties,
    });
    let (mut resource, created) = write_resource(
        &state,
        &fleet,
        Kind::Profile,
        &name,
        body,
        existing,
        &caller,
        &precondition(&headers),
    )
    .await?;
    // The answer says what the profile will start and when; nothing of it is stored.
    if let Some(next) = next_trigger(&state, &fleet, &name, &profile).await {
        resource.body["properties"]["autoUpgradeProfileStatus"]["nextTrigger"] = next;
    }
    Ok(respond(resource, created))
}

/// What an enabled profile triggers next (SEMANTICS §8): the run it will create and start, its
/// versions, and when — now (the server's next pass over profiles, within seconds) or at the
/// announced arrival that gives it a new target. `None` when it will trigger nothing that can
/// be foreseen, or the fleet's releases cannot be read now.
async fn next_trigger(state: &Shared, fleet: &str, name: &str, profile: &Profile) -> Option<Value> {
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await
        .ok()?;
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await.ok()?;
    let runs: HashSet<String> = state
        .runs
        .store
        .run_heads(fleet)
        .await
        .ok()?
        .into_iter()
        .map(|(run, _)| run)
        .collect();
    let (at, run) = next_generation(name, profile, &catalog, now(), |r| runs.contains(r))?;
    Some(json!({
        "updateRunName": run.name,
        "upgradeVersions": run.target.versions(),
        "triggersAt": at,
    }))
}

/// The run a profile generated (or had generated before) for its current target.
pub struct Generated {
    pub run: String,
    pub run_id: String,
    pub created: bool,
    pub versions: Vec<String>,
}

/// Creates, without starting it, the run for the profile's current target; generating again
/// with nothing new finds the same run (SEMANTICS §8). `Ok(Err(_))` says why the profile
/// generates nothing now.
pub async fn generate(
    state: &Shared,
    fleet: &str,
    name: &str,
    caller: &Caller,
) -> HttpResult<Result<Generated, NoRun>> {
    let (fleet, name) = (fleet.to_string(), name.to_string());
    let resource = get_one(state, &fleet, Kind::Profile, &name, "autoUpgradeProfile").await?;
    let spec: ProfileSpec = from_json_value(
        {
            let mut p = resource.body["properties"].clone();
            if let Some(map) = p.as_object_mut() {
                map.remove("provisioningState");
                map.remove("autoUpgradeProfileStatus");
            }
            p
        },
        "properties",
    )?;
    let profile = parse_profile(&spec)?;
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), &fleet)
        .await?;
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    let planned = match plan_generation(&name, &profile, &catalog, now()) {
        Ok(planned) => planned,
        Err(no_run) => return Ok(Err(no_run)),
    };
    let run = planned.name.clone();
    let run_id = format!("/v1/fleets/{fleet}/updateRuns/{run}");
    let versions = planned.target.versions();
    if state
        .runs
        .store
        .get(&fleet, Kind::Run, &run)
        .await?
        .is_some()
    {
        return Ok(Ok(Generated {
            run,
            run_id,
            created: false,
            versions,
        }));
    }
    let strategy = match &profile.update_strategy_id {
        Some(id) => {
            let strategy = strategy_name(id, &fleet)?;
            let found = state
                .runs
                .store
                .get(&fleet, Kind::Strategy, &strategy)
                .await?
                .ok_or_else(|| {
                    HttpError::from(ApiError::conflict(format!(
                        "the profile's update strategy {strategy:?} no longer exists"
                    )))
                })?;
            let spec = from_json_value::<StrategySpec>(
                found.body["properties"]["strategy"].clone(),
                "properties.strategy",
            )?;
            // A generated run is created as a hand-made one is: its checks name providers
            // that exist and serve this fleet (SEMANTICS §10).
            crate::check_providers::check_strategy(state, &fleet, &spec).await?;
            Some(spec)
        }
        None => None,
    };
    let new = NewRun {
        strategy,
        strategy_id: profile.update_strategy_id.clone(),
        update: planned.update,
        rules: planned.rules,
        profile_id: Some(format!("/v1/fleets/{fleet}/autoUpgradeProfiles/{name}")),
        system_data: system_data(caller, None),
    };
    create_run(state, &fleet, &run, new, Precondition::IfNoneMatchAny).await?;
    Ok(Ok(Generated {
        run,
        run_id,
        created: true,
        versions,
    }))
}

async fn generate_update_run(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, name)): Path<(String, String)>,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let generated = generate(&state, &fleet, &name, &caller)
        .await?
        .map_err(|no_run| no_run.error(&name))?;
    Ok(axum::Json(json!({"id": generated.run_id})).into_response())
}

/// When a fleet's catalog changes, its unfinished runs are told (`CatalogChanged`, logged like
/// any input): a member waiting for a version to be released in its region starts once it is.
async fn tell_runs_of_new_releases(state: &Shared, fleet: &str) {
    let Ok(driver) = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await
    else {
        return;
    };
    // A driver changed through another replica reaches this one's runs within a pass, and so
    // do its freezes.
    state.runs.use_driver(fleet, &driver);
    state.runs.rules_changed(fleet).await;
    let Ok(catalog) = driver.catalog().await else {
        return;
    };
    // The first look (after a start, or after taking the fleet over from another replica)
    // counts as a change: the catalog may have moved while nobody was watching.
    let changed = match state.catalogs.lock() {
        Ok(mut seen) => seen
            .insert(fleet.to_string(), catalog.clone())
            .is_none_or(|before| before != catalog),
        Err(_) => false,
    };
    if !changed {
        return;
    }
    let Ok(runs) = crate::run_head::heads(state.runs.store.as_ref(), fleet).await else {
        return;
    };
    // Every run that is not over hears it, by the fleet engine's rule: a Failed run whose
    // members are still in flight too (it was skipped here before).
    for (run, head) in runs {
        if !head.is_over() {
            let _ = state
                .runs
                .act(fleet, &run, Input::CatalogChanged(catalog.clone()))
                .await;
        }
    }
}

/// Profiles trigger by themselves: when a profile's channel selects a target it has no run for,
/// the run is created and started, and the profile's status says so (SEMANTICS §8).
pub async fn trigger_profiles(state: &Shared) {
    let Ok(fleets) = state.runs.store.list("", Kind::Fleet, None, 100_000).await else {
        return;
    };
    for fleet in fleets {
        // Only the replica driving a fleet tells its runs and triggers its profiles.
        if !state.runs.replica.holds(&fleet.name) {
            continue;
        }
        tell_runs_of_new_releases(state, &fleet.name).await;
        let Ok(profiles) = state
            .runs
            .store
            .list(&fleet.name, Kind::Profile, None, 100_000)
            .await
        else {
            continue;
        };
        for profile in profiles {
            if profile.body["properties"]["disabled"].as_bool() == Some(true) {
                continue;
            }
            let outcome = generate(state, &fleet.name, &profile.name, &Caller::system()).await;
            let outcome = match outcome {
                // Nothing selected yet (or disabled since it was listed) is not a failure.
                Ok(Err(_no_run)) => continue,
                Ok(Ok(g)) if !g.created => continue,
                Ok(Ok(g)) => {
                    let start = state.runs.act(&fleet.name, &g.run, Input::Start).await;
                    TriggerOutcome::started(g.run, g.versions, start.map_err(|e| e.message))
                }
                Err(e) => TriggerOutcome::not_created(e.code, e.message),
            };
            let Ok(Some(current)) = state
                .runs
                .store
                .get(&fleet.name, Kind::Profile, &profile.name)
                .await
            else {
                continue;
            };
            let mut body = current.body.clone();
            if already_recorded(&body["properties"]["autoUpgradeProfileStatus"], &outcome) {
                continue;
            }
            body["properties"]["autoUpgradeProfileStatus"] = trigger_status(now(), &outcome);
            let _ = state
                .runs
                .store
                .put(
                    &fleet.name,
                    Kind::Profile,
                    &profile.name,
                    &body,
                    &Precondition::IfMatch(current.etag),
                )
                .await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Releases, tokens, health, metrics, OpenAPI.

async fn releases(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    Paged(paging): Paged,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), &fleet)
        .await?;
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    let mut spec = catalog.spec();
    if let Some(region) = &paging.region {
        spec.retain(|r, _| r == region);
        if spec.is_empty() {
            return Err(not_found("region", region));
        }
    }
    Ok(axum::Json(json!({"regions": spec})).into_response())
}

async fn create_token(
    State(state): State<Shared>,
    caller: Caller,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NewToken {
        role: Option<String>,
        subject: Option<String>,
    }
    let request: NewToken = from_json_value(read_json(body).await?, "")?;
    let role_text = request.role.unwrap_or_default();
    let role = Role::parse(&role_text).ok_or_else(|| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("role {role_text:?}: must be reader, operator, approver or admin"),
            "role",
        ))
    })?;
    let subject = request
        .subject
        .unwrap_or_else(|| format!("{}-token", role.name()));
    let (secret, record) = crate::auth::new_token(role, &subject).map_err(|m| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidRequestContent,
            m,
            "subject",
        ))
    })?;
    state.runs.store.create_token(&record).await?;
    Ok((StatusCode::CREATED, axum::Json(json!({"id": record.id, "role": record.role, "subject": record.subject, "token": secret}))).into_response())
}

async fn list_tokens(State(state): State<Shared>, caller: Caller) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let tokens = state.runs.store.list_tokens().await?;
    let value: Vec<Value> = tokens
        .iter()
        .map(|t| json!({"id": t.id, "role": t.role, "subject": t.subject, "createdAt": flotilla_engine::time::Time::from_unix(t.created_at), "revoked": t.revoked}))
        .collect();
    Ok(axum::Json(json!({"value": value})).into_response())
}

async fn list_leases(State(state): State<Shared>, caller: Caller) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let leases = state.runs.store.leases().await?;
    let value: Vec<Value> = leases
        .iter()
        .map(|l| {
            json!({"fleet": l.fleet, "owner": l.owner, "epoch": l.epoch,
                "expiresInMs": l.expires_in_ms, "expired": l.expires_in_ms < 0})
        })
        .collect();
    Ok(axum::Json(json!({"replica": state.runs.replica.id, "value": value})).into_response())
}

async fn revoke_token(
    State(state): State<Shared>,
    caller: Caller,
    Path(id): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    if !state.runs.store.revoke_token(&id).await? {
        return Err(not_found("token", &id));
    }
    Ok(StatusCode::OK.into_response())
}

/// The caller's subject and role, so a client (the dashboard) shows only the actions the
/// server would allow; the server checks the role on every action regardless. Also where
/// fleets created on `/v1` live in ARM's terms, the subscription a CLI's `-g` alone means.
async fn who_am_i(State(state): State<Shared>, caller: Caller) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let arm = state.arm_settings();
    Ok(axum::Json(json!({
        "subject": caller.subject,
        "role": caller.role.name(),
        "arm": {"subscription": arm.subscription, "resourceGroup": arm.resource_group},
    }))
    .into_response())
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<Shared>) -> Response {
    match state.runs.store.list("", Kind::Fleet, None, 1).await {
        Ok(_) => "ready".into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unavailable: {e}"),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Shared>, caller: Caller) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let mut gauges = crate::metrics::ScrapeGauges::default();
    let runs = gauges.family("flotilla_update_runs", "Update runs by state");
    let failures = gauges.family(
        "flotilla_update_run_failure_count",
        "Failed members counted in each update run",
    );
    let pending = gauges.family(
        "flotilla_gates_pending",
        "Gates waiting for approval or their time",
    );
    let oldest = gauges.family(
        "flotilla_gate_longest_wait_seconds",
        "How long the oldest pending gate has been waiting",
    );
    let now = now();
    for fleet in state
        .runs
        .store
        .list("", Kind::Fleet, None, 100_000)
        .await?
    {
        let of_fleet = || vec![("fleet", fleet.name.clone())];
        for (name, run) in crate::run_head::heads(state.runs.store.as_ref(), &fleet.name).await? {
            let mut by_state = of_fleet();
            by_state.push(("state", run.state().to_string()));
            runs.get_or_create(&by_state).inc();
            let mut of_run = of_fleet();
            of_run.push(("run", name));
            failures.get_or_create(&of_run).set(run.failure_count());
            for gate in run.gates() {
                if gate.status.state.as_deref() != Some("Pending") {
                    continue;
                }
                pending.get_or_create(&of_fleet()).inc();
                if let Some(since) = gate
                    .status
                    .start_time
                    .as_deref()
                    .and_then(|t| flotilla_engine::time::Time::parse(t).ok())
                {
                    let waited = (now.unix() - since.unix()) as f64;
                    let longest = oldest.get_or_create(&of_fleet());
                    if waited > longest.get() {
                        longest.set(waited);
                    }
                }
            }
        }
    }
    let text = state.runs.metrics.render(&gauges);
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

/// Every route: method, path, summary and the role it needs. The router below serves exactly
/// these (a test checks it), and `/openapi.json` is generated from them.
pub const ROUTES: &[(&str, &str, &str, &str)] = &[
    (
        "get",
        "/v1/fleets/{fleet}/autoUpgradeProfiles",
        "List auto-upgrade profiles",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/autoUpgradeProfiles/{profile}",
        "Get an auto-upgrade profile",
        "reader",
    ),
    (
        "put",
        "/v1/fleets/{fleet}/autoUpgradeProfiles/{profile}",
        "Create or replace an auto-upgrade profile",
        "admin",
    ),
    (
        "delete",
        "/v1/fleets/{fleet}/autoUpgradeProfiles/{profile}",
        "Delete an auto-upgrade profile (its runs stay)",
        "admin",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/autoUpgradeProfiles/{profile}/generateUpdateRun",
        "Create (not start) the run for the profile's current target",
        "admin",
    ),
    (
        "get",
        "/",
        "The web dashboard (HTML; it holds no data, so no token)",
        "none",
    ),
    (
        "get",
        "/ui/{asset}",
        "The dashboard's embedded scripts, styles and icon",
        "none",
    ),
    ("get", "/healthz", "Liveness", "none"),
    ("get", "/readyz", "Readiness: the store answers", "none"),
    ("get", "/metrics", "Prometheus metrics", "reader"),
    ("get", "/openapi.json", "This description", "none"),
    ("get", "/v1/fleets", "List fleets", "reader"),
    ("get", "/v1/fleets/{fleet}", "Get a fleet", "reader"),
    (
        "put",
        "/v1/fleets/{fleet}",
        "Create or replace a fleet and its driver",
        "admin",
    ),
    (
        "patch",
        "/v1/fleets/{fleet}",
        "Change a fleet's tags or identity: {\"tags\": {...}}",
        "admin",
    ),
    (
        "delete",
        "/v1/fleets/{fleet}",
        "Delete a fleet and everything in it",
        "admin",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/members",
        "List members",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/members/{member}",
        "Get a member with its last observation",
        "reader",
    ),
    (
        "get",
        "/v1/audit",
        "The audit trail: every accepted write with its subject, time, request and status, oldest first (fleet=F, since=TIME, $top, after=ID)",
        "admin",
    ),
    (
        "get",
        "/v1/checkProviders",
        "List check providers: what health and readiness checks may reach (literal header values are never shown)",
        "reader",
    ),
    (
        "get",
        "/v1/checkProviders/{provider}",
        "Get a check provider (literal header values shown as <redacted>)",
        "reader",
    ),
    (
        "put",
        "/v1/checkProviders/{provider}",
        "Create or replace a check provider: {\"properties\": {\"type\": \"Prometheus\" (endpoint) | \"Http\" (baseUrl) | \"Exec\" (command, allowOptions), \"headers\", \"caFile\", \"fleets\"}}",
        "admin",
    ),
    (
        "delete",
        "/v1/checkProviders/{provider}",
        "Delete a check provider (409 while a strategy or a run that is not over names it)",
        "admin",
    ),
    (
        "get",
        "/v1/webhooks",
        "List webhooks (their secrets are never shown)",
        "admin",
    ),
    (
        "get",
        "/v1/webhooks/{webhook}",
        "Get a webhook (hasSecret, never the secret)",
        "admin",
    ),
    (
        "put",
        "/v1/webhooks/{webhook}",
        "Create or replace a webhook: {\"properties\": {\"url\", \"secret\", \"fleets\": [\"*\"], \"events\": [\"*\"], \"format\": \"CloudEvents\" | \"Slack\" | \"Teams\"}}",
        "admin",
    ),
    (
        "delete",
        "/v1/webhooks/{webhook}",
        "Delete a webhook and its deliveries, sent or not",
        "admin",
    ),
    (
        "get",
        "/v1/webhooks/{webhook}/deliveries",
        "A webhook's deliveries, oldest first: time, event id and type, state, attempts, status code, last error (state=, $top, after=ID)",
        "admin",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/discoverMembers",
        "Register the clusters the fleet's driver finds (aks: properties.driver.discover); answers {\"added\", \"updated\", \"vanished\"}, member names",
        "operator",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/importMembers",
        "Register up to 10,000 members in one transaction: {\"value\": [{\"name\", \"properties\"}], \"mode\": \"Create\" | \"Upsert\"}",
        "operator",
    ),
    (
        "put",
        "/v1/fleets/{fleet}/members/{member}",
        "Create or replace a member",
        "operator",
    ),
    (
        "patch",
        "/v1/fleets/{fleet}/members/{member}",
        "Change a member's group or labels",
        "operator",
    ),
    (
        "delete",
        "/v1/fleets/{fleet}/members/{member}",
        "Remove a member",
        "operator",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/freezes",
        "List the fleet's freezes, each with its status now (active, nextStart, nextEnd)",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/freezes/{freeze}",
        "Get a freeze with its status now (active, nextStart, nextEnd, members covered)",
        "reader",
    ),
    (
        "put",
        "/v1/fleets/{fleet}/freezes/{freeze}",
        "Create or replace a freeze (SEMANTICS §12): {\"properties\": {\"start\", \"end\"} or {\"recurrence\"}, \"selector\", \"scope\": \"AllUpgrades\" | \"MinorUpgrades\" | \"MinorAndNodeUpgrades\", \"reason\"}}; it holds members from the next scheduling pass",
        "operator",
    ),
    (
        "delete",
        "/v1/fleets/{fleet}/freezes/{freeze}",
        "Delete a freeze: members it held may start at the next scheduling pass",
        "operator",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/disruptionBudgets",
        "List the fleet's disruption budgets",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/disruptionBudgets/{budget}",
        "Get a disruption budget with its partitions now (value, members covered, maxUnavailable resolved, members in flight)",
        "reader",
    ),
    (
        "put",
        "/v1/fleets/{fleet}/disruptionBudgets/{budget}",
        "Create or replace a disruption budget (SEMANTICS §12): {\"properties\": {\"maxUnavailable\": \"N\" | \"P%\", \"selector\", \"perValueOf\": \"region\" | \"group\" | \"label:KEY\"}}; it holds members of every run from the next scheduling pass",
        "operator",
    ),
    (
        "delete",
        "/v1/fleets/{fleet}/disruptionBudgets/{budget}",
        "Delete a disruption budget: members it held may start at the next scheduling pass",
        "operator",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/updateStrategies",
        "List update strategies",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/updateStrategies/{strategy}",
        "Get an update strategy",
        "reader",
    ),
    (
        "put",
        "/v1/fleets/{fleet}/updateStrategies/{strategy}",
        "Create or replace an update strategy",
        "operator",
    ),
    (
        "delete",
        "/v1/fleets/{fleet}/updateStrategies/{strategy}",
        "Delete an update strategy",
        "operator",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/updateRuns",
        "List update runs",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/updateRuns/{run}",
        "Get an update run and its status",
        "reader",
    ),
    (
        "put",
        "/v1/fleets/{fleet}/updateRuns/{run}",
        "Create an update run (or change it before it starts)",
        "operator",
    ),
    (
        "delete",
        "/v1/fleets/{fleet}/updateRuns/{run}",
        "Delete an update run that is not running",
        "operator",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/updateRuns/{run}/start",
        "Start, resume or retry",
        "operator",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/updateRuns/{run}/stop",
        "Stop",
        "operator",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/updateRuns/{run}/skip",
        "Skip members, groups, stages or waits",
        "operator",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/updateRuns/{run}/forecast",
        "Forecast the run from now (SEMANTICS §11): {\"approvalDelaySeconds\": 0, \"defaultDurationSeconds\": 1800}",
        "reader",
    ),
    (
        "post",
        "/v1/fleets/{fleet}/forecast",
        "Forecast a run that is not created (what-if): {\"run\": <an update run body>, \"approvalDelaySeconds\", \"defaultDurationSeconds\"}",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/updateRuns/{run}/events",
        "The run's event log; text/event-stream for a live stream",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/gates",
        "List gates (?state=Pending)",
        "reader",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/gates/{gate}",
        "Get a gate",
        "reader",
    ),
    (
        "patch",
        "/v1/fleets/{fleet}/gates/{gate}",
        "Approve a gate: {\"properties\": {\"state\": \"Completed\"}}",
        "approver",
    ),
    (
        "get",
        "/v1/fleets/{fleet}/releases",
        "The release catalog the fleet's driver reports (?region=)",
        "reader",
    ),
    (
        "get",
        "/v1/me",
        "Who the token belongs to: its subject and role",
        "reader",
    ),
    ("get", "/v1/tokens", "List API tokens", "admin"),
    (
        "post",
        "/v1/tokens",
        "Create an API token (shown once)",
        "admin",
    ),
    ("delete", "/v1/tokens/{id}", "Revoke an API token", "admin"),
    (
        "get",
        "/v1/leases",
        "Which replica drives each fleet, at which epoch, and which replica answered",
        "reader",
    ),
];

pub fn openapi() -> Value {
    crate::openapi::document(ROUTES)
}

async fn openapi_json() -> Response {
    axum::Json(openapi()).into_response()
}

async fn auth_layer(State(state): State<Shared>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let open = matches!(path, "/healthz" | "/readyz" | "/openapi.json")
        || crate::dashboard::is_dashboard_path(path)
        // An ARM request was authenticated before its path was rewritten.
        || request.extensions().get::<Caller>().is_some();
    if !open {
        match authenticate(&state, request.headers()).await {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
            }
            Err(e) => return e.into_response(),
        }
    }
    let method = request.method().clone();
    let mut response = next.run(request).await;
    if method == Method::GET || method == Method::HEAD {
        response
            .headers_mut()
            .entry(header::CACHE_CONTROL)
            .or_insert(HeaderValue::from_static("no-store"));
    }
    response
}

/// Every route of the route table (Fleet Manager's ARM paths are served around it, `arm`).
pub fn router(state: Shared) -> Router {
    let fleet = "/v1/fleets/{fleet}";
    Router::new()
        .route("/", get(crate::dashboard::index))
        .route("/ui/{asset}", get(crate::dashboard::asset))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .route("/v1/fleets", get(list_fleets))
        .route(
            fleet,
            get(get_fleet)
                .put(put_fleet)
                .patch(patch_fleet)
                .delete(delete_fleet),
        )
        .route(&format!("{fleet}/members"), lister(Kind::Member))
        .route(&format!("{fleet}/discoverMembers"), post(discover_members))
        .route(
            &format!("{fleet}/importMembers"),
            post(import_members).layer(axum::extract::DefaultBodyLimit::max(IMPORT_BODY_LIMIT)),
        )
        .route(
            &format!("{fleet}/members/{{member}}"),
            getter(Kind::Member)
                .put(put_member)
                .patch(patch_member)
                .delete(delete_member),
        )
        .route(&format!("{fleet}/updateStrategies"), lister(Kind::Strategy))
        .route(
            &format!("{fleet}/updateStrategies/{{strategy}}"),
            getter(Kind::Strategy)
                .put(put_strategy)
                .merge(deleter(Kind::Strategy, Role::Operator)),
        )
        .route(&format!("{fleet}/freezes"), get(crate::freezes::list))
        .route(
            &format!("{fleet}/freezes/{{freeze}}"),
            get(crate::freezes::get)
                .put(crate::freezes::put)
                .merge(deleter(Kind::Freeze, Role::Operator)),
        )
        .route(
            &format!("{fleet}/disruptionBudgets"),
            get(crate::budgets::list),
        )
        .route(
            &format!("{fleet}/disruptionBudgets/{{budget}}"),
            get(crate::budgets::get)
                .put(crate::budgets::put)
                .merge(deleter(Kind::DisruptionBudget, Role::Operator)),
        )
        .route(&format!("{fleet}/updateRuns"), lister(Kind::Run))
        .route(
            &format!("{fleet}/updateRuns/{{run}}"),
            getter(Kind::Run).put(put_run).delete(delete_run),
        )
        .route(
            &format!("{fleet}/updateRuns/{{run}}/events"),
            get(run_events),
        )
        .route(
            &format!("{fleet}/updateRuns/{{run}}/{{action}}"),
            post(run_action),
        )
        .route(&format!("{fleet}/gates"), get(list_gates))
        .route(
            &format!("{fleet}/gates/{{gate}}"),
            getter(Kind::Gate).patch(patch_gate),
        )
        .route(&format!("{fleet}/releases"), get(releases))
        .route(&format!("{fleet}/forecast"), post(forecast_what_if))
        .route(
            &format!("{fleet}/autoUpgradeProfiles"),
            lister(Kind::Profile),
        )
        .route(
            &format!("{fleet}/autoUpgradeProfiles/{{profile}}"),
            getter(Kind::Profile)
                .put(put_profile)
                .merge(deleter(Kind::Profile, Role::Admin)),
        )
        .route(
            &format!("{fleet}/autoUpgradeProfiles/{{profile}}/generateUpdateRun"),
            post(generate_update_run),
        )
        .route("/v1/me", get(who_am_i))
        .route("/v1/tokens", get(list_tokens).post(create_token))
        .route("/v1/tokens/{id}", axum::routing::delete(revoke_token))
        .route("/v1/leases", get(list_leases))
        .route("/v1/audit", get(crate::audit::list))
        .route("/v1/checkProviders", get(crate::check_providers::list))
        .route(
            "/v1/checkProviders/{provider}",
            get(crate::check_providers::get)
                .put(crate::check_providers::put)
                .delete(crate::check_providers::delete),
        )
        .route("/v1/webhooks", get(crate::webhooks::list))
        .route(
            "/v1/webhooks/{webhook}",
            get(crate::webhooks::get)
                .put(crate::webhooks::put)
                .delete(crate::webhooks::delete),
        )
        .route(
            "/v1/webhooks/{webhook}/deliveries",
            get(crate::webhooks::deliveries),
        )
        .fallback(|| async {
            HttpError::from(ApiError::new(ErrorCode::NotFound, "no such path", ""))
        })
        // Every accepted write, recorded with its caller (inside the body limit: the body it
        // keeps has been read whole already).
        .layer(middleware::from_fn_with_state(
            crate::audit::Recorder {
                state: state.clone(),
                routes: ROUTES,
            },
            crate::audit::layer,
        ))
        // A body is read only once the caller is known: an unauthenticated client holds
        // nothing while it sends slowly.
        .layer(middleware::from_fn_with_state(
            std::time::Duration::from_millis(
                state
                    .body_timeout_ms
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
            crate::http::limit_body,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), auth_layer))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::with_etag;
    use serde_json::{Value, json};

    #[test]
    fn stored_text_gets_its_etag_without_being_parsed_into_a_tree() {
        let answer = |text: &str| {
            with_etag(text, "\"7\"").map(|t| serde_json::from_str::<Value>(&t).expect("JSON"))
        };
        assert_eq!(
            answer(r#"{"name":"r","properties":{"a":[1,2]}}"#),
            Some(json!({"eTag": "\"7\"", "name": "r", "properties": {"a": [1, 2]}}))
        );
        assert_eq!(answer("{}"), Some(json!({"eTag": "\"7\""})));
        assert_eq!(answer(" { } "), Some(json!({"eTag": "\"7\""})));
        // What needs more than an added field goes the parsed way.
        assert_eq!(answer(r#"{"x-flotilla":{},"name":"r"}"#), None);
        assert_eq!(answer(r#"{"eTag":"old","name":"r"}"#), None);
        assert_eq!(answer("[1]"), None);
    }
}
