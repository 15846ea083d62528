//! The codec of a run's input log: what the fleet's engine gave the run, in order, so that
//! replaying it into an engine built from the run's snapshot rebuilds the run exactly.
//!
//! Every entry names its format (`v`). Entries written before formats were named have the
//! shape of format 1 and are read as it; an entry of any other format, or one this server
//! cannot read, is an error that stops the run's fleet from driving it: a log replays exactly
//! or not at all.
//!
//! Format 1, one entry per instant of a step (a row, not a row per input):
//!
//! ```text
//! {"v":1,"at":T,"input":I}                        one input (entries of older servers)
//! {"v":1,"at":T,"settle":true}                    a settle (older servers)
//! {"v":1,"at":T,"advance":true}                   time alone (older servers)
//! {"v":1,"at":T,"clusters":[C…],"do":[D…]}        what the run was given at T, in order:
//!     {"i":I}           an input
//!     {"l":[M,R]}       MemberLocked: run R holds member M
//!     {"u":M}           MemberUnlocked
//!     {"o":[M,k]}       Observed (no operation asked about): M is clusters[k]
//!     "s" / "a"         a settle / time alone
//! ```
//!
//! The compact forms are for the news one run hears of the fleet's others: a run starting
//! after 99 others is told of thousands of members they hold, and each upgrade that ends is an
//! observation for every run that selected the member. Clusters are listed once per entry.

use std::collections::HashMap;
use std::sync::Arc;

use flotilla_engine::engine::{Engine, Input};
use flotilla_engine::fleet::Cluster;
use flotilla_engine::fleet_engine::Delivered;
use flotilla_engine::time::Time;
use serde_json::Value;

/// The format this server writes, and the only one it reads.
pub const FORMAT: u64 = 1;

/// Encodes what a run was given as log entries, one per instant, written straight to text.
pub fn encode(delivered: Vec<Delivered>) -> Vec<String> {
    let mut entries = Vec::new();
    let mut open: Option<Open> = None;
    for d in delivered {
        let at = match &d {
            Delivered::Input(at, _) | Delivered::AdvanceClock(at) | Delivered::Settle(at) => *at,
        };
        if open.as_ref().is_some_and(|o| o.at != at) {
            entries.extend(open.take().map(Open::close));
        }
        let o = open.get_or_insert_with(|| Open::new(at));
        let item = match d {
            Delivered::Settle(_) => Item::Settle,
            Delivered::AdvanceClock(_) => Item::Advance,
            Delivered::Input(_, Input::MemberLocked { member, by_run }) => {
                Item::Locked(member, by_run)
            }
            Delivered::Input(_, Input::MemberUnlocked { member }) => Item::Unlocked(member),
            Delivered::Input(
                _,
                Input::Observed {
                    member,
                    cluster,
                    operation: None,
                },
            ) => Item::Observed(member, o.cluster_index(cluster)),
            Delivered::Input(_, input) => Item::Input(input),
        };
        o.items.push(item);
    }
    entries.extend(open.map(Open::close));
    entries
}

/// The entry being built for one instant.
struct Open {
    at: Time,
    clusters: ClusterList,
    items: Vec<Item>,
}

impl Open {
    fn new(at: Time) -> Open {
        Open {
            at,
            clusters: ClusterList::default(),
            items: Vec::new(),
        }
    }

    fn cluster_index(&mut self, cluster: Arc<Cluster>) -> usize {
        self.clusters.index(cluster)
    }

    fn close(self) -> String {
        #[derive(serde::Serialize)]
        struct Entry<'a> {
            v: u64,
            at: Time,
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            clusters: &'a [Arc<Cluster>],
            #[serde(rename = "do")]
            items: &'a [Item],
        }
        serde_json::to_string(&Entry {
            v: FORMAT,
            at: self.at,
            clusters: &self.clusters.list,
            items: &self.items,
        })
        .unwrap_or_default()
    }
}

/// Applies one log entry, as stored. An entry this server cannot read is an error, never
/// skipped.
pub fn replay(engine: &mut Engine, entry: &str) -> Result<(), String> {
    for d in decode(entry)? {
        match d {
            Delivered::Settle(at) => engine.settle(at),
            Delivered::AdvanceClock(at) => engine.advance_clock(at),
            // A recorded input changed the run when it was given; given again it does the same.
            Delivered::Input(at, input) => {
                let _ = engine.handle(at, input);
            }
        }
    }
    Ok(())
}

/// An entry as stored, read straight into its types (a start's news of thousands of locks is
/// never built as a JSON tree).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    #[serde(default)]
    v: Option<u64>,
    at: Time,
    #[serde(default)]
    input: Option<Input>,
    #[serde(default)]
    settle: Option<bool>,
    #[serde(default)]
    advance: Option<bool>,
    #[serde(default)]
    clusters: Vec<Cluster>,
    #[serde(default, rename = "do")]
    items: Option<Vec<Item>>,
}

