//! Releases, tokens, health and metrics.

use super::*;

pub(super) async fn releases(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    Paged(paging): Paged,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), &fleet)
        .await?;
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    let mut spec = catalog.spec();
    if let Some(region) = &paging.region {
        spec.retain(|r, _| r == region);
        if spec.is_empty() {
            return Err(not_found("region", region));
        }
    }
    Ok(axum::Json(json!({"regions": spec})).into_response())
}

pub(super) async fn create_token(
    State(state): State<Shared>,
    caller: Caller,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NewToken {
        role: Option<String>,
        subject: Option<String>,
    }
    let request: NewToken = from_json_value(read_json(body).await?, "")?;
    let role_text = request.role.unwrap_or_default();
    let role = Role::parse(&role_text).ok_or_else(|| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("role {role_text:?}: must be reader, operator, approver or admin"),
            "role",
        ))
    })?;
    let subject = request
        .subject
        .unwrap_or_else(|| format!("{}-token", role.name()));
    let (secret, record) = crate::auth::new_token(role, &subject).map_err(|m| {
        HttpError::from(ApiError::new(
            ErrorCode::InvalidRequestContent,
            m,
            "subject",
        ))
    })?;
    state.runs.store.create_token(&record).await?;
    Ok((StatusCode::CREATED, axum::Json(json!({"id": record.id, "role": record.role, "subject": record.subject, "token": secret}))).into_response())
}

pub(super) async fn list_tokens(
    State(state): State<Shared>,
    caller: Caller,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    let tokens = state.runs.store.list_tokens().await?;
    let value: Vec<Value> = tokens
        .iter()
        .map(|t| json!({"id": t.id, "role": t.role, "subject": t.subject, "createdAt": flotilla_engine::time::Time::from_unix(t.created_at), "revoked": t.revoked}))
        .collect();
    Ok(axum::Json(json!({"value": value})).into_response())
}

pub(super) async fn list_leases(
    State(state): State<Shared>,
    caller: Caller,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let leases = state.runs.store.leases().await?;
    let value: Vec<Value> = leases
        .iter()
        .map(|l| {
            json!({"fleet": l.fleet, "owner": l.owner, "epoch": l.epoch,
                "expiresInMs": l.expires_in_ms, "expired": l.expires_in_ms < 0})
        })
        .collect();
    Ok(axum::Json(json!({"replica": state.runs.replica.id, "value": value})).into_response())
}

pub(super) async fn revoke_token(
    State(state): State<Shared>,
    caller: Caller,
    Path(id): Path<String>,
) -> HttpResult<Response> {
    require(&caller, Role::Admin)?;
    if !state.runs.store.revoke_token(&id).await? {
        return Err(not_found("token", &id));
    }
    Ok(StatusCode::OK.into_response())
}

/// The caller's subject and role, so a client (the dashboard) shows only the actions the
/// server would allow; the server checks the role on every action regardless. Also where
/// fleets created on `/v1` live in ARM's terms, the subscription a CLI's `-g` alone means.
pub(super) async fn who_am_i(
    State(state): State<Shared>,
    caller: Caller,
    headers: axum::http::HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let arm = state.arm_settings();
    // A dashboard session's CSRF token, which its writes carry (never with a bearer token).
    let csrf = if headers.contains_key(axum::http::header::AUTHORIZATION) {
        None
    } else {
        crate::sessions::cookie(&headers, crate::sessions::COOKIE)
            .and_then(|id| state.sessions.get(id, crate::clock::now().unix()))
            .map(|s| s.csrf)
    };
    let mut me = json!({
        "subject": caller.subject,
        "role": caller.role.name(),
        // Per fleet pattern (an identity provider's mappings; a static token's is `*`).
        "grants": caller.access.grants().into_iter()
            .map(|(fleets, role)| json!({"fleets": fleets, "role": role.name()}))
            .collect::<Vec<_>>(),
        "arm": {"subscription": arm.subscription, "resourceGroup": arm.resource_group},
    });
    if let Some(csrf) = csrf {
        me["csrfToken"] = json!(csrf);
    }
    Ok(axum::Json(me).into_response())
}

pub(super) async fn healthz() -> &'static str {
    "ok"
}

pub(super) async fn readyz(State(state): State<Shared>) -> Response {
    match state.runs.store.list("", Kind::Fleet, None, 1).await {
        Ok(_) => "ready".into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unavailable: {e}"),
        )
            .into_response(),
    }
}

pub(super) async fn metrics(State(state): State<Shared>, caller: Caller) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    let mut gauges = crate::metrics::ScrapeGauges::default();
    let runs = gauges.family("flotilla_update_runs", "Update runs by state");
    let failures = gauges.family(
        "flotilla_update_run_failure_count",
        "Failed members counted in each update run",
    );
    let pending = gauges.family(
        "flotilla_gates_pending",
        "Gates waiting for approval or their time",
    );
    let oldest = gauges.family(
        "flotilla_gate_longest_wait_seconds",
        "How long the oldest pending gate has been waiting",
    );
    let now = now();
    for fleet in state
        .runs
        .store
        .list("", Kind::Fleet, None, 100_000)
        .await?
    {
        let of_fleet = || vec![("fleet", fleet.name.clone())];
        for (name, run) in crate::run_head::heads(state.runs.store.as_ref(), &fleet.name).await? {
            let mut by_state = of_fleet();
            by_state.push(("state", run.state().to_string()));
            runs.get_or_create(&by_state).inc();
            let mut of_run = of_fleet();
            of_run.push(("run", name));
            failures.get_or_create(&of_run).set(run.failure_count());
            for gate in run.gates() {
                if gate.status.state.as_deref() != Some("Pending") {
                    continue;
                }
                pending.get_or_create(&of_fleet()).inc();
                if let Some(since) = gate
                    .status
                    .start_time
                    .as_deref()
                    .and_then(|t| flotilla_engine::time::Time::parse(t).ok())
                {
                    let waited = (now.unix() - since.unix()) as f64;
                    let longest = oldest.get_or_create(&of_fleet());
                    if waited > longest.get() {
                        longest.set(waited);
                    }
                }
            }
        }
    }
    let text = state.runs.metrics.render(&gauges);
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}
