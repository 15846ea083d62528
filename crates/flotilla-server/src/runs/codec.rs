//! The documents of runs: their snapshots, the run document and its status rendered from an engine, the fleet's member table read from the store, operation keys.

use super::*;
use flotilla_engine::engine::RollbackPlan;
use flotilla_engine::status::PromotedFrom;

/// The fleet's release catalog from its driver; a driver that cannot list it is a conflict
/// the caller may retry.
pub async fn driver_catalog(driver: &dyn Driver) -> Result<Catalog, ApiError> {
    driver.catalog().await.map_err(|e| {
        ApiError::conflict(format!(
            "the fleet's driver cannot list releases: {}",
            e.message
        ))
    })
}

/// A run's snapshot as stored (the run's strategy and upgrade stay in the run's document):
/// each distinct cluster once, and each member pointing at its cluster by index (`c`). Most
/// members of a fleet share a few cluster shapes, so this is about half the size of a cluster
/// written out per member, which snapshots before this held (and are still read).
pub fn snapshot_document(snapshot: &RunOrigin, created_at: Time) -> serde_json::Result<String> {
    use flotilla_engine::engine::RunRules;
    #[derive(serde::Serialize)]
    struct Stored<'a> {
        clusters: &'a [Arc<Cluster>],
        members: Vec<StoredMember<'a>>,
        catalog: &'a Catalog,
        rules: RunRules,
        #[serde(skip_serializing_if = "Option::is_none")]
        rollback: Option<&'a RollbackPlan>,
        #[serde(rename = "promotedFrom", skip_serializing_if = "Option::is_none")]
        promoted_from: Option<&'a PromotedFrom>,
        #[serde(rename = "createdAt")]
        created_at: Time,
        /// Written only when it is not 1: snapshots of real fleets read as before.
        #[serde(rename = "timeScale", skip_serializing_if = "is_one")]
        time_scale: f64,
    }
    fn is_one(scale: &f64) -> bool {
        *scale == 1.0
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct StoredMember<'a> {
        name: &'a str,
        cluster_resource_id: &'a str,
        labels: &'a std::collections::BTreeMap<String, String>,
        c: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        group: Option<&'a str>,
    }
    let mut clusters = crate::journal::ClusterList::default();
    let members = snapshot
        .members
        .iter()
        .map(|m| StoredMember {
            name: &m.name,
            cluster_resource_id: &m.cluster_resource_id,
            labels: &m.labels,
            c: clusters.index(m.cluster.clone()),
            group: m.group.as_deref(),
        })
        .collect();
    serde_json::to_string(&Stored {
        clusters: &clusters.list,
        members,
        catalog: &snapshot.catalog,
        rules: snapshot.rules(),
        rollback: snapshot.rollback(),
        promoted_from: snapshot.promoted_from.as_ref(),
        created_at,
        time_scale: snapshot.time_scale,
    })
}

