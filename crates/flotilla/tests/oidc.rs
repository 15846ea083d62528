//! Sign-in through a real OpenID provider: `oidc-provider` from the npm registry (pinned in
//! tests/oidc/package-lock.json) started on loopback by `tests/oidc/provider.mjs`, and the real
//! `flotilla` binary configured with it in its configuration file. A pipeline's client
//! credentials JWT starts a run and the audit trail names it; the provider rotates its signing
//! key and new tokens are taken without a restart; real tokens altered (another audience,
//! another issuer, `alg: none`, HS256 signed with the provider's public key) are refused;
//! `flotilla login --oidc` signs in with the device flow (the user's step done through the
//! provider's pages by tests/oidc/user-step.mjs), lists runs, and renews its expired access
//! token by itself.
//!
//! Needs `node` and `tests/oidc/node_modules` (`scripts/oidc-tests.sh` installs them); without
//! them each test says so and passes, unless FLOTILLA_REQUIRE_OIDC=1 (CI).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use common::{Api, Killed, TempDir, create_exec_run, create_token, free_port, serve, wait_for};

const AUDIENCE: &str = "urn:flotilla";

fn harness_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/oidc")
}

/// Whether the provider can run here; a skip notice when not (a failure under
/// FLOTILLA_REQUIRE_OIDC=1).
fn available(test: &str) -> bool {
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let modules = harness_dir().join("node_modules/oidc-provider").is_dir();
    if node && modules {
        return true;
    }
    let missing = if node {
        "tests/oidc/node_modules (run scripts/oidc-tests.sh)"
    } else {
        "node"
    };
    assert!(
        std::env::var("FLOTILLA_REQUIRE_OIDC").as_deref() != Ok("1"),
        "{test}: {missing} is missing and FLOTILLA_REQUIRE_OIDC=1"
    );
    eprintln!("{test}: skipped: {missing} is missing (scripts/oidc-tests.sh runs it)");
    false
}

struct Provider {
    issuer: String,
    _process: Killed,
}

fn provider(access_ttl: u64, redirect: &str) -> Provider {
    let mut child = Command::new("node")
        .arg(harness_dir().join("provider.mjs"))
        .env("PORT", "0")
        .env("AUDIENCE", AUDIENCE)
        .env("ACCESS_TTL", access_ttl.to_string())
        .env("REDIRECT_URIS", redirect)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node runs the provider");
    let stdout = child.stdout.take().expect("stdout");
    let process = Killed(child);
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    reader
        .read_line(&mut line)
        .expect("the provider's first line");
    // Whatever it prints later is read (a closed pipe would end it).
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    Provider {
        issuer: ready["issuer"].as_str().expect("issuer").to_string(),
        _process: process,
    }
}

/// A configuration file for `serve` with the provider: the release managers approve on
/// `prod-*`, everyone reads, the platform team administers, the pipeline operates `edge`.
fn config(dir: &std::path::Path, issuer: &str) -> String {
    let path = dir.join("flotilla.toml");
    std::fs::write(
        &path,
        format!(
            r#"[[identity-provider]]
name = "test-idp"
issuer = "{issuer}"
audience = "{AUDIENCE}"
clientId = "flotilla-dashboard"
clientSecret = {{ env = "FLOTILLA_TEST_DASHBOARD_SECRET" }}
cliClientId = "flotilla-cli"
userClaim = "preferred_username"
scopes = ["groups", "flotilla"]
roles = [
  {{ groups = ["everyone"], role = "reader" }},
  {{ groups = ["release-managers"], role = "approver", fleets = ["prod-*"] }},
  {{ groups = ["platform"], role = "admin" }},
  {{ subjects = ["deploy-pipeline"], role = "operator", fleets = ["edge"] }},
]
"#
        ),
    )
    .expect("config written");
    path.display().to_string()
}

struct Setup {
    idp: Provider,
    api: Api,
    dir: TempDir,
    port: u16,
    _server: Killed,
}

fn setup(label: &str, access_ttl: u64) -> Setup {
    let dir = TempDir::new(label);
    let port = free_port();
    let idp = provider(
        access_ttl,
        &format!("http://127.0.0.1:{port}/auth/callback"),
    );
    let database = dir.path().join("flotilla.db").display().to_string();
    let token = create_token(&database);
    let config = config(dir.path(), &idp.issuer);
    let server = Killed(serve(
        &database,
        port,
        &dir.path().join("server.log"),
        &["--config", &config],
    ));
    let api = Api {
        http: reqwest::blocking::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
        token,
    };
    api.wait_ready();
    Setup {
        idp,
        api,
        dir,
        port,
        _server: server,
    }
}

