//! One conformance suite for the storage interface, run on both backends: SQLite in a temporary
//! file, and the machine's PostgreSQL (`FLOTILLA_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432`) in a fresh database per test. Everything the server
//! relies on is here: eTag conditions, listing and paging, a run's batch and its logs, recorded
//! intents, leases and fencing, handed-over actions and notices, tokens.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use flotilla_store::postgres::PgStore;
use flotilla_store::prelude::*;
use flotilla_store::{
    AttemptOutcome, AuditEntry, Chunk, DeliveryAttempt, DeliveryState, Fence, Intent, Kind,
    MemberWrite, Notice, OperationRecord, Precondition, RegisterMode, RunBatch, RunDocument,
    SqliteStore, Store, StoreError, StoredLog, TokenRecord, UpgradeDuration, Webhook,
};

// ---------------------------------------------------------------------------------------------
// The backends.

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn sqlite() -> (Arc<dyn Store>, TempDir) {
    let dir = std::env::temp_dir().join(format!(
        "flotilla-store-{}-{}",
        std::process::id(),
        unique()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(&dir.join("flotilla.db")).await.unwrap();
    (Arc::new(store), TempDir(dir))
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    (nanos << 8) + NEXT.fetch_add(1, Ordering::Relaxed)
}

use flotilla_store::postgres::test_support::{
    base as postgres_base, reachable as postgres_reachable,
};

/// A fresh database, dropped when the test ends (forcibly: the store's listener holds a
/// connection).
struct TempDatabase(String);

impl Drop for TempDatabase {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                use sqlx::Connection;
                if let Ok(mut admin) =
                    sqlx::PgConnection::connect(&format!("{}/postgres", postgres_base())).await
                {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut admin)
                    .await;
                }
            });
        })
        .join();
    }
}

/// A fresh, empty database: its URL, and what drops it.
async fn fresh_database() -> (String, TempDatabase) {
    use sqlx::Connection;
    let name = format!("flotilla_store_{}_{}", std::process::id(), unique());
    let mut admin = sqlx::PgConnection::connect(&format!("{}/postgres", postgres_base()))
        .await
        .expect("the tests need PostgreSQL at FLOTILLA_TEST_POSTGRES or 127.0.0.1:5432");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    (format!("{}/{name}", postgres_base()), TempDatabase(name))
}

async fn postgres() -> (Arc<dyn Store>, TempDatabase) {
    let (url, db) = fresh_database().await;
    let store = PgStore::open(&url).await.unwrap();
    (Arc::new(store), db)
}

/// Each behaviour below, once per backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    let (store, _dir) = super::sqlite().await;
                    super::$name(store).await;
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    if !super::postgres_reachable() {
                        return;
                    }
                    let (store, _db) = super::postgres().await;
                    super::$name(store).await;
                }
            )*
        }
    };
}

on_both_backends!(
    etag_conditions,
    concurrent_creations_make_one_resource,
    listing_pages_in_name_order,
    run_batches_and_their_logs,
    events_read_back_the_same_whether_packed_or_not,
    deleting_a_run_or_fleet_takes_what_belongs_to_it,
    leases_and_fencing,
    leases_expire_by_time,
    handed_over_actions,
    notices_of_events_actions_and_replies,
    heartbeats_count_live_replicas,
    tokens,
    a_holder_taking_its_lease_again_gets_a_new_epoch,
    batches_race_a_takeover,
    a_replaced_run_refuses_its_old_writer,
    member_registration_keeps_cluster_ids_unique,
    statuses_are_set_together_and_only_on_what_exists,
    run_heads_follow_their_runs,
    batches_of_several_runs_land_together,
    large_runs_and_snapshots_read_back_whole,
    run_documents_are_stored_by_change,
    run_logs_are_cut_at_their_checkpoints,
    upgrade_durations_keep_the_recent_ones,
    the_audit_trail_keeps_every_entry_in_order,
    the_audit_trail_is_pruned_past_its_retention,
    webhooks_are_kept_with_their_conditions,
    events_make_deliveries_in_their_own_batch,
    fleet_events_make_deliveries_once,
    a_rule_and_its_report_are_written_together,
    deliveries_are_claimed_once_and_recorded,
    deleting_a_webhook_takes_its_deliveries,
);

// ---------------------------------------------------------------------------------------------
// The behaviours.

/// A run document written in one piece: a frame without member lists.
fn whole(body: &Value) -> Option<RunDocument> {
    Some(RunDocument {
        frame: vec![body.to_string()],
        chunks: 0,
        changed: Vec::new(),
    })
}

fn chunk(index: u32, slot: u32, text: &str) -> Chunk {
    Chunk {
        index,
        slot,
        text: text.into(),
    }
}

