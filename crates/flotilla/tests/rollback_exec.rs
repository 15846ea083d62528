//! Rollback with the `exec` driver through crashes (SEMANTICS §7, §15), with the real binary on
//! a real SQLite file: a fleet whose clusters are files kept by small shell scripts (observe,
//! upgrade, rollback, poll, and an Exec health check). A run upgrades it; the members whose
//! health check fails say `onFailure: RollBack`. The server is SIGKILLed again and again, at
//! random instants and on purpose while rollback operations run, and restarted on the same
//! file. At the end every cluster the run changed and whose check failed was rolled back by one
//! operation (one key; a re-send of the same key after a restart is allowed and must start
//! nothing new), every healthy one keeps its upgrade, no cluster the run did not change was
//! touched, and the statuses say so (`rolledBack: true`). Then the whole run is rolled back
//! (`POST …/updateRuns/r1/rollback`, its Approval gate approved) through kills again: every
//! changed member ends rolled back by exactly one key, the ones rolled back already are left
//! out, and the clusters at target are still untouched.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use common::{Api, Lcg, TempDir, create_token, free_port, serve};

const MEMBERS: usize = 14;
/// Their checks fail: rolled back if the run changes them.
const UNHEALTHY: [usize; 5] = [1, 4, 7, 10, 12];
/// At the target already: the run changes nothing there (store-12 is unhealthy too).
const AT_TARGET: [usize; 2] = [12, 13];
/// How long an operation (upgrade or rollback) takes, in milliseconds.
const OPERATION_MS: u64 = 1500;
/// Kills stop after this many, so that soaks (which a restart may begin again) can end.
const MAX_KILLS: usize = 20;

fn member(i: usize) -> String {
    format!("store-{i:02}")
}

/// The scripts: clusters at `STATE/clusters/MEMBER` (1.30.5 if absent), the rollback an upgrade
/// makes possible at `STATE/offers/MEMBER` ("VERSION UNTIL"), operations at `STATE/ops/KEY`
/// (created by one atomic rename, so one sender per key wins), every request received appended
/// to `*-received.log` and every operation actually started to `upgrades.log` or
/// `rollbacks.log` ("MEMBER KEY").
const OBSERVE: &str = r#"#!/bin/sh
set -eu
state=$1 member=$2
version=$(cat "$state/clusters/$member" 2>/dev/null || echo 1.30.5)
offer=
if [ -f "$state/offers/$member" ]; then
  read -r to until < "$state/offers/$member"
  offer="{\"scope\":\"ControlPlane\",\"to\":{\"kubernetesVersion\":\"$to\"},\"until\":\"$until\"}"
fi
printf '{"region":"eastus","kubernetesVersion":"%s","nodePools":[],"rollback":[%s]}\n' "$version" "$offer"
"#;

const UPGRADE: &str = r#"#!/bin/sh
set -eu
state=$1 member=$2 key=$3 version=$4
mkdir -p "$state/ops"
echo "$member $key" >> "$state/upgrade-received.log"
tmp=$(mktemp -d "$state/tmp.XXXXXX")
echo "upgrade $member $version" > "$tmp/what"
date +%s%N > "$tmp/started"
if mv -T "$tmp" "$state/ops/$key" 2>/dev/null; then
  echo "$member $key" >> "$state/upgrades.log"
else
  rm -rf "$tmp"
fi
printf '{"operationId":"%s"}\n' "$key"
"#;

/// A rollback nobody offered is the provider's definitive no (exit 2), as EKS and AKS refuse.
const ROLLBACK: &str = r#"#!/bin/sh
set -eu
state=$1 member=$2 key=$3 scope=$4 version=$5
echo "$member $key" >> "$state/rollback-received.log"
if [ "$scope" != ControlPlane ]; then
  echo "only the control plane rolls back here, not $scope"; exit 2
fi
if [ ! -d "$state/ops/$key" ]; then
  if [ ! -f "$state/offers/$member" ]; then echo "nothing to roll back on $member"; exit 2; fi
  read -r to until < "$state/offers/$member"
  if [ "$to" != "$version" ]; then echo "$member rolls back to $to, not $version"; exit 2; fi
