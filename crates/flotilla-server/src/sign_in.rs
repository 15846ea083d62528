//! Signing in to the dashboard through an identity provider: the authorization code flow with
//! PKCE, a `state` bound to the browser by a cookie and a `nonce` checked in the ID token; the
//! session it opens is an `HttpOnly`, `SameSite=Lax` cookie (`Secure` unless the server's public
//! URL is plain http on loopback, or it has none and listens on loopback without TLS), and every write made with it carries its CSRF token (`auth`). Also
//! the providers people sign in with, for the dashboard and `flotilla login --oidc`.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::clock::now;
use crate::oidc::equal_secrets;
use crate::principal::random_hex;
use crate::sessions::{
    COOKIE, PendingSignIn, SESSION_SECONDS, SIGN_IN_COOKIE, SIGN_IN_SECONDS, Session, cookie,
};
use crate::state::Shared;

/// `GET /auth/providers` (open): the identity providers people sign in with, and the clients
/// they sign in through.
pub async fn providers(State(state): State<Shared>) -> Response {
    let value: Vec<Value> = state
        .oidc
        .providers()
        .iter()
        .filter(|p| p.config.client_id.is_some() || p.config.cli_client_id.is_some())
        .map(|p| {
            let c = &p.config;
            json!({
                "name": c.name,
                "issuer": c.issuer,
                "clientId": c.client_id,
                "cliClientId": c.cli_client_id.as_ref().or(c.client_id.as_ref()),
                "scopes": c.scopes,
                "dashboard": c.client_id.is_some(),
            })
        })
        .collect();
    no_store(axum::Json(json!({"value": value})).into_response())
}

/// `GET /auth/session` (open): whether the request carries a live dashboard session, so that the
/// page asks `/v1/me` only then (a 401 would be logged by the browser as an error).
pub async fn session(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let live =
        cookie(&headers, COOKIE).is_some_and(|id| state.sessions.get(id, now().unix()).is_some());
    no_store(axum::Json(json!({"signedIn": live})).into_response())
}

fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn refused(status: StatusCode, message: String) -> Response {
    tracing::info!(reason = %message, "dashboard sign-in refused");
    no_store(
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("Sign-in refused: {message}\n"),
        )
            .into_response(),
    )
}

/// Whether cookies carry `Secure`: decided by how the server is configured to be reached (its
/// public URL, else its TLS and listener), never by the request's `Host`, which the client
/// chooses. Only a server reached over plain http on loopback goes without.
pub fn secure_cookies(settings: &crate::home::Settings) -> bool {
    match &settings.public_url {
        Some(url) => match reqwest::Url::parse(url) {
            Ok(url) => !(url.scheme() == "http" && url_on_loopback(&url)),
            Err(_) => true,
        },
        None => settings.https || !settings.loopback_listener,
    }
}

