//! Forecasts of a run (SEMANTICS §11), and what-ifs.

use super::*;

/// The longest delay or duration a forecast takes: a year.
pub(super) const FORECAST_SECONDS_MAX: i64 = 366 * 86_400;

/// A forecast's parameters as sent (API.md, "Health checks and forecasts"); all optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ForecastBody {
    approval_delay_seconds: Option<i64>,
    default_duration_seconds: Option<i64>,
}

pub(super) fn forecast_params(body: Value) -> HttpResult<ForecastParams> {
    let body: ForecastBody = from_json_value(body, "")?;
    let mut params = ForecastParams::default();
    for (field, value, min, into) in [
        (
            "approvalDelaySeconds",
            body.approval_delay_seconds,
            0,
            &mut params.approval_delay_seconds,
        ),
        (
            "defaultDurationSeconds",
            body.default_duration_seconds,
            1,
            &mut params.default_duration_seconds,
        ),
    ] {
        match value {
            None => {}
            Some(v) if (min..=FORECAST_SECONDS_MAX).contains(&v) => *into = v,
            Some(v) => {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequestContent,
                    format!("{field} {v}: must be from {min} to {FORECAST_SECONDS_MAX} seconds"),
                    field,
                )
                .into());
            }
        }
    }
    Ok(params)
}

/// A forecast of `run` in `copy`, durations as §11 says, in the API's shape; computed on a
/// blocking thread.
pub(super) async fn forecast_answer(
    state: &Shared,
    fleet: &str,
    copy: FleetEngine,
    run: String,
    params: ForecastParams,
    driver: std::sync::Arc<dyn crate::driver::Driver>,
) -> HttpResult<Value> {
    let durations =
        crate::durations::Durations::load(state.runs.store.as_ref(), fleet, &copy, driver, params)
            .await?;
    let answer = tokio::task::spawn_blocking(move || {
        let duration = |r: &str, m: &str| durations.of(&copy, r, m);
        let forecast = forecast(&copy, &run, now(), &params, &duration)?;
        Ok::<_, ApiError>(forecast.to_json(&params, durations.counts()))
    })
    .await
    .map_err(|e| ApiError::conflict(format!("the forecast did not finish: {e}")))??;
    Ok(answer)
}

/// A what-if forecast (`POST /v1/fleets/{fleet}/forecast`): `{"run": <an update run body>,
/// "approvalDelaySeconds", "defaultDurationSeconds"}`. The run is made in a copy of the fleet's
/// engine, as its creation would make it now, and forecast from now; nothing is stored.
pub(super) async fn forecast_what_if(
    State(state): State<Shared>,
    caller: Caller,
    Path(fleet): Path<String>,
    body: Body,
) -> HttpResult<Response> {
    require(&caller, Role::Reader)?;
    require_fleet(&state, &fleet).await?;
    let mut body = read_json(body).await?;
    let run = body
        .as_object_mut()
        .and_then(|b| b.remove("run"))
        .ok_or_else(|| {
            HttpError::from(ApiError::new(
                ErrorCode::InvalidRequestContent,
                "run is required: the update run body to forecast",
                "run",
            ))
        })?;
    let params = forecast_params(body)?;
    let props: RunProperties = envelope(run).map_err(|e| prefixed(e, "run"))?;
    let (strategy, _, update, rules) = run_body(&state, &fleet, props)
        .await
        .map_err(|e| prefixed(e, "run"))?;
    let spec = RunSpec {
        strategy: strategy
            .as_ref()
            .map(|s| parse_strategy(s, "properties.strategy", DEFAULT_STAGE_CONCURRENCY_LIMIT))
            .transpose()?,
        upgrade: parse_upgrade(&update, "properties.managedClusterUpdate")?,
        rules,
    };
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), &fleet)
        .await?;
    let catalog = crate::runs::driver_catalog(driver.as_ref()).await?;
    let mut copy = state.runs.fleet_copy(&fleet, None).await?;
    let (mut what_if, _) = copy
        .plan_run(WHAT_IF, &spec, catalog, &[])
        .map_err(|e| prefixed(e.into(), "run"))?;
    // Its waits run at the fleet's time scale, as a created run's would (a `sim` fleet's).
    what_if.set_time_scale(driver.time_scale());
    copy.take_run(WHAT_IF, what_if)
        .map_err(|e| prefixed(e.into(), "run"))?;
    let answer = forecast_answer(&state, &fleet, copy, WHAT_IF.to_string(), params, driver).await?;
    Ok(axum::Json(answer).into_response())
}

/// The name of a what-if run in a forecast's copy: not a name a run can have.
pub(super) const WHAT_IF: &str = "(what-if)";

/// An error about part of a body, its field path put under `prefix`.
pub(super) fn prefixed(mut e: HttpError, prefix: &str) -> HttpError {
    e.target = if e.target.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix}.{}", e.target)
    };
    if !e.message.starts_with(prefix) {
        e.message = format!("{prefix}.{}", e.message);
    }
    e
}

/// `POST …/updateRuns/{run}/forecast` (SEMANTICS §11): the fleet's engine copied and run
/// forward off the fleet's task. Durations: the median of the member's last five upgrades of
/// the run's type, else of the fleet's last fifty, else what the fleet's driver expects (the
/// `sim` driver's configured durations), else `defaultDurationSeconds`.
pub(super) async fn forecast_run(
    state: &Shared,
    caller: &Caller,
    fleet: &str,
    run: &str,
    body: Body,
) -> HttpResult<Response> {
    require(caller, Role::Reader)?;
    let params = forecast_params(read_json(body).await?)?;
    let Some((text, _)) = state.runs.store.get_raw(fleet, Kind::Run, run).await? else {
        return Err(not_found("updateRun", run));
    };
    let head = crate::run_head::RunHead::parse(&text);
    drop(text);
    if head.is_over() {
        return Err(ApiError::conflict(format!(
            "update run {run:?} has ended ({}); there is nothing to forecast",
            head.state()
        ))
        .into());
    }
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await?;
    let copy = state.runs.fleet_copy(fleet, Some(run)).await?;
    if copy.run(run).is_none() {
        // It ended between the look at its head and the copy.
        return Err(ApiError::conflict(format!(
            "update run {run:?} has ended; there is nothing to forecast"
        ))
        .into());
    }
    let answer = forecast_answer(state, fleet, copy, run.to_string(), params, driver).await?;
    Ok(axum::Json(answer).into_response())
}
