//! A profile's plugins per extension point and the scheduling algorithm that runs them, as
//! kube-scheduler's frameworkImpl and schedulePod:
//!
//! - PreFilter in order (Skip drops the plugin's Filter for this Pod; node sets returned are
//!   intersected; an Unschedulable status still runs the remaining PreFilters, an
//!   UnschedulableAndUnresolvable one stops);
//! - Filter in parallel over the nodes (chunks handed to scoped threads, at most `parallelism`
//!   and the machine's cores), starting where the previous Pod's search stopped, until
//!   percentageOfNodesToScore of the nodes are found feasible (upstream's adaptive default:
//!   50 % minus 1 % per 125 nodes, at least 5 % and 100 nodes); a node is checked with the Pods
//!   nominated to it of equal or higher priority added, then without them (both must pass);
//! - the nominated node first when the Pod has one;
//! - one feasible node: chosen without scoring; none: a [`FitError`] with every node's reason;
//! - PreScore, then Score in parallel over the feasible nodes, NormalizeScore, weights, and the
//!   best total with a random tie-break (selectHost);
//! - Reserve / Unreserve, Permit, PreBind, Bind, PostBind for the runtime's binding cycle;
//! - [`FilterRunner`] for PostFilter (preemption's what-if).
//!
//! Owns no API calls and no clock; pure over the snapshot apart from the tie-break's randomness.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::framework::{
    BindPlugin, Code, CycleState, FilterPlugin, FilterRunner, NodeInfo, NodeScore, PermitPlugin,
    PodInfo, PostBindPlugin, PostFilterPlugin, PostFilterResult, PreBindPlugin, PreEnqueuePlugin,
    PreFilterPlugin, PreScorePlugin, QueueSortPlugin, ReservePlugin, ScorePlugin, Snapshot, Status,
    MAX_NODE_SCORE, MIN_NODE_SCORE,
};

/// Upstream's minFeasibleNodesToFind.
pub const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// Upstream's minFeasibleNodesPercentageToFind.
pub const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: usize = 5;
/// Upstream's default parallelism.
pub const DEFAULT_PARALLELISM: usize = 16;
/// Below this many nodes a loop runs on the calling thread (a thread costs more than checking
/// that many nodes).
const MIN_NODES_FOR_THREADS: usize = 64;

/// One profile: its plugins per extension point, in the order they run.
#[derive(Default)]
pub struct Framework {
    /// The profile's schedulerName.
    pub name: String,
    /// The profile's percentageOfNodesToScore (None: the global one).
    pub percentage_of_nodes_to_score: Option<u32>,
    pub pre_enqueue: Vec<Arc<dyn PreEnqueuePlugin>>,
    pub queue_sort: Option<Arc<dyn QueueSortPlugin>>,
    pub pre_filter: Vec<Arc<dyn PreFilterPlugin>>,
    pub filter: Vec<Arc<dyn FilterPlugin>>,
    pub post_filter: Vec<Arc<dyn PostFilterPlugin>>,
    pub pre_score: Vec<Arc<dyn PreScorePlugin>>,
    /// Score plugins with their weights.
    pub score: Vec<(Arc<dyn ScorePlugin>, i64)>,
    pub reserve: Vec<Arc<dyn ReservePlugin>>,
    pub permit: Vec<Arc<dyn PermitPlugin>>,
    pub pre_bind: Vec<Arc<dyn PreBindPlugin>>,
    pub bind: Vec<Arc<dyn BindPlugin>>,
    pub post_bind: Vec<Arc<dyn PostBindPlugin>>,
}

