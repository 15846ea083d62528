//! Check providers (SEMANTICS §10): what health and readiness checks may reach, declared by an
//! admin at `/v1/checkProviders/{name}` (a Prometheus endpoint, an HTTP base URL, a program
//! with fixed arguments, with their headers and CA). Strategies and runs name a provider and
//! carry only data; a write that names one checks it here, and evaluations read providers
//! through a short cache (`crate::evaluate::Providers`).

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use flotilla_engine::checks::{
    ProviderSpec, ProviderTarget, check_providers, parse_provider, strategy_checks,
};
use flotilla_engine::error::{ApiError, ErrorCode, from_json_value};
use flotilla_engine::strategy::{StrategySpec, check_name};

use crate::auth::{Caller, Role, require};
use crate::error::{HttpError, HttpResult};
use crate::request::{ListQuery, page, precondition, read_json, system_data};
use crate::state::{AppState, Shared};
use crate::store::{Kind, Precondition, Resource};

use crate::evaluate::{SERVER, from_body, read};

/// What a GET shows instead of a header's literal value (it may be a credential).
const REDACTED: &str = "<redacted>";
/// Providers on one server at most, and a page of them.
const MOST: usize = 1000;

/// Checks the checks of a strategy written for `fleet` against the providers they name
/// (SEMANTICS §10): each exists, is of its check's type, serves the fleet; none carries an
/// endpoint, URL, header, file or program of its own. 400 naming the check's field otherwise.
pub async fn check_strategy(state: &AppState, fleet: &str, spec: &StrategySpec) -> HttpResult<()> {
    let names: BTreeSet<String> = strategy_checks(spec, "properties.strategy")
        .into_iter()
        .filter_map(|(_, c)| c.provider.clone())
        .collect();
    let mut found = BTreeMap::new();
    for name in names {
        if let Some(p) = read(state.runs.store.as_ref(), &name).await? {
            found.insert(name, p);
        }
    }
    check_providers(spec, "properties.strategy", fleet, &|n| {
        found.get(n).cloned()
    })?;
    Ok(())
}

/// Whether a strategy names `provider`.
fn names(spec: &StrategySpec, provider: &str) -> bool {
    strategy_checks(spec, "")
        .iter()
        .any(|(_, c)| c.provider.as_deref() == Some(provider))
}

/// What names `provider` (a strategy, or a run that is not over), for a refused delete.
async fn named_by(state: &AppState, provider: &str) -> HttpResult<Option<String>> {
    let store = state.runs.store.as_ref();
    let mut after: Option<String> = None;
    loop {
        let fleets = store
            .list(SERVER, Kind::Fleet, after.as_deref(), 100)
            .await?;
        for fleet in &fleets {
            let f = &fleet.name;
            let mut after_strategy: Option<String> = None;
            loop {
                let page = store
                    .list(f, Kind::Strategy, after_strategy.as_deref(), 100)
                    .await?;
                for s in &page {
                    if let Ok(spec) = serde_json::from_value::<StrategySpec>(
                        s.body["properties"]["strategy"].clone(),
                    ) && names(&spec, provider)
                    {
                        return Ok(Some(format!("update strategy {:?} of fleet {f:?}", s.name)));
                    }
                }
                match page.last() {
                    Some(last) if page.len() == 100 => after_strategy = Some(last.name.clone()),
                    _ => break,
                }
            }
            for (run, head) in crate::run_head::heads(store, f).await? {
                // Completed and Skipped runs are over; Failed and Stopped ones may go on.
                if matches!(head.state(), "Completed" | "Skipped") {
                    continue;
                }
                #[derive(Deserialize)]
                struct RunStrategy {
                    #[serde(default)]
                    properties: RunProperties,
                }
                #[derive(Deserialize, Default)]
                struct RunProperties {
                    #[serde(default)]
                    strategy: Option<StrategySpec>,
                }
                if let Some((text, _)) = store.get_raw(f, Kind::Run, &run).await?
                    && let Ok(doc) = serde_json::from_str::<RunStrategy>(&text)
                    && doc
                        .properties
                        .strategy
                        .is_some_and(|spec| names(&spec, provider))
                {
                    return Ok(Some(format!("update run {run:?} of fleet {f:?}")));
                }
            }
        }
        match fleets.last() {
            Some(last) if fleets.len() == 100 => after = Some(last.name.clone()),
            _ => return Ok(None),
        }
    }
}

fn invalid(field: &str, message: String) -> HttpError {
    let path = format!("properties.{field}");
    HttpError::from(ApiError::new(
        ErrorCode::InvalidCheckProvider,
        format!("{path}: {message}"),
        path,
    ))
}

/// The resource as the API shows it: literal header values hidden (they may be credentials);
/// `{env:NAME}` references shown as written.
fn shown(resource: Resource) -> Value {
    let mut body = resource.body;
    if let Some(headers) = body
        .get_mut("properties")
        .and_then(|p| p.get_mut("headers"))
        .and_then(Value::as_object_mut)
    {
        for value in headers.values_mut() {
            if value
                .as_str()
                .is_none_or(|v| flotilla_engine::checks::env_reference(v).is_none())
            {
                *value = json!(REDACTED);
            }
        }
    }
    if let Some(map) = body.as_object_mut() {
        map.insert("eTag".into(), json!(resource.etag));
    }
    body
}

