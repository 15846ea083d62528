//! Kubernetes label selectors in their string form (SEMANTICS §2): `=`, `==`, `!=`, `in`,
//! `notin`, exists (`key`) and not-exists (`!key`), comma-separated terms that are ANDed.
//!
//! No maintained crate parses the string form, so this is the project's own parser. Errors give
//! the byte position and the term.

use std::collections::BTreeMap;
use std::fmt;

pub const MAX_SELECTOR_LENGTH: usize = 512;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            // `!=` and `notin` also match members that lack the key (SEMANTICS §2).
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed selector: all requirements must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    text: String,
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectorError {
    /// Byte offset in the selector text where the problem is.
    pub position: usize,
    pub term: String,
    pub problem: String,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at position {} in term {:?}: {}",
            self.position, self.term, self.problem
        )
    }
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        if text.len() > MAX_SELECTOR_LENGTH {
            return Err(SelectorError {
                position: MAX_SELECTOR_LENGTH,
                term: String::new(),
                problem: format!(
                    "a selector is at most {MAX_SELECTOR_LENGTH} characters, this one has {}",
                    text.len()
                ),
            });
        }
        if text.trim().is_empty() {
            return Err(SelectorError {
                position: 0,
                term: String::new(),
                problem: "the selector is empty".into(),
            });
        }
        let mut requirements = Vec::new();
        for (start, term) in split_terms(text) {
            requirements.push(parse_term(term, start)?);
        }
        Ok(Selector {
            text: text.to_string(),
            requirements,
        })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

/// Splits at commas that are not inside parentheses, keeping each term's byte offset.
fn split_terms(text: &str) -> Vec<(usize, &str)> {
    let mut terms = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth <= 0 => {
                terms.push((start, &text[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push((start, &text[start..]));
    terms
}

fn parse_term(raw: &str, offset: usize) -> Result<Requirement, SelectorError> {
    let lead = raw.len() - raw.trim_start().len();
    let term = raw.trim();
    let position = offset + lead;
    let fail = |at: usize, problem: String| SelectorError {
        position: position + at,
        term: term.to_string(),
        problem,
    };
    if term.is_empty() {
        return Err(fail(
            0,
            "empty term (two commas in a row, or a trailing comma)".into(),
        ));
    }
    if let Some(rest) = term.strip_prefix('!') {
        let key = rest.trim();
        check_key(key).map_err(|p| fail(1, p))?;
        return Ok(Requirement::NotExists(key.to_string()));
    }
    for (op, len) in [("==", 2usize), ("!=", 2), ("=", 1)] {
        if let Some(at) = term.find(op) {
            // `!=` contains `=`; the loop order tries the two-character operators first.
            let key = term[..at].trim();
            let value = term[at + len..].trim();
            check_key(key).map_err(|p| fail(0, p))?;
            check_value(value).map_err(|p| fail(at + len, p))?;
            return Ok(match op {
                "!=" => Requirement::NotEquals(key.into(), value.into()),
                _ => Requirement::Equals(key.into(), value.into()),
            });
        }
    }
    // Set-based forms: `key in (a,b)`, `key notin (a,b)`.
    let mut words = term.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    if rest.is_empty() {
        if key.contains('(') || key.contains(')') {
            return Err(fail(
                0,
                "expected an operator between the key and the value list".into(),
            ));
        }
        check_key(key).map_err(|p| fail(0, p))?;
        return Ok(Requirement::Exists(key.to_string()));
    }
    check_key(key).map_err(|p| fail(0, p))?;
    let rest_at = term.len() - rest.len();
    let (negated, list) = if let Some(list) = rest.strip_prefix("notin") {
        (true, list)
    } else if let Some(list) = rest.strip_prefix("in") {
        (false, list)
    } else {
        return Err(fail(
            rest_at,
            format!(
                "unknown operator {:?}: expected =, ==, !=, in or notin",
                rest.split_whitespace().next().unwrap_or(rest)
            ),
        ));
    };
    let list_at = term.len() - list.len();
    let list = list.trim();
    let Some(inner) = list.strip_prefix('(').and_then(|l| l.strip_suffix(')')) else {
        return Err(fail(
            list_at,
            "expected a value list in parentheses, like (a, b)".into(),
        ));
    };
    if inner.trim().is_empty() {
        return Err(fail(list_at, "the value list is empty".into()));
    }
    let mut values = Vec::new();
    for value in inner.split(',') {
        let value = value.trim();
        check_value(value).map_err(|p| fail(list_at, p))?;
        if value.is_empty() {
            return Err(fail(list_at, "empty value in the list".into()));
        }
        values.push(value.to_string());
    }
    Ok(if negated {
        Requirement::NotIn(key.into(), values)
    } else {
        Requirement::In(key.into(), values)
    })
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("missing label key".into());
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "invalid label key prefix {prefix:?}: must be a DNS subdomain"
            ));
        }
    }
    if !is_label_name(name) || name.is_empty() {
        return Err(format!(
            "invalid label key {key:?}: the name must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), String> {
    if is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value {value:?}: at most 63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

/// Kubernetes' label-value form (also the name part of a key); empty is allowed here.
pub fn is_label_name(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let b = s.as_bytes();
    s.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Validates a member label key (for member create/update).
pub fn validate_label_key(key: &str) -> Result<(), String> {
    check_key(key)
}

/// Validates a member label value.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    check_value(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator() {
        let l = labels(&[
            ("env", "prod"),
            ("geo", "east"),
            ("fleet.example.com/tier", "web"),
        ]);
        let cases = [
            ("env=prod", true),
            ("env==prod", true),
            ("env!=prod", false),
            ("env!=dev", true),
            ("missing!=x", true),
            ("env in (prod, dev)", true),
            ("env in (dev)", false),
            ("env notin (dev)", true),
            ("missing notin (dev)", true),
            ("env notin (prod)", false),
            ("geo", true),
            ("missing", false),
            ("!missing", true),
            ("!geo", false),
            ("fleet.example.com/tier=web", true),
            ("env=prod,geo=east", true),
            ("env=prod, geo=west", false),
            (" env = prod ", true),
            ("env=", false),
        ];
        for (text, want) in cases {
            let s = Selector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(s.matches(&l), want, "{text}");
        }
    }

    #[test]
    fn errors_point_at_the_term() {
        let e = Selector::parse("").unwrap_err();
        assert!(e.problem.contains("empty"));
        let e = Selector::parse("env=prod, geo in ()").unwrap_err();
        assert_eq!(e.term, "geo in ()");
        assert!(e.problem.contains("empty"), "{e}");
        assert!(e.position >= 10, "{e}");
        let e = Selector::parse("env=prod,,x").unwrap_err();
        assert!(e.problem.contains("empty term"));
        let e = Selector::parse("env like prod").unwrap_err();
        assert!(e.problem.contains("unknown operator"), "{e}");
        let e = Selector::parse("-bad=x").unwrap_err();
        assert!(e.problem.contains("invalid label key"), "{e}");
        let e = Selector::parse("env in prod").unwrap_err();
        assert!(e.problem.contains("parentheses"), "{e}");
        let e = Selector::parse(&"a=b,".repeat(200)).unwrap_err();
        assert!(e.problem.contains("at most 512"), "{e}");
    }
}
