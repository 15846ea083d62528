//! The Flotilla server: the HTTP API over an embedded store, a reconciler task per active run
//! driving the engine, and the drivers that observe and upgrade clusters.

pub mod answers;

/// The options of jemalloc, where a binary uses it (the `flotilla` binary, the benches), exported
/// by each as `_rjem_malloc_conf`. `oversize_threshold:0`: by default every allocation of 8 MiB
/// or more (a run over 100,000 members is 8.6 MB) gets fresh pages from an arena of its own
/// that gives them back at once, which halved the rate of large reads (BENCHMARKS.md).
pub const JEMALLOC_CONF: &std::ffi::CStr = c"oversize_threshold:0";

/// A C string pointer that may be a `static` (jemalloc reads `const char *malloc_conf`).
#[repr(transparent)]
pub struct CConf(pub *const std::ffi::c_char);

// SAFETY: it points at a string constant, never written.
unsafe impl Sync for CConf {}
pub mod api;
pub mod arm;
pub mod audit;
pub mod auth;
pub mod budgets;
pub mod check_providers;
pub mod dashboard;
pub mod discovery;
pub mod durations;
pub mod error;
pub mod evaluate;
pub mod feed;
pub mod fleet_rules;
pub mod freezes;
pub mod home;
pub mod http;
pub mod identity_providers;
pub mod journal;
pub mod metrics;
pub mod observation;
pub mod oidc;
pub mod openapi;
pub mod principal;
pub mod request;
pub mod rule_http;
pub mod run_head;
pub mod runs;
pub mod sessions;
pub mod sign_in;
pub mod state;
pub mod trains;
pub mod webhooks;

pub use flotilla_driver::{self as driver, clock, operation};
pub use flotilla_store as store;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::runs::Runs;
use crate::state::AppState;
use crate::store::Store;

/// How often every member's cluster is observed again through its fleet's driver.
pub const OBSERVE_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// How often the release feed is read and profiles are checked for a new target.
pub const PROFILES_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The pacing of the server's background loops.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub observe_every: std::time::Duration,
    pub profiles_every: std::time::Duration,
    /// How long a fleet's lease lasts without renewal: how long the runs of a replica that died
    /// wait before another takes them over, and how long a slow replica may go without
    /// reaching the database before it stops sending upgrades.
    pub lease_ttl: std::time::Duration,
    /// Bytes of log a run writes before it is checkpointed (at least its checkpoint's size).
    pub checkpoint_after: u64,
    /// How long the audit trail keeps an entry; older ones are pruned in the background.
    pub audit_retention: std::time::Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            observe_every: OBSERVE_EVERY,
            profiles_every: PROFILES_EVERY,
            lease_ttl: runs::LEASE_TTL,
            checkpoint_after: runs::CHECKPOINT_AFTER,
            audit_retention: store::AUDIT_RETENTION,
        }
    }
}

/// A server bound to an address, ready to serve.
pub struct Server {
    pub listener: tokio::net::TcpListener,
    pub state: Arc<AppState>,
    /// What a client may hold: connections, requests at once, header and body deadlines.
    pub limits: http::Limits,
    /// Host names answered besides IP literals and `localhost`.
    pub allowed_hosts: Vec<String>,
    /// Serve HTTPS with this configuration instead of plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Server {
    /// Binds, takes this replica's fleets, and resumes their active runs in the background.
    pub async fn start(
        store: Arc<dyn Store>,
        addr: SocketAddr,
        insecure: bool,
    ) -> anyhow_like::Result<Server> {
        Server::start_with(store, addr, insecure, Timing::default()).await
    }

    /// Like [`Server::start`], with the background loops' pacing.
    pub async fn start_with(
        store: Arc<dyn Store>,
        addr: SocketAddr,
        insecure: bool,
        timing: Timing,
    ) -> anyhow_like::Result<Server> {
        Server::start_configured(store, addr, insecure, timing, driver::ExecAllow::default()).await
    }

