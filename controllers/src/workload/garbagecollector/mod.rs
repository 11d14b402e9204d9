//! The garbage collector (kube-controller-manager's `garbagecollector` controller, GC-1..GC-7):
//! deletes objects whose owners are gone (Background), deletes an owner's blocking dependents
//! before the owner when it is deleted in the foreground (`foregroundDeletion` finalizer,
//! `blockOwnerDeletion`), and strips an owner's references from its dependents when it is
//! deleted with Orphan (`orphan` finalizer).
//!
//! The pieces, as upstream's:
//! - [`discovery`]: every 30 s, the deletable resources (list, watch, delete; events ignored)
//!   and the REST mapper; monitors are added and removed to match;
//! - [`monitor`]: one metadata-only watch per resource, feeding the `graph_changes` queue;
//! - [`graph`]: the single-threaded graph builder's state and routing rules (pure), fed from
//!   that queue, producing the `attempt_to_delete` and `attempt_to_orphan` queues;
//! - [`plan`]: the decisions of the workers (pure);
//! - this module: the queues, the workers (`--concurrent-gc-syncs`, default 20, delete and
//!   orphan workers each) and the API calls: reads are metadata-only, deletes carry a uid (and
//!   resourceVersion) precondition, reference removal is a strategic merge patch with a JSON merge
//!   fallback, finalizer removal a JSON merge patch guarded by the resourceVersion.
//!
//! The monitors are the collector's own watches (metadata of every deletable resource, dynamic),
//! not the shared typed informers of the other workload controllers. The collector writes only
//! `ownerReferences`, `finalizers` (its own two) and deletes; it never creates objects other than
//! warning events.

pub mod absent;
pub mod discovery;
pub mod graph;
pub mod monitor;
pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{
    DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::core::PartialObjectMeta;
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use serde_json::Value;

use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::AbortOnDrop;

use absent::AbsentOwners;
use discovery::{Gvr, Mapping, ResourceInfo, RestMapper};
use graph::{Effect, Graph, GraphEvent, ObjectRef, FINALIZER_DELETE_DEPENDENTS, FINALIZER_ORPHAN};
use monitor::Monitor;
use plan::{Classified, Decision, OwnerClass};

/// kube-controller-manager's `--concurrent-gc-syncs` default.
pub const DEFAULT_WORKERS: usize = 20;
/// The discovery period (upstream's `garbageCollector.Sync` period, also the initial wait for
/// the monitors before the workers start anyway).
pub const SYNC_PERIOD: Duration = Duration::from_secs(30);
/// The component name on the collector's events.
const COMPONENT: &str = "garbage-collector-controller";

/// `garbagecollector_controller_resources_sync_error_total`, upstream's counter of failed
/// discovery syncs (no resources, or monitors not synced within a period).
fn sync_errors() -> &'static Counter {
    static COUNTER: OnceLock<Counter> = OnceLock::new();
    COUNTER.get_or_init(|| {
        let c = Counter::default();
        crate::runtime::metrics::with_registry(|r| {
            r.register(
                "garbagecollector_controller_resources_sync_error",
                "Number of garbage collector resources sync errors",
                c.clone(),
            )
        });
        c
    })
}

/// The resources upstream's collector ignores by default (`DefaultIgnoredResources`): events,
/// in the core group and in `events.k8s.io`, as `(group, resource)`.
pub fn default_ignored_resources() -> BTreeSet<(String, String)> {
    BTreeSet::from([
        (String::new(), "events".to_string()),
        ("events.k8s.io".to_string(), "events".to_string()),
    ])
}

/// The collector's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Attempt-to-delete workers, and as many attempt-to-orphan workers
    /// (`--concurrent-gc-syncs`).
    pub workers: usize,
    /// How often discovery runs to add and remove monitors.
    pub sync_period: Duration,
    /// How long the workers wait for every monitor's first listing before starting anyway.
    pub initial_sync_timeout: Duration,
    /// `(group, resource)` never monitored.
    pub ignored_resources: BTreeSet<(String, String)>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: DEFAULT_WORKERS,
            sync_period: SYNC_PERIOD,
            initial_sync_timeout: SYNC_PERIOD,
            ignored_resources: default_ignored_resources(),
        }
    }
}