fn answer(status: StatusCode, resource: Resource) -> Response {
    let etag = HeaderValue::from_str(&resource.etag).ok();
    let mut response = (status, axum::Json(shown(resource))).into_response();
    if let Some(v) = etag {
        response.headers_mut().insert(header::ETAG, v);
    }
    response
}

fn not_found(name: &str) -> HttpError {
    HttpError::from(ApiError::new(
        ErrorCode::NotFound,
        format!("check provider {name:?} does not exist"),
        "checkProvider",
    ))
}

fn check_provider_name(name: &str) -> HttpResult<()> {
    check_name(name, 63).map_err(|m| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidName,
            format!("checkProvider name: {m}"),
            "name",
        ))
    })
}

/// `PUT /v1/checkProviders/{name}` (admin): creates or replaces a provider. A header sent back
/// as `<redacted>` (what a GET shows) keeps its stored value.
pub async fn put(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    check_provider_name(&name)?;
    let envelope: flotilla_engine::body::Envelope<ProviderSpec> =
        from_json_value(read_json(body).await?, "")?;
    let mut spec = envelope.properties.ok_or_else(|| {
        invalid(
            "type",
            "is required: {\"properties\": {\"type\": \"Prometheus\" | \"Http\" | \"Exec\", ...}}"
                .into(),
        )
    })?;
    let store = state.runs.store.as_ref();
    let stored = store.get(SERVER, Kind::CheckProvider, &name).await?;
    if let Some(sent) = spec.headers.as_mut() {
        let kept = stored
            .as_ref()
            .and_then(|r| r.body["properties"]["headers"].as_object().cloned())
            .unwrap_or_default();
        for (key, value) in sent.iter_mut() {
            if value == REDACTED {
                *value = kept
                    .get(key)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        invalid(
                            &format!("headers.{key}"),
                            format!("{REDACTED:?} keeps a stored value, and there is none"),
                        )
                    })?;
            }
        }
    }
    let provider = parse_provider(&name, &spec)?;
    // What needs the machine: the CA file readable now, the program allowed.
    if let Some(ca) = &provider.ca_file {
        crate::evaluate::read_ca_file(ca).map_err(|e| invalid("caFile", e))?;
    }
    if let ProviderTarget::Exec { command, .. } = &provider.target {
        state
            .runs
            .drivers
            .exec_allowed()
            .resolve(&command[0], "properties.command[0]")
            .map_err(|e| invalid("command[0]", e.message))?;
    }
    // A strategy or run naming it expects its type.
    if let Some(before) = stored.as_ref().and_then(|r| from_body(&name, &r.body))
        && before.provider_type() != provider.provider_type()
        && let Some(user) = named_by(&state, &name).await?
    {
        return Err(HttpError::from(ApiError::conflict(format!(
            "check provider {name:?} is a {} provider named by {user}; its type cannot change while it is named",
            before.provider_type().as_str()
        ))));
    }
    let mut body = json!({
        "id": format!("/v1/checkProviders/{name}"),
        "name": name,
        "properties": spec,
    });
    body["systemData"] = system_data(&caller, stored.as_ref().map(|r| &r.body));
    let (resource, created) = store
        .put(
            SERVER,
            Kind::CheckProvider,
            &name,
            &body,
            &precondition(&headers),
        )
        .await?;
    state.runs.providers.forget(&name);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(answer(status, resource))
}

/// `GET /v1/checkProviders/{name}` (reader: operators name providers in their strategies).
pub async fn get(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let resource = state
        .runs
        .store
        .get(SERVER, Kind::CheckProvider, &name)
        .await?
        .ok_or_else(|| not_found(&name))?;
    Ok(answer(StatusCode::OK, resource))
}

/// `GET /v1/checkProviders` (reader), in name order.
pub async fn list(
    State(state): State<Shared>,
    caller: Caller,
    query: ListQuery,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let store = state.runs.store.as_ref();
    let body = page(
        store,
        SERVER,
        Kind::CheckProvider,
        &query,
        MOST,
        "/v1/checkProviders",
        shown,
    )
    .await?;
    Ok(axum::Json(body).into_response())
}

/// `DELETE /v1/checkProviders/{name}` (admin): refused (409) while a strategy or a run that
/// is not over names it.
pub async fn delete(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    if let Some(user) = named_by(&state, &name).await? {
        return Err(HttpError::from(ApiError::conflict(format!(
            "check provider {name:?} is named by {user}; change or delete that first"
        ))));
    }
    let when: Precondition = precondition(&headers);
    let existed = state
        .runs
        .store
        .delete(SERVER, Kind::CheckProvider, &name, &when)
        .await?;
    state.runs.providers.forget(&name);
    if !existed {
        return Err(not_found(&name));
    }
    Ok(StatusCode::OK.into_response())
}
