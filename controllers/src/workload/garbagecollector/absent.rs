//! Owners verified absent (upstream's `absentOwnerCache`, a 500-entry LRU): once a lookup or a
//! deletion showed that no object has an owner reference's coordinates, the other dependents
//! naming the same coordinates are classified dangling without asking the API server again. It
//! holds coordinates only; it never decides anything itself.

use std::collections::{BTreeMap, HashMap};

use super::graph::ObjectRef;

/// Upstream's size.
pub const DEFAULT_CAPACITY: usize = 500;

/// A least-recently-used set of coordinates.
#[derive(Debug)]
pub struct AbsentOwners {
    capacity: usize,
    tick: u64,
    by_ref: HashMap<ObjectRef, u64>,
    by_tick: BTreeMap<u64, ObjectRef>,
}

impl Default for AbsentOwners {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl AbsentOwners {
    /// An empty set holding at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            tick: 0,
            by_ref: HashMap::new(),
            by_tick: BTreeMap::new(),
        }
    }

    fn touch(&mut self, r: &ObjectRef) {
        self.tick += 1;
        if let Some(old) = self.by_ref.insert(r.clone(), self.tick) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(self.tick, r.clone());
    }

    /// Records `r` as absent, evicting the least recently used entry when full.
    pub fn add(&mut self, r: ObjectRef) {
        self.touch(&r);
        while self.by_ref.len() > self.capacity {
            let Some((_, oldest)) = self.by_tick.pop_first() else {
                break;
            };
            self.by_ref.remove(&oldest);
        }
    }

    /// Whether `r` is recorded absent (a hit counts as a use, as golang-lru's `Get`).
    pub fn has(&mut self, r: &ObjectRef) -> bool {
        if self.by_ref.contains_key(r) {
            self.touch(r);
            true
        } else {
            false
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.by_ref.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.by_ref.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str) -> ObjectRef {
        ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn gc3_absent_owner_cache_is_a_bounded_lru() {
        let mut c = AbsentOwners::new(2);
        c.add(r("a"));
        c.add(r("b"));
        assert!(c.has(&r("a")), "a used: b is now the oldest");
        c.add(r("c"));
        assert_eq!(c.len(), 2);
        assert!(!c.has(&r("b")), "the least recently used entry is evicted");
        assert!(c.has(&r("a")) && c.has(&r("c")));
        let mut other_ns = r("a");
        other_ns.namespace = "other".into();
        assert!(!c.has(&other_ns), "coordinates include the namespace");
    }
}
