//! The one implementation of the store over both databases: every method of the store's
//! traits, generic over the database, reading its statements from the dialect's
//! [`Statements`] (`sql/sqlite.rs`, `sql/postgres.rs`, side by side) and asking the dialect
//! ([`Dialect`]) for the few steps that are done otherwise there, not merely spelled otherwise:
//! bulk writes (SQLite: many rows to a statement; PostgreSQL: arrays bound, racing writers told
//! apart by the database), eTags, batch registration, the rows a claim of deliveries needs,
//! and whose clock lease times are on (SQLite: this machine's; PostgreSQL: the database's).
//! Transactions are begun as the dialect says ([`Statements::begin_write`]) and notices sent as
//! it can ([`Statements::notify`]).
//!
//! Rust does not carry a trait's `where` clause to the items that name the trait, so each
//! generic `impl` below repeats the bounds sqlx needs for the values bound and read.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::migrate::Migrate;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};
use tokio::sync::broadcast;

use crate::sql::Statements;
use crate::{
    Audit, AuditEntry, Chunk, Col, Coordination, Delivery, DeliveryAttempt, DeliveryState,
    DueDelivery, DurationHistory, Fence, Intent, Kind, Lease, MemberWrite, Notice, OperationRecord,
    PACKED_BODY, PendingAction, Precondition, RegisterMode, Registered, Resource, Resources,
    RunBatch, RunDocument, RunLog, StoreError, StoreResult, StoredLog, TokenRecord, Tokens,
    Webhook, Webhooks, assemble_rows, attempt_columns, check, checkpoint_needs_entries,
    delivery_row, fenced, fleet_event_rows, millis, outbox_rows, pack, pack_chunk, parse_body,
    part_row, same_run, unix_millis, unpack, webhook_columns, webhook_row, with_status,
};

/// A value sqlx binds for `DB`.
pub trait Bind<DB: Database>: for<'q> Encode<'q, DB> + Type<DB> {}
impl<DB: Database, T: for<'q> Encode<'q, DB> + Type<DB>> Bind<DB> for T {}

/// A value sqlx reads from `DB`'s rows.
pub trait Read<DB: Database>: for<'r> Decode<'r, DB> + Type<DB> {}
impl<DB: Database, T: for<'r> Decode<'r, DB> + Type<DB>> Read<DB> for T {}

/// What differs between the two databases beyond the text of a statement. Implemented by
/// `sqlx::Sqlite` (`sqlite.rs`) and `sqlx::Postgres` (`postgres.rs`).
#[async_trait]
pub(crate) trait Dialect:
    Database<Arguments: IntoArguments<Self>, Connection: Migrate>
{
    /// The statements the shared code runs, in this dialect.
    const SQL: &'static Statements;
    /// Whether several replicas may share the database ([`Coordination::shared`]); if so,
    /// writes lock the rows they read, in one order.
    const SHARED: bool;

    /// This machine's time (Unix milliseconds) where the dialect's lease and liveness
    /// statements are bound times (SQLite); `None` where they read the database's clock
    /// (PostgreSQL), so that replicas' clocks do not matter.
    fn clock() -> Option<i64>;
    /// How many rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;
    /// `n` (at least one) new eTags.
    async fn next_etags(c: &mut Self::Connection, n: usize) -> StoreResult<Vec<String>>;
    /// Creates or replaces resources, `(name, body, eTag)` each, in order; the names it
    /// created where the database tells (PostgreSQL: of two racing creators, one did).
    async fn put_rows(
        c: &mut Self::Connection,
        (fleet, kind): (&str, Kind),
        rows: &[(&str, &str, &str)],
    ) -> StoreResult<Option<HashSet<String>>>;
    /// Marks a run's intents of these attempts finished.
    async fn finish_intents(
        c: &mut Self::Connection,
        fleet_run: (&str, &str),
        attempts: &[u64],
    ) -> StoreResult<()>;
    /// Sets the operation ids drivers named for intents ([`RunLog::record_operations`]).
    async fn record_operations(
        store: &SqlStore<Self>,
        operations: &[OperationRecord],
    ) -> StoreResult<()>;
    /// Writes chunks of a run's document.
    async fn put_chunks(
        c: &mut Self::Connection,
        fleet_run: (&str, &str),
        chunks: &[Chunk],
    ) -> StoreResult<()>;
    /// `name, body, packed` of the resources of a kind among `names`, locked for the write.
    async fn lock_bodies(
        c: &mut Self::Connection,
        at: (&str, Kind),
        names: &[&str],
    ) -> StoreResult<Vec<Self::Row>>;
    /// [`Resources::register_members`].
    async fn register(
        store: &SqlStore<Self>,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered>;
    /// The claimed deliveries with their webhooks and runs' heads, in the claim's
    /// transaction; a delivery whose webhook is gone is deleted.
    async fn due(c: &mut Self::Connection, claimed: Vec<Delivery>)
    -> StoreResult<Vec<DueDelivery>>;
}

/// The store on one database: [`crate::SqliteStore`] or [`crate::postgres::PgStore`].
pub struct SqlStore<DB: Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) notices: broadcast::Sender<Notice>,
    /// SQLite's lock on its database file, held for the process's life: one server per file.
    pub(crate) _lock: Option<std::fs::File>,
}

