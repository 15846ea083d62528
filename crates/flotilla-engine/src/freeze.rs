//! Freezes (SEMANTICS §12): spans during which a fleet sends no upgrade of the kinds a freeze's
//! scope names to the members its selector covers, across every run. A freeze is one-off
//! (`start`, `end`) or recurring (the maintenance-window schedule shape, 1–168 hours long;
//! overlapping occurrences count as one). The fleet engine works out which members each freeze
//! covers and hands every run the same [`Freezes`]; a run asks it before each upgrade it sends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};
use crate::selector::Selector;
use crate::strategy::{MemberSelectorSpec, UpgradeType};
use crate::time::{Date, SECONDS_PER_DAY, Time};
use crate::window::{MaintenanceWindow, MaintenanceWindowSpec};

/// The longest a one-off freeze may last, and a recurring occurrence.
const MOST_DAYS: i64 = 366;
const MOST_HOURS: i64 = 168;

/// `properties` of a freeze (`P/freezes/{name}`), as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FreezeSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurrence: Option<MaintenanceWindowSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<MemberSelectorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a freeze holds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FreezeScope {
    /// Every upgrade.
    AllUpgrades,
    /// A Full or ControlPlaneOnly upgrade that changes the member's minor version.
    MinorUpgrades,
    /// Those, and every upgrade that changes node pools: only control-plane patches go.
    MinorAndNodeUpgrades,
}

/// When a freeze is in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Occurrences {
    Once {
        start: Time,
        end: Time,
    },
    /// The schedule's instances, each `duration` seconds long.
    Recurring {
        window: Box<MaintenanceWindow>,
        duration: i64,
    },
}

/// A freeze, validated. Kept (and checkpointed) as its name and properties.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "FreezeWire", try_from = "FreezeWire")]
pub struct Freeze {
    pub name: String,
    pub spec: FreezeSpec,
    pub occurrences: Occurrences,
    /// `None`: every member of the fleet.
    pub selector: Option<Selector>,
    pub scope: FreezeScope,
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct FreezeWire {
    name: String,
    properties: FreezeSpec,
}

impl From<Freeze> for FreezeWire {
    fn from(f: Freeze) -> FreezeWire {
        FreezeWire {
            name: f.name,
            properties: f.spec,
        }
    }
}

impl TryFrom<FreezeWire> for Freeze {
    type Error = String;
    fn try_from(w: FreezeWire) -> Result<Freeze, String> {
        parse_freeze(&w.name, &w.properties).map_err(|e| e.message)
    }
}

fn bad(field: &str, message: String) -> ApiError {
    let path = format!("properties.{field}");
    ApiError::new(ErrorCode::InvalidFreeze, format!("{path}: {message}"), path)
}

fn instant(field: &str, text: &Option<String>) -> Result<Time, ApiError> {
    let text = text
        .as_deref()
        .ok_or_else(|| bad(field, "is required with a one-off freeze".into()))?;
    Time::parse(text).map_err(|e| bad(field, format!("{text:?} is not an RFC 3339 time: {e}")))
}

/// Validates a freeze's properties; each refusal names the field and the value.
pub fn parse_freeze(name: &str, spec: &FreezeSpec) -> Result<Freeze, ApiError> {
    let occurrences = match (&spec.recurrence, spec.start.is_some() || spec.end.is_some()) {
        (Some(_), true) => {
            return Err(bad(
                "recurrence",
                "a freeze has either start and end, or a recurrence, not both".into(),
            ));
        }
        (None, false) => {
            return Err(bad(
                "start",
                "is required: a one-off freeze has start and end, a recurring one a recurrence"
                    .into(),
            ));
        }
        (None, true) => {
            let start = instant("start", &spec.start)?;
            let end = instant("end", &spec.end)?;
            if end <= start {
                return Err(bad(
                    "end",
                    format!(
                        "{:?} must be after start {:?}",
                        spec.end.as_deref().unwrap_or_default(),
                        spec.start.as_deref().unwrap_or_default()
                    ),
                ));
            }
            if end.unix() - start.unix() > MOST_DAYS * SECONDS_PER_DAY {
                return Err(bad(
                    "end",
                    format!("a freeze lasts at most {MOST_DAYS} days"),
                ));
            }
            Occurrences::Once { start, end }
        }
        (Some(recurrence), false) => {
            if !recurrence.not_allowed_dates.is_empty() {
                return Err(bad(
                    "recurrence.notAllowedDates",
                    "is not a freeze setting (a freeze is itself the span nothing starts in)"
                        .into(),
                ));
            }
            let hours = recurrence
                .duration_hours
                .ok_or_else(|| bad("recurrence.durationHours", "is required (1 to 168)".into()))?;
            if !(1..=MOST_HOURS).contains(&hours) {
                return Err(bad(
                    "recurrence.durationHours",
                    format!("{hours} must be between 1 and {MOST_HOURS}"),
                ));
            }
            // The schedule is a maintenance window's; its own duration bound does not apply.
            let mut shape = recurrence.clone();
            shape.duration_hours = Some(24);
            let window = MaintenanceWindow::parse(&shape, "properties.recurrence")
                .map_err(|e| ApiError::new(ErrorCode::InvalidFreeze, e.message, e.target))?;
            Occurrences::Recurring {
                window: Box::new(window),
                duration: hours * 3600,
            }
        }
    };
    let selector = crate::strategy::parse_selector(&spec.selector, "properties.selector")?;
    let scope = match spec.scope.as_deref() {
        None | Some("AllUpgrades") => FreezeScope::AllUpgrades,
        Some("MinorUpgrades") => FreezeScope::MinorUpgrades,
        Some("MinorAndNodeUpgrades") => FreezeScope::MinorAndNodeUpgrades,
        Some(other) => {
            return Err(bad(
                "scope",
                format!("{other:?} must be AllUpgrades, MinorUpgrades or MinorAndNodeUpgrades"),
            ));
        }
    };
    if let Some(reason) = &spec.reason
        && (reason.chars().count() > 200 || reason.chars().any(char::is_control))
    {
        return Err(bad(
            "reason",
            "must be at most 200 characters, none a control character".into(),
        ));
    }
    Ok(Freeze {
        name: name.to_string(),
        spec: spec.clone(),
        occurrences,
        selector,
        scope,
        reason: spec.reason.clone(),
    })
}

impl Freeze {
    /// If the freeze is in force at `t`, when it ends (overlapping occurrences as one).
    pub fn active_until(&self, t: Time) -> Option<Time> {
        match &self.occurrences {
            Occurrences::Once { start, end } => (*start <= t && t < *end).then_some(*end),
            Occurrences::Recurring { window, duration } => {
                let offset = window_offset(window);
                let (today, _) = t.civil(offset);
                // Occurrences last at most a week: one that began 8 days back may still hold.
                let mut date = Date::from_days(today.days() - 8);
                let mut span_end: Option<Time> = None;
                // Bounded: an endless chain of overlapping occurrences is followed this far,
                // and the run looks again when it ends.
                for _ in 0..64 {
                    let Some(d) = window.next_schedule_date(date) else {
                        break;
                    };
                    let start = window.instance_start(d);
                    let end = start.plus(*duration);
                    match span_end {
                        None if start > t => return None,
                        None if end > t => span_end = Some(end),
                        None => {}
                        // A gap: the span holding `t` ended.
                        Some(e) if start > e => break,
                        Some(e) => span_end = Some(e.max(end)),
                    }
                    date = Date::from_days(d.days() + 1);
                }
                span_end
            }
        }
    }

