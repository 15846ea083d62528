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
use serde_json::{Value, json};

/// The format this server writes, and the only one it reads.
pub const FORMAT: u64 = 1;

/// Encodes what a run was given as log entries: one per instant.
pub fn encode(delivered: Vec<Delivered>) -> Vec<Value> {
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
            Delivered::Settle(_) => json!("s"),
            Delivered::AdvanceClock(_) => json!("a"),
            Delivered::Input(_, Input::MemberLocked { member, by_run }) => {
                json!({"l": [member, by_run]})
            }
            Delivered::Input(_, Input::MemberUnlocked { member }) => json!({"u": member}),
            Delivered::Input(
                _,
                Input::Observed {
                    member,
                    cluster,
                    operation: None,
                },
            ) => json!({"o": [member, o.cluster_index(cluster)]}),
            Delivered::Input(_, input) => json!({ "i": input }),
        };
        o.items.push(item);
    }
    entries.extend(open.map(Open::close));
    entries
}

/// The entry being built for one instant.
struct Open {
    at: Time,
    clusters: Vec<Value>,
    /// Clusters listed, by pointer (a fan-out hands every run the same one) and by value.
    by_pointer: HashMap<*const Cluster, usize>,
    by_value: HashMap<String, usize>,
    items: Vec<Value>,
}

impl Open {
    fn new(at: Time) -> Open {
        Open {
            at,
            clusters: Vec::new(),
            by_pointer: HashMap::new(),
            by_value: HashMap::new(),
            items: Vec::new(),
        }
    }

    fn cluster_index(&mut self, cluster: Arc<Cluster>) -> usize {
        if let Some(k) = self.by_pointer.get(&Arc::as_ptr(&cluster)) {
            return *k;
        }
        let value = json!(cluster);
        let text = value.to_string();
        let k = *self.by_value.entry(text).or_insert_with(|| {
            self.clusters.push(value);
            self.clusters.len() - 1
        });
        self.by_pointer.insert(Arc::as_ptr(&cluster), k);
        k
    }

    fn close(self) -> Value {
        if self.clusters.is_empty() {
            json!({"v": FORMAT, "at": self.at, "do": self.items})
        } else {
            json!({"v": FORMAT, "at": self.at, "clusters": self.clusters, "do": self.items})
        }
    }
}

