//! TaintToleration (Filter, PreScore, Score): a node's NoSchedule / NoExecute taints keep off
//! Pods that do not tolerate them; among feasible nodes, fewer intolerable PreferNoSchedule
//! taints score higher (raw score = their count, normalized reversed). Upstream v1.34's
//! `tainttoleration` plugin; reads only the node's taints and the Pod's tolerations.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::helper::default_normalize_score;
use crate::helpers::taints::{
    find_untolerated_taint, is_do_not_schedule_taint, node_taints, pod_tolerations,
    tolerations_tolerate_taint, TAINT_EFFECT_PREFER_NO_SCHEDULE,
};
use crate::scheduler::framework::{
    CycleState, FilterPlugin, NodeInfo, NodeScore, Plugin, PreScorePlugin, ScorePlugin, Snapshot,
    Status, MAX_NODE_SCORE,
};

pub const NAME: &str = "TaintToleration";

const PRE_SCORE_STATE_KEY: &str = "PreScoreTaintToleration";

/// The Filter reason (v1.34 no longer names the taint in it).
pub const ERR_REASON_NOT_MATCH: &str = "node(s) had untolerated taint(s)";

/// The plugin; it has no arguments.
#[derive(Debug, Default)]
pub struct TaintToleration;

impl TaintToleration {
    /// The plugin has no arguments; any given are ignored, as upstream ignores them.
    pub fn new() -> Self {
        TaintToleration
    }
}

/// The Pod's tolerations that can tolerate a PreferNoSchedule taint (effect empty or
/// PreferNoSchedule), computed once per Pod.
#[derive(Debug, Clone)]
struct PreScoreState {
    tolerations: Arc<[Toleration]>,
}

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for TaintToleration {
    fn filter(&self, _state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        let Some(n) = node.node.as_ref() else {
            return Status::error("node not found");
        };
        match find_untolerated_taint(
            node_taints(n),
            pod_tolerations(pod),
            is_do_not_schedule_taint,
        ) {
            None => Status::success(),
            Some(_) => Status::unresolvable(ERR_REASON_NOT_MATCH),
        }
    }
}

impl PreScorePlugin for TaintToleration {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        let tolerations: Arc<[Toleration]> = pod_tolerations(pod)
            .iter()
            .filter(|t| {
                let effect = t.effect.as_deref().unwrap_or_default();
                effect.is_empty() || effect == TAINT_EFFECT_PREFER_NO_SCHEDULE
            })
            .cloned()
            .collect();
        state.write(PRE_SCORE_STATE_KEY, PreScoreState { tolerations });
        Status::success()
    }
}

