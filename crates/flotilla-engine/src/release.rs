//! The release timeline (the release feed's input): releases published at offsets from an
//! origin, region by region, added to a catalog as they come out. The scenario format and the
//! server's `sim` driver share it, so "what has been published by now" means the same in both.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ApiError, ErrorCode};
use crate::fleet::{Catalog, ImageRelease, KubeRelease};
use crate::time::{Time, parse_duration};
use crate::version::{ImageVersion, KubeVersion};

/// One release as written: `at` (an offset, `"+2m"`, `"3d"` or seconds), exactly one of
/// `kubernetesVersion` and `nodeImage` (`"<family>-<version>"`, as in
/// `customNodeImageVersions`), and `regions` (region → delay after `at`; every region of the
/// catalog at once when omitted).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseSpec {
    pub at: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<Value>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preview: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lts: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<BTreeMap<String, Value>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    Kubernetes {
        version: KubeVersion,
        preview: bool,
        lts: bool,
    },
    NodeImage {
        family: String,
        version: ImageVersion,
    },
}

/// A validated release: what, and seconds after the origin in each region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub what: Published,
    /// Region → seconds after the origin; empty: every region of the catalog at `at`.
    pub regions: BTreeMap<String, i64>,
    pub at: i64,
}

fn bad(path: &str, message: String) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequestContent,
        format!("{path}: {message}"),
        path,
    )
}

/// An offset: `"+2m"`, `"2m"`, `"1d"`, `"90"` or a number of seconds.
pub fn parse_offset(value: &Value, path: &str) -> Result<i64, ApiError> {
    let seconds = match value {
        Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| s.ceil() as i64),
        Value::String(s) => parse_duration(s.strip_prefix('+').unwrap_or(s)),
        _ => None,
    };
    seconds.ok_or_else(|| {
        bad(
            path,
            format!("{value} is not an offset like \"+2m\", \"1d\" or a number of seconds"),
        )
    })
}

/// Validates a timeline; errors name the field (`{root}[2].regions.westeurope`).
pub fn parse_releases(specs: &[ReleaseSpec], root: &str) -> Result<Vec<Release>, ApiError> {
    let mut out = Vec::new();
    for (i, r) in specs.iter().enumerate() {
        let path = format!("{root}[{i}]");
        let at = parse_offset(&r.at, &format!("{path}.at"))?;
        let what = match (&r.kubernetes_version, &r.node_image) {
            (Some(v), None) => {
                let text = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let version = KubeVersion::parse(&text).ok_or_else(|| {
                    bad(
                        &format!("{path}.kubernetesVersion"),
                        format!("{text:?} is not a Kubernetes version major.minor.patch"),
                    )
                })?;
                Published::Kubernetes {
                    version,
                    preview: r.preview,
                    lts: r.lts,
                }
            }
            (None, Some(full)) => {
                if r.preview || r.lts {
                    return Err(bad(
                        &format!("{path}.nodeImage"),
                        "preview and lts apply to Kubernetes versions only".into(),
                    ));
                }
                let parsed = full
                    .rsplit_once('-')
                    .and_then(|(f, v)| Some((f, ImageVersion::parse(v)?)))
                    .filter(|(f, _)| !f.is_empty());
                let (family, version) = parsed.ok_or_else(|| {
                    bad(
                        &format!("{path}.nodeImage"),
                        format!("{full:?} must be <family>-<version>, like AKSUbuntu-2204gen2containerd-202603.01.0"),
                    )
                })?;
                Published::NodeImage {
                    family: family.to_string(),
                    version,
                }
            }
            _ => {
                return Err(bad(
                    &path,
                    "needs exactly one of kubernetesVersion and nodeImage".into(),
                ));
            }
        };
        let mut regions = BTreeMap::new();
        for (region, delay) in r.regions.iter().flatten() {
            let delay = parse_offset(delay, &format!("{path}.regions.{region}"))?;
            regions.insert(region.clone(), at.saturating_add(delay));
        }
        out.push(Release { what, regions, at });
    }
    Ok(out)
}

