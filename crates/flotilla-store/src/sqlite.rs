//! The SQLite backend: one file, one server (a lock on the file itself), write-ahead logging,
//! checkpointed into the file at a clean shutdown. What it shares with PostgreSQL is in
//! [`crate::shared`], its statements in `sql/sqlite.rs`; here are opening the file and the
//! steps SQLite takes its own way: many rows to a statement (each statement crosses to
//! SQLite's own thread), one writer (`BEGIN IMMEDIATE`), so no row is locked and nothing
//! races, and times by this machine's clock.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions,
    SqliteQueryResult, SqliteRow, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Sqlite};
use tokio::sync::broadcast;

use crate::shared::{Dialect, SqlStore};
use crate::{
    Chunk, Col, Delivery, DueDelivery, Kind, MemberWrite, OperationRecord, RegisterMode,
    Registered, RegistrationPlan, StoreError, StoreResult, Webhook, pack, pack_chunk, unix_millis,
    webhook_columns, webhook_row,
};

/// The store on a SQLite file.
pub type SqliteStore = SqlStore<Sqlite>;

impl SqlStore<Sqlite> {
    /// Opens (creating if needed) the database at `path`, takes the single-server lock, and
    /// runs migrations. The lock is taken on the file's one identity ([`canonical_file`])
    /// before SQLite opens anything, and SQLite is then given that identity, never the
    /// spelling: a second server under any name of the file is refused without touching it.
    pub async fn open(path: &Path) -> StoreResult<SqliteStore> {
        let file = canonical_file(path)?;
        // The lock is taken on the database file itself (an advisory `flock`, which SQLite's own
        // `fcntl` locks do not see), so a hard link, which no path resolution finds, finds it
        // taken too.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&file)
            .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", file.display())))?;
        if lock.try_lock().is_err() {
            return Err(StoreError::Unavailable(format!(
                "another flotilla server is using {}; SQLite mode serves one replica only (use --database postgres://… for several)",
                file.display()
            )));
        }
        // What SQLite opens is the file locked: a name swapped for another file between the
        // two is refused.
        let opened = canonical_file(path)?;
        if !same_file(&lock, &opened) {
            return Err(StoreError::Unavailable(format!(
                "{} changed while it was being opened; start again",
                path.display()
            )));
        }
        let store = SqliteStore::connect(&opened).await?;
        // The file lock proves no other server uses this database, so leases held by a server
        // that died are let go now instead of after their time.
        sqlx::query("UPDATE leases SET expires_at = 0")
            .execute(&store.pool)
            .await?;
        sqlx::query("DELETE FROM replicas")
            .execute(&store.pool)
            .await?;
        // Likewise deliveries claimed by a server that died are due again at once.
        sqlx::query(
            "UPDATE webhook_deliveries SET claimed_until = NULL WHERE claimed_until IS NOT NULL",
        )
        .execute(&store.pool)
        .await?;
        Ok(SqliteStore {
            _lock: Some(lock),
            ..store
        })
    }

