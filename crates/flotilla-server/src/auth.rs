//! Bearer tokens with roles (API.md, Security): created by an admin, stored as SHA-256 hashes,
//! shown once; or JWTs from an identity provider (`oidc`), whose groups or subject are mapped
//! to a role per fleet pattern. Roles are ordered: reader < operator < approver < admin.
//!
//! A caller's `role` is its role in the request's scope (`Caller::scoped`): on the fleet a
//! path names, or on every fleet (`*`) for server-wide resources (identity providers, check
//! providers, webhooks, tokens, the audit, the fleet list, creating and deleting fleets).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};

use crate::clock::now;
use crate::error::{HttpError, unauthorized};
use crate::oidc::config::Grant;
pub use crate::principal::{Role, SUBJECT_MAX, random_hex};
use crate::state::AppState;
use crate::store::TokenRecord;

/// What a caller may do where.
#[derive(Clone, Debug)]
pub enum Access {
    /// A static token (or no authentication): one role on every fleet.
    Everywhere(Role),
    /// An identity provider's JWT: a role per fleet pattern, never empty.
    Grants(Arc<[Grant]>),
}

impl Access {
    /// The caller's role on one fleet: the highest a matching grant gives.
    pub fn role_on(&self, fleet: &str) -> Option<Role> {
        match self {
            Access::Everywhere(role) => Some(*role),
            Access::Grants(grants) => grants
                .iter()
                .filter(|g| g.fleets.matches(fleet))
                .map(|g| g.role)
                .max(),
        }
    }

    /// The caller's role on every fleet (`*`), which server-wide resources need.
    pub fn role_everywhere(&self) -> Option<Role> {
        match self {
            Access::Everywhere(role) => Some(*role),
            Access::Grants(grants) => grants
                .iter()
                .filter(|g| g.fleets.is_everything())
                .map(|g| g.role)
                .max(),
        }
    }

    /// Every grant, as `(fleet pattern, role)` (a static token's is `("*", role)`).
    pub fn grants(&self) -> Vec<(String, Role)> {
        match self {
            Access::Everywhere(role) => vec![("*".to_string(), *role)],
            Access::Grants(grants) => grants
                .iter()
                .map(|g| (g.fleets.as_str().to_string(), g.role))
                .collect(),
        }
    }
}

/// Who is calling: the token's subject and role.
#[derive(Clone, Debug)]
pub struct Caller {
    pub subject: String,
    /// The role in this request's scope (see the module's comment).
    pub role: Role,
    /// The hash of the token the call came with (none without authentication): what a
    /// long-lived answer checks again, so that revoking the token ends it.
    pub token_hash: Option<String>,
    pub access: Access,
    /// When the credential ends (a JWT's `exp`), in seconds since the epoch: a long-lived
    /// answer ends then.
    pub expires_at: Option<i64>,
}

/// Where a request acts: on one fleet, or on the whole server.
#[derive(Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// The fleet as the router sees it: the path's segment, percent-decoded.
    Fleet(std::borrow::Cow<'a, str>),
    Everywhere,
    /// `GET /v1/me`: who the caller is, whatever its roles.
    Me,
    /// A fleet segment that is not valid percent-encoded UTF-8 (refused with 400).
    Malformed(&'a str),
}

/// A path segment percent-decoded as the router decodes it (`None`: a `%` not followed by
/// two hex digits, or bytes that are not UTF-8).
fn percent_decoded(segment: &str) -> Option<std::borrow::Cow<'_, str>> {
    if !segment.contains('%') {
        return Some(segment.into());
    }
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(Into::into)
}

/// The scope of a `/v1` request (the raw path: its fleet segment is decoded here, as the
/// router decodes it, so that `prod%2Deu` is matched as `prod-eu`). Creating, replacing and
/// deleting a fleet are server-wide.
pub fn scope_of<'a>(method: &axum::http::Method, path: &'a str) -> Scope<'a> {
    use axum::http::Method;
    if path == "/v1/me" {
        return Scope::Me;
    }
    let Some(rest) = path.strip_prefix("/v1/fleets/") else {
        return Scope::Everywhere;
    };
    let fleet = |segment: &'a str| match percent_decoded(segment) {
        Some(decoded) => Scope::Fleet(decoded),
        None => Scope::Malformed(segment),
    };
    match rest.split_once('/') {
        Some((segment, _)) if !segment.is_empty() => fleet(segment),
        None if !rest.is_empty() && !matches!(*method, Method::PUT | Method::DELETE) => fleet(rest),
        _ => Scope::Everywhere,
    }
}

