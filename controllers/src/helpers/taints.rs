//! Taints and tolerations as `k8s.io/api/core/v1` and `component-helpers/scheduling/corev1`
//! match them (`Toleration.ToleratesTaint`, `FindMatchingUntoleratedTaint`, the
//! do-not-schedule effects, `Taint.ToString`). Shared by the scheduler's TaintToleration plugin and
//! the DaemonSet controller. Owns no state and makes no API call.

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};

pub const TAINT_EFFECT_NO_SCHEDULE: &str = "NoSchedule";
pub const TAINT_EFFECT_PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
pub const TAINT_EFFECT_NO_EXECUTE: &str = "NoExecute";

/// The taint the node lifecycle controller puts on `spec.unschedulable` nodes.
pub const TAINT_NODE_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// `Toleration.ToleratesTaint`: an empty toleration effect matches every effect, an empty key
/// every key (only meaningful with Exists); operator "" or Equal compares values, Exists ignores
/// them; any other operator tolerates nothing.
pub fn tolerates_taint(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// Whether any of the tolerations tolerates the taint (`TolerationsTolerateTaint`).
pub fn tolerations_tolerate_taint(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates_taint(t, taint))
}

/// The first taint selected by `include` that no toleration tolerates
/// (`FindMatchingUntoleratedTaint`).
pub fn find_untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    include: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|t| include(t) && !tolerations_tolerate_taint(tolerations, t))
}

/// NoSchedule and NoExecute taints: the ones that keep Pods off a node
/// (`DoNotScheduleTaintsFilterFunc`).
pub fn is_do_not_schedule_taint(taint: &Taint) -> bool {
    taint.effect == TAINT_EFFECT_NO_SCHEDULE || taint.effect == TAINT_EFFECT_NO_EXECUTE
}

/// The node's taints (empty when it has none).
pub fn node_taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The Pod's tolerations (empty when it has none).
pub fn pod_tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// `Taint.ToString`: `key[=value]:effect`, as in the scheduler's reasons.
pub fn taint_to_string(taint: &Taint) -> String {
    let value = taint.value.as_deref().unwrap_or_default();
    match (taint.effect.is_empty(), value.is_empty()) {
        (true, true) => taint.key.clone(),
        (true, false) => format!("{}={}:", taint.key, value),
        (false, true) => format!("{}:{}", taint.key, taint.effect),
        (false, false) => format!("{}={}:{}", taint.key, value, taint.effect),
    }
}

#[cfg(test)]
#[path = "taints_tests.rs"]
mod tests;