    /// The span in force at `now` (from `now`), else the next one to begin: (start, end).
    /// `None` when none begins within a year (a recurring schedule is walked date by date).
    pub fn next_span(&self, now: Time) -> Option<(Time, Time)> {
        if let Some(end) = self.active_until(now) {
            return Some((now, end));
        }
        match &self.occurrences {
            Occurrences::Once { start, end } => (*start > now).then_some((*start, *end)),
            Occurrences::Recurring { window, .. } => {
                let (today, _) = now.civil(window_offset(window));
                let mut date = Date::from_days(today.days() - 1);
                for _ in 0..400 {
                    let d = window.next_schedule_date(date)?;
                    let start = window.instance_start(d);
                    if start > now {
                        return Some((start, self.active_until(start)?));
                    }
                    date = Date::from_days(d.days() + 1);
                }
                None
            }
        }
    }

    /// Whether an upgrade of `upgrade_type` that changes the member's minor version
    /// (`changes_minor`) is one this freeze holds back.
    pub fn blocks(&self, upgrade_type: UpgradeType, changes_minor: bool) -> bool {
        match self.scope {
            FreezeScope::AllUpgrades => true,
            FreezeScope::MinorUpgrades => changes_minor,
            FreezeScope::MinorAndNodeUpgrades => {
                changes_minor
                    || matches!(upgrade_type, UpgradeType::Full | UpgradeType::NodeImageOnly)
            }
        }
    }

