//! `/v1/identityProviders`: identity providers made through the API (admin on every fleet),
//! stored under the server's fleet `""`, beside those of the configuration file, which the API
//! shows but never changes (a write to one is 409).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use flotilla_engine::error::{ApiError, ErrorCode};

use crate::auth::{Caller, Role, require};
use crate::error::{HttpError, HttpResult};
use crate::oidc::config::{ProviderConfig, Source};
use crate::request::{precondition, read_json, system_data};
use crate::state::Shared;
use crate::store::{Kind, Precondition, Store, StoreError};

/// The server-wide resources' fleet.
const SERVER: &str = "";
/// Providers made through the API, at most.
const MOST: usize = 100;

/// The providers stored through the API, parsed (one that no longer parses is left out and
/// logged: the configuration it had was checked when written).
pub async fn stored(store: &dyn Store) -> Result<Vec<ProviderConfig>, StoreError> {
    let page = store
        .list(SERVER, Kind::IdentityProvider, None, MOST)
        .await?;
    let mut found = Vec::new();
    for resource in page {
        let name = resource.name.clone();
        match ProviderConfig::parse(
            &name,
            Source::Api,
            &resource.body["properties"],
            "properties.",
        ) {
            Ok(config) => found.push(config),
            Err(e) => {
                tracing::warn!(provider = %name, error = %e, "a stored identity provider does not parse; it is not used")
            }
        }
    }
    Ok(found)
}

/// Reads the stored providers again into the verifier (after a write here, and every few
/// seconds for the writes of other replicas; a store that cannot answer keeps those held).
pub async fn reload(state: &crate::state::AppState) -> Result<(), StoreError> {
    let configs = stored(state.runs.store.as_ref()).await?;
    state.oidc.set_from_api(configs);
    Ok(())
}

fn invalid(field: &str, message: String) -> HttpError {
    HttpError::from(ApiError::new(
        ErrorCode::InvalidRequestContent,
        format!("{field}: {message}"),
        field,
    ))
}

fn not_found(name: &str) -> HttpError {
    HttpError::from(ApiError::new(
        ErrorCode::NotFound,
        format!("identity provider {name:?} does not exist"),
        "identityProvider",
    ))
}

fn from_file(state: &Shared, name: &str) -> HttpResult<()> {
    match state.oidc.find(name) {
        Some(p) if p.config.source == Source::File => {
            Err(HttpError::from(ApiError::conflict(format!(
                "identity provider {name:?} is defined in the server's configuration file; change it there"
            ))))
        }
        _ => Ok(()),
    }
}

fn shown(config: &ProviderConfig, stored: Option<&Value>) -> Value {
    let mut body = json!({
        "id": format!("/v1/identityProviders/{}", config.name),
        "name": config.name,
        "properties": config.to_properties(),
    });
    if let Some(stored) = stored {
        for key in ["eTag", "systemData"] {
            if let Some(v) = stored.get(key) {
                body[key] = v.clone();
            }
        }
    }
    body
}

/// `PUT /v1/identityProviders/{name}` (admin on every fleet).
pub async fn put(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    from_file(&state, &name)?;
    let sent = read_json(body).await?;
    let map = sent
        .as_object()
        .ok_or_else(|| invalid("body", "must be an object with properties".into()))?;
    if let Some(key) = map
        .keys()
        .find(|k| !["name", "id", "properties", "eTag", "systemData"].contains(&k.as_str()))
    {
        return Err(invalid(key, "unknown field".into()));
    }
    let mut properties = sent
        .get("properties")
        .cloned()
        .ok_or_else(|| invalid("properties", "is required".into()))?;
    // What a GET shows is accepted back.
    if let Some(p) = properties.as_object_mut()
        && p.get("source").and_then(Value::as_str) == Some("api")
    {
        p.remove("source");
    }
    let config =
        ProviderConfig::parse(&name, Source::Api, &properties, "properties.").map_err(|e| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                e.to_string(),
                e.field,
            ))
        })?;
    if let Some(other) = state
        .oidc
        .providers()
        .into_iter()
        .find(|p| p.config.issuer == config.issuer && p.config.name != name)
    {
        return Err(invalid(
            "properties.issuer",
            format!(
                "{:?} is already identity provider {:?}'s issuer",
                config.issuer, other.config.name
            ),
        ));
    }
    let store = state.runs.store.as_ref();
    let existing = store.get(SERVER, Kind::IdentityProvider, &name).await?;
    if existing.is_none() && stored(store).await?.len() >= MOST {
        return Err(invalid(
            "name",
            format!("at most {MOST} identity providers"),
        ));
    }
    let mut body = json!({
        "id": format!("/v1/identityProviders/{name}"),
        "name": name,
        "properties": config.to_properties(),
    });
    body["systemData"] = system_data(&caller, existing.as_ref().map(|r| &r.body));
    let (resource, created) = store
        .put(
            SERVER,
            Kind::IdentityProvider,
            &name,
            &body,
            &precondition(&headers),
        )
        .await?;
    reload(&state).await?;
    let mut answer = shown(&config, Some(&resource.body));
    answer["eTag"] = json!(resource.etag);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(answer)).into_response())
}

/// `GET /v1/identityProviders/{name}` (admin on every fleet).
pub async fn get(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    if let Some(p) = state
        .oidc
        .find(&name)
        .filter(|p| p.config.source == Source::File)
    {
        return Ok(axum::Json(shown(&p.config, None)).into_response());
    }
    let resource = state
        .runs
        .store
        .get(SERVER, Kind::IdentityProvider, &name)
        .await?
        .ok_or_else(|| not_found(&name))?;
    let config = ProviderConfig::parse(
        &name,
        Source::Api,
        &resource.body["properties"],
        "properties.",
    )
    .map_err(|e| invalid(&e.field, e.message))?;
    let mut answer = shown(&config, Some(&resource.body));
    answer["eTag"] = json!(resource.etag);
    Ok(axum::Json(answer).into_response())
}

/// `GET /v1/identityProviders` (admin on every fleet): the file's, then the API's.
pub async fn list(State(state): State<Shared>, caller: Caller) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let mut value: Vec<Value> = state
        .oidc
        .providers()
        .iter()
        .filter(|p| p.config.source == Source::File)
        .map(|p| shown(&p.config, None))
        .collect();
    let page = state
        .runs
        .store
        .list(SERVER, Kind::IdentityProvider, None, MOST)
        .await?;
    for resource in page {
        if let Ok(config) = ProviderConfig::parse(
            &resource.name,
            Source::Api,
            &resource.body["properties"],
            "properties.",
        ) {
            let mut shown = shown(&config, Some(&resource.body));
            shown["eTag"] = json!(resource.etag);
            value.push(shown);
        }
    }
    Ok(axum::Json(json!({"value": value})).into_response())
}

/// `DELETE /v1/identityProviders/{name}` (admin on every fleet): its tokens stop being taken.
pub async fn delete(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    from_file(&state, &name)?;
    let when: Precondition = precondition(&headers);
    let existed = state
        .runs
        .store
        .delete(SERVER, Kind::IdentityProvider, &name, &when)
        .await?;
    reload(&state).await?;
    if !existed {
        return Err(not_found(&name));
    }
    Ok(StatusCode::OK.into_response())
}
