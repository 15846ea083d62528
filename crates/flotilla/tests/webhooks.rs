//! Webhooks (API.md, "Webhooks and audit") with the real binary on a real SQLite file and a
//! receiver of our own on loopback that checks the signature of every delivery (recomputing
//! the HMAC) and records what it accepts by id: every event of a run arrives, once when
//! nothing crashes, and at least once across SIGKILLs of the server mid-run; a receiver that
//! answers 500 for a whole minute still gets everything afterwards; Slack and Teams get their
//! JSON; a receiver's `Retry-After` is waited for; the CLI creates, lists, shows and deletes
//! webhooks and lists their deliveries.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use common::{Api, Lcg, create_exec_run, create_token, free_port, serve};

// ---------------------------------------------------------------------------------------------
// The receiver.

/// One delivery the receiver accepted.
#[derive(Clone, Debug)]
struct Accepted {
    path: String,
    content_type: String,
    body: Value,
}

#[derive(Default)]
struct Log {
    accepted: Vec<Accepted>,
    /// Deliveries answered 500 while the receiver was "down".
    refused: usize,
    /// Deliveries whose signature or timestamp did not check out: must stay empty.
    bad: Vec<String>,
}

struct Shared {
    secret: String,
    /// Until then every delivery is answered 500.
    down_until: Mutex<Option<Instant>>,
    /// When each event (by id) came to `/throttled`: its first delivery there is answered 429
    /// with `Retry-After: 4`.
    throttled: Mutex<BTreeMap<String, Vec<Instant>>>,
    log: Mutex<Log>,
}

struct Receiver {
    base: String,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

fn hex_hmac(secret: &str, text: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(text);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Checks a delivery's signature as a receiver should: the HMAC-SHA256 of
/// `{X-Flotilla-Timestamp}.{body}`, and a timestamp within five minutes of now.
fn verify(secret: &str, headers: &axum::http::HeaderMap, body: &[u8]) -> Result<(), String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .ok_or_else(|| format!("no {name}"))
    };
    let timestamp = header("x-flotilla-timestamp")?;
    let signature = header("x-flotilla-signature")?;
    let at: i64 = timestamp
        .parse()
        .map_err(|_| format!("timestamp {timestamp:?}"))?;
    if (unix_now() - at).abs() > 300 {
        return Err(format!("timestamp {at} is stale"));
    }
    let mut signed = format!("{timestamp}.").into_bytes();
    signed.extend_from_slice(body);
    let expected = format!("sha256={}", hex_hmac(secret, &signed));
    if signature != expected {
        return Err(format!("signature {signature} is not {expected}"));
    }
    Ok(())
}

async fn hook(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let mut log = shared.log.lock().expect("log");
    if let Err(why) = verify(&shared.secret, &headers, &body) {
        log.bad.push(why);
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if uri.path() == "/throttled" {
        let id = headers
            .get("x-flotilla-event-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let mut throttled = shared.throttled.lock().expect("throttled");
        let seen = throttled.entry(id).or_default();
        seen.push(Instant::now());
        if seen.len() == 1 {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(axum::http::header::RETRY_AFTER, "4")],
            )
                .into_response();
        }
    }
    if shared
        .down_until
        .lock()
        .expect("down")
        .is_some_and(|until| Instant::now() < until)
    {
        log.refused += 1;
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        log.bad
            .push(format!("not JSON: {}", String::from_utf8_lossy(&body)));
        return StatusCode::BAD_REQUEST.into_response();
    };
    log.accepted.push(Accepted {
        path: uri.path().to_string(),
        content_type: headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        body,
    });
    StatusCode::NO_CONTENT.into_response()
}

/// A receiver on a loopback port, checking signatures made with `secret`.
fn receiver(secret: &str) -> Receiver {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the receiver");
    let shared = Arc::new(Shared {
        secret: secret.to_string(),
        down_until: Mutex::new(None),
        throttled: Mutex::new(BTreeMap::new()),
        log: Mutex::new(Log::default()),
    });
    let app = axum::Router::new()
        .fallback(axum::routing::post(hook))
        .with_state(shared.clone());
    let addr: SocketAddr = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        addr
    });
    Receiver {
        base: format!("http://{addr}"),
        shared,
        _runtime: runtime,
    }
}

