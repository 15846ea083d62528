//! Fleets: the fleet resource, its driver configuration and tags.

use super::*;

/// A fleet as sent: Flotilla's `properties.driver`, and what Fleet Manager's fleets carry
/// (`location`, `tags`, `identity`, `properties.hubProfile`), kept as given.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FleetBody {
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
pub(super) struct FleetProperties {
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
pub(super) struct FleetPatch {
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    identity: Option<serde_json::Map<String, Value>>,
}

/// ARM's limits on tags: at most 50, names up to 512 characters, values up to 256.
pub(super) fn check_tags(tags: &BTreeMap<String, String>) -> HttpResult<()> {
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
pub(super) async fn write_resource(
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

pub(super) async fn list_fleets(
    State(state): State<Shared>,
    caller: Caller,
    Paged(paging): Paged,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    list(&state, "", Kind::Fleet, &paging, "/v1/fleets").await
}

pub(super) async fn get_fleet(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    Ok(respond(require_fleet(&state, &fleet).await?, false))
}

pub(super) async fn put_fleet(
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
pub(super) async fn write_fleet(
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
pub(super) async fn patch_fleet(
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

pub(super) async fn delete_fleet(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    // A fleet whose profiles others follow stays (SEMANTICS §14).
    crate::trains::refuse_if_followed(&state, &fleet, None, "deleted").await?;
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
