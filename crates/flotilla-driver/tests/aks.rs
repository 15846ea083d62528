//! The `aks` driver against a fake of Azure Resource Manager and of its token endpoint
//! (`fake_arm`): observation with windows, every upgrade type followed through its long-running
//! operation, a resend attaching to the upgrade it started, throttling and expired tokens
//! slowing calls but failing nothing, someone else's operation making the driver wait, the
//! catalog from ARM's listings, and node pool rollbacks (offers, the rollback itself, AKS's
//! refusal after seven days).

mod fake_arm;

use std::time::Duration;

use serde_json::{Value, json};

use flotilla_driver::aks::AksDriver;
use flotilla_driver::{Driver, MemberRef, OperationState};
use flotilla_engine::engine::{PoolTarget, Rollback, Target};
use flotilla_engine::fleet::RollbackScope;
use flotilla_engine::strategy::UpgradeType;
use flotilla_engine::version::{ImageVersion, KubeVersion};

use fake_arm::{NEWEST_IMAGE, SECRET, cluster, cluster_id};

const SUB: &str = "00000000-0000-0000-0000-00000000aaaa";

fn driver(base: &str) -> AksDriver {
    // A file per driver: tests run side by side, and a file rewritten while read is empty.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let secret =
        std::env::temp_dir().join(format!("flotilla-aks-secret-{}-{n}", std::process::id()));
    std::fs::write(&secret, format!("{SECRET}\n")).expect("secret file");
    AksDriver::new(&json!({
        "type": "aks",
        "credential": {"type": "ClientSecret", "tenantId": "tenant-1", "clientId": "client-1", "clientSecretFile": secret},
        "armEndpoint": base,
        "authorityHost": base,
        "pollIntervalSeconds": 0.05,
    }))
    .expect("a valid configuration")
}

fn member(name: &str) -> MemberRef {
    MemberRef {
        name: name.into(),
        cluster_resource_id: cluster_id(SUB, name),
    }
}

async fn with_clusters(names: &[&str]) -> (String, fake_arm::Shared) {
    let (base, fake) = fake_arm::start().await;
    {
        let mut f = fake.lock().expect("fake");
        for name in names {
            let id = cluster_id(SUB, name);
            f.clusters
                .insert(id.clone(), cluster(&id, "eastus", "1.30.5"));
        }
    }
    (base, fake)
}

/// Polls an operation to its end (with a bound), as the server's task does.
async fn follow(driver: &AksDriver, m: &MemberRef, op: &str, key: &str) -> OperationState {
    for _ in 0..100 {
        match driver.poll(m, op, key).await.expect("a poll answers") {
            OperationState::Running => tokio::time::sleep(Duration::from_millis(10)).await,
            done => return done,
        }
    }
    panic!("the operation did not end");
}

fn version(v: &str) -> Option<KubeVersion> {
    Some(KubeVersion::parse(v).expect("version"))
}

#[tokio::test]
async fn observes_a_cluster_its_pools_and_its_two_windows() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let window = json!({"schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Sunday"}}, "durationHours": 4, "startTime": "00:00", "utcOffset": "+00:00"});
    fake.lock().expect("fake").windows.insert(
        (
            cluster_id(SUB, "c1"),
            "aksManagedAutoUpgradeSchedule".into(),
        ),
        window.clone(),
    );
    let d = driver(&base);
    let seen = d.observe(&member("c1")).await.expect("observed");
    assert_eq!(seen.region, "eastus");
    assert_eq!(seen.kubernetes_version, "1.30.5");
    assert_eq!(seen.node_pools.len(), 2);
    assert_eq!(seen.node_pools[0].family, "AKSUbuntu-2204gen2containerd");
    assert_eq!(
        seen.node_pools[0].node_image_version,
        "AKSUbuntu-2204gen2containerd-202602.10.0"
    );
    let maintenance = seen.maintenance.expect("windows");
    assert_eq!(
        serde_json::to_value(maintenance.kubernetes).expect("json"),
        window
    );
    assert!(maintenance.node_os.is_none(), "no node OS configuration");
    // A cluster that does not exist is a definitive answer; an id that is not AKS's too.
    let missing = d.observe(&member("nowhere")).await.expect_err("missing");
    assert!(
        !missing.is_transient() && missing.message.contains("does not exist"),
        "{}",
        missing.message
    );
    let bad = d
        .observe(&MemberRef {
            name: "x".into(),
            cluster_resource_id: "aks-x".into(),
        })
        .await
        .expect_err("not an ARM id");
    assert!(bad.message.contains("clusterResourceId"), "{}", bad.message);
}

