//! Transient faults never fail a member (API.md, "Driver errors and deadlines"): the real binary
//! over the example `exec` scripts, wrapped so that a fifth of every observe, upgrade and poll
//! fails (exit 1, or hangs past the timeout, before or after doing its work), and a server
//! started under a low hard file-descriptor limit, so that spawning the scripts runs out of file
//! descriptors. Every member is upgraded exactly once (the scripts log every upgrade they really
//! start), none fails, and the run completes.

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Api, create_token, free_port, member_name, scripts};

/// Fails about a fifth of the calls it wraps, with the three kinds of transient failure.
const FLAKY: &str = r#"#!/bin/sh
# Usage: flaky.sh LOG SCRIPT ARGS...: runs SCRIPT, except that about a fifth of the calls fail.
log=$1; shift
roll=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
roll=$((roll % 100))
if [ "$roll" -lt 7 ]; then
  echo "flaky: refused before $1" >> "$log"; echo "flaky: try again" >&2; exit 1
elif [ "$roll" -lt 14 ]; then
  # The work is done, but the answer is lost: the caller cannot know it was.
  sh "$@" > /dev/null; echo "flaky: failed after $1" >> "$log"; exit 1
elif [ "$roll" -lt 20 ]; then
  echo "flaky: hanging in $1" >> "$log"; sleep 5; exit 0
fi
exec sh "$@"
"#;

const MEMBERS: usize = 20;