/// A graph change in the `graph_changes` queue: every change is its own item (the sequence
/// number), so the queue keeps them all, in order, as upstream's queue of event pointers.
#[derive(Clone, Debug)]
struct Change {
    seq: u64,
    event: Arc<GraphEvent>,
}

impl PartialEq for Change {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}

impl Eq for Change {}

impl Hash for Change {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.seq.hash(state);
    }
}

/// Why an attempt stopped.
#[derive(Debug, thiserror::Error)]
enum GcError {
    /// The item is gone: a virtual delete event was queued for the graph (not retried).
    #[error("enqueued virtual delete event")]
    VirtualDelete,
    /// A cluster-scoped item names a namespaced owner: never resolves (not retried).
    #[error("cluster-scoped objects cannot refer to namespaced owners")]
    NamespacedOwnerOfClusterScoped,
    /// No served resource has this apiVersion and kind (yet).
    #[error("unable to get REST mapping for {api_version}/{kind}")]
    RestMapping { api_version: String, kind: String },
    /// An API request failed.
    #[error("{action} {object}: {source}")]
    Api {
        action: &'static str,
        object: Box<ObjectRef>,
        source: Box<kube::Error>,
    },
    /// The object vanished between two requests.
    #[error("{0} not found")]
    NotFound(Box<ObjectRef>),
    /// Something else, described.
    #[error("{0}")]
    Other(String),
}

impl From<plan::NamespacedOwnerOfClusterScoped> for GcError {
    fn from(_: plan::NamespacedOwnerOfClusterScoped) -> Self {
        Self::NamespacedOwnerOfClusterScoped
    }
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

impl GcError {
    fn api(action: &'static str, object: &ObjectRef, source: kube::Error) -> Self {
        Self::Api {
            action,
            object: Box::new(object.clone()),
            source: Box::new(source),
        }
    }

    fn code(&self) -> Option<u16> {
        match self {
            Self::Api { source, .. } => status_code(source),
            Self::NotFound(_) => Some(404),
            _ => None,
        }
    }

    fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }
}

/// What a worker does with the item it processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Forget,
    Requeue,
}

type MetaApi = Api<PartialObjectMeta<DynamicObject>>;

/// The garbage collector. Build with [`new`], then [`GarbageCollector::run`].
pub struct GarbageCollector {
    client: Client,
    config: Config,
    graph: Mutex<Graph>,
    absent: Mutex<AbsentOwners>,
    mapper: RwLock<RestMapper>,
    monitors: Mutex<BTreeMap<Gvr, Monitor>>,
    graph_changes: Arc<WorkQueue<Change>>,
    attempt_to_delete: Arc<WorkQueue<ObjectRef>>,
    attempt_to_orphan: Arc<WorkQueue<ObjectRef>>,
    /// Numbers the graph changes (monitors and workers share it).
    seq: Arc<AtomicU64>,
}

/// A garbage collector with these settings; nothing runs until [`GarbageCollector::run`].
pub fn new(client: Client, config: Config) -> Arc<GarbageCollector> {
    sync_errors();
    Arc::new(GarbageCollector {
        client,
        config,
        graph: Mutex::new(Graph::new()),
        absent: Mutex::new(AbsentOwners::default()),
        mapper: RwLock::new(RestMapper::default()),
        monitors: Mutex::new(BTreeMap::new()),
        // Upstream's queue names, so the workqueue metrics read the same.
        graph_changes: WorkQueue::new("garbage_collector_graph_changes"),
        attempt_to_delete: WorkQueue::new("garbage_collector_attempt_to_delete"),
        attempt_to_orphan: WorkQueue::new("garbage_collector_attempt_to_orphan"),
        seq: Arc::new(AtomicU64::new(0)),
    })
}

/// Stops what `run` started when `run` is dropped (leadership lost).
struct Running {
    gc: Arc<GarbageCollector>,
    tasks: AbortOnDrop,
}

impl Drop for Running {
    fn drop(&mut self) {
        // Dropping the monitors aborts their watches.
        self.gc.monitors.lock().expect("monitors lock").clear();
    }
}

