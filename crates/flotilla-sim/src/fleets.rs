//! Scenarios of several fleets (SEMANTICS §14, tests/scenarios/README.md): `fleets` maps each
//! fleet's name to a scenario body of its own sharing `start` and `until`, and the release trains
//! between them are checked when the file is read, as the API checks a profile's `upstream`
//! (400s): the upstream exists, has the same channel, and closes no cycle.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use flotilla_engine::fleet::Catalog;
use flotilla_engine::profile::Profile;
use flotilla_engine::train::{check_same_channel, cycle, profile_id};

use crate::scenario::{Action, Scenario, ScenarioError, bad};

/// Keys at the top of a scenario of several fleets; everything else belongs to a fleet.
const TOP_KEYS: [&str; 5] = ["description", "start", "until", "fleets", "expect"];

/// Keys a fleet's body may not give: they are shared, or given at the top.
const SHARED_KEYS: [&str; 4] = ["description", "start", "until", "expect"];

/// Reads a scenario with `fleets`: each fleet's body is read as a scenario of one fleet (its
/// errors prefixed with `fleets.NAME.`), with the shared `start` and `until` and its
/// expectations from `expect.fleets.NAME`.
pub(crate) fn parse_fleets(name: &str, value: Value) -> Result<Scenario, ScenarioError> {
    let Value::Object(mut top) = value else {
        return Err(ScenarioError("a scenario must be a mapping".into()));
    };
    if let Some(key) = top.keys().find(|k| !TOP_KEYS.contains(&k.as_str())) {
        return Err(bad(
            key,
            "a scenario with fleets takes only description, start, until, fleets and expect at its top: the rest belongs to each fleet",
        ));
    }
    let fleets = match top.remove("fleets") {
        Some(Value::Object(fleets)) if !fleets.is_empty() => fleets,
        _ => {
            return Err(bad(
                "fleets",
                "must map each fleet's name to its scenario (catalog, members, autoUpgradeProfiles, ...)",
            ));
        }
    };
    let expect = top.remove("expect");
    let fleet_expect = expectations(expect.as_ref(), &fleets)?;
    let description = match top.remove("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text,
        Some(_) => return Err(bad("description", "must be text")),
    };
    let mut parsed: BTreeMap<String, Scenario> = BTreeMap::new();
    for (fleet, body) in fleets {
        let path = format!("fleets.{fleet}");
        flotilla_engine::strategy::check_name(&fleet, 63).map_err(|e| bad(&path, e))?;
        let Value::Object(mut body) = body else {
            return Err(bad(&path, "must be a fleet's scenario (a mapping)"));
        };
        if let Some(key) = body.keys().find(|k| SHARED_KEYS.contains(&k.as_str())) {
            return Err(bad(
                &format!("{path}.{key}"),
                format!(
                    "is given once at the top of the scenario for every fleet (expectations under expect.fleets.{fleet})"
                ),
            ));
        }
        for key in ["start", "until"] {
            if let Some(v) = top.get(key) {
                body.insert(key.into(), v.clone());
            }
        }
        if let Some(e) = fleet_expect.get(&fleet) {
            body.insert("expect".into(), e.clone());
        }
        let mut scenario = Scenario::parse_value(name, Value::Object(body))
            .map_err(|e| ScenarioError(format!("{path}.{}", e.0)))?;
        scenario.fleet = fleet.clone();
        parsed.insert(fleet, scenario);
    }
    let order = check_trains(&parsed)?;
    let first = parsed
        .values()
        .next()
        .ok_or_else(|| bad("fleets", "names no fleet"))?;
    let (start, until) = (first.start, first.until);
    let mut fleets = Vec::with_capacity(order.len());
    for fleet in order {
        fleets.extend(parsed.remove(&fleet));
    }
    Ok(Scenario {
        name: name.to_string(),
        description,
        start,
        until,
        catalog: Catalog::default(),
        members: Vec::new(),
        behaviour: BTreeMap::new(),
        strategy: None,
        update: None,
        strategies: BTreeMap::new(),
        profiles: Vec::new(),
        releases: Vec::new(),
        actions: Vec::new(),
        member_checks: BTreeMap::new(),
        gate_checks: BTreeMap::new(),
        providers: BTreeMap::new(),
        freezes: Vec::new(),
        budgets: Vec::new(),
        expect,
        fleet: String::new(),
        pins_node_images: true,
        fleets,
    })
}

