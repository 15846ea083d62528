//! Run creation, deletion, user actions (start, stop, skip) and the event log with its live stream.

use super::*;

/// Creates (or replaces, before it starts) a run: reads the fleet's members as stored,
/// observes those never observed, takes the catalog from the driver, and hands the run to the
/// fleet's actor, where the fleet's engine decides it and it is recorded.
pub(super) async fn create_run(
    state: &Shared,
    fleet: &str,
    run: &str,
    new: NewRun,
    when: Precondition,
) -> HttpResult<CreatedRun> {
    if let Some((existing, etag)) = state.runs.store.get_raw(fleet, Kind::Run, run).await? {
        // Held before anything changes: a create-only write (`If-None-Match: *`) never
        // replaces a run, even one not started.
        if when == Precondition::IfNoneMatchAny {
            return Err(HttpError::new(
                StatusCode::PRECONDITION_FAILED,
                "PreconditionFailed",
                format!("If-None-Match: * but the resource exists (eTag {etag})"),
            ));
        }
        if let Precondition::IfMatch(wanted) = &when
            && wanted != "*"
            && *wanted != etag
        {
            return Err(HttpError::new(
                StatusCode::PRECONDITION_FAILED,
                "PreconditionFailed",
                format!("If-Match {wanted} but the resource's eTag is {etag}"),
            ));
        }
        drop(existing);
    }
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await?;
    let mut members = Vec::new();
    // Members the driver could not observe now, with why: they refuse only a run that selects
    // them (an unobservable member affects only itself).
    let mut unobserved = Vec::new();
    let mut never_observed = Vec::new();
    for stored in crate::runs::stored_members(&state.runs.store, fleet).await? {
        match stored.cluster.clone() {
            Some(c) => members.push(stored.with_cluster(c)),
            None => never_observed.push(stored),
        }
    }
    if !never_observed.is_empty() {
        let asked = never_observed
            .iter()
            .map(|m| (m.name.to_string(), m.cluster_resource_id.to_string()))
            .collect();
        let answers = observe_members(state, fleet, asked).await?;
        for (stored, (_, answer)) in never_observed.into_iter().zip(answers) {
            match answer {
                Ok(c) => members.push(stored.with_cluster(std::sync::Arc::new(c))),
                Err(why) => unobserved.push(crate::runs::Unobserved {
                    name: stored.name.to_string(),
                    cluster_resource_id: stored.cluster_resource_id.to_string(),
                    group: stored.group,
                    labels: stored.labels,
                    why,
                }),
            }
        }
    }
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    let request = crate::runs::CreateRequest {
        run: run.to_string(),
        strategy: new.strategy,
        strategy_id: new.strategy_id,
        update: new.update,
        rules: new.rules,
        profile_id: new.profile_id,
        promoted_from: new.promoted_from,
        system_data: new.system_data,
        create_only: when == Precondition::IfNoneMatchAny,
        if_match: match when {
            Precondition::IfMatch(etag) => Some(etag),
            _ => None,
        },
        catalog,
        unobserved,
    };
    Ok(state.runs.create(fleet, request, members).await?)
}

pub(super) async fn delete_run(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, run)): Path<(String, String)>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Operator)?;
    let (text, _) = state
        .runs
        .store
        .get_raw(&fleet, Kind::Run, &run)
        .await?
        .ok_or_else(|| not_found("updateRun", &run))?;
    if crate::run_head::RunHead::parse(&text).is_active() {
        return Err(ApiError::conflict(format!(
            "update run {run:?} is running; stop it before deleting it"
        ))
        .into());
    }
    state.runs.retire(&fleet, &run);
    state
        .runs
        .store
        .delete(&fleet, Kind::Run, &run, &precondition(&headers))
        .await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SkipBody {
    targets: Option<Vec<SkipTargetBody>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SkipTargetBody {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: Option<String>,
}

pub(super) async fn run_action(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, run, action)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    if action == "forecast" {
        return forecast_run(&state, &caller, &fleet, &run, body).await;
    }
    if action == "rollback" {
        return rollback_run(&state, &caller, &fleet, &run, &headers, body).await;
    }
    require(&caller, Role::Operator)?;
    // Only the eTag is needed: a large run's document is not parsed, before or after.
    let (_, etag) = state
        .runs
        .store
        .get_raw(&fleet, Kind::Run, &run)
        .await?
        .ok_or_else(|| not_found("updateRun", &run))?;
    check_if_match(&headers, &etag)?;
    let input = match action.as_str() {
        "start" => Input::Start,
        "stop" => Input::Stop,
        "skip" => {
            let skip: SkipBody = from_json_value(read_json(body).await?, "")?;
            let targets = skip.targets.ok_or_else(|| {
                HttpError::from(ApiError::new(
                    ErrorCode::InvalidSkipTarget,
                    "targets is required",
                    "targets",
                ))
            })?;
            let mut parsed = Vec::new();
            for (i, t) in targets.into_iter().enumerate() {
                let kind = match t.kind.as_deref() {
                    Some("Member") => SkipKind::Member,
                    Some("Group") => SkipKind::Group,
                    Some("Stage") => SkipKind::Stage,
                    Some("AfterStageWait") => SkipKind::AfterStageWait,
                    other => {
                        const KINDS: &str = "Member, Group, Stage or AfterStageWait";
                        return Err(ApiError::new(
                            ErrorCode::InvalidSkipTarget,
                            match other {
                                Some(t) => format!(
                                    "targets[{i}].type: {t:?} is not a skip target type: {KINDS}"
                                ),
                                None => format!("targets[{i}].type is required: {KINDS}"),
                            },
                            format!("targets[{i}].type"),
                        )
                        .into());
                    }
                };
                let name = t.name.filter(|n| !n.is_empty()).ok_or_else(|| {
                    HttpError::from(ApiError::new(
                        ErrorCode::InvalidSkipTarget,
                        format!("targets[{i}].name is required"),
                        format!("targets[{i}].name"),
                    ))
                })?;
                parsed.push(SkipTarget { kind, name });
            }
            // Passing a pending Approval gate needs the approver role; the engine decides
            // whether this skip does, atomically with the skip (API.md, "Security").
            Input::SkipBy {
                targets: parsed,
                subject: caller.subject.clone(),
                may_approve: caller.role >= Role::Approver,
            }
        }
        other => return Err(not_found("action", other)),
    };
    state.runs.act(&fleet, &run, input).await?;
    if let Some((text, etag)) = state.runs.store.get_raw(&fleet, Kind::Run, &run).await?
        && let Some(response) = stored_response(&text, &etag)
    {
        return Ok(response);
    }
    Ok(respond(
        get_one(&state, &fleet, Kind::Run, &run, "updateRun").await?,
        false,
    ))
}

