//! Shared informers (CTL-3): one watch per resource kind for every controller of the process,
//! each feeding one indexed cache and then the handlers the controllers registered.
//!
//! A controller registers at construction: the named indexes its lookups need and handlers that
//! turn object changes into work-queue keys. [`Informers::start`] starts the watches;
//! [`Informers::wait_synced`] returns once every cache holds a complete listing. The cache is
//! updated before the handlers run, so a key queued by a handler is synced against a cache at
//! least as new as the change that queued it. A re-listing (after a watch expired) is delivered to
//! the handlers as per-object adds, updates and deletes, so expectations observe every deletion.
//!
//! Handlers must not hold the [`Informers`] themselves (it stops its watches when dropped).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::runtime::cache::Indexed;

use super::workers::AbortOnDrop;

/// Index of every informer's cache: key = the object's namespace.
pub const NAMESPACE: &str = "namespace";

/// Whether watches start with a streaming list (one watch request with `sendInitialEvents`,
/// objects arriving one by one) rather than a paginated list followed by a watch.
static WATCH_LIST: AtomicBool = AtomicBool::new(true);

/// Chooses how every watch of this process starts (before the informers start): streaming lists
/// (the default; kube-apiserver has served them by default since v1.32, and kube-controller-manager
/// v1.34 uses them) or list then watch, for API servers without them.
pub fn set_watch_list(on: bool) {
    WATCH_LIST.store(on, Ordering::Relaxed);
}

/// Fault injection: how long every watch event waits before the informers apply it, in
/// milliseconds (0: applied at once). See [`set_watch_delay`].
static WATCH_DELAY_MS: AtomicU64 = AtomicU64::new(0);

/// Fault injection for the lagging-watch scenario (docs/RELIABILITY.md): every watch event of
/// this process reaches the caches and the handlers `delay` after it was read, in order, while
/// the controllers' own requests go through at once. A controller that acts on its cache without
/// expectations for its own writes makes duplicates under it. Set before the informers start.
pub fn set_watch_delay(delay: std::time::Duration) {
    WATCH_DELAY_MS.store(delay.as_millis() as u64, Ordering::Relaxed);
}

/// Makes a client for one watch thread, on that thread's runtime (see [`set_watch_client`]).
type ClientFactory = Box<dyn Fn() -> Option<Client> + Send + Sync>;

static WATCH_CLIENT: OnceLock<ClientFactory> = OnceLock::new();

/// How each informer's watch thread makes the client its watch runs on (the binaries set it
/// before the informers start, from the process's client configuration; unset, a watch uses the
/// client its [`Informers`] were given). A kube client reads its responses in tasks on the
/// runtime it was built on: a watch on the process's shared client has its socket read by the
/// same two worker threads that run every sync, so a burst of syncs delays the read, the API
/// server finds the watcher unresponsive (its per-watcher buffer is small), closes it, and the
/// events wait for the re-watch. Built on the watch's own thread, the client reads there.
pub fn set_watch_client(make: impl Fn() -> Option<Client> + Send + Sync + 'static) {
    let _ = WATCH_CLIENT.set(Box::new(make));
}

/// The watcher configuration every informer and monitor starts from (see [`set_watch_list`]).
/// A streaming list also keeps the peak memory of a start or relist to one object at a time,
/// where a list holds a whole page of 500 in its response.
pub fn watcher_config() -> watcher::Config {
    let cfg = watcher::Config::default();
    if WATCH_LIST.load(Ordering::Relaxed) {
        cfg.streaming_lists()
    } else {
        cfg
    }
}

/// The admission-injected service account token volume (`kube-api-access-<random>`).
const SERVICE_ACCOUNT_VOLUME_PREFIX: &str = "kube-api-access-";

