//! The node lifecycle controller (kube-controller-manager v1.34's `node-lifecycle-controller`,
//! `pkg/controller/nodelifecycle`), without the taint eviction it used to carry (that is the
//! `taint-eviction-controller`'s, `node/tainteviction`, as in v1.34).
//!
//! Owns, on Nodes: the Ready, MemoryPressure, DiskPressure and PIDPressure conditions once the
//! kubelet went quiet (set to Unknown when neither the Ready condition's heartbeat nor the Lease
//! in kube-node-lease moved for `--node-monitor-grace-period`, or `--node-startup-grace-period`
//! for a Node that never reported); the NoSchedule taints derived from conditions
//! (not-ready, unreachable, memory-pressure, disk-pressure, pid-pressure, network-unavailable)
//! and `spec.unschedulable`; the NoExecute not-ready and unreachable taints, added through one
//! rate-limited queue per zone (`--node-eviction-rate`, `--secondary-node-eviction-rate` when a
//! zone is partly disrupted and larger than `--large-cluster-size-threshold`, none when every zone
//! is fully disrupted: then every Node's NoExecute taints are lifted, as upstream does) and
//! removed when the Node is Ready again; the beta OS and arch labels. On Pods: Ready turned False
//! for the Pods of a Node that stopped being Ready (`MarkPodsNotReady`, with a `NodeNotReady`
//! Warning Event on the Pod). Events on Nodes (source `node-controller`): `RegisteredNode`,
//! `RemovingNode`, `NodeNotReady`.
//!
//! As upstream: a health pass over every Node each `--node-monitor-period` (eight at a time), the
//! NoExecute pass every 100 ms, the NoSchedule-and-labels work queue `node_lifecycle_controller`
//! (eight workers) fed by every Node change, the Pod queue `node_lifecycle_controller_pods` (four
//! workers) fed by Pods bound to a Node. Decisions are [`plan`]'s. Metrics: upstream's
//! `node_collector_*` (zone health, size, unhealthy Nodes, evictions, health pass durations).

pub mod plan;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use serde_json::json;

use crate::error::{Error, Result};
use crate::helpers::taints::{node_taints, TAINT_EFFECT_NO_EXECUTE};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::{node_index, CachedPod, NODE_INDEX};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{Informers, WatchHealth};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_workers_of, wait_for_caches};

use plan::{Eviction, Grace, Health, Rates, TaintQueue, Zones};

/// The controller's name in logs.
pub const NAME: &str = "node-lifecycle-controller";

/// Its Events' source, as upstream.
pub const EVENT_SOURCE: &str = "node-controller";

/// The Node queue's and the Pod queue's names, as upstream.
pub const NODE_QUEUE: &str = "node_lifecycle_controller";
pub const POD_QUEUE: &str = "node_lifecycle_controller_pods";

/// The namespace of the kubelets' Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Workers (upstream's `nodeUpdateWorkerSize` and `podUpdateWorkerSize`; no flag sets them).
pub const NODE_WORKERS: usize = 8;
pub const POD_WORKERS: usize = 4;

/// How often the rate-limited NoExecute pass runs (`NodeEvictionPeriod`).
pub const EVICTION_PERIOD: Duration = Duration::from_millis(100);

/// Tries of a Node's health write, 20 ms apart (`NodeHealthUpdateRetry`, `retrySleepTime`).
const HEALTH_TRIES: usize = 5;

/// The controller's settings (kube-controller-manager's flags and defaults).
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// `--node-monitor-period` (5 s).
    pub node_monitor_period: Duration,
    /// `--node-startup-grace-period` (60 s).
    pub node_startup_grace_period: Duration,
    /// `--node-monitor-grace-period` (50 s).
    pub node_monitor_grace_period: Duration,
    /// `--node-eviction-rate` (0.1), `--secondary-node-eviction-rate` (0.01),
    /// `--large-cluster-size-threshold` (50), `--unhealthy-zone-threshold` (0.55).
    pub rates: Rates,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_monitor_period: Duration::from_secs(5),
            node_startup_grace_period: Duration::from_secs(60),
            node_monitor_grace_period: Duration::from_secs(50),
            rates: Rates {
                eviction: 0.1,
                secondary_eviction: 0.01,
                large_cluster_threshold: 50,
                unhealthy_zone_threshold: 0.55,
            },
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZoneLabel {
    zone: String,
}