/// `POST …/updateRuns/{r}/rollback` (approver; SEMANTICS §15): the fleet's engine decides
/// whether run `r` can be rolled back, and makes and starts its rollback run, or answers the
/// one made already; the answer is that run's document.
async fn rollback_run(
    state: &Shared,
    caller: &Caller,
    fleet: &str,
    run: &str,
    headers: &HeaderMap,
    body: Body,
) -> HttpResult<Response> {
    require(caller, Role::Approver)?;
    // The request asks nothing but the rollback: a body, if any, is an empty object.
    let asked = read_json(body).await?;
    if !(asked.is_null() || asked.as_object().is_some_and(|o| o.is_empty())) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequestContent,
            format!("a rollback takes no body, got {asked}"),
            "",
        )
        .into());
    }
    let (_, etag) = state
        .runs
        .store
        .get_raw(fleet, Kind::Run, run)
        .await?
        .ok_or_else(|| not_found("updateRun", run))?;
    check_if_match(headers, &etag)?;
    let made = state
        .runs
        .roll_back(fleet, run, crate::request::system_data(caller, None))
        .await?;
    if let Some((text, etag)) = state.runs.store.get_raw(fleet, Kind::Run, &made).await?
        && let Some(response) = stored_response(&text, &etag)
    {
        return Ok(response);
    }
    Ok(respond(
        get_one(state, fleet, Kind::Run, &made, "updateRun").await?,
        false,
    ))
}

/// How often an open event stream checks that its token is still valid.
pub(super) const TOKEN_RECHECK: std::time::Duration = std::time::Duration::from_millis(400);

pub(super) async fn run_events(
    State(state): State<Shared>,
    caller: Caller,
    Path((fleet, run)): Path<(String, String)>,
    headers: HeaderMap,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    get_one(&state, &fleet, Kind::Run, &run, "updateRun").await?;
    let streaming = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let after: i64 = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if !streaming {
        let events = state
            .runs
            .store
            .run_events(&fleet, &run, after, 100_000)
            .await?;
        return Ok(axum::Json(
            json!({"value": events.into_iter().map(|(_, e)| e).collect::<Vec<_>>()}),
        )
        .into_response());
    }
    // The stream reads the run's event log, from whichever replica wrote it, and reads again
    // whenever the store says the log grew: subscribe first, so nothing falls between the two.
    let store = state.runs.store.clone();
    let mut notices = store.notices();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(256);
    let token = caller.token_hash.clone();
    let expires_at = caller.expires_at;
    tokio::spawn(async move {
        let mut last = after;
        // The token is checked again while the stream is open: revoking it ends the stream.
        let mut checked = tokio::time::Instant::now();
        loop {
            // An identity provider's token ends the stream when it expires.
            if expires_at.is_some_and(|exp| crate::clock::now().unix() > exp) {
                return;
            }
            if let Some(hash) = &token
                && checked.elapsed() >= TOKEN_RECHECK
            {
                match store.token_by_hash(hash).await {
                    Ok(Some(t)) if !t.revoked => {}
                    // Revoked or gone; a store that cannot answer is asked again.
                    Ok(_) => return,
                    Err(_) => {}
                }
                checked = tokio::time::Instant::now();
            }
            let page = store
                .run_events(&fleet, &run, last, 1000)
                .await
                .unwrap_or_default();
            let full = page.len() == 1000;
            for (seq, event) in page {
                last = seq;
                let sse = SseEvent::default()
                    .id(seq.to_string())
                    .data(event.to_string());
                if tx.send(Ok(sse)).await.is_err() {
                    return;
                }
            }
            if full {
                continue;
            }
            let grew = async {
                loop {
                    match notices.recv().await {
                        Ok(Notice::Events { fleet: f, run: r }) if f == fleet && r == run => {
                            return;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await
                        }
                        Ok(_) => {}
                    }
                }
            };
            tokio::select! {
                _ = grew => {}
                // A lost notice costs at most this much delay.
                _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(checked + TOKEN_RECHECK), if token.is_some() => {}
            }
        }
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}
