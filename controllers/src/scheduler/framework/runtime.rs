//! The framework runtime (upstream's pkg/scheduler/framework/runtime, `frameworkImpl`): one
//! profile's plugins per extension point, in the order they run, and how each extension point is
//! run:
//!
//! - PreFilter in order (Skip drops the plugin's Filter for this Pod; node sets returned are
//!   intersected; an Unschedulable status still runs the remaining PreFilters, an
//!   UnschedulableAndUnresolvable one stops);
//! - Filter on one node, with the Pods nominated to it of equal or higher priority added, then
//!   without them (both must pass: RunFilterPluginsWithNominatedPods);
//! - PostFilter in order until one succeeds, with [`CycleFilterRunner`] as preemption's what-if;
//! - PreScore, then Score in parallel over the feasible nodes, NormalizeScore and the weights;
//! - Reserve / Unreserve, Permit, PreBind, Bind, PostBind for the binding cycle;
//! - [`parallelize`] and [`parallel_fold`], upstream's parallelizer: chunks handed to scoped
//!   threads, at most `parallelism` and the machine's cores ([`workers`]).
//!
//! Owns no API calls, no clock and no choice between nodes: which nodes to filter, when to stop
//! and which node wins belong to [`schedule_one`](crate::scheduler::schedule_one).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::{
    BindPlugin, Code, CycleState, FilterPlugin, FilterRunner, NodeInfo, NodeScore, PermitPlugin,
    PodInfo, PostBindPlugin, PostFilterPlugin, PostFilterResult, PreBindPlugin, PreEnqueuePlugin,
    PreFilterPlugin, PreScorePlugin, QueueSortPlugin, ReservePlugin, ScorePlugin, Snapshot, Status,
    MAX_NODE_SCORE, MIN_NODE_SCORE,
};

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

/// The Pods nominated per node for one cycle (a copy taken from the queue).
pub type Nominations = HashMap<String, Vec<PodInfo>>;

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// namespace/name, for logs.
fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The threads a parallel loop may use: the configured `parallelism`, at most the machine's
/// cores (more threads than cores only add switches on a CPU-bound loop).
pub fn workers(parallelism: usize) -> usize {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    parallelism.clamp(1, cores.max(1))
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

/// Folds `f(acc, i)` for i in 0..n over up to `workers` threads (the caller's included), each
/// thread into an accumulator of its own made by `init`; returns the accumulators (one per
/// thread that ran) for the caller to merge. The plugins' PreFilter / PreScore passes over every
/// node use it as upstream's use `Parallelizer().Until` with a per-node merge under a lock: here
/// the merge happens once per thread instead of once per node.
pub fn parallel_fold<A: Send>(
    n: usize,
    workers: usize,
    init: impl Fn() -> A + Sync,
    f: impl Fn(&mut A, usize) + Sync,
) -> Vec<A> {
    let chunk = chunk_size(n, workers);
    let next = AtomicUsize::new(0);
    let work = || {
        let mut acc = init();
        loop {
            let start = next.fetch_add(chunk, Ordering::Relaxed);
            if start >= n {
                break;
            }
            for i in start..(start + chunk).min(n) {
                f(&mut acc, i);
            }
        }
        acc
    };
    let threads = workers.min(n.div_ceil(chunk)).max(1);
    if threads == 1 || n < MIN_NODES_FOR_THREADS {
        return vec![work()];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut all = vec![work()];
        for h in handles {
            all.push(h.join().expect("scheduler worker panicked"));
        }
        all
    })
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
        let trace = tracing::enabled!(tracing::Level::TRACE);
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
                if trace {
                    // Upstream's -v=10 "Plugin scored node for pod" (weighted score).
                    tracing::trace!(
                        pod = %pod_name(pod),
                        plugin = pl.name(),
                        node = %ns.name,
                        score = ns.score * weight,
                        "Plugin scored node for pod"
                    );
                }
            }
        }
        if trace {
            for (node, total) in nodes.iter().zip(&totals) {
                tracing::trace!(
                    pod = %pod_name(pod),
                    node = %node.name(),
                    score = total,
                    "Calculated node's final score for pod"
                );
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