#[tokio::test]
async fn a_full_upgrade_is_one_put_followed_to_its_end_and_a_resend_attaches() {
    let (base, fake) = with_clusters(&["c1"]).await;
    fake.lock().expect("fake").op_polls = 5;
    let d = driver(&base);
    let m = member("c1");
    let target = Target {
        rollback: None,
        upgrade_type: UpgradeType::Full,
        kubernetes_version: version("1.31.2"),
        node_images: vec![],
    };
    let op = d
        .start_upgrade(&m, &target, "edge.r1.1")
        .await
        .expect("sent");
    // The server asks again with the same key (say it crashed before recording the answer):
    // the driver finds its upgrade and attaches; nothing more is sent.
    let again = d
        .start_upgrade(&m, &target, "edge.r1.1")
        .await
        .expect("attached");
    assert_eq!(
        follow(&d, &m, &op, "edge.r1.1").await,
        OperationState::Succeeded
    );
    assert_eq!(
        follow(&d, &m, &again, "edge.r1.1").await,
        OperationState::Succeeded
    );
    let f = fake.lock().expect("fake");
    assert_eq!(
        f.count("PUT", "/managedClusters/c1"),
        1,
        "one upgrade sent: {:?}",
        f.requests
    );
    let c = &f.clusters[&cluster_id(SUB, "c1")];
    assert_eq!(c["properties"]["currentKubernetesVersion"], "1.31.2");
    assert_eq!(c["tags"]["flotilla-operation"], "edge.r1.1");
    assert_eq!(c["tags"]["env"], "prod", "the cluster's own tags are kept");
    for pool in c["properties"]["agentPoolProfiles"]
        .as_array()
        .expect("pools")
    {
        assert_eq!(pool["currentOrchestratorVersion"], "1.31.2", "{pool}");
    }
}

#[tokio::test]
async fn control_plane_only_leaves_the_pools_and_a_lost_answer_is_found_by_its_key() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let d = driver(&base);
    let m = member("c1");
    // Nothing was sent under this key: the server must send it again.
    assert_eq!(
        d.poll(&m, "edge.r2.1", "edge.r2.1").await.expect("poll"),
        OperationState::Unknown
    );
    let target = Target {
        rollback: None,
        upgrade_type: UpgradeType::ControlPlaneOnly,
        kubernetes_version: version("1.31.1"),
        node_images: vec![],
    };
    let _op = d
        .start_upgrade(&m, &target, "edge.r2.1")
        .await
        .expect("sent");
    // The answer was lost: polled by its key, the cluster says it arrived.
    assert_eq!(
        follow(&d, &m, "edge.r2.1", "edge.r2.1").await,
        OperationState::Succeeded
    );
    let f = fake.lock().expect("fake");
    let c = &f.clusters[&cluster_id(SUB, "c1")];
    assert_eq!(c["properties"]["currentKubernetesVersion"], "1.31.1");
    for pool in c["properties"]["agentPoolProfiles"]
        .as_array()
        .expect("pools")
    {
        assert_eq!(
            pool["currentOrchestratorVersion"], "1.30.5",
            "pools untouched: {pool}"
        );
    }
}