struct Setup {
    dir: std::path::PathBuf,
    api: Api,
    server: Child,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// A server on a fresh SQLite file (under `prlimit` when `nofile` is given), a fleet whose
/// driver wraps the example scripts in `flaky.sh` (or not), and run `r1` over its members.
fn setup(test: &str, nofile: Option<u32>, flaky: bool, extra: &[&str]) -> Setup {
    let dir = std::env::temp_dir().join(format!("flotilla-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("state")).expect("state dir");
    let db = dir.join("flotilla.db").display().to_string();
    let token = create_token(&db);
    let port = free_port();
    let log = std::fs::File::create(dir.join("server.log")).expect("log");
    let mut command = match nofile {
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}"))
                .arg(env!("CARGO_BIN_EXE_flotilla"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_flotilla")),
    };
    let server = command
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database",
            &db,
            "--exec-allow",
            &scripts().display().to_string(),
            "--exec-allow",
            &dir.display().to_string(),
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("the server starts");
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    let setup = Setup { dir, api, server };
    setup.api.wait_ready();

    let flaky_sh = setup.dir.join("flaky.sh");
    std::fs::write(&flaky_sh, FLAKY).expect("flaky.sh");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&flaky_sh, std::fs::Permissions::from_mode(0o755))
            .expect("executable");
    }
    let scripts = scripts().display().to_string();
    let state = setup.dir.join("state").display().to_string();
    let faults = setup.dir.join("faults.log").display().to_string();
    let wrap = |script: &str, args: Vec<String>| -> Vec<String> {
        let mut argv = if flaky {
            vec![flaky_sh.display().to_string(), faults.clone()]
        } else {
            vec![]
        };
        argv.push(format!("{scripts}/{script}"));
        argv.extend(args);
        argv
    };
    let driver = json!({
        "type": "exec",
        "observe": wrap("observe.sh", vec![state.clone(), "{member}".into()]),
        "upgrade": wrap("upgrade.sh", vec![state.clone(), "{member}".into(), "{operationKey}".into(), "{kubernetesVersion}".into()]),
        "poll": wrap("poll.sh", vec![state.clone(), "{member}".into(), "{operationId}".into(), "300".into()]),
        "pollIntervalSeconds": 0.05,
        "timeoutSeconds": 1,
    });
    must(
        &setup.api,
        reqwest::Method::PUT,
        "/v1/fleets/edge",
        json!({"properties": {"driver": driver}}),
    );
    for i in 0..MEMBERS {
        let name = member_name(i);
        // The observation at registration may fail: the member is observed again when a run
        // needs it.
        must(
            &setup.api,
            reqwest::Method::PUT,
            &format!("/v1/fleets/edge/members/{name}"),
            json!({"properties": {"clusterResourceId": name, "group": "stores"}}),
        );
    }
    let run = json!({"properties": {
        "strategy": {"stages": [{"name": "all", "groups": [{"name": "stores", "maxConcurrency": "8"}]}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
    }});
    must(
        &setup.api,
        reqwest::Method::PUT,
        "/v1/fleets/edge/updateRuns/r1",
        run,
    );
    must(
        &setup.api,
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
        Value::Null,
    );
    setup
}

/// A call that must succeed, asked again while the server cannot answer (a server out of file
/// descriptors refuses connections for a while) or answers 409 (a run whose members could not
/// all be observed yet).
fn must(api: &Api, method: reqwest::Method, path: &str, body: Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = (!body.is_null()).then_some(&body);
        match api.call(method.clone(), path, body) {
            Ok((status, value)) if (200..300).contains(&status) => return value,
            other if Instant::now() > deadline => panic!("{method} {path}: {other:?}"),
            Ok((status, value)) if status < 500 && status != 409 => {
                panic!("{method} {path}: {status} {value}")
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Waits for the run to end and checks it: Completed, nobody failed, and every member upgraded
/// exactly once according to the scripts' own log.
fn check_run_completes_once_each(setup: &Setup) {
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Ok((200, run)) =
            setup
                .api
                .call(reqwest::Method::GET, "/v1/fleets/edge/updateRuns/r1", None)
        {
            let state = run["properties"]["status"]["status"]["state"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if matches!(state.as_str(), "Completed" | "Failed" | "Stopped") {
                break run["properties"]["status"].clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the run did not end; server log:\n{}",
            std::fs::read_to_string(setup.dir.join("server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let members: Vec<&Value> = status["stages"][0]["groups"][0]["members"]
        .as_array()
        .expect("members")
        .iter()
        .collect();
    let failed: Vec<String> = members
        .iter()
        .filter(|m| m["status"]["state"] != "Completed")
        .map(|m| {
            format!(
                "{} {} {}",
                m["name"], m["status"]["state"], m["status"]["error"]
            )
        })
        .collect();
    assert!(failed.is_empty(), "members not Completed: {failed:#?}");
    assert_eq!(status["status"]["state"], "Completed", "{status}");
    let log = std::fs::read_to_string(setup.dir.join("state/upgrades.log")).unwrap_or_default();
    let mut upgrades: BTreeMap<String, usize> = BTreeMap::new();
    for line in log.lines() {
        let member = line.split(' ').next().unwrap_or_default();
        *upgrades.entry(member.to_string()).or_default() += 1;
    }
    for i in 0..MEMBERS {
        let name = member_name(i);
        assert_eq!(
            upgrades.get(&name).copied(),
            Some(1),
            "{name} was upgraded {:?} times",
            upgrades.get(&name)
        );
    }
}

#[test]
fn a_flaky_driver_slows_the_run_but_fails_no_member_and_upgrades_each_once() {
    let setup = setup("flaky", None, true, &[]);
    check_run_completes_once_each(&setup);
    let faults = std::fs::read_to_string(setup.dir.join("faults.log")).unwrap_or_default();
    for kind in ["refused before", "failed after", "hanging in"] {
        assert!(
            faults.contains(kind),
            "the run saw no fault of the kind {kind:?}:\n{faults}"
        );
    }
}

#[test]
fn running_out_of_file_descriptors_fails_no_member() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    let setup = setup("nofile", Some(40), false, &[]);
    check_run_completes_once_each(&setup);
    let log = std::fs::read_to_string(setup.dir.join("server.log")).unwrap_or_default();
    assert!(
        log.contains("Too many open files"),
        "the server never ran out of file descriptors, so this test tested nothing:\n{log}"
    );
}

/// Hostile clients hold nothing for long (Hardening, item 1): idle connections, headers sent a
/// byte at a time and bodies sent half are cut off by their deadlines; connections past the cap
/// are closed at once; and under a low file limit the API keeps answering and the run's members
/// are upgraded, none failed.
#[test]
fn hostile_connections_do_not_hold_the_server() {
    use std::io::{Read, Write};
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    let limits = [
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--max-connections",
        "48",
    ];
    let setup = setup("hostile", Some(160), false, &limits);
    let address = setup.api.base.trim_start_matches("http://").to_string();
    let connect = || {
        let stream = std::net::TcpStream::connect(&address).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(8))).ok()?;
        Some(stream)
    };
    let opened = Instant::now();
    // 20 connections that send their headers a byte at a time, 10 that send half a body.
    let mut slow: Vec<std::net::TcpStream> = (0..20).filter_map(|_| connect()).collect();
    let mut half: Vec<std::net::TcpStream> = (0..10)
        .filter_map(|_| {
            let mut s = connect()?;
            let head = format!(
                "PUT /v1/fleets/edge/members/x HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"properties\":",
                setup.api.token
            );
            s.write_all(head.as_bytes()).ok()?;
            Some(s)
        })
        .collect();
    // Then 200 idle connections: past the cap (the slow ones hold some) they are closed at
    // once, the rest after a second.
    let mut idle: Vec<std::net::TcpStream> = (0..200).filter_map(|_| connect()).collect();
    for byte in b"GET /v1/fleets HTTP/1.1\r\nHost: x\r\n" {
        for s in &mut slow {
            let _ = s.write_all(&[*byte]);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every hostile connection is closed by the server, the half-sent bodies with a 408.
    let closed = |s: &mut std::net::TcpStream| {
        let mut buffer = [0u8; 4096];
        let mut seen = Vec::new();
        loop {
            match s.read(&mut buffer) {
                Ok(0) => return Some(String::from_utf8_lossy(&seen).to_string()),
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Some(String::from_utf8_lossy(&seen).to_string());
                }
                Err(_) => return None,
            }
        }
    };
    for s in idle.iter_mut().chain(slow.iter_mut()) {
        assert!(
            closed(s).is_some(),
            "a connection was held past its deadline"
        );
    }
    for s in &mut half {
        let answer = closed(s).expect("closed");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    }
    assert!(
        opened.elapsed() < Duration::from_secs(15),
        "hostile connections held the server for {:?}",
        opened.elapsed()
    );
    // Meanwhile the run went on: every member upgraded once, none failed.
    check_run_completes_once_each(&setup);
}
