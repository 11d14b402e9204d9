//! An indexed in-memory cache fed by kube-runtime watcher events.
//!
//! The controllers need lookups a plain reflector store answers only by scanning: Pods by label,
//! Services by selector label, EndpointSlices by Service. `Indexed<K>` keeps the objects plus one
//! secondary index computed by a function of the object. It applies watcher events in stream order
//! (so a trigger emitted after the event sees the cache already updated) and reports readiness once
//! the first complete listing has arrived.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use kube::runtime::watcher::Event;
use kube::ResourceExt;
use tokio::sync::watch;

/// `(namespace, name)`.
pub type Key = (String, String);

/// Computes the index keys of one object.
pub type IndexFn<K> = fn(&K) -> Vec<String>;

struct Inner<K> {
    objects: HashMap<Key, Arc<K>>,
    index: HashMap<String, HashSet<Key>>,
    /// The listing in progress between `Init` and `InitDone`.
    pending: Option<Vec<K>>,
}

/// An indexed cache of `K`.
pub struct Indexed<K> {
    inner: RwLock<Inner<K>>,
    index_fn: IndexFn<K>,
    ready: watch::Sender<bool>,
}

/// What one event changed: the previous and the new version of the touched object(s).
#[derive(Debug)]
pub enum Change<K> {
    /// One object was applied (old is None when new) or deleted (new is None).
    One {
        /// Before.
        old: Option<Arc<K>>,
        /// After.
        new: Option<Arc<K>>,
    },
    /// A complete relisting replaced the cache.
    Relisted,
    /// Nothing changed yet (a listing is in progress).
    Nothing,
}

/// `(namespace, name)` of an object.
pub fn key_of<K: ResourceExt>(obj: &K) -> Key {
    (obj.namespace().unwrap_or_default(), obj.name_any())
}

impl<K: ResourceExt + Clone> Indexed<K> {
    /// An empty cache indexed by `index_fn`.
    pub fn new(index_fn: IndexFn<K>) -> Arc<Self> {
        let (ready, _) = watch::channel(false);
        Arc::new(Self {
            inner: RwLock::new(Inner {
                objects: HashMap::new(),
                index: HashMap::new(),
                pending: None,
            }),
            index_fn,
            ready,
        })
    }

    fn insert(&self, inner: &mut Inner<K>, obj: K) -> Option<Arc<K>> {
        let key = key_of(&obj);
        let old = self.remove(inner, &key);
        for ix in (self.index_fn)(&obj) {
            inner.index.entry(ix).or_default().insert(key.clone());
        }
        inner.objects.insert(key, Arc::new(obj));
        old
    }

    fn remove(&self, inner: &mut Inner<K>, key: &Key) -> Option<Arc<K>> {
        let old = inner.objects.remove(key)?;
        for ix in (self.index_fn)(&old) {
            if let Some(set) = inner.index.get_mut(&ix) {
                set.remove(key);
                if set.is_empty() {
                    inner.index.remove(&ix);
                }
            }
        }
        Some(old)
    }

    /// Applies one watcher event.
    pub fn apply(&self, ev: &Event<K>) -> Change<K> {
        let mut inner = self.inner.write().expect("cache lock");
        match ev {
            Event::Apply(obj) => {
                let old = self.insert(&mut inner, obj.clone());
                Change::One {
                    old,
                    new: inner.objects.get(&key_of(obj)).cloned(),
                }
            }
            Event::Delete(obj) => Change::One {
                old: self.remove(&mut inner, &key_of(obj)),
                new: None,
            },
            Event::Init => {
                inner.pending = Some(Vec::new());
                Change::Nothing
            }
            Event::InitApply(obj) => {
                inner.pending.get_or_insert_with(Vec::new).push(obj.clone());
                Change::Nothing
            }
            Event::InitDone => {
                let listed = inner.pending.take().unwrap_or_default();
                inner.objects.clear();
                inner.index.clear();
                for obj in listed {
                    self.insert(&mut inner, obj);
                }
                drop(inner);
                self.ready.send_replace(true);
                Change::Relisted
            }
        }
    }

    /// One object by namespace and name.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<K>> {
        let inner = self.inner.read().expect("cache lock");
        inner
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects under one index key.
    pub fn by_index(&self, ix: &str) -> Vec<Arc<K>> {
        let inner = self.inner.read().expect("cache lock");
        inner
            .index
            .get(ix)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| inner.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every cached object.
    pub fn all(&self) -> Vec<Arc<K>> {
        self.inner
            .read()
            .expect("cache lock")
            .objects
            .values()
            .cloned()
            .collect()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.inner.read().expect("cache lock").objects.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first complete listing has arrived.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits for the first complete listing.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(name: &str, app: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": app}}}),
        )
        .unwrap()
    }

    fn by_app(p: &Pod) -> Vec<String> {
        p.labels()
            .get("app")
            .map(|a| vec![format!("app={a}")])
            .unwrap_or_default()
    }

    #[test]
    fn index_follows_applies_deletes_and_relists() {
        let c = Indexed::new(by_app);
        c.apply(&Event::Apply(pod("a", "x")));
        c.apply(&Event::Apply(pod("b", "x")));
        assert_eq!(c.by_index("app=x").len(), 2);
        let change = c.apply(&Event::Apply(pod("a", "y")));
        assert!(matches!(change, Change::One { old: Some(ref o), .. } if o.labels()["app"] == "x"));
        assert_eq!(c.by_index("app=x").len(), 1);
        assert_eq!(c.by_index("app=y").len(), 1);
        c.apply(&Event::Delete(pod("b", "x")));
        assert!(c.by_index("app=x").is_empty());
        assert!(!c.is_ready());
        c.apply(&Event::Init);
        c.apply(&Event::InitApply(pod("z", "x")));
        assert_eq!(
            c.len(),
            1,
            "a listing in progress does not replace the cache"
        );
        c.apply(&Event::InitDone);
        assert!(c.is_ready());
        assert_eq!(
            c.all().iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["z"]
        );
        assert_eq!(c.by_index("app=x").len(), 1);
        assert!(c.by_index("app=y").is_empty());
    }
}
