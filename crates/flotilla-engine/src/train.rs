//! Release trains (SEMANTICS §14): a profile that names an upstream profile triggers only on
//! what a run of the upstream validated, once a soak after it is over, and pins exactly what
//! was validated. Pure: the shells gather the upstream's runs and ask when to trigger.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorCode};
use crate::profile::{Channel, ChannelTarget, GeneratedRun, Profile, generated_run};
use crate::status::{PromotedFrom, State, UpdateRunStatus};
use crate::time::Time;
use crate::version::{ImageVersion, KubeVersion, split_family_version};

/// A soak of 7 days unless the profile says otherwise.
pub const DEFAULT_SOAK_SECONDS: u64 = 7 * 24 * 3600;

/// The longest soak accepted: a year.
pub const MAX_SOAK_SECONDS: u64 = 365 * 24 * 3600;

/// `properties.upstream` as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamSpec {
    #[serde(default)]
    pub profile_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_seconds: Option<i64>,
}

/// The upstream profile of a release train, validated.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Upstream {
    pub fleet: String,
    pub profile: String,
    pub soak_seconds: u64,
}

impl Upstream {
    /// The upstream profile's id, as the API names it.
    pub fn profile_id(&self) -> String {
        profile_id(&self.fleet, &self.profile)
    }
}

/// A profile's id, as the API names it.
pub fn profile_id(fleet: &str, profile: &str) -> String {
    format!("/v1/fleets/{fleet}/autoUpgradeProfiles/{profile}")
}

fn bad(field: &str, message: String) -> ApiError {
    let target = format!("properties.upstream.{field}");
    ApiError::new(
        ErrorCode::InvalidRequestContent,
        format!("{target}: {message}"),
        target,
    )
}

/// Reads `properties.upstream`: a profile id (`/v1/fleets/F/autoUpgradeProfiles/P`, or the
/// ARM form ending in `/fleets/F/autoUpgradeProfiles/P`) and a soak of 0 to 365 days.
pub fn parse_upstream(spec: &UpstreamSpec) -> Result<Upstream, ApiError> {
    let id = spec
        .profile_id
        .as_deref()
        .ok_or_else(|| bad("profileId", "is required".into()))?;
    let (fleet, profile) = split_profile_id(id).ok_or_else(|| {
        bad(
            "profileId",
            format!("{id:?} must name a profile: /v1/fleets/FLEET/autoUpgradeProfiles/PROFILE"),
        )
    })?;
    let soak_seconds = match spec.soak_seconds {
        None => DEFAULT_SOAK_SECONDS,
        Some(s) if (0..=MAX_SOAK_SECONDS as i64).contains(&s) => s as u64,
        Some(s) => {
            return Err(bad(
                "soakSeconds",
                format!("{s} must be between 0 and {MAX_SOAK_SECONDS} (365 days)"),
            ));
        }
    };
    Ok(Upstream {
        fleet,
        profile,
        soak_seconds,
    })
}

/// The fleet and profile names of a profile id, if it is one.
pub fn split_profile_id(id: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = id.trim_end_matches('/').split('/').collect();
    let n = parts.len();
    if n < 5
        || !parts[n - 4].eq_ignore_ascii_case("fleets")
        || !parts[n - 2].eq_ignore_ascii_case("autoUpgradeProfiles")
    {
        return None;
    }
    // The /v1 form is exactly that; the ARM form is
    // `/subscriptions/S/resourceGroups/G/providers/Microsoft.ContainerService/fleets/F/…`.
    let prefix = &parts[..n - 4];
    let v1 = prefix == ["", "v1"];
    let arm = match prefix {
        ["", subscriptions, s, groups, g, providers, provider] => {
            subscriptions.eq_ignore_ascii_case("subscriptions")
                && groups.eq_ignore_ascii_case("resourceGroups")
                && providers.eq_ignore_ascii_case("providers")
                && provider.eq_ignore_ascii_case("Microsoft.ContainerService")
                && [s, g].iter().all(|part| {
                    !part.is_empty()
                        && part.len() <= 90
                        && part.chars().all(|c| c.is_ascii_graphic())
                })
        }
        _ => false,
    };
    let (fleet, profile) = (parts[n - 3], parts[n - 1]);
    let named = |name: &str| crate::strategy::check_name(name, 63).is_ok();
    ((v1 || arm) && named(fleet) && named(profile))
        .then(|| (fleet.to_string(), profile.to_string()))
}

/// A run of an upstream profile that validated its target (SEMANTICS §14).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Validated {
    pub run_id: String,
    pub completed_time: Time,
    pub kubernetes_version: Option<KubeVersion>,
    /// Per family, the oldest image its members ended on.
    pub node_images: BTreeMap<String, ImageVersion>,
}

