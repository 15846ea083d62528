//! The PostgreSQL store: the same interface as SQLite, for several replicas sharing one
//! database. Time for leases is the database's clock, so replicas' clocks do not matter; notices
//! travel between replicas with LISTEN/NOTIFY, sent inside the writing transaction so they are
//! delivered only once it commits.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Transaction};
use tokio::sync::broadcast;

use super::{
    Audit, AuditEntry, Col, Coordination, Delivery, DeliveryAttempt, DeliveryState, DueDelivery,
    DurationHistory, Intent, Kind, Lease, MemberWrite, Notice, OperationRecord, PACKED_BODY,
    PendingAction, Precondition, RegisterMode, Registered, RegistrationPlan, Resource, Resources,
    RunBatch, RunDocument, RunLog, StoreError, StoreResult, StoredLog, TokenRecord, Tokens,
    Webhook, Webhooks, assemble_rows, attempt_columns, check, checkpoint_needs_entries,
    delivery_columns, delivery_row, fenced, fleet_event_rows, millis, outbox_rows, pack,
    pack_chunk, parse_body, part_row, same_run, unix_millis, unpack, webhook_columns, webhook_row,
    with_status,
};

/// The channel notices travel on.
const CHANNEL: &str = "flotilla";

/// Any number, the same in every replica: the advisory lock migrations hold.
const MIGRATION_LOCK: i64 = 0x666c_6f74_696c_6c61;

/// How long a bulk write that holds no lease row (a batch registration, a fleet's observed
/// statuses) may wait on its client between statements. Every session ends a transaction
/// idle for a second ([`PgStore::open`]), which protects takeovers from a paused lease
/// holder; a bulk write does work of its own between its statements (deciding thousands of
/// members, rendering their bodies) and waits for its turn on a busy server, which under
/// load took more than a second, and the database ended healthy registrations
/// (`idle-in-transaction timeout`, then `Broken pipe` on the closed connection).
const BULK_IDLE: &str = "SET LOCAL idle_in_transaction_session_timeout = '30s'";

/// Attempts a batch registration gets when the database ends its transaction for a reason of
/// its own ([`rolled_back`]).
const REGISTER_ATTEMPTS: u32 = 3;

