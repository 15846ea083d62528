//! `maxConcurrency` and `maxAllowedFailures` values: `"N"` or `"P%"` (SEMANTICS §3, §4).

use std::fmt;

/// A count or a percentage of a scope's members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Amount {
    Count(u64),
    Percent(u8),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Count(n) => write!(f, "{n}"),
            Amount::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Parses the digits of a count: no sign, no leading zero (except "0" itself), no fraction.
fn whole_number(text: &str) -> Option<u64> {
    if text.is_empty()
        || !text.bytes().all(|c| c.is_ascii_digit())
        || (text.len() > 1 && text.starts_with('0'))
    {
        return None;
    }
    text.parse().ok()
}

impl Amount {
    /// `maxConcurrency`: `^(?:([1-9]\d*)|([1-9]\d?|100)%)$`.
    pub fn parse_concurrency(text: &str) -> Option<Amount> {
        match text.strip_suffix('%') {
            Some(p) => match whole_number(p)? {
                1..=100 => Some(Amount::Percent(p.parse().ok()?)),
                _ => None,
            },
            None => match whole_number(text)? {
                0 => None,
                n => Some(Amount::Count(n)),
            },
        }
    }

    /// `maxAllowedFailures`: `^(?:0|[1-9]\d*|(?:0|[1-9]\d?|100)%)$`.
    pub fn parse_failures(text: &str) -> Option<Amount> {
        match text.strip_suffix('%') {
            Some(p) => match whole_number(p)? {
                n @ 0..=100 => Some(Amount::Percent(n as u8)),
                _ => None,
            },
            None => whole_number(text).map(Amount::Count),
        }
    }

    /// A concurrency resolved against a scope of `size` members: percentages round down,
    /// never below 1 (SEMANTICS §3).
    pub fn resolve_concurrency(self, size: u64) -> u64 {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => (size * u64::from(p) / 100).max(1),
        }
    }

    /// A failure tolerance resolved against a scope of `size` members: percentages round up
    /// (SEMANTICS §4: 25% of 5 → 2, of 19 → 5, 10% of 1 → 1).
    pub fn resolve_failures(self, size: u64) -> u64 {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => (size * u64::from(p)).div_ceil(100),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_forms() {
        assert_eq!(Amount::parse_concurrency("5"), Some(Amount::Count(5)));
        assert_eq!(Amount::parse_concurrency("25%"), Some(Amount::Percent(25)));
        assert_eq!(
            Amount::parse_concurrency("100%"),
            Some(Amount::Percent(100))
        );
        for bad in [
            "0", "0%", "-1", "1.5", "abc", "101%", "", "%", "05", " 5", "5 %",
        ] {
            assert_eq!(Amount::parse_concurrency(bad), None, "{bad}");
        }
    }

    #[test]
    fn failure_forms() {
        assert_eq!(Amount::parse_failures("0"), Some(Amount::Count(0)));
        assert_eq!(Amount::parse_failures("0%"), Some(Amount::Percent(0)));
        for bad in ["-1", "1.5", "101%", "x", "01"] {
            assert_eq!(Amount::parse_failures(bad), None, "{bad}");
        }
    }

    #[test]
    fn rounding() {
        let p25 = Amount::Percent(25);
        assert_eq!(p25.resolve_failures(5), 2);
        assert_eq!(p25.resolve_failures(7), 2);
        assert_eq!(p25.resolve_failures(12), 3);
        assert_eq!(p25.resolve_failures(19), 5);
        assert_eq!(Amount::Percent(10).resolve_failures(1), 1);
        assert_eq!(p25.resolve_concurrency(20), 5);
        assert_eq!(Amount::Percent(50).resolve_concurrency(8), 4);
        assert_eq!(Amount::Percent(10).resolve_concurrency(3), 1);
    }
}
