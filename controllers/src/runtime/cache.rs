//! An indexed in-memory cache fed by kube-runtime watcher events.
//!
//! The controllers need lookups a plain reflector store answers only by scanning: Pods by label,
//! Services by selector label, EndpointSlices by Service, Pods by owning controller. `Indexed<K>`
//! keeps the objects plus secondary indexes, each computed by a function of the object: the
//! default one given to [`Indexed::new`] and named ones added with [`Indexed::add_index`]. It
//! applies watcher events in stream order (so a trigger emitted after the event sees the cache
//! already updated) and reports readiness once the first complete listing has arrived.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use kube::runtime::watcher::Event;
use kube::ResourceExt;
use tokio::sync::watch;

/// `(namespace, name)`.
pub type Key = (String, String);

/// Computes the index keys of one object.
pub type IndexFn<K> = fn(&K) -> Vec<String>;

/// The default index's name.
const DEFAULT_INDEX: &str = "";

struct Index<K> {
    f: IndexFn<K>,
    keys: HashMap<String, HashSet<Key>>,
}

struct Inner<K> {
    objects: HashMap<Key, Arc<K>>,
    indexes: HashMap<&'static str, Index<K>>,
    /// The listing in progress between `Init` and `InitDone`.
    pending: Option<Vec<K>>,
}

/// An indexed cache of `K`.
pub struct Indexed<K> {
    inner: RwLock<Inner<K>>,
    ready: watch::Sender<bool>,
}

/// One object's change as `(old, new)`: added `(None, Some)`, updated `(Some, Some)`, deleted
/// `(Some, None)`.
pub type Delta<K> = (Option<Arc<K>>, Option<Arc<K>>);

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
        let mut indexes = HashMap::new();
        indexes.insert(
            DEFAULT_INDEX,
            Index {
                f: index_fn,
                keys: HashMap::new(),
            },
        );
        Arc::new(Self {
            inner: RwLock::new(Inner {
                objects: HashMap::new(),
                indexes,
                pending: None,
            }),
            ready,
        })
    }

    /// Adds (or replaces) the index `name`, computed over the objects already cached too.
    pub fn add_index(&self, name: &'static str, f: IndexFn<K>) {
        let mut inner = self.inner.write().expect("cache lock");
        let mut keys: HashMap<String, HashSet<Key>> = HashMap::new();
        for (key, obj) in &inner.objects {
            for ix in f(obj) {
                keys.entry(ix).or_default().insert(key.clone());
            }
        }
        inner.indexes.insert(name, Index { f, keys });
    }

    /// Whether an index of that name exists.
    pub fn has_index(&self, name: &str) -> bool {
        self.inner
            .read()
            .expect("cache lock")
            .indexes
            .contains_key(name)
    }

    fn insert(&self, inner: &mut Inner<K>, obj: Arc<K>) -> Option<Arc<K>> {
        let key = key_of(obj.as_ref());
        let old = self.remove(inner, &key);
        for index in inner.indexes.values_mut() {
            for ix in (index.f)(&obj) {
                index.keys.entry(ix).or_default().insert(key.clone());
            }
        }
        inner.objects.insert(key, obj);
        old
    }

    fn remove(&self, inner: &mut Inner<K>, key: &Key) -> Option<Arc<K>> {
        let old = inner.objects.remove(key)?;
        for index in inner.indexes.values_mut() {
            for ix in (index.f)(&old) {
                if let Some(set) = index.keys.get_mut(&ix) {
                    set.remove(key);
                    if set.is_empty() {
                        index.keys.remove(&ix);
                    }
                }
            }
        }
        Some(old)
    }

    /// Applies one watcher event and returns what changed object by object: a completed relisting
    /// yields an update for every listed object whose resourceVersion changed (an add for a new
    /// one) and a delete for every cached object it no longer has, so handlers that count
    /// observations (expectations) miss nothing across a re-watch.
    pub fn apply_deltas(&self, ev: &Event<K>) -> Vec<Delta<K>>
    where
        K: kube::Resource,
    {
        let mut inner = self.inner.write().expect("cache lock");
        match ev {
            Event::Apply(obj) => {
                let new = Arc::new(obj.clone());
                let old = self.insert(&mut inner, new.clone());
                vec![(old, Some(new))]
            }
            Event::Delete(obj) => match self.remove(&mut inner, &key_of(obj)) {
                Some(old) => vec![(Some(old), None)],
                None => vec![(Some(Arc::new(obj.clone())), None)],
            },
            Event::Init => {
                inner.pending = Some(Vec::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                inner.pending.get_or_insert_with(Vec::new).push(obj.clone());
                Vec::new()
            }
            Event::InitDone => {
                let listed = inner.pending.take().unwrap_or_default();
                let mut previous = std::mem::take(&mut inner.objects);
                for index in inner.indexes.values_mut() {
                    index.keys.clear();
                }
                let mut deltas = Vec::new();
                for obj in listed {
                    let new = Arc::new(obj);
                    let old = previous.remove(&key_of(new.as_ref()));
                    let unchanged = old.as_ref().is_some_and(|o| {
                        o.meta().resource_version.is_some()
                            && o.meta().resource_version == new.meta().resource_version
                    });
                    self.insert(&mut inner, new.clone());
                    if !unchanged {
                        deltas.push((old, Some(new)));
                    }
                }
                deltas.extend(previous.into_values().map(|old| (Some(old), None)));
                drop(inner);
                self.ready.send_replace(true);
                deltas
            }
        }
    }

    /// Applies one watcher event.
    pub fn apply(&self, ev: &Event<K>) -> Change<K> {
        let mut inner = self.inner.write().expect("cache lock");
        match ev {
            Event::Apply(obj) => {
                let old = self.insert(&mut inner, Arc::new(obj.clone()));
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
                for index in inner.indexes.values_mut() {
                    index.keys.clear();
                }
                for obj in listed {
                    self.insert(&mut inner, Arc::new(obj));
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

    /// Objects under one key of the default index.
    pub fn by_index(&self, ix: &str) -> Vec<Arc<K>> {
        self.index(DEFAULT_INDEX, ix)
    }

    /// Objects under one key of the index `name` (none when there is no such index).
    pub fn index(&self, name: &str, ix: &str) -> Vec<Arc<K>> {
        let inner = self.inner.read().expect("cache lock");
        inner
            .indexes
            .get(name)
            .and_then(|index| index.keys.get(ix))
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
