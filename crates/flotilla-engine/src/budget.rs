//! Disruption budgets (SEMANTICS §12): how many of the members a selector covers may be in
//! flight at once, across every run of the fleet, in each partition of a value (`region`,
//! `group`, `label:KEY`) or in one. The fleet engine splits the members into partitions against
//! its member table and counts the members in flight in each; a run is given both
//! ([`Budgets`], then the counts as they change) and asks them before each upgrade it sends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};
use crate::fleet::SharedMember;
use crate::selector::{Selector, validate_label_key};
use crate::strategy::{AmountText, MemberSelectorSpec};
use crate::threshold::Amount;

/// `properties` of a disruption budget (`P/disruptionBudgets/{name}`), as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<MemberSelectorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<AmountText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_value_of: Option<String>,
}

/// The value that splits a budget's members into partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PerValueOf {
    Region,
    /// The member's own `group` field.
    Group,
    Label(String),
}

impl PerValueOf {
    fn value<'a>(&self, member: &'a SharedMember) -> &'a str {
        self.value_in(
            &member.cluster.region,
            member.group.as_deref(),
            &member.labels,
        )
    }

    /// The partition's value for a member of this region, group and labels (empty when it
    /// lacks one).
    pub fn value_in<'a>(
        &self,
        region: &'a str,
        group: Option<&'a str>,
        labels: &'a BTreeMap<String, String>,
    ) -> &'a str {
        match self {
            PerValueOf::Region => region,
            PerValueOf::Group => group.unwrap_or_default(),
            PerValueOf::Label(key) => labels.get(key).map_or("", String::as_str),
        }
    }

    /// How a partition is named in a message: `in westeurope`, `where env=prod`.
    fn place(&self, value: &str) -> String {
        match (self, value) {
            (PerValueOf::Region, "") => "among members with no region".into(),
            (PerValueOf::Region, v) => format!("in {v}"),
            (PerValueOf::Group, "") => "among members with no group".into(),
            (PerValueOf::Group, v) => format!("in group {v}"),
            (PerValueOf::Label(k), "") => format!("among members without label {k}"),
            (PerValueOf::Label(k), v) => format!("where {k}={v}"),
        }
    }
}

/// A disruption budget, validated. Kept (and checkpointed) as its name and properties.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "BudgetWire", try_from = "BudgetWire")]
pub struct Budget {
    pub name: String,
    pub spec: BudgetSpec,
    /// `None`: every member of the fleet.
    pub selector: Option<Selector>,
    pub max_unavailable: Amount,
    pub per_value_of: Option<PerValueOf>,
}

#[derive(Serialize, Deserialize)]
struct BudgetWire {
    name: String,
    properties: BudgetSpec,
}

impl From<Budget> for BudgetWire {
    fn from(b: Budget) -> BudgetWire {
        BudgetWire {
            name: b.name,
            properties: b.spec,
        }
    }
}

impl TryFrom<BudgetWire> for Budget {
    type Error = String;
    fn try_from(w: BudgetWire) -> Result<Budget, String> {
        parse_budget(&w.name, &w.properties).map_err(|e| e.message)
    }
}

fn bad(field: &str, message: String) -> ApiError {
    let path = format!("properties.{field}");
    ApiError::new(
        ErrorCode::InvalidDisruptionBudget,
        format!("{path}: {message}"),
        path,
    )
}

/// Validates a budget's properties; each refusal names the field and the value.
pub fn parse_budget(name: &str, spec: &BudgetSpec) -> Result<Budget, ApiError> {
    let text = spec
        .max_unavailable
        .as_ref()
        .ok_or_else(|| bad("maxUnavailable", "is required: \"N\" or \"P%\"".into()))?;
    let max_unavailable = Amount::parse_concurrency(&text.0).ok_or_else(|| {
        bad(
            "maxUnavailable",
            format!(
                "{:?} must be a whole number ≥ 1 or a percentage from 1% to 100%",
                text.0
            ),
        )
    })?;
    let per_value_of = match spec.per_value_of.as_deref() {
        None => None,
        Some("region") => Some(PerValueOf::Region),
        Some("group") => Some(PerValueOf::Group),
        Some(other) => match other.strip_prefix("label:") {
            Some(key) => {
                validate_label_key(key).map_err(|why| {
                    bad("perValueOf", format!("{other:?}: label key {key:?}: {why}"))
                })?;
                Some(PerValueOf::Label(key.to_string()))
            }
            None => {
                return Err(bad(
                    "perValueOf",
                    format!("{other:?} must be region, group or label:KEY"),
                ));
            }
        },
    };
    let selector = crate::strategy::parse_selector(&spec.selector, "properties.selector")?;
    Ok(Budget {
        name: name.to_string(),
        spec: spec.clone(),
        selector,
        max_unavailable,
        per_value_of,
    })
}

