//! Fixtures the engine's door tests share.

#![allow(dead_code)]

use std::collections::BTreeMap;

use flotilla_engine::engine::RunSpec;
use flotilla_engine::fleet::{Catalog, Cluster, KubeRelease, Member, RegionCatalog};
use flotilla_engine::strategy::{NodeImageSelection, Upgrade, UpgradeType};
use flotilla_engine::version::KubeVersion;

pub fn v(text: &str) -> KubeVersion {
    KubeVersion::parse(text).expect("valid version")
}

/// A member without labels or group, its cluster in `region` at `version`, no node pools and
/// no windows.
pub fn member_at(name: &str, region: &str, version: &str) -> Member {
    Member {
        name: name.into(),
        cluster_resource_id: format!("/c/{name}"),
        group: None,
        labels: BTreeMap::new(),
        cluster: Cluster {
            rollback: Default::default(),
            region: region.into(),
            kubernetes_version: v(version),
            node_pools: vec![],
            kubernetes_window: None,
            node_os_window: None,
            long_term_support: false,
        },
    }
}

/// A catalog listing these Kubernetes versions in these regions, available now.
pub fn catalog(regions: &[(&str, &[&str])]) -> Catalog {
    let mut c = Catalog::default();
    for (region, versions) in regions {
        let mut rc = RegionCatalog::default();
        for version in *versions {
            rc.kubernetes.push(KubeRelease {
                version: v(version),
                preview: false,
                long_term_support: false,
                available_at: None,
            });
        }
        c.regions.insert(region.to_string(), rc);
    }
    c
}

/// A run without a strategy upgrading the control plane to `version`.
pub fn control_plane(version: &str) -> RunSpec {
    RunSpec {
        strategy: None,
        rules: Default::default(),
        upgrade: Upgrade {
            upgrade_type: UpgradeType::ControlPlaneOnly,
            kubernetes_version: Some(v(version)),
            node_images: NodeImageSelection::Latest,
        },
    }
}
