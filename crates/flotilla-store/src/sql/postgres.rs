//! PostgreSQL's statements (fields in the order of [`Statements`]; `sqlite.rs` beside it).

use super::{Statements, runs};
use crate::{delivery_columns, webhook_columns};

pub(crate) const POSTGRES: Statements = Statements {
    begin_write: None,
    snapshot: Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
    // Every session ends a transaction idle for a second (`PgStore::open`), which protects
    // takeovers from a paused lease holder; a bulk write does work of its own between its
    // statements (deciding thousands of members, rendering their bodies) and waits for its
    // turn on a busy server, which under load took more than a second, and the database
    // ended healthy registrations (`idle-in-transaction timeout`, then `Broken pipe` on the
    // closed connection).
    bulk: Some("SET LOCAL idle_in_transaction_session_timeout = '30s'"),
    // On the channel `PgStore::open` listens on.
    notify: Some("SELECT pg_notify('flotilla', $1)"),
    checkpoint: None,

    // Any number, the same in every replica.
    migrations: crate::migrate::POSTGRES,
    migration_lock: Some("SELECT pg_advisory_xact_lock(7380396435129003105)"),
    legacy_migrations: "SELECT to_regclass('schema_migrations') IS NOT NULL",
    record_migration: "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                       VALUES ($1, $2, TRUE, $3, 0) ON CONFLICT DO NOTHING",

    etag: "SELECT etag FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3",
    lock_etag: "SELECT etag FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3 FOR UPDATE",
    get: "SELECT body, packed, etag FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3",
    get_run: runs!("WHERE r.fleet = $1 AND r.kind = 'updateRuns' AND r.name = $2 ORDER BY c.chunk"),
    list: "SELECT name, body, packed, etag FROM resources WHERE fleet = $1 AND kind = $2 AND name > $3 ORDER BY name LIMIT $4",
    last_run_of_page: "SELECT name FROM resources WHERE fleet = $1 AND kind = 'updateRuns' AND name > $2 ORDER BY name LIMIT 1 OFFSET $3",
    runs_up_to: runs!(
        "WHERE r.fleet = $1 AND r.kind = 'updateRuns' AND r.name > $2 AND r.name <= $3 ORDER BY r.name, c.chunk"
    ),
    runs_after: runs!(
        "WHERE r.fleet = $1 AND r.kind = 'updateRuns' AND r.name > $2 ORDER BY r.name, c.chunk"
    ),
    create: Some(
        "INSERT INTO resources (fleet, kind, name, body, packed, etag) VALUES ($1, $2, $3, $4, $5, $6)",
    ),
    put_frame: "INSERT INTO resources (fleet, kind, name, body, packed, etag, chunks) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                ON CONFLICT (fleet, kind, name) DO UPDATE SET body = excluded.body, packed = excluded.packed, etag = excluded.etag, chunks = excluded.chunks",
    drop_chunks_from: "DELETE FROM run_chunks WHERE fleet = $1 AND run = $2 AND chunk >= $3",
    forget_run_parts: &[
        "DELETE FROM run_heads WHERE fleet = $1 AND run = $2",
        "DELETE FROM run_chunks WHERE fleet = $1 AND run = $2",
        "DELETE FROM run_checkpoints WHERE fleet = $1 AND run = $2",
    ],
    delete: "DELETE FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3",
    delete_run_parts: &[
        "DELETE FROM resources WHERE fleet = $1 AND kind = 'updateRunSnapshots' AND name = $2",
        "DELETE FROM run_log WHERE fleet = $1 AND run = $2",
        "DELETE FROM run_events WHERE fleet = $1 AND run = $2",
        "DELETE FROM intents WHERE fleet = $1 AND run = $2",
        "DELETE FROM run_heads WHERE fleet = $1 AND run = $2",
        "DELETE FROM run_chunks WHERE fleet = $1 AND run = $2",
        "DELETE FROM run_checkpoints WHERE fleet = $1 AND run = $2",
        "DELETE FROM resources WHERE fleet = $1 AND kind = 'gates' AND body::jsonb #>> '{properties,target,updateRunProperties,name}' = $2",
    ],
    delete_member_parts: &["DELETE FROM member_clusters WHERE fleet = $1 AND member = $2"],
    delete_fleet_parts: &[
        "DELETE FROM member_clusters WHERE fleet = $1",
        "DELETE FROM resources WHERE fleet = $1",
        "DELETE FROM run_log WHERE fleet = $1",
        "DELETE FROM run_events WHERE fleet = $1",
        "DELETE FROM intents WHERE fleet = $1",
        "DELETE FROM run_heads WHERE fleet = $1",
        "DELETE FROM run_chunks WHERE fleet = $1",
        "DELETE FROM run_checkpoints WHERE fleet = $1",
        "DELETE FROM upgrade_durations WHERE fleet = $1",
    ],

    lock_lease: "SELECT owner, epoch FROM leases WHERE fleet = $1 FOR UPDATE",
    append_log: (
        "SELECT COALESCE(MAX(seq), 0) FROM run_log WHERE fleet = $1 AND run = $2",
        "INSERT INTO run_log (fleet, run, seq, entry) ",
    ),
    append_events: (
        "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE fleet = $1 AND run = $2",
        "INSERT INTO run_events (fleet, run, seq, event, first_seq, packed) ",
    ),
    put_checkpoint: "INSERT INTO run_checkpoints (fleet, run, seq, packed) \
                     SELECT $1, $2, MAX(seq), $3 FROM run_log WHERE fleet = $1 AND run = $2 \
                     ON CONFLICT (fleet, run) DO UPDATE SET seq = excluded.seq, packed = excluded.packed",
    trim_log: "DELETE FROM run_log WHERE fleet = $1 AND run = $2 \
               AND seq < (SELECT seq FROM run_checkpoints WHERE fleet = $1 AND run = $2)",
    checkpoint_of: "SELECT seq, packed FROM run_checkpoints WHERE fleet = $1 AND run = $2",
    log_after: "SELECT entry FROM run_log WHERE fleet = $1 AND run = $2 AND seq > $3 ORDER BY seq",
    // A row is taken while the events after `$3` in the rows before it are fewer than `$4`.
    // Every row after `$3` holds at least one event after it, so `$4` rows are enough to scan;
    // a row's count is written so that no `$3` overflows.
    events_after: "SELECT seq, event, first_seq, packed FROM ( \
                       SELECT seq, event, first_seq, packed, \
                           (SUM(seq - GREATEST(COALESCE(first_seq, seq) - 1, $3)) OVER (ORDER BY seq))::BIGINT \
                           - (seq - GREATEST(COALESCE(first_seq, seq) - 1, $3)) AS before \
                       FROM run_events WHERE fleet = $1 AND run = $2 AND seq > $3 ORDER BY seq LIMIT $4) AS e \
                   WHERE before < $4 ORDER BY seq",
    unfinished: "FALSE",
    intents: "SELECT attempt, member, target, operation_id, finished, recorded_at FROM intents WHERE fleet = $1 AND run = $2 ORDER BY attempt",
    put_head: "INSERT INTO run_heads (fleet, run, head) VALUES ($1, $2, $3) ON CONFLICT (fleet, run) DO UPDATE SET head = excluded.head",
    init_head: "INSERT INTO run_heads (fleet, run, head) VALUES ($1, $2, $3) ON CONFLICT (fleet, run) DO NOTHING",
    run_heads: "SELECT r.name, h.head FROM resources r LEFT JOIN run_heads h ON h.fleet = r.fleet AND h.run = r.name WHERE r.fleet = $1 AND r.kind = 'updateRuns' ORDER BY r.name",
    member_durations: "SELECT member, seconds FROM (SELECT member, seconds, ROW_NUMBER() OVER (PARTITION BY member ORDER BY finished_at DESC, run DESC) AS n \
                       FROM upgrade_durations WHERE fleet = $1 AND upgrade_type = $2) AS recent WHERE n <= $3 ORDER BY member, n",
    fleet_durations: "SELECT seconds FROM upgrade_durations WHERE fleet = $1 AND upgrade_type = $2 ORDER BY finished_at DESC, member DESC LIMIT $3",

    create_token: "INSERT INTO tokens (id, hash, role, subject, created_at, revoked) VALUES ($1, $2, $3, $4, $5, FALSE)",
    token_by_hash: "SELECT id, hash, role, subject, created_at, revoked FROM tokens WHERE hash = $1",
    tokens: "SELECT id, hash, role, subject, created_at, revoked FROM tokens ORDER BY created_at, id",
    revoke_token: "UPDATE tokens SET revoked = TRUE WHERE id = $1",

    heartbeat: "INSERT INTO replicas (id, expires_at) VALUES ($1, now() + $2 * interval '1 millisecond') ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
    forget_replicas: "DELETE FROM replicas WHERE expires_at < now() - interval '1 hour'",
    alive_replicas: "SELECT COUNT(*) FROM replicas WHERE expires_at >= now()",
    acquire_lease: "INSERT INTO leases (fleet, owner, epoch, expires_at)
                        VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond')
                    ON CONFLICT (fleet) DO UPDATE SET owner = excluded.owner, epoch = leases.epoch + 1,
                        expires_at = excluded.expires_at
                    WHERE leases.expires_at < now() OR leases.owner = excluded.owner
                    RETURNING epoch",
    renew_lease: "UPDATE leases SET expires_at = now() + $1 * interval '1 millisecond'
                  WHERE fleet = $2 AND owner = $3 AND epoch = $4",
    release_lease: "UPDATE leases SET expires_at = now() - interval '1 millisecond'
                    WHERE fleet = $1 AND owner = $2 AND epoch = $3",
    leases: "SELECT fleet, owner, epoch,
                 (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::BIGINT
             FROM leases ORDER BY fleet",
    submit_action: "INSERT INTO actions (fleet, run, input) VALUES ($1, $2, $3) RETURNING id",
    pending_actions: "SELECT id, run, input FROM actions WHERE fleet = $1 AND result IS NULL ORDER BY id",
    finish_action: "UPDATE actions SET result = $1 WHERE id = $2 AND result IS NULL",
    take_action_result: "DELETE FROM actions WHERE id = $1 AND result IS NOT NULL RETURNING result",

    append_audit: "INSERT INTO audit (at, subject, role, method, path, fleet, status, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    prune_audit: "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < $1 ORDER BY at LIMIT $2)",
    audit_of_fleet: "SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > $1 AND at >= $2 AND fleet = $3 ORDER BY id LIMIT $4",
    audit: "SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > $1 AND at >= $2 ORDER BY id LIMIT $3",

    lock_webhook_etag: "SELECT etag FROM webhooks WHERE name = $1 FOR UPDATE",
    put_webhook: "INSERT INTO webhooks (name, url, secret, fleets, events, format, system_data, etag) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                  ON CONFLICT (name) DO UPDATE SET url = excluded.url, secret = excluded.secret, fleets = excluded.fleets, \
                  events = excluded.events, format = excluded.format, system_data = excluded.system_data, etag = excluded.etag \
                  RETURNING (xmax = 0)",
    webhook: concat!(
        "SELECT ",
        webhook_columns!(),
        " FROM webhooks WHERE name = $1"
    ),
    webhooks_after: concat!(
        "SELECT ",
        webhook_columns!(),
        " FROM webhooks WHERE name > $1 ORDER BY name LIMIT $2"
    ),
    delete_webhook: &[
        "DELETE FROM webhooks WHERE name = $1",
        "DELETE FROM webhook_deliveries WHERE webhook = $1",
    ],
    // Rows another replica is claiming at this moment are skipped, not waited for.
    claim_deliveries: concat!(
        "UPDATE webhook_deliveries SET claimed_until = $1 WHERE id IN (",
        "SELECT id FROM webhook_deliveries WHERE state = 'Pending' AND next_attempt_at <= $2 ",
        "AND (claimed_until IS NULL OR claimed_until <= $2) ORDER BY next_attempt_at, id LIMIT $3 ",
        "FOR UPDATE SKIP LOCKED) RETURNING ",
        delivery_columns!()
    ),
    record_delivery: "UPDATE webhook_deliveries SET attempts = attempts + 1, last_attempt_at = $1, last_status = $2, \
                      last_error = $3, state = $4, next_attempt_at = $5, delivered_at = $6, claimed_until = NULL \
                      WHERE id = $7 AND state = 'Pending'",
    deliveries_after: concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM webhook_deliveries WHERE webhook = $1 AND id > $2 ",
        "AND ($3::text IS NULL OR state = $3) ORDER BY id LIMIT $4"
    ),
    prune_deliveries: "DELETE FROM webhook_deliveries WHERE state <> 'Pending' AND created_at < $1",
};
