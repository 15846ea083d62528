//! The Flotilla server: the HTTP API over an embedded store, a reconciler task per active run
//! driving the engine, and the drivers that observe and upgrade clusters.

pub mod api;
pub mod auth;
pub mod driver;
pub mod metrics;
pub mod runs;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::api::AppState;
use crate::metrics::Metrics;
use crate::runs::Runs;
use crate::store::Store;

/// A server bound to an address, ready to serve.
pub struct Server {
    pub listener: tokio::net::TcpListener,
    pub state: Arc<AppState>,
}

impl Server {
    /// Binds, loads every active run and resumes it.
    pub async fn start(
        store: Arc<dyn Store>,
        addr: SocketAddr,
        insecure: bool,
    ) -> anyhow_like::Result<Server> {
        if insecure && !addr.ip().is_loopback() {
            return Err(anyhow_like::Error(format!(
                "--insecure-no-auth serves without authentication and binds loopback only; {addr} is not a loopback address"
            )));
        }
        let runs = Runs::new(store, Arc::new(Metrics::default()));
        let resumed = runs
            .resume_all()
            .await
            .map_err(|e| anyhow_like::Error(e.message))?;
        tracing::info!(resumed, "active update runs resumed");
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow_like::Error(format!("cannot listen on {addr}: {e}")))?;
        Ok(Server {
            listener,
            state: Arc::new(AppState { runs, insecure }),
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
        let app = api::router(self.state.clone());
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| anyhow_like::Error(e.to_string()))
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
