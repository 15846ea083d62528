//! Evaluations of health and readiness checks (SEMANTICS §10), for real, through the check
//! provider each check names: a Prometheus instant query, a GET under a base URL, or a program
//! with fixed arguments, all declared by an admin. The engine asked for them with
//! `Command::Evaluate` and judges what comes back; this module only fetches the facts. An
//! evaluation that cannot be made (unreachable, timed out, not allowed, a provider gone, a
//! variable not set) is `Outcome::Unavailable` with why, never a failure. No message quotes a
//! response body.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::{Kind, Store, StoreResult};

use flotilla_driver::ExecAllow;
use flotilla_engine::checks::{
    Check, CheckKind, Context, Outcome, Provider, ProviderTarget, env_reference, has_dot_segment,
    percent_decode, render, render_path, render_query,
};

/// What an evaluation needs from the server: an HTTP client per CA file, and a limit on how
/// many run at once.
pub struct Evaluator {
    clients: Mutex<HashMap<Option<String>, reqwest::Client>>,
    /// Evaluations in progress at once, server-wide: a stage of 100,000 soaking members must
    /// not open 100,000 connections (or processes) each interval.
    running: tokio::sync::Semaphore,
}

/// Most evaluations in progress at once.
const MOST_AT_ONCE: usize = 64;

impl Default for Evaluator {
    fn default() -> Evaluator {
        Evaluator {
            clients: Mutex::default(),
            running: tokio::sync::Semaphore::new(MOST_AT_ONCE),
        }
    }
}

/// Longest body read from an Http check or Prometheus: enough for any answer worth judging.
const MOST_BODY: usize = 4 << 20;

/// Check providers are server-wide: stored under this fleet, which no fleet can be named.
pub const SERVER: &str = "";
/// How long an evaluation trusts a provider it read.
pub const FRESH: Duration = Duration::from_secs(5);

/// A provider as read, and when (`None`: there was none).
type Read = (Instant, Option<Arc<Provider>>);

/// Providers as evaluations last read them, by name.
#[derive(Default)]
pub struct Providers {
    cache: Mutex<HashMap<String, Read>>,
}

impl Providers {
    /// The provider named `name`, read again once its cached copy is older than [`FRESH`].
    pub async fn get(&self, store: &dyn Store, name: &str) -> StoreResult<Option<Arc<Provider>>> {
        if let Ok(cache) = self.cache.lock()
            && let Some((at, found)) = cache.get(name)
            && at.elapsed() < FRESH
        {
            return Ok(found.clone());
        }
        let found = read(store, name).await?.map(Arc::new);
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(name.to_string(), (Instant::now(), found.clone()));
        }
        Ok(found)
    }

    /// Drops a cached copy: this replica wrote or deleted the provider.
    pub fn forget(&self, name: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(name);
        }
    }
}

/// A stored provider, parsed; one that no longer parses (a rule tightened since) is none.
pub async fn read(store: &dyn Store, name: &str) -> StoreResult<Option<Provider>> {
    Ok(store
        .get(SERVER, Kind::CheckProvider, name)
        .await?
        .and_then(|r| from_body(name, &r.body)))
}

pub fn from_body(name: &str, body: &serde_json::Value) -> Option<Provider> {
    let spec: flotilla_engine::checks::ProviderSpec =
        serde_json::from_value(body["properties"].clone()).ok()?;
    flotilla_engine::checks::parse_provider(name, &spec).ok()
}

/// Reads a CA bundle: every certificate in a PEM file.
pub fn read_ca_file(path: &str) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|_| format!("{path:?} holds no PEM certificate"))?;
    if certs.is_empty() {
        return Err(format!("{path:?} holds no PEM certificate"));
    }
    Ok(certs)
}

