//! One Pod's way through the scheduler, as upstream's pkg/scheduler/schedule_one.go:
//!
//! - `Scheduler::schedule_one`: the scheduling cycle on the scheduling thread: skip deleted
//!   and assumed Pods, snapshot the cache, [`Algorithm::schedule_pod`], assume the Pod on its
//!   node, Reserve and Permit, then hand over to the binding cycle;
//! - [`Algorithm::schedule_pod`] (schedulePod): PreFilter, the nominated node first when the Pod
//!   has one, Filter over the nodes in parallel starting where the previous Pod's search stopped,
//!   until percentageOfNodesToScore of the nodes are found feasible (upstream's adaptive default:
//!   50 % minus 1 % per 125 nodes, at least 5 % and 100 nodes) (findNodesThatFitPod); one
//!   feasible node is chosen without scoring, none is a [`FitError`] with every node's reason;
//!   otherwise [`prioritize_nodes`] (PreScore, Score) and [`select_host`] (the best total with a
//!   random tie-break);
//! - the binding cycle (bindingCycle), a task on the runtime: PreBind, Bind, then the Scheduled
//!   Event and PostBind, or Unreserve, forget and the failure handling;
//! - `Scheduler::handle_scheduling_failure`: requeue, the nomination, the FailedScheduling
//!   Event and the PodScheduled=False condition; PostFilter (preemption) first on a FitError.
//!
//! [`FitError`] and [`Diagnosis`] live here (upstream keeps them in framework/types.go): only
//! this cycle makes and reads them. The algorithm is pure over the snapshot apart from the
//! tie-break's randomness; the API writes are the scheduler's (Events, conditions, nominations).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource as _};
use serde_json::json;

use super::framework::runtime::{parallelize, Framework, Nominations};
use super::framework::{Code, CycleState, NodeInfo, QueuedPodInfo, Snapshot, Status};
use super::metrics;
use super::queue::ClusterEvent;
use super::scheduler::{full_name, node_name, scheduler_name, uid, Scheduler};

/// PodScheduled condition reasons.
pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";
pub const REASON_SCHEDULER_ERROR: &str = "SchedulerError";

/// Upstream's minFeasibleNodesToFind.
pub const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// Upstream's minFeasibleNodesPercentageToFind.
pub const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: usize = 5;

/// Why a Pod fits no node: per-node statuses, the status of nodes not in the map (PreFilter
/// narrowed or rejected them), and the messages of PreFilter and PostFilter.
#[derive(Debug, Clone, Default)]
pub struct Diagnosis {
    pub node_to_status: HashMap<String, Status>,
    pub absent_status: Option<Status>,
    /// The plugins that rejected the Pod somewhere (the queue's hints use them).
    pub unschedulable_plugins: BTreeSet<&'static str>,
    pub pre_filter_msg: String,
    pub post_filter_msg: String,
    /// PostFilter failed with an error (e.g. DynamicResources' "not found" when an earlier
    /// PreFilter rejected the Pod): kube-scheduler v1.34 appends that message as it is, with no
    /// closing period.
    pub post_filter_error: bool,
}

impl Diagnosis {
    fn add_plugin_status(&mut self, s: &Status) {
        if s.is_rejected() && !s.plugin.is_empty() {
            self.unschedulable_plugins.insert(s.plugin);
        }
    }
}

/// No node fits the Pod; displays as kube-scheduler's FitError.
#[derive(Debug, Clone)]
pub struct FitError {
    pub num_all_nodes: usize,
    pub diagnosis: Diagnosis,
}

impl fmt::Display for FitError {
    /// "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint(s).", then
    /// " <PostFilter message>." when preemption said something.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available:", self.num_all_nodes)?;
        let d = &self.diagnosis;
        if !d.pre_filter_msg.is_empty() {
            write!(f, " {}.", d.pre_filter_msg)?;
        } else {
            let mut reasons: HashMap<&str, usize> = HashMap::new();
            for s in d.node_to_status.values() {
                for r in &s.reasons {
                    *reasons.entry(r.as_str()).or_default() += 1;
                }
            }
            if d.node_to_status.len() < self.num_all_nodes {
                if let Some(abs) = &d.absent_status {
                    for r in &abs.reasons {
                        *reasons.entry(r.as_str()).or_default() +=
                            self.num_all_nodes - d.node_to_status.len();
                    }
                }
            }
            let mut list: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
            // Sorted as strings, as upstream (so "10 x" sorts before "2 y").
            list.sort();
            if !list.is_empty() {
                write!(f, " {}.", list.join(", "))?;
            }
        }
        if d.post_filter_error {
            write!(f, " {}", d.post_filter_msg)?;
        } else if !d.post_filter_msg.is_empty() {
            // kube-scheduler v1.34 ends the message with one period even when the PostFilter
            // message (preemption's own FitError) already ends with one.
            write!(f, " {}.", d.post_filter_msg.trim_end_matches('.'))?;
        }
        Ok(())
    }
}

