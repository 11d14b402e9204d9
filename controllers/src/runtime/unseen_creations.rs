//! The Pods a controller created whose creation its Pod informer has not shown yet: the
//! written overlay ([`crate::runtime::written`]) for objects made with `generateName`, so a
//! sync can plan from the cache plus its own creations instead of waiting for the watch.
//! Owns only that bookkeeping and its pairing with the creation expectations; knows no
//! controller. [`crate::runtime::pod_control::PodControl`] keeps one when a controller asks
//! for it (`reading_own_creations`).
//!
//! Upstream's controllers wait: after a burst of creations, a sync does nothing until the watch
//! has shown every Pod (expectations, CTL-8). Under load the watch runs a second or more behind
//! the create responses (the API server fans every Pod event out to the scheduler, the node
//! agents and the controllers), and each burst of a large DaemonSet waits that long. Here a
//! creation's response is its observation: the created Pod is kept until the informer shows it,
//! and the expectation is lowered once, by whichever of the two comes first.
//!
//! Why no Pod is planned twice: a controller's syncs of one key are serial, so when a sync starts
//! every creation of the previous ones has answered; each created Pod is then either kept here
//! or already in the cache (the informer applies an event to its cache before it runs the
//! handlers that end the entry). A sync reads [`UnseenCreations::of`] before it reads the
//! cache, so a Pod leaving this set in between is in the cache by then. A Pod created and
//! deleted before the informer ever showed it (a re-list in between skips both events) stays
//! here until [`crate::runtime::expectations::TIMEOUT`], as upstream's expectations would.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::runtime::cached_pod::CachedPod;
use crate::runtime::expectations::{Expectations, TIMEOUT};

#[derive(Default)]
struct Owner {
    /// Created, answered, not yet shown by the informer: by name, with when it was answered.
    unseen: HashMap<String, (Arc<CachedPod>, Instant)>,
    /// Creations sent and not answered yet.
    in_flight: usize,
    /// Pods the informer showed while creations were in flight and before their answer came:
    /// already observed, so their answer must not be counted again.
    shown_early: HashSet<String>,
}

/// Per owner key, the Pods created and not yet shown; see the module doc.
#[derive(Default)]
pub struct UnseenCreations {
    owners: Mutex<HashMap<String, Owner>>,
}

impl UnseenCreations {
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owner>> {
        self.owners.lock().expect("unseen creations lock")
    }

    /// `n` creations for `key` are about to be sent.
    pub fn sending(&self, key: &str, n: usize) {
        self.owners().entry(key.to_string()).or_default().in_flight += n;
    }

    /// One creation for `key` was answered: with the Pod it made, or `None` (it failed, or was
    /// never sent). A made Pod is observed now unless the informer showed it already.
    pub fn answered(&self, key: &str, made: Option<CachedPod>, expectations: &Expectations) {
        let mut owners = self.owners();
        let owner = owners.entry(key.to_string()).or_default();
        owner.in_flight = owner.in_flight.saturating_sub(1);
        if let Some(pod) = made {
            let name = pod.metadata.name.clone().unwrap_or_default();
            if !owner.shown_early.remove(&name) {
                owner.unseen.insert(name, (Arc::new(pod), Instant::now()));
                expectations.creation_observed(key);
            }
        }
        if owner.in_flight == 0 {
            owner.shown_early.clear();
        }
        if owner.in_flight == 0 && owner.unseen.is_empty() {
            owners.remove(key);
        }
    }

    /// The informer showed a Pod of `key` for the first time: the creation is observed unless
    /// its answer was counted already.
    pub fn shown(&self, key: &str, name: &str, expectations: &Expectations) {
        let mut owners = self.owners();
        let Some(owner) = owners.get_mut(key) else {
            expectations.creation_observed(key);
            return;
        };
        if owner.unseen.remove(name).is_none() {
            if owner.in_flight > 0 {
                owner.shown_early.insert(name.to_string());
            }
            expectations.creation_observed(key);
        }
        if owner.in_flight == 0 && owner.unseen.is_empty() {
            owners.remove(key);
        }
    }