/// What a cached object keeps. No controller reads managedFields, and they are often the larger
/// part of an object (kube-controller-manager's informers drop them too). From full Pods (the
/// scheduler's cache: the controller-manager's caches hold a `CachedPod`, which keeps no volume
/// sources or mounts at all) the service account token volume the API server injects into nearly every Pod, and its mounts,
/// are dropped as well: no controller reads them, and in k8s-openapi's types a Volume carries
/// every volume source inline, several KiB per Pod. Volumes a controller may need (claims,
/// everything else) stay.
fn trim_for_cache<K: Watched>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(pod) = (obj as &mut dyn Any).downcast_mut::<Pod>() {
        trim_pod(pod);
    }
}

fn trim_pod(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let injected = |name: &str| name.starts_with(SERVICE_ACCOUNT_VOLUME_PREFIX);
    if let Some(volumes) = spec.volumes.as_mut() {
        volumes.retain(|v| !(injected(&v.name) && v.projected.is_some()));
        if volumes.is_empty() {
            spec.volumes = None;
        }
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(mounts) = c.volume_mounts.as_mut() {
            mounts.retain(|m| !injected(&m.name));
            if mounts.is_empty() {
                c.volume_mounts = None;
            }
        }
    }
}

/// Index of every informer's cache: key = the uid of the object's controller ownerReference.
pub const CONTROLLER_UID: &str = "controller-uid";

/// A handler: `(old, new)`; add = `(None, Some)`, update = `(Some, Some)`, delete = `(Some, None)`.
pub type Handler<K> = Box<dyn Fn(Option<&Arc<K>>, Option<&Arc<K>>) + Send + Sync>;

/// A controller's handler method, as [`Informer::on_change_of`] registers it.
pub type HandlerMethod<C, K> = fn(&C, Option<&Arc<K>>, Option<&Arc<K>>);

/// A controller's handler methods for one kind, one per kind of change, as
/// [`Informer::on_events_of`] registers them (client-go's `ResourceEventHandlerFuncs`): for the
/// controllers whose answers to an add, an update and a delete differ (the Pod handlers of the
/// workload controllers).
pub struct EventHandlers<C, K> {
    pub added: fn(&C, &K),
    pub updated: fn(&C, &K, &K),
    pub deleted: fn(&C, &K),
}

/// What a kind needs to be watched by an informer.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}
impl<K> Watched for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// The uid of the controller ownerReference (`metav1.GetControllerOf`).
pub fn controller_uid<K: Resource>(obj: &K) -> Option<&str> {
    crate::helpers::meta::controller_uid(obj.meta())
}

fn namespace_index<K: Resource>(obj: &K) -> Vec<String> {
    vec![obj.meta().namespace.clone().unwrap_or_default()]
}

fn controller_index<K: Resource>(obj: &K) -> Vec<String> {
    controller_uid(obj)
        .map(str::to_string)
        .into_iter()
        .collect()
}

fn no_index<K>(_: &K) -> Vec<String> {
    Vec::new()
}

/// One kind's cache and handlers.
pub struct Informer<K> {
    cache: Arc<Indexed<K>>,
    handlers: RwLock<Vec<Handler<K>>>,
    /// A field selector the watch is restricted to ([`Informer::restrict_fields`]).
    fields: Mutex<Option<&'static str>>,
    watch: Arc<WatchHealth>,
}

/// Whether an informer's watch is reading, and when it last came back after failing: while it
/// fails (the API server unreachable) the cache is as old as the failure, and a controller that
/// judges liveness by what the cache shows (the node lifecycle controller's Lease renewals) must
/// not count that time against anyone.
#[derive(Debug, Default)]
pub struct WatchHealth {
    broken: std::sync::atomic::AtomicBool,
    /// Unix milliseconds of the first event after the last failure (0: never failed).
    recovered_ms: std::sync::atomic::AtomicI64,
}

impl WatchHealth {
    /// Whether the watch reads (false from a failed watch request until the next event).
    pub fn healthy(&self) -> bool {
        !self.broken.load(Ordering::Relaxed)
    }

