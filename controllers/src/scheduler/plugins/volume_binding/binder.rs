//! The volume binder's decisions, as upstream's volumebinding/binder.go and
//! component-helpers' `FindMatchingVolume`: sort a Pod's claims into bound, unbound-immediate and
//! unbound-WaitForFirstConsumer ([`pod_volume_claims`]), and per node whether the bound volumes
//! reach it and every delayed claim finds a volume or can be provisioned there
//! ([`find_pod_volumes`]).
//!
//! Owns pure functions over the objects the [`AssumeCache`](super::assume_cache::AssumeCache)
//! shows (informer objects with this scheduler's assumed bindings laid over them); no API calls.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};

use super::assume_cache::AssumeCache;
use crate::helpers::quantity::parse_value;
use crate::helpers::selector::Selector;
use crate::scheduler::plugins::volume_util::{
    self as vu, claim_class, claim_volume_name, has_annotation, volume_bound_to_claim,
    volume_class, volume_fits_node_labels, ANN_BIND_COMPLETED, NO_PROVISIONER,
};

/// Filter reasons, word for word upstream's ConflictReasons.
pub const ERR_REASON_BIND_CONFLICT: &str =
    "node(s) didn't find available persistent volumes to bind";
pub const ERR_REASON_NODE_CONFLICT: &str = "node(s) didn't match PersistentVolume's node affinity";
pub const ERR_REASON_PV_NOT_EXIST: &str =
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";

/// A Pod's claims sorted as the binder needs them (upstream's PodVolumeClaims).
#[derive(Debug, Clone, Default)]
pub struct PodVolumeClaims {
    pub bound: Vec<Arc<PersistentVolumeClaim>>,
    pub unbound_immediate: Vec<Arc<PersistentVolumeClaim>>,
    pub unbound_delay_binding: Vec<Arc<PersistentVolumeClaim>>,
    /// The volumes of each class a delayed claim asks for.
    pub volumes_by_class: HashMap<String, Vec<Arc<PersistentVolume>>>,
}

/// A volume chosen for a claim: `pv` is the volume as it will be written (claimRef set) once
/// assumed.
#[derive(Debug, Clone)]
pub struct Binding {
    pub pv: Arc<PersistentVolume>,
    pub pvc: Arc<PersistentVolumeClaim>,
}

/// What binding the Pod's volumes on one node takes (upstream's PodVolumes).
#[derive(Debug, Clone, Default)]
pub struct PodVolumes {
    pub static_bindings: Vec<Binding>,
    /// Claims to provision: annotated with the node (`volume.kubernetes.io/selected-node`).
    pub dynamic_provisions: Vec<Arc<PersistentVolumeClaim>>,
}

/// `isPVCFullyBound`: the claim names a volume and its binding is complete.
pub fn claim_fully_bound(pvc: &PersistentVolumeClaim) -> bool {
    !claim_volume_name(pvc).is_empty() && has_annotation(&pvc.metadata, ANN_BIND_COMPLETED)
}

/// `IsDelayBindingMode`: the claim's class exists and is WaitForFirstConsumer (no class, or a
/// class not found, is immediate binding; a class without a mode is an error).
pub fn delay_binding(pvc: &PersistentVolumeClaim, cache: &AssumeCache) -> Result<bool, String> {
    let class = claim_class(pvc);
    if class.is_empty() {
        return Ok(false);
    }
    let Some(sc) = cache.objects().storage_class(class) else {
        return Ok(false);
    };
    match sc.volume_binding_mode.as_deref() {
        None => Err(format!(
            "VolumeBindingMode not set for StorageClass {class:?}"
        )),
        Some(m) => Ok(m == "WaitForFirstConsumer"),
    }
}

/// `GetPodVolumeClaims`: the Pod's claims (from the assume cache), sorted.
pub fn pod_volume_claims(pod: &Pod, cache: &AssumeCache) -> Result<PodVolumeClaims, String> {
    let ns = vu::ns(&pod.metadata);
    let mut out = PodVolumeClaims::default();
    for c in vu::pod_claims(pod) {
        let Some(pvc) = cache.get_pvc(ns, &c.name) else {
            return Err(format!(
                "error getting PVC \"{ns}/{}\": could not find v1.PersistentVolumeClaim \"{ns}/{}\"",
                c.name, c.name
            ));
        };
        if claim_fully_bound(&pvc) {
            out.bound.push(pvc);
        } else if delay_binding(&pvc, cache)? && claim_volume_name(&pvc).is_empty() {
            out.unbound_delay_binding.push(pvc);
        } else {
            // A claim pre-bound to a volume counts as immediate: the PV controller binds it.
            out.unbound_immediate.push(pvc);
        }
    }
    for pvc in &out.unbound_delay_binding {
        let class = claim_class(pvc).to_string();
        if let std::collections::hash_map::Entry::Vacant(e) = out.volumes_by_class.entry(class) {
            let pvs = cache.list_pvs(e.key());
            e.insert(pvs);
        }
    }
    Ok(out)
}

