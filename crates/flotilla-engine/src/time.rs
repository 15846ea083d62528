//! Instants and civil-calendar arithmetic: the engine's notion of time, passed in as a value.
//!
//! An instant is whole seconds since the Unix epoch, UTC. Maintenance windows and scheduled
//! gates use fixed UTC offsets (no daylight saving, SEMANTICS §3a), so the civil arithmetic
//! here is plain proleptic-Gregorian day counting.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant: seconds since 1970-01-01T00:00:00Z.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub i64);

pub const SECONDS_PER_DAY: i64 = 86_400;
pub const SECONDS_PER_HOUR: i64 = 3_600;

impl Time {
    pub const fn from_unix(seconds: i64) -> Time {
        Time(seconds)
    }

    pub const fn unix(self) -> i64 {
        self.0
    }

    pub const fn plus(self, seconds: i64) -> Time {
        Time(self.0.saturating_add(seconds))
    }

    /// Parses an RFC 3339 timestamp (`2026-03-02T00:00:00Z`, any offset, fractions truncated).
    pub fn parse(text: &str) -> Result<Time, String> {
        let ts: jiff::Timestamp = text
            .trim()
            .parse()
            .map_err(|e| format!("{text:?} is not an RFC 3339 timestamp: {e}"))?;
        Ok(Time(ts.as_second()))
    }

    /// The civil date and time of this instant at a fixed UTC offset (seconds east of UTC).
    pub fn civil(self, offset_seconds: i64) -> (Date, i64) {
        let local = self.0 + offset_seconds;
        let days = local.div_euclid(SECONDS_PER_DAY);
        let second_of_day = local.rem_euclid(SECONDS_PER_DAY);
        (Date::from_days(days), second_of_day)
    }
}

impl fmt::Display for Time {
    /// RFC 3339 in UTC with a `Z`, as the API writes every time.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (date, sod) = self.civil(0);
        write!(
            f,
            "{}T{:02}:{:02}:{:02}Z",
            date,
            sod / 3600,
            (sod / 60) % 60,
            sod % 60
        )
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Time::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A day of the week, Monday first (weeks start on Monday, SEMANTICS §3a).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    pub const ALL: [Weekday; 7] = [
        Weekday::Monday,
        Weekday::Tuesday,
        Weekday::Wednesday,
        Weekday::Thursday,
        Weekday::Friday,
        Weekday::Saturday,
        Weekday::Sunday,
    ];

    /// 0 for Monday … 6 for Sunday.
    pub fn index(self) -> i64 {
        self as i64
    }

    pub fn name(self) -> &'static str {
        match self {
            Weekday::Monday => "Monday",
            Weekday::Tuesday => "Tuesday",
            Weekday::Wednesday => "Wednesday",
            Weekday::Thursday => "Thursday",
            Weekday::Friday => "Friday",
            Weekday::Saturday => "Saturday",
            Weekday::Sunday => "Sunday",
        }
    }

    pub fn parse(text: &str) -> Option<Weekday> {
        Weekday::ALL.into_iter().find(|d| d.name() == text)
    }
}

/// A proleptic-Gregorian calendar date.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date {
    pub year: i64,
    pub month: u32,
    pub day: u32,
}