/// A run's origin as stored: its snapshot, and its strategy and upgrade from its document.
pub(super) fn read_snapshot(base: &Value, internal: &str) -> Result<RunOrigin, ApiError> {
    let bad = |e: String| ApiError::conflict(format!("stored run snapshot is unreadable: {e}"));
    // Read straight into its types: a 10,000-member snapshot is never built as a JSON tree.
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct StoredMember {
        name: String,
        cluster_resource_id: String,
        #[serde(default)]
        group: Option<String>,
        #[serde(default)]
        labels: std::collections::BTreeMap<String, String>,
        /// Snapshots written before clusters were listed once.
        #[serde(default)]
        cluster: Option<Cluster>,
        #[serde(default)]
        c: Option<usize>,
    }
    #[derive(serde::Deserialize)]
    struct Stored {
        members: Vec<StoredMember>,
        #[serde(default)]
        clusters: Vec<Cluster>,
        catalog: Catalog,
        #[serde(default)]
        rules: flotilla_engine::engine::RunRules,
        #[serde(default)]
        rollback: Option<RollbackPlan>,
        #[serde(default, rename = "promotedFrom")]
        promoted_from: Option<PromotedFrom>,
        /// Snapshots written before runs kept their time scale ran at 1.
        #[serde(default = "one", rename = "timeScale")]
        time_scale: f64,
    }
    fn one() -> f64 {
        1.0
    }
    let stored: Stored = serde_json::from_str(internal).map_err(|e| bad(e.to_string()))?;
    let clusters: Vec<Arc<Cluster>> = stored.clusters.into_iter().map(Arc::new).collect();
    let members = stored
        .members
        .into_iter()
        .map(|m| {
            let cluster = match (m.cluster, m.c) {
                (Some(cluster), None) => Arc::new(cluster),
                (None, Some(k)) => clusters.get(k).cloned().ok_or_else(|| {
                    bad(format!(
                        "member {:?} names cluster {k} of {}",
                        m.name,
                        clusters.len()
                    ))
                })?,
                _ => return Err(bad(format!("member {:?} has no one cluster", m.name))),
            };
            Ok(SharedMember {
                name: m.name.into(),
                cluster_resource_id: m.cluster_resource_id.into(),
                group: m.group,
                labels: m.labels,
                cluster,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let making = match stored.rollback {
        Some(plan) => RunMaking::Rollback(plan),
        None => {
            let json_bad = |e: serde_json::Error| bad(e.to_string());
            let strategy: Option<StrategySpec> = match &base["properties"]["strategy"] {
                Value::Null => None,
                s => Some(serde_json::from_value(s.clone()).map_err(json_bad)?),
            };
            let update: ManagedClusterUpdateSpec =
                serde_json::from_value(base["properties"]["managedClusterUpdate"].clone())
                    .map_err(json_bad)?;
            RunMaking::Spec(RunSpec {
                strategy: strategy
                    .as_ref()
                    .map(|s| {
                        parse_strategy(s, "properties.strategy", DEFAULT_STAGE_CONCURRENCY_LIMIT)
                    })
                    .transpose()?,
                upgrade: parse_upgrade(&update, "properties.managedClusterUpdate")?,
                rules: stored.rules,
            })
        }
    };
    Ok(RunOrigin {
        making,
        members,
        catalog: stored.catalog,
        promoted_from: stored.promoted_from,
        time_scale: stored.time_scale,
    })
}

/// A run's stored document without its status, read without building the status (the bulk of
/// a large run's document) as a JSON tree.
pub fn run_base(text: &str) -> Result<Value, ApiError> {
    let bad = |e: serde_json::Error| ApiError::conflict(format!("stored run is unreadable: {e}"));
    let fields: serde_json::Map<String, Value> = {
        let raw: raw_fields::Fields<'_> = serde_json::from_str(text).map_err(bad)?;
        let mut fields = serde_json::Map::new();
        for (key, value) in raw.0 {
            let value = if key == "properties" {
                let props: raw_fields::Fields<'_> =
                    serde_json::from_str(value.get()).map_err(bad)?;
                let mut out = serde_json::Map::new();
                for (k, v) in props.0 {
                    if k != "status" {
                        out.insert(k, serde_json::from_str(v.get()).map_err(bad)?);
                    }
                }
                Value::Object(out)
            } else {
                serde_json::from_str::<Value>(value.get()).map_err(bad)?
            };
            fields.insert(key, value);
        }
        fields
    };
    Ok(Value::Object(fields))
}

/// An object's fields in document order, each left as unparsed JSON.
pub(super) mod raw_fields {
    use serde::de::{Deserializer, MapAccess, Visitor};
    use serde_json::value::RawValue;

    pub struct Fields<'a>(pub Vec<(String, &'a RawValue)>);

    impl<'de: 'a, 'a> serde::Deserialize<'de> for Fields<'a> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<'a>(std::marker::PhantomData<&'a ()>);
            impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
                type Value = Fields<'a>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Fields<'a>, M::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = m.next_entry::<String, &'de RawValue>()? {
                        out.push((k, v));
                    }
                    Ok(Fields(out))
                }
            }
            d.deserialize_map(V(std::marker::PhantomData))
        }
    }
}

