//! Checks reach only what an admin declared (SEMANTICS §10), tried as an attacker holding an
//! operator token would: the real binary over real HTTP, the exec driver's real scripts, and
//! servers of the test's own on loopback (a "secret" one nothing may reach, an admin's health
//! endpoint, a redirector, a Prometheus that answers errors holding a secret).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    Api, Killed, TempDir, create_exec_run, create_token, free_port, scripts, serve, wait_for,
};
use reqwest::Method;
use serde_json::{Value, json};

/// A loopback HTTP server answering every request with `answer(path)` (a whole HTTP/1.1
/// response), recording each request's first line and headers.
fn listen(answer: fn(&str, u16) -> String) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                request.push_str(&line);
            }
            let path = request
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            log.lock().expect("log").push(request);
            let mut stream = stream;
            let _ = stream.write_all(answer(&path, port).as_bytes());
        }
    });
    (port, seen)
}

fn response(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn operator(admin: &Api) -> Api {
    let made = admin.must(
        Method::POST,
        "/v1/tokens",
        Some(&json!({"role": "operator", "subject": "mallory"})),
    );
    Api {
        http: admin.http.clone(),
        base: admin.base.clone(),
        token: made["token"].as_str().expect("a token").to_string(),
    }
}

/// A refusal: the status, and the error's target (the field it names) and message.
fn refused(api: &Api, method: Method, path: &str, body: &Value) -> (u16, String, String) {
    let (status, answer) = api.call(method, path, Some(body)).expect("answered");
    (
        status,
        answer["error"]["target"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn strategy_with_gate(check: Value) -> Value {
    json!({"properties": {"strategy": {"stages": [{"name": "all",
        "beforeGates": [{"type": "HealthCheck", "checks": [check], "soakSeconds": 0, "intervalSeconds": 1}],
        "groups": [{"name": "stores"}]}]}}})
}

#[test]
fn an_operator_cannot_run_a_program_of_its_choosing_through_a_check() {
    let dir = TempDir::new("providers-exec");
    let database = dir.0.join("flotilla.db").display().to_string();
    let port = free_port();
    let admin = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: create_token(&database),
    };
    let _server = Killed(serve(&database, port, &dir.0.join("server.log"), &[]));
    admin.wait_ready();
    let state = dir.0.join("clusters");
    std::fs::create_dir_all(&state).expect("state");
    create_exec_run(&admin, &state, 2, 1, 100);
    let mallory = operator(&admin);
    let scripts = scripts().display().to_string();
    let upgrade = format!("{scripts}/upgrade.sh");
    let state_text = state.display().to_string();

    // The attack as found: a before-gate check whose "command" upgrades store-00, with no run
    // and no approval.
    let attack = json!({"name": "pwn", "type": "Exec",
        "command": [upgrade, state_text, "store-00", "k1", "1.31.5", "Full", ""]});
    let at = "properties.strategy.stages[0].beforeGates[0].checks[0]";
    for path in [
        "/v1/fleets/edge/updateStrategies/evil",
        "/v1/fleets/edge/updateRuns/evil",
    ] {
        let mut body = strategy_with_gate(attack.clone());
        body["properties"]["managedClusterUpdate"] =
            json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}});
        if path.contains("Strategies") {
            body["properties"]
                .as_object_mut()
                .expect("object")
                .remove("managedClusterUpdate");
        }
        let (status, target, message) = refused(&mallory, Method::PUT, path, &body);
        assert_eq!(status, 400, "{path}: {message}");
        assert_eq!(target, format!("{at}.command"), "{message}");
        assert!(message.contains("check provider"), "{message}");
    }
    // Naming the upgrade script as a provider is an admin's act only.
    let provider = json!({"properties": {"type": "Exec", "command": [upgrade]}});
    let (status, _, message) = refused(
        &mallory,
        Method::PUT,
        "/v1/checkProviders/upgrade",
        &provider,
    );
    assert_eq!(status, 403, "{message}");
    // A check may name only a provider that exists.
    let named = json!({"name": "pwn", "provider": "upgrade",
        "args": [state_text, "store-00", "k1", "1.31.5"]});
    let (status, target, message) = refused(
        &mallory,
        Method::PUT,
        "/v1/fleets/edge/updateStrategies/evil",
        &strategy_with_gate(named),
    );
    assert_eq!(
        (status, target.as_str()),
        (400, &*format!("{at}.provider")),
        "{message}"
    );

    // An admin's provider fixes the program and its first arguments; an operator adds data,
    // never an option (the state directory an option would redirect stays the admin's).
    admin.must(
        Method::PUT,
        "/v1/checkProviders/observe",
        Some(&json!({"properties": {"type": "Exec",
            "command": [format!("{scripts}/observe.sh"), state_text]}})),
    );
    let option = json!({"name": "look", "provider": "observe", "args": ["--state=/etc"]});
    let (status, target, message) = refused(
        &mallory,
        Method::PUT,
        "/v1/fleets/edge/updateStrategies/evil",
        &strategy_with_gate(option),
    );
    assert_eq!(
        (status, target.as_str()),
        (400, &*format!("{at}.args[0]")),
        "{message}"
    );
    assert!(message.contains("option"), "{message}");
    // An admin cannot declare a program outside --exec-allow either.
    let (status, target, message) = refused(
        &admin,
        Method::PUT,
        "/v1/checkProviders/shell",
        &json!({"properties": {"type": "Exec", "command": ["/bin/sh", "-c", "id"]}}),
    );
    assert_eq!(
        (status, target.as_str()),
        (400, "properties.command[0]"),
        "{message}"
    );

    // A legitimate check through the provider runs (the run completes), and nothing but the
    // run's own upgrades was ever sent.
    let good = json!({"name": "look", "provider": "observe", "args": ["store-00"]});
    let mut run = strategy_with_gate(good);
    run["properties"]["managedClusterUpdate"] =
        json!({"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}});
    let received = || std::fs::read_to_string(state.join("received.log")).unwrap_or_default();
    assert_eq!(received(), "", "nothing was sent before any run started");
    mallory.must(
        Method::PUT,
        "/v1/fleets/edge/updateRuns/checked",
        Some(&run),
    );
    admin.must(Method::DELETE, "/v1/fleets/edge/updateRuns/r1", None);
    mallory.must(
        Method::POST,
        "/v1/fleets/edge/updateRuns/checked/start",
        None,
    );
    wait_for(
        "the checked run to complete",
        Duration::from_secs(60),
        || {
            admin.must(Method::GET, "/v1/fleets/edge/updateRuns/checked", None)["properties"]["status"]
                ["status"]["state"]
                == "Completed"
        },
    );
    let sent: Vec<String> = received()
        .lines()
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .collect();
    assert!(
        sent.iter().all(|l| l.ends_with(" 1.31.1")) && sent.len() == 2,
        "only the run's upgrades to 1.31.1: {sent:?}"
    );
    // A provider a strategy names cannot be deleted.
    let (status, _, message) = refused(
        &admin,
        Method::DELETE,
        "/v1/checkProviders/observe",
        &json!(null),
    );
    assert_eq!(
        status, 200,
        "the run is over and no strategy names it: {message}"
    );
}

/// The secret server's port, for the redirector to point at.
static SECRET_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

#[test]
fn an_operator_cannot_make_the_server_fetch_a_url_of_its_choosing() {
    let dir = TempDir::new("providers-http");
    let database = dir.0.join("flotilla.db").display().to_string();
    let port = free_port();
    let admin = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: create_token(&database),
    };
    let _server = Killed(serve(&database, port, &dir.0.join("server.log"), &[]));
    admin.wait_ready();
    let mallory = operator(&admin);

    let (secret, secret_hits) = listen(|_, _| response("200 OK", "", "SECRET=hunter2"));
    let (health, health_seen) = listen(|_, _| response("200 OK", "", "ok"));
    SECRET_PORT.store(secret, std::sync::atomic::Ordering::Relaxed);
    let (redirector, _) = listen(|_, _| {
        let secret = SECRET_PORT.load(std::sync::atomic::Ordering::Relaxed);
        response(
            "302 Found",
            &format!("Location: http://127.0.0.1:{secret}/\r\n"),
            "",
        )
    });
    let (prom, _) = listen(|_, _| {
        response(
            "400 Bad Request",
            "Content-Type: application/json\r\n",
            r#"{"status":"error","errorType":"bad_data","error":"SECRET=hunter2"}"#,
        )
    });

    // A sim fleet whose members' cluster ids an attacker chose.
    let ids = ["/sub/a?b#c", "../../admin"];
    let clusters: serde_json::Map<String, Value> = ids
        .iter()
        .map(|id| {
            (
                id.to_string(),
                json!({"region": "eastus", "kubernetesVersion": "1.30.5", "nodePools": []}),
            )
        })
        .collect();
    admin.must(
        Method::PUT,
        "/v1/fleets/f",
        Some(
            &json!({"properties": {"driver": {"type": "sim", "timeScale": 600,
            "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.32.0"}, {"version": "1.33.0"}]}},
            "clusters": clusters}}}),
        ),
    );
    for (name, id) in ["a", "b"].iter().zip(ids) {
        mallory.must(
            Method::PUT,
            &format!("/v1/fleets/f/members/{name}"),
            Some(&json!({"properties": {"clusterResourceId": id, "group": "g"}})),
        );
    }

    let at = "properties.strategy.stages[0].beforeGates[0].checks[0]";
    let secret_url = format!("http://127.0.0.1:{secret}/");
    for (check, field) in [
        (
            json!({"name": "x", "type": "Http", "url": secret_url, "headers": {"Metadata": "true"}}),
            "url",
        ),
        (
            json!({"name": "x", "type": "Prometheus", "endpoint": secret_url, "query": "up", "condition": "< 1"}),
            "endpoint",
        ),
        (
            json!({"name": "x", "provider": "health", "path": "/", "headers": {"Metadata": "true"}}),
            "headers",
        ),
        (
            json!({"name": "x", "provider": "health", "path": "/", "caFile": "/etc/shadow"}),
            "caFile",
        ),
    ] {
        let (status, target, message) = refused(
            &mallory,
            Method::PUT,
            "/v1/fleets/f/updateStrategies/evil",
            &strategy_with_gate(check.clone()),
        );
        assert_eq!(status, 400, "{check}: {message}");
        assert_eq!(target, format!("{at}.{field}"), "{check}: {message}");
    }
    let (status, _, _) = refused(
        &mallory,
        Method::PUT,
        "/v1/checkProviders/mine",
        &json!({"properties": {"type": "Http", "baseUrl": secret_url}}),
    );
    assert_eq!(status, 403);

    // The admin's providers.
    for (name, properties) in [
        (
            "health",
            json!({"type": "Http", "baseUrl": format!("http://127.0.0.1:{health}/base/")}),
        ),
        (
            "hop",
            json!({"type": "Http", "baseUrl": format!("http://127.0.0.1:{redirector}")}),
        ),
        (
            "prom",
            json!({"type": "Prometheus", "endpoint": format!("http://127.0.0.1:{prom}")}),
        ),
    ] {
        admin.must(
            Method::PUT,
            &format!("/v1/checkProviders/{name}"),
            Some(&json!({"properties": properties})),
        );
    }
    let (status, target, message) = refused(
        &admin,
        Method::PUT,
        "/v1/checkProviders/tls",
        &json!({"properties": {"type": "Http", "baseUrl": "https://h", "caFile": "/nonexistent/ca.pem"}}),
    );
    assert_eq!(
        (status, target.as_str()),
        (400, "properties.caFile"),
        "{message}"
    );
    assert!(
        !message.contains("nonexistent/ca.pem\" exists"),
        "{message}"
    );

    // Paths that would leave the base URL are refused when written.
    for path in [
        format!("//127.0.0.1:{secret}/"),
        "/../../secret".to_string(),
        "/%2e%2e/secret".to_string(),
        format!("/x?next=http://127.0.0.1:{secret}/"),
        "@127.0.0.1/".to_string(),
    ] {
        let (status, target, message) = refused(
            &mallory,
            Method::PUT,
            "/v1/fleets/f/updateStrategies/evil",
            &strategy_with_gate(json!({"name": "x", "provider": "health", "path": path})),
        );
        assert_eq!(status, 400, "{path}: {message}");
        assert_eq!(target, format!("{at}.path"), "{path}: {message}");
    }

    // A run whose checks go through the providers: values are encoded into one segment, a
    // value that would climb out is refused, a redirect is not followed, and no message
    // quotes what a server answered.
    // Each check in a run of its own: answers of one instant come in any order, and a member
    // ends at the first that fails it, so checks sharing a run could hide each other's results.
    let run_with = |name: &str, version: &str, check: Value| {
        let run = json!({"properties": {
            "strategy": {"stages": [{"name": "all", "maxAllowedFailures": "100%",
                "groups": [{"name": "g", "maxAllowedFailures": "100%", "maxConcurrency": "2"}],
                "memberHealthChecks": {"checks": [check], "soakSeconds": 3, "intervalSeconds": 1,
                                       "unavailableAfterSeconds": 1}}]},
            "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": version}},
        }});
        let path = format!("/v1/fleets/f/updateRuns/{name}");
        mallory.must(Method::PUT, &path, Some(&run));
        mallory.must(Method::POST, &format!("{path}/start"), None);
        wait_for(
            &format!("run {name} to end"),
            Duration::from_secs(60),
            || {
                admin.must(Method::GET, &path, None)["properties"]["status"]["status"]["state"]
                    == "Completed"
            },
        );
        let run = admin.must(Method::GET, &path, None);
        for member in run["properties"]["status"]["stages"][0]["groups"][0]["members"]
            .as_array()
            .expect("members")
        {
            let state = member["status"]["state"].clone();
            assert!(state == "Failed" || state == "Completed", "{member}");
        }
        let events = admin.must(Method::GET, &format!("{path}/events"), None);
        let everything = format!("{run}{events}");
        assert!(
            !everything.contains("hunter2"),
            "a body was quoted: {everything}"
        );
        (run, everything)
    };
    let state_of = |run: &Value, member: &str| {
        run["properties"]["status"]["stages"][0]["groups"][0]["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == member)
            .map(|m| m["status"]["state"].clone())
    };
    // A redirect is not followed: both fail on it, and the secret server is never reached.
    let (hop, everything) = run_with(
        "hop",
        "1.31.1",
        json!({"name": "hop", "provider": "hop", "path": "/"}),
    );
    assert_eq!(state_of(&hop, "a"), Some(json!("Failed")), "{hop}");
    assert_eq!(state_of(&hop, "b"), Some(json!("Failed")), "{hop}");
    assert!(
        everything.contains("HTTP 302"),
        "the redirect was seen, not followed: {everything}"
    );
    // No message quotes what a server answered (the Prometheus body holds the secret).
    let (_, everything) = run_with(
        "prom",
        "1.32.0",
        json!({"name": "prom", "provider": "prom", "query": "up", "condition": "< 1"}),
    );
    assert!(
        everything.contains("Prometheus answered HTTP 400"),
        "{everything}"
    );
    // Values are encoded into one segment, and a value that would climb out is refused.
    let (probe, everything) = run_with(
        "probe",
        "1.33.0",
        json!({"name": "probe", "provider": "health", "path": "/clusters/{clusterResourceId}"}),
    );
    assert_eq!(state_of(&probe, "a"), Some(json!("Completed")), "{probe}");
    assert_eq!(state_of(&probe, "b"), Some(json!("Failed")), "{probe}");
    assert!(
        everything.contains("leaves its provider's base URL"),
        "the climbing value was refused: {everything}"
    );
    assert!(
        secret_hits.lock().expect("hits").is_empty(),
        "the secret server was reached"
    );
    let seen = health_seen.lock().expect("seen").join("");
    assert!(
        seen.contains("GET /base/clusters/%2Fsub%2Fa%3Fb%23c HTTP/1.1"),
        "the value stays one segment: {seen}"
    );
    assert!(
        !seen.contains("admin"),
        "a value climbed out of the base: {seen}"
    );
    // Operators read providers (they name them), never a header's literal value.
    admin.must(
        Method::PUT,
        "/v1/checkProviders/prom",
        Some(&json!({"properties": {"type": "Prometheus", "endpoint": format!("http://127.0.0.1:{prom}"),
            "headers": {"Authorization": "Bearer s3cr3t", "X-Scope": "{env:FLOTILLA_CHECK_SCOPE}"}}})),
    );
    let shown = mallory.must(Method::GET, "/v1/checkProviders/prom", None);
    assert_eq!(
        shown["properties"]["headers"]["Authorization"],
        "<redacted>"
    );
    assert_eq!(
        shown["properties"]["headers"]["X-Scope"],
        "{env:FLOTILLA_CHECK_SCOPE}"
    );
    // Sent back as shown, the stored value stays.
    admin.must(
        Method::PUT,
        "/v1/checkProviders/prom",
        Some(&json!({"properties": shown["properties"]})),
    );
    let listed = admin
        .must(Method::GET, "/v1/checkProviders", None)
        .to_string();
    assert!(!listed.contains("s3cr3t"), "{listed}");
    // A run that is over no longer holds the provider; a strategy naming it does.
    mallory.must(
        Method::PUT,
        "/v1/fleets/f/updateStrategies/keep",
        Some(&strategy_with_gate(
            json!({"name": "p", "provider": "prom", "query": "up", "condition": "< 1"}),
        )),
    );
    let (status, _, message) = refused(
        &admin,
        Method::DELETE,
        "/v1/checkProviders/prom",
        &json!(null),
    );
    assert_eq!(status, 409, "{message}");
    assert!(message.contains("keep"), "{message}");
}

