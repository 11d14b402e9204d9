//! The Pod garbage collector (kube-controller-manager v1.34's `podgc` controller,
//! `pod-garbage-collector-controller`): every 20 s, force-deletes the Pods nobody else will
//! finish.
//!
//! Owns: force deletion (grace period 0) of
//! - terminated Pods (Succeeded, Failed) above `--terminated-pod-gc-threshold` (12500; 0 turns
//!   this off), evicted ones first, then the oldest by creation, then by name;
//! - terminating Pods on a Node that is not Ready and carries `node.kubernetes.io/out-of-service`;
//! - Pods bound to a Node that no longer exists: a Node missing from the cache waits 40 s in
//!   quarantine (the work queue `orphaned_pods_nodes`, as upstream's delaying queue) and is then
//!   read from the API server; only a NotFound makes its Pods orphans. Each gets the condition
//!   DisruptionTarget (reason DeletionByPodGC, "PodGC: node no longer exists") before deletion;
//! - terminating Pods that were never scheduled.
//!
//! Before deleting a Pod that is not yet Succeeded or Failed, its status is patched to phase
//! Failed (with the condition, for orphans), as upstream: with no kubelet left, nothing else would
//! ever finish it. Must not touch: anything but those Pods' status and existence.
//!
//! Runs on the shared runtime's Pod and Node informers (no handlers: a pass reads the caches).
//! Metrics as upstream: `pod_gc_collector_force_delete_pods_total` and
//! `pod_gc_collector_force_delete_pod_errors_total` by namespace and reason (terminated,
//! out-of-service, orphaned, unscheduled), and the quarantine queue's workqueue metrics. No
//! Events (upstream records none).

pub mod plan;

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::error::{Error, Result};
use crate::runtime::apierrors::is_not_found;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::Informers;
use crate::runtime::pods::pod_key;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::wait_for_caches;

use plan::Reason;

/// The controller's name in logs (the name `--controllers` takes).
pub const NAME: &str = "podgc";

/// The quarantine queue's (and its metrics') name, as upstream.
pub const QUEUE_NAME: &str = "orphaned_pods_nodes";

/// How often a pass runs (upstream's `gcCheckPeriod`).
pub const GC_CHECK_PERIOD: Duration = Duration::from_secs(20);

/// How long a Node is missing from the cache before it is read from the API server (upstream's
/// `quarantineTime`).
pub const QUARANTINE: Duration = Duration::from_secs(40);