    /// When the watch last came back after failing.
    pub fn recovered_at(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        match self.recovered_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok(),
        }
    }

    fn failed(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    fn read(&self) {
        if self.broken.swap(false, Ordering::Relaxed) {
            let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
            self.recovered_ms.store(now, Ordering::Relaxed);
        }
    }
}

impl<K: Watched> Informer<K> {
    fn new() -> Arc<Self> {
        let cache = Indexed::new(no_index::<K>);
        cache.add_index(NAMESPACE, namespace_index::<K>);
        cache.add_index(CONTROLLER_UID, controller_index::<K>);
        Arc::new(Self {
            cache,
            handlers: RwLock::new(Vec::new()),
            fields: Mutex::new(None),
            watch: Arc::default(),
        })
    }

    /// The state of this informer's watch.
    pub fn watch_health(&self) -> Arc<WatchHealth> {
        self.watch.clone()
    }

    /// Watches only the objects `selector` (a field selector, `metadata.name=kube-root-ca.crt`)
    /// selects, so the cache holds those alone: for a kind whose one controller reads a few
    /// objects of many (one ConfigMap per namespace of all the cluster's ConfigMaps). Must be
    /// called before the informers start. The informer is shared, so two controllers asking for
    /// different selectors of one kind is a programming error: `Err` names both.
    pub fn restrict_fields(&self, selector: &'static str) -> crate::Result<()> {
        let mut fields = self.fields.lock().expect("fields lock");
        match *fields {
            Some(s) if s != selector => Err(crate::Error::Invalid {
                object: format!("the {} informer", K::kind(&())),
                reason: format!(
                    "asked to watch only {selector:?} while another controller watches only {s:?}"
                ),
            }),
            _ => {
                *fields = Some(selector);
                Ok(())
            }
        }
    }

    /// The kind's cache.
    pub fn cache(&self) -> Arc<Indexed<K>> {
        self.cache.clone()
    }

    /// Adds a named index to the cache.
    pub fn add_index(&self, name: &'static str, f: fn(&K) -> Vec<String>) {
        self.cache.add_index(name, f);
    }

    /// Registers a handler, called after the cache has applied each change.
    pub fn on_change(&self, handler: Handler<K>) {
        self.handlers.write().expect("handlers lock").push(handler);
    }

