//! The SQLite backend: one file, one server (a lock on the file itself), write-ahead logging,
//! checkpointed into the file at a clean shutdown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tokio::sync::broadcast;

use super::*;

pub struct SqliteStore {
    pool: SqlitePool,
    notices: broadcast::Sender<Notice>,
    /// Held for the process's life: one server per database file.
    _lock: Option<std::fs::File>,
}

impl SqliteStore {
    /// Tells this process's listeners of a written batch.
    fn notify_batch(&self, batch: &RunBatch) {
        for notice in Notice::of_batch(batch) {
            let _ = self.notices.send(notice);
        }
    }

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
    /// log). Such a command ends with [`Resources::close`], which leaves what it wrote in the
    /// database file.
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

    async fn migrate(&self) -> StoreResult<()> {
        use sqlx::migrate::Migrate;
        let migrator = crate::migrate::migrator(crate::migrate::SQLITE);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let legacy: i64 = sqlx::query(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
        )
        .fetch_one(&mut *tx)
        .await?
        .col(0)?;
        if legacy > 0 {
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
                    "INSERT OR IGNORE INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                     VALUES (?, ?, TRUE, ?, 0)",
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

/// `n` new eTags in one statement.
async fn next_etags(tx: &mut Transaction<'_, Sqlite>, n: usize) -> StoreResult<Vec<String>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let count = i64::try_from(n).unwrap_or(i64::MAX);
    let last: i64 =
        sqlx::query("UPDATE etag_seq SET value = value + ? WHERE id = 1 RETURNING value")
            .bind(count)
            .fetch_one(&mut **tx)
            .await?
            .col(0)?;
    Ok((last - count + 1..=last)
        .map(|n| format!("\"{n}\""))
        .collect())
}

/// The rows `select` (ending in `fleet = `), then `column` (ending in `IN `) finds for `keys`,
/// a few hundred keys to a statement; with `kind`, of that kind only.
async fn select_in(
    tx: &mut Transaction<'_, Sqlite>,
    select: &'static str,
    fleet: &str,
    kind: Option<Kind>,
    column: &'static str,
    keys: &[&str],
) -> StoreResult<Vec<sqlx::sqlite::SqliteRow>> {
    let mut rows = Vec::new();
    for chunk in keys.chunks(crate::ROWS_PER_INSERT) {
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(select);
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
        rows.extend(q.build().fetch_all(&mut **tx).await?);
    }
    Ok(rows)
}

/// Creates or replaces resources, `(name, body)` each with its eTag, in order, a few hundred
/// to a statement.
async fn put_rows(
    tx: &mut Transaction<'_, Sqlite>,
    fleet: &str,
    kind: Kind,
    rows: &[(&str, &str)],
    etags: &[String],
) -> StoreResult<()> {
    for (chunk, tags) in rows
        .chunks(crate::ROWS_PER_INSERT)
        .zip(etags.chunks(crate::ROWS_PER_INSERT))
    {
        let mut packed = Vec::with_capacity(chunk.len());
        for (name, body) in chunk {
            let (body, pack) = pack(kind, body)?;
            packed.push((*name, body, pack));
        }
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO resources (fleet, kind, name, body, packed, etag) ",
        );
        q.push_values(
            packed.into_iter().zip(tags),
            |mut row, ((name, body, pack), tag)| {
                row.push_bind(fleet)
                    .push_bind(kind.as_str())
                    .push_bind(name)
                    .push_bind(body)
                    .push_bind(pack)
                    .push_bind(tag);
            },
        );
        q.push(
            " ON CONFLICT (fleet, kind, name) DO UPDATE SET body = excluded.body, packed = excluded.packed, etag = excluded.etag, chunks = NULL",
        );
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// Writes a run's document as a status write stores it: its frame in the run's resource, the
/// chunks that changed, and none past its count ([`RunDocument`]).
async fn put_document(
    tx: &mut Transaction<'_, Sqlite>,
    fleet: &str,
    run: &str,
    document: &RunDocument,
) -> StoreResult<()> {
    let etag = next_etag(tx).await?;
    let frame = serde_json::to_string(&document.frame)
        .map_err(|e| StoreError::Unavailable(format!("cannot write a run's frame: {e}")))?;
    let (body, packed) = pack(Kind::Run, &frame)?;
    sqlx::query(
        "INSERT INTO resources (fleet, kind, name, body, packed, etag, chunks) VALUES (?, ?, ?, ?, ?, ?, ?) \
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
    for rows in document.changed.chunks(crate::ROWS_PER_INSERT) {
        let mut packed = Vec::with_capacity(rows.len());
        for chunk in rows {
            let (body, pack) = pack_chunk(&chunk.text)?;
            packed.push((chunk, body, pack));
        }
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
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
        q.build().execute(&mut **tx).await?;
    }
    sqlx::query("DELETE FROM run_chunks WHERE fleet = ? AND run = ? AND chunk >= ?")
        .bind(fleet)
        .bind(run)
        .bind(i64::from(document.chunks))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn next_etag(tx: &mut Transaction<'_, Sqlite>) -> StoreResult<String> {
    Ok(next_etags(tx, 1).await?.remove(0))
}

async fn current_etag(
    tx: &mut Transaction<'_, Sqlite>,
    fleet: &str,
    kind: Kind,
    name: &str,
) -> StoreResult<Option<String>> {
    sqlx::query("SELECT etag FROM resources WHERE fleet = ? AND kind = ? AND name = ?")
        .bind(fleet)
        .bind(kind.as_str())
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| r.col(0))
        .transpose()
}

/// Appends entries to one of a run's numbered logs (its input log, its events), in order;
/// returns the number the first was given.
async fn append<E: ToString>(
    tx: &mut Transaction<'_, Sqlite>,
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
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(insert);
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

async fn upsert(
    tx: &mut Transaction<'_, Sqlite>,
    fleet: &str,
    kind: Kind,
    name: &str,
    body: &str,
) -> StoreResult<String> {
    let etag = next_etag(tx).await?;
    put_rows(
        tx,
        fleet,
        kind,
        &[(name, body)],
        std::slice::from_ref(&etag),
    )
    .await?;
    Ok(etag)
}

#[async_trait]
impl Resources for SqliteStore {
    async fn close(&self) {
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await
        {
            tracing::warn!(error = %e, "cannot checkpoint the write-ahead log");
        }
        self.pool.close().await;
    }

    async fn etag(&self, fleet: &str, kind: Kind, name: &str) -> StoreResult<Option<String>> {
        sqlx::query("SELECT etag FROM resources WHERE fleet = ? AND kind = ? AND name = ?")
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
            let rows = sqlx::query(
                "SELECT r.name, r.body, r.packed, r.etag, r.chunks, c.chunk, c.slot, c.body, c.packed \
                 FROM resources r LEFT JOIN run_chunks c ON c.fleet = r.fleet AND c.run = r.name AND c.chunk < r.chunks \
                 WHERE r.fleet = ? AND r.kind = 'updateRuns' AND r.name = ? ORDER BY c.chunk",
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
            "SELECT body, packed, etag FROM resources WHERE fleet = ? AND kind = ? AND name = ?",
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
            // tens of megabytes of chunks spilled to disk). A deferred transaction: both statements read one snapshot of the write-ahead log.
            let mut tx = self.pool.begin().await?;
            let last: Option<String> = sqlx::query(
                "SELECT name FROM resources WHERE fleet = ? AND kind = 'updateRuns' AND name > ? ORDER BY name LIMIT 1 OFFSET ?",
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
                         WHERE r.fleet = ? AND r.kind = 'updateRuns' AND r.name > ?",
                        $rest
                    )
                };
            }
            let query = match last {
                Some(_) => page!(" AND r.name <= ? ORDER BY r.name, c.chunk"),
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
            "SELECT name, body, packed, etag FROM resources WHERE fleet = ? AND kind = ? AND name > ? ORDER BY name LIMIT ?",
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let current = current_etag(&mut tx, fleet, kind, name).await?;
        check(current.as_deref(), when)?;
        let etag = upsert(&mut tx, fleet, kind, name, text).await?;
        if kind == Kind::Run {
            // A run written whole (created or replaced) has no head until one is set, no
            // chunks and no checkpoint.
            for statement in [
                "DELETE FROM run_heads WHERE fleet = ? AND run = ?",
                "DELETE FROM run_chunks WHERE fleet = ? AND run = ?",
                "DELETE FROM run_checkpoints WHERE fleet = ? AND run = ?",
            ] {
                sqlx::query(statement)
                    .bind(fleet)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok((etag, current.is_none()))
    }

    async fn register_members(
        &self,
        fleet: &str,
        writes: &[MemberWrite],
        mode: RegisterMode,
    ) -> StoreResult<Registered> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        // Hundreds of rows to a statement: each statement crosses to SQLite's own thread.
        let names: Vec<&str> = writes.iter().map(|w| w.name.as_str()).collect();
        let mut stored = HashMap::new();
        for r in select_in(
            &mut tx,
            "SELECT name, body, etag FROM resources WHERE fleet = ",
            fleet,
            Some(Kind::Member),
            " AND name IN ",
            &names,
        )
        .await?
        {
            stored.insert(r.col(0)?, (r.col(1)?, r.col(2)?));
        }
        let keys = RegistrationPlan::keys(writes);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut holders = HashMap::new();
        for r in select_in(
            &mut tx,
            "SELECT cluster_key, member FROM member_clusters WHERE fleet = ",
            fleet,
            None,
            " AND cluster_key IN ",
            &keys,
        )
        .await?
        {
            holders.insert(r.col(0)?, r.col(1)?);
        }
        let plan = RegistrationPlan::decide(writes, mode, &stored, &holders)?;
        for chunk in plan.claims.chunks(crate::ROWS_PER_INSERT) {
            let mut q = sqlx::QueryBuilder::<Sqlite>::new(
                "INSERT INTO member_clusters (fleet, cluster_key, member) ",
            );
            q.push_values(chunk, |mut row, (key, member, _)| {
                row.push_bind(fleet).push_bind(key).push_bind(member);
            });
            q.build().execute(&mut *tx).await?;
        }
        let etags = next_etags(&mut tx, plan.items.len()).await?;
        // In item order: a name given twice is created, then replaced.
        let rows: Vec<(&str, &str)> = plan
            .items
            .iter()
            .map(|(name, body, _)| (name.as_str(), body.as_str()))
            .collect();
        put_rows(&mut tx, fleet, Kind::Member, &rows, &etags).await?;
        tx.commit().await?;
        let created = plan.items.iter().map(|(_, _, created)| *created);
        Ok(Registered {
            written: etags.into_iter().zip(created).collect(),
        })
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
        let names: Vec<&str> = latest.keys().copied().collect();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut texts = Vec::new();
        for r in select_in(
            &mut tx,
            "SELECT name, body, packed FROM resources WHERE fleet = ",
            fleet,
            Some(kind),
            " AND name IN ",
            &names,
        )
        .await?
        {
            let name: String = r.col(0)?;
            let text = unpack(r.col(1)?, r.col(2)?)?;
            let status = latest.get(name.as_str()).copied().unwrap_or(&Value::Null);
            texts.push((name, with_status(&text, status)?.to_string()));
        }
        let etags = next_etags(&mut tx, texts.len()).await?;
        let rows: Vec<(&str, &str)> = texts
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        put_rows(&mut tx, fleet, kind, &rows, &etags).await?;
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let current = current_etag(&mut tx, fleet, kind, name).await?;
        check(current.as_deref(), when)?;
        if current.is_none() {
            return Ok(false);
        }
        sqlx::query("DELETE FROM resources WHERE fleet = ? AND kind = ? AND name = ?")
            .bind(fleet)
            .bind(kind.as_str())
            .bind(name)
            .execute(&mut *tx)
            .await?;
        match kind {
            Kind::Run => {
                for statement in [
                    "DELETE FROM resources WHERE fleet = ? AND kind = 'updateRunSnapshots' AND name = ?",
                    "DELETE FROM run_log WHERE fleet = ? AND run = ?",
                    "DELETE FROM run_events WHERE fleet = ? AND run = ?",
                    "DELETE FROM intents WHERE fleet = ? AND run = ?",
                    "DELETE FROM run_heads WHERE fleet = ? AND run = ?",
                    "DELETE FROM run_chunks WHERE fleet = ? AND run = ?",
                    "DELETE FROM run_checkpoints WHERE fleet = ? AND run = ?",
                ] {
                    sqlx::query(statement)
                        .bind(fleet)
                        .bind(name)
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query("DELETE FROM resources WHERE fleet = ? AND kind = 'gates' AND json_extract(body, '$.properties.target.updateRunProperties.name') = ?")
                    .bind(fleet)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
            Kind::Member => {
                sqlx::query("DELETE FROM member_clusters WHERE fleet = ? AND member = ?")
                    .bind(fleet)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
            Kind::Fleet => {
                sqlx::query("DELETE FROM resources WHERE fleet = ?")
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                for statement in [
                    "DELETE FROM member_clusters WHERE fleet = ?",
                    "DELETE FROM run_log WHERE fleet = ?",
                    "DELETE FROM run_events WHERE fleet = ?",
                    "DELETE FROM intents WHERE fleet = ?",
                    "DELETE FROM run_heads WHERE fleet = ?",
                    "DELETE FROM run_chunks WHERE fleet = ?",
                    "DELETE FROM run_checkpoints WHERE fleet = ?",
                    "DELETE FROM upgrade_durations WHERE fleet = ?",
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
impl RunLog for SqliteStore {
    async fn write_run_batch(&self, batch: &RunBatch) -> StoreResult<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        write_batch(&mut tx, batch).await?;
        tx.commit().await?;
        self.notify_batch(batch);
        Ok(())
    }

    async fn write_run_batches(&self, batches: &[RunBatch]) -> StoreResult<Vec<StoreResult<()>>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
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
        for (batch, result) in batches.iter().zip(&results) {
            if result.is_ok() {
                self.notify_batch(batch);
            }
        }
        Ok(results)
    }

    async fn run_heads(&self, fleet: &str) -> StoreResult<Vec<(String, Option<String>)>> {
        let rows = sqlx::query(
            "SELECT r.name, h.head FROM resources r LEFT JOIN run_heads h ON h.fleet = r.fleet AND h.run = r.name WHERE r.fleet = ? AND r.kind = 'updateRuns' ORDER BY r.name",
        )
        .bind(fleet)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.col(0)?, r.col(1)?))).collect()
    }

    async fn init_run_head(&self, fleet: &str, run: &str, head: &str) -> StoreResult<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if current_etag(&mut tx, fleet, Kind::Run, run)
            .await?
            .is_some()
        {
            sqlx::query(
                "INSERT INTO run_heads (fleet, run, head) VALUES (?, ?, ?) ON CONFLICT (fleet, run) DO NOTHING",
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
        // A deferred transaction: both reads see one snapshot of the WAL.
        let mut tx = self.pool.begin().await?;
        let checkpoint =
            sqlx::query("SELECT seq, packed FROM run_checkpoints WHERE fleet = ? AND run = ?")
                .bind(fleet)
                .bind(run)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| StoreResult::Ok((r.col::<i64>(0)?, r.col::<Vec<u8>>(1)?)))
                .transpose()?;
        let after = checkpoint.as_ref().map_or(0, |(seq, _)| *seq);
        let rows = sqlx::query(
            "SELECT entry FROM run_log WHERE fleet = ? AND run = ? AND seq > ? ORDER BY seq",
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
             FROM upgrade_durations WHERE fleet = ? AND upgrade_type = ?) AS recent WHERE n <= ? ORDER BY member, n",
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
            "SELECT seconds FROM upgrade_durations WHERE fleet = ? AND upgrade_type = ? ORDER BY finished_at DESC, member DESC LIMIT ?",
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
        let rows = sqlx::query("SELECT seq, event FROM run_events WHERE fleet = ? AND run = ? AND seq > ? ORDER BY seq LIMIT ?")
            .bind(fleet)
            .bind(run)
            .bind(after)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.col(0)?, parse_body(r.col::<&str>(1)?)?)))
            .collect()
    }

    async fn intents(&self, fleet: &str, run: &str) -> StoreResult<Vec<Intent>> {
        let rows = sqlx::query("SELECT attempt, member, target, operation_id, finished, recorded_at FROM intents WHERE fleet = ? AND run = ? ORDER BY attempt")
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
                    finished: r.col::<i64>(4)? != 0,
                    recorded_at: r.col::<Option<i64>>(5)?.map(Time),
                })
            })
            .collect()
    }

    async fn record_operations(&self, operations: &[OperationRecord]) -> StoreResult<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for op in operations {
            sqlx::query(
                "UPDATE intents SET operation_id = ? WHERE fleet = ? AND run = ? AND attempt = ?",
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
impl Tokens for SqliteStore {
    async fn create_token(&self, token: &TokenRecord) -> StoreResult<()> {
        sqlx::query("INSERT INTO tokens (id, hash, role, subject, created_at, revoked) VALUES (?, ?, ?, ?, ?, 0)")
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
            "SELECT id, hash, role, subject, created_at, revoked FROM tokens WHERE hash = ?",
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
        let done = sqlx::query("UPDATE tokens SET revoked = 1 WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

#[async_trait]
impl Coordination for SqliteStore {
    async fn heartbeat(&self, replica: &str, ttl: Duration) -> StoreResult<usize> {
        let now = unix_millis();
        sqlx::query("INSERT INTO replicas (id, expires_at) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at")
            .bind(replica)
            .bind(now + millis(ttl))
            .execute(&self.pool)
            .await?;
        // Replicas gone for an hour are forgotten.
        sqlx::query("DELETE FROM replicas WHERE expires_at < ?")
            .bind(now - 3_600_000)
            .execute(&self.pool)
            .await?;
        let alive: i64 = sqlx::query("SELECT COUNT(*) FROM replicas WHERE expires_at >= ?")
            .bind(now)
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
        let now = unix_millis();
        let row = sqlx::query(
            "INSERT INTO leases (fleet, owner, epoch, expires_at) VALUES (?, ?, 1, ?)
             ON CONFLICT (fleet) DO UPDATE SET owner = excluded.owner, epoch = leases.epoch + 1,
                 expires_at = excluded.expires_at
             WHERE leases.expires_at < ? OR leases.owner = excluded.owner
             RETURNING epoch",
        )
        .bind(fleet)
        .bind(owner)
        .bind(now + millis(ttl))
        .bind(now)
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
            "UPDATE leases SET expires_at = ? WHERE fleet = ? AND owner = ? AND epoch = ?",
        )
        .bind(unix_millis() + millis(ttl))
        .bind(fleet)
        .bind(owner)
        .bind(epoch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn release_lease(&self, fleet: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        sqlx::query("UPDATE leases SET expires_at = 0 WHERE fleet = ? AND owner = ? AND epoch = ?")
            .bind(fleet)
            .bind(owner)
            .bind(epoch)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn leases(&self) -> StoreResult<Vec<Lease>> {
        let now = unix_millis();
        let rows = sqlx::query("SELECT fleet, owner, epoch, expires_at FROM leases ORDER BY fleet")
            .fetch_all(&self.pool)
            .await?;
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
        let id: i64 =
            sqlx::query("INSERT INTO actions (fleet, run, input) VALUES (?, ?, ?) RETURNING id")
                .bind(fleet)
                .bind(run)
                .bind(input.to_string())
                .fetch_one(&self.pool)
                .await?
                .col(0)?;
        let _ = self.notices.send(Notice::Actions {
            fleet: fleet.to_string(),
        });
        Ok(id)
    }

    async fn pending_actions(&self, fleet: &str) -> StoreResult<Vec<PendingAction>> {
        let rows = sqlx::query(
            "SELECT id, run, input FROM actions WHERE fleet = ? AND result IS NULL ORDER BY id",
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
        sqlx::query("UPDATE actions SET result = ? WHERE id = ? AND result IS NULL")
            .bind(result.to_string())
            .bind(id)
            .execute(&self.pool)
            .await?;
        let _ = self.notices.send(Notice::Reply { id });
        Ok(())
    }

    async fn take_action_result(&self, id: i64) -> StoreResult<Option<Value>> {
        let row =
            sqlx::query("DELETE FROM actions WHERE id = ? AND result IS NOT NULL RETURNING result")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|r| parse_body(r.col::<&str>(0)?)).transpose()
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn shared(&self) -> bool {
        false
    }
}

#[async_trait]
impl Audit for SqliteStore {
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        sqlx::query("INSERT INTO audit (at, subject, role, method, path, fleet, status, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
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
            "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ? ORDER BY at LIMIT ?)",
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
                sqlx::query("SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > ? AND at >= ? AND fleet = ? ORDER BY id LIMIT ?")
                    .bind(after)
                    .bind(since)
                    .bind(f)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                sqlx::query("SELECT id, at, subject, role, method, path, fleet, status, body FROM audit WHERE id > ? AND at >= ? ORDER BY id LIMIT ?")
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

fn audit_row(r: &sqlx::sqlite::SqliteRow) -> StoreResult<AuditEntry> {
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

fn token_row(r: &sqlx::sqlite::SqliteRow) -> StoreResult<TokenRecord> {
    Ok(TokenRecord {
        id: r.col(0)?,
        hash: r.col(1)?,
        role: r.col(2)?,
        subject: r.col(3)?,
        created_at: r.col(4)?,
        revoked: r.col::<i64>(5)? != 0,
    })
}

async fn put_head(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    fleet: &str,
    run: &str,
    head: &str,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO run_heads (fleet, run, head) VALUES (?, ?, ?) ON CONFLICT (fleet, run) DO UPDATE SET head = excluded.head",
    )
    .bind(fleet)
    .bind(run)
    .bind(head)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A run's batch, inside a transaction: its checks first (the lease, the run's snapshot), then
/// its writes.
async fn write_batch(tx: &mut Transaction<'_, Sqlite>, batch: &RunBatch) -> StoreResult<()> {
    if batch.fence.is_some() {
        let found = sqlx::query("SELECT owner, epoch FROM leases WHERE fleet = ?")
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
        "SELECT COALESCE(MAX(seq), 0) FROM run_log WHERE fleet = ? AND run = ?",
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
             SELECT ?1, ?2, MAX(seq), ?3 FROM run_log WHERE fleet = ?1 AND run = ?2 \
             ON CONFLICT (fleet, run) DO UPDATE SET seq = excluded.seq, packed = excluded.packed",
        )
        .bind(&batch.fleet)
        .bind(&batch.run)
        .bind(packed)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "DELETE FROM run_log WHERE fleet = ?1 AND run = ?2 \
             AND seq < (SELECT seq FROM run_checkpoints WHERE fleet = ?1 AND run = ?2)",
        )
        .bind(&batch.fleet)
        .bind(&batch.run)
        .execute(&mut **tx)
        .await?;
    }
    let first_event = append(
        tx,
        "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE fleet = ? AND run = ?",
        "INSERT INTO run_events (fleet, run, seq, event) ",
        batch,
        &batch.events,
    )
    .await?;
    if !batch.events.is_empty() {
        write_outbox(tx, batch, first_event).await?;
    }
    for chunk in batch.durations.chunks(crate::ROWS_PER_INSERT) {
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
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
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO intents (fleet, run, attempt, member, target, operation_id, finished, recorded_at) ",
        );
        q.push_values(chunk, |mut row, intent| {
            row.push_bind(batch.fleet.clone())
                .push_bind(batch.run.clone())
                .push_bind(intent.attempt as i64)
                .push_bind(intent.member.clone())
                .push_bind(intent.target.to_string())
                .push_bind(intent.operation_id.clone())
                .push("0")
                .push_bind(intent.recorded_at.map(|t| t.unix()));
        });
        q.build().execute(&mut **tx).await?;
    }
    for chunk in batch.finished_attempts.chunks(crate::ROWS_PER_INSERT) {
        let mut q =
            sqlx::QueryBuilder::<Sqlite>::new("UPDATE intents SET finished = 1 WHERE fleet = ");
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
        sqlx::query("UPDATE actions SET result = ? WHERE id = ? AND result IS NULL")
            .bind(result.to_string())
            .bind(id)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// The webhooks, read in a transaction that writes outbox rows.
async fn webhooks_in(tx: &mut Transaction<'_, Sqlite>) -> StoreResult<Vec<Webhook>> {
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
    tx: &mut Transaction<'_, Sqlite>,
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
async fn insert_deliveries(tx: &mut Transaction<'_, Sqlite>, rows: &[Delivery]) -> StoreResult<()> {
    for chunk in rows.chunks(crate::ROWS_PER_INSERT) {
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
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

#[async_trait]
impl Webhooks for SqliteStore {
    async fn put_webhook(
        &self,
        webhook: &Webhook,
        when: &Precondition,
    ) -> StoreResult<(String, bool)> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let current: Option<String> = sqlx::query("SELECT etag FROM webhooks WHERE name = ?")
            .bind(&webhook.name)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.col(0))
            .transpose()?;
        check(current.as_deref(), when)?;
        let etag = next_etag(&mut tx).await?;
        sqlx::query(
            "INSERT INTO webhooks (name, url, secret, fleets, events, format, system_data, etag) VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (name) DO UPDATE SET url = excluded.url, secret = excluded.secret, fleets = excluded.fleets, \
             events = excluded.events, format = excluded.format, system_data = excluded.system_data, etag = excluded.etag",
        )
        .bind(&webhook.name)
        .bind(&webhook.url)
        .bind(&webhook.secret)
        .bind(serde_json::to_string(&webhook.fleets).unwrap_or_default())
        .bind(serde_json::to_string(&webhook.events).unwrap_or_default())
        .bind(&webhook.format)
        .bind(webhook.system_data.to_string())
        .bind(&etag)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((etag, current.is_none()))
    }

    async fn get_webhook(&self, name: &str) -> StoreResult<Option<Webhook>> {
        sqlx::query(concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhooks WHERE name = ?"
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
            " FROM webhooks WHERE name > ? ORDER BY name LIMIT ?"
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let current: Option<String> = sqlx::query("SELECT etag FROM webhooks WHERE name = ?")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.col(0))
            .transpose()?;
        check(current.as_deref(), when)?;
        if current.is_none() {
            return Ok(false);
        }
        for statement in [
            "DELETE FROM webhooks WHERE name = ?",
            "DELETE FROM webhook_deliveries WHERE webhook = ?",
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
        // One server per file: the claim keeps this server's own passes from sending a row
        // twice while its first send is under way.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let claimed = sqlx::query(concat!("UPDATE webhook_deliveries SET claimed_until = ?1 WHERE id IN (\
             SELECT id FROM webhook_deliveries WHERE state = 'Pending' AND next_attempt_at <= ?2 \
             AND (claimed_until IS NULL OR claimed_until <= ?2) ORDER BY next_attempt_at, id LIMIT ?3) \
             RETURNING ", delivery_columns!()))
        .bind(now.saturating_add(claim_ms))
        .bind(now)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(delivery_row)
        .collect::<StoreResult<Vec<_>>>()?;
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
                .fetch_optional(&mut *tx)
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
                    .fetch_optional(&mut *tx)
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
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(due)
    }

    async fn record_delivery(&self, id: i64, attempt: &DeliveryAttempt) -> StoreResult<()> {
        let (state, next, delivered) = attempt_columns(attempt);
        sqlx::query(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, last_attempt_at = ?, last_status = ?, \
             last_error = ?, state = ?, next_attempt_at = ?, delivered_at = ?, claimed_until = NULL \
             WHERE id = ? AND state = 'Pending'",
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
            " FROM webhook_deliveries WHERE webhook = ? AND id > ? \
             AND (? IS NULL OR state = ?) ORDER BY id LIMIT ?"
        ))
        .bind(webhook)
        .bind(after)
        .bind(state.map(DeliveryState::as_str))
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
            "DELETE FROM webhook_deliveries WHERE state <> 'Pending' AND created_at < ?",
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let hooks = webhooks_in(&mut tx).await?;
        let rows = fleet_event_rows(fleet, event_id, event, &hooks, unix_millis());
        insert_deliveries(&mut tx, &rows).await?;
        tx.commit().await?;
        Ok(())
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