    /// Writes a consistent copy of the database to `to` (`VACUUM INTO`: a snapshot of one
    /// read transaction, also while a server writes), as one file with no write-ahead log.
    pub async fn backup_to(&self, to: &Path) -> StoreResult<()> {
        // An absolute path: SQLite reads a name starting `file:` as a URI with parameters.
        let to = std::path::absolute(to)
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", to.display())))?;
        sqlx::query("VACUUM INTO ?")
            .bind(to.display().to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Opens the database without the server lock, for short-lived commands (`token create`,
    /// `backup`), at the same identity a server opens it at (so with the same write-ahead
    /// log). Such a command ends with [`crate::Resources::close`], which leaves what it wrote
    /// in the database file.
    pub async fn open_unlocked(path: &Path) -> StoreResult<SqliteStore> {
        SqliteStore::connect(&canonical_file(path)?).await
    }

    /// Connects to `file`, a [`canonical_file`]: given to SQLite as a file name, never parsed
    /// as a URL or a URI (an absolute path, so SQLite does not read it as one either).
    async fn connect(file: &Path) -> StoreResult<SqliteStore> {
        let options = SqliteConnectOptions::new()
            .filename(file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // Every acknowledged write survives a kill at any instant (SEMANTICS §7).
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        let store = SqliteStore {
            pool,
            notices: broadcast::channel(1024).0,
            _lock: None,
        };
        store.migrate().await?;
        Ok(store)
    }
}

/// The SQLite file a `--database` value names: a path (taken as it is, `?` and `%` included),
/// `sqlite://PATH` or `sqlite:PATH` (a URL: its query string is cut off and its path
/// percent-decoded, as sqlx reads it), or SQLite's own `file:PATH` URI (`file:///PATH`,
/// `file://localhost/PATH`), also inside `sqlite:`. Of a URL's parameters only those that
/// change nothing here are taken (`mode=rw`, `mode=rwc`, `cache=private`, `cache=shared`);
/// any other (`vfs`, `nolock`, `immutable`, `mode=ro`, ...) would open the file otherwise than
/// the server's lock assumes, and is refused by name.
pub fn database_file(spec: &str) -> StoreResult<PathBuf> {
    let refused = |why: String| StoreError::Unavailable(format!("--database {spec:?}: {why}"));
    let (rest, url) = match spec
        .strip_prefix("sqlite://")
        .or_else(|| spec.strip_prefix("sqlite:"))
    {
        Some(rest) => (rest, true),
        None => (spec, false),
    };
    let (rest, url) = match rest.strip_prefix("file:") {
        Some(uri) => match uri.strip_prefix("//") {
            // An authority: none, or this machine.
            Some(authority) => {
                let slash = authority.find('/').unwrap_or(authority.len());
                if !matches!(&authority[..slash], "" | "localhost") {
                    return Err(refused(format!(
                        "the host {:?}: a SQLite database is a file on this machine",
                        &authority[..slash]
                    )));
                }
                (&authority[slash..], true)
            }
            None => (uri, true),
        },
        None => (rest, url),
    };
    let path = if url {
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, query),
            None => (rest, ""),
        };
        let (path, query) = match (path.split_once('#'), query.split_once('#')) {
            (Some((path, _)), _) => (path, ""),
            (None, Some((query, _))) => (path, query),
            (None, None) => (path, query),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !matches!(
                (key, value),
                ("mode", "rw" | "rwc") | ("cache", "private" | "shared")
            ) {
                return Err(refused(format!(
                    "the parameter {pair:?} is not taken: Flotilla opens its database one way \
                     (read-write, write-ahead log, locked for one server); name the file alone"
                )));
            }
        }
        percent_decoded(path).ok_or_else(|| refused("not a valid percent-encoded path".into()))?
    } else {
        PathBuf::from(rest)
    };
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
        return Err(refused("names no file".into()));
    }
    Ok(path)
}

/// `%XX` decoded, the rest as it is; `None` for a `%` not followed by two hex digits.
fn percent_decoded(text: &str) -> Option<PathBuf> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
    }
    #[cfg(not(unix))]
    {
        String::from_utf8(out).ok().map(PathBuf::from)
    }
}

/// The one identity of the database file at `path`: its directory (created if missing)
/// resolved to its real, absolute path, and the file's own name, itself resolved when it is a
/// symbolic link. Every relative spelling, `.`/`..`, doubled `/` and symbolic link of a file
/// gives the same identity; SQLite names the write-ahead log after it, so every opener uses
/// the same log. (A hard link is another name of the same file that no resolution finds:
/// the server's lock, on the file itself, covers it.)
pub fn canonical_file(path: &Path) -> StoreResult<PathBuf> {
    let cannot = |what: &str, e: std::io::Error| {
        StoreError::Unavailable(format!("cannot {what} {}: {e}", path.display()))
    };
    let Some(name) = path.file_name() else {
        return Err(StoreError::Unavailable(format!(
            "{}: names a directory, not a database file",
            path.display()
        )));
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| cannot("create the directory of", e))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| cannot("resolve the directory of", e))?;
    let file = dir.join(name);
    match std::fs::canonicalize(&file) {
        Ok(real) => Ok(real),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(&file).is_ok() {
                // A link to nothing: creating the database through it would make a file that
                // is named here by the link alone.
                return Err(StoreError::Unavailable(format!(
                    "{}: a symbolic link to a file that does not exist; name the file itself",
                    path.display()
                )));
            }
            Ok(file)
        }
        Err(e) => Err(cannot("resolve", e)),
    }
}