/// `flotilla checkprovider …` with `args`, as `api`'s caller; (exit success, stdout JSON, stderr).
fn cli(api: &Api, args: &[&str]) -> (bool, Value, String) {
    api.cli(&[&["checkprovider"], args].concat())
}

#[test]
fn the_cli_manages_check_providers_and_refuses_bad_ones() {
    let dir = TempDir::new("providers-cli");
    let database = dir.0.join("flotilla.db").display().to_string();
    let port = free_port();
    let admin = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token: create_token(&database),
    };
    let _server = Killed(serve(&database, port, &dir.0.join("server.log"), &[]));
    admin.wait_ready();
    let probe = format!("{}/observe.sh", scripts().display());
    let (ok, made, err) = cli(
        &admin,
        &[
            "create",
            "-n",
            "probe",
            "--type",
            "exec",
            "--command",
            &probe,
            "--command",
            "--quiet",
            "--fleets",
            "prod,edge",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(made["name"], "probe", "{made}");
    assert_eq!(made["type"], "Exec", "{made}");
    assert_eq!(made["command"], json!([probe, "--quiet"]), "{made}");
    assert_eq!(made["fleets"], json!(["prod", "edge"]), "{made}");
    let (ok, _, err) = cli(
        &admin,
        &[
            "create",
            "-n",
            "prom",
            "--type",
            "Prometheus",
            "--endpoint",
            "http://prom:9090",
            "--header",
            "Authorization=Bearer abc",
        ],
    );
    assert!(ok, "{err}");
    let (ok, shown, err) = cli(&admin, &["show", "-n", "prom"]);
    assert!(ok, "{err}");
    assert_eq!(shown["headers"]["Authorization"], "<redacted>", "{shown}");
    let (ok, listed, err) = cli(&admin, &["list"]);
    assert!(ok, "{err}");
    let names: Vec<&str> = listed
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["probe", "prom"]);
    // Bad input: a clear error naming the field and the value, a non-zero exit, nothing made.
    for (args, says) in [
        (
            vec![
                "create",
                "-n",
                "x",
                "--type",
                "Http",
                "--base-url",
                "ftp://h",
            ],
            "properties.baseUrl",
        ),
        (
            vec![
                "create",
                "-n",
                "x",
                "--type",
                "Exec",
                "--command",
                "/bin/sh",
            ],
            "properties.command[0]",
        ),
        (
            vec![
                "create",
                "-n",
                "x",
                "--type",
                "Http",
                "--base-url",
                "http://h",
                "--header",
                "nope",
            ],
            "NAME=VALUE",
        ),
        (vec!["delete", "-n", "nope"], "does not exist"),
    ] {
        let (ok, _, err) = cli(&admin, &args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (_, listed, _) = cli(&admin, &["list"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    let (ok, _, err) = cli(&admin, &["delete", "-n", "prom"]);
    assert!(ok, "{err}");
    assert!(err.contains("deleted check provider prom"), "{err}");
}
