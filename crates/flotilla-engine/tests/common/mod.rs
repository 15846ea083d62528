//! Fixtures the engine's door tests share.

#![allow(dead_code)]

use std::collections::BTreeMap;

use flotilla_engine::fleet::{Cluster, Member};
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
            region: region.into(),
            kubernetes_version: v(version),
            node_pools: vec![],
            kubernetes_window: None,
            node_os_window: None,
            long_term_support: false,
        },
    }
}