impl Validated {
    /// What it validated, as a profile's status lists versions.
    pub fn target(&self) -> ChannelTarget {
        ChannelTarget::Promoted {
            kubernetes: self.kubernetes_version,
            node_images: self.node_images.clone(),
        }
    }
}

/// What a run validated, from its status: `None` unless it Completed with no member failed,
/// nothing skipped by a user and at least one member upgraded by an operation.
pub fn validated(run_id: &str, status: &UpdateRunStatus) -> Option<Validated> {
    let ended = status.ended_on.as_ref()?;
    let completed_time = status.status.completed_time?;
    // A run rolled back since (SEMANTICS §15) undid what it validated.
    if status.status.state != State::Completed
        || !ended.validates
        || status.rolled_back_by.is_some()
    {
        return None;
    }
    let node_images = ended
        .node_image_versions
        .iter()
        .filter_map(|i| {
            let (family, version) = split_family_version(&i.version)?;
            Some((family.to_string(), ImageVersion::parse(version)?))
        })
        .collect();
    Some(Validated {
        run_id: run_id.to_string(),
        completed_time,
        kubernetes_version: ended.kubernetes_version,
        node_images,
    })
}

/// Where a downstream profile stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Promotion {
    /// Its upstream validated nothing yet.
    Nothing,
    /// The newest validated target soaks until `soak_ends_at`.
    Soaking {
        validated: Validated,
        soak_ends_at: Time,
    },
    /// The newest validated target's soak is over: it promotes (once: its run's name is
    /// deterministic).
    Due {
        validated: Validated,
        soak_ends_at: Time,
    },
}

/// The promotion at `now` (SEMANTICS §14): the newest validated run (by completion, then id)
/// completed by `now` is the candidate, and it promotes once `soak_seconds` have passed since;
/// an older one never promotes while a newer one soaks.
pub fn promotion(validated: &[Validated], soak_seconds: u64, now: Time) -> Promotion {
    let newest = validated
        .iter()
        .filter(|v| v.completed_time <= now)
        .max_by(|a, b| (a.completed_time, &a.run_id).cmp(&(b.completed_time, &b.run_id)));
    let Some(v) = newest else {
        return Promotion::Nothing;
    };
    let soak_ends_at = Time::from_unix(v.completed_time.unix().saturating_add(soak_seconds as i64));
    if now >= soak_ends_at {
        Promotion::Due {
            validated: v.clone(),
            soak_ends_at,
        }
    } else {
        Promotion::Soaking {
            validated: v.clone(),
            soak_ends_at,
        }
    }
}

/// The promotion of downstream `profile` at `now`: [`promotion`] over the validated runs its
/// channel would select (an upstream may have changed its channel while nobody followed it:
/// its older runs promote nothing a follower's channel does not take).
pub fn promotion_for(profile: &Profile, validated: &[Validated], now: Time) -> Promotion {
    let Some(up) = &profile.upstream else {
        return Promotion::Nothing;
    };
    let selected: Vec<Validated> = validated
        .iter()
        .filter(|v| selects(profile.channel, v))
        .cloned()
        .collect();
    promotion(&selected, up.soak_seconds, now)
}

/// Whether a validated run's target is one `channel` upgrades to.
fn selects(channel: Channel, v: &Validated) -> bool {
    match (channel, v.kubernetes_version) {
        (Channel::NodeImage | Channel::SecurityPatch, kube) => kube.is_none(),
        (Channel::Rapid | Channel::Stable, kube) => kube.is_some(),
        (Channel::TargetKubernetesVersion { major, minor, .. }, Some(kube)) => {
            kube.minor_line() == (major, minor)
        }
        (Channel::TargetKubernetesVersion { .. }, None) => false,
    }
}

impl Promotion {
    /// The profile status's `upstream` (API.md): what it waits for and when its soak ends;
    /// `None` when nothing is validated yet.
    pub fn status(&self) -> Option<Value> {
        let (v, ends) = match self {
            Promotion::Nothing => return None,
            Promotion::Soaking {
                validated,
                soak_ends_at,
            }
            | Promotion::Due {
                validated,
                soak_ends_at,
            } => (validated, soak_ends_at),
        };
        Some(json!({
            "validatedTarget": v.target().versions(),
            "validatedAt": v.completed_time,
            "validatedBy": v.run_id,
            "soakEndsAt": ends,
        }))
    }

    /// When the shell should look again: the end of a soak still running.
    pub fn wakes_at(&self) -> Option<Time> {
        match self {
            Promotion::Soaking { soak_ends_at, .. } => Some(*soak_ends_at),
            _ => None,
        }
    }
}

