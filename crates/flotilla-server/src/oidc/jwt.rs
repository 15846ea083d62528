//! Compact JWS (RFC 7515) verification against a JSON Web Key (RFC 7517), and the claim checks
//! of a JWT (RFC 7519): no I/O, no clock (the instant is passed in).
//!
//! The algorithm is never chosen by the token: it must be one of the asymmetric algorithms
//! below, belong to the key's type (and curve), and equal the key's own `alg` when the key
//! names one. `none` and every HMAC algorithm are refused before any key is looked at, so a
//! token "signed" with an HS256 secret equal to the public key cannot pass.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value};

/// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY: i64 = 60;

/// The longest token read (a JWT with many groups is a few KiB; anything far larger is not one).
pub const TOKEN_MAX: usize = 64 * 1024;

/// Why a token is refused. The message names the check, never the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

fn refused(message: impl Into<String>) -> Refused {
    Refused(message.into())
}

/// The signature algorithms accepted (RFC 7518 names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
    Es256,
    Es384,
    EdDsa,
}

impl Algorithm {
    /// The accepted algorithm of that name; `none`, `HS*` and anything else are refused.
    pub fn parse(name: &str) -> Result<Algorithm, Refused> {
        Ok(match name {
            "RS256" => Algorithm::Rs256,
            "RS384" => Algorithm::Rs384,
            "RS512" => Algorithm::Rs512,
            "PS256" => Algorithm::Ps256,
            "PS384" => Algorithm::Ps384,
            "PS512" => Algorithm::Ps512,
            "ES256" => Algorithm::Es256,
            "ES384" => Algorithm::Es384,
            "EdDSA" => Algorithm::EdDsa,
            "none" => return Err(refused("alg \"none\": unsigned tokens are refused")),
            other if other.starts_with("HS") => {
                return Err(refused(format!(
                    "alg {other:?}: symmetric (HMAC) signatures are refused; an identity provider signs with its private key"
                )));
            }
            other => return Err(refused(format!("alg {other:?}: not an accepted algorithm"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Rs256 => "RS256",
            Algorithm::Rs384 => "RS384",
            Algorithm::Rs512 => "RS512",
            Algorithm::Ps256 => "PS256",
            Algorithm::Ps384 => "PS384",
            Algorithm::Ps512 => "PS512",
            Algorithm::Es256 => "ES256",
            Algorithm::Es384 => "ES384",
            Algorithm::EdDsa => "EdDSA",
        }
    }
}

/// A public key from a JWKS, checked when read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    P256 { point: Vec<u8> },
    P384 { point: Vec<u8> },
    Ed25519 { x: Vec<u8> },
}

/// One key of a JWKS: its id, the algorithm it is pinned to (if it says), the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jwk {
    pub kid: Option<String>,
    pub alg: Option<Algorithm>,
    pub key: PublicKey,
}

fn b64(field: &str, text: &str) -> Result<Vec<u8>, Refused> {
    URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| refused(format!("{field}: not base64url")))
}

/// Big-endian integers without their leading zero bytes (some providers send one).
fn unsigned(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    bytes.drain(..zeros.min(bytes.len().saturating_sub(1)));
    bytes
}

impl Jwk {
    /// The usable signing keys of a JWKS document (`{"keys": [...]}`): keys for encryption
    /// (`use: enc`), symmetric keys and keys of unknown types are left out; a malformed key is
    /// left out too (one bad key must not take the issuer's others with it).
    pub fn set(document: &Value) -> Result<Vec<Jwk>, Refused> {
        let keys = document
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| refused("the JWKS has no \"keys\" array"))?;
        Ok(keys.iter().filter_map(|k| Jwk::parse(k).ok()).collect())
    }

