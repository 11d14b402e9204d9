//! The Pod garbage collector's decisions (kube-controller-manager v1.34's `pkg/controller/podgc`):
//! from the cached Pods and Nodes, which Pods one pass force-deletes and why, and the status
//! patch that marks a Pod Failed first. Pure functions only; the pass, the quarantine of missing
//! Nodes (a delaying work queue) and the API calls live in `super`.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::runtime::cached_pod::CachedPod;

/// Why a Pod is collected: the `reason` label of upstream's `pod_gc_collector_*` metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Terminated, above the threshold.
    Terminated,
    /// Terminating on a Node that is not Ready and carries the out-of-service taint.
    OutOfService,
    /// Bound to a Node that no longer exists.
    Orphaned,
    /// Terminating and never scheduled.
    Unscheduled,
}

impl Reason {
    /// The metrics label value, as upstream.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Terminated => "terminated",
            Reason::OutOfService => "out-of-service",
            Reason::Orphaned => "orphaned",
            Reason::Unscheduled => "unscheduled",
        }
    }
}

/// The taint that lets Pods terminating on a Node that is down be collected.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// The condition set on an orphaned Pod before it is deleted.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason.
pub const DELETION_BY_POD_GC: &str = "DeletionByPodGC";
/// Its message.
pub const NODE_GONE_MESSAGE: &str = "PodGC: node no longer exists";

/// Terminated as podgc counts it (upstream's `isPodTerminated`): a phase other than Pending,
/// Running and Unknown, so Succeeded, Failed, and a Pod without a phase yet.
pub fn is_terminated(pod: &CachedPod) -> bool {
    !matches!(pod.phase(), "Pending" | "Running" | "Unknown")
}

/// Evicted by the kubelet (upstream's `eviction.PodIsEvicted`): Failed with reason `Evicted`.
pub fn is_evicted(pod: &CachedPod) -> bool {
    pod.phase() == "Failed"
        && pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

/// Upstream's `byEvictionAndCreationTimestamp`: evicted Pods first (so that terminated Pods of
/// controllers go last), then the oldest creation, then the name.
pub fn sort_for_collection(pods: &mut [Arc<CachedPod>]) {
    pods.sort_by(|a, b| {
        is_evicted(b)
            .cmp(&is_evicted(a))
            .then_with(|| {
                let t = |p: &CachedPod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                t(a).cmp(&t(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// The terminated Pods above `threshold`, in collection order (upstream's `gcTerminated`); none
/// when the threshold is 0 (the collection is off).
pub fn terminated_to_delete(pods: &[Arc<CachedPod>], threshold: usize) -> Vec<Arc<CachedPod>> {
    if threshold == 0 {
        return Vec::new();
    }
    let mut terminated: Vec<_> = pods.iter().filter(|p| is_terminated(p)).cloned().collect();
    let excess = terminated.len().saturating_sub(threshold);
    if excess == 0 {
        return Vec::new();
    }
    sort_for_collection(&mut terminated);
    terminated.truncate(excess);
    terminated
}

fn node_name(pod: &CachedPod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// A Node's Ready condition is True (upstream's `nodeutil.IsNodeReady`).
pub fn is_node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn out_of_service(node: &Node) -> bool {
    !is_node_ready(node)
        && node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|t| t.key == OUT_OF_SERVICE_TAINT)
}

/// Terminating Pods on a Node that is not Ready and carries the out-of-service taint, in
/// collection order (upstream's `gcTerminating`). A Pod whose Node is not in `node` is skipped
/// (upstream logs the failed lookup).
pub fn terminating_out_of_service(
    pods: &[Arc<CachedPod>],
    node: impl Fn(&str) -> Option<Arc<Node>>,
) -> Vec<Arc<CachedPod>> {
    let mut out: Vec<_> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter(|p| node(node_name(p)).is_some_and(|n| out_of_service(&n)))
        .cloned()
        .collect();
    sort_for_collection(&mut out);
    out
}

/// The Nodes Pods are bound to that the cache does not have (`exists` says which it has): the
/// candidates for the quarantine (upstream adds each to its delaying queue).
pub fn missing_nodes(pods: &[Arc<CachedPod>], exists: impl Fn(&str) -> bool) -> BTreeSet<String> {
    pods.iter()
        .map(|p| node_name(p))
        .filter(|n| !n.is_empty() && !exists(n))
        .map(str::to_string)
        .collect()
}

/// The Pods bound to one of `deleted` (Nodes confirmed gone after the quarantine): orphans,
/// upstream's `gcOrphaned`, in the cache's order.
pub fn orphaned(pods: &[Arc<CachedPod>], deleted: &BTreeSet<String>) -> Vec<Arc<CachedPod>> {
    if deleted.is_empty() {
        return Vec::new();
    }
    pods.iter()
        .filter(|p| deleted.contains(node_name(p)))
        .cloned()
        .collect()
}

/// Terminating Pods never bound to a Node (upstream's `gcUnscheduledTerminating`): no kubelet
/// will ever finish their deletion.
pub fn unscheduled_terminating(pods: &[Arc<CachedPod>]) -> Vec<Arc<CachedPod>> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some() && node_name(p).is_empty())
        .cloned()
        .collect()
}

/// The condition upstream sets on an orphaned Pod before deleting it.
pub struct Condition {
    /// Its type.
    pub type_: &'static str,
    /// Its reason.
    pub reason: &'static str,
    /// Its message.
    pub message: &'static str,
}

/// The DisruptionTarget condition of an orphan.
pub const NODE_GONE: Condition = Condition {
    type_: DISRUPTION_TARGET,
    reason: DELETION_BY_POD_GC,
    message: NODE_GONE_MESSAGE,
};

/// The strategic-merge status patch that marks `pod` Failed before its deletion (upstream's
/// `markFailedAndDeletePodWithCondition` through `PatchPodStatus`): `None` for a Pod already
/// Succeeded or Failed (deleted as it is). Otherwise phase Failed, `observedGeneration` the Pod's
/// generation (v1.34's PodObservedGenerationTracking, on by default), the `condition` if any (its
/// lastTransitionTime kept when the Pod has it already with status True, else `now`; the
/// condition's observedGeneration the Pod's generation), and the Pod's uid as a precondition. A
/// Pod that kept running with no kubelet to report it would otherwise stay Running forever.
pub fn failed_status_patch(
    pod: &CachedPod,
    condition: Option<&Condition>,
    now: Timestamp,
) -> Option<Value> {
    if matches!(pod.phase(), "Succeeded" | "Failed") {
        return None;
    }
    let generation = pod.metadata.generation.filter(|g| *g > 0);
    let mut status = json!({"phase": "Failed"});
    if let Some(g) = generation {
        status["observedGeneration"] = json!(g);
    }
    if let Some(c) = condition {
        let existing = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|e| e.type_ == c.type_));
        let transition = existing
            .filter(|e| e.status == "True")
            .and_then(|e| e.last_transition_time.as_ref())
            .map(|t| t.0)
            .unwrap_or(now);
        let mut cond = json!({
            "type": c.type_,
            "status": "True",
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": Time(transition),
        });
        if let Some(g) = generation {
            cond["observedGeneration"] = json!(g);
        }
        status["conditions"] = json!([cond]);
    }
    Some(json!({
        "metadata": {"uid": pod.metadata.uid},
        "status": status,
    }))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
