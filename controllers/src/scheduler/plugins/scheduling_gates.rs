//! SchedulingGates, the PreEnqueue plugin that keeps a Pod with `spec.schedulingGates` out of the
//! active queue until its gates are removed (upstream's schedulinggates). The API server itself
//! writes the PodScheduled=False/SchedulingGated condition on such Pods; this plugin only gates.

use k8s_openapi::api::core::v1::Pod;

use crate::scheduler::framework::{Plugin, PreEnqueuePlugin, Status};

pub const NAME: &str = "SchedulingGates";

/// Rejects Pods that still have scheduling gates.
#[derive(Debug, Default)]
pub struct SchedulingGates;

impl SchedulingGates {
    /// SchedulingGates takes no args.
    pub fn new() -> Self {
        SchedulingGates
    }
}

impl Plugin for SchedulingGates {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreEnqueuePlugin for SchedulingGates {
    fn pre_enqueue(&self, pod: &Pod) -> Status {
        let gates: Vec<&str> = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .into_iter()
            .flatten()
            .map(|g| g.name.as_str())
            .collect();
        if gates.is_empty() {
            return Status::success();
        }
        Status::unresolvable(format!(
            "waiting for scheduling gates: [{}]",
            gates.join(" ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Code;

    #[test]
    fn gated_pods_wait() {
        let cases = [
            (
                "no gates: enqueued",
                serde_json::json!(null),
                Code::Success,
                "",
            ),
            (
                "empty gates: enqueued",
                serde_json::json!([]),
                Code::Success,
                "",
            ),
            (
                "gates: pending with their names",
                serde_json::json!([{"name": "a"}, {"name": "b"}]),
                Code::UnschedulableAndUnresolvable,
                "waiting for scheduling gates: [a b]",
            ),
        ];
        for (name, gates, code, reason) in cases {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [], "schedulingGates": gates}
            }))
            .unwrap();
            let s = SchedulingGates.pre_enqueue(&pod);
            assert_eq!(s.code, code, "{name}");
            assert_eq!(s.reasons.join(""), reason, "{name}");
        }
    }
}
