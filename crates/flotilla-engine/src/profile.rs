//! Auto-upgrade profiles (SEMANTICS §8): the wire shape, its validation, and channel resolution —
//! which upgrade a profile's channel selects from a release catalog at an instant. Pure: the
//! server and the simulator decide when to ask.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use serde_json::{Value, json};

use crate::engine::RunRules;
use crate::error::{ApiError, ErrorCode};
use crate::fleet::Catalog;
use crate::strategy::{
    ManagedClusterUpdateSpec, NodeImageSelectionSpec, NodeImageVersionSpec, UpgradeSpec,
};
use crate::time::Time;
use crate::version::{ImageVersion, KubeVersion};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSpec {
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image_selection: Option<ProfileNodeImageSelection>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_kubernetes_version: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub long_term_support: bool,
    /// Members more than one minor behind the target are upgraded one minor at a time
    /// (SEMANTICS §13) instead of being skipped (§8).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chain_minor_versions: bool,
    /// A release train (SEMANTICS §14): the profile triggers only on what this upstream
    /// profile validated, once its soak is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<crate::train::UpstreamSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileNodeImageSelection {
    #[serde(rename = "type", default)]
    pub selection_type: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    Rapid,
    Stable,
    /// Newest patch of `major.minor`; with long-term support, minors kept only by it count.
    TargetKubernetesVersion {
        major: u32,
        minor: u32,
        long_term_support: bool,
    },
    NodeImage,
    SecurityPatch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub channel: Channel,
    pub update_strategy_id: Option<String>,
    /// `Latest` or `Consistent` for the Kubernetes channels; NodeImage behaves as Consistent.
    pub consistent_images: bool,
    pub disabled: bool,
    /// `chainMinorVersions`: only with a channel that selects a Kubernetes version.
    pub chain_minor_versions: bool,
    /// The profile it follows in a release train (SEMANTICS §14).
    pub upstream: Option<crate::train::Upstream>,
}

/// What a channel selects now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChannelTarget {
    /// A Full upgrade to this version.
    Kubernetes(KubeVersion),
    /// Node images only: the newest version of each family (Linux families only for
    /// SecurityPatch).
    NodeImages(BTreeMap<String, ImageVersion>),
    /// What an upstream run validated (SEMANTICS §14): its Kubernetes version, where it had
    /// one, and the node images its members ended on, where they are pinned.
    Promoted {
        kubernetes: Option<KubeVersion>,
        node_images: BTreeMap<String, ImageVersion>,
    },
}

impl ChannelTarget {
    /// The versions as `lastTriggerUpgradeVersions` lists them.
    pub fn versions(&self) -> Vec<String> {
        let images = |images: &BTreeMap<String, ImageVersion>| {
            images
                .iter()
                .map(|(f, v)| format!("{f}-{v}"))
                .collect::<Vec<_>>()
        };
        match self {
            ChannelTarget::Kubernetes(v) => vec![v.to_string()],
            ChannelTarget::NodeImages(i) => images(i),
            ChannelTarget::Promoted {
                kubernetes,
                node_images,
            } => kubernetes
                .iter()
                .map(|v| v.to_string())
                .chain(images(node_images))
                .collect(),
        }
    }

    /// A name for the run a profile generates for this target: deterministic, so generating
    /// again with nothing new finds the same run. Fits the 50-character name rule.
    pub fn run_name(&self, profile: &str) -> String {
        let text = self.versions().join("+");
        let digest = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let tag = match self {
            ChannelTarget::Kubernetes(v)
            | ChannelTarget::Promoted {
                kubernetes: Some(v),
                ..
            } => format!("{}-{}-{}", v.major, v.minor, v.patch),
            ChannelTarget::NodeImages(_) | ChannelTarget::Promoted { .. } => "images".to_string(),
        };
        let head: String = profile.chars().take(50 - tag.len() - 10).collect();
        format!("{}-{tag}-{:08x}", head.trim_end_matches('-'), digest as u32)
    }
}

fn bad(field: &str, message: String) -> ApiError {
    let target = format!("properties.{field}");
    ApiError::new(
        ErrorCode::InvalidRequestContent,
        format!("{target}: {message}"),
        target,
    )
}

