//! The garbage collector's decisions, pure (upstream `attemptToDeleteItem`'s classification and
//! three-way choice, `processDeletingDependentsItem`, the orphan and finalizer patches): given
//! the latest state read from the API server and the graph, they say which request to send. They
//! own no state and send nothing; `mod.rs` reads, calls them and applies the result.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PropagationPolicy;
use serde_json::{json, Value};

use super::graph::{FINALIZER_DELETE_DEPENDENTS, FINALIZER_ORPHAN};

/// How one owner reference stands (GC-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerClass {
    /// The owner exists and is not waiting for its dependents' deletion.
    Solid,
    /// No object has the reference's coordinates (absent, or another uid under the name).
    Dangling,
    /// The owner is being deleted in the foreground (deletionTimestamp and `foregroundDeletion`).
    WaitingForDependentsDeletion,
}

/// Classifies `reference` from the owner the API server returned for its coordinates (`None`:
/// not found).
pub fn classify_owner(reference: &OwnerReference, found: Option<&ObjectMeta>) -> OwnerClass {
    let Some(owner) = found else {
        return OwnerClass::Dangling;
    };
    if owner.uid.as_deref() != Some(reference.uid.as_str()) {
        // Same name, another object: the referenced one is gone.
        return OwnerClass::Dangling;
    }
    let fg = owner
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER_DELETE_DEPENDENTS);
    if owner.deletion_timestamp.is_some() && fg {
        OwnerClass::WaitingForDependentsDeletion
    } else {
        OwnerClass::Solid
    }
}

/// A namespaced kind named without a namespace to look in: a cluster-scoped dependent naming a
/// namespaced owner (owner references carry no namespace). Never resolves by retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespacedOwnerOfClusterScoped;

/// Where to read an object of a kind with this scope, named from (or being) an object in
/// `namespace`: `Some(ns)` in that namespace, `None` cluster-wide (GC-7; upstream
/// `resourceDefaultNamespace` and its cluster-scoped-dependent check).
pub fn lookup_namespace(
    namespaced: bool,
    namespace: &str,
) -> Result<Option<&str>, NamespacedOwnerOfClusterScoped> {
    match (namespaced, namespace.is_empty()) {
        (false, _) => Ok(None),
        (true, true) => Err(NamespacedOwnerOfClusterScoped),
        (true, false) => Ok(Some(namespace)),
    }
}

/// An item's owner references sorted into the three classes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Classified {
    /// Owners that keep the item alive.
    pub solid: Vec<OwnerReference>,
    /// Owners that no longer exist.
    pub dangling: Vec<OwnerReference>,
    /// Owners deleting their dependents in the foreground.
    pub waiting: Vec<OwnerReference>,
}

impl Classified {
    /// Adds `reference` to its class.
    pub fn push(&mut self, reference: OwnerReference, class: OwnerClass) {
        match class {
            OwnerClass::Solid => self.solid.push(reference),
            OwnerClass::Dangling => self.dangling.push(reference),
            OwnerClass::WaitingForDependentsDeletion => self.waiting.push(reference),
        }
    }
}

/// What attempt-to-delete does with an item whose owners were classified (GC-3).
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// A solid owner remains and no reference needs removing: nothing to do.
    Keep,
    /// (a) A solid owner remains: remove the references to these owner uids (dangling, then
    /// waiting) so foreground owners are not stuck on this item.
    RemoveReferences(Vec<String>),
    /// (b) Some owner waits for its dependents and the item has dependents of its own: delete it
    /// in the foreground, first turning its blocking references off when one of its dependents
    /// is itself deleting dependents (a possible cycle).
    DeleteForeground {
        /// Patch `blockOwnerDeletion=false` onto the item's references first.
        unblock_first: bool,
    },
    /// (c) No solid owner: delete with the propagation the item's own finalizers imply.
    Delete(PropagationPolicy),
}

/// The propagation an item's finalizers imply: `orphan` gives Orphan, `foregroundDeletion`
/// gives Foreground, anything else Background (GC-3 (c), in that order).
pub fn propagation_for(finalizers: &[String]) -> PropagationPolicy {
    if finalizers.iter().any(|f| f == FINALIZER_ORPHAN) {
        PropagationPolicy::Orphan
    } else if finalizers.iter().any(|f| f == FINALIZER_DELETE_DEPENDENTS) {
        PropagationPolicy::Foreground
    } else {
        PropagationPolicy::Background
    }
}