    /// Registers `handle` of a controller as a handler. The informer holds the controller only
    /// weakly (handlers must not keep their controller alive), so once it is dropped the handler
    /// does nothing.
    pub fn on_change_of<C: Send + Sync + 'static>(
        &self,
        controller: &Arc<C>,
        handle: HandlerMethod<C, K>,
    ) {
        let weak = Arc::downgrade(controller);
        self.on_change(Box::new(move |old, new| {
            if let Some(c) = weak.upgrade() {
                handle(&c, old, new);
            }
        }));
    }

    /// Registers a controller's add, update and delete methods (held weakly, as
    /// [`Self::on_change_of`] holds its controller).
    pub fn on_events_of<C: Send + Sync + 'static>(
        &self,
        controller: &Arc<C>,
        handlers: EventHandlers<C, K>,
    ) {
        let weak = Arc::downgrade(controller);
        let EventHandlers {
            added,
            updated,
            deleted,
        } = handlers;
        self.on_change(Box::new(move |old, new| {
            let Some(c) = weak.upgrade() else { return };
            match (old, new) {
                (None, Some(n)) => added(&c, n),
                (Some(o), Some(n)) => updated(&c, o, n),
                (Some(o), None) => deleted(&c, o),
                (None, None) => {}
            }
        }));
    }

    /// Applies one watch event and runs the handlers on what it changed.
    pub fn dispatch(&self, ev: &watcher::Event<K>) {
        let deltas = self.cache.apply_deltas(ev);
        if deltas.is_empty() {
            return;
        }
        let handlers = self.handlers.read().expect("handlers lock");
        for (old, new) in &deltas {
            for h in handlers.iter() {
                h(old.as_ref(), new.as_ref());
            }
        }
    }

    /// Reads the watch on a thread of its own into an unbounded buffer and applies what it read
    /// here, as client-go's reflector feeds its DeltaFIFO: the watch is drained as fast as the
    /// API server sends, whatever the controllers' syncs are doing with the process's runtime.
    /// Read inline, a burst (1,000 daemon Pods created, bound and started within seconds) could
    /// go unread while syncs held both worker threads; the API server then closes the watch as
    /// unresponsive (its per-watcher buffer is small) and events wait for the re-watch.
    async fn run(self: Arc<Self>, client: Client) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let kind = K::kind(&()).into_owned();
        let mut config = watcher_config();
        if let Some(selector) = *self.fields.lock().expect("fields lock") {
            config = config.fields(selector);
        }
        let watch = self.watch.clone();
        let reader = move |client: Client| async move {
            let api: Api<K> = Api::all(client);
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            loop {
                let ev = tokio::select! {
                    // The informer is gone (its Informers were dropped): stop watching.
                    _ = tx.closed() => return,
                    ev = stream.next() => ev,
                };
                match ev {
                    Some(Ok(ev)) => {
                        watch.read();
                        let read = tokio::time::Instant::now();
                        if tx.send((read, ev.modify(trim_for_cache::<K>))).is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        watch.failed();
                        tracing::warn!(kind = %K::kind(&()), "watch: {e}");
                    }
                    None => return,
                }
            }
        };
        let thread_kind = kind.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("watch-{kind}"))
            .spawn(move || {
                let kind = thread_kind;
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(async move {
                        let own = WATCH_CLIENT.get().and_then(|make| make());
                        reader(own.unwrap_or(client)).await
                    }),
                    Err(e) => tracing::error!(kind, "watch thread: building its runtime: {e}"),
                }
            });
        if let Err(e) = spawned {
            tracing::error!(kind, "starting the watch thread: {e}");
            return;
        }
        let delay = std::time::Duration::from_millis(WATCH_DELAY_MS.load(Ordering::Relaxed));
        while let Some((read, ev)) = rx.recv().await {
            if !delay.is_zero() {
                tokio::time::sleep_until(read + delay).await;
            }
            self.dispatch(&ev);
        }
    }
}

type Starter = Box<dyn FnOnce(Client) -> BoxFuture<'static, ()> + Send>;
type Waiter = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

#[derive(Default)]
struct Inner {
    by_type: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
    starters: Vec<Starter>,
    waiters: Vec<Waiter>,
    running: Vec<tokio::task::AbortHandle>,
}

/// The process's informers, one per kind, created on first request.
pub struct Informers {
    client: Client,
    inner: Mutex<Inner>,
}

impl Informers {
    /// No informers yet.
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The client the watches use.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The informer of kind `K` (created, not yet watching, on first request).
    pub fn get<K: Watched>(&self) -> Arc<Informer<K>> {
        let mut inner = self.inner.lock().expect("informers lock");
        if let Some(i) = inner.by_type.get(&TypeId::of::<K>()) {
            return i.clone().downcast::<Informer<K>>().expect("informer type");
        }
        let informer = Informer::<K>::new();
        inner.by_type.insert(
            TypeId::of::<K>(),
            informer.clone() as Arc<dyn Any + Send + Sync>,
        );
        let run = informer.clone();
        inner
            .starters
            .push(Box::new(move |client| run.run(client).boxed()));
        let cache = informer.cache();
        inner.waiters.push(Box::new(move || {
            let cache = cache.clone();
            async move { cache.wait_ready().await }.boxed()
        }));
        if !inner.running.is_empty() {
            tracing::error!(kind = %K::kind(&()), "informer requested after start: starting it late");
            let starter = inner.starters.pop().expect("just pushed");
            let handle = tokio::spawn(starter(self.client.clone()));
            inner.running.push(handle.abort_handle());
        }
        informer
    }

