//! Members, their clusters as last observed, and the release catalog (SEMANTICS §1–§3).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::time::Time;
use crate::version::{ImageVersion, KubeVersion};
use crate::window::MaintenanceWindow;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Os {
    Linux,
    Windows,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePool {
    pub name: String,
    /// Image family: OS + SKU generation, e.g. `AKSUbuntu-2204gen2containerd`.
    pub family: String,
    pub os: Os,
    pub image: ImageVersion,
    /// The pool's Kubernetes version where it differs from the control plane's (a
    /// ControlPlaneOnly upgrade leaves pools behind); `None`: the control plane's.
    pub orchestrator_version: Option<KubeVersion>,
}

impl NodePool {
    /// The pool's Kubernetes version in `cluster`.
    pub fn kubernetes_version(&self, cluster: &Cluster) -> KubeVersion {
        self.orchestrator_version
            .unwrap_or(cluster.kubernetes_version)
    }
}

/// What a driver reports about a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub region: String,
    pub kubernetes_version: KubeVersion,
    pub node_pools: Vec<NodePool>,
    /// The AKS `aksManagedAutoUpgradeSchedule` window (Full and ControlPlaneOnly runs). Windows
    /// are shared, not copied, between the clusters and runs that hold them: a window is large
    /// and every run holds every member's cluster.
    pub kubernetes_window: Option<Arc<MaintenanceWindow>>,
    /// The AKS `aksManagedNodeOSUpgradeSchedule` window (NodeImageOnly runs).
    pub node_os_window: Option<Arc<MaintenanceWindow>>,
    pub long_term_support: bool,
    /// What the driver can roll back on this cluster, and until when (SEMANTICS §15).
    pub rollback: Vec<RollbackOffer>,
}

/// One scope a driver can take back to an earlier state (SEMANTICS §15).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RollbackScope {
    ControlPlane,
    NodePool(String),
}

impl std::fmt::Display for RollbackScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RollbackScope::ControlPlane => write!(f, "the control plane"),
            RollbackScope::NodePool(pool) => write!(f, "node pool {pool:?}"),
        }
    }
}

/// A rollback a driver offers: `scope` back to `kubernetes_version` (the control plane's, or
/// the pool's orchestrator version) and, for a node pool, `node_image`, until `until`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RollbackOffer {
    pub scope: RollbackScope,
    pub kubernetes_version: KubeVersion,
    pub node_image: Option<ImageVersion>,
    pub until: Time,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub cluster_resource_id: String,
    pub group: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub cluster: Cluster,
}

impl Cluster {
    /// A cluster nothing is known of: version 0.0.0, no node pools, no region. It stands in
    /// for a member that could not be observed, to learn whether a run selects it; it is never
    /// upgraded from.
    pub fn unknown() -> Cluster {
        Cluster {
            region: String::new(),
            kubernetes_version: crate::version::KubeVersion {
                major: 0,
                minor: 0,
                patch: 0,
            },
            node_pools: Vec::new(),
            kubernetes_window: None,
            node_os_window: None,
            long_term_support: false,
            rollback: Vec::new(),
        }
    }
}

/// A member as a fleet engine holds it: one copy, shared by every run of the fleet. Runs keep
/// pointers to its name and cluster, never copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedMember {
    pub name: Arc<str>,
    pub cluster_resource_id: Arc<str>,
    pub group: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub cluster: Arc<Cluster>,
}

