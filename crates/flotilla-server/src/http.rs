//! Serving connections under limits, so that no client can hold the server: a cap on open
//! connections, a deadline for a request's headers (which is also how long a keep-alive
//! connection may sit idle), a deadline for its body, and a cap on requests handled at once.
//! Running out of file descriptors is the server's own problem, never a member's: the process
//! raises its soft limit to the hard one at start.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, watch};

/// The limits, with defaults; `flotilla serve` takes each as a flag.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Open connections at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Requests being handled at once (an event stream counts until its headers are sent);
    /// one more is answered 503 at once.
    pub max_requests: usize,
    /// How long a client may take to send a request's headers, and how long a keep-alive
    /// connection may wait for its next request.
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_requests: 256,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Raises the soft limit of open files to the hard limit, and says what it is.
pub fn raise_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    // `rlim_t` is u64 on Linux but not on every platform.
    #[allow(clippy::unnecessary_cast)]
    Some(limit.rlim_cur as u64)
}

/// Answers 503 when `max_requests` are already being handled.
pub async fn limit_requests(
    State(permits): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    match permits.try_acquire() {
        Ok(_permit) => next.run(request).await,
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "1")],
            axum::Json(serde_json::json!({"error": {
                "code": "ServerBusy",
                "message": "too many requests are being handled at once; try again",
                "target": "",
            }})),
        )
            .into_response(),
    }
}

/// Resolves once the stop is sent (the guard `wait_for` returns is not held).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Accepts connections until `shutdown` is sent, then asks every open connection to finish its
/// request and close.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut refused_since_log = 0u64;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped(&mut shutdown) => {
                // Open connections finish their requests (event streams are cut after a
                // while): every permit back means every connection closed.
                let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
                let _ = tokio::time::timeout(Duration::from_secs(5), connections.acquire_many(all))
                    .await;
                return;
            }
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors, say: wait a little rather than spin.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            refused_since_log += 1;
            if refused_since_log.is_power_of_two() {
                tracing::warn!(
                    refused = refused_since_log,
                    max = limits.max_connections,
                    "connection refused: too many open connections"
                );
            }
            drop(stream);
            continue;
        };
        let app = app.clone();
        let stop = shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, app, limits, stop).await,
                // The handshake is held to the header deadline too.
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await
                    {
                        Ok(Ok(stream)) => serve_connection(stream, app, limits, stop).await,
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Serves one connection (plain or TLS) until it ends or the server stops.
async fn serve_connection<I>(io: I, app: Router, limits: Limits, mut stop: watch::Receiver<bool>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = stopped(&mut stop) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// A TLS configuration from PEM files: the certificate chain and its private key.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: no certificate in it",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| format!("--tls-cert and --tls-key do not make a certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Reads a request's body within `body_timeout` (408 past it) and within the route's size
/// limit (413 past it), before any handler sees it: a client sending its body slowly holds
/// nothing for long.
pub async fn limit_body(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let segments: Vec<&str> = path.split('/').collect();
    // Only `/v1/fleets/{fleet}/importMembers` takes large bodies.
    let import = segments.len() == 5
        && segments[1] == "v1"
        && segments[2] == "fleets"
        && segments[4] == "importMembers";
    let limit = if import {
        crate::state::IMPORT_BODY_LIMIT
    } else {
        crate::state::BODY_LIMIT
    };
    let (parts, body) = request.into_parts();
    let refuse = |status: StatusCode, code: &str, message: String| {
        (
            status,
            axum::Json(
                serde_json::json!({"error": {"code": code, "message": message, "target": ""}}),
            ),
        )
            .into_response()
    };
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await
        }
        Ok(Err(_)) => refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PayloadTooLarge",
            format!("the request body is larger than {limit} bytes"),
        ),
        Err(_) => refuse(
            StatusCode::REQUEST_TIMEOUT,
            "RequestTimeout",
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            ),
        ),
    }
}

