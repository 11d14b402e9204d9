//! The resourceclaim controller's decisions over cached state: which ResourceClaim each of a
//! Pod's claims names (`resourceclaim.Name`), what a Pod needs (claims made from its templates,
//! its status, reservations once scheduled) and what a claim needs (stale reservations dropped,
//! an unused allocation cleared, its finalizer removed, a generated claim of a finished Pod
//! deleted).
//!
//! Owns the decisions only; API calls, Events and the deleted-Pod memory are [`super`]'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodResourceClaim;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::runtime::cached_pod::CachedPod;

/// The annotation a generated claim carries: the Pod claim it was made for.
pub const ANN_POD_CLAIM_NAME: &str = "resource.kubernetes.io/pod-claim-name";

/// The finalizer the scheduler puts on a claim it allocates (`resourceapi.Finalizer`).
pub const FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// What a Pod claim's ResourceClaim is (`resourceclaim.Name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimName {
    /// This claim; `check_owner`: it was generated, so it must be the Pod's (`IsForPod`).
    Named { name: String, check_owner: bool },
    /// Recorded as not needed (a status entry without a claim name).
    NotNeeded,
    /// From a template, and not generated yet.
    NotCreated,
    /// Neither a claim nor a template: an API this controller does not know.
    Unsupported,
}

pub fn claim_name(pod: &CachedPod, pc: &PodResourceClaim) -> ClaimName {
    if let Some(name) = &pc.resource_claim_name {
        return ClaimName::Named {
            name: name.clone(),
            check_owner: false,
        };
    }
    if pc.resource_claim_template_name.is_none() {
        return ClaimName::Unsupported;
    }
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    match statuses.iter().find(|s| s.name == pc.name) {
        Some(s) => match &s.resource_claim_name {
            Some(name) => ClaimName::Named {
                name: name.clone(),
                check_owner: true,
            },
            None => ClaimName::NotNeeded,
        },
        None => ClaimName::NotCreated,
    }
}

/// The Pod's claims (`pod.spec.resourceClaims`).
pub fn pod_claims(pod: &CachedPod) -> &[PodResourceClaim] {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default()
}

/// The Pod that controls a claim: (name, uid) of its controller owner reference of kind Pod.
pub fn owning_pod(claim: &ResourceClaim) -> Option<(&str, &str)> {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.api_version == "v1" && o.kind == "Pod")
        .map(|o| (o.name.as_str(), o.uid.as_str()))
}

/// `IsForPod`: the claim is controlled by the Pod; the error names both.
pub fn is_for_pod(pod: &CachedPod, claim: &ResourceClaim) -> Result<(), String> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    if claim.metadata.namespace.as_deref() == Some(ns)
        && owning_pod(claim).is_some_and(|(_, u)| u == uid)
    {
        return Ok(());
    }
    Err(format!(
        "ResourceClaim {}/{} was not created for pod {}/{} (pod is not owner)",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default(),
        ns,
        pod.metadata.name.as_deref().unwrap_or_default()
    ))
}

/// Whether the claim lists the Pod (by uid) in `status.reservedFor`.
pub fn is_reserved_for(pod: &CachedPod, claim: &ResourceClaim) -> bool {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .any(|r| r.uid == uid)
}

fn allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

/// `isPodDone`: terminal, or deleted before it was scheduled.
pub fn is_pod_done(pod: &CachedPod) -> bool {
    pod.is_terminal() || (pod.metadata.deletion_timestamp.is_some() && pod.node_name().is_none())
}

/// The claim a template gives a Pod claim: named after both (`<pod>-<claim>-` and the API
/// server's five characters, both parts shortened in proportion past 57 characters), controlled
/// by the Pod, with the template's labels, its annotations and [`ANN_POD_CLAIM_NAME`].
pub fn claim_from_template(
    pod: &CachedPod,
    pc: &PodResourceClaim,
    template: &ResourceClaimTemplate,
) -> ResourceClaim {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let mut generate_name = format!("{pod_name}-{}-", pc.name);
    const MAX_BASE: usize = 57;
    if generate_name.len() > MAX_BASE {
        let len = generate_name.len();
        // Byte slicing as upstream; names are DNS labels (ASCII).
        generate_name = format!(
            "{}-{}",
            &pod_name[..pod_name.len() * MAX_BASE / len],
            &pc.name[..pc.name.len() * MAX_BASE / len]
        );
    }
    let meta = template.spec.metadata.clone().unwrap_or_default();
    let mut annotations: BTreeMap<String, String> = meta.annotations.unwrap_or_default();
    annotations.insert(ANN_POD_CLAIM_NAME.to_string(), pc.name.clone());
    ResourceClaim {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            generate_name: Some(generate_name),
            namespace: pod.metadata.namespace.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod_name,
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            annotations: Some(annotations),
            labels: meta.labels,
            ..Default::default()
        },
        spec: template.spec.spec.clone(),
        status: None,
    }
}

/// One Pod claim's step in `syncPod`.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimStep {
    /// Nothing to make.
    Ready,
    /// An orphan the controller made earlier (found by owner and annotation): record it.
    Record { claim: String },
    /// Make it from this template, then record it.
    Create { template: String },
    /// The failure the Pod's Event reports ("PodResourceClaim <name>: <this>").
    Fail(String),
}

