//! The scheduling framework's contract: the result of a plugin ([`Status`] with its [`Code`]),
//! per-cycle plugin data ([`CycleState`]), the extension points as traits, and the node view the
//! plugins read ([`NodeInfo`], [`Snapshot`], in [`types`]).
//!
//! Owns only types and traits; running a profile's plugins in order and in parallel over nodes
//! is [`runtime`]'s (upstream's framework/runtime). Every API call (binding, conditions, events,
//! victims) belongs to the scheduler, never to a plugin: every trait here except [`BindPlugin`] /
//! [`PreBindPlugin`] / [`PostBindPlugin`] is synchronous and pure over its arguments.

pub mod runtime;
pub mod types;

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

pub use types::{NodeInfo, PodInfo, Resource, Snapshot};

/// kube-scheduler's MaxNodeScore: every Score plugin's normalized score lies in 0..=100.
pub const MAX_NODE_SCORE: i64 = 100;
/// kube-scheduler's MinNodeScore.
pub const MIN_NODE_SCORE: i64 = 0;

/// What a plugin decided, as kube-scheduler's framework.Code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// The plugin ran and the Pod may go on (fits the node, may be scheduled, ...).
    Success,
    /// An internal error: the scheduling attempt fails and the Pod is retried with backoff.
    Error,
    /// The Pod does not fit, but preemption might make it fit.
    Unschedulable,
    /// The Pod does not fit and preempting Pods on this node would not change that.
    UnschedulableAndUnresolvable,
    /// Permit: wait (not used by the default plugins).
    Wait,
    /// PreFilter / PreScore: this plugin has nothing to do for this Pod; its Filter / Score is
    /// skipped for this cycle.
    Skip,
    /// PreEnqueue: the Pod stays out of the active queue until something changes.
    Pending,
}

/// The result of one plugin call: a code, the plugin that produced it, and human-readable reasons
/// (the strings kube-scheduler puts in FitError messages, e.g. "Insufficient cpu").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub reasons: Vec<String>,
    /// The plugin that returned this status (set by the runtime when a plugin leaves it empty).
    pub plugin: &'static str,
}

impl Status {
    pub fn success() -> Status {
        Status {
            code: Code::Success,
            reasons: Vec::new(),
            plugin: "",
        }
    }

    pub fn new(code: Code, reason: impl Into<String>) -> Status {
        Status {
            code,
            reasons: vec![reason.into()],
            plugin: "",
        }
    }

    pub fn unschedulable(reason: impl Into<String>) -> Status {
        Status::new(Code::Unschedulable, reason)
    }

    pub fn unresolvable(reason: impl Into<String>) -> Status {
        Status::new(Code::UnschedulableAndUnresolvable, reason)
    }

    pub fn error(reason: impl Into<String>) -> Status {
        Status::new(Code::Error, reason)
    }

    pub fn skip() -> Status {
        Status {
            code: Code::Skip,
            reasons: Vec::new(),
            plugin: "",
        }
    }

    pub fn with_plugin(mut self, plugin: &'static str) -> Status {
        self.plugin = plugin;
        self
    }

    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }

    pub fn is_skip(&self) -> bool {
        self.code == Code::Skip
    }

    /// Unschedulable or UnschedulableAndUnresolvable.
    pub fn is_rejected(&self) -> bool {
        matches!(
            self.code,
            Code::Unschedulable | Code::UnschedulableAndUnresolvable
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.code)?;
        if !self.plugin.is_empty() {
            write!(f, " ({})", self.plugin)?;
        }
        if !self.reasons.is_empty() {
            write!(f, ": {}", self.reasons.join(", "))?;
        }
        Ok(())
    }
}