pub struct PgStore {
    pool: PgPool,
    notices: broadcast::Sender<Notice>,
}

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/database`), runs migrations (one replica
    /// at a time), and starts listening for other replicas' notices.
    pub async fn open(url: &str) -> StoreResult<PgStore> {
        let options: PgConnectOptions = url.parse().map_err(|e| {
            // The URL may hold a password: it is not repeated.
            StoreError::Unavailable(format!("--database: not a PostgreSQL URL: {e}"))
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(
                options
                    .application_name("flotilla")
                    // A replica paused or cut off inside a transaction would hold its row locks
                    // (a fleet's lease row among them) and block every other replica's
                    // takeover; the database ends such a session instead. Flotilla's
                    // transactions never wait between statements for anything but the database.
                    .options([("idle_in_transaction_session_timeout", "1000")]),
            )
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot connect to {url}: {e}")))?;
        let store = PgStore {
            pool,
            notices: broadcast::channel(4096).0,
        };
        store.migrate().await?;
        let mut listener = PgListener::connect_with(&store.pool).await?;
        listener.listen(CHANNEL).await?;
        let notices = store.notices.clone();
        tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(n) => {
                        if let Some(notice) = Notice::from_payload(n.payload()) {
                            let _ = notices.send(notice);
                        }
                    }
                    Err(e) => {
                        // The listener reconnects by itself; notices sent meanwhile are lost,
                        // which the periodic passes of the coordinator make up for.
                        tracing::warn!(error = %e, "listening for notices failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(store)
    }

    async fn migrate(&self) -> StoreResult<()> {
        use sqlx::migrate::Migrate;
        let migrator = crate::migrate::migrator(crate::migrate::POSTGRES);
        let mut tx = self.pool.begin().await?;
        // Replicas starting together take a database made before the migrator one after the
        // other; the migrator then holds its own lock.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        let legacy: bool = sqlx::query("SELECT to_regclass('schema_migrations') IS NOT NULL")
            .fetch_one(&mut *tx)
            .await?
            .col(0)?;
        if legacy {
            let applied: Vec<i64> = sqlx::query("SELECT version FROM schema_migrations")
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| r.col(0))
                .collect::<StoreResult<_>>()?;
            let done = crate::migrate::legacy(&migrator, &applied)?;
            (*tx)
                .ensure_migrations_table(&migrator.table_name)
                .await
                .map_err(crate::migrate::failed)?;
            for m in done {
                sqlx::query(
                    "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                     VALUES ($1, $2, TRUE, $3, 0) ON CONFLICT DO NOTHING",
                )
                .bind(m.version)
                .bind(m.description.as_ref())
                .bind(m.checksum.as_ref())
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query("DROP TABLE schema_migrations")
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        migrator
            .run(&self.pool)
            .await
            .map_err(crate::migrate::failed)
    }

    /// One attempt at [`Resources::register_members`], in one transaction. A few statements
    /// whatever the number of members, each binding arrays: over a network a statement per
    /// member costs a round trip each. Rows are read through a lateral lookup per name, by
    /// key, whatever the table's statistics say: a plan made while a fleet grows faster than
    /// they follow would otherwise scan the whole fleet.
    async fn register_once(
        &self,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(BULK_IDLE).execute(&mut *tx).await?;
        let mut names: Vec<&str> = writes.iter().map(|w| w.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let mut stored = HashMap::new();
        for r in sqlx::query(
            "SELECT r.* FROM UNNEST($2::text[]) AS u(n) CROSS JOIN LATERAL (SELECT name, body, etag FROM resources WHERE fleet = $1 AND kind = 'members' AND name = u.n FOR UPDATE) r",
        )
        .bind(fleet)
        .bind(&names)
        .fetch_all(&mut *tx)
        .await?
        {
            stored.insert(r.col(0)?, (r.col(1)?, r.col(2)?));
        }
        let mut holders = HashMap::new();
        for r in sqlx::query(
            "SELECT r.* FROM UNNEST($2::text[]) AS u(n) CROSS JOIN LATERAL (SELECT cluster_key, member FROM member_clusters WHERE fleet = $1 AND cluster_key = u.n) r",
        )
        .bind(fleet)
        .bind(RegistrationPlan::keys(writes))
        .fetch_all(&mut *tx)
        .await?
        {
            holders.insert(r.col(0)?, r.col(1)?);
        }
        let plan = RegistrationPlan::decide(writes, mode, &stored, &holders)?;
        if !plan.claims.is_empty() {
            // Two registrations racing for one id: the primary key decides, and the loser is
            // told to send again.
            let (keys, members): (Vec<&str>, Vec<&str>) = plan
                .claims
                .iter()
                .map(|(k, m, _)| (k.as_str(), m.as_str()))
                .unzip();
            let won: HashSet<String> = sqlx::query(
                "INSERT INTO member_clusters (fleet, cluster_key, member)
                 SELECT $1, k, m FROM UNNEST($2::text[], $3::text[]) AS u(k, m)
                 ON CONFLICT DO NOTHING RETURNING cluster_key",
            )
            .bind(fleet)
            .bind(&keys)
            .bind(&members)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.col(0))
            .collect::<StoreResult<_>>()?;
            if let Some((_, member, item)) = plan.claims.iter().find(|c| !won.contains(&c.0)) {
                return Err(racing(*item, member));
            }
        }
        let etags = next_etags(&mut tx, plan.items.len()).await?;
        // One row per member, its last item's body (an item sees the ones before it): a
        // statement may not touch a row twice.
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (i, (name, _, _)) in plan.items.iter().enumerate() {
            last.insert(name, i);
        }
        let mut rows: Vec<usize> = last.into_values().collect();
        rows.sort_unstable();
        let rows: Vec<(&str, &str, &str)> = rows
            .into_iter()
            .map(|i| {
                let (name, body, _) = &plan.items[i];
                (name.as_str(), body.as_str(), etags[i].as_str())
            })
            .collect();
        let inserted = put_rows(&mut tx, fleet, Kind::Member, &rows).await?;
        let mut registered = Registered::default();
        for (item, ((name, _, created), etag)) in plan.items.iter().zip(etags).enumerate() {
            if *created && !inserted.contains(name.as_str()) {
                // Created by another transaction since it was read: nothing is written.
                return Err(racing(item, name));
            }
            registered.written.push((etag, *created));
        }
        commit(tx).await?;
        Ok(registered)
    }
}

async fn notify(tx: &mut Transaction<'_, Postgres>, notice: &Notice) -> StoreResult<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(notice.to_payload())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The current eTag, with the row locked until the transaction ends.
async fn current_etag(
    tx: &mut Transaction<'_, Postgres>,
    fleet: &str,
    kind: Kind,
    name: &str,
) -> StoreResult<Option<String>> {
    sqlx::query(
        "SELECT etag FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3 FOR UPDATE",
    )
    .bind(fleet)
    .bind(kind.as_str())
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?
    .map(|r| r.col(0))
    .transpose()
}

/// Creates or replaces resources, `(name, body, eTag)` each, in one statement (a name at most
/// once); returns the names it created (`xmax` is zero on a row the statement inserted).
async fn put_rows(
    tx: &mut Transaction<'_, Postgres>,
    fleet: &str,
    kind: Kind,
    rows: &[(&str, &str, &str)],
) -> StoreResult<HashSet<String>> {
    let mut names = Vec::with_capacity(rows.len());
    let mut bodies = Vec::with_capacity(rows.len());
    let mut packs = Vec::with_capacity(rows.len());
    let mut etags = Vec::with_capacity(rows.len());
    for (name, body, etag) in rows {
        let (body, packed) = pack(kind, body)?;
        names.push(*name);
        bodies.push(body);
        packs.push(packed);
        etags.push(*etag);
    }
    let mut created = HashSet::new();
    for r in sqlx::query(
        "INSERT INTO resources (fleet, kind, name, body, packed, etag)
         SELECT $1, $2, n, b, p, e FROM UNNEST($3::text[], $4::text[], $5::bytea[], $6::text[]) AS u(n, b, p, e)
         ON CONFLICT (fleet, kind, name) DO UPDATE SET body = excluded.body, packed = excluded.packed, etag = excluded.etag, chunks = NULL
         RETURNING name, (xmax = 0)",
    )
    .bind(fleet)
    .bind(kind.as_str())
    .bind(&names)
    .bind(&bodies)
    .bind(&packs)
    .bind(&etags)
    .fetch_all(&mut **tx)
    .await?
    {
        if r.col::<bool>(1)? {
            created.insert(r.col(0)?);
        }
    }
    Ok(created)
}

/// Writes a run's document as a status write stores it: its frame in the run's resource, the
/// chunks that changed, and none past its count ([`RunDocument`]).
async fn put_document(
    tx: &mut Transaction<'_, Postgres>,
    fleet: &str,
    run: &str,
    document: &RunDocument,
) -> StoreResult<()> {
    let etag = next_etag(tx).await?;
    let frame = serde_json::to_string(&document.frame)
        .map_err(|e| StoreError::Unavailable(format!("cannot write a run's frame: {e}")))?;
    let (body, packed) = pack(Kind::Run, &frame)?;
    sqlx::query(
        "INSERT INTO resources (fleet, kind, name, body, packed, etag, chunks) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (fleet, kind, name) DO UPDATE SET body = excluded.body, packed = excluded.packed, etag = excluded.etag, chunks = excluded.chunks",
    )
    .bind(fleet)
    .bind(Kind::Run.as_str())
    .bind(run)
    .bind(body)
    .bind(packed)
    .bind(&etag)
    .bind(i64::from(document.chunks))
    .execute(&mut **tx)
    .await?;
    if !document.changed.is_empty() {
        let mut indices = Vec::with_capacity(document.changed.len());
        let mut slots = Vec::with_capacity(document.changed.len());
        let mut bodies = Vec::with_capacity(document.changed.len());
        let mut packs = Vec::with_capacity(document.changed.len());
        for chunk in &document.changed {
            let (body, packed) = pack_chunk(&chunk.text)?;
            indices.push(i64::from(chunk.index));
            slots.push(i64::from(chunk.slot));
            bodies.push(body);
            packs.push(packed);
        }
        sqlx::query(
            "INSERT INTO run_chunks (fleet, run, chunk, slot, body, packed) \
             SELECT $1, $2, c, s, b, p FROM UNNEST($3::bigint[], $4::bigint[], $5::text[], $6::bytea[]) AS u(c, s, b, p) \
             ON CONFLICT (fleet, run, chunk) DO UPDATE SET slot = excluded.slot, body = excluded.body, packed = excluded.packed",
        )
        .bind(fleet)
        .bind(run)
        .bind(&indices)
        .bind(&slots)
        .bind(&bodies)
        .bind(&packs)
        .execute(&mut **tx)
        .await?;
    }
    sqlx::query("DELETE FROM run_chunks WHERE fleet = $1 AND run = $2 AND chunk >= $3")
        .bind(fleet)
        .bind(run)
        .bind(i64::from(document.chunks))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// `n` new eTags in one statement.
async fn next_etags(tx: &mut Transaction<'_, Postgres>, n: usize) -> StoreResult<Vec<String>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    sqlx::query("SELECT nextval('etag_seq') FROM generate_series(1, $1)")
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|r| r.col::<i64>(0).map(|n| format!("\"{n}\"")))
        .collect()
}

async fn next_etag(tx: &mut Transaction<'_, Postgres>) -> StoreResult<String> {
    Ok(next_etags(tx, 1).await?.remove(0))
}

/// Creates or replaces a resource; returns its new eTag and whether this created it (decided by
/// the insert itself, so of two racing creators only one is told it created the resource).
async fn upsert(
    tx: &mut Transaction<'_, Postgres>,
    fleet: &str,
    kind: Kind,
    name: &str,
    body: &str,
) -> StoreResult<(String, bool)> {
    let etag = next_etag(tx).await?;
    let created = put_rows(tx, fleet, kind, &[(name, body, &etag)]).await?;
    Ok((etag, created.contains(name)))
}

/// Appends entries to one of a run's numbered logs; returns the number the first was given. Only the fleet's lease holder writes a run's
/// logs, and its batch holds the lease row locked, so the numbers do not race.
async fn append<E: ToString>(
    tx: &mut Transaction<'_, Postgres>,
    last_seq: &'static str,
    insert: &'static str,
    batch: &RunBatch,
    entries: &[E],
) -> StoreResult<i64> {
    if entries.is_empty() {
        return Ok(0);
    }
    let next: i64 = sqlx::query(last_seq)
        .bind(&batch.fleet)
        .bind(&batch.run)
        .fetch_one(&mut **tx)
        .await?
        .col(0)?;
    // Many rows per statement: a batch of thousands costs a few round trips, not thousands.
    for (c, chunk) in entries.chunks(crate::ROWS_PER_INSERT).enumerate() {
        let first = next + 1 + (c * crate::ROWS_PER_INSERT) as i64;
        let mut q = sqlx::QueryBuilder::<Postgres>::new(insert);
        q.push_values(chunk.iter().enumerate(), |mut row, (i, entry)| {
            row.push_bind(batch.fleet.clone())
                .push_bind(batch.run.clone())
                .push_bind(first + i as i64)
                .push_bind(entry.to_string());
        });
        q.build().execute(&mut **tx).await?;
    }
    Ok(next + 1)
}

/// Two registrations of one member or one cluster id at the same time: the later is refused
/// whole, and may be sent again.
fn racing(item: usize, member: &str) -> StoreError {
    StoreError::Refused {
        item,
        field: "properties.clusterResourceId",
        conflict: true,
        message: format!(
            "member {member:?} or its cluster was registered by another request at the same time; send it again"
        ),
    }
}

fn unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("23505"))
}

/// Whether the database rolled the transaction back for a reason of its own, so that running
/// it again as it is may succeed: a serialization failure (40001), a deadlock it broke
/// (40P01), the session ended while the transaction waited on its client (25P03), or the
/// connection lost before the commit was sent ([`commit`] turns a loss during the commit
/// into an error of its own: whether that one committed is not known).
fn rolled_back(e: &StoreError) -> bool {
    match e {
        StoreError::Database(sqlx::Error::Database(d)) => {
            matches!(d.code().as_deref(), Some("40001" | "40P01" | "25P03"))
        }
        StoreError::Database(sqlx::Error::Io(_)) => true,
        _ => false,
    }
}

/// Commits; a connection lost during the commit is said so, never taken for a rollback.
async fn commit(tx: Transaction<'_, Postgres>) -> StoreResult<()> {
    tx.commit().await.map_err(|e| match e {
        sqlx::Error::Io(io) => StoreError::Unavailable(format!(
            "the database connection was lost while committing ({io}): the write may or may \
             not have been made; read it back before sending it again"
        )),
        other => other.into(),
    })
}

#[async_trait]
impl Resources for PgStore {
    async fn etag(&self, fleet: &str, kind: Kind, name: &str) -> StoreResult<Option<String>> {
        sqlx::query("SELECT etag FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3")
            .bind(fleet)
            .bind(kind.as_str())
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.col(0))
            .transpose()
    }

    async fn get_raw(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
    ) -> StoreResult<Option<(String, String)>> {
        if kind == Kind::Run {
            // One statement: one snapshot of the frame and its chunks.
            let rows = sqlx::query(
                "SELECT r.name, r.body, r.packed, r.etag, r.chunks, c.chunk, c.slot, c.body, c.packed \
                 FROM resources r LEFT JOIN run_chunks c ON c.fleet = r.fleet AND c.run = r.name AND c.chunk < r.chunks \
                 WHERE r.fleet = $1 AND r.kind = 'updateRuns' AND r.name = $2 ORDER BY c.chunk",
            )
            .bind(fleet)
            .bind(name)
            .fetch_all(&self.pool)
            .await?;
            let rows = rows.iter().map(part_row).collect::<StoreResult<_>>()?;
            return Ok(assemble_rows(rows)?
                .pop()
                .map(|(_, text, etag)| (text, etag)));
        }
        let row = sqlx::query(
            "SELECT body, packed, etag FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3",
        )
        .bind(fleet)
        .bind(kind.as_str())
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| Ok((unpack(r.col(0)?, r.col(1)?)?, r.col(2)?)))
            .transpose()
    }

    async fn list_raw(
        &self,
        fleet: &str,
        kind: Kind,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<(String, String, String)>> {
        if kind == Kind::Run {
            if limit == 0 {
                return Ok(Vec::new());
            }
            // The page's last name first, then the runs up to it with their chunks: read as
            // one range in the order of both primary keys, a page needs no sort (a sort of
            // tens of megabytes of chunks spilled to disk). Both statements read one snapshot.
            let mut tx = self.pool.begin().await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
            let last: Option<String> = sqlx::query(
                "SELECT name FROM resources WHERE fleet = $1 AND kind = 'updateRuns' AND name > $2 ORDER BY name LIMIT 1 OFFSET $3",
            )
            .bind(fleet)
            .bind(after.unwrap_or(""))
            .bind((limit - 1).min(i64::MAX as usize) as i64)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.col(0))
            .transpose()?;
            macro_rules! page {
                ($rest:literal) => {
                    concat!(
                        "SELECT r.name, r.body, r.packed, r.etag, r.chunks, c.chunk, c.slot, c.body, c.packed \
                         FROM resources r LEFT JOIN run_chunks c ON c.fleet = r.fleet AND c.run = r.name AND c.chunk < r.chunks \
                         WHERE r.fleet = $1 AND r.kind = 'updateRuns' AND r.name > $2",
                        $rest
                    )
                };
            }
            let query = match last {
                Some(_) => page!(" AND r.name <= $3 ORDER BY r.name, c.chunk"),
                // Fewer than a page left: all of them.
                None => page!(" ORDER BY r.name, c.chunk"),
            };
            let mut rows = sqlx::query(query).bind(fleet).bind(after.unwrap_or(""));
            if let Some(last) = last {
                rows = rows.bind(last);
            }
            let rows = rows.fetch_all(&mut *tx).await?;
            tx.commit().await?;
            let rows = rows.iter().map(part_row).collect::<StoreResult<_>>()?;
            return assemble_rows(rows);
        }
        let rows = sqlx::query(
            "SELECT name, body, packed, etag FROM resources WHERE fleet = $1 AND kind = $2 AND name > $3 ORDER BY name LIMIT $4",
        )
        .bind(fleet)
        .bind(kind.as_str())
        .bind(after.unwrap_or(""))
        .bind(limit.min(i64::MAX as usize) as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.col(0)?, unpack(r.col(1)?, r.col(2)?)?, r.col(3)?)))
            .collect()
    }

    async fn list(
        &self,
        fleet: &str,
        kind: Kind,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<Resource>> {
        self.list_raw(fleet, kind, after, limit)
            .await?
            .into_iter()
            .map(|(name, body, etag)| {
                Ok(Resource {
                    name,
                    body: parse_body(&body)?,
                    etag,
                })
            })
            .collect()
    }

    async fn put_raw(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
        text: &str,
        when: &Precondition,
    ) -> StoreResult<(String, bool)> {
        let mut tx = self.pool.begin().await?;
        let current = current_etag(&mut tx, fleet, kind, name).await?;
        check(current.as_deref(), when)?;
        if current.is_none() && *when == Precondition::IfNoneMatchAny {
            // Two creations racing: the row lock above cannot hold a row that does not exist
            // yet, so the insert itself decides.
            let etag = next_etag(&mut tx).await?;
            let (stored, packed) = pack(kind, text)?;
            let inserted = sqlx::query(
                "INSERT INTO resources (fleet, kind, name, body, packed, etag) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(fleet)
            .bind(kind.as_str())
            .bind(name)
            .bind(stored)
            .bind(packed)
            .bind(&etag)
            .execute(&mut *tx)
            .await;
            return match inserted {
                Ok(_) => {
                    tx.commit().await?;
                    Ok((etag, true))
                }
                Err(e) if unique_violation(&e) => Err(StoreError::Precondition(
                    "If-None-Match *: the resource already exists".into(),
                )),
                Err(e) => Err(e.into()),
            };
        }
        let (etag, created) = upsert(&mut tx, fleet, kind, name, text).await?;
        if kind == Kind::Run {
            // A run written whole (created or replaced) has no head until one is set, no
            // chunks and no checkpoint.
            for statement in [
                "DELETE FROM run_heads WHERE fleet = $1 AND run = $2",
                "DELETE FROM run_chunks WHERE fleet = $1 AND run = $2",
                "DELETE FROM run_checkpoints WHERE fleet = $1 AND run = $2",
            ] {
                sqlx::query(statement)
                    .bind(fleet)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok((etag, created))
    }

    async fn register_members(
        &self,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered> {
        // All or nothing: a transaction the database ended by itself wrote nothing, and is run
        // again from the start (it reads what another writer committed meanwhile).
        let mut attempt = 1;
        loop {
            match self.register_once(fleet, writes, mode).await {
                Err(e) if rolled_back(&e) && attempt < REGISTER_ATTEMPTS => {
                    tracing::info!(fleet, attempt, error = %e, "registration rolled back by the database; running it again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) if rolled_back(&e) => {
                    return Err(StoreError::Busy(format!(
                        "the database ended the registration's transaction {attempt} times ({e}); nothing was written: send it again"
                    )));
                }
                other => return other,
            }
        }
    }
    async fn set_statuses(
        &self,
        fleet: &str,
        kind: Kind,
        statuses: &[(String, Value)],
    ) -> StoreResult<()> {
        if statuses.is_empty() {
            return Ok(());
        }
        // The last status given for a name is the one that stays.
        let mut latest: HashMap<&str, &Value> = HashMap::new();
        for (name, status) in statuses {
            latest.insert(name, status);
        }
        let mut names: Vec<&str> = latest.keys().copied().collect();
        names.sort_unstable();
        let mut tx = self.pool.begin().await?;
        sqlx::query(BULK_IDLE).execute(&mut *tx).await?;
        let current = sqlx::query(
            "SELECT r.* FROM UNNEST($2::text[]) AS u(n) CROSS JOIN LATERAL (SELECT name, body, packed FROM resources WHERE fleet = $1 AND kind = $3 AND name = u.n FOR UPDATE) r",
        )
        .bind(fleet)
        .bind(&names)
        .bind(kind.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let etags = next_etags(&mut tx, current.len()).await?;
        let mut texts = Vec::with_capacity(current.len());
        for r in current {
            let name: String = r.col(0)?;
            let text = unpack(r.col(1)?, r.col(2)?)?;
            let status = latest.get(name.as_str()).copied().unwrap_or(&Value::Null);
            texts.push((name, with_status(&text, status)?.to_string()));
        }
        // Every row exists and is locked: each is replaced, found by its key.
        let rows: Vec<(&str, &str, &str)> = texts
            .iter()
            .zip(&etags)
            .map(|((name, text), etag)| (name.as_str(), text.as_str(), etag.as_str()))
            .collect();
        put_rows(&mut tx, fleet, kind, &rows).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn delete(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
        when: &Precondition,
    ) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        if kind == Kind::Run {
            // A run's batches lock its snapshot before its resource; so does its deletion, so
            // the two never wait for each other in opposite orders.
            current_etag(&mut tx, fleet, Kind::RunSnapshot, name).await?;
        }
        let current = current_etag(&mut tx, fleet, kind, name).await?;
        check(current.as_deref(), when)?;
        if current.is_none() {
            return Ok(false);
        }
        sqlx::query("DELETE FROM resources WHERE fleet = $1 AND kind = $2 AND name = $3")
            .bind(fleet)
            .bind(kind.as_str())
            .bind(name)
            .execute(&mut *tx)
            .await?;
        match kind {
            Kind::Run => {
                for statement in [
                    "DELETE FROM resources WHERE fleet = $1 AND kind = 'updateRunSnapshots' AND name = $2",
                    "DELETE FROM run_log WHERE fleet = $1 AND run = $2",
                    "DELETE FROM run_events WHERE fleet = $1 AND run = $2",
                    "DELETE FROM intents WHERE fleet = $1 AND run = $2",
                    "DELETE FROM run_heads WHERE fleet = $1 AND run = $2",
                    "DELETE FROM run_chunks WHERE fleet = $1 AND run = $2",
                    "DELETE FROM run_checkpoints WHERE fleet = $1 AND run = $2",
                    "DELETE FROM resources WHERE fleet = $1 AND kind = 'gates' AND body::jsonb #>> '{properties,target,updateRunProperties,name}' = $2",
                ] {
                    sqlx::query(statement)
                        .bind(fleet)
                        .bind(name)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            Kind::Member => {
                sqlx::query("DELETE FROM member_clusters WHERE fleet = $1 AND member = $2")
                    .bind(fleet)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
            Kind::Fleet => {
                for statement in [
                    "DELETE FROM member_clusters WHERE fleet = $1",
                    "DELETE FROM resources WHERE fleet = $1",
                    "DELETE FROM run_log WHERE fleet = $1",
                    "DELETE FROM run_events WHERE fleet = $1",
                    "DELETE FROM intents WHERE fleet = $1",
                    "DELETE FROM run_heads WHERE fleet = $1",
                    "DELETE FROM run_chunks WHERE fleet = $1",
                    "DELETE FROM run_checkpoints WHERE fleet = $1",
                    "DELETE FROM upgrade_durations WHERE fleet = $1",
                ] {
                    sqlx::query(statement).bind(name).execute(&mut *tx).await?;
                }
            }
            _ => {}
        }
        tx.commit().await?;
        Ok(true)
    }
}

#[async_trait]
impl RunLog for PgStore {
    async fn write_run_batch(&self, batch: &RunBatch) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        write_batch(&mut tx, batch).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn write_run_batches(&self, batches: &[RunBatch]) -> StoreResult<Vec<StoreResult<()>>> {
        let mut tx = self.pool.begin().await?;
        let mut results = Vec::with_capacity(batches.len());
        for batch in batches {
            // A run replaced or deleted is refused alone (its checks come before any write);
            // anything else, the loss of the lease included, refuses them all.
            match write_batch(&mut tx, batch).await {
                Err(e @ StoreError::Superseded(_)) => results.push(Err(e)),
                Err(e) => return Err(e),
                Ok(()) => results.push(Ok(())),
            }
        }
        tx.commit().await?;
        Ok(results)
    }

    async fn run_heads(&self, fleet: &str) -> StoreResult<Vec<(String, Option<String>)>> {
        let rows = sqlx::query(
            "SELECT r.name, h.head FROM resources r LEFT JOIN run_heads h ON h.fleet = r.fleet AND h.run = r.name WHERE r.fleet = $1 AND r.kind = 'updateRuns' ORDER BY r.name",
        )
        .bind(fleet)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.col(0)?, r.col(1)?))).collect()
    }

    async fn init_run_head(&self, fleet: &str, run: &str, head: &str) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        if current_etag(&mut tx, fleet, Kind::Run, run)
            .await?
            .is_some()
        {
            sqlx::query(
                "INSERT INTO run_heads (fleet, run, head) VALUES ($1, $2, $3) ON CONFLICT (fleet, run) DO NOTHING",
            )
            .bind(fleet)
            .bind(run)
            .bind(head)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn run_log(&self, fleet: &str, run: &str) -> StoreResult<StoredLog> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let checkpoint =
            sqlx::query("SELECT seq, packed FROM run_checkpoints WHERE fleet = $1 AND run = $2")
                .bind(fleet)
                .bind(run)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| StoreResult::Ok((r.col::<i64>(0)?, r.col::<Vec<u8>>(1)?)))
                .transpose()?;
        let after = checkpoint.as_ref().map_or(0, |(seq, _)| *seq);
        let rows = sqlx::query(
            "SELECT entry FROM run_log WHERE fleet = $1 AND run = $2 AND seq > $3 ORDER BY seq",
        )
        .bind(fleet)
        .bind(run)
        .bind(after)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(StoredLog {
            checkpoint: checkpoint
                .map(|(_, packed)| unpack(PACKED_BODY.to_string(), Some(packed)))
                .transpose()?,
            entries: rows
                .iter()
                .map(|r| r.col::<String>(0))
                .collect::<StoreResult<_>>()?,
        })
    }

    async fn upgrade_durations(
        &self,
        fleet: &str,
        upgrade_type: &str,
    ) -> StoreResult<DurationHistory> {
        let mut history = DurationHistory::default();
        let rows = sqlx::query(
            "SELECT member, seconds FROM (SELECT member, seconds, ROW_NUMBER() OVER (PARTITION BY member ORDER BY finished_at DESC, run DESC) AS n \
             FROM upgrade_durations WHERE fleet = $1 AND upgrade_type = $2) AS recent WHERE n <= $3 ORDER BY member, n",
        )
        .bind(fleet)
        .bind(upgrade_type)
        .bind(crate::MEMBER_HISTORY as i64)
        .fetch_all(&self.pool)
        .await?;
        for r in &rows {
            history
                .members
                .entry(r.col::<String>(0)?)
                .or_default()
                .push(r.col::<i64>(1)?);
        }
        let rows = sqlx::query(
            "SELECT seconds FROM upgrade_durations WHERE fleet = $1 AND upgrade_type = $2 ORDER BY finished_at DESC, member DESC LIMIT $3",
        )
        .bind(fleet)
        .bind(upgrade_type)
        .bind(crate::FLEET_HISTORY as i64)
        .fetch_all(&self.pool)
        .await?;
        history.fleet = rows
            .iter()
            .map(|r| r.col::<i64>(0))
            .collect::<StoreResult<_>>()?;
        Ok(history)
    }

    async fn run_events(
        &self,
        fleet: &str,
        run: &str,
        after: i64,
        limit: usize,
    ) -> StoreResult<Vec<(i64, Value)>> {
        let rows = sqlx::query("SELECT seq, event FROM run_events WHERE fleet = $1 AND run = $2 AND seq > $3 ORDER BY seq LIMIT $4")
            .bind(fleet)
            .bind(run)
            .bind(after)
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.col(0)?, parse_body(r.col::<&str>(1)?)?)))
            .collect()
    }

    async fn intents(&self, fleet: &str, run: &str) -> StoreResult<Vec<Intent>> {
        let rows = sqlx::query("SELECT attempt, member, target, operation_id, finished, recorded_at FROM intents WHERE fleet = $1 AND run = $2 ORDER BY attempt")
            .bind(fleet)
            .bind(run)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Intent {
                    attempt: r.col::<i64>(0)? as u64,
                    member: r.col(1)?,
                    target: parse_body(r.col::<&str>(2)?)?,
                    operation_id: r.col(3)?,
                    finished: r.col(4)?,
                    recorded_at: r.col::<Option<i64>>(5)?.map(flotilla_engine::time::Time),
                })
            })
            .collect()
    }

    async fn record_operations(&self, operations: &[OperationRecord]) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        for op in operations {
            sqlx::query(
                "UPDATE intents SET operation_id = $1 WHERE fleet = $2 AND run = $3 AND attempt = $4",
            )
            .bind(&op.operation_id)
            .bind(&op.fleet)
            .bind(&op.run)
            .bind(op.attempt as i64)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl Tokens for PgStore {
    async fn create_token(&self, token: &TokenRecord) -> StoreResult<()> {
        sqlx::query("INSERT INTO tokens (id, hash, role, subject, created_at, revoked) VALUES ($1, $2, $3, $4, $5, FALSE)")
            .bind(&token.id)
            .bind(&token.hash)
            .bind(&token.role)
            .bind(&token.subject)
            .bind(token.created_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn token_by_hash(&self, hash: &str) -> StoreResult<Option<TokenRecord>> {
        let row = sqlx::query(
            "SELECT id, hash, role, subject, created_at, revoked FROM tokens WHERE hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| token_row(&r)).transpose()
    }

    async fn list_tokens(&self) -> StoreResult<Vec<TokenRecord>> {
        let rows = sqlx::query("SELECT id, hash, role, subject, created_at, revoked FROM tokens ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(token_row).collect()
    }

    async fn revoke_token(&self, id: &str) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE tokens SET revoked = TRUE WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

#[async_trait]
impl Coordination for PgStore {
    async fn heartbeat(&self, replica: &str, ttl: Duration) -> StoreResult<usize> {
        sqlx::query("INSERT INTO replicas (id, expires_at) VALUES ($1, now() + $2 * interval '1 millisecond') ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at")
            .bind(replica)
            .bind(millis(ttl))
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM replicas WHERE expires_at < now() - interval '1 hour'")
            .execute(&self.pool)
            .await?;
        let alive: i64 = sqlx::query("SELECT COUNT(*) FROM replicas WHERE expires_at >= now()")
            .fetch_one(&self.pool)
            .await?
            .col(0)?;
        Ok(alive as usize)
    }

    async fn acquire_lease(
        &self,
        fleet: &str,
        owner: &str,
        ttl: Duration,
    ) -> StoreResult<Option<i64>> {
        let row = sqlx::query(
            "INSERT INTO leases (fleet, owner, epoch, expires_at)
                 VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond')
             ON CONFLICT (fleet) DO UPDATE SET owner = excluded.owner, epoch = leases.epoch + 1,
                 expires_at = excluded.expires_at
             WHERE leases.expires_at < now() OR leases.owner = excluded.owner
             RETURNING epoch",
        )
        .bind(fleet)
        .bind(owner)
        .bind(millis(ttl))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.col(0)).transpose()?)
    }

    async fn renew_lease(
        &self,
        fleet: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE leases SET expires_at = now() + $1 * interval '1 millisecond'
             WHERE fleet = $2 AND owner = $3 AND epoch = $4",
        )
        .bind(millis(ttl))
        .bind(fleet)
        .bind(owner)
        .bind(epoch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn release_lease(&self, fleet: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE leases SET expires_at = now() - interval '1 millisecond'
             WHERE fleet = $1 AND owner = $2 AND epoch = $3",
        )
        .bind(fleet)
        .bind(owner)
        .bind(epoch)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn leases(&self) -> StoreResult<Vec<Lease>> {
        let rows = sqlx::query(
            "SELECT fleet, owner, epoch,
                 (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::BIGINT
             FROM leases ORDER BY fleet",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Lease {
                    fleet: r.col(0)?,
                    owner: r.col(1)?,
                    epoch: r.col(2)?,
                    expires_in_ms: r.col(3)?,
                })
            })
            .collect()
    }

    async fn submit_action(&self, fleet: &str, run: &str, input: &Value) -> StoreResult<i64> {
        let mut tx = self.pool.begin().await?;
        let id: i64 =
            sqlx::query("INSERT INTO actions (fleet, run, input) VALUES ($1, $2, $3) RETURNING id")
                .bind(fleet)
                .bind(run)
                .bind(input.to_string())
                .fetch_one(&mut *tx)
                .await?
                .col(0)?;
        notify(
            &mut tx,
            &Notice::Actions {
                fleet: fleet.to_string(),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn pending_actions(&self, fleet: &str) -> StoreResult<Vec<PendingAction>> {
        let rows = sqlx::query(
            "SELECT id, run, input FROM actions WHERE fleet = $1 AND result IS NULL ORDER BY id",
        )
        .bind(fleet)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(PendingAction {
                    id: r.col(0)?,
                    run: r.col(1)?,
                    input: parse_body(r.col::<&str>(2)?)?,
                })
            })
            .collect()
    }

    async fn finish_action(&self, id: i64, result: &Value) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE actions SET result = $1 WHERE id = $2 AND result IS NULL")
            .bind(result.to_string())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        notify(&mut tx, &Notice::Reply { id }).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn take_action_result(&self, id: i64) -> StoreResult<Option<Value>> {
        let row = sqlx::query(
            "DELETE FROM actions WHERE id = $1 AND result IS NOT NULL RETURNING result",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| parse_body(r.col::<&str>(0)?)).transpose()
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn shared(&self) -> bool {
        true
    }
}

#[async_trait]
impl Audit for PgStore {
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        sqlx::query("INSERT INTO audit (at, subject, role, method, path, fleet, status, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
            .bind(entry.at)
            .bind(&entry.subject)
            .bind(&entry.role)
            .bind(&entry.method)
            .bind(&entry.path)
            .bind(&entry.fleet)
            .bind(i32::from(entry.status))
            .bind(&entry.body)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn prune_audit(&self, before: i64, limit: usize) -> StoreResult<u64> {
        let done = sqlx::query(
            "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < $1 ORDER BY at LIMIT $2)",
        )
        .bind(before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn list_audit(
        &self,
        fleet: Option<&str>,
        after: i64,
        since: i64,
        limit: usize,
    ) -> StoreResult<Vec<AuditEntry>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match fleet {
            Some(f) => {
                sqlx::query("SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > $1 AND at >= $2 AND fleet = $3 ORDER BY id LIMIT $4")
                    .bind(after)
                    .bind(since)
                    .bind(f)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                sqlx::query("SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > $1 AND at >= $2 ORDER BY id LIMIT $3")
                    .bind(after)
                    .bind(since)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(audit_row).collect()
    }
}

fn audit_row(r: &PgRow) -> StoreResult<AuditEntry> {
    Ok(AuditEntry {
        id: r.col(0)?,
        at: r.col(1)?,
        subject: r.col(2)?,
        role: r.col(3)?,
        method: r.col(4)?,
        path: r.col(5)?,
        fleet: r.col(6)?,
        status: u16::try_from(r.col::<i32>(7)?).unwrap_or_default(),
        body: r.col(8)?,
    })
}

fn token_row(r: &PgRow) -> StoreResult<TokenRecord> {
    Ok(TokenRecord {
        id: r.col(0)?,
        hash: r.col(1)?,
        role: r.col(2)?,
        subject: r.col(3)?,
        created_at: r.col(4)?,
        revoked: r.col(5)?,
    })
}

/// What the workspace's PostgreSQL tests share (the store suite and the replica tests): where
/// the test server is, and whether they can run.
#[doc(hidden)]
pub mod test_support {
    /// `FLOTILLA_TEST_POSTGRES`, default the machine's `postgres://postgres@127.0.0.1:5432`.
    pub fn base() -> String {
        std::env::var("FLOTILLA_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
    }

    /// Whether the PostgreSQL tests can run here: the server answers, or CI requires it
    /// (`FLOTILLA_REQUIRE_POSTGRES=1`, set by `.ci/run`), in which case its absence fails them.
    /// Without either they are skipped with a notice written past the test harness's capture.
    pub fn reachable() -> bool {
        use std::io::Write;
        let base = base();
        let address = base
            .rsplit('@')
            .next()
            .unwrap_or_default()
            .trim_start_matches("postgres://")
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let reachable = std::net::ToSocketAddrs::to_socket_addrs(&address)
            .ok()
            .and_then(|mut addrs| addrs.next())
            .is_some_and(|a| {
                std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).is_ok()
            });
        let required = std::env::var_os("FLOTILLA_REQUIRE_POSTGRES").is_some_and(|v| v != "0");
        if !reachable && !required {
            let _ = writeln!(
                std::io::stderr(),
                "skipped: no PostgreSQL at {base} (set FLOTILLA_TEST_POSTGRES to one, or FLOTILLA_REQUIRE_POSTGRES=1 to fail instead)"
            );
        }
        reachable || required
    }
}