async fn write_document(store: &dyn Store, run: &str, document: RunDocument) {
    store
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: run.into(),
            run_body: Some(document),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn read_run(store: &dyn Store, run: &str) -> Value {
    store.get("f", Kind::Run, run).await.unwrap().unwrap().body
}

/// A status write stores its frame and the chunks that changed; a read puts the document
/// together from them, alone or in a page; a run written whole, replaced or deleted leaves no
/// chunk behind.
async fn run_documents_are_stored_by_change(store: Arc<dyn Store>) {
    let member = |n: usize, state: &str| json!({"name": format!("m{n}"), "state": state});
    let members = |range: std::ops::Range<usize>, state: &str| {
        range
            .map(|n| member(n, state).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    // Two groups: a, whose members are in two chunks (one large enough to be compressed),
    // and b, empty; then c with one chunk.
    let frame = vec![
        r#"{"name":"r","groups":[{"g":"a","members":["#.to_string(),
        r#"]},{"g":"b","members":["#.to_string(),
        r#"]},{"g":"c","members":["#.to_string(),
        r#"]}]}"#.to_string(),
    ];
    write_document(
        &*store,
        "r",
        RunDocument {
            frame: frame.clone(),
            chunks: 3,
            changed: vec![
                chunk(0, 0, &members(0..400, "NotStarted")),
                chunk(1, 0, &members(400..402, "NotStarted")),
                chunk(2, 2, &members(402..403, "NotStarted")),
            ],
        },
    )
    .await;
    let expect = |states: [&str; 3]| {
        let a: Vec<Value> = (0..400)
            .map(|n| member(n, states[0]))
            .chain((400..402).map(|n| member(n, states[1])))
            .collect();
        json!({"name": "r", "groups": [
            {"g": "a", "members": a},
            {"g": "b", "members": []},
            {"g": "c", "members": [member(402, states[2])]},
        ]})
    };
    assert_eq!(
        read_run(&*store, "r").await,
        expect(["NotStarted", "NotStarted", "NotStarted"])
    );
    // Only the second chunk changes: the others stay as stored.
    write_document(
        &*store,
        "r",
        RunDocument {
            frame: frame.clone(),
            chunks: 3,
            changed: vec![chunk(1, 0, &members(400..402, "Running"))],
        },
    )
    .await;
    assert_eq!(
        read_run(&*store, "r").await,
        expect(["NotStarted", "Running", "NotStarted"])
    );
    // A page reads each run whole, the chunked beside one stored whole.
    put(&*store, Kind::Run, "s", &json!({"n": 1})).await;
    let page = store.list("f", Kind::Run, None, 10).await.unwrap();
    let bodies: Vec<&Value> = page.iter().map(|r| &r.body).collect();
    assert_eq!(
        bodies,
        [
            &expect(["NotStarted", "Running", "NotStarted"]),
            &json!({"n": 1})
        ]
    );
    let raw = store.list_raw("f", Kind::Run, Some("r"), 10).await.unwrap();
    assert_eq!(raw.len(), 1);
    assert_eq!(raw[0].0, "s");
    // A page shorter than the runs left ends at its last run, with all of its chunks.
    let first = store.list_raw("f", Kind::Run, None, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(
        serde_json::from_str::<Value>(&first[0].1).unwrap(),
        expect(["NotStarted", "Running", "NotStarted"])
    );
    assert!(
        store
            .list_raw("f", Kind::Run, None, 0)
            .await
            .unwrap()
            .is_empty()
    );
    // Fewer chunks: those past the count are gone.
    write_document(
        &*store,
        "r",
        RunDocument {
            frame: frame.clone(),
            chunks: 1,
            changed: vec![],
        },
    )
    .await;
    let a: Vec<Value> = (0..400).map(|n| member(n, "NotStarted")).collect();
    assert_eq!(
        read_run(&*store, "r").await,
        json!({"name": "r", "groups": [
            {"g": "a", "members": a}, {"g": "b", "members": []}, {"g": "c", "members": []}]})
    );
    // A run written whole, then by change again: its old chunks do not come back. A write
    // that names chunks it does not carry reads as an error, not as old text.
    put(&*store, Kind::Run, "r", &json!({"n": 2})).await;
    assert_eq!(read_run(&*store, "r").await, json!({"n": 2}));
    let partial = RunDocument {
        frame: frame.clone(),
        chunks: 2,
        changed: vec![chunk(1, 0, &members(400..402, "Running"))],
    };
    write_document(&*store, "r", partial.clone()).await;
    let Err(StoreError::Corrupt(why)) = store.get_raw("f", Kind::Run, "r").await else {
        panic!("a run missing a chunk was read");
    };
    assert!(why.contains("chunk 0 is missing"), "{why}");
    // Deleted and written again: nothing of the deleted run is read.
    assert!(
        store
            .delete("f", Kind::Run, "r", &Precondition::None)
            .await
            .unwrap()
    );
    write_document(&*store, "r", partial).await;
    assert!(matches!(
        store.get_raw("f", Kind::Run, "r").await,
        Err(StoreError::Corrupt(_))
    ));
    // So is a fleet's deletion.
    write_document(
        &*store,
        "t",
        RunDocument {
            frame: frame.clone(),
            chunks: 1,
            changed: vec![chunk(0, 2, &members(0..1, "Running"))],
        },
    )
    .await;
    store
        .put("", Kind::Fleet, "f", &json!({}), &Precondition::None)
        .await
        .unwrap();
    store
        .delete("", Kind::Fleet, "f", &Precondition::None)
        .await
        .unwrap();
    write_document(
        &*store,
        "t",
        RunDocument {
            frame,
            chunks: 1,
            changed: vec![],
        },
    )
    .await;
    assert!(matches!(
        store.get_raw("f", Kind::Run, "t").await,
        Err(StoreError::Corrupt(_))
    ));
}

/// Writes a resource unconditionally.
async fn put(store: &dyn Store, kind: Kind, name: &str, body: &Value) {
    store
        .put("f", kind, name, body, &Precondition::None)
        .await
        .unwrap();
}

/// A run document or snapshot large enough to be stored compressed, with text that compresses
/// (members' statuses) and some that does not.
fn large_body(seed: &str) -> Value {
    let members: Vec<Value> = (0..1000)
        .map(|i| json!({"name": format!("m{i:04}"), "status": {"state": "NotStarted"}, "noise": format!("{seed}-{:x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))}))
        .collect();
    json!({"properties": {"status": {"members": members}}})
}

/// Large runs and snapshots (stored compressed) read back as they were written, through every
/// read; small ones and other kinds are untouched; writing a small body over a large one (or
/// the reverse) leaves only the new one.
async fn large_runs_and_snapshots_read_back_whole(store: Arc<dyn Store>) {
    let run = large_body("run");
    let snapshot = large_body("snapshot");
    assert!(run.to_string().len() > 32 * 1024);
    store
        .put("f", Kind::Run, "r", &run, &Precondition::IfNoneMatchAny)
        .await
        .unwrap();
    put(&*store, Kind::RunSnapshot, "r", &snapshot).await;
    put(&*store, Kind::Run, "small", &json!({"n": 1})).await;
    let (text, _) = store.get_raw("f", Kind::Run, "r").await.unwrap().unwrap();
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), run);
    assert_eq!(
        store
            .get("f", Kind::RunSnapshot, "r")
            .await
            .unwrap()
            .unwrap()
            .body,
        snapshot
    );
    let listed = store.list("f", Kind::Run, None, 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].body, run);
    assert_eq!(listed[1].body, json!({"n": 1}));
    let raw = store.list_raw("f", Kind::Run, None, 10).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&raw[0].1).unwrap(), run);
    // A batch's run body goes the same way.
    let bigger = large_body("batch");
    store
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: "r".into(),
            run_body: whole(&bigger),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        store.get("f", Kind::Run, "r").await.unwrap().unwrap().body,
        bigger
    );
    // Small over large, and large over small.
    put(&*store, Kind::Run, "r", &json!({"n": 2})).await;
    assert_eq!(
        store.get("f", Kind::Run, "r").await.unwrap().unwrap().body,
        json!({"n": 2})
    );
    put(&*store, Kind::Run, "small", &run).await;
    assert_eq!(
        store
            .get("f", Kind::Run, "small")
            .await
            .unwrap()
            .unwrap()
            .body,
        run
    );
}

/// SQLite stores a large run compressed, and a small one or a member as text.
#[tokio::test]
async fn sqlite_stores_large_runs_compressed() {
    let dir = std::env::temp_dir().join(format!("flotilla-packed-{}", unique()));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = TempDir(dir.clone());
    let path = dir.join("flotilla.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let run = large_body("run");
    put(&store, Kind::Run, "large", &run).await;
    put(&store, Kind::Run, "small", &json!({"n": 1})).await;
    put(&store, Kind::Member, "m", &large_body("member")).await;
    assert_eq!(
        sqlite_count(
            &path,
            "SELECT count(*) FROM resources WHERE packed IS NOT NULL"
        )
        .await,
        1
    );
    let stored = sqlite_count(
        &path,
        "SELECT length(packed) FROM resources WHERE name = 'large'",
    )
    .await;
    assert!(
        (stored as usize) * 4 < run.to_string().len(),
        "{stored} bytes packed for {}",
        run.to_string().len()
    );
    // A writer from before packing sets `body` alone: its text is what is read, not the older
    // packed one it left behind.
    sqlite_file(
        &path,
        "UPDATE resources SET body = '{\"n\": 3}' WHERE name = 'large'",
    )
    .await;
    assert_eq!(
        store
            .get("f", Kind::Run, "large")
            .await
            .unwrap()
            .unwrap()
            .body,
        json!({"n": 3})
    );
    store.close().await;
}

/// A run's head is written with its body, cleared when the run is written whole, set only on a
/// run that exists, and goes with the run and with its fleet.
async fn run_heads_follow_their_runs(store: Arc<dyn Store>) {
    let heads = |store: Arc<dyn Store>| async move { store.run_heads("f").await.unwrap() };
    for run in ["a", "b"] {
        store
            .put("f", Kind::Run, run, &json!({"n": run}), &Precondition::None)
            .await
            .unwrap();
    }
    assert_eq!(
        heads(store.clone()).await,
        vec![("a".to_string(), None), ("b".to_string(), None)]
    );
    store.init_run_head("f", "a", "head-a").await.unwrap();
    // A head already there is kept: one written with a batch is newer.
    store.init_run_head("f", "a", "older").await.unwrap();
    // A run that does not exist gets no head.
    store.init_run_head("f", "ghost", "head").await.unwrap();
    store
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: "b".into(),
            run_body: whole(&json!({"n": "b", "status": 1})),
            run_head: Some("head-b1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        heads(store.clone()).await,
        vec![
            ("a".to_string(), Some("head-a".to_string())),
            ("b".to_string(), Some("head-b1".to_string()))
        ]
    );
    // A batch refused (the run's snapshot changed) writes no head.
    let refused = store
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: "b".into(),
            run_head: Some("head-b2".into()),
            snapshot_etag: Some("stale".into()),
            ..Default::default()
        })
        .await;
    assert!(refused.is_err());
    assert_eq!(heads(store.clone()).await[1].1.as_deref(), Some("head-b1"));
    // A batch's head replaces the one there.
    store
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: "b".into(),
            run_head: Some("head-b3".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(heads(store.clone()).await[1].1.as_deref(), Some("head-b3"));
    // Replaced whole: no head until one is set.
    store
        .put(
            "f",
            Kind::Run,
            "a",
            &json!({"n": "a2"}),
            &Precondition::None,
        )
        .await
        .unwrap();
    assert_eq!(heads(store.clone()).await[0], ("a".to_string(), None));
    store.init_run_head("f", "a", "head-a2").await.unwrap();
    assert!(
        store
            .delete("f", Kind::Run, "b", &Precondition::None)
            .await
            .unwrap()
    );
    assert_eq!(
        heads(store.clone()).await,
        vec![("a".to_string(), Some("head-a2".to_string()))]
    );
    // Created again, the deleted run has no head of its old self.
    store
        .put("f", Kind::Run, "b", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert_eq!(heads(store.clone()).await[1], ("b".to_string(), None));
    store
        .put("", Kind::Fleet, "f", &json!({}), &Precondition::None)
        .await
        .unwrap();
    store
        .delete("", Kind::Fleet, "f", &Precondition::None)
        .await
        .unwrap();
    assert!(heads(store.clone()).await.is_empty());
    store
        .put("f", Kind::Run, "a", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert_eq!(heads(store.clone()).await, vec![("a".to_string(), None)]);
}

async fn statuses_are_set_together_and_only_on_what_exists(store: Arc<dyn Store>) {
    let (a, _) = store
        .put(
            "f",
            Kind::Member,
            "a",
            &json!({"properties": {"clusterResourceId": "ca", "status": {"old": true}}}),
            &Precondition::None,
        )
        .await
        .unwrap();
    store
        .put(
            "f",
            Kind::Member,
            "b",
            &json!({"properties": {"clusterResourceId": "cb"}}),
            &Precondition::None,
        )
        .await
        .unwrap();
    store
        .set_statuses(
            "f",
            Kind::Member,
            &[
                ("a".into(), json!({"cluster": {"v": 2}})),
                ("b".into(), json!({"cluster": {"v": 3}})),
                ("gone".into(), json!({"cluster": {"v": 4}})),
                ("b".into(), json!({"cluster": {"v": 5}})),
            ],
        )
        .await
        .unwrap();
    let a2 = store.get("f", Kind::Member, "a").await.unwrap().unwrap();
    assert_eq!(
        a2.body["properties"]["status"],
        json!({"cluster": {"v": 2}})
    );
    assert_eq!(
        a2.body["properties"]["clusterResourceId"], "ca",
        "the rest is kept"
    );
    assert_ne!(a2.etag, a.etag, "a new eTag");
    let b = store.get("f", Kind::Member, "b").await.unwrap().unwrap();
    assert_eq!(
        b.body["properties"]["status"]["cluster"]["v"], 5,
        "the last status given for a name stays"
    );
    assert!(
        store
            .get("f", Kind::Member, "gone")
            .await
            .unwrap()
            .is_none(),
        "not created"
    );
    store.set_statuses("f", Kind::Member, &[]).await.unwrap();
}

fn precondition_failed<T: std::fmt::Debug>(result: Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Precondition(_)))
}

async fn etag_conditions(store: Arc<dyn Store>) {
    let body = json!({"properties": {"a": 1}});
    let (created, new) = store
        .put("f", Kind::Member, "m", &body, &Precondition::IfNoneMatchAny)
        .await
        .unwrap();
    assert!(new);
    assert!(precondition_failed(
        store
            .put("f", Kind::Member, "m", &body, &Precondition::IfNoneMatchAny)
            .await
    ));
    assert!(precondition_failed(
        store
            .put(
                "f",
                Kind::Member,
                "m",
                &body,
                &Precondition::IfMatch("\"nope\"".into())
            )
            .await
    ));
    assert!(precondition_failed(
        store
            .put(
                "f",
                Kind::Member,
                "other",
                &body,
                &Precondition::IfMatch("*".into())
            )
            .await
    ));
    let changed = json!({"properties": {"a": 2}});
    let (updated, new) = store
        .put(
            "f",
            Kind::Member,
            "m",
            &changed,
            &Precondition::IfMatch(created.etag.clone()),
        )
        .await
        .unwrap();
    assert!(!new);
    assert_ne!(updated.etag, created.etag);
    let read = store.get("f", Kind::Member, "m").await.unwrap().unwrap();
    assert_eq!(read.body, changed);
    assert_eq!(read.etag, updated.etag);
    let (text, etag) = store
        .get_raw("f", Kind::Member, "m")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), changed);
    assert_eq!(etag, updated.etag);
    assert!(
        store
            .get_raw("f", Kind::Member, "nobody")
            .await
            .unwrap()
            .is_none()
    );
    // The eTag alone, without the body.
    assert_eq!(
        store.etag("f", Kind::Member, "m").await.unwrap(),
        Some(updated.etag.clone())
    );
    assert_eq!(store.etag("f", Kind::Member, "nobody").await.unwrap(), None);
    assert_eq!(store.etag("g", Kind::Member, "m").await.unwrap(), None);
    // A body written as text is read back as that text, under the same conditions.
    let text = r#"{"properties":{"a":3}}"#;
    assert!(precondition_failed(
        store
            .put_raw("f", Kind::Member, "m", text, &Precondition::IfNoneMatchAny)
            .await
    ));
    let (raw_etag, new) = store
        .put_raw(
            "f",
            Kind::Member,
            "m",
            text,
            &Precondition::IfMatch(updated.etag.clone()),
        )
        .await
        .unwrap();
    assert!(!new);
    assert_ne!(raw_etag, updated.etag);
    let (read, etag) = store
        .get_raw("f", Kind::Member, "m")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((read.as_str(), &etag), (text, &raw_etag));
    assert_eq!(
        store.etag("f", Kind::Member, "m").await.unwrap(),
        Some(raw_etag.clone())
    );
    // Back to `changed` for what follows.
    let (updated, new) = store
        .put(
            "f",
            Kind::Member,
            "m",
            &changed,
            &Precondition::IfMatch(raw_etag),
        )
        .await
        .unwrap();
    assert!(!new);
    // The old eTag no longer matches, for a write or a delete.
    assert!(precondition_failed(
        store
            .put(
                "f",
                Kind::Member,
                "m",
                &body,
                &Precondition::IfMatch(created.etag.clone())
            )
            .await
    ));
    assert!(precondition_failed(
        store
            .delete("f", Kind::Member, "m", &Precondition::IfMatch(created.etag))
            .await
    ));
    assert!(
        store
            .delete("f", Kind::Member, "m", &Precondition::IfMatch(updated.etag))
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete("f", Kind::Member, "m", &Precondition::None)
            .await
            .unwrap()
    );
    assert!(store.get("f", Kind::Member, "m").await.unwrap().is_none());
    // The same name in another kind or fleet is another resource.
    store
        .put(
            "f",
            Kind::Strategy,
            "m",
            &body,
            &Precondition::IfNoneMatchAny,
        )
        .await
        .unwrap();
    store
        .put("g", Kind::Member, "m", &body, &Precondition::IfNoneMatchAny)
        .await
        .unwrap();
}

