//! Bearer tokens with roles (API.md, Security): created by an admin, stored as SHA-256 hashes,
//! shown once. Roles are ordered: reader < operator < approver < admin.

use std::io::Read;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};

use crate::clock::now;
use crate::error::{HttpError, unauthorized};
use crate::state::AppState;
use crate::store::TokenRecord;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Reader,
    Operator,
    Approver,
    Admin,
}

impl Role {
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "reader" => Some(Role::Reader),
            "operator" => Some(Role::Operator),
            "approver" => Some(Role::Approver),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }
}

/// Who is calling: the token's subject and role.
#[derive(Clone, Debug)]
pub struct Caller {
    pub subject: String,
    pub role: Role,
    /// The hash of the token the call came with (none without authentication): what a
    /// long-lived answer checks again, so that revoking the token ends it.
    pub token_hash: Option<String>,
}

/// The subject of what the server does by itself (a profile's run, say).
const SYSTEM_SUBJECT: &str = "flotilla";

impl Caller {
    /// The server itself, acting on its own (no token).
    pub fn system() -> Caller {
        Caller {
            subject: SYSTEM_SUBJECT.into(),
            role: Role::Admin,
            token_hash: None,
        }
    }

    /// Whether this is [`Caller::system`].
    pub fn is_system(&self) -> bool {
        self.token_hash.is_none() && self.subject == SYSTEM_SUBJECT && self.role == Role::Admin
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| unauthorized("no credentials"))
    }
}

pub fn hash(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Random bytes from the kernel's CSPRNG, as hex. There is no fallback: a token guessable from
/// the clock is worse than no token.
fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("cannot read the system's random source /dev/urandom: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The longest token subject.
pub const SUBJECT_MAX: usize = 256;

/// A token's subject is shown in gates, skips and logs: at most 256 characters, no control
/// characters (a terminal escape in it would reach every reader's screen).
pub fn check_subject(subject: &str) -> Result<(), String> {
    if subject.trim().is_empty() {
        return Err("subject: must not be empty".into());
    }
    if subject.chars().count() > SUBJECT_MAX {
        return Err(format!(
            "subject: {} characters; at most {SUBJECT_MAX}",
            subject.chars().count()
        ));
    }
    if let Some(c) = subject.chars().find(|c| c.is_control()) {
        return Err(format!(
            "subject {:?}: control characters ({c:?}) are not allowed",
            subject.chars().take(40).collect::<String>()
        ));
    }
    Ok(())
}

/// A new token: the secret (shown once) and the record to store. Refused for a subject
/// [`check_subject`] refuses, or without a random source.
pub fn new_token(role: Role, subject: &str) -> Result<(String, TokenRecord), String> {
    check_subject(subject)?;
    let id = random_hex(6)?;
    let secret = format!("flt_{}_{}", id, random_hex(24)?);
    let record = TokenRecord {
        id,
        hash: hash(&secret),
        role: role.name().to_string(),
        subject: subject.to_string(),
        created_at: now().unix(),
        revoked: false,
    };
    Ok((secret, record))
}

/// Resolves the caller from `Authorization: Bearer …`.
pub async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Caller, HttpError> {
    if state.insecure {
        return Ok(Caller {
            subject: "anonymous".into(),
            role: Role::Admin,
            token_hash: None,
        });
    }
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <token>"))?;
    let secret = value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .ok_or_else(|| unauthorized("the Authorization header must be Bearer <token>"))?;
    let token_hash = hash(secret);
    let record = state
        .runs
        .store
        .token_by_hash(&token_hash)
        .await
        .map_err(HttpError::from)?
        .filter(|t| !t.revoked)
        .ok_or_else(|| unauthorized("the token is not valid (unknown or revoked)"))?;
    let role =
        Role::parse(&record.role).ok_or_else(|| unauthorized("the token has an unknown role"))?;
    Ok(Caller {
        subject: record.subject,
        role,
        token_hash: Some(token_hash),
    })
}

/// Refuses (403) a caller whose role is below `role`.
pub fn require(caller: &Caller, role: Role) -> crate::error::HttpResult<()> {
    if caller.role >= role {
        Ok(())
    } else {
        Err(HttpError::new(
            axum::http::StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "this needs the {} role; the token of {:?} has {}",
                role.name(),
                caller.subject,
                caller.role.name()
            ),
        ))
    }
}
