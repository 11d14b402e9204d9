//! NodeName (Filter): a Pod that names a node in `spec.nodeName` fits only that node, as upstream
//! v1.34's `nodename` plugin. Reads only the Pod and the node's name.

use k8s_openapi::api::core::v1::Pod;

use crate::scheduler::framework::{CycleState, FilterPlugin, NodeInfo, Plugin, Status};

pub const NAME: &str = "NodeName";

/// Upstream's ErrReason.
pub const ERR_REASON: &str = "node(s) didn't match the requested node name";

/// The plugin; it has no arguments.
#[derive(Debug, Default)]
pub struct NodeName;

impl NodeName {
    /// The plugin has no arguments; any given are ignored, as upstream ignores them.
    pub fn new() -> Self {
        NodeName
    }
}

/// Whether the Pod may run on the node by its `spec.nodeName` (upstream `nodename.Fits`).
pub fn fits(pod: &Pod, node: &NodeInfo) -> bool {
    match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        None | Some("") => true,
        Some(name) => name == node.name(),
    }
}

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for NodeName {
    fn filter(&self, _state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        if fits(pod, node) {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON)
        }
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
                node_info(node("foo", json!({})), vec![]),
                node_info(node("bar", json!({})), vec![]),
            ])
        };
        let cases = [
            (
                "no host specified fits every node",
                pod(json!({})),
                vec![ok(), ok()],
            ),
            (
                "an empty nodeName fits every node",
                pod(json!({"spec": {"nodeName": ""}})),
                vec![ok(), ok()],
            ),
            (
                "SCH-6 nodeName mismatch is unresolvable",
                pod(json!({"spec": {"nodeName": "foo"}})),
                vec![ok(), unresolvable(&[ERR_REASON])],
            ),
            (
                "a nodeName of no node fits none",
                pod(json!({"spec": {"nodeName": "baz"}})),
                vec![unresolvable(&[ERR_REASON]), unresolvable(&[ERR_REASON])],
            ),
        ];
        for (name, p, want) in cases {
            assert_eq!(run_filter(None, &NodeName, &p, &nodes()), want, "{name}");
        }
    }
}
