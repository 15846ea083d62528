//! The CLI: the real binary against a real `flotilla serve` on loopback, through the seeds'
//! walkthrough (stages file with thresholds, strategy, run, watch, gate approval, failure
//! counts), every command's error paths, and snapshots of the table and tree outputs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Env {
    dir: PathBuf,
    server: Child,
    url: String,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_flotilla")
}

impl Env {
    fn start(name: &str) -> Env {
        Env::start_with(name, |_| Vec::new())
    }

    /// A server working in the test's directory, with the flags `prepare` returns after it has
    /// set that directory up.
    fn start_with(name: &str, prepare: impl FnOnce(&Path) -> Vec<String>) -> Env {
        let dir = std::env::temp_dir().join(format!("flotilla-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let extra = prepare(&dir);
        let db = dir.join("db.sqlite").display().to_string();
        let token = Command::new(bin())
            .args([
                "token",
                "create",
                "--role",
                "admin",
                "--subject",
                "alice",
                "--database",
                &db,
            ])
            .output()
            .expect("runs");
        assert!(token.status.success());
        let token = String::from_utf8_lossy(&token.stdout).trim().to_string();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let server = Command::new(bin())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--database",
                &db,
            ])
            .args(&extra)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("server");
        let url = format!("http://127.0.0.1:{port}");
        let env = Env { dir, server, url };
        let deadline = Instant::now() + Duration::from_secs(20);
        while env.run(&["fleet", "list", "--token", &token]).status.code() != Some(0) {
            assert!(Instant::now() < deadline, "the server did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        let login = env.run(&["login", "--token", &token]);
        assert!(
            login.status.success(),
            "{}",
            String::from_utf8_lossy(&login.stderr)
        );
        env
    }

    fn command(&self) -> Command {
        let mut c = Command::new(bin());
        c.env("FLOTILLA_SERVER", &self.url)
            .env("FLOTILLA_CONFIG", self.dir.join("config.json"))
            .env_remove("FLOTILLA_TOKEN")
            .current_dir(&self.dir);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("the binary runs")
    }

    /// Runs a command that must succeed; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "flotilla {}: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Runs a command that must fail with one clear line mentioning `needle`.
    fn fails(&self, args: &[&str], needle: &str) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            !out.status.success(),
            "flotilla {} should fail",
            args.join(" ")
        );
        assert!(
            stderr.contains(needle),
            "flotilla {}: expected {needle:?} in {stderr:?}",
            args.join(" ")
        );
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "one clear line: {stderr:?}"
        );
        stderr
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).expect("JSON output")
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    }
}

const DRIVER: &str = r#"{"type": "sim", "timeScale": 3000,
  "catalog": {"japaneast": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}],
                            "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202602.10.0"}]}}},
  "clusters": {
    "aks-canary": {"region": "japaneast", "kubernetesVersion": "1.30.5"},
    "aks-east-1": {"region": "japaneast", "kubernetesVersion": "1.30.5"},
    "aks-east-2": {"region": "japaneast", "kubernetesVersion": "1.30.5", "sim": {"outcome": "fail", "failMessage": "node drain timed out"}},
    "aks-west-1": {"region": "japaneast", "kubernetesVersion": "1.30.5"},
    "aks-west-2": {"region": "japaneast", "kubernetesVersion": "1.30.5"}}}"#;

