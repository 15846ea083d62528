//! Members found by the fleet's driver (API.md, the `aks` driver's `discover`): what a
//! discovery means for a fleet, worked out without I/O (`api::discover` asks the driver and
//! writes the result). Clusters found become members (named from the cluster, labelled from its
//! tags, grouped by a tag); members already there are updated; a member whose cluster is no
//! longer found is reported in its status (`status.discovery`), never removed.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use flotilla_engine::selector::{validate_label_key, validate_label_value};
use flotilla_engine::strategy::check_name;
use flotilla_engine::time::Time;

use crate::driver::{Discovered, Discovery};
use crate::store::Resource;

/// The longest member name (API.md).
const NAME_MAX: usize = 50;

/// What a discovery did, by member name.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub vanished: Vec<String>,
}

/// A member's name from its cluster's: lowercase, `_` as `-`, at most 50 characters; with `-`
/// and six hex digits of a hash of the ARM id when another cluster would have the same.
pub fn member_name(cluster: &str, id: &str, taken: impl Fn(&str) -> bool) -> String {
    let plain: String = cluster
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let trim = |s: &str, max: usize| {
        s.chars()
            .take(max)
            .collect::<String>()
            .trim_matches('-')
            .to_string()
    };
    let name = trim(&plain, NAME_MAX);
    if !name.is_empty() && check_name(&name, NAME_MAX).is_ok() && !taken(&name) {
        return name;
    }
    let hash = Sha256::digest(id.to_ascii_lowercase().as_bytes());
    let suffix: String = hash.iter().take(3).map(|b| format!("{b:02x}")).collect();
    let base = trim(&plain, NAME_MAX - 7);
    if base.is_empty() {
        format!("cluster-{suffix}")
    } else {
        format!("{base}-{suffix}")
    }
}

/// A found cluster's labels (its tags that are valid labels) and group (the group tag's value),
/// and the tags that could not be labels.
fn labels_of(
    cluster: &Discovered,
    group_tag: Option<&str>,
) -> (BTreeMap<String, String>, Option<String>, Vec<String>) {
    let mut labels = BTreeMap::new();
    let mut left = Vec::new();
    let mut group = None;
    for (key, value) in &cluster.tags {
        if Some(key.as_str()) == group_tag {
            if check_name(value, 50).is_ok() {
                group = Some(value.clone());
            } else {
                left.push(key.clone());
            }
            continue;
        }
        if validate_label_key(key).is_ok() && validate_label_value(value).is_ok() {
            labels.insert(key.clone(), value.clone());
        } else {
            left.push(key.clone());
        }
    }
    (labels, group, left)
}

/// What a discovery changes: the members to write (name and body, `{"properties": …}`) and
/// the statuses to set, and what it tells.
#[derive(Debug, Default)]
pub struct Plan {
    pub outcome: Outcome,
    pub upserts: Vec<(String, Value)>,
    pub statuses: Vec<(String, Value)>,
}

