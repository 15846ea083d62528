//! Tokens signed here with keys made here: every way a token must be refused, and the role
//! mapping.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::config::{ProviderConfig, Source};
use super::jwt::{Algorithm, Expected, Jwk, Unverified};
use crate::principal::Role;

const ISSUER: &str = "https://idp.example";
const AUDIENCE: &str = "flotilla";
const NOW: i64 = 1_800_000_000;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The `n` and `e` of a DER RSAPublicKey (SEQUENCE of two INTEGERs).
fn rsa_components(der: &[u8]) -> (Vec<u8>, Vec<u8>) {
    fn read(der: &[u8]) -> (u8, &[u8], &[u8]) {
        let tag = der[0];
        let (len, start) = if der[1] < 0x80 {
            (der[1] as usize, 2)
        } else {
            let count = (der[1] & 0x7f) as usize;
            let len = der[2..2 + count]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | *b as usize);
            (len, 2 + count)
        };
        (tag, &der[start..start + len], &der[start + len..])
    }
    let (_, sequence, _) = read(der);
    let (_, n, rest) = read(sequence);
    let (_, e, _) = read(rest);
    let strip = |v: &[u8]| {
        v.iter()
            .skip_while(|b| **b == 0)
            .copied()
            .collect::<Vec<_>>()
    };
    (strip(n), strip(e))
}

struct Rsa {
    pair: RsaKeyPair,
    kid: String,
}

impl Rsa {
    fn new(kid: &str) -> Rsa {
        Rsa {
            pair: RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).expect("RSA key"),
            kid: kid.into(),
        }
    }

    fn public_der(&self) -> Vec<u8> {
        self.pair.public_key().as_ref().to_vec()
    }

    fn jwk(&self) -> Value {
        let (n, e) = rsa_components(&self.public_der());
        json!({"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256", "n": b64(&n), "e": b64(&e)})
    }

    fn sign(&self, header: Value, claims: &Value) -> String {
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let mut sig = vec![0u8; self.pair.public_modulus_len()];
        self.pair
            .sign(
                &signature::RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                input.as_bytes(),
                &mut sig,
            )
            .expect("sign");
        format!("{input}.{}", b64(&sig))
    }

    fn token(&self, claims: &Value) -> String {
        self.sign(
            json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }
}

fn claims() -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "u-1", "exp": NOW + 300, "nbf": NOW - 10, "iat": NOW - 10, "groups": ["release-managers"], "preferred_username": "alice"})
}

fn with(mut base: Value, key: &str, value: Value) -> Value {
    base[key] = value;
    base
}

fn expected() -> Expected<'static> {
    Expected {
        issuer: ISSUER,
        audience: AUDIENCE,
        nonce: None,
    }
}

fn check(key: &Value, token: &str) -> Result<(), String> {
    let jwk = Jwk::parse(key).map_err(|e| e.0)?;
    Unverified::parse(token)
        .and_then(|t| t.verify(&jwk, &expected(), NOW))
        .map(|_| ())
        .map_err(|e| e.0)
}

fn refused_for(key: &Value, token: &str, reason: &str) {
    match check(key, token) {
        Ok(()) => panic!("accepted; expected a refusal for {reason}"),
        Err(e) => assert!(e.contains(reason), "{e:?} does not say {reason:?}"),
    }
}

#[test]
fn a_token_signed_by_the_key_with_the_right_claims_is_accepted() {
    let key = Rsa::new("k1");
    assert_eq!(check(&key.jwk(), &key.token(&claims())), Ok(()));
    // aud as a list holding the audience; exp just inside the leeway.
    let listed = with(claims(), "aud", json!(["other", AUDIENCE]));
    assert_eq!(check(&key.jwk(), &key.token(&listed)), Ok(()));
    let late = with(claims(), "exp", json!(NOW - 30));
    assert_eq!(check(&key.jwk(), &key.token(&late)), Ok(()));
}