/// Applies one log entry. An entry this server cannot read is an error, never skipped.
pub fn replay(engine: &mut Engine, entry: Value) -> Result<(), String> {
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

/// What one log entry gave the run, in order.
pub fn decode(mut entry: Value) -> Result<Vec<Delivered>, String> {
    match &entry["v"] {
        Value::Null => {}
        v if v.as_u64() == Some(FORMAT) => {}
        v => {
            return Err(format!(
                "an entry is of format {v}; this server reads format {FORMAT} only"
            ));
        }
    }
    let at = entry["at"]
        .as_str()
        .and_then(|t| Time::parse(t).ok())
        .ok_or_else(|| format!("an entry has no readable time: {entry}"))?;
    if entry.get("settle").is_some() {
        return Ok(vec![Delivered::Settle(at)]);
    }
    if entry.get("advance").is_some() {
        return Ok(vec![Delivered::AdvanceClock(at)]);
    }
    if let Some(input) = entry.get_mut("input") {
        return Ok(vec![Delivered::Input(at, read_input(input.take(), at)?)]);
    }
    let clusters: Vec<Arc<Cluster>> = match entry.get_mut("clusters") {
        None => Vec::new(),
        Some(c) => serde_json::from_value::<Vec<Cluster>>(c.take())
            .map_err(|e| format!("the clusters of the entry at {at} are unreadable: {e}"))?
            .into_iter()
            .map(Arc::new)
            .collect(),
    };
    let Some(Value::Array(items)) = entry.get_mut("do").map(Value::take) else {
        return Err(format!("the entry at {at} is of no kind this server knows"));
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let unknown =
            || format!("an item of the entry at {at} is of no kind this server knows: {item}");
        let input = match &item {
            Value::String(s) if s == "s" => {
                out.push(Delivered::Settle(at));
                continue;
            }
            Value::String(s) if s == "a" => {
                out.push(Delivered::AdvanceClock(at));
                continue;
            }
            Value::Object(o) if o.len() == 1 => {
                let (kind, value) = o.iter().next().ok_or_else(unknown)?;
                match (kind.as_str(), value) {
                    ("i", input) => read_input(input.clone(), at)?,
                    ("l", Value::Array(pair)) => match pair.as_slice() {
                        [Value::String(member), Value::String(by_run)] => Input::MemberLocked {
                            member: member.clone(),
                            by_run: by_run.clone(),
                        },
                        _ => return Err(unknown()),
                    },
                    ("u", Value::String(member)) => Input::MemberUnlocked {
                        member: member.clone(),
                    },
                    ("o", Value::Array(pair)) => match pair.as_slice() {
                        [Value::String(member), k] => Input::Observed {
                            member: member.clone(),
                            cluster: k
                                .as_u64()
                                .and_then(|k| clusters.get(k as usize))
                                .ok_or_else(unknown)?
                                .clone(),
                            operation: None,
                        },
                        _ => return Err(unknown()),
                    },
                    _ => return Err(unknown()),
                }
            }
            _ => return Err(unknown()),
        };
        out.push(Delivered::Input(at, input));
    }
    Ok(out)
}

fn read_input(input: Value, at: Time) -> Result<Input, String> {
    serde_json::from_value::<Input>(input)
        .map_err(|e| format!("an entry at {at} is not an input this engine knows: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_engine::engine::{Command, RunSpec};
    use flotilla_engine::fleet::{Catalog, KubeRelease, Member, RegionCatalog};
    use flotilla_engine::fleet_engine::{FleetEngine, FleetInput};
    use flotilla_engine::strategy::{NodeImageSelection, Upgrade, UpgradeType};
    use flotilla_engine::version::KubeVersion;

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
        let mut encoded: HashMap<String, Vec<Value>> = HashMap::new();
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
                .flat_map(|e| {
                    let text = e.to_string();
                    decode(serde_json::from_str(&text).expect("json")).expect("decoded")
                })
                .collect();
            assert_eq!(decoded, journals[run], "{run}");
            let (mut rebuilt, _) =
                Engine::create(run, &spec(), &members, catalog.clone()).expect("engine");
            for e in entries {
                replay(&mut rebuilt, e.clone()).expect("replayed");
            }
            let live = fleet.run(run).expect("run");
            assert_eq!(
                serde_json::to_value(rebuilt.status()).expect("status"),
                serde_json::to_value(live.status()).expect("status"),
                "{run}"
            );
        }
    }

    #[test]
    fn entries_of_older_servers_are_read_and_unknown_ones_refused() {
        let at = "2026-12-01T00:00:00Z";
        let old = json!({"at": at, "input": "Start"});
        let t = Time::parse(at).expect("time");
        assert_eq!(
            decode(old).expect("read"),
            vec![Delivered::Input(t, Input::Start)]
        );
        assert_eq!(
            decode(json!({"at": at, "settle": true})).expect("read"),
            vec![Delivered::Settle(t)]
        );
        let newer = decode(json!({"v": 2, "at": at, "do": ["s"]})).expect_err("refused");
        assert!(newer.contains("format 2"), "{newer}");
        let odd = decode(json!({"v": 1, "at": at, "do": [{"x": 1}]})).expect_err("refused");
        assert!(odd.contains("no kind"), "{odd}");
        let missing =
            decode(json!({"v": 1, "at": at, "do": [{"o": ["m", 3]}]})).expect_err("refused");
        assert!(missing.contains("no kind"), "{missing}");
        let no_time = decode(json!({"v": 1, "do": ["s"]})).expect_err("refused");
        assert!(no_time.contains("time"), "{no_time}");
        let bad_input =
            decode(json!({"v": 1, "at": at, "do": [{"i": {"Nope": 1}}]})).expect_err("refused");
        assert!(bad_input.contains("not an input"), "{bad_input}");
    }
}