/// Validates a profile (the rules of the reference API and `az fleet autoupgradeprofile`).
pub fn parse_profile(spec: &ProfileSpec) -> Result<Profile, ApiError> {
    let channel_text = spec
        .channel
        .as_deref()
        .ok_or_else(|| bad("channel", "is required".into()))?;
    let target = spec.target_kubernetes_version.as_deref();
    let channel = match channel_text {
        "TargetKubernetesVersion" => {
            let text = target.ok_or_else(|| {
                bad(
                    "targetKubernetesVersion",
                    "is required with the TargetKubernetesVersion channel".into(),
                )
            })?;
            let parts: Vec<&str> = text.split('.').collect();
            let number = |p: &str| {
                (!p.is_empty() && p.len() <= 6 && p.bytes().all(|c| c.is_ascii_digit()))
                    .then(|| p.parse::<u32>().ok())
                    .flatten()
            };
            match parts.as_slice() {
                [major, minor] => match (number(major), number(minor)) {
                    (Some(major), Some(minor)) => Channel::TargetKubernetesVersion {
                        major,
                        minor,
                        long_term_support: spec.long_term_support,
                    },
                    _ => {
                        return Err(bad(
                            "targetKubernetesVersion",
                            format!("{text:?} must be major.minor, like 1.30"),
                        ));
                    }
                },
                _ => {
                    return Err(bad(
                        "targetKubernetesVersion",
                        format!("{text:?} must be major.minor, like 1.30"),
                    ));
                }
            }
        }
        other => {
            if let Some(t) = target {
                return Err(bad(
                    "targetKubernetesVersion",
                    format!(
                        "{t:?} is only allowed with the TargetKubernetesVersion channel, not {other}"
                    ),
                ));
            }
            if spec.long_term_support {
                return Err(bad(
                    "longTermSupport",
                    format!(
                        "is only allowed with the TargetKubernetesVersion channel, not {other}"
                    ),
                ));
            }
            match other {
                "Rapid" => Channel::Rapid,
                "Stable" => Channel::Stable,
                "NodeImage" => Channel::NodeImage,
                "SecurityPatch" => Channel::SecurityPatch,
                _ => {
                    return Err(bad(
                        "channel",
                        format!(
                            "{other:?} must be Rapid, Stable, TargetKubernetesVersion, NodeImage or SecurityPatch"
                        ),
                    ));
                }
            }
        }
    };
    let consistent_images = match spec
        .node_image_selection
        .as_ref()
        .map(|s| s.selection_type.as_deref())
    {
        None => matches!(channel, Channel::NodeImage),
        Some(_) if matches!(channel, Channel::NodeImage) => {
            return Err(bad(
                "nodeImageSelection",
                "cannot be set with the NodeImage channel (it always uses Consistent)".into(),
            ));
        }
        Some(Some("Latest")) => false,
        Some(Some("Consistent")) => true,
        Some(Some(other)) => {
            return Err(bad(
                "nodeImageSelection.type",
                format!("{other:?} must be Latest or Consistent"),
            ));
        }
        Some(None) => {
            return Err(bad(
                "nodeImageSelection.type",
                "is required (Latest or Consistent)".into(),
            ));
        }
    };
    if spec.chain_minor_versions && matches!(channel, Channel::NodeImage | Channel::SecurityPatch) {
        return Err(bad(
            "chainMinorVersions",
            format!(
                "true is only allowed with a channel that selects a Kubernetes version (Rapid, Stable, TargetKubernetesVersion), not {channel_text}"
            ),
        ));
    }
    let upstream = spec
        .upstream
        .as_ref()
        .map(crate::train::parse_upstream)
        .transpose()?;
    Ok(Profile {
        channel,
        update_strategy_id: spec.update_strategy_id.clone(),
        consistent_images,
        disabled: spec.disabled,
        chain_minor_versions: spec.chain_minor_versions,
        upstream,
    })
}