impl From<&Member> for SharedMember {
    fn from(m: &Member) -> SharedMember {
        SharedMember {
            name: m.name.as_str().into(),
            cluster_resource_id: m.cluster_resource_id.as_str().into(),
            group: m.group.clone(),
            labels: m.labels.clone(),
            cluster: Arc::new(m.cluster.clone()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeRelease {
    pub version: KubeVersion,
    pub preview: bool,
    pub long_term_support: bool,
    /// When it became available in the region; `None` means it always was.
    pub available_at: Option<Time>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRelease {
    pub version: ImageVersion,
    pub available_at: Option<Time>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionCatalog {
    pub kubernetes: Vec<KubeRelease>,
    /// Family → versions, in the order listed.
    pub node_images: BTreeMap<String, Vec<ImageRelease>>,
    /// Families in the order first listed (the scenario default pool takes the first).
    pub family_order: Vec<String>,
}

/// When something becomes available in a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    Now,
    At(Time),
    /// Not in the catalog at all: it may appear when the catalog changes.
    Unlisted,
}

impl Availability {
    fn of(available_at: Option<Time>, now: Time) -> Availability {
        match available_at {
            Some(t) if t > now => Availability::At(t),
            _ => Availability::Now,
        }
    }

    /// The later of two requirements.
    pub fn and(self, other: Availability) -> Availability {
        match (self, other) {
            (Availability::Unlisted, _) | (_, Availability::Unlisted) => Availability::Unlisted,
            (Availability::At(a), Availability::At(b)) => Availability::At(a.max(b)),
            (Availability::At(a), Availability::Now) | (Availability::Now, Availability::At(a)) => {
                Availability::At(a)
            }
            (Availability::Now, Availability::Now) => Availability::Now,
        }
    }
}

/// Per region, the Kubernetes versions and node images and when each arrived there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    pub regions: BTreeMap<String, RegionCatalog>,
}

impl Catalog {
    /// An empty catalog means the driver reports no release data (an `exec` driver without a
    /// `catalog` command): every version is taken as available everywhere, and Latest node
    /// images cannot be chosen, so node pools are left to the driver.
    pub fn is_unknown(&self) -> bool {
        self.regions.is_empty()
    }

    pub fn kubernetes(&self, region: &str, version: KubeVersion, now: Time) -> Availability {
        if self.is_unknown() {
            return Availability::Now;
        }
        self.regions
            .get(region)
            .and_then(|r| r.kubernetes.iter().find(|k| k.version == version))
            .map_or(Availability::Unlisted, |k| {
                Availability::of(k.available_at, now)
            })
    }

    pub fn image(
        &self,
        region: &str,
        family: &str,
        version: &ImageVersion,
        now: Time,
    ) -> Availability {
        if self.is_unknown() {
            return Availability::Now;
        }
        self.regions
            .get(region)
            .and_then(|r| r.node_images.get(family))
            .and_then(|list| list.iter().find(|i| &i.version == version))
            .map_or(Availability::Unlisted, |i| {
                Availability::of(i.available_at, now)
            })
    }

    /// The newest image of `family` available in `region` at `now`.
    pub fn newest_image(&self, region: &str, family: &str, now: Time) -> Option<&ImageVersion> {
        self.regions
            .get(region)?
            .node_images
            .get(family)?
            .iter()
            .filter(|i| i.available_at.is_none_or(|t| t <= now))
            .map(|i| &i.version)
            .max()
    }

    /// The newest generally available patch of `major.minor` in `region` at `now` (SEMANTICS
    /// §13, a chain's intermediate version): not a preview, and a patch kept only by long-term
    /// support only for a cluster with it (`long_term_support`).
    pub fn newest_patch(
        &self,
        region: &str,
        (major, minor): (u32, u32),
        long_term_support: bool,
        now: Time,
    ) -> Option<KubeVersion> {
        self.patches(region, (major, minor), long_term_support)
            .filter(|k| k.available_at.is_none_or(|t| t <= now))
            .map(|k| k.version)
            .max()
    }

    /// When the first patch [`Catalog::newest_patch`] could choose arrives in `region`.
    pub fn patch_arrival(
        &self,
        region: &str,
        line: (u32, u32),
        long_term_support: bool,
        now: Time,
    ) -> Availability {
        self.patches(region, line, long_term_support)
            .map(|k| Availability::of(k.available_at, now))
            .min_by_key(|a| match a {
                Availability::Now => (0, Time(i64::MIN)),
                Availability::At(t) => (1, *t),
                Availability::Unlisted => (2, Time(i64::MAX)),
            })
            .unwrap_or(Availability::Unlisted)
    }

    fn patches(
        &self,
        region: &str,
        line: (u32, u32),
        long_term_support: bool,
    ) -> impl Iterator<Item = &KubeRelease> {
        self.regions
            .get(region)
            .into_iter()
            .flat_map(|r| r.kubernetes.iter())
            .filter(move |k| {
                k.version.minor_line() == line
                    && !k.preview
                    && (long_term_support || !k.long_term_support)
            })
    }

    /// When the first image of `family` arrives in `region`, if none is there at `now`.
    pub fn first_image_arrival(&self, region: &str, family: &str, now: Time) -> Availability {
        if self.is_unknown() {
            return Availability::Now;
        }
        let Some(list) = self
            .regions
            .get(region)
            .and_then(|r| r.node_images.get(family))
        else {
            return Availability::Unlisted;
        };
        list.iter()
            .map(|i| Availability::of(i.available_at, now))
            .min_by_key(|a| match a {
                Availability::Now => (0, Time(i64::MIN)),
                Availability::At(t) => (1, *t),
                Availability::Unlisted => (2, Time(i64::MAX)),
            })
            .unwrap_or(Availability::Unlisted)
    }

    /// Whether any region lists this Kubernetes version, arrived or announced.
    pub fn lists_kubernetes(&self, version: KubeVersion) -> bool {
        self.is_unknown()
            || self
                .regions
                .values()
                .any(|r| r.kubernetes.iter().any(|k| k.version == version))
    }

    /// Whether any region lists this image (custom selections must name a real image).
    pub fn lists_image(&self, family: &str, version: &ImageVersion) -> bool {
        if self.is_unknown() {
            return true;
        }
        self.regions.values().any(|r| {
            r.node_images
                .get(family)
                .is_some_and(|l| l.iter().any(|i| &i.version == version))
        })
    }

    /// The newest version of `family` available at `now` in every one of `regions`
    /// (SEMANTICS §1, Consistent).
    pub fn newest_common_image<'a>(
        &self,
        family: &str,
        regions: impl IntoIterator<Item = &'a str>,
        now: Time,
    ) -> Option<ImageVersion> {
        let mut common: Option<Vec<&ImageVersion>> = None;
        for region in regions {
            let available: Vec<&ImageVersion> = self
                .regions
                .get(region)
                .and_then(|r| r.node_images.get(family))
                .map(|l| {
                    l.iter()
                        .filter(|i| i.available_at.is_none_or(|t| t <= now))
                        .map(|i| &i.version)
                        .collect()
                })
                .unwrap_or_default();
            common = Some(match common {
                None => available,
                Some(prev) => prev.into_iter().filter(|v| available.contains(v)).collect(),
            });
        }
        common?.into_iter().max().cloned()
    }
}

// ---------------------------------------------------------------------------------------------
// Wire forms: how clusters and catalogs are written in the API, in scenarios and in storage.

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};
use crate::window::MaintenanceWindowSpec;

fn invalid(path: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequestContent,
        format!("{path}: {message}"),
        path,
    )
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePoolSpec {
    pub name: String,
    pub family: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// A version (`202602.10.0`) or the AKS form `<family>-<version>`.
    pub node_image_version: String,
    /// The pool's Kubernetes version; absent: the control plane's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestrator_version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaintenanceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<MaintenanceWindowSpec>,
    #[serde(default, rename = "nodeOS", skip_serializing_if = "Option::is_none")]
    pub node_os: Option<MaintenanceWindowSpec>,
}

/// A cluster as a driver reports it (`status.cluster` of a member).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    pub region: String,
    pub kubernetes_version: String,
    #[serde(default)]
    pub node_pools: Vec<NodePoolSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceSpec>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub long_term_support: bool,
    /// What the driver can roll back, and until when (SEMANTICS §15).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollback: Vec<RollbackOfferSpec>,
}

/// A rollback a driver offers, as written: `{scope: "ControlPlane" | "NodePool", pool?, to,
/// until}`, `to` being `{kubernetesVersion}` for the control plane and `{orchestratorVersion,
/// nodeImageVersion}` for a node pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackOfferSpec {
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub to: RollbackToSpec,
    pub until: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackToSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestrator_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image_version: Option<String>,
}