// The crate's own helpers, bound by the crate's own trait.
#[allow(private_bounds)]
impl<DB> SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: Encode<'a, DB> + Decode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    String: Bind<DB> + Read<DB>,
    i64: Bind<DB> + Read<DB>,
    Option<i64>: Bind<DB>,
    i32: Bind<DB> + Read<DB>,
    bool: Read<DB>,
    Vec<u8>: Read<DB>,
    Option<Vec<u8>>: Bind<DB>,
{
    /// A transaction that writes: SQLite takes its one writer's lock at once (`BEGIN
    /// IMMEDIATE`), so the transaction never fails to upgrade a read.
    pub(crate) async fn begin_write(&self) -> StoreResult<sqlx::Transaction<'static, DB>> {
        Ok(match DB::SQL.begin_write {
            Some(begin) => self.pool.begin_with(begin).await?,
            None => self.pool.begin().await?,
        })
    }

    /// A transaction whose reads see one snapshot.
    async fn begin_snapshot(&self) -> StoreResult<sqlx::Transaction<'static, DB>> {
        let mut tx = self.pool.begin().await?;
        if let Some(snapshot) = DB::SQL.snapshot {
            sqlx::query(snapshot).execute(&mut *tx).await?;
        }
        Ok(tx)
    }

    /// A writing transaction for a bulk write that holds no lease row
    /// ([`Statements::bulk`]).
    pub(crate) async fn begin_bulk(&self) -> StoreResult<sqlx::Transaction<'static, DB>> {
        let mut tx = self.begin_write().await?;
        if let Some(bulk) = DB::SQL.bulk {
            sqlx::query(bulk).execute(&mut *tx).await?;
        }
        Ok(tx)
    }

    /// Sends a notice inside the transaction that writes what it tells of, where the database
    /// carries notices (PostgreSQL's NOTIFY, delivered to every replica once it commits).
    async fn notify(c: &mut DB::Connection, notice: &Notice) -> StoreResult<()> {
        if let Some(notify) = DB::SQL.notify {
            sqlx::query(notify)
                .bind(notice.to_payload())
                .execute(c)
                .await?;
        }
        Ok(())
    }

    /// Tells this process's listeners of a committed notice, where the database does not
    /// carry them (SQLite: one process).
    fn announce(&self, notice: Notice) {
        if DB::SQL.notify.is_none() {
            let _ = self.notices.send(notice);
        }
    }

    /// Runs the migrations the database lacks, first recording for the migrator those that a
    /// database made before it applied ([`crate::migrate`]).
    pub(crate) async fn migrate(&self) -> StoreResult<()> {
        let migrator = crate::migrate::migrator(DB::SQL.migrations);
        let mut tx = self.begin_write().await?;
        if let Some(lock) = DB::SQL.migration_lock {
            // Replicas starting together take a database made before the migrator one after
            // the other; the migrator then holds its own lock.
            sqlx::query(lock).execute(&mut *tx).await?;
        }
        let legacy: bool = sqlx::query(DB::SQL.legacy_migrations)
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
                sqlx::query(DB::SQL.record_migration)
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

    /// `n` new eTags.
    pub(crate) async fn next_etags(c: &mut DB::Connection, n: usize) -> StoreResult<Vec<String>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        DB::next_etags(c, n).await
    }

    async fn next_etag(c: &mut DB::Connection) -> StoreResult<String> {
        Ok(Self::next_etags(c, 1).await?.remove(0))
    }

    /// The current eTag (PostgreSQL: with the row locked until the transaction ends).
    async fn current_etag(
        c: &mut DB::Connection,
        fleet: &str,
        kind: Kind,
        name: &str,
    ) -> StoreResult<Option<String>> {
        sqlx::query(DB::SQL.lock_etag)
            .bind(fleet)
            .bind(kind.as_str())
            .bind(name)
            .fetch_optional(c)
            .await?
            .map(|r| r.col(0))
            .transpose()
    }

    /// Creates or replaces a resource; returns its new eTag, and whether this created it where
    /// the database tells ([`Dialect::put_rows`]).
    async fn upsert(
        c: &mut DB::Connection,
        fleet: &str,
        kind: Kind,
        name: &str,
        body: &str,
    ) -> StoreResult<(String, Option<bool>)> {
        let etag = Self::next_etag(c).await?;
        let created = DB::put_rows(c, (fleet, kind), &[(name, body, &etag)]).await?;
        Ok((etag, created.map(|names| names.contains(name))))
    }

    /// Creates a resource that must not exist yet, racing other creators: the row lock a
    /// replace takes cannot hold a row that does not exist, so the insert itself decides.
    async fn create(
        mut tx: sqlx::Transaction<'_, DB>,
        insert: &'static str,
        (fleet, kind, name): (&str, Kind, &str),
        text: &str,
    ) -> StoreResult<(String, bool)> {
        let etag = Self::next_etag(&mut tx).await?;
        let (stored, packed) = pack(kind, text)?;
        let inserted = sqlx::query(insert)
            .bind(fleet)
            .bind(kind.as_str())
            .bind(name)
            .bind(stored)
            .bind(packed)
            .bind(etag.as_str())
            .execute(&mut *tx)
            .await;
        match inserted {
            Ok(_) => {
                tx.commit().await?;
                Ok((etag, true))
            }
            Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Err(
                StoreError::Precondition("If-None-Match *: the resource already exists".into()),
            ),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a run's document as a status write stores it: its frame in the run's resource,
    /// the chunks that changed, and none past its count ([`RunDocument`]).
    async fn put_document(
        c: &mut DB::Connection,
        fleet: &str,
        run: &str,
        document: &RunDocument,
    ) -> StoreResult<()> {
        let etag = Self::next_etag(c).await?;
        let frame = serde_json::to_string(&document.frame)
            .map_err(|e| StoreError::Unavailable(format!("cannot write a run's frame: {e}")))?;
        let (body, packed) = pack(Kind::Run, &frame)?;
        sqlx::query(DB::SQL.put_frame)
            .bind(fleet)
            .bind(Kind::Run.as_str())
            .bind(run)
            .bind(body)
            .bind(packed)
            .bind(etag.as_str())
            .bind(i64::from(document.chunks))
            .execute(&mut *c)
            .await?;
        if !document.changed.is_empty() {
            DB::put_chunks(c, (fleet, run), &document.changed).await?;
        }
        sqlx::query(DB::SQL.drop_chunks_from)
            .bind(fleet)
            .bind(run)
            .bind(i64::from(document.chunks))
            .execute(c)
            .await?;
        Ok(())
    }

    /// Deletes what a run written whole replaces: its head, chunks and checkpoint.
    async fn forget_run_parts(c: &mut DB::Connection, fleet: &str, run: &str) -> StoreResult<()> {
        for statement in DB::SQL.forget_run_parts {
            sqlx::query(*statement)
                .bind(fleet)
                .bind(run)
                .execute(&mut *c)
                .await?;
        }
        Ok(())
    }

    /// Appends a batch's input log entries to its run's, in order. (PostgreSQL: only the
    /// fleet's lease holder writes a run's logs, and its batch holds the lease row locked, so
    /// the numbers do not race.)
    async fn append_log(c: &mut DB::Connection, batch: &RunBatch) -> StoreResult<()> {
        let (last_seq, insert) = DB::SQL.append_log;
        let entries = &batch.log;
        if entries.is_empty() {
            return Ok(());
        }
        let next = Self::last_number(c, last_seq, batch).await?;
        // Many rows per statement: a batch of thousands costs a few round trips, not thousands.
        for (n, chunk) in entries.chunks(crate::ROWS_PER_INSERT).enumerate() {
            let first = next + 1 + (n * crate::ROWS_PER_INSERT) as i64;
            let mut q = sqlx::QueryBuilder::<DB>::new(insert);
            q.push_values(chunk.iter().enumerate(), |mut row, (i, entry)| {
                row.push_bind(batch.fleet.clone())
                    .push_bind(batch.run.clone())
                    .push_bind(first + i as i64)
                    .push_bind(entry.as_str());
            });
            q.build().execute(&mut *c).await?;
        }
        Ok(())
    }

    /// The last number of one of a batch's run's numbered logs (`last_seq`: fleet, run).
    async fn last_number(
        c: &mut DB::Connection,
        last_seq: &'static str,
        batch: &RunBatch,
    ) -> StoreResult<i64> {
        sqlx::query(last_seq)
            .bind(batch.fleet.as_str())
            .bind(batch.run.as_str())
            .fetch_one(c)
            .await?
            .col(0)
    }

    /// Appends a batch's events to its run's, in order; returns the number the first was
    /// given. One event is a row of its own; more go in packs of up to
    /// [`EVENTS_PER_PACK`](crate::EVENTS_PER_PACK), compressed
    /// ([`Statements::events_after`]). The numbers rest on one writer at a time, as
    /// [`append_log`](Self::append_log)'s do: the primary key catches two writers giving the same
    /// number to a row, not a pack that covers another's.
    async fn append_events(c: &mut DB::Connection, batch: &RunBatch) -> StoreResult<i64> {
        let (last_seq, insert) = DB::SQL.append_events;
        let events = &batch.events;
        if events.is_empty() {
            return Ok(0);
        }
        let next = Self::last_number(c, last_seq, batch).await?;
        let mut rows = Vec::new();
        if let [event] = events.as_slice() {
            rows.push((next + 1, event.to_string(), None, None));
        } else {
            for (n, pack) in events.chunks(crate::EVENTS_PER_PACK).enumerate() {
                let first = next + 1 + (n * crate::EVENTS_PER_PACK) as i64;
                let last = first + pack.len() as i64 - 1;
                let lines = pack
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n");
                let (placeholder, packed) = pack_chunk(&lines)?;
                rows.push((last, placeholder.to_string(), Some(first), packed));
            }
        }
        let mut q = sqlx::QueryBuilder::<DB>::new(insert);
        q.push_values(rows, |mut row, (seq, event, first, packed)| {
            row.push_bind(batch.fleet.clone())
                .push_bind(batch.run.clone())
                .push_bind(seq)
                .push_bind(event)
                .push_bind(first)
                .push_bind(packed);
        });
        q.build().execute(&mut *c).await?;
        Ok(next + 1)
    }

    /// A run's batch, inside a transaction: its checks first (the lease, the run's snapshot),
    /// then its writes, then its notices (where the database carries them, sent when the
    /// transaction commits).
    /// Writes one run's batch in the transaction `c`. `lease_checked`: an earlier batch of
    /// this transaction checked the same fleet's lease under the same fence (and, on
    /// PostgreSQL, holds its row locked until the commit), so it is not read again.
    async fn write_batch(
        c: &mut DB::Connection,
        batch: &RunBatch,
        lease_checked: bool,
    ) -> StoreResult<()> {
        let sql = DB::SQL;
        if batch.fence.is_some() && !lease_checked {
            // PostgreSQL locks the lease row, which orders this batch with any takeover: a
            // replica that took the fleet over has a new epoch, and this batch is then refused.
            let found = sqlx::query(sql.lock_lease)
                .bind(batch.fleet.as_str())
                .fetch_optional(&mut *c)
                .await?
                .map(|r| StoreResult::Ok((r.col(0)?, r.col(1)?)))
                .transpose()?;
            fenced(batch, found)?;
        }
        if batch.snapshot_etag.is_some() {
            let found = Self::current_etag(c, &batch.fleet, Kind::RunSnapshot, &batch.run).await?;
            same_run(batch, found)?;
        }
        Self::append_log(c, batch).await?;
        if let Some(checkpoint) = &batch.checkpoint {
            checkpoint_needs_entries(batch)?;
            let (_, packed) = pack_chunk(checkpoint)?;
            // It follows the batch's last entry: the log before that entry goes.
            sqlx::query(sql.put_checkpoint)
                .bind(batch.fleet.as_str())
                .bind(batch.run.as_str())
                .bind(packed)
                .execute(&mut *c)
                .await?;
            sqlx::query(sql.trim_log)
                .bind(batch.fleet.as_str())
                .bind(batch.run.as_str())
                .execute(&mut *c)
                .await?;
        }
        let first_event = Self::append_events(c, batch).await?;
        if !batch.events.is_empty() {
            Self::write_outbox(c, batch, first_event).await?;
        }
        for chunk in batch.durations.chunks(crate::ROWS_PER_INSERT) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
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
            q.build().execute(&mut *c).await?;
        }
        for chunk in batch.intents.chunks(crate::ROWS_PER_INSERT) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "INSERT INTO intents (fleet, run, attempt, member, target, operation_id, finished, recorded_at) ",
            );
            q.push_values(chunk, |mut row, intent| {
                row.push_bind(batch.fleet.clone())
                    .push_bind(batch.run.clone())
                    .push_bind(intent.attempt as i64)
                    .push_bind(intent.member.clone())
                    .push_bind(intent.target.to_string())
                    .push_bind(intent.operation_id.as_deref())
                    .push(sql.unfinished)
                    .push_bind(intent.recorded_at.map(|t| t.unix()));
            });
            q.build().execute(&mut *c).await?;
        }
        if !batch.finished_attempts.is_empty() {
            DB::finish_intents(c, (&batch.fleet, &batch.run), &batch.finished_attempts).await?;
        }
        if let Some(document) = &batch.run_body {
            Self::put_document(c, &batch.fleet, &batch.run, document).await?;
        }
        if let Some(head) = &batch.run_head {
            sqlx::query(sql.put_head)
                .bind(batch.fleet.as_str())
                .bind(batch.run.as_str())
                .bind(head.as_str())
                .execute(&mut *c)
                .await?;
        }
        for (name, body) in &batch.gates {
            Self::upsert(c, &batch.fleet, Kind::Gate, name, &body.to_string()).await?;
        }
        for (id, result) in &batch.action_results {
            sqlx::query(sql.finish_action)
                .bind(result.to_string())
                .bind(*id)
                .execute(&mut *c)
                .await?;
        }
        for notice in Notice::of_batch(batch) {
            Self::notify(c, &notice).await?;
        }
        Ok(())
    }

    /// Tells this process's listeners of a committed batch ([`SqlStore::announce`]).
    fn announce_batch(&self, batch: &RunBatch) {
        for notice in Notice::of_batch(batch) {
            self.announce(notice);
        }
    }

    /// The webhooks, read in a transaction that writes outbox rows.
    async fn webhooks_in(c: &mut DB::Connection) -> StoreResult<Vec<Webhook>> {
        sqlx::query(concat!("SELECT ", webhook_columns!(), " FROM webhooks"))
            .fetch_all(c)
            .await?
            .iter()
            .map(webhook_row)
            .collect()
    }

    /// The outbox rows of a batch's events (one per webhook that wants each), in the batch's
    /// transaction; `first_seq` is the first event's number.
    async fn write_outbox(
        c: &mut DB::Connection,
        batch: &RunBatch,
        first_seq: i64,
    ) -> StoreResult<()> {
        let hooks = Self::webhooks_in(c).await?;
        if hooks.is_empty() {
            return Ok(());
        }
        Self::insert_deliveries(c, &outbox_rows(batch, first_seq, &hooks, unix_millis())).await
    }

    /// Inserts outbox rows; the same event twice for one webhook (a batch written again) is
    /// one delivery.
    async fn insert_deliveries(c: &mut DB::Connection, rows: &[Delivery]) -> StoreResult<()> {
        for chunk in rows.chunks(crate::ROWS_PER_INSERT) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
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
            q.build().execute(&mut *c).await?;
        }
        Ok(())
    }

    /// A webhook's eTag (PostgreSQL: with its row locked).
    async fn webhook_etag(c: &mut DB::Connection, name: &str) -> StoreResult<Option<String>> {
        sqlx::query(DB::SQL.lock_webhook_etag)
            .bind(name)
            .fetch_optional(c)
            .await?
            .map(|r| r.col(0))
            .transpose()
    }
}

