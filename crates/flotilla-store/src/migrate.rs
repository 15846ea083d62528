//! Schema migrations: one SQL file per change and backend (`migrations/sqlite`,
//! `migrations/postgres`), embedded in the binary and applied in order by sqlx's migrator, which
//! records each one's checksum in `_sqlx_migrations` and refuses to start on a database whose
//! applied migrations have since been edited.
//!
//! Databases made before the migrator recorded their versions alone in `schema_migrations`;
//! the first start on such a database records those versions for the migrator (with the
//! checksums of today's files, which hold the same SQL) and drops the old table, in one
//! transaction, then the migrator applies the rest.

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

use crate::{StoreError, StoreResult};

/// One migration: its version, what it does, its SQL.
pub(crate) struct Source {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

macro_rules! sources {
    ($dir:literal: $($version:literal $name:literal),* $(,)?) => {
        &[$(Source {
            version: $version,
            description: $name,
            sql: include_str!(concat!("../migrations/", $dir, "/", $name, ".sql")),
        }),*]
    };
}

pub(crate) const SQLITE: &[Source] = sources!("sqlite":
    1 "0001_resources_logs_tokens",
    2 "0002_replicas_leases_actions",
    3 "0003_member_clusters",
    4 "0004_intent_times",
    5 "0005_run_heads",
    6 "0006_packed_bodies",
    7 "0007_events_without_rowid",
    8 "0008_run_chunks",
    9 "0009_run_checkpoints",
    10 "0010_upgrade_durations",
    11 "0011_audit",
    12 "0012_webhooks",
    13 "0013_audit_by_time",
    14 "0014_packed_events",
);

pub(crate) const POSTGRES: &[Source] = sources!("postgres":
    1 "0001_resources_logs_tokens",
    2 "0002_replicas_leases_actions",
    3 "0003_member_clusters",
    4 "0004_intent_times",
    5 "0005_run_heads",
    6 "0006_packed_bodies",
    7 "0007_run_chunks",
    8 "0008_run_checkpoints",
    9 "0009_upgrade_durations",
    10 "0010_audit",
    11 "0011_webhooks",
    12 "0012_audit_by_time",
    13 "0013_room_for_updates",
    14 "0014_packed_events",
);

/// The migrator for a backend's migrations.
pub(crate) fn migrator(sources: &[Source]) -> Migrator {
    Migrator::with_migrations(
        sources
            .iter()
            .map(|s| {
                Migration::new(
                    s.version,
                    Cow::Borrowed(s.description),
                    MigrationType::Simple,
                    s.sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

/// The migrations a database made before the migrator recorded in `schema_migrations`, as the
/// migrator records them: a version this binary does not know means a newer Flotilla made the
/// database, and nothing is changed.
pub(crate) fn legacy<'m>(
    migrator: &'m Migrator,
    applied: &[i64],
) -> StoreResult<Vec<&'m Migration>> {
    if let Some(unknown) = applied
        .iter()
        .find(|v| !migrator.iter().any(|m| m.version == **v))
    {
        return Err(StoreError::Unavailable(format!(
            "the database was migrated by a newer Flotilla (schema version {unknown}); \
             start that version instead"
        )));
    }
    Ok(migrator
        .iter()
        .filter(|m| applied.contains(&m.version))
        .collect())
}

/// A migrator's refusal, said as a store error.
pub(crate) fn failed(e: sqlx::migrate::MigrateError) -> StoreError {
    StoreError::Unavailable(format!("cannot migrate the database: {e}"))
}