/// Whether the open `file` is the file at `path` (the same device and inode).
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        true
    }
}

/// The rows `select` (ending in `fleet = `), then `column` (ending in `IN `) finds for `keys`,
/// a few hundred keys to a statement; with `kind`, of that kind only.
async fn select_in(
    c: &mut SqliteConnection,
    select: &'static str,
    (fleet, kind): (&str, Option<Kind>),
    column: &'static str,
    keys: &[&str],
) -> StoreResult<Vec<SqliteRow>> {
    let mut rows = Vec::new();
    for chunk in keys.chunks(crate::ROWS_PER_INSERT) {
        let mut q = QueryBuilder::<Sqlite>::new(select);
        q.push_bind(fleet);
        if let Some(kind) = kind {
            q.push(" AND kind = ").push_bind(kind.as_str());
        }
        q.push(column).push("(");
        let mut list = q.separated(", ");
        for key in chunk {
            list.push_bind(*key);
        }
        q.push(")");
        rows.extend(q.build().fetch_all(&mut *c).await?);
    }
    Ok(rows)
}

#[async_trait]
impl Dialect for Sqlite {
    const SQL: &'static crate::sql::Statements = &crate::sql::SQLITE;
    const SHARED: bool = false;

    fn clock() -> Option<i64> {
        Some(unix_millis())
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn next_etags(c: &mut SqliteConnection, n: usize) -> StoreResult<Vec<String>> {
        let count = i64::try_from(n).unwrap_or(i64::MAX);
        let last: i64 =
            sqlx::query("UPDATE etag_seq SET value = value + ? WHERE id = 1 RETURNING value")
                .bind(count)
                .fetch_one(c)
                .await?
                .col(0)?;
        Ok((last - count + 1..=last)
            .map(|n| format!("\"{n}\""))
            .collect())
    }

    async fn lock_bodies(
        c: &mut SqliteConnection,
        (fleet, kind): (&str, Kind),
        names: &[&str],
    ) -> StoreResult<Vec<SqliteRow>> {
        let select = "SELECT name, body, packed FROM resources WHERE fleet = ";
        select_in(c, select, (fleet, Some(kind)), " AND name IN ", names).await
    }

    /// A few hundred rows to a statement, in order: a name given twice is created, then
    /// replaced.
    async fn put_rows(
        c: &mut SqliteConnection,
        (fleet, kind): (&str, Kind),
        rows: &[(&str, &str, &str)],
    ) -> StoreResult<Option<HashSet<String>>> {
        for chunk in rows.chunks(crate::ROWS_PER_INSERT) {
            let mut packed = Vec::with_capacity(chunk.len());
            for (name, body, etag) in chunk {
                let (body, pack) = pack(kind, body)?;
                packed.push((*name, body, pack, *etag));
            }
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO resources (fleet, kind, name, body, packed, etag) ",
            );
            q.push_values(packed, |mut row, (name, body, pack, etag)| {
                row.push_bind(fleet)
                    .push_bind(kind.as_str())
                    .push_bind(name)
                    .push_bind(body)
                    .push_bind(pack)
                    .push_bind(etag);
            });
            q.push(
                " ON CONFLICT (fleet, kind, name) DO UPDATE SET body = excluded.body, packed = excluded.packed, etag = excluded.etag, chunks = NULL",
            );
            q.build().execute(&mut *c).await?;
        }
        Ok(None)
    }