struct Metrics {
    zone_health: Family<ZoneLabel, Gauge<f64, AtomicU64>>,
    zone_size: Family<ZoneLabel, Gauge<f64, AtomicU64>>,
    unhealthy: Family<ZoneLabel, Gauge<f64, AtomicU64>>,
    evictions: Family<ZoneLabel, Counter>,
    node_health: Histogram,
    all_nodes_health: Histogram,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let m = Metrics {
            zone_health: Family::default(),
            zone_size: Family::default(),
            unhealthy: Family::default(),
            evictions: Family::default(),
            node_health: Histogram::new(exponential_buckets(0.001, 4.0, 8)),
            all_nodes_health: Histogram::new(exponential_buckets(0.01, 4.0, 8)),
        };
        crate::runtime::metrics::with_registry(|r| {
            r.register(
                "node_collector_zone_health",
                "Gauge measuring percentage of healthy nodes per zone.",
                m.zone_health.clone(),
            );
            r.register(
                "node_collector_zone_size",
                "Gauge measuring number of registered Nodes per zones.",
                m.zone_size.clone(),
            );
            r.register(
                "node_collector_unhealthy_nodes_in_zone",
                "Gauge measuring number of not Ready Nodes per zones.",
                m.unhealthy.clone(),
            );
            r.register(
                "node_collector_evictions",
                "Number of Node evictions that happened since current instance of NodeController started.",
                m.evictions.clone(),
            );
            r.register(
                "node_collector_update_node_health_duration_seconds",
                "Duration in seconds for NodeController to update the health of a single node.",
                m.node_health.clone(),
            );
            r.register(
                "node_collector_update_all_nodes_health_duration_seconds",
                "Duration in seconds for NodeController to update the health of all nodes.",
                m.all_nodes_health.clone(),
            );
        });
        m
    })
}

fn zone_label(zone: &str) -> ZoneLabel {
    ZoneLabel {
        zone: zone.to_string(),
    }
}

fn pod_ready(p: &CachedPod) -> Option<&str> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str())
}

/// A Pod to look at (`podUpdateItem`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodItem {
    pub namespace: String,
    pub name: String,
}

/// The health pass's state, held across passes (only the pass writes it).
#[derive(Default)]
struct Pass {
    /// `knownNodeSet`: name to uid.
    known: HashMap<String, String>,
    zones: Zones,
    /// Nodes whose Pods' marking failed (`nodesToRetry`).
    retry: HashSet<String>,
}

/// The running controller.
pub struct Controller {
    client: Client,
    recorder: Recorder,
    config: Config,
    nodes: Arc<Indexed<Node>>,
    pods: Arc<Indexed<CachedPod>>,
    leases: Arc<Indexed<Lease>>,
    /// The Lease informer's watch: no node is judged while it fails (see
    /// [`plan::probe_after_blindness`]).
    lease_watch: Arc<WatchHealth>,
    node_queue: Arc<WorkQueue<String>>,
    pod_queue: Arc<WorkQueue<PodItem>>,
    /// `nodeHealthMap`.
    health: Mutex<HashMap<String, Health>>,
    /// `zoneNoExecuteTainter`, by zone key.
    tainters: Mutex<BTreeMap<String, TaintQueue>>,
    pass: tokio::sync::Mutex<Pass>,
}

