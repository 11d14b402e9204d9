//! The ReplicaSet plan: from a ReplicaSet and the Pods in its cache, what one sync does
//! (kube-controller-manager v1.34's `manageReplicas`, `calculateStatus`,
//! `updateReplicaSetStatus`'s short-cut and the minReadySeconds requeue), and the Pod a creation
//! posts (`GetPodFromTemplate`). Pure functions only; the apply layer lives in `super`.
//!
//! The plan reads a `ReplicaSet`; a ReplicationController is planned as the ReplicaSet it
//! converts to (`super::replication`), as upstream runs one controller over both. What differs
//! is the [`Kind`] the functions that name the object or its Pods' owner take: the kind the
//! controller reference of its Pods carries, and the name in errors.
//!
//! v1.34 defaults followed: `status.terminatingReplicas` is not written (the
//! DeploymentReplicaSetTerminatingReplicas gate is alpha, off); the scale-down order applies
//! pod-deletion-cost and the logarithmic comparison (`runtime::pods`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::error::{Error, Result};
use crate::helpers::selector::Selector;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::claim::OwnerInfo;
use crate::runtime::pod_control;
use crate::runtime::pods;

/// Creations or deletions one sync may issue (upstream's `BurstReplicas`, CTL-9).
pub const BURST_REPLICAS: usize = 500;

/// The condition type set when creating or deleting Pods failed.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// `ReplicaSet ns/name`, for errors and logs (typed, so an `Arc<ReplicaSet>` derefs into it).
pub fn object_name(rs: &ReplicaSet) -> String {
    REPLICA_SET.object_name(rs)
}

/// The kind of object a plan manages Pods for (upstream's `controllerKind`): a ReplicaSet, or a
/// ReplicationController read as a ReplicaSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The API version its Pods' controller references carry (`apps/v1`, `v1`).
    pub api_version: &'static str,
    /// Its kind (`ReplicaSet`, `ReplicationController`).
    pub kind: &'static str,
}

/// ReplicaSets, `apps/v1`.
pub const REPLICA_SET: Kind = Kind {
    api_version: "apps/v1",
    kind: "ReplicaSet",
};