/// The run a downstream profile generates for what its upstream validated: exactly its
/// Kubernetes version and, where the fleet's driver can pin them, the node images its members
/// ended on.
pub fn promoted_run(
    profile_name: &str,
    profile: &Profile,
    catalog: &crate::fleet::Catalog,
    validated: &Validated,
    pins_images: bool,
) -> (GeneratedRun, PromotedFrom) {
    let target = ChannelTarget::Promoted {
        kubernetes: validated.kubernetes_version,
        node_images: if pins_images {
            validated.node_images.clone()
        } else {
            BTreeMap::new()
        },
    };
    let mut run = generated_run(profile_name, profile, catalog, target);
    // Named after what was validated, not what is pinned: where images cannot be pinned, two
    // validated targets of one Kubernetes version (or none) are still two promotions.
    run.name = validated.target().run_name(profile_name);
    let from = PromotedFrom {
        run_id: validated.run_id.clone(),
        completed_time: validated.completed_time,
        images_pinned: pins_images && !validated.node_images.is_empty(),
    };
    (run, from)
}

/// Whether a downstream profile may follow its upstream (SEMANTICS §14): the same channel,
/// and for TargetKubernetesVersion the same target.
pub fn check_same_channel(downstream: &Profile, upstream: &Profile) -> Result<(), ApiError> {
    if same_channel(downstream.channel, upstream.channel) {
        return Ok(());
    }
    let name = |c: Channel| match c {
        Channel::Rapid => "Rapid".to_string(),
        Channel::Stable => "Stable".to_string(),
        Channel::NodeImage => "NodeImage".to_string(),
        Channel::SecurityPatch => "SecurityPatch".to_string(),
        Channel::TargetKubernetesVersion { major, minor, .. } => {
            format!("TargetKubernetesVersion {major}.{minor}")
        }
    };
    Err(ApiError::new(
        ErrorCode::InvalidRequestContent,
        format!(
            "properties.channel: {} must be the upstream profile's channel ({})",
            name(downstream.channel),
            name(upstream.channel)
        ),
        "properties.channel",
    ))
}

/// Whether two channels are the same for a release train: TargetKubernetesVersion with the same
/// target (whether long-term support is asked for or not).
pub fn same_channel(a: Channel, b: Channel) -> bool {
    let target = |c: Channel| match c {
        Channel::TargetKubernetesVersion { major, minor, .. } => Some((major, minor)),
        _ => None,
    };
    std::mem::discriminant(&a) == std::mem::discriminant(&b) && target(a) == target(b)
}