impl RollbackOffer {
    pub fn parse(spec: &RollbackOfferSpec, path: &str) -> Result<RollbackOffer, ApiError> {
        let version = |text: &Option<String>, field: &str| {
            let at = format!("{path}.to.{field}");
            let text = text.as_deref().ok_or_else(|| invalid(&at, "is required"))?;
            KubeVersion::parse(text)
                .ok_or_else(|| invalid(&at, format!("{text:?} is not a version major.minor.patch")))
        };
        let until = Time::parse(&spec.until)
            .map_err(|e| invalid(&format!("{path}.until"), format!("{:?}: {e}", spec.until)))?;
        let (scope, kubernetes_version, node_image) = match (spec.scope.as_str(), &spec.pool) {
            ("ControlPlane", None) => (
                RollbackScope::ControlPlane,
                version(&spec.to.kubernetes_version, "kubernetesVersion")?,
                None,
            ),
            ("ControlPlane", Some(pool)) => {
                return Err(invalid(
                    &format!("{path}.pool"),
                    format!("{pool:?}: a ControlPlane rollback names no node pool"),
                ));
            }
            ("NodePool", Some(pool)) if !pool.is_empty() => {
                let at = format!("{path}.to.nodeImageVersion");
                let text = spec
                    .to
                    .node_image_version
                    .as_deref()
                    .ok_or_else(|| invalid(&at, "is required"))?;
                let bare = text.rsplit('-').next().unwrap_or(text);
                let image = ImageVersion::parse(bare)
                    .ok_or_else(|| invalid(&at, format!("{text:?} is not a node image version")))?;
                (
                    RollbackScope::NodePool(pool.clone()),
                    version(&spec.to.orchestrator_version, "orchestratorVersion")?,
                    Some(image),
                )
            }
            ("NodePool", _) => {
                return Err(invalid(
                    &format!("{path}.pool"),
                    "a NodePool rollback names its node pool",
                ));
            }
            (other, _) => {
                return Err(invalid(
                    &format!("{path}.scope"),
                    format!("{other:?} must be ControlPlane or NodePool"),
                ));
            }
        };
        Ok(RollbackOffer {
            scope,
            kubernetes_version,
            node_image,
            until,
        })
    }