/// A token from `id, hash, role, subject, created_at, revoked`.
fn token_row<R: sqlx::Row>(r: &R) -> StoreResult<TokenRecord>
where
    usize: ColumnIndex<R>,
    String: Read<R::Database>,
    i64: Read<R::Database>,
    bool: Read<R::Database>,
{
    Ok(TokenRecord {
        id: r.col(0)?,
        hash: r.col(1)?,
        role: r.col(2)?,
        subject: r.col(3)?,
        created_at: r.col(4)?,
        revoked: r.col(5)?,
    })
}

/// An audit entry from `id, at, subject, role, method, path, fleet, status, body`.
fn audit_row<R: sqlx::Row>(r: &R) -> StoreResult<AuditEntry>
where
    usize: ColumnIndex<R>,
    String: Read<R::Database>,
    i64: Read<R::Database>,
    i32: Read<R::Database>,
{
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

/// A lease's or a replica's expiry as the dialect's statements take it: a time by this
/// machine's clock, or a duration the statement adds to the database's ([`Dialect::clock`]).
fn expiry(now: Option<i64>, ttl: Duration) -> i64 {
    now.unwrap_or(0) + millis(ttl)
}

/// `query` with `time` bound last, where the dialect binds times ([`Dialect::clock`]).
fn at<'q, DB: Database>(
    query: sqlx::query::Query<'q, DB, DB::Arguments>,
    time: Option<i64>,
) -> sqlx::query::Query<'q, DB, DB::Arguments>
where
    i64: Bind<DB>,
{
    match time {
        Some(time) => query.bind(time),
        None => query,
    }
}

