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
use super::framework::{ClusterObjects, Code, CycleState, QueuedPodInfo, Snapshot, Status};
use super::framework_runner::{Algorithm, Framework, Nominations, ScheduleError};
use super::metrics;
use super::queue::{ClusterEvent, QueueCore, SchedulingQueue};
use crate::runtime::cache::Indexed;
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

/// Whether a bound Pod's update can change a scheduling decision (labels, spec: resources on
/// resize; status updates from the kubelet cannot).
fn assigned_pod_changed(old: &Pod, new: &Pod) -> bool {
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || old.metadata.namespace != new.metadata.namespace
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
                let first = !was_assigned;
                if first {
                    self.queue.with(|q, _| q.delete(uid(p)));
                }
                let changed = first || old.is_none_or(|o| assigned_pod_changed(o, p));
                let in_cache = self.cache.lock().expect("cache lock").contains_pod(uid(p));
                if changed || !in_cache {
                    self.cache.lock().expect("cache lock").add_pod(p.clone());
                    let ev = if first {
                        ClusterEvent::AssignedPodAdd
                    } else {
                        ClusterEvent::AssignedPodUpdate
                    };
                    self.queue.with(|q, now| q.on_event(ev, now));
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