    /// Why a member waits, for its message: the freeze, its reason and its end.
    pub fn message(&self, until: Time) -> String {
        match &self.reason {
            Some(reason) => format!("frozen by {:?} ({reason}) until {until}", self.name),
            None => format!("frozen by {:?} until {until}", self.name),
        }
    }
}

fn window_offset(window: &MaintenanceWindow) -> i64 {
    window
        .spec()
        .utc_offset
        .as_deref()
        .and_then(crate::time::parse_utc_offset)
        .unwrap_or(0)
}

/// A fleet's freezes, each with the members it covers (worked out by the fleet engine against
/// its member table: runs hold no labels). Shared by every run of the fleet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Freezes {
    pub freezes: Vec<CoveredFreeze>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoveredFreeze {
    pub freeze: Freeze,
    /// `None`: every member (no selector).
    pub members: Option<BTreeSet<Arc<str>>>,
}

impl Freezes {
    /// The freezes of a fleet, by name, with the members each covers among `members` (name →
    /// labels).
    pub fn cover<'a>(
        freezes: &BTreeMap<String, Freeze>,
        members: impl Iterator<Item = (&'a Arc<str>, &'a BTreeMap<String, String>)> + Clone,
    ) -> Freezes {
        Freezes {
            freezes: freezes
                .values()
                .map(|f| CoveredFreeze {
                    freeze: f.clone(),
                    members: f.selector.as_ref().map(|s| {
                        members
                            .clone()
                            .filter(|(_, labels)| s.matches(labels))
                            .map(|(name, _)| name.clone())
                            .collect()
                    }),
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.freezes.is_empty()
    }

    /// The freeze that holds `member` back from an upgrade now, and when it ends: of those in
    /// force that cover it and block the upgrade, the one that ends last (SEMANTICS §12).
    pub fn holding(
        &self,
        member: &str,
        upgrade_type: UpgradeType,
        changes_minor: bool,
        now: Time,
    ) -> Option<(&Freeze, Time)> {
        self.freezes
            .iter()
            .filter(|c| c.members.as_ref().is_none_or(|m| m.contains(member)))
            .filter(|c| c.freeze.blocks(upgrade_type, changes_minor))
            .filter_map(|c| c.freeze.active_until(now).map(|end| (&c.freeze, end)))
            .max_by_key(|(f, end)| (*end, std::cmp::Reverse(f.name.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freeze(json: &str) -> Result<Freeze, ApiError> {
        parse_freeze("f", &serde_json::from_str(json).expect("shape"))
    }

    fn at(text: &str) -> Time {
        Time::parse(text).expect("a time")
    }

    #[test]
    fn a_one_off_freeze_holds_from_start_to_end() {
        let f = freeze(r#"{"start":"2026-11-26T00:00:00Z","end":"2026-12-01T00:00:00Z","reason":"retail peak"}"#).unwrap();
        assert_eq!(f.active_until(at("2026-11-25T23:59:59Z")), None);
        assert_eq!(
            f.active_until(at("2026-11-26T00:00:00Z")),
            Some(at("2026-12-01T00:00:00Z"))
        );
        assert_eq!(f.active_until(at("2026-12-01T00:00:00Z")), None);
        assert!(
            f.message(at("2026-12-01T00:00:00Z"))
                .contains("retail peak")
        );
    }

    #[test]
    fn a_recurring_freeze_follows_its_schedule_and_offset() {
        // Fridays 18:00 at +01:00 for 60 hours: Friday 17:00Z to Monday 05:00Z.
        let f = freeze(r#"{"recurrence":{"schedule":{"weekly":{"intervalWeeks":1,"dayOfWeek":"Friday"}},"startTime":"18:00","utcOffset":"+01:00","durationHours":60}}"#).unwrap();
        // 2026-03-06 is a Friday.
        assert_eq!(f.active_until(at("2026-03-06T16:59:59Z")), None);
        assert_eq!(
            f.active_until(at("2026-03-06T17:00:00Z")),
            Some(at("2026-03-09T05:00:00Z"))
        );
        assert_eq!(
            f.active_until(at("2026-03-08T12:00:00Z")),
            Some(at("2026-03-09T05:00:00Z"))
        );
        assert_eq!(f.active_until(at("2026-03-09T05:00:00Z")), None);
        assert_eq!(
            f.active_until(at("2026-03-13T18:00:00Z")),
            Some(at("2026-03-16T05:00:00Z"))
        );
        // Not in force: the next span; in force: from now to its end.
        assert_eq!(
            f.next_span(at("2026-03-10T00:00:00Z")),
            Some((at("2026-03-13T17:00:00Z"), at("2026-03-16T05:00:00Z")))
        );
        assert_eq!(
            f.next_span(at("2026-03-08T00:00:00Z")),
            Some((at("2026-03-08T00:00:00Z"), at("2026-03-09T05:00:00Z")))
        );
    }

    #[test]
    fn overlapping_occurrences_count_as_one() {
        // Every day at 00:00 for 36 hours: always frozen once begun, ending never within reach
        // of a single occurrence; the span ends only where occurrences stop overlapping.
        let f = freeze(r#"{"recurrence":{"schedule":{"daily":{"intervalDays":2}},"startTime":"00:00","durationHours":36,"startDate":"2026-03-02"}}"#).unwrap();
        // Instances 03-02 00:00–03-03 12:00, 03-04 00:00–03-05 12:00: a gap between.
        assert_eq!(
            f.active_until(at("2026-03-02T06:00:00Z")),
            Some(at("2026-03-03T12:00:00Z"))
        );
        assert_eq!(f.active_until(at("2026-03-03T18:00:00Z")), None);
        let g = freeze(r#"{"recurrence":{"schedule":{"daily":{"intervalDays":1}},"startTime":"00:00","durationHours":30,"startDate":"2026-03-02"}}"#).unwrap();
        // Each day's instance overlaps the next: one endless span.
        let until = g
            .active_until(at("2026-03-02T06:00:00Z"))
            .expect("in force");
        assert!(until > at("2026-03-10T00:00:00Z"), "{until}");
    }

    #[test]
    fn scopes_hold_back_what_they_name() {
        let scoped = |scope: &str| {
            freeze(&format!(
                r#"{{"start":"2026-03-02T00:00:00Z","end":"2026-03-03T00:00:00Z","scope":"{scope}"}}"#
            ))
            .unwrap()
        };
        let all = scoped("AllUpgrades");
        assert!(all.blocks(UpgradeType::ControlPlaneOnly, false));
        let minor = scoped("MinorUpgrades");
        assert!(minor.blocks(UpgradeType::Full, true));
        assert!(!minor.blocks(UpgradeType::Full, false));
        assert!(!minor.blocks(UpgradeType::NodeImageOnly, false));
        let nodes = scoped("MinorAndNodeUpgrades");
        assert!(nodes.blocks(UpgradeType::NodeImageOnly, false));
        assert!(nodes.blocks(UpgradeType::Full, false));
        assert!(!nodes.blocks(UpgradeType::ControlPlaneOnly, false));
        assert!(nodes.blocks(UpgradeType::ControlPlaneOnly, true));
    }

    #[test]
    fn refusals_name_the_field_and_value() {
        for (json, target, says) in [
            (r#"{}"#, "properties.start", "required"),
            (
                r#"{"start":"2026-03-02T00:00:00Z"}"#,
                "properties.end",
                "required",
            ),
            (
                r#"{"start":"2026-03-02T00:00:00Z","end":"2026-03-01T00:00:00Z"}"#,
                "properties.end",
                "2026-03-01T00:00:00Z",
            ),
            (
                r#"{"start":"2026-03-02T00:00:00Z","end":"2027-03-04T00:00:00Z"}"#,
                "properties.end",
                "366 days",
            ),
            (
                r#"{"start":"yesterday","end":"2027-03-04T00:00:00Z"}"#,
                "properties.start",
                "yesterday",
            ),
            (
                r#"{"start":"2026-03-02T00:00:00Z","end":"2026-03-03T00:00:00Z","recurrence":{}}"#,
                "properties.recurrence",
                "not both",
            ),
            (
                r#"{"recurrence":{"schedule":{"daily":{"intervalDays":1}},"startTime":"00:00"}}"#,
                "properties.recurrence.durationHours",
                "required",
            ),
            (
                r#"{"recurrence":{"schedule":{"daily":{"intervalDays":1}},"startTime":"00:00","durationHours":169}}"#,
                "properties.recurrence.durationHours",
                "169",
            ),
            (
                r#"{"recurrence":{"schedule":{"daily":{"intervalDays":1}},"startTime":"00:00","durationHours":2,"notAllowedDates":[{"start":"2026-03-02","end":"2026-03-03"}]}}"#,
                "properties.recurrence.notAllowedDates",
                "not a freeze setting",
            ),
            (
                r#"{"recurrence":{"schedule":{"daily":{"intervalDays":1}},"startTime":"25:00","durationHours":2}}"#,
                "properties.recurrence.startTime",
                "25:00",
            ),
            (
                r#"{"start":"2026-03-02T00:00:00Z","end":"2026-03-03T00:00:00Z","scope":"Everything"}"#,
                "properties.scope",
                "Everything",
            ),
            (
                r#"{"start":"2026-03-02T00:00:00Z","end":"2026-03-03T00:00:00Z","selector":{"byLabel":"env in ()"}}"#,
                "properties.selector.byLabel",
                "env in ()",
            ),
        ] {
            let err = freeze(json).expect_err(json);
            assert_eq!(err.target, target, "{json}: {}", err.message);
            assert!(err.message.contains(says), "{json}: {}", err.message);
            let code = if target.contains("selector") {
                ErrorCode::InvalidMemberSelector
            } else {
                ErrorCode::InvalidFreeze
            };
            assert_eq!(err.code, code, "{json}");
        }
    }
}