/// A page's size as bound.
fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl<DB> Resources for SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: Encode<'a, DB> + Decode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    String: Bind<DB> + Read<DB>,
    i64: Bind<DB> + Read<DB>,
    Option<i64>: Bind<DB>,
    i32: Bind<DB> + Read<DB>,
    bool: Read<DB>,
    Vec<u8>: Read<DB>,
    Option<Vec<u8>>: Bind<DB>,
{
    async fn close(&self) {
        // SQLite moves its write-ahead log into the database file, so the file alone holds
        // everything.
        if let Some(checkpoint) = DB::SQL.checkpoint {
            if let Err(e) = sqlx::query(checkpoint).execute(&self.pool).await {
                tracing::warn!(error = %e, "cannot checkpoint the write-ahead log");
            }
            self.pool.close().await;
        }
    }

    async fn etag(&self, fleet: &str, kind: Kind, name: &str) -> StoreResult<Option<String>> {
        sqlx::query(DB::SQL.etag)
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
            let rows = sqlx::query(DB::SQL.get_run)
                .bind(fleet)
                .bind(name)
                .fetch_all(&self.pool)
                .await?;
            let rows = rows.iter().map(part_row).collect::<StoreResult<_>>()?;
            return Ok(assemble_rows(rows)?
                .pop()
                .map(|(_, text, etag)| (text, etag)));
        }
        let row = sqlx::query(DB::SQL.get)
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
        let sql = DB::SQL;
        if kind == Kind::Run {
            if limit == 0 {
                return Ok(Vec::new());
            }
            // The page's last name first, then the runs up to it with their chunks: read as
            // one range in the order of both primary keys, a page needs no sort (a sort of
            // tens of megabytes of chunks spilled to disk). Both statements read one snapshot.
            let mut tx = self.begin_snapshot().await?;
            let last: Option<String> = sqlx::query(sql.last_run_of_page)
                .bind(fleet)
                .bind(after.unwrap_or(""))
                .bind((limit - 1).min(i64::MAX as usize) as i64)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.col(0))
                .transpose()?;
            let rows = match &last {
                Some(last) => sqlx::query(sql.runs_up_to)
                    .bind(fleet)
                    .bind(after.unwrap_or(""))
                    .bind(last.as_str()),
                // Fewer than a page left: all of them.
                None => sqlx::query(sql.runs_after)
                    .bind(fleet)
                    .bind(after.unwrap_or("")),
            };
            let rows = rows.fetch_all(&mut *tx).await?;
            tx.commit().await?;
            let rows = rows.iter().map(part_row).collect::<StoreResult<_>>()?;
            return assemble_rows(rows);
        }
        let rows = sqlx::query(sql.list)
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
        let mut tx = self.begin_write().await?;
        let current = Self::current_etag(&mut tx, fleet, kind, name).await?;
        check(current.as_deref(), when)?;
        if let (None, Precondition::IfNoneMatchAny, Some(insert)) = (&current, when, DB::SQL.create)
        {
            return Self::create(tx, insert, (fleet, kind, name), text).await;
        }
        let (etag, created) = Self::upsert(&mut tx, fleet, kind, name, text).await?;
        if kind == Kind::Run {
            // A run written whole (created or replaced) has no head until one is set, no
            // chunks and no checkpoint.
            Self::forget_run_parts(&mut tx, fleet, name).await?;
        }
        tx.commit().await?;
        // Where the database does not tell, its one writer created what was not there.
        Ok((etag, created.unwrap_or(current.is_none())))
    }

    async fn register_members(
        &self,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered> {
        DB::register(self, fleet, writes, mode).await
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
        let mut tx = self.begin_bulk().await?;
        let current = DB::lock_bodies(&mut tx, (fleet, kind), &names).await?;
        let etags = Self::next_etags(&mut tx, current.len()).await?;
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
        DB::put_rows(&mut tx, (fleet, kind), &rows).await?;
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
        let sql = DB::SQL;
        let mut tx = self.begin_write().await?;
        if DB::SHARED && kind == Kind::Run {
            // A run's batches lock its snapshot before its resource; so does its deletion, so
            // the two never wait for each other in opposite orders.
            Self::current_etag(&mut tx, fleet, Kind::RunSnapshot, name).await?;
        }
        let current = Self::current_etag(&mut tx, fleet, kind, name).await?;
        check(current.as_deref(), when)?;
        if current.is_none() {
            return Ok(false);
        }
        sqlx::query(sql.delete)
            .bind(fleet)
            .bind(kind.as_str())
            .bind(name)
            .execute(&mut *tx)
            .await?;
        // What goes with it: a run's parts and gates and a member's cluster id, each bound
        // `fleet, name`; a fleet's children, each bound the fleet's name.
        let (parts, of_fleet) = match kind {
            Kind::Run => (sql.delete_run_parts, false),
            Kind::Member => (sql.delete_member_parts, false),
            Kind::Fleet => (sql.delete_fleet_parts, true),
            _ => (&[][..], false),
        };
        for statement in parts {
            let q = sqlx::query(*statement);
            let q = if of_fleet {
                q.bind(name)
            } else {
                q.bind(fleet).bind(name)
            };
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}

#[async_trait]
impl<DB> RunLog for SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: Encode<'a, DB> + Decode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    String: Bind<DB> + Read<DB>,
    i64: Bind<DB> + Read<DB>,
    Option<i64>: Bind<DB>,
    i32: Bind<DB> + Read<DB>,
    bool: Read<DB>,
    Vec<u8>: Read<DB>,
    Option<Vec<u8>>: Bind<DB>,
{
    async fn write_run_batch(&self, batch: &RunBatch) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        Self::write_batch(&mut tx, batch, false).await?;
        tx.commit().await?;
        self.announce_batch(batch);
        Ok(())
    }

    async fn write_run_batches(&self, batches: &[RunBatch]) -> StoreResult<Vec<StoreResult<()>>> {
        let mut tx = self.begin_write().await?;
        let mut results = Vec::with_capacity(batches.len());
        // The lease a batch of this transaction was checked under: the batches of one step
        // are one fleet's, under one fence, and the check is one round trip each otherwise.
        let mut checked: Option<(&str, &Fence)> = None;
        for batch in batches {
            let lease_checked = batch
                .fence
                .as_ref()
                .is_some_and(|f| checked == Some((batch.fleet.as_str(), f)));
            // A run replaced or deleted is refused alone (its checks come before any write);
            // anything else, the loss of the lease included, refuses them all.
            match Self::write_batch(&mut tx, batch, lease_checked).await {
                Err(e @ StoreError::Superseded(_)) => results.push(Err(e)),
                Err(e) => return Err(e),
                Ok(()) => {
                    if let Some(fence) = &batch.fence {
                        checked = Some((batch.fleet.as_str(), fence));
                    }
                    results.push(Ok(()));
                }
            }
        }
        tx.commit().await?;
        for (batch, result) in batches.iter().zip(&results) {
            if result.is_ok() {
                self.announce_batch(batch);
            }
        }
        Ok(results)
    }

    async fn run_heads(&self, fleet: &str) -> StoreResult<Vec<(String, Option<String>)>> {
        let rows = sqlx::query(DB::SQL.run_heads)
            .bind(fleet)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.col(0)?, r.col(1)?))).collect()
    }

    async fn init_run_head(&self, fleet: &str, run: &str, head: &str) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        if Self::current_etag(&mut tx, fleet, Kind::Run, run)
            .await?
            .is_some()
        {
            sqlx::query(DB::SQL.init_head)
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
        let mut tx = self.begin_snapshot().await?;
        let checkpoint = sqlx::query(DB::SQL.checkpoint_of)
            .bind(fleet)
            .bind(run)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| StoreResult::Ok((r.col::<i64>(0)?, r.col::<Vec<u8>>(1)?)))
            .transpose()?;
        let after = checkpoint.as_ref().map_or(0, |(seq, _)| *seq);
        let rows = sqlx::query(DB::SQL.log_after)
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
        let rows = sqlx::query(DB::SQL.member_durations)
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
        let rows = sqlx::query(DB::SQL.fleet_durations)
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
        let rows = sqlx::query(DB::SQL.events_after)
            .bind(fleet)
            .bind(run)
            .bind(after)
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.pool)
            .await?;
        let mut events = Vec::new();
        for r in &rows {
            let (seq, first): (i64, Option<i64>) = (r.col(0)?, r.col(2)?);
            let Some(first) = first else {
                events.push((seq, parse_body(r.col::<&str>(1)?)?));
                continue;
            };
            let text = unpack(r.col(1)?, r.col(3)?)?;
            let lines: Vec<&str> = text.split('\n').collect();
            if lines.len() as i64 != seq - first + 1 {
                return Err(StoreError::Corrupt(format!(
                    "the pack of events {first}..={seq} of run {run:?} holds {}",
                    lines.len()
                )));
            }
            for (n, line) in (first..).zip(lines) {
                if n > after {
                    events.push((n, parse_body(line)?));
                }
            }
        }
        events.truncate(limit);
        Ok(events)
    }

    async fn intents(&self, fleet: &str, run: &str) -> StoreResult<Vec<Intent>> {
        let rows = sqlx::query(DB::SQL.intents)
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
        if operations.is_empty() {
            return Ok(());
        }
        DB::record_operations(self, operations).await
    }
}