/// `CheckVolumeModeMismatches`: Filesystem unless said otherwise, on both sides.
fn volume_mode_mismatch(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let c = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let v = pv
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    c != v
}

/// `CheckAccessModes`: every mode the claim asks for is one the volume has.
fn access_modes_fit(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let have: HashSet<&str> = pv
        .spec
        .iter()
        .flat_map(|s| s.access_modes.iter().flatten())
        .map(String::as_str)
        .collect();
    pvc.spec
        .iter()
        .flat_map(|s| s.access_modes.iter().flatten())
        .all(|m| have.contains(m.as_str()))
}

/// The claim's storage request in bytes (0 when none).
pub fn requested_storage(pvc: &PersistentVolumeClaim) -> i64 {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| parse_value(&q.0))
        .unwrap_or(0)
}

fn capacity(pv: &PersistentVolume) -> i64 {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| parse_value(&q.0))
        .unwrap_or(0)
}

/// `FindMatchingVolume` on the scheduler's path (a node given, delayed binding): a volume
/// pre-bound to the claim if there is one (None when it does not reach the node), otherwise the
/// smallest Available volume of the claim's class, volume attributes class, volume mode and
/// access modes, big enough, matching the claim's selector and reaching the node, not excluded
/// (chosen for another claim of the Pod) and not bound or being deleted.
pub fn find_matching_volume(
    pvc: &PersistentVolumeClaim,
    volumes: &[Arc<PersistentVolume>],
    node: &Node,
    excluded: &HashSet<String>,
) -> Result<Option<Arc<PersistentVolume>>, String> {
    let requested = requested_storage(pvc);
    let class = claim_class(pvc);
    let vac = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref())
        .unwrap_or_default();
    let selector = match pvc.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        None => None,
        Some(sel) => Some(Selector::parse(Some(sel)).map_err(|e| {
            format!(
                "error creating internal label selector for claim: {}/{}: {e}",
                vu::ns(&pvc.metadata),
                vu::name(&pvc.metadata)
            )
        })?),
    };
    let mut smallest: Option<(&Arc<PersistentVolume>, i64)> = None;
    for pv in volumes {
        let pv_name = vu::name(&pv.metadata);
        if excluded.contains(pv_name) {
            continue;
        }
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        if claim_ref.is_some() && !volume_bound_to_claim(pv, pvc) {
            continue;
        }
        let qty = capacity(pv);
        if qty < requested {
            continue;
        }
        if volume_mode_mismatch(pvc, pv) {
            continue;
        }
        if pv.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let affinity_ok = volume_fits_node_labels(pv, node.metadata.labels.as_ref());
        if volume_bound_to_claim(pv, pvc) {
            return Ok(affinity_ok.then(|| pv.clone()));
        }
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Available") {
            continue;
        }
        if let Some(sel) = &selector {
            if !sel.matches(pv.metadata.labels.as_ref()) {
                continue;
            }
        }
        if volume_class(pv) != class {
            continue;
        }
        let pv_vac = pv
            .spec
            .as_ref()
            .and_then(|s| s.volume_attributes_class_name.as_deref())
            .unwrap_or_default();
        if pv_vac != vac {
            continue;
        }
        if !affinity_ok || !access_modes_fit(pvc, pv) {
            continue;
        }
        if smallest.is_none_or(|(_, q)| q > qty) {
            smallest = Some((pv, qty));
        }
    }
    Ok(smallest.map(|(pv, _)| pv.clone()))
}