    async fn finish_intents(
        c: &mut SqliteConnection,
        (fleet, run): (&str, &str),
        attempts: &[u64],
    ) -> StoreResult<()> {
        for chunk in attempts.chunks(crate::ROWS_PER_INSERT) {
            let mut q =
                QueryBuilder::<Sqlite>::new("UPDATE intents SET finished = 1 WHERE fleet = ");
            q.push_bind(fleet)
                .push(" AND run = ")
                .push_bind(run)
                .push(" AND attempt IN (");
            let mut listed = q.separated(", ");
            for attempt in chunk {
                listed.push_bind(*attempt as i64);
            }
            q.push(")");
            q.build().execute(&mut *c).await?;
        }
        Ok(())
    }

    /// A statement each in one transaction: SQLite runs in this process, so a statement is no
    /// round trip.
    async fn record_operations(
        store: &SqliteStore,
        operations: &[OperationRecord],
    ) -> StoreResult<()> {
        let mut tx = store.begin_write().await?;
        for op in operations {
            sqlx::query(
                "UPDATE intents SET operation_id = ? WHERE fleet = ? AND run = ? AND attempt = ?",
            )
            .bind(op.operation_id.as_str())
            .bind(op.fleet.as_str())
            .bind(op.run.as_str())
            .bind(op.attempt as i64)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn put_chunks(
        c: &mut SqliteConnection,
        (fleet, run): (&str, &str),
        chunks: &[Chunk],
    ) -> StoreResult<()> {
        for rows in chunks.chunks(crate::ROWS_PER_INSERT) {
            let mut packed = Vec::with_capacity(rows.len());
            for chunk in rows {
                let (body, pack) = pack_chunk(&chunk.text)?;
                packed.push((chunk, body, pack));
            }
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO run_chunks (fleet, run, chunk, slot, body, packed) ",
            );
            q.push_values(packed, |mut row, (chunk, body, pack)| {
                row.push_bind(fleet)
                    .push_bind(run)
                    .push_bind(i64::from(chunk.index))
                    .push_bind(i64::from(chunk.slot))
                    .push_bind(body)
                    .push_bind(pack);
            });
            q.push(
                " ON CONFLICT (fleet, run, chunk) DO UPDATE SET slot = excluded.slot, body = excluded.body, packed = excluded.packed",
            );
            q.build().execute(&mut *c).await?;
        }
        Ok(())
    }

    async fn register(
        store: &SqliteStore,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered> {
        let mut tx = store.begin_write().await?;
        let names: Vec<&str> = writes.iter().map(|w| w.name.as_str()).collect();
        let mut stored = HashMap::new();
        let select = "SELECT name, body, etag FROM resources WHERE fleet = ";
        let at = (fleet, Some(Kind::Member));
        for r in select_in(&mut tx, select, at, " AND name IN ", &names).await? {
            stored.insert(r.col(0)?, (r.col(1)?, r.col(2)?));
        }
        let keys = RegistrationPlan::keys(writes);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut holders = HashMap::new();
        let select = "SELECT cluster_key, member FROM member_clusters WHERE fleet = ";
        for r in select_in(
            &mut tx,
            select,
            (fleet, None),
            " AND cluster_key IN ",
            &keys,
        )
        .await?
        {
            holders.insert(r.col(0)?, r.col(1)?);
        }
        let plan = RegistrationPlan::decide(writes, mode, &stored, &holders)?;
        for chunk in plan.claims.chunks(crate::ROWS_PER_INSERT) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO member_clusters (fleet, cluster_key, member) ",
            );
            q.push_values(chunk, |mut row, (key, member, _)| {
                row.push_bind(fleet).push_bind(key).push_bind(member);
            });
            q.build().execute(&mut *tx).await?;
        }
        let etags = SqliteStore::next_etags(&mut tx, plan.items.len()).await?;
        // In item order: a name given twice is created, then replaced.
        let rows: Vec<(&str, &str, &str)> = plan
            .items
            .iter()
            .zip(&etags)
            .map(|((name, body, _), etag)| (name.as_str(), body.as_str(), etag.as_str()))
            .collect();
        Sqlite::put_rows(&mut tx, (fleet, Kind::Member), &rows).await?;
        tx.commit().await?;
        let created = plan.items.iter().map(|(_, _, created)| *created);
        Ok(Registered {
            written: etags.into_iter().zip(created).collect(),
        })
    }

