//! VolumeZone, as kube-scheduler v1.34's volumezone plugin: a Pod whose bound volumes carry zone
//! or region labels (`topology.kubernetes.io/zone|region` and the beta
//! `failure-domain.beta.kubernetes.io/zone|region`, values joined by `__`) fits only nodes whose
//! label for that key (or, for a beta key, the GA one) is one of them. A node with none of the
//! four labels fits any volume. Unbound WaitForFirstConsumer claims are skipped (VolumeBinding
//! decides them); an unbound immediate claim is unresolvable here too.
//!
//! Owns only this plugin's PreFilter state; pure over the claims, volumes and classes it reads.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::volume_util::{self as vu, claim_class, claim_volume_name};
use crate::scheduler::framework::{
    ClusterObjects, CycleState, FilterPlugin, NodeInfo, Plugin, PreFilterPlugin, PreFilterResult,
    Snapshot, Status,
};

pub const NAME: &str = "VolumeZone";
const STATE_KEY: &str = "PreFilterVolumeZone";
pub const ERR_REASON_CONFLICT: &str = "node(s) had no available volume zone";

const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const ZONE: &str = "topology.kubernetes.io/zone";
const REGION: &str = "topology.kubernetes.io/region";
/// Upstream's topologyLabels, in its order.
const TOPOLOGY_LABELS: [&str; 4] = [BETA_ZONE, BETA_REGION, ZONE, REGION];

/// One volume's constraint: the node's label `key` must be one of `values`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvTopology {
    pub pv: String,
    pub key: &'static str,
    pub values: BTreeSet<String>,
}

pub struct VolumeZone {
    objects: Arc<dyn ClusterObjects>,
}

impl VolumeZone {
    pub fn new(objects: Arc<dyn ClusterObjects>) -> VolumeZone {
        VolumeZone { objects }
    }

    /// `getPVbyPod`: the zone constraints of the Pod's bound volumes.
    fn pv_topologies(&self, pod: &Pod) -> Result<Vec<PvTopology>, Status> {
        let ns = vu::ns(&pod.metadata);
        let mut out = Vec::new();
        for c in vu::pod_claims(pod) {
            if c.name.is_empty() {
                return Err(Status::unresolvable("PersistentVolumeClaim had no name"));
            }
            let Some(pvc) = self.objects.persistent_volume_claim(ns, &c.name) else {
                return Err(Status::unresolvable(format!(
                    "persistentvolumeclaim {:?} not found",
                    c.name
                )));
            };
            let pv_name = claim_volume_name(&pvc);
            if pv_name.is_empty() {
                let class = claim_class(&pvc);
                if class.is_empty() {
                    return Err(Status::unresolvable(
                        "PersistentVolumeClaim had no pv name and storageClass name",
                    ));
                }
                let Some(sc) = self.objects.storage_class(class) else {
                    return Err(Status::unresolvable(format!(
                        "storageclass.storage.k8s.io {class:?} not found"
                    )));
                };
                match sc.volume_binding_mode.as_deref() {
                    None => {
                        return Err(Status::unresolvable(format!(
                            "VolumeBindingMode not set for StorageClass {class:?}"
                        )))
                    }
                    Some("WaitForFirstConsumer") => continue,
                    Some(_) => return Err(Status::unresolvable("PersistentVolume had no name")),
                }
            }
            let Some(pv) = self.objects.persistent_volume(pv_name) else {
                return Err(Status::unresolvable(format!(
                    "persistentvolume {pv_name:?} not found"
                )));
            };
            let labels = pv.metadata.labels.clone().unwrap_or_default();
            for key in TOPOLOGY_LABELS {
                if let Some(v) = labels.get(key) {
                    out.push(PvTopology {
                        pv: pv_name.to_string(),
                        key,
                        values: zones_to_set(v),
                    });
                }
            }
        }
        Ok(out)
    }
}

/// `LabelZonesToSet`: a `__`-separated list of zones.
fn zones_to_set(v: &str) -> BTreeSet<String> {
    v.split("__")
        .map(str::trim)
        .filter(|z| !z.is_empty())
        .map(String::from)
        .collect()
}