/// Replaces timestamps and gate ids so outputs can be compared.
fn normalise(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut l = String::new();
        for word in line.split(' ') {
            let is_time =
                word.len() == 20 && word.ends_with('Z') && word.as_bytes().get(10) == Some(&b'T');
            let is_guid = word.len() == 36 && word.chars().filter(|c| *c == '-').count() == 4;
            l.push_str(if is_time {
                "<time>"
            } else if is_guid {
                "<gate>"
            } else {
                word
            });
            l.push(' ');
        }
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

/// A file of the repository's `examples/`, which the walkthrough of docs/cli-guide.md uses.
fn example(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(path)
}

fn stages_file() -> PathBuf {
    example("fleet-stages.json")
}

#[test]
fn the_seed_walkthrough_from_the_command_line() {
    let env = Env::start("walkthrough");
    // The walkthrough of docs/cli-guide.md with its example files: the sim fleet, one member
    // created, the others imported. The example's time scale, 300, is for watching; ten times
    // that here.
    let mut driver: Value = serde_json::from_str(
        &std::fs::read_to_string(example("sim/driver.json")).expect("the example fleet"),
    )
    .expect("the example fleet is JSON");
    driver["timeScale"] = json!(3000);
    let driver = env.write("driver.json", &driver.to_string());
    env.ok(&["fleet", "create", "-n", "retail", "--driver", &driver]);
    env.ok(&[
        "member",
        "create",
        "-f",
        "retail",
        "-n",
        "canary",
        "--cluster-resource-id",
        "aks-canary",
        "--update-group",
        "canary",
        "--labels",
        "env=prod",
        "tier=store",
    ]);
    let stores = example("stores.csv").display().to_string();
    env.ok(&["member", "import", "-f", "retail", &stores]);
    // The walkthrough's stages file, unchanged.
    let stages = stages_file().display().to_string();
    env.ok(&[
        "updatestrategy",
        "create",
        "-f",
        "retail",
        "-n",
        "safe-rollout",
        "--stages",
        &stages,
    ]);
    let shown = env.ok(&[
        "updatestrategy",
        "show",
        "-f",
        "retail",
        "-n",
        "safe-rollout",
        "-o",
        "table",
    ]);
    insta::assert_snapshot!("strategy_show", shown);
    env.ok(&[
        "updaterun",
        "create",
        "-f",
        "retail",
        "-n",
        "upgrade-131",
        "--upgrade-type",
        "Full",
        "--kubernetes-version",
        "1.31.1",
        "--update-strategy-name",
        "safe-rollout",
    ]);
    env.ok(&["updaterun", "start", "-f", "retail", "-n", "upgrade-131"]);
    // The stages file waits 30 real minutes after the canary; skip that wait.
    env.ok(&[
        "updaterun",
        "skip",
        "-f",
        "retail",
        "-n",
        "upgrade-131",
        "--targets",
        "AfterStageWait:canary-stage",
    ]);
    let wait = env.run(&[
        "updaterun",
        "wait",
        "-f",
        "retail",
        "-n",
        "upgrade-131",
        "--timeout",
        "60",
    ]);
    assert_eq!(
        wait.status.code(),
        Some(6),
        "Completed with failures: {}",
        String::from_utf8_lossy(&wait.stdout)
    );
    let run = env.json(&["updaterun", "show", "-f", "retail", "-n", "upgrade-131"]);
    assert_eq!(run["status"]["failureCount"], 1);
    // `watch` of the ended run ends at once with its outcome and the failed member's message.
    let watched = env.run(&["updaterun", "watch", "-f", "retail", "-n", "upgrade-131"]);
    assert_eq!(watched.status.code(), Some(6));
    let text = String::from_utf8_lossy(&watched.stdout);
    assert!(
        text.contains("ended Completed with 1 failures") && text.contains("node drain timed out"),
        "{text}"
    );
    assert_eq!(
        run["status"]["stages"][1]["maxAllowedFailures"], 1,
        "10% of 4 rounds up to 1"
    );
    let tree = env.ok(&[
        "updaterun",
        "show",
        "-f",
        "retail",
        "-n",
        "upgrade-131",
        "-o",
        "table",
    ]);
    insta::assert_snapshot!("run_tree", normalise(&tree));
    let list = env.ok(&["updaterun", "list", "-f", "retail", "-o", "table"]);
    insta::assert_snapshot!("run_list", normalise(&list));
    let members = env.ok(&["member", "list", "-f", "retail", "-o", "table"]);
    insta::assert_snapshot!("member_list", members);
    let yaml = env.ok(&[
        "updaterun",
        "show",
        "-f",
        "retail",
        "-n",
        "upgrade-131",
        "-o",
        "yaml",
    ]);
    assert!(yaml.contains("failureCount: 1"), "{yaml}");
    // Re-run reapplies the upgrade: everything upgraded is now Skipped as already at target.
    env.ok(&[
        "updaterun",
        "rerun",
        "-f",
        "retail",
        "-n",
        "upgrade-131",
        "--new-name",
        "upgrade-131-again",
    ]);
    env.ok(&[
        "updaterun",
        "start",
        "-f",
        "retail",
        "-n",
        "upgrade-131-again",
    ]);
    let again = env.run(&[
        "updaterun",
        "wait",
        "-f",
        "retail",
        "-n",
        "upgrade-131-again",
        "--timeout",
        "60",
    ]);
    assert_eq!(again.status.code(), Some(6), "east-2 fails again");
    let again = env.json(&[
        "updaterun",
        "show",
        "-f",
        "retail",
        "-n",
        "upgrade-131-again",
    ]);
    assert_eq!(
        again["status"]["stages"][0]["groups"][0]["members"][0]["status"]["state"],
        "Skipped"
    );
}

/// The exec example of docs/drivers.md: the scripts keep clusters in files and do every upgrade
/// type, checked against the catalog their `catalog.sh` prints.
#[test]
fn the_exec_example_does_every_upgrade_type() {
    let examples = example("").canonicalize().expect("examples");
    let env = Env::start_with("exec-example", |dir| {
        // The server runs where `examples/` is, as from the repository's root in docs/drivers.md.
        std::os::unix::fs::symlink(&examples, dir.join("examples")).expect("link");
        vec![
            "--exec-allow".to_string(),
            examples.join("exec").display().to_string(),
        ]
    });
    // The example driver, with upgrades of 0.2 s instead of 20 and quicker polling.
    let mut driver: Value = serde_json::from_str(
        &std::fs::read_to_string(example("exec/driver.json")).expect("the exec example"),
    )
    .expect("the exec example is JSON");
    assert_eq!(driver["poll"][4], "20000", "the upgrade's duration in ms");
    driver["poll"][4] = json!("200");
    driver["pollIntervalSeconds"] = json!(0.1);
    let driver = env.write("exec-driver.json", &driver.to_string());
    env.ok(&["fleet", "create", "-n", "edge", "--driver", &driver]);
    let stores = example("stores.csv").display().to_string();
    env.ok(&["member", "import", "-f", "edge", &stores]);
    let stages = r#"{"stages": [{"name": "all", "groups": [{"name": "prod-east"}, {"name": "prod-west"}]}]}"#;
    let state = env.dir.join("exec-state");
    let cluster = |what: &str, member: &str| {
        std::fs::read_to_string(state.join(what).join(member))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let members = ["east-1", "east-2", "west-1", "west-2"];
    let run = |name: &str, args: &[&str]| {
        let mut create = vec![
            "updaterun",
            "create",
            "-f",
            "edge",
            "-n",
            name,
            "--stages",
            stages,
        ];
        create.extend(args);
        env.ok(&create);
        env.ok(&["updaterun", "start", "-f", "edge", "-n", name]);
        let wait = env.run(&[
            "updaterun",
            "wait",
            "-f",
            "edge",
            "-n",
            name,
            "--timeout",
            "60",
        ]);
        assert_eq!(
            wait.status.code(),
            Some(0),
            "{name}: {}{}",
            String::from_utf8_lossy(&wait.stdout),
            String::from_utf8_lossy(&wait.stderr)
        );
    };
    // NodeImageOnly, the latest image of the catalog: images move, versions stay.
    run(
        "images",
        &[
            "--upgrade-type",
            "NodeImageOnly",
            "--node-image-selection",
            "Latest",
        ],
    );
    for m in members {
        assert_eq!(
            cluster("images", m),
            "AKSUbuntu-2204gen2containerd-202602.10.0",
            "{m}"
        );
        assert_eq!(cluster("clusters", m), "", "{m}: the version has not moved");
    }
    // ControlPlaneOnly: versions move, images stay.
    run(
        "control-plane",
        &[
            "--upgrade-type",
            "ControlPlaneOnly",
            "--kubernetes-version",
            "1.31.1",
        ],
    );
    for m in members {
        assert_eq!(cluster("clusters", m), "1.31.1", "{m}");
    }
    // Full, to the catalog's newest patch.
    run(
        "full",
        &["--upgrade-type", "Full", "--kubernetes-version", "1.31.2"],
    );
    let shown = env.json(&["member", "show", "-f", "edge", "-n", "west-2"]);
    assert_eq!(cluster("clusters", "west-2"), "1.31.2", "{shown}");
    let runs = env.json(&["updaterun", "list", "-f", "edge"]);
    assert_eq!(runs.as_array().map(Vec::len), Some(3), "{runs}");
}

/// A chained run over the exec example (SEMANTICS §13, issue #38): stores two minors and more
/// behind are walked up one minor at a time, each hop one call of `upgrade.sh` with
/// `{kubernetesVersion}` the hop's version (the newest generally available patch of each minor
/// in between, the preview one not chosen), as the script's own log of upgrades started says.
#[test]
fn a_chained_run_over_the_exec_example_sends_one_call_per_hop() {
    let examples = example("").canonicalize().expect("examples");
    let env = Env::start_with("exec-chain", |dir| {
        std::os::unix::fs::symlink(&examples, dir.join("examples")).expect("link");
        // The stores are on 1.29.9; the catalog (catalog.sh prints this file) has three minors
        // above it, one with a preview patch.
        let state = dir.join("exec-state");
        std::fs::create_dir_all(state.join("clusters")).expect("state");
        for m in ["east-1", "east-2", "west-1", "west-2"] {
            std::fs::write(state.join("clusters").join(m), "1.29.9\n").expect("cluster");
        }
        let catalog = json!({"eastus": {
            "kubernetes": [{"version": "1.29.9"}, {"version": "1.30.5"}, {"version": "1.30.7"},
                {"version": "1.30.8", "preview": true}, {"version": "1.31.2"}, {"version": "1.32.2"}],
            "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202601.05.0"}, {"version": "202602.10.0"}]}}});
        std::fs::write(state.join("catalog.json"), catalog.to_string()).expect("catalog");
        vec![
            "--exec-allow".to_string(),
            examples.join("exec").display().to_string(),
        ]
    });
    let mut driver: Value = serde_json::from_str(
        &std::fs::read_to_string(example("exec/driver.json")).expect("the exec example"),
    )
    .expect("the exec example is JSON");
    driver["poll"][4] = json!("200");
    driver["pollIntervalSeconds"] = json!(0.1);
    let driver = env.write("exec-driver.json", &driver.to_string());
    env.ok(&["fleet", "create", "-n", "edge", "--driver", &driver]);
    let stores = example("stores.csv").display().to_string();
    env.ok(&["member", "import", "-f", "edge", &stores]);
    let stages = r#"{"stages": [{"name": "east", "groups": [{"name": "prod-east"}]}, {"name": "west", "groups": [{"name": "prod-west"}]}]}"#;
    env.ok(&[
        "updaterun",
        "create",
        "-f",
        "edge",
        "-n",
        "catch-up",
        "--stages",
        stages,
        "--upgrade-type",
        "Full",
        "--kubernetes-version",
        "1.32.2",
        "--chain-minor-versions",
    ]);
    env.ok(&["updaterun", "start", "-f", "edge", "-n", "catch-up"]);
    let wait = env.run(&[
        "updaterun",
        "wait",
        "-f",
        "edge",
        "-n",
        "catch-up",
        "--timeout",
        "90",
    ]);
    assert_eq!(
        wait.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&wait.stdout),
        String::from_utf8_lossy(&wait.stderr)
    );
    let state = env.dir.join("exec-state");
    // upgrades.log: `MEMBER KEY VERSION` per upgrade started (a resend of a key starts none).
    let log = std::fs::read_to_string(state.join("upgrades.log")).expect("upgrades.log");
    let received = std::fs::read_to_string(state.join("received.log")).expect("received.log");
    let run = env.json(&["updaterun", "show", "-f", "edge", "-n", "catch-up"]);
    for m in ["east-1", "east-2", "west-1", "west-2"] {
        let started: Vec<(&str, &str)> = log
            .lines()
            .filter_map(|l| {
                let mut parts = l.split_whitespace();
                (parts.next() == Some(m))
                    .then(|| (parts.next().unwrap_or(""), parts.next().unwrap_or("")))
            })
            .collect();
        let versions: Vec<&str> = started.iter().map(|(_, v)| *v).collect();
        assert_eq!(versions, ["1.30.7", "1.31.2", "1.32.2"], "{m}: {log}");
        let keys: std::collections::BTreeSet<&str> = started.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.len(), 3, "each hop its own operation key: {m}: {log}");
        // Every call the script received for this member asked for one of the hops' versions.
        for line in received.lines().filter(|l| l.starts_with(&format!("{m} "))) {
            let version = line.split_whitespace().nth(2).unwrap_or_default();
            assert!(
                ["1.30.7", "1.31.2", "1.32.2"].contains(&version),
                "{m} was asked for {version}: {received}"
            );
        }
        let cluster = std::fs::read_to_string(state.join("clusters").join(m)).expect("cluster");
        assert_eq!(cluster.trim(), "1.32.2", "{m}");
        let member = run["status"]["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["groups"].as_array().into_iter().flatten())
            .flat_map(|g| g["members"].as_array().into_iter().flatten())
            .find(|x| x["name"] == m)
            .unwrap_or_else(|| panic!("{m} in {run}"));
        let hops: Vec<&str> = member["hops"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["to"].as_str())
            .collect();
        assert_eq!(hops, ["1.30.7", "1.31.2", "1.32.2"], "{member}");
    }
}