/// The target a channel selects from the catalog at `now`, over the given regions (all regions
/// of the catalog when empty). Preview versions never count; versions kept only by long-term
/// support count only for a TargetKubernetesVersion profile that asks for it. `None`: nothing to
/// upgrade to yet.
pub fn resolve(
    channel: Channel,
    catalog: &Catalog,
    regions: &[&str],
    now: Time,
) -> Option<ChannelTarget> {
    let in_scope = |region: &String| regions.is_empty() || regions.contains(&region.as_str());
    match channel {
        Channel::NodeImage | Channel::SecurityPatch => {
            let mut newest: BTreeMap<String, ImageVersion> = BTreeMap::new();
            for (region, rc) in catalog.regions.iter().filter(|(r, _)| in_scope(r)) {
                let _ = region;
                for (family, releases) in &rc.node_images {
                    // Windows image families are not patched by the SecurityPatch channel.
                    if channel == Channel::SecurityPatch
                        && family.to_ascii_lowercase().contains("windows")
                    {
                        continue;
                    }
                    for release in releases
                        .iter()
                        .filter(|r| r.available_at.is_none_or(|t| t <= now))
                    {
                        let entry = newest
                            .entry(family.clone())
                            .or_insert_with(|| release.version.clone());
                        if release.version > *entry {
                            *entry = release.version.clone();
                        }
                    }
                }
            }
            (!newest.is_empty()).then_some(ChannelTarget::NodeImages(newest))
        }
        _ => {
            let lts_allowed = matches!(
                channel,
                Channel::TargetKubernetesVersion {
                    long_term_support: true,
                    ..
                }
            );
            let mut versions: Vec<KubeVersion> = catalog
                .regions
                .iter()
                .filter(|(r, _)| in_scope(r))
                .flat_map(|(_, rc)| rc.kubernetes.iter())
                .filter(|k| !k.preview && (lts_allowed || !k.long_term_support))
                .filter(|k| k.available_at.is_none_or(|t| t <= now))
                .map(|k| k.version)
                .collect();
            versions.sort();
            versions.dedup();
            let newest_of = |line: (u32, u32)| {
                versions
                    .iter()
                    .filter(|v| v.minor_line() == line)
                    .max()
                    .copied()
            };
            let mut lines: Vec<(u32, u32)> = versions.iter().map(|v| v.minor_line()).collect();
            lines.dedup();
            let target = match channel {
                Channel::Rapid => lines.last().and_then(|l| newest_of(*l)),
                Channel::Stable => lines.len().checked_sub(2).and_then(|i| newest_of(lines[i])),
                Channel::TargetKubernetesVersion { major, minor, .. } => newest_of((major, minor)),
                Channel::NodeImage | Channel::SecurityPatch => None,
            };
            target.map(ChannelTarget::Kubernetes)
        }
    }
}

/// The run a profile generates for a target: its deterministic name, the upgrade and the rules.
/// The server and the simulator both build generated runs from this, so they agree on names,
/// upgrades and rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedRun {
    pub name: String,
    pub target: ChannelTarget,
    pub update: ManagedClusterUpdateSpec,
    pub rules: RunRules,
}

/// Why a profile generates no run now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRun {
    /// A disabled profile generates nothing.
    Disabled,
    /// Its channel selects nothing from the catalog yet: not a failure, a trigger waits.
    NothingSelected(Channel),
    /// A downstream profile (SEMANTICS §14) whose upstream validated nothing yet (`None`), or
    /// whose validated target soaks until the instant given.
    Soaking(Option<Time>),
}

impl NoRun {
    /// What `generateUpdateRun` answers (409): a trigger records neither.
    pub fn error(self, profile_name: &str) -> ApiError {
        ApiError::conflict(match self {
            NoRun::Soaking(None) => format!(
                "auto-upgrade profile {profile_name:?} follows an upstream profile that has validated nothing yet"
            ),
            NoRun::Soaking(Some(until)) => format!(
                "auto-upgrade profile {profile_name:?} promotes what its upstream validated when the soak ends at {until}"
            ),
            NoRun::Disabled => format!(
                "auto-upgrade profile {profile_name:?} is disabled; a disabled profile generates nothing"
            ),
            NoRun::NothingSelected(channel) => {
                // The channel as the profile names it, with its target where it has one.
                let (name, detail) = match channel {
                    Channel::Rapid => ("Rapid", String::new()),
                    Channel::Stable => ("Stable", String::new()),
                    Channel::NodeImage => ("NodeImage", String::new()),
                    Channel::SecurityPatch => ("SecurityPatch", String::new()),
                    Channel::TargetKubernetesVersion {
                        major,
                        minor,
                        long_term_support,
                    } => (
                        "TargetKubernetesVersion",
                        format!(
                            " (targetKubernetesVersion {major}.{minor}{})",
                            if long_term_support {
                                " with longTermSupport"
                            } else {
                                ""
                            }
                        ),
                    ),
                };
                format!("the {name} channel{detail} selects nothing from the fleet's releases yet")
            }
        })
    }
}