    /// The informer showed the Pod `name` of `key` gone (or first seen already terminating):
    /// whatever was kept of it ends.
    pub fn gone(&self, key: &str, name: &str) {
        let mut owners = self.owners();
        if let Some(owner) = owners.get_mut(key) {
            owner.unseen.remove(name);
            if owner.in_flight == 0 && owner.unseen.is_empty() {
                owners.remove(key);
            }
        }
    }

    /// The Pods of `key` created and not yet shown, younger than the expectations' timeout.
    /// Read before the cache (see the module doc).
    pub fn of(&self, key: &str) -> Vec<Arc<CachedPod>> {
        let mut owners = self.owners();
        let Some(owner) = owners.get_mut(key) else {
            return Vec::new();
        };
        let now = Instant::now();
        owner
            .unseen
            .retain(|_, (_, at)| now.saturating_duration_since(*at) <= TIMEOUT);
        owner.unseen.values().map(|(p, _)| p.clone()).collect()
    }

    /// Forgets `key` (its owner was deleted).
    pub fn forget(&self, key: &str) {
        self.owners().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str) -> CachedPod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"}})).unwrap()
    }

    fn names(u: &UnseenCreations, key: &str) -> Vec<String> {
        let mut n: Vec<String> = u.of(key).iter().map(|p| p.name_any()).collect();
        n.sort();
        n
    }

    use kube::ResourceExt;

    #[test]
    fn an_answer_observes_the_creation_and_keeps_the_pod_until_the_informer_shows_it() {
        let (u, e) = (UnseenCreations::default(), Expectations::new());
        e.expect("ns/ds", 2, &[]);
        u.sending("ns/ds", 2);
        u.answered("ns/ds", Some(pod("a")), &e);
        assert!(!e.satisfied("ns/ds"), "one creation still unanswered");
        u.answered("ns/ds", Some(pod("b")), &e);
        assert!(e.satisfied("ns/ds"), "both answered: the sync may plan");
        assert_eq!(names(&u, "ns/ds"), ["a", "b"]);
        u.shown("ns/ds", "a", &e);
        assert_eq!(names(&u, "ns/ds"), ["b"]);
        assert_eq!(e.pending("ns/ds"), Some((0, 0)), "not counted twice");
        u.shown("ns/ds", "b", &e);
        assert!(u.of("ns/ds").is_empty());
        assert_eq!(e.pending("ns/ds"), Some((0, 0)));
    }

    #[test]
    fn a_pod_shown_before_its_answer_is_counted_once() {
        let (u, e) = (UnseenCreations::default(), Expectations::new());
        e.expect("ns/ds", 2, &[]);
        u.sending("ns/ds", 2);
        u.shown("ns/ds", "a", &e);
        assert_eq!(e.pending("ns/ds"), Some((1, 0)));
        u.answered("ns/ds", Some(pod("a")), &e);
        assert_eq!(e.pending("ns/ds"), Some((1, 0)), "the answer adds nothing");
        assert!(u.of("ns/ds").is_empty(), "the cache has it: nothing kept");
        u.answered("ns/ds", None, &e);
        assert_eq!(
            e.pending("ns/ds"),
            Some((1, 0)),
            "a failed creation is the caller's to observe (PodControl does)"
        );
    }

    #[test]
    fn pods_shown_with_nothing_in_flight_are_observed_and_not_remembered() {
        let (u, e) = (UnseenCreations::default(), Expectations::new());
        e.expect("ns/ds", 1, &[]);
        u.shown("ns/ds", "adopted", &e);
        assert!(e.satisfied("ns/ds"));
        u.sending("ns/ds", 1);
        u.answered("ns/ds", Some(pod("adopted")), &e);
        assert_eq!(
            names(&u, "ns/ds"),
            ["adopted"],
            "no stale early-shown name swallows a later answer"
        );
    }

    #[test]
    fn a_pod_gone_before_it_was_shown_ends_and_forget_drops_the_owner() {
        let (u, e) = (UnseenCreations::default(), Expectations::new());
        u.sending("ns/ds", 2);
        u.answered("ns/ds", Some(pod("a")), &e);
        u.answered("ns/ds", Some(pod("b")), &e);
        u.gone("ns/ds", "a");
        assert_eq!(names(&u, "ns/ds"), ["b"]);
        u.forget("ns/ds");
        assert!(u.of("ns/ds").is_empty());
    }
}
