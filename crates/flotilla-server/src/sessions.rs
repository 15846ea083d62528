//! The dashboard's sign-ins through an identity provider: sign-ins under way (the `state`, the
//! `nonce` and the PKCE verifier of each, for ten minutes, kept in the browser's sign-in cookie
//! sealed (AES-256-GCM: neither readable nor alterable) with this replica's key: the server holds nothing per sign-in started, so no one can
//! crowd out others' sign-ins by starting many) and sessions (the ID
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

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PendingSignIn {
    /// The `state` sent to the provider, which its answer must carry back.
    pub state: String,
    pub provider: String,
    pub nonce: String,
    pub verifier: String,
    pub redirect_uri: String,
    /// Where the dashboard returns after the sign-in (a fragment of `/`).
    pub started_at: i64,
}

pub struct Sessions {
    sessions: Mutex<HashMap<String, Session>>,
    /// The key sign-in cookies are sealed with (none without a random source: no sign-in).
    sign_in_key: Option<aws_lc_rs::aead::LessSafeKey>,
}

impl Default for Sessions {
    fn default() -> Sessions {
        let mut bytes = [0u8; 32];
        let sign_in_key = aws_lc_rs::rand::fill(&mut bytes)
            .ok()
            .and_then(|()| {
                aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, &bytes).ok()
            })
            .map(aws_lc_rs::aead::LessSafeKey::new);
        Sessions {
            sessions: Mutex::new(HashMap::new()),
            sign_in_key,
        }
    }
}

fn key(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Sessions {
    /// A sign-in under way as its cookie's value: base64url of a random 96-bit nonce and the
    /// sign-in's JSON sealed with AES-256-GCM under this replica's key (the PKCE verifier and the
    /// `nonce` in it are not readable from the cookie).
    pub fn seal(&self, pending: &PendingSignIn) -> Option<String> {
        use aws_lc_rs::aead::{Aad, NONCE_LEN, Nonce};
        use base64::Engine;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let key = self.sign_in_key.as_ref()?;
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).ok()?;
        let mut sealed = serde_json::to_vec(pending).ok()?;
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::empty(),
            &mut sealed,
        )
        .ok()?;
        let mut value = nonce.to_vec();
        value.extend_from_slice(&sealed);
        Some(URL_SAFE_NO_PAD.encode(value))
    }

    /// The sign-in a cookie carries, if this replica sealed it, it is for `state` and it is
    /// less than `SIGN_IN_SECONDS` old.
    pub fn unseal(&self, cookie: &str, state: &str, now: i64) -> Option<PendingSignIn> {
        use aws_lc_rs::aead::{Aad, NONCE_LEN, Nonce};
        use base64::Engine;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let key = self.sign_in_key.as_ref()?;
        let mut value = URL_SAFE_NO_PAD.decode(cookie).ok()?;
        if value.len() < NONCE_LEN {
            return None;
        }
        let mut sealed = value.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&value).ok()?;
        let opened = key.open_in_place(nonce, Aad::empty(), &mut sealed).ok()?;
        let pending: PendingSignIn = serde_json::from_slice(opened).ok()?;
        (crate::oidc::equal_secrets(&pending.state, state)
            && (0..SIGN_IN_SECONDS).contains(&(now - pending.started_at)))
        .then_some(pending)
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
    fn a_sign_in_cookie_is_taken_sealed_by_this_replica_for_its_state_within_ten_minutes() {
        let sessions = Sessions::default();
        let pending = PendingSignIn {
            state: "s1".into(),
            provider: "corp".into(),
            nonce: "n".into(),
            verifier: "v".into(),
            redirect_uri: "http://127.0.0.1/auth/callback".into(),
            started_at: 100,
        };
        let sealed = sessions.seal(&pending).expect("sealed");
        assert_eq!(sessions.unseal(&sealed, "s1", 101), Some(pending.clone()));
        assert_eq!(sessions.unseal(&sealed, "s2", 101), None, "another state");
        assert_eq!(
            sessions.unseal(&sealed, "s1", 100 + SIGN_IN_SECONDS),
            None,
            "expired"
        );
        assert_eq!(
            Sessions::default().unseal(&sealed, "s1", 101),
            None,
            "another replica's key"
        );
        // Altered anywhere, or cut short: refused.
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 5;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).expect("ascii");
        assert_eq!(sessions.unseal(&altered, "s1", 101), None, "altered");
        assert_eq!(sessions.unseal(&sealed[..10], "s1", 101), None, "cut short");
        // Not readable: the sealed bytes do not hold the sign-in's text.
        let raw = {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(&sealed)
                .expect("base64")
        };
        assert!(!raw.windows(13).any(|w| w == b"auth/callback"));
    }

    #[test]
    fn a_session_ends_when_closed_or_expired() {
        let sessions = Sessions::default();
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