    /// Like [`Server::start_with`], with the directories `exec` drivers' commands may come
    /// from (none: every `exec` driver is refused).
    pub async fn start_configured(
        store: Arc<dyn Store>,
        addr: SocketAddr,
        insecure: bool,
        timing: Timing,
        exec_allow: driver::ExecAllow,
    ) -> anyhow_like::Result<Server> {
        if insecure && !addr.ip().is_loopback() {
            return Err(anyhow_like::Error(format!(
                "--insecure-no-auth serves without authentication and binds loopback only; {addr} is not a loopback address"
            )));
        }
        let replica = runs::Replica::new(
            runs::Replica::generated_id(&addr.to_string()),
            timing.lease_ttl,
        );
        let runs = Runs::with_replica(store, Arc::new(Metrics::default()), replica);
        runs.checkpoint_after.store(
            timing.checkpoint_after,
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Ok(mut allow) = runs.drivers.exec_allow.write() {
            *allow = exec_allow;
        }
        // Take this replica's share of the fleets before serving; their active runs are resumed
        // in the background.
        runs.coordinate_once().await;
        tracing::info!(
            replica = %runs.replica.id,
            fleets = runs.replica.held_fleets().len(),
            "fleets taken; their active runs are being resumed"
        );
        tokio::spawn(runs.clone().coordinate());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow_like::Error(format!("cannot listen on {addr}: {e}")))?;
        tokio::spawn(observation::observe_fleets(
            runs.clone(),
            timing.observe_every,
        ));
        tokio::spawn(store::prune_audit_forever(
            runs.store.clone(),
            timing.audit_retention,
        ));
        let state = Arc::new(AppState {
            runs,
            insecure,
            body_timeout_ms: (http::Limits::default().body_timeout.as_millis() as u64).into(),
            catalogs: Default::default(),
            answers: Default::default(),
            arm: Default::default(),
            validations: Default::default(),
            oidc: Default::default(),
            sessions: Default::default(),
        });
        // Webhooks: the outbox the run batches fill, sent from every replica (rows are
        // claimed one sender at a time).
        tokio::spawn(webhooks::deliver(
            state.clone(),
            webhooks::Pacing::default(),
        ));
        // Identity providers made through the API, on another replica too.
        let providers = state.clone();
        tokio::spawn(async move {
            loop {
                // Asked again at the next pass; the providers held stay meanwhile.
                if let Err(e) = identity_providers::reload(&providers).await {
                    tracing::debug!(error = %e, "cannot read the identity providers");
                }
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        });
        let feed = state.clone();
        tokio::spawn(async move {
            // The release feed: each fleet's catalog is read from its driver and every enabled
            // profile is checked for a new target.
            // Also the discoveries that drivers run on an interval.
            let mut discovered = std::collections::HashMap::new();
            loop {
                let soak_ends = feed::trigger_profiles(&feed).await;
                feed::discover_due(&feed, &mut discovered).await;
                // A soak that ends before the next pass is looked at when it ends (SEMANTICS
                // §14: the promotion happens at that instant).
                let until_soak_end = soak_ends.map(|at| {
                    let seconds = (at.unix() - clock::now().unix()).max(0) as u64;
                    std::time::Duration::from_secs(seconds)
                });
                let pause =
                    until_soak_end.map_or(timing.profiles_every, |d| d.min(timing.profiles_every));
                tokio::time::sleep(pause).await;
            }
        });
        Ok(Server {
            listener,
            state,
            limits: http::Limits::default(),
            allowed_hosts: Vec::new(),
            tls: None,
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow_like::Result<()> {
        let limits = self.limits;
        self.state.body_timeout_ms.store(
            limits.body_timeout.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Ok(mut arm) = self.state.arm.write() {
            let arm = Arc::make_mut(&mut arm);
            arm.https = self.tls.is_some();
            arm.loopback_listener = self
                .listener
                .local_addr()
                .is_ok_and(|a| a.ip().is_loopback());
        }
        let app = arm::router(self.state.clone())
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(http::AllowedHosts::new(self.allowed_hosts.clone())),
                http::check_origin,
            ))
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(tokio::sync::Semaphore::new(limits.max_requests)),
                http::limit_requests,
            ));
        let runs = self.state.runs.clone();
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let mut stopped = stopping.clone();
        tokio::spawn(async move {
            shutdown.await;
            // Other replicas take over at once rather than after the lease time.
            runs.release_leases().await;
            let _ = stop.send(true);
        });
        let connections = tokio::spawn(http::serve(
            self.listener,
            app,
            limits,
            self.tls.clone(),
            stopping,
        ));
        if stopped.wait_for(|s| *s).await.is_err() {
            return Ok(());
        }
        // Open event streams never end by themselves: connections get a few seconds, no more.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(6), connections).await;
        self.state.runs.store.close().await;
        Ok(())
    }
}

/// A plain error type for the server's entry points.
pub mod anyhow_like {
    #[derive(Debug)]
    pub struct Error(pub String);

    impl std::fmt::Display for Error {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for Error {}

    pub type Result<T> = std::result::Result<T, Error>;
}