fn client_credentials(issuer: &str, resource: &str) -> String {
    let http = reqwest::blocking::Client::new();
    let answer: Value = http
        .post(format!("{issuer}/token"))
        .basic_auth("deploy-pipeline", Some("pipeline-secret-for-tests"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "grant_type=client_credentials&scope=flotilla&resource={resource}"
        ))
        .send()
        .expect("token request")
        .json()
        .expect("JSON");
    answer["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no access token: {answer}"))
        .to_string()
}

fn call(api: &Api, token: &str, method: reqwest::Method, path: &str) -> (u16, Value) {
    Api {
        http: api.http.clone(),
        base: api.base.clone(),
        token: token.to_string(),
    }
    .call(method, path, None)
    .expect("the server answers")
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

#[test]
fn a_pipeline_starts_a_run_keys_rotate_and_altered_tokens_are_refused() {
    if !available("a_pipeline_starts_a_run") {
        return;
    }
    let s = setup("oidc-pipeline", 300);
    create_exec_run(&s.api, s.dir.path(), 2, 1, 100);

    // The pipeline's JWT (client credentials, a JWT thanks to the resource indicator).
    let pipeline = client_credentials(&s.idp.issuer, AUDIENCE);
    let (status, run) = call(
        &s.api,
        &pipeline,
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
    );
    assert_eq!(status, 200, "{run}");
    // Operator on `edge` only: nothing server-wide.
    assert_eq!(
        call(&s.api, &pipeline, reqwest::Method::GET, "/v1/webhooks").0,
        403
    );
    let audit = s.api.must(reqwest::Method::GET, "/v1/audit", None);
    let named = format!("deploy-pipeline ({})", s.idp.issuer);
    assert!(
        audit["value"]
            .as_array()
            .expect("entries")
            .iter()
            .any(|e| e["subject"] == json!(named)
                && e["path"].as_str().is_some_and(|p| p.ends_with("/start"))),
        "the audit trail does not name {named}: {audit}"
    );

    // Real tokens, altered.
    let other_audience = client_credentials(&s.idp.issuer, "urn:another-api");
    let (status, answer) = call(
        &s.api,
        &other_audience,
        reqwest::Method::GET,
        "/v1/fleets/edge",
    );
    assert_eq!(status, 401, "{answer}");
    assert!(answer.to_string().contains("aud"), "{answer}");
    let stranger = provider(300, "http://127.0.0.1:1/unused");
    let foreign = client_credentials(&stranger.issuer, AUDIENCE);
    let (status, answer) = call(&s.api, &foreign, reqwest::Method::GET, "/v1/fleets/edge");
    assert_eq!(status, 401, "{answer}");
    assert!(
        answer
            .to_string()
            .contains("no identity provider has that issuer"),
        "{answer}"
    );
    let parts: Vec<&str> = pipeline.split('.').collect();
    let none = format!("{}.{}.", b64(br#"{"alg":"none","typ":"at+jwt"}"#), parts[1]);
    let (status, answer) = call(&s.api, &none, reqwest::Method::GET, "/v1/fleets/edge");
    assert_eq!(status, 401, "{answer}");
    let jwks: Value = reqwest::blocking::get(format!("{}/jwks", s.idp.issuer))
        .expect("jwks")
        .json()
        .expect("JSON");
    let kid = jwks["keys"][0]["kid"].as_str().expect("kid");
    let input = format!(
        "{}.{}",
        b64(format!(r#"{{"alg":"HS256","kid":"{kid}"}}"#).as_bytes()),
        parts[1]
    );
    for secret in [jwks["keys"][0].to_string(), jwks.to_string()] {
        use hmac::{KeyInit, Mac};
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
        mac.update(input.as_bytes());
        let forged = format!("{input}.{}", b64(&mac.finalize().into_bytes()));
        let (status, answer) = call(&s.api, &forged, reqwest::Method::GET, "/v1/fleets/edge");
        assert_eq!(status, 401, "{answer}");
        assert!(answer.to_string().contains("HS256"), "{answer}");
    }

    // The provider rotates its signing key: tokens signed with the new one are taken without a
    // restart (its key id is fetched once the 30 s between fetches have passed).
    let rotated: Value = reqwest::blocking::Client::new()
        .post(format!("{}/admin/rotate", s.idp.issuer))
        .send()
        .expect("rotate")
        .json()
        .expect("JSON");
    let fresh = client_credentials(&s.idp.issuer, AUDIENCE);
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(fresh.split('.').next().expect("header"))
            .expect("base64"),
    )
    .expect("JSON");
    assert_eq!(
        header["kid"], rotated["kid"],
        "the new token is signed with the new key"
    );
    let mut status = 0;
    wait_for(
        "the rotated key to be taken",
        Duration::from_secs(45),
        || {
            status = call(&s.api, &fresh, reqwest::Method::GET, "/v1/fleets/edge").0;
            status == 200
        },
    );
    // The old key is still published: tokens signed with it still pass.
    assert_eq!(
        call(&s.api, &pipeline, reqwest::Method::GET, "/v1/fleets/edge").0,
        200
    );
}

#[test]
fn the_cli_signs_in_with_the_device_flow_and_renews_its_token() {
    if !available("the_cli_signs_in_with_the_device_flow") {
        return;
    }
    // Access tokens live 8 s, so the CLI must renew one during the test.
    let s = setup("oidc-cli", 8);
    create_exec_run(&s.api, s.dir.path(), 1, 1, 100);
    let login_file = s.dir.path().join("cli/config.json");
    let server = format!("http://127.0.0.1:{}", s.port);
    let cli = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        c.env("FLOTILLA_CONFIG", &login_file)
            .env_remove("FLOTILLA_TOKEN")
            .env_remove("FLOTILLA_SERVER");
        c
    };
    let mut login = cli()
        .args(["login", "--oidc", "--server", &server])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("login runs");
    let stderr = login.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut said = String::new();
    let complete = loop {
        let line = lines
            .next()
            .expect("login prints where to sign in")
            .expect("a line");
        said.push_str(&line);
        said.push('\n');
        if let Some(rest) = line.strip_prefix("(or open ") {
            break rest.trim_end_matches(')').to_string();
        }
    };
    assert!(said.contains("enter the code"), "{said}");
    // The user's step, on the provider's own pages: alice signs in and confirms.
    let user = Command::new("node")
        .arg(harness_dir().join("user-step.mjs"))
        .args([&complete, "alice"])
        .output()
        .expect("node runs");
    assert!(
        user.status.success(),
        "{}",
        String::from_utf8_lossy(&user.stderr)
    );
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = login.wait().expect("login ends");
    assert!(status.success(), "login failed: {said}{}", rest.join("\n"));
    assert!(
        rest.join("\n").contains("as alice ("),
        "{}",
        rest.join("\n")
    );

    // The login file is private and holds the refresh token.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&login_file)
        .expect("login file")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the login file's mode");
    let read = || -> Value {
        serde_json::from_str(&std::fs::read_to_string(&login_file).expect("read")).expect("JSON")
    };
    let first = read();
    assert!(first["oidc"]["refreshToken"].is_string(), "{first}");
    assert!(first.get("token").is_none(), "{first}");

    let list = || {
        let out = cli()
            .args(["updaterun", "list", "-f", "edge", "-o", "json"])
            .output()
            .expect("the CLI runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("JSON")
    };
    let runs = list();
    assert!(runs.to_string().contains("r1"), "{runs}");

    // Once the access token has expired, the next command renews it by itself.
    let expires = first["oidc"]["expiresAt"].as_i64().expect("expiresAt");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
    };
    wait_for(
        "the access token to expire",
        Duration::from_secs(30),
        || now() > expires,
    );
    let started = Instant::now();
    let runs = list();
    assert!(runs.to_string().contains("r1"), "{runs}");
    let after = read();
    assert_ne!(
        after["oidc"]["accessToken"], first["oidc"]["accessToken"],
        "the access token was renewed"
    );
    assert!(
        after["oidc"]["expiresAt"].as_i64().expect("expiresAt") > now(),
        "{after}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    let mode = std::fs::metadata(&login_file)
        .expect("login file")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the login file's mode after the renewal");
}

/// A server that answers every request with a redirect to `location`; answers its address.
fn redirecting(location: String) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = std::io::Write::write_all(
                &mut stream,
                format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
            );
        }
    });
    address
}

#[test]
fn the_cli_does_not_follow_a_redirect_with_its_token() {
    // Elsewhere: counts the requests that reach it (none must).
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let target = format!("http://{}/v1/fleets", elsewhere.local_addr().expect("addr"));
    elsewhere.set_nonblocking(true).expect("nonblocking");
    let server = redirecting(target.clone());
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .env(
            "FLOTILLA_CONFIG",
            std::env::temp_dir().join("flotilla-no-config.json"),
        )
        .args([
            "fleet",
            "list",
            "--server",
            &server,
            "--token",
            "flt_secret",
        ])
        .output()
        .expect("ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("answered a redirect to \"{target}\"")),
        "{stderr}"
    );
    assert!(elsewhere.accept().is_err(), "the redirect was followed");
}
