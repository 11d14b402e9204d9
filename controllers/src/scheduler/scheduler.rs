//! The scheduler (upstream's pkg/scheduler/scheduler.go): the shared state of one scheduler
//! process (profiles, the scheduling queue, the cache, the informers' Pods, the API client and
//! one Event recorder per profile), its construction from the built profiles, and the scheduling
//! loop: a thread of its own (the cycle is CPU work) popping Pods for
//! [`schedule_one`](super::schedule_one), with the binding cycles as tasks on the Tokio runtime.
//!
//! The rest of the scheduler's runtime sits along upstream's seams:
//! [`eventhandlers`](super::eventhandlers) feeds the cache and the queue from the informers,
//! [`schedule_one`](super::schedule_one) holds the scheduling and binding cycles and the failure
//! handling, [`preemption`](super::preemption) the victims' eviction. Together they own every API
//! call of the scheduler except the Binding itself (DefaultBinder); the cycle makes no API read:
//! it reads the cache's snapshot and the informers' Pods.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::Client;

use super::cache::Cache;
use super::eventhandlers::add_all_event_handlers;
use super::framework::runtime::Framework;
use super::framework::{ClusterObjects, Snapshot};
use super::metrics;
use super::queue::{QueueCore, SchedulingQueue};
use super::schedule_one::Algorithm;
use crate::runtime::cache::Indexed;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{Informers, NAMESPACE};

/// [`ClusterObjects`] over the informers' caches.
pub struct InformerObjects {
    services: Arc<Indexed<Service>>,
    rcs: Arc<Indexed<ReplicationController>>,
    rss: Arc<Indexed<ReplicaSet>>,
    stss: Arc<Indexed<StatefulSet>>,
    pdbs: Arc<Indexed<PodDisruptionBudget>>,
    pvcs: Arc<Indexed<PersistentVolumeClaim>>,
    pvs: Arc<Indexed<PersistentVolume>>,
    classes: Arc<Indexed<StorageClass>>,
    csi_nodes: Arc<Indexed<CSINode>>,
}

impl InformerObjects {
    /// Requests the informers (they start with the others).
    pub fn new(informers: &Informers) -> InformerObjects {
        InformerObjects {
            services: informers.get::<Service>().cache(),
            rcs: informers.get::<ReplicationController>().cache(),
            rss: informers.get::<ReplicaSet>().cache(),
            stss: informers.get::<StatefulSet>().cache(),
            pdbs: informers.get::<PodDisruptionBudget>().cache(),
            pvcs: informers.get::<PersistentVolumeClaim>().cache(),
            pvs: informers.get::<PersistentVolume>().cache(),
            classes: informers.get::<StorageClass>().cache(),
            csi_nodes: informers.get::<CSINode>().cache(),
        }
    }
}

impl ClusterObjects for InformerObjects {
    fn services(&self, namespace: &str) -> Vec<Arc<Service>> {
        self.services.index(NAMESPACE, namespace)
    }
    fn replication_controllers(&self, namespace: &str) -> Vec<Arc<ReplicationController>> {
        self.rcs.index(NAMESPACE, namespace)
    }
    fn replica_sets(&self, namespace: &str) -> Vec<Arc<ReplicaSet>> {
        self.rss.index(NAMESPACE, namespace)
    }
    fn stateful_sets(&self, namespace: &str) -> Vec<Arc<StatefulSet>> {
        self.stss.index(NAMESPACE, namespace)
    }
    fn pod_disruption_budgets(&self, namespace: &str) -> Vec<Arc<PodDisruptionBudget>> {
        self.pdbs.index(NAMESPACE, namespace)
    }
    fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolumeClaim>> {
        self.pvcs.get(namespace, name)
    }
    fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.pvs.get("", name)
    }
    fn persistent_volumes(&self) -> Vec<Arc<PersistentVolume>> {
        let mut pvs = self.pvs.all();
        pvs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        pvs
    }
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get("", name)
    }
    fn csi_node(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csi_nodes.get("", name)
    }
}

pub(super) fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub(super) fn scheduler_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or(super::config::DEFAULT_SCHEDULER_NAME)
}

/// Succeeded and Failed Pods hold no resources: kube-scheduler's informer leaves them out.
pub(super) fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

pub(super) fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

pub(super) fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Shared between the informer handlers, the loop and the binding tasks.
pub struct Scheduler {
    /// The profiles by schedulerName.
    pub(super) profiles: HashMap<String, Arc<Framework>>,
    pub(super) queue: Arc<SchedulingQueue>,
    pub(super) cache: Arc<Mutex<Cache>>,
    /// The informer's Pods (the failure handling requeues the latest version).
    pub(super) pods: Arc<Indexed<Pod>>,
    pub(super) client: Client,
    /// One Event recorder per profile (the Event source is the profile's schedulerName).
    pub(super) recorders: HashMap<String, Recorder>,
    parallelism: usize,
    percentage_of_nodes_to_score: u32,
}