/// One item of a format-1 entry's `do` list.
enum Item {
    Settle,
    Advance,
    Input(Input),
    Locked(String, Arc<str>),
    Unlocked(String),
    Observed(String, usize),
}

/// Distinct clusters listed once, as stored texts list them (a log entry, a run's snapshot):
/// each cluster handed in gets the index of the first equal one.
#[derive(Default)]
pub struct ClusterList {
    pub list: Vec<Arc<Cluster>>,
    /// By pointer (a fan-out hands every run the same one), then by value.
    by_pointer: HashMap<*const Cluster, usize>,
    by_value: HashMap<String, usize>,
    /// Every cluster handed in, held while the list lives, so no other cluster takes a listed
    /// address meanwhile.
    held: Vec<Arc<Cluster>>,
}

impl ClusterList {
    pub fn index(&mut self, cluster: Arc<Cluster>) -> usize {
        if let Some(k) = self.by_pointer.get(&Arc::as_ptr(&cluster)) {
            return *k;
        }
        let text = serde_json::to_string(&*cluster).unwrap_or_default();
        let k = match self.by_value.get(&text) {
            Some(k) => *k,
            None => {
                self.list.push(cluster.clone());
                self.by_value.insert(text, self.list.len() - 1);
                self.list.len() - 1
            }
        };
        self.by_pointer.insert(Arc::as_ptr(&cluster), k);
        self.held.push(cluster);
        k
    }
}

impl serde::Serialize for Item {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        fn one<S: serde::Serializer, T: serde::Serialize>(
            s: S,
            key: &str,
            value: &T,
        ) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry(key, value)?;
            m.end()
        }
        match self {
            Item::Settle => s.serialize_str("s"),
            Item::Advance => s.serialize_str("a"),
            Item::Input(input) => one(s, "i", input),
            Item::Locked(member, by_run) => one(s, "l", &(member, by_run)),
            Item::Unlocked(member) => one(s, "u", member),
            Item::Observed(member, k) => one(s, "o", &(member, k)),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Item {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Item, D::Error> {
        use serde::de::{Error, MapAccess, Visitor};
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Item;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#""s", "a", or one of {"i"}, {"l"}, {"u"}, {"o"}"#)
            }
            fn visit_str<E: Error>(self, s: &str) -> Result<Item, E> {
                match s {
                    "s" => Ok(Item::Settle),
                    "a" => Ok(Item::Advance),
                    other => Err(E::custom(format!("no item of kind {other:?}"))),
                }
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Item, M::Error> {
                let kind: String = m
                    .next_key()?
                    .ok_or_else(|| M::Error::custom("an empty item"))?;
                let item = match kind.as_str() {
                    "i" => Item::Input(m.next_value()?),
                    "l" => {
                        let (member, by_run) = m.next_value()?;
                        Item::Locked(member, by_run)
                    }
                    "u" => Item::Unlocked(m.next_value()?),
                    "o" => {
                        let (member, k) = m.next_value()?;
                        Item::Observed(member, k)
                    }
                    other => return Err(M::Error::custom(format!("no item of kind {other:?}"))),
                };
                if m.next_key::<String>()?.is_some() {
                    return Err(M::Error::custom(format!("an item {kind:?} with more keys")));
                }
                Ok(item)
            }
        }
        d.deserialize_any(V)
    }
}