/// Which `Host` names the server answers to (a DNS-rebinding page uses a name of its own):
/// IP literals, `localhost`, and the names it is told of (`--public-url`, `--allowed-hosts`).
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    pub fn new(names: impl IntoIterator<Item = String>) -> AllowedHosts {
        let mut names: Vec<String> = names
            .into_iter()
            .map(|n| n.trim().to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .collect();
        names.push("localhost".into());
        AllowedHosts { names }
    }

    /// Whether a page from `authority` may change things here: a named host or loopback.
    pub fn allows_origin(&self, authority: &str) -> bool {
        let name = host_name(authority);
        match name.parse::<std::net::IpAddr>() {
            Ok(ip) => ip.is_loopback(),
            Err(_) => self.names.contains(&name),
        }
    }

    /// Whether `host` (a `Host` header or an origin's authority, port included or not) is one
    /// the server answers to.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_name(host);
        name.parse::<std::net::IpAddr>().is_ok() || self.names.contains(&name)
    }
}

/// The name part of an authority: `[::1]:8080` → `::1`, `Example.com:80` → `example.com`.
fn host_name(authority: &str) -> String {
    let authority = authority.trim();
    let name = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                authority
            }
        })
    };
    name.to_ascii_lowercase()
}

/// Refuses requests whose `Host` the server does not answer to (421), state-changing requests
/// from another site's page (403: a browser names the page's origin), and bodies that are not
/// JSON (415; an action with no body, as the Azure SDK sends it, needs no content type). In
/// every mode, `--insecure-no-auth` included.
pub async fn check_origin(
    State(allowed): State<Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Response {
    use axum::http::{Method, header};
    let refuse = |status: StatusCode, code: &str, message: String| {
        (
            status,
            axum::Json(
                serde_json::json!({"error": {"code": code, "message": message, "target": ""}}),
            ),
        )
            .into_response()
    };
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(host) = &host
        && !allowed.allows(host)
    {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "UnknownHost",
            format!(
                "this server does not answer to the host {host:?}; add it with --allowed-hosts or --public-url"
            ),
        );
    }
    let changes = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if changes && let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let authority = origin.split_once("://").map_or(origin, |(_, a)| a);
        let same = host
            .as_deref()
            .is_some_and(|h| h.eq_ignore_ascii_case(authority));
        // An origin is a page's site: unlike a Host, any IP literal is not good enough (a page
        // served from 203.0.113.7 must not change anything); loopback and named hosts are.
        if !same && !allowed.allows_origin(authority) {
            return refuse(
                StatusCode::FORBIDDEN,
                "CrossOriginRequest",
                format!(
                    "a page from {origin:?} may not change anything here; only this server's own pages may"
                ),
            );
        }
    }
    let has_body = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|n| n.trim() != "0")
        || headers.contains_key(header::TRANSFER_ENCODING);
    if has_body {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|t| {
                t.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            })
            .is_some_and(|t| t == "application/json" || t.ends_with("+json"));
        if !json {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                "a request body must be JSON, sent with Content-Type: application/json".into(),
            );
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_matched_by_name_with_or_without_a_port() {
        let allowed = AllowedHosts::new(["Flotilla.Example.com".to_string()]);
        for ok in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "10.1.2.3",
            "flotilla.example.com",
            "FLOTILLA.example.com:443",
        ] {
            assert!(allowed.allows(ok), "{ok}");
        }
        for refused in ["evil.example", "localhost.evil.example:8080", "example.com"] {
            assert!(!allowed.allows(refused), "{refused}");
        }
        // A page's origin: loopback and named hosts, not any IP.
        for ok in [
            "127.0.0.1:8080",
            "[::1]",
            "localhost:8080",
            "flotilla.example.com",
        ] {
            assert!(allowed.allows_origin(ok), "{ok}");
        }
        for refused in ["203.0.113.7", "10.0.0.1:80", "evil.example", "null"] {
            assert!(!allowed.allows_origin(refused), "{refused}");
        }
    }
}
