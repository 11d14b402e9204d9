//! NodeVolumeLimits, as kube-scheduler v1.34's CSILimits (nodevolumelimits/csi.go): a node's CSI
//! drivers attach at most `CSINode.spec.drivers[].allocatable.count` volumes each (or the node's
//! `attachable-volumes-csi-<driver>` allocatable); a Pod fits when the unique volumes of the Pods
//! already on the node plus its own new ones stay within every driver's limit
//! ("node(s) exceed max volume count", Unschedulable: preemption may free volumes).
//!
//! A claim's volume counts as `<driver>/<volumeHandle>` of its bound CSI PersistentVolume, or,
//! unbound (or its volume missing), as a volume of its class's provisioner named after the claim
//! (with a per-process random prefix, so it never equals a real handle). In-tree volumes that
//! upstream counts through CSI migration are not counted here (no migration translation).
//!
//! Owns nothing but the random prefix; pure over the claims, volumes, classes and CSINodes.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::volume_util::{self as vu, claim_class, claim_volume_name};
use crate::scheduler::framework::{
    ClusterObjects, CycleState, FilterPlugin, NodeInfo, Plugin, PreFilterPlugin, PreFilterResult,
    Snapshot, Status,
};

pub const NAME: &str = "NodeVolumeLimits";
pub const ERR_REASON_MAX_VOLUME_COUNT_EXCEEDED: &str = "node(s) exceed max volume count";
/// A node allocatable that limits a CSI driver's volumes (`GetCSIAttachLimitKey`).
const CSI_ATTACH_LIMIT_PREFIX: &str = "attachable-volumes-csi-";

pub struct NodeVolumeLimits {
    objects: Arc<dyn ClusterObjects>,
    random_prefix: String,
}

/// Why the Pod's own volumes could not be counted.
enum CountError {
    /// A claim the new Pod needs is missing: it cannot run anywhere until it exists.
    ClaimNotFound(String),
    Other(String),
}

impl NodeVolumeLimits {
    pub fn new(objects: Arc<dyn ClusterObjects>) -> NodeVolumeLimits {
        NodeVolumeLimits {
            objects,
            random_prefix: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// `filterAttachableVolumes`: the Pod's CSI volumes, unique name -> driver. A missing claim
    /// is an error for the new Pod and skipped for Pods already on the node.
    fn attachable(
        &self,
        pod: &Pod,
        new_pod: bool,
        out: &mut HashMap<String, String>,
    ) -> Result<(), CountError> {
        let ns = vu::ns(&pod.metadata);
        for c in vu::pod_claims(pod) {
            if c.name.is_empty() {
                return Err(CountError::Other(
                    "PersistentVolumeClaim had no name".into(),
                ));
            }
            let Some(pvc) = self.objects.persistent_volume_claim(ns, &c.name) else {
                if new_pod {
                    return Err(CountError::ClaimNotFound(format!(
                        "looking up PVC {ns}/{}: persistentvolumeclaim {:?} not found",
                        c.name, c.name
                    )));
                }
                continue;
            };
            if c.ephemeral {
                vu::volume_is_for_pod(pod, &pvc).map_err(CountError::Other)?;
            }
            if let Some((driver, handle)) = self.csi_driver_info(&pvc) {
                out.insert(format!("{driver}/{handle}"), driver);
            }
        }
        Ok(())
    }

    /// `getCSIDriverInfo`: the bound volume's CSI driver and handle, or the class's.
    fn csi_driver_info(&self, pvc: &PersistentVolumeClaim) -> Option<(String, String)> {
        let pv_name = claim_volume_name(pvc);
        if !pv_name.is_empty() {
            if let Some(pv) = self.objects.persistent_volume(pv_name) {
                let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref())?;
                return Some((csi.driver.clone(), csi.volume_handle.clone()));
            }
        }
        // Unbound, or the volume is gone (or pre-bound to one not created yet): count it as a
        // volume of the class's provisioner.
        let class = claim_class(pvc);
        if class.is_empty() {
            return None;
        }
        let sc = self.objects.storage_class(class)?;
        let handle = format!(
            "{}-{}/{}",
            self.random_prefix,
            vu::ns(&pvc.metadata),
            vu::name(&pvc.metadata)
        );
        Some((sc.provisioner.clone(), handle))
    }

    /// `getVolumeLimits`: the node's `attachable-volumes-csi-*` allocatable, overridden by its
    /// CSINode's per-driver counts.
    fn limits(&self, node: &NodeInfo) -> HashMap<String, i64> {
        let mut limits: HashMap<String, i64> = node
            .allocatable
            .scalar
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(CSI_ATTACH_LIMIT_PREFIX)
                    .map(|d| (d.to_string(), *v))
            })
            .collect();
        if let Some(csi_node) = self.objects.csi_node(node.name()) {
            for d in &csi_node.spec.drivers {
                if let Some(count) = d.allocatable.as_ref().and_then(|a| a.count) {
                    limits.insert(d.name.clone(), i64::from(count));
                }
            }
        }
        limits
    }
}