/// Why scheduling a Pod failed.
#[derive(Debug, Clone)]
pub enum ScheduleError {
    /// No node fits.
    Fit(Box<FitError>),
    /// The snapshot has no nodes (upstream's ErrNoNodesAvailable).
    NoNodes,
    /// A plugin returned an error.
    Internal(Status),
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Fit(e) => e.fmt(f),
            ScheduleError::NoNodes => f.write_str("no nodes available to schedule pods"),
            ScheduleError::Internal(s) => write!(f, "{}", s.reasons.join(", ")),
        }
    }
}

/// The chosen node, and how many nodes were looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleResult {
    pub node: String,
    pub evaluated: usize,
    pub feasible: usize,
}

/// The number of feasible nodes after which Filter stops (upstream's numFeasibleNodesToFind).
pub fn num_feasible_nodes_to_find(percentage: u32, num_all_nodes: usize) -> usize {
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND {
        return num_all_nodes;
    }
    let mut pct = percentage as i64;
    if pct == 0 {
        pct = (50 - num_all_nodes as i64 / 125).max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND as i64);
    }
    let n = (num_all_nodes as i64 * pct / 100) as usize;
    n.max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// The scheduling algorithm's state across Pods: where the next Filter search starts, and the
/// configured parallelism / percentage.
#[derive(Debug)]
pub struct Algorithm {
    pub next_start_node_index: usize,
    /// Threads a Filter / Score pass may use (min of the configured parallelism and the cores).
    pub workers: usize,
    /// The global percentageOfNodesToScore (0: adaptive).
    pub percentage_of_nodes_to_score: u32,
}

impl Algorithm {
    pub fn new(parallelism: usize, percentage_of_nodes_to_score: u32) -> Algorithm {
        Algorithm {
            next_start_node_index: 0,
            workers: super::framework::runtime::workers(parallelism),
            percentage_of_nodes_to_score,
        }
    }

    /// Finds the node for `pod` (upstream's schedulePod).
    pub fn schedule_pod(
        &mut self,
        fw: &Framework,
        state: &mut CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
        nominated: &Nominations,
    ) -> Result<ScheduleResult, ScheduleError> {
        let all = snapshot.nodes.len();
        if all == 0 {
            return Err(ScheduleError::NoNodes);
        }
        let (feasible, diagnosis) =
            self.find_nodes_that_fit(fw, state, pod, snapshot, nominated)?;
        if feasible.is_empty() {
            return Err(ScheduleError::Fit(Box::new(FitError {
                num_all_nodes: all,
                diagnosis,
            })));
        }
        let evaluated = feasible.len() + diagnosis.node_to_status.len();
        if feasible.len() == 1 {
            return Ok(ScheduleResult {
                node: feasible[0].name().to_string(),
                evaluated,
                feasible: 1,
            });
        }
        let totals = prioritize_nodes(fw, state, pod, &feasible, snapshot, self.workers)?;
        let best = select_host(&totals, &mut rand::thread_rng());
        Ok(ScheduleResult {
            node: feasible[best].name().to_string(),
            evaluated,
            feasible: feasible.len(),
        })
    }

