//! `flotilla simulate --check`: compares a result document with a scenario's `expect`, key by
//! key, as `tests/conformance/check.py` does. Returns one line per difference.

use std::collections::BTreeMap;

use serde_json::Value;

use flotilla_engine::time::Time;

use crate::scenario::Scenario;

fn state_of(node: &Value) -> Option<&str> {
    node.get("status")
        .and_then(|s| s.get("state"))
        .or_else(|| node.get("state"))
        .and_then(Value::as_str)
}

fn failure_count_of(node: &Value) -> Option<&Value> {
    node.get("failureCount")
        .or_else(|| node.get("status").and_then(|s| s.get("failureCount")))
}

fn time_of(v: &Value) -> Option<Time> {
    v.as_str().and_then(|s| Time::parse(s).ok())
}

fn cmp(errors: &mut Vec<String>, label: String, got: Option<Value>, want: &Value) {
    let got = got.unwrap_or(Value::Null);
    if &got != want {
        errors.push(format!("{label}: expected {want}, got {got}"));
    }
}

fn image_version(full: &str) -> &str {
    full.rsplit_once('-').map_or(full, |(_, v)| v)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The fleet-wide scopes a member counts in besides `fleet`: `budget:NAME` and
/// `budget:NAME/VALUE` for each budget declared at `start` that covers it (SEMANTICS §12).
pub type BudgetScopes = BTreeMap<String, Vec<String>>;

/// The budget scopes of a scenario's members.
pub fn budget_scopes(scenario: &Scenario) -> BudgetScopes {
    scenario
        .members
        .iter()
        .map(|m| {
            let scopes = scenario
                .budgets
                .iter()
                .filter(|b| b.selector.as_ref().is_none_or(|s| s.matches(&m.labels)))
                .flat_map(|b| {
                    let value = b.per_value_of.as_ref().map_or("", |per| {
                        per.value_in(&m.cluster.region, m.group.as_deref(), &m.labels)
                    });
                    [
                        format!("budget:{}", b.name),
                        format!("budget:{}/{value}", b.name),
                    ]
                })
                .collect();
            (m.name.clone(), scopes)
        })
        .collect()
}

/// Compares a scenario's `result` (the `--json` document) with its expectations. Empty means
/// every expectation held.
pub fn check_scenario(scenario: &Scenario, result: &Value) -> Vec<String> {
    if !scenario.fleets.is_empty() {
        // Several fleets (SEMANTICS §14): each fleet's expectations against its document.
        let mut errors = Vec::new();
        for fleet in &scenario.fleets {
            if fleet.expect.is_none() {
                continue;
            }
            let Some(document) = result["fleets"].get(&fleet.fleet) else {
                errors.push(format!("fleets.{}: no result for this fleet", fleet.fleet));
                continue;
            };
            for e in check_scenario(fleet, document) {
                errors.push(format!("fleets.{}.{e}", fleet.fleet));
            }
        }
        return errors;
    }
    let expect = scenario.expect.as_ref().unwrap_or(&Value::Null);
    check_with(expect, result, &budget_scopes(scenario))
}

/// Compares `result` (the `--json` document) with `expect`, for a fleet with no budgets.
/// Empty means every expectation held.
pub fn check(expect: &Value, result: &Value) -> Vec<String> {
    check_with(expect, result, &BudgetScopes::new())
}

fn check_with(expect: &Value, result: &Value, budgets: &BudgetScopes) -> Vec<String> {
    let empty = serde_json::Map::new();
    let exp = expect.as_object().unwrap_or(&empty);
    let mut errors = check_run(exp, result, result, budgets);
    check_profiles(exp, result, &mut errors);
    check_runs(exp, result, &mut errors, budgets);
    errors
}

/// The expectations of one run: `result` holds its `run`, `events` and `createError` (the
/// whole document for the run of `update`, a sub-document for one under `runs`); `full` is the
/// whole document, for what is counted over every run (`pendingMessages`, fleet-wide scopes).
fn check_run(
    exp: &serde_json::Map<String, Value>,
    result: &Value,
    full: &Value,
    budgets: &BudgetScopes,
) -> Vec<String> {
    let mut errors = Vec::new();
    let create_error = result.get("createError").filter(|v| !v.is_null());
    if let Some(want) = exp
        .get("createError")
        .filter(|v| !v.is_null() && *v != &Value::Bool(false))
    {
        let Some(got) = create_error else {
            return vec![
                "run was created, but the scenario expects it to be rejected at creation".into(),
            ];
        };
        if let Some(mentions) = want.get("mentions").and_then(Value::as_str) {
            let body = got.to_string();
            if !body.contains(mentions) {
                errors.push(format!("createError should mention {mentions:?} (in its code, message or target); got {body}"));
            }
        }
        return errors;
    }
    if let Some(got) = create_error {
        return vec![format!("run was rejected at creation: {got}")];
    }
    check_pending_messages(exp, full, &mut errors);
    let Some(run) = result.get("run").filter(|v| !v.is_null()) else {
        // A profile scenario without a hand-made run: only the keys about profiles apply.
        if let Some(key) = exp.keys().find(|k| !GLOBAL_KEYS.contains(&k.as_str())) {
            errors.push(format!(
                "{key}: the scenario has no hand-made run (put expectations on generated runs under runs)"
            ));
        }
        return errors;
    };
    let status = &run["properties"]["status"];
    let mut stages = BTreeMap::new();
    let mut groups = BTreeMap::new();
    let mut members = BTreeMap::new();
    for st in status["stages"].as_array().into_iter().flatten() {
        stages.insert(text(&st["name"]), st);
        for g in st["groups"].as_array().into_iter().flatten() {
            groups.insert(text(&g["name"]), g);
            for m in g["members"].as_array().into_iter().flatten() {
                members.insert(text(&m["name"]), m);
            }
        }
    }
    if let Some(want) = exp.get("run").and_then(Value::as_object) {
        for (k, v) in want {
            let got = if k == "state" {
                state_of(status).map(|s| Value::String(s.into()))
            } else {
                failure_count_of(status).cloned()
            };
            cmp(&mut errors, format!("run.{k}"), got, v);
        }
    }
    for (kind, table) in [("stages", &stages), ("groups", &groups)] {
        for (name, want) in exp
            .get(kind)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let Some(node) = table.get(name) else {
                cmp(
                    &mut errors,
                    format!("{kind}.{name}"),
                    Some(Value::String("missing from the run status".into())),
                    &Value::Null,
                );
                continue;
            };
            for (k, v) in want.as_object().into_iter().flatten() {
                let got = if k == "state" {
                    state_of(node).map(|s| Value::String(s.into()))
                } else {
                    failure_count_of(node).cloned()
                };
                cmp(&mut errors, format!("{kind}.{name}.{k}"), got, v);
            }
        }
    }
    for (name, want) in exp
        .get("members")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let node = members.get(name);
        if want.as_str() == Some("Absent") {
            if node.is_some() {
                cmp(
                    &mut errors,
                    format!("members.{name}"),
                    Some(Value::String("part of the run".into())),
                    want,
                );
            }
            continue;
        }
        match node {
            None => cmp(
                &mut errors,
                format!("members.{name}"),
                Some(Value::String("missing from the run status".into())),
                want,
            ),
            Some(node) => cmp(
                &mut errors,
                format!("members.{name}.state"),
                state_of(node).map(|s| Value::String(s.into())),
                want,
            ),
        }
    }
    for (name, want) in exp
        .get("memberMessages")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let want = text(want);
        let got = members.get(name).map(|m| {
            [&m["message"], &m["status"]["error"]["message"]]
                .into_iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" | ")
        });
        match got {
            Some(g) if g.contains(&want) => {}
            got => errors.push(format!(
                "memberMessages.{name}: expected a message containing {want:?}, got {:?}",
                got.unwrap_or_else(|| "no such member".into())
            )),
        }
    }
    // The `to` of every hop sent to a member, in order (SEMANTICS §13), as check.py reads it.
    for (name, want) in exp
        .get("memberHops")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let hops = members
            .get(name)
            .and_then(|m| m["hops"].as_array())
            .into_iter()
            .flatten()
            .map(|h| h["to"].clone())
            .collect();
        let want = Value::Array(
            want.as_array()
                .into_iter()
                .flatten()
                .map(|v| Value::String(text(v)))
                .collect(),
        );
        cmp(
            &mut errors,
            format!("memberHops.{name}"),
            Some(Value::Array(hops)),
            &want,
        );
    }
    // Whether each member was rolled back (SEMANTICS §15), as check.py reads it: the member's
    // `rolledBack`, else its status's, else false.
    for (name, want) in exp
        .get("rolledBack")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let member = members.get(name);
        let got = member
            .and_then(|m| {
                m.get("rolledBack")
                    .or_else(|| m["status"].get("rolledBack"))
            })
            .cloned()
            .unwrap_or(Value::Bool(false));
        cmp(&mut errors, format!("rolledBack.{name}"), Some(got), want);
    }
    // Additions for checks (tests/scenarios/README.md): error codes of members, groups and
    // stages ("member:m1"), and the state of the first gate at a place ("prod/Before",
    // "prod/g/After").
    for (key, want) in exp
        .get("errorCodes")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let node = match key.split_once(':') {
            Some(("member", name)) => members.get(name),
            Some(("group", name)) => groups.get(name),
            Some(("stage", name)) => stages.get(name),
            _ => None,
        };
        let got = node.and_then(|n| {
            n["status"]["error"]["code"]
                .as_str()
                .map(|c| Value::String(c.into()))
        });
        cmp(&mut errors, format!("errorCodes[{key}]"), got, want);
    }
    for (key, want) in exp
        .get("gates")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let parts: Vec<&str> = key.split('/').collect();
        let (node, timing) = match parts.as_slice() {
            [stage, timing] => (stages.get(*stage), *timing),
            [_, group, timing] => (groups.get(*group), *timing),
            _ => (None, ""),
        };
        let list = if timing == "Before" {
            "beforeGates"
        } else {
            "afterGates"
        };
        let got = node
            .and_then(|n| n[list].get(0))
            .and_then(state_of)
            .map(|s| Value::String(s.into()));
        cmp(&mut errors, format!("gates[{key}]"), got, want);
    }
    for (name, want) in exp
        .get("memberCompletedAt")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let got = members
            .get(name)
            .and_then(|m| m["status"]["completedTime"].as_str());
        if got.and_then(|g| Time::parse(g).ok()) != time_of(want) {
            errors.push(format!(
                "memberCompletedAt.{name}: expected {want}, got {}",
                got.unwrap_or("nothing")
            ));
        }
    }
    let events: Vec<&Value> = result["events"].as_array().into_iter().flatten().collect();
    // Addition for refusals (tests/scenarios/README.md): the codes of the actions refused on
    // this run, in order.
    if let Some(want) = exp.get("rejected") {
        let got: Vec<Value> = events
            .iter()
            .filter(|e| e["type"] == "ActionRejected")
            .map(|e| e["error"]["code"].clone())
            .collect();
        cmp(
            &mut errors,
            "rejected".into(),
            Some(Value::Array(got)),
            want,
        );
    }
    for name in exp
        .get("neverPending")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(text)
    {
        if let Some(e) = events
            .iter()
            .find(|e| e["type"] == "MemberPending" && text(&e["member"]) == name)
        {
            errors.push(format!(
                "neverPending: {name} was Pending at {}: {}",
                text(&e["time"]),
                text(&e["message"])
            ));
        }
    }
    // Peak in flight per `stage:X` and `group:Y`.
    let mut current: BTreeMap<String, i64> = BTreeMap::new();
    let mut peak: BTreeMap<String, i64> = BTreeMap::new();
    let mut place: BTreeMap<String, [String; 2]> = BTreeMap::new();
    let mut starts: BTreeMap<String, Vec<Time>> = BTreeMap::new();
    for e in &events {
        let kind = e["type"].as_str().unwrap_or_default();
        let member = text(&e["member"]);
        match kind {
            "MemberStarted" | "MemberReattached" => {
                let keys = [
                    format!("stage:{}", text(&e["stage"])),
                    format!("group:{}", text(&e["group"])),
                ];
                for k in &keys {
                    let c = current.entry(k.clone()).or_default();
                    *c += 1;
                    let p = peak.entry(k.clone()).or_default();
                    *p = (*p).max(*c);
                }
                place.insert(member.clone(), keys);
                if kind == "MemberStarted"
                    && let Some(t) = time_of(&e["time"])
                {
                    starts.entry(member).or_default().push(t);
                }
            }
            "MemberSucceeded" | "MemberFailed" | "MemberStopped" => {
                if let Some(keys) = place.remove(&member) {
                    for k in keys {
                        *current.entry(k).or_default() -= 1;
                    }
                }
            }
            _ => {}
        }
    }
    let scoped: Vec<&str> = ["maxInFlight", "inFlightAtMost"]
        .into_iter()
        .flat_map(|k| exp.get(k).and_then(Value::as_object).into_iter().flatten())
        .map(|(key, _)| key.as_str())
        .filter(|key| is_fleet_scope(key))
        .collect();
    if !scoped.is_empty() {
        peak.extend(fleet_peaks(full, &scoped, budgets));
    }
    for (key, want) in exp
        .get("maxInFlight")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        cmp(
            &mut errors,
            format!("maxInFlight[{key}]"),
            Some(Value::from(peak.get(key).copied().unwrap_or(0))),
            want,
        );
    }
    for (key, bound) in exp
        .get("inFlightAtMost")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let got = peak.get(key).copied().unwrap_or(0);
        if bound.as_i64().is_some_and(|b| got > b) {
            errors.push(format!("inFlightAtMost[{key}]: peak {got} exceeds {bound}"));
        }
    }
    let order: Vec<String> = exp
        .get("startsInOrder")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    for pair in order.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        match (
            starts.get(a).and_then(|v| v.first()),
            starts.get(b).and_then(|v| v.first()),
        ) {
            (Some(ta), Some(tb)) if ta < tb => {}
            (Some(ta), Some(tb)) => errors.push(format!(
                "startsInOrder: {a} ({ta}) should start strictly before {b} ({tb})"
            )),
            (None, _) => errors.push(format!("startsInOrder: {a} never started")),
            (_, None) => errors.push(format!("startsInOrder: {b} never started")),
        }
    }
    for (name, when) in exp
        .get("notStartedBefore")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let Some(t) = time_of(when) else {
            errors.push(format!("notStartedBefore.{name}: {when} is not a time"));
            continue;
        };
        match starts.get(name).and_then(|v| v.first()) {
            None => errors.push(format!("notStartedBefore.{name}: never started")),
            Some(s) if *s < t => errors.push(format!(
                "notStartedBefore.{name}: started at {s}, before {t}"
            )),
            Some(_) => {}
        }
    }
    for name in exp
        .get("neverStarted")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(text)
    {
        if let Some(t) = starts.get(&name).and_then(|v| v.first()) {
            errors.push(format!("neverStarted: {name} started at {t}"));
        }
    }
    for (name, n) in exp
        .get("startCount")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        cmp(
            &mut errors,
            format!("startCount.{name}"),
            Some(Value::from(starts.get(name).map_or(0, Vec::len))),
            n,
        );
    }
    // The run's start (SEMANTICS §14: a promoted run starts at the end of its soak).
    if let Some(want) = exp.get("runStartedAt") {
        let got = status["status"]["startTime"].as_str();
        if got.and_then(|g| Time::parse(g).ok()) != time_of(want) {
            errors.push(format!(
                "runStartedAt: expected {want}, got {}",
                got.unwrap_or("nothing")
            ));
        }
    }
    // Where a promoted run's target comes from (SEMANTICS §14); `null`: not promoted.
    if let Some(want) = exp.get("promotedFrom") {
        check_promoted_from(want, &status["promotedFrom"], &mut errors);
    }
    if let Some(want) = exp.get("runCompletedAt") {
        let got = status["status"]["completedTime"]
            .as_str()
            .or_else(|| status["completedTime"].as_str());
        if got.and_then(|g| Time::parse(g).ok()) != time_of(want) {
            errors.push(format!(
                "runCompletedAt: expected {want}, got {}",
                got.unwrap_or("nothing")
            ));
        }
    }
    if let Some(want) = exp
        .get("selectedNodeImageVersions")
        .and_then(Value::as_object)
    {
        let mut got = BTreeMap::new();
        for item in status["nodeImageSelection"]["selectedNodeImageVersions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let full = text(&item["version"]);
            if let Some((family, version)) = full.rsplit_once('-') {
                got.insert(family.to_string(), version.to_string());
            }
        }
        for (family, v) in want {
            cmp(
                &mut errors,
                format!("selectedNodeImageVersions.{family}"),
                got.get(family).map(|s| Value::String(s.clone())),
                &Value::String(text(v)),
            );
        }
    }
    for (member, pools) in exp
        .get("memberNodeImage")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let got: BTreeMap<String, String> = result["clusters"][member]["nodePools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    text(&p["name"]),
                    image_version(p["nodeImageVersion"].as_str().unwrap_or_default()).to_string(),
                )
            })
            .collect();
        for (pool, v) in pools.as_object().into_iter().flatten() {
            cmp(
                &mut errors,
                format!("memberNodeImage.{member}.{pool}"),
                got.get(pool).map(|s| Value::String(s.clone())),
                &Value::String(text(v)),
            );
        }
    }
    for (member, v) in exp
        .get("memberKubernetesVersion")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        cmp(
            &mut errors,
            format!("memberKubernetesVersion.{member}"),
            result["clusters"][member].get("kubernetesVersion").cloned(),
            &Value::String(text(v)),
        );
    }
    errors
}