    pub fn parse(value: &Value) -> Result<Jwk, Refused> {
        let text = |name: &str| value.get(name).and_then(Value::as_str);
        if text("use").is_some_and(|u| u != "sig") {
            return Err(refused("not a signing key"));
        }
        let alg = text("alg").map(Algorithm::parse).transpose()?;
        let bytes = |name: &str| {
            text(name)
                .ok_or_else(|| refused(format!("key without {name:?}")))
                .and_then(|t| b64(name, t))
        };
        let key = match (text("kty"), text("crv")) {
            (Some("RSA"), _) => {
                let n = unsigned(bytes("n")?);
                if n.len() < 256 {
                    return Err(refused("RSA key shorter than 2048 bits"));
                }
                PublicKey::Rsa {
                    n,
                    e: unsigned(bytes("e")?),
                }
            }
            (Some("EC"), Some(crv @ ("P-256" | "P-384"))) => {
                let size = if crv == "P-256" { 32 } else { 48 };
                let (x, y) = (bytes("x")?, bytes("y")?);
                if x.len() != size || y.len() != size {
                    return Err(refused("EC key coordinates of the wrong length"));
                }
                let mut point = vec![4u8];
                point.extend(x);
                point.extend(y);
                if size == 32 {
                    PublicKey::P256 { point }
                } else {
                    PublicKey::P384 { point }
                }
            }
            (Some("OKP"), Some("Ed25519")) => PublicKey::Ed25519 { x: bytes("x")? },
            (kty, crv) => {
                return Err(refused(format!(
                    "key type {kty:?} (curve {crv:?}) is not supported"
                )));
            }
        };
        Ok(Jwk {
            kid: text("kid").map(str::to_string),
            alg,
            key,
        })
    }

    /// Whether this key may check a signature made with `alg`: the algorithm belongs to the
    /// key's type, and is the key's own if it names one.
    pub fn permits(&self, alg: Algorithm) -> bool {
        let family = matches!(
            (&self.key, alg),
            (
                PublicKey::Rsa { .. },
                Algorithm::Rs256
                    | Algorithm::Rs384
                    | Algorithm::Rs512
                    | Algorithm::Ps256
                    | Algorithm::Ps384
                    | Algorithm::Ps512
            ) | (PublicKey::P256 { .. }, Algorithm::Es256)
                | (PublicKey::P384 { .. }, Algorithm::Es384)
                | (PublicKey::Ed25519 { .. }, Algorithm::EdDsa)
        );
        family && self.alg.is_none_or(|own| own == alg)
    }

    fn verify(&self, alg: Algorithm, message: &[u8], signature: &[u8]) -> bool {
        use aws_lc_rs::signature as sig;
        if !self.permits(alg) {
            return false;
        }
        match &self.key {
            PublicKey::Rsa { n, e } => {
                let params = match alg {
                    Algorithm::Rs256 => &sig::RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::Rs384 => &sig::RSA_PKCS1_2048_8192_SHA384,
                    Algorithm::Rs512 => &sig::RSA_PKCS1_2048_8192_SHA512,
                    Algorithm::Ps256 => &sig::RSA_PSS_2048_8192_SHA256,
                    Algorithm::Ps384 => &sig::RSA_PSS_2048_8192_SHA384,
                    Algorithm::Ps512 => &sig::RSA_PSS_2048_8192_SHA512,
                    _ => return false,
                };
                sig::RsaPublicKeyComponents { n, e }
                    .verify(params, message, signature)
                    .is_ok()
            }
            PublicKey::P256 { point } => {
                sig::UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            PublicKey::P384 { point } => {
                sig::UnparsedPublicKey::new(&sig::ECDSA_P384_SHA384_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            PublicKey::Ed25519 { x } => sig::UnparsedPublicKey::new(&sig::ED25519, x)
                .verify(message, signature)
                .is_ok(),
        }
    }
}

/// A compact JWS split and decoded, not yet verified.
#[derive(Debug)]
pub struct Unverified {
    pub alg: Algorithm,
    pub kid: Option<String>,
    pub claims: Map<String, Value>,
    signing_input: String,
    signature: Vec<u8>,
}

/// Whether a bearer value has the shape of a JWT (three base64url parts, a JSON header).
pub fn looks_like_jwt(token: &str) -> bool {
    token.starts_with("eyJ") && token.split('.').count() == 3
}

impl Unverified {
    /// Splits and decodes a token. Refused: not three parts, not JSON objects, an algorithm
    /// not accepted (`none`, `HS*`), a `crit` header (no extension is understood), a JWE.
    pub fn parse(token: &str) -> Result<Unverified, Refused> {
        if token.len() > TOKEN_MAX {
            return Err(refused(format!(
                "the token is longer than {TOKEN_MAX} bytes"
            )));
        }
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(refused(
                "not a JWT (a signed JWT has three dot-separated parts)",
            ));
        };
        let object = |field: &str, text: &str| -> Result<Map<String, Value>, Refused> {
            match serde_json::from_slice(&b64(field, text)?) {
                Ok(Value::Object(map)) => Ok(map),
                _ => Err(refused(format!("{field}: not a JSON object"))),
            }
        };
        let head = object("header", header)?;
        if head.contains_key("crit") {
            return Err(refused("header crit: extensions are not supported"));
        }
        if head.contains_key("enc") {
            return Err(refused("encrypted tokens (JWE) are not accepted"));
        }
        let alg = head
            .get("alg")
            .and_then(Value::as_str)
            .ok_or_else(|| refused("header: no alg"))
            .and_then(Algorithm::parse)?;
        // Keys are only ever looked up in the issuer's JWKS: a key or a key URL carried by the
        // token itself is refused rather than ignored.
        for embedded in ["jwk", "jku", "x5u", "x5c"] {
            if head.contains_key(embedded) {
                return Err(refused(format!(
                    "header {embedded}: keys named by the token are not accepted"
                )));
            }
        }
        Ok(Unverified {
            alg,
            kid: head.get("kid").and_then(Value::as_str).map(str::to_string),
            claims: object("payload", payload)?,
            signing_input: format!("{header}.{payload}"),
            signature: b64("signature", signature)?,
        })
    }

    /// The `iss` claim, to find the issuer's keys (not trusted until verified).
    pub fn issuer(&self) -> Option<&str> {
        self.claims.get("iss").and_then(Value::as_str)
    }

    /// Verifies the signature with `key` and the claims against `expect` at `now` (seconds).
    pub fn verify(
        self,
        key: &Jwk,
        expect: &Expected<'_>,
        now: i64,
    ) -> Result<Map<String, Value>, Refused> {
        if !key.permits(self.alg) {
            return Err(refused(format!(
                "alg {}: not the algorithm of key {:?}",
                self.alg.name(),
                key.kid.as_deref().unwrap_or("")
            )));
        }
        if !key.verify(self.alg, self.signing_input.as_bytes(), &self.signature) {
            return Err(refused("the signature does not verify"));
        }
        check_claims(&self.claims, expect, now)?;
        Ok(self.claims)
    }
}

/// What a token's claims must say.
#[derive(Debug)]
pub struct Expected<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    /// An ID token's `nonce`, when the token answers a sign-in this server started.
    pub nonce: Option<&'a str>,
}

fn seconds(claims: &Map<String, Value>, name: &str) -> Result<Option<i64>, Refused> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
            .map(Some)
            .ok_or_else(|| refused(format!("{name}: not a number of seconds"))),
    }
}