    /// PreFilter, the nominated node, then Filter over the nodes (upstream's
    /// findNodesThatFitPod).
    pub fn find_nodes_that_fit(
        &mut self,
        fw: &Framework,
        state: &mut CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
        nominated: &Nominations,
    ) -> Result<(Vec<Arc<NodeInfo>>, Diagnosis), ScheduleError> {
        let mut diagnosis = Diagnosis::default();
        let (restricted, s, with_nodes) = fw.run_pre_filter(state, pod, snapshot);
        diagnosis
            .unschedulable_plugins
            .extend(with_nodes.iter().copied());
        if !s.is_success() {
            if !s.is_rejected() {
                return Err(ScheduleError::Internal(s));
            }
            diagnosis.pre_filter_msg = s.reasons.join(", ");
            diagnosis.add_plugin_status(&s);
            diagnosis.absent_status = Some(s);
            return Ok((Vec::new(), diagnosis));
        }
        let nominated_node = pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty());
        if let Some(node) = nominated_node.and_then(|n| snapshot.get(n)) {
            let s = fw.run_filters_with_nominated(state, pod, node, nominated);
            if s.code == Code::Error {
                tracing::warn!(node = node.name(), "evaluating the nominated node: {s}");
            } else if s.is_success() {
                return Ok((vec![node.clone()], diagnosis));
            }
        }
        let subset: Vec<Arc<NodeInfo>>;
        let nodes: &[Arc<NodeInfo>] = match &restricted {
            None => &snapshot.nodes,
            Some(names) => {
                subset = names
                    .iter()
                    .filter_map(|n| snapshot.get(n).cloned())
                    .collect();
                diagnosis.absent_status = Some(Status::unresolvable(format!(
                    "node(s) didn't satisfy plugin(s) [{}]",
                    with_nodes.join(" ")
                )));
                &subset
            }
        };
        let feasible =
            self.find_nodes_that_pass_filters(fw, state, pod, &mut diagnosis, nodes, nominated)?;
        let processed = feasible.len() + diagnosis.node_to_status.len();
        self.next_start_node_index =
            (self.next_start_node_index + processed) % snapshot.nodes.len();
        Ok((feasible, diagnosis))
    }

    fn find_nodes_that_pass_filters(
        &self,
        fw: &Framework,
        state: &CycleState,
        pod: &Pod,
        diagnosis: &mut Diagnosis,
        nodes: &[Arc<NodeInfo>],
        nominated: &Nominations,
    ) -> Result<Vec<Arc<NodeInfo>>, ScheduleError> {
        let n = nodes.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let pct = fw
            .percentage_of_nodes_to_score
            .unwrap_or(self.percentage_of_nodes_to_score);
        let to_find = if fw.has_score_plugins() {
            num_feasible_nodes_to_find(pct, n)
        } else {
            1
        };
        let start = self.next_start_node_index;
        if fw.filter.is_empty() {
            return Ok((0..to_find.min(n))
                .map(|i| nodes[(start + i) % n].clone())
                .collect());
        }
        let found = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let results = parallelize(n, self.workers, &stop, |i| {
            let node = &nodes[(start + i) % n];
            let s = fw.run_filters_with_nominated(state, pod, node, nominated);
            if s.is_success() {
                let k = found.fetch_add(1, Ordering::Relaxed) + 1;
                if k > to_find {
                    stop.store(true, Ordering::Relaxed);
                    found.fetch_sub(1, Ordering::Relaxed);
                    return None;
                }
                if k == to_find {
                    stop.store(true, Ordering::Relaxed);
                }
                return Some(Ok(i));
            }
            if s.code == Code::Error {
                stop.store(true, Ordering::Relaxed);
                return Some(Err(s));
            }
            Some(Err(s))
        });
        let mut feasible_idx = Vec::new();
        let mut error = None;
        for (i, r) in results {
            match r {
                Ok(_) => feasible_idx.push(i),
                Err(s) if s.code == Code::Error => error = Some(s),
                Err(s) => {
                    diagnosis.add_plugin_status(&s);
                    diagnosis
                        .node_to_status
                        .insert(nodes[(start + i) % n].name().to_string(), s);
                }
            }
        }
        if let Some(e) = error {
            return Err(ScheduleError::Internal(e));
        }
        // In search order, as upstream's slice (ties in selectHost depend on it only randomly).
        feasible_idx.sort_unstable();
        Ok(feasible_idx
            .into_iter()
            .map(|i| nodes[(start + i) % n].clone())
            .collect())
    }
}

/// PreScore and Score over the feasible nodes: each node's weighted total, in `feasible` order;
/// every node scores 1 when the profile has no Score plugin (upstream's prioritizeNodes).
pub fn prioritize_nodes(
    fw: &Framework,
    state: &mut CycleState,
    pod: &Pod,
    feasible: &[Arc<NodeInfo>],
    snapshot: &Snapshot,
    workers: usize,
) -> Result<Vec<i64>, ScheduleError> {
    if !fw.has_score_plugins() {
        return Ok(vec![1; feasible.len()]);
    }
    let s = fw.run_pre_score(state, pod, feasible, snapshot);
    if !s.is_success() {
        return Err(ScheduleError::Internal(s));
    }
    fw.run_score(state, pod, feasible, workers)
        .map_err(ScheduleError::Internal)
}