/// Upstream's three-way choice. `dependents_deleting_dependents` holds, for each of the item's
/// dependents in the graph, whether it is itself deleting its dependents; `finalizers` are the
/// item's latest.
pub fn decide(
    classified: &Classified,
    dependents_deleting_dependents: &[bool],
    finalizers: &[String],
) -> Decision {
    if !classified.solid.is_empty() {
        if classified.dangling.is_empty() && classified.waiting.is_empty() {
            return Decision::Keep;
        }
        let uids = classified
            .dangling
            .iter()
            .chain(&classified.waiting)
            .map(|r| r.uid.clone())
            .collect();
        return Decision::RemoveReferences(uids);
    }
    if !classified.waiting.is_empty() && !dependents_deleting_dependents.is_empty() {
        return Decision::DeleteForeground {
            unblock_first: dependents_deleting_dependents.iter().any(|d| *d),
        };
    }
    Decision::Delete(propagation_for(finalizers))
}

/// The strategic merge patch removing the references to `owner_uids` from the object with
/// `dependent_uid` (the uid in the patch makes it fail on another object of the same name).
pub fn delete_owner_refs_strategic(dependent_uid: &str, owner_uids: &[String]) -> Value {
    let refs: Vec<Value> = owner_uids
        .iter()
        .map(|u| json!({"$patch": "delete", "uid": u}))
        .collect();
    json!({"metadata": {"ownerReferences": refs, "uid": dependent_uid}})
}

/// The JSON merge patch fallback (for resources without strategic merge, i.e. custom
/// resources): the whole remaining list, guarded by the resourceVersion it was computed from.
pub fn delete_owner_refs_merge(
    resource_version: &str,
    current: &[OwnerReference],
    owner_uids: &[String],
) -> Value {
    let remaining: Vec<&OwnerReference> = current
        .iter()
        .filter(|r| !owner_uids.contains(&r.uid))
        .collect();
    json!({"metadata": {
        "resourceVersion": resource_version,
        // An empty list is null, which removes the field, as upstream's nil slice.
        "ownerReferences": if remaining.is_empty() { Value::Null } else { json!(remaining) },
    }})
}

fn unblocked(r: &OwnerReference) -> OwnerReference {
    OwnerReference {
        block_owner_deletion: Some(false),
        ..r.clone()
    }
}

/// The strategic merge patch setting `blockOwnerDeletion=false` on the item's blocking
/// references (GC-3 (b), before a foreground delete that could otherwise deadlock).
pub fn unblock_owner_refs_strategic(uid: &str, owners: &[OwnerReference]) -> Value {
    let blocking: Vec<OwnerReference> = owners
        .iter()
        .filter(|r| r.block_owner_deletion == Some(true))
        .map(unblocked)
        .collect();
    let mut meta = json!({"uid": uid});
    if !blocking.is_empty() {
        meta["ownerReferences"] = json!(blocking);
    }
    json!({ "metadata": meta })
}

/// Its JSON merge patch fallback: every reference with `blockOwnerDeletion=false`.
pub fn unblock_owner_refs_merge(resource_version: &str, owners: &[OwnerReference]) -> Value {
    let all: Vec<OwnerReference> = owners.iter().map(unblocked).collect();
    json!({"metadata": {
        "resourceVersion": resource_version,
        "ownerReferences": if all.is_empty() { Value::Null } else { json!(all) },
    }})
}

/// The finalizers left once `target` is removed; `None` when it is not there.
pub fn without_finalizer(finalizers: &[String], target: &str) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == target) {
        return None;
    }
    Some(
        finalizers
            .iter()
            .filter(|f| *f != target)
            .cloned()
            .collect(),
    )
}

/// The JSON merge patch writing `finalizers`, guarded by `resource_version` (a conflict means
/// someone else changed the object: read it again).
pub fn finalizers_merge(resource_version: &str, finalizers: &[String]) -> Value {
    json!({"metadata": {
        "resourceVersion": resource_version,
        "finalizers": if finalizers.is_empty() { Value::Null } else { json!(finalizers) },
    }})
}

/// After a delete failed on its resourceVersion precondition: whether to retry without it. Only
/// when the live object is the same one (uid), changed (resourceVersion), and still has the
/// owner references the decision was made on.
pub fn retry_delete_without_resource_version(
    uid: &str,
    resource_version: &str,
    owners_at_resource_version: &[OwnerReference],
    live: &ObjectMeta,
) -> bool {
    live.uid.as_deref() == Some(uid)
        && live.resource_version.as_deref() != Some(resource_version)
        && live.owner_references.as_deref().unwrap_or_default() == owners_at_resource_version
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