/// What `found` means for a fleet of `members`, at `at`: a cluster found is a member (the one
/// with its cluster id, else a new one named after it) labelled and grouped from its tags; a
/// member under a scope searched whose cluster was not found has vanished.
pub fn plan(found: &Discovery, members: &[Resource], at: Time) -> Plan {
    let by_cluster: HashMap<String, &Resource> = members
        .iter()
        .filter_map(|m| {
            let id = m.body["properties"]["clusterResourceId"].as_str()?;
            Some((id.to_ascii_lowercase(), m))
        })
        .collect();
    let mut names: HashSet<String> = members.iter().map(|m| m.name.clone()).collect();
    let mut plan = Plan::default();
    let mut seen = HashSet::new();
    for cluster in &found.clusters {
        let key = cluster.cluster_resource_id.to_ascii_lowercase();
        if !seen.insert(key.clone()) {
            continue;
        }
        let (labels, group, left) = labels_of(cluster, found.group_tag.as_deref());
        let existing = by_cluster.get(&key);
        let name = match existing {
            Some(m) => m.name.clone(),
            None => {
                let name = member_name(&cluster.name, &cluster.cluster_resource_id, |n| {
                    names.contains(n)
                });
                names.insert(name.clone());
                name
            }
        };
        let changed = match existing {
            None => true,
            Some(m) => {
                let p = &m.body["properties"];
                p["labels"] != json!(labels) || p["group"].as_str() != group.as_deref()
            }
        };
        if changed {
            let mut body = json!({"properties": {"clusterResourceId": cluster.cluster_resource_id, "labels": labels}});
            if let Some(g) = &group {
                body["properties"]["group"] = json!(g);
            }
            plan.upserts.push((name.clone(), body));
            if existing.is_some() {
                plan.outcome.updated.push(name.clone());
            } else {
                plan.outcome.added.push(name.clone());
            }
        }
        // Found: what discovery says of it (tags it could not take), and no longer vanished.
        let discovery = (!left.is_empty()).then(|| json!({"checkedAt": at, "tagsNotLabels": left}));
        let had = existing.map(|m| &m.body["properties"]["status"]["discovery"]);
        match (existing, had) {
            (Some(m), Some(had)) if !same_finding(had, discovery.as_ref()) => {
                plan.statuses
                    .push((name.clone(), status_with(m, discovery)));
            }
            (None, _) if discovery.is_some() => {
                plan.statuses
                    .push((name.clone(), json!({"discovery": discovery})));
            }
            _ => {}
        }
    }
    // Members under a scope searched whose cluster was not found: reported, never removed.
    for m in members {
        let Some(id) = m.body["properties"]["clusterResourceId"].as_str() else {
            continue;
        };
        let id = id.to_ascii_lowercase();
        let searched = found.scopes.iter().any(|s| id.starts_with(s.as_str()));
        if !searched || seen.contains(&id) {
            continue;
        }
        plan.outcome.vanished.push(m.name.clone());
        if m.body["properties"]["status"]["discovery"]["vanished"] != true {
            let discovery = json!({"checkedAt": at, "vanished": true, "message": "the cluster was not found where discovery looks; the member is kept"});
            plan.statuses
                .push((m.name.clone(), status_with(m, Some(discovery))));
        }
    }
    plan
}

/// Whether a member's recorded finding says what a new one says, whenever each was made.
fn same_finding(had: &Value, now: Option<&Value>) -> bool {
    let without_time = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("checkedAt");
        }
        v
    };
    match now {
        None => had.is_null(),
        Some(n) => without_time(had) == without_time(n),
    }
}

/// A member's status with its `discovery` replaced (`None`: null; the store keeps the field
/// across observations, so it is cleared by writing it).
fn status_with(member: &Resource, discovery: Option<Value>) -> Value {
    let mut status = member.body["properties"]["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    status["discovery"] = discovery.unwrap_or(Value::Null);
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_come_from_cluster_names_and_stay_unique() {
        let none = |_: &str| false;
        assert_eq!(
            member_name("Store_042-East", "/x/a", none),
            "store-042-east"
        );
        let long = "a".repeat(70);
        assert_eq!(member_name(&long, "/x/a", none).len(), 50);
        let taken = |n: &str| n == "store-1";
        let a = member_name("store-1", "/subscriptions/s1/x/store-1", taken);
        let b = member_name("STORE_1", "/subscriptions/s2/x/store_1", taken);
        assert!(
            a.starts_with("store-1-") && a.len() == "store-1-".len() + 6,
            "{a}"
        );
        assert_ne!(a, b, "another id, another suffix");
        assert_eq!(
            a,
            member_name("store-1", "/SUBSCRIPTIONS/S1/x/STORE-1", taken),
            "ids compare in any case"
        );
        assert!(member_name("___", "/x/a", none).starts_with("cluster-"));
    }

    #[test]
    fn tags_become_labels_where_they_can_and_the_group_tag_the_group() {
        let cluster = Discovered {
            cluster_resource_id: "/x".into(),
            name: "c".into(),
            tags: [
                ("env", "prod"),
                ("update-group", "ring-1"),
                ("Cost Center", "42"),
                ("owner", "team a"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        };
        let (labels, group, left) = labels_of(&cluster, Some("update-group"));
        assert_eq!(
            labels.into_iter().collect::<Vec<_>>(),
            vec![("env".to_string(), "prod".to_string())]
        );
        assert_eq!(group.as_deref(), Some("ring-1"));
        assert_eq!(left, ["Cost Center", "owner"]);
    }
}