impl Evaluator {
    fn client(&self, ca_file: Option<&str>) -> Result<reqwest::Client, String> {
        let key = ca_file.map(str::to_string);
        if let Ok(clients) = self.clients.lock()
            && let Some(client) = clients.get(&key)
        {
            return Ok(client.clone());
        }
        // Redirects are not followed: a check reaches what its provider declares, nothing a
        // server it asks points elsewhere to (SEMANTICS §10).
        let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
        if let Some(path) = ca_file {
            for cert in read_ca_file(path).map_err(|e| format!("caFile: {e}"))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        if let Ok(mut clients) = self.clients.lock() {
            clients.insert(key, client.clone());
        }
        Ok(client)
    }

    /// [`Evaluator::evaluate`] once fewer than [`MOST_AT_ONCE`] others are in progress.
    pub async fn evaluate_limited(
        &self,
        check: &Check,
        provider: Option<&Provider>,
        context: &Context,
        labels: &BTreeMap<String, String>,
        allow: &ExecAllow,
    ) -> Outcome {
        let Ok(_turn) = self.running.acquire().await else {
            return Outcome::Unavailable("the server is shutting down".into());
        };
        self.evaluate(check, provider, context, labels, allow).await
    }

    /// Evaluates one check now through its provider (`None`: it does not exist, or may not be
    /// named by the run's fleet). `labels` answers `{label:KEY}` for a member's checks.
    pub async fn evaluate(
        &self,
        check: &Check,
        provider: Option<&Provider>,
        context: &Context,
        labels: &BTreeMap<String, String>,
        allow: &ExecAllow,
    ) -> Outcome {
        let label = |k: &str| labels.get(k).cloned();
        let fill = |text: &str| render(text, context, &label);
        let timeout = Duration::from_secs(check.request_timeout_seconds.max(1) as u64);
        if let CheckKind::Inline { field } = &check.kind {
            return Outcome::Unavailable(format!(
                "written before check providers (it carries {field}): never evaluated"
            ));
        }
        let Some(provider) = provider else {
            return Outcome::Unavailable(format!(
                "check provider {:?} does not exist, or may not be named by this fleet",
                check.provider
            ));
        };
        let result = match (&check.kind, &provider.target) {
            (CheckKind::Prometheus { query, .. }, ProviderTarget::Prometheus { endpoint }) => {
                let url = format!("{endpoint}/api/v1/query");
                let query = render_query(query, context, &label);
                match self.get(provider, &url, &[("query", query)], timeout).await {
                    Ok((200..=299, body)) => prometheus_samples(&body).map(Outcome::Samples),
                    Ok((status, _)) => Err(format!("Prometheus answered HTTP {status}")),
                    Err(e) => Err(e),
                }
            }
            (
                CheckKind::Http {
                    path,
                    expect_status,
                    body_contains,
                },
                ProviderTarget::Http { base_url },
            ) => match under_base(base_url, &render_path(path, context, &label)) {
                Err(e) => Err(e),
                Ok(url) => match self.get(provider, &url, &[], timeout).await {
                    Ok((status, body)) => {
                        let status_ok = match expect_status {
                            Some(s) => status == *s,
                            None => (200..=299).contains(&status),
                        };
                        let wanted = body_contains.as_ref().map(|t| fill(t));
                        let body_ok = wanted
                            .as_ref()
                            .is_none_or(|t| String::from_utf8_lossy(&body).contains(t.as_str()));
                        let mut value = format!("HTTP {status}");
                        if !body_ok {
                            value.push_str(", without the text bodyContains names");
                        }
                        Ok(Outcome::Verdict {
                            passed: status_ok && body_ok,
                            value,
                        })
                    }
                    Err(e) => Err(e),
                },
            },
            (
                CheckKind::Exec { args },
                ProviderTarget::Exec {
                    command,
                    allow_options,
                },
            ) => {
                let rendered: Vec<String> = args.iter().map(|a| fill(a)).collect();
                match rendered.iter().position(|a| a.starts_with('-')) {
                    Some(i) if !allow_options => Err(format!(
                        "argument {i} starts with - once filled in; provider {:?} does not allow options",
                        provider.name
                    )),
                    _ => {
                        let argv: Vec<String> = command.iter().cloned().chain(rendered).collect();
                        run_command(&argv, allow, timeout).await
                    }
                }
            }
            _ => Err(format!(
                "check provider {:?} is not of this check's type",
                check.provider
            )),
        };
        result.unwrap_or_else(Outcome::Unavailable)
    }

    async fn get(
        &self,
        provider: &Provider,
        url: &str,
        query: &[(&str, String)],
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), String> {
        let client = self.client(provider.ca_file.as_deref())?;
        let parsed = if query.is_empty() {
            reqwest::Url::parse(url)
        } else {
            reqwest::Url::parse_with_params(url, query)
        };
        let url =
            parsed.map_err(|_| "the URL the provider and check make is not valid".to_string())?;
        let mut request = client.get(url).timeout(timeout);
        for (name, value) in &provider.headers {
            let value = match env_reference(value) {
                Some(var) => std::env::var(var)
                    .map_err(|_| format!("header {name}: environment variable {var} is not set"))?,
                None => value.clone(),
            };
            request = request.header(name, value);
        }
        let mut response = request.send().await.map_err(describe)?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(describe)? {
            if body.len() + chunk.len() > MOST_BODY {
                return Err(format!("the answer is larger than {MOST_BODY} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }
}

/// `base` followed by `path` (a check's path, its placeholders filled and encoded), refused
/// unless it stays under `base`: no `.` or `..` segment before or after decoding (a `\\` counts
/// as a separator, a decoded `?` or `#` hides nothing), and the parsed URL keeps the base's
/// scheme, host and port and is exactly the base's path followed by this one, nothing folded
/// (SEMANTICS §10).
pub fn under_base(base: &str, path: &str) -> Result<String, String> {
    let refused = || Err("the check's path leaves its provider's base URL".to_string());
    let raw_path = path.split_once('?').map_or(path, |(p, _)| p);
    if !raw_path.starts_with('/') || raw_path.starts_with("//") || path.contains('#') {
        return refused();
    }
    if has_dot_segment(raw_path) || has_dot_segment(&percent_decode(raw_path)) {
        return refused();
    }
    let joined = format!("{base}{path}");
    let (Ok(b), Ok(j)) = (reqwest::Url::parse(base), reqwest::Url::parse(&joined)) else {
        return refused();
    };
    let base_path = b.path().trim_end_matches('/');
    let same_origin = b.scheme() == j.scheme()
        && b.host_str() == j.host_str()
        && b.port_or_known_default() == j.port_or_known_default()
        && j.username().is_empty()
        && j.password().is_none();
    if !same_origin || j.path() != format!("{base_path}{raw_path}") {
        return refused();
    }
    Ok(joined)
}

/// Why a request failed, without its URL (which may hold credentials or tokens; the check's
/// name says which it was).
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The samples of an instant query's answer: every value of a vector, or a scalar's.
fn prometheus_samples(body: &[u8]) -> Result<Vec<f64>, String> {
    let doc: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| "Prometheus answered something other than JSON".to_string())?;
    if doc["status"] != "success" {
        return Err("Prometheus answered an error".into());
    }
    let value = |pair: &serde_json::Value| -> Result<f64, String> {
        let text = pair
            .get(1)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| "a sample without a value".to_string())?;
        match text {
            "NaN" => Ok(f64::NAN),
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            t => t
                .parse()
                .map_err(|_| "a sample value is not a number".to_string()),
        }
    };
    let data = &doc["data"];
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| value(&s["value"]))
            .collect(),
        Some("scalar") => Ok(vec![value(&data["result"])?]),
        other => Err(format!(
            "the query answered a {}, not an instant vector or scalar",
            other.unwrap_or("nothing")
        )),
    }
}

/// Runs an Exec check's command if the server allows it: exit 0 passes.
async fn run_command(
    args: &[String],
    allow: &ExecAllow,
    timeout: Duration,
) -> Result<Outcome, String> {
    let Some((program, rest)) = args.split_first() else {
        return Err("the command is empty".into());
    };
    let program = allow.resolve(program, "command").map_err(|e| e.message)?;
    // The program gets PATH, the locale and the variables set for checks, nothing else of the
    // server's environment (database URLs, cloud credentials).
    let kept = std::env::vars().filter(|(k, _)| {
        matches!(k.as_str(), "PATH" | "LANG" | "LC_ALL" | "TZ")
            || k.starts_with(flotilla_engine::checks::ENV_PREFIX)
    });
    let mut child = tokio::process::Command::new(&program)
        .args(rest)
        .env_clear()
        .envs(kept)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let mut stderr = child.stderr.take();
    let waited = tokio::time::timeout(timeout, async {
        // All of it is read (a full pipe would stall the command), the first 4 KiB kept.
        let mut text = Vec::new();
        if let Some(err) = stderr.as_mut() {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 8192];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let room = 4096usize.saturating_sub(text.len());
                text.extend_from_slice(&buf[..n.min(room)]);
            }
        }
        (child.wait().await, text)
    })
    .await;
    match waited {
        Err(_) => Err(format!(
            "{program} did not finish within {} s",
            timeout.as_secs()
        )),
        Ok((Err(e), _)) => Err(format!("{program}: {e}")),
        Ok((Ok(status), stderr)) => {
            let code = status
                .code()
                .map_or_else(|| "killed by a signal".to_string(), |c| format!("exit {c}"));
            // What it said goes to the server's log, not to the run (readers see runs).
            let said = String::from_utf8_lossy(&stderr).trim().to_string();
            if !said.is_empty() && !status.success() {
                tracing::info!(program = %program, %code, stderr = %said.chars().take(500).collect::<String>(), "an exec check failed");
            }
            Ok(Outcome::Verdict {
                passed: status.success(),
                value: code,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_stays_under_its_base() {
        let base = "http://health.example.test:8080/api";
        assert_eq!(
            under_base(base, "/clusters/c%2Fd").unwrap(),
            "http://health.example.test:8080/api/clusters/c%2Fd"
        );
        for path in [
            "//127.0.0.1/x",
            "/../admin",
            "/%2e%2e/admin",
            "/x/%2E%2e",
            "/x%3F/%2e%2e/%2e%2e/api-internal/secret",
            "/x%23/%2e%2e/%2e%2e/api-internal",
            "/x%5C..%5C..%5Capix",
            "/x/..%2F..%2Fapix",
            "/x#/../../apix",
            "@127.0.0.1/",
            "\\..\\x",
            "/x\\..",
        ] {
            assert!(under_base(base, path).is_err(), "{path}");
        }
        // Nothing folds into a sibling of the base's path.
        assert!(under_base("http://h/api", "/../apis/x").is_err());
        assert_eq!(
            under_base("http://h/api", "/q?cluster=a%2Fb").unwrap(),
            "http://h/api/q?cluster=a%2Fb"
        );
        // A userinfo or another host cannot be smuggled in after the base.
        assert!(under_base("http://h", "@127.0.0.1/").is_err());
        assert!(under_base("http://h", ".evil.example/").is_err());
        assert!(under_base("http://h", ":9999/").is_err());
    }

    #[test]
    fn instant_query_answers_are_read() {
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"b"},"value":[1,"0.5"]},{"metric":{},"value":[1,"NaN"]}]}}"#;
        let samples = prometheus_samples(vector).unwrap();
        assert_eq!(samples[0], 0.5);
        assert!(samples[1].is_nan());
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"3"]}}"#;
        assert_eq!(prometheus_samples(scalar).unwrap(), vec![3.0]);
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(prometheus_samples(empty).unwrap().is_empty());
        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        let refused = prometheus_samples(error).unwrap_err();
        assert!(
            !refused.contains("parse error"),
            "never quotes the body: {refused}"
        );
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(prometheus_samples(matrix).unwrap_err().contains("matrix"));
        assert!(prometheus_samples(b"<html>").is_err());
    }
}