/// `expect` of a scenario with fleets: `{fleets: {NAME: <a fleet's expectations>}}`, naming
/// only fleets of the scenario.
fn expectations(
    expect: Option<&Value>,
    fleets: &Map<String, Value>,
) -> Result<Map<String, Value>, ScenarioError> {
    let Some(expect) = expect.filter(|e| !e.is_null()) else {
        return Ok(Map::new());
    };
    let Some(expect) = expect.as_object() else {
        return Err(bad("expect", "must be {fleets: {NAME: ...}}"));
    };
    if let Some(key) = expect.keys().find(|k| *k != "fleets") {
        return Err(bad(
            &format!("expect.{key}"),
            "a scenario with fleets expects per fleet: under expect.fleets.NAME",
        ));
    }
    let per_fleet = match expect.get("fleets") {
        None => return Ok(Map::new()),
        Some(Value::Object(per_fleet)) => per_fleet.clone(),
        Some(_) => return Err(bad("expect.fleets", "must map fleet names to expectations")),
    };
    if let Some(fleet) = per_fleet.keys().find(|f| !fleets.contains_key(*f)) {
        return Err(bad(
            &format!("expect.fleets.{fleet}"),
            format!("is not a fleet of the scenario ({})", names(fleets.keys())),
        ));
    }
    Ok(per_fleet)
}

fn names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    names.map(String::as_str).collect::<Vec<_>>().join(", ")
}

/// Checks every profile's upstream as the API does (SEMANTICS §14): it names a profile of a
/// fleet of the scenario, with the same channel, closing no cycle. Answers the order in which
/// to simulate the fleets: each after the fleets it follows (the simulator needs an upstream
/// fleet's runs over the whole horizon before its downstream fleet), names in order otherwise.
fn check_trains(fleets: &BTreeMap<String, Scenario>) -> Result<Vec<String>, ScenarioError> {
    let profile = |fleet: &str, name: &str| -> Option<&Profile> {
        fleets
            .get(fleet)?
            .profiles
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.profile)
    };
    let upstream_of = |id: &str| -> Option<String> {
        let (fleet, name) = flotilla_engine::train::split_profile_id(id)?;
        profile(&fleet, &name)?
            .upstream
            .as_ref()
            .map(|u| u.profile_id())
    };
    let mut follows: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (fleet, scenario) in fleets {
        follows.entry(fleet).or_default();
        for p in &scenario.profiles {
            let at = format!("fleets.{fleet}.autoUpgradeProfiles.{}", p.name);
            check_upstream(fleets, fleet, &at, &p.profile, &upstream_of, &p.name)?;
            if let Some(up) = &p.profile.upstream {
                follows.entry(fleet).or_default().insert(up.fleet.as_str());
            }
        }
        // An edited profile keeps its upstream: the order of the fleets depends on it.
        for (i, a) in scenario.actions.iter().enumerate() {
            let Action::UpdateProfile {
                profile: name,
                parsed,
                ..
            } = &a.action
            else {
                continue;
            };
            let at = format!("fleets.{fleet}.actions[{i}].properties");
            let declared = scenario
                .profiles
                .iter()
                .find(|p| &p.name == name)
                .and_then(|p| p.profile.upstream.as_ref());
            let key = |u: &flotilla_engine::train::Upstream| u.profile_id();
            if parsed.upstream.as_ref().map(key) != declared.map(key) {
                return Err(bad(
                    &format!("{at}.upstream"),
                    format!(
                        "updateProfile must keep profile {name:?}'s upstream profile (its soak may change): the simulator runs each fleet after the fleets it follows"
                    ),
                ));
            }
            check_upstream(fleets, fleet, &at, parsed, &upstream_of, name)?;
        }
    }
    // Fleets in upstream order (Kahn), names in order among those ready together.
    let mut order = Vec::new();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    while done.len() < follows.len() {
        let ready: Vec<&str> = follows
            .iter()
            .filter(|(f, ups)| !done.contains(*f) && ups.iter().all(|u| done.contains(u)))
            .map(|(f, _)| *f)
            .collect();
        if ready.is_empty() {
            let left: Vec<&str> = follows
                .keys()
                .filter(|f| !done.contains(*f))
                .copied()
                .collect();
            return Err(bad(
                "fleets",
                format!(
                    "fleets {} follow profiles of each other: the simulator runs each fleet after the fleets it follows, so their upstreams must not go round the fleets",
                    left.join(", ")
                ),
            ));
        }
        for f in ready {
            done.insert(f);
            order.push(f.to_string());
        }
    }
    Ok(order)
}

