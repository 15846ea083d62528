//! The HTTP API of `docs/spec/API.md`: resources with eTags and paging, run actions, gates,
//! the event log and its live stream, releases, tokens, health and metrics.
//!
//! This module holds what every resource's handlers share (reading, listing and deleting a
//! stored resource, answers with eTags), the router and the authentication layer; each
//! resource's handlers are in a submodule (`api/`), the route table in `routes`. What is not
//! HTTP lives beside the fleets' tasks: observing clusters (module `observation`), the
//! release feed and discovery passes (module `feed`). Freezes, budgets and check providers have
//! modules of their own (`crate::freezes`, `crate::budgets`, `crate::check_providers`).

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
use flotilla_engine::selector::{validate_label_key, validate_label_value};
use flotilla_engine::strategy::{
    DEFAULT_STAGE_CONCURRENCY_LIMIT, ManagedClusterUpdateSpec, StrategySpec, check_name,
    parse_strategy, parse_upgrade,
};

use crate::auth::{Caller, Role, authenticate, require};
use crate::clock::now;
use crate::driver::validate_driver_config;
use crate::error::{HttpError, HttpResult};
use crate::request::{precondition, read_json, read_json_limited, system_data};
use crate::runs::{CreatedRun, SNAPSHOT};
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
    NoRun, Profile, ProfileSpec, next_generation, parse_profile, plan_generation,
};
use flotilla_engine::train::Promotion;

mod discover;
mod fleets;
mod forecasts;
mod gates;
mod import;
mod members;
mod profiles;
mod routes;
mod run_actions;
mod service;
mod strategies;
mod update_runs;

use crate::observation::{observe_members, spawn_register};
pub use discover::*;
use fleets::*;
use forecasts::*;
use gates::*;
use import::*;
use members::*;
pub use profiles::*;
pub use routes::*;
use run_actions::*;
use service::*;
use strategies::*;
pub use update_runs::*;

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
        Kind::IdentityProvider => "identityProvider",
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
    let when = precondition(&headers);
    if kind == Kind::Profile {
        // A profile others follow stays (SEMANTICS §14).
        crate::trains::refuse_if_followed(&state, &fleet, Some(&name), "deleted").await?;
    }
    let rule = matches!(kind, Kind::Freeze | Kind::DisruptionBudget);
    let existed = if rule {
        // Deleted and reported in one transaction (a fleet's rule, SEMANTICS §12).
        let report = crate::rule_http::report(&fleet, kind, &name);
        let store = state.runs.store.as_ref();
        let (_, existed) = store
            .write_reported(&fleet, kind, &name, None, &when, &report)
            .await?;
        existed
    } else {
        state.runs.store.delete(&fleet, kind, &name, &when).await?
    };
    if !existed {
        return Err(not_found(kind_name(kind), &name));
    }
    if rule {
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
        || path.starts_with("/auth/")
        // An ARM request was authenticated before its path was rewritten.
        || request.extensions().get::<Caller>().is_some();
    if !open {
        match authenticate(&state, request.method(), request.headers()).await {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
            }
            Err(e) => return e.into_response(),
        }
    }
    // The caller's role where this request acts (an ARM request's too, now that its path is
    // the /v1 one).
    if let Some(caller) = request.extensions_mut().remove::<Caller>() {
        match caller.scoped(request.method(), request.uri().path()) {
            Ok(scoped) => {
                request.extensions_mut().insert(scoped);
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
            get(get_gate).patch(patch_gate),
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
        .route("/auth/providers", get(crate::sign_in::providers))
        .route("/auth/session", get(crate::sign_in::session))
        .route("/auth/login", get(crate::sign_in::login))
        .route("/auth/callback", get(crate::sign_in::callback))
        .route("/auth/logout", post(crate::sign_in::logout))
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
        .route(
            "/v1/identityProviders",
            get(crate::identity_providers::list),
        )
        .route(
            "/v1/identityProviders/{provider}",
            get(crate::identity_providers::get)
                .put(crate::identity_providers::put)
                .delete(crate::identity_providers::delete),
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
