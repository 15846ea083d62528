//! Bearer JWTs over real HTTP: a server on loopback with identity providers whose discovery
//! document and keys are served here (keys made and tokens signed by this test), so that each
//! refusal can be made on purpose: wrong audience or issuer, `alg: none`, HS256 signed with the
//! public key, expired, not yet valid, an unknown key id (fetched at most every 30 s), a valid
//! token mapped to no role. The real OpenID provider's flows are `crates/flotilla/tests/oidc.rs`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, KeyPair, RsaKeyPair};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use flotilla_server::Server;
use flotilla_server::auth::{Role, new_token};
use flotilla_server::oidc::AuthMode;
use flotilla_server::oidc::config::{ProviderConfig, Source};
use flotilla_server::store::SqliteStore;
use flotilla_server::store::prelude::*;

const AUDIENCE: &str = "flotilla-api";

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `n` and `e` of a DER RSAPublicKey.
fn rsa_components(der: &[u8]) -> (Vec<u8>, Vec<u8>) {
    fn read(der: &[u8]) -> (&[u8], &[u8]) {
        let (len, start) = if der[1] < 0x80 {
            (der[1] as usize, 2)
        } else {
            let count = (der[1] & 0x7f) as usize;
            let len = der[2..2 + count]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | *b as usize);
            (len, 2 + count)
        };
        (&der[start..start + len], &der[start + len..])
    }
    let (sequence, _) = read(der);
    let (n, rest) = read(sequence);
    let (e, _) = read(rest);
    let strip = |v: &[u8]| {
        v.iter()
            .skip_while(|b| **b == 0)
            .copied()
            .collect::<Vec<_>>()
    };
    (strip(n), strip(e))
}

struct Key {
    pair: RsaKeyPair,
    kid: String,
}

impl Key {
    fn new(kid: &str) -> Key {
        Key {
            pair: RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).expect("RSA key"),
            kid: kid.into(),
        }
    }

    fn jwk(&self) -> Value {
        let (n, e) = rsa_components(self.pair.public_key().as_ref());
        json!({"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256", "n": b64(&n), "e": b64(&e)})
    }

    fn sign(&self, header: &Value, claims: &Value) -> String {
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
        self.sign(&json!({"alg": "RS256", "kid": self.kid}), claims)
    }
}

/// A provider's two documents, served on loopback; its keys can be changed, its JWKS reads are
/// counted.
struct Provider {
    issuer: String,
    keys: Arc<Mutex<Value>>,
    jwks_reads: Arc<AtomicUsize>,
}