impl Plugin for NodeVolumeLimits {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodeVolumeLimits {
    /// Only Pods with claims (or generic ephemeral volumes) are checked.
    fn pre_filter(
        &self,
        _state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let uses = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some());
        if uses {
            (None, Status::success())
        } else {
            (None, Status::skip())
        }
    }
}

impl FilterPlugin for NodeVolumeLimits {
    fn filter(&self, _state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        let mut new_volumes = HashMap::new();
        match self.attachable(pod, true, &mut new_volumes) {
            Ok(()) => {}
            Err(CountError::ClaimNotFound(e)) => return Status::unresolvable(e),
            Err(CountError::Other(e)) => return Status::error(e),
        }
        if new_volumes.is_empty() {
            return Status::success();
        }
        let limits = self.limits(node);
        if limits.is_empty() {
            return Status::success();
        }
        let mut attached = HashMap::new();
        for p in &node.pods {
            if let Err(CountError::Other(e) | CountError::ClaimNotFound(e)) =
                self.attachable(&p.pod, false, &mut attached)
            {
                return Status::error(e);
            }
        }
        let mut attached_count: HashMap<&str, i64> = HashMap::new();
        for (unique, driver) in &attached {
            // A volume already used on the node is not attached again.
            new_volumes.remove(unique);
            *attached_count.entry(driver).or_default() += 1;
        }
        let mut new_count: HashMap<&str, i64> = HashMap::new();
        for driver in new_volumes.values() {
            *new_count.entry(driver).or_default() += 1;
        }
        for (driver, count) in new_count {
            if let Some(max) = limits.get(driver) {
                if attached_count.get(driver).copied().unwrap_or(0) + count > *max {
                    return Status::unschedulable(ERR_REASON_MAX_VOLUME_COUNT_EXCEEDED);
                }
            }
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    //! Upstream's csi_test.go cases, restated: volumes of one and of two drivers against the
    //! CSINode's counts, a volume shared with a Pod already on the node counted once, unbound
    //! claims counted as their class's provisioner's, a missing claim, no limits.

    use super::*;
    use crate::scheduler::framework::{Code, PodInfo, StaticObjects};
    use serde_json::json;

    fn objects() -> StaticObjects {
        let pv = |name: &str, driver: &str| {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name},
                    "spec": {"csi": {"driver": driver, "volumeHandle": name}}}))
                .unwrap(),
            )
        };
        let pvc = |name: &str, volume: Option<&str>, class: Option<&str>| {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                    "spec": {"volumeName": volume, "storageClassName": class}}))
                .unwrap(),
            )
        };
        StaticObjects {
            persistent_volumes: vec![
                pv("ebs-1", "ebs.csi.aws.com"),
                pv("ebs-2", "ebs.csi.aws.com"),
                pv("ebs-3", "ebs.csi.aws.com"),
                pv("gce-1", "pd.csi.storage.gke.io"),
            ],
            persistent_volume_claims: vec![
                pvc("c-ebs-1", Some("ebs-1"), None),
                pvc("c-ebs-2", Some("ebs-2"), None),
                pvc("c-ebs-3", Some("ebs-3"), None),
                pvc("c-gce-1", Some("gce-1"), None),
                pvc("c-unbound-ebs", None, Some("ebs-sc")),
                pvc("c-unbound-noclass", None, None),
                pvc("c-missing-pv", Some("nope"), Some("ebs-sc")),
            ],
            storage_classes: vec![Arc::new(
                serde_json::from_value(
                    json!({"metadata": {"name": "ebs-sc"}, "provisioner": "ebs.csi.aws.com"}),
                )
                .unwrap(),
            )],
            csi_nodes: vec![Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"drivers": [
                    {"name": "ebs.csi.aws.com", "nodeID": "n", "allocatable": {"count": 2}},
                    {"name": "pd.csi.storage.gke.io", "nodeID": "n"}
                ]}}))
                .unwrap(),
            )],
            ..StaticObjects::default()
        }
    }

    fn pod(name: &str, claims: &[&str]) -> Pod {
        let vols: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [], "volumes": vols}}),
        )
        .unwrap()
    }

    fn run(objects: StaticObjects, new: &[&str], existing: &[&[&str]]) -> (Code, Vec<String>) {
        let pl = NodeVolumeLimits::new(Arc::new(objects));
        let mut node = NodeInfo::new(Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap(),
        ));
        for (i, claims) in existing.iter().enumerate() {
            node.add_pod(PodInfo::new(Arc::new(pod(&format!("e{i}"), claims))));
        }
        let p = pod("new", new);
        let (_, s) = pl.pre_filter(&mut CycleState::new(), &p, &Snapshot::default());
        if s.is_skip() {
            return (s.code, s.reasons);
        }
        let s = pl.filter(&CycleState::new(), &p, &node);
        (s.code, s.reasons)
    }

    #[test]
    fn csi_volumes_against_the_csinode_counts() {
        let exceed = (
            Code::Unschedulable,
            vec![ERR_REASON_MAX_VOLUME_COUNT_EXCEEDED.to_string()],
        );
        let ok = (Code::Success, vec![]);
        type Case<'a> = (
            &'a str,
            Vec<&'a str>,
            Vec<&'a [&'a str]>,
            (Code, Vec<String>),
        );
        let cases: Vec<Case> = vec![
            (
                "two new volumes, limit 2",
                vec!["c-ebs-1", "c-ebs-2"],
                vec![],
                ok.clone(),
            ),
            (
                "three new volumes, limit 2",
                vec!["c-ebs-1", "c-ebs-2", "c-ebs-3"],
                vec![],
                exceed.clone(),
            ),
            (
                "one new after two attached",
                vec!["c-ebs-3"],
                vec![&["c-ebs-1"], &["c-ebs-2"]],
                exceed.clone(),
            ),
            (
                "the same volume as a Pod on the node: counted once",
                vec!["c-ebs-1", "c-ebs-2"],
                vec![&["c-ebs-1"]],
                ok.clone(),
            ),
            (
                "unbound claim counts as its class's driver",
                vec!["c-unbound-ebs"],
                vec![&["c-ebs-1"], &["c-ebs-2"]],
                exceed.clone(),
            ),
            (
                "volume of a claim gone: the class's driver",
                vec!["c-missing-pv"],
                vec![&["c-ebs-1", "c-ebs-2"]],
                exceed.clone(),
            ),
            (
                "unbound claim without class: not counted",
                vec!["c-unbound-noclass"],
                vec![&["c-ebs-1"], &["c-ebs-2"]],
                ok.clone(),
            ),
            (
                "a driver without a count: no limit",
                vec!["c-gce-1"],
                vec![&["c-ebs-1"], &["c-ebs-2"]],
                ok.clone(),
            ),
            ("no claims: skipped", vec![], vec![], (Code::Skip, vec![])),
            (
                "claim missing",
                vec!["c-x"],
                vec![],
                (
                    Code::UnschedulableAndUnresolvable,
                    vec![
                        "looking up PVC default/c-x: persistentvolumeclaim \"c-x\" not found"
                            .to_string(),
                    ],
                ),
            ),
        ];
        for (name, new, existing, want) in cases {
            assert_eq!(run(objects(), &new, &existing), want, "{name}");
        }
        // No CSINode: no limits.
        let mut o = objects();
        o.csi_nodes.clear();
        assert_eq!(
            run(o, &["c-ebs-1", "c-ebs-2", "c-ebs-3"], &[]),
            ok,
            "no CSINode"
        );
    }
}
