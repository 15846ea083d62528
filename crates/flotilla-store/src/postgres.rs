//! The PostgreSQL store: the same interface as SQLite, for several replicas sharing one
//! database. Time for leases is the database's clock, so replicas' clocks do not matter; notices
//! travel between replicas with LISTEN/NOTIFY, sent inside the writing transaction so they are
//! delivered only once it commits. What it shares with SQLite is in [`crate::shared`], its
//! statements in `sql/postgres.rs`; here are connecting and the steps PostgreSQL takes its own
//! way: arrays bound (over a network a statement per row costs a round trip each), rows locked
//! for the writes that read them, racing writers told apart by the database.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgListener, PgPoolOptions, PgQueryResult, PgRow,
};
use sqlx::{Postgres, Transaction};
use tokio::sync::broadcast;

use crate::shared::{Dialect, SqlStore};
use crate::{
    Chunk, Col, Delivery, DueDelivery, Kind, MemberWrite, Notice, OperationRecord, RegisterMode,
    Registered, RegistrationPlan, StoreError, StoreResult, Webhook, pack, pack_chunk,
    webhook_columns, webhook_row,
};

/// The channel notices travel on (`notify` in `sql/postgres.rs` sends on it).
const CHANNEL: &str = "flotilla";

/// Attempts a batch registration gets when the database ends its transaction for a reason of
/// its own ([`rolled_back`]).
const REGISTER_ATTEMPTS: u32 = 3;

/// The store on a PostgreSQL database, which several replicas may share.
pub type PgStore = SqlStore<Postgres>;

/// A PostgreSQL URL as it may be shown: its password, if any, replaced.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{host}{path}")
        }
        _ => url.to_string(),
    }
}