#[async_trait]
impl<DB> Tokens for SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: Encode<'a, DB> + Decode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    String: Bind<DB> + Read<DB>,
    i64: Bind<DB> + Read<DB>,
    Option<i64>: Bind<DB>,
    i32: Bind<DB> + Read<DB>,
    bool: Read<DB>,
    Vec<u8>: Read<DB>,
    Option<Vec<u8>>: Bind<DB>,
{
    async fn create_token(&self, token: &TokenRecord) -> StoreResult<()> {
        sqlx::query(DB::SQL.create_token)
            .bind(token.id.as_str())
            .bind(token.hash.as_str())
            .bind(token.role.as_str())
            .bind(token.subject.as_str())
            .bind(token.created_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn token_by_hash(&self, hash: &str) -> StoreResult<Option<TokenRecord>> {
        let row = sqlx::query(DB::SQL.token_by_hash)
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| token_row(&r)).transpose()
    }

    async fn list_tokens(&self) -> StoreResult<Vec<TokenRecord>> {
        let rows = sqlx::query(DB::SQL.tokens).fetch_all(&self.pool).await?;
        rows.iter().map(token_row).collect()
    }

    async fn revoke_token(&self, id: &str) -> StoreResult<bool> {
        let done = sqlx::query(DB::SQL.revoke_token)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done) > 0)
    }
}

