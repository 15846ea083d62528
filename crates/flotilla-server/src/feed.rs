//! The server's passes over every fleet, beside the fleets' tasks: the release feed (each
//! fleet's catalog read again: its runs told of new releases, its profiles triggered) and the
//! discoveries of fleets whose driver lists clusters on an interval.

use flotilla_engine::engine::Input;
use flotilla_engine::profile::{TriggerOutcome, already_recorded, trigger_status};
use flotilla_engine::time::Time;
use flotilla_engine::train::{Promotion, profile_id};
use serde_json::{Value, json};

use crate::api::{discover, generate_knowing};
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
/// the run is created and started, and the profile's status says so (SEMANTICS §8); a
/// downstream profile promotes what its upstream validated when the soak ends (§14). Answers
/// the next instant a soak ends, when the server should look again.
pub async fn trigger_profiles(state: &Shared) -> Option<Time> {
    let Ok(fleets) = state.runs.store.list("", Kind::Fleet, None, 100_000).await else {
        return None;
    };
    let mut wake: Option<Time> = None;
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
            // A downstream profile's standing: what it waits for, and until when.
            let upstream = match crate::trains::stored_profile(&profile.body) {
                Ok((_, p)) if p.upstream.is_some() => {
                    match crate::trains::promotion_now(state, &p).await {
                        Ok(standing) => Some(standing),
                        Err(_) => continue,
                    }
                }
                _ => None,
            };
            if let Some(at) = upstream.as_ref().and_then(Promotion::wakes_at) {
                wake = Some(wake.map_or(at, |w| w.min(at)));
            }
            let outcome = generate_knowing(
                state,
                &fleet.name,
                &profile.name,
                &Caller::system(),
                upstream.clone(),
            )
            .await;
            let outcome = match outcome {
                // Nothing selected yet (or disabled since it was listed) is not a failure.
                Ok(Err(_no_run)) => None,
                // A run the server created for a trigger but never started (a replica killed
                // between the two) is started now; one a user generated waits for the user.
                Ok(Ok(g)) if !g.created && !left_unstarted(state, &fleet.name, &g.run).await => {
                    None
                }
                Ok(Ok(g)) => {
                    let start = state.runs.act(&fleet.name, &g.run, Input::Start).await;
                    if upstream.is_some() && start.is_ok() {
                        promotion_started(state, &fleet.name, &profile.name, &g.run_id).await;
                    }
                    Some(TriggerOutcome::started(
                        g.run,
                        g.versions,
                        start.map_err(|e| e.message),
                    ))
                }
                Err(e) => Some(TriggerOutcome::not_created(e.code, e.message)),
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
            let status = &mut body["properties"]["autoUpgradeProfileStatus"];
            let was_upstream = status["upstream"].take();
            let mut changed = false;
            if let Some(outcome) = &outcome
                && !already_recorded(status, outcome)
            {
                *status = trigger_status(now(), outcome);
                changed = true;
            }
            let standing = upstream.as_ref().and_then(Promotion::status);
            if let Some(standing) = &standing {
                if standing["validatedBy"] != was_upstream["validatedBy"] {
                    promotion_scheduled(state, &fleet.name, &profile.name, standing).await;
                }
                changed |= *standing != was_upstream;
                status["upstream"] = standing.clone();
            } else if !was_upstream.is_null() {
                changed = true;
            }
            if !changed {
                continue;
            }
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
    wake
}

/// Whether `run` was created by the server's own trigger and never started.
async fn left_unstarted(state: &Shared, fleet: &str, run: &str) -> bool {
    let store = state.runs.store.as_ref();
    let not_started = crate::run_head::heads(store, fleet)
        .await
        .is_ok_and(|heads| {
            heads
                .iter()
                .any(|(r, h)| r == run && h.state() == "NotStarted")
        });
    not_started
        && store
            .get(fleet, crate::store::Kind::Run, run)
            .await
            .is_ok_and(|doc| {
                doc.is_some_and(|d| d.body["systemData"]["createdByType"] == "Application")
            })
}

/// A fleet's event about one of its profiles, in no run's log, for the webhooks that want it;
/// `id` makes it one delivery whichever replica reports it, however often.
async fn report_profile_event(state: &Shared, fleet: &str, id: &str, event: serde_json::Value) {
    if let Err(e) = state.runs.store.record_fleet_event(fleet, id, &event).await {
        tracing::warn!(fleet, error = %e, "cannot report a promotion to webhooks");
    }
}

/// A downstream profile's upstream validated a new target: it promotes when the soak ends.
async fn promotion_scheduled(state: &Shared, fleet: &str, profile: &str, standing: &Value) {
    let id = profile_id(fleet, profile);
    let event = json!({
        "type": "PromotionScheduled",
        "time": now(),
        "profile": id,
        "upstreamRun": standing["validatedBy"],
        "validatedTarget": standing["validatedTarget"],
        "soakEndsAt": standing["soakEndsAt"],
        "message": format!(
            "auto-upgrade profile {profile:?} promotes {} when the soak ends at {}",
            standing["validatedTarget"], standing["soakEndsAt"]
        ),
    });
    let key = format!(
        "{id}/scheduled/{}",
        standing["validatedBy"].as_str().unwrap_or_default()
    );
    report_profile_event(state, fleet, &key, event).await;
}

/// A downstream profile created and started its promoted run: reported to webhooks and kept in
/// the audit trail, as the system's write.
async fn promotion_started(state: &Shared, fleet: &str, profile: &str, run_id: &str) {
    let id = profile_id(fleet, profile);
    let event = json!({
        "type": "PromotionStarted",
        "time": now(),
        "profile": id,
        "updateRun": run_id,
        "message": format!("auto-upgrade profile {profile:?} started the promoted run {run_id}"),
    });
    report_profile_event(state, fleet, &format!("{id}/started/{run_id}"), event).await;
    let entry = crate::store::AuditEntry {
        id: 0,
        at: now().unix().saturating_mul(1000),
        subject: "system (release train)".into(),
        role: "admin".into(),
        method: "POST".into(),
        path: format!("{id}/generateUpdateRun"),
        fleet: Some(fleet.to_string()),
        status: 201,
        body: Some(json!({"updateRun": run_id}).to_string()),
    };
    if let Err(e) = state.runs.store.append_audit(&entry).await {
        tracing::warn!(fleet, error = %e, "cannot record a promotion in the audit trail");
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