#[test]
fn every_claim_is_checked() {
    let key = Rsa::new("k1");
    let jwk = key.jwk();
    refused_for(
        &jwk,
        &key.token(&with(claims(), "aud", json!("someone-else"))),
        "aud",
    );
    refused_for(
        &jwk,
        &key.token(&with(claims(), "iss", json!("https://evil.example"))),
        "iss",
    );
    refused_for(
        &jwk,
        &key.token(&with(claims(), "exp", json!(NOW - 120))),
        "expired",
    );
    refused_for(
        &jwk,
        &key.token(&with(claims(), "nbf", json!(NOW + 600))),
        "not valid before",
    );
    refused_for(
        &jwk,
        &key.token(&with(claims(), "iat", json!(NOW + 600))),
        "future",
    );
    let mut no_exp = claims();
    no_exp.as_object_mut().map(|m| m.remove("exp"));
    refused_for(&jwk, &key.token(&no_exp), "no exp");
    let mut no_aud = claims();
    no_aud.as_object_mut().map(|m| m.remove("aud"));
    refused_for(&jwk, &key.token(&no_aud), "no aud");
    refused_for(
        &jwk,
        &key.token(&with(claims(), "exp", json!("soon"))),
        "exp",
    );
}

#[test]
fn unsigned_and_symmetric_tokens_are_refused() {
    let key = Rsa::new("k1");
    let jwk = key.jwk();
    let body = b64(claims().to_string().as_bytes());
    let none = format!("{}.{body}.", b64(br#"{"alg":"none","typ":"JWT"}"#));
    refused_for(&jwk, &none, "none");
    // HS256 with the RSA public key (its DER, and its JWK's text) as the HMAC secret: the
    // classic confusion; refused by name before any key is used.
    for secret in [key.public_der(), jwk.to_string().into_bytes()] {
        let input = format!("{}.{body}", b64(br#"{"alg":"HS256","kid":"k1"}"#));
        let mac = aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &secret),
            input.as_bytes(),
        );
        refused_for(&jwk, &format!("{input}.{}", b64(mac.as_ref())), "HS256");
    }
}

#[test]
fn the_algorithm_must_be_the_keys() {
    let rsa = Rsa::new("k1");
    // An RS256 token checked against a key pinned to PS256, and against an EC key.
    let pinned = with(rsa.jwk(), "alg", json!("PS256"));
    refused_for(&pinned, &rsa.token(&claims()), "not the algorithm");
    let ec = EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_FIXED_SIGNING).expect("EC key");
    let point = ec.public_key().as_ref().to_vec();
    let ec_jwk = json!({"kty": "EC", "crv": "P-256", "kid": "k1", "x": b64(&point[1..33]), "y": b64(&point[33..])});
    refused_for(&ec_jwk, &rsa.token(&claims()), "not the algorithm");
    // The EC key's own ES256 token passes; the same token claiming RS256 does not.
    let input = format!(
        "{}.{}",
        b64(br#"{"alg":"ES256","kid":"k1"}"#),
        b64(claims().to_string().as_bytes())
    );
    let sig = ec
        .sign(&SystemRandom::new(), input.as_bytes())
        .expect("sign");
    let token = format!("{input}.{}", b64(sig.as_ref()));
    assert_eq!(check(&ec_jwk, &token), Ok(()));
    let relabelled = format!(
        "{}.{}.{}",
        b64(br#"{"alg":"RS256","kid":"k1"}"#),
        b64(claims().to_string().as_bytes()),
        b64(sig.as_ref())
    );
    refused_for(&ec_jwk, &relabelled, "not the algorithm");
}

#[test]
fn a_signature_by_another_key_or_over_other_claims_is_refused() {
    let key = Rsa::new("k1");
    let other = Rsa::new("k1");
    refused_for(&key.jwk(), &other.token(&claims()), "signature");
    let token = key.token(&claims());
    let parts: Vec<&str> = token.split('.').collect();
    let forged = b64(with(claims(), "groups", json!(["admins"]))
        .to_string()
        .as_bytes());
    refused_for(
        &key.jwk(),
        &format!("{}.{forged}.{}", parts[0], parts[2]),
        "signature",
    );
}

#[test]
fn tokens_naming_their_own_keys_or_extensions_are_refused() {
    let key = Rsa::new("k1");
    let jwk = key.jwk();
    let embedded = key.sign(json!({"alg": "RS256", "kid": "k1", "jwk": jwk}), &claims());
    refused_for(&jwk, &embedded, "jwk");
    let jku = key.sign(
        json!({"alg": "RS256", "jku": "https://evil.example/keys"}),
        &claims(),
    );
    refused_for(&jwk, &jku, "jku");
    let crit = key.sign(json!({"alg": "RS256", "crit": ["exp"]}), &claims());
    refused_for(&jwk, &crit, "crit");
    refused_for(&jwk, "eyJhbGciOiJSUzI1NiJ9.e30", "three");
    refused_for(&jwk, "eyJhbGciOiJSUzI1NiJ9.!!!.e30", "base64url");
}

#[test]
fn weak_or_unknown_keys_are_not_read() {
    let short = json!({"kty": "RSA", "n": b64(&[0xc5; 128]), "e": "AQAB"});
    assert!(Jwk::parse(&short).is_err());
    let oct = json!({"kty": "oct", "k": "c2VjcmV0"});
    assert!(Jwk::parse(&oct).is_err());
    let enc = with(Rsa::new("k").jwk(), "use", json!("enc"));
    assert!(Jwk::parse(&enc).is_err());
    let set = json!({"keys": [oct, Rsa::new("k2").jwk()]});
    assert_eq!(Jwk::set(&set).map(|k| k.len()), Ok(1));
    assert!(Algorithm::parse("HS512").is_err());
    assert!(Algorithm::parse("none").is_err());
}

#[test]
fn the_nonce_of_an_id_token_must_be_the_one_sent() {
    let key = Rsa::new("k1");
    let jwk = Jwk::parse(&key.jwk()).expect("key");
    let token = key.token(&with(claims(), "nonce", json!("n-123")));
    let expect = |nonce| Expected {
        issuer: ISSUER,
        audience: AUDIENCE,
        nonce: Some(nonce),
    };
    let verify =
        |nonce| Unverified::parse(&token).and_then(|t| t.verify(&jwk, &expect(nonce), NOW));
    assert!(verify("n-123").is_ok());
    assert!(verify("n-124").is_err());
}

fn provider(roles: Value) -> ProviderConfig {
    ProviderConfig::parse(
        "corp",
        Source::File,
        &json!({"issuer": ISSUER, "audience": AUDIENCE, "userClaim": "preferred_username", "roles": roles}),
        "identity-provider[0].",
    )
    .expect("valid")
}

#[test]
fn groups_and_subjects_grant_roles_on_fleet_patterns() {
    let corp = provider(json!([
        {"groups": ["everyone"], "role": "reader"},
        {"groups": ["release-managers"], "role": "approver", "fleets": ["prod-*"]},
    ]));
    let claims =
        json!({"sub": "u-1", "groups": ["release-managers"], "preferred_username": "alice"});
    let grants = corp.grants(claims.as_object().expect("object"));
    assert_eq!(grants.len(), 1);
    assert_eq!(
        (grants[0].fleets.as_str(), grants[0].role),
        ("prod-*", Role::Approver)
    );
}

#[test]
fn bad_configuration_names_the_field_and_the_value() {
    let parse = |v: Value| {
        ProviderConfig::parse("corp", Source::Api, &v, "properties.")
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let base = json!({"issuer": ISSUER, "audience": AUDIENCE});
    assert_eq!(parse(base.clone()), Ok(()));
    let cases = [
        (
            with(base.clone(), "issuer", json!("http://idp.example")),
            "properties.issuer: \"http://idp.example\": must be https://",
        ),
        (
            with(base.clone(), "issuer", json!("not a url")),
            "properties.issuer: \"not a url\": not a URL",
        ),
        (
            with(base.clone(), "audience", json!(7)),
            "properties.audience: 7: must be a non-empty string",
        ),
        (
            with(
                base.clone(),
                "roles",
                json!([{"groups": ["g"], "role": "boss"}]),
            ),
            "properties.roles[0].role: \"boss\": must be reader, operator, approver or admin",
        ),
        (
            with(base.clone(), "roles", json!([{"role": "reader"}])),
            "properties.roles[0]: needs groups or subjects",
        ),
        (
            with(
                base.clone(),
                "roles",
                json!([{"groups": ["g"], "role": "reader", "fleets": ["prod/*"]}]),
            ),
            "properties.roles[0].fleets[0]: \"prod/*\"",
        ),
        (
            with(base.clone(), "clientSecret", json!("hunter2")),
            "properties.clientSecret: must be {\"env\"",
        ),
        (
            with(base.clone(), "colour", json!("blue")),
            "properties.colour: unknown field",
        ),
    ];
    for (value, message) in cases {
        let got = parse(value).expect_err(message);
        assert!(
            got.starts_with(message),
            "{got:?} does not start with {message:?}"
        );
    }
    assert!(parse(with(base.clone(), "issuer", json!("http://127.0.0.1:9000"))).is_ok());
    assert!(ProviderConfig::parse("Corp!", Source::Api, &base, "").is_err());
}

#[test]
fn glob_matches_runs_of_characters() {
    use super::config::glob;
    assert!(glob("*", ""));
    assert!(glob("prod-*", "prod-eu"));
    assert!(!glob("prod-*", "staging"));
    assert!(glob("*-eu-*", "prod-eu-1"));
    assert!(!glob("a*b", "acbd"));
    assert!(glob("a*b*c", "axxbyyc"));
}

#[test]
fn through_the_api_a_secret_is_read_from_the_providers_own_variable_only() {
    let with_secret = |secret: Value| json!({"issuer": ISSUER, "audience": AUDIENCE, "clientId": "c", "clientSecret": secret});
    let parse = |source, secret| {
        ProviderConfig::parse("corp-eu", source, &with_secret(secret), "properties.")
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let refused = parse(Source::Api, json!({"env": "AWS_SECRET_ACCESS_KEY"})).expect_err("env");
    assert!(
        refused.starts_with("properties.clientSecret.env: \"AWS_SECRET_ACCESS_KEY\": through the API, only \"FLOTILLA_OIDC_CORP_EU_SECRET\""),
        "{refused}"
    );
    // Another provider's variable (the configuration file's, say) is refused too.
    let refused = parse(Source::Api, json!({"env": "FLOTILLA_OIDC_SECRET"})).expect_err("env");
    assert!(
        refused.starts_with("properties.clientSecret.env: \"FLOTILLA_OIDC_SECRET\": through the API, only \"FLOTILLA_OIDC_CORP_EU_SECRET\""),
        "{refused}"
    );
    let refused = parse(Source::Api, json!({"env": "FLOTILLA_OIDC_CORP_SECRET"})).expect_err("env");
    assert!(
        refused.contains("FLOTILLA_OIDC_CORP_EU_SECRET"),
        "{refused}"
    );
    let refused = parse(Source::Api, json!({"file": "/etc/shadow"})).expect_err("file");
    assert!(
        refused.starts_with(
            "properties.clientSecret.file: a file is named in the configuration file only"
        ),
        "{refused}"
    );
    assert_eq!(
        parse(Source::Api, json!({"env": "FLOTILLA_OIDC_CORP_EU_SECRET"})),
        Ok(())
    );
    // The configuration file's author may name any variable or a file.
    assert_eq!(parse(Source::File, json!({"env": "CORP_SECRET"})), Ok(()));
    assert_eq!(
        parse(Source::File, json!({"file": "/etc/flotilla/secret"})),
        Ok(())
    );
}

#[test]
fn an_origin_is_scheme_host_and_port() {
    use super::same_origin;
    assert!(same_origin(
        "https://idp.example/tenant/v2.0",
        "https://idp.example/oauth2/token"
    ));
    assert!(same_origin(
        "https://idp.example",
        "https://idp.example:443/token"
    ));
    assert!(!same_origin(
        "https://idp.example",
        "http://idp.example/token"
    ));
    assert!(!same_origin(
        "https://idp.example",
        "https://idp.example:8443/token"
    ));
    assert!(!same_origin(
        "https://idp.example",
        "https://evil.example/token"
    ));
    assert!(!same_origin(
        "https://idp.example",
        "https://idp.example.evil.example/token"
    ));
    assert!(!same_origin("https://idp.example", "not a url"));
}