/// Scopes of `maxInFlight`/`inFlightAtMost` counted over every run of the simulation
/// (SEMANTICS §12): `fleet`, `budget:NAME[/VALUE]`, `members:A,B,…`.
fn is_fleet_scope(key: &str) -> bool {
    key == "fleet" || key.starts_with("members:") || key.starts_with("budget:")
}

/// Every run's events together (the run of `update`, then `updateRuns`, then `generatedRuns`),
/// in time order with, at one instant, ends (`MemberSucceeded`, `MemberFailed`,
/// `MemberStopped`) before everything else, as `check.py`'s `all_events` sorts them.
fn all_events(full: &Value) -> Vec<&Value> {
    let mut events: Vec<&Value> = std::iter::once(&full["events"])
        .chain(["updateRuns", "generatedRuns"].into_iter().flat_map(|k| {
            full[k]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| &r["events"])
        }))
        .flat_map(|l| l.as_array().into_iter().flatten())
        .collect();
    events.sort_by_key(|e| {
        let end = matches!(
            e["type"].as_str(),
            Some("MemberSucceeded" | "MemberFailed" | "MemberStopped")
        );
        (time_of(&e["time"]), !end)
    });
    events
}

/// Peak number of members in flight over every run together, for the fleet-wide scopes
/// `fleet` and `members:A,B,…` (a member counts in every such scope that lists it). A member
/// already in flight that starts again (in another run) is counted once, as `check.py` does.
fn fleet_peaks(full: &Value, keys: &[&str], budgets: &BudgetScopes) -> BTreeMap<String, i64> {
    let mut current: BTreeMap<String, i64> = BTreeMap::new();
    let mut peak: BTreeMap<String, i64> = BTreeMap::new();
    let mut in_flight: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in all_events(full) {
        let member = text(&e["member"]);
        match e["type"].as_str().unwrap_or_default() {
            "MemberStarted" | "MemberReattached" => {
                if in_flight.contains_key(&member) {
                    continue;
                }
                let scopes: Vec<String> = std::iter::once("fleet".to_string())
                    .chain(budgets.get(&member).into_iter().flatten().cloned())
                    .chain(
                        keys.iter()
                            .filter(|k| {
                                k.strip_prefix("members:")
                                    .is_some_and(|list| list.split(',').any(|m| m == member))
                            })
                            .map(|k| k.to_string()),
                    )
                    .collect();
                for k in &scopes {
                    let c = current.entry(k.clone()).or_default();
                    *c += 1;
                    let p = peak.entry(k.clone()).or_default();
                    *p = (*p).max(*c);
                }
                in_flight.insert(member, scopes);
            }
            "MemberSucceeded" | "MemberFailed" | "MemberStopped" => {
                for k in in_flight.remove(&member).into_iter().flatten() {
                    *current.entry(k).or_default() -= 1;
                }
            }
            _ => {}
        }
    }
    peak
}