/// The index of the highest total; among equal totals each is chosen with equal probability
/// (upstream's selectHost reservoir sampling).
pub fn select_host(totals: &[i64], rng: &mut impl rand::Rng) -> usize {
    let mut best = 0;
    let mut count = 0u32;
    for (i, &t) in totals.iter().enumerate() {
        if i == 0 || t > totals[best] {
            best = i;
            count = 1;
        } else if t == totals[best] {
            count += 1;
            if rng.gen_range(0..count) == 0 {
                best = i;
            }
        }
    }
    best
}

impl Scheduler {
    /// One scheduling cycle; the binding cycle continues as a task.
    pub(super) fn schedule_one(
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
        let result = algorithm.schedule_pod(&fw, &mut state, &pod, snapshot, &nominated);
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
            self.handle_scheduling_failure(
                &fw,
                info,
                Status::error(e.to_string()),
                None,
                Default::default(),
                start,
            );
            return;
        }
        tracing::trace!(pod = %full_name(&pod), node = %node, "Assumed pod on node");
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
            self.handle_scheduling_failure(&fw, info, s, None, Default::default(), start);
            return;
        }
        let me = self.clone();
        handle.spawn(async move {
            me.binding_cycle(fw, info, state, node, start).await;
        });
    }

    async fn binding_cycle(
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
            self.handle_scheduling_failure(&fw, info, s, None, Default::default(), start);
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
                self.handle_scheduling_failure(fw, info, s, Some(None), Default::default(), start);
            }
            ScheduleError::Internal(s) => {
                self.handle_scheduling_failure(fw, info, s, None, Default::default(), start);
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
                    let preemptor = self.with_nomination(&pod);
                    let (result, s) =
                        fw.run_post_filter(state, &preemptor, snapshot, &filtered, nominated);
                    fit.diagnosis.post_filter_msg = s.reasons.join(", ");
                    fit.diagnosis.post_filter_error = s.code == Code::Error;
                    if s.code == Code::Error {
                        tracing::warn!(pod = full_name(&pod), "PostFilter: {s}");
                    }
                    match result {
                        Some(r) if s.is_success() => {
                            metrics::metrics()
                                .preemption_victims
                                .observe(r.victims.len() as f64);
                            self.preempt(fw, &pod, &r.nominated_node, &r.victims, nominated);
                            nomination = Some(Some(r.nominated_node));
                        }
                        // Preemption cannot help anywhere: an earlier nomination is cleared
                        // (upstream's NominatingMode override with an empty node).
                        Some(r) if r.nominated_node.is_empty() && s.is_rejected() => {
                            nomination = Some(None);
                        }
                        _ => {}
                    }
                }
                let plugins = fit.diagnosis.unschedulable_plugins.clone();
                let s = Status {
                    code: Code::Unschedulable,
                    reasons: vec![fit.to_string()],
                    plugin: "",
                };
                self.handle_scheduling_failure(fw, info, s, nomination, plugins, start);
            }
        }
    }

    /// The Pod as preemption must judge it: with the node this scheduler nominated it to when
    /// its status does not show that yet (upstream's nominator holds the nomination in memory
    /// from the failure handling on, and Preempt reads the latest Pod; a status write still in
    /// flight must not make the Pod look un-nominated and preempt a second time).
    fn with_nomination(&self, pod: &Arc<Pod>) -> Arc<Pod> {
        let nominated = self
            .queue
            .with(|q, _| q.nominated_node(uid(pod)).map(str::to_string));
        with_nominated_node(pod, nominated.as_deref())
    }

    /// Upstream's handleSchedulingFailure: requeue the latest version of the Pod (unless it is
    /// gone or bound), record the nomination, the FailedScheduling Event and the PodScheduled
    /// condition. `nomination`: None leaves nominatedNodeName, Some(None) clears it, Some(node)
    /// sets it.
    fn handle_scheduling_failure(
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

/// `pod` with `status.nominatedNodeName` set to `node` when its status has none.
pub fn with_nominated_node(pod: &Arc<Pod>, node: Option<&str>) -> Arc<Pod> {
    let has = pod
        .status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    match node.filter(|n| !n.is_empty()) {
        Some(n) if !has => {
            let mut p = (**pod).clone();
            p.status
                .get_or_insert_with(Default::default)
                .nominated_node_name = Some(n.to_string());
            Arc::new(p)
        }
        _ => pod.clone(),
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

#[cfg(test)]
#[path = "schedule_one_tests.rs"]
mod tests;
