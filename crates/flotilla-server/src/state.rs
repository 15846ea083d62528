//! What every request handler shares: the runs and their store, the server's mode, the
//! release feed's last reading, the large answers kept, and the limits on request bodies.

use std::collections::HashMap;
use std::sync::Arc;

use crate::runs::Runs;

/// Largest request body accepted (413 above).
pub const BODY_LIMIT: usize = 1 << 20;

/// An import's body limit.
pub const IMPORT_BODY_LIMIT: usize = 32 << 20;

pub struct AppState {
    pub runs: Arc<Runs>,
    pub insecure: bool,
    /// How long a client may take to send a request's body, in milliseconds
    /// (`http::Limits::body_timeout`, set when serving starts).
    pub body_timeout_ms: std::sync::atomic::AtomicU64,
    /// The release feed: each fleet's catalog as last read, to tell runs when it changes.
    pub catalogs: std::sync::Mutex<HashMap<String, flotilla_engine::fleet::Catalog>>,
    /// Large documents as last answered, by eTag.
    pub answers: crate::answers::Answers,
    /// Fleet Manager's ARM paths: the default home of fleets, the default driver.
    pub arm: std::sync::RwLock<Arc<crate::home::Settings>>,
    /// Release trains: what each Completed run validated (SEMANTICS §14), by run id and the
    /// eTag of its document (a run rolled back since is read again).
    pub validations: std::sync::Mutex<HashMap<String, Option<flotilla_engine::train::Validated>>>,
    /// The identity providers whose JWTs are taken, and whether static tokens are.
    pub oidc: crate::oidc::Oidc,
    /// The dashboard's sessions and sign-ins under way.
    pub sessions: crate::sessions::Sessions,
}

impl AppState {
    /// The ARM settings as they are now (set once when serving starts).
    pub fn arm_settings(&self) -> Arc<crate::home::Settings> {
        self.arm.read().map(|s| s.clone()).unwrap_or_default()
    }
}

pub type Shared = Arc<AppState>;
