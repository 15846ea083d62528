//! OpenID Connect: bearer JWTs from the configured identity providers, verified completely
//! (signature by the issuer's published keys, `iss`, `aud`, `exp`/`nbf`, the algorithm pinned
//! to the key), and turned into a caller with the roles its groups or subject are mapped to.
//!
//! Each provider's discovery document and keys are fetched and kept (`keys`: when to fetch
//! again); keys rotate without a restart. A refusal names its reason in the 401 and the log,
//! never the token.

pub mod config;
pub mod jwt;
pub mod keys;

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use self::config::{Grant, ProviderConfig, Source};
use self::jwt::{Expected, Refused, Unverified};
use self::keys::{KeyCache, Lookup};

/// Which credentials the server takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Static tokens and identity providers' JWTs.
    #[default]
    Any,
    /// Identity providers' JWTs only: static tokens are refused (`--auth oidc-only`).
    OidcOnly,
}

/// Compares two secrets in time independent of where they differ.
pub fn equal_secrets(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The endpoints of a provider's discovery document that Flotilla uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    pub jwks_uri: String,
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: Option<String>,
    pub device_authorization_endpoint: Option<String>,
    pub end_session_endpoint: Option<String>,
}

/// One configured provider with its keys as last fetched.
pub struct Issuer {
    pub config: ProviderConfig,
    keys: tokio::sync::Mutex<KeyCache>,
    discovery: tokio::sync::Mutex<Option<Discovery>>,
}

impl Issuer {
    pub fn new(config: ProviderConfig) -> Issuer {
        Issuer {
            config,
            keys: tokio::sync::Mutex::new(KeyCache::default()),
            discovery: tokio::sync::Mutex::new(None),
        }
    }
}

/// Who a verified token names and what it may do.
#[derive(Clone, Debug)]
pub struct Identity {
    pub subject: String,
    pub grants: Vec<Grant>,
    /// `exp`, in seconds since the epoch.
    pub expires_at: i64,
    pub provider: String,
}

/// Why a token was not taken: 401 (not valid) or 403 (valid, but mapped to no role).
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    Unauthorized(String),
    Forbidden(String),
}

/// The largest discovery document or JWKS read.
const DOCUMENT_MAX: usize = 1 << 20;

/// The identity providers, those of the configuration file and those made through the API.
pub struct Oidc {
    mode: RwLock<AuthMode>,
    providers: RwLock<Vec<Arc<Issuer>>>,
    http: reqwest::Client,
}

impl Default for Oidc {
    fn default() -> Oidc {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Oidc {
            mode: RwLock::new(AuthMode::Any),
            providers: RwLock::new(Vec::new()),
            http,
        }
    }
}

impl Oidc {
    /// Sets the mode and the configuration file's providers (once, when serving starts).
    pub fn configure(&self, mode: AuthMode, from_file: Vec<ProviderConfig>) {
        if let Ok(mut held) = self.mode.write() {
            *held = mode;
        }
        if let Ok(mut providers) = self.providers.write() {
            providers.retain(|p| p.config.source == Source::Api);
            let file: Vec<Arc<Issuer>> = from_file
                .into_iter()
                .map(|c| Arc::new(Issuer::new(c)))
                .collect();
            providers.splice(0..0, file);
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode.read().map(|m| *m).unwrap_or(AuthMode::OidcOnly)
    }

    pub fn providers(&self) -> Vec<Arc<Issuer>> {
        self.providers.read().map(|p| p.clone()).unwrap_or_default()
    }

    pub fn find(&self, name: &str) -> Option<Arc<Issuer>> {
        self.providers().into_iter().find(|p| p.config.name == name)
    }

    /// Whether any provider is configured.
    pub fn any(&self) -> bool {
        !self.providers().is_empty()
    }

    /// Lays the API-defined providers over the file's: those unchanged keep their keys.
    pub fn set_from_api(&self, configs: Vec<ProviderConfig>) {
        let Ok(mut providers) = self.providers.write() else {
            return;
        };
        let old = std::mem::take(&mut *providers);
        let mut next: Vec<Arc<Issuer>> = old
            .iter()
            .filter(|p| p.config.source == Source::File)
            .cloned()
            .collect();
        for config in configs {
            if next.iter().any(|p| p.config.name == config.name) {
                continue;
            }
            match old.iter().find(|p| p.config == config) {
                Some(same) => next.push(same.clone()),
                None => next.push(Arc::new(Issuer::new(config))),
            }
        }
        *providers = next;
    }

    async fn get_json(&self, url: &str) -> Result<Value, String> {
        let mut response = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: {}", response.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > DOCUMENT_MAX {
                return Err(format!("GET {url}: larger than {DOCUMENT_MAX} bytes"));
            }
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON ({e})"))
    }

