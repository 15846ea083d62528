//! Evaluations of health and readiness checks (SEMANTICS §10), for real: a Prometheus instant
//! query over HTTP, a GET, or a subprocess the server allows. The engine asked for them with
//! `Command::Evaluate` and judges what comes back; this module only fetches the facts. An
//! evaluation that cannot be made (unreachable, timed out, not allowed, a variable not set)
//! is `Outcome::Unavailable` with why, never a failure.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use flotilla_driver::ExecAllow;
use flotilla_engine::checks::{Check, CheckKind, Context, Outcome, env_reference, render};

/// What an evaluation needs from the server: an HTTP client per CA file and the directories
/// exec checks may run from.
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

impl Evaluator {
    fn client(&self, ca_file: Option<&str>) -> Result<reqwest::Client, String> {
        let key = ca_file.map(str::to_string);
        if let Ok(clients) = self.clients.lock()
            && let Some(client) = clients.get(&key)
        {
            return Ok(client.clone());
        }
        let mut builder =
            reqwest::Client::builder().redirect(reqwest::redirect::Policy::limited(3));
        if let Some(path) = ca_file {
            let pem = std::fs::read(path).map_err(|e| format!("caFile {path}: {e}"))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("caFile {path}: {e}"))?;
            for cert in certs {
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
        context: &Context,
        labels: &BTreeMap<String, String>,
        allow: &ExecAllow,
    ) -> Outcome {
        let Ok(_turn) = self.running.acquire().await else {
            return Outcome::Unavailable("the server is shutting down".into());
        };
        self.evaluate(check, context, labels, allow).await
    }

    /// Evaluates one check now. `labels` answers `{label:KEY}` for a member's checks.
    pub async fn evaluate(
        &self,
        check: &Check,
        context: &Context,
        labels: &BTreeMap<String, String>,
        allow: &ExecAllow,
    ) -> Outcome {
        let label = |k: &str| labels.get(k).cloned();
        let fill = |text: &str| render(text, context, &label);
        let timeout = Duration::from_secs(check.request_timeout_seconds.max(1) as u64);
        let result = match &check.kind {
            CheckKind::Prometheus {
                endpoint, query, ..
            } => {
                let url = format!("{}/api/v1/query", fill(endpoint).trim_end_matches('/'));
                match self
                    .get(check, &url, &[("query", fill(query))], &fill, timeout)
                    .await
                {
                    Ok((200..=299, body)) => prometheus_samples(&body).map(Outcome::Samples),
                    Ok((status, body)) => Err(format!(
                        "Prometheus answered HTTP {status}: {}",
                        prometheus_error(&body)
                    )),
                    Err(e) => Err(e),
                }
            }
            CheckKind::Http {
                url,
                expect_status,
                body_contains,
            } => match self.get(check, &fill(url), &[], &fill, timeout).await {
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
                    if let Some(t) = wanted.filter(|_| !body_ok) {
                        value.push_str(&format!(", body without {t:?}"));
                    }
                    Ok(Outcome::Verdict {
                        passed: status_ok && body_ok,
                        value,
                    })
                }
                Err(e) => Err(e),
            },
            CheckKind::Exec { command } => {
                let args: Vec<String> = command.iter().map(|a| fill(a)).collect();
                run_command(&args, allow, timeout).await
            }
        };
        result.unwrap_or_else(Outcome::Unavailable)
    }

    async fn get(
        &self,
        check: &Check,
        url: &str,
        query: &[(&str, String)],
        fill: &(dyn Fn(&str) -> String + Sync),
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), String> {
        let client = self.client(check.ca_file.as_deref())?;
        let parsed = if query.is_empty() {
            reqwest::Url::parse(url)
        } else {
            reqwest::Url::parse_with_params(url, query)
        };
        let url = parsed.map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        let mut request = client.get(url).timeout(timeout);
        for (name, value) in &check.headers {
            let value = match env_reference(value) {
                Some(var) => std::env::var(var)
                    .map_err(|_| format!("header {name}: environment variable {var} is not set"))?,
                None => fill(value),
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
    let doc: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("Prometheus answered no JSON: {e}"))?;
    if doc["status"] != "success" {
        return Err(format!(
            "Prometheus answered an error: {}",
            prometheus_error(body)
        ));
    }
    let value = |pair: &serde_json::Value| -> Result<f64, String> {
        let text = pair
            .get(1)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| format!("a sample without a value: {pair}"))?;
        match text {
            "NaN" => Ok(f64::NAN),
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            t => t
                .parse()
                .map_err(|_| format!("a sample value {t:?} is not a number")),
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

fn prometheus_error(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|d| d["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
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
    let mut child = tokio::process::Command::new(&program)
        .args(rest)
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
            let said = String::from_utf8_lossy(&stderr).trim().to_string();
            Ok(Outcome::Verdict {
                passed: status.success(),
                value: if said.is_empty() || status.success() {
                    code
                } else {
                    format!("{code}: {}", said.chars().take(200).collect::<String>())
                },
            })
        }
    }
}

/// The checks of a run's strategy that run commands, with where they sit: refused at creation
/// when the server does not allow their program (SEMANTICS §10: only commands the server
/// allows).
pub fn refuse_disallowed_commands(
    strategy: &serde_json::Value,
    allow: &ExecAllow,
) -> Result<(), (String, String)> {
    fn walk(
        value: &serde_json::Value,
        path: &str,
        allow: &ExecAllow,
    ) -> Result<(), (String, String)> {
        match value {
            serde_json::Value::Object(map) => {
                if map.get("type").and_then(|t| t.as_str()) == Some("Exec")
                    && let Some(program) = map
                        .get("command")
                        .and_then(|c| c.get(0))
                        .and_then(|p| p.as_str())
                {
                    let field = format!("{path}.command[0]");
                    allow
                        .resolve(program, &field)
                        .map_err(|e| (field.clone(), e.message))?;
                }
                for (k, v) in map {
                    walk(v, &format!("{path}.{k}"), allow)?;
                }
                Ok(())
            }
            serde_json::Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{path}[{i}]"), allow)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    walk(strategy, "properties.strategy", allow)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(
            prometheus_samples(error)
                .unwrap_err()
                .contains("parse error")
        );
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(prometheus_samples(matrix).unwrap_err().contains("matrix"));
        assert!(prometheus_samples(b"<html>").is_err());
    }
}