async fn put_head(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    fleet: &str,
    run: &str,
    head: &str,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO run_heads (fleet, run, head) VALUES ($1, $2, $3) ON CONFLICT (fleet, run) DO UPDATE SET head = excluded.head",
    )
    .bind(fleet)
    .bind(run)
    .bind(head)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A run's batch, inside a transaction: its checks first (the lease, the run's snapshot), then
/// its writes, then its notices (sent when the transaction commits).
async fn write_batch(tx: &mut Transaction<'_, Postgres>, batch: &RunBatch) -> StoreResult<()> {
    if batch.fence.is_some() {
        // Locking the lease row orders this batch with any takeover: a replica that took
        // the fleet over has a new epoch, and this batch is then refused.
        let found = sqlx::query("SELECT owner, epoch FROM leases WHERE fleet = $1 FOR UPDATE")
            .bind(&batch.fleet)
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| StoreResult::Ok((r.col(0)?, r.col(1)?)))
            .transpose()?;
        fenced(batch, found)?;
    }
    if batch.snapshot_etag.is_some() {
        let found = current_etag(tx, &batch.fleet, Kind::RunSnapshot, &batch.run).await?;
        same_run(batch, found)?;
    }
    append(
        tx,
        "SELECT COALESCE(MAX(seq), 0) FROM run_log WHERE fleet = $1 AND run = $2",
        "INSERT INTO run_log (fleet, run, seq, entry) ",
        batch,
        &batch.log,
    )
    .await?;
    if let Some(checkpoint) = &batch.checkpoint {
        checkpoint_needs_entries(batch)?;
        let (_, packed) = pack_chunk(checkpoint)?;
        // It follows the batch's last entry: the log before that entry goes.
        sqlx::query(
            "INSERT INTO run_checkpoints (fleet, run, seq, packed) \
             SELECT $1, $2, MAX(seq), $3 FROM run_log WHERE fleet = $1 AND run = $2 \
             ON CONFLICT (fleet, run) DO UPDATE SET seq = excluded.seq, packed = excluded.packed",
        )
        .bind(&batch.fleet)
        .bind(&batch.run)
        .bind(packed)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "DELETE FROM run_log WHERE fleet = $1 AND run = $2 \
             AND seq < (SELECT seq FROM run_checkpoints WHERE fleet = $1 AND run = $2)",
        )
        .bind(&batch.fleet)
        .bind(&batch.run)
        .execute(&mut **tx)
        .await?;
    }
    let first_event = append(
        tx,
        "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE fleet = $1 AND run = $2",
        "INSERT INTO run_events (fleet, run, seq, event) ",
        batch,
        &batch.events,
    )
    .await?;
    if !batch.events.is_empty() {
        write_outbox(tx, batch, first_event).await?;
    }
    for chunk in batch.durations.chunks(crate::ROWS_PER_INSERT) {
        let mut q = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO upgrade_durations (fleet, upgrade_type, member, finished_at, run, seconds) ",
        );
        q.push_values(chunk, |mut row, d| {
            row.push_bind(batch.fleet.clone())
                .push_bind(d.upgrade_type.clone())
                .push_bind(d.member.clone())
                .push_bind(d.finished_at.unix())
                .push_bind(batch.run.clone())
                .push_bind(d.seconds);
        });
        q.push(" ON CONFLICT DO NOTHING");
        q.build().execute(&mut **tx).await?;
    }
    for chunk in batch.intents.chunks(crate::ROWS_PER_INSERT) {
        let mut q = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO intents (fleet, run, attempt, member, target, operation_id, finished, recorded_at) ",
        );
        q.push_values(chunk, |mut row, intent| {
            row.push_bind(batch.fleet.clone())
                .push_bind(batch.run.clone())
                .push_bind(intent.attempt as i64)
                .push_bind(intent.member.clone())
                .push_bind(intent.target.to_string())
                .push_bind(intent.operation_id.clone())
                .push("FALSE")
                .push_bind(intent.recorded_at.map(|t| t.unix()));
        });
        q.build().execute(&mut **tx).await?;
    }
    for chunk in batch.finished_attempts.chunks(crate::ROWS_PER_INSERT) {
        let mut q = sqlx::QueryBuilder::<Postgres>::new(
            "UPDATE intents SET finished = TRUE WHERE fleet = ",
        );
        q.push_bind(batch.fleet.clone())
            .push(" AND run = ")
            .push_bind(batch.run.clone())
            .push(" AND attempt IN (");
        let mut attempts = q.separated(", ");
        for attempt in chunk {
            attempts.push_bind(*attempt as i64);
        }
        q.push(")");
        q.build().execute(&mut **tx).await?;
    }
    if let Some(document) = &batch.run_body {
        put_document(tx, &batch.fleet, &batch.run, document).await?;
    }
    if let Some(head) = &batch.run_head {
        put_head(tx, &batch.fleet, &batch.run, head).await?;
    }
    for (name, body) in &batch.gates {
        upsert(tx, &batch.fleet, Kind::Gate, name, &body.to_string()).await?;
    }
    for (id, result) in &batch.action_results {
        sqlx::query("UPDATE actions SET result = $1 WHERE id = $2 AND result IS NULL")
            .bind(result.to_string())
            .bind(id)
            .execute(&mut **tx)
            .await?;
    }
    for notice in Notice::of_batch(batch) {
        notify(tx, &notice).await?;
    }
    Ok(())
}