/// Twelve writers putting one resource at once.
async fn race(
    store: &Arc<dyn Store>,
    name: &'static str,
    when: Precondition,
) -> Vec<Result<(flotilla_store::Resource, bool), StoreError>> {
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (store, when) = (store.clone(), when.clone());
        tasks.push(tokio::spawn(async move {
            store
                .put("f", Kind::Run, name, &json!({"writer": i}), &when)
                .await
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

async fn concurrent_creations_make_one_resource(store: Arc<dyn Store>) {
    let mut created = 0;
    for result in race(&store, "r", Precondition::IfNoneMatchAny).await {
        match result {
            Ok(_) => created += 1,
            Err(StoreError::Precondition(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(created, 1);
    // Without a condition every write lands, and exactly one of them says it created it.
    let mut said_created = 0;
    for result in race(&store, "unconditional", Precondition::None).await {
        said_created += usize::from(result.unwrap().1);
    }
    assert_eq!(said_created, 1);
}

async fn listing_pages_in_name_order(store: Arc<dyn Store>) {
    let mut names: Vec<String> = (0..23).map(|i| format!("member-{i:02}")).collect();
    names.extend(["A-upper".to_string(), "zz".to_string(), "b".to_string()]);
    for name in &names {
        store
            .put(
                "f",
                Kind::Member,
                name,
                &json!({"name": name}),
                &Precondition::None,
            )
            .await
            .unwrap();
    }
    store
        .put("f", Kind::Strategy, "s", &json!({}), &Precondition::None)
        .await
        .unwrap();
    store
        .put("other", Kind::Member, "x", &json!({}), &Precondition::None)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let asked = after.clone();
        let page = store
            .list("f", Kind::Member, after.as_deref(), 10)
            .await
            .unwrap();
        assert!(page.len() <= 10);
        let Some(last) = page.last() else { break };
        after = Some(last.name.clone());
        for r in &page {
            assert_eq!(r.body["name"], json!(r.name));
        }
        // The same page unparsed: the same names, eTags and bodies, in the same order.
        let raw = store
            .list_raw("f", Kind::Member, asked.as_deref(), 10)
            .await
            .unwrap();
        assert_eq!(raw.len(), page.len());
        for ((name, text, etag), r) in raw.iter().zip(&page) {
            assert_eq!((name, etag), (&r.name, &r.etag));
            assert_eq!(serde_json::from_str::<Value>(text).unwrap(), r.body);
        }
        seen.extend(page.into_iter().map(|r| r.name));
    }
    let mut expected = names.clone();
    // Byte order, as both backends sort: upper case before lower case.
    expected.sort();
    assert_eq!(seen, expected);
    assert_eq!(
        store
            .list("f", Kind::Strategy, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

fn intent(attempt: u64, member: &str) -> Intent {
    Intent {
        attempt,
        member: member.into(),
        target: json!({"upgradeType": "Full", "kubernetesVersion": "1.30.1"}),
        operation_id: None,
        finished: false,
        recorded_at: Some(flotilla_engine::time::Time(1_780_000_000)),
    }
}

fn gate_body(run: &str) -> Value {
    json!({"properties": {"target": {"updateRunProperties": {"name": run}}, "state": "Pending"}})
}

async fn run_batches_and_their_logs(store: Arc<dyn Store>) {
    let batch = RunBatch {
        fleet: "f".into(),
        run: "r".into(),
        log: vec![
            json!({"input": 1}).to_string(),
            json!({"input": 2}).to_string(),
        ],
        intents: vec![intent(1, "m1"), intent(2, "m2")],
        events: vec![json!({"e": "a"}), json!({"e": "b"})],
        run_body: whole(&json!({"properties": {"status": {"state": "Running"}}})),
        gates: vec![("g1".into(), gate_body("r"))],
        ..Default::default()
    };
    store.write_run_batch(&batch).await.unwrap();
    store
        .record_operations(&[
            OperationRecord {
                fleet: "f".into(),
                run: "r".into(),
                attempt: 1,
                operation_id: "operation-1".into(),
            },
            // Several at once, and one of an intent that does not exist (no row to set).
            OperationRecord {
                fleet: "f".into(),
                run: "r".into(),
                attempt: 2,
                operation_id: "operation-2-first".into(),
            },
            // Of two ids for one attempt, the later is kept.
            OperationRecord {
                fleet: "f".into(),
                run: "r".into(),
                attempt: 2,
                operation_id: "operation-2".into(),
            },
            OperationRecord {
                fleet: "f".into(),
                run: "other".into(),
                attempt: 2,
                operation_id: "operation-x".into(),
            },
        ])
        .await
        .unwrap();
    let next = RunBatch {
        fleet: "f".into(),
        run: "r".into(),
        log: vec![json!({"input": 3}).to_string()],
        finished_attempts: vec![1],
        events: vec![json!({"e": "c"})],
        ..Default::default()
    };
    store.write_run_batch(&next).await.unwrap();
    assert_eq!(
        parsed(store.run_log("f", "r").await.unwrap().entries),
        vec![
            json!({"input": 1}),
            json!({"input": 2}),
            json!({"input": 3})
        ]
    );
    let events = store.run_events("f", "r", 0, 100).await.unwrap();
    assert_eq!(
        events,
        vec![
            (1, json!({"e": "a"})),
            (2, json!({"e": "b"})),
            (3, json!({"e": "c"}))
        ]
    );
    assert_eq!(
        store.run_events("f", "r", 1, 1).await.unwrap(),
        vec![(2, json!({"e": "b"}))]
    );
    assert!(store.run_events("f", "r", 3, 100).await.unwrap().is_empty());
    let intents = store.intents("f", "r").await.unwrap();
    assert_eq!(intents.len(), 2);
    assert_eq!(intents[0].operation_id.as_deref(), Some("operation-1"));
    assert!(intents[0].finished);
    assert_eq!(intents[1].member, "m2");
    // When each was recorded survives the round trip (an operation's deadline counts from it).
    assert_eq!(
        intents[1].recorded_at,
        Some(flotilla_engine::time::Time(1_780_000_000))
    );
    assert!(!intents[1].finished);
    assert_eq!(intents[1].operation_id.as_deref(), Some("operation-2"));
    assert_eq!(intents[1].target, intent(2, "m2").target);
    assert!(store.intents("f", "other").await.unwrap().is_empty());
    let run = store.get("f", Kind::Run, "r").await.unwrap().unwrap();
    assert_eq!(run.body["properties"]["status"]["state"], "Running");
    assert!(store.get("f", Kind::Gate, "g1").await.unwrap().is_some());
    // Another run's logs are its own.
    assert!(
        store
            .run_log("f", "other")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    // A batch repeating an intent's attempt fails as a whole: nothing of it lands.
    let clash = RunBatch {
        fleet: "f".into(),
        run: "r".into(),
        log: vec![json!({"input": 4}).to_string()],
        intents: vec![intent(2, "m2")],
        events: vec![json!({"e": "d"})],
        ..Default::default()
    };
    assert!(store.write_run_batch(&clash).await.is_err());
    assert_eq!(store.run_log("f", "r").await.unwrap().entries.len(), 3);
    assert_eq!(store.run_events("f", "r", 0, 100).await.unwrap().len(), 3);
}

/// A run's events come back numbered and in order however they were stored: batches of one
/// (a row each), of a few and of more than a pack holds (packs of up to 1,000), read from any
/// number on, any number at a time; the webhooks' outbox numbers them the same.
async fn events_read_back_the_same_whether_packed_or_not(store: Arc<dyn Store>) {
    let sizes = [1, 3, 2500, 1, 1000, 7];
    let mut all = Vec::new();
    for (b, size) in sizes.into_iter().enumerate() {
        let events: Vec<Value> = (0..size)
            .map(|i| json!({"type": "MemberPending", "batch": b, "i": i, "message": "a\nb"}))
            .collect();
        let first = all.len() as i64 + 1;
        all.extend(events.iter().cloned().zip(first..).map(|(e, n)| (n, e)));
        store
            .write_run_batch(&events_batch("f", "r", events))
            .await
            .unwrap();
    }
    assert_eq!(all.len(), 3512);
    assert_eq!(
        store.run_events("f", "r", 0, usize::MAX).await.unwrap(),
        all
    );
    // Every start that matters (pack and batch edges, inside packs) and a few limits.
    let starts = [
        0, 1, 2, 4, 5, 500, 1003, 1004, 2004, 2504, 2505, 2506, 3000, 3505, 3511, 3512,
    ];
    for after in starts {
        for limit in [1, 2, 999, 1000, 1001, 5000] {
            let want: Vec<_> = all
                .iter()
                .filter(|(n, _)| *n > after)
                .take(limit)
                .cloned()
                .collect();
            assert_eq!(
                store.run_events("f", "r", after, limit).await.unwrap(),
                want,
                "after {after}, limit {limit}"
            );
        }
    }
    // A number past any (a client's `Last-Event-ID`) reads nothing, and fails nothing.
    assert!(
        store
            .run_events("f", "r", i64::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.run_events("f", "r", 0, 0).await.unwrap().is_empty());
    // Another run's numbers start at 1 of their own.
    store
        .write_run_batch(&events_batch(
            "f",
            "other",
            vec![json!({"e": 1}), json!({"e": 2})],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.run_events("f", "other", 1, 10).await.unwrap(),
        vec![(2, json!({"e": 2}))]
    );
    // Deleting a run takes its packs.
    store
        .write_run_batch(&RunBatch {
            run_body: whole(&json!({})),
            ..events_batch("f", "gone", vec![json!({"e": 1}), json!({"e": 2})])
        })
        .await
        .unwrap();
    assert_eq!(store.run_events("f", "gone", 0, 10).await.unwrap().len(), 2);
    assert!(
        store
            .delete("f", Kind::Run, "gone", &Precondition::None)
            .await
            .unwrap()
    );
    assert!(
        store
            .run_events("f", "gone", 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

fn log_batch(run: &str, entries: &[i64], checkpoint: Option<&str>) -> RunBatch {
    RunBatch {
        fleet: "f".into(),
        run: run.into(),
        log: entries
            .iter()
            .map(|e| json!({"input": e}).to_string())
            .collect(),
        checkpoint: checkpoint.map(String::from),
        ..Default::default()
    }
}

/// A checkpoint replaces the log up to the batch it is written with: a read gives the last
/// checkpoint and the entries after it, whatever was written before, on both backends.
async fn run_logs_are_cut_at_their_checkpoints(store: Arc<dyn Store>) {
    let entries = |log: &StoredLog| parsed(log.entries.clone());
    store
        .write_run_batch(&log_batch("r", &[1, 2], None))
        .await
        .unwrap();
    let log = store.run_log("f", "r").await.unwrap();
    assert_eq!(log.checkpoint, None);
    assert_eq!(
        entries(&log),
        vec![json!({"input": 1}), json!({"input": 2})]
    );
    // A large checkpoint (stored compressed) covering entries 1 to 4.
    let big = format!("{{\"state\":\"{}\"}}", "x".repeat(100_000));
    store
        .write_run_batch(&log_batch("r", &[3, 4], Some(&big)))
        .await
        .unwrap();
    let log = store.run_log("f", "r").await.unwrap();
    assert_eq!(log.checkpoint.as_deref(), Some(big.as_str()));
    assert!(log.entries.is_empty(), "{:?}", log.entries);
    // The log goes on after it, numbered on.
    store
        .write_run_batch(&log_batch("r", &[5], None))
        .await
        .unwrap();
    store
        .write_run_batch(&log_batch("r", &[6, 7], None))
        .await
        .unwrap();
    let log = store.run_log("f", "r").await.unwrap();
    assert_eq!(log.checkpoint.as_deref(), Some(big.as_str()));
    assert_eq!(
        entries(&log),
        vec![
            json!({"input": 5}),
            json!({"input": 6}),
            json!({"input": 7})
        ]
    );
    // A later checkpoint replaces the first and cuts the log again.
    store
        .write_run_batch(&log_batch("r", &[8], Some("second")))
        .await
        .unwrap();
    store
        .write_run_batch(&log_batch("r", &[9], None))
        .await
        .unwrap();
    let log = store.run_log("f", "r").await.unwrap();
    assert_eq!(log.checkpoint.as_deref(), Some("second"));
    assert_eq!(entries(&log), vec![json!({"input": 9})]);
    // A checkpoint with no entry of its own is refused, and changes nothing.
    assert!(
        store
            .write_run_batch(&log_batch("r", &[], Some("third")))
            .await
            .is_err()
    );
    assert_eq!(store.run_log("f", "r").await.unwrap(), log);
    // Another run's log is its own.
    store
        .write_run_batch(&log_batch("other", &[1], None))
        .await
        .unwrap();
    assert_eq!(store.run_log("f", "other").await.unwrap().checkpoint, None);
    // A run deleted, or written whole, leaves no checkpoint behind; nor does a deleted fleet.
    store
        .put("f", Kind::Run, "r", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert!(
        store
            .delete("f", Kind::Run, "r", &Precondition::None)
            .await
            .unwrap()
    );
    assert_eq!(store.run_log("f", "r").await.unwrap(), StoredLog::default());
    store
        .write_run_batch(&log_batch("r", &[1], Some("again")))
        .await
        .unwrap();
    store
        .put_raw("f", Kind::Run, "r", "{}", &Precondition::None)
        .await
        .unwrap();
    assert_eq!(store.run_log("f", "r").await.unwrap().checkpoint, None);
    store
        .write_run_batch(&log_batch("other", &[2], Some("kept")))
        .await
        .unwrap();
    store
        .put("", Kind::Fleet, "f", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert!(
        store
            .delete("", Kind::Fleet, "f", &Precondition::None)
            .await
            .unwrap()
    );
    assert_eq!(
        store.run_log("f", "other").await.unwrap(),
        StoredLog::default()
    );
}

/// The history a forecast reads (SEMANTICS §11): each member's last five durations of an
/// upgrade type, newest first, and the fleet's last fifty; a batch written again adds nothing.
async fn upgrade_durations_keep_the_recent_ones(store: Arc<dyn Store>) {
    let duration = |member: &str, kind: &str, seconds: i64, at: i64| UpgradeDuration {
        member: member.into(),
        upgrade_type: kind.into(),
        seconds,
        finished_at: flotilla_engine::time::Time(1_780_000_000 + at),
    };
    let mut durations: Vec<UpgradeDuration> =
        (0..7).map(|i| duration("m1", "Full", 100 + i, i)).collect();
    durations.push(duration("m2", "Full", 50, 3));
    durations.push(duration("m1", "NodeImageOnly", 9, 100));
    for (i, chunk) in durations.chunks(4).enumerate() {
        let batch = RunBatch {
            fleet: "f".into(),
            run: format!("r{i}"),
            durations: chunk.to_vec(),
            ..Default::default()
        };
        store.write_run_batch(&batch).await.unwrap();
        // Written again (a retried batch): nothing more.
        store.write_run_batch(&batch).await.unwrap();
    }
    let full = store.upgrade_durations("f", "Full").await.unwrap();
    assert_eq!(full.members["m1"], vec![106, 105, 104, 103, 102]);
    assert_eq!(full.members["m2"], vec![50]);
    // Ties in time go by member name, last first.
    assert_eq!(full.fleet, vec![106, 105, 104, 50, 103, 102, 101, 100]);
    let images = store.upgrade_durations("f", "NodeImageOnly").await.unwrap();
    assert_eq!(images.members.len(), 1);
    assert_eq!(images.fleet, vec![9]);
    // The fleet's last fifty, newest first.
    let many: Vec<UpgradeDuration> = (0..60)
        .map(|i| duration(&format!("n{i:02}"), "ControlPlaneOnly", i, 1000 + i))
        .collect();
    store
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: "many".into(),
            durations: many,
            ..Default::default()
        })
        .await
        .unwrap();
    let planes = store
        .upgrade_durations("f", "ControlPlaneOnly")
        .await
        .unwrap();
    assert_eq!(planes.fleet, (10..60).rev().collect::<Vec<i64>>());
    assert_eq!(planes.members.len(), 60);
    // Another fleet's are its own; a deleted fleet leaves none.
    assert_eq!(
        store.upgrade_durations("g", "Full").await.unwrap(),
        Default::default()
    );
    store
        .put("", Kind::Fleet, "f", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert!(
        store
            .delete("", Kind::Fleet, "f", &Precondition::None)
            .await
            .unwrap()
    );
    assert_eq!(
        store.upgrade_durations("f", "Full").await.unwrap(),
        Default::default()
    );
}

async fn deleting_a_run_or_fleet_takes_what_belongs_to_it(store: Arc<dyn Store>) {
    for run in ["r", "keep"] {
        store
            .put("f", Kind::RunSnapshot, run, &json!({}), &Precondition::None)
            .await
            .unwrap();
        store
            .write_run_batch(&RunBatch {
                fleet: "f".into(),
                run: run.into(),
                log: vec![json!(1).to_string()],
                intents: vec![intent(1, "m")],
                events: vec![json!(1)],
                run_body: whole(&json!({})),
                gates: vec![(format!("gate-{run}"), gate_body(run))],
                ..Default::default()
            })
            .await
            .unwrap();
    }
    assert!(
        store
            .delete("f", Kind::Run, "r", &Precondition::None)
            .await
            .unwrap()
    );
    assert!(store.run_log("f", "r").await.unwrap().entries.is_empty());
    assert!(store.run_events("f", "r", 0, 10).await.unwrap().is_empty());
    assert!(store.intents("f", "r").await.unwrap().is_empty());
    assert!(
        store
            .get("f", Kind::Gate, "gate-r")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get("f", Kind::RunSnapshot, "r")
            .await
            .unwrap()
            .is_none()
    );
    // The other run is untouched.
    assert_eq!(store.run_log("f", "keep").await.unwrap().entries.len(), 1);
    assert!(
        store
            .get("f", Kind::Gate, "gate-keep")
            .await
            .unwrap()
            .is_some()
    );
    store
        .put("", Kind::Fleet, "f", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert!(
        store
            .delete("", Kind::Fleet, "f", &Precondition::None)
            .await
            .unwrap()
    );
    assert!(store.get("f", Kind::Run, "keep").await.unwrap().is_none());
    assert!(store.run_log("f", "keep").await.unwrap().entries.is_empty());
    assert!(store.intents("f", "keep").await.unwrap().is_empty());
}

/// Several runs' batches in one transaction: a replaced run's is refused alone, a lost lease
/// refuses them all, and only what was written is announced.
async fn batches_of_several_runs_land_together(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    assert_eq!(store.acquire_lease("f", "a", ttl).await.unwrap(), Some(1));
    let mut etags = Vec::new();
    for run in ["r1", "r2", "r3"] {
        let (snapshot, _) = store
            .put("f", Kind::RunSnapshot, run, &json!({}), &Precondition::None)
            .await
            .unwrap();
        etags.push(snapshot.etag);
    }
    let batch = |run: &str, etag: &str, epoch: i64| RunBatch {
        fleet: "f".into(),
        run: run.into(),
        log: vec![json!({"run": run}).to_string()],
        events: vec![json!({"type": "E", "run": run})],
        run_body: whole(&json!({"name": run})),
        fence: Some(Fence {
            owner: "a".into(),
            epoch,
        }),
        snapshot_etag: Some(etag.into()),
        ..Default::default()
    };
    let mut notices = store.notices();
    let results = store
        .write_run_batches(&[
            batch("r1", &etags[0], 1),
            batch("r2", "\"stale\"", 1),
            batch("r3", &etags[2], 1),
        ])
        .await
        .unwrap();
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(
        matches!(results[1], Err(StoreError::Superseded(_))),
        "{results:?}"
    );
    for (run, written) in [("r1", 1), ("r2", 0), ("r3", 1)] {
        assert_eq!(
            store.run_log("f", run).await.unwrap().entries.len(),
            written,
            "{run}"
        );
        assert_eq!(
            store.get("f", Kind::Run, run).await.unwrap().is_some(),
            written == 1,
            "{run}"
        );
    }
    let mut announced = std::collections::BTreeSet::new();
    while let Ok(Ok(notice)) = tokio::time::timeout(Duration::from_secs(5), notices.recv()).await {
        if let Notice::Events { run, .. } = notice {
            announced.insert(run);
        }
        if announced.len() == 2 {
            break;
        }
    }
    assert_eq!(
        announced,
        ["r1", "r3"].map(String::from).into_iter().collect()
    );
    // Another holder's epoch: nothing of any batch lands.
    let refused = store
        .write_run_batches(&[batch("r1", &etags[0], 1), batch("r3", &etags[2], 7)])
        .await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    assert_eq!(store.run_log("f", "r1").await.unwrap().entries.len(), 1);
    assert_eq!(store.run_log("f", "r3").await.unwrap().entries.len(), 1);
}

fn fenced_batch(owner: &str, epoch: i64) -> RunBatch {
    RunBatch {
        fleet: "f".into(),
        run: "r".into(),
        log: vec![json!({"by": owner, "epoch": epoch}).to_string()],
        fence: Some(Fence {
            owner: owner.into(),
            epoch,
        }),
        ..Default::default()
    }
}

async fn leases_and_fencing(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    // Without a lease, a fenced batch is refused.
    assert!(matches!(
        store.write_run_batch(&fenced_batch("a", 1)).await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(store.acquire_lease("f", "a", ttl).await.unwrap(), Some(1));
    assert_eq!(store.acquire_lease("f", "b", ttl).await.unwrap(), None);
    assert_eq!(store.acquire_lease("g", "b", ttl).await.unwrap(), Some(1));
    assert!(store.renew_lease("f", "a", 1, ttl).await.unwrap());
    assert!(!store.renew_lease("f", "b", 1, ttl).await.unwrap());
    assert!(!store.renew_lease("f", "a", 2, ttl).await.unwrap());
    store.write_run_batch(&fenced_batch("a", 1)).await.unwrap();
    assert!(matches!(
        store.write_run_batch(&fenced_batch("b", 1)).await,
        Err(StoreError::Fenced(_))
    ));
    // Let go: the next holder gets the next epoch, and the old one is fenced off.
    store.release_lease("f", "a", 1).await.unwrap();
    assert_eq!(store.acquire_lease("f", "b", ttl).await.unwrap(), Some(2));
    assert!(!store.renew_lease("f", "a", 1, ttl).await.unwrap());
    assert!(matches!(
        store.write_run_batch(&fenced_batch("a", 1)).await,
        Err(StoreError::Fenced(_))
    ));
    store.write_run_batch(&fenced_batch("b", 2)).await.unwrap();
    // Only the holder's batches landed.
    assert_eq!(
        parsed(store.run_log("f", "r").await.unwrap().entries),
        vec![
            json!({"by": "a", "epoch": 1}),
            json!({"by": "b", "epoch": 2})
        ]
    );
    let leases = store.leases().await.unwrap();
    assert_eq!(leases.len(), 2);
    assert_eq!(
        (leases[0].fleet.as_str(), leases[0].owner.as_str()),
        ("f", "b")
    );
    assert_eq!(leases[0].epoch, 2);
    assert!(leases[0].expires_in_ms > 20_000 && leases[0].expires_in_ms <= 30_000);
    // Releasing with a stale epoch does nothing.
    store.release_lease("f", "a", 1).await.unwrap();
    assert_eq!(store.acquire_lease("f", "c", ttl).await.unwrap(), None);
}

async fn leases_expire_by_time(store: Arc<dyn Store>) {
    // Long enough that a slow write (an fsync on a loaded machine) does not outlast it.
    let short = Duration::from_secs(2);
    assert_eq!(store.acquire_lease("f", "a", short).await.unwrap(), Some(1));
    assert_eq!(store.acquire_lease("f", "b", short).await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(store.leases().await.unwrap()[0].expires_in_ms < 0);
    assert_eq!(
        store
            .acquire_lease("f", "b", Duration::from_secs(30))
            .await
            .unwrap(),
        Some(2)
    );
    // The expired holder cannot renew what another took.
    assert!(
        !store
            .renew_lease("f", "a", 1, Duration::from_secs(30))
            .await
            .unwrap()
    );
}

async fn handed_over_actions(store: Arc<dyn Store>) {
    let first = store
        .submit_action("f", "r", &json!({"Start": null}))
        .await
        .unwrap();
    let second = store
        .submit_action("f", "r2", &json!("Stop"))
        .await
        .unwrap();
    store.submit_action("g", "r", &json!("Stop")).await.unwrap();
    assert!(second > first);
    let pending = store.pending_actions("f").await.unwrap();
    assert_eq!(
        pending.iter().map(|a| a.id).collect::<Vec<_>>(),
        vec![first, second]
    );
    assert_eq!(pending[0].run, "r");
    assert_eq!(pending[0].input, json!({"Start": null}));
    assert_eq!(store.take_action_result(first).await.unwrap(), None);
    // The result lands with the run's batch, under the lease.
    store
        .acquire_lease("f", "a", Duration::from_secs(30))
        .await
        .unwrap();
    let mut batch = fenced_batch("a", 1);
    batch.action_results = vec![(first, json!({"ok": true}))];
    store.write_run_batch(&batch).await.unwrap();
    store
        .finish_action(second, &json!({"error": {"code": "NotFound"}}))
        .await
        .unwrap();
    assert!(store.pending_actions("f").await.unwrap().is_empty());
    assert_eq!(
        store.take_action_result(first).await.unwrap(),
        Some(json!({"ok": true}))
    );
    // Taken once.
    assert_eq!(store.take_action_result(first).await.unwrap(), None);
    assert_eq!(
        store.take_action_result(second).await.unwrap(),
        Some(json!({"error": {"code": "NotFound"}}))
    );
    // A fenced-off batch records no result.
    let third = store.submit_action("f", "r", &json!("Stop")).await.unwrap();
    let mut stale = fenced_batch("b", 1);
    stale.action_results = vec![(third, json!({"ok": true}))];
    assert!(store.write_run_batch(&stale).await.is_err());
    assert_eq!(store.pending_actions("f").await.unwrap().len(), 1);
}

async fn next_notice(
    notices: &mut tokio::sync::broadcast::Receiver<Notice>,
    want: &Notice,
) -> bool {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match notices.recv().await {
                Ok(n) if n == *want => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false)
}

async fn notices_of_events_actions_and_replies(store: Arc<dyn Store>) {
    let notices = store.notices();
    notices_reach(store.as_ref(), notices).await;
}

/// What `writer` does is announced on `notices`: a run's events, a handed-over action, its
/// result.
async fn notices_reach(writer: &dyn Store, mut notices: tokio::sync::broadcast::Receiver<Notice>) {
    writer
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: "r".into(),
            events: vec![json!({"e": 1})],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        next_notice(
            &mut notices,
            &Notice::Events {
                fleet: "f".into(),
                run: "r".into()
            }
        )
        .await
    );
    let id = writer
        .submit_action("f", "r", &json!("Stop"))
        .await
        .unwrap();
    assert!(next_notice(&mut notices, &Notice::Actions { fleet: "f".into() }).await);
    writer
        .finish_action(id, &json!({"ok": true}))
        .await
        .unwrap();
    assert!(next_notice(&mut notices, &Notice::Reply { id }).await);
    // A result recorded with the run's batch is announced too.
    let id = writer
        .submit_action("f", "r", &json!("Stop"))
        .await
        .unwrap();
    writer
        .write_run_batch(&RunBatch {
            fleet: "f".into(),
            run: "r".into(),
            action_results: vec![(id, json!({"ok": true}))],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(next_notice(&mut notices, &Notice::Reply { id }).await);
}

async fn heartbeats_count_live_replicas(store: Arc<dyn Store>) {
    // Counting says no replica is alive, and does not make one.
    assert_eq!(store.alive_replicas().await.unwrap(), 0);
    assert_eq!(
        store.heartbeat("a", Duration::from_secs(30)).await.unwrap(),
        1
    );
    assert_eq!(
        store.heartbeat("b", Duration::from_secs(2)).await.unwrap(),
        2
    );
    assert_eq!(
        store.heartbeat("a", Duration::from_secs(30)).await.unwrap(),
        2
    );
    assert_eq!(store.alive_replicas().await.unwrap(), 2);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // b's heartbeat ran out: counted gone, by a count that writes none.
    assert_eq!(store.alive_replicas().await.unwrap(), 1);
    assert_eq!(
        store.heartbeat("a", Duration::from_secs(30)).await.unwrap(),
        1
    );
}

async fn tokens(store: Arc<dyn Store>) {
    let record = TokenRecord {
        id: "t1".into(),
        hash: "h1".into(),
        role: "admin".into(),
        subject: "ops".into(),
        created_at: 1_700_000_000,
        revoked: false,
    };
    store.create_token(&record).await.unwrap();
    assert!(
        store
            .create_token(&TokenRecord {
                id: "t2".into(),
                ..record.clone()
            })
            .await
            .is_err(),
        "hashes are unique"
    );
    assert_eq!(
        store.token_by_hash("h1").await.unwrap(),
        Some(record.clone())
    );
    assert_eq!(store.token_by_hash("nope").await.unwrap(), None);
    assert!(store.revoke_token("t1").await.unwrap());
    assert!(!store.revoke_token("missing").await.unwrap());
    let listed = store.list_tokens().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].revoked);
}

/// Several PostgreSQL replicas starting at once migrate one database without tripping on each
/// other.
#[tokio::test]
async fn postgres_replicas_starting_together_migrate_once() {
    if !postgres_reachable() {
        return;
    }
    let (url, _db) = fresh_database().await;
    let opened = futures_join((0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { PgStore::open(&url).await.map(|_| ()) })
    }))
    .await;
    for result in opened {
        result.expect("every replica opens the database");
    }
}

async fn futures_join<T: Send + 'static>(
    tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for task in tasks.collect::<Vec<_>>() {
        out.push(task.await.unwrap());
    }
    out
}

async fn a_holder_taking_its_lease_again_gets_a_new_epoch(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    assert_eq!(store.acquire_lease("f", "a", ttl).await.unwrap(), Some(1));
    // A replica that let go of a fleet in memory takes it again: its old epoch is fenced off.
    assert_eq!(store.acquire_lease("f", "a", ttl).await.unwrap(), Some(2));
    assert!(matches!(
        store.write_run_batch(&fenced_batch("a", 1)).await,
        Err(StoreError::Fenced(_))
    ));
    store.write_run_batch(&fenced_batch("a", 2)).await.unwrap();
}

/// A holder writing as fast as it can while its lease runs out and another replica takes it:
/// none of the old holder's batches lands after the new holder's first.
async fn batches_race_a_takeover(store: Arc<dyn Store>) {
    // Two seconds: the writer lands some batches first, also on a loaded machine.
    assert_eq!(
        store
            .acquire_lease("f", "a", Duration::from_secs(2))
            .await
            .unwrap(),
        Some(1)
    );
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut landed = 0;
            loop {
                match store.write_run_batch(&fenced_batch("a", 1)).await {
                    Ok(()) => landed += 1,
                    Err(StoreError::Fenced(_)) => return landed,
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
        })
    };
    let taken = loop {
        if let Some(epoch) = store
            .acquire_lease("f", "b", Duration::from_secs(30))
            .await
            .unwrap()
        {
            break epoch;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(taken, 2);
    store.write_run_batch(&fenced_batch("b", 2)).await.unwrap();
    let landed = writer.await.unwrap();
    assert!(
        landed > 0,
        "the old holder wrote nothing before the takeover"
    );
    let log = parsed(store.run_log("f", "r").await.unwrap().entries);
    assert_eq!(log.len(), landed + 1);
    assert_eq!(log.last(), Some(&json!({"by": "b", "epoch": 2})));
}

async fn a_replaced_run_refuses_its_old_writer(store: Arc<dyn Store>) {
    let (first, _) = store
        .put(
            "f",
            Kind::RunSnapshot,
            "r",
            &json!({"v": 1}),
            &Precondition::None,
        )
        .await
        .unwrap();
    let batch = |etag: &str| RunBatch {
        fleet: "f".into(),
        run: "r".into(),
        log: vec![json!({"etag": etag}).to_string()],
        snapshot_etag: Some(etag.to_string()),
        ..Default::default()
    };
    store.write_run_batch(&batch(&first.etag)).await.unwrap();
    // Replaced: a new snapshot.
    let (second, _) = store
        .put(
            "f",
            Kind::RunSnapshot,
            "r",
            &json!({"v": 2}),
            &Precondition::None,
        )
        .await
        .unwrap();
    assert!(matches!(
        store.write_run_batch(&batch(&first.etag)).await,
        Err(StoreError::Superseded(_))
    ));
    store.write_run_batch(&batch(&second.etag)).await.unwrap();
    // Deleted, with its snapshot.
    store
        .put("f", Kind::Run, "r", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert!(
        store
            .delete("f", Kind::Run, "r", &Precondition::None)
            .await
            .unwrap()
    );
    assert!(matches!(
        store.write_run_batch(&batch(&second.etag)).await,
        Err(StoreError::Superseded(_))
    ));
}

/// Notices cross replicas: what one PostgreSQL store writes, another one connected to the same
/// database hears (LISTEN/NOTIFY), so event streams and handed-over actions need no polling.
#[tokio::test]
async fn postgres_notices_reach_other_replicas() {
    if !postgres_reachable() {
        return;
    }
    let (writer, db) = postgres().await;
    let reader = PgStore::open(&format!("{}/{}", postgres_base(), db.0))
        .await
        .unwrap();
    notices_reach(writer.as_ref(), reader.notices()).await;
}

/// Issue #36, finding 8: a batch registration the database rolls back for a reason of its own
/// (here a deadlock it breaks, forced by a transaction of the test's holding a cluster id the
/// registration claims, then claiming one the registration holds) is run again, and succeeds
/// once the other transaction is gone: the database's own reasons never refuse a batch.
#[tokio::test]
async fn postgres_a_registration_the_database_rolls_back_is_run_again() {
    use sqlx::{Connection, Row};
    if !postgres_reachable() {
        return;
    }
    let (url, _db) = fresh_database().await;
    let store: Arc<dyn Store> = Arc::new(PgStore::open(&url).await.unwrap());
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query(
        "INSERT INTO member_clusters (fleet, cluster_key, member) VALUES ('f', 'k-b', 'holder')",
    )
    .execute(&mut other)
    .await
    .unwrap();
    // The registration claims k-a, then waits for the test's transaction on k-b.
    let batch = vec![member("a", "k-a"), member("b", "k-b"), member("c", "k-c")];
    let registering = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .register_members("f", &batch, RegisterMode::Create)
                .await
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE '%member_clusters%'",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap()
        .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the registration never waited for k-b"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The test's transaction claims k-a: each waits for the other. The registration, waiting
    // longer, is the one the database rolls back; the test's claim then goes through.
    let claimed = sqlx::query(
        "INSERT INTO member_clusters (fleet, cluster_key, member) VALUES ('f', 'k-a', 'holder')",
    )
    .execute(&mut other)
    .await;
    assert!(
        claimed.is_ok(),
        "the test's transaction was the one rolled back: {claimed:?}"
    );
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    let registered = registering.await.unwrap();
    let registered = registered.expect("the registration rolled back by the deadlock is run again");
    assert_eq!(registered.written.len(), 3);
    assert!(registered.written.iter().all(|w| w.1));
    let members = store.list("f", Kind::Member, None, 10).await.unwrap();
    assert_eq!(members.len(), 3);
}

fn member(name: &str, id: &str) -> MemberWrite {
    MemberWrite {
        name: name.into(),
        body: json!({"name": name, "properties": {"clusterResourceId": id, "status": {}}}),
        when: Precondition::None,
    }
}

/// Batch registration: all or nothing; a cluster id belongs to one member of a fleet,
/// case-insensitively, also when two registrations race; deleting the member, or its fleet,
/// frees it; Upsert keeps the stored status and cannot move a member to another cluster.
async fn member_registration_keeps_cluster_ids_unique(store: Arc<dyn Store>) {
    let batch: Vec<MemberWrite> = (0..50)
        .map(|i| member(&format!("m{i:02}"), &format!("/Sub/rg/c{i}")))
        .collect();
    let done = store
        .register_members("f", &batch, RegisterMode::Create)
        .await
        .unwrap();
    assert_eq!(done.written.len(), 50);
    assert!(done.written.iter().all(|w| w.1));
    // The 51st clashes with the 8th: nothing of the batch is written.
    let clash = vec![member("n1", "/sub/rg/fresh"), member("n2", "/SUB/RG/C7")];
    match store
        .register_members("f", &clash, RegisterMode::Create)
        .await
    {
        Err(StoreError::Refused {
            item: 1,
            conflict: true,
            message,
            ..
        }) => {
            assert!(message.contains("m07"), "{message}")
        }
        other => panic!("expected a clash: {other:?}"),
    }
    assert!(store.get("f", Kind::Member, "n1").await.unwrap().is_none());
    // Items of one batch see the items before them: a name twice is created once and then
    // replaced (Upsert) or refused (Create); one new cluster under two names is refused.
    let twice = vec![
        member("d1", "/sub/rg/dup"),
        MemberWrite {
            body: json!({"name": "d1", "properties": {"clusterResourceId": "/SUB/rg/dup", "group": "g2", "status": {}}}),
            ..member("d1", "/sub/rg/dup")
        },
    ];
    let done = store
        .register_members("f", &twice, RegisterMode::Upsert)
        .await
        .unwrap();
    assert_eq!(
        done.written.iter().map(|w| w.1).collect::<Vec<_>>(),
        [true, false]
    );
    assert_ne!(
        done.written[0].0, done.written[1].0,
        "each item has its eTag"
    );
    let d1 = store.get("f", Kind::Member, "d1").await.unwrap().unwrap();
    assert_eq!(d1.body["properties"]["group"], "g2", "the last item stays");
    assert_eq!(d1.etag, done.written[1].0);
    for (batch, field) in [
        (
            vec![member("e1", "/sub/rg/e"), member("e1", "/sub/rg/e")],
            "name",
        ),
        (
            vec![member("e1", "/sub/rg/e"), member("e2", "/Sub/rg/E")],
            "properties.clusterResourceId",
        ),
    ] {
        match store
            .register_members("f", &batch, RegisterMode::Create)
            .await
        {
            Err(StoreError::Refused {
                item: 1, field: f, ..
            }) => assert_eq!(f, field),
            other => panic!("expected item 1 refused on {field}: {other:?}"),
        }
        assert!(store.get("f", Kind::Member, "e1").await.unwrap().is_none());
    }
    // Another fleet may hold the same id.
    store
        .register_members("g", &[member("m07", "/sub/rg/c7")], RegisterMode::Create)
        .await
        .unwrap();
    // Upsert keeps what was observed and refuses another cluster.
    let mut observed = store.get("f", Kind::Member, "m03").await.unwrap().unwrap();
    observed.body["properties"]["status"] = json!({"cluster": {"region": "eastus"}});
    store
        .put(
            "f",
            Kind::Member,
            "m03",
            &observed.body,
            &Precondition::None,
        )
        .await
        .unwrap();
    let again = store
        .register_members("f", &[member("m03", "/sub/RG/c3")], RegisterMode::Upsert)
        .await
        .unwrap();
    assert!(!again.written[0].1, "replaced, not created");
    let stored = store.get("f", Kind::Member, "m03").await.unwrap().unwrap();
    assert_eq!(
        stored.body["properties"]["status"]["cluster"]["region"],
        "eastus"
    );
    assert!(matches!(
        store
            .register_members("f", &[member("m03", "/elsewhere")], RegisterMode::Upsert)
            .await,
        Err(StoreError::Refused {
            conflict: false,
            ..
        })
    ));
    // Two registrations of one new id at once: exactly one lands.
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .register_members(
                        "f",
                        &[member(&format!("racer{i}"), "/sub/rg/contested")],
                        RegisterMode::Create,
                    )
                    .await
            })
        })
        .collect();
    let mut landed = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => landed += 1,
            Err(StoreError::Refused { conflict: true, .. }) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(landed, 1);
    // Deleting the holder frees the id; so does deleting the fleet.
    store
        .delete("f", Kind::Member, "m07", &Precondition::None)
        .await
        .unwrap();
    store
        .register_members("f", &[member("n2", "/sub/rg/c7")], RegisterMode::Create)
        .await
        .unwrap();
    store
        .put("", Kind::Fleet, "g", &json!({}), &Precondition::None)
        .await
        .unwrap();
    assert!(
        store
            .delete("", Kind::Fleet, "g", &Precondition::None)
            .await
            .unwrap()
    );
    store
        .register_members("g", &[member("x", "/sub/rg/c7")], RegisterMode::Create)
        .await
        .unwrap();
}

/// TLS to PostgreSQL (Hardening, item 11): `sslmode=require` in the URL makes the store's
/// connections encrypted (rustls), as the server itself reports for the session.
#[tokio::test]
async fn postgres_connections_use_tls_when_the_url_asks() {
    use sqlx::{Connection, Row};
    if !postgres_reachable() {
        return;
    }
    let url = format!("{}/postgres?sslmode=require", postgres_base());
    let mut c = match sqlx::PgConnection::connect(&url).await {
        Ok(c) => c,
        Err(e)
            if e.to_string().contains("does not support TLS") || e.to_string().contains("SSL") =>
        {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: this PostgreSQL does not offer TLS ({e})"
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let encrypted: bool = sqlx::query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut c)
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(encrypted, "the session is not encrypted");
    let (_, db) = postgres().await;
    let store = PgStore::open(&format!("{}/{}?sslmode=require", postgres_base(), db.0))
        .await
        .expect("the store opens over TLS");
    store
        .put(
            "",
            Kind::Fleet,
            "tls",
            &json!({"name": "tls"}),
            &Precondition::None,
        )
        .await
        .expect("writes");
    assert!(
        store
            .get("", Kind::Fleet, "tls")
            .await
            .expect("reads")
            .is_some()
    );
}

// ---------------------------------------------------------------------------------------------
// Migrations: databases made before the migrator move forward; edited history is refused.

/// The schema a Flotilla before the migrator left at `versions`, by its own bookkeeping.
const LEGACY_SQLITE: [&str; 2] = [
    include_str!("../migrations/sqlite/0001_resources_logs_tokens.sql"),
    include_str!("../migrations/sqlite/0002_replicas_leases_actions.sql"),
];
const LEGACY_POSTGRES: [&str; 2] = [
    include_str!("../migrations/postgres/0001_resources_logs_tokens.sql"),
    include_str!("../migrations/postgres/0002_replicas_leases_actions.sql"),
];

const LEGACY_MEMBER: &str = r#"{"name": "m1", "properties": {"clusterResourceId": "Cluster-1"}}"#;

async fn sqlite_file(path: &std::path::Path, sql: &str) {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let mut c = sqlx::SqliteConnection::connect(&url).await.expect("sqlite");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut c)
        .await
        .expect("sql runs");
    c.close().await.expect("closed");
}

async fn sqlite_count(path: &std::path::Path, sql: &str) -> i64 {
    use sqlx::{Connection, Row};
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("sqlite");
    let n = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&mut c)
        .await
        .expect("query")
        .get(0);
    c.close().await.expect("closed");
    n
}

#[tokio::test]
async fn sqlite_databases_made_before_the_migrator_move_forward() {
    let dir = std::env::temp_dir().join(format!("flotilla-legacy-{}", unique()));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = TempDir(dir.clone());
    let path = dir.join("flotilla.db");
    let legacy = format!(
        "{}\n{}\nCREATE TABLE schema_migrations (version INTEGER PRIMARY KEY);
         INSERT INTO schema_migrations VALUES (1), (2);
         INSERT INTO resources VALUES ('f1', 'members', 'm1', '{LEGACY_MEMBER}', '\"7\"');
         INSERT INTO run_events VALUES ('f1', 'r1', 1, '{{\"e\":1}}'), ('f1', 'r1', 2, '{{\"e\":2}}');",
        LEGACY_SQLITE[0], LEGACY_SQLITE[1]
    );
    sqlite_file(&path, &legacy).await;
    let store = SqliteStore::open(&path)
        .await
        .expect("a legacy database opens");
    // Its events moved to the table kept by key (migration 7), in order.
    assert_eq!(
        store.run_events("f1", "r1", 0, 10).await.unwrap(),
        vec![(1, json!({"e": 1})), (2, json!({"e": 2}))]
    );
    // The data is kept, and migration 3 saw it: the member's cluster id is taken.
    let m = store
        .get("f1", Kind::Member, "m1")
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(m.etag, "\"7\"");
    store.close().await;
    drop(store);
    assert_eq!(
        sqlite_count(
            &path,
            "SELECT count(*) FROM member_clusters WHERE cluster_key = 'cluster-1'"
        )
        .await,
        1
    );
    // Every migration applied, packed events (0014) the last.
    assert_eq!(
        sqlite_count(&path, "SELECT count(*) FROM _sqlx_migrations WHERE success").await,
        14
    );
    assert_eq!(
        sqlite_count(
            &path,
            "SELECT count(*) FROM sqlite_master WHERE name = 'schema_migrations'"
        )
        .await,
        0
    );
    // Opening again changes nothing.
    let store = SqliteStore::open(&path).await.expect("opens again");
    store.close().await;
    drop(store);
    // A migration edited after it was applied is refused, naming the migration.
    sqlite_file(
        &path,
        "UPDATE _sqlx_migrations SET checksum = x'00' WHERE version = 3",
    )
    .await;
    let refused = SqliteStore::open(&path).await.err().expect("refused");
    assert!(refused.to_string().contains("migration 3"), "{refused}");
}

#[tokio::test]
async fn sqlite_databases_of_a_newer_flotilla_are_refused_unchanged() {
    let dir = std::env::temp_dir().join(format!("flotilla-newer-{}", unique()));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = TempDir(dir.clone());
    let path = dir.join("flotilla.db");
    let legacy = format!(
        "{}\nCREATE TABLE schema_migrations (version INTEGER PRIMARY KEY);
         INSERT INTO schema_migrations VALUES (1), (99);",
        LEGACY_SQLITE[0]
    );
    sqlite_file(&path, &legacy).await;
    let refused = SqliteStore::open(&path).await.err().expect("refused");
    assert!(refused.to_string().contains("newer"), "{refused}");
    assert_eq!(
        sqlite_count(&path, "SELECT count(*) FROM schema_migrations").await,
        2,
        "nothing changed"
    );
}

#[tokio::test]
async fn postgres_databases_made_before_the_migrator_move_forward() {
    use sqlx::{Connection, Row};
    if !postgres_reachable() {
        return;
    }
    let (url, _db) = fresh_database().await;
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    let legacy = format!(
        "{}\n{}\nCREATE TABLE schema_migrations (version BIGINT PRIMARY KEY);
         INSERT INTO schema_migrations VALUES (1), (2);
         INSERT INTO resources VALUES ('f1', 'members', 'm1', '{LEGACY_MEMBER}', '\"7\"');",
        LEGACY_POSTGRES[0], LEGACY_POSTGRES[1]
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(legacy))
        .execute(&mut c)
        .await
        .unwrap();
    let store = PgStore::open(&url).await.expect("a legacy database opens");
    let m = store
        .get("f1", Kind::Member, "m1")
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(m.etag, "\"7\"");
    let count = |sql: &'static str| {
        let url = url.clone();
        async move {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let n: i64 = sqlx::query(sql).fetch_one(&mut c).await.unwrap().get(0);
            n
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM member_clusters WHERE cluster_key = 'cluster-1'").await,
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM _sqlx_migrations WHERE success").await,
        14
    );
    assert_eq!(
        count("SELECT count(*) FROM pg_tables WHERE tablename = 'schema_migrations'").await,
        0
    );
    PgStore::open(&url).await.expect("opens again");
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 3")
        .execute(&mut c)
        .await
        .unwrap();
    let refused = PgStore::open(&url).await.err().expect("refused");
    assert!(refused.to_string().contains("migration 3"), "{refused}");
}

/// A run's log entries as JSON (the store keeps them as written).
fn parsed(entries: Vec<String>) -> Vec<Value> {
    entries
        .iter()
        .map(|e| serde_json::from_str(e).expect("an entry is JSON"))
        .collect()
}

/// The audit trail: appended in order, read after an id, by fleet or all, a page at a time.
async fn the_audit_trail_keeps_every_entry_in_order(store: Arc<dyn Store>) {
    let entry = |i: i64, fleet: Option<&str>| AuditEntry {
        id: 0,
        at: 1_700_000_000_000 + i,
        subject: format!("user-{i}"),
        role: "operator".into(),
        method: "POST".into(),
        path: format!("/v1/fleets/f/updateRuns/r{i}/start"),
        fleet: fleet.map(String::from),
        status: 202,
        body: (i % 2 == 0).then(|| format!("{{\"n\": {i}}}")),
    };
    for i in 0..5 {
        let fleet = if i == 3 { Some("other") } else { Some("f") };
        store
            .append_audit(&entry(i, fleet))
            .await
            .expect("appended");
    }
    store.append_audit(&entry(5, None)).await.expect("appended");
    let all = store.list_audit(None, 0, 0, 100).await.expect("listed");
    assert_eq!(all.len(), 6);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "in order");
    assert_eq!(all[2].subject, "user-2");
    assert_eq!(all[2].body.as_deref(), Some("{\"n\": 2}"));
    assert_eq!(all[1].body, None);
    assert_eq!(all[5].fleet, None);
    let of_f = store
        .list_audit(Some("f"), 0, 0, 100)
        .await
        .expect("listed");
    assert_eq!(
        of_f.iter().map(|e| e.subject.as_str()).collect::<Vec<_>>(),
        ["user-0", "user-1", "user-2", "user-4"]
    );
    let page = store
        .list_audit(Some("f"), of_f[1].id, 0, 2)
        .await
        .expect("listed");
    assert_eq!(
        page.iter().map(|e| e.subject.as_str()).collect::<Vec<_>>(),
        ["user-2", "user-4"]
    );
    let since = store
        .list_audit(None, 0, 1_700_000_000_004, 100)
        .await
        .expect("listed");
    assert_eq!(
        since.iter().map(|e| e.subject.as_str()).collect::<Vec<_>>(),
        ["user-4", "user-5"]
    );
}

/// Entries older than the retention go, oldest first and a batch at a time; younger ones stay.
/// The background loop every server runs does it by itself.
async fn the_audit_trail_is_pruned_past_its_retention(store: Arc<dyn Store>) {
    const DAY: i64 = 86_400_000;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .expect("clock");
    let entry = |at: i64, subject: &str| AuditEntry {
        id: 0,
        at,
        subject: subject.into(),
        role: "admin".into(),
        method: "PUT".into(),
        path: "/v1/fleets/f".into(),
        fleet: Some("f".into()),
        status: 200,
        body: None,
    };
    for i in 0..2500 {
        store
            .append_audit(&entry(now - 30 * DAY + i, "old"))
            .await
            .expect("appended");
    }
    for subject in ["recent-1", "recent-2"] {
        store
            .append_audit(&entry(now - DAY, subject))
            .await
            .expect("appended");
    }
    let before = now - 10 * DAY;
    assert_eq!(store.prune_audit(before, 1000).await.expect("pruned"), 1000);
    assert_eq!(store.prune_audit(before, 1000).await.expect("pruned"), 1000);
    assert_eq!(store.prune_audit(before, 1000).await.expect("pruned"), 500);
    assert_eq!(store.prune_audit(before, 1000).await.expect("pruned"), 0);
    let left = store.list_audit(None, 0, 0, 100).await.expect("listed");
    assert_eq!(
        left.iter().map(|e| e.subject.as_str()).collect::<Vec<_>>(),
        ["recent-1", "recent-2"]
    );
    // The loop: more old entries, pruned at its first pass, the recent ones kept.
    for _ in 0..1500 {
        store
            .append_audit(&entry(now - 20 * DAY, "old"))
            .await
            .expect("appended");
    }
    let pruner = tokio::spawn(flotilla_store::prune_audit_forever(
        store.clone(),
        std::time::Duration::from_secs(10 * 86_400),
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = store.list_audit(None, 0, 0, 2000).await.expect("listed");
        if left.iter().all(|e| e.subject != "old") {
            assert_eq!(left.len(), 2, "the recent entries stay");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{} left", left.len());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    pruner.abort();
}

// ---------------------------------------------------------------------------------------------
// Webhooks and their outbox.

fn webhook(name: &str, fleets: &[&str], events: &[&str]) -> Webhook {
    Webhook {
        name: name.into(),
        url: format!("https://hooks.example/{name}"),
        secret: format!("secret-{name}"),
        fleets: fleets.iter().map(|s| s.to_string()).collect(),
        events: events.iter().map(|s| s.to_string()).collect(),
        format: "CloudEvents".into(),
        system_data: json!({"createdBy": "admin"}),
        etag: String::new(),
    }
}

fn event(kind: &str, member: Option<&str>) -> Value {
    let mut e = json!({"time": "2026-12-01T00:00:00Z", "type": kind});
    if let Some(m) = member {
        e["member"] = json!(m);
    }
    e
}

fn events_batch(fleet: &str, run: &str, events: Vec<Value>) -> RunBatch {
    RunBatch {
        fleet: fleet.into(),
        run: run.into(),
        events,
        ..Default::default()
    }
}

fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn webhooks_are_kept_with_their_conditions(store: Arc<dyn Store>) {
    let hook = webhook("ops", &["*"], &["RunCompleted", "MemberFailed"]);
    let (etag, created) = store.put_webhook(&hook, &Precondition::None).await.unwrap();
    assert!(created);
    let stored = store.get_webhook("ops").await.unwrap().unwrap();
    assert_eq!(
        stored,
        Webhook {
            etag: etag.clone(),
            ..hook.clone()
        }
    );
    // Replaced under its eTag: a new eTag, not created; the old eTag no longer matches.
    let changed = Webhook {
        url: "https://hooks.example/moved".into(),
        ..hook.clone()
    };
    let (etag2, created) = store
        .put_webhook(&changed, &Precondition::IfMatch(etag.clone()))
        .await
        .unwrap();
    assert!(!created);
    assert_ne!(etag, etag2);
    assert!(precondition_failed(
        store
            .put_webhook(&hook, &Precondition::IfMatch(etag.clone()))
            .await
    ));
    assert!(precondition_failed(
        store
            .put_webhook(&hook, &Precondition::IfNoneMatchAny)
            .await
    ));
    assert!(precondition_failed(
        store
            .put_webhook(
                &webhook("new", &["*"], &["*"]),
                &Precondition::IfMatch("*".into())
            )
            .await
    ));
    assert!(precondition_failed(
        store
            .delete_webhook("ops", &Precondition::IfMatch(etag))
            .await
    ));
    let stored = store.get_webhook("ops").await.unwrap().unwrap();
    assert_eq!(stored.url, "https://hooks.example/moved");
    assert_eq!(stored.etag, etag2);
    // Listed by name, a page at a time.
    for name in ["b", "a", "c"] {
        store
            .put_webhook(
                &webhook(name, &["*"], &["*"]),
                &Precondition::IfNoneMatchAny,
            )
            .await
            .unwrap();
    }
    let names = |hooks: Vec<Webhook>| hooks.into_iter().map(|h| h.name).collect::<Vec<_>>();
    assert_eq!(
        names(store.list_webhooks(None, 2).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(
        names(store.list_webhooks(Some("b"), 10).await.unwrap()),
        ["c", "ops"]
    );
    assert!(store.get_webhook("none").await.unwrap().is_none());
    assert!(
        !store
            .delete_webhook("none", &Precondition::None)
            .await
            .unwrap()
    );
    assert!(
        store
            .delete_webhook("ops", &Precondition::IfMatch(etag2))
            .await
            .unwrap()
    );
    assert!(store.get_webhook("ops").await.unwrap().is_none());
}

/// A fleet's event in no run (a freeze or budget written) goes to the webhooks that want it,
/// once per id.
async fn fleet_events_make_deliveries_once(store: Arc<dyn Store>) {
    for hook in [
        webhook("rules", &["f"], &["FreezeChanged"]),
        webhook("runs", &["*"], &["RunCompleted"]),
    ] {
        store.put_webhook(&hook, &Precondition::None).await.unwrap();
    }
    let changed = json!({"type": "FreezeChanged", "freeze": "peak", "change": "Created"});
    for _ in 0..2 {
        store
            .record_fleet_event("f", "f/freezes/peak/7", &changed)
            .await
            .unwrap();
    }
    store
        .record_fleet_event("g", "g/freezes/peak/8", &changed)
        .await
        .unwrap();
    let rules = store.list_deliveries("rules", None, 0, 100).await.unwrap();
    assert_eq!(
        rules
            .iter()
            .map(|d| (
                d.event_id.as_str(),
                d.fleet.as_str(),
                d.run.as_str(),
                d.event_type.as_str()
            ))
            .collect::<Vec<_>>(),
        [("f/freezes/peak/7", "f", "", "FreezeChanged")]
    );
    assert_eq!(rules[0].event, changed);
    assert!(
        store
            .list_deliveries("runs", None, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A freeze written or deleted and the event that reports it are one transaction: a write
/// its precondition refuses reports nothing, and each change is reported once, as made.
async fn a_rule_and_its_report_are_written_together(store: Arc<dyn Store>) {
    store
        .put_webhook(
            &webhook("rules", &["f"], &["FreezeChanged"]),
            &Precondition::None,
        )
        .await
        .unwrap();
    let report = |created: bool, etag: Option<&str>| {
        let change = match (etag, created) {
            (None, _) => "Deleted",
            (Some(_), true) => "Created",
            (Some(_), false) => "Updated",
        };
        (
            format!("f/freezes/peak/{}", etag.unwrap_or("gone")),
            json!({"type": "FreezeChanged", "freeze": "peak", "change": change}),
        )
    };
    let changes = |store: Arc<dyn Store>| async move {
        store
            .list_deliveries("rules", None, 0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.event["change"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    let body = json!({"properties": {"start": "2026-12-24T00:00:00Z"}}).to_string();
    let (etag, created) = store
        .write_reported(
            "f",
            Kind::Freeze,
            "peak",
            Some(&body),
            &Precondition::IfNoneMatchAny,
            &report,
        )
        .await
        .unwrap();
    assert!(created);
    let etag = etag.expect("an eTag");
    assert_eq!(
        store
            .get("f", Kind::Freeze, "peak")
            .await
            .unwrap()
            .unwrap()
            .etag,
        etag
    );
    // Refused by its precondition: nothing written, nothing reported.
    let refused = store
        .write_reported(
            "f",
            Kind::Freeze,
            "peak",
            Some(&body),
            &Precondition::IfNoneMatchAny,
            &report,
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Precondition(_))),
        "{refused:?}"
    );
    assert_eq!(changes(store.clone()).await, ["Created"]);
    let (_, created) = store
        .write_reported(
            "f",
            Kind::Freeze,
            "peak",
            Some(&body),
            &Precondition::IfMatch(etag),
            &report,
        )
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(
        store
            .write_reported(
                "f",
                Kind::Freeze,
                "peak",
                None,
                &Precondition::None,
                &report
            )
            .await
            .unwrap(),
        (None, true)
    );
    assert!(
        store
            .get("f", Kind::Freeze, "peak")
            .await
            .unwrap()
            .is_none()
    );
    // Gone already: nothing to report.
    assert_eq!(
        store
            .write_reported(
                "f",
                Kind::Freeze,
                "peak",
                None,
                &Precondition::None,
                &report
            )
            .await
            .unwrap(),
        (None, false)
    );
    assert_eq!(
        changes(store.clone()).await,
        ["Created", "Updated", "Deleted"]
    );
    // Only a fleet's rules are written so.
    let member = store
        .write_reported(
            "f",
            Kind::Member,
            "m",
            Some("{}"),
            &Precondition::None,
            &report,
        )
        .await;
    assert!(
        matches!(member, Err(StoreError::Refused { .. })),
        "{member:?}"
    );
    assert!(store.get("f", Kind::Member, "m").await.unwrap().is_none());
}

async fn events_make_deliveries_in_their_own_batch(store: Arc<dyn Store>) {
    // Events written before any webhook make no delivery.
    store
        .write_run_batch(&events_batch("f", "r", vec![event("RunStarted", None)]))
        .await
        .unwrap();
    for hook in [
        webhook("all", &["*"], &["*"]),
        webhook("ends", &["f"], &["RunCompleted"]),
        webhook("elsewhere", &["g"], &["*"]),
    ] {
        store.put_webhook(&hook, &Precondition::None).await.unwrap();
    }
    let before = unix_now_ms();
    store
        .write_run_batch(&events_batch(
            "f",
            "r",
            vec![
                event("MemberStarted", Some("m1")),
                event("MemberSucceeded", Some("m1")),
                event("RunCompleted", None),
            ],
        ))
        .await
        .unwrap();
    let all = store.list_deliveries("all", None, 0, 100).await.unwrap();
    assert_eq!(
        all.iter()
            .map(|d| (d.event_id.as_str(), d.seq, d.event_type.as_str()))
            .collect::<Vec<_>>(),
        [
            ("f/r/0/2", 2, "MemberStarted"),
            ("f/r/0/3", 3, "MemberSucceeded"),
            ("f/r/0/4", 4, "RunCompleted"),
        ]
    );
    let first = &all[0];
    assert_eq!(first.event, event("MemberStarted", Some("m1")));
    assert_eq!((first.fleet.as_str(), first.run.as_str()), ("f", "r"));
    assert_eq!(first.state, DeliveryState::Pending);
    assert_eq!(first.attempts, 0);
    assert!(first.created_at >= before && first.created_at <= unix_now_ms());
    assert_eq!(first.next_attempt_at, Some(first.created_at));
    assert_eq!(
        (
            first.last_status,
            first.last_error.clone(),
            first.delivered_at
        ),
        (None, None, None)
    );
    // Each webhook gets the events it wants, with the same ids.
    let ends = store.list_deliveries("ends", None, 0, 100).await.unwrap();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].event_id, "f/r/0/4");
    assert!(
        store
            .list_deliveries("elsewhere", None, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    // A run's generation (its snapshot's eTag) is part of the id: a run made again under the
    // same name gives new ids.
    put(&*store, Kind::RunSnapshot, "s", &json!({"properties": {}})).await;
    let snapshot = store
        .get("f", Kind::RunSnapshot, "s")
        .await
        .unwrap()
        .unwrap()
        .etag;
    store
        .write_run_batch(&RunBatch {
            snapshot_etag: Some(snapshot.clone()),
            ..events_batch("f", "s", vec![event("RunStarted", None)])
        })
        .await
        .unwrap();
    let all = store.list_deliveries("all", None, 0, 100).await.unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(
        all[3].event_id,
        format!("f/s/{}/1", snapshot.trim_matches('"'))
    );
    // A batch refused (its writer lost the lease) makes no delivery: the outbox is in the
    // events' transaction.
    assert!(matches!(
        store
            .write_run_batch(&RunBatch {
                fence: Some(Fence {
                    owner: "nobody".into(),
                    epoch: 1,
                }),
                ..events_batch("f", "r", vec![event("RunFailed", None)])
            })
            .await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(
        store
            .list_deliveries("all", None, 0, 100)
            .await
            .unwrap()
            .len(),
        4
    );
    // Several runs' batches in one transaction make theirs too.
    store
        .write_run_batches(&[
            events_batch("f", "r", vec![event("RunStopped", None)]),
            events_batch("f", "q", vec![event("RunCompleted", None)]),
        ])
        .await
        .unwrap();
    let ends = store.list_deliveries("ends", None, 0, 100).await.unwrap();
    assert_eq!(
        ends.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(),
        ["f/r/0/4", "f/q/0/1"]
    );
}

async fn deliveries_are_claimed_once_and_recorded(store: Arc<dyn Store>) {
    store
        .put_webhook(&webhook("all", &["*"], &["*"]), &Precondition::None)
        .await
        .unwrap();
    store
        .write_run_batch(&RunBatch {
            run_head: Some(r#"{"properties":{"status":{"status":{"state":"Running"}}}}"#.into()),
            ..events_batch(
                "f",
                "r",
                (0..6)
                    .map(|i| event("MemberStarted", Some(&format!("m{i}"))))
                    .collect(),
            )
        })
        .await
        .unwrap();
    let now = unix_now_ms() + 1;
    // Two claimers at once: each row goes to one of them.
    let claims = futures_join((0..2).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.claim_deliveries(now, 60_000, 4).await.unwrap() })
    }))
    .await;
    let mut ids: Vec<i64> = claims.iter().flatten().map(|d| d.delivery.id).collect();
    assert_eq!(ids.len(), 6, "{claims:?}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 6, "a row was claimed twice: {claims:?}");
    let due = claims.into_iter().flatten().collect::<Vec<_>>();
    assert_eq!(due[0].webhook.secret, "secret-all");
    assert_eq!(
        due[0].run_head.as_deref(),
        Some(r#"{"properties":{"status":{"status":{"state":"Running"}}}}"#)
    );
    // Claimed: not due again until the claim lapses.
    assert!(
        store
            .claim_deliveries(now + 59_999, 60_000, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .claim_deliveries(now + 60_000, 60_000, 10)
            .await
            .unwrap()
            .len(),
        6
    );
    let later = now + 120_000;
    let attempt =
        |outcome: AttemptOutcome, status: Option<u16>, error: Option<&str>| DeliveryAttempt {
            at: later,
            status,
            error: error.map(String::from),
            outcome,
        };
    let [a, b, c, ..] = ids[..] else {
        panic!("{ids:?}");
    };
    store
        .record_delivery(a, &attempt(AttemptOutcome::Delivered, Some(204), None))
        .await
        .unwrap();
    store
        .record_delivery(
            b,
            &attempt(
                AttemptOutcome::RetryAt(later + 1_000),
                Some(500),
                Some("HTTP 500"),
            ),
        )
        .await
        .unwrap();
    store
        .record_delivery(
            c,
            &attempt(AttemptOutcome::Abandoned, None, Some("connection refused")),
        )
        .await
        .unwrap();
    // A delivery no longer pending stays as it was recorded.
    store
        .record_delivery(a, &attempt(AttemptOutcome::Abandoned, None, Some("late")))
        .await
        .unwrap();
    let all = store.list_deliveries("all", None, 0, 100).await.unwrap();
    let find = |id: i64| all.iter().find(|d| d.id == id).unwrap().clone();
    let delivered = find(a);
    assert_eq!(delivered.state, DeliveryState::Delivered);
    assert_eq!(
        (
            delivered.attempts,
            delivered.last_status,
            delivered.delivered_at,
            delivered.next_attempt_at,
            delivered.last_error
        ),
        (1, Some(204), Some(later), None, None)
    );
    let retried = find(b);
    assert_eq!(retried.state, DeliveryState::Pending);
    assert_eq!(
        (
            retried.attempts,
            retried.last_status,
            retried.last_attempt_at,
            retried.next_attempt_at,
            retried.last_error.as_deref()
        ),
        (
            1,
            Some(500),
            Some(later),
            Some(later + 1_000),
            Some("HTTP 500")
        )
    );
    let abandoned = find(c);
    assert_eq!(abandoned.state, DeliveryState::Abandoned);
    assert_eq!(abandoned.last_error.as_deref(), Some("connection refused"));
    // The recorded attempt let its claim go: the retry is due at its time, not before.
    let due_at = |t: i64| {
        let store = store.clone();
        async move {
            store
                .claim_deliveries(t, 60_000, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|d| d.delivery.id)
                .collect::<Vec<_>>()
        }
    };
    assert!(due_at(later + 999).await.iter().all(|id| *id != b));
    assert!(due_at(later + 1_000).await.contains(&b));
    // By state, and paged by id.
    let by_state = |state| {
        let store = store.clone();
        async move {
            store
                .list_deliveries("all", Some(state), 0, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|d| d.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(by_state(DeliveryState::Delivered).await, [a]);
    assert_eq!(by_state(DeliveryState::Abandoned).await, [c]);
    assert_eq!(by_state(DeliveryState::Pending).await.len(), 4);
    let page = store.list_deliveries("all", None, a, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|d| d.id).collect::<Vec<_>>(),
        ids[1..3].to_vec()
    );
    // Pruning takes what is over and older than the limit, never what is pending.
    assert_eq!(store.prune_deliveries(unix_now_ms() + 1).await.unwrap(), 2);
    assert_eq!(
        store
            .list_deliveries("all", None, 0, 100)
            .await
            .unwrap()
            .len(),
        4
    );
}

async fn deleting_a_webhook_takes_its_deliveries(store: Arc<dyn Store>) {
    for name in ["gone", "kept"] {
        store
            .put_webhook(&webhook(name, &["*"], &["*"]), &Precondition::None)
            .await
            .unwrap();
    }
    store
        .write_run_batch(&events_batch(
            "f",
            "r",
            vec![event("RunStarted", None), event("RunCompleted", None)],
        ))
        .await
        .unwrap();
    assert!(
        store
            .delete_webhook("gone", &Precondition::None)
            .await
            .unwrap()
    );
    assert!(
        store
            .list_deliveries("gone", None, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let due = store
        .claim_deliveries(unix_now_ms() + 1, 60_000, 100)
        .await
        .unwrap();
    assert_eq!(
        due.iter()
            .map(|d| d.webhook.name.as_str())
            .collect::<Vec<_>>(),
        ["kept", "kept"]
    );
    // Made again under the same name, it starts with no deliveries, and new events reach it.
    store
        .put_webhook(&webhook("gone", &["*"], &["*"]), &Precondition::None)
        .await
        .unwrap();
    assert!(
        store
            .list_deliveries("gone", None, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    store
        .write_run_batch(&events_batch("f", "r", vec![event("RunStopped", None)]))
        .await
        .unwrap();
    let again = store.list_deliveries("gone", None, 0, 100).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].event_id, "f/r/0/3");
}

/// A PostgreSQL database that does not exist is created when the role may create databases;
/// otherwise the error says exactly what an administrator runs, and never shows the URL's
/// password (#42).
#[tokio::test]
async fn a_missing_postgres_database_is_created_or_its_creation_spelled_out() {
    if !postgres_reachable() {
        return;
    }
    use sqlx::Connection;
    let name = format!("flotilla_made_{}_{}", std::process::id(), unique());
    let _made = TempDatabase(name.clone());
    let store = PgStore::open(&format!("{}/{name}", postgres_base()))
        .await
        .expect("the database is created");
    store.list_tokens().await.expect("and migrated");
    drop(store);
    // A role that may log in but not create databases.
    let role = format!("flotilla_nocreate_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(&format!("{}/postgres", postgres_base()))
        .await
        .unwrap();
    for sql in [
        format!("DROP ROLE IF EXISTS {role}"),
        format!("CREATE ROLE {role} LOGIN NOCREATEDB PASSWORD 'hunter2'"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let base = postgres_base();
    let host = base
        .rsplit_once('@')
        .map_or(base.trim_start_matches("postgres://"), |(_, h)| h);
    let never = format!("flotilla_never_{}", std::process::id());
    let refused = PgStore::open(&format!("postgres://{role}:hunter2@{host}/{never}")).await;
    let message = refused.err().expect("refused").to_string();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
        .execute(&mut admin)
        .await
        .unwrap();
    assert!(
        message.contains(&format!("CREATE DATABASE \"{never}\" OWNER \"{role}\"")),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}
