//! The default plugins this scheduler does not build because they need PersistentVolume / CSI /
//! DRA machinery (VolumeBinding, VolumeZone, NodeVolumeLimits, DynamicResources). In the default
//! profile VolumeBinding and DynamicResources are replaced by this guard: a PreFilter that leaves
//! Pods without PersistentVolumeClaims (or generic ephemeral volumes) and without resource claims
//! alone (Skip) and rejects the others as UnschedulableAndUnresolvable, saying this scheduler does
//! not support them, rather than placing them on a node their volumes or devices may not reach.
//! DynamicResources' guard also stands in for its PostFilter, whose rejection reason is part of
//! kube-scheduler's FitError messages.
//! VolumeZone and NodeVolumeLimits only act on such Pods, so they are simply left out. A profile
//! that names any of the four explicitly is a configuration error (see the registry).

use k8s_openapi::api::core::v1::Pod;

use std::collections::HashMap;

use crate::scheduler::framework::{
    CycleState, FilterRunner, Plugin, PostFilterPlugin, PostFilterResult, PreFilterPlugin,
    PreFilterResult, Snapshot, Status,
};

/// The names of the default plugins that are not built.
pub const NOT_BUILT: [&str; 4] = [
    "VolumeBinding",
    "VolumeZone",
    "NodeVolumeLimits",
    "DynamicResources",
];

/// Which kind of unsupported Pod this guard rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsupported {
    /// VolumeBinding's place: Pods with PersistentVolumeClaim or ephemeral volumes.
    Claims,
    /// DynamicResources' place: Pods with `spec.resourceClaims`.
    ResourceClaims,
}

/// Rejects Pods whose volumes or resource claims this scheduler cannot place.
#[derive(Debug)]
pub struct UnsupportedGuard {
    kind: Unsupported,
}

impl UnsupportedGuard {
    pub fn new(kind: Unsupported) -> UnsupportedGuard {
        UnsupportedGuard { kind }
    }
}

impl Plugin for UnsupportedGuard {
    fn name(&self) -> &'static str {
        match self.kind {
            Unsupported::Claims => "VolumeBinding",
            Unsupported::ResourceClaims => "DynamicResources",
        }
    }
}

impl PreFilterPlugin for UnsupportedGuard {
    fn pre_filter(
        &self,
        _state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let Some(spec) = pod.spec.as_ref() else {
            return (None, Status::skip());
        };
        match self.kind {
            Unsupported::Claims => {
                let uses = spec
                    .volumes
                    .iter()
                    .flatten()
                    .any(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some());
                if uses {
                    return (
                        None,
                        Status::unresolvable(
                            "pod uses PersistentVolumeClaims, which this scheduler does not support (VolumeBinding is not built)",
                        ),
                    );
                }
            }
            Unsupported::ResourceClaims => {
                if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
                    return (
                        None,
                        Status::unresolvable(
                            "pod uses resource claims, which this scheduler does not support (DynamicResources is not built)",
                        ),
                    );
                }
            }
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
        _state: &CycleState,
        _pod: &Pod,
        _snapshot: &Snapshot,
        _filtered: &HashMap<String, Status>,
        _framework: &dyn FilterRunner,
    ) -> (Option<PostFilterResult>, Status) {
        (None, Status::unschedulable("no new claims to deallocate"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Code;

    #[test]
    fn claims_are_refused_and_other_pods_skipped() {
        let cases = [
            (
                "no volumes: skip",
                Unsupported::Claims,
                serde_json::json!({}),
                Code::Skip,
            ),
            (
                "emptyDir only: skip",
                Unsupported::Claims,
                serde_json::json!({"volumes": [{"name": "v", "emptyDir": {}}]}),
                Code::Skip,
            ),
            (
                "PVC: unresolvable",
                Unsupported::Claims,
                serde_json::json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}),
                Code::UnschedulableAndUnresolvable,
            ),
            (
                "generic ephemeral volume: unresolvable",
                Unsupported::Claims,
                serde_json::json!({"volumes": [{"name": "v", "ephemeral": {}}]}),
                Code::UnschedulableAndUnresolvable,
            ),
            (
                "resource claims: unresolvable",
                Unsupported::ResourceClaims,
                serde_json::json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}),
                Code::UnschedulableAndUnresolvable,
            ),
            (
                "no resource claims: skip",
                Unsupported::ResourceClaims,
                serde_json::json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}),
                Code::Skip,
            ),
        ];
        for (name, kind, extra, code) in cases {
            let mut spec = serde_json::json!({"containers": []});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let pod: Pod = serde_json::from_value(
                serde_json::json!({"metadata": {"name": "p"}, "spec": spec}),
            )
            .unwrap();
            let (_, s) = UnsupportedGuard::new(kind).pre_filter(
                &mut CycleState::new(),
                &pod,
                &Snapshot::default(),
            );
            assert_eq!(s.code, code, "{name}");
        }
    }
}
