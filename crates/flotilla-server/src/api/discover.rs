//! Discovery through the API: `discoverMembers`, and the pass that discovers fleets whose driver can list clusters (`crate::discovery` decides what they mean).

use super::*;

/// `POST /v1/fleets/{fleet}/discoverMembers`: the clusters the fleet's driver finds become
/// members (`crate::discovery`).
pub(super) async fn discover_members(
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
        spawn_register(state.clone(), fleet.to_string(), &writes);
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