/// The webhooks, read in a transaction that writes outbox rows.
async fn webhooks_in(tx: &mut Transaction<'_, Postgres>) -> StoreResult<Vec<Webhook>> {
    sqlx::query(concat!("SELECT ", webhook_columns!(), " FROM webhooks"))
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(webhook_row)
        .collect()
}

/// The outbox rows of a batch's events (one per webhook that wants each), in the batch's
/// transaction; `first_seq` is the first event's number.
async fn write_outbox(
    tx: &mut Transaction<'_, Postgres>,
    batch: &RunBatch,
    first_seq: i64,
) -> StoreResult<()> {
    let hooks = webhooks_in(tx).await?;
    if hooks.is_empty() {
        return Ok(());
    }
    insert_deliveries(tx, &outbox_rows(batch, first_seq, &hooks, unix_millis())).await
}

/// Inserts outbox rows; the same event twice for one webhook (a batch written again) is one
/// delivery.
async fn insert_deliveries(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[Delivery],
) -> StoreResult<()> {
    for chunk in rows.chunks(crate::ROWS_PER_INSERT) {
        let mut q = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO webhook_deliveries (webhook, event_id, fleet, run, seq, event_type, event, created_at, state, attempts, next_attempt_at) ",
        );
        q.push_values(chunk, |mut row, d| {
            row.push_bind(d.webhook.clone())
                .push_bind(d.event_id.clone())
                .push_bind(d.fleet.clone())
                .push_bind(d.run.clone())
                .push_bind(d.seq)
                .push_bind(d.event_type.clone())
                .push_bind(d.event.to_string())
                .push_bind(d.created_at)
                .push_bind(d.state.as_str())
                .push_bind(d.attempts)
                .push_bind(d.next_attempt_at);
        });
        q.push(" ON CONFLICT (webhook, event_id) DO NOTHING");
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

async fn webhook_etag(
    tx: &mut Transaction<'_, Postgres>,
    name: &str,
) -> StoreResult<Option<String>> {
    sqlx::query("SELECT etag FROM webhooks WHERE name = $1 FOR UPDATE")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| r.col(0))
        .transpose()
}

