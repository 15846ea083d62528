//! Large stored documents as last answered, eTag included, so that reading a run that has not
//! changed costs a look at its eTag instead of unpacking, checking and copying megabytes of text
//! (a run over 100,000 members is 8 MB). Bounded in bytes; the entry read least recently goes
//! first.

use std::collections::VecDeque;
use std::sync::Mutex;

use axum::body::Bytes;

use crate::store::Kind;

/// Answers smaller than this are read from the store each time: they cost little to read, and
/// keeping them would cost a second query for every read.
pub const KEPT_FROM: usize = 64 * 1024;

/// At most this many bytes of answers are kept.
pub const BUDGET: usize = 32 << 20;

struct Answer {
    fleet: String,
    kind: Kind,
    name: String,
    etag: String,
    body: Bytes,
}

impl Answer {
    fn is(&self, fleet: &str, kind: Kind, name: &str) -> bool {
        self.kind == kind && self.name == name && self.fleet == fleet
    }
}

/// The kept answers, most recently read last.
#[derive(Default)]
pub struct Answers {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    entries: VecDeque<Answer>,
    bytes: usize,
}

impl Answers {
    /// Whether an answer for this resource is kept, at any eTag: only then is its eTag worth
    /// asking the store for.
    pub fn holds(&self, fleet: &str, kind: Kind, name: &str) -> bool {
        self.kept
            .lock()
            .is_ok_and(|k| k.entries.iter().any(|a| a.is(fleet, kind, name)))
    }

    /// The kept answer for this resource if it was made at `etag` (eTags are never reused, so
    /// the same eTag is the same text).
    pub fn get(&self, fleet: &str, kind: Kind, name: &str, etag: &str) -> Option<Bytes> {
        let mut kept = self.kept.lock().ok()?;
        let at = kept.entries.iter().position(|a| a.is(fleet, kind, name))?;
        if kept.entries[at].etag != etag {
            return None;
        }
        let answer = kept.entries.remove(at)?;
        let body = answer.body.clone();
        kept.entries.push_back(answer);
        Some(body)
    }

    /// Keeps `body` as this resource's answer at `etag`, in place of any older one, if it is
    /// large enough to be worth it and small enough to fit.
    pub fn put(&self, fleet: &str, kind: Kind, name: &str, etag: &str, body: &Bytes) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        if let Some(at) = kept.entries.iter().position(|a| a.is(fleet, kind, name))
            && let Some(old) = kept.entries.remove(at)
        {
            kept.bytes -= old.body.len();
        }
        if body.len() < KEPT_FROM || body.len() > BUDGET {
            return;
        }
        while kept.bytes + body.len() > BUDGET {
            let Some(old) = kept.entries.pop_front() else {
                break;
            };
            kept.bytes -= old.body.len();
        }
        kept.bytes += body.len();
        kept.entries.push_back(Answer {
            fleet: fleet.to_string(),
            kind,
            name: name.to_string(),
            etag: etag.to_string(),
            body: body.clone(),
        });
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> usize {
        self.kept.lock().map_or(0, |k| k.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(size: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; size])
    }

    #[test]
    fn an_answer_is_served_only_at_its_etag() {
        let answers = Answers::default();
        let big = body(KEPT_FROM, b'a');
        answers.put("f", Kind::Run, "r", "7", &big);
        assert!(answers.holds("f", Kind::Run, "r"));
        assert_eq!(answers.get("f", Kind::Run, "r", "7"), Some(big));
        assert_eq!(answers.get("f", Kind::Run, "r", "8"), None);
        assert_eq!(answers.get("f", Kind::Run, "other", "7"), None);
        assert_eq!(answers.get("g", Kind::Run, "r", "7"), None);
        assert_eq!(answers.get("f", Kind::RunSnapshot, "r", "7"), None);
        // A newer answer replaces the older one.
        let newer = body(KEPT_FROM, b'b');
        answers.put("f", Kind::Run, "r", "8", &newer);
        assert_eq!(answers.get("f", Kind::Run, "r", "7"), None);
        assert_eq!(answers.get("f", Kind::Run, "r", "8"), Some(newer));
        assert_eq!(answers.bytes(), KEPT_FROM);
        // A small one is not kept, and drops the larger one it replaces.
        answers.put("f", Kind::Run, "r", "9", &body(10, b'c'));
        assert!(!answers.holds("f", Kind::Run, "r"));
        assert_eq!(answers.bytes(), 0);
    }

    #[test]
    fn the_least_recently_read_goes_first_and_the_budget_holds() {
        let answers = Answers::default();
        let size = BUDGET / 3;
        for name in ["a", "b", "c"] {
            answers.put("f", Kind::Run, name, "1", &body(size, b'x'));
        }
        // Read "a", so "b" is now the least recently read.
        assert!(answers.get("f", Kind::Run, "a", "1").is_some());
        answers.put("f", Kind::Run, "d", "1", &body(size, b'y'));
        assert!(answers.holds("f", Kind::Run, "a"));
        assert!(!answers.holds("f", Kind::Run, "b"));
        assert!(answers.holds("f", Kind::Run, "c"));
        assert!(answers.holds("f", Kind::Run, "d"));
        assert!(answers.bytes() <= BUDGET);
        // Larger than the whole budget: not kept.
        answers.put("f", Kind::Run, "e", "1", &body(BUDGET + 1, b'z'));
        assert!(!answers.holds("f", Kind::Run, "e"));
        assert!(answers.bytes() <= BUDGET);
    }
}