    /// The provider's discovery document (fetched once, then kept; fetched again with its
    /// keys).
    pub async fn discovery(&self, issuer: &Issuer) -> Result<Discovery, String> {
        let mut held = issuer.discovery.lock().await;
        if let Some(found) = held.as_ref() {
            return Ok(found.clone());
        }
        let fetched = self.fetch_discovery(&issuer.config.issuer).await?;
        *held = Some(fetched.clone());
        Ok(fetched)
    }

    async fn fetch_discovery(&self, issuer: &str) -> Result<Discovery, String> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let document = self.get_json(&url).await?;
        let text = |name: &str| {
            document
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        // OpenID Connect Discovery §4.3: the document's issuer is the one asked about.
        if text("issuer").as_deref() != Some(issuer) {
            return Err(format!(
                "{url}: its issuer {:?} is not {issuer:?}",
                text("issuer").unwrap_or_default()
            ));
        }
        let jwks_uri = text("jwks_uri").ok_or_else(|| format!("{url}: no jwks_uri"))?;
        // Every endpoint follows the issuer's scheme rule: keys over plain http from afar could
        // be swapped in transit, and a sign-in sent there could be read. (The token endpoint
        // must also be on the issuer's origin: `exchange_code` checks it where it is used, as
        // some providers' JWTs are verified here without it.)
        for (name, endpoint) in [
            ("jwks_uri", Some(&jwks_uri)),
            (
                "authorization_endpoint",
                text("authorization_endpoint").as_ref(),
            ),
            ("token_endpoint", text("token_endpoint").as_ref()),
            (
                "device_authorization_endpoint",
                text("device_authorization_endpoint").as_ref(),
            ),
            (
                "end_session_endpoint",
                text("end_session_endpoint").as_ref(),
            ),
        ] {
            if let Some(endpoint) = endpoint {
                let ok = reqwest::Url::parse(endpoint)
                    .is_ok_and(|parsed| config::https_or_loopback(&parsed));
                if !ok {
                    return Err(format!(
                        "{url}: its {name} {endpoint:?} must be https:// (http:// only on a loopback address)"
                    ));
                }
            }
        }
        Ok(Discovery {
            jwks_uri,
            authorization_endpoint: text("authorization_endpoint"),
            token_endpoint: text("token_endpoint"),
            device_authorization_endpoint: text("device_authorization_endpoint"),
            end_session_endpoint: text("end_session_endpoint"),
        })
    }

    /// The key for a token, fetching the issuer's keys when [`KeyCache`] says so.
    async fn key_for(&self, issuer: &Issuer, token: &Unverified) -> Result<jwt::Jwk, Refused> {
        let mut cache = issuer.keys.lock().await;
        for _ in 0..2 {
            match cache.lookup(token.kid.as_deref(), token.alg, Instant::now()) {
                Lookup::Found(key) => return Ok(key),
                Lookup::Unknown => break,
                Lookup::Fetch => {
                    cache.attempted(Instant::now());
                    let fetched = async {
                        let discovery = self.fetch_discovery(&issuer.config.issuer).await?;
                        let set = self.get_json(&discovery.jwks_uri).await?;
                        *issuer.discovery.lock().await = Some(discovery);
                        jwt::Jwk::set(&set).map_err(|e| e.0)
                    }
                    .await;
                    match fetched {
                        Ok(keys) => {
                            tracing::info!(provider = %issuer.config.name, keys = keys.len(), "identity provider keys fetched");
                            cache.fetched(keys, Instant::now());
                        }
                        Err(e) => {
                            tracing::warn!(provider = %issuer.config.name, error = %e, "cannot fetch the identity provider's keys");
                        }
                    }
                }
            }
        }
        Err(Refused(format!(
            "no key {:?} in the keys of {} (fetched again at most every {} s)",
            token.kid.as_deref().unwrap_or(""),
            issuer.config.issuer,
            keys::REFETCH_AFTER.as_secs()
        )))
    }

    /// Verifies a token from `issuer` for `audience` (and `nonce`, for an ID token).
    pub async fn verify(
        &self,
        issuer: &Issuer,
        token: &str,
        audience: &str,
        nonce: Option<&str>,
    ) -> Result<Map<String, Value>, Refused> {
        let parsed = Unverified::parse(token)?;
        let key = self.key_for(issuer, &parsed).await?;
        let expect = Expected {
            issuer: &issuer.config.issuer,
            audience,
            nonce,
        };
        parsed.verify(&key, &expect, crate::clock::now().unix())
    }