/// One partition of one budget: the members it covers there, and the most of them that may be
/// in flight at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub budget: String,
    pub value: String,
    /// How messages name it (`in westeurope`); empty when the budget has one partition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub place: String,
    /// The fleet's members the budget covers in this partition, in a run or not.
    pub members: u64,
    /// `maxUnavailable` resolved against `members` (rounded down, never below 1).
    pub limit: u64,
}

/// A fleet's budgets split into partitions, with the partitions each member is in, worked out
/// by the fleet engine against its member table (runs hold no labels). Shared by every run of
/// the fleet; `in_flight` is the count in each partition when it was worked out (later counts
/// reach a run as they change).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    pub partitions: Vec<Partition>,
    /// Member → the partitions it is in, ascending (budgets in name order).
    pub covers: BTreeMap<Arc<str>, Box<[u32]>>,
    pub in_flight: Vec<u64>,
}

impl Budgets {
    /// The budgets of a fleet, by name, split over `members`; `disrupted` lists the members in
    /// flight in any run now.
    pub fn cover<'a>(
        budgets: &BTreeMap<String, Budget>,
        members: impl Iterator<Item = &'a SharedMember> + Clone,
        disrupted: impl Iterator<Item = &'a Arc<str>>,
    ) -> Budgets {
        let mut partitions = Vec::new();
        let mut covers: BTreeMap<Arc<str>, Vec<u32>> = BTreeMap::new();
        for budget in budgets.values() {
            let mut by_value: BTreeMap<&str, Vec<&Arc<str>>> = BTreeMap::new();
            for member in members.clone() {
                if budget
                    .selector
                    .as_ref()
                    .is_some_and(|s| !s.matches(&member.labels))
                {
                    continue;
                }
                let value = budget.per_value_of.as_ref().map_or("", |p| p.value(member));
                by_value.entry(value).or_default().push(&member.name);
            }
            for (value, names) in by_value {
                let p = partitions.len() as u32;
                let size = names.len() as u64;
                partitions.push(Partition {
                    budget: budget.name.clone(),
                    value: value.to_string(),
                    place: budget
                        .per_value_of
                        .as_ref()
                        .map(|per| format!(" {}", per.place(value)))
                        .unwrap_or_default(),
                    members: size,
                    limit: budget.max_unavailable.resolve_concurrency(size),
                });
                for name in names {
                    covers.entry(name.clone()).or_default().push(p);
                }
            }
        }
        let mut in_flight = vec![0; partitions.len()];
        for member in disrupted {
            for &p in covers.get(member).map_or(&[][..], |v| v.as_slice()) {
                in_flight[p as usize] += 1;
            }
        }
        Budgets {
            partitions,
            covers: covers
                .into_iter()
                .map(|(k, v)| (k, v.into_boxed_slice()))
                .collect(),
            in_flight,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// The partitions `member` is in.
    pub fn partitions_of(&self, member: &str) -> &[u32] {
        self.covers.get(member).map_or(&[], |p| p)
    }

    /// Why a member waits for partition `p`, `in_flight` of its members being in flight:
    /// `disruption budget "prod-per-region": 1 of 1 in flight in westeurope`.
    pub fn message(&self, p: u32, in_flight: u64) -> String {
        let part = &self.partitions[p as usize];
        format!(
            "disruption budget {:?}: {in_flight} of {} in flight{}",
            part.budget, part.limit, part.place
        )
    }

    /// Each budget's partitions with the members in flight in each, for a budget's status.
    pub fn status(&self, in_flight: &[u64]) -> HashMap<&str, Vec<(&Partition, u64)>> {
        let mut out: HashMap<&str, Vec<(&Partition, u64)>> = HashMap::new();
        for (p, part) in self.partitions.iter().enumerate() {
            let n = in_flight.get(p).copied().unwrap_or_default();
            out.entry(part.budget.as_str()).or_default().push((part, n));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Cluster, Member};

    fn budget(json: &str) -> Result<Budget, ApiError> {
        parse_budget("b", &serde_json::from_str(json).expect("shape"))
    }

    fn member(name: &str, region: &str, group: Option<&str>, labels: &[(&str, &str)]) -> Member {
        let mut cluster = Cluster::unknown();
        cluster.region = region.into();
        Member {
            name: name.into(),
            cluster_resource_id: format!("/c/{name}"),
            group: group.map(str::to_string),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cluster,
        }
    }

    #[test]
    fn members_split_into_partitions_and_percentages_round_down_to_one() {
        let members: Vec<SharedMember> = [
            member("e1", "eastus", Some("a"), &[("env", "prod")]),
            member("e2", "eastus", Some("a"), &[("env", "prod")]),
            member("e3", "eastus", None, &[("env", "test")]),
            member("w1", "westeurope", Some("b"), &[("env", "prod")]),
            member("x1", "", Some("b"), &[]),
        ]
        .iter()
        .map(SharedMember::from)
        .collect();
        let mut budgets = BTreeMap::new();
        for (name, json) in [
            (
                "a-region",
                r#"{"maxUnavailable":"50%","perValueOf":"region"}"#,
            ),
            (
                "b-prod",
                r#"{"maxUnavailable":"2","selector":{"byLabel":"env=prod"}}"#,
            ),
            (
                "c-env",
                r#"{"maxUnavailable":"10%","perValueOf":"label:env"}"#,
            ),
            ("d-group", r#"{"maxUnavailable":"1","perValueOf":"group"}"#),
        ] {
            let b = parse_budget(name, &serde_json::from_str(json).unwrap()).unwrap();
            budgets.insert(name.to_string(), b);
        }
        let disrupted: Vec<Arc<str>> = vec!["e1".into(), "w1".into()];
        let view = Budgets::cover(&budgets, members.iter(), disrupted.iter());
        let shown: Vec<(String, String, u64, u64, u64)> = view
            .partitions
            .iter()
            .zip(&view.in_flight)
            .map(|(p, n)| (p.budget.clone(), p.value.clone(), p.members, p.limit, *n))
            .collect();
        let s = |b: &str, v: &str, m, l, n| (b.to_string(), v.to_string(), m, l, n);
        assert_eq!(
            shown,
            vec![
                // 50% of 1 rounds down to 0, never below 1.
                s("a-region", "", 1, 1, 0),
                s("a-region", "eastus", 3, 1, 1),
                s("a-region", "westeurope", 1, 1, 1),
                s("b-prod", "", 3, 2, 2),
                s("c-env", "", 1, 1, 0),
                s("c-env", "prod", 3, 1, 2),
                s("c-env", "test", 1, 1, 0),
                s("d-group", "", 1, 1, 0),
                s("d-group", "a", 2, 1, 1),
                s("d-group", "b", 2, 1, 1),
            ]
        );
        assert_eq!(view.partitions_of("e1"), &[1, 3, 5, 8]);
        assert_eq!(view.partitions_of("nobody"), &[] as &[u32]);
        assert_eq!(
            view.message(2, 1),
            "disruption budget \"a-region\": 1 of 1 in flight in westeurope"
        );
        assert_eq!(
            view.message(3, 2),
            "disruption budget \"b-prod\": 2 of 2 in flight"
        );
        assert_eq!(
            view.message(4, 1),
            "disruption budget \"c-env\": 1 of 1 in flight among members without label env"
        );
    }

    #[test]
    fn refusals_name_the_field_and_value() {
        for (json, target, says) in [
            (r#"{}"#, "properties.maxUnavailable", "required"),
            (
                r#"{"maxUnavailable":"0"}"#,
                "properties.maxUnavailable",
                "\"0\"",
            ),
            (
                r#"{"maxUnavailable":"101%"}"#,
                "properties.maxUnavailable",
                "101%",
            ),
            (
                r#"{"maxUnavailable":"1","perValueOf":"zone"}"#,
                "properties.perValueOf",
                "zone",
            ),
            (
                r#"{"maxUnavailable":"1","perValueOf":"label:"}"#,
                "properties.perValueOf",
                "label:",
            ),
            (
                r#"{"maxUnavailable":"1","selector":{"byLabel":"env in ()"}}"#,
                "properties.selector.byLabel",
                "env in ()",
            ),
        ] {
            let err = budget(json).expect_err(json);
            assert_eq!(err.target, target, "{json}: {}", err.message);
            assert!(err.message.contains(says), "{json}: {}", err.message);
        }
        assert!(serde_json::from_str::<BudgetSpec>(r#"{"maxUnavailable":"1","x":1}"#).is_err());
        // A number is read as the API's strings are.
        assert_eq!(
            budget(r#"{"maxUnavailable":3}"#).unwrap().max_unavailable,
            Amount::Count(3)
        );
    }
}
