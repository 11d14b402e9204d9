//! NodeResourcesBalancedAllocation (PreScore, Score): prefers nodes whose resource usage, with the
//! Pod, is balanced across the configured resources (cpu and memory by default): score =
//! (1 - standard deviation of the requested/allocatable fractions) * 100. Upstream v1.34's
//! `noderesources` BalancedAllocation: plain requests (no non-zero defaults), best-effort Pods
//! skipped in PreScore. Reads only the node's sums.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::node_resources_fit::ResourceAllocationScorer;
use crate::scheduler::framework::{
    CycleState, NodeInfo, Plugin, PreScorePlugin, ScorePlugin, Snapshot, Status, MAX_NODE_SCORE,
};
use crate::scheduler::plugin_args::NodeResourcesBalancedAllocationArgs;

pub const NAME: &str = "NodeResourcesBalancedAllocation";

const PRE_SCORE_STATE_KEY: &str = "PreScoreNodeResourcesBalancedAllocation";

/// The plugin with its parsed NodeResourcesBalancedAllocationArgs.
#[derive(Debug, Clone)]
pub struct BalancedAllocation {
    scorer: ResourceAllocationScorer,
}

/// The Pod's request for each configured resource.
#[derive(Debug, Clone)]
struct PreScoreState(Arc<[i64]>);

impl BalancedAllocation {
    /// From validated NodeResourcesBalancedAllocationArgs (the resources, each weight 1).
    pub fn new(args: &NodeResourcesBalancedAllocationArgs) -> Self {
        BalancedAllocation {
            scorer: ResourceAllocationScorer::new(&args.resources, true),
        }
    }

    /// `balancedResourceScorer`, over the resources the node has, without allocating.
    fn score_node(&self, node: &NodeInfo, pod_requests: &[i64]) -> i64 {
        let fraction = |i: usize| -> Option<f64> {
            let (alloc, req) = self.scorer.allocatable_requested(node, i, pod_requests[i]);
            (alloc != 0).then(|| (req as f64 / alloc as f64).min(1.0))
        };
        let n = pod_requests.len();
        let (mut count, mut total) = (0usize, 0.0f64);
        let (mut first, mut second) = (0.0, 0.0);
        for f in (0..n).filter_map(fraction) {
            match count {
                0 => first = f,
                1 => second = f,
                _ => {}
            }
            count += 1;
            total += f;
        }
        let std = match count {
            0 | 1 => 0.0,
            2 => ((first - second) / 2.0).abs(),
            _ => {
                let mean = total / count as f64;
                let sum: f64 = (0..n)
                    .filter_map(fraction)
                    .map(|f| (f - mean) * (f - mean))
                    .sum();
                (sum / count as f64).sqrt()
            }
        };
        ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
    }
}

impl Plugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreScorePlugin for BalancedAllocation {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        let requests = self.scorer.pod_requests(pod);
        if requests.iter().all(|&r| r == 0) {
            return Status::skip();
        }
        state.write(PRE_SCORE_STATE_KEY, PreScoreState(requests.into()));
        Status::success()
    }
}