/// The SQLSTATE of a database's error, if it is one.
fn sql_state(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// Creates the database `options` names, connected to the server's maintenance database as the
/// same role; a database another replica created meanwhile is fine. A role that may not create
/// databases gets the exact command an administrator runs.
async fn create_database(options: &PgConnectOptions, shown: &str) -> StoreResult<()> {
    use sqlx::Connection;
    let role = options.get_username().to_string();
    let name = options.get_database().unwrap_or(&role).to_string();
    let quoted = |id: &str| format!("\"{}\"", id.replace('"', "\"\""));
    let by_hand = format!(
        "database {name:?} does not exist on {shown}; create it as an administrator with\n  psql -h {} -p {} -U postgres -c 'CREATE DATABASE {} OWNER {}'",
        options.get_host(),
        options.get_port(),
        quoted(&name),
        quoted(&role)
    );
    let mut last = None;
    for maintenance in ["postgres", "template1"] {
        let mut conn =
            match sqlx::PgConnection::connect_with(&options.clone().database(maintenance)).await {
                Ok(conn) => conn,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
        let sql = format!("CREATE DATABASE {}", quoted(&name));
        let made = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
        return match made {
            Ok(_) => {
                tracing::info!(database = name, "created the database");
                Ok(())
            }
            // Made by another replica starting at the same time.
            Err(e) if matches!(sql_state(&e).as_deref(), Some("42P04" | "23505")) => Ok(()),
            Err(e) => Err(StoreError::Unavailable(format!(
                "{by_hand}\n(role {role:?} may not create it here: {e})"
            ))),
        };
    }
    Err(StoreError::Unavailable(format!(
        "{by_hand}\n(the server's maintenance database cannot be reached to create it: {})",
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

impl SqlStore<Postgres> {
    /// Connects to `url` (`postgres://user@host:port/database`), runs migrations (one replica
    /// at a time), and starts listening for other replicas' notices.
    pub async fn open(url: &str) -> StoreResult<PgStore> {
        let options: PgConnectOptions = url.parse().map_err(|e| {
            // The URL may hold a password: it is not repeated.
            StoreError::Unavailable(format!("--database: not a PostgreSQL URL: {e}"))
        })?;
        let connect = |options: PgConnectOptions| {
            PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(
                    options
                        .application_name("flotilla")
                        // A replica paused or cut off inside a transaction would hold its row
                        // locks (a fleet's lease row among them) and block every other replica's
                        // takeover; the database ends such a session instead. Flotilla's
                        // transactions never wait between statements for anything but the
                        // database.
                        .options([("idle_in_transaction_session_timeout", "1000")]),
                )
        };
        let shown = redacted(url);
        let unreachable =
            |e: sqlx::Error| StoreError::Unavailable(format!("cannot connect to {shown}: {e}"));
        let pool = match connect(options.clone()).await {
            Ok(pool) => pool,
            // The database does not exist yet: made here if the role may create databases.
            Err(e) if sql_state(&e).as_deref() == Some("3D000") => {
                create_database(&options, &shown).await?;
                connect(options).await.map_err(unreachable)?
            }
            Err(e) => return Err(unreachable(e)),
        };
        let store = PgStore {
            pool,
            notices: broadcast::channel(4096).0,
            _lock: None,
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

    /// One attempt at [`crate::Resources::register_members`], in one transaction. A few
    /// statements whatever the number of members, each binding arrays: over a network a
    /// statement per member costs a round trip each. Rows are read through a lateral lookup
    /// per name, by key, whatever the table's statistics say: a plan made while a fleet grows
    /// faster than they follow would otherwise scan the whole fleet.
    async fn register_once(
        &self,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered> {
        let mut tx = self.begin_bulk().await?;
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
        let etags = PgStore::next_etags(&mut tx, plan.items.len()).await?;
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
        let inserted = Postgres::put_rows(&mut tx, (fleet, Kind::Member), &rows)
            .await?
            .unwrap_or_default();
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
impl Dialect for Postgres {
    const SQL: &'static crate::sql::Statements = &crate::sql::POSTGRES;
    const SHARED: bool = true;

    fn clock() -> Option<i64> {
        None
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn next_etags(c: &mut PgConnection, n: usize) -> StoreResult<Vec<String>> {
        sqlx::query("SELECT nextval('etag_seq') FROM generate_series(1, $1)")
            .bind(i64::try_from(n).unwrap_or(i64::MAX))
            .fetch_all(c)
            .await?
            .iter()
            .map(|r| r.col::<i64>(0).map(|n| format!("\"{n}\"")))
            .collect()
    }

    /// One statement (a name at most once); `xmax` is zero on a row the statement inserted.
    async fn put_rows(
        c: &mut PgConnection,
        (fleet, kind): (&str, Kind),
        rows: &[(&str, &str, &str)],
    ) -> StoreResult<Option<HashSet<String>>> {
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
        .fetch_all(c)
        .await?
        {
            if r.col::<bool>(1)? {
                created.insert(r.col(0)?);
            }
        }
        Ok(Some(created))
    }

    /// One array parameter, not an `IN` list of up to 500: one statement text to prepare.
    async fn finish_intents(
        c: &mut PgConnection,
        (fleet, run): (&str, &str),
        attempts: &[u64],
    ) -> StoreResult<()> {
        let attempts: Vec<i64> = attempts.iter().map(|a| *a as i64).collect();
        sqlx::query(
            "UPDATE intents SET finished = TRUE WHERE fleet = $1 AND run = $2 AND attempt = ANY($3)",
        )
        .bind(fleet)
        .bind(run)
        .bind(&attempts)
        .execute(c)
        .await?;
        Ok(())
    }

    /// One statement for them all, outside any transaction: a dispatch names hundreds of
    /// operations at once. One statement each in one transaction was as many round trips with
    /// the intents' rows locked: under load the database ended such transactions as idle
    /// (their ids lost), and the batches finishing the same intents waited on their locks
    /// (338 ms a statement at 10 fleets of 100,000 members, the database's largest cost).
    async fn record_operations(store: &PgStore, operations: &[OperationRecord]) -> StoreResult<()> {
        // The last id named for an attempt wins, as it did one statement after another
        // (`UPDATE … FROM` would take any one of several rows matching an intent).
        let mut last = HashMap::new();
        for o in operations {
            last.insert(
                (o.fleet.as_str(), o.run.as_str(), o.attempt as i64),
                o.operation_id.as_str(),
            );
        }
        let (mut fleets, mut runs, mut attempts, mut ids) = (vec![], vec![], vec![], vec![]);
        for ((fleet, run, attempt), id) in last {
            fleets.push(fleet);
            runs.push(run);
            attempts.push(attempt);
            ids.push(id);
        }
        sqlx::query(
            "UPDATE intents AS i SET operation_id = u.o \
             FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(f, r, a, o) \
             WHERE i.fleet = u.f AND i.run = u.r AND i.attempt = u.a",
        )
        .bind(&fleets)
        .bind(&runs)
        .bind(&attempts)
        .bind(&ids)
        .execute(&store.pool)
        .await?;
        Ok(())
    }

    async fn put_chunks(
        c: &mut PgConnection,
        (fleet, run): (&str, &str),
        chunks: &[Chunk],
    ) -> StoreResult<()> {
        let mut indices = Vec::with_capacity(chunks.len());
        let mut slots = Vec::with_capacity(chunks.len());
        let mut bodies = Vec::with_capacity(chunks.len());
        let mut packs = Vec::with_capacity(chunks.len());
        for chunk in chunks {
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
        .execute(c)
        .await?;
        Ok(())
    }

    async fn lock_bodies(
        c: &mut PgConnection,
        (fleet, kind): (&str, Kind),
        names: &[&str],
    ) -> StoreResult<Vec<PgRow>> {
        Ok(sqlx::query(
            "SELECT r.* FROM UNNEST($2::text[]) AS u(n) CROSS JOIN LATERAL (SELECT name, body, packed FROM resources WHERE fleet = $1 AND kind = $3 AND name = u.n FOR UPDATE) r",
        )
        .bind(fleet)
        .bind(names)
        .bind(kind.as_str())
        .fetch_all(c)
        .await?)
    }

    /// All or nothing: a transaction the database ended by itself wrote nothing, and is run
    /// again from the start (it reads what another writer committed meanwhile).
    async fn register(
        store: &PgStore,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered> {
        let mut attempt = 1;
        loop {
            match store.register_once(fleet, writes, mode).await {
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

    /// Two statements whatever the number of deliveries.
    async fn due(c: &mut PgConnection, claimed: Vec<Delivery>) -> StoreResult<Vec<DueDelivery>> {
        let mut names: Vec<String> = claimed.iter().map(|d| d.webhook.clone()).collect();
        names.sort();
        names.dedup();
        let hooks: HashMap<String, Webhook> = sqlx::query(concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhooks WHERE name = ANY($1)"
        ))
        .bind(&names)
        .fetch_all(&mut *c)
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
        .fetch_all(&mut *c)
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
                .execute(&mut *c)
                .await?;
        }
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

    /// Runs `sql` on the server's `postgres` database (creating and dropping the databases of
    /// tests and benches). Blocking: for a caller outside any async runtime; panics on failure.
    pub fn admin_sql(sql: String) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            use sqlx::Connection;
            let mut admin = sqlx::PgConnection::connect(&format!("{}/postgres", base()))
                .await
                .expect("the tests need PostgreSQL at FLOTILLA_TEST_POSTGRES or 127.0.0.1:5432");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut admin)
                .await
                .expect("admin statement");
        });
    }
}