impl Date {
    /// Days since 1970-01-01 (Howard Hinnant's `days_from_civil`).
    pub fn days(self) -> i64 {
        let y = if self.month <= 2 {
            self.year - 1
        } else {
            self.year
        };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let m = i64::from(self.month);
        let mp = if m > 2 { m - 3 } else { m + 9 };
        let doy = (153 * mp + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// The date `days` after 1970-01-01 (`civil_from_days`).
    pub fn from_days(days: i64) -> Date {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Date { year, month, day }
    }

    pub fn weekday(self) -> Weekday {
        // 1970-01-01 was a Thursday (index 3).
        Weekday::ALL[(self.days() + 3).rem_euclid(7) as usize]
    }

    pub fn is_leap_year(year: i64) -> bool {
        (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
    }

    pub fn days_in_month(year: i64, month: u32) -> u32 {
        match month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            _ if Date::is_leap_year(year) => 29,
            _ => 28,
        }
    }

    /// Parses `YYYY-MM-DD`, checking the day exists.
    pub fn parse(text: &str) -> Option<Date> {
        let b = text.as_bytes();
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let digits = |s: &str| -> Option<i64> {
            if s.bytes().all(|c| c.is_ascii_digit()) {
                s.parse().ok()
            } else {
                None
            }
        };
        let year = digits(&text[0..4])?;
        let month = u32::try_from(digits(&text[5..7])?).ok()?;
        let day = u32::try_from(digits(&text[8..10])?).ok()?;
        if !(1..=12).contains(&month) || day == 0 || day > Date::days_in_month(year, month) {
            return None;
        }
        Some(Date { year, month, day })
    }

    /// Months since year 0, for counting monthly intervals.
    pub fn month_index(self) -> i64 {
        self.year * 12 + i64::from(self.month) - 1
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// Parses `HH:mm` (24 h) into seconds after midnight, with the reference API's pattern
/// `^([01][0-9]|2[0-3]):[0-5][0-9]$`.
pub fn parse_clock(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 5
        || b[2] != b':'
        || !b
            .iter()
            .enumerate()
            .all(|(i, c)| i == 2 || c.is_ascii_digit())
    {
        return None;
    }
    let hours = i64::from(b[0] - b'0') * 10 + i64::from(b[1] - b'0');
    let minutes = i64::from(b[3] - b'0') * 10 + i64::from(b[4] - b'0');
    (hours < 24 && minutes < 60).then_some(hours * 3600 + minutes * 60)
}

/// Parses a UTC offset `±HH:mm` into seconds east of UTC, with the reference API's pattern
/// `^[+-]((0[0-9]|1[0-3]):[0-5][0-9]|14:00)$`.
pub fn parse_utc_offset(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 6 || (b[0] != b'+' && b[0] != b'-') {
        return None;
    }
    let clock = parse_clock(&text[1..])?;
    if clock > 14 * 3600 {
        return None;
    }
    Some(if b[0] == b'-' { -clock } else { clock })
}

/// Parses a scenario duration: `30s`, `10m`, `4h`, `2d`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Option<i64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&text[..i], c),
        _ => (text, 's'),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let n: i64 = digits.parse().ok()?;
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => SECONDS_PER_DAY,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trip_and_weekday() {
        for days in -800_000..800_000i64 {
            if days % 997 != 0 {
                continue;
            }
            assert_eq!(Date::from_days(days).days(), days);
        }
        let d = Date::parse("2026-03-02").unwrap();
        assert_eq!(d.weekday(), Weekday::Monday);
        assert_eq!(
            Date::parse("2024-02-29").unwrap().weekday(),
            Weekday::Thursday
        );
        assert!(Date::parse("2023-02-29").is_none());
        assert!(Date::parse("2026-13-01").is_none());
    }

    #[test]
    fn formats_and_parses_instants() {
        let t = Time::parse("2026-03-02T01:02:03Z").unwrap();
        assert_eq!(t.to_string(), "2026-03-02T01:02:03Z");
        assert_eq!(
            Time::parse("2026-03-02T01:02:03+01:00")
                .unwrap()
                .to_string(),
            "2026-03-02T00:02:03Z"
        );
        assert!(Time::parse("yesterday").is_err());
    }

    #[test]
    fn clocks_offsets_and_durations() {
        assert_eq!(parse_clock("23:59"), Some(86_340));
        assert_eq!(parse_clock("24:00"), None);
        assert_eq!(parse_clock("9:00"), None);
        assert_eq!(parse_utc_offset("-08:00"), Some(-8 * 3600));
        assert_eq!(parse_utc_offset("+14:00"), Some(14 * 3600));
        assert_eq!(parse_utc_offset("+14:30"), None);
        assert_eq!(parse_utc_offset("08:00"), None);
        assert_eq!(parse_duration("90m"), Some(5400));
        assert_eq!(parse_duration("2d"), Some(172_800));
        assert_eq!(parse_duration("45"), Some(45));
        assert_eq!(parse_duration("4x"), None);
        assert_eq!(parse_duration("h"), None);
    }
}
