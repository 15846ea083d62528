//! Observing members' clusters through their fleet's driver, off the request: what each is now, recorded in its status and told to the fleet's task.

use std::collections::BTreeMap;

use flotilla_engine::error::ApiError;
use flotilla_engine::fleet::{Cluster, Member};

use serde_json::{Value, json};

use crate::clock::now;
use crate::driver::MemberRef;
use crate::state::{AppState, Shared};
use crate::store::{Kind, Precondition};

/// Members just written (registered, imported, discovered): their clusters are observed in the
/// background and recorded, and each member observed is handed, with its group and labels, to
/// the task driving its fleet if one runs here: the fleet engine's member table (what freezes
/// and budgets cover, SEMANTICS §12) then holds it, whether or not a run selected it yet.
pub fn spawn_register(state: Shared, fleet: String, writes: &[crate::store::MemberWrite]) {
    // Each as written, its cluster still to be observed.
    let written: Vec<Member> = writes
        .iter()
        .map(|w| {
            let properties = &w.body["properties"];
            Member {
                name: w.name.clone(),
                cluster_resource_id: crate::store::member_cluster_id(&w.body).to_string(),
                group: properties["group"].as_str().map(String::from),
                labels: properties["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect::<BTreeMap<_, _>>(),
                cluster: Cluster::unknown(),
            }
        })
        .collect();
    crate::clock::spawn(async move {
        let asked = written
            .iter()
            .map(|m| (m.name.clone(), m.cluster_resource_id.clone()))
            .collect();
        let answers = match observe_members(&state, &fleet, asked).await {
            Ok(answers) => answers,
            Err(e) => {
                tracing::warn!(fleet, error = %e.message, "cannot observe the members written");
                return;
            }
        };
        // Only those observed: the table never holds a cluster nobody saw.
        let joined: Vec<Member> = written
            .into_iter()
            .zip(answers)
            .filter_map(|(member, (_, answer))| {
                Some(Member {
                    cluster: answer.ok()?,
                    ..member
                })
            })
            .collect();
        state.runs.members_joined(&fleet, joined).await;
    });
}

pub async fn observe_member(
    state: &AppState,
    fleet: &str,
    member: &str,
    id: &str,
) -> Result<Cluster, ApiError> {
    let asked = vec![(member.to_string(), id.to_string())];
    observe_members(state, fleet, asked)
        .await?
        .pop()
        .map(|(_, result)| result)
        .unwrap_or_else(|| {
            Err(ApiError::conflict(format!(
                "member {member:?} was not observed"
            )))
        })
}

/// How many members' clusters are asked of the driver at once.
pub const OBSERVE_AT_ONCE: usize = 16;

/// Observes members' clusters through the fleet's driver, [`OBSERVE_AT_ONCE`] at a time, and
/// records each answer in its member's `status` (`cluster` and `lastObservedAt`, or
/// `lastObservationError` beside a cluster observed before). Answers, in the order asked; the
/// clusters observed are recorded many to a transaction, so a fleet registered in a batch is
/// observed in seconds, not one sync to disk a member.
pub async fn observe_members(
    state: &AppState,
    fleet: &str,
    members: Vec<(String, String)>,
) -> Result<Vec<(String, Result<Cluster, ApiError>)>, ApiError> {
    let driver = state
        .runs
        .drivers
        .for_fleet(state.runs.store.as_ref(), fleet)
        .await?;
    let mut answers = Vec::with_capacity(members.len());
    for chunk in members.chunks(1000) {
        let mut asking = tokio::task::JoinSet::new();
        // By position, so every member asked gets an answer in its place, even one whose call
        // ended without one (a panic in the driver).
        let mut specs: Vec<Option<_>> = (0..chunk.len()).map(|_| None).collect();
        for (i, (name, id)) in chunk.iter().enumerate() {
            if asking.len() >= OBSERVE_AT_ONCE
                && let Some(Ok((k, spec))) = asking.join_next().await
            {
                specs[k] = Some(spec);
            }
            let (driver, member) = (
                driver.clone(),
                MemberRef {
                    name: name.clone(),
                    cluster_resource_id: id.clone(),
                },
            );
            asking.spawn(async move { (i, driver.observe(&member).await) });
        }
        while let Some(done) = asking.join_next().await {
            if let Ok((k, spec)) = done {
                specs[k] = Some(spec);
            }
        }
        let at = now();
        let mut observed = Vec::new();
        let mut failed = Vec::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let name = &chunk[i].0;
            let spec = spec.unwrap_or_else(|| {
                Err(crate::driver::DriverError::transient(
                    "the driver's call ended without an answer",
                ))
            });
            let (error, result) = match spec {
                Ok(spec) => match Cluster::parse(&spec, "cluster") {
                    Ok(cluster) => {
                        observed
                            .push((name.clone(), json!({"cluster": spec, "lastObservedAt": at})));
                        answers.push((name.clone(), Ok(cluster)));
                        continue;
                    }
                    Err(e) => (
                        json!({"code": "InvalidObservation", "message": e.message}),
                        Err(e),
                    ),
                },
                Err(e) => (
                    json!({"code": "ObservationFailed", "message": e.message}),
                    Err(ApiError::conflict(format!(
                        "member {name:?} cannot be observed: {}",
                        e.message
                    ))),
                ),
            };
            failed.push((name.clone(), error));
            answers.push((name.clone(), result));
        }
        if let Err(e) = state
            .runs
            .store
            .set_statuses(fleet, Kind::Member, &observed)
            .await
        {
            tracing::warn!(fleet, error = %e, "cannot record the members' clusters");
        }
        for (name, error) in failed {
            record_observation_error(state, fleet, &name, error, at).await;
        }
    }
    Ok(answers)
}

