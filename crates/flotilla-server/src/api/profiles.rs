//! Auto-upgrade profiles, and the runs they generate.

use super::*;

pub(super) async fn put_profile(
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
    crate::trains::check_upstream(&state, &fleet, &name, &profile).await?;
    // Kept in its `/v1` form, whichever form it was written in.
    if let (Some(written), Some(up)) = (spec.upstream.as_mut(), &profile.upstream) {
        written.profile_id = Some(up.profile_id());
    }
    let existing = state.runs.store.get(&fleet, Kind::Profile, &name).await?;
    // A profile others follow keeps its channel (SEMANTICS §14).
    if let Some(before) = &existing
        && let Ok((_, old)) = crate::trains::stored_profile(&before.body)
        && !flotilla_engine::train::same_channel(old.channel, profile.channel)
    {
        crate::trains::refuse_if_followed(&state, &fleet, Some(&name), "given another channel")
            .await?;
    }
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
pub(super) async fn next_trigger(
    state: &Shared,
    fleet: &str,
    name: &str,
    profile: &Profile,
) -> Option<Value> {
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
    let (at, run) = match &profile.upstream {
        // A downstream profile promotes what its upstream validated when the soak ends
        // (SEMANTICS §14), nothing before.
        Some(_) if !profile.disabled => {
            let (at, validated) = match crate::trains::promotion_now(state, profile).await.ok()? {
                Promotion::Due { validated, .. } => (now(), validated),
                Promotion::Soaking {
                    validated,
                    soak_ends_at,
                } => (soak_ends_at, validated),
                Promotion::Nothing => return None,
            };
            let (run, _) = flotilla_engine::train::promoted_run(
                name,
                profile,
                &catalog,
                &validated,
                driver.pins_node_images(),
            );
            (at, run).into()
        }
        Some(_) => None,
        None => next_generation(name, profile, &catalog, now(), |r| runs.contains(r)),
    }
    .filter(|(_, run)| !runs.contains(&run.name))?;
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
    generate_knowing(state, fleet, name, caller, None).await
}

/// [`generate`], for a caller that has just worked out where a downstream profile stands
/// (the release feed, which shows it in the profile's status): it is not read twice.
pub async fn generate_knowing(
    state: &Shared,
    fleet: &str,
    name: &str,
    caller: &Caller,
    standing: Option<Promotion>,
) -> HttpResult<Result<Generated, NoRun>> {
    let (fleet, name) = (fleet.to_string(), name.to_string());
    let resource = get_one(state, &fleet, Kind::Profile, &name, "autoUpgradeProfile").await?;
    let (_, profile) = crate::trains::stored_profile(&resource.body)?;
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), &fleet)
        .await?;
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    // A downstream profile promotes what its upstream validated, once soaked (SEMANTICS §14);
    // any other follows its channel.
    let (planned, promoted_from) = match &profile.upstream {
        _ if profile.disabled => return Ok(Err(NoRun::Disabled)),
        Some(_) => {
            let standing = match standing {
                Some(known) => known,
                None => crate::trains::promotion_now(state, &profile).await?,
            };
            match standing {
                Promotion::Due { validated, .. } => {
                    let (run, from) = flotilla_engine::train::promoted_run(
                        &name,
                        &profile,
                        &catalog,
                        &validated,
                        driver.pins_node_images(),
                    );
                    (run, Some(from))
                }
                other => return Ok(Err(NoRun::Soaking(other.wakes_at()))),
            }
        }
        None => match plan_generation(&name, &profile, &catalog, now()) {
            Ok(planned) => (planned, None),
            Err(no_run) => return Ok(Err(no_run)),
        },
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
        promoted_from,
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

pub(super) async fn generate_update_run(
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
