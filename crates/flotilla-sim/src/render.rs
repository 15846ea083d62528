//! The human-readable output of `flotilla simulate`: the final stage → group → member tree and
//! a compact timeline, one line per instant.

use std::fmt::Write;

use flotilla_engine::status::{
    CheckResult, Event, EventType, GateStatus, UpdateRunStatus, UpdateStatus,
};
use flotilla_engine::time::Time;

use crate::simulator::SimResult;

fn span(status: &UpdateStatus) -> String {
    match (status.start_time, status.completed_time) {
        (Some(a), Some(b)) => format!("  {a} → {b}"),
        (Some(a), None) => format!("  since {a}"),
        _ => String::new(),
    }
}

fn gates(out: &mut String, prefix: &str, label: &str, gates: &[GateStatus]) {
    for g in gates {
        let name = g.display_name.as_deref().unwrap_or("gate");
        // A pending gate shows its id: what `flotilla gate approve` needs.
        let id = if g.status.state == flotilla_engine::status::State::Pending {
            format!("  gate {}", g.gate_id)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{prefix}{label} {name:?}  {:?}{}{id}",
            g.status.state,
            span(&g.status)
        );
    }
}

/// A status's check evaluations (SEMANTICS §10): each check's latest, with how many of those
/// the status keeps failed.
fn checks(out: &mut String, prefix: &str, results: &[CheckResult]) {
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
    }
    for name in names {
        let of: Vec<&CheckResult> = results.iter().filter(|r| r.name == name).collect();
        let Some(last) = of.last() else { continue };
        let mark = match last.passed {
            Some(true) => "passed",
            Some(false) => "FAILED",
            None => "unavailable",
        };
        let failing = of.iter().filter(|r| r.passed == Some(false)).count();
        let _ = writeln!(
            out,
            "{prefix}check {name} {mark} at {}{}{}",
            last.time,
            last.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default(),
            if failing > 1 {
                format!(" ({failing} failing evaluations)")
            } else {
                String::new()
            }
        );
    }
}

/// The final tree of a run status.
/// How many members a stage or group selected.
fn count(members: usize) -> String {
    match members {
        1 => "1 member".to_string(),
        n => format!("{n} members"),
    }
}

pub fn tree(name: &str, status: &UpdateRunStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "update run {name}  {:?}  failures {}{}",
        status.status.state,
        status.failure_count,
        span(&status.status)
    );
    if let Some(sel) = &status.node_image_selection {
        let versions: Vec<&str> = sel
            .selected_node_image_versions
            .iter()
            .map(|v| v.version.as_str())
            .collect();
        let _ = writeln!(out, "  consistent node images: {}", versions.join(", "));
    }
    for stage in &status.stages {
        let _ = writeln!(
            out,
            "  stage {}  {:?}  {}  failures {}/{} allowed  concurrency {}{}",
            stage.name,
            stage.status.state,
            count(stage.groups.iter().map(|g| g.members.len()).sum()),
            stage.failure_count,
            stage.max_allowed_failures,
            stage.max_concurrency,
            span(&stage.status)
        );
        if let Some(e) = &stage.status.error {
            let _ = writeln!(out, "    error {}: {}", e.code, e.message);
        }
        checks(&mut out, "    ", &stage.health_checks);
        gates(&mut out, "    ", "before-gate", &stage.before_gates);
        for group in &stage.groups {
            let _ = writeln!(
                out,
                "    group {}  {:?}  {}  failures {}/{} allowed  concurrency {}{}{}",
                group.name,
                group.status.state,
                count(group.members.len()),
                group.failure_count,
                group.max_allowed_failures,
                group.max_concurrency,
                span(&group.status),
                group
                    .message
                    .as_deref()
                    .map(|m| format!("  ({m})"))
                    .unwrap_or_default()
            );
            checks(&mut out, "      ", &group.health_checks);
            gates(&mut out, "      ", "before-gate", &group.before_gates);
            for m in &group.members {
                let detail = m
                    .status
                    .error
                    .as_ref()
                    .map(|e| format!("  error {}: {}", e.code, e.message))
                    .or_else(|| m.message.as_ref().map(|msg| format!("  ({msg})")))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "      {}  {:?}{}{}",
                    m.name,
                    m.status.state,
                    span(&m.status),
                    detail
                );
                checks(&mut out, "        ", &m.health_checks);
            }
            gates(&mut out, "      ", "after-gate", &group.after_gates);
        }
        gates(&mut out, "    ", "after-gate", &stage.after_gates);
        if let Some(wait) = &stage.after_stage_wait_status {
            let _ = writeln!(
                out,
                "    wait {}s  {:?}{}",
                wait.wait_duration_in_seconds,
                wait.status.state,
                span(&wait.status)
            );
        }
    }
    out
}

fn verb(kind: EventType) -> &'static str {
    match kind {
        EventType::MemberStarted => "started",
        EventType::MemberSucceeded => "succeeded",
        EventType::MemberFailed => "FAILED",
        EventType::MemberSkipped => "skipped",
        EventType::MemberPending => "pending",
        EventType::MemberStopped => "stopped",
        EventType::MemberReattached => "re-attached",
        EventType::MemberVerifying => "verifying",
        _ => "",
    }
}