impl fmt::Debug for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |v: Vec<&str>| v.join(",");
        f.debug_struct("Framework")
            .field("name", &self.name)
            .field(
                "pre_filter",
                &names(self.pre_filter.iter().map(|p| p.name()).collect()),
            )
            .field(
                "filter",
                &names(self.filter.iter().map(|p| p.name()).collect()),
            )
            .field(
                "score",
                &self
                    .score
                    .iter()
                    .map(|(p, w)| format!("{}={w}", p.name()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

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
        if !d.post_filter_msg.is_empty() {
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

/// The Pods nominated per node for one cycle (a copy taken from the queue).
pub type Nominations = HashMap<String, Vec<PodInfo>>;

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// Upstream's parallelizer chunk size: about sqrt(n), at most n/parallelism + 1.
fn chunk_size(n: usize, parallelism: usize) -> usize {
    let s = (n as f64).sqrt() as usize;
    let r = n / parallelism.max(1) + 1;
    s.min(r).max(1)
}

/// Runs `f(i)` for i in 0..n over up to `workers` threads (the caller's included) in chunks,
/// stopping early once `stop` is set; returns the `Some` results with their index.
pub fn parallelize<T: Send>(
    n: usize,
    workers: usize,
    stop: &AtomicBool,
    f: impl Fn(usize) -> Option<T> + Sync,
) -> Vec<(usize, T)> {
    let chunk = chunk_size(n, workers);
    let next = AtomicUsize::new(0);
    let work = || {
        let mut out = Vec::new();
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let start = next.fetch_add(chunk, Ordering::Relaxed);
            if start >= n {
                break;
            }
            for i in start..(start + chunk).min(n) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Some(t) = f(i) {
                    out.push((i, t));
                }
            }
        }
        out
    };
    let threads = workers.min(n.div_ceil(chunk)).max(1);
    if threads == 1 || n < MIN_NODES_FOR_THREADS {
        return work();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut all = work();
        for h in handles {
            all.extend(h.join().expect("scheduler worker panicked"));
        }
        all
    })
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

impl Framework {
    /// Whether scoring would change anything (upstream's hasScoring without extenders).
    pub fn has_score_plugins(&self) -> bool {
        !self.score.is_empty()
    }

    /// PreFilter: the merged node restriction, or the rejecting status and, in both cases, the
    /// plugins that restricted nodes.
    pub fn run_pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
    ) -> (Option<BTreeSet<String>>, Status, Vec<&'static str>) {
        let mut result: Option<BTreeSet<String>> = None;
        let mut with_nodes = Vec::new();
        let mut ret = Status::success();
        let mut skip = BTreeSet::new();
        for pl in &self.pre_filter {
            let (r, s) = pl.pre_filter(state, pod, snapshot);
            if s.is_skip() {
                skip.insert(pl.name());
                continue;
            }
            if !s.is_success() {
                let s = s.with_plugin(pl.name());
                match s.code {
                    Code::UnschedulableAndUnresolvable => {
                        state.skip_filter_plugins = skip;
                        return (None, s, with_nodes);
                    }
                    Code::Unschedulable => {
                        ret = s;
                        continue;
                    }
                    _ => {
                        let msg = format!(
                            "running PreFilter plugin {:?}: {}",
                            pl.name(),
                            s.reasons.join(", ")
                        );
                        state.skip_filter_plugins = skip;
                        return (None, Status::error(msg).with_plugin(pl.name()), with_nodes);
                    }
                }
            }
            if let Some(names) = r.and_then(|r| r.node_names) {
                with_nodes.push(pl.name());
                result = Some(match result {
                    None => names,
                    Some(prev) => prev.intersection(&names).cloned().collect(),
                });
                if result.as_ref().is_some_and(|r| r.is_empty()) {
                    let msg = if with_nodes.len() == 1 {
                        format!("node(s) didn't satisfy plugin {}", with_nodes[0])
                    } else {
                        format!(
                            "node(s) didn't satisfy plugin(s) [{}] simultaneously",
                            with_nodes.join(" ")
                        )
                    };
                    state.skip_filter_plugins = skip;
                    return (result, Status::unresolvable(msg), with_nodes);
                }
            }
        }
        state.skip_filter_plugins = skip;
        (result, ret, with_nodes)
    }

    /// Every Filter plugin on one node; the first rejection (with its plugin) or an error.
    pub fn run_filter_plugins(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        for pl in &self.filter {
            if state.skip_filter_plugins.contains(pl.name()) {
                continue;
            }
            let s = pl.filter(state, pod, node);
            if !s.is_success() {
                if !s.is_rejected() {
                    let msg = format!(
                        "running {:?} filter plugin: {}",
                        pl.name(),
                        s.reasons.join(", ")
                    );
                    return Status::error(msg).with_plugin(pl.name());
                }
                return s.with_plugin(pl.name());
            }
        }
        Status::success()
    }

    fn run_pre_filter_extension(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        info: &PodInfo,
        node: &NodeInfo,
        add: bool,
    ) -> Status {
        for pl in &self.pre_filter {
            if state.skip_filter_plugins.contains(pl.name()) {
                continue;
            }
            let s = if add {
                pl.add_pod(state, pod, info, node)
            } else {
                pl.remove_pod(state, pod, info, node)
            };
            if !s.is_success() {
                let what = if add { "AddPod" } else { "RemovePod" };
                let msg = format!(
                    "running {what} on PreFilter plugin {:?}: {}",
                    pl.name(),
                    s.reasons.join(", ")
                );
                return Status::error(msg).with_plugin(pl.name());
            }
        }
        Status::success()
    }

    /// Filter on `node` as if the Pods nominated to it with the same or a higher priority (other
    /// than `pod` itself) were running there, then, when some were added, without them too: a
    /// nominated Pod must not be relied on (upstream's RunFilterPluginsWithNominatedPods).
    pub fn run_filters_with_nominated(
        &self,
        state: &CycleState,
        pod: &Pod,
        node: &NodeInfo,
        nominated: &Nominations,
    ) -> Status {
        let prio = priority(pod);
        let me = uid(pod);
        let added: Vec<&PodInfo> = nominated
            .get(node.name())
            .into_iter()
            .flatten()
            .filter(|p| p.uid() != me && priority(&p.pod) >= prio)
            .collect();
        if added.is_empty() {
            return self.run_filter_plugins(state, pod, node);
        }
        let mut state_with = state.clone();
        let mut node_with = node.clone();
        for p in added {
            node_with.add_pod(p.clone());
            let s = self.run_pre_filter_extension(&mut state_with, pod, p, &node_with, true);
            if !s.is_success() {
                return s;
            }
        }
        let s = self.run_filter_plugins(&state_with, pod, &node_with);
        if !s.is_success() {
            return s;
        }
        self.run_filter_plugins(state, pod, node)
    }

    /// PostFilter in order until one succeeds; rejections' reasons are joined.
    pub fn run_post_filter(
        &self,
        state: &CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
        filtered: &HashMap<String, Status>,
        nominated: &Nominations,
    ) -> (Option<PostFilterResult>, Status) {
        let runner = CycleFilterRunner {
            fw: self,
            nominated,
        };
        let mut result = None;
        let mut reasons = Vec::new();
        let mut rejector = "";
        for pl in &self.post_filter {
            let (r, s) = pl.post_filter(state, pod, snapshot, filtered, &runner);
            if s.is_success() {
                return (r, s);
            }
            if s.code == Code::UnschedulableAndUnresolvable {
                return (r, s.with_plugin(pl.name()));
            }
            if !s.is_rejected() {
                return (None, s.with_plugin(pl.name()));
            }
            if r.is_some() {
                result = r;
            }
            reasons.extend(s.reasons);
            if rejector.is_empty() {
                rejector = pl.name();
            }
        }
        let status = Status {
            code: Code::Unschedulable,
            reasons,
            plugin: rejector,
        };
        (result, status)
    }

    /// PreScore over the feasible nodes (Skip drops the plugin's Score for this Pod).
    pub fn run_pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status {
        let mut skip = BTreeSet::new();
        for pl in &self.pre_score {
            let s = pl.pre_score(state, pod, nodes, snapshot);
            if s.is_skip() {
                skip.insert(pl.name());
                continue;
            }
            if !s.is_success() {
                let msg = format!(
                    "running PreScore plugin {:?}: {}",
                    pl.name(),
                    s.reasons.join(", ")
                );
                return Status::error(msg).with_plugin(pl.name());
            }
        }
        state.skip_score_plugins = skip;
        Status::success()
    }

    /// Score, NormalizeScore and weights: each node's weighted total, in `nodes` order.
    pub fn run_score(
        &self,
        state: &CycleState,
        pod: &Pod,
        nodes: &[Arc<NodeInfo>],
        workers: usize,
    ) -> Result<Vec<i64>, Status> {
        let plugins: Vec<&(Arc<dyn ScorePlugin>, i64)> = self
            .score
            .iter()
            .filter(|(p, _)| !state.skip_score_plugins.contains(p.name()))
            .collect();
        if plugins.is_empty() {
            return Ok(vec![0; nodes.len()]);
        }
        let stop = AtomicBool::new(false);
        let per_node = parallelize(nodes.len(), workers, &stop, |i| {
            let mut row = Vec::with_capacity(plugins.len());
            for (pl, _) in &plugins {
                match pl.score(state, pod, &nodes[i]) {
                    Ok(s) => row.push(s),
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        let msg = format!(
                            "running Score plugin {:?}: {}",
                            pl.name(),
                            e.reasons.join(", ")
                        );
                        return Some(Err(Status::error(msg).with_plugin(pl.name())));
                    }
                }
            }
            Some(Ok(row))
        });
        let mut matrix: Vec<Vec<NodeScore>> = plugins
            .iter()
            .map(|_| Vec::with_capacity(nodes.len()))
            .collect();
        let mut rows: Vec<Option<Vec<i64>>> = vec![None; nodes.len()];
        for (i, r) in per_node {
            rows[i] = Some(r?);
        }
        for (i, row) in rows.into_iter().enumerate() {
            let row = row.ok_or_else(|| Status::error("a Score call did not run"))?;
            for (p, s) in row.into_iter().enumerate() {
                matrix[p].push(NodeScore {
                    name: nodes[i].name().to_string(),
                    score: s,
                });
            }
        }
        let mut totals = vec![0i64; nodes.len()];
        for ((pl, weight), scores) in plugins.iter().zip(matrix.iter_mut()) {
            let s = pl.normalize(state, pod, scores);
            if !s.is_success() {
                let msg = format!(
                    "running Normalize on Score plugin {:?}: {}",
                    pl.name(),
                    s.reasons.join(", ")
                );
                return Err(Status::error(msg).with_plugin(pl.name()));
            }
            for (i, ns) in scores.iter().enumerate() {
                if !(MIN_NODE_SCORE..=MAX_NODE_SCORE).contains(&ns.score) {
                    let msg = format!(
                        "plugin {:?} returns an invalid score {}, it should in the range of [{}, {}] after normalizing",
                        pl.name(),
                        ns.score,
                        MIN_NODE_SCORE,
                        MAX_NODE_SCORE
                    );
                    return Err(Status::error(msg).with_plugin(pl.name()));
                }
                totals[i] += ns.score * weight;
            }
        }
        Ok(totals)
    }

    /// Reserve in order; on a failure the caller runs [`run_unreserve`](Self::run_unreserve).
    pub fn run_reserve(&self, state: &mut CycleState, pod: &Pod, node: &str) -> Status {
        for pl in &self.reserve {
            let s = pl.reserve(state, pod, node);
            if !s.is_success() {
                let code = if s.is_rejected() { s.code } else { Code::Error };
                return Status {
                    code,
                    reasons: s.reasons,
                    plugin: pl.name(),
                };
            }
        }
        Status::success()
    }

    /// Unreserve in reverse order.
    pub fn run_unreserve(&self, state: &mut CycleState, pod: &Pod, node: &str) {
        for pl in self.reserve.iter().rev() {
            pl.unreserve(state, pod, node);
        }
    }

    /// Permit: the first rejection. A Wait is refused: no plugin here can later allow a waiting
    /// Pod (the contract has no waiting-Pod handle), so waiting would only time out.
    pub fn run_permit(&self, state: &CycleState, pod: &Pod, node: &str) -> Status {
        for pl in &self.permit {
            let (s, _) = pl.permit(state, pod, node);
            match s.code {
                Code::Success => {}
                Code::Wait => {
                    return Status::error(format!(
                        "plugin {:?} asked to wait, which this scheduler does not support",
                        pl.name()
                    ))
                    .with_plugin(pl.name())
                }
                _ => return s.with_plugin(pl.name()),
            }
        }
        Status::success()
    }

    pub async fn run_pre_bind(&self, state: &CycleState, pod: &Pod, node: &str) -> Status {
        for pl in &self.pre_bind {
            let s = pl.pre_bind(state, pod, node).await;
            if !s.is_success() {
                return s.with_plugin(pl.name());
            }
        }
        Status::success()
    }

    /// Bind plugins until one does not Skip.
    pub async fn run_bind(&self, state: &CycleState, pod: &Pod, node: &str) -> Status {
        for pl in &self.bind {
            let s = pl.bind(state, pod, node).await;
            if s.is_skip() {
                continue;
            }
            return s.with_plugin(pl.name());
        }
        Status::error("all bind plugins skipped the pod")
    }

    pub fn run_post_bind(&self, state: &CycleState, pod: &Pod, node: &str) {
        for pl in &self.post_bind {
            pl.post_bind(state, pod, node);
        }
    }
}