impl Controller {
    /// Registers the controller's handlers on the shared Node, Pod and Lease informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let node_informer = informers.get::<Node>();
        let pod_informer = informers.get::<CachedPod>();
        pod_informer.add_index(NODE_INDEX, node_index);
        let lease_informer = informers.get::<Lease>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), EVENT_SOURCE),
            client,
            config,
            nodes: node_informer.cache(),
            pods: pod_informer.cache(),
            leases: lease_informer.cache(),
            lease_watch: lease_informer.watch_health(),
            node_queue: WorkQueue::new(NODE_QUEUE),
            pod_queue: WorkQueue::new(POD_QUEUE),
            health: Mutex::default(),
            tainters: Mutex::default(),
            pass: Default::default(),
        });
        node_informer.on_change_of(&this, |c, _old, new| {
            if let Some(name) = new.and_then(|n| n.metadata.name.clone()) {
                c.node_queue.add(name);
            }
        });
        pod_informer.on_change_of(&this, |c, old, new| {
            // `podUpdated`: a Pod bound to a Node, or moved to another.
            let Some(new) = new else { return };
            let Some(node) = new.node_name() else { return };
            if old.is_some_and(|o| o.node_name() == Some(node)) {
                return;
            }
            c.pod_queue.add(PodItem {
                namespace: new.metadata.namespace.clone().unwrap_or_default(),
                name: new.metadata.name.clone().unwrap_or_default(),
            });
        });
        this
    }

    /// Waits for the caches, then runs the passes and the workers.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(NAME, &[&*self.nodes, &*self.pods, &*self.leases]).await;
        tracing::info!(controller = NAME, "controller started");
        let nodes = run_workers_of(
            &self,
            &self.node_queue,
            NODE_WORKERS,
            |c, name| async move { c.no_schedule_pass(&name).await },
        );
        let pods = run_workers_of(&self, &self.pod_queue, POD_WORKERS, |c, item| async move {
            c.process_pod(&item).await
        });
        let this = self.clone();
        let no_execute = async move {
            let mut tick = tokio::time::interval(EVICTION_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                this.no_execute_pass().await;
            }
        };
        let this = self.clone();
        let monitor = async move {
            let mut tick = tokio::time::interval(this.config.node_monitor_period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                this.monitor_node_health().await;
            }
        };
        futures::join!(nodes, pods, no_execute, monitor);
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.node_queue.shut_down();
        self.pod_queue.shut_down();
    }

    fn node_event(
        &self,
        name: &str,
        uid: Option<String>,
        warning: bool,
        reason: &str,
        message: String,
    ) {
        self.recorder.publish(
            &ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.into()),
                uid,
                ..Default::default()
            },
            warning,
            reason,
            message,
        );
    }

    /// `doNoScheduleTaintingPass` and `reconcileNodeLabels` for one Node.
    async fn no_schedule_pass(&self, name: &str) -> Result<()> {
        let Some(node) = self.nodes.get("", name) else {
            return Ok(());
        };
        let (add, remove) = plan::no_schedule_taints(&node);
        if !add.is_empty() || !remove.is_empty() {
            if let Err(e) = self.swap_taints(&node, add, &remove).await {
                tracing::error!(
                    controller = NAME,
                    node = name,
                    "failed to taint NoSchedule on node: {e}"
                );
            }
        }
        let labels = plan::labels_to_reconcile(&node);
        if !labels.is_empty() {
            let api: Api<Node> = Api::all(self.client.clone());
            let patch = json!({"metadata": {"labels": labels}});
            if let Err(e) = api
                .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                tracing::error!(
                    controller = NAME,
                    node = name,
                    "failed to reconcile labels: {e}"
                );
            }
        }
        // Upstream does not retry either (its TODO): the next Node change brings it back.
        Ok(())
    }

    /// `SwapNodeControllerTaint`: `add` (stamped now) and `remove` on the Node read afresh,
    /// written with its resourceVersion as precondition, again on conflict. Skips the call when
    /// the cached Node has none of `remove` and nothing to add.
    async fn swap_taints(
        &self,
        node: &Node,
        mut add: Vec<Taint>,
        remove: &[Taint],
    ) -> Result<bool> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let cached = node_taints(node);
        if add.is_empty()
            && !remove.iter().any(|r| {
                cached
                    .iter()
                    .any(|t| t.key == r.key && t.effect == r.effect)
            })
        {
            return Ok(false);
        }
        let now = Time(Timestamp::now());
        for t in &mut add {
            t.time_added = Some(now.clone());
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let object = || format!("Node {name}");
        for _ in 0..5 {
            let Some(fresh) = api
                .get_opt(&name)
                .await
                .map_err(|e| Error::kube("reading", object(), e))?
            else {
                return Ok(false);
            };
            let Some(taints) = plan::swapped_taints(node_taints(&fresh), &add, remove) else {
                return Ok(false);
            };
            let patch = json!({
                "metadata": {"resourceVersion": fresh.metadata.resource_version},
                "spec": {"taints": taints},
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if apierrors::is_conflict(&e) => continue,
                Err(e) => return Err(Error::kube("tainting", object(), e)),
            }
        }
        Err(Error::Invalid {
            object: object(),
            reason: "spec.taints: conflicting writes, gave up after 5 tries".into(),
        })
    }

    /// The Node's Lease renew time, when it has a Lease.
    fn lease_of(&self, name: &str) -> Option<Option<Timestamp>> {
        self.leases.get(NODE_LEASE_NAMESPACE, name).map(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0)
        })
    }

    fn zone_tainter<T>(&self, zone: &str, f: impl FnOnce(&mut TaintQueue) -> T) -> Option<T> {
        self.tainters
            .lock()
            .expect("tainters lock")
            .get_mut(zone)
            .map(f)
    }

    /// `addPodEvictorForNewZone`.
    fn add_zone(&self, pass: &mut Pass, zone: &str) {
        if pass.zones.states.contains_key(zone) {
            return;
        }
        pass.zones
            .states
            .insert(zone.to_string(), plan::ZoneState::Initial);
        self.tainters
            .lock()
            .expect("tainters lock")
            .entry(zone.to_string())
            .or_insert_with(|| TaintQueue::new(self.config.rates.eviction, Instant::now()));
        // Upstream initialises the zone's counter at 0.
        let _ = metrics().evictions.get_or_create(&zone_label(zone));
    }

    /// `markNodeAsReachable`: both NoExecute taints off, the Node forgotten by its zone's queue.
    async fn mark_reachable(&self, node: &Node) -> Result<bool> {
        let remove = [
            plan::taint(plan::TAINT_UNREACHABLE, TAINT_EFFECT_NO_EXECUTE),
            plan::taint(plan::TAINT_NOT_READY, TAINT_EFFECT_NO_EXECUTE),
        ];
        self.swap_taints(node, Vec::new(), &remove).await?;
        let name = node.metadata.name.as_deref().unwrap_or_default();
        Ok(self
            .zone_tainter(&plan::zone_key(node), |q| q.remove(name))
            .unwrap_or(false))
    }

    /// `monitorNodeHealth`: one pass over every Node.
    async fn monitor_node_health(self: &Arc<Self>) {
        let started = Instant::now();
        let mut pass = self.pass.lock().await;
        let mut nodes = self.nodes.all();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        // classifyNodes.
        let mut added = Vec::new();
        for n in &nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            if !pass.known.contains_key(&name) {
                added.push(n.clone());
            } else {
                let zone = plan::zone_key(n);
                self.add_zone(&mut pass, &zone);
            }
        }
        let present: HashSet<&str> = nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        let deleted: Vec<(String, String)> = pass
            .known
            .iter()
            .filter(|(k, _)| !present.contains(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for n in &added {
            let name = n.metadata.name.clone().unwrap_or_default();
            self.node_event(
                &name,
                n.metadata.uid.clone(),
                false,
                "RegisteredNode",
                format!("Node {name} event: Registered Node {name} in Controller"),
            );
            pass.known
                .insert(name.clone(), n.metadata.uid.clone().unwrap_or_default());
            self.add_zone(&mut pass, &plan::zone_key(n));
            if let Err(e) = self.mark_reachable(n).await {
                tracing::error!(controller = NAME, node = %name, "failed to remove taints: {e}");
            }
        }
        for (name, uid) in deleted {
            self.node_event(
                &name,
                Some(uid),
                false,
                "RemovingNode",
                format!("Node {name} event: Removing Node {name} from Controller"),
            );
            pass.known.remove(&name);
            self.health.lock().expect("health lock").remove(&name);
        }
        let retry = pass.retry.clone();
        let results: Vec<(String, Option<Option<String>>, bool)> =
            futures::stream::iter(nodes.clone())
                .map(|n| {
                    let this = self.clone();
                    let needs_retry =
                        retry.contains(n.metadata.name.as_deref().unwrap_or_default());
                    async move { this.update_node(n, needs_retry).await }
                })
                .buffer_unordered(NODE_WORKERS)
                .collect()
                .await;
        let mut by_zone: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
        let by_name: HashMap<&str, &Arc<Node>> = nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref().map(|k| (k, n)))
            .collect();
        for (name, ready, failed) in results {
            if failed {
                pass.retry.insert(name.clone());
            } else {
                pass.retry.remove(&name);
            }
            let (Some(ready), Some(node)) = (ready, by_name.get(name.as_str())) else {
                continue;
            };
            if !plan::excluded_from_disruption(node) {
                by_zone.entry(plan::zone_key(node)).or_default().push(ready);
            }
        }
        self.handle_disruption(&mut pass, &by_zone, &nodes).await;
        metrics()
            .all_nodes_health
            .observe(started.elapsed().as_secs_f64());
    }

    /// One Node of the health pass: its health checked (and written), its NoExecute taint
    /// decided, its Pods marked not Ready when it stopped being Ready. Returns the Node's name,
    /// its Ready status for the zone count (`None`: the health update failed and it is left out;
    /// `Some(None)`: no Ready condition) and whether its Pods' marking must be retried.
    async fn update_node(
        &self,
        node: Arc<Node>,
        needs_retry: bool,
    ) -> (String, Option<Option<String>>, bool) {
        let started = Instant::now();
        let name = node.metadata.name.clone().unwrap_or_default();
        // Blind (the Lease watch failing: the API server unreachable): judged when it reads again.
        if !self.lease_watch.healthy() {
            return (name, None, needs_retry);
        }
        let grace = Grace {
            startup: self.config.node_startup_grace_period,
            monitor: self.config.node_monitor_grace_period,
        };
        let mut current_node = (*node).clone();
        let mut outcome = None;
        for attempt in 0..HEALTH_TRIES {
            let now = Timestamp::now();
            let lease = self.lease_of(&name);
            let saved = plan::probe_after_blindness(
                self.health.lock().expect("health lock").get(&name),
                self.lease_watch.recovered_at(),
            );
            let check = plan::check_health(saved.as_ref(), &current_node, lease, now, grace);
            self.health
                .lock()
                .expect("health lock")
                .insert(name.clone(), check.health.clone());
            let Some(conditions) = check.write.clone() else {
                outcome = Some(check);
                break;
            };
            let mut updated = current_node.clone();
            updated
                .status
                .get_or_insert_with(Default::default)
                .conditions = Some(conditions);
            let api: Api<Node> = Api::all(self.client.clone());
            match api
                .replace_status(&name, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => {
                    let mut h = check.health.clone();
                    h.ready_transition = now;
                    h.lease = lease;
                    self.health
                        .lock()
                        .expect("health lock")
                        .insert(name.clone(), h);
                    outcome = Some(check);
                    break;
                }
                Err(e) => {
                    tracing::error!(controller = NAME, node = %name, "error updating node: {e}");
                    if attempt + 1 == HEALTH_TRIES {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    match api.get_opt(&name).await {
                        Ok(Some(n)) => current_node = n,
                        _ => break,
                    }
                }
            }
        }
        metrics()
            .node_health
            .observe(started.elapsed().as_secs_f64());
        let Some(check) = outcome else {
            tracing::error!(controller = NAME, node = %name, "update health of Node from Controller error, skipping - no pods will be evicted");
            return (name, None, needs_retry);
        };
        let Some(current) = check.current_ready.clone() else {
            return (name, Some(None), false);
        };
        self.taint_base_eviction(&current_node, &current.status)
            .await;
        let became_not_ready = current.status != "True" && check.observed_ready.status == "True";
        if became_not_ready {
            self.node_event(
                &name,
                current_node.metadata.uid.clone(),
                false,
                "NodeNotReady",
                format!("Node {name} status is now: NodeNotReady"),
            );
        }
        let mut failed = false;
        if became_not_ready || (needs_retry && check.observed_ready.status != "True") {
            failed = self.mark_pods_not_ready(&name).await.is_err();
        }
        (name, Some(Some(current.status)), failed)
    }

    /// `processTaintBaseEviction`.
    async fn taint_base_eviction(&self, node: &Node, ready: &str) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        match plan::eviction(node, ready) {
            Eviction::SwapNow { add, remove } => {
                let result = self
                    .swap_taints(
                        node,
                        vec![plan::taint(add, TAINT_EFFECT_NO_EXECUTE)],
                        &[plan::taint(remove, TAINT_EFFECT_NO_EXECUTE)],
                    )
                    .await;
                if let Err(e) = result {
                    tracing::error!(
                        controller = NAME,
                        node = name,
                        "failed to instantly swap {remove} to {add}: {e}"
                    );
                }
            }
            Eviction::Queue { forget_first } => {
                let zone = plan::zone_key(node);
                let added = self.zone_tainter(&zone, |q| {
                    if forget_first {
                        q.remove(name);
                    }
                    q.add(name, Instant::now())
                });
                if added == Some(true) {
                    tracing::debug!(
                        controller = NAME,
                        node = name,
                        "adding node to the taint queue"
                    );
                }
            }
            Eviction::Reachable => {
                if let Err(e) = self.mark_reachable(node).await {
                    tracing::error!(
                        controller = NAME,
                        node = name,
                        "failed to remove taints from node: {e}"
                    );
                }
            }
        }
    }

    /// `MarkPodsNotReady` over the Node's Pods.
    async fn mark_pods_not_ready(&self, node: &str) -> Result<()> {
        let mut last = Ok(());
        for pod in self.pods.index(NODE_INDEX, node) {
            if let Err(e) = self.mark_pod_not_ready(&pod).await {
                tracing::info!(controller = NAME, "failed to update status for pod: {e}");
                last = Err(e);
            }
        }
        last
    }

    async fn mark_pod_not_ready(&self, pod: &CachedPod) -> Result<()> {
        let Some(patch) = plan::pod_not_ready_patch(
            pod.metadata.uid.as_deref(),
            pod_ready(pod),
            Timestamp::now(),
        ) else {
            return Ok(());
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {}
            Err(e) if apierrors::is_not_found(&e) => return Ok(()),
            Err(e) => {
                return Err(Error::kube(
                    "patching the status of",
                    format!("Pod {ns}/{name}"),
                    e,
                ))
            }
        }
        self.recorder.publish(
            &ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(ns),
                name: Some(name),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            },
            true,
            "NodeNotReady",
            "Node is not ready".into(),
        );
        Ok(())
    }

    /// `processPod`: a Pod bound to a Node known not Ready is marked not Ready.
    async fn process_pod(&self, item: &PodItem) -> Result<()> {
        let Some(pod) = self.pods.get(&item.namespace, &item.name) else {
            return Ok(());
        };
        let node = pod.node_name().unwrap_or_default();
        let ready = {
            let health = self.health.lock().expect("health lock");
            let Some(h) = health.get(node) else {
                return Ok(()); // Not looked at yet, or gone.
            };
            h.ready.as_ref().map(|c| c.status.clone())
        };
        if self.nodes.get("", node).is_none() {
            return Err(Error::Invalid {
                object: format!("Pod {}/{}", item.namespace, item.name),
                reason: format!("spec.nodeName {node}: the Node is not in the cache yet"),
            });
        }
        match ready {
            Some(s) if s != "True" => self.mark_pod_not_ready(&pod).await,
            _ => Ok(()),
        }
    }

    /// `handleDisruption` applied: rates set, metrics written, and on entering full disruption
    /// every Node's NoExecute taints lifted; on leaving it, every Node's probe time reset.
    async fn handle_disruption(
        &self,
        pass: &mut Pass,
        by_zone: &BTreeMap<String, Vec<Option<String>>>,
        nodes: &[Arc<Node>],
    ) {
        for (zone, ready) in by_zone {
            let (unhealthy, _) = self.config.rates.zone_state(ready);
            let l = zone_label(zone);
            metrics()
                .zone_size
                .get_or_create(&l)
                .set(ready.len() as f64);
            metrics()
                .zone_health
                .get_or_create(&l)
                .set(100.0 * (ready.len() - unhealthy) as f64 / ready.len() as f64);
            metrics().unhealthy.get_or_create(&l).set(unhealthy as f64);
        }
        for zone in pass.zones.states.keys() {
            if !by_zone.contains_key(zone) {
                let l = zone_label(zone);
                metrics().zone_size.get_or_create(&l).set(0.0);
                metrics().zone_health.get_or_create(&l).set(100.0);
                metrics().unhealthy.get_or_create(&l).set(0.0);
            }
        }
        let decision = pass.zones.handle(by_zone, &self.config.rates);
        if decision.entered_full {
            tracing::info!(
                controller = NAME,
                "controller detected that all Nodes are not-Ready. Entering master disruption mode"
            );
            for n in nodes {
                if let Err(e) = self.mark_reachable(n).await {
                    tracing::error!(controller = NAME, "failed to remove taints from Node: {e}");
                }
            }
        }
        if decision.left_full {
            tracing::info!(
                controller = NAME,
                "controller detected that some Nodes are Ready. Exiting master disruption mode"
            );
            let now = Timestamp::now();
            let mut health = self.health.lock().expect("health lock");
            for n in nodes {
                if let Some(h) = n.metadata.name.as_ref().and_then(|k| health.get_mut(k)) {
                    h.probe = now;
                    h.ready_transition = now;
                }
            }
        }
        let now = Instant::now();
        for (zone, qps) in decision.rates {
            self.zone_tainter(&zone, |q| q.set_rate(qps, now));
        }
    }

    /// `doNoExecuteTaintingPass`: each zone's due Nodes, as many as its rate lets through, get
    /// the NoExecute taint of their Ready status (the other one removed).
    async fn no_execute_pass(&self) {
        let now = Instant::now();
        let due: Vec<(String, Vec<String>)> = self
            .tainters
            .lock()
            .expect("tainters lock")
            .iter_mut()
            .map(|(zone, q)| (zone.clone(), q.take_due(now)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        for (zone, names) in due {
            for name in names {
                let Some(node) = self.nodes.get("", &name) else {
                    continue; // Gone: done with it.
                };
                let Some(ready) = plan::condition(&node, "Ready").map(|c| c.status.clone()) else {
                    self.zone_tainter(&zone, |q| {
                        q.retry(&name, Instant::now() + Duration::from_millis(50))
                    });
                    continue;
                };
                let Some((add, remove)) = plan::no_execute_swap(&ready) else {
                    continue; // Ready again: nothing to taint.
                };
                let result = self
                    .swap_taints(
                        &node,
                        vec![plan::taint(add, TAINT_EFFECT_NO_EXECUTE)],
                        &[plan::taint(remove, TAINT_EFFECT_NO_EXECUTE)],
                    )
                    .await;
                match result {
                    Ok(_) => metrics()
                        .evictions
                        .get_or_create(&zone_label(&plan::zone_key(&node)))
                        .inc(),
                    Err(e) => {
                        tracing::error!(controller = NAME, node = %name, "unable to taint unresponsive node: {e}");
                        self.zone_tainter(&zone, |q| q.retry(&name, Instant::now()));
                        0
                    }
                };
            }
        }
    }
}