#[tokio::test]
async fn node_images_move_each_pool_to_its_region_s_newest_and_a_pinned_older_one_is_refused() {
    let (base, fake) = with_clusters(&["c1", "c2"]).await;
    let d = driver(&base);
    for name in ["c1", "c2"] {
        d.observe(&member(name)).await.expect("observed");
    }
    let pool = |p: &str, image: &str| PoolTarget {
        pool: p.into(),
        family: "AKSUbuntu-2204gen2containerd".into(),
        image: ImageVersion::parse(image).expect("image"),
    };
    let latest = Target {
        rollback: None,
        upgrade_type: UpgradeType::NodeImageOnly,
        kubernetes_version: None,
        node_images: vec![pool("system", NEWEST_IMAGE), pool("user", NEWEST_IMAGE)],
    };
    let m = member("c1");
    let op = d
        .start_upgrade(&m, &latest, "edge.r3.1")
        .await
        .expect("sent");
    assert_eq!(
        follow(&d, &m, &op, "edge.r3.1").await,
        OperationState::Succeeded
    );
    {
        let f = fake.lock().expect("fake");
        assert_eq!(f.count("POST", "/upgradeNodeImageVersion"), 2);
        for p in f.clusters[&cluster_id(SUB, "c1")]["properties"]["agentPoolProfiles"]
            .as_array()
            .expect("pools")
        {
            assert_eq!(
                p["nodeImageVersion"],
                format!("AKSUbuntu-2204gen2containerd-{NEWEST_IMAGE}")
            );
        }
    }
    // A Consistent or Custom selection pinned below the newest cannot be had from AKS.
    let pinned = Target {
        rollback: None,
        upgrade_type: UpgradeType::NodeImageOnly,
        kubernetes_version: None,
        node_images: vec![pool("system", "202602.10.0")],
    };
    let e = d
        .start_upgrade(&member("c2"), &pinned, "edge.r4.1")
        .await
        .expect_err("refused");
    assert!(
        !e.is_transient() && e.message.starts_with("NodeImageSelectionUnsupported"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn throttling_and_an_expired_token_slow_calls_but_fail_nothing() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let d = driver(&base);
    d.observe(&member("c1")).await.expect("observed");
    assert_eq!(
        fake.lock().expect("fake").tokens_issued,
        1,
        "the token is kept"
    );
    // Two 429s with Retry-After: 1, then the answer.
    fake.lock().expect("fake").throttle_next = 2;
    let started = std::time::Instant::now();
    d.observe(&member("c1"))
        .await
        .expect("observed after the throttling");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "Retry-After was honoured"
    );
    // Every token expires: one 401, one new token, the answer.
    fake.lock().expect("fake").valid_tokens.clear();
    d.observe(&member("c1"))
        .await
        .expect("observed with a new token");
    assert_eq!(fake.lock().expect("fake").tokens_issued, 2);
}

#[tokio::test]
async fn someone_else_s_operation_makes_the_driver_wait_not_fail() {
    let (base, fake) = with_clusters(&["c1"]).await;
    fake.lock().expect("fake").start_foreign(
        &cluster_id(SUB, "c1"),
        "1.30.6",
        Duration::from_secs(3600),
    );
    let d = driver(&base);
    let target = Target {
        rollback: None,
        upgrade_type: UpgradeType::Full,
        kubernetes_version: version("1.31.2"),
        node_images: vec![],
    };
    let e = d
        .start_upgrade(&member("c1"), &target, "edge.r5.1")
        .await
        .expect_err("busy");
    assert!(e.is_transient(), "{}", e.message);
    assert!(
        e.message.contains("another operation is in progress"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn a_failed_operation_fails_with_arm_s_message() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let d = driver(&base);
    let m = member("c1");
    let target = Target {
        rollback: None,
        upgrade_type: UpgradeType::Full,
        kubernetes_version: version("1.31.2"),
        node_images: vec![],
    };
    let op = d
        .start_upgrade(&m, &target, "edge.r6.1")
        .await
        .expect("sent");
    for o in fake.lock().expect("fake").ops.values_mut() {
        o.fails = Some("Drain of node aks-user-1 did not complete: pod disruption budget".into());
    }
    match follow(&d, &m, &op, "edge.r6.1").await {
        OperationState::Failed(message) => {
            assert!(message.contains("pod disruption budget"), "{message}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn the_catalog_lists_versions_and_every_page_of_node_images_of_the_regions_seen() {
    let (base, _fake) = with_clusters(&["c1"]).await;
    let d = driver(&base);
    assert!(
        d.catalog().await.expect("catalog").regions.is_empty(),
        "no region seen yet"
    );
    d.observe(&member("c1")).await.expect("observed");
    let catalog = d.catalog().await.expect("catalog");
    let spec = serde_json::to_value(catalog.spec()).expect("json");
    let eastus = &spec["eastus"];
    let versions: Vec<&str> = eastus["kubernetes"]
        .as_array()
        .expect("versions")
        .iter()
        .filter_map(|k| k["version"].as_str())
        .collect();
    for v in ["1.30.5", "1.30.6", "1.31.1", "1.31.2", "1.32.0", "1.27.102"] {
        assert!(versions.contains(&v), "{v} in {versions:?}");
    }
    let flag = |v: &str, key: &str| {
        eastus["kubernetes"]
            .as_array()
            .expect("versions")
            .iter()
            .find(|k| k["version"] == v)
            .map(|k| k[key] == Value::Bool(true))
    };
    assert_eq!(flag("1.32.0", "preview"), Some(true));
    assert_eq!(
        flag("1.27.102", "lts"),
        Some(true),
        "kept only by long-term support"
    );
    assert_eq!(
        flag("1.30.5", "lts"),
        Some(false),
        "also community-supported"
    );
    // The second page (through nextLink) is read too.
    assert!(
        eastus["nodeImages"]["AKSWindows-2022-containerd"].is_array(),
        "{eastus}"
    );
    assert!(
        eastus["nodeImages"]["AKSUbuntu-2204gen2containerd"].is_array(),
        "{eastus}"
    );
}

#[tokio::test]
async fn a_managed_identity_gets_its_token_from_the_metadata_endpoint() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let d = AksDriver::new(&json!({
        "type": "aks",
        "credential": {"type": "ManagedIdentity", "identityEndpoint": format!("{base}/metadata/identity/oauth2/token")},
        "armEndpoint": base,
    }))
    .expect("valid");
    d.observe(&member("c1")).await.expect("observed");
    assert_eq!(fake.lock().expect("fake").tokens_issued, 1);
    // A wrong secret is a configuration to fix: transient, so no member fails for it.
    let wrong = std::env::temp_dir().join(format!("flotilla-aks-wrong-{}", std::process::id()));
    std::fs::write(&wrong, "nope").expect("file");
    let d = AksDriver::new(&json!({
        "type": "aks",
        "credential": {"type": "ClientSecret", "tenantId": "t", "clientId": "c", "clientSecretFile": wrong},
        "armEndpoint": base, "authorityHost": base,
    }))
    .expect("valid");
    let e = d.observe(&member("c1")).await.expect_err("refused");
    assert!(
        e.is_transient() && e.message.contains("Invalid client secret"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn a_workload_identity_trades_its_federated_token_file_for_a_token() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let file = std::env::temp_dir().join(format!("flotilla-aks-federated-{}", std::process::id()));
    std::fs::write(&file, "eyJhbGciOiJSUzI1NiJ9.e30.signature\n").expect("token file");
    let d = AksDriver::new(&json!({
        "type": "aks",
        "credential": {"type": "WorkloadIdentity", "tenantId": "tenant-1", "clientId": "client-1", "tokenFile": file},
        "armEndpoint": base, "authorityHost": base,
    }))
    .expect("valid");
    d.observe(&member("c1")).await.expect("observed");
    assert_eq!(fake.lock().expect("fake").tokens_issued, 1);
}

#[tokio::test]
async fn an_operation_followed_by_its_location_header() {
    let (base, fake) = with_clusters(&["c1"]).await;
    fake.lock().expect("fake").location_only = true;
    let d = driver(&base);
    let m = member("c1");
    let target = Target {
        rollback: None,
        upgrade_type: UpgradeType::ControlPlaneOnly,
        kubernetes_version: version("1.31.1"),
        node_images: vec![],
    };
    let op = d
        .start_upgrade(&m, &target, "edge.r7.1")
        .await
        .expect("sent");
    assert!(op.contains("result=location"), "{op}");
    assert_eq!(
        follow(&d, &m, &op, "edge.r7.1").await,
        OperationState::Succeeded
    );
    let f = fake.lock().expect("fake");
    assert_eq!(
        f.clusters[&cluster_id(SUB, "c1")]["properties"]["currentKubernetesVersion"],
        "1.31.1"
    );
}

/// A chain (SEMANTICS §13) through the driver: each hop is one PUT to the hop's version under
/// the hop's own key, followed to its end; AKS refuses a PUT that skips a minor, and that
/// refusal is a definitive answer. ControlPlaneOnly hops leave the pools behind, and the
/// observation says where they are; Full hops move them with the control plane.
#[tokio::test]
async fn each_hop_is_one_put_and_aks_refuses_a_skipped_minor() {
    let (base, fake) = fake_arm::start().await;
    {
        let mut f = fake.lock().expect("fake");
        for name in ["c1", "c2"] {
            let id = cluster_id(SUB, name);
            f.clusters
                .insert(id.clone(), cluster(&id, "eastus", "1.29.9"));
        }
    }
    let d = driver(&base);
    let hop = |kind: UpgradeType, v: &str| Target {
        upgrade_type: kind,
        kubernetes_version: version(v),
        node_images: vec![],
        rollback: None,
    };
    let seen = d.observe(&member("c1")).await.expect("observed");
    assert!(
        seen.node_pools
            .iter()
            .all(|p| p.orchestrator_version.is_none()),
        "pools at the control plane's version: {:?}",
        seen.node_pools
    );
    // Two minors at once: AKS says no, and nothing moves.
    let e = d
        .start_upgrade(
            &member("c1"),
            &hop(UpgradeType::Full, "1.31.2"),
            "edge.r8.1",
        )
        .await
        .expect_err("a skipped minor is refused");
    assert!(
        !e.is_transient()
            && e.message.contains("OperationNotAllowed")
            && e.message.contains("1.29.9 to 1.31.2"),
        "{}",
        e.message
    );
    assert!(fake.lock().expect("fake").ops.is_empty(), "nothing started");

    // ControlPlaneOnly, one minor at a time.
    let m = member("c1");
    for (v, key) in [("1.30.6", "edge.r8.2"), ("1.31.2", "edge.r8.3")] {
        let op = d
            .start_upgrade(&m, &hop(UpgradeType::ControlPlaneOnly, v), key)
            .await
            .expect("sent");
        assert_eq!(follow(&d, &m, &op, key).await, OperationState::Succeeded);
    }
    let seen = d.observe(&m).await.expect("observed");
    assert_eq!(seen.kubernetes_version, "1.31.2");
    for pool in &seen.node_pools {
        assert_eq!(
            pool.orchestrator_version.as_deref(),
            Some("1.29.9"),
            "the pools stayed behind, and the observation says so: {pool:?}"
        );
    }

    // Full, one minor at a time: the pools move at each hop.
    let m = member("c2");
    for (v, key) in [("1.30.6", "edge.r9.1"), ("1.31.2", "edge.r9.2")] {
        let op = d
            .start_upgrade(&m, &hop(UpgradeType::Full, v), key)
            .await
            .expect("sent");
        assert_eq!(follow(&d, &m, &op, key).await, OperationState::Succeeded);
        let f = fake.lock().expect("fake");
        for pool in f.clusters[&cluster_id(SUB, "c2")]["properties"]["agentPoolProfiles"]
            .as_array()
            .expect("pools")
        {
            assert_eq!(pool["currentOrchestratorVersion"], v, "{pool}");
            assert_eq!(pool["orchestratorVersion"], v, "{pool}");
        }
    }
    let seen = d.observe(&m).await.expect("observed");
    assert_eq!(seen.kubernetes_version, "1.31.2");
    assert!(
        seen.node_pools
            .iter()
            .all(|p| p.orchestrator_version.is_none())
    );

    let f = fake.lock().expect("fake");
    let puts: Vec<(&str, &str, &str, bool)> = f
        .version_puts
        .iter()
        .map(|p| {
            (
                p.cluster.rsplit('/').next().unwrap_or_default(),
                p.from.as_str(),
                p.to.as_str(),
                p.accepted,
            )
        })
        .collect();
    assert_eq!(
        puts,
        [
            ("c1", "1.29.9", "1.31.2", false),
            ("c1", "1.29.9", "1.30.6", true),
            ("c1", "1.30.6", "1.31.2", true),
            ("c2", "1.29.9", "1.30.6", true),
            ("c2", "1.30.6", "1.31.2", true),
        ]
    );
}

/// The images of both pools of `c1` upgraded to the newest, through the driver.
async fn upgrade_images(d: &AksDriver, name: &str, key: &str) {
    let pool = |p: &str| PoolTarget {
        pool: p.into(),
        family: "AKSUbuntu-2204gen2containerd".into(),
        image: ImageVersion::parse(NEWEST_IMAGE).expect("image"),
    };
    let m = member(name);
    d.observe(&m).await.expect("observed");
    let target = Target {
        rollback: None,
        upgrade_type: UpgradeType::NodeImageOnly,
        kubernetes_version: None,
        node_images: vec![pool("system"), pool("user")],
    };
    let op = d.start_upgrade(&m, &target, key).await.expect("sent");
    assert_eq!(follow(d, &m, &op, key).await, OperationState::Succeeded);
}

/// The engine's rollback of one node pool (SEMANTICS §15): a NodeImageOnly target naming the
/// pool and its image before, and its Kubernetes version after.
fn pool_rollback(pool: &str, image: &str, orchestrator: &str) -> Target {
    Target {
        upgrade_type: UpgradeType::NodeImageOnly,
        kubernetes_version: None,
        node_images: vec![PoolTarget {
            pool: pool.into(),
            family: "AKSUbuntu-2204gen2containerd".into(),
            image: ImageVersion::parse(image).expect("image"),
        }],
        rollback: Some(Rollback {
            scope: RollbackScope::NodePool(pool.into()),
            orchestrator_version: version(orchestrator),
        }),
    }
}

const OLD_IMAGE: &str = "202602.10.0";

fn pool_json(f: &fake_arm::Fake, cluster: &str, pool: &str) -> Value {
    f.clusters[&cluster_id(SUB, cluster)]["properties"]["agentPoolProfiles"]
        .as_array()
        .expect("pools")
        .iter()
        .find(|p| p["name"] == pool)
        .cloned()
        .expect("pool")
}

#[tokio::test]
async fn observe_offers_each_upgraded_pool_its_previous_versions_for_seven_days() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let d = driver(&base);
    let seen = d.observe(&member("c1")).await.expect("observed");
    assert!(
        seen.rollback.is_empty(),
        "nothing upgraded: {:?}",
        seen.rollback
    );
    let before = flotilla_engine::time::Time::from_unix(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64,
    );
    upgrade_images(&d, "c1", "edge.rb1.1").await;
    let seen = d.observe(&member("c1")).await.expect("observed");
    let offered: Vec<(Option<&str>, Option<&str>, Option<&str>)> = seen
        .rollback
        .iter()
        .map(|o| {
            assert_eq!(o.scope, "NodePool");
            (
                o.pool.as_deref(),
                o.to.orchestrator_version.as_deref(),
                o.to.node_image_version.as_deref(),
            )
        })
        .collect();
    let old = format!("AKSUbuntu-2204gen2containerd-{OLD_IMAGE}");
    assert_eq!(
        offered,
        [
            (Some("system"), Some("1.30.5"), Some(old.as_str())),
            (Some("user"), Some("1.30.5"), Some(old.as_str())),
        ]
    );
    // Until seven days after the upgrade, which just happened.
    for o in &seen.rollback {
        let until = flotilla_engine::time::Time::parse(&o.until).expect("RFC 3339");
        let after = before.plus(7 * 86_400);
        assert!(
            until >= after && until <= after.plus(120),
            "{} is seven days after {before}",
            o.until
        );
    }
    // The engine reads the offers as they are.
    flotilla_engine::fleet::Cluster::parse(&seen, "observation").expect("the engine reads it");
    // Eight days later for the system pool: AKS lists nothing for it, so nothing is offered.
    fake.lock()
        .expect("fake")
        .age_last_upgrade(&cluster_id(SUB, "c1"), "system", 8 * 86_400);
    let seen = d.observe(&member("c1")).await.expect("observed");
    let pools: Vec<Option<&str>> = seen.rollback.iter().map(|o| o.pool.as_deref()).collect();
    assert_eq!(pools, [Some("user")]);
    // The profile's versions are asked with the API version that has them.
    let f = fake.lock().expect("fake");
    assert!(f.count("GET", "/agentPools/system/upgradeProfiles/default") >= 3);
}

#[tokio::test]
async fn a_node_pool_rollback_goes_through_throttling_and_conflicts_and_a_resend_attaches() {
    let (base, fake) = with_clusters(&["c1"]).await;
    fake.lock().expect("fake").op_polls = 4;
    let d = driver(&base);
    let m = member("c1");
    upgrade_images(&d, "c1", "edge.rb2.1").await;
    let target = pool_rollback("system", OLD_IMAGE, "1.30.5");

    // Someone else's operation runs: AKS answers 409, which is waited for, not a failure.
    fake.lock().expect("fake").start_foreign(
        &cluster_id(SUB, "c1"),
        "1.30.5",
        Duration::from_secs(3600),
    );
    let e = d
        .start_upgrade(&m, &target, "edge.rb2.2")
        .await
        .expect_err("busy");
    assert!(
        e.is_transient() && e.message.contains("another operation is in progress"),
        "{}",
        e.message
    );
    {
        let mut f = fake.lock().expect("fake");
        f.end_foreign();
        assert!(f.pool_puts.is_empty(), "a refused PUT changed nothing");
        // ARM throttles the next requests: Retry-After is honoured.
        f.throttle_next = 2;
    }
    // The engine polls the key first after a transient error: nothing arrived under it.
    let started = std::time::Instant::now();
    assert_eq!(
        d.poll(&m, "edge.rb2.2", "edge.rb2.2").await.expect("poll"),
        OperationState::Unknown
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "throttled twice"
    );
    let op = d
        .start_upgrade(&m, &target, "edge.rb2.2")
        .await
        .expect("sent");
    // Sent again under the same key (a restart before the answer was recorded): attached.
    let again = d
        .start_upgrade(&m, &target, "edge.rb2.2")
        .await
        .expect("attached");
    // The answer lost: polled by its key, the pool says the rollback arrived.
    assert_ne!(
        d.poll(&m, "edge.rb2.2", "edge.rb2.2").await.expect("poll"),
        OperationState::Unknown
    );
    for id in [&op, &again] {
        assert_eq!(
            follow(&d, &m, id, "edge.rb2.2").await,
            OperationState::Succeeded
        );
    }
    {
        let f = fake.lock().expect("fake");
        assert_eq!(
            f.pool_puts,
            [fake_arm::PoolPut {
                cluster: cluster_id(SUB, "c1"),
                pool: "system".into(),
                orchestrator_version: "1.30.5".into(),
                node_image_version: format!("AKSUbuntu-2204gen2containerd-{OLD_IMAGE}"),
                accepted: true,
            }],
            "one rollback sent"
        );
        let system = pool_json(&f, "c1", "system");
        assert_eq!(
            system["nodeImageVersion"],
            format!("AKSUbuntu-2204gen2containerd-{OLD_IMAGE}")
        );
        assert_eq!(system["currentOrchestratorVersion"], "1.30.5");
        assert_eq!(system["tags"]["flotilla-operation"], "edge.rb2.2");
        let user = pool_json(&f, "c1", "user");
        assert_eq!(
            user["nodeImageVersion"],
            format!("AKSUbuntu-2204gen2containerd-{NEWEST_IMAGE}"),
            "the other pool is untouched"
        );
    }
    // Used up: AKS does not roll back twice, and the driver offers it no more.
    let seen = d.observe(&m).await.expect("observed");
    let pools: Vec<Option<&str>> = seen.rollback.iter().map(|o| o.pool.as_deref()).collect();
    assert_eq!(pools, [Some("user")]);
    // A resend after the end finds the pool where the rollback took it: nothing more is sent.
    d.start_upgrade(&m, &target, "edge.rb2.2")
        .await
        .expect("attached");
    assert_eq!(fake.lock().expect("fake").pool_puts.len(), 1);
}

#[tokio::test]
async fn a_rollback_past_seven_days_is_refused_with_aks_s_reason() {
    let (base, fake) = with_clusters(&["c1"]).await;
    let d = driver(&base);
    let m = member("c1");
    upgrade_images(&d, "c1", "edge.rb3.1").await;
    fake.lock()
        .expect("fake")
        .age_last_upgrade(&cluster_id(SUB, "c1"), "system", 7 * 86_400 + 60);
    let e = d
        .start_upgrade(
            &m,
            &pool_rollback("system", OLD_IMAGE, "1.30.5"),
            "edge.rb3.2",
        )
        .await
        .expect_err("refused");
    assert!(!e.is_transient(), "{}", e.message);
    assert!(
        e.message.contains(&format!(
            "NodeImageVersion 'AKSUbuntu-2204gen2containerd-{OLD_IMAGE}' is not accepted"
        )) && e.message.contains("node pool \"system\""),
        "{}",
        e.message
    );
    {
        let f = fake.lock().expect("fake");
        assert_eq!(f.pool_puts.len(), 1);
        assert!(!f.pool_puts[0].accepted);
        assert_eq!(
            pool_json(&f, "c1", "system")["nodeImageVersion"],
            format!("AKSUbuntu-2204gen2containerd-{NEWEST_IMAGE}"),
            "nothing changed"
        );
        assert!(f.ops.is_empty(), "nothing started");
    }
    // Within its seven days, the user pool still goes back.
    let op = d
        .start_upgrade(
            &m,
            &pool_rollback("user", OLD_IMAGE, "1.30.5"),
            "edge.rb3.3",
        )
        .await
        .expect("sent");
    assert_eq!(
        follow(&d, &m, &op, "edge.rb3.3").await,
        OperationState::Succeeded
    );
    // AKS rolls no control plane back.
    let control_plane = Target {
        upgrade_type: UpgradeType::ControlPlaneOnly,
        kubernetes_version: version("1.30.5"),
        node_images: vec![],
        rollback: Some(Rollback {
            scope: RollbackScope::ControlPlane,
            orchestrator_version: None,
        }),
    };
    let e = d
        .start_upgrade(&m, &control_plane, "edge.rb3.4")
        .await
        .expect_err("refused");
    assert!(
        !e.is_transient() && e.message.contains("no rollback of a control plane"),
        "{}",
        e.message
    );
}
