//! What the three volume plugins (VolumeBinding, VolumeZone, NodeVolumeLimits) read the same way,
//! as upstream's component-helpers storage/volume and storage/ephemeral: a Pod's claims (generic
//! ephemeral volumes through their `<pod>-<volume>` claim), the class of a claim or a volume
//! (the beta annotation first), whether a claim belongs to a Pod, whether a volume is bound to a
//! claim, and a volume's node affinity against a node's labels.
//!
//! Owns pure functions over API objects only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::helpers::nodeaffinity::match_node_selector_terms;

/// `volume.beta.kubernetes.io/storage-class`: wins over `spec.storageClassName`.
pub const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";
/// Set by the PersistentVolume controller once it has bound a claim (`AnnBindCompleted`).
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set on a volume bound by a controller rather than pre-bound by a user.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// The scheduler's choice for a claim to be provisioned (`AnnSelectedNode`).
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// A class whose volumes are never provisioned (local volumes).
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// One claim a Pod's volume uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    pub name: String,
    /// A generic ephemeral volume: the claim is `<pod>-<volume>` and must be the Pod's own.
    pub ephemeral: bool,
}

/// The claims of the Pod's volumes, in volume order (other volume kinds left out).
pub fn pod_claims(pod: &Pod) -> Vec<PodClaim> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(PodClaim {
                    name: c.claim_name.clone(),
                    ephemeral: false,
                })
            } else {
                v.ephemeral.as_ref().map(|_| PodClaim {
                    name: format!("{pod_name}-{}", v.name),
                    ephemeral: true,
                })
            }
        })
        .collect()
}

/// Upstream's `ephemeral.VolumeIsForPod`: the claim of a generic ephemeral volume must be
/// controlled by the Pod.
pub fn volume_is_for_pod(pod: &Pod, pvc: &PersistentVolumeClaim) -> Result<(), String> {
    let owned = crate::helpers::meta::controller_uid(&pvc.metadata)
        .is_some_and(|u| Some(u) == pod.metadata.uid.as_deref());
    if owned {
        Ok(())
    } else {
        Err(format!(
            "PVC {}/{} was not created for pod {}/{} (pod is not owner)",
            ns(&pvc.metadata),
            name(&pvc.metadata),
            ns(&pod.metadata),
            name(&pod.metadata)
        ))
    }
}

pub fn ns(m: &ObjectMeta) -> &str {
    m.namespace.as_deref().unwrap_or_default()
}

pub fn name(m: &ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or_default()
}

fn annotation<'a>(m: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    m.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

pub fn has_annotation(m: &ObjectMeta, key: &str) -> bool {
    annotation(m, key).is_some()
}

pub fn selected_node(pvc: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&pvc.metadata, ANN_SELECTED_NODE)
}

/// `GetPersistentVolumeClaimClass`: the beta annotation, else `spec.storageClassName`, else "".
pub fn claim_class(pvc: &PersistentVolumeClaim) -> &str {
    annotation(&pvc.metadata, BETA_STORAGE_CLASS_ANNOTATION)
        .or_else(|| {
            pvc.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .unwrap_or_default()
}

/// `GetPersistentVolumeClass`, the same for a volume.
pub fn volume_class(pv: &PersistentVolume) -> &str {
    annotation(&pv.metadata, BETA_STORAGE_CLASS_ANNOTATION)
        .or_else(|| {
            pv.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .unwrap_or_default()
}

/// The claim's `spec.volumeName` ("" when unbound).
pub fn claim_volume_name(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default()
}

/// `IsVolumeBoundToClaim`: the volume's claimRef names this claim (and its UID, when set).
pub fn volume_bound_to_claim(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.name.as_deref() == pvc.metadata.name.as_deref()
        && r.namespace.as_deref() == pvc.metadata.namespace.as_deref()
        && r.uid
            .as_deref()
            .is_none_or(|u| u.is_empty() || Some(u) == pvc.metadata.uid.as_deref())
}

/// `CheckNodeAffinity`: the volume's required node affinity against a node known by its labels
/// only (as upstream, a `matchFields` term on `metadata.name` never matches here).
pub fn volume_fits_node_labels(
    pv: &PersistentVolume,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let Some(required) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    let node = Node {
        metadata: ObjectMeta {
            labels: labels.cloned(),
            ..Default::default()
        },
        ..Default::default()
    };
    match_node_selector_terms(&node, required)
}
