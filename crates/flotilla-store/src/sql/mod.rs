//! The statements the shared store code runs ([`crate::shared`]), one set per dialect:
//! `sqlite.rs` and `postgres.rs` give the same fields in the same order, so the two read side
//! by side. What a statement binds is said here, in order; what it reads is in the code that
//! runs it. A dialect's own statements (its bulk writes, its registration, its clock) stay in
//! its module (`crate::sqlite`, `crate::postgres`).

mod postgres;
mod sqlite;

/// A read of runs with their chunks, as `part_row` reads them: the columns and the join, then
/// the dialect's condition and order.
macro_rules! runs {
    ($rest:literal) => {
        concat!(
            "SELECT r.name, r.body, r.packed, r.etag, r.chunks, c.chunk, c.slot, c.body, c.packed \
             FROM resources r LEFT JOIN run_chunks c ON c.fleet = r.fleet AND c.run = r.name AND c.chunk < r.chunks ",
            $rest
        )
    };
}
use runs;

pub(crate) use postgres::POSTGRES;
pub(crate) use sqlite::SQLITE;

/// A dialect's statements.
pub(crate) struct Statements {
    // Transactions and what a dialect does about them.
    /// How a writing transaction begins, if not plainly.
    pub(crate) begin_write: Option<&'static str>,
    /// Run first in a transaction whose reads must see one snapshot, if it needs saying.
    pub(crate) snapshot: Option<&'static str>,
    /// Run first in a bulk write that holds no lease row (a batch registration, a fleet's
    /// observed statuses), if anything needs relaxing for it.
    pub(crate) bulk: Option<&'static str>,
    /// Sends a notice from inside a transaction (payload), where the database carries them.
    pub(crate) notify: Option<&'static str>,
    /// Run at a clean shutdown, before the pool closes, where something is left to do.
    pub(crate) checkpoint: Option<&'static str>,

    // Migrations.
    /// The schema, one migration per change ([`crate::migrate`]).
    pub(crate) migrations: &'static [crate::migrate::Source],
    /// Held for the first-start recording of a legacy database, if replicas may race on it.
    pub(crate) migration_lock: Option<&'static str>,
    /// Whether the legacy `schema_migrations` table exists: one boolean.
    pub(crate) legacy_migrations: &'static str,
    /// Records an applied migration for sqlx's migrator, once (version, description,
    /// checksum).
    pub(crate) record_migration: &'static str,