impl Caller {
    /// The caller with its role in the scope of a `/v1` request; 403 with no role there.
    pub fn scoped(mut self, method: &axum::http::Method, path: &str) -> Result<Caller, HttpError> {
        if let Access::Everywhere(role) = self.access {
            self.role = role;
            return Ok(self);
        }
        let (role, place) = match scope_of(method, path) {
            Scope::Fleet(fleet) => (self.access.role_on(&fleet), format!("fleet {fleet:?}")),
            Scope::Malformed(segment) => {
                return Err(HttpError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("fleet {segment:?}: not valid percent-encoded UTF-8"),
                ));
            }
            Scope::Everywhere => (
                self.access.role_everywhere(),
                "every fleet (*), which server-wide resources need".to_string(),
            ),
            Scope::Me => (
                self.access.role_everywhere().or(Some(Role::Reader)),
                String::new(),
            ),
        };
        match role {
            Some(role) => {
                self.role = role;
                Ok(self)
            }
            None => Err(HttpError::new(
                axum::http::StatusCode::FORBIDDEN,
                "Forbidden",
                format!("{:?} has no role on {place}", self.subject),
            )),
        }
    }
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
            access: Access::Everywhere(Role::Admin),
            expires_at: None,
        }
    }

    /// Whether this is [`Caller::system`].
    pub fn is_system(&self) -> bool {
        self.token_hash.is_none()
            && self.expires_at.is_none()
            && self.subject == SYSTEM_SUBJECT
            && self.role == Role::Admin
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

/// Resolves the caller from `Authorization: Bearer …` (a JWT from an identity provider, or a
/// static token unless the server takes JWTs only), else from the dashboard's session cookie;
/// a write made with the cookie must carry the session's CSRF token (`X-CSRF-Token`).
pub async fn authenticate(
    state: &AppState,
    method: &axum::http::Method,
    headers: &HeaderMap,
) -> Result<Caller, HttpError> {
    if state.insecure {
        return Ok(Caller {
            subject: "anonymous".into(),
            role: Role::Admin,
            token_hash: None,
            access: Access::Everywhere(Role::Admin),
            expires_at: None,
        });
    }
    if headers.get(axum::http::header::AUTHORIZATION).is_none()
        && let Some(id) = crate::sessions::cookie(headers, crate::sessions::COOKIE)
    {
        return from_session(state, method, headers, id);
    }
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <token>"))?;
    let secret = value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .ok_or_else(|| unauthorized("the Authorization header must be Bearer <token>"))?;
    if crate::oidc::jwt::looks_like_jwt(secret) {
        return match state.oidc.authenticate(secret).await {
            Ok(identity) => Ok(caller_of(identity)),
            Err(crate::oidc::Denied::Unauthorized(reason)) => Err(unauthorized(&reason)),
            Err(crate::oidc::Denied::Forbidden(reason)) => Err(HttpError::new(
                axum::http::StatusCode::FORBIDDEN,
                "Forbidden",
                reason,
            )),
        };
    }
    if state.oidc.mode() == crate::oidc::AuthMode::OidcOnly {
        return Err(unauthorized(
            "this server takes identity provider tokens only (--auth oidc-only); static tokens are refused",
        ));
    }
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
        access: Access::Everywhere(role),
        expires_at: None,
    })
}

/// The caller a dashboard session is; a write needs its CSRF token.
fn from_session(
    state: &AppState,
    method: &axum::http::Method,
    headers: &HeaderMap,
    id: &str,
) -> Result<Caller, HttpError> {
    let session = state
        .sessions
        .get(id, now().unix())
        .ok_or_else(|| unauthorized("the dashboard session has ended; sign in again"))?;
    if !matches!(
        *method,
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    ) {
        let sent = headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !crate::oidc::equal_secrets(sent, &session.csrf) {
            return Err(HttpError::new(
                axum::http::StatusCode::FORBIDDEN,
                "Forbidden",
                "X-CSRF-Token: a write made with the session cookie must carry its CSRF token",
            ));
        }
    }
    // The roles come from the provider's mappings as they are now; a provider gone (or now
    // another issuer under the same name) ends the session.
    let issuer = state
        .oidc
        .find(&session.provider)
        .filter(|p| p.config.issuer == session.issuer);
    let Some(issuer) = issuer else {
        state.sessions.close(id);
        return Err(unauthorized(&format!(
            "identity provider {:?} is gone; the dashboard session has ended, sign in again",
            session.provider
        )));
    };
    let subject = issuer.config.subject(&session.claims);
    let grants = issuer.config.grants(&session.claims);
    if grants.is_empty() {
        return Err(HttpError::new(
            axum::http::StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{subject}: none of identity provider {}'s role mappings names your groups now",
                issuer.config.name
            ),
        ));
    }
    let access = Access::Grants(grants.into());
    Ok(Caller {
        subject,
        role: access.role_everywhere().unwrap_or(Role::Reader),
        token_hash: None,
        access,
        expires_at: Some(session.expires_at),
    })
}