fn url_on_loopback(url: &reqwest::Url) -> bool {
    url.host_str().is_some_and(|host| {
        host == "localhost"
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

/// The server's address as users reach it: `--public-url`, else the request's `Host` (which the
/// HTTP layer has checked against the names the server answers to).
fn base_url(state: &Shared, headers: &HeaderMap) -> String {
    let settings = state.arm_settings();
    match &settings.public_url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => format!(
            "{}://{}",
            if settings.https { "https" } else { "http" },
            headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost")
        ),
    }
}

fn set_cookie(state: &Shared, name: &str, value: &str, path: &str, max_age: i64) -> HeaderValue {
    let secure = if secure_cookies(&state.arm_settings()) {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[derive(Deserialize)]
pub struct LoginQuery {
    provider: Option<String>,
}

/// `GET /auth/login?provider=NAME` (open): to the provider's sign-in page.
pub async fn login(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<LoginQuery>,
) -> Response {
    let candidates: Vec<_> = state
        .oidc
        .providers()
        .into_iter()
        .filter(|p| p.config.client_id.is_some())
        .collect();
    let issuer = match &query.provider {
        Some(name) => candidates.into_iter().find(|p| &p.config.name == name),
        None if candidates.len() == 1 => candidates.into_iter().next(),
        None => None,
    };
    let Some(issuer) = issuer else {
        return refused(
            StatusCode::BAD_REQUEST,
            format!(
                "provider {:?}: no identity provider with a clientId has that name",
                query.provider.unwrap_or_default()
            ),
        );
    };
    let discovery = match state.oidc.discovery(&issuer).await {
        Ok(d) => d,
        Err(e) => return refused(StatusCode::BAD_GATEWAY, e),
    };
    let Some(endpoint) = discovery.authorization_endpoint else {
        return refused(
            StatusCode::BAD_GATEWAY,
            format!("{} names no authorization_endpoint", issuer.config.issuer),
        );
    };
    let (Ok(sign_in), Ok(nonce), Ok((verifier, challenge))) =
        (random_hex(32), random_hex(32), crate::oidc::pkce())
    else {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "no random source".into());
    };
    let redirect_uri = format!("{}/auth/callback", base_url(&state, &headers));
    let mut scopes = vec!["openid".to_string(), "profile".to_string()];
    scopes.extend(
        issuer
            .config
            .scopes
            .iter()
            .filter(|s| *s != "openid" && *s != "profile")
            .cloned(),
    );
    let mut url = match reqwest::Url::parse(&endpoint) {
        Ok(url) => url,
        Err(e) => {
            return refused(
                StatusCode::BAD_GATEWAY,
                format!("authorization_endpoint {endpoint:?}: {e}"),
            );
        }
    };
    url.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair(
            "client_id",
            issuer.config.client_id.as_deref().unwrap_or_default(),
        )
        .append_pair("redirect_uri", &redirect_uri)
        .append_pair("scope", &scopes.join(" "))
        .append_pair("state", &sign_in)
        .append_pair("nonce", &nonce)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256");
    // Nothing is kept on the server: the sign-in travels sealed in the browser's cookie.
    let Some(sealed) = state.sessions.seal(&PendingSignIn {
        state: sign_in,
        provider: issuer.config.name.clone(),
        nonce,
        verifier,
        redirect_uri,
        started_at: now().unix(),
    }) else {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "no random source".into());
    };
    let mut response =
        (StatusCode::SEE_OTHER, [(header::LOCATION, url.to_string())]).into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, SIGN_IN_COOKIE, &sealed, "/auth", SIGN_IN_SECONDS),
    );
    no_store(response)
}

#[derive(Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /auth/callback` (open): the provider's answer; opens a session and returns to `/`.
pub async fn callback(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<CallbackQuery>,
) -> Response {
    if let Some(error) = &query.error {
        return refused(
            StatusCode::UNAUTHORIZED,
            format!(
                "the identity provider answered {error}: {}",
                query.error_description.as_deref().unwrap_or("")
            ),
        );
    }
    let (Some(code), Some(sent_state)) = (&query.code, &query.state) else {
        return refused(
            StatusCode::BAD_REQUEST,
            "the answer has no code or no state".into(),
        );
    };
    // The state must be the one this browser's sign-in started with (login CSRF): its cookie,
    // sealed by this replica, names it.
    let bound = cookie(&headers, SIGN_IN_COOKIE).unwrap_or_default();
    let Some(pending) = state.sessions.unseal(bound, sent_state, now().unix()) else {
        return refused(
            StatusCode::BAD_REQUEST,
            "state: not a sign-in this browser started here in the last ten minutes; sign in again"
                .into(),
        );
    };
    let Some(issuer) = state.oidc.find(&pending.provider) else {
        return refused(
            StatusCode::BAD_REQUEST,
            format!("identity provider {:?} is gone", pending.provider),
        );
    };
    let (claims, id_token) = match state
        .oidc
        .exchange_code(
            &issuer,
            code,
            &pending.redirect_uri,
            &pending.verifier,
            &pending.nonce,
        )
        .await
    {
        Ok(found) => found,
        Err(e) => return refused(StatusCode::UNAUTHORIZED, e),
    };
    let subject = issuer.config.subject(&claims);
    let grants = issuer.config.grants(&claims);
    if grants.is_empty() {
        return refused(
            StatusCode::FORBIDDEN,
            format!(
                "{subject}: none of identity provider {}'s role mappings names your groups",
                issuer.config.name
            ),
        );
    }
    let (Ok(id), Ok(csrf)) = (random_hex(32), random_hex(32)) else {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "no random source".into());
    };
    tracing::info!(subject = %subject, provider = %issuer.config.name, "signed in to the dashboard");
    // The session ends with the ID token, or after SESSION_SECONDS if that is sooner.
    let expires_at = session_end(&claims, now().unix());
    state.sessions.open(
        &id,
        Session {
            claims: claims.into(),
            csrf,
            provider: issuer.config.name.clone(),
            issuer: issuer.config.issuer.clone(),
            id_token,
            expires_at,
        },
        now().unix(),
    );
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    let headers_out = response.headers_mut();
    headers_out.append(
        header::SET_COOKIE,
        set_cookie(&state, COOKIE, &id, "/", expires_at - now().unix()),
    );
    headers_out.append(
        header::SET_COOKIE,
        set_cookie(&state, SIGN_IN_COOKIE, "", "/auth", 0),
    );
    no_store(response)
}