/// A fleet's members as last observed (`status.cluster`), for its fleet engine's table. A
/// member never observed is left out: the runs that selected it bring what they know of it.
pub(crate) async fn member_table(
    store: &Arc<dyn Store>,
    fleet: &str,
) -> Result<Vec<SharedMember>, ApiError> {
    Ok(stored_members(store, fleet)
        .await?
        .into_iter()
        .filter_map(|m| {
            let cluster = m.cluster.clone()?;
            Some(m.with_cluster(cluster))
        })
        .collect())
}

/// Every member of a fleet in name order, read straight into its type; the store fetches the
/// next page while this task reads the last (a fleet of 100,000 is 30 MB of text).
pub async fn stored_members(
    store: &Arc<dyn Store>,
    fleet: &str,
) -> Result<Vec<StoredMember>, ApiError> {
    const PAGE: usize = 2000;
    let (pages, mut fetched) = mpsc::channel(2);
    let fetcher = {
        let (store, fleet) = (store.clone(), fleet.to_string());
        tokio::spawn(async move {
            let mut after: Option<String> = None;
            loop {
                let page = store
                    .list_raw(&fleet, Kind::Member, after.as_deref(), PAGE)
                    .await
                    .map_err(|e| ApiError::conflict(e.to_string()));
                let last = page
                    .as_ref()
                    .ok()
                    .and_then(|p| p.last())
                    .map(|l| l.0.clone());
                let full = page.as_ref().is_ok_and(|p| p.len() == PAGE);
                if pages.send(page).await.is_err() || !full {
                    return;
                }
                after = last;
            }
        })
    };
    let mut reader = MemberReader::default();
    let mut members = Vec::new();
    while let Some(page) = fetched.recv().await {
        for (name, text, _) in page? {
            members.push(reader.read(&name, &text)?);
        }
    }
    fetcher
        .await
        .map_err(|e| ApiError::conflict(format!("cannot read the fleet's members: {e}")))?;
    Ok(members)
}

/// A member resource as the fleet's runs see it, read from its stored text: its cluster as last
/// observed (`status.cluster`), if it was and it reads as one.
pub struct StoredMember {
    pub name: Arc<str>,
    pub cluster_resource_id: Arc<str>,
    pub group: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub cluster: Option<Arc<Cluster>>,
}

impl StoredMember {
    pub fn with_cluster(self, cluster: Arc<Cluster>) -> SharedMember {
        SharedMember {
            name: self.name,
            cluster_resource_id: self.cluster_resource_id,
            group: self.group,
            labels: self.labels,
            cluster,
        }
    }
}

/// Reads member resources straight from their stored texts into their types, never as JSON
/// trees: a fleet of 100,000 is read to create a run or start the fleet's task. Clusters of the
/// same text are read once and shared, as most members of a fleet share a few shapes.
#[derive(Default)]
pub struct MemberReader {
    pub(super) clusters: HashMap<String, Arc<Cluster>>,
}

