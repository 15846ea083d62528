//! The `exec` script sets for other clouds (examples/exec/eks, examples/exec/gke) in the real
//! server, against fakes of the AWS and Google Cloud CLIs (tests/fake_clouds) that answer the
//! calls the scripts make as those CLIs document them: every upgrade type ends with the
//! clusters where it should have taken them, and every cloud update is started exactly once.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Api, create_token, free_port};

fn examples(cloud: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/exec")
        .join(cloud)
        .canonicalize()
        .expect("the example scripts")
}

/// A server whose commands find the fake CLIs first on their PATH.
fn serve(dir: &Path, db: &str, port: u16, cloud: &str) -> Child {
    let fakes = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_clouds");
    let path = format!(
        "{}:{}",
        fakes.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = std::fs::File::create(dir.join("server.log")).expect("log");
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database",
            db,
        ])
        .args(["--exec-allow", &examples(cloud).display().to_string()])
        .env("PATH", path)
        .env("FAKE_CLOUD", dir.join("cloud"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("the server starts")
}

fn write(path: PathBuf, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("dir");
    std::fs::write(path, format!("{text}\n")).expect("write");
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// A server for `cloud`'s scripts over a database in `dir`, ready, and its client.
fn start(dir: &Path, cloud: &str) -> (Api, Child) {
    let db = dir.join("flotilla.db").display().to_string();
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: create_token(&db),
    };
    let server = serve(dir, &db, port, cloud);
    api.wait_ready();
    (api, server)
}

/// A member's cluster once the server has observed it.
fn observed(api: &Api, fleet: &str, member: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = api.must(
            reqwest::Method::GET,
            &format!("/v1/fleets/{fleet}/members/{member}"),
            None,
        );
        if m["properties"]["status"]["cluster"].is_object() {
            return m["properties"]["status"]["cluster"].clone();
        }
        assert!(Instant::now() < deadline, "not observed: {m}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Creates, starts and waits for a run over the fleet's members; its final status.
fn run(api: &Api, fleet: &str, name: &str, upgrade: Value) -> Value {
    api.must(
        reqwest::Method::PUT,
        &format!("/v1/fleets/{fleet}/updateRuns/{name}"),
        Some(&json!({"properties": {"managedClusterUpdate": upgrade}})),
    );
    api.must(
        reqwest::Method::POST,
        &format!("/v1/fleets/{fleet}/updateRuns/{name}/start"),
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = api.must(
            reqwest::Method::GET,
            &format!("/v1/fleets/{fleet}/updateRuns/{name}"),
            None,
        );
        let status = run["properties"]["status"].clone();
        if ["Completed", "Failed", "Stopped"]
            .contains(&status["status"]["state"].as_str().unwrap_or_default())
        {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "run {name} did not end: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The updates the fake cloud started, by the first words of each log line.
fn started(dir: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(dir.join("cloud/started.log"))
        .unwrap_or_default()
        .lines()
    {
        let words: Vec<&str> = line.split(' ').collect();
        *counts.entry(words[..3].join(" ")).or_default() += 1;
    }
    counts
}

#[test]
fn the_eks_scripts_do_every_upgrade_type_once() {
    let dir = std::env::temp_dir().join(format!("flotilla-eks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let clusters = ["eks-1", "eks-2", "eks-3"];
    for c in clusters {
        let at = dir.join("cloud/clusters").join(c);
        write(at.join("version"), "1.30");
        for ng in ["ng-a", "ng-b"] {
            write(at.join("nodegroups").join(ng).join("version"), "1.30");
            write(
                at.join("nodegroups").join(ng).join("ami"),
                "AL2023_x86_64_STANDARD",
            );
            write(
                at.join("nodegroups").join(ng).join("release"),
                "1.30.4-20240917",
            );
        }
    }
    let (api, mut server) = start(&dir, "eks");
    let eks = examples("eks").display().to_string();
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/eks",
        Some(&json!({"properties": {"driver": {
            "type": "exec",
            "observe": [format!("{eks}/observe.sh"), "{clusterResourceId}"],
            "upgrade": [format!("{eks}/upgrade.sh"), "{clusterResourceId}", "{operationKey}", "{upgradeType}", "{kubernetesVersion}"],
            "poll": [format!("{eks}/poll.sh"), "{clusterResourceId}", "{operationId}", "{operationKey}"],
            "pollIntervalSeconds": 0.1,
        }}})),
    );
    for c in clusters {
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/eks/members/{c}"),
            Some(&json!({"properties": {"clusterResourceId": format!("arn:aws:eks:us-east-1:123456789012:cluster/{c}")}})),
        );
    }
    // What observe.sh prints: the region from the ARN, EKS's minor as x.y.0, a pool per node
    // group with its AMI type and release date.
    let cluster = observed(&api, "eks", "eks-1");
    assert_eq!(cluster["region"], "us-east-1");
    assert_eq!(cluster["kubernetesVersion"], "1.30.0");
    assert_eq!(
        cluster["nodePools"][0]["nodeImageVersion"], "AL2023_x86_64_STANDARD-20240917",
        "{cluster}"
    );

    // Full: the control plane, then each node group, to 1.31.
    let status = run(
        &api,
        "eks",
        "full",
        json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.0"}}),
    );
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    for c in clusters {
        let at = dir.join("cloud/clusters").join(c);
        assert_eq!(read(at.join("version")), "1.31");
        for ng in ["ng-a", "ng-b"] {
            assert_eq!(read(at.join("nodegroups").join(ng).join("version")), "1.31");
        }
    }
    // NodeImageOnly: each node group's latest AMI release, versions kept.
    let status = run(
        &api,
        "eks",
        "images",
        json!({"upgrade": {"type": "NodeImageOnly"}}),
    );
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    assert_eq!(
        read(dir.join("cloud/clusters/eks-2/nodegroups/ng-b/release")),
        "1.31.9-20260301"
    );
    // ControlPlaneOnly: the node groups stay.
    let status = run(
        &api,
        "eks",
        "control",
        json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.32.0"}}),
    );
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    assert_eq!(read(dir.join("cloud/clusters/eks-3/version")), "1.32");
    assert_eq!(
        read(dir.join("cloud/clusters/eks-3/nodegroups/ng-a/version")),
        "1.31"
    );
    // Every update started once: per cluster, two control plane updates (1.31, 1.32) and per
    // node group two (1.31 and the AMI).
    let counts = started(&dir);
    for c in clusters {
        assert_eq!(
            counts.get(&format!("cluster {c} -")),
            Some(&2),
            "{counts:?}"
        );
        for ng in ["ng-a", "ng-b"] {
            assert_eq!(
                counts.get(&format!("nodegroup {c} {ng}")),
                Some(&2),
                "{counts:?}"
            );
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_gke_scripts_do_every_upgrade_type_once() {
    let dir = std::env::temp_dir().join(format!("flotilla-gke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let clusters = ["gke-1", "gke-2", "gke-3"];
    for c in clusters {
        let at = dir.join("cloud/gke").join(c);
        write(at.join("master"), "1.30.5-gke.100");
        for pool in ["pool-a", "pool-b"] {
            write(
                at.join("pools").join(pool).join("version"),
                "1.30.5-gke.100",
            );
            write(at.join("pools").join(pool).join("image"), "COS_CONTAINERD");
        }
    }
    let (api, mut server) = start(&dir, "gke");
    let gke = examples("gke").display().to_string();
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/gke",
        Some(&json!({"properties": {"driver": {
            "type": "exec",
            "observe": [format!("{gke}/observe.sh"), "{clusterResourceId}"],
            "upgrade": [format!("{gke}/upgrade.sh"), "{clusterResourceId}", "{upgradeType}", "{kubernetesVersion}"],
            "poll": [format!("{gke}/poll.sh"), "{clusterResourceId}", "{operationId}"],
            "pollIntervalSeconds": 0.1,
        }}})),
    );
    for c in clusters {
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/gke/members/{c}"),
            Some(&json!({"properties": {"clusterResourceId": format!("projects/shop-prod/locations/europe-west1/clusters/{c}")}})),
        );
    }
    let cluster = observed(&api, "gke", "gke-1");
    assert_eq!(cluster["region"], "europe-west1");
    assert_eq!(cluster["kubernetesVersion"], "1.30.5");
    assert_eq!(
        cluster["nodePools"][1]["nodeImageVersion"], "COS_CONTAINERD-1.30.5.100",
        "{cluster}"
    );

    let status = run(
        &api,
        "gke",
        "full",
        json!({"upgrade": {"type": "Full", "kubernetesVersion": "1.31.2"}}),
    );
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    for c in clusters {
        let at = dir.join("cloud/gke").join(c);
        assert_eq!(read(at.join("master")), "1.31.2-gke.200");
        for pool in ["pool-a", "pool-b"] {
            assert_eq!(
                read(at.join("pools").join(pool).join("version")),
                "1.31.2-gke.200"
            );
        }
    }
    let status = run(
        &api,
        "gke",
        "control",
        json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.32.1"}}),
    );
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    assert_eq!(read(dir.join("cloud/gke/gke-2/master")), "1.32.1-gke.200");
    assert_eq!(
        read(dir.join("cloud/gke/gke-2/pools/pool-a/version")),
        "1.31.2-gke.200",
        "pools stay"
    );
    // NodeImageOnly: the node pools follow the control plane.
    let status = run(
        &api,
        "gke",
        "images",
        json!({"upgrade": {"type": "NodeImageOnly"}}),
    );
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    assert_eq!(
        read(dir.join("cloud/gke/gke-3/pools/pool-b/version")),
        "1.32.1-gke.200"
    );
    // Each operation once: per cluster, the control plane twice, each pool twice.
    let counts = started(&dir);
    assert_eq!(
        counts.values().sum::<usize>(),
        clusters.len() * 6,
        "{counts:?}"
    );
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
