//! AKS-style maintenance windows (SEMANTICS §3a): the wire shape, its validation, and the exact
//! computation of when work may start.
//!
//! Work may start at `t` when `t` lies inside an instance, from the local date at `startTime`
//! for `durationHours`, and not inside a not-allowed local day. The next such instant is found by
//! jumping from schedule date to schedule date (O(1) each), never by walking minutes.

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};
use crate::time::{
    Date, SECONDS_PER_DAY, SECONDS_PER_HOUR, Time, Weekday, parse_clock, parse_utc_offset,
};

/// The AKS `maintenanceWindow` object as it appears on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaintenanceWindowSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_hours: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc_offset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_date: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_allowed_dates: Vec<DateSpanSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily: Option<DailySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weekly: Option<WeeklySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absolute_monthly: Option<AbsoluteMonthlySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_monthly: Option<RelativeMonthlySpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DailySpec {
    pub interval_days: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeeklySpec {
    pub interval_weeks: Option<i64>,
    pub day_of_week: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AbsoluteMonthlySpec {
    pub interval_months: Option<i64>,
    pub day_of_month: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RelativeMonthlySpec {
    pub interval_months: Option<i64>,
    pub week_index: Option<String>,
    pub day_of_week: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DateSpanSpec {
    pub start: String,
    pub end: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeekIndex {
    First,
    Second,
    Third,
    Fourth,
    Last,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    Daily {
        interval_days: i64,
    },
    Weekly {
        interval_weeks: i64,
        day: Weekday,
    },
    AbsoluteMonthly {
        interval_months: i64,
        day_of_month: u32,
    },
    RelativeMonthly {
        interval_months: i64,
        week: WeekIndex,
        day: Weekday,
    },
}

/// A validated maintenance window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaintenanceWindow {
    pub schedule: Schedule,
    /// Length of an instance, seconds.
    pub duration: i64,
    /// Local start time, seconds after midnight.
    pub start_time: i64,
    /// Seconds east of UTC.
    pub utc_offset: i64,
    /// First local date an instance may fall on.
    anchor: Date,
    has_start_date: bool,
    /// Not-allowed spans in UTC, `[start, end)`, sorted and merged.
    blocked: Vec<(Time, Time)>,
    /// The wire form it was parsed from, to show and store it as written.
    spec: MaintenanceWindowSpec,
}

/// An instant at which work may start, and when that permission ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opening {
    pub from: Time,
    pub until: Time,
}

/// How many schedule dates a search may look at before it concludes the window never opens.
const SEARCH_LIMIT: usize = 5_000;

impl MaintenanceWindow {
    /// Validates the wire form; `path` names the field in errors (e.g. `maintenance.kubernetes`).
    pub fn parse(spec: &MaintenanceWindowSpec, path: &str) -> Result<MaintenanceWindow, ApiError> {
        let bad = |field: &str, message: String| {
            ApiError::new(
                ErrorCode::InvalidMaintenanceWindow,
                format!("{path}.{field}: {message}"),
                format!("{path}.{field}"),
            )
        };
        let schedule_spec = spec
            .schedule
            .as_ref()
            .ok_or_else(|| bad("schedule", "is required".into()))?;
        let kinds = [
            schedule_spec.daily.is_some(),
            schedule_spec.weekly.is_some(),
            schedule_spec.absolute_monthly.is_some(),
            schedule_spec.relative_monthly.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(bad(
                "schedule",
                "must have exactly one of daily, weekly, absoluteMonthly, relativeMonthly".into(),
            ));
        }
        let ranged = |field: &str, value: Option<i64>, lo: i64, hi: i64| -> Result<i64, ApiError> {
            match value {
                None => Err(bad(field, "is required".into())),
                Some(v) if v < lo || v > hi => Err(bad(
                    field,
                    format!("{v} is out of range: must be {lo} to {hi}"),
                )),
                Some(v) => Ok(v),
            }
        };
        let weekday = |field: &str, value: &Option<String>| -> Result<Weekday, ApiError> {
            let text = value
                .as_deref()
                .ok_or_else(|| bad(field, "is required".into()))?;
            Weekday::parse(text).ok_or_else(|| {
                bad(
                    field,
                    format!("{text:?} is not a day of the week (Monday … Sunday)"),
                )
            })
        };
        let schedule = if let Some(d) = &schedule_spec.daily {
            Schedule::Daily {
                interval_days: ranged("schedule.daily.intervalDays", d.interval_days, 1, 7)?,
            }
        } else if let Some(w) = &schedule_spec.weekly {
            Schedule::Weekly {
                interval_weeks: ranged("schedule.weekly.intervalWeeks", w.interval_weeks, 1, 4)?,
                day: weekday("schedule.weekly.dayOfWeek", &w.day_of_week)?,
            }
        } else if let Some(m) = &schedule_spec.absolute_monthly {
            Schedule::AbsoluteMonthly {
                interval_months: ranged(
                    "schedule.absoluteMonthly.intervalMonths",
                    m.interval_months,
                    1,
                    6,
                )?,
                day_of_month: ranged("schedule.absoluteMonthly.dayOfMonth", m.day_of_month, 1, 31)?
                    as u32,
            }
        } else if let Some(m) = &schedule_spec.relative_monthly {
            let text = m
                .week_index
                .as_deref()
                .ok_or_else(|| bad("schedule.relativeMonthly.weekIndex", "is required".into()))?;
            let week = match text {
                "First" => WeekIndex::First,
                "Second" => WeekIndex::Second,
                "Third" => WeekIndex::Third,
                "Fourth" => WeekIndex::Fourth,
                "Last" => WeekIndex::Last,
                other => {
                    return Err(bad(
                        "schedule.relativeMonthly.weekIndex",
                        format!("{other:?} is not one of First, Second, Third, Fourth, Last"),
                    ));
                }
            };
            Schedule::RelativeMonthly {
                interval_months: ranged(
                    "schedule.relativeMonthly.intervalMonths",
                    m.interval_months,
                    1,
                    6,
                )?,
                week,
                day: weekday("schedule.relativeMonthly.dayOfWeek", &m.day_of_week)?,
            }
        } else {
            unreachable!("exactly one schedule kind was checked above")
        };
        let duration_hours = ranged(
            "durationHours",
            Some(spec.duration_hours.unwrap_or(24)),
            4,
            24,
        )?;
        let start_text = spec
            .start_time
            .as_deref()
            .ok_or_else(|| bad("startTime", "is required".into()))?;
        let start_time = parse_clock(start_text).ok_or_else(|| {
            bad(
                "startTime",
                format!("{start_text:?} must be HH:mm, 00:00 to 23:59"),
            )
        })?;
        let offset_text = spec.utc_offset.as_deref().unwrap_or("+00:00");
        let utc_offset = parse_utc_offset(offset_text).ok_or_else(|| {
            bad(
                "utcOffset",
                format!("{offset_text:?} must be ±HH:mm between -14:00 and +14:00"),
            )
        })?;
        let (anchor, has_start_date) = match spec.start_date.as_deref() {
            Some(text) => (
                Date::parse(text).ok_or_else(|| {
                    bad("startDate", format!("{text:?} must be a date YYYY-MM-DD"))
                })?,
                true,
            ),
            None => (Date::from_days(0), false),
        };
        let mut blocked = Vec::new();
        for (i, span) in spec.not_allowed_dates.iter().enumerate() {
            let field = format!("notAllowedDates[{i}]");
            let start = Date::parse(&span.start).ok_or_else(|| {
                bad(
                    &format!("{field}.start"),
                    format!("{:?} must be a date YYYY-MM-DD", span.start),
                )
            })?;
            let end = Date::parse(&span.end).ok_or_else(|| {
                bad(
                    &format!("{field}.end"),
                    format!("{:?} must be a date YYYY-MM-DD", span.end),
                )
            })?;
            if end < start {
                return Err(bad(
                    &field,
                    format!("end {} is before start {}", span.end, span.start),
                ));
            }
            // Whole local days, end inclusive.
            let from = Time(start.days() * SECONDS_PER_DAY - utc_offset);
            let until = Time((end.days() + 1) * SECONDS_PER_DAY - utc_offset);
            blocked.push((from, until));
        }
        blocked.sort();
        let mut merged: Vec<(Time, Time)> = Vec::with_capacity(blocked.len());
        for (from, until) in blocked {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(until),
                _ => merged.push((from, until)),
            }
        }
        Ok(MaintenanceWindow {
            schedule,
            duration: duration_hours * SECONDS_PER_HOUR,
            start_time,
            utc_offset,
            anchor,
            has_start_date,
            blocked: merged,
            spec: spec.clone(),
        })
    }

    /// The wire form this window was parsed from.
    pub fn spec(&self) -> &MaintenanceWindowSpec {
        &self.spec
    }

    /// Whether an instance falls on local date `d` (a direct check, used by tests as an oracle
    /// and by nothing on the hot path).
    pub fn is_schedule_date(&self, d: Date) -> bool {
        if d < self.anchor {
            return false;
        }
        match self.schedule {
            Schedule::Daily { interval_days } => {
                (d.days() - self.anchor.days()) % interval_days == 0
            }
            Schedule::Weekly {
                interval_weeks,
                day,
            } => {
                d.weekday() == day && ((d.days() - self.anchor_monday()) / 7) % interval_weeks == 0
            }
            Schedule::AbsoluteMonthly {
                interval_months,
                day_of_month,
            } => {
                d.day == day_of_month
                    && (d.month_index() - self.anchor.month_index()) % interval_months == 0
            }
            Schedule::RelativeMonthly {
                interval_months,
                week,
                day,
            } => {
                (d.month_index() - self.anchor.month_index()) % interval_months == 0
                    && relative_day(d.year, d.month, week, day) == Some(d.day)
            }
        }
    }

    fn anchor_monday(&self) -> i64 {
        self.anchor.days() - self.anchor.weekday().index()
    }

    /// The first schedule date on or after `from`.
    pub(crate) fn next_schedule_date(&self, from: Date) -> Option<Date> {
        let from = from.max(self.anchor);
        match self.schedule {
            Schedule::Daily { interval_days } => {
                let delta = from.days() - self.anchor.days();
                let k = (delta + interval_days - 1).div_euclid(interval_days);
                Some(Date::from_days(self.anchor.days() + k * interval_days))
            }
            Schedule::Weekly {
                interval_weeks,
                day,
            } => {
                let monday = self.anchor_monday();
                let period = 7 * interval_weeks;
                // Week blocks start at `monday + k * period`; the occurrence is `day` in that block.
                let mut k = (from.days() - monday).div_euclid(period);
                loop {
                    let candidate = monday + k * period + day.index();
                    if candidate >= from.days() {
                        return Some(Date::from_days(candidate));
                    }
                    k += 1;
                }
            }
            Schedule::AbsoluteMonthly {
                interval_months,
                day_of_month,
            } => self.next_monthly(from, interval_months, |y, m| {
                (day_of_month <= Date::days_in_month(y, m)).then_some(day_of_month)
            }),
            Schedule::RelativeMonthly {
                interval_months,
                week,
                day,
            } => self.next_monthly(from, interval_months, |y, m| relative_day(y, m, week, day)),
        }
    }

    fn next_monthly(
        &self,
        from: Date,
        interval: i64,
        day_in: impl Fn(i64, u32) -> Option<u32>,
    ) -> Option<Date> {
        let base = self.anchor.month_index();
        let first = (from.month_index() - base).div_euclid(interval);
        // A month lacking the day is skipped; a few steps always find one that has it.
        for k in first..first + 64 {
            let index = base + k * interval;
            let (year, month) = (index.div_euclid(12), (index.rem_euclid(12) + 1) as u32);
            if let Some(day) = day_in(year, month) {
                let date = Date { year, month, day };
                if date >= from {
                    return Some(date);
                }
            }
        }
        None
    }

    pub(crate) fn instance_start(&self, d: Date) -> Time {
        Time(d.days() * SECONDS_PER_DAY + self.start_time - self.utc_offset)
    }

    /// The first opening at or after `t`: the earliest instant `from ≥ t` at which work may
    /// start, and the end of that permission. `None` if the window never opens again.
    pub fn next_opening(&self, t: Time) -> Option<Opening> {
        let (today, _) = t.civil(self.utc_offset);
        // Instances last at most 24 h, so one that began yesterday may still be open.
        let mut from_date = Date::from_days(today.days() - 1);
        for _ in 0..SEARCH_LIMIT {
            let d = self.next_schedule_date(from_date)?;
            let start = self.instance_start(d);
            let end = start.plus(self.duration);
            if end > t {
                let mut seg = start.max(t);
                for &(b_from, b_until) in &self.blocked {
                    if b_until <= seg {
                        continue;
                    }
                    if b_from > seg {
                        break;
                    }
                    seg = b_until;
                }
                if seg < end {
                    let until = self
                        .blocked
                        .iter()
                        .find(|(b_from, _)| *b_from > seg)
                        .map_or(end, |(b_from, _)| end.min(*b_from));
                    return Some(Opening { from: seg, until });
                }
                // Blocked through the end of this instance: skip to the end of the blocked span.
                let (resume, _) = seg.civil(self.utc_offset);
                from_date = Date::from_days((d.days() + 1).max(resume.days() - 1));
            } else {
                from_date = Date::from_days(d.days() + 1);
            }
        }
        None
    }

    /// Whether work may start at `t`.
    pub fn is_open(&self, t: Time) -> bool {
        self.next_opening(t).is_some_and(|o| o.from == t)
    }

    pub fn has_start_date(&self) -> bool {
        self.has_start_date
    }
}

/// The day of month of the `week`-th `day` in a month (`Last` = the last one).
fn relative_day(year: i64, month: u32, week: WeekIndex, day: Weekday) -> Option<u32> {
    let first = Date {
        year,
        month,
        day: 1,
    };
    let first_match = 1 + (day.index() - first.weekday().index()).rem_euclid(7) as u32;
    let n = match week {
        WeekIndex::First => 0,
        WeekIndex::Second => 1,
        WeekIndex::Third => 2,
        WeekIndex::Fourth => 3,
        WeekIndex::Last => {
            let len = Date::days_in_month(year, month);
            return Some(first_match + 7 * ((len - first_match) / 7));
        }
    };
    Some(first_match + 7 * n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(json: &str) -> MaintenanceWindow {
        let spec: MaintenanceWindowSpec = serde_json::from_str(json).unwrap();
        MaintenanceWindow::parse(&spec, "w").unwrap()
    }

    fn t(s: &str) -> Time {
        Time::parse(s).unwrap()
    }

    /// Brute force: is work allowed to start at `t`, from the direct date predicate.
    fn oracle_open(w: &MaintenanceWindow, at: Time) -> bool {
        let (today, _) = at.civil(w.utc_offset);
        let in_instance = [today.days() - 1, today.days()].into_iter().any(|days| {
            let d = Date::from_days(days);
            let start = w.instance_start(d);
            w.is_schedule_date(d) && start <= at && at < start.plus(w.duration)
        });
        in_instance && !w.blocked.iter().any(|(a, b)| *a <= at && at < *b)
    }

    #[test]
    fn daily_window_opens_at_start_time() {
        let w = window(
            r#"{"schedule":{"daily":{"intervalDays":1}},"durationHours":4,"startTime":"03:00"}"#,
        );
        let o = w.next_opening(t("2026-03-02T01:00:00Z")).unwrap();
        assert_eq!(o.from, t("2026-03-02T03:00:00Z"));
        assert_eq!(o.until, t("2026-03-02T07:00:00Z"));
        assert!(w.is_open(t("2026-03-02T06:59:59Z")));
        assert!(!w.is_open(t("2026-03-02T07:00:00Z")));
    }

    #[test]
    fn instance_from_yesterday_spills_past_midnight() {
        let w = window(
            r#"{"schedule":{"daily":{"intervalDays":1}},"durationHours":6,"startTime":"22:00","utcOffset":"+00:00"}"#,
        );
        let o = w.next_opening(t("2026-03-02T02:00:00Z")).unwrap();
        assert_eq!(o.from, t("2026-03-02T02:00:00Z"));
        assert_eq!(o.until, t("2026-03-02T04:00:00Z"));
    }

    #[test]
    fn negative_and_positive_offsets() {
        let w = window(
            r#"{"schedule":{"weekly":{"intervalWeeks":1,"dayOfWeek":"Tuesday"}},"durationHours":4,"startTime":"10:00","utcOffset":"-08:00"}"#,
        );
        assert_eq!(
            w.next_opening(t("2026-03-02T00:00:00Z")).unwrap().from,
            t("2026-03-03T18:00:00Z")
        );
        let w = window(
            r#"{"schedule":{"weekly":{"intervalWeeks":1,"dayOfWeek":"Tuesday"}},"durationHours":4,"startTime":"01:00","utcOffset":"+05:30"}"#,
        );
        assert_eq!(
            w.next_opening(t("2026-03-02T00:00:00Z")).unwrap().from,
            t("2026-03-02T19:30:00Z")
        );
    }

    #[test]
    fn absolute_monthly_day_31_skips_short_months() {
        let w = window(
            r#"{"schedule":{"absoluteMonthly":{"intervalMonths":1,"dayOfMonth":31}},"durationHours":4,"startTime":"00:00"}"#,
        );
        assert_eq!(
            w.next_opening(t("2026-04-01T00:00:00Z")).unwrap().from,
            t("2026-05-31T00:00:00Z")
        );
        let w = window(
            r#"{"schedule":{"absoluteMonthly":{"intervalMonths":1,"dayOfMonth":29}},"durationHours":4,"startTime":"00:00"}"#,
        );
        assert_eq!(
            w.next_opening(t("2027-02-01T00:00:00Z")).unwrap().from,
            t("2027-03-29T00:00:00Z")
        );
        assert_eq!(
            w.next_opening(t("2028-02-01T00:00:00Z")).unwrap().from,
            t("2028-02-29T00:00:00Z")
        );
    }

    #[test]
    fn relative_monthly_last_and_fourth() {
        let w = window(
            r#"{"schedule":{"relativeMonthly":{"intervalMonths":1,"weekIndex":"Last","dayOfWeek":"Friday"}},"durationHours":4,"startTime":"00:00"}"#,
        );
        // May 2026 has five Fridays: 1, 8, 15, 22, 29.
        assert_eq!(
            w.next_opening(t("2026-05-01T05:00:00Z")).unwrap().from,
            t("2026-05-29T00:00:00Z")
        );
        let w = window(
            r#"{"schedule":{"relativeMonthly":{"intervalMonths":1,"weekIndex":"Fourth","dayOfWeek":"Friday"}},"durationHours":4,"startTime":"00:00"}"#,
        );
        assert_eq!(
            w.next_opening(t("2026-05-01T05:00:00Z")).unwrap().from,
            t("2026-05-22T00:00:00Z")
        );
    }

    #[test]
    fn start_date_in_the_future_and_intervals() {
        let w = window(
            r#"{"schedule":{"weekly":{"intervalWeeks":2,"dayOfWeek":"Monday"}},"durationHours":4,"startTime":"00:00","startDate":"2026-03-04"}"#,
        );
        // The week of 2026-03-04 (a Wednesday) starts on Monday 2026-03-02, before startDate: its
        // Monday is skipped and the cadence keeps counting from that week.
        assert_eq!(
            w.next_opening(t("2026-01-01T00:00:00Z")).unwrap().from,
            t("2026-03-16T00:00:00Z")
        );
    }

    #[test]
    fn not_allowed_dates_span_a_window() {
        let w = window(
            r#"{"schedule":{"daily":{"intervalDays":1}},"durationHours":4,"startTime":"22:00","utcOffset":"+02:00","notAllowedDates":[{"start":"2026-03-02","end":"2026-03-04"}]}"#,
        );
        // Blocked from 2026-03-01T22:00Z to 2026-03-04T22:00Z; the instance of 03-04 local
        // (20:00Z) is blocked, the one of 03-05 local opens at 2026-03-05T20:00Z... but the
        // 03-04 instance runs until 2026-03-05T00:00Z, so it opens as the block ends.
        let o = w.next_opening(t("2026-03-02T00:00:00Z")).unwrap();
        assert_eq!(o.from, t("2026-03-04T22:00:00Z"));
        assert_eq!(o.until, t("2026-03-05T00:00:00Z"));
    }

    #[test]
    fn rejects_bad_fields_by_name() {
        for (json, field) in [
            (r#"{"durationHours":4,"startTime":"00:00"}"#, "w.schedule"),
            (r#"{"schedule":{},"startTime":"00:00"}"#, "w.schedule"),
            (
                r#"{"schedule":{"daily":{"intervalDays":8}},"startTime":"00:00"}"#,
                "intervalDays",
            ),
            (
                r#"{"schedule":{"daily":{"intervalDays":1}},"durationHours":3,"startTime":"00:00"}"#,
                "durationHours",
            ),
            (
                r#"{"schedule":{"daily":{"intervalDays":1}},"startTime":"24:00"}"#,
                "startTime",
            ),
            (r#"{"schedule":{"daily":{"intervalDays":1}}}"#, "startTime"),
            (
                r#"{"schedule":{"daily":{"intervalDays":1}},"startTime":"00:00","utcOffset":"+15:00"}"#,
                "utcOffset",
            ),
            (
                r#"{"schedule":{"weekly":{"intervalWeeks":1,"dayOfWeek":"Funday"}},"startTime":"00:00"}"#,
                "dayOfWeek",
            ),
            (
                r#"{"schedule":{"relativeMonthly":{"intervalMonths":1,"weekIndex":"Fifth","dayOfWeek":"Monday"}},"startTime":"00:00"}"#,
                "weekIndex",
            ),
            (
                r#"{"schedule":{"absoluteMonthly":{"intervalMonths":7,"dayOfMonth":1}},"startTime":"00:00"}"#,
                "intervalMonths",
            ),
            (
                r#"{"schedule":{"daily":{"intervalDays":1}},"startTime":"00:00","startDate":"2026-02-30"}"#,
                "startDate",
            ),
            (
                r#"{"schedule":{"daily":{"intervalDays":1}},"startTime":"00:00","notAllowedDates":[{"start":"2026-03-05","end":"2026-03-01"}]}"#,
                "notAllowedDates[0]",
            ),
        ] {
            let spec: MaintenanceWindowSpec = serde_json::from_str(json).unwrap();
            let err = MaintenanceWindow::parse(&spec, "w").unwrap_err();
            assert!(err.target.contains(field), "{json}: {err:?}");
        }
    }

    use proptest::prelude::*;

    fn arb_window() -> impl Strategy<Value = MaintenanceWindow> {
        let schedule = prop_oneof![
            (1i64..=7).prop_map(|i| format!(r#"{{"daily":{{"intervalDays":{i}}}}}"#)),
            (1i64..=4, 0usize..7).prop_map(|(i, d)| format!(
                r#"{{"weekly":{{"intervalWeeks":{i},"dayOfWeek":"{}"}}}}"#,
                Weekday::ALL[d].name()
            )),
            (1i64..=6, 1i64..=31).prop_map(|(i, d)| format!(
                r#"{{"absoluteMonthly":{{"intervalMonths":{i},"dayOfMonth":{d}}}}}"#
            )),
            (1i64..=6, 0usize..5, 0usize..7).prop_map(|(i, w, d)| format!(
                r#"{{"relativeMonthly":{{"intervalMonths":{i},"weekIndex":"{}","dayOfWeek":"{}"}}}}"#,
                ["First", "Second", "Third", "Fourth", "Last"][w],
                Weekday::ALL[d].name()
            )),
        ];
        (schedule, 4i64..=24, 0i64..24, 0i64..4, -14i64..=14, proptest::option::of(0i64..120), proptest::option::of((0i64..90, 0i64..10)))
            .prop_map(|(schedule, hours, h, quarter, off, start, blocked)| {
                let offset = format!("{}{:02}:00", if off < 0 { '-' } else { '+' }, off.abs());
                let mut json = format!(
                    r#"{{"schedule":{schedule},"durationHours":{hours},"startTime":"{h:02}:{:02}","utcOffset":"{offset}""#,
                    quarter * 15
                );
                if let Some(s) = start {
                    json += &format!(r#","startDate":"{}""#, Date::from_days(Date::parse("2026-01-01").unwrap().days() + s));
                }
                if let Some((b, len)) = blocked {
                    let from = Date::from_days(Date::parse("2026-01-10").unwrap().days() + b);
                    json += &format!(r#","notAllowedDates":[{{"start":"{from}","end":"{}"}}]"#, Date::from_days(from.days() + len));
                }
                json.push('}');
                window(&json)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(150))]
        /// The O(1)-per-date search agrees with a minute-by-minute walk over the brute-force predicate.
        #[test]
        fn next_opening_matches_minute_oracle(w in arb_window(), start_minute in 0i64..(60 * 24 * 120)) {
            let t0 = Time::parse("2026-01-01T00:00:00Z").unwrap().plus(start_minute * 60);
            let got = w.next_opening(t0);
            let horizon = 60 * 24 * 400;
            let mut found = None;
            for m in 0..horizon {
                let at = t0.plus(m * 60);
                if oracle_open(&w, at) {
                    found = Some(at);
                    break;
                }
            }
            match (got, found) {
                (Some(o), Some(at)) => {
                    prop_assert_eq!(o.from, at);
                    // Work may start at every minute of the permission.
                    let mut at = o.from;
                    while at < o.until {
                        prop_assert!(oracle_open(&w, at), "closed at {} inside {:?}", at, o);
                        at = at.plus(60);
                    }
                }
                (None, None) => {}
                (got, found) => prop_assert!(got.map(|o| o.from.unix() - t0.unix() >= horizon * 60).unwrap_or(false), "got {:?}, oracle {:?}", got, found),
            }
        }
    }
}