#[async_trait]
impl Webhooks for PgStore {
    async fn put_webhook(
        &self,
        webhook: &Webhook,
        when: &Precondition,
    ) -> StoreResult<(String, bool)> {
        let mut tx = self.pool.begin().await?;
        let current = webhook_etag(&mut tx, &webhook.name).await?;
        check(current.as_deref(), when)?;
        let etag = next_etag(&mut tx).await?;
        // `xmax = 0` only on a row this statement inserted: of two racing creators, one is told
        // it created the webhook.
        let created: bool = sqlx::query(
            "INSERT INTO webhooks (name, url, secret, fleets, events, format, system_data, etag) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (name) DO UPDATE SET url = excluded.url, secret = excluded.secret, fleets = excluded.fleets, \
             events = excluded.events, format = excluded.format, system_data = excluded.system_data, etag = excluded.etag \
             RETURNING (xmax = 0)",
        )
        .bind(&webhook.name)
        .bind(&webhook.url)
        .bind(&webhook.secret)
        .bind(serde_json::to_string(&webhook.fleets).unwrap_or_default())
        .bind(serde_json::to_string(&webhook.events).unwrap_or_default())
        .bind(&webhook.format)
        .bind(webhook.system_data.to_string())
        .bind(&etag)
        .fetch_one(&mut *tx)
        .await?
        .col(0)?;
        if when == &Precondition::IfNoneMatchAny && !created {
            return Err(StoreError::Precondition(
                "If-None-Match *: the resource already exists".into(),
            ));
        }
        tx.commit().await?;
        Ok((etag, created))
    }

