//! Update runs: their bodies and creation through `PUT`.

use super::*;

/// A strategy's id as stored (answered as an ARM id on the ARM paths).
pub(super) fn strategy_id(fleet: &str, name: &str) -> String {
    format!("/v1/fleets/{fleet}/updateStrategies/{name}")
}

/// `/v1/fleets/{f}/updateStrategies/{s}` or a full Azure id ending the same way; the fleet's
/// name compares case-insensitively, as Azure's do.
pub(super) fn strategy_name(id: &str, fleet: &str) -> HttpResult<String> {
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
/// the strategy it names), its upgrade and its rules (`chainMinorVersions`), all checked.
pub(super) async fn run_body(
    state: &Shared,
    fleet: &str,
    props: RunProperties,
) -> HttpResult<(
    Option<StrategySpec>,
    Option<String>,
    ManagedClusterUpdateSpec,
    RunRules,
)> {
    props.check_read_only()?;
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
    let upgrade = parse_upgrade(&update, "properties.managedClusterUpdate")?;
    flotilla_engine::strategy::check_chain_minor_versions(
        props.chain_minor_versions,
        &upgrade,
        "properties.chainMinorVersions",
    )?;
    let rules = RunRules {
        chain_minor_versions: props.chain_minor_versions,
        ..RunRules::default()
    };
    Ok((strategy, strategy_id, update, rules))
}

pub(super) async fn put_run(
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
    if let Some(of) = &props.rollback_of
        && props.rolled_back_by.is_none()
        && let Some((text, etag)) = state.runs.store.get_raw(&fleet, Kind::Run, &run).await?
        && crate::runs::run_base(&text).is_ok_and(|b| b["properties"]["rollbackOf"] == *of)
    {
        // What a GET of a rollback run answered, sent back to it: the run as it is.
        check_precondition(&headers, &etag)?;
        if let Some(response) = stored_response(&text, &etag) {
            return Ok(response);
        }
    }
    let (strategy, strategy_id, update, rules) = run_body(&state, &fleet, props).await?;
    // What a GET answered, sent back: the run as it is, whatever its state.
    if let Some((text, etag)) = state.runs.store.get_raw(&fleet, Kind::Run, &run).await?
        && same_run(&text, &strategy, &strategy_id, &update, &rules)
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
            rules,
            profile_id: None,
            promoted_from: None,
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
pub(super) fn same_run(
    text: &str,
    strategy: &Option<StrategySpec>,
    strategy_id: &Option<String>,
    update: &ManagedClusterUpdateSpec,
    rules: &RunRules,
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
        #[serde(default)]
        chain_minor_versions: bool,
    }
    let Ok(stored) = serde_json::from_str::<Stored>(text) else {
        return false;
    };
    let p = stored.properties;
    p.strategy == strategy.as_ref().map(|s| json!(s))
        && p.update_strategy_id == *strategy_id
        && p.managed_cluster_update == Some(json!(update))
        && p.chain_minor_versions == rules.chain_minor_versions
}

/// What a new run is made of.
pub struct NewRun {
    pub strategy: Option<StrategySpec>,
    pub strategy_id: Option<String>,
    pub update: ManagedClusterUpdateSpec,
    pub rules: RunRules,
    pub profile_id: Option<String>,
    /// A promoted run's provenance (SEMANTICS §14).
    pub promoted_from: Option<flotilla_engine::status::PromotedFrom>,
    /// Who creates it, and when.
    pub system_data: Value,
}