/// One profile's upstream, checked as the API checks it (SEMANTICS §14); `at` is where the
/// profile's properties are written.
fn check_upstream(
    fleets: &BTreeMap<String, Scenario>,
    fleet: &str,
    at: &str,
    profile: &Profile,
    upstream_of: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<(), ScenarioError> {
    let Some(up) = &profile.upstream else {
        return Ok(());
    };
    let path = format!("{at}.upstream.profileId");
    let id = up.profile_id();
    let Some(up_fleet) = fleets.get(&up.fleet) else {
        return Err(bad(
            &path,
            format!(
                "{id:?} names fleet {:?}, which is not a fleet of the scenario ({})",
                up.fleet,
                names(fleets.keys())
            ),
        ));
    };
    let Some(up_profile) = up_fleet.profiles.iter().find(|p| p.name == up.profile) else {
        let has: Vec<&String> = up_fleet.profiles.iter().map(|p| &p.name).collect();
        return Err(bad(
            &path,
            format!(
                "{id:?} names profile {:?}, which fleet {:?} does not have ({})",
                up.profile,
                up.fleet,
                if has.is_empty() {
                    "it has none".to_string()
                } else {
                    names(has.into_iter())
                }
            ),
        ));
    };
    if let Some(around) = cycle(&profile_id(fleet, name), &id, upstream_of) {
        return Err(bad(
            &path,
            format!("closes a cycle of upstreams: {}", around.join(" → ")),
        ));
    }
    check_same_channel(profile, &up_profile.profile).map_err(|e| {
        bad(
            &format!("{at}.channel"),
            e.message
                .split_once(": ")
                .map_or(e.message.as_str(), |(_, m)| m),
        )
    })?;
    if up.fleet == fleet {
        return Err(bad(
            &path,
            format!(
                "{id:?} is a profile of the same fleet: the simulator runs each fleet after the fleets it follows, so an upstream must be in another fleet"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Scenario;

    /// A scenario of fleets `a` and `b` whose profiles are given.
    fn fleets(a: &str, b: &str) -> String {
        let fleet = |profiles: &str| {
            format!(
                r#"
    catalog: {{eastus: {{kubernetes: [{{version: "1.31.2"}}]}}}}
    members: [{{name: m, region: eastus, kubernetesVersion: "1.31.2"}}]
    autoUpgradeProfiles: {profiles}"#
            )
        };
        format!(
            "start: 2026-03-02T00:00:00Z\nfleets:\n  a:{}\n  b:{}\n",
            fleet(a),
            fleet(b)
        )
    }

    fn refused(yaml: &str) -> String {
        match Scenario::parse("s", yaml) {
            Ok(_) => panic!("accepted: {yaml}"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn a_train_between_fleets_is_read_in_upstream_order() {
        let scenario = Scenario::parse(
            "s",
            &fleets(
                "{rapid: {channel: Rapid, upstream: {profileId: /v1/fleets/b/autoUpgradeProfiles/rapid}}}",
                "{rapid: {channel: Rapid}}",
            ),
        )
        .expect("parses");
        let order: Vec<&str> = scenario.fleets.iter().map(|f| f.fleet.as_str()).collect();
        assert_eq!(order, ["b", "a"]);
        let up = scenario.fleets[1].profiles[0].profile.upstream.as_ref();
        assert_eq!(up.map(|u| u.soak_seconds), Some(7 * 24 * 3600));
    }

    #[test]
    fn an_upstream_that_does_not_exist_is_refused() {
        let e = refused(&fleets(
            "{rapid: {channel: Rapid, upstream: {profileId: /v1/fleets/c/autoUpgradeProfiles/rapid}}}",
            "{rapid: {channel: Rapid}}",
        ));
        assert!(
            e.starts_with("fleets.a.autoUpgradeProfiles.rapid.upstream.profileId: ")
                && e.contains("names fleet \"c\", which is not a fleet of the scenario (a, b)"),
            "{e}"
        );
        let e = refused(&fleets(
            "{rapid: {channel: Rapid, upstream: {profileId: /v1/fleets/b/autoUpgradeProfiles/slow}}}",
            "{rapid: {channel: Rapid}}",
        ));
        assert!(
            e.starts_with("fleets.a.autoUpgradeProfiles.rapid.upstream.profileId: ")
                && e.contains("names profile \"slow\", which fleet \"b\" does not have (rapid)"),
            "{e}"
        );
    }

    #[test]
    fn a_channel_mismatch_is_refused() {
        let e = refused(&fleets(
            "{stable: {channel: Stable, upstream: {profileId: /v1/fleets/b/autoUpgradeProfiles/rapid}}}",
            "{rapid: {channel: Rapid}}",
        ));
        assert_eq!(
            e,
            "fleets.a.autoUpgradeProfiles.stable.channel: Stable must be the upstream profile's channel (Rapid)"
        );
        let e = refused(&fleets(
            r#"{p: {channel: TargetKubernetesVersion, targetKubernetesVersion: "1.30", upstream: {profileId: /v1/fleets/b/autoUpgradeProfiles/p}}}"#,
            r#"{p: {channel: TargetKubernetesVersion, targetKubernetesVersion: "1.31"}}"#,
        ));
        assert!(e.contains("TargetKubernetesVersion 1.30 must be the upstream profile's channel (TargetKubernetesVersion 1.31)"), "{e}");
    }

    #[test]
    fn a_cycle_of_upstreams_is_refused_naming_it() {
        let e = refused(&fleets(
            "{rapid: {channel: Rapid, upstream: {profileId: /v1/fleets/b/autoUpgradeProfiles/rapid}}}",
            "{rapid: {channel: Rapid, upstream: {profileId: /v1/fleets/a/autoUpgradeProfiles/rapid}}}",
        ));
        assert_eq!(
            e,
            "fleets.a.autoUpgradeProfiles.rapid.upstream.profileId: closes a cycle of upstreams: /v1/fleets/a/autoUpgradeProfiles/rapid → /v1/fleets/b/autoUpgradeProfiles/rapid → /v1/fleets/a/autoUpgradeProfiles/rapid"
        );
        // A profile its own upstream.
        let e = refused(&fleets(
            "{rapid: {channel: Rapid, upstream: {profileId: /v1/fleets/a/autoUpgradeProfiles/rapid}}}",
            "{rapid: {channel: Rapid}}",
        ));
        assert!(e.contains("closes a cycle of upstreams"), "{e}");
    }

    #[test]
    fn what_the_simulator_cannot_order_is_refused() {
        // Fleets following each other through different profiles: no cycle of profiles, but no
        // fleet can be simulated first.
        let e = refused(&fleets(
            "{x: {channel: Rapid, upstream: {profileId: /v1/fleets/b/autoUpgradeProfiles/x}}, y: {channel: Rapid}}",
            "{x: {channel: Rapid}, y: {channel: Rapid, upstream: {profileId: /v1/fleets/a/autoUpgradeProfiles/y}}}",
        ));
        assert!(
            e.starts_with("fleets: fleets a, b follow profiles of each other"),
            "{e}"
        );
        // An upstream in the same fleet.
        let e = refused(&fleets(
            "{x: {channel: Rapid, upstream: {profileId: /v1/fleets/a/autoUpgradeProfiles/y}}, y: {channel: Rapid}}",
            "{x: {channel: Rapid}}",
        ));
        assert!(e.contains("is a profile of the same fleet"), "{e}");
    }

    #[test]
    fn shared_keys_and_expectations_are_checked() {
        let base = fleets("{rapid: {channel: Rapid}}", "{rapid: {channel: Rapid}}");
        let e = refused(&base.replace("  b:\n", "  b:\n    until: 2d\n"));
        assert!(
            e.starts_with("fleets.b.until: is given once at the top"),
            "{e}"
        );
        let e = refused(&format!("{base}expect: {{fleets: {{c: {{}}}}}}\n"));
        assert!(
            e.starts_with("expect.fleets.c: is not a fleet of the scenario (a, b)"),
            "{e}"
        );
        let e = refused(&format!("{base}expect: {{run: {{state: Completed}}}}\n"));
        assert!(e.starts_with("expect.run: "), "{e}");
        let e = refused(&format!("{base}members: []\n"));
        assert!(e.starts_with("members: "), "{e}");
        // An error inside a fleet names the fleet.
        let e = refused(&base.replace(
            "kubernetesVersion: \"1.31.2\"}]\n",
            "kubernetesVersion: \"x\"}]\n",
        ));
        assert!(
            e.starts_with("fleets.a.members[0].kubernetesVersion"),
            "{e}"
        );
    }

    #[test]
    fn a_scenario_of_one_fleet_has_no_upstream_to_follow() {
        let yaml = r#"
start: 2026-03-02T00:00:00Z
catalog: {eastus: {kubernetes: [{version: "1.31.2"}]}}
members: [{name: m, region: eastus, kubernetesVersion: "1.31.2"}]
autoUpgradeProfiles: {rapid: {channel: Rapid, upstream: {profileId: /v1/fleets/dev/autoUpgradeProfiles/rapid}}}
"#;
        let e = refused(yaml);
        assert!(
            e.starts_with("autoUpgradeProfiles.rapid.upstream: a scenario of one fleet"),
            "{e}"
        );
    }
}