    /// A statement or two per delivery: a claim is a few rows, on this machine.
    async fn due(
        c: &mut SqliteConnection,
        claimed: Vec<Delivery>,
    ) -> StoreResult<Vec<DueDelivery>> {
        let mut due = Vec::with_capacity(claimed.len());
        let mut hooks: HashMap<String, Option<Webhook>> = HashMap::new();
        let mut heads: HashMap<(String, String), Option<String>> = HashMap::new();
        for delivery in claimed {
            if !hooks.contains_key(&delivery.webhook) {
                let hook = sqlx::query(concat!(
                    "SELECT ",
                    webhook_columns!(),
                    " FROM webhooks WHERE name = ?"
                ))
                .bind(&delivery.webhook)
                .fetch_optional(&mut *c)
                .await?
                .map(|r| webhook_row(&r))
                .transpose()?;
                hooks.insert(delivery.webhook.clone(), hook);
            }
            let key = (delivery.fleet.clone(), delivery.run.clone());
            if !heads.contains_key(&key) {
                let head = sqlx::query("SELECT head FROM run_heads WHERE fleet = ? AND run = ?")
                    .bind(&key.0)
                    .bind(&key.1)
                    .fetch_optional(&mut *c)
                    .await?
                    .map(|r| r.col::<String>(0))
                    .transpose()?;
                heads.insert(key.clone(), head);
            }
            match hooks.get(&delivery.webhook) {
                Some(Some(webhook)) => due.push(DueDelivery {
                    webhook: webhook.clone(),
                    run_head: heads.get(&key).cloned().flatten(),
                    delivery,
                }),
                // Its webhook is gone (deleting one deletes its deliveries, so only a row of a
                // database changed by hand): it goes now.
                _ => {
                    sqlx::query("DELETE FROM webhook_deliveries WHERE id = ?")
                        .bind(delivery.id)
                        .execute(&mut *c)
                        .await?;
                }
            }
        }
        Ok(due)
    }
}

#[cfg(test)]
mod tests {
    use super::database_file;
    use std::path::PathBuf;

    #[test]
    fn every_spelling_names_its_file_and_parameters_that_open_it_otherwise_are_refused() {
        let file = |s: &str| database_file(s).map_err(|e| e.to_string());
        let p = |s: &str| Ok(PathBuf::from(s));
        assert_eq!(file("/d/a.db"), p("/d/a.db"));
        // A path is taken as it is; a URL is decoded and its query cut off.
        assert_eq!(file("/d/a.db?mode=rw"), p("/d/a.db?mode=rw"));
        assert_eq!(file("/d/a%2Edb"), p("/d/a%2Edb"));
        assert_eq!(file("sqlite:///d/a.db?mode=rw"), p("/d/a.db"));
        assert_eq!(file("sqlite:///d/%61.db"), p("/d/a.db"));
        assert_eq!(file("sqlite:a.db"), p("a.db"));
        assert_eq!(file("sqlite://a.db?cache=shared&mode=rwc"), p("a.db"));
        assert_eq!(file("file:/d/a.db"), p("/d/a.db"));
        assert_eq!(file("file:///d/a.db#x"), p("/d/a.db"));
        assert_eq!(file("file://localhost/d/a.db?mode=rw"), p("/d/a.db"));
        assert_eq!(file("sqlite:file:/d/a.db"), p("/d/a.db"));
        for (spec, named) in [
            ("sqlite:///d/a.db?vfs=unix-none", "vfs"),
            ("file:/d/a.db?nolock=1", "nolock"),
            ("sqlite:///d/a.db?immutable=1", "immutable"),
            ("sqlite:///d/a.db?mode=ro", "mode=ro"),
            ("sqlite:///d/a.db?mode=memory", "mode=memory"),
            ("file://elsewhere/d/a.db", "elsewhere"),
            ("sqlite:///d/a%zz.db", "percent"),
            ("sqlite::memory:", "no file"),
            ("sqlite://", "no file"),
        ] {
            let refused = file(spec);
            assert!(
                refused.as_ref().is_err_and(|e| e.contains(named)),
                "{spec}: {refused:?}"
            );
        }
    }
}