    async fn get_webhook(&self, name: &str) -> StoreResult<Option<Webhook>> {
        sqlx::query(concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhooks WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await?
        .map(|r| webhook_row(&r))
        .transpose()
    }

    async fn list_webhooks(&self, after: Option<&str>, limit: usize) -> StoreResult<Vec<Webhook>> {
        sqlx::query(concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhooks WHERE name > $1 ORDER BY name LIMIT $2"
        ))
        .bind(after.unwrap_or(""))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(webhook_row)
        .collect()
    }

    async fn delete_webhook(&self, name: &str, when: &Precondition) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        let current = webhook_etag(&mut tx, name).await?;
        check(current.as_deref(), when)?;
        if current.is_none() {
            return Ok(false);
        }
        for statement in [
            "DELETE FROM webhooks WHERE name = $1",
            "DELETE FROM webhook_deliveries WHERE webhook = $1",
        ] {
            sqlx::query(statement).bind(name).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn claim_deliveries(
        &self,
        now: i64,
        claim_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<DueDelivery>> {
        let mut tx = self.pool.begin().await?;
        // Rows another replica is claiming at this moment are skipped, not waited for; a row
        // claimed is not due again until its claim lapses, so two replicas do not send it at
        // once (unless the first takes longer than the claim).
        let claimed = sqlx::query(concat!(
            "UPDATE webhook_deliveries SET claimed_until = $1 WHERE id IN (",
            "SELECT id FROM webhook_deliveries WHERE state = 'Pending' AND next_attempt_at <= $2 ",
            "AND (claimed_until IS NULL OR claimed_until <= $2) ORDER BY next_attempt_at, id LIMIT $3 ",
            "FOR UPDATE SKIP LOCKED) RETURNING ",
            delivery_columns!()
        ))
        .bind(now.saturating_add(claim_ms))
        .bind(now)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(delivery_row)
        .collect::<StoreResult<Vec<_>>>()?;
        let mut names: Vec<String> = claimed.iter().map(|d| d.webhook.clone()).collect();
        names.sort();
        names.dedup();
        let hooks: HashMap<String, Webhook> = sqlx::query(concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhooks WHERE name = ANY($1)"
        ))
        .bind(&names)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| webhook_row(r).map(|w| (w.name.clone(), w)))
        .collect::<StoreResult<_>>()?;
        let (fleets, runs): (Vec<String>, Vec<String>) = claimed
            .iter()
            .map(|d| (d.fleet.clone(), d.run.clone()))
            .collect::<HashSet<_>>()
            .into_iter()
            .unzip();
        let heads: HashMap<(String, String), String> = sqlx::query(
            "SELECT h.fleet, h.run, h.head FROM run_heads h \
             JOIN UNNEST($1::text[], $2::text[]) AS k(fleet, run) ON h.fleet = k.fleet AND h.run = k.run",
        )
        .bind(&fleets)
        .bind(&runs)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok(((r.col(0)?, r.col(1)?), r.col(2)?)))
        .collect::<StoreResult<_>>()?;
        // A row whose webhook was deleted while its batch was being written outlived the
        // delete: it goes now.
        let orphans: Vec<i64> = claimed
            .iter()
            .filter(|d| !hooks.contains_key(&d.webhook))
            .map(|d| d.id)
            .collect();
        if !orphans.is_empty() {
            sqlx::query("DELETE FROM webhook_deliveries WHERE id = ANY($1)")
                .bind(&orphans)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(claimed
            .into_iter()
            .filter_map(|delivery| {
                let webhook = hooks.get(&delivery.webhook)?.clone();
                let run_head = heads
                    .get(&(delivery.fleet.clone(), delivery.run.clone()))
                    .cloned();
                Some(DueDelivery {
                    delivery,
                    webhook,
                    run_head,
                })
            })
            .collect())
    }

