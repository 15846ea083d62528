//! The dashboard's sign-ins through an identity provider: sign-ins under way (the `state`, the
//! `nonce` and the PKCE verifier of each, used once, for ten minutes) and sessions (the ID
//! token's claims and the provider that vouched for them, the CSRF token every write must
//! carry). A session keeps claims, not grants: its roles are worked out from the provider's
//! current mappings on each request, so changing or deleting the provider takes effect at once.
//! Held in this replica's memory: a session id is a random secret kept only as its SHA-256.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use serde_json::{Map, Value};

/// How long a session lasts at most from its sign-in (less if the ID token ends sooner).
pub const SESSION_SECONDS: i64 = 8 * 3600;
/// How long a sign-in may take at the provider.
pub const SIGN_IN_SECONDS: i64 = 600;
/// Sessions and sign-ins held at most (the oldest go first past it).
const MOST: usize = 10_000;

/// The session cookie's name.
pub const COOKIE: &str = "flotilla_session";
/// The cookie binding a sign-in under way to the browser that started it.
pub const SIGN_IN_COOKIE: &str = "flotilla_sign_in";

#[derive(Clone, Debug)]
pub struct Session {
    /// The verified ID token's claims (`sub`, the user and groups claims, ...).
    pub claims: Arc<Map<String, Value>>,
    pub csrf: String,
    /// The provider's name, and its issuer then: a provider since deleted, or renamed onto
    /// another issuer, ends the session.
    pub provider: String,
    pub issuer: String,
    /// The ID token, sent back as `id_token_hint` when signing out at the provider.
    pub id_token: String,
    pub expires_at: i64,
}

#[derive(Clone, Debug)]
pub struct PendingSignIn {
    pub provider: String,
    pub nonce: String,
    pub verifier: String,
    pub redirect_uri: String,
    /// Where the dashboard returns after the sign-in (a fragment of `/`).
    pub started_at: i64,
}

#[derive(Default)]
pub struct Sessions {
    sessions: Mutex<HashMap<String, Session>>,
    pending: Mutex<HashMap<String, PendingSignIn>>,
}

fn key(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Sessions {
    /// Keeps a sign-in under way, by its `state`.
    pub fn start(&self, state: &str, pending: PendingSignIn, now: i64) {
        if let Ok(mut held) = self.pending.lock() {
            held.retain(|_, p| now - p.started_at < SIGN_IN_SECONDS);
            if held.len() >= MOST
                && let Some(oldest) = held
                    .iter()
                    .min_by_key(|(_, p)| p.started_at)
                    .map(|(k, _)| k.clone())
            {
                held.remove(&oldest);
            }
            held.insert(key(state), pending);
        }
    }

    /// Takes a sign-in under way (once: a `state` cannot be replayed).
    pub fn finish(&self, state: &str, now: i64) -> Option<PendingSignIn> {
        let mut held = self.pending.lock().ok()?;
        held.remove(&key(state))
            .filter(|p| now - p.started_at < SIGN_IN_SECONDS)
    }

    /// Opens a session; answers its id (the cookie's value).
    pub fn open(&self, id: &str, session: Session, now: i64) {
        if let Ok(mut held) = self.sessions.lock() {
            held.retain(|_, s| s.expires_at > now);
            if held.len() >= MOST
                && let Some(oldest) = held
                    .iter()
                    .min_by_key(|(_, s)| s.expires_at)
                    .map(|(k, _)| k.clone())
            {
                held.remove(&oldest);
            }
            held.insert(key(id), session);
        }
    }

    pub fn get(&self, id: &str, now: i64) -> Option<Session> {
        let held = self.sessions.lock().ok()?;
        held.get(&key(id)).filter(|s| s.expires_at > now).cloned()
    }

    /// Ends a session (sign-out).
    pub fn close(&self, id: &str) -> Option<Session> {
        self.sessions.lock().ok()?.remove(&key(id))
    }
}

/// A cookie's value from a `Cookie` header.
pub fn cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(expires_at: i64) -> Session {
        Session {
            claims: Arc::new(Map::new()),
            csrf: "c".into(),
            provider: "corp".into(),
            issuer: "https://idp.example".into(),
            id_token: String::new(),
            expires_at,
        }
    }

    #[test]
    fn a_sign_in_is_finished_once_and_a_session_ends_when_closed_or_expired() {
        let sessions = Sessions::default();
        let pending = PendingSignIn {
            provider: "corp".into(),
            nonce: "n".into(),
            verifier: "v".into(),
            redirect_uri: "http://127.0.0.1/auth/callback".into(),
            started_at: 100,
        };
        sessions.start("s1", pending, 100);
        assert!(sessions.finish("s1", 101).is_some());
        assert!(sessions.finish("s1", 101).is_none(), "a state is used once");
        sessions.open("id", session(1000), 100);
        assert!(sessions.get("id", 999).is_some());
        assert!(sessions.get("id", 1000).is_none(), "expired");
        assert!(sessions.close("id").is_some());
        assert!(sessions.get("id", 500).is_none(), "signed out");
    }

    #[test]
    fn cookies_are_read_by_name() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            "a=1; flotilla_session=abc; b=2".parse().expect("header"),
        );
        assert_eq!(cookie(&headers, COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}