impl MemberReader {
    /// A field that does not read as its type is left out (no group, no labels, not observed),
    /// as registration validated what it stored; text that is not JSON is an error.
    pub fn read(&mut self, name: &str, text: &str) -> Result<StoredMember, ApiError> {
        use serde_json::value::RawValue;
        #[derive(serde::Deserialize)]
        struct Document<'a> {
            #[serde(borrow, default)]
            properties: Option<&'a RawValue>,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Properties<'a> {
            #[serde(borrow, default)]
            cluster_resource_id: Option<&'a RawValue>,
            #[serde(borrow, default)]
            group: Option<&'a RawValue>,
            #[serde(borrow, default)]
            labels: Option<&'a RawValue>,
            #[serde(borrow, default)]
            status: Option<&'a RawValue>,
        }
        #[derive(serde::Deserialize)]
        struct Status<'a> {
            #[serde(borrow, default)]
            cluster: Option<&'a RawValue>,
        }
        fn field<'a, T: serde::Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
            serde_json::from_str(raw?.get()).ok()
        }
        let document: Document<'_> = serde_json::from_str(text).map_err(|e| {
            ApiError::conflict(format!("stored member {name:?} is unreadable: {e}"))
        })?;
        let props: Properties<'_> = field(document.properties).unwrap_or_default();
        let cluster = match field::<Status<'_>>(props.status).and_then(|s| s.cluster) {
            Some(raw) => match self.clusters.get(raw.get()) {
                Some(known) => Some(known.clone()),
                None => serde_json::from_str::<Cluster>(raw.get()).ok().map(|c| {
                    let c = Arc::new(c);
                    self.clusters.insert(raw.get().to_string(), c.clone());
                    c
                }),
            },
            None => None,
        };
        Ok(StoredMember {
            name: Arc::from(name),
            cluster_resource_id: Arc::from(
                field::<String>(props.cluster_resource_id).unwrap_or_default(),
            ),
            group: field(props.group),
            labels: field(props.labels).unwrap_or_default(),
            cluster,
        })
    }
}

/// A run's document as JSON text: its resource without status (`base`), with `status` as
/// `properties.status`. Rendered straight to text: a 10,000-member status is never built as a
/// JSON tree first.
pub fn run_document<T: serde::Serialize>(base: &Value, status: &T) -> serde_json::Result<String> {
    use serde::ser::{Serialize, SerializeMap, Serializer};
    struct Document<'a, T>(&'a Value, &'a T);
    struct Properties<'a, T>(&'a Value, &'a T);
    impl<T: Serialize> Serialize for Document<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let fields = self.0.as_object();
            let mut map = s.serialize_map(None)?;
            for (key, value) in fields.into_iter().flatten() {
                if key == "properties" {
                    map.serialize_entry(key, &Properties(value, self.1))?;
                } else {
                    map.serialize_entry(key, value)?;
                }
            }
            if !fields.is_some_and(|f| f.contains_key("properties")) {
                map.serialize_entry("properties", &Properties(&Value::Null, self.1))?;
            }
            map.end()
        }
    }
    impl<T: Serialize> Serialize for Properties<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(None)?;
            for (key, value) in self.0.as_object().into_iter().flatten() {
                if key != "status" {
                    map.serialize_entry(key, value)?;
                }
            }
            map.serialize_entry("status", self.1)?;
            map.end()
        }
    }
    serde_json::to_string(&Document(base, status))
}

/// What a status write stores of a run (FLEET-DESIGN.md, persistence by change): the frame
/// around its members' lists, small whatever the run's size, and the chunks of its members
/// that changed since `meta` last wrote them (all of them the first time); and the run's head.
pub(super) fn status_document(
    meta: &mut RunMeta,
    engine: &Engine,
) -> serde_json::Result<(flotilla_store::RunDocument, String)> {
    let mut skeleton = engine.status_skeleton();
    if moving(engine) {
        skeleton.forecast = meta.forecast;
    }
    let around = match &meta.around {
        Some(around) => around,
        None => meta.around.insert(StatusPlace::of(&meta.base)?),
    };
    let frame = run_frame(around, &skeleton)?;
    let chunks = engine.status_chunks();
    let all = meta.chunks_written.len() != chunks.len();
    let mut changed = Vec::new();
    for (c, chunk) in chunks.iter().enumerate() {
        if !all && meta.chunks_written[c].0 == chunk.revision {
            continue;
        }
        let mut text = Vec::new();
        engine.write_status_chunk(c, &mut text)?;
        let text = String::from_utf8(text).map_err(serde::ser::Error::custom)?;
        changed.push(flotilla_store::Chunk {
            index: c as u32,
            slot: chunk.slot,
            text,
        });
    }
    if all {
        meta.chunks_written = vec![(0, 0); chunks.len()];
    }
    for chunk in &changed {
        meta.chunks_written[chunk.index as usize] =
            (chunks[chunk.index as usize].revision, chunk.text.len());
    }
    meta.status_bytes = frame.iter().map(String::len).sum::<usize>()
        + meta.chunks_written.iter().map(|&(_, n)| n).sum::<usize>();
    let document = flotilla_store::RunDocument {
        frame,
        chunks: chunks.len() as u32,
        changed,
    };
    Ok((document, crate::run_head::head_of(&skeleton)))
}

