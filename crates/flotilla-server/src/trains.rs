//! Release trains in the server (SEMANTICS §14): what the engine's `train` module decides,
//! gathered from the store. A profile's upstream must exist, have its channel and close no
//! cycle; a profile others follow keeps its channel and is not deleted, nor is its fleet; and a
//! downstream profile's trigger reads what its upstream's runs validated.

use std::collections::HashMap;

use serde_json::Value;

use flotilla_engine::error::{ApiError, ErrorCode};
use flotilla_engine::profile::{Profile, ProfileSpec, parse_profile};
use flotilla_engine::status::UpdateRunStatus;
use flotilla_engine::train::{self, Promotion, Upstream, Validated};

use crate::error::{HttpError, HttpResult};
use crate::state::AppState;
use crate::store::Kind;

/// A stored profile's definition (its read-only fields left out).
pub fn stored_profile(body: &Value) -> Result<(ProfileSpec, Profile), ApiError> {
    let mut properties = body["properties"].clone();
    if let Some(map) = properties.as_object_mut() {
        map.remove("provisioningState");
        map.remove("autoUpgradeProfileStatus");
    }
    let spec: ProfileSpec = serde_json::from_value(properties).map_err(|e| {
        ApiError::conflict(format!(
            "the stored profile {} is unreadable: {e}",
            body["id"]
        ))
    })?;
    let profile = parse_profile(&spec)?;
    Ok((spec, profile))
}

/// Every profile of the server that names an upstream: its id and its upstream's id.
async fn upstreams(state: &AppState) -> HttpResult<HashMap<String, String>> {
    let store = state.runs.store.as_ref();
    let mut found = HashMap::new();
    for fleet in store.list("", Kind::Fleet, None, 100_000).await? {
        for p in store
            .list(&fleet.name, Kind::Profile, None, 100_000)
            .await?
        {
            if let Ok((_, profile)) = stored_profile(&p.body)
                && let Some(up) = &profile.upstream
            {
                found.insert(train::profile_id(&fleet.name, &p.name), up.profile_id());
            }
        }
    }
    Ok(found)
}

fn bad_upstream(message: String) -> HttpError {
    HttpError::from(ApiError::new(
        ErrorCode::InvalidRequestContent,
        format!("properties.upstream.profileId: {message}"),
        "properties.upstream.profileId",
    ))
}

/// A profile's upstream exists, has its channel, and closes no cycle (400 otherwise).
pub async fn check_upstream(
    state: &AppState,
    fleet: &str,
    name: &str,
    profile: &Profile,
) -> HttpResult<()> {
    let Some(up) = &profile.upstream else {
        return Ok(());
    };
    let id = train::profile_id(fleet, name);
    let stored = state
        .runs
        .store
        .get(&up.fleet, Kind::Profile, &up.profile)
        .await?
        .ok_or_else(|| {
            bad_upstream(format!(
                "{:?}: auto-upgrade profile {:?} of fleet {:?} does not exist",
                up.profile_id(),
                up.profile,
                up.fleet
            ))
        })?;
    let (_, upstream) = stored_profile(&stored.body)?;
    train::check_same_channel(profile, &upstream)?;
    let mut graph = upstreams(state).await?;
    graph.remove(&id);
    if let Some(cycle) = train::cycle(&id, &up.profile_id(), |p| graph.get(p).cloned()) {
        return Err(bad_upstream(format!(
            "{:?} would close a cycle of upstreams: {}",
            up.profile_id(),
            cycle.join(" → ")
        )));
    }
    Ok(())
}

/// The profiles that follow `fleet`'s profile `name` (any of its profiles when `None`), from
/// other fleets only when a whole fleet goes.
async fn followers(state: &AppState, fleet: &str, name: Option<&str>) -> HttpResult<Vec<String>> {
    let mut found: Vec<String> = upstreams(state)
        .await?
        .into_iter()
        .filter(|(follower, upstream)| {
            let Some((f, p)) = train::split_profile_id(upstream) else {
                return false;
            };
            f == fleet
                && match name {
                    Some(name) => p == name,
                    None => train::split_profile_id(follower).is_none_or(|(ff, _)| ff != fleet),
                }
        })
        .map(|(follower, _)| follower)
        .collect();
    found.sort();
    Ok(found)
}

/// 409 when profiles follow `fleet`'s profile `name` (any of its profiles when `None`): `what`
/// says what was asked ("deleted", "change its channel").
pub async fn refuse_if_followed(
    state: &AppState,
    fleet: &str,
    name: Option<&str>,
    what: &str,
) -> HttpResult<()> {
    let followers = followers(state, fleet, name).await?;
    if followers.is_empty() {
        return Ok(());
    }
    let subject = match name {
        Some(name) => format!("auto-upgrade profile {name:?}"),
        None => format!("fleet {fleet:?}"),
    };
    Err(ApiError::conflict(format!(
        "{subject} cannot be {what}: it is the upstream of {} (SEMANTICS §14); change or delete {} first",
        followers.join(", "),
        if followers.len() == 1 { "it" } else { "them" }
    ))
    .into())
}

/// Where downstream `profile` stands now (SEMANTICS §14): what its upstream's runs validated,
/// as its channel takes it. `Nothing` for a profile that follows no upstream.
pub async fn promotion_now(state: &AppState, profile: &Profile) -> HttpResult<Promotion> {
    let Some(up) = &profile.upstream else {
        return Ok(Promotion::Nothing);
    };
    let validated = validated_runs(state, up).await?;
    Ok(train::promotion_for(
        profile,
        &validated,
        crate::clock::now(),
    ))
}

/// What the runs of `up`'s profile validated (SEMANTICS §14). A Completed run's verdict changes
/// only if it is rolled back: it is read once per version of its document.
pub async fn validated_runs(state: &AppState, up: &Upstream) -> HttpResult<Vec<Validated>> {
    let store = state.runs.store.as_ref();
    let profile_id = up.profile_id();
    let mut found = Vec::new();
    for (run, head) in crate::run_head::heads(store, &up.fleet).await? {
        if head.state() != "Completed" {
            continue;
        }
        let run_id = format!("/v1/fleets/{}/updateRuns/{run}", up.fleet);
        // Keyed by the document's eTag: a run rolled back since (`rolledBackBy`) is read again.
        let Some(etag) = store.etag(&up.fleet, Kind::Run, &run).await? else {
            continue;
        };
        let key = format!("{run_id}@{etag}");
        let cached = state
            .validations
            .lock()
            .ok()
            .and_then(|seen| seen.get(&key).cloned());
        let verdict = match cached {
            Some(verdict) => verdict,
            None => {
                let verdict = match store.get(&up.fleet, Kind::Run, &run).await? {
                    Some(doc) if doc.body["properties"]["autoUpgradeProfileId"] == *profile_id => {
                        serde_json::from_value::<UpdateRunStatus>(
                            doc.body["properties"]["status"].clone(),
                        )
                        .ok()
                        .and_then(|status| train::validated(&run_id, &status))
                    }
                    _ => None,
                };
                if let Ok(mut seen) = state.validations.lock() {
                    seen.insert(key, verdict.clone());
                }
                verdict
            }
        };
        found.extend(verdict);
    }
    Ok(found)
}