/// `pendingMessages` (SEMANTICS §12): member → a text one of its `MemberPending` messages, in
/// any run of the simulation, contains.
fn check_pending_messages(
    exp: &serde_json::Map<String, Value>,
    result: &Value,
    errors: &mut Vec<String>,
) {
    let Some(wanted) = exp.get("pendingMessages").and_then(Value::as_object) else {
        return;
    };
    let lists = std::iter::once(&result["events"]).chain(
        ["updateRuns", "generatedRuns"].into_iter().flat_map(|k| {
            result[k]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| &r["events"])
        }),
    );
    let events: Vec<&Value> = lists
        .flat_map(|l| l.as_array().into_iter().flatten())
        .collect();
    for (member, text) in wanted {
        let text = text.as_str().unwrap_or_default();
        let messages: Vec<&str> = events
            .iter()
            .filter(|e| e["type"] == "MemberPending" && e["member"] == member.as_str())
            .filter_map(|e| e["message"].as_str())
            .collect();
        if !messages.iter().any(|m| m.contains(text)) {
            errors.push(format!(
                "pendingMessages.{member}: no MemberPending message contains {text:?} (got {messages:?})"
            ));
        }
    }
}

/// Keys of `expect` about the whole simulation rather than the hand-made run.
const GLOBAL_KEYS: [&str; 7] = [
    "createError",
    "pendingMessages",
    "generatedRuns",
    "profiles",
    "runs",
    "memberKubernetesVersion",
    "memberNodeImage",
];

