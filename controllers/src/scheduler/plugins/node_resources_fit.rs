//! NodeResourcesFit (PreFilter, Filter, PreScore, Score): a Pod fits a node only if the node
//! has room for one more Pod and allocatable minus requested covers each resource the Pod
//! requests; feasible nodes are scored by the configured strategy (LeastAllocated by default,
//! MostAllocated, RequestedToCapacityRatio) over the configured resources. Upstream v1.34's
//! `noderesources` Fit plugin and its `resourceAllocationScorer`, which
//! NodeResourcesBalancedAllocation shares ([`ResourceAllocationScorer`]).
//!
//! The Pod's requests are computed once per cycle (PreFilter for Filter, PreScore for Score);
//! Filter and Score read the node's sums and allocate nothing unless the Pod does not fit (the
//! reasons). Not implemented: the DRA extended-resource mapping (feature DRAExtendedResource,
//! alpha and off in v1.34).

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::helpers::nodeaffinity::validate_label_key;
use crate::scheduler::framework::types::{pod_requests, CPU, EPHEMERAL_STORAGE, MEMORY};
use crate::scheduler::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PreFilterPlugin, PreFilterResult, PreScorePlugin,
    ScorePlugin, Snapshot, Status, MAX_NODE_SCORE,
};
use crate::scheduler::plugin_args::{
    NodeResourcesFitArgs, ResourceSpec, ScoringStrategyType, MAX_CUSTOM_PRIORITY_SCORE,
};

pub const NAME: &str = "NodeResourcesFit";

const PRE_FILTER_STATE_KEY: &str = "PreFilterNodeResourcesFit";
const PRE_SCORE_STATE_KEY: &str = "PreScoreNodeResourcesFit";

/// The "Too many pods" reason.
pub const ERR_REASON_TOO_MANY_PODS: &str = "Too many pods";

pub const LEAST_ALLOCATED: &str = "LeastAllocated";
pub const MOST_ALLOCATED: &str = "MostAllocated";
pub const REQUESTED_TO_CAPACITY_RATIO: &str = "RequestedToCapacityRatio";

const MAX_UTILIZATION: i64 = 100;

// ---------------------------------------------------------------------------------------------
// Resource names
// ---------------------------------------------------------------------------------------------

/// Prefixed native resources (`*kubernetes.io/*`).
fn is_prefixed_native(name: &str) -> bool {
    name.contains("kubernetes.io/")
}

/// An extended resource (`v1helper.IsExtendedResourceName`): a domain-prefixed name outside
/// `kubernetes.io`, not a quota `requests.` name, and valid as a quota name.
pub fn is_extended_resource_name(name: &str) -> bool {
    if !name.contains('/') || is_prefixed_native(name) || name.starts_with("requests.") {
        return false;
    }
    validate_label_key(&format!("requests.{name}")).is_ok()
}

/// The resources the scheduler counts by name (`schedutil.IsScalarResourceName`): extended,
/// hugepages, prefixed native and attachable-volume resources.
pub fn is_scalar_resource_name(name: &str) -> bool {
    name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || is_prefixed_native(name)
        || is_extended_resource_name(name)
}

// ---------------------------------------------------------------------------------------------
// The shared scorer (resource_allocation.go)
// ---------------------------------------------------------------------------------------------

/// Where a scored resource's amounts are kept in [`Resource`](crate::scheduler::framework::Resource).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Cpu,
    Memory,
    EphemeralStorage,
    /// Looked up by name among the scalar resources.
    Scalar,
}

#[derive(Debug, Clone)]
struct ScoredResource {
    name: String,
    weight: i64,
    slot: Slot,
    /// `IsScalarResourceName`: a Pod that does not request it leaves it out of the score.
    scalar: bool,
}

/// The per-node arithmetic NodeResourcesFit and NodeResourcesBalancedAllocation share
/// (upstream `resourceAllocationScorer`): the Pod's request for each configured resource, and
/// each resource's (allocatable, requested-with-the-Pod) on a node.
#[derive(Debug, Clone)]
pub struct ResourceAllocationScorer {
    resources: Vec<ScoredResource>,
    /// Count requests as they are (BalancedAllocation); otherwise CPU / memory count the
    /// non-zero defaults for containers that request none, on the node and for the Pod.
    use_requested: bool,
}