    // Resources.
    /// A resource's eTag (fleet, kind, name).
    pub(crate) etag: &'static str,
    /// A resource's eTag, its row locked for the write (fleet, kind, name).
    pub(crate) lock_etag: &'static str,
    /// `body, packed, etag` (fleet, kind, name).
    pub(crate) get: &'static str,
    /// A run with its chunks, as `part_row` reads (fleet, name).
    pub(crate) get_run: &'static str,
    /// A page: `name, body, packed, etag` (fleet, kind, after, limit).
    pub(crate) list: &'static str,
    /// The name of a page's last run (fleet, after, offset of the last).
    pub(crate) last_run_of_page: &'static str,
    /// Runs with their chunks after a name up to another (fleet, after, last).
    pub(crate) runs_up_to: &'static str,
    /// Runs with their chunks after a name (fleet, after).
    pub(crate) runs_after: &'static str,
    /// Inserts a resource that must not exist, if creators can race (fleet, kind, name,
    /// body, packed, etag).
    pub(crate) create: Option<&'static str>,
    /// Creates or replaces a run's frame (fleet, kind, name, body, packed, etag, chunks).
    pub(crate) put_frame: &'static str,
    /// Deletes a run's chunks from an index on (fleet, run, index).
    pub(crate) drop_chunks_from: &'static str,
    /// Deletes what a run written whole no longer has (fleet, run each).
    pub(crate) forget_run_parts: &'static [&'static str],
    /// Deletes a resource (fleet, kind, name).
    pub(crate) delete: &'static str,
    /// Deletes what goes with a run (fleet, run each).
    pub(crate) delete_run_parts: &'static [&'static str],
    /// Deletes what goes with a member (fleet, member each).
    pub(crate) delete_member_parts: &'static [&'static str],
    /// Deletes what goes with a fleet (fleet each).
    pub(crate) delete_fleet_parts: &'static [&'static str],

    // Runs' logs.
    /// The fleet's lease (fleet): `owner, epoch`, locked where writers race.
    pub(crate) lock_lease: &'static str,
    /// The input log's last number (fleet, run), and the start of the insert of its entries.
    pub(crate) append_log: (&'static str, &'static str),
    /// The events' last number (fleet, run), and the start of the insert of events
    /// (`fleet, run, seq, event, first_seq, packed`: see [`events_after`](Self::events_after)).
    pub(crate) append_events: (&'static str, &'static str),
    /// Sets a run's checkpoint after its last entry (fleet, run, packed).
    pub(crate) put_checkpoint: &'static str,
    /// Deletes the log before the checkpoint (fleet, run).
    pub(crate) trim_log: &'static str,
    /// `seq, packed` of a run's checkpoint (fleet, run).
    pub(crate) checkpoint_of: &'static str,
    /// `entry` after a number (fleet, run, seq).
    pub(crate) log_after: &'static str,
    /// `seq, event, first_seq, packed` of the rows holding the events after a number, in
    /// order, as many rows as hold the first `limit` of them (fleet, run, seq, limit). A row is
    /// one event (`first_seq` NULL, the event in `event`) or a pack of the events numbered
    /// `first_seq..=seq` (compressed in `packed`, one per line; `event` holds `{}`). A pack is
    /// keyed by its last number, so the largest `seq` is the last event's, as it was before
    /// packs.
    pub(crate) events_after: &'static str,
    /// The value of an intent not finished, in an insert's row.
    pub(crate) unfinished: &'static str,
    /// `attempt, member, target, operation_id, finished, recorded_at` (fleet, run).
    pub(crate) intents: &'static str,
    /// Sets a run's head (fleet, run, head).
    pub(crate) put_head: &'static str,
    /// Sets a run's head if it has none (fleet, run, head).
    pub(crate) init_head: &'static str,
    /// `name, head` of a fleet's runs (fleet).
    pub(crate) run_heads: &'static str,
    /// `member, seconds`, each member's last few (fleet, upgrade type, how many).
    pub(crate) member_durations: &'static str,
    /// `seconds`, the fleet's last few (fleet, upgrade type, how many).
    pub(crate) fleet_durations: &'static str,

    // Tokens.
    /// (id, hash, role, subject, created at).
    pub(crate) create_token: &'static str,
    /// A token's columns (hash).
    pub(crate) token_by_hash: &'static str,
    /// Every token's columns.
    pub(crate) tokens: &'static str,
    /// (id).
    pub(crate) revoke_token: &'static str,

    // Liveness, leases and actions. Where the dialect binds times
    // ([`crate::shared::Dialect::clock`]), a statement binds the time last; an expiry is a time
    // by this machine's clock, or a duration added to the database's.
    /// Says a replica is alive (replica, expiry).
    pub heartbeat: &'static str,
    /// Forgets replicas gone for an hour (an hour ago).
    pub forget_replicas: &'static str,
    /// How many replicas are alive (now).
    pub alive_replicas: &'static str,
    /// Takes a lease free or expired, or held by the same owner, with the next epoch (fleet,
    /// owner, expiry, now): `epoch`.
    pub acquire_lease: &'static str,
    /// (expiry, fleet, owner, epoch); the expiry counts from [`crate::shared::Dialect::clock`].
    pub(crate) renew_lease: &'static str,
    /// (fleet, owner, epoch).
    pub(crate) release_lease: &'static str,
    /// `fleet, owner, epoch, expiry`: a time by this machine's clock, or the milliseconds left.
    pub(crate) leases: &'static str,
    /// (fleet, run, input): `id`.
    pub(crate) submit_action: &'static str,
    /// `id, run, input` (fleet).
    pub(crate) pending_actions: &'static str,
    /// (result, id).
    pub(crate) finish_action: &'static str,
    /// `result`, deleting the action (id).
    pub(crate) take_action_result: &'static str,

    // Audit.
    /// (at, subject, role, method, path, fleet, status, body).
    pub(crate) append_audit: &'static str,
    /// (before, limit).
    pub(crate) prune_audit: &'static str,
    /// A page of entries (after, since, fleet, limit).
    pub(crate) audit_of_fleet: &'static str,
    /// A page of entries (after, since, limit).
    pub(crate) audit: &'static str,

    // Webhooks.
    /// A webhook's eTag, its row locked where writers race (name).
    pub(crate) lock_webhook_etag: &'static str,
    /// Creates or replaces a webhook (its columns); where the database tells, answers whether
    /// it inserted the row.
    pub(crate) put_webhook: &'static str,
    /// A webhook's columns (name).
    pub(crate) webhook: &'static str,
    /// A page of webhooks (after, limit).
    pub(crate) webhooks_after: &'static str,
    /// Deletes a webhook and its deliveries (name each).
    pub(crate) delete_webhook: &'static [&'static str],
    /// Claims due deliveries (claimed until, now, limit): their columns.
    pub(crate) claim_deliveries: &'static str,
    /// Records an attempt (at, status, error, state, next attempt, delivered at, id).
    pub(crate) record_delivery: &'static str,
    /// A page of a webhook's deliveries (webhook, after, state or null, limit).
    pub(crate) deliveries_after: &'static str,
    /// (before).
    pub(crate) prune_deliveries: &'static str,
}