impl GarbageCollector {
    /// Runs discovery, the monitors, the graph builder and the workers until dropped. The
    /// workers start once every monitor has listed its resource, or after
    /// `initial_sync_timeout` regardless, as upstream.
    pub async fn run(self: Arc<Self>) {
        tracing::info!("starting controller garbagecollector");
        self.graph.lock().expect("graph lock").clear();
        // Everything started here stops when this future is dropped.
        let mut running = Running {
            gc: self.clone(),
            tasks: AbortOnDrop(vec![
                tokio::spawn(self.clone().run_graph_builder()).abort_handle(),
                tokio::spawn(self.clone().run_discovery()).abort_handle(),
            ]),
        };
        let deadline = tokio::time::Instant::now() + self.config.initial_sync_timeout;
        while !self.is_synced() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if self.is_synced() {
            tracing::info!("garbage collector: all resource monitors have synced");
        } else {
            tracing::info!(
                "garbage collector: not all resource monitors could be synced, proceeding anyways"
            );
        }
        for _ in 0..self.config.workers.max(1) {
            let gc = self.clone();
            let q = gc.attempt_to_delete.clone();
            let delete = gc.work(q, |gc, item| async move {
                gc.attempt_to_delete_worker(&item).await
            });
            running.tasks.0.push(tokio::spawn(delete).abort_handle());
            let gc = self.clone();
            let q = gc.attempt_to_orphan.clone();
            let orphan = gc.work(q, |gc, item| async move {
                gc.attempt_to_orphan_worker(&item).await
            });
            running.tasks.0.push(tokio::spawn(orphan).abort_handle());
        }
        futures::future::pending::<()>().await;
    }

    /// Whether monitors exist and each has listed its resource (upstream `IsSynced`).
    pub fn is_synced(&self) -> bool {
        let monitors = self.monitors.lock().expect("monitors lock");
        !monitors.is_empty() && monitors.values().all(Monitor::synced)
    }

    /// Whether the graph has a node with this uid (for tests, as upstream's `GraphHasUID`).
    pub fn graph_has_uid(&self, uid: &str) -> bool {
        self.graph.lock().expect("graph lock").node(uid).is_some()
    }

    /// The resources monitored now.
    pub fn monitored(&self) -> Vec<Gvr> {
        self.monitors
            .lock()
            .expect("monitors lock")
            .keys()
            .cloned()
            .collect()
    }

