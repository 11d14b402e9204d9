//! The scheduler's runtime: informers feeding the cache and the queue, the scheduling loop
//! (upstream's scheduleOne) on a thread of its own, the asynchronous binding cycle, and the API
//! writes around them: the FailedScheduling / Scheduled / Preempted Events, the
//! PodScheduled=False condition with the FitError, `status.nominatedNodeName`, and preemption's
//! victims (DisruptionTarget condition, then deletion).
//!
//! Owns every API call of the scheduler except the Binding itself (DefaultBinder). The cycle makes
//! no API read: it reads the cache's snapshot and the informers' Pods.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ReplicationController, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource as _};
use serde_json::json;

use super::cache::Cache;
use super::framework::types::pod_requests;
use super::framework::{ClusterObjects, Code, CycleState, QueuedPodInfo, Snapshot, Status};
use super::framework_runner::{Algorithm, Framework, Nominations, ScheduleError};
use super::metrics;
use super::queue::{ClusterEvent, QueueCore, SchedulingQueue};
use crate::cache::Indexed;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{Informers, NAMESPACE};

/// PodScheduled condition reasons.
pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";
pub const REASON_SCHEDULER_ERROR: &str = "SchedulerError";

/// [`ClusterObjects`] over the informers' caches.
pub struct InformerObjects {
    services: Arc<Indexed<Service>>,
    rcs: Arc<Indexed<ReplicationController>>,
    rss: Arc<Indexed<ReplicaSet>>,
    stss: Arc<Indexed<StatefulSet>>,
    pdbs: Arc<Indexed<PodDisruptionBudget>>,
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
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn scheduler_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or(super::config::DEFAULT_SCHEDULER_NAME)
}

/// Succeeded and Failed Pods hold no resources: kube-scheduler's informer leaves them out.
fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether a node update can change a scheduling decision (labels, spec: taints and
/// unschedulable, allocatable, images); heartbeats and condition timestamps cannot.
fn node_changed(old: &Node, new: &Node) -> bool {
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || old.status.as_ref().map(|s| (&s.allocatable, &s.images))
            != new.status.as_ref().map(|s| (&s.allocatable, &s.images))
}

/// What an update of an assigned Pod changed, as the queue's events (upstream's
/// `PodSchedulingPropertiesChange` for an assigned Pod): its labels, a lowered or removed
/// resource request, and otherwise "other" (status, deletionTimestamp, ...).
fn assigned_pod_update_events(old: &Pod, new: &Pod) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    // Semantic equality: no labels and an empty map are the same.
    let labels = |p: &Pod| p.metadata.labels.clone().unwrap_or_default();
    if labels(old) != labels(new) {
        events.push(ClusterEvent::AssignedPodLabelUpdate);
    }
    if scaled_down(old, new) {
        events.push(ClusterEvent::AssignedPodScaleDown);
    }
    if events.is_empty() {
        events.push(ClusterEvent::AssignedPodOtherUpdate);
    }
    events
}

/// Upstream's extractPodScaleDown: some resource the old Pod requested is requested less, or no
/// more, by the new one.
fn scaled_down(old: &Pod, new: &Pod) -> bool {
    let (o, n) = (pod_requests(old, false), pod_requests(new, false));
    o.milli_cpu > n.milli_cpu
        || o.memory > n.memory
        || o.ephemeral_storage > n.ephemeral_storage
        || o.scalar
            .iter()
            .any(|(k, v)| n.scalar.get(k).is_none_or(|nv| nv < v))
}

/// A Pod the watch shows assigned: the cache takes this version, whatever changed (upstream's
/// addPodToCache / updatePodInCache: a bound Pod's startTime, phase, conditions and
/// deletionTimestamp matter to preemption's choices and to topology spread), and the events for
/// the queue are returned. `old` is the previous version when it was assigned too; a
/// re-delivery of the same version (a resync) changes nothing.
fn take_assigned_pod(cache: &mut Cache, old: Option<&Pod>, new: &Arc<Pod>) -> Vec<ClusterEvent> {
    let Some(old) = old else {
        cache.add_pod(new.clone());
        return vec![ClusterEvent::AssignedPodAdd];
    };
    let same_version = old.metadata.resource_version.is_some()
        && old.metadata.resource_version == new.metadata.resource_version;
    if same_version && cache.contains_pod(uid(new)) {
        return Vec::new();
    }
    cache.update_pod(new.clone());
    assigned_pod_update_events(old, new)
}