impl Kind {
    /// `Kind ns/name` of the object `rs` stands for, for errors and logs.
    pub fn object_name(self, rs: &ReplicaSet) -> String {
        format!(
            "{} {}/{}",
            self.kind,
            rs.metadata.namespace.as_deref().unwrap_or_default(),
            rs.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// The object `rs` stands for, as the owner of its Pods.
    pub fn owner(self, rs: &ReplicaSet) -> OwnerInfo {
        OwnerInfo {
            api_version: self.api_version.to_string(),
            kind: self.kind.to_string(),
            name: rs.metadata.name.clone().unwrap_or_default(),
            uid: rs.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

/// `spec.replicas` (the API server defaults a missing one to 1).
pub fn desired_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// `spec.minReadySeconds` (0 when unset).
pub fn min_ready_seconds(rs: &ReplicaSet) -> i32 {
    rs.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

/// The ReplicaSet's selector; an invalid one is an error naming the field (upstream then skips
/// the ReplicaSet until it changes).
pub fn selector(kind: Kind, rs: &ReplicaSet) -> Result<Selector> {
    Selector::parse(rs.spec.as_ref().map(|s| &s.selector)).map_err(|reason| Error::Invalid {
        object: kind.object_name(rs),
        reason: format!("spec.{reason}"),
    })
}

/// The Pods a sync considers (upstream's `FilterPodsByOwner` with orphans): those whose
/// controller reference is this object (`kind`, name and uid) and those without a controller,
/// in the ReplicaSet's namespace. Sorted by name so that Pods the deletion order cannot tell apart
/// are taken in a reproducible order.
pub fn candidates(
    kind: Kind,
    rs: &ReplicaSet,
    pods: impl IntoIterator<Item = Arc<CachedPod>>,
) -> Vec<Arc<CachedPod>> {
    let (ns, name, uid) = (
        rs.namespace().unwrap_or_default(),
        rs.name_any(),
        rs.uid().unwrap_or_default(),
    );
    let mut out: Vec<Arc<CachedPod>> = pods
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or_default() == ns)
        .filter(|p| match controller_of(p.as_ref()) {
            None => true,
            Some(r) => r.kind == kind.kind && r.name == name && r.uid == uid,
        })
        .collect();
    out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out.dedup_by(|a, b| a.metadata.name == b.metadata.name);
    out
}

/// The controller ownerReference of an object (`metav1.GetControllerOf`).
pub use crate::helpers::meta::controller_of_object as controller_of;

/// The Pods related to a ReplicaSet for ranking (RS-7, upstream's `getIndirectlyRelatedPods`):
/// every Pod matched by the selector of any ReplicaSet with the same controller (`siblings`, the
/// ReplicaSet itself included), each Pod once. `pods_for` gives the Pods a sibling's selector
/// can match (at least those of its namespace that it matches); siblings with an invalid selector
/// match nothing.
pub fn related_pods(
    kind: Kind,
    siblings: &[Arc<ReplicaSet>],
    pods_for: impl Fn(&ReplicaSet) -> Vec<Arc<CachedPod>>,
) -> Vec<Arc<CachedPod>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for rs in siblings {
        let Ok(sel) = selector(kind, rs) else {
            continue;
        };
        let ns = rs.namespace().unwrap_or_default();
        for p in pods_for(rs) {
            if p.metadata.namespace.as_deref().unwrap_or_default() != ns
                || !sel.matches(p.metadata.labels.as_ref())
            {
                continue;
            }
            if seen.insert(p.metadata.uid.clone().unwrap_or_default()) {
                out.push(p);
            }
        }
    }
    out
}

/// The value a ReplicaSet's selector requires for `label` in matchLabels, if any (Deployments'
/// ReplicaSets require their `pod-template-hash`): lets the caller narrow the Pods to match.
pub fn selector_label<'a>(rs: &'a ReplicaSet, label: &str) -> Option<&'a str> {
    rs.spec
        .as_ref()?
        .selector
        .match_labels
        .as_ref()?
        .get(label)
        .map(String::as_str)
}

/// What `manageReplicas` does in one sync.
#[derive(Debug, Clone, PartialEq)]
pub enum Manage {
    /// Nothing: the count is right, expectations are pending, or the ReplicaSet is being deleted.
    Nothing,
    /// Create this many Pods from the template (expect them first).
    Create(usize),
    /// Delete these Pods (expect their deletions first).
    Delete(Vec<Arc<CachedPod>>),
}

/// The replica management step (RS-3 step 7, RS-4, CTL-9): only when expectations are satisfied
/// and the ReplicaSet has no deletionTimestamp; too few active Pods creates
/// `min(missing, burst)`, too many deletes `min(extra, burst)` chosen by the scale-down ranking
/// against `related` (RS-5..RS-7) at `now`.
pub fn manage(
    rs: &ReplicaSet,
    active: &[Arc<CachedPod>],
    related: &[Arc<CachedPod>],
    expectations_satisfied: bool,
    burst: usize,
    now: Timestamp,
) -> Manage {
    if !expectations_satisfied || rs.metadata.deletion_timestamp.is_some() {
        return Manage::Nothing;
    }
    let diff = active.len() as i64 - i64::from(desired_replicas(rs));
    if diff < 0 {
        Manage::Create((diff.unsigned_abs() as usize).min(burst))
    } else if diff > 0 {
        let n = (diff as usize).min(burst);
        Manage::Delete(pods::get_pods_to_delete(active.to_vec(), related, n, now))
    } else {
        Manage::Nothing
    }
}

/// The status a sync writes (upstream's `calculateStatus`): replicas = active claimed Pods;
/// fullyLabeledReplicas = those carrying every template label; readyReplicas; availableReplicas
/// (ready for minReadySeconds at `now`). A manage error sets a ReplicaFailure condition
/// (reason FailedCreate or FailedDelete by the sign of the difference, message = the error) when
/// there is none yet; a sync without error removes it. terminatingReplicas stays unset (v1.34's
/// gate is off). observedGeneration is left as it was: [`status_to_write`] sets it.
pub fn calculate_status(
    rs: &ReplicaSet,
    active: &[Arc<CachedPod>],
    manage_error: Option<&str>,
    now: Timestamp,
) -> ReplicaSetStatus {
    let mut status = rs.status.clone().unwrap_or_default();
    let template_labels = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let template = Selector::from_labels(&template_labels);
    let min_ready = min_ready_seconds(rs);
    let (mut fully_labeled, mut ready, mut available) = (0, 0, 0);
    for p in active {
        if template.matches(p.metadata.labels.as_ref()) {
            fully_labeled += 1;
        }
        if pods::is_pod_ready(p) {
            ready += 1;
            if pods::is_pod_available(p, min_ready, now) {
                available += 1;
            }
        }
    }
    let has_failure = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == REPLICA_FAILURE);
    match manage_error {
        Some(msg) if !has_failure => {
            let diff = active.len() as i64 - i64::from(desired_replicas(rs));
            let reason = match diff {
                d if d < 0 => Some("FailedCreate".to_string()),
                d if d > 0 => Some("FailedDelete".to_string()),
                // Upstream leaves the reason empty when the count matches again.
                _ => None,
            };
            status
                .conditions
                .get_or_insert_with(Vec::new)
                .push(ReplicaSetCondition {
                    type_: REPLICA_FAILURE.into(),
                    status: "True".into(),
                    reason,
                    message: Some(msg.to_string()),
                    last_transition_time: Some(Time(now)),
                });
        }
        None if has_failure => {
            let rest: Vec<_> = status
                .conditions
                .take()
                .into_iter()
                .flatten()
                .filter(|c| c.type_ != REPLICA_FAILURE)
                .collect();
            status.conditions = (!rest.is_empty()).then_some(rest);
        }
        _ => {}
    }
    status.replicas = active.len() as i32;
    status.fully_labeled_replicas = Some(fully_labeled);
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status.terminating_replicas = None;
    status
}

fn empty_is_none<T>(v: Option<&Vec<T>>) -> Option<&Vec<T>> {
    v.filter(|v| !v.is_empty())
}

/// Whether `new` must be written (upstream's steady-state short-cut): a count, the conditions,
/// or observedGeneration (behind metadata.generation) differ.
pub fn needs_status_update(rs: &ReplicaSet, new: &ReplicaSetStatus) -> bool {
    let old = rs.status.clone().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0);
    old.replicas != new.replicas
        || n(old.fully_labeled_replicas) != n(new.fully_labeled_replicas)
        || n(old.ready_replicas) != n(new.ready_replicas)
        || n(old.available_replicas) != n(new.available_replicas)
        || old.terminating_replicas != new.terminating_replicas
        || rs.metadata.generation.unwrap_or(0) != old.observed_generation.unwrap_or(0)
        || empty_is_none(old.conditions.as_ref()) != empty_is_none(new.conditions.as_ref())
}

