//! Members: the member resource, its labels and group.

use super::*;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct MemberProperties {
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

pub(super) fn check_group_and_labels(
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

pub(super) fn member_body(
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
pub(super) fn member_write(
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

pub(super) async fn put_member(
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
    let writes = [write];
    let registered = state
        .runs
        .store
        .register_members(&fleet, &writes, RegisterMode::Upsert)
        .await?;
    let created = registered.written.first().is_some_and(|w| w.1);
    let resource = get_one(&state, &fleet, Kind::Member, &member, "member").await?;
    spawn_register(state.clone(), fleet, &writes);
    Ok(respond(resource, created))
}