fi
tmp=$(mktemp -d "$state/tmp.XXXXXX")
echo "rollback $member $version" > "$tmp/what"
date +%s%N > "$tmp/started"
if mv -T "$tmp" "$state/ops/$key" 2>/dev/null; then
  echo "$member $key" >> "$state/rollbacks.log"
else
  rm -rf "$tmp"
fi
printf '{"operationId":"%s"}\n' "$key"
"#;

/// An operation ends DURATION_MS after it started; its effect is applied once (an atomic
/// mkdir), files replaced by rename so that an observe never reads half of one.
const POLL: &str = r#"#!/bin/sh
set -eu
state=$1 key=$3 duration_ms=$4
dir="$state/ops/$key"
if [ ! -f "$dir/started" ]; then echo '{"state":"Unknown"}'; exit 0; fi
if [ $(( ($(date +%s%N) - $(cat "$dir/started")) / 1000000 )) -lt "$duration_ms" ]; then
  echo '{"state":"Running"}'; exit 0
fi
read -r kind member version < "$dir/what"
if mkdir "$dir/applied" 2>/dev/null; then
  mkdir -p "$state/clusters" "$state/offers"
  if [ "$kind" = upgrade ]; then
    before=$(cat "$state/clusters/$member" 2>/dev/null || echo 1.30.5)
    echo "$before $(date -u -d '+7 days' +%Y-%m-%dT%H:%M:%SZ)" > "$dir/offer"
    mv "$dir/offer" "$state/offers/$member"
  else
    rm -f "$state/offers/$member"
  fi
  echo "$version" > "$dir/version"
  mv "$dir/version" "$state/clusters/$member"
fi
echo '{"state":"Succeeded"}'
"#;

const CHECK: &str = r#"#!/bin/sh
[ ! -e "$1/unhealthy/$2" ] || { echo "$2 is unhealthy"; exit 1; }
"#;

fn write_script(bin: &Path, name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = bin.join(name);
    std::fs::write(&path, text).expect("script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

fn start_server(db: &Path, port: u16, log: &Path, bin: &Path) -> Child {
    serve(
        &db.display().to_string(),
        port,
        log,
        &[
            "--exec-allow",
            &bin.display().to_string(),
            "--checkpoint-after",
            "1",
        ],
    )
}

/// Per member, the distinct operation keys of a log ("MEMBER KEY" lines).
fn keys(path: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let mut words = line.split_whitespace();
        if let (Some(m), Some(k)) = (words.next(), words.next()) {
            keys.entry(m.to_string()).or_default().insert(k.to_string());
        }
    }
    keys
}

/// Whether a rollback operation has started and not yet ended (in the scripts' files).
fn rollback_in_flight(state: &Path) -> bool {
    let Ok(ops) = std::fs::read_dir(state.join("ops")) else {
        return false;
    };
    ops.flatten().any(|op| {
        std::fs::read_to_string(op.path().join("what")).is_ok_and(|w| w.starts_with("rollback"))
            && !op.path().join("applied").exists()
    })
}

fn run_state(api: &Api, run: &str) -> (String, Value) {
    let (_, value) = api
        .call(
            reqwest::Method::GET,
            &format!("/v1/fleets/edge/updateRuns/{run}"),
            None,
        )
        .unwrap_or((0, Value::Null));
    let state = value["properties"]["status"]["status"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (state, value)
}

/// Kills and restarts the server while a run goes on.
struct Killer<'a> {
    api: &'a Api,
    state: &'a Path,
    db: &'a Path,
    port: u16,
    log: &'a Path,
    bin: &'a Path,
    rng: &'a mut Lcg,
}

impl Killer<'_> {
    /// Until `run` ends: half the time waits for a rollback in flight (while fewer than
    /// `rollbacks` keys were started) and kills the server then, otherwise at a random instant;
    /// restarts it on the same file. Kills stop after [`MAX_KILLS`] so that soaks (which a
    /// restart may begin again) can end. The run as it ended, the kills, and those made while
    /// a rollback ran.
    fn drive(&mut self, run: &str, server: &mut Child, rollbacks: usize) -> (Value, usize, usize) {
        let (mut kills, mut kills_in_rollback) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let started = keys(&self.state.join("rollbacks.log"))
                .values()
                .map(BTreeSet::len)
                .sum::<usize>();
            let mut in_rollback = false;
            if self.rng.next(2) == 0 && started < rollbacks {
                let until = Instant::now() + Duration::from_secs(4);
                while Instant::now() < until && !rollback_in_flight(self.state) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                std::thread::sleep(Duration::from_millis(self.rng.next(OPERATION_MS / 2)));
                in_rollback = rollback_in_flight(self.state);
            } else {
                std::thread::sleep(Duration::from_millis(200 + self.rng.next(1500)));
            }
            let (now, value) = run_state(self.api, run);
            if ["Completed", "Failed", "Stopped"].contains(&now.as_str()) {
                return (value, kills, kills_in_rollback);
            }
            assert!(
                Instant::now() < deadline,
                "run {run} did not finish; last state {now:?}; see {}",
                self.log.display()
            );
            if kills >= MAX_KILLS {
                continue;
            }
            server.kill().expect("kill");
            let _ = server.wait();
            kills += 1;
            if in_rollback {
                kills_in_rollback += 1;
            }
            *server = start_server(self.db, self.port, self.log, self.bin);
            self.api.wait_ready();
        }
    }
}