/// What one log entry, as stored, gave the run, in order.
pub fn decode(entry: &str) -> Result<Vec<Delivered>, String> {
    if !entry.trim_start().starts_with('{') {
        return Err(format!("an entry is not a JSON object: {entry:.80}"));
    }
    let newer = |v: &dyn std::fmt::Display| {
        format!("an entry is of format {v}; this server reads format {FORMAT} only")
    };
    let stored: Stored = match serde_json::from_str(entry) {
        Ok(stored) => stored,
        // Read again for its format only when it cannot be read: an entry of a newer server
        // says so rather than naming a field it does not know.
        Err(e) => {
            #[derive(serde::Deserialize)]
            struct Format {
                #[serde(default)]
                v: Option<Value>,
            }
            if let Ok(Format { v: Some(v) }) = serde_json::from_str::<Format>(entry)
                && v.as_u64() != Some(FORMAT)
            {
                return Err(newer(&v));
            }
            return Err(format!("an entry is of no kind this server knows: {e}"));
        }
    };
    if let Some(v) = stored.v.filter(|v| *v != FORMAT) {
        return Err(newer(&v));
    }
    let at = stored.at;
    if let Some(input) = stored.input {
        return Ok(vec![Delivered::Input(at, input)]);
    }
    if stored.settle.is_some() {
        return Ok(vec![Delivered::Settle(at)]);
    }
    if stored.advance.is_some() {
        return Ok(vec![Delivered::AdvanceClock(at)]);
    }
    let Some(items) = stored.items else {
        return Err(format!("the entry at {at} is of no kind this server knows"));
    };
    let clusters: Vec<Arc<Cluster>> = stored.clusters.into_iter().map(Arc::new).collect();
    items
        .into_iter()
        .map(|item| {
            let input = match item {
                Item::Settle => return Ok(Delivered::Settle(at)),
                Item::Advance => return Ok(Delivered::AdvanceClock(at)),
                Item::Input(input) => input,
                Item::Locked(member, by_run) => Input::MemberLocked { member, by_run },
                Item::Unlocked(member) => Input::MemberUnlocked { member },
                Item::Observed(member, k) => Input::Observed {
                    cluster: clusters
                        .get(k)
                        .ok_or_else(|| {
                            format!("the entry at {at} names cluster {k} of {}", clusters.len())
                        })?
                        .clone(),
                    member,
                    operation: None,
                },
            };
            Ok(Delivered::Input(at, input))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_engine::engine::{Command, RunSpec};
    use flotilla_engine::fleet::{Catalog, KubeRelease, Member, RegionCatalog};
    use flotilla_engine::fleet_engine::{FleetEngine, FleetInput};
    use flotilla_engine::strategy::{NodeImageSelection, Upgrade, UpgradeType};
    use flotilla_engine::version::KubeVersion;
    use serde_json::json;

    fn v(text: &str) -> KubeVersion {
        KubeVersion::parse(text).expect("version")
    }

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            cluster_resource_id: format!("/c/{name}"),
            group: None,
            labels: Default::default(),
            cluster: Cluster {
                rollback: Default::default(),
                region: "eastus".into(),
                kubernetes_version: v("1.30.5"),
                node_pools: vec![],
                kubernetes_window: None,
                node_os_window: None,
                long_term_support: false,
            },
        }
    }

    fn fleet(members: &[Member]) -> (FleetEngine, Catalog) {
        let mut rc = RegionCatalog::default();
        for version in ["1.30.5", "1.31.1"] {
            rc.kubernetes.push(KubeRelease {
                version: v(version),
                preview: false,
                long_term_support: false,
                available_at: None,
            });
        }
        let mut catalog = Catalog::default();
        catalog.regions.insert("eastus".into(), rc);
        (
            FleetEngine::new(members, catalog.clone()).recording(),
            catalog,
        )
    }

    fn spec() -> RunSpec {
        RunSpec {
            strategy: None,
            rules: Default::default(),
            upgrade: Upgrade {
                upgrade_type: UpgradeType::ControlPlaneOnly,
                kubernetes_version: Some(v("1.31.1")),
                node_images: NodeImageSelection::Latest,
            },
        }
    }

    /// Two runs over the same members: the second hears of every member the first holds, and
    /// of each cluster the first upgraded. Its journal, through the codec, is what it was given
    /// and rebuilds it exactly.
    #[test]
    fn a_journal_through_the_codec_is_what_the_run_was_given() {
        let members: Vec<Member> = (0..6).map(|i| member(&format!("m{i}"))).collect();
        let (mut fleet, catalog) = fleet(&members);
        let mut journals: HashMap<String, Vec<Delivered>> = HashMap::new();
        let mut t = Time::parse("2026-12-01T00:00:00Z").expect("time");
        for run in ["a", "b"] {
            fleet
                .create_run(run, &spec(), catalog.clone())
                .expect("created");
            fleet
                .handle(
                    t,
                    FleetInput::Run {
                        run: run.into(),
                        input: Input::Start,
                    },
                )
                .expect("started");
        }
        let mut encoded: HashMap<String, Vec<String>> = HashMap::new();
        for _ in 0..40 {
            fleet.settle(t);
            let mut started = Vec::new();
            while let Some(c) = fleet.poll_command() {
                if let Command::StartUpgrade {
                    member, attempt, ..
                } = c.command
                {
                    started.push((c.run, member, attempt));
                }
            }
            while fleet.poll_event().is_some() {}
            for run in ["a", "b"] {
                let given = fleet.take_journal(run);
                encoded
                    .entry(run.into())
                    .or_default()
                    .extend(encode(given.clone()));
                journals.entry(run.into()).or_default().extend(given);
            }
            if started.is_empty() && fleet.is_finished() {
                break;
            }
            t = Time::from_unix(t.unix() + 60);
            for (run, member, attempt) in started {
                let outcome = Ok(());
                let input = Input::OperationFinished {
                    member,
                    attempt,
                    outcome,
                };
                fleet
                    .handle(t, FleetInput::Run { run, input })
                    .expect("finished");
            }
        }
        assert!(fleet.is_finished(), "both runs finish");
        let b = &journals["b"];
        let count = |want: fn(&Input) -> bool| {
            b.iter()
                .filter(|d| matches!(d, Delivered::Input(_, i) if want(i)))
                .count()
        };
        assert!(count(|i| matches!(i, Input::MemberLocked { .. })) > 0);
        assert!(
            count(|i| matches!(
                i,
                Input::Observed {
                    operation: None,
                    ..
                }
            )) > 0
        );
        assert!(count(|i| matches!(i, Input::MemberUnlocked { .. })) > 0);
        for run in ["a", "b"] {
            let entries = &encoded[run];
            // One entry per instant, not one per input.
            assert!(
                entries.len() < journals[run].len(),
                "{run}: {} entries",
                entries.len()
            );
            let decoded: Vec<Delivered> = entries
                .iter()
                .flat_map(|e| decode(&e.to_string()).expect("decoded"))
                .collect();
            assert_eq!(decoded, journals[run], "{run}");
            let (mut rebuilt, _) =
                Engine::create(run, &spec(), &members, catalog.clone()).expect("engine");
            for e in entries {
                replay(&mut rebuilt, &e.to_string()).expect("replayed");
            }
            let live = fleet.run(run).expect("run");
            assert_eq!(
                serde_json::to_value(rebuilt.status()).expect("status"),
                serde_json::to_value(live.status()).expect("status"),
                "{run}"
            );
        }
    }

    /// Clusters are listed once by value, whatever pointer each observation holds.
    #[test]
    fn an_entry_lists_each_distinct_cluster_once() {
        let t = Time::parse("2026-12-01T00:00:00Z").expect("time");
        let at = |version: &str| {
            let mut c = member("m").cluster;
            c.kubernetes_version = v(version);
            Arc::new(c)
        };
        let observed = |member: &str, cluster: Arc<Cluster>| {
            Delivered::Input(
                t,
                Input::Observed {
                    member: member.into(),
                    cluster,
                    operation: None,
                },
            )
        };
        let one = at("1.30.5");
        let given = vec![
            observed("a", one.clone()),
            observed("b", at("1.31.1")),
            observed("c", at("1.30.5")),
            observed("d", one),
            Delivered::Settle(t),
        ];
        let entries = encode(given.clone());
        assert_eq!(entries.len(), 1);
        let entry: Value = serde_json::from_str(&entries[0]).expect("json");
        assert_eq!(
            entry["clusters"].as_array().map(Vec::len),
            Some(2),
            "{entry}"
        );
        assert_eq!(entry["do"][2], json!({"o": ["c", 0]}));
        assert_eq!(entry["do"][4], json!("s"));
        assert_eq!(decode(&entries[0]).expect("decoded"), given);
    }

    #[test]
    fn entries_of_older_servers_are_read_and_unknown_ones_refused() {
        let at = "2026-12-01T00:00:00Z";
        let t = Time::parse(at).expect("time");
        let read = |v: Value| decode(&v.to_string());
        let old = read(json!({"at": at, "input": "Start"})).expect("read");
        assert_eq!(old, vec![Delivered::Input(t, Input::Start)]);
        let settle = read(json!({"at": at, "settle": true})).expect("read");
        assert_eq!(settle, vec![Delivered::Settle(t)]);
        let refused = |v: Value, says: &str| {
            let why = read(v.clone()).expect_err("refused");
            assert!(why.contains(says), "{v}: {why}");
        };
        refused(json!({"v": 2, "at": at, "do": ["s"]}), "format 2");
        refused(json!({"v": "1", "at": at, "do": ["s"]}), "format \"1\"");
        refused(json!({"v": 1, "at": at, "do": [{"x": 1}]}), "\"x\"");
        refused(json!({"v": 1, "at": at, "do": ["z"]}), "\"z\"");
        refused(
            json!({"v": 1, "at": at, "do": [{"u": "m", "l": ["m", "r"]}]}),
            "more keys",
        );
        refused(
            json!({"v": 1, "at": at, "do": [{"o": ["m", 3]}]}),
            "cluster 3",
        );
        refused(json!({"v": 1, "do": ["s"]}), "`at`");
        refused(
            json!({"v": 1, "at": at, "do": [{"i": {"Nope": 1}}]}),
            "Nope",
        );
        refused(json!({"v": 1, "at": at, "do": [], "later": true}), "later");
        refused(json!({"v": 1, "at": at}), "no kind");
        refused(json!([1]), "not a JSON object");
    }
}
