//! Gates: listing and approving.

use super::*;

pub(super) async fn list_gates(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    Paged(paging): Paged,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    // Every state a gate resource can have (a HealthCheck gate can fail, SEMANTICS §10).
    if let Some(s) = paging.wanted_state()
        && !matches!(s.as_str(), "Pending" | "Completed" | "Skipped" | "Failed")
    {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("state {s:?}: must be Pending, Completed, Skipped or Failed"),
            "state",
        )
        .into());
    }
    list(
        &state,
        &fleet,
        Kind::Gate,
        &paging,
        &format!("/v1/fleets/{fleet}/gates"),
    )
    .await
}

pub(super) async fn patch_gate(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, gate)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Approver)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct GatePatch {
        state: Option<String>,
    }
    let patch: GatePatch = envelope(read_json(body).await?)?;
    if patch.state.as_deref() != Some("Completed") {
        const ONLY: &str = "the only change allowed is Completed (approve)";
        return Err(ApiError::new(
            ErrorCode::InvalidGate,
            match &patch.state {
                Some(s) => format!("properties.state: {s:?} cannot be set; {ONLY}"),
                None => format!("properties.state is required; {ONLY}"),
            },
            "properties.state",
        )
        .into());
    }
    let current = get_one(&state, &fleet, Kind::Gate, &gate, "gate").await?;
    check_if_match(&headers, &current.etag)?;
    let run = current.body["properties"]["target"]["updateRunProperties"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    state
        .runs
        .act(
            &fleet,
            &run,
            Input::ApproveGateById {
                id: gate.clone(),
                by: caller.subject.clone(),
            },
        )
        .await?;
    get_child(state, caller, fleet, gate, Kind::Gate).await
}