    pub fn spec(&self) -> RollbackOfferSpec {
        let (scope, pool, to) = match &self.scope {
            RollbackScope::ControlPlane => (
                "ControlPlane",
                None,
                RollbackToSpec {
                    kubernetes_version: Some(self.kubernetes_version.to_string()),
                    ..RollbackToSpec::default()
                },
            ),
            RollbackScope::NodePool(pool) => (
                "NodePool",
                Some(pool.clone()),
                RollbackToSpec {
                    orchestrator_version: Some(self.kubernetes_version.to_string()),
                    node_image_version: self.node_image.as_ref().map(|i| i.to_string()),
                    ..RollbackToSpec::default()
                },
            ),
        };
        RollbackOfferSpec {
            scope: scope.into(),
            pool,
            to,
            until: self.until.to_string(),
        }
    }
}

impl NodePool {
    pub fn parse(spec: &NodePoolSpec, path: &str) -> Result<NodePool, ApiError> {
        let os = match spec.os.as_deref() {
            None | Some("Linux") => Os::Linux,
            Some("Windows") => Os::Windows,
            Some(other) => {
                return Err(invalid(
                    &format!("{path}.os"),
                    format!("{other:?} must be Linux or Windows"),
                ));
            }
        };
        let text = spec.node_image_version.as_str();
        let version = text
            .strip_prefix(&format!("{}-", spec.family))
            .unwrap_or(text);
        let image = ImageVersion::parse(version).ok_or_else(|| {
            invalid(
                &format!("{path}.nodeImageVersion"),
                format!("{text:?} is not a node image version"),
            )
        })?;
        let orchestrator_version = spec
            .orchestrator_version
            .as_deref()
            .map(|v| {
                KubeVersion::parse(v).ok_or_else(|| {
                    invalid(
                        &format!("{path}.orchestratorVersion"),
                        format!("{v:?} is not a version major.minor.patch"),
                    )
                })
            })
            .transpose()?;
        Ok(NodePool {
            name: spec.name.clone(),
            family: spec.family.clone(),
            os,
            image,
            orchestrator_version,
        })
    }

