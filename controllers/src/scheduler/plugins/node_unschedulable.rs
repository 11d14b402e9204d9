//! NodeUnschedulable (Filter): keeps Pods off nodes with `spec.unschedulable` unless they
//! tolerate the `node.kubernetes.io/unschedulable:NoSchedule` taint, as upstream v1.34's
//! `nodeunschedulable` plugin. Reads only the node object and the Pod's tolerations.

use k8s_openapi::api::core::v1::{Pod, Taint};

use crate::helpers::taints::{
    pod_tolerations, tolerations_tolerate_taint, TAINT_EFFECT_NO_SCHEDULE, TAINT_NODE_UNSCHEDULABLE,
};
use crate::scheduler::framework::{CycleState, FilterPlugin, NodeInfo, Plugin, Status};

pub const NAME: &str = "NodeUnschedulable";

/// Upstream's ErrReasonUnschedulable.
pub const ERR_REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";

/// The plugin; it has no arguments.
#[derive(Debug)]
pub struct NodeUnschedulable {
    /// The taint a Pod must tolerate to be placed on an unschedulable node, built once.
    unschedulable_taint: Taint,
}

impl Default for NodeUnschedulable {
    fn default() -> Self {
        NodeUnschedulable::new()
    }
}

impl NodeUnschedulable {
    /// The plugin has no arguments; any given are ignored, as upstream ignores them.
    pub fn new() -> Self {
        NodeUnschedulable {
            unschedulable_taint: Taint {
                key: TAINT_NODE_UNSCHEDULABLE.to_string(),
                effect: TAINT_EFFECT_NO_SCHEDULE.to_string(),
                ..Taint::default()
            },
        }
    }
}

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for NodeUnschedulable {
    fn filter(&self, _state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        let Some(n) = node.node.as_ref() else {
            return Status::error("node not found");
        };
        if !n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
        {
            return Status::success();
        }
        if tolerations_tolerate_taint(pod_tolerations(pod), &self.unschedulable_taint) {
            return Status::success();
        }
        Status::unresolvable(ERR_REASON_UNSCHEDULABLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::plugins::helper::test_util::*;
    use serde_json::json;

    #[test]
    fn filter_per_node() {
        let nodes = || {
            snapshot(vec![
                node_info(node("normal", json!({})), vec![]),
                node_info(
                    node(
                        "explicitly-schedulable",
                        json!({"spec": {"unschedulable": false}}),
                    ),
                    vec![],
                ),
                node_info(
                    node("cordoned", json!({"spec": {"unschedulable": true}})),
                    vec![],
                ),
            ])
        };
        let cases = [
            (
                "a Pod without tolerations stays off the cordoned node only",
                pod(json!({})),
                vec![ok(), ok(), unresolvable(&[ERR_REASON_UNSCHEDULABLE])],
            ),
            (
                "tolerating the unschedulable taint allows the cordoned node",
                pod(json!({"spec": {"tolerations": [
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}})),
                vec![ok(), ok(), ok()],
            ),
            (
                "an Exists toleration for every key allows it",
                pod(json!({"spec": {"tolerations": [{"operator": "Exists"}]}})),
                vec![ok(), ok(), ok()],
            ),
            (
                "a NoExecute toleration does not",
                pod(json!({"spec": {"tolerations": [
                    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}]}})),
                vec![ok(), ok(), unresolvable(&[ERR_REASON_UNSCHEDULABLE])],
            ),
        ];
        let pl = NodeUnschedulable::new();
        for (name, p, want) in cases {
            assert_eq!(run_filter(None, &pl, &p, &nodes()), want, "{name}");
        }
    }
}