/// `new` with observedGeneration set to the generation this sync acted on.
pub fn status_to_write(rs: &ReplicaSet, mut new: ReplicaSetStatus) -> ReplicaSetStatus {
    new.observed_generation = Some(rs.metadata.generation.unwrap_or(0));
    new
}

/// The status a sync writes, if any: upstream's `updateReplicaSetStatus` short-cut (nothing when
/// nothing changed, see [`needs_status_update`]) with observedGeneration set
/// ([`status_to_write`]), and nothing either while the sync started with this controller's own
/// creations or deletions still on their way through the watch (expectations pending, CTL-8).
/// Such a status is a point in the middle of a burst: the observation that completes the
/// expectations queues the ReplicaSet again, and that sync writes the status once. Upstream
/// writes in every sync, but a burst's sync there lasts until its last request returned (its
/// client is rate limited, 20 QPS by default), by which time the watch has shown most of the
/// burst: it writes about once per burst (1,200 -> 0: four writes). kpr's sync returns sooner,
/// and without this every sync between two observed Pods wrote the count of the moment (46
/// writes).
pub fn status_write(
    rs: &ReplicaSet,
    computed: ReplicaSetStatus,
    expectations_satisfied: bool,
) -> Option<ReplicaSetStatus> {
    if !expectations_satisfied || !needs_status_update(rs, &computed) {
        return None;
    }
    Some(status_to_write(rs, computed))
}

/// When to sync again so that availableReplicas catches up with minReadySeconds (upstream's
/// last line of defence after a successful sync): only with minReadySeconds > 0 and
/// readyReplicas != availableReplicas in the written status; then when the next ready Pod turns
/// available (evaluated at `evaluated_at`, the time the status was computed, and recomputed at
/// `now`), else after minReadySeconds.
pub fn requeue_after(
    written: &ReplicaSet,
    active: &[Arc<CachedPod>],
    evaluated_at: Timestamp,
    now: Timestamp,
) -> Option<Duration> {
    let min_ready = min_ready_seconds(written);
    let status = written.status.clone().unwrap_or_default();
    if min_ready <= 0
        || status.ready_replicas.unwrap_or(0) == status.available_replicas.unwrap_or(0)
    {
        return None;
    }
    pods::next_availability_check(active, min_ready, evaluated_at, now)
        .or(Some(Duration::from_secs(min_ready as u64)))
}

/// The Pod one creation posts (upstream's `GetPodFromTemplate`): the template's labels,
/// annotations, finalizers and spec, `generateName: <rs>-` (the bare name when the dash would
/// make it too long), and the controller ownerReference (controller and blockOwnerDeletion true).
/// A template without a spec or without labels is an error naming the field (upstream refuses to
/// create Pods without labels).
pub fn pod_from_template(kind: Kind, rs: &ReplicaSet) -> Result<Pod> {
    let invalid = |reason: &str| Error::Invalid {
        object: kind.object_name(rs),
        reason: reason.to_string(),
    };
    let template = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .ok_or_else(|| invalid("spec.template is missing"))?;
    let meta = template.metadata.as_ref();
    if meta
        .and_then(|m| m.labels.as_ref())
        .is_none_or(|l| l.is_empty())
    {
        return Err(invalid(
            "spec.template.metadata.labels is empty: Pods without labels are not created",
        ));
    }
    if template.spec.is_none() {
        return Err(invalid("spec.template.spec is missing"));
    }
    Ok(pod_control::pod_from_template(template, &kind.owner(rs)))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