/// A run's document (as [`run_document`] renders it) around its status: the text before the
/// status's value and after it. The resource without its status never changes while a task
/// drives the run, so this is found once per run, not per write.
pub struct StatusPlace {
    pub(super) before: String,
    pub(super) after: String,
}

impl StatusPlace {
    pub fn of(base: &Value) -> serde_json::Result<StatusPlace> {
        // Two renderings that differ only in the status: where they part is where it sits.
        let zero = run_document(base, &0u8)?;
        let one = run_document(base, &1u8)?;
        let at = zero
            .bytes()
            .zip(one.bytes())
            .position(|(a, b)| a != b)
            .ok_or_else(|| {
                serde::ser::Error::custom("a run's document does not show its status")
            })?;
        Ok(StatusPlace {
            before: zero[..at].to_string(),
            after: zero[at + 1..].to_string(),
        })
    }
}

/// The run's document (as [`run_document`] renders it) with `skeleton` as its status, cut
/// right after the `[` of every group's empty `members` list: the frame of a
/// [`flotilla_store::RunDocument`]. Every key of a status is the engine's and a user's text is
/// only ever a string value, in which a `"` is escaped, so `"members":[]` in the status's text
/// is a group's list and nothing else; the count is checked all the same.
pub fn run_frame(
    around: &StatusPlace,
    skeleton: &flotilla_engine::status::UpdateRunStatus,
) -> serde_json::Result<Vec<String>> {
    const LIST: &str = r#""members":[]"#;
    let status = serde_json::to_string(skeleton)?;
    let mut frame = Vec::new();
    let mut piece = around.before.clone();
    let mut from = 0;
    for (i, _) in status.match_indices(LIST) {
        let cut = i + LIST.len() - 1;
        piece.push_str(&status[from..cut]);
        frame.push(std::mem::take(&mut piece));
        from = cut;
    }
    piece.push_str(&status[from..]);
    piece.push_str(&around.after);
    frame.push(piece);
    let groups: usize = skeleton.stages.iter().map(|s| s.groups.len()).sum();
    if frame.len() != groups + 1 {
        return Err(serde::ser::Error::custom(format!(
            "a status of {groups} groups shows {} member lists",
            frame.len() - 1
        )));
    }
    Ok(frame)
}

/// A member's status: its cluster as last seen, and when; and what is new of its last operation
/// (what it does not say, the store keeps).
pub(super) fn member_status(
    spec: &flotilla_engine::fleet::ClusterSpec,
    at: Time,
    operation: Option<Value>,
) -> Value {
    let mut status = json!({"cluster": spec, "lastObservedAt": at});
    if let (Some(s), Some(Value::Object(op))) = (status.as_object_mut(), operation) {
        s.extend(op);
    }
    status
}

/// Writes a member's latest observation into its resource (`status.cluster`).
pub async fn record_observation(
    store: &dyn Store,
    fleet: &str,
    member: &str,
    spec: &flotilla_engine::fleet::ClusterSpec,
) {
    let status = [(member.to_string(), member_status(spec, now(), None))];
    if let Err(e) = store.set_statuses(fleet, Kind::Member, &status).await {
        tracing::warn!(fleet, member, error = %e, "cannot record the member's cluster");
    }
}

/// The idempotency key of an attempt, given to the driver with the upgrade.
pub fn operation_key(fleet: &str, run: &str, attempt: u64) -> String {
    format!("{fleet}.{run}.{attempt}")
}

/// A target as stored with its intent.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TargetRecord {
    pub(super) upgrade_type: flotilla_engine::strategy::UpgradeType,
    #[serde(default)]
    pub(super) kubernetes_version: Option<String>,
    #[serde(default)]
    pub(super) node_images: Vec<(String, String, String)>,
    /// A rollback step (SEMANTICS §15): what it takes back, so a step recovered after a restart
    /// is the same step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rollback: Option<RollbackRecord>,
}