#[test]
fn gates_watch_and_actions() {
    let env = Env::start("gates");
    let driver = env.write("driver.json", DRIVER);
    env.ok(&["fleet", "create", "-n", "retail", "--driver", &driver]);
    env.ok(&[
        "member",
        "create",
        "-f",
        "retail",
        "-n",
        "canary",
        "--cluster-resource-id",
        "aks-canary",
        "--update-group",
        "canary",
    ]);
    env.ok(&[
        "member",
        "create",
        "-f",
        "retail",
        "-n",
        "west-1",
        "--cluster-resource-id",
        "aks-west-1",
        "--update-group",
        "prod",
    ]);
    let stages = r#"{"stages": [{"name": "canary", "groups": [{"name": "canary"}]},
        {"name": "prod", "beforeGates": [{"type": "Approval", "displayName": "Go to production"}], "groups": [{"name": "prod"}]}]}"#;
    env.ok(&[
        "updaterun",
        "create",
        "-f",
        "retail",
        "-n",
        "r1",
        "--upgrade-type",
        "ControlPlaneOnly",
        "--kubernetes-version",
        "v1.31.1",
        "--stages",
        stages,
    ]);
    // A forecast before the start: the canary, the approval 600 s after it, then prod.
    let table = env.ok(&[
        "updaterun",
        "forecast",
        "-f",
        "retail",
        "-n",
        "r1",
        "--approval-delay",
        "600",
        "-o",
        "table",
    ]);
    assert!(table.contains("the run ends 20"), "{table}");
    // What prod waits for, and no gate is pending yet, so the end is not conditional on one.
    assert!(
        table.contains("  waits for approval of gate \"Go to production\" until 20"),
        "{table}"
    );
    assert!(!table.contains("approved now"), "{table}");
    assert!(
        table.contains("critical path:") && table.contains("Gate"),
        "{table}"
    );
    let forecast = env.json(&[
        "updaterun",
        "forecast",
        "-f",
        "retail",
        "-n",
        "r1",
        "--approval-delay",
        "600",
    ]);
    assert_eq!(
        forecast["assumptions"]["durations"]["driver"], 2,
        "{forecast}"
    );
    assert_eq!(
        forecast["stages"][1]["groups"][0]["members"][0]["waitsFor"],
        json!(["Gate"])
    );
    assert_eq!(
        forecast["assumptions"]["approvals"], "IfApprovedAfterDelay",
        "{forecast}"
    );
    // The canary's upgrade takes no time at this scale: only the gate holds prod.
    let holds = &forecast["stages"][1]["waitsFor"];
    assert_eq!(holds[0]["kind"], "Approval", "{holds}");
    assert_eq!(holds[0]["state"], "NotStarted", "{holds}");
    assert_eq!(holds[0]["displayName"], "Go to production", "{holds}");
    assert_eq!(
        holds.as_array().map(Vec::len),
        Some(1),
        "only what holds it: {holds}"
    );
    assert_eq!(forecast["stages"][0]["waitsFor"], json!([]));
    // The same run with one stage and no gate, side by side: ten minutes sooner.
    let compared = env.ok(&[
        "updaterun",
        "forecast",
        "-f",
        "retail",
        "-n",
        "r1",
        "--approval-delay",
        "600",
        "--what-if",
        "--stages",
        r#"{"stages": [{"name": "all", "groups": [{"name": "canary"}, {"name": "prod"}]}]}"#,
        "-o",
        "table",
    ]);
    assert!(compared.contains("── what if ──"), "{compared}");
    assert!(
        compared.contains("10 minutes earlier than the run"),
        "{compared}"
    );
    env.fails(
        &[
            "updaterun",
            "forecast",
            "-f",
            "retail",
            "-n",
            "r1",
            "--approval-delay",
            "-1",
        ],
        "approvalDelaySeconds -1",
    );
    // The gate is in the run's status before the run reaches it: asked for then, it is not
    // reached yet (not "does not exist"), and cannot be approved yet.
    let created = env.json(&["updaterun", "show", "-f", "retail", "-n", "r1"]);
    let future = created["status"]["stages"][1]["beforeGates"][0]["gateId"]
        .as_str()
        .expect("the gate's id in the run's status")
        .to_string();
    let shown = env.fails(
        &["gate", "show", "-f", "retail", "-n", &future],
        "is not reached yet",
    );
    assert!(
        shown.contains(r#"stage "prod" of update run "r1""#) && !shown.contains("does not exist"),
        "{shown}"
    );
    env.fails(
        &["gate", "approve", "-f", "retail", "-n", &future],
        "cannot be approved yet",
    );
    env.ok(&["updaterun", "start", "-f", "retail", "-n", "r1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let gate = loop {
        let gates = env.json(&["gate", "list", "-f", "retail", "--state", "Pending"]);
        if let Some(name) = gates[0]["name"].as_str() {
            break name.to_string();
        }
        assert!(Instant::now() < deadline, "no gate became pending");
        std::thread::sleep(Duration::from_millis(50));
    };
    let pending = env.ok(&[
        "updaterun",
        "show",
        "-f",
        "retail",
        "-n",
        "r1",
        "-o",
        "table",
    ]);
    assert!(
        pending.contains("before-gate \"Go to production\"  Pending") && pending.contains(&gate),
        "{pending}"
    );
    assert_eq!(
        gate, future,
        "the gate reached is the one the status listed"
    );
    // The gate pending, the forecast's end holds if it is approved now, and says so.
    let table = env.ok(&[
        "updaterun",
        "forecast",
        "-f",
        "retail",
        "-n",
        "r1",
        "-o",
        "table",
    ]);
    assert!(
        table.contains("if gate \"Go to production\" is approved now"),
        "{table}"
    );
    // Gates by run and stage.
    let listed = env.json(&[
        "gate", "list", "-f", "retail", "--run", "r1", "--stage", "prod",
    ]);
    assert_eq!(listed[0]["name"], gate.as_str(), "{listed}");
    let listed = env.json(&["gate", "list", "-f", "retail", "--stage", "canary"]);
    assert_eq!(listed, json!([]), "the canary stage has no gate");
    env.fails(
        &[
            "gate", "list", "-f", "retail", "--run", "r1", "--stage", "nope",
        ],
        "update run r1 has no such stage (its stages: canary, prod)",
    );
    let ghost = env.run(&["gate", "list", "-f", "retail", "--run", "ghost"]);
    assert_eq!(ghost.status.code(), Some(3), "no such run");
    let mut watch = env
        .command()
        .args(["updaterun", "watch", "-f", "retail", "-n", "r1"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("watch");
    // It begins with the run as it is (the canary done, the gate waiting, with its id), not
    // with its history replayed: a line per stage, then the gate, before the gate is approved
    // (were the run to end first, watch would only print how it ended).
    let mut watched = std::io::BufReader::new(watch.stdout.take().expect("stdout"));
    let mut out = String::new();
    for _ in 0..3 {
        std::io::BufRead::read_line(&mut watched, &mut out).expect("watch's first lines");
    }
    let first: Vec<&str> = out.lines().collect();
    assert!(
        first[0].starts_with("canary") && first[0].contains("1/1 done"),
        "{out}"
    );
    assert!(
        first[1].starts_with("prod") && first[1].contains("0/1 done"),
        "{out}"
    );
    assert!(
        first[2].contains(&format!("prod: gate {gate} waiting: Go to production")),
        "{out}"
    );
    let approved = env.ok(&[
        "gate", "approve", "-f", "retail", "-n", &gate, "-o", "table",
    ]);
    assert!(
        approved.contains("Completed") && approved.contains("alice"),
        "{approved}"
    );
    env.fails(
        &["gate", "approve", "-f", "retail", "-n", &gate],
        "already Completed",
    );
    std::io::Read::read_to_string(&mut watched, &mut out).expect("read");
    let status = watch.wait().expect("watch ends");
    assert_eq!(status.code(), Some(0), "Completed with no failures");
    assert!(
        out.contains("GateCompleted") && out.contains("ended Completed") && out.contains("[####"),
        "{out}"
    );
    assert!(
        !out.contains("RunStarted") && !out.contains("MemberStarted  canary"),
        "what happened before watch began is not replayed: {out}"
    );
    // A condition on a run that has ended is answered at once, holding or not.
    let ended = Instant::now();
    let never = env.run(&[
        "updaterun",
        "wait",
        "-f",
        "retail",
        "-n",
        "r1",
        "--custom",
        "status.status.state=='Failed'",
        "--timeout",
        "120",
    ]);
    let said = String::from_utf8_lossy(&never.stderr);
    assert_eq!(never.status.code(), Some(1), "{said}");
    assert!(
        said.contains("update run r1 ended Completed") && said.contains("does not hold"),
        "{said}"
    );
    assert!(
        ended.elapsed() < Duration::from_secs(30),
        "answered at once, not after --timeout"
    );
    env.ok(&[
        "updaterun",
        "wait",
        "-f",
        "retail",
        "-n",
        "r1",
        "--custom",
        "status.status.state=='Completed'",
        "--timeout",
        "120",
    ]);
    let gate_show = env.ok(&["gate", "show", "-f", "retail", "-n", &gate, "-o", "table"]);
    insta::assert_snapshot!("gate_show", normalise(&gate_show));
    // Stop and skip.
    env.ok(&[
        "updaterun",
        "create",
        "-f",
        "retail",
        "-n",
        "r2",
        "--upgrade-type",
        "NodeImageOnly",
    ]);
    env.fails(
        &["updaterun", "stop", "-f", "retail", "-n", "r2"],
        "only a Running or Pending run can be stopped",
    );
    // A target's type matches in any case, as docs/cli-guide.md says enum values do.
    let skipped = env.json(&[
        "updaterun",
        "skip",
        "-f",
        "retail",
        "-n",
        "r2",
        "--targets",
        "member:canary",
        "MEMBER:west-1",
    ]);
    let members = &skipped["status"]["stages"][0]["groups"][0]["members"];
    assert!(
        members
            .as_array()
            .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m["status"]["state"] == "Skipped")),
        "{skipped}"
    );
    env.fails(
        &[
            "updaterun",
            "skip",
            "-f",
            "retail",
            "-n",
            "r2",
            "--targets",
            "bogus:canary",
        ],
        "Type:Name",
    );
    env.fails(
        &[
            "updaterun",
            "skip",
            "-f",
            "retail",
            "-n",
            "r2",
            "--targets",
            "Member:ghost",
        ],
        "not part of this update run",
    );
    env.ok(&["updaterun", "start", "-f", "retail", "-n", "r2"]);
    let r2 = env.run(&["updaterun", "wait", "-f", "retail", "-n", "r2"]);
    assert_eq!(
        r2.status.code(),
        Some(0),
        "a run of skipped members ends Skipped"
    );
    env.ok(&["updaterun", "delete", "-f", "retail", "-n", "r2"]);
    env.fails(
        &["updaterun", "show", "-f", "retail", "-n", "r2"],
        "does not exist",
    );
    // The audit trail names who approved, started and deleted, with times.
    let trail = env.json(&["audit", "list", "-f", "retail"]);
    let did = |method: &str, path: &str| {
        trail.as_array().into_iter().flatten().any(|e| {
            e["subject"] == "alice"
                && e["method"] == method
                && e["path"].as_str().is_some_and(|p| p.starts_with(path))
                && e["time"].is_string()
        })
    };
    assert!(did("PATCH", "/v1/fleets/retail/gates/"), "{trail}");
    assert!(
        did("POST", "/v1/fleets/retail/updateRuns/r1/start"),
        "{trail}"
    );
    assert!(did("DELETE", "/v1/fleets/retail/updateRuns/r2"), "{trail}");
    let table = env.ok(&["audit", "list", "-f", "retail", "-o", "table"]);
    assert!(
        table.contains("alice") && table.contains("PATCH"),
        "{table}"
    );
}

#[test]
fn flag_checks_and_error_lines() {
    let env = Env::start("errors");
    let driver = env.write("driver.json", DRIVER);
    env.ok(&["fleet", "create", "-n", "retail", "--driver", &driver]);
    // az fleet's own checks, before anything is sent.
    env.fails(
        &[
            "updaterun",
            "create",
            "-f",
            "retail",
            "-n",
            "r",
            "--upgrade-type",
            "NodeImageOnly",
            "--kubernetes-version",
            "1.31.1",
        ],
        "Cannot set kubernetes version when upgrade type is 'NodeImageOnly'.",
    );
    env.fails(
        &[
            "updaterun",
            "create",
            "-f",
            "retail",
            "-n",
            "r",
            "--upgrade-type",
            "Full",
        ],
        "Please set kubernetes version when upgrade type is 'Full'.",
    );
    env.fails(
        &[
            "updaterun",
            "create",
            "-f",
            "retail",
            "-n",
            "r",
            "--upgrade-type",
            "Full",
            "--kubernetes-version",
            "1.31.1",
            "--stages",
            "{}",
            "--update-strategy-name",
            "x",
        ],
        "Cannot set stages when update strategy name is set.",
    );
    // Server errors: one line with the field path and the status.
    env.fails(
        &[
            "updatestrategy",
            "create",
            "-f",
            "retail",
            "-n",
            "bad",
            "--stages",
            r#"{"stages": [{"name": "s", "groups": [{"name": "g", "maxConcurrency": "0"}]}]}"#,
        ],
        "properties.strategy.stages[0].groups[0].maxConcurrency",
    );
    env.fails(
        &[
            "member",
            "create",
            "-f",
            "retail",
            "-n",
            "Bad_Name",
            "--cluster-resource-id",
            "x",
        ],
        "(400",
    );
    env.fails(&["member", "show", "-f", "retail", "-n", "nobody"], "(404");
    env.fails(
        &[
            "member",
            "create",
            "-f",
            "nofleet",
            "-n",
            "m",
            "--cluster-resource-id",
            "x",
        ],
        "fleet \"nofleet\" does not exist",
    );
    env.fails(
        &[
            "member",
            "create",
            "-f",
            "retail",
            "-n",
            "m",
            "--cluster-resource-id",
            "x",
            "--labels",
            "=novalue",
        ],
        "key=value",
    );
    env.fails(
        &["member", "update", "-f", "retail", "-n", "m"],
        "nothing to update",
    );
    env.fails(
        &["fleet", "create", "-n", "f2", "--driver", "missing.json"],
        "cannot read file",
    );
    env.fails(
        &[
            "updatestrategy",
            "create",
            "-f",
            "retail",
            "-n",
            "s",
            "--stages",
            "{not json",
        ],
        "not valid JSON",
    );
    // Members: create, update, show, delete.
    env.ok(&[
        "member",
        "create",
        "-f",
        "retail",
        "-n",
        "m1",
        "--cluster-resource-id",
        "aks-canary",
    ]);
    let updated = env.json(&[
        "member",
        "update",
        "-f",
        "retail",
        "-n",
        "m1",
        "--update-group",
        "canary",
        "--labels",
        "ring=0",
    ]);
    assert_eq!(updated["group"], "canary");
    assert_eq!(updated["labels"]["ring"], "0");
    env.ok(&["member", "delete", "-f", "retail", "-n", "m1"]);
    env.fails(
        &["member", "show", "-f", "retail", "-n", "m1"],
        "does not exist",
    );
    // Tokens through the server; a reader is refused writes.
    let reader = env
        .ok(&["token", "create", "--role", "reader", "--subject", "bob"])
        .trim()
        .to_string();
    // A list, like every other list command's (so `--query "[].id"` and `-o tsv` work on it).
    let tokens = env.json(&["token", "list"]);
    assert!(
        tokens.as_array().is_some_and(|t| t.len() == 2) && !tokens.to_string().contains(&reader)
    );
    let refused = env
        .command()
        .args([
            "fleet", "create", "-n", "f3", "--driver", &driver, "--token", &reader,
        ])
        .output()
        .expect("runs");
    assert!(
        !refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("(403"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let id = tokens
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["subject"] == "bob")
        .and_then(|t| t["id"].as_str())
        .expect("bob's token is listed")
        .to_string();
    env.ok(&["token", "revoke", &id]);
    let revoked = env
        .command()
        .args(["fleet", "list", "--token", &reader])
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&revoked.stderr).contains("(401"));
    // Fleets.
    let fleets = env.ok(&["fleet", "list", "-o", "table"]);
    assert!(
        fleets.contains("retail") && fleets.contains("sim"),
        "{fleets}"
    );
    env.ok(&["fleet", "delete", "-n", "retail"]);
    env.fails(&["fleet", "show", "-n", "retail"], "(404");
    // A server that is not there.
    let out = env
        .command()
        .args(["fleet", "list", "--server", "http://127.0.0.1:9"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("cannot reach the Flotilla server at http://127.0.0.1:9"),
        "{err}"
    );
    // Completions.
    for shell in ["bash", "zsh", "fish"] {
        let completions = env.ok(&["completions", shell]);
        assert!(completions.contains("updaterun"), "{shell}");
    }
}

#[test]
fn auto_upgrade_profile_commands() {
    let env = Env::start("profiles");
    let driver = env.write("driver.json", DRIVER);
    env.ok(&["fleet", "create", "-n", "retail", "--driver", &driver]);
    env.ok(&[
        "member",
        "create",
        "-f",
        "retail",
        "-n",
        "canary",
        "--cluster-resource-id",
        "aks-canary",
    ]);
    env.fails(
        &[
            "autoupgradeprofile",
            "create",
            "-f",
            "retail",
            "-n",
            "images",
            "-c",
            "NodeImage",
            "--node-image-selection",
            "Latest",
        ],
        "cannot be used with the NodeImage channel",
    );
    env.fails(
        &[
            "autoupgradeprofile",
            "create",
            "-f",
            "retail",
            "-n",
            "t",
            "-c",
            "TargetKubernetesVersion",
        ],
        "properties.targetKubernetesVersion",
    );
    let created = env.run(&[
        "autoupgradeprofile",
        "create",
        "-f",
        "retail",
        "-n",
        "rapid",
        "-c",
        "Rapid",
    ]);
    assert!(created.status.success(), "{created:?}");
    // It says what it will start and when, unless the server's pass over profiles (every two
    // seconds) was quicker than its answer and has started that run already.
    let said = String::from_utf8_lossy(&created.stderr);
    if !said.contains("will create and start update run rapid-1-31-1") {
        let runs = env.json(&["updaterun", "list", "-f", "retail", "--query", "[].name"]);
        assert!(
            runs.as_array()
                .into_iter()
                .flatten()
                .any(|r| r.as_str().is_some_and(|r| r.starts_with("rapid-1-31-1"))),
            "{said} {runs}"
        );
    }
    let listed = env.ok(&["autoupgradeprofile", "list", "-f", "retail", "-o", "table"]);
    assert!(
        listed.contains("rapid") && listed.contains("Rapid"),
        "{listed}"
    );
    let id = env.ok(&[
        "autoupgradeprofile",
        "generate-update-run",
        "-f",
        "retail",
        "-n",
        "rapid",
        "-o",
        "table",
    ]);
    let run_name = id.trim().rsplit('/').next().expect("a run id").to_string();
    let run = env.json(&["updaterun", "show", "-f", "retail", "-n", &run_name]);
    assert_eq!(
        run["managedClusterUpdate"]["upgrade"]["kubernetesVersion"],
        "1.31.1"
    );
    let shown = env.json(&["autoupgradeprofile", "show", "-f", "retail", "-n", "rapid"]);
    assert_eq!(shown["channel"], "Rapid");
    env.ok(&[
        "autoupgradeprofile",
        "delete",
        "-f",
        "retail",
        "-n",
        "rapid",
    ]);
    env.fails(
        &["autoupgradeprofile", "show", "-f", "retail", "-n", "rapid"],
        "(404",
    );
}

/// A release train from the command line (SEMANTICS §14): `--upstream` and `--soak` on create,
/// refusals as the server words them, and `show` saying what the profile waits for.
#[test]
fn a_profile_follows_an_upstream_profile() {
    let env = Env::start("trains");
    let driver = env.write("driver.json", DRIVER);
    env.ok(&["fleet", "create", "-n", "staging", "--driver", &driver]);
    env.ok(&["fleet", "create", "-n", "prod", "--driver", &driver]);
    let create = |fleet: &str, extra: &[&str]| {
        let mut args = vec![
            "autoupgradeprofile",
            "create",
            "-f",
            fleet,
            "-n",
            "rapid",
            "-c",
            "Rapid",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let upstream = "/v1/fleets/staging/autoUpgradeProfiles/rapid";
    let args = create("prod", &["--upstream", upstream, "--soak", "2h"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The upstream must exist first.
    env.fails(&args, "properties.upstream.profileId");
    // A soak that is not a duration is refused before anything is sent, naming the value.
    let bad: Vec<String> = create("prod", &["--upstream", upstream, "--soak", "2 weeks"]);
    let bad: Vec<&str> = bad.iter().map(String::as_str).collect();
    // (The command line's own refusals, as clap words them: the error, then where to look.)
    let clap_refuses = |args: &[&str], needle: &str| {
        let out = env.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.starts_with("error: ") && err.contains(needle),
            "{err}"
        );
    };
    clap_refuses(
        &bad,
        "'2 weeks' for '--soak <SOAK>': \"2 weeks\" is not a duration",
    );
    // `--soak` means nothing without `--upstream`.
    let alone: Vec<String> = create("prod", &["--soak", "2h"]);
    let alone: Vec<&str> = alone.iter().map(String::as_str).collect();
    clap_refuses(&alone, "--upstream");
    let staging = create("staging", &["--disabled"]);
    let staging: Vec<&str> = staging.iter().map(String::as_str).collect();
    env.ok(&staging);
    let created = env.run(&args);
    assert!(created.status.success(), "{created:?}");
    let said = String::from_utf8_lossy(&created.stderr);
    assert!(
        said.contains(&format!("follows {upstream}: nothing validated there yet")),
        "{said}"
    );
    let shown = env.json(&["autoupgradeprofile", "show", "-f", "prod", "-n", "rapid"]);
    assert_eq!(shown["upstream"]["profileId"], upstream, "{shown}");
    assert_eq!(shown["upstream"]["soakSeconds"], 7200, "{shown}");
    let table = env.ok(&[
        "autoupgradeprofile",
        "show",
        "-f",
        "prod",
        "-n",
        "rapid",
        "-o",
        "table",
    ]);
    assert!(table.contains("nothing validated there yet"), "{table}");
    // The upstream keeps its channel and stays while prod follows it.
    let stable = [
        "autoupgradeprofile",
        "create",
        "-f",
        "staging",
        "-n",
        "rapid",
        "-c",
        "Stable",
    ];
    env.fails(
        &stable,
        "upstream of /v1/fleets/prod/autoUpgradeProfiles/rapid",
    );
    env.fails(
        &[
            "autoupgradeprofile",
            "delete",
            "-f",
            "staging",
            "-n",
            "rapid",
        ],
        "(409",
    );
    env.fails(&["fleet", "delete", "-n", "staging"], "(409");
}

/// `flotilla member import`: CSV, JSON lines and JSON files, in batches; a bad line is named and
/// nothing of its batch is written; a clash of cluster ids is refused with the item's path.
#[test]
fn member_import_from_csv_json_lines_and_json() {
    let env = Env::start("import");
    // `login` wrote the token into a file only its owner can read.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(env.dir.join("config.json"))
            .expect("config written")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    let driver = env.write("driver.json", DRIVER);
    env.ok(&["fleet", "create", "-n", "retail", "--driver", &driver]);
    let csv = env.write(
        "stores.csv",
        "name,clusterResourceId,group,labels\nstore-1,aks-east-1,east,env=prod;ring=1\nstore-2,aks-east-2,east,\nstore-3,aks-west-1,west,env=prod\n",
    );
    let answer = env.json(&["member", "import", "-f", "retail", &csv]);
    assert_eq!(answer, serde_json::json!({"created": 3, "updated": 0}));
    let member = env.json(&["member", "show", "-f", "retail", "-n", "store-1"]);
    assert_eq!(member["labels"]["ring"], "1");
    assert_eq!(member["group"], "east");
    let lines = env.write(
        "more.jsonl",
        "{\"name\": \"store-4\", \"properties\": {\"clusterResourceId\": \"aks-west-2\"}}\n\n{\"name\": \"store-5\", \"properties\": {\"clusterResourceId\": \"aks-canary\"}}\n",
    );
    let answer = env.json(&["member", "import", "-f", "retail", &lines]);
    assert_eq!(answer, serde_json::json!({"created": 2, "updated": 0}));
    let json = env.write(
        "again.json",
        r#"[{"name": "store-1", "properties": {"clusterResourceId": "AKS-EAST-1", "group": "canary"}}]"#,
    );
    let table = env.ok(&[
        "member", "import", "-f", "retail", &json, "--upsert", "-o", "table",
    ]);
    assert!(table.contains("created 0, updated 1"), "{table}");
    env.fails(
        &["member", "import", "-f", "retail", &json],
        "value[0].name",
    );
    let clash = env.write(
        "clash.json",
        r#"{"value": [{"name": "store-9", "properties": {"clusterResourceId": "aks-canary"}}]}"#,
    );
    env.fails(
        &["member", "import", "-f", "retail", &clash],
        "value[0].properties.clusterResourceId",
    );
    let bad = env.write(
        "bad.csv",
        "name,clusterResourceId,labels\nstore-7,aks-x,env=prod\nstore-8,aks-y,=prod\n",
    );
    env.fails(&["member", "import", "-f", "retail", &bad], "line 3");
    // What does not exist exits 3, as in `az`; other errors 2.
    let missing = env.run(&["member", "show", "-f", "retail", "-n", "nobody"]);
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
    let bad = env.run(&[
        "member",
        "create",
        "-f",
        "retail",
        "-n",
        "Not A Name",
        "--cluster-resource-id",
        "x",
    ]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let header = env.write("header.csv", "name,cluster\nstore-7,aks-x\n");
    env.fails(&["member", "import", "-f", "retail", &header], "line 1");
    let listed = env.json(&["member", "list", "-f", "retail"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(5));
    // A reader that closes the pipe (`| head -1`) ends the command quietly: no panic, exit 0.
    let mut child = env
        .command()
        .args(["member", "list", "-f", "retail", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// What a script written for `az fleet` spells differently works unchanged (First hour, "Against
/// `az fleet`"): `-g` and `--subscription`, `--yes` and `--no-wait`, enum values in any case, a
/// label given as a key alone, `--gate-name`, `gate list --gate-type`, `-o tsv`, `-o none` and `--query`.
#[test]
fn az_spellings_are_accepted() {
    let env = Env::start("az-spellings");
    let driver = env.write("driver.json", DRIVER);
    // `-g` and `--subscription` ask at the ARM paths: the fleet lives in that resource group.
    let az = ["-g", "rg", "--subscription", "sub"];
    let mut create = vec!["fleet", "create", "-n", "retail", "--driver", &driver];
    create.extend(az);
    let fleet = env.json(&create);
    assert_eq!(
        fleet["id"],
        "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ContainerService/fleets/retail"
    );
    assert_eq!(fleet["resourceGroup"], "rg", "az's shape: {fleet}");
    for (name, group) in [("canary", "canary"), ("west-1", "prod")] {
        let cluster = format!("aks-{name}");
        let mut args = vec![
            "member",
            "create",
            "-f",
            "retail",
            "-n",
            name,
            "--cluster-resource-id",
            &cluster,
            "--update-group",
            group,
            "--labels",
            "env=prod",
            "pci",
        ];
        args.extend(az);
        env.ok(&args);
    }
    let member = env.json(&["member", "show", "-f", "retail", "-n", "canary"]);
    assert_eq!(
        member["labels"],
        serde_json::json!({"env": "prod", "pci": ""}),
        "{member}"
    );
    // In another resource group, or the server's own (`-g` alone: its default subscription),
    // the fleet is not found, as in `az` (exit 3); the lists of each say the same.
    let elsewhere = env.run(&[
        "member",
        "show",
        "-f",
        "retail",
        "-n",
        "canary",
        "-g",
        "other",
        "--subscription",
        "sub",
    ]);
    assert_eq!(elsewhere.status.code(), Some(3), "{elsewhere:?}");
    let mut listed = vec!["fleet", "list", "--query", "[].name"];
    listed.extend(az);
    assert_eq!(env.json(&listed), serde_json::json!(["retail"]));
    assert_eq!(
        env.json(&["fleet", "list", "-g", "flotilla"]),
        serde_json::json!([])
    );
    let mut paged = vec!["member", "list", "-f", "retail", "--query", "[].id"];
    paged.extend(az);
    let ids = env.json(&paged);
    assert_eq!(
        ids[0],
        "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ContainerService/fleets/retail/members/canary",
        "{ids}"
    );
    // `-o tsv`: a line per member, its scalar values tab-separated; `-o none`: nothing.
    let tsv = env.ok(&["member", "list", "-f", "retail", "-o", "tsv"]);
    let lines: Vec<&str> = tsv.lines().collect();
    assert_eq!(lines.len(), 2, "{tsv}");
    assert!(
        lines.iter().any(|l| l.split('\t').any(|v| v == "canary")),
        "{tsv}"
    );
    assert!(lines.iter().all(|l| !l.contains('{')), "{tsv}");
    assert_eq!(
        env.ok(&["member", "list", "-f", "retail", "-o", "none"]),
        ""
    );
    // `--query`, JMESPath as `az` takes it, before the output format.
    let names = env.ok(&[
        "member", "list", "-f", "retail", "--query", "[].name", "-o", "tsv",
    ]);
    assert_eq!(names, "canary\nwest-1\n");
    let prod = env.json(&[
        "member",
        "list",
        "-f",
        "retail",
        "--query",
        "[?group=='prod'].{name: name, cluster: clusterResourceId}",
    ]);
    assert_eq!(
        prod,
        serde_json::json!([{"name": "west-1", "cluster": "aks-west-1"}])
    );
    env.fails(
        &["member", "list", "-f", "retail", "--query", "[?"],
        "--query",
    );
    let stages = r#"{"stages": [{"name": "canary", "groups": [{"name": "canary"}]},
        {"name": "prod", "beforeGates": [{"type": "Approval", "displayName": "Go"}], "groups": [{"name": "prod"}]}]}"#;
    let mut create = vec![
        "updaterun",
        "create",
        "-f",
        "retail",
        "-n",
        "r1",
        "--upgrade-type",
        "full",
        "--kubernetes-version",
        "1.31.1",
        "--node-image-selection",
        "LATEST",
        "--stages",
        stages,
        "--no-wait",
    ];
    create.extend(az);
    let run = env.json(&create);
    let update = &run["managedClusterUpdate"];
    assert_eq!(update["upgrade"]["type"], "Full", "{run}");
    assert_eq!(update["nodeImageSelection"]["type"], "Latest", "{run}");
    env.ok(&[
        "updaterun",
        "start",
        "-f",
        "retail",
        "-n",
        "r1",
        "--no-wait",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let gate = loop {
        let gates = env.json(&[
            "gate",
            "list",
            "-f",
            "retail",
            "--state",
            "pending",
            "--gate-type",
            "approval",
        ]);
        if let Some(name) = gates[0]["name"].as_str() {
            break name.to_string();
        }
        assert!(Instant::now() < deadline, "no gate became pending");
        std::thread::sleep(Duration::from_millis(50));
    };
    let none = env.json(&[
        "gate",
        "list",
        "-f",
        "retail",
        "--gate-type",
        "ScheduledStart",
    ]);
    assert_eq!(none, serde_json::json!([]), "{none}");
    let shown = env.json(&["gate", "show", "-f", "retail", "--gate-name", &gate]);
    assert_eq!(shown["name"], gate.as_str());
    // az's shape: the fields of `properties` beside `id` and `name`.
    assert!(shown.get("properties").is_none(), "{shown}");
    assert_eq!(shown["state"], "Pending", "{shown}");
    // A run that has not ended by `--timeout` exits 1.
    let waited = env.run(&[
        "updaterun",
        "wait",
        "-f",
        "retail",
        "-n",
        "r1",
        "--timeout",
        "0",
    ]);
    assert_eq!(waited.status.code(), Some(1), "{waited:?}");
    let approved = env.json(&[
        "gate",
        "update",
        "-f",
        "retail",
        "--gate-name",
        &gate,
        "--state",
        "completed",
    ]);
    assert_eq!(approved["state"], "Completed", "{approved}");
    let waited = env.run(&[
        "updaterun",
        "wait",
        "-f",
        "retail",
        "-n",
        "r1",
        "--custom",
        "status.status.state=='Completed'",
        "--interval",
        "1",
        "--timeout",
        "60",
    ]);
    assert_eq!(waited.status.code(), Some(0), "{waited:?}");
    // The `wait` commands of `az`: one condition, polled every `--interval`, 1 after `--timeout`.
    env.ok(&["fleet", "wait", "-n", "retail", "--exists"]);
    env.ok(&[
        "member",
        "wait",
        "-f",
        "retail",
        "-n",
        "canary",
        "--created",
    ]);
    let missing = env.run(&[
        "member",
        "wait",
        "-f",
        "retail",
        "-n",
        "nobody",
        "--exists",
        "--interval",
        "1",
        "--timeout",
        "1",
    ]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("timed out"));
    env.fails(
        &["member", "wait", "-f", "retail", "-n", "canary"],
        "exactly one of --created",
    );
    env.fails(
        &[
            "member", "wait", "-f", "retail", "-n", "canary", "--custom", "[?",
        ],
        "--custom",
    );
    env.ok(&[
        "member",
        "wait",
        "-f",
        "retail",
        "-n",
        "canary",
        "--custom",
        "group=='canary'",
    ]);
    // `reconcile` observes the cluster again and changes nothing else.
    let before = env.json(&["member", "show", "-f", "retail", "-n", "west-1"]);
    let after = env.json(&["member", "reconcile", "-f", "retail", "-n", "west-1"]);
    for field in ["clusterResourceId", "group", "labels"] {
        assert_eq!(before[field], after[field], "{field}");
    }
    env.ok(&["member", "delete", "-f", "retail", "-n", "west-1", "--yes"]);
    env.ok(&[
        "member",
        "wait",
        "-f",
        "retail",
        "-n",
        "west-1",
        "--deleted",
    ]);
}

/// The commands that talk to no server: `simulate` prints its document in the format asked, and
/// takes no client flags; `completions` into a closed pipe ends quietly.
#[test]
fn simulate_and_completions_print_as_asked() {
    let scenario = example("retail-fleet.yaml").display().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(bin()).args(args).output().expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, yaml, _) = run(&["simulate", &scenario, "-o", "yaml"]);
    assert_eq!(code, Some(0));
    assert!(
        yaml.starts_with("run:\n") && yaml.contains("\nclusters:\n"),
        "{yaml}"
    );
    let (code, json, _) = run(&["simulate", &scenario, "-o", "json"]);
    assert_eq!(code, Some(0));
    let document: Value = serde_json::from_str(&json).expect("JSON");
    let (_, legacy, _) = run(&["simulate", &scenario, "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&legacy).expect("JSON"),
        document
    );
    let state = document["run"]["properties"]["status"]["status"]["state"]
        .as_str()
        .expect("a state")
        .to_string();
    let (code, queried, _) = run(&[
        "simulate",
        &scenario,
        "--query",
        "run.properties.status.status.state",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(queried.trim(), state);
    let (code, text, _) = run(&["simulate", &scenario]);
    assert_eq!(code, Some(0));
    assert!(!text.trim_start().starts_with('{'), "the report: {text}");
    // Client flags belong to client commands.
    let (code, _, stderr) = run(&["simulate", &scenario, "--token", "x"]);
    assert_eq!(code, Some(2), "{stderr}");
    let (_, help, _) = run(&["serve", "--help"]);
    assert!(
        help.contains("--listen") && !help.contains("--token") && !help.contains("--query"),
        "{help}"
    );
    // Shell completions into a closed pipe.
    let mut child = Command::new(bin())
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// `updaterun rollback` (SEMANTICS §15): an approver rolls a finished run back; the rollback run
/// waits at its gate, takes the cluster back once approved, cannot be re-run, and the original
/// cannot be started again.
#[test]
fn a_run_rolled_back_from_the_command_line() {
    let env = Env::start("rollback");
    let driver = env.write(
        "driver.json",
        r#"{"type": "sim", "timeScale": 3000,
  "catalog": {"japaneast": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}]}},
  "clusters": {
    "aks-1": {"region": "japaneast", "kubernetesVersion": "1.30.5", "sim": {"rollback": {"untilSeconds": 604800}}}}}"#,
    );
    env.ok(&["fleet", "create", "-n", "retail", "--driver", &driver]);
    env.ok(&[
        "member",
        "create",
        "-f",
        "retail",
        "-n",
        "one",
        "--cluster-resource-id",
        "aks-1",
    ]);
    let run = ["-f", "retail", "-n", "r1"];
    env.ok(&[
        &["updaterun", "create"][..],
        &run,
        &[
            "--upgrade-type",
            "ControlPlaneOnly",
            "--kubernetes-version",
            "1.31.1",
        ],
    ]
    .concat());
    env.fails(
        &[&["updaterun", "rollback"][..], &run].concat(),
        "only a finished or Stopped run can be rolled back",
    );
    env.ok(&[&["updaterun", "start"][..], &run].concat());
    let done = env.run(&[&["updaterun", "wait"][..], &run, &["--timeout", "60"]].concat());
    assert_eq!(done.status.code(), Some(0), "r1 completes");
    let shown = env.ok(&[&["updaterun", "rollback"][..], &run, &["-o", "table"]].concat());
    assert!(
        shown.contains("update run rollback-of-r1 rolls back r1"),
        "{shown}"
    );
    assert!(shown.contains("gate list -f retail"), "{shown}");
    let again = env.json(&[&["updaterun", "rollback"][..], &run].concat());
    assert_eq!(again["name"], "rollback-of-r1", "the same rollback run");
    assert_eq!(again["status"]["rollbackOf"], "r1", "{again}");
    env.fails(
        &[&["updaterun", "start"][..], &run].concat(),
        "only a NotStarted, Stopped or Failed run can be started",
    );
    env.fails(
        &[
            "updaterun",
            "rerun",
            "-f",
            "retail",
            "-n",
            "rollback-of-r1",
            "--new-name",
            "copy",
        ],
        "a rollback run cannot be re-run",
    );
    let gates = env.json(&["gate", "list", "-f", "retail", "--state", "Pending"]);
    assert!(
        gates.as_array().is_some_and(|g| g.len() == 1)
            && gates.to_string().contains("rollback-of-r1"),
        "one gate pending, the rollback run's: {gates}"
    );
    let gate = gates[0]["name"].as_str().expect("its name").to_string();
    env.ok(&["gate", "approve", "-f", "retail", "-n", &gate]);
    let back = env.run(&[
        "updaterun",
        "wait",
        "-f",
        "retail",
        "-n",
        "rollback-of-r1",
        "--timeout",
        "60",
    ]);
    assert_eq!(back.status.code(), Some(0), "the rollback run completes");
    let member = env.json(&["member", "show", "-f", "retail", "-n", "one"]);
    assert_eq!(
        member["status"]["cluster"]["kubernetesVersion"], "1.30.5",
        "{member}"
    );
}

/// Every enum value of the command line matches in any case (docs/cli-guide.md: "enum values
/// match in any case"), and bad shapes are one clear line naming the field, the value and what is
/// expected.
#[test]
fn enum_values_in_any_case_and_shapes_said_clearly() {
    let env = Env::start("enums");
    let driver = env.write("driver.json", DRIVER);
    env.ok(&["fleet", "create", "-n", "retail", "--driver", &driver]);
    // -o and a value parser's enums.
    let fleets: Value =
        serde_json::from_str(&env.ok(&["fleet", "list", "-o", "JSON"])).expect("-o JSON is JSON");
    assert_eq!(fleets[0]["name"], "retail");
    let token = env.ok(&["token", "create", "--role", "Reader", "--subject", "carol"]);
    assert!(!token.trim().is_empty());
    let tokens = env.json(&["token", "list"]);
    assert!(
        tokens
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["subject"] == "carol" && t["role"] == "reader"),
        "{tokens}"
    );
    let budget = env.json(&[
        "budget",
        "create",
        "-f",
        "retail",
        "-n",
        "per-region",
        "--max-unavailable",
        "1",
        "--per-value-of",
        "Region",
    ]);
    assert_eq!(budget["perValueOf"], "region", "{budget}");
    let budget = env.json(&[
        "budget",
        "create",
        "-f",
        "retail",
        "-n",
        "per-tier",
        "--max-unavailable",
        "1",
        "--per-value-of",
        "LABEL:Tier",
    ]);
    assert_eq!(
        budget["perValueOf"], "label:Tier",
        "the key keeps its case: {budget}"
    );
    let hook = env.json(&[
        "webhook",
        "create",
        "-n",
        "ops",
        "--url",
        "http://127.0.0.1:9/hook",
        "--secret",
        "s3cret",
        "--events",
        "runcompleted,GATEPENDING",
        "--format",
        "slack",
    ]);
    assert_eq!(
        hook["events"],
        json!(["RunCompleted", "GatePending"]),
        "{hook}"
    );
    let completions = env.ok(&["completions", "BASH"]);
    assert!(completions.contains("updaterun"));
    // A stages file written as a bare array of stages.
    let bare = env.write(
        "bare.json",
        r#"[{"name": "canary", "groups": [{"name": "canary"}]}]"#,
    );
    let said = env.fails(
        &[
            "updatestrategy",
            "create",
            "-f",
            "retail",
            "-n",
            "s",
            "--stages",
            &bare,
        ],
        r#"properties.strategy: expected an object {"stages": [...]}"#,
    );
    assert!(
        said.contains("not an array") && !said.contains("expected a sequence"),
        "{said}"
    );
    // A cron expression as a recurring freeze's schedule.
    let said = env.fails(
        &[
            "freeze",
            "create",
            "-f",
            "retail",
            "-n",
            "nights",
            "--recurrence",
            r#"{"schedule": "0 3 * * 1", "durationHours": 4, "startTime": "03:00", "utcOffset": "+00:00"}"#,
        ],
        "properties.recurrence.schedule",
    );
    assert!(
        said.contains(r#"not the string "0 3 * * 1""#)
            && said.contains(r#"{"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}"#)
            && !said.contains("ScheduleSpec"),
        "{said}"
    );
    // A skip target of no type: one line, the value named.
    env.ok(&[
        "updaterun",
        "create",
        "-f",
        "retail",
        "-n",
        "r",
        "--upgrade-type",
        "nodeimageonly",
    ]);
    let said = env.fails(
        &[
            "updaterun",
            "skip",
            "-f",
            "retail",
            "-n",
            "r",
            "--targets",
            "Cluster:x",
        ],
        r#"--targets "Cluster:x""#,
    );
    assert!(!said.contains("Some("), "{said}");
}