impl Release {
    /// Where and when (seconds after the origin) this release comes out, given the catalog's
    /// regions for a release that names none.
    pub fn schedule<'a>(&'a self, catalog: &'a Catalog) -> Vec<(&'a str, i64)> {
        if self.regions.is_empty() {
            catalog
                .regions
                .keys()
                .map(|r| (r.as_str(), self.at))
                .collect()
        } else {
            self.regions.iter().map(|(r, t)| (r.as_str(), *t)).collect()
        }
    }
}

/// The instant `offset` (virtual seconds after the origin) falls on when virtual time runs
/// `scale` times faster than the origin's clock. Rounded up: nothing comes out early.
pub fn instant(origin: Time, offset: i64, scale: f64) -> Time {
    let real = (offset as f64 / scale).ceil();
    origin.plus(if real.is_finite() {
        real as i64
    } else {
        i64::MAX / 4
    })
}

/// `base` plus every release of the timeline out by `now`, each with `availableAt` set to when
/// it came out in that region. A version already listed in a region keeps its listing.
pub fn published(
    base: &Catalog,
    releases: &[Release],
    origin: Time,
    scale: f64,
    now: Time,
) -> Catalog {
    listed(base, releases, origin, scale, now, false)
}

/// Like [`published`], and a release that is out in one region by `now` is also listed in the
/// regions it reaches later, with the `availableAt` it will have there: what a feed that
/// announces its regional rollout tells (the `sim` driver's catalog), so that a forecast knows
/// when a version arrives (SEMANTICS §11).
pub fn announced(
    base: &Catalog,
    releases: &[Release],
    origin: Time,
    scale: f64,
    now: Time,
) -> Catalog {
    listed(base, releases, origin, scale, now, true)
}

fn listed(
    base: &Catalog,
    releases: &[Release],
    origin: Time,
    scale: f64,
    now: Time,
    ahead: bool,
) -> Catalog {
    let mut catalog = base.clone();
    for release in releases {
        let schedule = release.schedule(base);
        let out = schedule
            .iter()
            .any(|(_, offset)| instant(origin, *offset, scale) <= now);
        for (region, offset) in schedule {
            let at = instant(origin, offset, scale);
            if at > now && !(ahead && out) {
                continue;
            }
            let entry = catalog.regions.entry(region.to_string()).or_default();
            match &release.what {
                Published::Kubernetes {
                    version,
                    preview,
                    lts,
                } => {
                    if !entry.kubernetes.iter().any(|k| k.version == *version) {
                        entry.kubernetes.push(KubeRelease {
                            version: *version,
                            preview: *preview,
                            long_term_support: *lts,
                            available_at: Some(at),
                        });
                    }
                }
                Published::NodeImage { family, version } => {
                    if !entry.family_order.contains(family) {
                        entry.family_order.push(family.clone());
                    }
                    let list = entry.node_images.entry(family.clone()).or_default();
                    if !list.iter().any(|i| i.version == *version) {
                        list.push(ImageRelease {
                            version: version.clone(),
                            available_at: Some(at),
                        });
                    }
                }
            }
        }
    }
    catalog
}