/// The profile expectations: `generatedRuns` (profile → the targets of its runs, in creation
/// order), `profiles` (status fields), and `runs` (a generated run, named by its name or by
/// `profile/versions`, checked with the same keys as the hand-made run).
fn check_profiles(exp: &serde_json::Map<String, Value>, result: &Value, errors: &mut Vec<String>) {
    let generated: Vec<&Value> = result["generatedRuns"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    for (profile, want) in exp
        .get("generatedRuns")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let got: Vec<Value> = generated
            .iter()
            .filter(|g| g["profile"].as_str() == Some(profile.as_str()))
            .filter_map(|g| g["key"].as_str())
            .map(|k| Value::String(k.split_once('/').map_or(k, |(_, v)| v).to_string()))
            .collect();
        let want = Value::Array(
            want.as_array()
                .into_iter()
                .flatten()
                .map(|v| Value::String(text(v)))
                .collect(),
        );
        cmp(
            errors,
            format!("generatedRuns.{profile}"),
            Some(Value::Array(got)),
            &want,
        );
    }
    for (name, want) in exp
        .get("profiles")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let Some(profile) = result["profiles"].get(name) else {
            errors.push(format!("profiles.{name}: no such profile"));
            continue;
        };
        let status = &profile["properties"]["autoUpgradeProfileStatus"];
        for (field, v) in want.as_object().into_iter().flatten() {
            let label = format!("profiles.{name}.{field}");
            match field.as_str() {
                // A downstream profile may show what it waits for without having triggered.
                "triggered" => cmp(
                    errors,
                    label,
                    Some(Value::Bool(!status["lastTriggeredAt"].is_null())),
                    v,
                ),
                "upstream" => check_upstream_status(&label, v, &status[field], errors),
                "lastTriggeredAt" => {
                    if time_of(&status[field]) != time_of(v) {
                        errors.push(format!("{label}: expected {v}, got {}", status[field]));
                    }
                }
                "lastTriggerMessage" | "lastTriggerError" => {
                    let got = text(&status[field]);
                    if status[field].is_null() || !got.contains(&text(v)) {
                        errors.push(format!("{label}: expected it to mention {v}, got {got}"));
                    }
                }
                "lastTriggerUpgradeVersions" => {
                    cmp(errors, label, status.get(field).cloned(), &versions(v));
                }
                _ => cmp(errors, label, status.get(field).cloned(), v),
            }
        }
    }
}