impl ScorePlugin for TaintToleration {
    fn score(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Err(Status::error(format!(
                "reading {PRE_SCORE_STATE_KEY:?} from cycleState: not found"
            )));
        };
        let Some(n) = node.node.as_ref() else {
            return Err(Status::error("node not found"));
        };
        let count = node_taints(n)
            .iter()
            .filter(|t| {
                t.effect == TAINT_EFFECT_PREFER_NO_SCHEDULE
                    && !tolerations_tolerate_taint(&s.tolerations, t)
            })
            .count();
        Ok(count as i64)
    }

    fn normalize(&self, _state: &CycleState, _pod: &Pod, scores: &mut [NodeScore]) -> Status {
        default_normalize_score(MAX_NODE_SCORE, true, scores);
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::plugins::helper::test_util::*;
    use serde_json::{json, Value};

    fn tainted(name: &str, taints: Value) -> NodeInfo {
        node_info(node(name, json!({"spec": {"taints": taints}})), vec![])
    }

    fn tolerating(tolerations: Value) -> Pod {
        pod(json!({"spec": {"tolerations": tolerations}}))
    }

    // Upstream TestTaintTolerationFilter, one node per case.
    #[test]
    fn filter_per_node() {
        let reject = || unresolvable(&[ERR_REASON_NOT_MATCH]);
        let cases = [
            (
                "a Pod without tolerations cannot go to a node with a NoSchedule taint",
                tolerating(json!([])),
                json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
                reject(),
            ),
            (
                "a toleration with key, value and effect tolerates it",
                tolerating(json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}])),
                json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
                ok(),
            ),
            (
                "Equal with another value does not",
                tolerating(
                    json!([{"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"}]),
                ),
                json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
                reject(),
            ),
            (
                "Exists tolerates any value",
                tolerating(json!([{"key": "foo", "operator": "Exists", "effect": "NoSchedule"}])),
                json!([{"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
                ok(),
            ),
            (
                "all of several taints tolerated",
                tolerating(json!([
                    {"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"},
                    {"key": "foo", "operator": "Exists", "effect": "NoSchedule"}])),
                json!([{"key": "dedicated", "value": "user2", "effect": "NoSchedule"},
                       {"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
                ok(),
            ),
            (
                "a toleration for another (non-empty) effect does not tolerate",
                tolerating(
                    json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "PreferNoSchedule"}]),
                ),
                json!([{"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
                reject(),
            ),
            (
                "a toleration with an empty effect tolerates NoSchedule",
                tolerating(json!([{"key": "foo", "operator": "Equal", "value": "bar"}])),
                json!([{"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
                ok(),
            ),
            (
                "PreferNoSchedule taints never filter",
                tolerating(
                    json!([{"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"}]),
                ),
                json!([{"key": "dedicated", "value": "user1", "effect": "PreferNoSchedule"}]),
                ok(),
            ),
            (
                "NoExecute taints filter",
                tolerating(json!([])),
                json!([{"key": "gone", "effect": "NoExecute"}]),
                reject(),
            ),
        ];
        for (name, p, taints, want) in cases {
            let snap = snapshot(vec![tainted("nodeA", taints)]);
            assert_eq!(
                run_filter(None, &TaintToleration, &p, &snap),
                vec![want],
                "{name}"
            );
        }
    }

    // Upstream TestTaintTolerationScore.
    #[test]
    fn score_per_node() {
        let arm = json!({"key": "cpu-type", "value": "arm64", "effect": "PreferNoSchedule"});
        let ssd = json!({"key": "disk-type", "value": "ssd", "effect": "PreferNoSchedule"});
        let cases = [
            (
                "a node whose taints are tolerated scores higher than one with intolerable taints",
                tolerating(
                    json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "PreferNoSchedule"}]),
                ),
                vec![
                    tainted(
                        "nodeA",
                        json!([{"key": "foo", "value": "bar", "effect": "PreferNoSchedule"}]),
                    ),
                    tainted(
                        "nodeB",
                        json!([{"key": "foo", "value": "blah", "effect": "PreferNoSchedule"}]),
                    ),
                ],
                vec![100, 0],
            ),
            (
                "how many tolerated taints a node has does not matter",
                tolerating(json!([
                    {"key": "cpu-type", "operator": "Equal", "value": "arm64", "effect": "PreferNoSchedule"},
                    {"key": "disk-type", "operator": "Equal", "value": "ssd", "effect": "PreferNoSchedule"}])),
                vec![
                    tainted("nodeA", json!([])),
                    tainted("nodeB", json!([arm])),
                    tainted("nodeC", json!([arm, ssd])),
                ],
                vec![100, 100, 100],
            ),
            (
                "the more intolerable taints, the lower the score",
                tolerating(
                    json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "PreferNoSchedule"}]),
                ),
                vec![
                    tainted("nodeA", json!([])),
                    tainted("nodeB", json!([arm])),
                    tainted("nodeC", json!([arm, ssd])),
                ],
                vec![100, 50, 0],
            ),
            (
                "only PreferNoSchedule taints and tolerations count",
                tolerating(json!([
                    {"key": "cpu-type", "operator": "Equal", "value": "arm64", "effect": "NoSchedule"},
                    {"key": "disk-type", "operator": "Equal", "value": "ssd", "effect": "NoSchedule"}])),
                vec![
                    tainted("nodeA", json!([])),
                    tainted(
                        "nodeB",
                        json!([{"key": "cpu-type", "value": "arm64", "effect": "NoSchedule"}]),
                    ),
                    tainted("nodeC", json!([arm, ssd])),
                ],
                vec![100, 100, 0],
            ),
            (
                "no tolerations: the untainted node wins",
                tolerating(json!([])),
                vec![tainted("nodeA", json!([])), tainted("nodeB", json!([arm]))],
                vec![100, 0],
            ),
        ];
        for (name, p, nodes, want) in cases {
            let got = run_score(
                Some(&TaintToleration),
                &TaintToleration,
                &p,
                &snapshot(nodes),
            );
            assert_eq!(got, Some(want), "{name}");
        }
    }
}
