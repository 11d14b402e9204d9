//! Expectations (CTL-8): per controller key, the creations and deletions a controller has issued
//! and not yet seen come back through its watch. Until they are observed (or 5 minutes pass), a
//! sync must not act on the cache again, or it would create the same Pods twice. Deletions are
//! tracked by the deleted object's key (`ns/name`), so only the deletion of an object this
//! controller deleted lowers the count (client-go's `UIDTrackingControllerExpectations`).
//!
//! # Read-your-writes: which mechanism when
//!
//! An informer's cache lags the controller's own writes. Four mechanisms bridge that lag; each
//! fits one kind of write, and a new controller picks by what it writes:
//!
//! - **Expectations** (this module), for dependents created with `generateName` or deleted in
//!   bulk: the controller cannot name what it created before the API server answers, and another
//!   kind's informer brings it back, so only counts can be kept. A sync that finds them unmet
//!   does not create or delete (it may still write status). Raised and lowered by
//!   [`crate::runtime::pod_control`] for the ReplicaSet, DaemonSet and Job controllers; the
//!   StatefulSet controller (`StatefulPodControl`, Pods it names) raises them itself before its
//!   own creations and deletions. Observed in the controllers' Pod handlers.
//! - **The written overlay** ([`crate::runtime::written`]), for objects the controller writes by
//!   name and plans from again at once (the Deployment controller's ReplicaSets and its own
//!   status, the Job controller's status, the Endpoints controller's Endpoints): the object a
//!   write returned stands in for the cached one until the informer shows that write, so the
//!   next sync neither conflicts on a stale resourceVersion nor re-creates an object it just
//!   created. It substitutes rather than waits: it never hides another writer's change (it ends
//!   on the object's first informer event).
//! - **Unseen creations** ([`crate::runtime::unseen_creations`]), the overlay for Pods made with
//!   `generateName`, which a controller opts into through
//!   [`crate::runtime::pod_control::PodControl::reading_own_creations`] (the DaemonSet
//!   controller): a creation's answer observes it and the created Pod is read back until the
//!   watch shows it, so the expectations are met as soon as the creations are answered and the
//!   next burst does not wait for the watch.
//! - **The generation tracker** of the EndpointSlice controller (`endpointslice::Tracker`,
//!   upstream's `EndpointSliceTracker`): per Service, the generation (or the deletion) of every
//!   slice it wrote; a sync whose cache has not caught up requeues instead of planning. It waits
//!   rather than substitutes because the slices are planned as one set from all of them, and it
//!   gives up on a write after 10 seconds. It lives with that controller: nothing else plans
//!   from a set of its own objects.
//!
//! Upstream has the first and the last; the two overlays are kpr's, saving the conflict round trips
//! upstream's Deployment controller lives with and the watch's lag between a DaemonSet's bursts.
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

    /// `creations` creations and the deletion of the objects `deletions` (`ns/name`) are about
    /// to be issued (upstream's `SetExpectations`): replaces `key`'s record and restarts its
    /// clock.
    pub fn expect(&self, key: &str, creations: usize, deletions: &[String]) {
        let mut records = self.records();
        records.insert(
            key.to_string(),
            Record {
                add: creations as i64,
                del: deletions.len() as i64,
                at: Instant::now(),
                deleting: deletions.iter().cloned().collect(),
            },
        );
    }

    /// `n` creations are about to be issued.
    pub fn expect_creations(&self, key: &str, n: usize) {
        self.expect(key, n, &[]);
    }

    /// The objects `keys` (`ns/name`) are about to be deleted.
    pub fn expect_deletions(&self, key: &str, keys: &[String]) {
        self.expect(key, 0, keys);
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
