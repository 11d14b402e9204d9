//! The one default plugin this scheduler does not build: DynamicResources (it needs the DRA
//! machinery: ResourceClaims, DeviceClasses, ResourceSlices and their allocation). In the default
//! profile it is replaced by this guard: a PreFilter that leaves Pods without `spec.resourceClaims`
//! alone (Skip) and rejects the others as UnschedulableAndUnresolvable, saying this scheduler does
//! not support them, rather than placing them on a node their devices may not reach. The guard
//! also stands in for DynamicResources' PostFilter, whose rejection reason is part of
//! kube-scheduler's FitError messages: "no new claims to deallocate" after its PreFilter ran, and
//! an error "not found" (its PreFilter state missing) when an earlier PreFilter plugin rejected
//! the Pod, which ends PostFilter before preemption, as upstream. A profile that names DynamicResources explicitly is a
//! configuration error (see the registry).

use k8s_openapi::api::core::v1::Pod;

use std::collections::HashMap;

use crate::scheduler::framework::{
    CycleState, FilterRunner, Plugin, PostFilterPlugin, PostFilterResult, PreFilterPlugin,
    PreFilterResult, Snapshot, Status,
};

/// The names of the default plugins that are not built.
pub const NOT_BUILT: [&str; 1] = ["DynamicResources"];

/// Rejects Pods with resource claims (DynamicResources' place).
#[derive(Debug, Default)]
pub struct UnsupportedGuard;

impl UnsupportedGuard {
    pub fn new() -> UnsupportedGuard {
        UnsupportedGuard
    }
}

impl Plugin for UnsupportedGuard {
    fn name(&self) -> &'static str {
        "DynamicResources"
    }
}

/// Written by PreFilter (upstream's DynamicResources writes its state before it skips).
const STATE_KEY: &str = "PreFilterDynamicResources";

impl PreFilterPlugin for UnsupportedGuard {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        state.write(STATE_KEY, ());
        let claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
        if claims {
            return (
                None,
                Status::unresolvable(
                    "pod uses resource claims, which this scheduler does not support (DynamicResources is not built)",
                ),
            );
        }
        (None, Status::skip())
    }
}

/// DynamicResources' PostFilter, which runs before DefaultPreemption in the default profile:
/// with no claims to deallocate it rejects, and kube-scheduler's FitError messages carry its
/// reason ("no new claims to deallocate, preemption: ..."), so this guard says the same.
impl PostFilterPlugin for UnsupportedGuard {
    fn post_filter(
        &self,
        state: &CycleState,
        _pod: &Pod,
        _snapshot: &Snapshot,
        _filtered: &HashMap<String, Status>,
        _framework: &dyn FilterRunner,
    ) -> (Option<PostFilterResult>, Status) {
        if state.read::<()>(STATE_KEY).is_none() {
            return (None, Status::error("not found"));
        }
        (None, Status::unschedulable("no new claims to deallocate"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Code;

    #[test]
    fn resource_claims_are_refused_and_other_pods_skipped() {
        let cases = [
            ("no claims: skip", serde_json::json!({}), Code::Skip),
            (
                "a PVC is VolumeBinding's, not this guard's: skip",
                serde_json::json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}),
                Code::Skip,
            ),
            (
                "resource claims: unresolvable",
                serde_json::json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}),
                Code::UnschedulableAndUnresolvable,
            ),
        ];
        for (name, extra, code) in cases {
            let mut spec = serde_json::json!({"containers": []});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let pod: Pod = serde_json::from_value(
                serde_json::json!({"metadata": {"name": "p"}, "spec": spec}),
            )
            .unwrap();
            let (_, s) = UnsupportedGuard::new().pre_filter(
                &mut CycleState::new(),
                &pod,
                &Snapshot::default(),
            );
            assert_eq!(s.code, code, "{name}");
        }
    }

    /// A FilterRunner the guard's PostFilter never calls.
    struct NoRunner;
    impl FilterRunner for NoRunner {
        fn run_filters(
            &self,
            _: &CycleState,
            _: &Pod,
            _: &crate::scheduler::framework::NodeInfo,
        ) -> Status {
            unreachable!()
        }
        fn remove_pod(
            &self,
            _: &mut CycleState,
            _: &Pod,
            _: &crate::scheduler::framework::PodInfo,
            _: &crate::scheduler::framework::NodeInfo,
        ) -> Status {
            unreachable!()
        }
        fn add_pod(
            &self,
            _: &mut CycleState,
            _: &Pod,
            _: &crate::scheduler::framework::PodInfo,
            _: &crate::scheduler::framework::NodeInfo,
        ) -> Status {
            unreachable!()
        }
    }

    #[test]
    fn post_filter_without_its_prefilter_state_is_not_found() {
        let pod: Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": []}}),
        )
        .unwrap();
        let guard = UnsupportedGuard::new();
        let post = |st: &CycleState| {
            guard
                .post_filter(st, &pod, &Snapshot::default(), &HashMap::new(), &NoRunner)
                .1
        };
        let s = post(&CycleState::new());
        assert_eq!(
            (s.code, s.reasons),
            (Code::Error, vec!["not found".to_string()])
        );
        let mut st = CycleState::new();
        let _ = guard.pre_filter(&mut st, &pod, &Snapshot::default());
        let s = post(&st);
        assert_eq!(
            (s.code, s.reasons),
            (
                Code::Unschedulable,
                vec!["no new claims to deallocate".to_string()]
            )
        );
    }
}