    fn push_change(&self, event: GraphEvent) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.graph_changes.add(Change {
            seq,
            event: Arc::new(event),
        });
    }

    /// The graph builder: the only writer of the graph (upstream `processGraphChanges`).
    async fn run_graph_builder(self: Arc<Self>) {
        while let Some(change) = self.graph_changes.get().await {
            let effects = self
                .graph
                .lock()
                .expect("graph lock")
                .process(&change.event);
            self.apply_effects(effects);
            self.graph_changes.done(&change);
        }
    }

    fn apply_effects(&self, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::AttemptToDelete(r) => self.attempt_to_delete.add(r),
                Effect::AttemptToDeleteRateLimited(r) => self.attempt_to_delete.add_rate_limited(r),
                Effect::AttemptToOrphan(r) => self.attempt_to_orphan.add(r),
                Effect::AbsentOwner(r) => self.absent.lock().expect("absent lock").add(r),
                Effect::InvalidNamespaceOwnerRef { dependent, owner } => {
                    tracing::info!(item = %dependent, owner = %owner, "item references an owner but does not match namespaces");
                    tokio::spawn(report_invalid_namespace(
                        self.client.clone(),
                        dependent,
                        owner,
                    ));
                }
            }
        }
    }

    /// Discovery every `sync_period`, monitors added and removed to match (upstream `Sync`).
    async fn run_discovery(self: Arc<Self>) {
        let mut old: BTreeMap<Gvr, ResourceInfo> = BTreeMap::new();
        loop {
            self.sync_once(&mut old).await;
            tokio::time::sleep(self.config.sync_period).await;
        }
    }

    async fn sync_once(&self, old: &mut BTreeMap<Gvr, ResourceInfo>) {
        let discovered = match discovery::discover(&self.client).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("garbage collector: discovery failed, skipping this sync: {e}");
                sync_errors().inc();
                return;
            }
        };
        // kube-controller-manager refreshes its REST mapper on the same period.
        *self.mapper.write().expect("mapper lock") = discovered.mapper;
        let mut new = discovered.deletable;
        if new.is_empty() {
            tracing::info!("no resources reported by discovery, skipping garbage collector sync");
            sync_errors().inc();
            return;
        }
        // Partial discovery: keep the synced monitors of the groups that failed.
        for (gvr, info) in old.iter() {
            let gv = (gvr.group.clone(), gvr.version.clone());
            if discovered.failed.contains(&gv) && self.is_resource_synced(gvr) {
                new.insert(gvr.clone(), info.clone());
            }
        }
        if *old == new {
            return;
        }
        let added: Vec<String> = new
            .keys()
            .filter(|g| !old.contains_key(*g))
            .map(Gvr::path)
            .collect();
        let removed: Vec<String> = old
            .keys()
            .filter(|g| !new.contains_key(*g))
            .map(Gvr::path)
            .collect();
        tracing::info!(
            ?added,
            ?removed,
            "syncing garbage collector with updated resources from discovery"
        );
        self.sync_monitors(&new);
        let deadline = tokio::time::Instant::now() + self.config.sync_period;
        while !self.is_synced() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !self.is_synced() {
            tracing::warn!("timed out waiting for dependency graph builder sync during GC sync");
            sync_errors().inc();
        }
        *old = new;
    }

    fn is_resource_synced(&self, gvr: &Gvr) -> bool {
        self.monitors
            .lock()
            .expect("monitors lock")
            .get(gvr)
            .is_some_and(Monitor::synced)
    }

    /// Starts monitors for new resources and stops those no longer listed (upstream
    /// `syncMonitors` + `startMonitors`).
    fn sync_monitors(&self, resources: &BTreeMap<Gvr, ResourceInfo>) {
        let mut monitors = self.monitors.lock().expect("monitors lock");
        let mut current = BTreeMap::new();
        let sink = self.sink();
        for (gvr, info) in resources {
            let gr = (gvr.group.clone(), gvr.resource.clone());
            if self.config.ignored_resources.contains(&gr) {
                continue;
            }
            let m = match monitors.remove(gvr) {
                Some(m) => m,
                None => Monitor::start(self.client.clone(), gvr, info, sink.clone()),
            };
            current.insert(gvr.clone(), m);
        }
        // Those left are dropped, which stops them.
        *monitors = current;
    }

    fn sink(&self) -> monitor::Sink {
        let queue = self.graph_changes.clone();
        let seq = self.seq.clone();
        Arc::new(move |event| {
            let seq = seq.fetch_add(1, Ordering::Relaxed);
            queue.add(Change {
                seq,
                event: Arc::new(event),
            });
        })
    }

    /// A worker loop with upstream's three outcomes: forget, or re-queue rate-limited (errors,
    /// and virtual nodes not yet observed, which are polled).
    async fn work<F, Fut>(self: Arc<Self>, queue: Arc<WorkQueue<ObjectRef>>, f: F)
    where
        F: Fn(Arc<Self>, ObjectRef) -> Fut,
        Fut: std::future::Future<Output = Action>,
    {
        while let Some(item) = queue.get().await {
            let action = std::panic::AssertUnwindSafe(f(self.clone(), item.clone()))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(queue = queue.name(), %item, "garbage collector worker panicked");
                    Action::Requeue
                });
            match action {
                Action::Forget => queue.forget(&item),
                Action::Requeue => queue.add_rate_limited(item.clone()),
            }
            queue.done(&item);
        }
    }

    /// Upstream `attemptToDeleteWorker`.
    async fn attempt_to_delete_worker(&self, item: &ObjectRef) -> Action {
        let identity = {
            let graph = self.graph.lock().expect("graph lock");
            let Some(n) = graph.node(&item.uid) else {
                // Deleted meanwhile (or a virtual node already resolved): nothing to do.
                tracing::debug!(%item, "item no longer in the graph, skipping attemptToDeleteItem");
                return Action::Forget;
            };
            if !n.virtual_
                && (n.identity.name != item.name || n.identity.namespace != item.namespace)
            {
                // Queued under coordinates a virtual node had; the object was observed with others.
                tracing::debug!(%item, "item no longer virtual in the graph, skipping attemptToDeleteItem on virtual node");
                return Action::Forget;
            }
            // The node may have been observed under another apiVersion/kind since it was queued.
            ObjectRef {
                api_version: n.identity.api_version.clone(),
                kind: n.identity.kind.clone(),
                ..item.clone()
            }
        };
        match self.attempt_to_delete_item(&identity).await {
            Ok(()) => {
                let still_virtual = self
                    .graph
                    .lock()
                    .expect("graph lock")
                    .node(&item.uid)
                    .is_some_and(|n| n.virtual_);
                if still_virtual {
                    // Poll until a watch observes it, so a virtual node for an object added and
                    // removed while unwatched does not stay in the graph.
                    Action::Requeue
                } else {
                    Action::Forget
                }
            }
            Err(GcError::VirtualDelete) | Err(GcError::NamespacedOwnerOfClusterScoped) => {
                Action::Forget
            }
            Err(e) => {
                tracing::warn!(%item, "garbage collector: error syncing item: {e}");
                Action::Requeue
            }
        }
    }

    fn node_state(&self, uid: &str) -> (bool, bool) {
        self.graph
            .lock()
            .expect("graph lock")
            .node(uid)
            .map(|n| (n.being_deleted, n.deleting_dependents))
            .unwrap_or_default()
    }

    fn mapping(&self, api_version: &str, kind: &str) -> Result<Mapping, GcError> {
        self.mapper
            .read()
            .expect("mapper lock")
            .mapping(api_version, kind)
            .cloned()
            .ok_or_else(|| GcError::RestMapping {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
            })
    }

    fn api(&self, item: &ObjectRef) -> Result<MetaApi, GcError> {
        let m = self.mapping(&item.api_version, &item.kind)?;
        Ok(self.api_in(&m, &item.namespace))
    }

    fn api_in(&self, m: &Mapping, namespace: &str) -> MetaApi {
        let ar = m.api_resource();
        if m.info.namespaced && !namespace.is_empty() {
            Api::namespaced_with(self.client.clone(), namespace, &ar)
        } else {
            Api::all_with(self.client.clone(), &ar)
        }
    }

    /// The item's latest metadata; `None` when not found.
    async fn get_object(&self, item: &ObjectRef) -> Result<Option<ObjectMeta>, GcError> {
        let m = self.mapping(&item.api_version, &item.kind)?;
        // Only a virtual owner named by a cluster-scoped dependent has a namespaced kind and no
        // namespace: there is nowhere to look (GC-7).
        plan::lookup_namespace(m.info.namespaced, &item.namespace)?;
        let api = self.api_in(&m, &item.namespace);
        match api.get_opt(&item.name).await {
            Ok(o) => Ok(o.map(|o| o.metadata)),
            Err(e) => Err(GcError::api("getting", item, e)),
        }
    }

    fn enqueue_virtual_delete(&self, item: &ObjectRef) {
        self.push_change(GraphEvent::virtual_delete(item));
    }

    /// Upstream `attemptToDeleteItem` (GC-3).
    async fn attempt_to_delete_item(&self, item: &ObjectRef) -> Result<(), GcError> {
        let (being_deleted, deleting_dependents) = self.node_state(&item.uid);
        tracing::debug!(%item, "processing item");
        // Being deleted is a one-way trip; its dependents are handled when it is gone.
        if being_deleted && !deleting_dependents {
            return Ok(());
        }
        let latest = match self.get_object(item).await? {
            Some(m) if m.uid.as_deref() == Some(item.uid.as_str()) => m,
            _ => {
                // Absent (or another object under the name): drop the node from the graph.
                self.enqueue_virtual_delete(item);
                return Err(GcError::VirtualDelete);
            }
        };
        if self.node_state(&item.uid).1 {
            return self.process_deleting_dependents_item(item).await;
        }
        let owners = latest.owner_references.clone().unwrap_or_default();
        if owners.is_empty() {
            return Ok(());
        }
        let classified = self.classify_references(item, &owners).await?;
        let dependents: Vec<bool> = self
            .graph
            .lock()
            .expect("graph lock")
            .dependents(&item.uid)
            .iter()
            .map(|d| d.deleting_dependents)
            .collect();
        let finalizers = latest.finalizers.clone().unwrap_or_default();
        let rv = latest.resource_version.clone().unwrap_or_default();
        let decision = plan::decide(&classified, &dependents, &finalizers);
        tracing::debug!(%item, ?decision, "classified item's references");
        match decision {
            Decision::Keep => Ok(()),
            Decision::RemoveReferences(uids) => {
                let smp = plan::delete_owner_refs_strategic(&item.uid, &uids);
                self.patch(item, smp, |m| {
                    plan::delete_owner_refs_merge(
                        m.resource_version.as_deref().unwrap_or_default(),
                        m.owner_references.as_deref().unwrap_or_default(),
                        &uids,
                    )
                })
                .await
            }
            Decision::DeleteForeground { unblock_first } => {
                if unblock_first {
                    // A dependent deletes its own dependents: unblock to avoid a cycle.
                    let graph_owners = self
                        .graph
                        .lock()
                        .expect("graph lock")
                        .node(&item.uid)
                        .map(|n| n.owners.clone())
                        .unwrap_or_default();
                    let smp = plan::unblock_owner_refs_strategic(&item.uid, &graph_owners);
                    self.patch(item, smp, |m| {
                        plan::unblock_owner_refs_merge(
                            m.resource_version.as_deref().unwrap_or_default(),
                            &graph_owners,
                        )
                    })
                    .await?;
                }
                self.delete_item(item, &rv, &owners, PropagationPolicy::Foreground)
                    .await
            }
            Decision::Delete(policy) => self.delete_item(item, &rv, &owners, policy).await,
        }
    }

    /// Deletes the item; a 404 becomes a virtual delete.
    async fn delete_item(
        &self,
        item: &ObjectRef,
        resource_version: &str,
        owners: &[OwnerReference],
        policy: PropagationPolicy,
    ) -> Result<(), GcError> {
        tracing::debug!(%item, ?policy, "garbage collector: deleting item");
        match self
            .delete_object(item, resource_version, owners, policy)
            .await
        {
            Err(e) if e.is_not_found() => {
                self.enqueue_virtual_delete(item);
                Err(GcError::VirtualDelete)
            }
            other => other,
        }
    }

    /// Upstream `classifyReferences` (owners looked up one by one).
    async fn classify_references(
        &self,
        item: &ObjectRef,
        owners: &[OwnerReference],
    ) -> Result<Classified, GcError> {
        let mut c = Classified::default();
        for r in owners {
            let class = self.owner_class(r, item).await?;
            c.push(r.clone(), class);
        }
        Ok(c)
    }

    /// Upstream `isDangling` + the waiting check: the absent-owner cache first, then a
    /// metadata GET of the owner at the coordinates the reference names in the item's
    /// namespace (or cluster-wide for a cluster-scoped kind; GC-7).
    async fn owner_class(
        &self,
        r: &OwnerReference,
        item: &ObjectRef,
    ) -> Result<OwnerClass, GcError> {
        let mut key = ObjectRef::from_owner(r, "");
        let absent_cluster = self.absent.lock().expect("absent lock").has(&key);
        if absent_cluster {
            return Ok(OwnerClass::Dangling);
        }
        key.namespace = item.namespace.clone();
        let absent_here = self.absent.lock().expect("absent lock").has(&key);
        if absent_here {
            return Ok(OwnerClass::Dangling);
        }
        let m = self.mapping(&r.api_version, &r.kind)?;
        if !m.info.namespaced {
            key.namespace.clear();
        }
        if let Err(e) = plan::lookup_namespace(m.info.namespaced, &item.namespace) {
            tracing::info!(%item, owner = %key, "item is cluster-scoped, but refers to a namespaced owner");
            return Err(e.into());
        }
        let api = self.api_in(&m, &item.namespace);
        let owner = api
            .get_opt(&r.name)
            .await
            .map_err(|e| GcError::api("getting owner", &key, e))?;
        let class = plan::classify_owner(r, owner.as_ref().map(|o| &o.metadata));
        if class == OwnerClass::Dangling {
            self.absent.lock().expect("absent lock").add(key);
        }
        Ok(class)
    }

    /// Upstream `processDeletingDependentsItem` (GC-4 foreground): remove `foregroundDeletion`
    /// once no dependent blocks, else queue the blocking dependents.
    async fn process_deleting_dependents_item(&self, item: &ObjectRef) -> Result<(), GcError> {
        let blocking: Vec<(ObjectRef, bool)> = self
            .graph
            .lock()
            .expect("graph lock")
            .blocking_dependents(&item.uid)
            .iter()
            .map(|d| (d.identity.clone(), d.deleting_dependents))
            .collect();
        if blocking.is_empty() {
            tracing::debug!(%item, "garbage collector: removing the foregroundDeletion finalizer");
            return self
                .remove_finalizer(item, FINALIZER_DELETE_DEPENDENTS)
                .await;
        }
        for (dep, deleting_dependents) in blocking {
            if !deleting_dependents {
                self.attempt_to_delete.add(dep);
            }
        }
        Ok(())
    }

    /// Upstream `attemptToOrphanWorker` (GC-6): remove the owner's reference from every
    /// dependent, then the `orphan` finalizer. GC-6's wording also has the handler drop other
    /// stale references; upstream v1.34 removes only this owner's reference (stale ones are
    /// removed by attempt-to-delete's case (a) when the dependent is processed), and so does this.
    async fn attempt_to_orphan_worker(&self, owner: &ObjectRef) -> Action {
        let dependents: Vec<ObjectRef> = self
            .graph
            .lock()
            .expect("graph lock")
            .dependents(&owner.uid)
            .iter()
            .map(|d| d.identity.clone())
            .collect();
        if let Err(e) = self.orphan_dependents(owner, &dependents).await {
            tracing::warn!(%owner, "orphanDependents failed: {e}");
            return Action::Requeue;
        }
        if let Err(e) = self.remove_finalizer(owner, FINALIZER_ORPHAN).await {
            tracing::warn!(%owner, "removing the orphan finalizer failed: {e}");
            return Action::Requeue;
        }
        Action::Forget
    }

    async fn orphan_dependents(
        &self,
        owner: &ObjectRef,
        dependents: &[ObjectRef],
    ) -> Result<(), GcError> {
        let owner_uids = [owner.uid.clone()];
        let patches = dependents.iter().map(|dep| {
            let owner_uids = &owner_uids;
            async move {
                let smp = plan::delete_owner_refs_strategic(&dep.uid, owner_uids);
                let res = self
                    .patch(dep, smp, |m| {
                        plan::delete_owner_refs_merge(
                            m.resource_version.as_deref().unwrap_or_default(),
                            m.owner_references.as_deref().unwrap_or_default(),
                            owner_uids,
                        )
                    })
                    .await;
                // A dependent already gone needs nothing.
                match res {
                    Err(e) if !e.is_not_found() => Some(format!("orphaning {dep} failed, {e}")),
                    _ => None,
                }
            }
        });
        let errors: Vec<String> = futures::future::join_all(patches)
            .await
            .into_iter()
            .flatten()
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(GcError::Other(format!(
                "failed to orphan dependents of owner {owner}, got errors: {}",
                errors.join("; ")
            )))
        }
    }

    /// A strategic merge patch, or, where the resource has none (custom resources answer 415),
    /// the JSON merge patch `merge` builds from the object's latest metadata.
    async fn patch(
        &self,
        item: &ObjectRef,
        strategic: Value,
        merge: impl FnOnce(&ObjectMeta) -> Value,
    ) -> Result<(), GcError> {
        let api = self.api(item)?;
        let pp = PatchParams::default();
        match api
            .patch(&item.name, &pp, &Patch::Strategic(&strategic))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(415) => {
                let meta = self
                    .get_object(item)
                    .await?
                    .ok_or_else(|| GcError::NotFound(Box::new(item.clone())))?;
                let body = merge(&meta);
                api.patch(&item.name, &pp, &Patch::Merge(&body))
                    .await
                    .map(|_| ())
                    .map_err(|e| GcError::api("patching", item, e))
            }
            Err(e) => Err(GcError::api("patching", item, e)),
        }
    }

    /// Upstream `deleteObject`: a uid precondition and, since v1.34 (beyond GC-3's uid
    /// precondition), the resourceVersion the decision was made on; on a conflict where only the resourceVersion moved (same owners), once more
    /// without it, so unrelated updates do not starve the collector.
    async fn delete_object(
        &self,
        item: &ObjectRef,
        resource_version: &str,
        owners: &[OwnerReference],
        policy: PropagationPolicy,
    ) -> Result<(), GcError> {
        let api = self.api(item)?;
        let params = |rv: Option<String>| DeleteParams {
            propagation_policy: Some(policy.clone()),
            preconditions: Some(Preconditions {
                uid: Some(item.uid.clone()),
                resource_version: rv,
            }),
            ..DeleteParams::default()
        };
        let rv = (!resource_version.is_empty()).then(|| resource_version.to_string());
        let first = api.delete(&item.name, &params(rv.clone())).await;
        match first {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(409) && rv.is_some() => {
                let live = api
                    .get_opt(&item.name)
                    .await
                    .map_err(|e| GcError::api("getting", item, e))?;
                match live {
                    // Gone meanwhile: what was wanted.
                    None => Ok(()),
                    Some(l)
                        if plan::retry_delete_without_resource_version(
                            &item.uid,
                            resource_version,
                            owners,
                            &l.metadata,
                        ) =>
                    {
                        api.delete(&item.name, &params(None))
                            .await
                            .map(|_| ())
                            .map_err(|e| GcError::api("deleting", item, e))
                    }
                    Some(_) => Err(GcError::api("deleting", item, e)),
                }
            }
            Err(e) => Err(GcError::api("deleting", item, e)),
        }
    }

    /// Upstream `removeFinalizer`: read, drop `target`, write with a resourceVersion-guarded
    /// JSON merge patch, retrying conflicts with client-go's default backoff (4 tries, 10 ms
    /// growing fivefold).
    async fn remove_finalizer(&self, item: &ObjectRef, target: &str) -> Result<(), GcError> {
        let api = self.api(item)?;
        let mut delay = Duration::from_millis(10);
        for attempt in 0..4 {
            if attempt > 0 {
                tokio::time::sleep(delay).await;
                delay *= 5;
            }
            let latest = match self.get_object(item).await {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(GcError::Other(format!(
                        "cannot finalize owner {item}, because cannot get it: {e}. The garbage collector will retry later"
                    )))
                }
            };
            let finalizers = latest.finalizers.clone().unwrap_or_default();
            let Some(remaining) = plan::without_finalizer(&finalizers, target) else {
                return Ok(());
            };
            let body = plan::finalizers_merge(
                latest.resource_version.as_deref().unwrap_or_default(),
                &remaining,
            );
            match api
                .patch(&item.name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if status_code(&e) == Some(409) => continue,
                Err(e) => return Err(GcError::api("removing a finalizer from", item, e)),
            }
        }
        Err(GcError::Other(format!(
            "updateMaxRetries(4) has reached. The garbage collector will retry later for owner {item}"
        )))
    }
}