/// Settings besides the profiles.
#[derive(Debug, Clone)]
pub struct Settings {
    pub parallelism: usize,
    pub percentage_of_nodes_to_score: u32,
    pub backoff: super::queue::Backoff,
    /// How long an assumed Pod may wait for its binding to show (None: forever, as upstream).
    pub assumed_ttl: Option<Duration>,
}

impl Scheduler {
    /// Registers the handlers on `informers` (not started yet).
    pub fn new(
        client: Client,
        informers: &Informers,
        profiles: Vec<Arc<Framework>>,
        settings: &Settings,
    ) -> Result<Arc<Scheduler>, String> {
        let sort = profiles
            .first()
            .and_then(|p| p.queue_sort.clone())
            .ok_or("no profile with a queue sort plugin")?;
        let pre_enqueue = profiles
            .iter()
            .map(|p| (p.name.clone(), p.pre_enqueue.clone()))
            .collect();
        let queue = SchedulingQueue::new(QueueCore::new(sort, pre_enqueue, settings.backoff));
        let recorders = profiles
            .iter()
            .map(|p| {
                // Leaked once per profile for the process's life: Event sources are 'static.
                let name: &'static str = Box::leak(p.name.clone().into_boxed_str());
                (p.name.clone(), Recorder::concurrent(client.clone(), name))
            })
            .collect();
        let sched = Arc::new(Scheduler {
            profiles: profiles
                .iter()
                .map(|p| (p.name.clone(), p.clone()))
                .collect(),
            queue,
            cache: Arc::new(Mutex::new(Cache::new(settings.assumed_ttl))),
            pods: informers.get::<Pod>().cache(),
            client,
            recorders,
            parallelism: settings.parallelism,
            percentage_of_nodes_to_score: settings.percentage_of_nodes_to_score,
        });
        add_all_event_handlers(&sched, informers);
        Ok(sched)
    }

    /// The queue (metrics, tests).
    pub fn queue(&self) -> &Arc<SchedulingQueue> {
        &self.queue
    }

    pub(super) fn ours(&self, pod: &Pod) -> bool {
        self.profiles.contains_key(scheduler_name(pod))
    }

    /// Runs the scheduling loop until the returned guard is dropped or the queue closes: a
    /// thread of its own (the cycle is CPU work), bindings as tasks on `handle`.
    pub fn start(self: &Arc<Self>, handle: tokio::runtime::Handle) -> LoopGuard {
        let s = self.clone();
        let flushes = handle.spawn(self.queue.clone().run_flushes());
        let thread = std::thread::Builder::new()
            .name("scheduler".into())
            .spawn(move || s.run_loop(handle))
            .expect("spawning the scheduling thread");
        LoopGuard {
            queue: self.queue.clone(),
            thread: Some(thread),
            flushes,
        }
    }

    fn run_loop(self: Arc<Self>, handle: tokio::runtime::Handle) {
        let mut algorithm = Algorithm::new(self.parallelism, self.percentage_of_nodes_to_score);
        let mut snapshot = Snapshot::default();
        let mut last_cleanup = Instant::now();
        while let Some(info) = handle.block_on(self.queue.pop()) {
            if last_cleanup.elapsed() >= Duration::from_secs(1) {
                last_cleanup = Instant::now();
                let expired = self
                    .cache
                    .lock()
                    .expect("cache lock")
                    .cleanup_expired(last_cleanup);
                for uid in expired {
                    tracing::warn!(uid, "assumed pod expired: its binding never showed");
                }
            }
            self.schedule_one(&handle, &mut algorithm, &mut snapshot, info);
        }
    }
}

/// Stops the scheduling loop when dropped.
pub struct LoopGuard {
    queue: Arc<SchedulingQueue>,
    thread: Option<std::thread::JoinHandle<()>>,
    flushes: tokio::task::JoinHandle<()>,
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        self.queue.close();
        self.flushes.abort();
        // The thread ends after its current cycle; not joined here (a drop must not block the
        // runtime the cycle may be waiting on).
        drop(self.thread.take());
    }
}

/// Starts informers and the loop, and runs until the future is dropped.
pub async fn run(informers: Arc<Informers>, sched: Arc<Scheduler>) {
    let _refresh = metrics::watch_queue(sched.queue().clone());
    informers.start();
    informers.wait_synced().await;
    tracing::info!("scheduler caches synced; scheduling");
    let _guard = sched.start(tokio::runtime::Handle::current());
    std::future::pending::<()>().await;
}