/// The run `profile` generates from `catalog` at `now`, or why none: the rule both shells
/// follow. A run that already exists under the name is the one generated before.
pub fn plan_generation(
    profile_name: &str,
    profile: &Profile,
    catalog: &Catalog,
    now: Time,
) -> Result<GeneratedRun, NoRun> {
    if profile.disabled {
        return Err(NoRun::Disabled);
    }
    plan_run(profile_name, profile, catalog, now).ok_or(NoRun::NothingSelected(profile.channel))
}

/// What `profile` would generate from `catalog` at `now` (SEMANTICS §8): `None` when its channel
/// selects nothing yet. Whether to create it is the shell's decision: a disabled profile
/// generates nothing, and a run that already exists under the name is the one generated before.
pub fn plan_run(
    profile_name: &str,
    profile: &Profile,
    catalog: &Catalog,
    now: Time,
) -> Option<GeneratedRun> {
    let target = resolve(profile.channel, catalog, &[], now)?;
    Some(generated_run(profile_name, profile, catalog, target))
}

/// The run `profile` generates for `target`: its deterministic name, its upgrade and its rules.
pub fn generated_run(
    profile_name: &str,
    profile: &Profile,
    catalog: &Catalog,
    target: ChannelTarget,
) -> GeneratedRun {
    let custom = |images: &BTreeMap<String, ImageVersion>| NodeImageSelectionSpec {
        selection_type: Some("Custom".into()),
        custom_node_image_versions: images
            .iter()
            .map(|(f, v)| NodeImageVersionSpec {
                version: Some(format!("{f}-{v}")),
            })
            .collect(),
    };
    let node_images_only = |selection: NodeImageSelectionSpec| ManagedClusterUpdateSpec {
        upgrade: Some(UpgradeSpec {
            upgrade_type: Some("NodeImageOnly".into()),
            kubernetes_version: None,
        }),
        node_image_selection: Some(selection),
    };
    let consistent = NodeImageSelectionSpec {
        selection_type: Some("Consistent".into()),
        custom_node_image_versions: Vec::new(),
    };
    // Windows pools are left alone by the SecurityPatch channel, with a message.
    let image_rules = RunRules {
        linux_node_pools_only: profile.channel == Channel::SecurityPatch,
        ..RunRules::default()
    };
    let (update, rules) = match &target {
        ChannelTarget::Kubernetes(version) => full_upgrade(profile, catalog, version, None),
        ChannelTarget::Promoted {
            kubernetes: Some(version),
            node_images,
        } => full_upgrade(
            profile,
            catalog,
            version,
            (!node_images.is_empty()).then(|| custom(node_images)),
        ),
        // The newest Linux images, named exactly (SecurityPatch); what an upstream validated.
        ChannelTarget::NodeImages(images) if profile.channel == Channel::SecurityPatch => {
            (node_images_only(custom(images)), image_rules)
        }
        ChannelTarget::Promoted {
            kubernetes: None,
            node_images,
        } if !node_images.is_empty() => (node_images_only(custom(node_images)), image_rules),
        ChannelTarget::NodeImages(_) | ChannelTarget::Promoted { .. } => {
            (node_images_only(consistent), image_rules)
        }
    };
    GeneratedRun {
        name: target.run_name(profile_name),
        target,
        update,
        rules,
    }
}

/// A Full upgrade to `version` with `images` (else the profile's Latest or Consistent
/// selection), and the rules of a profile's runs.
fn full_upgrade(
    profile: &Profile,
    catalog: &Catalog,
    version: &KubeVersion,
    images: Option<NodeImageSelectionSpec>,
) -> (ManagedClusterUpdateSpec, RunRules) {
    // Every listing of the version is kept only by long-term support: members without it fail
    // (SEMANTICS §8, LTS).
    let listings: Vec<bool> = catalog
        .regions
        .values()
        .flat_map(|r| r.kubernetes.iter())
        .filter(|k| k.version == *version)
        .map(|k| k.long_term_support)
        .collect();
    let lts_only = listings.iter().all(|lts| *lts) && !listings.is_empty();
    let selection = images.unwrap_or_else(|| NodeImageSelectionSpec {
        selection_type: Some(
            if profile.consistent_images {
                "Consistent"
            } else {
                "Latest"
            }
            .into(),
        ),
        custom_node_image_versions: Vec::new(),
    });
    (
        ManagedClusterUpdateSpec {
            upgrade: Some(UpgradeSpec {
                upgrade_type: Some("Full".into()),
                kubernetes_version: Some(version.to_string()),
            }),
            node_image_selection: Some(selection),
        },
        RunRules {
            // A chain brings a member behind up one minor at a time instead (SEMANTICS §13).
            skip_minor_jumps: !profile.chain_minor_versions,
            require_long_term_support: lts_only,
            linux_node_pools_only: false,
            chain_minor_versions: profile.chain_minor_versions,
        },
    )
}