/// [`FilterRunner`] for PostFilter within one cycle (nominated Pods counted as in Filter).
pub struct CycleFilterRunner<'a> {
    pub fw: &'a Framework,
    pub nominated: &'a Nominations,
}

impl FilterRunner for CycleFilterRunner<'_> {
    fn run_filters(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        self.fw
            .run_filters_with_nominated(state, pod, node, self.nominated)
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        removed: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        self.fw
            .run_pre_filter_extension(state, pod, removed, node, false)
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        added: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        self.fw
            .run_pre_filter_extension(state, pod, added, node, true)
    }
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
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Algorithm {
            next_start_node_index: 0,
            workers: parallelism.clamp(1, cores.max(1)),
            percentage_of_nodes_to_score,
        }
    }

    /// Finds the node for `pod` (upstream's schedulePod).
    pub fn schedule(
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
        let totals = if fw.has_score_plugins() {
            let s = fw.run_pre_score(state, pod, &feasible, snapshot);
            if !s.is_success() {
                return Err(ScheduleError::Internal(s));
            }
            fw.run_score(state, pod, &feasible, self.workers)
                .map_err(ScheduleError::Internal)?
        } else {
            vec![1; feasible.len()]
        };
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

#[cfg(test)]
#[path = "framework_runner_tests.rs"]
mod tests;