/// A beta topology key's GA counterpart (the node may carry only the GA label).
fn ga_label(key: &str) -> &str {
    match key {
        BETA_ZONE => ZONE,
        BETA_REGION => REGION,
        k => k,
    }
}

impl Plugin for VolumeZone {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for VolumeZone {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        match self.pv_topologies(pod) {
            Err(s) => (None, s),
            Ok(t) if t.is_empty() => (None, Status::skip()),
            Ok(t) => {
                state.write(STATE_KEY, t);
                (None, Status::success())
            }
        }
    }
}

impl FilterPlugin for VolumeZone {
    fn filter(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        if pod
            .spec
            .as_ref()
            .is_none_or(|s| s.volumes.as_ref().is_none_or(|v| v.is_empty()))
        {
            return Status::success();
        }
        let computed;
        let topologies = match state.read::<Vec<PvTopology>>(STATE_KEY) {
            Some(t) => t,
            None => match self.pv_topologies(pod) {
                Ok(t) => {
                    computed = t;
                    &computed
                }
                Err(s) => return s,
            },
        };
        let labels = node
            .node
            .as_ref()
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        if !TOPOLOGY_LABELS.iter().any(|k| labels.contains_key(*k)) {
            return Status::success();
        }
        for t in topologies {
            let v = labels.get(t.key).or_else(|| labels.get(ga_label(t.key)));
            if !v.is_some_and(|v| t.values.contains(v)) {
                return Status::unresolvable(ERR_REASON_CONFLICT);
            }
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    //! Upstream's volume_zone_test.go tables, restated: single-zone, multi-zone (`__`) and
    //! region labels, beta labels on the volume against GA labels on the node, nodes without
    //! topology labels, and the PreFilter errors.

    use super::*;
    use crate::scheduler::framework::{Code, StaticObjects};
    use serde_json::json;

    fn pv(
        name: &str,
        labels: serde_json::Value,
    ) -> Arc<k8s_openapi::api::core::v1::PersistentVolume> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap(),
        )
    }