/// The caller a verified identity is: until scoped, its role is the one it has on every
/// fleet, else the lowest (`Caller::scoped` decides per request).
pub fn caller_of(identity: crate::oidc::Identity) -> Caller {
    let access = Access::Grants(identity.grants.into());
    Caller {
        subject: identity.subject,
        role: access.role_everywhere().unwrap_or(Role::Reader),
        token_hash: None,
        access,
        expires_at: Some(identity.expires_at),
    }
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
                "this needs the {} role; {:?} has {} here",
                role.name(),
                caller.subject,
                caller.role.name()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oidc::config::{ProviderConfig, Source};
    use serde_json::{Value, json};

    fn provider(roles: Value) -> ProviderConfig {
        ProviderConfig::parse(
            "corp",
            Source::File,
            &json!({"issuer": "https://idp.example", "audience": "flotilla", "userClaim": "preferred_username", "roles": roles}),
            "identity-provider[0].",
        )
        .expect("valid")
    }

    #[test]
    fn groups_and_subjects_map_to_roles_per_fleet_and_nothing_else_does() {
        let corp = provider(json!([
            {"groups": ["everyone"], "role": "reader"},
            {"groups": ["release-managers"], "role": "approver", "fleets": ["prod-*"]},
            {"subjects": ["repo:acme/app:ref:refs/heads/main"], "role": "operator", "fleets": "staging"},
        ]));
        let claims_of = |v: Value| v.as_object().cloned().expect("object");
        let manager = claims_of(
            json!({"sub": "u-1", "groups": ["everyone", "release-managers"], "preferred_username": "alice"}),
        );
        let access = Access::Grants(corp.grants(&manager).into());
        assert_eq!(access.role_on("prod-eu"), Some(Role::Approver));
        assert_eq!(access.role_on("staging"), Some(Role::Reader));
        assert_eq!(access.role_everywhere(), Some(Role::Reader));
        assert_eq!(
            corp.subject(&manager),
            "alice (sub u-1, https://idp.example)"
        );
        let pipeline = claims_of(json!({"sub": "repo:acme/app:ref:refs/heads/main"}));
        let access = Access::Grants(corp.grants(&pipeline).into());
        assert_eq!(access.role_on("staging"), Some(Role::Operator));
        assert_eq!(access.role_on("prod-eu"), None);
        assert_eq!(access.role_everywhere(), None);
        // A valid token from a stranger: no grant at all (the API answers 403).
        let stranger = claims_of(
            json!({"sub": "repo:evil/app:ref:refs/heads/main", "groups": ["contractors"]}),
        );
        assert!(corp.grants(&stranger).is_empty());
    }

    #[test]
    fn a_scope_is_the_fleet_a_path_names_or_everything() {
        use axum::http::Method;
        assert_eq!(
            scope_of(&Method::GET, "/v1/fleets/prod-eu/updateRuns"),
            Scope::Fleet("prod-eu".into())
        );
        assert_eq!(
            scope_of(&Method::GET, "/v1/fleets/prod-eu"),
            Scope::Fleet("prod-eu".into())
        );
        assert_eq!(
            scope_of(&Method::PATCH, "/v1/fleets/prod-eu"),
            Scope::Fleet("prod-eu".into())
        );
        assert_eq!(
            scope_of(&Method::PUT, "/v1/fleets/prod-eu"),
            Scope::Everywhere
        );
        assert_eq!(
            scope_of(&Method::DELETE, "/v1/fleets/prod-eu"),
            Scope::Everywhere
        );
        assert_eq!(scope_of(&Method::GET, "/v1/fleets"), Scope::Everywhere);
        assert_eq!(scope_of(&Method::GET, "/v1/webhooks"), Scope::Everywhere);
        assert_eq!(scope_of(&Method::GET, "/v1/me"), Scope::Me);
        // The segment is decoded as the router decodes it.
        assert_eq!(
            scope_of(&Method::GET, "/v1/fleets/prod%2deu/updateRuns"),
            Scope::Fleet("prod-eu".into())
        );
        assert_eq!(
            scope_of(&Method::PATCH, "/v1/fleets/%70rod-eu"),
            Scope::Fleet("prod-eu".into())
        );
        assert_eq!(
            scope_of(&Method::GET, "/v1/fleets/prod%zz/updateRuns"),
            Scope::Malformed("prod%zz")
        );
        assert_eq!(
            scope_of(&Method::GET, "/v1/fleets/prod%ff"),
            Scope::Malformed("prod%ff")
        );
    }
}
