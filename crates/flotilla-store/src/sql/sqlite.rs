//! SQLite's statements (fields in the order of [`Statements`]; `postgres.rs` beside it).

use super::{Statements, runs};
use crate::{delivery_columns, webhook_columns};

pub(crate) const SQLITE: Statements = Statements {
    begin_write: Some("BEGIN IMMEDIATE"),
    // A deferred transaction: its reads see one snapshot of the write-ahead log.
    snapshot: None,
    bulk: None,
    notify: None,
    checkpoint: Some("PRAGMA wal_checkpoint(TRUNCATE)"),

    migrations: crate::migrate::SQLITE,
    migration_lock: None,
    legacy_migrations: "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
    record_migration: "INSERT OR IGNORE INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                       VALUES (?, ?, TRUE, ?, 0)",

    etag: "SELECT etag FROM resources WHERE fleet = ? AND kind = ? AND name = ?",
    lock_etag: "SELECT etag FROM resources WHERE fleet = ? AND kind = ? AND name = ?",
    get: "SELECT body, packed, etag FROM resources WHERE fleet = ? AND kind = ? AND name = ?",
    get_run: runs!("WHERE r.fleet = ? AND r.kind = 'updateRuns' AND r.name = ? ORDER BY c.chunk"),
    list: "SELECT name, body, packed, etag FROM resources WHERE fleet = ? AND kind = ? AND name > ? ORDER BY name LIMIT ?",
    last_run_of_page: "SELECT name FROM resources WHERE fleet = ? AND kind = 'updateRuns' AND name > ? ORDER BY name LIMIT 1 OFFSET ?",
    runs_up_to: runs!(
        "WHERE r.fleet = ? AND r.kind = 'updateRuns' AND r.name > ? AND r.name <= ? ORDER BY r.name, c.chunk"
    ),
    runs_after: runs!(
        "WHERE r.fleet = ? AND r.kind = 'updateRuns' AND r.name > ? ORDER BY r.name, c.chunk"
    ),
    // One writer: a creation does not race.
    create: None,
    put_frame: "INSERT INTO resources (fleet, kind, name, body, packed, etag, chunks) VALUES (?, ?, ?, ?, ?, ?, ?) \
                ON CONFLICT (fleet, kind, name) DO UPDATE SET body = excluded.body, packed = excluded.packed, etag = excluded.etag, chunks = excluded.chunks",
    drop_chunks_from: "DELETE FROM run_chunks WHERE fleet = ? AND run = ? AND chunk >= ?",
    forget_run_parts: &[
        "DELETE FROM run_heads WHERE fleet = ? AND run = ?",
        "DELETE FROM run_chunks WHERE fleet = ? AND run = ?",
        "DELETE FROM run_checkpoints WHERE fleet = ? AND run = ?",
    ],
    delete: "DELETE FROM resources WHERE fleet = ? AND kind = ? AND name = ?",
    delete_run_parts: &[
        "DELETE FROM resources WHERE fleet = ? AND kind = 'updateRunSnapshots' AND name = ?",
        "DELETE FROM run_log WHERE fleet = ? AND run = ?",
        "DELETE FROM run_events WHERE fleet = ? AND run = ?",
        "DELETE FROM intents WHERE fleet = ? AND run = ?",
        "DELETE FROM run_heads WHERE fleet = ? AND run = ?",
        "DELETE FROM run_chunks WHERE fleet = ? AND run = ?",
        "DELETE FROM run_checkpoints WHERE fleet = ? AND run = ?",
        "DELETE FROM resources WHERE fleet = ? AND kind = 'gates' AND json_extract(body, '$.properties.target.updateRunProperties.name') = ?",
    ],
    delete_member_parts: &["DELETE FROM member_clusters WHERE fleet = ? AND member = ?"],
    delete_fleet_parts: &[
        "DELETE FROM resources WHERE fleet = ?",
        "DELETE FROM member_clusters WHERE fleet = ?",
        "DELETE FROM run_log WHERE fleet = ?",
        "DELETE FROM run_events WHERE fleet = ?",
        "DELETE FROM intents WHERE fleet = ?",
        "DELETE FROM run_heads WHERE fleet = ?",
        "DELETE FROM run_chunks WHERE fleet = ?",
        "DELETE FROM run_checkpoints WHERE fleet = ?",
        "DELETE FROM upgrade_durations WHERE fleet = ?",
    ],

    lock_lease: "SELECT owner, epoch FROM leases WHERE fleet = ?",
    append_log: (
        "SELECT COALESCE(MAX(seq), 0) FROM run_log WHERE fleet = ? AND run = ?",
        "INSERT INTO run_log (fleet, run, seq, entry) ",
    ),
    append_events: (
        "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE fleet = ? AND run = ?",
        "INSERT INTO run_events (fleet, run, seq, event, first_seq, packed) ",
    ),
    put_checkpoint: "INSERT INTO run_checkpoints (fleet, run, seq, packed) \
                     SELECT ?1, ?2, MAX(seq), ?3 FROM run_log WHERE fleet = ?1 AND run = ?2 \
                     ON CONFLICT (fleet, run) DO UPDATE SET seq = excluded.seq, packed = excluded.packed",
    trim_log: "DELETE FROM run_log WHERE fleet = ?1 AND run = ?2 \
               AND seq < (SELECT seq FROM run_checkpoints WHERE fleet = ?1 AND run = ?2)",
    checkpoint_of: "SELECT seq, packed FROM run_checkpoints WHERE fleet = ? AND run = ?",
    log_after: "SELECT entry FROM run_log WHERE fleet = ? AND run = ? AND seq > ? ORDER BY seq",
    // A row is taken while the events after `?3` in the rows before it are fewer than `?4`.
    // Every row after `?3` holds at least one event after it, so `?4` rows are enough to scan;
    // a row's count is written so that no `?3` overflows.
    events_after: "SELECT seq, event, first_seq, packed FROM ( \
                       SELECT seq, event, first_seq, packed, \
                           SUM(seq - MAX(COALESCE(first_seq, seq) - 1, ?3)) OVER (ORDER BY seq) \
                           - (seq - MAX(COALESCE(first_seq, seq) - 1, ?3)) AS before \
                       FROM run_events WHERE fleet = ?1 AND run = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4) AS e \
                   WHERE before < ?4 ORDER BY seq",
    unfinished: "0",
    intents: "SELECT attempt, member, target, operation_id, finished, recorded_at FROM intents WHERE fleet = ? AND run = ? ORDER BY attempt",
    put_head: "INSERT INTO run_heads (fleet, run, head) VALUES (?, ?, ?) ON CONFLICT (fleet, run) DO UPDATE SET head = excluded.head",
    init_head: "INSERT INTO run_heads (fleet, run, head) VALUES (?, ?, ?) ON CONFLICT (fleet, run) DO NOTHING",
    run_heads: "SELECT r.name, h.head FROM resources r LEFT JOIN run_heads h ON h.fleet = r.fleet AND h.run = r.name WHERE r.fleet = ? AND r.kind = 'updateRuns' ORDER BY r.name",
    member_durations: "SELECT member, seconds FROM (SELECT member, seconds, ROW_NUMBER() OVER (PARTITION BY member ORDER BY finished_at DESC, run DESC) AS n \
                       FROM upgrade_durations WHERE fleet = ? AND upgrade_type = ?) AS recent WHERE n <= ? ORDER BY member, n",
    fleet_durations: "SELECT seconds FROM upgrade_durations WHERE fleet = ? AND upgrade_type = ? ORDER BY finished_at DESC, member DESC LIMIT ?",

    create_token: "INSERT INTO tokens (id, hash, role, subject, created_at, revoked) VALUES (?, ?, ?, ?, ?, 0)",
    token_by_hash: "SELECT id, hash, role, subject, created_at, revoked FROM tokens WHERE hash = ?",
    tokens: "SELECT id, hash, role, subject, created_at, revoked FROM tokens ORDER BY created_at, id",
    revoke_token: "UPDATE tokens SET revoked = 1 WHERE id = ?",

    heartbeat: "INSERT INTO replicas (id, expires_at) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
    forget_replicas: "DELETE FROM replicas WHERE expires_at < ?",
    alive_replicas: "SELECT COUNT(*) FROM replicas WHERE expires_at >= ?",
    acquire_lease: "INSERT INTO leases (fleet, owner, epoch, expires_at) VALUES (?, ?, 1, ?)
                    ON CONFLICT (fleet) DO UPDATE SET owner = excluded.owner, epoch = leases.epoch + 1,
                        expires_at = excluded.expires_at
                    WHERE leases.expires_at < ? OR leases.owner = excluded.owner
                    RETURNING epoch",
    renew_lease: "UPDATE leases SET expires_at = ? WHERE fleet = ? AND owner = ? AND epoch = ?",
    release_lease: "UPDATE leases SET expires_at = 0 WHERE fleet = ? AND owner = ? AND epoch = ?",
    leases: "SELECT fleet, owner, epoch, expires_at FROM leases ORDER BY fleet",
    submit_action: "INSERT INTO actions (fleet, run, input) VALUES (?, ?, ?) RETURNING id",
    pending_actions: "SELECT id, run, input FROM actions WHERE fleet = ? AND result IS NULL ORDER BY id",
    finish_action: "UPDATE actions SET result = ? WHERE id = ? AND result IS NULL",
    take_action_result: "DELETE FROM actions WHERE id = ? AND result IS NOT NULL RETURNING result",

    append_audit: "INSERT INTO audit (at, subject, role, method, path, fleet, status, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    prune_audit: "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ? ORDER BY at LIMIT ?)",
    audit_of_fleet: "SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > ? AND at >= ? AND fleet = ? ORDER BY id LIMIT ?",
    audit: "SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > ? AND at >= ? ORDER BY id LIMIT ?",

    lock_webhook_etag: "SELECT etag FROM webhooks WHERE name = ?",
    put_webhook: "INSERT INTO webhooks (name, url, secret, fleets, events, format, system_data, etag) VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
                  ON CONFLICT (name) DO UPDATE SET url = excluded.url, secret = excluded.secret, fleets = excluded.fleets, \
                  events = excluded.events, format = excluded.format, system_data = excluded.system_data, etag = excluded.etag",
    webhook: concat!(
        "SELECT ",
        webhook_columns!(),
        " FROM webhooks WHERE name = ?"
    ),
    webhooks_after: concat!(
        "SELECT ",
        webhook_columns!(),
        " FROM webhooks WHERE name > ? ORDER BY name LIMIT ?"
    ),
    delete_webhook: &[
        "DELETE FROM webhooks WHERE name = ?",
        "DELETE FROM webhook_deliveries WHERE webhook = ?",
    ],
    claim_deliveries: concat!(
        "UPDATE webhook_deliveries SET claimed_until = ?1 WHERE id IN (\
         SELECT id FROM webhook_deliveries WHERE state = 'Pending' AND next_attempt_at <= ?2 \
         AND (claimed_until IS NULL OR claimed_until <= ?2) ORDER BY next_attempt_at, id LIMIT ?3) \
         RETURNING ",
        delivery_columns!()
    ),
    record_delivery: "UPDATE webhook_deliveries SET attempts = attempts + 1, last_attempt_at = ?, last_status = ?, \
                      last_error = ?, state = ?, next_attempt_at = ?, delivered_at = ?, claimed_until = NULL \
                      WHERE id = ? AND state = 'Pending'",
    deliveries_after: concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM webhook_deliveries WHERE webhook = ?1 AND id > ?2 \
         AND (?3 IS NULL OR state = ?3) ORDER BY id LIMIT ?4"
    ),
    prune_deliveries: "DELETE FROM webhook_deliveries WHERE state <> 'Pending' AND created_at < ?",
};