impl ScorePlugin for BalancedAllocation {
    fn score(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        if self.scorer.is_empty() {
            return Err(Status::error("resources not found"));
        }
        match state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) {
            Some(s) => Ok(self.score_node(node, &s.0)),
            // PreScore disabled in the profile: a best-effort Pod scores 0 everywhere.
            None => {
                let requests = self.scorer.pod_requests(pod);
                if requests.iter().all(|&r| r == 0) {
                    return Ok(0);
                }
                Ok(self.score_node(node, &requests))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::plugin_args::{decode, valid, PluginArgs};
    use crate::scheduler::plugins::helper::test_util::*;
    use serde_json::{json, Value};

    const KIND: &str = NodeResourcesBalancedAllocationArgs::KIND;

    /// upstream's `makeNode(name, milliCPU, memory, extended)`.
    fn make_node(
        name: &str,
        milli_cpu: i64,
        memory: i64,
        gpu: Option<i64>,
        pods: Vec<Pod>,
    ) -> NodeInfo {
        let mut alloc = json!({"cpu": format!("{milli_cpu}m"), "memory": memory.to_string()});
        if let Some(g) = gpu {
            alloc["nvidia.com/gpu"] = json!(g.to_string());
        }
        node_info(node(name, json!({"status": {"allocatable": alloc}})), pods)
    }

    fn spec_pod(name: &str, containers: Value) -> Pod {
        let mut p = pod(json!({"metadata": {"name": name, "uid": name}}));
        p.spec.as_mut().unwrap().containers = serde_json::from_value(containers).unwrap();
        p
    }

    fn cpu_and_memory(name: &str) -> Pod {
        spec_pod(
            name,
            json!([{"name": "a", "resources": {"requests": {"cpu": "1000m", "memory": "2000"}}},
                   {"name": "b", "resources": {"requests": {"cpu": "2000m", "memory": "3000"}}}]),
        )
    }

    fn cpu_only(name: &str) -> Pod {
        spec_pod(
            name,
            json!([{"name": "a", "resources": {"requests": {"cpu": "1000m", "memory": "0"}}},
                   {"name": "b", "resources": {"requests": {"cpu": "2000m", "memory": "0"}}}]),
        )
    }

    fn cpu_memory_gpu(name: &str) -> Pod {
        spec_pod(
            name,
            json!([{"name": "a", "resources": {"requests": {"cpu": "1000m", "memory": "2000"}}},
                   {"name": "b", "resources": {"requests": {"cpu": "2000m", "memory": "3000", "nvidia.com/gpu": "3"}}}]),
        )
    }

    /// Name, args, the Pod, the nodes with their Pods, the scores (None: PreScore skips).
    type ScoreCase = (
        &'static str,
        Option<Value>,
        Pod,
        Vec<NodeInfo>,
        Option<Vec<i64>>,
    );

    // Upstream TestNodeResourcesBalancedAllocation.
    #[test]
    fn score_per_node() {
        let with_gpu = Some(
            json!({"resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
                                                 {"name": "nvidia.com/gpu", "weight": 1}]}),
        );
        let cases: Vec<ScoreCase> = vec![
            (
                "nothing requested: PreScore skips",
                None,
                spec_pod("p", json!([])),
                vec![make_node("node1", 4000, 10000, None, vec![])],
                None,
            ),
            (
                "nothing scheduled, differently sized nodes",
                None,
                cpu_and_memory("p"),
                vec![
                    make_node("node1", 4000, 10000, None, vec![]),
                    make_node("node2", 6000, 10000, None, vec![]),
                ],
                Some(vec![87, 100]),
            ),
            (
                "pods scheduled with resources",
                None,
                cpu_and_memory("p"),
                vec![
                    make_node("node1", 10000, 20000, None, vec![cpu_only("e1")]),
                    make_node("node2", 10000, 20000, None, vec![cpu_and_memory("e2")]),
                ],
                Some(vec![82, 95]),
            ),
            (
                "pods scheduled with resources, differently sized nodes",
                None,
                cpu_and_memory("p"),
                vec![
                    make_node("node1", 10000, 20000, None, vec![cpu_only("e1")]),
                    make_node("node2", 10000, 50000, None, vec![cpu_and_memory("e2")]),
                ],
                Some(vec![82, 80]),
            ),
            (
                "requested resources at node capacity",
                None,
                cpu_only("p"),
                vec![
                    make_node("node1", 6000, 10000, None, vec![cpu_only("e1")]),
                    make_node("node2", 6000, 10000, None, vec![cpu_and_memory("e2")]),
                ],
                Some(vec![50, 75]),
            ),
            (
                "a scalar resource on the node counts (three fractions)",
                with_gpu.clone(),
                spec_pod(
                    "p",
                    json!([{"name": "a", "resources": {"requests": {"memory": "0", "nvidia.com/gpu": "1"}}}]),
                ),
                vec![
                    make_node("node1", 3500, 40000, Some(8), vec![cpu_memory_gpu("e1")]),
                    make_node("node2", 3500, 40000, Some(8), vec![cpu_and_memory("e2")]),
                ],
                Some(vec![70, 65]),
            ),
            (
                "a scalar resource the Pod does not request is skipped",
                with_gpu,
                cpu_and_memory("p"),
                vec![
                    make_node("node1", 3500, 40000, Some(8), vec![]),
                    make_node("node2", 3500, 40000, None, vec![]),
                ],
                Some(vec![63, 63]),
            ),
        ];
        for (name, args, p, nodes, want) in cases {
            let pl = BalancedAllocation::new(&valid(args.as_ref()));
            let snap = snapshot(nodes);
            assert_eq!(run_score(Some(&pl), &pl, &p, &snap), want, "{name}");
            let without = run_score(None, &pl, &p, &snap);
            let want_without = Some(want.unwrap_or_else(|| vec![0; snap.nodes.len()]));
            assert_eq!(without, want_without, "{name}: without PreScore");
        }
    }

    #[test]
    fn args_errors_name_the_field() {
        let cases = [
            (
                "weight other than 1",
                json!({"resources": [{"name": "cpu", "weight": 2}]}),
                "NodeResourcesBalancedAllocationArgs.resources[0].weight: Invalid value: 2: must be 1",
            ),
            (
                "duplicate name",
                json!({"resources": [{"name": "cpu"}, {"name": "cpu"}]}),
                "NodeResourcesBalancedAllocationArgs.resources[1].name: Duplicate value: \"cpu\"",
            ),
            ("unknown field", json!({"resource": []}), "NodeResourcesBalancedAllocationArgs.resource: unknown field"),
            (
                "unknown resource field",
                json!({"resources": [{"name": "cpu", "wieght": 1}]}),
                "NodeResourcesBalancedAllocationArgs.resources[0].wieght: unknown field `wieght`",
            ),
        ];
        for (name, args, want) in cases {
            let err = decode::<NodeResourcesBalancedAllocationArgs>(Some(&args), KIND).unwrap_err();
            assert!(err.starts_with(want), "{name}: {err}");
        }
        let ok = json!({"resources": [{"name": "cpu"}, {"name": "memory", "weight": 1}]});
        assert!(decode::<NodeResourcesBalancedAllocationArgs>(Some(&ok), KIND).is_ok());
    }
}
