//! Registration benchmark over real HTTP on loopback, on a real SQLite file: members registered
//! one PUT at a time by 8 clients, then a fleet of N members through `importMembers` (10,000 per
//! request, each one transaction).
//!
//! `cargo bench -p flotilla-server --bench register [-- MEMBERS]` (default 100000)

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use flotilla_server::Server;
use flotilla_server::auth::{Role, new_token};
use flotilla_server::store::SqliteStore;
use flotilla_server::store::prelude::*;

async fn send(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: &Value,
) {
    let response = http
        .request(method.clone(), format!("{base}{path}"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("sent");
    let status = response.status();
    let text = response.text().await.expect("body");
    assert!(
        status.is_success(),
        "{method} {path}: {status} {}",
        &text[..text.len().min(300)]
    );
}

#[tokio::main]
async fn main() {
    let members: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = std::env::temp_dir().join(format!("flotilla-register-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = SqliteStore::open(&dir.join("bench.db"))
        .await
        .expect("store");
    let (token, record) = new_token(Role::Admin, "bench").expect("token");
    store.create_token(&record).await.expect("token");
    let store: Arc<dyn Store> = Arc::new(store);
    let server = Server::start(store, "127.0.0.1:0".parse().expect("addr"), false)
        .await
        .expect("server");
    let base = format!("http://{}", server.local_addr().expect("addr"));
    tokio::spawn(server.serve(std::future::pending()));
    let http = reqwest::Client::new();
    let fleet = json!({"properties": {"driver": {"type": "sim", "timeScale": 6000,
        "defaultCluster": {"region": "eastus", "kubernetesVersion": "1.30.5"}}}});
    for name in ["one-by-one", "imported"] {
        send(
            &http,
            &base,
            &token,
            reqwest::Method::PUT,
            &format!("/v1/fleets/{name}"),
            &fleet,
        )
        .await;
    }

    // One PUT per member, 8 clients.
    let single = 2_000;
    let t = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|client| {
            let (http, base, token) = (http.clone(), base.clone(), token.clone());
            tokio::spawn(async move {
                for i in (client..single).step_by(8) {
                    let body = json!({"properties": {"clusterResourceId": format!("/sub/rg/c{i}"), "group": format!("g{}", i % 20)}});
                    send(&http, &base, &token, reqwest::Method::PUT, &format!("/v1/fleets/one-by-one/members/m{i:06}"), &body).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client");
    }
    let put_seconds = t.elapsed().as_secs_f64();
    println!(
        "one PUT per member, 8 clients: {single} members in {put_seconds:.2} s ({:.0}/s)",
        single as f64 / put_seconds
    );

    // importMembers, 10,000 per request.
    let t = Instant::now();
    for start in (0..members).step_by(10_000) {
        let value: Vec<Value> = (start..(start + 10_000).min(members))
            .map(|i| json!({"name": format!("m{i:06}"), "properties": {"clusterResourceId": format!("/sub/rg/c{i}"), "group": format!("g{}", i % 20), "labels": {"ring": (i % 3).to_string()}}}))
            .collect();
        send(
            &http,
            &base,
            &token,
            reqwest::Method::POST,
            "/v1/fleets/imported/importMembers",
            &json!({"value": value}),
        )
        .await;
    }
    let import_seconds = t.elapsed().as_secs_f64();
    println!(
        "importMembers, 10,000 per request: {members} members in {import_seconds:.2} s ({:.0}/s)",
        members as f64 / import_seconds
    );
    let _ = std::fs::remove_dir_all(&dir);
}