/// When `profile` next generates a run, and which (what a profile's create answer tells): at
/// `now` when its channel selects a target whose run `exists` does not know, else at the first
/// announced arrival in the catalog (`availableAt`) after which it does. `None`: disabled, or
/// nothing announced makes it generate.
pub fn next_generation(
    profile_name: &str,
    profile: &Profile,
    catalog: &Catalog,
    now: Time,
    exists: impl Fn(&str) -> bool,
) -> Option<(Time, GeneratedRun)> {
    if profile.disabled {
        return None;
    }
    let mut arrivals: Vec<Time> = catalog
        .regions
        .values()
        .flat_map(|r| {
            let images = r.node_images.values().flatten().map(|i| i.available_at);
            r.kubernetes.iter().map(|k| k.available_at).chain(images)
        })
        .flatten()
        .filter(|t| *t > now)
        .collect();
    arrivals.sort();
    arrivals.dedup();
    std::iter::once(now).chain(arrivals).find_map(|at| {
        plan_run(profile_name, profile, catalog, at)
            .filter(|run| !exists(&run.name))
            .map(|run| (at, run))
    })
}

/// How a trigger ended, for the profile's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TriggerOutcome {
    /// The run was created and started.
    Started { run: String, versions: Vec<String> },
    /// Creating or starting the run failed; `versions` is empty when no target was reached.
    Failed {
        versions: Vec<String>,
        code: String,
        message: String,
    },
}

impl TriggerOutcome {
    /// A trigger created run `run` for `versions` and then started it, with this result: a
    /// start refused leaves the run created and the trigger failed (`StartFailed`).
    pub fn started(run: String, versions: Vec<String>, start: Result<(), String>) -> Self {
        match start {
            Ok(()) => TriggerOutcome::Started { run, versions },
            Err(message) => TriggerOutcome::Failed {
                versions,
                code: "StartFailed".into(),
                message,
            },
        }
    }

    /// A trigger that could not create its run: the error's code and message.
    pub fn not_created(code: String, message: String) -> Self {
        TriggerOutcome::Failed {
            versions: Vec::new(),
            code,
            message,
        }
    }
}

/// The profile's `autoUpgradeProfileStatus` after a trigger at `at`.
pub fn trigger_status(at: Time, outcome: &TriggerOutcome) -> Value {
    match outcome {
        TriggerOutcome::Started { run, versions } => json!({
            "lastTriggeredAt": at,
            "lastTriggerStatus": "Succeeded",
            "lastTriggerUpgradeVersions": versions,
            "lastTriggerMessage": format!("created and started update run {run}"),
        }),
        TriggerOutcome::Failed {
            versions,
            code,
            message,
        } => {
            let mut status = json!({
                "lastTriggeredAt": at,
                "lastTriggerStatus": "Failed",
                "lastTriggerError": {"code": code, "message": message},
            });
            if !versions.is_empty() {
                status["lastTriggerUpgradeVersions"] = json!(versions);
            }
            status
        }
    }
}