async fn provider() -> Provider {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let issuer = format!("http://{}", listener.local_addr().expect("addr"));
    let keys = Arc::new(Mutex::new(json!({"keys": []})));
    let jwks_reads = Arc::new(AtomicUsize::new(0));
    let discovery = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks")});
    let (held, reads) = (keys.clone(), jwks_reads.clone());
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || {
                let d = discovery.clone();
                async move { axum::Json(d) }
            }),
        )
        .route(
            "/jwks",
            axum::routing::get(move || {
                reads.fetch_add(1, Ordering::SeqCst);
                let k = held.lock().expect("keys").clone();
                async move { axum::Json(k) }
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Provider {
        issuer,
        keys,
        jwks_reads,
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Flotilla {
    base: String,
    admin: String,
    state: Arc<flotilla_server::state::AppState>,
    http: reqwest::Client,
    _dir: TempDir,
}

fn corp(issuer: &str) -> ProviderConfig {
    ProviderConfig::parse(
        "corp",
        Source::File,
        &json!({
            "issuer": issuer, "audience": AUDIENCE, "userClaim": "preferred_username",
            "roles": [
                {"groups": ["everyone"], "role": "reader"},
                {"groups": ["release-managers"], "role": "approver", "fleets": ["prod-*"]},
                {"groups": ["platform"], "role": "admin"},
                {"subjects": ["pipeline-deploy"], "role": "operator", "fleets": ["staging"]},
            ]
        }),
        "identity-provider[0].",
    )
    .expect("valid provider")
}

async fn flotilla(name: &str, mode: AuthMode, providers: Vec<ProviderConfig>) -> Flotilla {
    let dir = std::env::temp_dir().join(format!(
        "flotilla-oidc-{name}-{}-{:?}",
        std::process::id(),
        Instant::now()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let store = SqliteStore::open(&dir.join("flotilla.db"))
        .await
        .expect("store");
    let (admin, record) = new_token(Role::Admin, "break-glass").expect("token");
    store.create_token(&record).await.expect("stored");
    let store: Arc<dyn Store> = Arc::new(store);
    let server = Server::start_with(
        store,
        "127.0.0.1:0".parse().expect("addr"),
        false,
        flotilla_server::Timing {
            profiles_every: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await
    .expect("server");
    server.state.oidc.configure(mode, providers);
    let state = server.state.clone();
    let base = format!("http://{}", server.local_addr().expect("bound"));
    tokio::spawn(server.serve(std::future::pending()));
    Flotilla {
        base,
        admin,
        state,
        http: reqwest::Client::new(),
        _dir: TempDir(dir),
    }
}

impl Flotilla {
    async fn call(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("sent");
        let status = response.status();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `GET path` with a dashboard session's cookie.
    async fn with_cookie(&self, session: &str, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", format!("flotilla_session={session}"))
            .send()
            .await
            .expect("sent");
        let status = response.status();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn fleet(&self, name: &str) {
        let body = json!({"properties": {"driver": {"type": "sim", "timeScale": 6000,
            "catalog": {"eastus": {"kubernetes": [{"version": "1.30.5"}]}}, "clusters": {}}}});
        let (status, answer) = self
            .call(
                &self.admin,
                Method::PUT,
                &format!("/v1/fleets/{name}"),
                Some(body),
            )
            .await;
        assert!(status.is_success(), "{status} {answer}");
    }
}

fn claims(issuer: &str, sub: &str, groups: &[&str]) -> Value {
    json!({"iss": issuer, "aud": AUDIENCE, "sub": sub, "preferred_username": format!("{sub}@example.com"),
        "groups": groups, "iat": now(), "nbf": now() - 5, "exp": now() + 300})
}

fn with(mut base: Value, key: &str, value: Value) -> Value {
    base[key] = value;
    base
}

fn message(answer: &Value) -> String {
    answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn roles_follow_the_mappings_per_fleet_and_the_audit_names_the_person() {
    let idp = provider().await;
    let key = Key::new("k1");
    *idp.keys.lock().expect("keys") = json!({"keys": [key.jwk()]});
    let f = flotilla("roles", AuthMode::Any, vec![corp(&idp.issuer)]).await;
    f.fleet("prod-eu").await;
    f.fleet("staging").await;

    let manager = key.token(&claims(
        &idp.issuer,
        "u-1",
        &["everyone", "release-managers"],
    ));
    let (status, me) = f.call(&manager, Method::GET, "/v1/me", None).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        me["subject"],
        json!(format!("u-1@example.com (sub u-1, {})", idp.issuer))
    );
    assert_eq!(me["role"], json!("reader"));
    assert!(
        me["grants"]
            .as_array()
            .is_some_and(|g| g.contains(&json!({"fleets": "prod-*", "role": "approver"}))),
        "{me}"
    );
    // Approver on prod-*, reader elsewhere, nothing server-wide beyond reading.
    assert_eq!(
        f.call(&manager, Method::GET, "/v1/fleets/prod-eu", None)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        f.call(&manager, Method::GET, "/v1/fleets", None).await.0,
        StatusCode::OK
    );
    let strategy =
        json!({"properties": {"strategy": {"stages": [{"name": "s", "groups": [{"name": "g"}]}]}}});
    let (status, answer) = f
        .call(
            &manager,
            Method::PUT,
            "/v1/fleets/prod-eu/updateStrategies/s",
            Some(strategy.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = f
        .call(
            &manager,
            Method::PUT,
            "/v1/fleets/staging/updateStrategies/s",
            Some(strategy.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    for server_wide in [
        "/v1/webhooks",
        "/v1/audit",
        "/v1/identityProviders",
        "/v1/tokens",
    ] {
        assert_eq!(
            f.call(&manager, Method::GET, server_wide, None).await.0,
            StatusCode::FORBIDDEN,
            "{server_wide}"
        );
    }
    assert_eq!(
        f.call(&manager, Method::DELETE, "/v1/fleets/prod-eu", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );

    // A pipeline: operator on staging only, by its subject.
    let pipeline = key.token(
        &json!({"iss": idp.issuer, "aud": AUDIENCE, "sub": "pipeline-deploy", "exp": now() + 300}),
    );
    let (status, answer) = f
        .call(
            &pipeline,
            Method::PUT,
            "/v1/fleets/staging/updateStrategies/p",
            Some(strategy.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = f
        .call(&pipeline, Method::GET, "/v1/fleets/prod-eu", None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert!(
        message(&answer).contains("no role on fleet \"prod-eu\""),
        "{answer}"
    );
    // The fleet is matched as the router decodes it: percent-encoded, it is the same fleet.
    let (status, answer) = f
        .call(&pipeline, Method::GET, "/v1/fleets/prod%2Deu", None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert!(
        message(&answer).contains("no role on fleet \"prod-eu\""),
        "{answer}"
    );
    let (status, answer) = f
        .call(
            &pipeline,
            Method::PUT,
            "/v1/fleets/st%61ging/updateStrategies/p2",
            Some(strategy.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = f
        .call(&pipeline, Method::GET, "/v1/fleets/staging%zz", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

    // A valid token that no mapping names: 403, never a default role.
    let stranger = key.token(&claims(&idp.issuer, "u-9", &["contractors"]));
    let (status, answer) = f.call(&stranger, Method::GET, "/v1/fleets", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert!(
        message(&answer).contains("none of identity provider corp's role mappings"),
        "{answer}"
    );

    // The audit trail names the person and the pipeline, by name, sub and issuer.
    let (_, audit) = f.call(&f.admin, Method::GET, "/v1/audit", None).await;
    let subjects: Vec<&str> = audit["value"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["subject"].as_str())
        .collect();
    assert!(
        subjects.contains(&format!("u-1@example.com (sub u-1, {})", idp.issuer).as_str()),
        "{subjects:?}"
    );
    assert!(
        subjects.contains(&format!("pipeline-deploy ({})", idp.issuer).as_str()),
        "{subjects:?}"
    );
}

#[tokio::test]
async fn every_bad_token_is_refused_with_its_reason() {
    let idp = provider().await;
    let key = Key::new("k1");
    *idp.keys.lock().expect("keys") = json!({"keys": [key.jwk()]});
    let f = flotilla("refusals", AuthMode::Any, vec![corp(&idp.issuer)]).await;
    let good = claims(&idp.issuer, "u-1", &["platform"]);
    assert_eq!(
        f.call(&key.token(&good), Method::GET, "/v1/fleets", None)
            .await
            .0,
        StatusCode::OK
    );

    let body = b64(good.to_string().as_bytes());
    let none = format!("{}.{body}.", b64(br#"{"alg":"none","kid":"k1"}"#));
    let hs256 = {
        let input = format!("{}.{body}", b64(br#"{"alg":"HS256","kid":"k1"}"#));
        let secret = key.pair.public_key().as_ref().to_vec();
        let mac = aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &secret),
            input.as_bytes(),
        );
        format!("{input}.{}", b64(mac.as_ref()))
    };
    let other_key = Key::new("k1");
    let cases = [
        (
            key.token(&with(good.clone(), "aud", json!("another-api"))),
            "aud",
        ),
        (
            key.token(&with(good.clone(), "iss", json!("https://evil.example"))),
            "no identity provider has that issuer",
        ),
        (none, "alg \"none\""),
        (hs256, "HS256"),
        (
            key.token(&with(good.clone(), "exp", json!(now() - 600))),
            "expired",
        ),
        (
            key.token(&with(good.clone(), "nbf", json!(now() + 600))),
            "not valid before",
        ),
        (other_key.token(&good), "signature"),
    ];
    for (token, reason) in cases {
        let (status, answer) = f.call(&token, Method::GET, "/v1/fleets", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{reason}: {answer}");
        assert!(message(&answer).contains(reason), "{reason}: {answer}");
    }

    // Made-up key ids: one fetch of the keys at most every 30 s, however many are sent.
    let before = idp.jwks_reads.load(Ordering::SeqCst);
    for i in 0..20 {
        let forged = Key::new(&format!("made-up-{i}"));
        let (status, _) = f
            .call(&forged.token(&good), Method::GET, "/v1/fleets", None)
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert!(
        idp.jwks_reads.load(Ordering::SeqCst) - before <= 1,
        "JWKS read {} times",
        idp.jwks_reads.load(Ordering::SeqCst) - before
    );
}

#[tokio::test]
async fn oidc_only_refuses_static_tokens() {
    let idp = provider().await;
    let key = Key::new("k1");
    *idp.keys.lock().expect("keys") = json!({"keys": [key.jwk()]});
    let f = flotilla("oidc-only", AuthMode::OidcOnly, vec![corp(&idp.issuer)]).await;
    let (status, answer) = f
        .call(&f.admin.clone(), Method::GET, "/v1/fleets", None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    assert!(message(&answer).contains("oidc-only"), "{answer}");
    let platform = key.token(&claims(&idp.issuer, "u-2", &["platform"]));
    assert_eq!(
        f.call(&platform, Method::GET, "/v1/fleets", None).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn identity_providers_are_managed_through_the_api_but_not_the_files() {
    let file_idp = provider().await;
    let api_idp = provider().await;
    let key = Key::new("k1");
    *file_idp.keys.lock().expect("keys") = json!({"keys": [key.jwk()]});
    *api_idp.keys.lock().expect("keys") = json!({"keys": [key.jwk()]});
    let f = flotilla("crud", AuthMode::Any, vec![corp(&file_idp.issuer)]).await;
    let (status, list) = f
        .call(&f.admin, Method::GET, "/v1/identityProviders", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["value"][0]["name"], json!("corp"));
    assert_eq!(list["value"][0]["properties"]["source"], json!("file"));

    // The file's provider is read-only.
    let body = json!({"properties": {"issuer": "https://other.example", "audience": "x"}});
    let (status, answer) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/corp",
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(
        f.call(&f.admin, Method::DELETE, "/v1/identityProviders/corp", None)
            .await
            .0,
        StatusCode::CONFLICT
    );

    // Bad bodies name the field and the value.
    let bad = json!({"properties": {"issuer": api_idp.issuer, "audience": AUDIENCE,
        "roles": [{"groups": ["ci"], "role": "superuser"}]}});
    let (status, answer) = f
        .call(&f.admin, Method::PUT, "/v1/identityProviders/ci", Some(bad))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        message(&answer).contains("properties.roles[0].role: \"superuser\""),
        "{answer}"
    );
    assert_eq!(answer["error"]["target"], json!("properties.roles[0].role"));

    // Before it exists, its tokens are not taken; after the PUT they are; after the DELETE not.
    let token = key.token(
        &json!({"iss": api_idp.issuer, "aud": AUDIENCE, "sub": "ci-main", "exp": now() + 300}),
    );
    assert_eq!(
        f.call(&token, Method::GET, "/v1/fleets", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let good = json!({"properties": {"issuer": api_idp.issuer, "audience": AUDIENCE,
        "roles": [{"subjects": ["ci-*"], "role": "reader"}]}});
    let (status, answer) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/ci",
            Some(good),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["properties"]["source"], json!("api"));
    assert_eq!(
        f.call(&token, Method::GET, "/v1/fleets", None).await.0,
        StatusCode::OK
    );
    // Only an admin on every fleet manages them.
    assert_eq!(
        f.call(&token, Method::GET, "/v1/identityProviders/ci", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        f.call(&f.admin, Method::GET, "/v1/identityProviders/ci", None)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        f.call(&f.admin, Method::DELETE, "/v1/identityProviders/ci", None)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        f.call(&token, Method::GET, "/v1/fleets", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        f.call(&f.admin, Method::GET, "/v1/identityProviders/ci", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_session_follows_its_providers_current_mappings_and_ends_with_it() {
    use flotilla_server::sessions::Session;
    let idp = provider().await;
    let f = flotilla("session-roles", AuthMode::Any, Vec::new()).await;
    let put = |role: &str| {
        json!({"properties": {"issuer": idp.issuer, "audience": AUDIENCE, "clientId": "dashboard",
            "roles": [{"groups": ["everyone"], "role": role, "fleets": ["prod-*"]}]}})
    };
    let (status, answer) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/sso",
            Some(put("reader")),
        )
        .await;
    assert!(status.is_success(), "{answer}");
    let claims = claims(&idp.issuer, "alice", &["everyone"]);
    f.state.sessions.open(
        "the-session",
        Session {
            claims: Arc::new(claims.as_object().cloned().expect("object")),
            csrf: "csrf".into(),
            provider: "sso".into(),
            issuer: idp.issuer.clone(),
            id_token: String::new(),
            expires_at: now() + 300,
        },
        now(),
    );
    let (status, me) = f.with_cookie("the-session", "/v1/me").await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        me["grants"],
        json!([{"fleets": "prod-*", "role": "reader"}])
    );

    // The mapping changes: the open session has the new role at once.
    let (status, answer) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/sso",
            Some(put("approver")),
        )
        .await;
    assert!(status.is_success(), "{answer}");
    let (status, me) = f.with_cookie("the-session", "/v1/me").await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        me["grants"],
        json!([{"fleets": "prod-*", "role": "approver"}])
    );

    // The provider is deleted: the session ends.
    let (status, answer) = f
        .call(&f.admin, Method::DELETE, "/v1/identityProviders/sso", None)
        .await;
    assert!(status.is_success(), "{answer}");
    let (status, answer) = f.with_cookie("the-session", "/v1/me").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    assert!(message(&answer).contains("\"sso\" is gone"), "{answer}");
    // Made again under the same name, it does not bring the session back.
    let (status, _) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/sso",
            Some(put("admin")),
        )
        .await;
    assert!(status.is_success());
    assert_eq!(
        f.with_cookie("the-session", "/v1/me").await.0,
        StatusCode::UNAUTHORIZED
    );
}

/// A discovery document served on loopback (made from the issuer's URL), for documents that
/// point elsewhere; answers the issuer and how many requests reached any other path.
async fn fake_discovery(document: impl Fn(&str) -> Value) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let issuer = format!("http://{}", listener.local_addr().expect("addr"));
    let document = document(&issuer);
    let others = Arc::new(AtomicUsize::new(0));
    let counted = others.clone();
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || {
                let d = document.clone();
                async move { axum::Json(d) }
            }),
        )
        .fallback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { axum::Json(json!({"error": "invalid_grant"})) }
        });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (issuer, others)
}

#[tokio::test]
async fn an_api_made_provider_reads_its_own_secret_and_sends_it_to_its_issuer_only() {
    let f = flotilla("secret", AuthMode::Any, Vec::new()).await;
    // Elsewhere: another server on loopback, which must receive nothing.
    let (elsewhere, reached) = fake_discovery(|issuer| json!({"issuer": issuer})).await;
    let (issuer, _) = fake_discovery(|issuer| {
        json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks"),
            "token_endpoint": format!("{elsewhere}/token")})
    })
    .await;
    let body = |env: &str| {
        json!({"properties": {"issuer": issuer, "audience": AUDIENCE, "clientId": "dashboard",
            "clientSecret": {"env": env}, "roles": [{"groups": ["everyone"], "role": "reader"}]}})
    };
    // The configuration file's variable (or any but its own) is refused, naming field and value.
    let (status, answer) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/team-sso",
            Some(body("FLOTILLA_OIDC_SECRET")),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        message(&answer).contains("properties.clientSecret.env: \"FLOTILLA_OIDC_SECRET\""),
        "{answer}"
    );
    assert!(
        message(&answer).contains("FLOTILLA_OIDC_TEAM_SSO_SECRET"),
        "{answer}"
    );
    let (status, answer) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/team-sso",
            Some(body("FLOTILLA_OIDC_TEAM_SSO_SECRET")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");

    // Its discovery document names a token endpoint on another origin: nothing is sent there.
    let provider = f.state.oidc.find("team-sso").expect("made");
    let refused = f
        .state
        .oidc
        .exchange_code(
            &provider,
            "code",
            "http://127.0.0.1/auth/callback",
            "verifier",
            "nonce",
        )
        .await
        .expect_err("another origin");
    assert!(
        refused.contains("is not on the issuer's origin"),
        "{refused}"
    );
    assert_eq!(reached.load(Ordering::SeqCst), 0);
}

/// `GET /auth/login?provider=NAME`, not following the redirect: the status, `Location` and
/// `Set-Cookie`, or the body of a refusal.
async fn login(f: &Flotilla, provider: &str) -> (StatusCode, String, String) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let response = http
        .get(format!("{}/auth/login?provider={provider}", f.base))
        .send()
        .await
        .expect("sent");
    let status = response.status();
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (location, cookie) = (header("location"), header("set-cookie"));
    let body = response.text().await.unwrap_or_default();
    (
        status,
        location,
        if cookie.is_empty() { body } else { cookie },
    )
}

#[tokio::test]
async fn cookies_are_secure_unless_the_server_is_configured_on_plain_http_loopback() {
    let (issuer, _) = fake_discovery(|issuer| {
        json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks"),
            "authorization_endpoint": format!("{issuer}/auth")})
    })
    .await;
    let f = flotilla("secure", AuthMode::Any, Vec::new()).await;
    let body = json!({"properties": {"issuer": issuer, "audience": AUDIENCE, "clientId": "dashboard",
        "roles": [{"groups": ["everyone"], "role": "reader"}]}});
    let (status, answer) = f
        .call(
            &f.admin,
            Method::PUT,
            "/v1/identityProviders/sso",
            Some(body),
        )
        .await;
    assert!(status.is_success(), "{answer}");
    // On loopback, without TLS or a public URL: no Secure (the browser would drop it).
    let (status, location, cookie) = login(&f, "sso").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{cookie}");
    assert!(
        location.starts_with(&format!("{issuer}/auth?")),
        "{location}"
    );
    assert!(cookie.starts_with("flotilla_sign_in="), "{cookie}");
    assert!(!cookie.contains("Secure"), "{cookie}");
    // Reached at an https public URL (a proxy in front): Secure, though the request's Host is
    // the loopback address.
    {
        let mut arm = f.state.arm.write().expect("settings");
        Arc::make_mut(&mut arm).public_url = Some("https://flotilla.example".into());
    }
    let (_, location, cookie) = login(&f, "sso").await;
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(
        location.contains("redirect_uri=https%3A%2F%2Fflotilla.example%2Fauth%2Fcallback"),
        "{location}"
    );
}

#[tokio::test]
async fn endpoints_a_discovery_document_names_elsewhere_in_clear_are_refused() {
    let f = flotilla("endpoints", AuthMode::Any, Vec::new()).await;
    for (name, endpoint) in [
        ("jwks_uri", "http://keys.example/jwks"),
        ("authorization_endpoint", "http://idp.example/auth"),
        ("token_endpoint", "http://idp.example/token"),
        ("end_session_endpoint", "ftp://idp.example/logout"),
    ] {
        let (issuer, _) = fake_discovery(|issuer| {
            let mut document = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks"),
                "authorization_endpoint": format!("{issuer}/auth"),
                "token_endpoint": format!("{issuer}/token")});
            document[name] = json!(endpoint);
            document
        })
        .await;
        let body = json!({"properties": {"issuer": issuer, "audience": AUDIENCE,
            "clientId": "dashboard", "roles": [{"groups": ["everyone"], "role": "reader"}]}});
        let (status, answer) = f
            .call(
                &f.admin,
                Method::PUT,
                "/v1/identityProviders/sso",
                Some(body),
            )
            .await;
        assert!(status.is_success(), "{answer}");
        let (status, _, refusal) = login(&f, "sso").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{name}: {refusal}");
        assert!(
            refusal.contains(&format!("its {name} \"{endpoint}\" must be https://")),
            "{name}: {refusal}"
        );
        // Nor are its tokens verified with keys from there.
        let key = Key::new("k1");
        let token = key.token(&claims(&issuer, "alice", &["everyone"]));
        let (status, answer) = f.call(&token, Method::GET, "/v1/fleets", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    }
}

#[tokio::test]
async fn signing_out_always_clears_the_cookie_and_ends_the_session_on_the_server() {
    use flotilla_server::sessions::Session;
    let idp = provider().await;
    let f = flotilla("logout", AuthMode::Any, vec![corp(&idp.issuer)]).await;
    let claims = claims(&idp.issuer, "alice", &["everyone"]);
    f.state.sessions.open(
        "old-session",
        Session {
            claims: Arc::new(claims.as_object().cloned().expect("object")),
            csrf: "the-csrf".into(),
            provider: "corp".into(),
            issuer: idp.issuer.clone(),
            id_token: String::new(),
            expires_at: now() + 300,
        },
        now(),
    );
    let logout = |csrf: Option<&'static str>| {
        let mut request = f
            .http
            .post(format!("{}/auth/logout", f.base))
            .header("cookie", "flotilla_session=old-session");
        if let Some(csrf) = csrf {
            request = request.header("x-csrf-token", csrf);
        }
        async move {
            let response = request.send().await.expect("sent");
            let status = response.status();
            let cookie = response
                .headers()
                .get("set-cookie")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            (status, cookie, response.text().await.unwrap_or_default())
        }
    };
    // Refused (no CSRF token): the reason is given, and the cookie is cleared all the same.
    let (status, cookie, body) = logout(None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("X-CSRF-Token: missing"), "{body}");
    assert!(cookie.starts_with("flotilla_session=;"), "{cookie}");
    assert!(cookie.contains("Max-Age=0"), "{cookie}");
    assert_eq!(
        f.with_cookie("old-session", "/v1/me").await.0,
        StatusCode::OK
    );
    // Signed out: the old cookie, replayed, is refused.
    let (status, cookie, body) = logout(Some("the-csrf")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(cookie.contains("Max-Age=0"), "{cookie}");
    let (status, answer) = f.with_cookie("old-session", "/v1/me").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    let (status, _, body) = logout(Some("the-csrf")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
}