/// When a session opened at `now` ends: at the ID token's `exp`, or `SESSION_SECONDS` on,
/// whichever is sooner.
pub fn session_end(claims: &serde_json::Map<String, Value>, now: i64) -> i64 {
    let cap = now + SESSION_SECONDS;
    claims
        .get("exp")
        .and_then(Value::as_i64)
        .map_or(cap, |exp| exp.min(cap))
}

/// `POST /auth/logout` (the session's CSRF token in `X-CSRF-Token`): ends the session; answers
/// where to end the provider's session too. The cookie is cleared whatever the answer, so the
/// browser never keeps one the page believes gone; a refusal says why (the page shows it).
pub async fn logout(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let mut response = end_session(&state, &headers).await;
    response
        .headers_mut()
        .append(header::SET_COOKIE, set_cookie(&state, COOKIE, "", "/", 0));
    response
}

async fn end_session(state: &Shared, headers: &HeaderMap) -> Response {
    let Some(id) = cookie(headers, COOKIE) else {
        return refused(StatusCode::UNAUTHORIZED, "no session".into());
    };
    let Some(session) = state.sessions.get(id, now().unix()) else {
        return refused(StatusCode::UNAUTHORIZED, "the session has ended".into());
    };
    let sent = headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !equal_secrets(sent, &session.csrf) {
        return refused(
            StatusCode::FORBIDDEN,
            "X-CSRF-Token: missing or not this session's".into(),
        );
    }
    state.sessions.close(id);
    let mut end_session = None;
    if let Some(issuer) = state.oidc.find(&session.provider)
        && let Ok(discovery) = state.oidc.discovery(&issuer).await
        && let Some(endpoint) = discovery.end_session_endpoint
        && let Ok(mut url) = reqwest::Url::parse(&endpoint)
    {
        url.query_pairs_mut()
            .append_pair("id_token_hint", &session.id_token)
            .append_pair(
                "post_logout_redirect_uri",
                &format!("{}/", base_url(state, headers)),
            );
        end_session = Some(url.to_string());
    }
    no_store(axum::Json(json!({"signedOut": true, "endSessionUrl": end_session})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_go_without_secure_only_for_plain_http_on_loopback() {
        let settings = |public_url: Option<&str>, https: bool, loopback_listener: bool| {
            crate::home::Settings {
                public_url: public_url.map(str::to_string),
                https,
                loopback_listener,
                ..Default::default()
            }
        };
        assert!(!secure_cookies(&settings(
            Some("http://127.0.0.1:8080"),
            false,
            false
        )));
        assert!(!secure_cookies(&settings(
            Some("http://localhost:8080/"),
            false,
            true
        )));
        assert!(!secure_cookies(&settings(
            Some("http://[::1]:8080"),
            false,
            true
        )));
        assert!(secure_cookies(&settings(
            Some("https://flotilla.example"),
            false,
            true
        )));
        assert!(secure_cookies(&settings(
            Some("http://flotilla.example"),
            false,
            true
        )));
        assert!(secure_cookies(&settings(
            Some("https://127.0.0.1"),
            true,
            true
        )));
        assert!(!secure_cookies(&settings(None, false, true)));
        assert!(secure_cookies(&settings(None, true, true)));
        assert!(secure_cookies(&settings(None, false, false)));
    }

    #[test]
    fn a_session_ends_with_its_id_token_or_after_eight_hours() {
        let claims = |exp: i64| json!({"exp": exp}).as_object().cloned().expect("object");
        assert_eq!(session_end(&claims(1000 + 3600), 1000), 1000 + 3600);
        assert_eq!(
            session_end(&claims(1000 + 86_400), 1000),
            1000 + SESSION_SECONDS
        );
        assert_eq!(
            session_end(&serde_json::Map::new(), 1000),
            1000 + SESSION_SECONDS
        );
    }
}