/// Shared between the informer handlers, the loop and the binding tasks.
pub struct Scheduler {
    profiles: HashMap<String, Arc<Framework>>,
    queue: Arc<SchedulingQueue>,
    cache: Arc<Mutex<Cache>>,
    pods: Arc<Indexed<Pod>>,
    client: Client,
    recorders: HashMap<String, Recorder>,
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
        let pods = informers.get::<Pod>();
        let sched = Arc::new(Scheduler {
            profiles: profiles
                .iter()
                .map(|p| (p.name.clone(), p.clone()))
                .collect(),
            queue,
            cache: Arc::new(Mutex::new(Cache::new(settings.assumed_ttl))),
            pods: pods.cache(),
            client,
            recorders,
            parallelism: settings.parallelism,
            percentage_of_nodes_to_score: settings.percentage_of_nodes_to_score,
        });
        let s = sched.clone();
        pods.on_change(Box::new(move |old, new| s.on_pod(old, new)));
        let s = sched.clone();
        informers
            .get::<Node>()
            .on_change(Box::new(move |old, new| s.on_node(old, new)));
        let s = sched.clone();
        informers
            .get::<Namespace>()
            .on_change(Box::new(move |old, new| {
                let ns = new.or(old).expect("a change has an object");
                let name = ns.metadata.name.clone().unwrap_or_default();
                s.cache.lock().expect("cache lock").set_namespace(
                    &name,
                    new.map(|n| n.metadata.labels.clone().unwrap_or_default()),
                );
            }));
        Ok(sched)
    }

    /// The queue (metrics, tests).
    pub fn queue(&self) -> &Arc<SchedulingQueue> {
        &self.queue
    }

    fn ours(&self, pod: &Pod) -> bool {
        self.profiles.contains_key(scheduler_name(pod))
    }

    fn on_node(&self, old: Option<&Arc<Node>>, new: Option<&Arc<Node>>) {
        match (old, new) {
            (_, None) => {
                let name = old
                    .and_then(|n| n.metadata.name.clone())
                    .unwrap_or_default();
                self.cache.lock().expect("cache lock").remove_node(&name);
            }
            (None, Some(n)) => {
                self.cache.lock().expect("cache lock").add_node(n.clone());
                self.queue
                    .with(|q, now| q.on_event(ClusterEvent::NodeAdd, now));
            }
            (Some(o), Some(n)) => {
                if !node_changed(o, n) {
                    return;
                }
                self.cache
                    .lock()
                    .expect("cache lock")
                    .update_node(n.clone());
                self.queue
                    .with(|q, now| q.on_event(ClusterEvent::NodeUpdate, now));
            }
        }
    }

    fn on_pod(&self, old: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>) {
        let was_assigned = old.is_some_and(|p| node_name(p).is_some() && !terminal(p));
        match new {
            Some(p) if node_name(p).is_some() && !terminal(p) => {
                let old = old.filter(|_| was_assigned).map(|o| o.as_ref());
                if old.is_none() {
                    self.queue.with(|q, _| q.delete(uid(p)));
                }
                let events = take_assigned_pod(&mut self.cache.lock().expect("cache lock"), old, p);
                if events.iter().any(|e| e.may_requeue()) {
                    self.queue.with(|q, now| {
                        for e in events {
                            q.on_event(e, now);
                        }
                    });
                }
            }
            Some(p) if node_name(p).is_none() && !terminal(p) && self.ours(p) => {
                let p = p.clone();
                self.queue.with(|q, now| q.update(p, now));
            }
            _ => {
                let pod = new.or(old).expect("a change has an object");
                let key = uid(pod).to_string();
                let removed = {
                    let mut cache = self.cache.lock().expect("cache lock");
                    let had = cache.contains_pod(&key);
                    cache.remove_pod(&key);
                    had
                };
                self.queue.with(|q, now| {
                    q.delete(&key);
                    if removed {
                        q.on_event(ClusterEvent::AssignedPodDelete, now);
                    }
                });
            }
        }
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

    /// One scheduling cycle; the binding cycle continues as a task.
    fn schedule_one(
        self: &Arc<Self>,
        handle: &tokio::runtime::Handle,
        algorithm: &mut Algorithm,
        snapshot: &mut Snapshot,
        info: QueuedPodInfo,
    ) {
        let pod = info.pod.clone();
        let key = uid(&pod).to_string();
        let Some(fw) = self.profiles.get(scheduler_name(&pod)).cloned() else {
            self.queue.with(|q, _| q.done(&key));
            return;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            let _guard = handle.enter();
            self.recorders[&fw.name].publish(
                &pod.object_ref(&()),
                true,
                "FailedScheduling",
                format!("skip schedule deleting pod: {}", full_name(&pod)),
            );
            self.queue.with(|q, _| q.done(&key));
            return;
        }
        if self.cache.lock().expect("cache lock").is_assumed(&key) {
            self.queue.with(|q, _| q.done(&key));
            return;
        }
        let start = Instant::now();
        let mut state = CycleState::new();
        let nominated: Nominations = self.queue.with(|q, _| {
            if q.has_nominated() {
                q.nominations()
            } else {
                Nominations::new()
            }
        });
        self.cache
            .lock()
            .expect("cache lock")
            .update_snapshot(snapshot);
        let result = algorithm.schedule(&fw, &mut state, &pod, snapshot, &nominated);
        metrics::metrics()
            .algorithm_duration
            .observe(start.elapsed().as_secs_f64());
        let result = match result {
            Ok(r) => r,
            Err(err) => {
                let _guard = handle.enter();
                self.cycle_failed(&fw, info, err, &state, snapshot, &nominated, start);
                return;
            }
        };
        let node = result.node;
        // Assume: the Pod counts on its node from now on (no copy of the Pod: the cache keeps the
        // node name next to it).
        if let Err(e) = self
            .cache
            .lock()
            .expect("cache lock")
            .assume(pod.clone(), &node)
        {
            let _guard = handle.enter();
            self.fail(
                &fw,
                info,
                Status::error(e.to_string()),
                None,
                Default::default(),
                start,
            );
            return;
        }
        self.queue.with(|q, _| q.delete_nominated(&key));
        let s = fw.run_reserve(&mut state, &pod, &node);
        let s = if s.is_success() {
            fw.run_permit(&state, &pod, &node)
        } else {
            s
        };
        if !s.is_success() {
            fw.run_unreserve(&mut state, &pod, &node);
            let _ = self.cache.lock().expect("cache lock").forget(&key);
            let _guard = handle.enter();
            self.fail(&fw, info, s, None, Default::default(), start);
            return;
        }
        let me = self.clone();
        handle.spawn(async move {
            me.bind(fw, info, state, node, start).await;
        });
    }

    async fn bind(
        self: Arc<Self>,
        fw: Arc<Framework>,
        info: QueuedPodInfo,
        mut state: CycleState,
        node: String,
        start: Instant,
    ) {
        let pod = info.pod.clone();
        let key = uid(&pod).to_string();
        let mut s = fw.run_pre_bind(&state, &pod, &node).await;
        if s.is_success() {
            s = fw.run_bind(&state, &pod, &node).await;
        }
        if !s.is_success() {
            fw.run_unreserve(&mut state, &pod, &node);
            let _ = self.cache.lock().expect("cache lock").forget(&key);
            self.queue
                .with(|q, now| q.on_event(ClusterEvent::AssignedPodDelete, now));
            let s = Status {
                code: Code::Error,
                ..s
            };
            self.fail(&fw, info, s, None, Default::default(), start);
            return;
        }
        self.cache
            .lock()
            .expect("cache lock")
            .finish_binding(&key, Instant::now());
        metrics::observe_attempt("scheduled", &fw.name, start.elapsed().as_secs_f64());
        self.recorders[&fw.name].publish(
            &pod.object_ref(&()),
            false,
            "Scheduled",
            format!("Successfully assigned {} to {node}", full_name(&pod)),
        );
        fw.run_post_bind(&state, &pod, &node);
        self.queue.with(|q, _| q.done(&key));
    }

    /// No node, or an error: PostFilter (preemption) on a FitError, then the failure handling.
    #[allow(clippy::too_many_arguments)]
    fn cycle_failed(
        &self,
        fw: &Arc<Framework>,
        info: QueuedPodInfo,
        err: ScheduleError,
        state: &CycleState,
        snapshot: &Snapshot,
        nominated: &Nominations,
        start: Instant,
    ) {
        let pod = info.pod.clone();
        match err {
            ScheduleError::NoNodes => {
                let s = Status::unresolvable(err.to_string());
                self.fail(fw, info, s, Some(None), Default::default(), start);
            }
            ScheduleError::Internal(s) => {
                self.fail(fw, info, s, None, Default::default(), start);
            }
            ScheduleError::Fit(mut fit) => {
                let mut nomination = None;
                if !fw.post_filter.is_empty() {
                    // Every node's status: the absent ones (narrowed by PreFilter) get theirs.
                    let mut filtered = fit.diagnosis.node_to_status.clone();
                    if let Some(abs) = &fit.diagnosis.absent_status {
                        for n in &snapshot.nodes {
                            filtered
                                .entry(n.name().to_string())
                                .or_insert_with(|| abs.clone());
                        }
                    }
                    metrics::metrics().preemption_attempts.inc();
                    let (result, s) =
                        fw.run_post_filter(state, &pod, snapshot, &filtered, nominated);
                    fit.diagnosis.post_filter_msg = s.reasons.join(", ");
                    if s.code == Code::Error {
                        tracing::warn!(pod = full_name(&pod), "PostFilter: {s}");
                    }
                    if let Some(r) = result.filter(|_| s.is_success()) {
                        metrics::metrics()
                            .preemption_victims
                            .observe(r.victims.len() as f64);
                        self.preempt(fw, &pod, &r.nominated_node, &r.victims, nominated);
                        nomination = Some(Some(r.nominated_node));
                    }
                }
                let plugins = fit.diagnosis.unschedulable_plugins.clone();
                let s = Status {
                    code: Code::Unschedulable,
                    reasons: vec![fit.to_string()],
                    plugin: "",
                };
                self.fail(fw, info, s, nomination, plugins, start);
            }
        }
    }

    /// Preemption's API side: victims get the DisruptionTarget condition, an Event, and are
    /// deleted; lower-priority Pods nominated to the node lose their nomination.
    fn preempt(
        &self,
        fw: &Arc<Framework>,
        pod: &Arc<Pod>,
        node: &str,
        victims: &[Arc<Pod>],
        nominated: &Nominations,
    ) {
        let prio = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let lower: Vec<Arc<Pod>> = nominated
            .get(node)
            .into_iter()
            .flatten()
            .filter(|p| {
                p.uid() != uid(pod)
                    && p.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0) < prio
            })
            .map(|p| p.pod.clone())
            .collect();
        self.queue.with(|q, _| {
            for p in &lower {
                q.delete_nominated(uid(p));
            }
        });
        let client = self.client.clone();
        let recorder = self.recorders[&fw.name].clone();
        let victims = victims.to_vec();
        let preemptor_uid = uid(pod).to_string();
        let node = node.to_string();
        let scheduler = fw.name.clone();
        tokio::spawn(async move {
            for p in lower {
                let api: Api<Pod> = Api::namespaced(
                    client.clone(),
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                );
                let patch = json!({"status": {"nominatedNodeName": null}});
                if let Err(e) = api
                    .patch_status(
                        p.metadata.name.as_deref().unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Strategic(patch),
                    )
                    .await
                {
                    tracing::warn!(pod = full_name(&p), "clearing nominatedNodeName: {e}");
                }
            }
            for v in victims {
                let ns = v.metadata.namespace.as_deref().unwrap_or_default();
                let name = v.metadata.name.as_deref().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client.clone(), ns);
                let patch = json!({"status": {"conditions": [{
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "message": format!("{scheduler}: preempting to accommodate a higher priority pod"),
                    "lastTransitionTime": Timestamp::now().to_string(),
                }]}});
                if let Err(e) = api
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                {
                    tracing::debug!(pod = full_name(&v), "DisruptionTarget condition: {e}");
                }
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => recorder.publish(
                        &v.object_ref(&()),
                        false,
                        "Preempted",
                        format!("Preempted by pod {preemptor_uid} on node {node}"),
                    ),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => tracing::warn!(pod = full_name(&v), "deleting victim: {e}"),
                }
            }
        });
    }

    /// Upstream's handleSchedulingFailure: requeue the latest version of the Pod (unless it is
    /// gone or bound), record the nomination, the FailedScheduling Event and the PodScheduled
    /// condition. `nomination`: None leaves nominatedNodeName, Some(None) clears it, Some(node)
    /// sets it.
    fn fail(
        &self,
        fw: &Arc<Framework>,
        mut info: QueuedPodInfo,
        status: Status,
        nomination: Option<Option<String>>,
        plugins: std::collections::BTreeSet<&'static str>,
        start: Instant,
    ) {
        let pod = info.pod.clone();
        let key = uid(&pod).to_string();
        let rejected = status.is_rejected();
        let (result, reason) = if rejected {
            ("unschedulable", REASON_UNSCHEDULABLE)
        } else {
            ("error", REASON_SCHEDULER_ERROR)
        };
        metrics::observe_attempt(result, &fw.name, start.elapsed().as_secs_f64());
        let message = status.reasons.join(", ");
        if rejected {
            tracing::debug!(pod = full_name(&pod), "unschedulable: {message}");
        } else {
            tracing::info!(pod = full_name(&pod), "scheduling error: {message}");
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let latest = self.pods.get(ns, name).filter(|p| uid(p) == key);
        let Some(latest) = latest.filter(|p| node_name(p).is_none()) else {
            self.queue.with(|q, _| q.done(&key));
            return;
        };
        info.pod = latest.clone();
        info.unschedulable_plugins = plugins;
        let nominated = match &nomination {
            Some(Some(n)) => Some(n.clone()),
            _ => None,
        };
        self.queue.with(|q, now| {
            if let Some(n) = &nominated {
                q.add_nominated(latest.clone(), n);
            } else if nomination == Some(None) {
                q.delete_nominated(&key);
            }
            q.add_unschedulable(info, now);
        });
        self.recorders[&fw.name].publish(
            &latest.object_ref(&()),
            true,
            "FailedScheduling",
            truncate(&message),
        );
        // Upstream writes the status only when the condition or the nomination changes.
        let current = latest
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
        let same_condition = current.is_some_and(|c| {
            c.status == "False"
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message.as_str())
        });
        let current_nnn = latest
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.clone())
            .filter(|n| !n.is_empty());
        let nnn_change = match &nomination {
            None => None,
            Some(n) if *n == current_nnn => None,
            Some(n) => Some(n.clone()),
        };
        if same_condition && nnn_change.is_none() {
            return;
        }
        let mut status = json!({"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": Timestamp::now().to_string(),
        }]});
        if let Some(n) = nnn_change {
            status["nominatedNodeName"] = json!(n);
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let name = name.to_string();
        tokio::spawn(async move {
            let patch = Patch::Strategic(json!({ "status": status }));
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &patch)
                .await
            {
                tracing::debug!(pod = name, "writing the PodScheduled condition: {e}");
            }
        });
    }
}