impl Receiver {
    fn accepted(&self, path: &str) -> Vec<Accepted> {
        self.shared
            .log
            .lock()
            .expect("log")
            .accepted
            .iter()
            .filter(|a| a.path == path)
            .cloned()
            .collect()
    }

    fn assert_signatures_held(&self) {
        let log = self.shared.log.lock().expect("log");
        assert!(log.bad.is_empty(), "bad deliveries: {:?}", log.bad);
    }
}

// ---------------------------------------------------------------------------------------------
// The server.

struct Setup {
    dir: PathBuf,
    db: PathBuf,
    port: u16,
    api: Api,
    server: Child,
    extra: Vec<String>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl Setup {
    fn start(test: &str, extra: &[&str]) -> Setup {
        let dir = std::env::temp_dir().join(format!("flotilla-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("state")).expect("state dir");
        let db = dir.join("flotilla.db");
        let token = create_token(&db.display().to_string());
        let port = free_port();
        let extra: Vec<String> = extra
            .iter()
            .map(|s| s.replace("{port}", &port.to_string()))
            .collect();
        let server = start_server(&dir, &db, port, &extra);
        let api = Api {
            http: reqwest::blocking::Client::new(),
            base: format!("http://127.0.0.1:{port}"),
            token,
        };
        api.wait_ready();
        Setup {
            dir,
            db,
            port,
            api,
            server,
            extra,
        }
    }

    /// SIGKILL, then serve the same file again.
    fn kill_and_restart(&mut self) {
        self.server.kill().expect("kill");
        let _ = self.server.wait();
        self.server = start_server(&self.dir, &self.db, self.port, &self.extra);
        self.api.wait_ready();
    }

    /// The run's state (empty while the server cannot answer).
    fn run_state(&self, run: &str) -> String {
        let (_, body) = self
            .api
            .call(
                reqwest::Method::GET,
                &format!("/v1/fleets/edge/updateRuns/{run}"),
                None,
            )
            .unwrap_or((0, Value::Null));
        body["properties"]["status"]["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn wait_completed(&self, run: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match self.run_state(run).as_str() {
                "Completed" => return,
                "Failed" | "Stopped" => panic!("run {run} did not complete"),
                _ => {}
            }
            assert!(Instant::now() < deadline, "run {run} did not end");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The run's event log as the API gives it, in order (the n-th has seq n).
    fn events(&self, run: &str) -> Vec<Value> {
        self.api.must(
            reqwest::Method::GET,
            &format!("/v1/fleets/edge/updateRuns/{run}/events"),
            None,
        )["value"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn deliveries(&self, webhook: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut next = Some(format!("/v1/webhooks/{webhook}/deliveries?$top=200"));
        while let Some(path) = next {
            let page = self.api.must(reqwest::Method::GET, &path, None);
            all.extend(page["value"].as_array().cloned().unwrap_or_default());
            next = page["nextLink"].as_str().map(String::from);
        }
        all
    }
}

fn start_server(dir: &Path, db: &Path, port: u16, extra: &[String]) -> Child {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    serve(
        &db.display().to_string(),
        port,
        &dir.join("server.log"),
        &extra,
    )
}

fn put_webhook(api: &Api, name: &str, properties: Value) {
    api.must(
        reqwest::Method::PUT,
        &format!("/v1/webhooks/{name}"),
        Some(&json!({"properties": properties})),
    );
}

/// A run over the fleet's members to `version`, started.
fn start_run(api: &Api, run: &str, version: &str) {
    let body = json!({"properties": {
        "strategy": {"stages": [{"name": "all", "groups": [{"name": "stores", "maxConcurrency": "2"}]}]},
        "managedClusterUpdate": {"upgrade": {"type": "ControlPlaneOnly", "kubernetesVersion": version}},
    }});
    api.must(
        reqwest::Method::PUT,
        &format!("/v1/fleets/edge/updateRuns/{run}"),
        Some(&body),
    );
    api.must(
        reqwest::Method::POST,
        &format!("/v1/fleets/edge/updateRuns/{run}/start"),
        None,
    );
}

/// Waits until the receiver has accepted, at `path`, a CloudEvent for every event of the run's
/// log; returns them by seq (every copy of each).
fn wait_for_every_event(
    receiver: &Receiver,
    path: &str,
    run: &str,
    events: &[Value],
    within: Duration,
) -> BTreeMap<i64, Vec<Value>> {
    let deadline = Instant::now() + within;
    loop {
        let mut by_seq: BTreeMap<i64, Vec<Value>> = BTreeMap::new();
        for a in receiver.accepted(path) {
            if a.body["source"] != format!("/v1/fleets/edge/updateRuns/{run}") {
                continue;
            }
            let seq = a.body["id"]
                .as_str()
                .and_then(|id| id.rsplit('/').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("an id that ends in no seq: {}", a.body));
            by_seq.entry(seq).or_default().push(a.body);
        }
        let seen: BTreeSet<i64> = by_seq.keys().copied().collect();
        let expected: BTreeSet<i64> = (1..=events.len() as i64).collect();
        if seen == expected {
            return by_seq;
        }
        assert!(
            seen.is_subset(&expected),
            "ids past the run's log: {:?}",
            seen.difference(&expected)
        );
        assert!(
            Instant::now() < deadline,
            "run {run}: events {:?} of {} never arrived",
            expected.difference(&seen).collect::<Vec<_>>(),
            events.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each CloudEvent received is the event at its seq in the run's log, with the right shape;
/// copies of one id are the same event. Returns how many copies there were beyond the first.
fn check_cloud_events(run: &str, events: &[Value], by_seq: &BTreeMap<i64, Vec<Value>>) -> usize {
    let mut prefix: Option<String> = None;
    let mut copies = 0;
    for (seq, received) in by_seq {
        let event = &events[(*seq - 1) as usize];
        for body in received {
            assert_eq!(body["specversion"], "1.0", "{body}");
            assert_eq!(body["data"]["event"], *event, "seq {seq}: {body}");
            assert_eq!(body["data"]["sequence"], *seq);
            assert_eq!(body["data"]["run"]["fleet"], "edge");
            assert_eq!(body["data"]["run"]["name"], run);
            let kind = event["type"].as_str().expect("a type");
            let dotted: String = kind
                .chars()
                .enumerate()
                .flat_map(|(i, c)| {
                    let dot = (i > 0 && c.is_ascii_uppercase()).then_some('.');
                    dot.into_iter()
                        .chain(std::iter::once(c.to_ascii_lowercase()))
                })
                .collect();
            assert_eq!(body["type"], format!("io.flotilla.{dotted}"), "{body}");
            assert_eq!(body["time"], event["time"]);
            let id = body["id"].as_str().expect("an id");
            let this = id.rsplit_once('/').expect("fleet/run/generation/seq").0;
            assert!(this.starts_with(&format!("edge/{run}/")), "{id}");
            match &prefix {
                None => prefix = Some(this.to_string()),
                Some(p) => assert_eq!(p, this, "one run, one generation"),
            }
        }
        copies += received.len() - 1;
    }
    copies
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn every_event_arrives_signed_once_and_at_least_once_across_sigkills() {
    let receiver = receiver("crash-secret");
    let mut setup = Setup::start("webhook-crash", &[]);
    put_webhook(
        &setup.api,
        "all",
        json!({"url": format!("{}/all", receiver.base), "secret": "crash-secret"}),
    );
    create_exec_run(&setup.api, &setup.dir.join("state"), 8, 2, 700);
    setup.api.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
        None,
    );
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    eprintln!("webhook crash test seed {seed}");
    let mut rng = Lcg(seed);
    let mut kills = 0;
    let mut delivered_before_last_kill = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        std::thread::sleep(Duration::from_millis(300 + rng.next(1200)));
        if matches!(setup.run_state("r1").as_str(), "Completed" | "Failed") {
            break;
        }
        assert!(Instant::now() < deadline, "the run did not end");
        // What arrived before this kill: deliveries made while the run went on, between kills.
        delivered_before_last_kill = receiver.accepted("/all").len();
        setup.kill_and_restart();
        kills += 1;
    }
    assert!(
        kills >= 2,
        "only {kills} kills before the run ended; the test proves little"
    );
    setup.wait_completed("r1");
    let events = setup.events("r1");
    // Each member starts and succeeds, and the run, stage and group start and complete.
    assert!(events.len() >= 2 * 8 + 6, "{events:?}");
    assert!(
        delivered_before_last_kill > 0,
        "nothing was delivered while the run went on; the kills tested nothing of delivery"
    );
    let by_seq = wait_for_every_event(&receiver, "/all", "r1", &events, Duration::from_secs(90));
    let copies = check_cloud_events("r1", &events, &by_seq);
    eprintln!(
        "{kills} kills, {} events ({delivered_before_last_kill} delivered before the last kill), {copies} sent again after a kill",
        events.len()
    );
    receiver.assert_signatures_held();
    // The deliveries say so too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let deliveries = setup.deliveries("all");
        if deliveries.len() == events.len() && deliveries.iter().all(|d| d["state"] == "Delivered")
        {
            assert!(
                deliveries
                    .iter()
                    .all(|d| d["statusCode"] == 204 && d["attempts"].as_i64() >= Some(1))
            );
            break;
        }
        assert!(Instant::now() < deadline, "{deliveries:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A second run with no kill: every event exactly once.
    start_run(&setup.api, "r2", "1.32.0");
    setup.wait_completed("r2");
    let events = setup.events("r2");
    let by_seq = wait_for_every_event(&receiver, "/all", "r2", &events, Duration::from_secs(30));
    assert_eq!(
        check_cloud_events("r2", &events, &by_seq),
        0,
        "sent twice with no crash: {by_seq:?}"
    );
    // Nothing more comes of it: every delivery is recorded, none is pending to be sent again.
    let deadline = Instant::now() + Duration::from_secs(20);
    while setup
        .deliveries("all")
        .iter()
        .any(|d| d["state"] != "Delivered")
    {
        assert!(Instant::now() < deadline, "deliveries stay pending");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        receiver
            .accepted("/all")
            .iter()
            .filter(|a| a.body["source"] == "/v1/fleets/edge/updateRuns/r2")
            .count()
            == events.len()
    );
    receiver.assert_signatures_held();
    let _ = std::fs::remove_dir_all(&setup.dir);
}

#[test]
fn a_receiver_down_for_a_minute_gets_everything_afterwards() {
    let receiver = receiver("down-secret");
    let setup = Setup::start("webhook-down", &[]);
    let down_for = Duration::from_secs(60);
    let back_at = Instant::now() + down_for;
    *receiver.shared.down_until.lock().expect("down") = Some(back_at);
    put_webhook(
        &setup.api,
        "ops",
        json!({"url": format!("{}/ops", receiver.base), "secret": "down-secret",
            "fleets": ["edge"], "events": ["*"], "format": "CloudEvents"}),
    );
    create_exec_run(&setup.api, &setup.dir.join("state"), 4, 2, 300);
    setup.api.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
        None,
    );
    setup.wait_completed("r1");
    let events = setup.events("r1");
    // While it is down, the deliveries show the failures and wait.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let deliveries = setup.deliveries("ops");
        let failing = deliveries.iter().all(|d| {
            d["state"] == "Pending"
                && d["statusCode"] == 500
                && d["lastError"].as_str().is_some_and(|e| e.contains("500"))
                && d["nextAttemptTime"].is_string()
        });
        if deliveries.len() == events.len() && failing {
            break;
        }
        assert!(Instant::now() < deadline, "{deliveries:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Down for the whole minute: nothing is accepted.
    while Instant::now() < back_at {
        assert!(receiver.accepted("/ops").is_empty());
        std::thread::sleep(Duration::from_millis(500));
    }
    let refused = receiver.shared.log.lock().expect("log").refused;
    assert!(
        refused >= 5 * events.len(),
        "only {refused} attempts in a minute"
    );
    // Back up: everything arrives within the backoff's cap, once.
    let by_seq = wait_for_every_event(&receiver, "/ops", "r1", &events, Duration::from_secs(45));
    assert_eq!(check_cloud_events("r1", &events, &by_seq), 0);
    receiver.assert_signatures_held();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let deliveries = setup.deliveries("ops");
        if deliveries.iter().all(|d| d["state"] == "Delivered") {
            assert!(
                deliveries.iter().all(|d| d["attempts"].as_i64() > Some(5)),
                "{deliveries:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{deliveries:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(&setup.dir);
}

/// A receiver that answers 429 with `Retry-After: 4` is left alone that long (the backoff alone
/// would try again after 1 s), then gets the event.
#[test]
fn a_receivers_retry_after_is_waited_for() {
    let receiver = receiver("throttle-secret");
    let setup = Setup::start("webhook-throttled", &[]);
    put_webhook(
        &setup.api,
        "throttled",
        json!({"url": format!("{}/throttled", receiver.base), "secret": "throttle-secret",
            "fleets": ["edge"], "events": ["RunStarted"], "format": "CloudEvents"}),
    );
    create_exec_run(&setup.api, &setup.dir.join("state"), 2, 2, 100);
    setup.api.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.accepted("/throttled").is_empty() {
        assert!(Instant::now() < deadline, "RunStarted never arrived");
        std::thread::sleep(Duration::from_millis(100));
    }
    receiver.assert_signatures_held();
    let accepted = receiver.accepted("/throttled");
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].body["type"], "io.flotilla.run.started");
    let attempts: Vec<Vec<Instant>> = receiver
        .shared
        .throttled
        .lock()
        .expect("throttled")
        .values()
        .cloned()
        .collect();
    assert_eq!(attempts.len(), 1, "one event");
    let times = &attempts[0];
    assert_eq!(times.len(), 2, "refused once, then accepted");
    let waited = times[1] - times[0];
    assert!(
        waited >= Duration::from_secs(4),
        "tried again after {waited:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let deliveries = setup.deliveries("throttled");
        if deliveries.len() == 1 && deliveries[0]["state"] == "Delivered" {
            assert_eq!(deliveries[0]["attempts"], 2, "{deliveries:?}");
            break;
        }
        assert!(Instant::now() < deadline, "{deliveries:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(&setup.dir);
}

/// `flotilla webhook …` against the server, with the admin token.
fn cli(setup: &Setup, args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .args([
            "--server",
            &setup.api.base,
            "--token",
            &setup.api.token,
            "-o",
            "json",
        ])
        .envs(env.iter().copied())
        .output()
        .expect("the CLI runs");
    assert!(
        out.status.success(),
        "flotilla {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn slack_and_teams_get_their_json_and_the_cli_manages_webhooks() {
    let receiver = receiver("chat-secret");
    let setup = Setup::start("webhook-chat", &["--public-url", "http://127.0.0.1:{port}"]);
    let slack_url = format!("{}/slack", receiver.base);
    let teams_url = format!("{}/teams", receiver.base);
    let other_url = format!("{}/other", receiver.base);
    let secret_file = setup.dir.join("secret");
    std::fs::write(&secret_file, "chat-secret\n").expect("secret file");
    let slack = cli(
        &setup,
        &[
            "webhook",
            "create",
            "-n",
            "slack",
            "--url",
            &slack_url,
            "--secret-env",
            "HOOK_SECRET",
            "--format",
            "slack",
            "--events",
            "RunCompleted",
            "--fleets",
            "edge",
        ],
        &[("HOOK_SECRET", "chat-secret")],
    );
    // Printed as `az` prints resources: `properties` lifted beside the name.
    assert_eq!(
        (
            &slack["name"],
            &slack["url"],
            &slack["hasSecret"],
            &slack["fleets"],
            &slack["events"],
            &slack["format"]
        ),
        (
            &json!("slack"),
            &json!(slack_url),
            &json!(true),
            &json!(["edge"]),
            &json!(["RunCompleted"]),
            &json!("Slack")
        )
    );
    assert!(slack.get("secret").is_none(), "{slack}");
    cli(
        &setup,
        &[
            "webhook",
            "create",
            "-n",
            "teams",
            "--url",
            &teams_url,
            "--secret-file",
            &secret_file.display().to_string(),
            "--format",
            "Teams",
            "--events",
            "RunStarted,RunCompleted",
        ],
        &[],
    );
    cli(
        &setup,
        &[
            "webhook",
            "create",
            "-n",
            "other",
            "--url",
            &other_url,
            "--secret",
            "chat-secret",
            "--fleets",
            "other",
        ],
        &[],
    );
    let listed = cli(&setup, &["webhook", "list"], &[]);
    let names: Vec<&str> = listed
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert_eq!(names, ["other", "slack", "teams"]);
    assert!(!listed.to_string().contains("chat-secret"), "{listed}");

    create_exec_run(&setup.api, &setup.dir.join("state"), 2, 2, 200);
    setup.api.must(
        reqwest::Method::POST,
        "/v1/fleets/edge/updateRuns/r1/start",
        None,
    );
    setup.wait_completed("r1");
    let link = format!("http://127.0.0.1:{}/#/fleets/edge/runs/r1", setup.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.accepted("/slack").is_empty() || receiver.accepted("/teams").len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the chat messages did not arrive"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let slack = receiver.accepted("/slack");
    assert_eq!(slack.len(), 1);
    assert_eq!(slack[0].content_type, "application/json");
    assert_eq!(
        slack[0].body,
        json!({"text": format!("Update run r1 of fleet edge completed (<{link}|open in Flotilla>)")})
    );
    let teams = receiver.accepted("/teams");
    let texts: Vec<&Value> = teams
        .iter()
        .map(|t| {
            assert_eq!(t.body["type"], "message", "{}", t.body);
            let card = &t.body["attachments"][0];
            assert_eq!(
                card["contentType"],
                "application/vnd.microsoft.card.adaptive"
            );
            assert_eq!(card["content"]["type"], "AdaptiveCard");
            assert_eq!(card["content"]["actions"][0]["url"], link);
            &card["content"]["body"][0]["text"]
        })
        .collect();
    let mut texts: Vec<&str> = texts.iter().filter_map(|t| t.as_str()).collect();
    texts.sort();
    assert_eq!(
        texts,
        [
            "Update run r1 of fleet edge completed",
            "Update run r1 of fleet edge started"
        ]
    );
    receiver.assert_signatures_held();
    // Another fleet's webhook got nothing: no delivery was ever written for it.
    assert_eq!(
        cli(&setup, &["webhook", "deliveries", "-n", "other"], &[]),
        json!([])
    );
    assert!(receiver.accepted("/other").is_empty());
    // The receiver logs a message before it answers, and the server marks the delivery
    // Delivered once the answer is in: ask until both are.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let deliveries = cli(
            &setup,
            &[
                "webhook",
                "deliveries",
                "-n",
                "teams",
                "--state",
                "delivered",
            ],
            &[],
        );
        let types: BTreeSet<String> = deliveries
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|d| d["eventType"].as_str().map(str::to_string))
            .collect();
        if types == BTreeSet::from(["RunStarted".to_string(), "RunCompleted".to_string()]) {
            break;
        }
        assert!(Instant::now() < deadline, "delivered: {types:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let shown = cli(&setup, &["webhook", "show", "-n", "teams"], &[]);
    assert_eq!(shown["format"], "Teams");
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "webhook",
            "delete",
            "-n",
            "teams",
            "--server",
            &setup.api.base,
            "--token",
            &setup.api.token,
        ])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = cli(&setup, &["webhook", "list"], &[]);
    assert_eq!(listed.as_array().map(Vec::len), Some(2));
    // A bad flag value is refused by the server, naming the field.
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "webhook",
            "create",
            "-n",
            "bad",
            "--url",
            &slack_url,
            "--secret",
            "x",
            "--events",
            "RunExploded",
            "--server",
            &setup.api.base,
            "--token",
            &setup.api.token,
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("properties.events[0]"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&setup.dir);
}
