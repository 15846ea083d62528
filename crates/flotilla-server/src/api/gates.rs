//! Gates: listing, reading and approving. A gate's resource is written when its run reaches it
//! (SEMANTICS §5); before that its id is in the run's status only, and asking for it answers
//! that it is not reached yet, where it is, never that it does not exist.

use super::*;

/// A gate of a run's status, as far as saying where it is.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct GatePlace {
    gate_id: String,
    display_name: Option<String>,
    status: crate::run_head::StateHead,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct GroupPlaces {
    name: String,
    before_gates: Vec<GatePlace>,
    after_gates: Vec<GatePlace>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct StagePlaces {
    name: String,
    before_gates: Vec<GatePlace>,
    after_gates: Vec<GatePlace>,
    groups: Vec<GroupPlaces>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StatusPlaces {
    status: crate::run_head::StateHead,
    stages: Vec<StagePlaces>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PropertiesPlaces {
    status: StatusPlaces,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RunPlaces {
    properties: PropertiesPlaces,
}

/// A gate a run's status lists that has no resource yet: where it is, in words
/// (`the before-gate "Go to production" of stage "prod" of update run "r1" (Running)`).
async fn unreached_gate(state: &AppState, fleet: &str, id: &str) -> HttpResult<Option<String>> {
    for (run, _) in state.runs.store.run_heads(fleet).await? {
        let Some((text, _)) = state.runs.store.get_raw(fleet, Kind::Run, &run).await? else {
            continue;
        };
        // A cheap look first: most runs do not hold the id at all.
        if !text.contains(id) {
            continue;
        }
        let places: RunPlaces = serde_json::from_str(&text).unwrap_or_default();
        let status = &places.properties.status;
        let run_state = status.status.state.as_deref().unwrap_or("NotStarted");
        for stage in &status.stages {
            let mut at: Vec<(Option<&str>, &str, &[GatePlace])> = vec![
                (None, "before", &stage.before_gates),
                (None, "after", &stage.after_gates),
            ];
            for group in &stage.groups {
                at.push((Some(&group.name), "before", &group.before_gates));
                at.push((Some(&group.name), "after", &group.after_gates));
            }
            for (group, timing, gates) in at {
                let Some(gate) = gates.iter().find(|g| g.gate_id == id) else {
                    continue;
                };
                if gate
                    .status
                    .state
                    .as_deref()
                    .is_some_and(|s| s != "NotStarted")
                {
                    // Reached: its resource is being written.
                    return Ok(None);
                }
                let name = gate
                    .display_name
                    .as_ref()
                    .map(|n| format!(" {n:?}"))
                    .unwrap_or_default();
                let place = match group {
                    Some(group) => format!("group {group:?} of stage {:?}", stage.name),
                    None => format!("stage {:?}", stage.name),
                };
                return Ok(Some(format!(
                    "the {timing}-gate{name} of {place} of update run {run:?} ({run_state})"
                )));
            }
        }
    }
    Ok(None)
}

/// `GET P/gates/{gate}`: the gate; one its run has not reached yet answers 404 saying so.
pub(super) async fn get_gate(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, gate)): Path<(String, String)>,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    if state
        .runs
        .store
        .etag(&fleet, Kind::Gate, &gate)
        .await?
        .is_none()
        && let Some(place) = unreached_gate(&state, &fleet, &gate).await?
    {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "gate {gate} is not reached yet: it is {place}; its gate resource appears, Pending, when the run reaches it"
            ),
            "gate",
        )
        .into());
    }
    get_child(state, caller, fleet, gate, Kind::Gate).await
}

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
    let current = match state.runs.store.get(&fleet, Kind::Gate, &gate).await? {
        Some(current) => current,
        None => {
            return Err(match unreached_gate(&state, &fleet, &gate).await? {
                Some(place) => ApiError::conflict(format!(
                    "gate {gate} cannot be approved yet: it is {place}, not reached yet; approve it once it is Pending, or skip its stage or group"
                ))
                .into(),
                None => not_found("gate", &gate),
            });
        }
    };
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
