//! Members, their clusters as last observed, and the release catalog (SEMANTICS §1–§3).

use std::collections::BTreeMap;

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
}

/// What a driver reports about a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub region: String,
    pub kubernetes_version: KubeVersion,
    pub node_pools: Vec<NodePool>,
    /// The AKS `aksManagedAutoUpgradeSchedule` window (Full and ControlPlaneOnly runs).
    pub kubernetes_window: Option<MaintenanceWindow>,
    /// The AKS `aksManagedNodeOSUpgradeSchedule` window (NodeImageOnly runs).
    pub node_os_window: Option<MaintenanceWindow>,
    pub long_term_support: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub cluster_resource_id: String,
    pub group: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub cluster: Cluster,
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
    pub fn kubernetes(&self, region: &str, version: KubeVersion, now: Time) -> Availability {
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

    /// When the first image of `family` arrives in `region`, if none is there at `now`.
    pub fn first_image_arrival(&self, region: &str, family: &str, now: Time) -> Availability {
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

    /// Whether any region lists this image (custom selections must name a real image).
    pub fn lists_image(&self, family: &str, version: &ImageVersion) -> bool {
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
