//! Replica coordination: the fleets' leases this replica holds (with their fencing epochs), and the permit under which an upgrade is sent.

use super::*;

/// How long a fleet's lease lasts without renewal, unless configured.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

/// This replica's share of the fleets: which leases it holds, and since when it may act on them.
pub struct Replica {
    /// Unique among the replicas sharing the database.
    pub id: String,
    pub ttl: Duration,
    pub(super) held: Mutex<HashMap<String, Held>>,
    /// Serialises taking leases, so the coordinator and an API call do not race for one.
    pub(super) taking: tokio::sync::Mutex<()>,
    /// Handed-over actions already given to a run, by fleet, until their result is recorded.
    pub(super) delivered: Mutex<HashMap<String, std::collections::HashSet<i64>>>,
    /// Shutting down: take no more leases.
    pub(super) closing: std::sync::atomic::AtomicBool,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) epoch: i64,
    /// Upgrades are sent only before this instant: the lease's end by this process's monotonic
    /// clock, counted from before the renewal was asked for and cut short by a tenth, so it
    /// ends before the database lets another replica take over.
    pub(super) valid_until: Instant,
    /// When this replica took the lease.
    pub(super) taken_at: Instant,
}

impl Replica {
    pub fn new(id: String, ttl: Duration) -> Replica {
        Replica {
            id,
            ttl,
            held: Mutex::new(HashMap::new()),
            taking: tokio::sync::Mutex::new(()),
            delivered: Mutex::new(Default::default()),
            closing: Default::default(),
        }
    }

    /// A replica id: the listen address for people to read, the process, and 64 random bits,
    /// so that replicas in identical containers and restarts all differ.
    pub fn generated_id(hint: &str) -> String {
        use std::hash::{BuildHasher, Hasher};
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        format!("{hint}/pid{}/{:016x}", std::process::id(), random.finish())
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn valid_after(&self, asked_at: Instant) -> Instant {
        asked_at + self.ttl.mul_f64(0.9)
    }

    pub fn holds(&self, fleet: &str) -> bool {
        self.held().contains_key(fleet)
    }

    pub fn fence(&self, fleet: &str) -> Option<Fence> {
        self.held().get(fleet).map(|h| Fence {
            owner: self.id.clone(),
            epoch: h.epoch,
        })
    }

    /// Whether an upgrade may be sent now under this epoch: `Some(true)` yes, `Some(false)` not
    /// yet (the lease is being renewed), `None` never (it was lost).
    pub(super) fn may_send(&self, fleet: &str, epoch: i64) -> Option<bool> {
        match self.held().get(fleet) {
            Some(h) if h.epoch == epoch => Some(Instant::now() < h.valid_until),
            _ => None,
        }
    }

    /// The fleets held, with their epochs.
    /// The epoch held for a fleet, if any.
    pub(super) fn epoch(&self, fleet: &str) -> Option<i64> {
        self.held().get(fleet).map(|h| h.epoch)
    }

    pub(super) fn held_epochs(&self) -> Vec<(String, i64)> {
        self.held()
            .iter()
            .map(|(f, h)| (f.clone(), h.epoch))
            .collect()
    }

    /// How long until a lease taken at `epoch` is a full lease time old, if it is not yet.
    pub(super) fn settling(&self, fleet: &str, epoch: i64) -> Option<Duration> {
        let held = self.held().get(fleet).copied()?;
        (held.epoch == epoch)
            .then(|| (held.taken_at + self.ttl).checked_duration_since(Instant::now()))
            .flatten()
    }

    pub fn held_fleets(&self) -> Vec<String> {
        self.held().keys().cloned().collect()
    }
}

/// Sends only under the fleet's lease, as held when the attempt was made.
pub(super) struct LeasePermit {
    pub(super) runs: Arc<Runs>,
    pub(super) fleet: String,
    pub(super) run: String,
    pub(super) epoch: i64,
    pub(super) attempt: u64,
}

impl crate::operation::SendPermit for LeasePermit {
    fn may_send(&self) -> Option<bool> {
        self.runs.replica.may_send(&self.fleet, self.epoch)
    }

    async fn record(&self, operation_id: &str) {
        let writer = self.runs.operation_ids.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(write_operation_ids(self.runs.store.clone(), rx));
            tx
        });
        let record = OperationRecord {
            fleet: self.fleet.clone(),
            run: self.run.clone(),
            attempt: self.attempt,
            operation_id: operation_id.to_string(),
        };
        let (done, stored) = oneshot::channel();
        if writer.send((record, done)).is_ok() {
            let _ = stored.await;
        }
    }

    fn count_started(&self) {
        self.runs.metrics.count_started(&self.fleet);
    }
}
