//! The server's passes over every fleet, beside the fleets' tasks: the release feed (each
//! fleet's catalog read again: its runs told of new releases, its profiles triggered) and the
//! discoveries of fleets whose driver lists clusters on an interval.

use flotilla_engine::engine::Input;
use flotilla_engine::profile::{TriggerOutcome, already_recorded, trigger_status};

use crate::api::{discover, generate};
use crate::auth::Caller;
use crate::clock::now;
use crate::state::Shared;
use crate::store::{Kind, Precondition};

/// When a fleet's catalog changes, its unfinished runs are told (`CatalogChanged`, logged like
/// any input): a member waiting for a version to be released in its region starts once it is.
async fn tell_runs_of_new_releases(state: &Shared, fleet: &str) {
    let Ok(driver) = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await
    else {
        return;
    };
    // A driver changed through another replica reaches this one's runs within a pass, and so
    // do its freezes.
    state.runs.use_driver(fleet, &driver);
    state.runs.rules_changed(fleet).await;
    let Ok(catalog) = driver.catalog().await else {
        return;
    };
    // The first look (after a start, or after taking the fleet over from another replica)
    // counts as a change: the catalog may have moved while nobody was watching.
    let changed = match state.catalogs.lock() {
        Ok(mut seen) => seen
            .insert(fleet.to_string(), catalog.clone())
            .is_none_or(|before| before != catalog),
        Err(_) => false,
    };
    if !changed {
        return;
    }
    let Ok(runs) = crate::run_head::heads(state.runs.store.as_ref(), fleet).await else {
        return;
    };
    // Every run that is not over hears it, by the fleet engine's rule: a Failed run whose
    // members are still in flight too (it was skipped here before).
    for (run, head) in runs {
        if !head.is_over() {
            let _ = state
                .runs
                .act(fleet, &run, Input::CatalogChanged(catalog.clone()))
                .await;
        }
    }
}

/// Profiles trigger by themselves: when a profile's channel selects a target it has no run for,
/// the run is created and started, and the profile's status says so (SEMANTICS §8).
pub async fn trigger_profiles(state: &Shared) {
    let Ok(fleets) = state.runs.store.list("", Kind::Fleet, None, 100_000).await else {
        return;
    };
    for fleet in fleets {
        // Only the replica driving a fleet tells its runs and triggers its profiles.
        if !state.runs.replica.holds(&fleet.name) {
            continue;
        }
        tell_runs_of_new_releases(state, &fleet.name).await;
        let Ok(profiles) = state
            .runs
            .store
            .list(&fleet.name, Kind::Profile, None, 100_000)
            .await
        else {
            continue;
        };
        for profile in profiles {
            if profile.body["properties"]["disabled"].as_bool() == Some(true) {
                continue;
            }
            let outcome = generate(state, &fleet.name, &profile.name, &Caller::system()).await;
            let outcome = match outcome {
                // Nothing selected yet (or disabled since it was listed) is not a failure.
                Ok(Err(_no_run)) => continue,
                Ok(Ok(g)) if !g.created => continue,
                Ok(Ok(g)) => {
                    let start = state.runs.act(&fleet.name, &g.run, Input::Start).await;
                    TriggerOutcome::started(g.run, g.versions, start.map_err(|e| e.message))
                }
                Err(e) => TriggerOutcome::not_created(e.code, e.message),
            };
            let Ok(Some(current)) = state
                .runs
                .store
                .get(&fleet.name, Kind::Profile, &profile.name)
                .await
            else {
                continue;
            };
            let mut body = current.body.clone();
            if already_recorded(&body["properties"]["autoUpgradeProfileStatus"], &outcome) {
                continue;
            }
            body["properties"]["autoUpgradeProfileStatus"] = trigger_status(now(), &outcome);
            let _ = state
                .runs
                .store
                .put(
                    &fleet.name,
                    Kind::Profile,
                    &profile.name,
                    &body,
                    &Precondition::IfMatch(current.etag),
                )
                .await;
        }
    }
}

/// The server's own discoveries: every fleet this replica drives whose driver discovers on an
/// interval, when its interval has passed since the last.
pub async fn discover_due(
    state: &Shared,
    last: &mut std::collections::HashMap<String, std::time::Instant>,
) {
    let Ok(fleets) = state.runs.store.list("", Kind::Fleet, None, 100_000).await else {
        return;
    };
    for fleet in fleets {
        if !state.runs.replica.holds(&fleet.name) {
            continue;
        }
        let Ok(driver) = state
            .runs
            .drivers
            .for_fleet(state.runs.store.as_ref(), &fleet.name)
            .await
        else {
            continue;
        };
        let Some(every) = driver.discover_every() else {
            continue;
        };
        if last.get(&fleet.name).is_some_and(|t| t.elapsed() < every) {
            continue;
        }
        last.insert(fleet.name.clone(), std::time::Instant::now());
        match discover(state, &fleet.name, &Caller::system()).await {
            Ok(o) => tracing::info!(
                fleet = fleet.name,
                added = o.added.len(),
                updated = o.updated.len(),
                vanished = o.vanished.len(),
                "discovered members"
            ),
            Err(e) => tracing::warn!(fleet = fleet.name, error = ?e, "discovery failed"),
        }
    }
}
