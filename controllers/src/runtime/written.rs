//! Read-your-writes for a controller's own writes of objects it names: the object a write
//! returned, kept until the informer's cache shows that write (or anything newer). Which of the
//! runtime's read-your-writes mechanisms fits which write: [`crate::runtime::expectations`].
//! Used by the Deployment controller (its ReplicaSets and its own status), the Endpoints
//! controller (its Endpoints), the ResourceQuota controller (quota status) and the Job controller
//! (its own status); knows no controller.
//!
//! A sync that starts before the cache has caught up with the previous sync's writes would
//! otherwise plan from the older object: its writes then fail with a conflict (the
//! resourceVersion moved) and the key is retried, or, for a ReplicaSet created a moment ago, the
//! create is attempted again and fails as AlreadyExists. Upstream lives with both; the overlay
//! saves those round trips. It never hides anyone else's write: a successful write means nobody
//! wrote between the version it was based on and its result, so while the cache still holds
//! that base version (or, for a create, nothing) the written object is the newest there is, and
//! the first informer event for the object ([`Written::forget`]) ends the overlay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Resource;

type Key = (String, String);

/// Objects written and not yet seen in the cache, by namespace and name.
pub struct Written<K> {
    entries: Mutex<HashMap<Key, Entry<K>>>,
}

struct Entry<K> {
    /// The resourceVersion the cache held when the write was made (`None`: a create).
    base: Option<String>,
    obj: Arc<K>,
}

fn key_of<K: Resource>(obj: &K) -> Key {
    (
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

impl<K: Resource> Written<K> {
    /// Nothing written yet.
    pub fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Records `obj` as returned by a write sent with resourceVersion `sent` (`None`: a create).
    /// A second write before the cache caught up keeps the first one's base.
    pub fn record(&self, sent: Option<String>, obj: K) {
        let key = key_of(&obj);
        let mut entries = self.entries.lock().expect("written lock");
        let base = match entries.remove(&key) {
            Some(e) => e.base,
            None => sent,
        };
        entries.insert(
            key,
            Entry {
                base,
                obj: Arc::new(obj),
            },
        );
    }

    /// The cache has an event for this object: it is at least as new as any write of ours.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.entries
            .lock()
            .expect("written lock")
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// The newer of the cached object and our write of it.
    pub fn fresh(&self, namespace: &str, name: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let key = (namespace.to_string(), name.to_string());
        let mut entries = self.entries.lock().expect("written lock");
        let Some(e) = entries.get(&key) else {
            return cached;
        };
        let cached_rv = cached
            .as_ref()
            .and_then(|c| c.meta().resource_version.clone());
        if cached_rv == e.base {
            return Some(e.obj.clone());
        }
        entries.remove(&key);
        cached
    }

    /// Objects of `namespace` we created that the cache does not have yet, among those `keep`
    /// selects.
    pub fn created(
        &self,
        namespace: &str,
        cached: impl Fn(&str) -> bool,
        keep: impl Fn(&K) -> bool,
    ) -> Vec<Arc<K>> {
        let entries = self.entries.lock().expect("written lock");
        entries
            .iter()
            .filter(|((ns, name), e)| {
                ns == namespace && e.base.is_none() && !cached(name) && keep(&e.obj)
            })
            .map(|(_, e)| e.obj.clone())
            .collect()
    }
}

impl<K: Resource> Default for Written<K> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use serde_json::json;

    fn rs(rv: &str) -> ReplicaSet {
        serde_json::from_value(
            json!({"metadata": {"name": "a", "namespace": "ns", "resourceVersion": rv}}),
        )
        .unwrap()
    }

    fn rv(o: Option<Arc<ReplicaSet>>) -> Option<String> {
        o.and_then(|o| o.metadata.resource_version.clone())
    }

    #[test]
    fn ctl3_own_writes_are_read_back_until_the_cache_shows_them() {
        let w = Written::new();
        let cached = Some(Arc::new(rs("1")));
        w.record(Some("1".into()), rs("2"));
        w.record(Some("2".into()), rs("3"));
        assert_eq!(
            rv(w.fresh("ns", "a", cached.clone())),
            Some("3".into()),
            "CTL-3 the cache still at the base: our last write"
        );
        assert_eq!(
            rv(w.fresh("ns", "a", Some(Arc::new(rs("2"))))),
            Some("2".into()),
            "CTL-3 the cache moved: the cache, and the overlay ends"
        );
        assert_eq!(rv(w.fresh("ns", "a", cached.clone())), Some("1".into()));

        w.record(None, rs("5"));
        assert_eq!(
            rv(w.fresh("ns", "a", None)),
            Some("5".into()),
            "CTL-3 a create not yet seen"
        );
        assert_eq!(w.created("ns", |_| false, |_| true).len(), 1);
        w.forget("ns", "a");
        assert_eq!(
            rv(w.fresh("ns", "a", None)),
            None,
            "CTL-3 an event ends the overlay"
        );
        assert!(w.created("ns", |_| false, |_| true).is_empty());
    }
}