    /// The authorization code of a dashboard sign-in exchanged at the provider's token
    /// endpoint (with the PKCE verifier and the client's secret, if it has one), and the ID
    /// token it answers verified (audience: the client; the sign-in's nonce): its claims and
    /// the token itself.
    pub async fn exchange_code(
        &self,
        issuer: &Issuer,
        code: &str,
        redirect_uri: &str,
        verifier: &str,
        nonce: &str,
    ) -> Result<(Map<String, Value>, String), String> {
        let config = &issuer.config;
        let client_id = config
            .client_id
            .as_deref()
            .ok_or_else(|| format!("identity provider {} has no clientId", config.name))?;
        let discovery = self.discovery(issuer).await?;
        let endpoint = discovery.token_endpoint.ok_or_else(|| {
            format!(
                "{}: the discovery document names no token_endpoint",
                config.issuer
            )
        })?;
        // The code, the PKCE verifier and the client's secret go to the issuer's own origin
        // only: a discovery document (or an API-made provider) must not send them elsewhere.
        if !same_origin(&config.issuer, &endpoint) {
            return Err(format!(
                "{}: its token_endpoint {endpoint:?} is not on the issuer's origin (scheme, host and port); the code and the client secret are not sent there",
                config.issuer
            ));
        }
        let mut pairs = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ];
        let secret = config
            .client_secret
            .as_ref()
            .map(|s| s.read())
            .transpose()?;
        if secret.is_none() {
            pairs.push(("client_id", client_id));
        }
        let mut request = self
            .http
            .post(&endpoint)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body(form_body(&pairs)?);
        if let Some(secret) = &secret {
            // RFC 6749 §2.3.1: both form-encoded, then Basic.
            request = request.basic_auth(form_value(client_id)?, Some(form_value(secret)?));
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("POST {endpoint}: {e}"))?;
        let status = response.status();
        let answer: Value = response
            .json()
            .await
            .map_err(|e| format!("POST {endpoint}: {status}, not JSON ({e})"))?;
        if !status.is_success() {
            return Err(format!(
                "POST {endpoint}: {status} {} {}",
                answer["error"].as_str().unwrap_or(""),
                answer["error_description"].as_str().unwrap_or("")
            ));
        }
        let id_token = answer["id_token"]
            .as_str()
            .ok_or_else(|| format!("POST {endpoint}: no id_token in the answer"))?
            .to_string();
        let claims = self
            .verify(issuer, &id_token, client_id, Some(nonce))
            .await
            .map_err(|e| format!("the ID token is not valid: {}", e.0))?;
        Ok((claims, id_token))
    }

    /// A bearer JWT from one of the providers: who it names and what it is granted.
    pub async fn authenticate(&self, token: &str) -> Result<Identity, Denied> {
        let unauthorized = |reason: String| {
            tracing::info!(reason = %reason, "bearer JWT refused");
            Denied::Unauthorized(format!("the token is not valid: {reason}"))
        };
        let parsed = Unverified::parse(token).map_err(|e| unauthorized(e.0))?;
        let iss = parsed.issuer().unwrap_or("").to_string();
        let issuer = self
            .providers()
            .into_iter()
            .find(|p| p.config.issuer == iss)
            .ok_or_else(|| {
                unauthorized(format!("iss {iss:?}: no identity provider has that issuer"))
            })?;
        let audience = issuer.config.audience.clone();
        let claims = self
            .verify(&issuer, token, &audience, None)
            .await
            .map_err(|e| unauthorized(format!("{} ({})", e.0, issuer.config.name)))?;
        let subject = issuer.config.subject(&claims);
        let grants = issuer.config.grants(&claims);
        if grants.is_empty() {
            tracing::info!(subject = %subject, provider = %issuer.config.name, "bearer JWT maps to no role");
            return Err(Denied::Forbidden(format!(
                "{subject}: the token is valid but none of identity provider {}'s role mappings names its groups or subject",
                issuer.config.name
            )));
        }
        Ok(Identity {
            subject,
            grants,
            expires_at: claims.get("exp").and_then(Value::as_i64).unwrap_or(0),
            provider: issuer.config.name.clone(),
        })
    }
}

/// Whether two URLs share scheme, host and port (an unparsable one shares nothing).
pub fn same_origin(a: &str, b: &str) -> bool {
    match (reqwest::Url::parse(a), reqwest::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin().is_tuple() && a.origin() == b.origin(),
        _ => false,
    }
}

/// `application/x-www-form-urlencoded` pairs.
pub fn form_body(pairs: &[(&str, &str)]) -> Result<String, String> {
    let mut url = reqwest::Url::parse("http://form.invalid/").map_err(|e| e.to_string())?;
    url.query_pairs_mut().extend_pairs(pairs);
    Ok(url.query().unwrap_or_default().to_string())
}

fn form_value(text: &str) -> Result<String, String> {
    form_body(&[("v", text)]).map(|b| b.trim_start_matches("v=").to_string())
}

/// A PKCE verifier (RFC 7636: 43 characters of base64url from 32 random bytes) and its S256
/// challenge.
pub fn pkce() -> Result<(String, String), String> {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use sha2::Digest;
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| "no random source".to_string())?;
    let verifier = URL_SAFE_NO_PAD.encode(bytes);
    let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()));
    Ok((verifier, challenge))
}

#[cfg(test)]
mod tests;