/// A rollback step's scope as recorded: a node pool (and its version after the step), or the
/// control plane when no pool is named.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RollbackRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    orchestrator_version: Option<String>,
}

impl From<&Target> for TargetRecord {
    fn from(t: &Target) -> TargetRecord {
        use flotilla_engine::fleet::RollbackScope;
        TargetRecord {
            upgrade_type: t.upgrade_type,
            kubernetes_version: t.kubernetes_version.map(|v| v.to_string()),
            node_images: t
                .node_images
                .iter()
                .map(|p| (p.pool.clone(), p.family.clone(), p.image.to_string()))
                .collect(),
            rollback: t.rollback.as_ref().map(|r| RollbackRecord {
                pool: match &r.scope {
                    RollbackScope::ControlPlane => None,
                    RollbackScope::NodePool(pool) => Some(pool.clone()),
                },
                orchestrator_version: r.orchestrator_version.map(|v| v.to_string()),
            }),
        }
    }
}

impl TargetRecord {
    pub(super) fn into_target(self) -> Target {
        Target {
            upgrade_type: self.upgrade_type,
            kubernetes_version: self
                .kubernetes_version
                .and_then(|v| flotilla_engine::version::KubeVersion::parse(&v)),
            node_images: self
                .node_images
                .into_iter()
                .filter_map(|(pool, family, image)| {
                    flotilla_engine::version::ImageVersion::parse(&image).map(|image| {
                        flotilla_engine::engine::PoolTarget {
                            pool,
                            family,
                            image,
                        }
                    })
                })
                .collect(),
            rollback: self.rollback.map(|r| flotilla_engine::engine::Rollback {
                scope: match r.pool {
                    None => flotilla_engine::fleet::RollbackScope::ControlPlane,
                    Some(pool) => flotilla_engine::fleet::RollbackScope::NodePool(pool),
                },
                orchestrator_version: r
                    .orchestrator_version
                    .and_then(|v| flotilla_engine::version::KubeVersion::parse(&v)),
            }),
        }
    }
}

#[cfg(test)]
mod target_record_tests {
    use super::*;
    use flotilla_engine::engine::{PoolTarget, Rollback};
    use flotilla_engine::fleet::RollbackScope;
    use flotilla_engine::version::{ImageVersion, KubeVersion};

    /// An intent recorded before a restart gives back the same target, a rollback step's
    /// scope included: the step recovered is the step that was sent.
    #[test]
    fn a_recorded_target_is_the_target_again() {
        let v = |t: &str| KubeVersion::parse(t).expect("version");
        let targets = [
            Target {
                upgrade_type: flotilla_engine::strategy::UpgradeType::Full,
                kubernetes_version: Some(v("1.31.2")),
                node_images: vec![PoolTarget {
                    pool: "sys".into(),
                    family: "AKSUbuntu-2204gen2containerd".into(),
                    image: ImageVersion::parse("202602.10.0").expect("image"),
                }],
                rollback: None,
            },
            Target {
                upgrade_type: flotilla_engine::strategy::UpgradeType::ControlPlaneOnly,
                kubernetes_version: Some(v("1.30.5")),
                node_images: vec![],
                rollback: Some(Rollback {
                    scope: RollbackScope::ControlPlane,
                    orchestrator_version: None,
                }),
            },
            Target {
                upgrade_type: flotilla_engine::strategy::UpgradeType::Full,
                kubernetes_version: None,
                node_images: vec![],
                rollback: Some(Rollback {
                    scope: RollbackScope::NodePool("sys".into()),
                    orchestrator_version: Some(v("1.30.5")),
                }),
            },
        ];
        for target in targets {
            let text = serde_json::to_string(&TargetRecord::from(&target)).expect("recorded");
            let back: TargetRecord = serde_json::from_str(&text).expect("read");
            assert_eq!(back.into_target(), target, "{text}");
        }
    }
}