    fn pvc(
        name: &str,
        volume: &str,
        class: Option<&str>,
    ) -> Arc<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
        let mut spec = json!({});
        if !volume.is_empty() {
            spec["volumeName"] = json!(volume);
        }
        if let Some(c) = class {
            spec["storageClassName"] = json!(c);
        }
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
            )
            .unwrap(),
        )
    }

    fn objects() -> StaticObjects {
        StaticObjects {
            persistent_volumes: vec![
                pv("Vol_1", json!({ZONE: "us-west1-a"})),
                pv("Vol_2", json!({REGION: "us-west1", "uselessLabel": "none"})),
                pv("Vol_3", json!({REGION: "us-west1"})),
                pv("Vol_Stable_1", json!({BETA_ZONE: "us-west1-a"})),
                pv("Vol_Multi", json!({ZONE: "us-west1-a__us-west1-b"})),
            ],
            persistent_volume_claims: vec![
                pvc("PVC_1", "Vol_1", None),
                pvc("PVC_2", "Vol_2", None),
                pvc("PVC_3", "Vol_3", None),
                pvc("PVC_Stable_1", "Vol_Stable_1", None),
                pvc("PVC_Multi", "Vol_Multi", None),
                pvc("PVC_NoSC", "", None),
                pvc("PVC_EmptySC", "", Some("")),
                pvc("PVC_WFFC", "", Some("wffc")),
                pvc("PVC_Immediate", "", Some("immediate")),
                pvc("PVC_Missing_PV", "Vol_Not_Exist", None),
            ],
            storage_classes: vec![
                Arc::new(
                    serde_json::from_value(json!({"metadata": {"name": "wffc"},
                        "provisioner": "x", "volumeBindingMode": "WaitForFirstConsumer"}))
                    .unwrap(),
                ),
                Arc::new(
                    serde_json::from_value(json!({"metadata": {"name": "immediate"},
                        "provisioner": "x", "volumeBindingMode": "Immediate"}))
                    .unwrap(),
                ),
            ],
            ..StaticObjects::default()
        }
    }

    fn pod(claims: &[&str]) -> Pod {
        let vols: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [], "volumes": vols}}))
        .unwrap()
    }

    fn node(labels: serde_json::Value) -> NodeInfo {
        NodeInfo::new(Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}})).unwrap(),
        ))
    }

    fn run(claims: &[&str], labels: serde_json::Value) -> (Code, Vec<String>) {
        let pl = VolumeZone::new(Arc::new(objects()));
        let p = pod(claims);
        let mut st = CycleState::new();
        let (_, s) = pl.pre_filter(&mut st, &p, &Snapshot::default());
        if !s.is_success() {
            return (s.code, s.reasons);
        }
        let s = pl.filter(&st, &p, &node(labels));
        (s.code, s.reasons)
    }

    #[test]
    fn zones_and_regions_of_bound_volumes_against_node_labels() {
        let conflict = (
            Code::UnschedulableAndUnresolvable,
            vec![ERR_REASON_CONFLICT.to_string()],
        );
        let ok = (Code::Success, vec![]);
        let cases = [
            (
                "node without topology labels fits",
                vec!["PVC_1"],
                json!({"a": "b"}),
                ok.clone(),
            ),
            (
                "same zone",
                vec!["PVC_1"],
                json!({ZONE: "us-west1-a"}),
                ok.clone(),
            ),
            (
                "other zone",
                vec!["PVC_1"],
                json!({ZONE: "us-west1-b"}),
                conflict.clone(),
            ),
            (
                "node has region only: the zone key is missing",
                vec!["PVC_1"],
                json!({REGION: "us-west1"}),
                conflict.clone(),
            ),
            (
                "same region",
                vec!["PVC_2"],
                json!({REGION: "us-west1"}),
                ok.clone(),
            ),
            (
                "other region",
                vec!["PVC_3"],
                json!({REGION: "us-east1"}),
                conflict.clone(),
            ),
            (
                "two volumes, both fit",
                vec!["PVC_1", "PVC_2"],
                json!({ZONE: "us-west1-a", REGION: "us-west1"}),
                ok.clone(),
            ),
            (
                "beta label on the volume, GA label on the node",
                vec!["PVC_Stable_1"],
                json!({ZONE: "us-west1-a"}),
                ok.clone(),
            ),
            (
                "beta label on both, other zone",
                vec!["PVC_Stable_1"],
                json!({BETA_ZONE: "us-west1-b"}),
                conflict.clone(),
            ),
            (
                "multi-zone volume, second zone",
                vec!["PVC_Multi"],
                json!({ZONE: "us-west1-b"}),
                ok.clone(),
            ),
            (
                "multi-zone volume, zone not listed",
                vec!["PVC_Multi"],
                json!({ZONE: "us-west1-c"}),
                conflict.clone(),
            ),
            (
                "WaitForFirstConsumer claim: skipped",
                vec!["PVC_WFFC"],
                json!({ZONE: "us-west1-c"}),
                (Code::Skip, vec![]),
            ),
        ];
        for (name, claims, labels, want) in cases {
            assert_eq!(run(&claims, labels), want, "{name}");
        }
    }

    #[test]
    fn pre_filter_errors() {
        let un = |m: &str| (Code::UnschedulableAndUnresolvable, vec![m.to_string()]);
        let cases = [
            (
                "claim missing",
                "PVC_X",
                un("persistentvolumeclaim \"PVC_X\" not found"),
            ),
            (
                "no volume, no class",
                "PVC_NoSC",
                un("PersistentVolumeClaim had no pv name and storageClass name"),
            ),
            (
                "no volume, empty class",
                "PVC_EmptySC",
                un("PersistentVolumeClaim had no pv name and storageClass name"),
            ),
            (
                "unbound immediate claim",
                "PVC_Immediate",
                un("PersistentVolume had no name"),
            ),
            (
                "volume missing",
                "PVC_Missing_PV",
                un("persistentvolume \"Vol_Not_Exist\" not found"),
            ),
        ];
        for (name, claim, want) in cases {
            assert_eq!(run(&[claim], json!({ZONE: "us-west1-a"})), want, "{name}");
        }
    }
}