/// Whether a profile's stored `autoUpgradeProfileStatus` already records this outcome: the
/// same failure as the last trigger's, whenever it was. A failure repeated at every pass is
/// written once, so the profile's eTag does not climb and users' `If-Match` edits do not race
/// the server; a run started is always news.
pub fn already_recorded(status: &Value, outcome: &TriggerOutcome) -> bool {
    if matches!(outcome, TriggerOutcome::Started { .. }) {
        return false;
    }
    let without_time = |v: &Value| {
        let mut v = v.clone();
        if let Some(fields) = v.as_object_mut() {
            fields.remove("lastTriggeredAt");
            // A downstream profile's standing is not a trigger's (SEMANTICS §14).
            fields.remove("upstream");
        }
        v
    };
    let fresh = trigger_status(Time::from_unix(0), outcome);
    without_time(status) == without_time(&fresh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{CatalogSpec, RegionCatalogSpec};

    fn catalog(
        kube: &[(&str, bool, bool, Option<&str>)],
        images: &[(&str, &str, Option<&str>)],
    ) -> Catalog {
        let mut region = RegionCatalogSpec::default();
        for (v, preview, lts, at) in kube {
            region.kubernetes.push(crate::fleet::KubeReleaseSpec {
                version: v.to_string(),
                preview: *preview,
                lts: *lts,
                available_at: at.map(String::from),
            });
        }
        for (family, v, at) in images {
            let list = region
                .node_images
                .entry(family.to_string())
                .or_insert(serde_json::json!([]));
            if let Some(a) = list.as_array_mut() {
                a.push(serde_json::json!({"version": v, "availableAt": at}));
            }
        }
        let spec: CatalogSpec = [("eastus".to_string(), region)].into_iter().collect();
        Catalog::parse(&spec, "").expect("valid catalog")
    }

    fn t(s: &str) -> Time {
        Time::parse(s).expect("time")
    }

    fn kube(c: Channel, cat: &Catalog, now: &str) -> Option<String> {
        match resolve(c, cat, &[], t(now)) {
            Some(ChannelTarget::Kubernetes(v)) => Some(v.to_string()),
            other => other.map(|o| format!("{o:?}")),
        }
    }

    const NOW: &str = "2026-03-02T00:00:00Z";

    #[test]
    fn rapid_and_stable_follow_the_newest_generally_available_minors() {
        let cat = catalog(
            &[
                ("1.29.9", false, false, None),
                ("1.30.4", false, false, None),
                ("1.30.5", false, false, None),
                ("1.31.2", false, false, None),
                ("1.32.0", true, false, None),
                ("1.31.3", false, false, Some("2026-03-05T00:00:00Z")),
            ],
            &[],
        );
        assert_eq!(
            kube(Channel::Rapid, &cat, NOW).as_deref(),
            Some("1.31.2"),
            "previews never count"
        );
        assert_eq!(kube(Channel::Stable, &cat, NOW).as_deref(), Some("1.30.5"));
        assert_eq!(
            kube(Channel::Rapid, &cat, "2026-03-06T00:00:00Z").as_deref(),
            Some("1.31.3"),
            "a new patch moves Rapid"
        );
        // A new minor arriving moves both.
        let cat = catalog(
            &[
                ("1.30.5", false, false, None),
                ("1.31.2", false, false, None),
                ("1.32.1", false, false, Some("2026-04-01T00:00:00Z")),
            ],
            &[],
        );
        assert_eq!(kube(Channel::Rapid, &cat, NOW).as_deref(), Some("1.31.2"));
        assert_eq!(
            kube(Channel::Rapid, &cat, "2026-04-02T00:00:00Z").as_deref(),
            Some("1.32.1")
        );
        assert_eq!(
            kube(Channel::Stable, &cat, "2026-04-02T00:00:00Z").as_deref(),
            Some("1.31.2")
        );
        // One minor only: Stable has nothing.
        let cat = catalog(&[("1.31.2", false, false, None)], &[]);
        assert_eq!(kube(Channel::Stable, &cat, NOW), None);
    }

    #[test]
    fn target_version_and_long_term_support() {
        let cat = catalog(
            &[
                ("1.27.100", false, true, None),
                ("1.27.101", false, true, None),
                ("1.30.4", false, false, None),
                ("1.30.7", false, false, None),
                ("1.31.2", false, false, None),
            ],
            &[],
        );
        let target = |major, minor, lts| Channel::TargetKubernetesVersion {
            major,
            minor,
            long_term_support: lts,
        };
        assert_eq!(
            kube(target(1, 30, false), &cat, NOW).as_deref(),
            Some("1.30.7"),
            "never the next minor"
        );
        assert_eq!(
            kube(target(1, 27, false), &cat, NOW),
            None,
            "an LTS-only minor needs long-term support"
        );
        assert_eq!(
            kube(target(1, 27, true), &cat, NOW).as_deref(),
            Some("1.27.101")
        );
        assert_eq!(kube(Channel::Rapid, &cat, NOW).as_deref(), Some("1.31.2"));
    }

    #[test]
    fn node_image_channels() {
        let cat = catalog(
            &[],
            &[
                ("AKSUbuntu-2204gen2containerd", "202602.10.0", None),
                (
                    "AKSUbuntu-2204gen2containerd",
                    "202603.01.0",
                    Some("2026-03-03T00:00:00Z"),
                ),
                ("AKSWindows-2022-containerd", "20348.2026.02", None),
            ],
        );
        let Some(ChannelTarget::NodeImages(images)) =
            resolve(Channel::NodeImage, &cat, &[], t(NOW))
        else {
            panic!("images")
        };
        assert_eq!(images.len(), 2);
        assert_eq!(
            images["AKSUbuntu-2204gen2containerd"].to_string(),
            "202602.10.0"
        );
        let Some(ChannelTarget::NodeImages(images)) =
            resolve(Channel::SecurityPatch, &cat, &[], t("2026-03-04T00:00:00Z"))
        else {
            panic!("images")
        };
        assert_eq!(
            images.keys().collect::<Vec<_>>(),
            ["AKSUbuntu-2204gen2containerd"],
            "Windows pools are not patched"
        );
        assert_eq!(
            images["AKSUbuntu-2204gen2containerd"].to_string(),
            "202603.01.0"
        );
    }

    #[test]
    fn validation_names_the_field() {
        let spec = |json: &str| -> ProfileSpec { serde_json::from_str(json).expect("shape") };
        for (json, target) in [
            (r#"{}"#, "properties.channel"),
            (r#"{"channel": "Fast"}"#, "properties.channel"),
            (
                r#"{"channel": "TargetKubernetesVersion"}"#,
                "properties.targetKubernetesVersion",
            ),
            (
                r#"{"channel": "TargetKubernetesVersion", "targetKubernetesVersion": "1.30.2"}"#,
                "properties.targetKubernetesVersion",
            ),
            (
                r#"{"channel": "Rapid", "targetKubernetesVersion": "1.30"}"#,
                "properties.targetKubernetesVersion",
            ),
            (
                r#"{"channel": "Stable", "longTermSupport": true}"#,
                "properties.longTermSupport",
            ),
            (
                r#"{"channel": "NodeImage", "nodeImageSelection": {"type": "Latest"}}"#,
                "properties.nodeImageSelection",
            ),
            (
                r#"{"channel": "Rapid", "nodeImageSelection": {"type": "Custom"}}"#,
                "properties.nodeImageSelection.type",
            ),
        ] {
            let err = parse_profile(&spec(json)).expect_err(json);
            assert_eq!(err.target, target, "{json}: {err:?}");
        }
        let ok = parse_profile(&spec(r#"{"channel": "TargetKubernetesVersion", "targetKubernetesVersion": "1.27", "longTermSupport": true}"#)).expect("valid");
        assert_eq!(
            ok.channel,
            Channel::TargetKubernetesVersion {
                major: 1,
                minor: 27,
                long_term_support: true
            }
        );
    }

    #[test]
    fn generated_run_names_are_stable_and_valid() {
        let target = ChannelTarget::Kubernetes(KubeVersion::parse("1.31.2").expect("v"));
        let name = target.run_name("nightly-rapid");
        assert_eq!(name, target.run_name("nightly-rapid"));
        assert!(crate::strategy::check_name(&name, 50).is_ok(), "{name}");
        let long = target.run_name(&"p".repeat(50));
        assert!(crate::strategy::check_name(&long, 50).is_ok(), "{long}");
        assert_ne!(
            name,
            ChannelTarget::Kubernetes(KubeVersion::parse("1.31.3").expect("v"))
                .run_name("nightly-rapid")
        );
    }

    fn profile(json: &str) -> Profile {
        parse_profile(&serde_json::from_str(json).expect("shape")).expect("valid")
    }

    /// A profile's create answer: now when its target has no run yet, else at the announced
    /// arrival that gives it one; nothing when disabled or when nothing announced would.
    #[test]
    fn the_next_generation_is_now_or_at_an_announced_arrival() {
        let cat = catalog(
            &[
                ("1.30.7", false, false, None),
                ("1.31.2", false, false, Some("2026-03-05T00:00:00Z")),
                ("1.32.0", true, false, Some("2026-03-04T00:00:00Z")),
            ],
            &[],
        );
        let now = t(NOW);
        let rapid = profile(r#"{"channel": "Rapid"}"#);
        let none = |_: &str| false;
        let (at, run) = next_generation("rapid", &rapid, &cat, now, none).expect("a run");
        assert_eq!(
            (at, run.target.versions()),
            (now, vec!["1.30.7".to_string()])
        );
        // Its run exists: the next is 1.31.2 when it arrives (the preview never counts).
        let (at, run) = next_generation("rapid", &rapid, &cat, now, |name: &str| name == run.name)
            .expect("a later run");
        assert_eq!(at, t("2026-03-05T00:00:00Z"));
        assert_eq!(run.target.versions(), ["1.31.2"]);
        assert_eq!(
            next_generation("rapid", &rapid, &cat, now, |_: &str| true),
            None,
            "every run it could make exists"
        );
        let disabled = profile(r#"{"channel": "Rapid", "disabled": true}"#);
        assert_eq!(next_generation("rapid", &disabled, &cat, now, none), None);
    }

    #[test]
    fn planned_runs_carry_the_channel_s_upgrade_and_rules() {
        let cat = catalog(
            &[
                ("1.27.101", false, true, None),
                ("1.30.7", false, false, None),
                ("1.31.2", false, false, None),
            ],
            &[
                ("AKSUbuntu-2204gen2containerd", "202603.01.0", None),
                ("AKSWindows-2022-containerd", "20348.2026.02", None),
            ],
        );
        let now = t(NOW);
        let rapid =
            plan_run("rapid", &profile(r#"{"channel": "Rapid"}"#), &cat, now).expect("a target");
        assert_eq!(rapid.name, rapid.target.run_name("rapid"));
        assert_eq!(
            serde_json::to_value(&rapid.update).expect("json"),
            json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.2"}, "nodeImageSelection": {"type": "Latest"}})
        );
        assert!(rapid.rules.skip_minor_jumps && !rapid.rules.require_long_term_support);
        let lts = plan_run(
            "lts",
            &profile(r#"{"channel": "TargetKubernetesVersion", "targetKubernetesVersion": "1.27", "longTermSupport": true, "nodeImageSelection": {"type": "Consistent"}}"#),
            &cat,
            now,
        )
        .expect("a target");
        assert_eq!(lts.target.versions(), ["1.27.101"]);
        assert!(lts.rules.require_long_term_support, "an LTS-only target");
        assert_eq!(
            lts.update
                .node_image_selection
                .and_then(|s| s.selection_type)
                .as_deref(),
            Some("Consistent")
        );
        let security = plan_run(
            "sec",
            &profile(r#"{"channel": "SecurityPatch"}"#),
            &cat,
            now,
        )
        .expect("a target");
        assert!(security.rules.linux_node_pools_only);
        assert_eq!(
            serde_json::to_value(&security.update).expect("json"),
            json!({"upgrade": {"type": "NodeImageOnly"}, "nodeImageSelection": {"type": "Custom", "customNodeImageVersions": [{"version": "AKSUbuntu-2204gen2containerd-202603.01.0"}]}})
        );
        let images =
            plan_run("img", &profile(r#"{"channel": "NodeImage"}"#), &cat, now).expect("a target");
        assert_eq!(
            images.target.versions().len(),
            2,
            "NodeImage covers Windows too"
        );
        assert_eq!(images.rules, RunRules::default());
        let empty = catalog(&[], &[]);
        assert_eq!(
            plan_run("rapid", &profile(r#"{"channel": "Stable"}"#), &empty, now),
            None
        );
    }

    #[test]
    fn trigger_status_has_the_profile_status_fields() {
        let at = t(NOW);
        let ok = trigger_status(
            at,
            &TriggerOutcome::Started {
                run: "rapid-1-31-2-0badf00d".into(),
                versions: vec!["1.31.2".into()],
            },
        );
        assert_eq!(
            ok,
            json!({"lastTriggeredAt": NOW, "lastTriggerStatus": "Succeeded", "lastTriggerUpgradeVersions": ["1.31.2"], "lastTriggerMessage": "created and started update run rapid-1-31-2-0badf00d"})
        );
        let failed = trigger_status(
            at,
            &TriggerOutcome::Failed {
                versions: Vec::new(),
                code: "Conflict".into(),
                message: "gone".into(),
            },
        );
        assert_eq!(failed["lastTriggerStatus"], "Failed");
        assert_eq!(failed["lastTriggerError"]["code"], "Conflict");
        assert!(failed.get("lastTriggerUpgradeVersions").is_none());
        // The same failure later is already recorded; another failure or a start is not.
        let again = TriggerOutcome::not_created("Conflict".into(), "gone".into());
        assert!(already_recorded(&failed, &again));
        let other = TriggerOutcome::not_created("Conflict".into(), "went".into());
        assert!(!already_recorded(&failed, &other));
        let started = TriggerOutcome::Started {
            run: "r".into(),
            versions: vec!["1.31.2".into()],
        };
        assert!(!already_recorded(&trigger_status(at, &started), &started));
        assert!(!already_recorded(&Value::Null, &again));
    }
}
