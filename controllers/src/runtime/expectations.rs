//! Expectations (CTL-8): per controller key, the creations and deletions a controller has issued
//! and not yet seen come back through its watch. Until they are observed (or 5 minutes pass), a
//! sync must not act on the cache again, or it would create the same Pods twice. Deletions are
//! tracked by the deleted object's key (`ns/name`), so only the deletion of an object this
//! controller deleted lowers the count (client-go's `UIDTrackingControllerExpectations`).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a record stays authoritative (upstream's `ExpectationsTimeout`).
pub const TIMEOUT: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone)]
struct Record {
    add: i64,
    del: i64,
    at: Instant,
    /// Keys of the objects whose deletion is expected.
    deleting: HashSet<String>,
}

/// The expectations of one controller, keyed by the owner's `ns/name`.
#[derive(Debug, Default)]
pub struct Expectations {
    records: Mutex<HashMap<String, Record>>,
}

impl Expectations {
    /// No expectations.
    pub fn new() -> Self {
        Self::default()
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.records.lock().expect("expectations lock")
    }

    /// Replaces `key`'s record: `add` creations and `del` deletions expected from now on.
    pub fn set(&self, key: &str, add: i64, del: i64) {
        self.set_at(key, add, del, Instant::now());
    }

    fn set_at(&self, key: &str, add: i64, del: i64, at: Instant) {
        self.records().insert(
            key.to_string(),
            Record {
                add,
                del,
                at,
                deleting: HashSet::new(),
            },
        );
    }

    /// `n` creations are about to be issued.
    pub fn expect_creations(&self, key: &str, n: usize) {
        self.set(key, n as i64, 0);
    }

    /// The objects `keys` (`ns/name`) are about to be deleted.
    pub fn expect_deletions(&self, key: &str, keys: &[String]) {
        let mut records = self.records();
        records.insert(
            key.to_string(),
            Record {
                add: 0,
                del: keys.len() as i64,
                at: Instant::now(),
                deleting: keys.iter().cloned().collect(),
            },
        );
    }

    /// Raises the counts (the timestamp stays).
    pub fn raise(&self, key: &str, add: i64, del: i64) {
        if let Some(r) = self.records().get_mut(key) {
            r.add += add;
            r.del += del;
        }
    }

    /// Lowers the counts (the timestamp stays).
    pub fn lower(&self, key: &str, add: i64, del: i64) {
        self.raise(key, -add, -del);
    }

    /// One creation was observed, or will never be (it failed or was not attempted).
    pub fn creation_observed(&self, key: &str) {
        self.lower(key, 1, 0);
    }

    /// The object `object` (`ns/name`) was seen deleted, or its deletion failed: counts only when
    /// its deletion was expected.
    pub fn deletion_observed(&self, key: &str, object: &str) {
        let mut records = self.records();
        if let Some(r) = records.get_mut(key) {
            if r.deleting.remove(object) {
                r.del -= 1;
            }
        }
    }

    /// Whether a sync may act (CTL-8): no record, a fulfilled one, or an expired one.
    pub fn satisfied(&self, key: &str) -> bool {
        self.satisfied_at(key, Instant::now())
    }

    fn satisfied_at(&self, key: &str, now: Instant) -> bool {
        match self.records().get(key) {
            None => true,
            Some(r) if r.add <= 0 && r.del <= 0 => true,
            Some(r) if now.saturating_duration_since(r.at) > TIMEOUT => {
                tracing::debug!(key, "expectations expired");
                true
            }
            Some(_) => false,
        }
    }

    /// Forgets `key` (its owner was deleted).
    pub fn delete(&self, key: &str) {
        self.records().remove(key);
    }

    /// The pending `(add, del)` of `key`, for logs and tests.
    pub fn pending(&self, key: &str) -> Option<(i64, i64)> {
        self.records().get(key).map(|r| (r.add, r.del))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl8_satisfied_expectations_four_way_rule() {
        let e = Expectations::new();
        let now = Instant::now();
        type Setup<'a> = Box<dyn Fn(&Expectations) + 'a>;
        let cases: Vec<(&str, Setup<'_>, Instant, bool)> = vec![
            ("CTL-8 no record: satisfied", Box::new(|_| {}), now, true),
            (
                "CTL-8 pending creations: not satisfied",
                Box::new(|e| e.set_at("k", 2, 0, now)),
                now,
                false,
            ),
            (
                "CTL-8 fulfilled after observations",
                Box::new(|e| {
                    e.set_at("k", 2, 0, now);
                    e.creation_observed("k");
                    e.creation_observed("k");
                }),
                now,
                true,
            ),
            (
                "CTL-8 expired after 5 minutes",
                Box::new(|e| e.set_at("k", 2, 0, now)),
                now + TIMEOUT + Duration::from_secs(1),
                true,
            ),
            (
                "CTL-8 not yet expired at 5 minutes",
                Box::new(|e| e.set_at("k", 2, 0, now)),
                now + TIMEOUT,
                false,
            ),
        ];
        for (name, setup, at, want) in cases {
            e.delete("k");
            setup(&e);
            assert_eq!(e.satisfied_at("k", at), want, "{name}");
        }
    }

    #[test]
    fn ctl8_deletions_are_tracked_by_object_key() {
        let e = Expectations::new();
        e.expect_deletions("ns/rs", &["ns/a".into(), "ns/b".into()]);
        assert!(!e.satisfied("ns/rs"));
        e.deletion_observed("ns/rs", "ns/unrelated");
        assert_eq!(
            e.pending("ns/rs"),
            Some((0, 2)),
            "CTL-8 an unexpected deletion does not count"
        );
        e.deletion_observed("ns/rs", "ns/a");
        e.deletion_observed("ns/rs", "ns/a");
        assert_eq!(
            e.pending("ns/rs"),
            Some((0, 1)),
            "CTL-8 the same deletion counts once"
        );
        e.deletion_observed("ns/rs", "ns/b");
        assert!(e.satisfied("ns/rs"));
    }
}