/// Events and conditions carry at most 1024 characters of message, as upstream truncates.
fn truncate(msg: &str) -> String {
    const MAX: usize = 1024;
    if msg.len() <= MAX {
        return msg.to_string();
    }
    let mut end = MAX - 3;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &msg[..end])
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

#[cfg(test)]
mod tests {
    //! The informer's view of assigned Pods reaching the cache: every update of a bound Pod is
    //! taken (its status and deletionTimestamp matter to preemption and topology spread), with
    //! the queue events upstream's `PodSchedulingPropertiesChange` gives it.

    use std::collections::HashMap;

    use k8s_openapi::api::core::v1::Node;
    use serde_json::{json, Value};

    use super::*;
    use crate::scheduler::framework::{
        FilterPlugin, FilterRunner, NodeInfo, Plugin, PodInfo, PostFilterPlugin, PreFilterPlugin,
        StaticObjects,
    };
    use crate::scheduler::plugins::default_preemption::DefaultPreemption;
    use crate::scheduler::plugins::pod_topology_spread::PodTopologySpread;

    fn node(name: &str, cpu: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"node": name}},
                "status": {"allocatable": {"cpu": cpu, "pods": "110"}}
            }))
            .unwrap(),
        )
    }

    /// A Pod bound to `node`, version `rv`, with `extra` merged in.
    fn bound(name: &str, node: &str, rv: u32, extra: Value) -> Arc<Pod> {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "resourceVersion": rv.to_string()},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]}
        });
        json_patch::merge(&mut p, &extra);
        Arc::new(serde_json::from_value(p).unwrap())
    }

    /// What a kubelet writes right after the Pod starts.
    fn running_since(t: &str) -> Value {
        json!({"status": {"phase": "Running", "startTime": t,
                          "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn cached<'a>(snap: &'a Snapshot, node: &str, name: &str) -> &'a Pod {
        &snap
            .get(node)
            .unwrap()
            .pods
            .iter()
            .find(|p| p.pod.metadata.name.as_deref() == Some(name))
            .unwrap()
            .pod
    }

    fn snapshot_of(cache: &mut Cache) -> Snapshot {
        let mut snap = Snapshot::default();
        cache.update_snapshot(&mut snap);
        snap
    }

    #[test]
    fn every_update_of_an_assigned_pod_reaches_the_cache_with_its_events() {
        use ClusterEvent::*;
        let mut cache = Cache::new(None);
        cache.add_node(node("n1", "4"));
        let v1 = bound("p", "n1", 1, json!({"metadata": {"labels": {"app": "a"}}}));
        assert_eq!(take_assigned_pod(&mut cache, None, &v1), [AssignedPodAdd]);
        type Case = (&'static str, Value, Vec<ClusterEvent>);
        let cases: Vec<Case> = vec![
            (
                "status written by the kubelet: startTime, phase, conditions",
                running_since("2024-01-03T00:00:00Z"),
                vec![AssignedPodOtherUpdate],
            ),
            (
                "deletionTimestamp set (a finalizer keeps the Pod)",
                json!({"metadata": {"deletionTimestamp": "2024-01-05T00:00:00Z"}}),
                vec![AssignedPodOtherUpdate],
            ),
            (
                "labels changed",
                json!({"metadata": {"labels": {"app": "b"}}}),
                vec![AssignedPodLabelUpdate],
            ),
            (
                "a request lowered, and the labels",
                json!({"metadata": {"labels": {"app": "c"}},
                       "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}),
                vec![AssignedPodLabelUpdate],
            ),
            (
                "a request lowered (resized)",
                json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}}),
                vec![AssignedPodScaleDown],
            ),
        ];
        let mut old = v1;
        let mut rv = 1;
        for (name, patch, want) in cases {
            rv += 1;
            let mut p = serde_json::to_value(old.as_ref()).unwrap();
            json_patch::merge(&mut p, &patch);
            p["metadata"]["resourceVersion"] = json!(rv.to_string());
            let new: Arc<Pod> = Arc::new(serde_json::from_value(p).unwrap());
            assert_eq!(
                take_assigned_pod(&mut cache, Some(old.as_ref()), &new),
                want,
                "{name}"
            );
            let snap = snapshot_of(&mut cache);
            assert_eq!(
                cached(&snap, "n1", "p"),
                new.as_ref(),
                "{name}: the cache's copy"
            );
            old = new;
        }
        assert_eq!(
            take_assigned_pod(&mut cache, Some(old.as_ref()), &old.clone()),
            Vec::<ClusterEvent>::new(),
            "the same version again (a resync) changes nothing"
        );
    }

    #[test]
    fn status_updates_of_assigned_pods_move_nothing_in_the_queue() {
        use crate::scheduler::plugins::priority_sort::PrioritySort;
        let mut q = QueueCore::new(
            Arc::new(PrioritySort),
            HashMap::new(),
            super::super::queue::Backoff::default(),
        );
        let t0 = Instant::now();
        let waiting = |name: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default", "uid": name},
                    "spec": {"containers": []}
                }))
                .unwrap(),
            )
        };
        for (name, plugin) in [
            ("fit", "NodeResourcesFit"),
            ("spread", "PodTopologySpread"),
            ("ports", "NodePorts"),
        ] {
            q.add(waiting(name), t0);
            let mut info = q.pop().unwrap();
            info.unschedulable_plugins = [plugin].into_iter().collect();
            q.add_unschedulable(info, t0);
        }
        let later = t0 + Duration::from_secs(60);
        let location = |q: &QueueCore, n: &str| q.location(n);
        use super::super::queue::Location::*;
        q.on_event(ClusterEvent::AssignedPodOtherUpdate, later);
        for n in ["fit", "spread", "ports"] {
            assert_eq!(location(&q, n), Some(Unschedulable), "other update: {n}");
        }
        q.on_event(ClusterEvent::AssignedPodLabelUpdate, later);
        assert_eq!(location(&q, "spread"), Some(Active), "labels wake spread");
        assert_eq!(location(&q, "fit"), Some(Unschedulable), "labels: fit");
        q.on_event(ClusterEvent::AssignedPodScaleDown, later);
        assert_eq!(
            location(&q, "fit"),
            Some(Active),
            "a lowered request wakes fit"
        );
        assert_eq!(
            location(&q, "ports"),
            Some(Unschedulable),
            "scale down: ports"
        );
        q.on_event(ClusterEvent::AssignedPodDelete, later);
        assert_eq!(
            location(&q, "ports"),
            Some(Active),
            "a deletion wakes ports"
        );
    }

    /// CPU only, as NodeResourcesFit decides it.
    struct CpuFit;
    impl Plugin for CpuFit {
        fn name(&self) -> &'static str {
            "NodeResourcesFit"
        }
    }
    impl FilterPlugin for CpuFit {
        fn filter(&self, _: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
            if node.requested.milli_cpu + pod_requests(pod, false).milli_cpu
                > node.allocatable.milli_cpu
            {
                Status::unschedulable("Insufficient cpu")
            } else {
                Status::success()
            }
        }
    }
    impl FilterRunner for CpuFit {
        fn run_filters(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
            self.filter(state, pod, node)
        }
        fn remove_pod(&self, _: &mut CycleState, _: &Pod, _: &PodInfo, _: &NodeInfo) -> Status {
            Status::success()
        }
        fn add_pod(&self, _: &mut CycleState, _: &Pod, _: &PodInfo, _: &NodeInfo) -> Status {
            Status::success()
        }
    }

    fn cpu_pod(name: &str, node: &str, cpu: &str, priority: i32) -> Arc<Pod> {
        bound(
            name,
            node,
            1,
            json!({"spec": {"priority": priority,
                   "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}),
        )
    }

    /// Binds `pods` as the watch first shows them (no status), then gives each the status a
    /// kubelet writes: the start time given.
    fn bind_then_start(cache: &mut Cache, pods: &[(Arc<Pod>, &str)]) {
        for (p, _) in pods {
            take_assigned_pod(cache, None, p);
        }
        for (p, t) in pods {
            let mut v = serde_json::to_value(p.as_ref()).unwrap();
            json_patch::merge(&mut v, &running_since(t));
            v["metadata"]["resourceVersion"] = json!("2");
            let started: Arc<Pod> = Arc::new(serde_json::from_value(v).unwrap());
            take_assigned_pod(cache, Some(p.as_ref()), &started);
        }
    }

    fn preempt(snap: &Snapshot, preemptor: &Pod) -> (String, Vec<String>) {
        let pl = DefaultPreemption::new(None, Arc::new(StaticObjects::default()))
            .unwrap()
            .with_offset(|_| 0);
        let filtered: HashMap<String, Status> = snap
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name().to_string(),
                    CpuFit.filter(&CycleState::new(), preemptor, n),
                )
            })
            .collect();
        let (r, st) = pl.post_filter(&CycleState::new(), preemptor, snap, &filtered, &CpuFit);
        assert!(st.is_success(), "{st}");
        let r = r.unwrap();
        let victims = r
            .victims
            .iter()
            .map(|v| v.metadata.name.clone().unwrap())
            .collect();
        (r.nominated_node, victims)
    }

    #[test]
    fn preemption_sees_start_times_written_after_binding() {
        // Issue 37, case 1: two victims of one priority per node, started on different days per
        // node; upstream picks the node whose earliest-started victim started latest.
        let mut cache = Cache::new(None);
        for n in ["machine1", "machine2", "machine3"] {
            cache.add_node(node(n, "2"));
        }
        let pods: Vec<(Arc<Pod>, &str)> = vec![
            (cpu_pod("m1-a", "machine1", "1", 10), "2024-01-03T00:00:00Z"),
            (cpu_pod("m1-b", "machine1", "1", 10), "2024-01-03T01:00:00Z"),
            (cpu_pod("m2-a", "machine2", "1", 10), "2024-01-04T00:00:00Z"),
            (cpu_pod("m2-b", "machine2", "1", 10), "2024-01-04T01:00:00Z"),
            (cpu_pod("m3-a", "machine3", "1", 10), "2024-01-02T00:00:00Z"),
            (cpu_pod("m3-b", "machine3", "1", 10), "2024-01-02T01:00:00Z"),
        ];
        bind_then_start(&mut cache, &pods);
        let snap = snapshot_of(&mut cache);
        let preemptor = cpu_pod("p", "", "2", 100);
        let (chosen, mut victims) = preempt(&snap, &preemptor);
        victims.sort();
        assert_eq!(
            (chosen.as_str(), victims),
            ("machine2", vec!["m2-a".into(), "m2-b".into()])
        );

        // Case 2: of two equal-priority small Pods the earlier-started one is the more important
        // and is reprieved first; the later-started one goes with the medium Pod.
        let mut cache = Cache::new(None);
        cache.add_node(node("node1", "10"));
        let pods: Vec<(Arc<Pod>, &str)> = vec![
            (cpu_pod("a", "node1", "1", 10), "2024-01-02T00:00:00Z"),
            (cpu_pod("b", "node1", "1", 10), "2024-01-01T00:00:00Z"),
            (cpu_pod("c", "node1", "4", 50), "2024-01-01T00:00:00Z"),
            (cpu_pod("d", "node1", "1", 100), "2024-01-01T00:00:00Z"),
        ];
        bind_then_start(&mut cache, &pods);
        let snap = snapshot_of(&mut cache);
        let preemptor = cpu_pod("p", "", "8", 100);
        assert_eq!(
            preempt(&snap, &preemptor),
            ("node1".into(), vec!["c".into(), "a".into()])
        );
    }

    #[test]
    fn topology_spread_skips_pods_that_turn_terminating_after_binding() {
        // Issue 37, case 3: node-a's only match is terminating (a finalizer keeps it), node-b
        // has one running match: with maxSkew 1 only node-a fits.
        let mut cache = Cache::new(None);
        cache.add_node(node("node-a", "4"));
        cache.add_node(node("node-b", "4"));
        let foo = json!({"metadata": {"labels": {"foo": "bar"}}});
        let t = bound("t", "node-a", 1, foo.clone());
        take_assigned_pod(&mut cache, None, &t);
        take_assigned_pod(&mut cache, None, &bound("r", "node-b", 1, foo.clone()));
        let mut terminating = foo;
        json_patch::merge(
            &mut terminating,
            &json!({"metadata": {"deletionTimestamp": "2024-01-05T00:00:00Z",
                                 "finalizers": ["example.com/keep"]}}),
        );
        take_assigned_pod(
            &mut cache,
            Some(t.as_ref()),
            &bound("t", "node-a", 2, terminating),
        );
        let snap = snapshot_of(&mut cache);
        let incoming: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-p",
                         "labels": {"foo": "bar"}},
            "spec": {"containers": [{"name": "c"}], "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "node", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"foo": "bar"}}}]}
        }))
        .unwrap();
        let pl = PodTopologySpread::new(None, Arc::new(StaticObjects::default())).unwrap();
        let mut state = CycleState::new();
        let (_, st) = pl.pre_filter(&mut state, &incoming, &snap);
        assert!(st.is_success(), "{st}");
        let fits: Vec<(String, bool)> = snap
            .nodes
            .iter()
            .map(|n| {
                let st = pl.filter(&state, &incoming, n);
                (n.name().to_string(), st.is_success())
            })
            .collect();
        assert_eq!(
            fits,
            [("node-a".to_string(), true), ("node-b".to_string(), false)]
        );
    }
}