/// Data a plugin computes in PreFilter / PreScore and reads back in Filter / Score for the same
/// Pod in the same cycle, keyed by the plugin's own key (by convention its name plus the point,
/// e.g. "PreFilterNodeResourcesFit"). Preemption clones it to simulate removing victims.
#[derive(Default)]
pub struct CycleState {
    data: HashMap<&'static str, Box<dyn StateData>>,
    /// Set by the runtime when the profile asks for all nodes to be scored for this Pod.
    pub skip_filter_plugins: BTreeSet<&'static str>,
    pub skip_score_plugins: BTreeSet<&'static str>,
}

/// A value kept in [`CycleState`]; `clone_box` lets preemption copy the state per candidate node.
pub trait StateData: Any + Send + Sync {
    fn clone_box(&self) -> Box<dyn StateData>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Clone + Send + Sync> StateData for T {
    fn clone_box(&self) -> Box<dyn StateData> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Clone for CycleState {
    fn clone(&self) -> Self {
        CycleState {
            data: self
                .data
                .iter()
                .map(|(k, v)| (*k, (**v).clone_box()))
                .collect(),
            skip_filter_plugins: self.skip_filter_plugins.clone(),
            skip_score_plugins: self.skip_score_plugins.clone(),
        }
    }
}

impl CycleState {
    pub fn new() -> CycleState {
        CycleState::default()
    }

    pub fn write<T: Any + Clone + Send + Sync>(&mut self, key: &'static str, value: T) {
        self.data.insert(key, Box::new(value));
    }

    pub fn read<T: Any>(&self, key: &'static str) -> Option<&T> {
        let data: &dyn StateData = &**self.data.get(key)?;
        data.as_any().downcast_ref::<T>()
    }

    pub fn read_mut<T: Any>(&mut self, key: &'static str) -> Option<&mut T> {
        let data: &mut dyn StateData = &mut **self.data.get_mut(key)?;
        data.as_any_mut().downcast_mut::<T>()
    }
}

/// A node's score from one plugin (raw, then normalized in place by NormalizeScore).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeScore {
    pub name: String,
    pub score: i64,
}

/// What PreFilter may say about the nodes worth filtering: `None` means all nodes; `Some(set)`
/// restricts the cycle to those node names (NodeAffinity's `metadata.name` terms, NodeName).
/// The runtime intersects the results of all PreFilter plugins.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreFilterResult {
    pub node_names: Option<BTreeSet<String>>,
}

/// The cluster objects some plugins read besides nodes and Pods (PodTopologySpread's system
/// default constraints select by the Pod's Services and owning ReplicaSets / StatefulSets /
/// ReplicationControllers; DefaultPreemption respects PodDisruptionBudgets; the volume plugins
/// read claims, volumes, classes and CSINodes). The scheduler implements it over its informer
/// caches; tests over vectors. Plugins get it at construction.
pub trait ClusterObjects: Send + Sync {
    fn services(&self, namespace: &str) -> Vec<Arc<Service>>;
    fn replication_controllers(&self, namespace: &str) -> Vec<Arc<ReplicationController>>;
    fn replica_sets(&self, namespace: &str) -> Vec<Arc<ReplicaSet>>;
    fn stateful_sets(&self, namespace: &str) -> Vec<Arc<StatefulSet>>;
    fn pod_disruption_budgets(&self, namespace: &str) -> Vec<Arc<PodDisruptionBudget>>;
    fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolumeClaim>>;
    fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>>;
    /// Every PersistentVolume, in name order.
    fn persistent_volumes(&self) -> Vec<Arc<PersistentVolume>>;
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>>;
    fn csi_node(&self, name: &str) -> Option<Arc<CSINode>>;
}

/// [`ClusterObjects`] over plain vectors (tests, and a scheduler run without those informers).
#[derive(Debug, Clone, Default)]
pub struct StaticObjects {
    pub services: Vec<Arc<Service>>,
    pub replication_controllers: Vec<Arc<ReplicationController>>,
    pub replica_sets: Vec<Arc<ReplicaSet>>,
    pub stateful_sets: Vec<Arc<StatefulSet>>,
    pub pod_disruption_budgets: Vec<Arc<PodDisruptionBudget>>,
    pub persistent_volume_claims: Vec<Arc<PersistentVolumeClaim>>,
    pub persistent_volumes: Vec<Arc<PersistentVolume>>,
    pub storage_classes: Vec<Arc<StorageClass>>,
    pub csi_nodes: Vec<Arc<CSINode>>,
}