#[async_trait]
impl<DB> Coordination for SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: Encode<'a, DB> + Decode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    String: Bind<DB> + Read<DB>,
    i64: Bind<DB> + Read<DB>,
    Option<i64>: Bind<DB>,
    i32: Bind<DB> + Read<DB>,
    bool: Read<DB>,
    Vec<u8>: Read<DB>,
    Option<Vec<u8>>: Bind<DB>,
{
    async fn heartbeat(&self, replica: &str, ttl: Duration) -> StoreResult<usize> {
        let now = DB::clock();
        sqlx::query(DB::SQL.heartbeat)
            .bind(replica)
            .bind(expiry(now, ttl))
            .execute(&self.pool)
            .await?;
        // Replicas gone for an hour are forgotten.
        at(
            sqlx::query(DB::SQL.forget_replicas),
            now.map(|t| t - 3_600_000),
        )
        .execute(&self.pool)
        .await?;
        let alive: i64 = at(sqlx::query(DB::SQL.alive_replicas), now)
            .fetch_one(&self.pool)
            .await?
            .col(0)?;
        Ok(alive as usize)
    }

    async fn alive_replicas(&self) -> StoreResult<usize> {
        let alive: i64 = at(sqlx::query(DB::SQL.alive_replicas), DB::clock())
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
        let now = DB::clock();
        let take = sqlx::query(DB::SQL.acquire_lease)
            .bind(fleet)
            .bind(owner)
            .bind(expiry(now, ttl));
        let row = at(take, now).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| r.col(0)).transpose()?)
    }

    async fn renew_lease(
        &self,
        fleet: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
    ) -> StoreResult<bool> {
        let done = sqlx::query(DB::SQL.renew_lease)
            .bind(expiry(DB::clock(), ttl))
            .bind(fleet)
            .bind(owner)
            .bind(epoch)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done) > 0)
    }

    async fn release_lease(&self, fleet: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        sqlx::query(DB::SQL.release_lease)
            .bind(fleet)
            .bind(owner)
            .bind(epoch)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn leases(&self) -> StoreResult<Vec<Lease>> {
        let now = DB::clock().unwrap_or(0);
        let rows = sqlx::query(DB::SQL.leases).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(Lease {
                    fleet: r.col(0)?,
                    owner: r.col(1)?,
                    epoch: r.col(2)?,
                    expires_in_ms: r.col::<i64>(3)? - now,
                })
            })
            .collect()
    }

    async fn submit_action(&self, fleet: &str, run: &str, input: &Value) -> StoreResult<i64> {
        let notice = Notice::Actions {
            fleet: fleet.to_string(),
        };
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query(DB::SQL.submit_action)
            .bind(fleet)
            .bind(run)
            .bind(input.to_string())
            .fetch_one(&mut *tx)
            .await?
            .col(0)?;
        Self::notify(&mut tx, &notice).await?;
        tx.commit().await?;
        self.announce(notice);
        Ok(id)
    }

    async fn pending_actions(&self, fleet: &str) -> StoreResult<Vec<PendingAction>> {
        let rows = sqlx::query(DB::SQL.pending_actions)
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
        let notice = Notice::Reply { id };
        let mut tx = self.pool.begin().await?;
        sqlx::query(DB::SQL.finish_action)
            .bind(result.to_string())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        Self::notify(&mut tx, &notice).await?;
        tx.commit().await?;
        self.announce(notice);
        Ok(())
    }

    async fn take_action_result(&self, id: i64) -> StoreResult<Option<Value>> {
        let row = sqlx::query(DB::SQL.take_action_result)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| parse_body(r.col::<&str>(0)?)).transpose()
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn shared(&self) -> bool {
        DB::SHARED
    }
}

