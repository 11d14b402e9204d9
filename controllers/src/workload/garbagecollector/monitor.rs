//! Resource monitors (upstream's per-resource informers of the `GraphBuilder`): one metadata-only
//! watch per deletable resource, turned into [`GraphEvent`]s for the graph builder. A monitor
//! keeps only what it needs to produce add/update/delete events with the previous version's
//! deletion state: per object its uid, resourceVersion and [`Flags`]. A re-listing (after the
//! watch expired) is diffed against that, so objects deleted meanwhile still produce deletes.
//! Monitors never touch the graph; they only feed the graph-changes queue through a sink.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt as _;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client};

use super::discovery::{Gvr, ResourceInfo};
use super::graph::{EventType, Flags, GraphEvent, Meta};

/// `(namespace, name)`.
type Key = (String, String);

/// What a monitor remembers of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    uid: String,
    resource_version: String,
    flags: Flags,
}

/// The graph's view of one object's metadata.
pub fn meta_of(m: &kube::core::ObjectMeta) -> Meta {
    Meta {
        uid: m.uid.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
        namespace: m.namespace.clone().unwrap_or_default(),
        owners: m.owner_references.clone().unwrap_or_default(),
        flags: Flags::new(
            m.deletion_timestamp.is_some(),
            m.finalizers.as_deref().unwrap_or_default(),
        ),
    }
}

/// One resource's remembered objects, turning watch events into graph events (pure).
#[derive(Debug)]
pub struct MonitorStore {
    api_version: String,
    kind: String,
    objects: HashMap<Key, Seen>,
    /// The listing in progress between `Init` and `InitDone`.
    relist: Option<HashMap<Key, Seen>>,
    synced: bool,
}

impl MonitorStore {
    /// An empty store for objects of `api_version`/`kind`.
    pub fn new(api_version: &str, kind: &str) -> Self {
        Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            objects: HashMap::new(),
            relist: None,
            synced: false,
        }
    }

    /// Whether a complete listing has been applied.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Objects remembered.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether no object is remembered.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    fn event(&self, event_type: EventType, object: Meta, old: Option<Flags>) -> GraphEvent {
        GraphEvent {
            event_type,
            virtual_: false,
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            object,
            old,
        }
    }

    fn gone(&self, key: &Key, seen: &Seen) -> GraphEvent {
        // Only the uid and coordinates matter for a delete.
        let object = Meta {
            uid: seen.uid.clone(),
            namespace: key.0.clone(),
            name: key.1.clone(),
            owners: Vec::new(),
            flags: seen.flags,
        };
        self.event(EventType::Delete, object, None)
    }

    /// The events for an object observed now against what was remembered under its key.
    fn observed(
        &self,
        prev: Option<&Seen>,
        key: &Key,
        meta: Meta,
        rv: &str,
        out: &mut Vec<GraphEvent>,
    ) {
        match prev {
            None => out.push(self.event(EventType::Add, meta, None)),
            Some(p) if p.uid != meta.uid => {
                // Deleted and recreated under the same name while unobserved.
                out.push(self.gone(key, p));
                out.push(self.event(EventType::Add, meta, None));
            }
            // Unchanged: a re-listing repeats what the graph already has.
            Some(p) if p.resource_version == rv && !rv.is_empty() => {}
            Some(p) => out.push(self.event(EventType::Update, meta, Some(p.flags))),
        }
    }

    /// Applies one watch event; returns the graph events it implies.
    pub fn apply(
        &mut self,
        ev: watcher::Event<PartialObjectMeta<DynamicObject>>,
    ) -> Vec<GraphEvent> {
        let mut out = Vec::new();
        match ev {
            watcher::Event::Init => self.relist = Some(HashMap::new()),
            watcher::Event::InitApply(obj) => {
                let (key, seen, meta) = split(&obj);
                self.observed(
                    self.objects.get(&key),
                    &key,
                    meta,
                    &seen.resource_version,
                    &mut out,
                );
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(key, seen);
            }
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let mut gone: Vec<(&Key, &Seen)> = self
                    .objects
                    .iter()
                    .filter(|(k, _)| !listed.contains_key(*k))
                    .collect();
                gone.sort_by(|a, b| a.0.cmp(b.0));
                for (k, s) in gone {
                    out.push(self.gone(k, s));
                }
                self.objects = listed;
                self.synced = true;
            }
            watcher::Event::Apply(obj) => {
                let (key, seen, meta) = split(&obj);
                self.observed(
                    self.objects.get(&key),
                    &key,
                    meta,
                    &seen.resource_version,
                    &mut out,
                );
                self.objects.insert(key, seen);
            }
            watcher::Event::Delete(obj) => {
                let (key, _, meta) = split(&obj);
                match self.objects.remove(&key) {
                    Some(prev) if prev.uid != meta.uid => {
                        // The remembered object went unobserved; then this one came and went.
                        out.push(self.gone(&key, &prev));
                    }
                    _ => {}
                }
                out.push(self.event(EventType::Delete, meta, None));
            }
        }
        out
    }
}