/// `MatchTopologySelectorTerms`: no terms match every node; otherwise some term's every
/// expression has the node's label value among its values.
fn topology_fits(
    terms: Option<&Vec<k8s_openapi::api::core::v1::TopologySelectorTerm>>,
    node: &Node,
) -> bool {
    let Some(terms) = terms.filter(|t| !t.is_empty()) else {
        return true;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    terms.iter().any(|t| {
        t.match_label_expressions.iter().flatten().all(|e| {
            labels
                .get(&e.key)
                .is_some_and(|v| e.values.iter().any(|x| x == v))
        })
    })
}

/// Why a node does not do for the Pod's volumes (empty: it does), and what binding them there
/// takes. `Err` is an internal error (the cycle fails), as upstream's `FindPodVolumes`.
pub fn find_pod_volumes(
    claims: &PodVolumeClaims,
    node: &Node,
    cache: &AssumeCache,
) -> Result<(PodVolumes, Vec<&'static str>), String> {
    let mut out = PodVolumes::default();
    let mut bound_ok = true;
    let mut unbound_ok = true;
    let mut pvs_found = true;
    let reasons = |bound_ok: bool, unbound_ok: bool, pvs_found: bool| {
        let mut r = Vec::new();
        if !bound_ok {
            r.push(ERR_REASON_NODE_CONFLICT);
        }
        if !unbound_ok {
            r.push(ERR_REASON_BIND_CONFLICT);
        }
        if !pvs_found {
            r.push(ERR_REASON_PV_NOT_EXIST);
        }
        r
    };
    for pvc in &claims.bound {
        match cache.get_pv(claim_volume_name(pvc)) {
            None => {
                pvs_found = false;
                break;
            }
            Some(pv) => {
                if !volume_fits_node_labels(&pv, node.metadata.labels.as_ref()) {
                    bound_ok = false;
                    break;
                }
            }
        }
    }
    if claims.unbound_delay_binding.is_empty() {
        return Ok((out, reasons(bound_ok, unbound_ok, pvs_found)));
    }
    let node_name = vu::name(&node.metadata);
    let mut to_match = Vec::new();
    let mut to_provision = Vec::new();
    for pvc in &claims.unbound_delay_binding {
        match vu::selected_node(pvc) {
            Some(sel) if sel != node_name => {
                return Ok((out, reasons(bound_ok, false, pvs_found)));
            }
            Some(_) => to_provision.push(pvc.clone()),
            None => to_match.push(pvc.clone()),
        }
    }
    if !to_match.is_empty() {
        // Smallest requests first, so each gets the smallest volume that fits.
        to_match.sort_by_key(|c| requested_storage(c));
        let mut chosen = HashSet::new();
        for pvc in to_match {
            let class = claim_class(&pvc);
            let pvs = claims
                .volumes_by_class
                .get(class)
                .map(Vec::as_slice)
                .unwrap_or_default();
            match find_matching_volume(&pvc, pvs, node, &chosen)? {
                Some(pv) => {
                    chosen.insert(vu::name(&pv.metadata).to_string());
                    out.static_bindings.push(Binding { pv, pvc });
                }
                None => {
                    unbound_ok = false;
                    to_provision.push(pvc);
                }
            }
        }
    }
    if !to_provision.is_empty() {
        // checkVolumeProvisions: it stops at the first claim that cannot be provisioned here
        // and reports "unbound not satisfied" alone for it.
        let mut provisions = Vec::new();
        let mut provision_ok = true;
        for pvc in &to_provision {
            let class = claim_class(pvc);
            if class.is_empty() {
                return Err(format!(
                    "no class for claim \"{}/{}\"",
                    vu::ns(&pvc.metadata),
                    vu::name(&pvc.metadata)
                ));
            }
            let Some(sc) = cache.objects().storage_class(class) else {
                return Err(format!("failed to find storage class {class:?}"));
            };
            if sc.provisioner.is_empty()
                || sc.provisioner == NO_PROVISIONER
                || !topology_fits(sc.allowed_topologies.as_ref(), node)
            {
                provision_ok = false;
                break;
            }
            provisions.push(pvc.clone());
        }
        unbound_ok = provision_ok;
        if provision_ok {
            out.dynamic_provisions = provisions;
        }
    }
    Ok((out, reasons(bound_ok, unbound_ok, pvs_found)))
}

/// `GetBindVolumeToClaim`: the volume with its claimRef pointing at the claim, annotated
/// bound-by-controller when the user had not pre-bound it.
pub fn bind_volume_to_claim(
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
) -> PersistentVolume {
    let mut out = pv.clone();
    let pre_bound = volume_bound_to_claim(pv, pvc);
    let spec = out.spec.get_or_insert_with(Default::default);
    let same = spec.claim_ref.as_ref().is_some_and(|r| {
        r.name == pvc.metadata.name
            && r.namespace == pvc.metadata.namespace
            && r.uid == pvc.metadata.uid
    });
    if !same {
        spec.claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: pvc.metadata.name.clone(),
            namespace: pvc.metadata.namespace.clone(),
            uid: pvc.metadata.uid.clone(),
            resource_version: pvc.metadata.resource_version.clone(),
            field_path: None,
        });
    }
    if !pre_bound {
        out.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .entry(vu::ANN_BOUND_BY_CONTROLLER.to_string())
            .or_insert_with(|| "yes".to_string());
    }
    out
}