/// `handleClaim` for one Pod claim. `claim(name)` reads the claim cache, `generated` the claims
/// the Pod controls (the cache and the controller's own recent creations).
pub fn claim_step(
    pod: &CachedPod,
    pc: &PodResourceClaim,
    claim: &dyn Fn(&str) -> Option<std::sync::Arc<ResourceClaim>>,
    generated: &[std::sync::Arc<ResourceClaim>],
) -> ClaimStep {
    match claim_name(pod, pc) {
        ClaimName::NotCreated => {}
        ClaimName::Unsupported => {
            return ClaimStep::Fail(format!(
                "checking for claim before creating it: pod \"{}/{}\", spec.resourceClaim {:?}: \
                 none of the supported fields are set",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default(),
                pc.name
            ))
        }
        ClaimName::NotNeeded => return ClaimStep::Ready,
        ClaimName::Named { name, check_owner } => {
            // Recorded in the status: made already, unless it was deleted or is not the Pod's
            // (then a new one is made).
            if let Some(c) = claim(&name) {
                if !check_owner || is_for_pod(pod, &c).is_ok() {
                    return ClaimStep::Ready;
                }
            }
        }
    }
    let Some(template) = pc.resource_claim_template_name.clone() else {
        return ClaimStep::Ready;
    };
    let orphan = generated.iter().find(|c| {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_POD_CLAIM_NAME))
            .is_some_and(|n| *n == pc.name)
    });
    match orphan {
        Some(c) => ClaimStep::Record {
            claim: c.metadata.name.clone().unwrap_or_default(),
        },
        None => ClaimStep::Create { template },
    }
}

/// The claims a scheduled Pod's use needs reserved: allocated, not reserved for it yet, and
/// (generated) the Pod's own. `Err` when a generated claim is not the Pod's.
pub fn to_reserve(
    pod: &CachedPod,
    claim: &dyn Fn(&str) -> Option<std::sync::Arc<ResourceClaim>>,
) -> Result<Vec<std::sync::Arc<ResourceClaim>>, String> {
    let mut out = Vec::new();
    for pc in pod_claims(pod) {
        let ClaimName::Named { name, check_owner } = claim_name(pod, pc) else {
            continue;
        };
        let Some(c) = claim(&name) else {
            continue;
        };
        if check_owner {
            is_for_pod(pod, &c)?;
        }
        let reserved = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .map_or(0, Vec::len);
        if allocated(&c) && !is_reserved_for(pod, &c) && reserved < RESERVED_FOR_MAX {
            out.push(c);
        }
    }
    Ok(out)
}

/// `ResourceClaimReservedForMaxSize`.
pub const RESERVED_FOR_MAX: usize = 256;

/// Whether a Pod reserved in a claim still counts (`syncClaim`: the apply layer decides it from
/// the Pods it knows deleted, the cache, and for a Pod the cache has not seen, the API server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumer {
    /// The Pod with this uid exists and is not done: kept.
    Running,
    /// Gone, replaced (another uid) or done: dropped.
    Gone,
}

/// What a claim needs once its consumers are known.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimPlan {
    /// The new `status.reservedFor` when entries are dropped.
    pub reserved_for: Option<Vec<k8s_openapi::api::resource::v1::ResourceClaimConsumerReference>>,
    /// Clear `status.allocation` (no consumer left, and the scheduler's finalizer is there).
    pub deallocate: bool,
    /// Remove [`FINALIZER`] (after the status write).
    pub remove_finalizer: bool,
    /// Delete the claim: generated for a Pod that will not run.
    pub delete: bool,
}

/// `syncClaim` over the verdicts on its Pod consumers (`consumer(name, uid)`, every one known)
/// and its owning Pod (`owner`: `Some(Some(done or replaced))` when cached, `Some(None)` when
/// not, `None` when the claim was not generated for a Pod).
pub fn claim_plan(
    claim: &ResourceClaim,
    consumer: &dyn Fn(&str, &str) -> Consumer,
    owner_finished: Option<Option<bool>>,
) -> Result<ClaimPlan, String> {
    let mut plan = ClaimPlan::default();
    let reserved: Vec<_> = claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .cloned()
        .collect();
    let mut valid = Vec::with_capacity(reserved.len());
    for r in &reserved {
        if r.api_group.as_deref().unwrap_or_default() != "" || r.resource != "pods" {
            return Err(format!("unsupported ReservedFor entry: {r:?}"));
        }
        if consumer(&r.name, &r.uid) != Consumer::Gone {
            valid.push(r.clone());
        }
    }
    let has_finalizer = claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER);
    if valid.len() < reserved.len() {
        // The last consumer gone: the allocation is released (DRA allocates anew for the next).
        plan.deallocate = valid.is_empty() && has_finalizer && allocated(claim);
        plan.remove_finalizer = has_finalizer && (plan.deallocate || !allocated(claim));
        plan.reserved_for = Some(valid.clone());
    } else if has_finalizer && claim.metadata.deletion_timestamp.is_some() && valid.is_empty() {
        plan.deallocate = allocated(claim);
        plan.remove_finalizer = true;
    }
    if valid.is_empty() && owner_finished == Some(Some(true)) {
        plan.delete = true;
    }
    Ok(plan)
}