/// Records why a member could not be observed, keeping the cluster observed before if any.
pub async fn record_observation_error(
    state: &AppState,
    fleet: &str,
    member: &str,
    error: Value,
    at: flotilla_engine::time::Time,
) {
    let Ok(Some(current)) = state.runs.store.get(fleet, Kind::Member, member).await else {
        return;
    };
    let mut body = current.body;
    if body["properties"]["status"].get("cluster").is_none() {
        body["properties"]["status"] = json!({"lastObservationError": error, "lastObservedAt": at});
    } else {
        body["properties"]["status"]["lastObservationError"] = error;
    }
    let _ = state
        .runs
        .store
        .put(
            fleet,
            Kind::Member,
            member,
            &body,
            &Precondition::IfMatch(current.etag),
        )
        .await;
}

/// Refreshes `status.cluster` of every member, fleet by fleet, forever.
pub async fn observe_fleets(runs: std::sync::Arc<crate::runs::Runs>, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Ok(fleets) = runs.store.list("", Kind::Fleet, None, 100_000).await else {
            continue;
        };
        for fleet in fleets {
            // Only the replica driving a fleet observes it.
            if !runs.replica.holds(&fleet.name) {
                continue;
            }
            let Ok(driver) = runs
                .drivers
                .for_fleet(runs.store.as_ref(), &fleet.name)
                .await
            else {
                continue;
            };
            let mut after: Option<String> = None;
            while let Ok(page) = runs
                .store
                .list(&fleet.name, Kind::Member, after.as_deref(), 500)
                .await
            {
                let Some(last) = page.last() else { break };
                after = Some(last.name.clone());
                for member in page {
                    let id = member.body["properties"]["clusterResourceId"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let who = MemberRef {
                        name: member.name.clone(),
                        cluster_resource_id: id,
                    };
                    if let Ok(spec) = driver.observe(&who).await {
                        // The fleet's task, when one runs, records it and tells the runs that
                        // selected the member; otherwise it is recorded here.
                        if let Ok(cluster) =
                            flotilla_engine::fleet::Cluster::parse(&spec, "observation")
                            && runs.observed(&fleet.name, &member.name, cluster)
                        {
                            continue;
                        }
                        crate::runs::record_observation(
                            runs.store.as_ref(),
                            &fleet.name,
                            &member.name,
                            &spec,
                        )
                        .await;
                    }
                }
            }
        }
    }
}