#[test]
fn rollbacks_of_members_and_of_the_whole_run_happen_once_through_kills() {
    let dir = TempDir::new("rollback-exec");
    let state = dir.path().join("state");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(state.join("unhealthy")).expect("state");
    std::fs::create_dir_all(state.join("clusters")).expect("state");
    std::fs::create_dir_all(&bin).expect("bin");
    for i in UNHEALTHY {
        std::fs::write(state.join("unhealthy").join(member(i)), "").expect("unhealthy");
    }
    for i in AT_TARGET {
        std::fs::write(state.join("clusters").join(member(i)), "1.31.1\n").expect("at target");
    }
    let observe = write_script(&bin, "observe.sh", OBSERVE);
    let upgrade = write_script(&bin, "upgrade.sh", UPGRADE);
    let rollback = write_script(&bin, "rollback.sh", ROLLBACK);
    let poll = write_script(&bin, "poll.sh", POLL);
    let check = write_script(&bin, "check.sh", CHECK);
    let db = dir.path().join("flotilla.db");
    let server_log = dir.path().join("server.log");
    let port = free_port();
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: create_token(&db.display().to_string()),
    };
    let mut server = start_server(&db, port, &server_log, &bin);
    api.wait_ready();

    let s = state.display().to_string();
    api.must(
        reqwest::Method::PUT,
        "/v1/checkProviders/probe",
        Some(&json!({"properties": {"type": "Exec", "command": [check, s]}})),
    );
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/edge",
        Some(&json!({"properties": {"driver": {
            "type": "exec",
            "observe": [observe, s, "{member}"],
            "upgrade": [upgrade, s, "{member}", "{operationKey}", "{kubernetesVersion}"],
            "rollback": [rollback, s, "{member}", "{operationKey}", "{rollbackScope}", "{kubernetesVersion}"],
            "poll": [poll, s, "{member}", "{operationId}", OPERATION_MS.to_string()],
            "pollIntervalSeconds": 0.1,
            "timeoutSeconds": 10,
        }}})),
    );
    for i in 0..MEMBERS {
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/edge/members/{}", member(i)),
            Some(&json!({"properties": {"clusterResourceId": member(i), "group": "stores"}})),
        );
    }
    let run = json!({"properties": {
        "strategy": {"stages": [{"name": "all", "maxAllowedFailures": "100%",
            "groups": [{"name": "stores", "maxConcurrency": "2", "maxAllowedFailures": "100%"}],
            "memberHealthChecks": {"checks": [{"name": "probe", "provider": "probe", "args": ["{member}"]}],
                                   "soakSeconds": 2, "intervalSeconds": 1, "onFailure": "RollBack"}}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
    }});
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/edge/updateRuns/r1",
        Some(&run),
    );
    api.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
        None,
    );

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    eprintln!("rollback crash test seed {seed}");
    let mut rng = Lcg(seed);
    let changed_unhealthy = UNHEALTHY.iter().filter(|i| !AT_TARGET.contains(i)).count();
    let mut killer = Killer {
        api: &api,
        state: &state,
        db: &db,
        port,
        log: &server_log,
        bin: &bin,
        rng: &mut rng,
    };
    let (final_run, kills, kills_in_rollback) = killer.drive("r1", &mut server, changed_unhealthy);
    eprintln!("{kills} kills, {kills_in_rollback} while a rollback ran");
    assert!(kills >= 8, "only {kills} kills; the test proves little");
    assert!(
        kills_in_rollback >= 1,
        "no kill happened while a rollback ran; the test proves nothing of them"
    );
    let status = &final_run["properties"]["status"];
    assert_eq!(status["status"]["state"], "Completed", "{status}");

    // The scripts' files: what was asked and what was done, per member.
    let upgrades_asked = keys(&state.join("upgrade-received.log"));
    let upgrades_done = keys(&state.join("upgrades.log"));
    let rollbacks_asked = keys(&state.join("rollback-received.log"));
    let rollbacks_done = keys(&state.join("rollbacks.log"));
    let logs = format!(
        "upgrades asked {upgrades_asked:?}\nrollbacks asked {rollbacks_asked:?}\nrollbacks done {rollbacks_done:?}"
    );
    let sent = std::fs::read_to_string(state.join("rollback-received.log"))
        .unwrap_or_default()
        .lines()
        .count();
    eprintln!(
        "{sent} rollback requests received for {} keys",
        rollbacks_asked.values().map(BTreeSet::len).sum::<usize>()
    );
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
    for i in 0..MEMBERS {
        let name = member(i);
        let m = &members[&name];
        let version = std::fs::read_to_string(state.join("clusters").join(&name))
            .unwrap_or_else(|_| "1.30.5".into());
        let count = |k: &BTreeMap<String, BTreeSet<String>>| k.get(&name).map_or(0, BTreeSet::len);
        if AT_TARGET.contains(&i) {
            // Not changed: never touched, whatever its checks say.
            assert_eq!(count(&upgrades_asked), 0, "{name}\n{logs}");
            assert_eq!(count(&rollbacks_asked), 0, "{name}\n{logs}");
            assert_eq!(version.trim(), "1.31.1", "{name}");
            assert_eq!(m["status"]["state"], "Skipped", "{m}");
            assert_ne!(m["rolledBack"], true, "{m}");
            continue;
        }
        // Changed: upgraded by one operation.
        assert_eq!(count(&upgrades_asked), 1, "{name}\n{logs}");
        assert_eq!(count(&upgrades_done), 1, "{name}\n{logs}");
        assert_eq!(m["before"]["kubernetesVersion"], "1.30.5", "{m}");
        if UNHEALTHY.contains(&i) {
            // Rolled back by one operation (one key, however often it was sent), back where it
            // was, Failed for its check with rolledBack true.
            assert_eq!(count(&rollbacks_asked), 1, "{name}\n{logs}");
            assert_eq!(count(&rollbacks_done), 1, "{name}\n{logs}");
            assert_eq!(version.trim(), "1.30.5", "{name}");
            assert_eq!(m["status"]["state"], "Failed", "{m}");
            assert_eq!(m["status"]["error"]["code"], "HealthCheckFailed", "{m}");
            assert_eq!(m["rolledBack"], true, "{m}");
        } else {
            assert_eq!(count(&rollbacks_asked), 0, "{name}\n{logs}");
            assert_eq!(version.trim(), "1.31.1", "{name}");
            assert_eq!(m["status"]["state"], "Completed", "{m}");
            assert_ne!(m["rolledBack"], true, "{m}");
        }
    }
    assert_eq!(
        status["status"]["state"], "Completed",
        "the failures were allowed (100 %)"
    );

    // The whole run rolled back (POST …/rollback): a rollback run over the members it changed
    // and that are not rolled back yet, waiting at its Approval gate; approved, it is driven
    // through kills like the run. Every changed member ends rolled back by exactly one key
    // (the ones rolled back already get none more), the others are never touched.
    let made = api.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/rollback",
        None,
    );
    assert_eq!(made["name"], "rollback-of-r1", "{made}");
    let gate = made["properties"]["status"]["stages"][0]["beforeGates"][0]["gateId"]
        .as_str()
        .and_then(|id| id.rsplit('/').next())
        .unwrap_or_else(|| panic!("an Approval gate: {made}"))
        .to_string();
    api.must(
        reqwest::Method::PATCH,
        &format!("/v1/fleets/edge/gates/{gate}"),
        Some(&json!({"properties": {"state": "Completed"}})),
    );
    let changed_healthy = (0..MEMBERS)
        .filter(|i| !AT_TARGET.contains(i) && !UNHEALTHY.contains(i))
        .count();
    let mut killer = Killer {
        api: &api,
        state: &state,
        db: &db,
        port,
        log: &server_log,
        bin: &bin,
        rng: &mut rng,
    };
    let (rolled, kills, kills_in_rollback) = killer.drive(
        "rollback-of-r1",
        &mut server,
        changed_unhealthy + changed_healthy,
    );
    eprintln!("rollback run: {kills} kills, {kills_in_rollback} while a rollback ran");
    assert!(kills >= 4, "only {kills} kills in the rollback run");
    assert!(
        kills_in_rollback >= 1,
        "no kill happened while the rollback run's operations ran"
    );
    let status = &rolled["properties"]["status"];
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    let upgrades_asked = keys(&state.join("upgrade-received.log"));
    let rollbacks_asked = keys(&state.join("rollback-received.log"));
    let rollbacks_done = keys(&state.join("rollbacks.log"));
    let logs = format!("upgrades asked {upgrades_asked:?}\nrollbacks asked {rollbacks_asked:?}");
    let in_run: BTreeMap<String, Value> = status["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .flat_map(|s| s["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["members"].as_array().into_iter().flatten())
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_string(),
                m.clone(),
            )
        })
        .collect();
    for i in 0..MEMBERS {
        let name = member(i);
        let count = |k: &BTreeMap<String, BTreeSet<String>>| k.get(&name).map_or(0, BTreeSet::len);
        let version = std::fs::read_to_string(state.join("clusters").join(&name))
            .unwrap_or_else(|_| "1.30.5".into());
        if AT_TARGET.contains(&i) {
            assert_eq!(count(&upgrades_asked), 0, "{name}\n{logs}");
            assert_eq!(count(&rollbacks_asked), 0, "{name}\n{logs}");
            assert_eq!(version.trim(), "1.31.1", "{name}");
            assert!(
                !in_run.contains_key(&name),
                "{name} was never changed: {status}"
            );
            continue;
        }
        assert_eq!(count(&upgrades_asked), 1, "{name}\n{logs}");
        assert_eq!(count(&rollbacks_asked), 1, "{name}\n{logs}");
        assert_eq!(count(&rollbacks_done), 1, "{name}\n{logs}");
        assert_eq!(version.trim(), "1.30.5", "{name}");
        if UNHEALTHY.contains(&i) {
            assert!(
                !in_run.contains_key(&name),
                "{name} was rolled back already: {status}"
            );
        } else {
            let m = &in_run[&name];
            assert_eq!(m["status"]["state"], "Completed", "{m}");
            assert_eq!(m["rolledBack"], true, "{m}");
        }
    }
    let _ = server.kill();
    let _ = server.wait();
}
