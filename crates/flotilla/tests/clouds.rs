//! The `exec` script sets for other clouds (examples/exec/eks, examples/exec/gke) in the real
//! server, against fakes of the AWS and Google Cloud CLIs (tests/fake_clouds) that answer the
//! calls the scripts make as those CLIs document them: every upgrade type ends with the
//! clusters where it should have taken them, and every cloud update is started exactly once.
//! The EKS set also rolls a control plane back as EKS allows it (SEMANTICS §15): offered within
//! 7 days of an in-place upgrade, refused after, done once per attempt.

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

/// The fake CLIs first, then the test's own PATH.
fn fake_path() -> String {
    let fakes = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_clouds");
    format!(
        "{}:{}",
        fakes.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A server whose commands find the fake CLIs first on their PATH.
fn serve(dir: &Path, db: &str, port: u16, cloud: &str) -> Child {
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
        // The test's own scripts (a health check), beside the cloud's.
        .args(["--exec-allow", &dir.join("bin").display().to_string()])
        .env("PATH", fake_path())
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
    std::fs::create_dir_all(dir.join("bin")).expect("bin");
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

/// An EKS cluster of the fake cloud at `version` with node groups `ng-a` and `ng-b` there.
fn eks_cluster(dir: &Path, name: &str, version: &str) {
    let at = dir.join("cloud/clusters").join(name);
    write(at.join("version"), version);
    for ng in ["ng-a", "ng-b"] {
        let g = at.join("nodegroups").join(ng);
        write(g.join("version"), version);
        write(g.join("ami"), "AL2023_x86_64_STANDARD");
        write(g.join("release"), &format!("{version}.4-20240917"));
    }
}

/// A finished update of the fake cloud's cluster `name`, made `days_ago`: `kind` VersionUpdate
/// or VersionRollback, to `version`.
fn eks_past_update(dir: &Path, name: &str, token: &str, kind: &str, version: &str, days_ago: f64) {
    let u = dir.join("cloud/updates").join(token);
    let when = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        - (days_ago * 86_400.0) as u64;
    write(u.join("what"), &format!("cluster {name} - {version}"));
    write(u.join("type"), kind);
    write(u.join("status"), "Successful");
    write(u.join("left"), "0");
    write(
        u.join("id"),
        &format!("00000000-0000-0000-0000-{token:0>12}"),
    );
    write(u.join("created"), &when.to_string());
    write(u.join("ended"), &(when + 900).to_string());
}

/// Runs one of the EKS scripts as the server would, on the fake cloud: (exit code, stdout,
/// stderr).
fn eks_script(dir: &Path, script: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(examples("eks").join(script))
        .args(args)
        .env("PATH", fake_path())
        .env("FAKE_CLOUD", dir.join("cloud"))
        .output()
        .expect("the script runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

fn arn(name: &str) -> String {
    format!("arn:aws:eks:us-east-1:123456789012:cluster/{name}")
}

/// What observe.sh offers to roll back on `name`.
fn offered(dir: &Path, name: &str) -> Value {
    let (code, out, err) = eks_script(dir, "observe.sh", &[&arn(name)]);
    assert_eq!(code, 0, "{out} {err}");
    let cluster: Value = serde_json::from_str(&out).expect("observe prints JSON");
    cluster["rollback"].clone()
}

/// The control plane rollback EKS documents
/// (https://docs.aws.amazon.com/eks/latest/userguide/rollback-cluster.html), through the
/// scripts on the fake AWS CLI: offered back to the previous minor for 7 days after an in-place
/// upgrade, not for a cluster created at its version, rolled back already or upgraded more than
/// 7 days ago; the rollback itself is refused there with EKS's error (a definitive no), asked
/// again after throttling or while another update runs, and started once per key.
#[test]
fn the_eks_scripts_offer_and_do_the_control_plane_rollback_eks_allows() {
    let dir = std::env::temp_dir().join(format!("flotilla-eks-rollback-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for name in ["fresh", "old", "created", "rolled"] {
        eks_cluster(&dir, name, "1.31");
    }
    eks_cluster(&dir, "rolled", "1.30");
    eks_past_update(&dir, "fresh", "1", "VersionUpdate", "1.31", 1.0);
    eks_past_update(&dir, "old", "2", "VersionUpdate", "1.31", 8.0);
    eks_past_update(&dir, "rolled", "3", "VersionUpdate", "1.31", 2.0);
    eks_past_update(&dir, "rolled", "4", "VersionRollback", "1.30", 1.0);

    // Offered: one day after the upgrade, until six days from now.
    let offer = offered(&dir, "fresh");
    assert_eq!(offer.as_array().map(Vec::len), Some(1), "{offer}");
    assert_eq!(offer[0]["scope"], "ControlPlane");
    assert_eq!(offer[0]["to"], json!({"kubernetesVersion": "1.30.0"}));
    let until = offer[0]["until"].as_str().expect("until");
    let until = Command::new("date")
        .args(["-u", "-d", until, "+%s"])
        .output()
        .expect("date");
    let until: u64 = String::from_utf8_lossy(&until.stdout)
        .trim()
        .parse()
        .expect("an RFC 3339 time");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(
        until.abs_diff(now + 6 * 86_400) < 120,
        "until {until}, now {now}"
    );
    // Not offered: past 7 days, created at its version, rolled back already.
    for name in ["old", "created", "rolled"] {
        assert_eq!(offered(&dir, name), json!([]), "{name}");
    }

    // Past 7 days EKS refuses: exit 2 with its words, nothing started.
    let (code, out, _) = eks_script(
        &dir,
        "rollback.sh",
        &[&arn("old"), "k-old", "ControlPlane", "1.30.0"],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("InvalidRequestException") && out.contains("more than 7 days"),
        "{out}"
    );
    let (code, out, _) = eks_script(
        &dir,
        "rollback.sh",
        &[&arn("created"), "k-created", "ControlPlane", "1.30.0"],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("not upgraded in place"), "{out}");
    // A node group is not EKS's to roll back.
    let (code, out, _) = eks_script(
        &dir,
        "rollback.sh",
        &[&arn("fresh"), "k-np", "NodePool", "1.30.0"],
    );
    assert_eq!(code, 2, "{out}");
    assert_eq!(started(&dir).len(), 0, "{:?}", started(&dir));

    // Throttled: a transient failure (neither an answer nor a definitive no).
    write(dir.join("cloud/throttle"), "1");
    let (code, _, err) = eks_script(
        &dir,
        "rollback.sh",
        &[&arn("fresh"), "k1", "ControlPlane", "1.30.0"],
    );
    assert!(code != 0 && code != 2, "{code} {err}");
    assert!(err.contains("ThrottlingException"), "{err}");
    // Then started, and the same key again answers the same update.
    let (code, out, err) = eks_script(
        &dir,
        "rollback.sh",
        &[&arn("fresh"), "k1", "ControlPlane", "1.30.0"],
    );
    assert_eq!(code, 0, "{out} {err}");
    let op: Value = serde_json::from_str(&out).expect("JSON");
    let op = op["operationId"]
        .as_str()
        .expect("an operation id")
        .to_string();
    assert!(op.starts_with("Rollback:"), "{op}");
    let (_, again, _) = eks_script(
        &dir,
        "rollback.sh",
        &[&arn("fresh"), "k1", "ControlPlane", "1.30.0"],
    );
    assert_eq!(again, out);
    // Another attempt while it runs: ResourceInUseException, asked again later.
    let (code, _, err) = eks_script(
        &dir,
        "rollback.sh",
        &[&arn("fresh"), "k2", "ControlPlane", "1.30.0"],
    );
    assert!(code != 0 && code != 2, "{code} {err}");
    assert!(err.contains("ResourceInUseException"), "{err}");
    // Followed with describe-update until it succeeds; the control plane is back, the node
    // groups untouched, and nothing is offered any more.
    let mut states = Vec::new();
    for _ in 0..5 {
        let (code, out, err) = eks_script(&dir, "poll.sh", &[&arn("fresh"), &op, "k1"]);
        assert_eq!(code, 0, "{out} {err}");
        states.push(out.clone());
        if out.contains("Succeeded") {
            break;
        }
        assert!(out.contains("Running"), "{out}");
    }
    assert!(
        states.last().is_some_and(|s| s.contains("Succeeded")),
        "{states:?}"
    );
    assert_eq!(read(dir.join("cloud/clusters/fresh/version")), "1.30");
    assert_eq!(
        read(dir.join("cloud/clusters/fresh/nodegroups/ng-a/version")),
        "1.31"
    );
    assert_eq!(offered(&dir, "fresh"), json!([]));
    let counts = started(&dir);
    assert_eq!(counts.get("rollback fresh -"), Some(&1), "{counts:?}");
    assert_eq!(counts.len(), 1, "{counts:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Through the server: a ControlPlaneOnly run over EKS clusters whose member health check says
/// `onFailure: RollBack`; the cluster whose check fails is rolled back by rollback.sh with
/// EKS's call (once), and its status says so; the others keep their upgrade.
#[test]
fn the_eks_scripts_roll_back_a_control_plane_whose_health_check_fails() {
    let dir = std::env::temp_dir().join(format!("flotilla-eks-rb-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let clusters = ["eks-1", "eks-2", "eks-3"];
    for c in clusters {
        eks_cluster(&dir, c, "1.30");
    }
    // The health check: fails for the members named in `unhealthy/`.
    let check = dir.join("bin/check.sh");
    write(
        check.clone(),
        "#!/bin/sh\n[ ! -e \"$1/$2\" ] || { echo \"$2 is unhealthy\"; exit 1; }",
    );
    std::fs::set_permissions(&check, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    write(dir.join("unhealthy/eks-2"), "");
    let (api, mut server) = start(&dir, "eks");
    let eks = examples("eks").display().to_string();
    api.must(
        reqwest::Method::PUT,
        "/v1/checkProviders/probe",
        Some(&json!({"properties": {"type": "Exec",
            "command": [check.display().to_string(), dir.join("unhealthy").display().to_string()]}})),
    );
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/eks",
        Some(&json!({"properties": {"driver": {
            "type": "exec",
            "observe": [format!("{eks}/observe.sh"), "{clusterResourceId}"],
            "upgrade": [format!("{eks}/upgrade.sh"), "{clusterResourceId}", "{operationKey}", "{upgradeType}", "{kubernetesVersion}"],
            "rollback": [format!("{eks}/rollback.sh"), "{clusterResourceId}", "{operationKey}", "{rollbackScope}", "{kubernetesVersion}"],
            "poll": [format!("{eks}/poll.sh"), "{clusterResourceId}", "{operationId}", "{operationKey}"],
            "pollIntervalSeconds": 0.1,
        }}})),
    );
    for c in clusters {
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/eks/members/{c}"),
            Some(&json!({"properties": {"clusterResourceId": arn(c), "group": "g"}})),
        );
    }
    let run = json!({"properties": {
        "strategy": {"stages": [{"name": "all", "maxAllowedFailures": "100%",
            "groups": [{"name": "g", "maxAllowedFailures": "100%", "maxConcurrency": "3"}],
            "memberHealthChecks": {"checks": [{"name": "probe", "provider": "probe", "args": ["{member}"]}],
                                   "soakSeconds": 1, "intervalSeconds": 1, "onFailure": "RollBack"}}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.0"}},
    }});
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/eks/updateRuns/r1",
        Some(&run),
    );
    api.must(
        reqwest::Method::POST,
        "/v1/fleets/eks/updateRuns/r1/start",
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let run = api.must(reqwest::Method::GET, "/v1/fleets/eks/updateRuns/r1", None);
        let status = run["properties"]["status"].clone();
        if ["Completed", "Failed", "Stopped"]
            .contains(&status["status"]["state"].as_str().unwrap_or_default())
        {
            break status;
        }
        assert!(Instant::now() < deadline, "the run did not end: {status}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    let members: BTreeMap<String, Value> = status["stages"][0]["groups"][0]["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_string(),
                m.clone(),
            )
        })
        .collect();
    let bad = &members["eks-2"];
    assert_eq!(bad["status"]["state"], "Failed", "{bad}");
    assert_eq!(bad["rolledBack"], true, "{bad}");
    assert_eq!(bad["before"]["kubernetesVersion"], "1.30.0", "{bad}");
    for good in ["eks-1", "eks-3"] {
        let m = &members[good];
        assert_eq!(m["status"]["state"], "Completed", "{m}");
        assert_ne!(m["rolledBack"], true, "{m}");
    }
    // In the cloud: eks-2 back at 1.30 by one rollback, the others at 1.31, every node group
    // where it was.
    assert_eq!(read(dir.join("cloud/clusters/eks-2/version")), "1.30");
    for c in ["eks-1", "eks-3"] {
        assert_eq!(
            read(dir.join("cloud/clusters").join(c).join("version")),
            "1.31"
        );
    }
    for c in clusters {
        for ng in ["ng-a", "ng-b"] {
            assert_eq!(
                read(
                    dir.join("cloud/clusters")
                        .join(c)
                        .join("nodegroups")
                        .join(ng)
                        .join("version")
                ),
                "1.30"
            );
        }
    }
    let counts = started(&dir);
    for c in clusters {
        assert_eq!(
            counts.get(&format!("cluster {c} -")),
            Some(&1),
            "{counts:?}"
        );
    }
    assert_eq!(counts.get("rollback eks-2 -"), Some(&1), "{counts:?}");
    assert_eq!(counts.len(), 4, "{counts:?}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