/// The cycle a profile's upstream would close, if any: `upstream_of` answers a profile id's
/// upstream id. Answers the ids around the cycle, starting and ending with `profile`.
pub fn cycle(
    profile: &str,
    upstream: &str,
    upstream_of: impl Fn(&str) -> Option<String>,
) -> Option<Vec<String>> {
    let mut path = vec![profile.to_string()];
    let mut seen = BTreeSet::new();
    let mut at = Some(upstream.to_string());
    while let Some(id) = at {
        path.push(id.clone());
        if id == profile {
            return Some(path);
        }
        if !seen.insert(id.clone()) {
            // A cycle that does not pass through this profile was refused when it was made.
            return None;
        }
        at = upstream_of(&id);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(run: &str, completed: i64) -> Validated {
        Validated {
            run_id: run.into(),
            completed_time: Time::from_unix(completed),
            kubernetes_version: KubeVersion::parse("1.31.2"),
            node_images: BTreeMap::new(),
        }
    }

    #[test]
    fn the_newest_validated_run_promotes_at_its_soak_end() {
        let runs = [v("a", 100), v("b", 200)];
        assert_eq!(
            promotion(&runs, 50, Time::from_unix(99)),
            Promotion::Nothing
        );
        // At 160 `a`'s soak is over and `b` is not validated yet: `a` is due.
        assert!(matches!(
            promotion(&runs, 50, Time::from_unix(160)),
            Promotion::Due { validated, .. } if validated.run_id == "a"
        ));
        // Once `b` completed, `a` never promotes: `b` soaks until 250.
        let soaking = promotion(&runs, 50, Time::from_unix(249));
        assert_eq!(soaking.wakes_at(), Some(Time::from_unix(250)));
        assert!(matches!(
            promotion(&runs, 50, Time::from_unix(250)),
            Promotion::Due { validated, soak_ends_at } if validated.run_id == "b" && soak_ends_at == Time::from_unix(250)
        ));
    }

    #[test]
    fn profile_ids_in_both_forms_and_refusals() {
        let parse = |id: &str, soak: Option<i64>| {
            parse_upstream(&UpstreamSpec {
                profile_id: Some(id.into()),
                soak_seconds: soak,
            })
        };
        let up = parse("/v1/fleets/staging/autoUpgradeProfiles/rapid", None).expect("v1");
        assert_eq!(
            (up.fleet.as_str(), up.profile.as_str()),
            ("staging", "rapid")
        );
        assert_eq!(up.soak_seconds, DEFAULT_SOAK_SECONDS);
        let arm = "/subscriptions/s/resourceGroups/g/providers/Microsoft.ContainerService/fleets/dev/autoUpgradeProfiles/p";
        assert_eq!(parse(arm, Some(0)).expect("arm").fleet, "dev");
        for (id, soak, field) in [
            ("/v1/fleets/staging", None, "properties.upstream.profileId"),
            (
                "/v1/fleets/Staging!/autoUpgradeProfiles/p",
                None,
                "properties.upstream.profileId",
            ),
            (
                "/v2/fleets/a/autoUpgradeProfiles/p",
                None,
                "properties.upstream.profileId",
            ),
            (
                "/v1/fleets/a/autoUpgradeProfiles/p",
                Some(-1),
                "properties.upstream.soakSeconds",
            ),
        ] {
            let e = parse(id, soak).expect_err(id);
            assert_eq!(e.target, field, "{id}: {}", e.message);
        }
        let none = parse_upstream(&UpstreamSpec::default()).expect_err("no id");
        assert!(
            none.message.contains("profileId: is required"),
            "{}",
            none.message
        );
    }

    #[test]
    fn a_follower_takes_only_what_its_channel_selects_and_names_runs_by_what_was_validated() {
        let profile = |channel: &str, target: Option<&str>| {
            crate::profile::parse_profile(&crate::profile::ProfileSpec {
                channel: Some(channel.into()),
                target_kubernetes_version: target.map(String::from),
                upstream: Some(UpstreamSpec {
                    profile_id: Some("/v1/fleets/a/autoUpgradeProfiles/p".into()),
                    soak_seconds: Some(0),
                }),
                ..Default::default()
            })
            .expect("profile")
        };
        let mut old = v("old", 100);
        old.kubernetes_version = KubeVersion::parse("1.30.9");
        let runs = [old, v("new", 200)];
        let at = Time::from_unix(300);
        // Pinned to 1.30: the newer 1.31 run is not its to promote.
        let pinned = profile("TargetKubernetesVersion", Some("1.30"));
        assert!(matches!(
            promotion_for(&pinned, &runs, at),
            Promotion::Due { validated, .. } if validated.run_id == "old"
        ));
        assert!(matches!(
            promotion_for(&profile("NodeImage", None), &runs, at),
            Promotion::Nothing
        ));
        // Images a driver cannot pin: each validated image set is its own run all the same.
        let images = profile("NodeImage", None);
        let image_run = |version: &str| Validated {
            run_id: version.into(),
            completed_time: Time::from_unix(100),
            kubernetes_version: None,
            node_images: [(
                "Ubuntu".to_string(),
                ImageVersion::parse(version).expect("v"),
            )]
            .into_iter()
            .collect(),
        };
        let catalog = crate::fleet::Catalog::default();
        let (a, from) = promoted_run("p", &images, &catalog, &image_run("1.0"), false);
        let (b, _) = promoted_run("p", &images, &catalog, &image_run("2.0"), false);
        assert_ne!(a.name, b.name);
        assert!(!from.images_pinned);
        assert!(same_channel(
            profile("TargetKubernetesVersion", Some("1.30")).channel,
            crate::profile::Channel::TargetKubernetesVersion {
                major: 1,
                minor: 30,
                long_term_support: true
            }
        ));
    }

    #[test]
    fn a_rolled_back_run_validates_nothing() {
        let status: UpdateRunStatus = serde_json::from_value(json!({
            "status": {"state": "Completed", "completedTime": "2026-03-02T00:00:00Z"},
            "stages": [], "failureCount": 0,
            "endedOn": {"kubernetesVersion": "1.31.2", "validates": true}
        }))
        .expect("status");
        assert!(validated("r", &status).is_some());
        let mut rolled = status.clone();
        rolled.rolled_back_by = Some("rollback-of-r".into());
        assert_eq!(validated("r", &rolled), None);
    }

    #[test]
    fn a_cycle_is_named_around() {
        let ups: BTreeMap<&str, &str> = [("b", "c"), ("c", "a")].into_iter().collect();
        let of = |id: &str| ups.get(id).map(|s| s.to_string());
        assert_eq!(
            cycle("a", "b", of),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
        assert_eq!(cycle("d", "b", of), None);
        assert_eq!(cycle("a", "a", of), Some(vec!["a".into(), "a".into()]));
    }
}