/// A list of versions as expected, each as text (YAML reads `1.31` as a number).
fn versions(v: &Value) -> Value {
    Value::Array(
        v.as_array()
            .into_iter()
            .flatten()
            .map(|x| Value::String(text(x)))
            .collect(),
    )
}

/// `runs` (SEMANTICS §12, tests/scenarios/README.md): a run other than the one of `update`,
/// named by a generated run's `profile/versions` key, a hand-made run's name (`updateRuns`) or
/// a generated run's full name, in that order, checked with the same keys as the run of
/// `update`; what is counted over every run is counted over the whole document. A hand-made run
/// refused at creation carries its `createError`, so `createError: {mentions}` checks it.
fn check_runs(
    exp: &serde_json::Map<String, Value>,
    result: &Value,
    errors: &mut Vec<String>,
    budgets: &BudgetScopes,
) {
    let generated: Vec<&Value> = result["generatedRuns"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let declared: Vec<&Value> = result["updateRuns"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    for (key, want) in exp
        .get("runs")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let found = generated
            .iter()
            .find(|g| g["key"].as_str() == Some(key.as_str()))
            .or_else(|| {
                declared
                    .iter()
                    .find(|r| r["name"].as_str() == Some(key.as_str()))
            })
            .or_else(|| {
                generated
                    .iter()
                    .find(|g| g["run"]["name"].as_str() == Some(key.as_str()))
            });
        let Some(r) = found else {
            let made: Vec<&str> = declared
                .iter()
                .filter_map(|r| r["name"].as_str())
                .chain(generated.iter().filter_map(|g| g["key"].as_str()))
                .collect();
            errors.push(format!(
                "runs.{key}: no such run (updateRuns names, generatedRuns keys: {made:?})"
            ));
            continue;
        };
        let mut document = serde_json::json!({
            "run": r["run"],
            "events": r["events"],
            "clusters": result["clusters"],
        });
        if let Some(error) = r.get("createError") {
            document["createError"] = error.clone();
        }
        let empty = serde_json::Map::new();
        for e in check_run(
            want.as_object().unwrap_or(&empty),
            &document,
            result,
            budgets,
        ) {
            errors.push(format!("runs.{key}.{e}"));
        }
    }
}

/// `promotedFrom` of a run (SEMANTICS §14): `null` when the run is not promoted; otherwise each
/// field given: `runId` (the upstream run's id contains it), `completedTime` (the same
/// instant), `imagesPinned`.
fn check_promoted_from(want: &Value, got: &Value, errors: &mut Vec<String>) {
    let Some(fields) = want.as_object() else {
        if !want.is_null() || !got.is_null() {
            errors.push(format!("promotedFrom: expected {want}, got {got}"));
        }
        return;
    };
    if got.is_null() {
        errors.push(format!(
            "promotedFrom: expected {want}, got nothing (the run is not promoted)"
        ));
        return;
    }
    for (field, v) in fields {
        let label = format!("promotedFrom.{field}");
        match field.as_str() {
            "runId" => {
                let id = text(&got[field]);
                if got[field].is_null() || !id.contains(&text(v)) {
                    errors.push(format!("{label}: expected it to contain {v}, got {id}"));
                }
            }
            "completedTime" => {
                if time_of(&got[field]) != time_of(v) {
                    errors.push(format!("{label}: expected {v}, got {}", got[field]));
                }
            }
            _ => cmp(errors, label, got.get(field).cloned(), v),
        }
    }
}

/// A downstream profile's `upstream` status (SEMANTICS §14): `null` when it waits for nothing;
/// otherwise each field given: `validatedTarget` (the versions), `validatedAt` and `soakEndsAt`
/// (instants), `validatedBy` (the upstream run's id contains it).
fn check_upstream_status(label: &str, want: &Value, got: &Value, errors: &mut Vec<String>) {
    let Some(fields) = want.as_object() else {
        if !want.is_null() || !got.is_null() {
            errors.push(format!("{label}: expected {want}, got {got}"));
        }
        return;
    };
    if got.is_null() {
        errors.push(format!("{label}: expected {want}, got nothing"));
        return;
    }
    for (field, v) in fields {
        let label = format!("{label}.{field}");
        match field.as_str() {
            "validatedAt" | "soakEndsAt" => {
                if time_of(&got[field]) != time_of(v) {
                    errors.push(format!("{label}: expected {v}, got {}", got[field]));
                }
            }
            "validatedBy" => {
                let id = text(&got[field]);
                if got[field].is_null() || !id.contains(&text(v)) {
                    errors.push(format!("{label}: expected it to contain {v}, got {id}"));
                }
            }
            "validatedTarget" => cmp(errors, label, got.get(field).cloned(), &versions(v)),
            _ => cmp(errors, label, got.get(field).cloned(), v),
        }
    }
}
