//! Update strategies.

use super::*;

pub(super) async fn put_strategy(
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
