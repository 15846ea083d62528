//! What the process-level tests share: the real binary started as a server (killed when
//! dropped), a blocking API client and the CLI as its caller, free ports, temporary folders that
//! keep their logs when a test fails, waiting on a condition, a seeded random number generator,
//! and the example exec scripts.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A child process killed (and waited for) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A temporary folder, removed when dropped unless the test is failing (its logs are kept).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-{name}-{}-{:?}",
            std::process::id(),
            Instant::now()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("logs kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Waits until `done`, failing the test past `limit` (a condition with a deadline, never a
/// fixed sleep).
pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub struct Lcg(pub u64);
impl Lcg {
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// A loopback port for a server the test starts, and starts again on the same port after a
/// kill. Picked below Linux's ephemeral range (32768–60999): a port there can be handed to any
/// outgoing connection or `bind(0)` between the check and the server's (re)start. Each call
/// takes the next port of this process's own run of them (by its pid), free when asked.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(64);
    for _ in 0..COUNT {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + start.wrapping_add(n) % COUNT) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + COUNT)
}

/// `flotilla serve` on a loopback port over `database`, its output appended to `log`, allowed
/// to run the example exec scripts.
pub fn serve(database: &str, port: u16, log: &Path, extra: &[&str]) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database",
            database,
            "--exec-allow",
            &scripts().display().to_string(),
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("the server starts")
}

pub struct Api {
    pub http: reqwest::blocking::Client,
    pub base: String,
    pub token: String,
}

impl Api {
    pub fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(5));
        if let Some(b) = body {
            request = request.json(b);
        }
        let response = request.send().map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response.text().map_err(|e| e.to_string())?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    pub fn must(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Value {
        let (status, value) = self
            .call(method.clone(), path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {value}"
        );
        value
    }

    /// `flotilla ARGS -o json` as this caller: (exit success, stdout as JSON or null, stderr).
    pub fn cli(&self, args: &[&str]) -> (bool, Value, String) {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let (ok, out, err) = self.cli_text(&all);
        (ok, serde_json::from_str(&out).unwrap_or(Value::Null), err)
    }

    /// `flotilla ARGS` as this caller: (exit success, stdout, stderr).
    pub fn cli_text(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .args(["--server", &self.base, "--token", &self.token])
            .output()
            .expect("the CLI runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self
                .call(reqwest::Method::GET, "/readyz", None)
                .is_ok_and(|(s, _)| s == 200)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the server did not become ready");
    }
}

pub fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/exec")
        .canonicalize()
        .expect("example scripts")
}

/// Creates an admin token directly in `database` and returns it.
pub fn create_token(database: &str) -> String {
    let token = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "token",
            "create",
            "--role",
            "admin",
            "--subject",
            "process-test",
            "--database",
            database,
        ])
        .output()
        .expect("token create runs");
    assert!(
        token.status.success(),
        "{}",
        String::from_utf8_lossy(&token.stderr)
    );
    String::from_utf8_lossy(&token.stdout).trim().to_string()
}

/// The member names of [`create_exec_run`]'s fleet.
pub fn member_name(i: usize) -> String {
    format!("store-{i:02}")
}

/// Fleet `edge` over the example exec scripts keeping clusters in `state_dir` (upgrades take
/// `upgrade_ms`), `members` members in one group, and run `r1` across them at `concurrency`,
/// not started.
pub fn create_exec_run(
    api: &Api,
    state_dir: &Path,
    members: usize,
    concurrency: usize,
    upgrade_ms: u64,
) {
    let scripts = scripts().display().to_string();
    let state = state_dir.display().to_string();
    let driver = json!({
        "type": "exec",
        "observe": [format!("{scripts}/observe.sh"), state, "{member}"],
        "upgrade": [format!("{scripts}/upgrade.sh"), state, "{member}", "{operationKey}", "{kubernetesVersion}"],
        "poll": [format!("{scripts}/poll.sh"), state, "{member}", "{operationId}", upgrade_ms.to_string()],
        "pollIntervalSeconds": 0.1,
        "timeoutSeconds": 10,
    });
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/edge",
        Some(&json!({"properties": {"driver": driver}})),
    );
    for i in 0..members {
        let name = member_name(i);
        api.must(
            reqwest::Method::PUT,
            &format!("/v1/fleets/edge/members/{name}"),
            Some(&json!({"properties": {"clusterResourceId": name, "group": "stores"}})),
        );
    }
    let run = json!({"properties": {
        "strategy": {"stages": [{"name": "all", "groups": [{"name": "stores", "maxConcurrency": concurrency.to_string()}]}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": "1.31.1"}},
    }});
    api.must(
        reqwest::Method::PUT,
        "/v1/fleets/edge/updateRuns/r1",
        Some(&run),
    );
}

/// A certificate authority and a server certificate it signed for `localhost` and 127.0.0.1,
/// written as PEM files in `dir`: (ca.pem, server.pem, server-key.pem).
pub fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "flotilla test CA");
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key")).expect("ca");
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("server params");
    let server = params.signed_by(&key, &ca).expect("server certificate");
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server-key.pem"),
    );
    std::fs::write(&paths.0, ca.pem()).expect("ca.pem");
    std::fs::write(&paths.1, server.pem()).expect("server.pem");
    std::fs::write(&paths.2, key.serialize_pem()).expect("server-key.pem");
    paths
}

/// What a process test starts from: a server on a fresh SQLite file in a temporary directory, on
/// a free port, with an admin token, ready. Its fields are destructured in the order they should
/// drop (the server before its directory).
pub struct Served {
    pub dir: TempDir,
    pub database: String,
    pub port: u16,
    pub log: std::path::PathBuf,
    pub api: Api,
    pub server: Killed,
}

impl Served {
    pub fn start(label: &str) -> Served {
        let dir = TempDir::new(label);
        let database = dir.0.join("flotilla.db").display().to_string();
        let port = free_port();
        let api = Api {
            http: reqwest::blocking::Client::new(),
            base: format!("http://127.0.0.1:{port}"),
            token: create_token(&database),
        };
        let log = dir.0.join("server.log");
        let server = Killed(serve(&database, port, &log, &[]));
        api.wait_ready();
        Served {
            dir,
            database,
            port,
            log,
            api,
            server,
        }
    }
}