#[async_trait]
impl<DB> Audit for SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: Encode<'a, DB> + Decode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    String: Bind<DB> + Read<DB>,
    i64: Bind<DB> + Read<DB>,
    Option<i64>: Bind<DB>,
    i32: Bind<DB> + Read<DB>,
    bool: Read<DB>,
    Vec<u8>: Read<DB>,
    Option<Vec<u8>>: Bind<DB>,
{
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        sqlx::query(DB::SQL.append_audit)
            .bind(entry.at)
            .bind(entry.subject.as_str())
            .bind(entry.role.as_str())
            .bind(entry.method.as_str())
            .bind(entry.path.as_str())
            .bind(entry.fleet.as_deref())
            .bind(i32::from(entry.status))
            .bind(entry.body.as_deref())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn prune_audit(&self, before: i64, limit: usize) -> StoreResult<u64> {
        let done = sqlx::query(DB::SQL.prune_audit)
            .bind(before)
            .bind(self::limit(limit))
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn list_audit(
        &self,
        fleet: Option<&str>,
        after: i64,
        since: i64,
        limit: usize,
    ) -> StoreResult<Vec<AuditEntry>> {
        let limit = self::limit(limit);
        let rows = match fleet {
            Some(f) => sqlx::query(DB::SQL.audit_of_fleet)
                .bind(after)
                .bind(since)
                .bind(f)
                .bind(limit),
            None => sqlx::query(DB::SQL.audit)
                .bind(after)
                .bind(since)
                .bind(limit),
        };
        let rows = rows.fetch_all(&self.pool).await?;
        rows.iter().map(audit_row).collect()
    }
}

#[async_trait]
impl<DB> Webhooks for SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: Encode<'a, DB> + Decode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    String: Bind<DB> + Read<DB>,
    i64: Bind<DB> + Read<DB>,
    Option<i64>: Bind<DB>,
    i32: Bind<DB> + Read<DB>,
    bool: Read<DB>,
    Vec<u8>: Read<DB>,
    Option<Vec<u8>>: Bind<DB>,
{
    async fn put_webhook(
        &self,
        webhook: &Webhook,
        when: &Precondition,
    ) -> StoreResult<(String, bool)> {
        let mut tx = self.begin_write().await?;
        let current = Self::webhook_etag(&mut tx, &webhook.name).await?;
        check(current.as_deref(), when)?;
        let etag = Self::next_etag(&mut tx).await?;
        // PostgreSQL's statement says whether it inserted the row (`xmax = 0`): of two racing
        // creators, one is told it created the webhook. SQLite's one writer created it if it
        // was not there.
        let inserted: Option<bool> = sqlx::query(DB::SQL.put_webhook)
            .bind(webhook.name.as_str())
            .bind(webhook.url.as_str())
            .bind(webhook.secret.as_str())
            .bind(serde_json::to_string(&webhook.fleets).unwrap_or_default())
            .bind(serde_json::to_string(&webhook.events).unwrap_or_default())
            .bind(webhook.format.as_str())
            .bind(webhook.system_data.to_string())
            .bind(etag.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.col(0))
            .transpose()?;
        let created = inserted.unwrap_or(current.is_none());
        if when == &Precondition::IfNoneMatchAny && !created {
            return Err(StoreError::Precondition(
                "If-None-Match *: the resource already exists".into(),
            ));
        }
        tx.commit().await?;
        Ok((etag, created))
    }

    async fn get_webhook(&self, name: &str) -> StoreResult<Option<Webhook>> {
        sqlx::query(DB::SQL.webhook)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| webhook_row(&r))
            .transpose()
    }

    async fn list_webhooks(&self, after: Option<&str>, limit: usize) -> StoreResult<Vec<Webhook>> {
        sqlx::query(DB::SQL.webhooks_after)
            .bind(after.unwrap_or(""))
            .bind(self::limit(limit))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(webhook_row)
            .collect()
    }

    async fn delete_webhook(&self, name: &str, when: &Precondition) -> StoreResult<bool> {
        let mut tx = self.begin_write().await?;
        let current = Self::webhook_etag(&mut tx, name).await?;
        check(current.as_deref(), when)?;
        if current.is_none() {
            return Ok(false);
        }
        for statement in DB::SQL.delete_webhook {
            sqlx::query(*statement).bind(name).execute(&mut *tx).await?;
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
        // A row claimed is not due again until its claim lapses, so two claimers do not send
        // it at once (unless the first takes longer than the claim). PostgreSQL skips rows
        // another replica is claiming at this moment; SQLite's claim keeps this server's own
        // passes from sending a row twice while its first send is under way.
        let mut tx = self.begin_write().await?;
        let claimed = sqlx::query(DB::SQL.claim_deliveries)
            .bind(now.saturating_add(claim_ms))
            .bind(now)
            .bind(self::limit(limit))
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(delivery_row)
            .collect::<StoreResult<Vec<_>>>()?;
        let due = DB::due(&mut tx, claimed).await?;
        tx.commit().await?;
        Ok(due)
    }

    async fn record_delivery(&self, id: i64, attempt: &DeliveryAttempt) -> StoreResult<()> {
        let (state, next, delivered) = attempt_columns(attempt);
        sqlx::query(DB::SQL.record_delivery)
            .bind(attempt.at)
            .bind(attempt.status.map(i64::from))
            .bind(attempt.error.as_deref())
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
        sqlx::query(DB::SQL.deliveries_after)
            .bind(webhook)
            .bind(after)
            .bind(state.map(DeliveryState::as_str))
            .bind(self::limit(limit))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(delivery_row)
            .collect()
    }

    async fn prune_deliveries(&self, before: i64) -> StoreResult<u64> {
        let done = sqlx::query(DB::SQL.prune_deliveries)
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn write_reported(
        &self,
        fleet: &str,
        kind: Kind,
        name: &str,
        text: Option<&str>,
        when: &Precondition,
        report: &(dyn for<'e> Fn(bool, Option<&'e str>) -> (String, Value) + Send + Sync),
    ) -> StoreResult<(Option<String>, bool)> {
        if !matches!(kind, Kind::Freeze | Kind::DisruptionBudget) {
            return Err(StoreError::Refused {
                item: 0,
                field: "kind",
                conflict: false,
                message: format!(
                    "{} are not a fleet's rules; only freezes and disruption budgets are reported so",
                    kind.as_str()
                ),
            });
        }
        let mut tx = self.begin_write().await?;
        let current = Self::current_etag(&mut tx, fleet, kind, name).await?;
        check(current.as_deref(), when)?;
        let (etag, flag) = match text {
            Some(text) => {
                let (etag, created) = Self::upsert(&mut tx, fleet, kind, name, text).await?;
                (Some(etag), created.unwrap_or(current.is_none()))
            }
            None if current.is_none() => return Ok((None, false)),
            None => {
                sqlx::query(DB::SQL.delete)
                    .bind(fleet)
                    .bind(kind.as_str())
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                (None, true)
            }
        };
        let (event_id, event) = report(flag, etag.as_deref());
        let hooks = Self::webhooks_in(&mut tx).await?;
        let rows = fleet_event_rows(fleet, &event_id, &event, &hooks, unix_millis());
        Self::insert_deliveries(&mut tx, &rows).await?;
        tx.commit().await?;
        Ok((etag, flag))
    }

    async fn record_fleet_event(
        &self,
        fleet: &str,
        event_id: &str,
        event: &Value,
    ) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let hooks = Self::webhooks_in(&mut tx).await?;
        let rows = fleet_event_rows(fleet, event_id, event, &hooks, unix_millis());
        Self::insert_deliveries(&mut tx, &rows).await?;
        tx.commit().await?;
        Ok(())
    }
}