    async fn record_delivery(&self, id: i64, attempt: &DeliveryAttempt) -> StoreResult<()> {
        let (state, next, delivered) = attempt_columns(attempt);
        sqlx::query(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, last_attempt_at = $1, last_status = $2, \
             last_error = $3, state = $4, next_attempt_at = $5, delivered_at = $6, claimed_until = NULL \
             WHERE id = $7 AND state = 'Pending'",
        )
        .bind(attempt.at)
        .bind(attempt.status.map(i64::from))
        .bind(&attempt.error)
        .bind(state.as_str())
        .bind(next)
        .bind(delivered)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn list_deliveries(
        &self,
        webhook: &str,
        state: Option<DeliveryState>,
        after: i64,
        limit: usize,
    ) -> StoreResult<Vec<Delivery>> {
        sqlx::query(concat!(
            "SELECT ",
            delivery_columns!(),
            " FROM webhook_deliveries WHERE webhook = $1 AND id > $2 ",
            "AND ($3::text IS NULL OR state = $3) ORDER BY id LIMIT $4"
        ))
        .bind(webhook)
        .bind(after)
        .bind(state.map(DeliveryState::as_str))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(delivery_row)
        .collect()
    }

    async fn prune_deliveries(&self, before: i64) -> StoreResult<u64> {
        Ok(sqlx::query(
            "DELETE FROM webhook_deliveries WHERE state <> 'Pending' AND created_at < $1",
        )
        .bind(before)
        .execute(&self.pool)
        .await?
        .rows_affected())
    }

    async fn record_fleet_event(
        &self,
        fleet: &str,
        event_id: &str,
        event: &Value,
    ) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        let hooks = webhooks_in(&mut tx).await?;
        let rows = fleet_event_rows(fleet, event_id, event, &hooks, unix_millis());
        insert_deliveries(&mut tx, &rows).await?;
        tx.commit().await?;
        Ok(())
    }
}