    /// Starts the watch of every informer requested so far.
    pub fn start(&self) {
        let mut inner = self.inner.lock().expect("informers lock");
        let starters = std::mem::take(&mut inner.starters);
        for s in starters {
            let handle = tokio::spawn(s(self.client.clone()));
            inner.running.push(handle.abort_handle());
        }
    }

    /// Waits until every informer's cache holds a complete listing.
    pub async fn wait_synced(&self) {
        let waits: Vec<_> = {
            let inner = self.inner.lock().expect("informers lock");
            inner.waiters.iter().map(|w| w()).collect()
        };
        futures::future::join_all(waits).await;
    }
}

impl Drop for Informers {
    fn drop(&mut self) {
        let running = std::mem::take(&mut self.inner.get_mut().expect("informers lock").running);
        drop(AbortOnDrop(running));
    }
}

/// `namespace/name` of an object, the work-queue key of the workload controllers.
pub fn key_of<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// Splits a `namespace/name` key.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// Whether `obj` has a deletionTimestamp.
pub fn is_deleting<K: ResourceExt>(obj: &K) -> bool {
    obj.meta().deletion_timestamp.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn pod(name: &str, rv: &str, owner: Option<&str>) -> Pod {
        let mut meta = json!({"name": name, "namespace": "ns", "resourceVersion": rv});
        if let Some(uid) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "rs", "uid": uid, "controller": true}]);
        }
        serde_json::from_value(json!({ "metadata": meta })).unwrap()
    }

    #[test]
    fn ctl3_handlers_see_relists_as_per_object_changes_and_indexes_follow() {
        let informer = Informer::<Pod>::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        informer.on_change(Box::new(move |old, new| {
            let name = |p: Option<&Arc<Pod>>| p.map(|p| p.name_any());
            s.lock().unwrap().push((name(old), name(new)));
        }));
        informer.dispatch(&Event::Init);
        informer.dispatch(&Event::InitApply(pod("a", "1", Some("u1"))));
        informer.dispatch(&Event::InitApply(pod("b", "1", None)));
        informer.dispatch(&Event::InitDone);
        assert_eq!(informer.cache().index(CONTROLLER_UID, "u1").len(), 1);
        assert_eq!(informer.cache().index(NAMESPACE, "ns").len(), 2);
        seen.lock().unwrap().clear();
        // A relist: a unchanged, b gone, c new.
        informer.dispatch(&Event::Init);
        informer.dispatch(&Event::InitApply(pod("a", "1", Some("u1"))));
        informer.dispatch(&Event::InitApply(pod("c", "2", Some("u1"))));
        informer.dispatch(&Event::InitDone);
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        assert_eq!(
            got,
            [(None, Some("c".to_string())), (Some("b".to_string()), None)]
        );
        assert_eq!(informer.cache().index(CONTROLLER_UID, "u1").len(), 2);
        informer.dispatch(&Event::Delete(pod("a", "3", Some("u1"))));
        assert_eq!(informer.cache().index(CONTROLLER_UID, "u1").len(), 1);
    }

    #[test]
    fn cached_pods_drop_managed_fields_and_the_injected_token_volume_only() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "managedFields": [{"manager": "kubectl"}]},
            "spec": {
                "containers": [{"name": "c", "volumeMounts": [
                    {"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                    {"name": "data", "mountPath": "/data"}]}],
                "initContainers": [{"name": "i", "volumeMounts": [
                    {"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                "volumes": [
                    {"name": "kube-api-access-x1", "projected": {"sources": []}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]
            }
        }))
        .unwrap();
        trim_for_cache(&mut p);
        assert!(p.metadata.managed_fields.is_none());
        let spec = p.spec.unwrap();
        let volumes: Vec<_> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(
            volumes,
            ["data"],
            "claims stay for the controllers that read them"
        );
        let mounts: Vec<_> = spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.name.clone())
            .collect();
        assert_eq!(mounts, ["data"]);
        assert!(spec.init_containers.unwrap()[0].volume_mounts.is_none());
    }
}