fn split(obj: &PartialObjectMeta<DynamicObject>) -> (Key, Seen, Meta) {
    let meta = meta_of(&obj.metadata);
    let key = (meta.namespace.clone(), meta.name.clone());
    let seen = Seen {
        uid: meta.uid.clone(),
        resource_version: obj.metadata.resource_version.clone().unwrap_or_default(),
        flags: meta.flags,
    };
    (key, seen, meta)
}

/// Where a monitor delivers its events.
pub type Sink = Arc<dyn Fn(GraphEvent) + Send + Sync>;

/// A running monitor: its watch task (aborted when the monitor is dropped) and sync state.
#[derive(Debug)]
pub struct Monitor {
    task: tokio::task::AbortHandle,
    synced: Arc<AtomicBool>,
}

impl Monitor {
    /// Starts watching `gvr` (objects of `info.kind`), delivering to `sink`.
    pub fn start(client: Client, gvr: &Gvr, info: &ResourceInfo, sink: Sink) -> Self {
        let ar = super::discovery::api_resource(gvr, info);
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        let name = gvr.path();
        let task = tokio::spawn(async move {
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client, &ar);
            let mut store = MonitorStore::new(&ar.api_version, &ar.kind);
            // resourceVersion=0 lists (when streaming lists are off) come from the API server's
            // watch cache, as client-go's reflectors list; metadata-only requests keep the
            // payload to what the graph needs.
            let config = crate::runtime::informer::watcher_config().any_semantic();
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => {
                        for change in store.apply(ev) {
                            sink(change);
                        }
                        if store.synced() {
                            flag.store(true, Ordering::Release);
                        }
                    }
                    Err(e) => tracing::warn!(resource = %name, "garbage collector monitor: {e}"),
                }
            }
        })
        .abort_handle();
        Self { task, synced }
    }

    /// Whether the first complete listing has been delivered.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(
        name: &str,
        uid: &str,
        rv: &str,
        extra: serde_json::Value,
    ) -> PartialObjectMeta<DynamicObject> {
        let mut meta = json!({"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv});
        if let serde_json::Value::Object(m) = extra {
            for (k, v) in m {
                meta[k] = v;
            }
        }
        serde_json::from_value(json!({"metadata": meta})).unwrap()
    }

    fn kinds(evs: &[GraphEvent]) -> Vec<(EventType, String)> {
        evs.iter()
            .map(|e| (e.event_type, e.object.uid.clone()))
            .collect()
    }

    #[test]
    fn gc2_watch_events_become_graph_events_with_the_old_deletion_state() {
        use watcher::Event::*;
        let mut s = MonitorStore::new("apps/v1", "ReplicaSet");
        assert!(s.apply(Init).is_empty());
        let evs = s.apply(InitApply(obj("a", "u-a", "1", json!({}))));
        assert_eq!(kinds(&evs), [(EventType::Add, "u-a".to_string())]);
        assert_eq!(evs[0].api_version, "apps/v1");
        assert_eq!(evs[0].kind, "ReplicaSet");
        assert!(!s.synced());
        assert!(s.apply(InitDone).is_empty());
        assert!(s.synced());

        let evs = s.apply(Apply(obj(
            "a",
            "u-a",
            "2",
            json!({"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["orphan"]}),
        )));
        assert_eq!(kinds(&evs), [(EventType::Update, "u-a".to_string())]);
        assert_eq!(
            evs[0].old,
            Some(Flags::default()),
            "the old version was not being deleted"
        );
        assert!(evs[0].object.flags.being_deleted && evs[0].object.flags.orphan_finalizer);

        let evs = s.apply(Delete(obj("a", "u-a", "3", json!({}))));
        assert_eq!(kinds(&evs), [(EventType::Delete, "u-a".to_string())]);
        assert!(s.is_empty());
    }

    #[test]
    fn gc2_a_relist_reports_what_changed_while_unwatched() {
        use watcher::Event::*;
        let mut s = MonitorStore::new("v1", "Pod");
        s.apply(Init);
        for (n, u) in [("a", "u-a"), ("b", "u-b"), ("c", "u-c")] {
            s.apply(InitApply(obj(n, u, "1", json!({}))));
        }
        s.apply(InitDone);

        s.apply(Init);
        let mut evs = Vec::new();
        evs.extend(s.apply(InitApply(obj("a", "u-a", "1", json!({})))));
        evs.extend(s.apply(InitApply(obj("b", "u-b2", "5", json!({})))));
        evs.extend(s.apply(InitApply(obj("d", "u-d", "6", json!({})))));
        evs.extend(s.apply(InitDone));
        assert_eq!(
            kinds(&evs),
            [
                (EventType::Delete, "u-b".to_string()),
                (EventType::Add, "u-b2".to_string()),
                (EventType::Add, "u-d".to_string()),
                (EventType::Delete, "u-c".to_string()),
            ],
            "unchanged a: nothing; b recreated: delete + add; d new; c gone"
        );
        assert_eq!(s.len(), 3);
    }
}
