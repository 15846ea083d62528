//! An issuer's signing keys as last fetched, and when to fetch them again: a decision, no I/O
//! and no clock (the caller passes the instant and does the fetching).
//!
//! A key id not in the set makes a fetch at most once every [`REFETCH_AFTER`] per issuer (any
//! client can send tokens naming made-up key ids; they must not become requests to the
//! provider). The whole set is fetched again after [`MAX_AGE`], so a key the provider removed
//! stops being accepted; a failed fetch keeps the keys held.

use std::time::{Duration, Instant};

use super::jwt::{Algorithm, Jwk};

/// The least time between two fetches of one issuer's keys.
pub const REFETCH_AFTER: Duration = Duration::from_secs(30);

/// How long a fetched set is used before it is fetched again.
pub const MAX_AGE: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
pub struct KeyCache {
    keys: Vec<Jwk>,
    fetched_at: Option<Instant>,
    attempted_at: Option<Instant>,
}

/// What to do for a token's key.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Check the signature with this key.
    Found(Jwk),
    /// Fetch the set now (then look again).
    Fetch,
    /// No such key, and the set was fetched too recently to fetch it again.
    Unknown,
}

impl KeyCache {
    /// The key for a token's `kid` (without one: the only key that permits its algorithm).
    pub fn lookup(&self, kid: Option<&str>, alg: Algorithm, now: Instant) -> Lookup {
        let may_fetch = self
            .attempted_at
            .is_none_or(|at| now.saturating_duration_since(at) >= REFETCH_AFTER);
        let stale = self
            .fetched_at
            .is_none_or(|at| now.saturating_duration_since(at) >= MAX_AGE);
        if stale && may_fetch {
            return Lookup::Fetch;
        }
        let found = match kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None => {
                let mut fitting = self.keys.iter().filter(|k| k.permits(alg));
                match (fitting.next(), fitting.next()) {
                    (Some(only), None) => Some(only),
                    _ => None,
                }
            }
        };
        match found {
            Some(key) => Lookup::Found(key.clone()),
            None if may_fetch => Lookup::Fetch,
            None => Lookup::Unknown,
        }
    }

    /// A fetch is being made now (successful or not, it counts against [`REFETCH_AFTER`]).
    pub fn attempted(&mut self, now: Instant) {
        self.attempted_at = Some(now);
    }

    /// A fetch answered this set.
    pub fn fetched(&mut self, keys: Vec<Jwk>, now: Instant) {
        self.keys = keys;
        self.fetched_at = Some(now);
    }

    pub fn keys(&self) -> &[Jwk] {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oidc::jwt::PublicKey;

    fn key(kid: &str) -> Jwk {
        Jwk {
            kid: Some(kid.into()),
            alg: None,
            key: PublicKey::Ed25519 { x: vec![1; 32] },
        }
    }

    #[test]
    fn an_unknown_key_id_fetches_at_most_once_every_thirty_seconds() {
        let t0 = Instant::now();
        let mut cache = KeyCache::default();
        assert_eq!(cache.lookup(Some("a"), Algorithm::EdDsa, t0), Lookup::Fetch);
        cache.attempted(t0);
        cache.fetched(vec![key("a")], t0);
        assert_eq!(
            cache.lookup(Some("a"), Algorithm::EdDsa, t0),
            Lookup::Found(key("a"))
        );
        // A made-up kid right after: no fetch, however many times it is asked.
        for s in [0, 1, 29] {
            let t = t0 + Duration::from_secs(s);
            assert_eq!(
                cache.lookup(Some("b"), Algorithm::EdDsa, t),
                Lookup::Unknown
            );
        }
        let t30 = t0 + REFETCH_AFTER;
        assert_eq!(
            cache.lookup(Some("b"), Algorithm::EdDsa, t30),
            Lookup::Fetch
        );
        cache.attempted(t30);
        // The provider rotated: the new key is there, the old one gone.
        cache.fetched(vec![key("b")], t30);
        assert_eq!(
            cache.lookup(Some("b"), Algorithm::EdDsa, t30),
            Lookup::Found(key("b"))
        );
        assert_eq!(
            cache.lookup(Some("a"), Algorithm::EdDsa, t30),
            Lookup::Unknown
        );
    }

    #[test]
    fn a_failed_fetch_counts_and_keeps_the_keys_held() {
        let t0 = Instant::now();
        let mut cache = KeyCache::default();
        cache.attempted(t0);
        assert_eq!(
            cache.lookup(Some("a"), Algorithm::EdDsa, t0),
            Lookup::Unknown
        );
        cache.fetched(vec![key("a")], t0);
        let later = t0 + MAX_AGE;
        assert_eq!(
            cache.lookup(Some("a"), Algorithm::EdDsa, later),
            Lookup::Fetch
        );
        cache.attempted(later);
        // The refresh failed: the key held still serves.
        assert_eq!(
            cache.lookup(Some("a"), Algorithm::EdDsa, later),
            Lookup::Found(key("a"))
        );
    }

    #[test]
    fn without_a_key_id_only_a_single_fitting_key_is_used() {
        let t0 = Instant::now();
        let mut cache = KeyCache::default();
        cache.attempted(t0);
        cache.fetched(vec![key("a")], t0);
        assert_eq!(
            cache.lookup(None, Algorithm::EdDsa, t0),
            Lookup::Found(key("a"))
        );
        assert_eq!(cache.lookup(None, Algorithm::Rs256, t0), Lookup::Unknown);
        cache.fetched(vec![key("a"), key("b")], t0);
        assert_eq!(cache.lookup(None, Algorithm::EdDsa, t0), Lookup::Unknown);
    }
}