/// `iss` exactly, `aud` (a string or a list) holding the audience, `exp` required and not
/// passed, `nbf` and `iat` not in the future, all with [`LEEWAY`]; `nonce` when expected.
pub fn check_claims(
    claims: &Map<String, Value>,
    expect: &Expected<'_>,
    now: i64,
) -> Result<(), Refused> {
    match claims.get("iss").and_then(Value::as_str) {
        Some(iss) if iss == expect.issuer => {}
        Some(iss) => {
            return Err(refused(format!(
                "iss {iss:?}: expected {:?}",
                expect.issuer
            )));
        }
        None => return Err(refused("no iss claim")),
    }
    let audience_ok = match claims.get("aud") {
        Some(Value::String(aud)) => aud == expect.audience,
        Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(expect.audience)),
        _ => return Err(refused("no aud claim")),
    };
    if !audience_ok {
        return Err(refused(format!(
            "aud {}: does not include {:?}",
            claims.get("aud").map(Value::to_string).unwrap_or_default(),
            expect.audience
        )));
    }
    let exp = seconds(claims, "exp")?.ok_or_else(|| refused("no exp claim"))?;
    if now > exp.saturating_add(LEEWAY) {
        return Err(refused(format!("expired {}s ago", now - exp)));
    }
    if let Some(nbf) = seconds(claims, "nbf")?
        && nbf > now.saturating_add(LEEWAY)
    {
        return Err(refused(format!(
            "not valid before {nbf} (in {}s)",
            nbf - now
        )));
    }
    if let Some(iat) = seconds(claims, "iat")?
        && iat > now.saturating_add(LEEWAY)
    {
        return Err(refused(format!(
            "issued in the future ({}s ahead)",
            iat - now
        )));
    }
    if let Some(nonce) = expect.nonce {
        let given = claims.get("nonce").and_then(Value::as_str).unwrap_or("");
        if !crate::oidc::equal_secrets(given, nonce) {
            return Err(refused("nonce: not the one this sign-in sent"));
        }
    }
    Ok(())
}