/// The `OwnerRefInvalidNamespace` warning on `dependent` (GC-7), as upstream's event recorder
/// writes it (core/v1 Event, named `<name>.<unix nanoseconds in hex>`).
async fn report_invalid_namespace(client: Client, dependent: ObjectRef, owner: ObjectRef) {
    let ns = if dependent.namespace.is_empty() {
        "default".to_string()
    } else {
        dependent.namespace.clone()
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", dependent.name, now.as_nanosecond())),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(dependent.api_version.clone()),
            kind: Some(dependent.kind.clone()),
            name: Some(dependent.name.clone()),
            namespace: (!dependent.namespace.is_empty()).then(|| dependent.namespace.clone()),
            uid: Some(dependent.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some("OwnerRefInvalidNamespace".into()),
        message: Some(format!(
            "ownerRef {owner} does not exist in namespace {:?}",
            dependent.namespace
        )),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: None,
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        type_: Some("Warning".into()),
        reporting_component: Some(COMPONENT.into()),
        ..Event::default()
    };
    if let Err(e) = Api::<Event>::namespaced(client, &ns)
        .create(&PostParams::default(), &event)
        .await
    {
        tracing::warn!(item = %dependent, "recording event OwnerRefInvalidNamespace: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc2_sync_error_counter_uses_upstreams_name() {
        sync_errors();
        let text = crate::runtime::metrics::encode();
        assert!(
            text.contains("garbagecollector_controller_resources_sync_error_total"),
            "{text}"
        );
    }

    #[test]
    fn gc2_every_graph_change_is_its_own_queue_item() {
        let ev = Arc::new(GraphEvent::virtual_delete(&ObjectRef::default()));
        let a = Change {
            seq: 1,
            event: ev.clone(),
        };
        let b = Change { seq: 2, event: ev };
        assert_ne!(a, b, "the same event twice is two changes");
    }

    #[test]
    fn gc2_events_are_ignored_by_default() {
        let ignored = Config::default().ignored_resources;
        assert!(ignored.contains(&(String::new(), "events".into())));
        assert!(ignored.contains(&("events.k8s.io".into(), "events".into())));
        assert_eq!(Config::default().workers, 20, "--concurrent-gc-syncs");
    }
}