/// One line per instant; member events are grouped by kind, at most a few names each.
pub fn timeline(events: &[Event]) -> String {
    const NAMES: usize = 6;
    let mut out = String::new();
    let mut i = 0;
    while i < events.len() {
        let t: Time = events[i].time;
        let mut j = i;
        while j < events.len() && events[j].time == t {
            j += 1;
        }
        let mut parts: Vec<String> = Vec::new();
        let mut members: Vec<(EventType, Vec<&str>)> = Vec::new();
        for e in &events[i..j] {
            if let (Some(m), v) = (&e.member, verb(e.kind))
                && !v.is_empty()
            {
                match members.iter_mut().find(|(k, _)| *k == e.kind) {
                    Some((_, names)) => names.push(m),
                    None => members.push((e.kind, vec![m])),
                }
                continue;
            }
            let place = match (&e.stage, &e.group) {
                (Some(s), Some(g)) if let Some(m) = &e.member => format!(" {s}/{g}/{m}"),
                (Some(s), Some(g)) => format!(" {s}/{g}"),
                (Some(s), None) => format!(" {s}"),
                _ => String::new(),
            };
            let extra = match (&e.error, &e.message) {
                (Some(err), Some(m)) => format!(" ({m}: {})", err.message),
                (None, Some(m)) => format!(" ({m})"),
                _ => String::new(),
            };
            parts.push(format!("{:?}{place}{extra}", e.kind));
        }
        for (kind, names) in members {
            let shown: Vec<&str> = names.iter().take(NAMES).copied().collect();
            let more = if names.len() > NAMES {
                format!(" +{} more", names.len() - NAMES)
            } else {
                String::new()
            };
            parts.push(format!("{} {}{more}", verb(kind), shown.join(", ")));
        }
        let _ = writeln!(out, "{t}  {}", parts.join("; "));
        i = j;
    }
    out
}

/// The whole human-readable report; for a scenario of several fleets, each fleet's report in
/// the order they were simulated, then the promotions between them (SEMANTICS §14).
pub fn report(description: &str, result: &SimResult) -> String {
    let mut out = String::new();
    if !description.is_empty() {
        let _ = writeln!(out, "{description}\n");
    }
    if !result.fleets.is_empty() {
        let mut promotions = Vec::new();
        for name in &result.fleet_order {
            let Some(fleet) = result.fleets.get(name) else {
                continue;
            };
            let _ = writeln!(out, "=== fleet {name} ===");
            out.push_str(&report("", fleet));
            let _ = writeln!(out);
            for g in &fleet.generated_runs {
                if let Some(from) = g.status.as_ref().and_then(|s| s.promoted_from.as_ref()) {
                    promotions.push((g.created_at, name, g, from));
                }
            }
        }
        promotions.sort_by_key(|(at, ..)| *at);
        let _ = writeln!(out, "promotions:");
        if promotions.is_empty() {
            let _ = writeln!(out, "  none");
        }
        for (at, fleet, g, from) in promotions {
            let _ = writeln!(
                out,
                "  {at}  {fleet}: profile {} promoted {} from {} (completed {}){}",
                g.profile,
                g.key.split_once('/').map_or(g.key.as_str(), |(_, v)| v),
                from.run_id,
                from.completed_time,
                if from.images_pinned {
                    ""
                } else {
                    ", node images not pinned"
                }
            );
        }
        return out;
    }
    for w in &result.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    if let Some(e) = &result.create_error {
        let _ = writeln!(
            out,
            "the update run was rejected at creation: {} ({:?}, at {})",
            e.message, e.code, e.target
        );
        if result.update_runs.is_empty() {
            return out;
        }
    }
    if result.run.is_some() || !result.events.is_empty() {
        let _ = writeln!(out, "timeline:");
        out.push_str(&timeline(&result.events));
    }
    if let (Some(run), Some(status)) = (&result.run, &result.status) {
        let _ = writeln!(out);
        out.push_str(&tree(run["name"].as_str().unwrap_or("run"), status));
    }
    for u in &result.update_runs {
        match (&u.create_error, &u.status) {
            (Some(e), _) => {
                let _ = writeln!(
                    out,
                    "\nupdate run {} was rejected at creation: {} ({:?}, at {})",
                    u.name, e.message, e.code, e.target
                );
            }
            (None, status) => {
                let _ = writeln!(out, "\nupdate run {}:", u.name);
                out.push_str(&timeline(&u.events));
                if let Some(status) = status {
                    let _ = writeln!(out);
                    out.push_str(&tree(&u.name, status));
                }
            }
        }
    }
    for g in &result.generated_runs {
        let name = g.run["name"].as_str().unwrap_or("run");
        let _ = writeln!(
            out,
            "\nprofile {} generated {name} at {} ({}):",
            g.profile, g.created_at, g.key
        );
        out.push_str(&timeline(&g.events));
        if let Some(status) = &g.status {
            let _ = writeln!(out);
            out.push_str(&tree(name, status));
        }
    }
    for (name, profile) in &result.profiles {
        let status = &profile["properties"]["autoUpgradeProfileStatus"];
        let _ = writeln!(
            out,
            "\nprofile {name}: {}",
            if status.is_null() {
                "never triggered".to_string()
            } else {
                status.to_string()
            }
        );
    }
    out
}