/// Every instant at which the timeline changes the catalog, in order, without duplicates.
pub fn change_instants(
    base: &Catalog,
    releases: &[Release],
    origin: Time,
    scale: f64,
) -> Vec<Time> {
    let mut out: Vec<Time> = releases
        .iter()
        .flat_map(|r| {
            r.schedule(base)
                .into_iter()
                .map(|(_, offset)| instant(origin, offset, scale))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::CatalogSpec;

    fn releases(json: Value) -> Result<Vec<Release>, ApiError> {
        let specs: Vec<ReleaseSpec> = serde_json::from_value(json).expect("shape");
        parse_releases(&specs, "releases")
    }

    fn base() -> Catalog {
        let spec: CatalogSpec = serde_json::from_value(serde_json::json!({
            "eastus": {"kubernetes": [{"version": "1.30.5"}]},
            "westeurope": {"kubernetes": [{"version": "1.30.5"}]},
        }))
        .expect("shape");
        Catalog::parse(&spec, "catalog").expect("valid")
    }

    #[test]
    fn releases_come_out_region_by_region_and_time_scaled() {
        let timeline = releases(serde_json::json!([
            {"at": "+2m", "kubernetesVersion": "1.30.7", "regions": {"eastus": "+0s", "westeurope": "1d"}},
            {"at": 600, "nodeImage": "AKSUbuntu-2204gen2containerd-202603.01.0"},
        ]))
        .expect("valid");
        let origin = Time::from_unix(1_000_000);
        let versions = |c: &Catalog, region: &str| -> Vec<String> {
            c.regions[region]
                .kubernetes
                .iter()
                .map(|k| k.version.to_string())
                .collect()
        };
        let at = |s: i64| origin.plus(s);
        // Unscaled: 1.30.7 in eastus after 2 minutes, in westeurope a day later.
        let c = published(&base(), &timeline, origin, 1.0, at(119));
        assert_eq!(versions(&c, "eastus"), ["1.30.5"]);
        let c = published(&base(), &timeline, origin, 1.0, at(120));
        assert_eq!(versions(&c, "eastus"), ["1.30.5", "1.30.7"]);
        assert_eq!(versions(&c, "westeurope"), ["1.30.5"]);
        assert_eq!(
            c.regions["eastus"].kubernetes[1].available_at,
            Some(at(120))
        );
        let c = published(&base(), &timeline, origin, 1.0, at(120 + 86_400));
        assert_eq!(versions(&c, "westeurope"), ["1.30.5", "1.30.7"]);
        assert!(
            c.regions["westeurope"]
                .node_images
                .contains_key("AKSUbuntu-2204gen2containerd")
        );
        // Announced: once out in eastus, it is listed in westeurope with its arrival there.
        let c = announced(&base(), &timeline, origin, 1.0, at(120));
        assert_eq!(versions(&c, "westeurope"), ["1.30.5", "1.30.7"]);
        assert_eq!(
            c.regions["westeurope"].kubernetes[1].available_at,
            Some(at(120 + 86_400))
        );
        let c = announced(&base(), &timeline, origin, 1.0, at(119));
        assert_eq!(versions(&c, "westeurope"), ["1.30.5"], "nothing is out yet");
        // 60 times faster: two virtual minutes are two real seconds.
        let c = published(&base(), &timeline, origin, 60.0, at(2));
        assert_eq!(versions(&c, "eastus"), ["1.30.5", "1.30.7"]);
        assert_eq!(
            change_instants(&base(), &timeline, origin, 60.0),
            [at(2), at(10), at(1442)]
        );
    }

    #[test]
    fn bad_releases_name_the_field() {
        for (json, target) in [
            (
                serde_json::json!([{"at": "soon", "kubernetesVersion": "1.30.7"}]),
                "releases[0].at",
            ),
            (
                serde_json::json!([{"at": 0, "kubernetesVersion": "1.30"}]),
                "releases[0].kubernetesVersion",
            ),
            (serde_json::json!([{"at": 0}]), "releases[0]"),
            (
                serde_json::json!([{"at": 0, "nodeImage": "202603.01.0"}]),
                "releases[0].nodeImage",
            ),
            (
                serde_json::json!([{"at": 0, "kubernetesVersion": "1.30.7", "regions": {"eastus": "later"}}]),
                "releases[0].regions.eastus",
            ),
            (
                serde_json::json!([{"at": -5, "kubernetesVersion": "1.30.7"}]),
                "releases[0].at",
            ),
        ] {
            let err = releases(json.clone()).expect_err(&json.to_string());
            assert_eq!(err.target, target, "{json}: {err:?}");
        }
    }
}