/// Force deletions at once in one pass's terminated collection (upstream starts one goroutine
/// per Pod and lets its client's rate limiter pace them; this bounds the requests in flight, the
/// client's limiter paces them the same way).
const PARALLEL_DELETES: usize = 64;

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--terminated-pod-gc-threshold` (12500; 0: terminated Pods are never collected).
    pub terminated_pod_gc_threshold: usize,
    /// Time between passes.
    pub gc_period: Duration,
    /// A missing Node's quarantine.
    pub quarantine: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            terminated_pod_gc_threshold: 12500,
            gc_period: GC_CHECK_PERIOD,
            quarantine: QUARANTINE,
        }
    }
}

/// The `namespace` and `reason` labels of the deletion counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeleteLabels {
    namespace: String,
    reason: String,
}

struct Metrics {
    deleting: Family<DeleteLabels, Counter>,
    errors: Family<DeleteLabels, Counter>,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let m = Metrics {
            deleting: Family::default(),
            errors: Family::default(),
        };
        crate::runtime::metrics::with_registry(|r| {
            r.register(
                "pod_gc_collector_force_delete_pods",
                "Number of pods that are being forcefully deleted since the Pod GC Controller started.",
                m.deleting.clone(),
            );
            r.register(
                "pod_gc_collector_force_delete_pod_errors",
                "Number of errors encountered when forcefully deleting the pods since the Pod GC Controller started.",
                m.errors.clone(),
            );
        });
        m
    })
}

fn count(family: &Family<DeleteLabels, Counter>, pod: &CachedPod, reason: Reason) {
    family
        .get_or_create(&DeleteLabels {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            reason: reason.label().to_string(),
        })
        .inc();
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    pods: Arc<Indexed<CachedPod>>,
    nodes: Arc<Indexed<Node>>,
    /// Missing Nodes in quarantine, handed out when it is over.
    node_queue: Arc<WorkQueue<String>>,
    /// The Nodes added to `node_queue` and not yet handed out: a Node is added once, as to
    /// upstream's delaying queue, where a waiting item keeps its time.
    waiting: Mutex<HashSet<String>>,
}

impl Controller {
    /// Takes the Pod and Node caches of the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let _ = metrics();
        Arc::new(Controller {
            client,
            config,
            pods: informers.get::<CachedPod>().cache(),
            nodes: informers.get::<Node>().cache(),
            node_queue: WorkQueue::new(QUEUE_NAME),
            waiting: Mutex::new(HashSet::new()),
        })
    }

    /// Waits for the caches, then runs a pass every `gc_period` (counted from the end of the
    /// previous one, as upstream's `wait.Until`).
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(NAME, &[&*self.pods, &*self.nodes]).await;
        tracing::info!(
            controller = NAME,
            threshold = self.config.terminated_pod_gc_threshold,
            "controller started"
        );
        loop {
            self.gc().await;
            tokio::time::sleep(self.config.gc_period).await;
        }
    }

    /// Stops handing out quarantined Nodes.
    pub fn shut_down(&self) {
        self.node_queue.shut_down();
    }

    /// One pass (upstream's `gc`): terminated, terminating out of service, orphaned, unscheduled
    /// terminating, in this order, each over the same snapshot of the caches.
    pub async fn gc(&self) {
        let pods = self.pods.all();
        if self.config.terminated_pod_gc_threshold > 0 {
            let victims =
                plan::terminated_to_delete(&pods, self.config.terminated_pod_gc_threshold);
            if !victims.is_empty() {
                tracing::info!(pods = victims.len(), "garbage collecting terminated pods");
            }
            self.delete_all(victims, Reason::Terminated).await;
        }
        let out_of_service =
            plan::terminating_out_of_service(&pods, |name| self.nodes.get("", name));
        self.delete_all(out_of_service, Reason::OutOfService).await;
        self.gc_orphaned(&pods).await;
        for pod in plan::unscheduled_terminating(&pods) {
            tracing::info!(pod = %pod_key(&pod), "deleting unscheduled terminating pod");
            self.delete(&pod, None, Reason::Unscheduled).await;
        }
    }

    async fn delete_all(&self, victims: Vec<Arc<CachedPod>>, reason: Reason) {
        futures::stream::iter(victims)
            .for_each_concurrent(PARALLEL_DELETES, |pod| async move {
                self.delete(&pod, None, reason).await;
            })
            .await;
    }

    /// Quarantines the Nodes Pods are bound to that the cache lacks, reads the ones whose
    /// quarantine is over and deletes the Pods of those the API server does not have.
    async fn gc_orphaned(&self, pods: &[Arc<CachedPod>]) {
        let missing = plan::missing_nodes(pods, |n| self.nodes.get("", n).is_some());
        for node in missing {
            if self.waiting().insert(node.clone()) {
                self.node_queue.add_after(node, self.config.quarantine);
            }
        }
        let mut deleted = BTreeSet::new();
        while !self.node_queue.is_empty() {
            let Some(node) = self.node_queue.get().await else {
                return;
            };
            self.waiting().remove(&node);
            if self.nodes.get("", &node).is_none() {
                match self.node_exists(&node).await {
                    Ok(true) => {}
                    Ok(false) => {
                        deleted.insert(node.clone());
                    }
                    // Checked again after another quarantine if Pods still name it.
                    Err(e) => tracing::error!(node, "error while getting node: {e}"),
                }
            }
            self.node_queue.done(&node);
        }
        for pod in plan::orphaned(pods, &deleted) {
            tracing::info!(pod = %pod_key(&pod), "deleting orphaned pod: its node no longer exists");
            self.delete(&pod, Some(&plan::NODE_GONE), Reason::Orphaned)
                .await;
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.waiting.lock().expect("podgc waiting lock")
    }

    async fn node_exists(&self, name: &str) -> Result<bool> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        match nodes.get(name).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(Error::kube("reading", format!("Node {name}"), e)),
        }
    }

    /// Marks `pod` Failed (with `condition`) unless it is terminal, then force-deletes it; counts
    /// the deletion and its failure under `reason`.
    async fn delete(&self, pod: &CachedPod, condition: Option<&plan::Condition>, reason: Reason) {
        count(&metrics().deleting, pod, reason);
        if let Err(e) = self.mark_failed_and_delete(pod, condition).await {
            count(&metrics().errors, pod, reason);
            tracing::warn!(pod = %pod_key(pod), "{e}");
        }
    }

    async fn mark_failed_and_delete(
        &self,
        pod: &CachedPod,
        condition: Option<&plan::Condition>,
    ) -> Result<()> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let object = || format!("Pod {ns}/{name}");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        tracing::info!(pod = %pod_key(pod), "PodGC is force deleting Pod");
        if let Some(patch) = plan::failed_status_patch(pod, condition, Timestamp::now()) {
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .map_err(|e| Error::kube("marking Failed", object(), e))?;
        }
        api.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .map_err(|e| Error::kube("force deleting", object(), e))?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