fn named<K: kube::Resource>(objs: &[Arc<K>], ns: Option<&str>, name: &str) -> Option<Arc<K>> {
    objs.iter()
        .find(|o| {
            o.meta().name.as_deref() == Some(name)
                && ns.is_none_or(|ns| o.meta().namespace.as_deref() == Some(ns))
        })
        .cloned()
}

fn in_namespace<K: kube::Resource>(objs: &[Arc<K>], ns: &str) -> Vec<Arc<K>> {
    objs.iter()
        .filter(|o| o.meta().namespace.as_deref() == Some(ns))
        .cloned()
        .collect()
}

impl ClusterObjects for StaticObjects {
    fn services(&self, namespace: &str) -> Vec<Arc<Service>> {
        in_namespace(&self.services, namespace)
    }
    fn replication_controllers(&self, namespace: &str) -> Vec<Arc<ReplicationController>> {
        in_namespace(&self.replication_controllers, namespace)
    }
    fn replica_sets(&self, namespace: &str) -> Vec<Arc<ReplicaSet>> {
        in_namespace(&self.replica_sets, namespace)
    }
    fn stateful_sets(&self, namespace: &str) -> Vec<Arc<StatefulSet>> {
        in_namespace(&self.stateful_sets, namespace)
    }
    fn pod_disruption_budgets(&self, namespace: &str) -> Vec<Arc<PodDisruptionBudget>> {
        in_namespace(&self.pod_disruption_budgets, namespace)
    }
    fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolumeClaim>> {
        named(&self.persistent_volume_claims, Some(namespace), name)
    }
    fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        named(&self.persistent_volumes, None, name)
    }
    fn persistent_volumes(&self) -> Vec<Arc<PersistentVolume>> {
        let mut pvs = self.persistent_volumes.clone();
        pvs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        pvs
    }
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        named(&self.storage_classes, None, name)
    }
    fn csi_node(&self, name: &str) -> Option<Arc<CSINode>> {
        named(&self.csi_nodes, None, name)
    }
}

/// Every plugin has a name (the one used in KubeSchedulerConfiguration and in FitError reasons).
pub trait Plugin: Send + Sync {
    fn name(&self) -> &'static str;
}

/// Gatekeeps the active queue (schedulingGates).
pub trait PreEnqueuePlugin: Plugin {
    fn pre_enqueue(&self, pod: &Pod) -> Status;
}

/// Orders the active queue: `less(a, b)` is true when `a` is scheduled before `b`.
pub trait QueueSortPlugin: Plugin {
    fn less(&self, a: &QueuedPodInfo, b: &QueuedPodInfo) -> bool;
}

/// What the queue knows about a Pod waiting to be scheduled.
#[derive(Debug, Clone)]
pub struct QueuedPodInfo {
    pub pod: Arc<Pod>,
    /// When the Pod was first added to the queue (kube-scheduler's InitialAttemptTimestamp /
    /// Timestamp: the QueueSort tie-break is the time it entered the queue).
    pub timestamp: std::time::Instant,
    pub attempts: u32,
    /// The plugins that rejected it in its last attempt (for queueing hints).
    pub unschedulable_plugins: BTreeSet<&'static str>,
}

