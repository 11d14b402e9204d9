//! Test builders for the plugin tables: nodes and Pods from JSON fragments, a snapshot, and a
//! miniature framework that runs one plugin's PreFilter + Filter or PreScore + Score + normalize
//! over every node as the scheduler's runtime does. Test-only.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};

use crate::scheduler::framework::{
    Code, CycleState, FilterPlugin, NodeInfo, NodeScore, PodInfo, PreFilterPlugin, PreScorePlugin,
    ScorePlugin, Snapshot, Status,
};

fn merged(mut base: Value, extra: Value) -> Value {
    json_patch::merge(&mut base, &extra);
    base
}

/// A node named `name` with `extra` merged in (labels, spec, status).
pub fn node(name: &str, extra: Value) -> Node {
    serde_json::from_value(merged(json!({"metadata": {"name": name}}), extra)).unwrap()
}

/// A Pod named `p` in `default` with one container `c`, plus `extra` (merged into the object).
pub fn pod(extra: Value) -> Pod {
    let base = json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "p-uid"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    serde_json::from_value(merged(base, extra)).unwrap()
}

/// A node with these Pods on it.
pub fn node_info(node: Node, pods: Vec<Pod>) -> NodeInfo {
    let mut info = NodeInfo::new(Arc::new(node));
    for p in pods {
        info.add_pod(PodInfo::new(Arc::new(p)));
    }
    info
}

pub fn snapshot(nodes: Vec<NodeInfo>) -> Snapshot {
    Snapshot::new(nodes, HashMap::new())
}

/// Runs PreFilter (when given) then Filter on every node, in snapshot order. A PreFilter Skip
/// passes every node; a PreFilter rejection is every node's status; a node left out of the
/// PreFilter result is reported as `Unresolvable("not in PreFilter result")`.
pub fn run_filter(
    pre: Option<&dyn PreFilterPlugin>,
    filter: &dyn FilterPlugin,
    pod: &Pod,
    snap: &Snapshot,
) -> Vec<Status> {
    let mut state = CycleState::new();
    let mut names = None;
    if let Some(pre) = pre {
        let (result, status) = pre.pre_filter(&mut state, pod, snap);
        if status.is_skip() {
            return snap.nodes.iter().map(|_| Status::success()).collect();
        }
        if !status.is_success() {
            return snap.nodes.iter().map(|_| status.clone()).collect();
        }
        names = result.and_then(|r| r.node_names);
    }
    snap.nodes
        .iter()
        .map(|n| match &names {
            Some(names) if !names.contains(n.name()) => {
                Status::unresolvable("not in PreFilter result")
            }
            _ => filter.filter(&state, pod, n),
        })
        .collect()
}

/// Runs PreScore (when given), Score on every node and the plugin's normalization; the
/// normalized scores in snapshot order. None when PreScore said Skip.
pub fn run_score(
    pre: Option<&dyn PreScorePlugin>,
    score: &dyn ScorePlugin,
    pod: &Pod,
    snap: &Snapshot,
) -> Option<Vec<i64>> {
    let mut state = CycleState::new();
    if let Some(pre) = pre {
        let status = pre.pre_score(&mut state, pod, &snap.nodes, snap);
        if status.is_skip() {
            return None;
        }
        assert!(status.is_success(), "PreScore: {status}");
    }
    let mut scores: Vec<NodeScore> = snap
        .nodes
        .iter()
        .map(|n| NodeScore {
            name: n.name().to_string(),
            score: score.score(&state, pod, n).expect("Score"),
        })
        .collect();
    let status = score.normalize(&state, pod, &mut scores);
    assert!(status.is_success(), "NormalizeScore: {status}");
    Some(scores.into_iter().map(|s| s.score).collect())
}

/// Success, for expected-status tables.
pub fn ok() -> Status {
    Status::success()
}

/// UnschedulableAndUnresolvable with one or more reasons.
pub fn unresolvable(reasons: &[&str]) -> Status {
    status(Code::UnschedulableAndUnresolvable, reasons)
}

pub fn status(code: Code, reasons: &[&str]) -> Status {
    Status {
        code,
        reasons: reasons.iter().map(|r| r.to_string()).collect(),
        plugin: "",
    }
}