impl ResourceAllocationScorer {
    /// Over these resources (weights already defaulted and validated).
    pub fn new(resources: &[ResourceSpec], use_requested: bool) -> ResourceAllocationScorer {
        ResourceAllocationScorer {
            resources: resources
                .iter()
                .map(|r| ScoredResource {
                    name: r.name.clone(),
                    weight: r.weight,
                    slot: match r.name.as_str() {
                        CPU => Slot::Cpu,
                        MEMORY => Slot::Memory,
                        EPHEMERAL_STORAGE => Slot::EphemeralStorage,
                        _ => Slot::Scalar,
                    },
                    scalar: is_scalar_resource_name(&r.name),
                })
                .collect(),
            use_requested,
        }
    }

    pub fn len(&self) -> usize {
        self.resources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    /// The weight of the i-th resource.
    pub fn weight(&self, i: usize) -> i64 {
        self.resources[i].weight
    }

    /// The Pod's request for each configured resource (`calculatePodResourceRequestList`).
    pub fn pod_requests(&self, pod: &Pod) -> Vec<i64> {
        let r = pod_requests(pod, !self.use_requested);
        self.resources
            .iter()
            .map(|res| match res.slot {
                Slot::Cpu => r.milli_cpu,
                Slot::Memory => r.memory,
                Slot::EphemeralStorage => r.ephemeral_storage,
                Slot::Scalar => r.scalar.get(&res.name).copied().unwrap_or(0),
            })
            .collect()
    }

    /// (allocatable, requested including the Pod) of the i-th resource on the node
    /// (`calculateResourceAllocatableRequest`); (0, 0) leaves the resource out of the score.
    pub fn allocatable_requested(&self, node: &NodeInfo, i: usize, pod_request: i64) -> (i64, i64) {
        let res = &self.resources[i];
        if pod_request == 0 && res.scalar {
            return (0, 0);
        }
        let requested = if self.use_requested {
            &node.requested
        } else {
            &node.non_zero_requested
        };
        match res.slot {
            Slot::Cpu => (
                node.allocatable.milli_cpu,
                requested.milli_cpu + pod_request,
            ),
            Slot::Memory => (node.allocatable.memory, requested.memory + pod_request),
            // Ephemeral storage has no non-zero default: always the plain sum.
            Slot::EphemeralStorage => (
                node.allocatable.ephemeral_storage,
                node.requested.ephemeral_storage + pod_request,
            ),
            Slot::Scalar => match node.allocatable.scalar.get(&res.name) {
                Some(&alloc) => (
                    alloc,
                    node.requested.scalar.get(&res.name).copied().unwrap_or(0) + pod_request,
                ),
                None => (0, 0),
            },
        }
    }
}

/// LeastAllocated's per-resource score: the free share, 0 when over capacity.
fn least_requested_score(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

/// MostAllocated's per-resource score: the used share, capped at capacity.
fn most_requested_score(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 {
        return 0;
    }
    requested.min(capacity) * MAX_NODE_SCORE / capacity
}

/// The scoring strategy with its shape (scores already scaled to 0..=100).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Strategy {
    LeastAllocated,
    MostAllocated,
    /// (utilization, score) points, increasing utilization.
    RequestedToCapacityRatio(Vec<(i64, i64)>),
}

/// `BuildBrokenLinearFunction`: linear between the points, flat outside them.
fn broken_linear(shape: &[(i64, i64)], p: i64) -> i64 {
    for (i, &(u, s)) in shape.iter().enumerate() {
        if p <= u {
            if i == 0 {
                return s;
            }
            let (pu, ps) = shape[i - 1];
            return ps + (s - ps) * (p - pu) / (u - pu);
        }
    }
    shape.last().map_or(0, |&(_, s)| s)
}

impl Strategy {
    fn score(
        &self,
        scorer: &ResourceAllocationScorer,
        node: &NodeInfo,
        pod_requests: &[i64],
    ) -> i64 {
        let mut node_score = 0i64;
        let mut weight_sum = 0i64;
        for (i, &pod_request) in pod_requests.iter().enumerate() {
            let (alloc, req) = scorer.allocatable_requested(node, i, pod_request);
            if alloc == 0 {
                continue;
            }
            let weight = scorer.weight(i);
            match self {
                Strategy::LeastAllocated => {
                    node_score += least_requested_score(req, alloc) * weight;
                    weight_sum += weight;
                }
                Strategy::MostAllocated => {
                    node_score += most_requested_score(req, alloc) * weight;
                    weight_sum += weight;
                }
                Strategy::RequestedToCapacityRatio(shape) => {
                    let utilization = if req > alloc {
                        MAX_UTILIZATION
                    } else {
                        req * MAX_UTILIZATION / alloc
                    };
                    let s = broken_linear(shape, utilization);
                    // Upstream counts only resources with a positive score.
                    if s > 0 {
                        node_score += s * weight;
                        weight_sum += weight;
                    }
                }
            }
        }
        if weight_sum == 0 {
            return 0;
        }
        match self {
            Strategy::RequestedToCapacityRatio(_) => {
                (node_score as f64 / weight_sum as f64).round() as i64
            }
            _ => node_score / weight_sum,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The plugin
// ---------------------------------------------------------------------------------------------

/// The plugin with its parsed NodeResourcesFitArgs.
#[derive(Debug, Clone)]
pub struct NodeResourcesFit {
    ignored_resources: BTreeSet<String>,
    ignored_resource_groups: BTreeSet<String>,
    strategy: Strategy,
    scorer: ResourceAllocationScorer,
}

/// One scalar resource the Pod requests, with its precomputed reason.
#[derive(Debug, Clone)]
struct ScalarRequest {
    name: String,
    quantity: i64,
    reason: String,
}

/// The Pod's requests as Filter checks them.
#[derive(Debug, Clone, Default)]
struct PreFilterState {
    milli_cpu: i64,
    memory: i64,
    ephemeral_storage: i64,
    /// Non-zero scalar requests that are not ignored.
    scalars: Arc<[ScalarRequest]>,
}

/// The Pod's request for each scoring resource.
#[derive(Debug, Clone)]
struct PreScoreState(Arc<[i64]>);

/// One resource the node lacks for the Pod (upstream `InsufficientResource`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsufficientResource {
    pub resource: String,
    pub reason: String,
    pub requested: i64,
    pub used: i64,
    pub capacity: i64,
    /// The node could not fit the Pod even empty: preemption would not help.
    pub unresolvable: bool,
}

impl NodeResourcesFit {
    /// From validated NodeResourcesFitArgs (defaulted: the scoring strategy is set).
    pub fn new(args: &NodeResourcesFitArgs) -> Self {
        let strategy_args = args.scoring_strategy.clone().unwrap_or_default();
        let strategy = match strategy_args.type_ {
            Some(ScoringStrategyType::MostAllocated) => Strategy::MostAllocated,
            Some(ScoringStrategyType::RequestedToCapacityRatio) => {
                // Shape scores are 0..=10 in the config, scaled to 0..=MAX_NODE_SCORE.
                let scale = MAX_NODE_SCORE / i64::from(MAX_CUSTOM_PRIORITY_SCORE);
                let shape = strategy_args
                    .requested_to_capacity_ratio
                    .map(|r| r.shape)
                    .unwrap_or_default();
                Strategy::RequestedToCapacityRatio(
                    shape
                        .iter()
                        .map(|p| (i64::from(p.utilization), i64::from(p.score) * scale))
                        .collect(),
                )
            }
            Some(ScoringStrategyType::LeastAllocated) | None => Strategy::LeastAllocated,
        };
        NodeResourcesFit {
            ignored_resources: args.ignored_resources.iter().cloned().collect(),
            ignored_resource_groups: args.ignored_resource_groups.iter().cloned().collect(),
            strategy,
            scorer: ResourceAllocationScorer::new(&strategy_args.resources, false),
        }
    }

    fn ignored(&self, name: &str) -> bool {
        if !is_extended_resource_name(name) {
            return false;
        }
        self.ignored_resources.contains(name)
            || (!self.ignored_resource_groups.is_empty()
                && self
                    .ignored_resource_groups
                    .contains(name.split('/').next().unwrap_or_default()))
    }

    /// The Pod's requests as Filter reads them (`computePodResourceRequest`).
    fn compute_pod_request(&self, pod: &Pod) -> PreFilterState {
        let r = pod_requests(pod, false);
        let scalars: Vec<ScalarRequest> = r
            .scalar
            .iter()
            .filter(|(name, &q)| q != 0 && is_scalar_resource_name(name) && !self.ignored(name))
            .map(|(name, &q)| ScalarRequest {
                name: name.clone(),
                quantity: q,
                reason: format!("Insufficient {name}"),
            })
            .collect();
        PreFilterState {
            milli_cpu: r.milli_cpu,
            memory: r.memory,
            ephemeral_storage: r.ephemeral_storage,
            scalars: scalars.into(),
        }
    }
}

/// What the node lacks for the Pod's requests (`fitsRequest`): room for one more Pod, then each
/// requested resource. Empty when it fits.
fn fits_request(s: &PreFilterState, node: &NodeInfo) -> Vec<InsufficientResource> {
    let mut out = Vec::new();
    let alloc = &node.allocatable;
    let used = &node.requested;
    let pods = node.pods.len() as i64;
    if pods + 1 > alloc.allowed_pod_number {
        out.push(InsufficientResource {
            resource: "pods".into(),
            reason: ERR_REASON_TOO_MANY_PODS.into(),
            requested: 1,
            used: pods,
            capacity: alloc.allowed_pod_number,
            unresolvable: false,
        });
    }
    let mut check = |name: &str, reason: &str, req: i64, used: i64, cap: i64| {
        if req > 0 && req > cap - used {
            out.push(InsufficientResource {
                resource: name.to_string(),
                reason: reason.to_string(),
                requested: req,
                used,
                capacity: cap,
                unresolvable: req > cap,
            });
        }
    };
    check(
        CPU,
        "Insufficient cpu",
        s.milli_cpu,
        used.milli_cpu,
        alloc.milli_cpu,
    );
    check(
        MEMORY,
        "Insufficient memory",
        s.memory,
        used.memory,
        alloc.memory,
    );
    check(
        EPHEMERAL_STORAGE,
        "Insufficient ephemeral-storage",
        s.ephemeral_storage,
        used.ephemeral_storage,
        alloc.ephemeral_storage,
    );
    for r in s.scalars.iter() {
        let cap = alloc.scalar.get(&r.name).copied().unwrap_or(0);
        let used = used.scalar.get(&r.name).copied().unwrap_or(0);
        check(&r.name, &r.reason, r.quantity, used, cap);
    }
    out
}

/// Whether the node would fit the Pod as NodeResourcesFit's Filter sees it with no ignored
/// resources (upstream `noderesources.Fits`): what it lacks, empty when it fits.
pub fn fits(pod: &Pod, node: &NodeInfo) -> Vec<InsufficientResource> {
    let pl = NodeResourcesFit {
        ignored_resources: BTreeSet::new(),
        ignored_resource_groups: BTreeSet::new(),
        strategy: Strategy::LeastAllocated,
        scorer: ResourceAllocationScorer::new(&[], false),
    };
    fits_request(&pl.compute_pod_request(pod), node)
}

/// Quick check without building reasons: whether any resource is short.
fn fits_fast(s: &PreFilterState, node: &NodeInfo) -> bool {
    let alloc = &node.allocatable;
    let used = &node.requested;
    if node.pods.len() as i64 + 1 > alloc.allowed_pod_number {
        return false;
    }
    let short = |req: i64, used: i64, cap: i64| req > 0 && req > cap - used;
    if short(s.milli_cpu, used.milli_cpu, alloc.milli_cpu)
        || short(s.memory, used.memory, alloc.memory)
        || short(
            s.ephemeral_storage,
            used.ephemeral_storage,
            alloc.ephemeral_storage,
        )
    {
        return false;
    }
    !s.scalars.iter().any(|r| {
        short(
            r.quantity,
            used.scalar.get(&r.name).copied().unwrap_or(0),
            alloc.scalar.get(&r.name).copied().unwrap_or(0),
        )
    })
}

impl Plugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodeResourcesFit {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        state.write(PRE_FILTER_STATE_KEY, self.compute_pod_request(pod));
        (None, Status::success())
    }
}

impl FilterPlugin for NodeResourcesFit {
    fn filter(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) else {
            return Status::error(format!(
                "error reading {PRE_FILTER_STATE_KEY:?} from cycleState: not found"
            ));
        };
        if fits_fast(s, node) {
            return Status::success();
        }
        let insufficient = fits_request(s, node);
        let code = if insufficient.iter().any(|r| r.unresolvable) {
            crate::scheduler::framework::Code::UnschedulableAndUnresolvable
        } else {
            crate::scheduler::framework::Code::Unschedulable
        };
        Status {
            code,
            reasons: insufficient.into_iter().map(|r| r.reason).collect(),
            plugin: "",
        }
    }
}

impl PreScorePlugin for NodeResourcesFit {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        state.write(
            PRE_SCORE_STATE_KEY,
            PreScoreState(self.scorer.pod_requests(pod).into()),
        );
        Status::success()
    }
}

impl ScorePlugin for NodeResourcesFit {
    fn score(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        if self.scorer.is_empty() {
            return Err(Status::error("resources not found"));
        }
        match state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) {
            Some(s) => Ok(self.strategy.score(&self.scorer, node, &s.0)),
            // PreScore disabled in the profile: compute the Pod's requests here.
            None => Ok(self
                .strategy
                .score(&self.scorer, node, &self.scorer.pod_requests(pod))),
        }
    }
}

#[cfg(test)]
#[path = "node_resources_fit_tests.rs"]
mod tests;