    pub fn spec(&self) -> NodePoolSpec {
        NodePoolSpec {
            name: self.name.clone(),
            family: self.family.clone(),
            os: Some(match self.os {
                Os::Linux => "Linux".into(),
                Os::Windows => "Windows".into(),
            }),
            node_image_version: format!("{}-{}", self.family, self.image),
            orchestrator_version: self.orchestrator_version.map(|v| v.to_string()),
        }
    }
}

impl Cluster {
    pub fn parse(spec: &ClusterSpec, path: &str) -> Result<Cluster, ApiError> {
        let kubernetes_version = KubeVersion::parse(&spec.kubernetes_version).ok_or_else(|| {
            invalid(
                &format!("{path}.kubernetesVersion"),
                format!(
                    "{:?} is not a version major.minor.patch",
                    spec.kubernetes_version
                ),
            )
        })?;
        let node_pools = spec
            .node_pools
            .iter()
            .enumerate()
            .map(|(i, p)| NodePool::parse(p, &format!("{path}.nodePools[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let maintenance = spec.maintenance.clone().unwrap_or_default();
        let window = |w: &Option<MaintenanceWindowSpec>, field: &str| {
            w.as_ref()
                .map(|w| MaintenanceWindow::parse(w, &format!("{path}.maintenance.{field}")))
                .transpose()
                .map(|w| w.map(Arc::new))
        };
        Ok(Cluster {
            region: spec.region.clone(),
            kubernetes_version,
            node_pools,
            kubernetes_window: window(&maintenance.kubernetes, "kubernetes")?,
            node_os_window: window(&maintenance.node_os, "nodeOS")?,
            long_term_support: spec.long_term_support,
            rollback: spec
                .rollback
                .iter()
                .enumerate()
                .map(|(i, r)| RollbackOffer::parse(r, &format!("{path}.rollback[{i}]")))
                .collect::<Result<_, _>>()?,
        })
    }

    pub fn spec(&self) -> ClusterSpec {
        let kubernetes = self.kubernetes_window.as_ref().map(|w| w.spec().clone());
        let node_os = self.node_os_window.as_ref().map(|w| w.spec().clone());
        ClusterSpec {
            region: self.region.clone(),
            kubernetes_version: self.kubernetes_version.to_string(),
            node_pools: self.node_pools.iter().map(NodePool::spec).collect(),
            maintenance: (kubernetes.is_some() || node_os.is_some()).then_some(MaintenanceSpec {
                kubernetes,
                node_os,
            }),
            long_term_support: self.long_term_support,
            rollback: self.rollback.iter().map(RollbackOffer::spec).collect(),
        }
    }
}

impl Serialize for Cluster {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.spec().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Cluster {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = ClusterSpec::deserialize(deserializer)?;
        Cluster::parse(&spec, "cluster").map_err(|e| serde::de::Error::custom(e.message))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeReleaseSpec {
    pub version: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preview: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lts: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageReleaseSpec {
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegionCatalogSpec {
    #[serde(default)]
    pub kubernetes: Vec<KubeReleaseSpec>,
    /// Family → versions, in the order listed.
    #[serde(default)]
    pub node_images: serde_json::Map<String, serde_json::Value>,
}

/// Region → releases, the form of the scenarios' `catalog` and of `GET …/releases`.
pub type CatalogSpec = BTreeMap<String, RegionCatalogSpec>;

fn time_field(path: &str, text: &Option<String>) -> Result<Option<Time>, ApiError> {
    text.as_deref()
        .map(|t| Time::parse(t).map_err(|e| invalid(path, e)))
        .transpose()
}

impl Catalog {
    pub fn parse(spec: &CatalogSpec, path: &str) -> Result<Catalog, ApiError> {
        let mut catalog = Catalog::default();
        for (region, r) in spec {
            let rpath = if path.is_empty() {
                region.clone()
            } else {
                format!("{path}.{region}")
            };
            let mut rc = RegionCatalog::default();
            for (i, k) in r.kubernetes.iter().enumerate() {
                let kpath = format!("{rpath}.kubernetes[{i}]");
                rc.kubernetes.push(KubeRelease {
                    version: KubeVersion::parse(&k.version).ok_or_else(|| {
                        invalid(
                            &format!("{kpath}.version"),
                            format!("{:?} is not a version major.minor.patch", k.version),
                        )
                    })?,
                    preview: k.preview,
                    long_term_support: k.lts,
                    available_at: time_field(&format!("{kpath}.availableAt"), &k.available_at)?,
                });
            }
            for (family, list) in &r.node_images {
                let fpath = format!("{rpath}.nodeImages.{family}");
                let releases: Vec<ImageReleaseSpec> =
                    crate::error::from_json_value(list.clone(), &fpath)?;
                let mut out = Vec::with_capacity(releases.len());
                for (i, rel) in releases.iter().enumerate() {
                    let ipath = format!("{fpath}[{i}]");
                    let text = rel.version.as_str();
                    let version = text.strip_prefix(&format!("{family}-")).unwrap_or(text);
                    out.push(ImageRelease {
                        version: ImageVersion::parse(version).ok_or_else(|| {
                            invalid(
                                &format!("{ipath}.version"),
                                format!("{text:?} is not a node image version"),
                            )
                        })?,
                        available_at: time_field(
                            &format!("{ipath}.availableAt"),
                            &rel.available_at,
                        )?,
                    });
                }
                rc.family_order.push(family.clone());
                rc.node_images.insert(family.clone(), out);
            }
            catalog.regions.insert(region.clone(), rc);
        }
        Ok(catalog)
    }

    pub fn spec(&self) -> CatalogSpec {
        self.regions
            .iter()
            .map(|(region, rc)| {
                let mut node_images = serde_json::Map::new();
                for family in &rc.family_order {
                    let list: Vec<ImageReleaseSpec> = rc.node_images[family]
                        .iter()
                        .map(|i| ImageReleaseSpec {
                            version: i.version.to_string(),
                            available_at: i.available_at.map(|t| t.to_string()),
                        })
                        .collect();
                    node_images.insert(
                        family.clone(),
                        serde_json::to_value(list).unwrap_or_default(),
                    );
                }
                let spec = RegionCatalogSpec {
                    kubernetes: rc
                        .kubernetes
                        .iter()
                        .map(|k| KubeReleaseSpec {
                            version: k.version.to_string(),
                            preview: k.preview,
                            lts: k.long_term_support,
                            available_at: k.available_at.map(|t| t.to_string()),
                        })
                        .collect(),
                    node_images,
                };
                (region.clone(), spec)
            })
            .collect()
    }
}

impl Serialize for Catalog {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.spec().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Catalog {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = CatalogSpec::deserialize(deserializer)?;
        Catalog::parse(&spec, "").map_err(|e| serde::de::Error::custom(e.message))
    }
}

/// A member as stored in a run's snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRecord {
    pub name: String,
    pub cluster_resource_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub cluster: Cluster,
}

impl From<MemberRecord> for Member {
    fn from(r: MemberRecord) -> Member {
        Member {
            name: r.name,
            cluster_resource_id: r.cluster_resource_id,
            group: r.group,
            labels: r.labels,
            cluster: r.cluster,
        }
    }
}

impl From<&Member> for MemberRecord {
    fn from(m: &Member) -> MemberRecord {
        MemberRecord {
            name: m.name.clone(),
            cluster_resource_id: m.cluster_resource_id.clone(),
            group: m.group.clone(),
            labels: m.labels.clone(),
            cluster: m.cluster.clone(),
        }
    }
}