/// Runs once per Pod before Filter; may compute state for Filter and narrow the nodes.
pub trait PreFilterPlugin: Plugin {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status);

    /// Preemption's "what if": update this plugin's PreFilter state as if `added` were on `node`.
    /// Plugins whose Filter depends on other Pods (ports, affinity, spread) implement it.
    fn add_pod(
        &self,
        _state: &mut CycleState,
        _pod: &Pod,
        _added: &PodInfo,
        _node: &NodeInfo,
    ) -> Status {
        Status::success()
    }

    /// As [`add_pod`](Self::add_pod), for a Pod removed from `node` (a preemption victim).
    fn remove_pod(
        &self,
        _state: &mut CycleState,
        _pod: &Pod,
        _removed: &PodInfo,
        _node: &NodeInfo,
    ) -> Status {
        Status::success()
    }
}

/// Whether the Pod may run on one node. Called in parallel over nodes: `&self` and `&CycleState`.
pub trait FilterPlugin: Plugin {
    fn filter(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status;
}

/// Runs when no node passed Filter (DefaultPreemption). Returns the nominated node, if any, and
/// the Pods to evict for it; the runtime performs the evictions and writes nominatedNodeName.
pub trait PostFilterPlugin: Plugin {
    fn post_filter(
        &self,
        state: &CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
        filtered: &HashMap<String, Status>,
        framework: &dyn FilterRunner,
    ) -> (Option<PostFilterResult>, Status);
}

/// The nominated node and the victims preemption chose.
#[derive(Debug, Clone, PartialEq)]
pub struct PostFilterResult {
    pub nominated_node: String,
    pub victims: Vec<Arc<Pod>>,
}

/// What PostFilter may ask of the framework: re-run the profile's PreFilter extensions and Filter
/// plugins on a node with Pods removed (preemption's simulation).
pub trait FilterRunner: Send + Sync {
    /// All Filter plugins of the profile on `node`, with `state` as PreFilter left it.
    fn run_filters(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status;
    /// The PreFilter plugins' `remove_pod` for every plugin that has one.
    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        removed: &PodInfo,
        node: &NodeInfo,
    ) -> Status;
    /// The PreFilter plugins' `add_pod` for every plugin that has one.
    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        added: &PodInfo,
        node: &NodeInfo,
    ) -> Status;
}

/// Runs once per Pod before Score, over the nodes that passed Filter.
pub trait PreScorePlugin: Plugin {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status;
}

/// Scores one node (called in parallel over the feasible nodes), then normalizes all scores of
/// this plugin to 0..=[`MAX_NODE_SCORE`] (the default normalization does nothing).
pub trait ScorePlugin: Plugin {
    fn score(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Result<i64, Status>;

    fn normalize(&self, _state: &CycleState, _pod: &Pod, _scores: &mut [NodeScore]) -> Status {
        Status::success()
    }
}

/// Reserve / Unreserve: the cache's assume, and any plugin bookkeeping around it.
pub trait ReservePlugin: Plugin {
    fn reserve(&self, state: &mut CycleState, pod: &Pod, node: &str) -> Status;
    fn unreserve(&self, state: &mut CycleState, pod: &Pod, node: &str);
}

/// Approves, denies or delays binding.
pub trait PermitPlugin: Plugin {
    fn permit(&self, state: &CycleState, pod: &Pod, node: &str) -> (Status, std::time::Duration);
}

/// A boxed future, for the asynchronous (API-calling) extension points.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Work before binding (volumes, DRA); none of the default plugins here needs it.
pub trait PreBindPlugin: Plugin {
    fn pre_bind<'a>(
        &'a self,
        state: &'a CycleState,
        pod: &'a Pod,
        node: &'a str,
    ) -> BoxFuture<'a, Status>;
}

/// Binds the Pod (DefaultBinder: a Binding through pods/binding). Skip passes to the next binder.
pub trait BindPlugin: Plugin {
    fn bind<'a>(
        &'a self,
        state: &'a CycleState,
        pod: &'a Pod,
        node: &'a str,
    ) -> BoxFuture<'a, Status>;
}

/// Informational, after a successful bind.
pub trait PostBindPlugin: Plugin {
    fn post_bind(&self, state: &CycleState, pod: &Pod, node: &str);
}
