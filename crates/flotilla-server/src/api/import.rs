//! Batch registration: `importMembers`, one transaction, all or nothing; and member patches and deletion.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportRequest {
    value: Vec<Value>,
    #[serde(default)]
    mode: Option<String>,
}

/// `POST /v1/fleets/{fleet}/importMembers`: up to 10,000 members in one transaction, all or
/// nothing; a rejection names the item.
pub(super) async fn import_members(
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
    // Observed in the background, a few at a time and recorded in batches: an import is large.
    spawn_register(state.clone(), fleet, &writes);
    Ok(
        axum::Json(json!({"created": created, "updated": registered.written.len() - created}))
            .into_response(),
    )
}

/// An import names each member and each cluster once: a repeat within the request is refused
/// as one, naming both items (it is neither a member that exists nor another's cluster, and
/// which of the two items was meant cannot be told). Cluster ids compare case-insensitively.
pub(super) fn check_no_repeats(writes: &[MemberWrite]) -> HttpResult<()> {
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

pub(super) async fn patch_member(
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

pub(super) async fn delete_member(
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
    // The fleet's member table no longer holds it (what freezes and budgets cover).
    state.runs.member_left(&fleet, &member).await;
    // Every run that can still move skips it where it has not started (SEMANTICS §2), a Failed
    // run included: a retry must not upgrade a member that left the fleet. Each is told through
    // the fleet's task, and its engine decides what that means for the run.
    for (run, head) in crate::run_head::heads(state.runs.store.as_ref(), &fleet).await? {
        if head.may_move_again() {
            let input = Input::MemberRemoved {
                member: member.clone(),
            };
            let _ = state.runs.act(&fleet, &run, input).await;
        }
    }
    Ok(StatusCode::OK.into_response())
}
