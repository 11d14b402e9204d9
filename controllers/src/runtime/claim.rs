//! The controller-ref manager (CTL-6, CTL-7): which candidate objects (Pods of a ReplicaSet,
//! ReplicaSets of a Deployment) an owner controls after this sync.
//!
//! [`claim_plan`] decides, purely: an object controlled by the owner that still matches stays
//! owned, one that no longer matches is released (unless the owner is being deleted); an orphan
//! that matches and is not being deleted is adopted (unless the owner is being deleted); objects
//! controlled by someone else are never touched. [`claim`] carries the plan out with the patches
//! upstream sends (strategic merge on `metadata.ownerReferences`, merge key `uid`, with the
//! object's uid as a precondition), after re-reading the owner once from the API server so a
//! deleted or re-created owner does not adopt (`RecheckDeletionTimestamp`). The candidates are
//! the owner's own objects (the informers' controller-uid index) and the orphans of its
//! namespace ([`ORPHAN_NAMESPACE`], registered by [`add_orphan_index`]).

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::{Error, Result};
use crate::helpers::meta::object_name;
use crate::helpers::selector::Selector;
use crate::runtime::apierrors::{has_code, is_not_found};

use super::cache::Indexed;
use super::cached_pod::CachedPod;
use super::expectations::Expectations;
use super::informer::{controller_uid, key_of, Informer, Watched};
use super::pods::pod_key;
use super::queue::WorkQueue;
use crate::helpers::meta::controller_of_object;

/// Cache index: key = the namespace of an object without a controller reference (the orphans an
/// owner may adopt, upstream's orphan key of its controller indexes). One index per informer,
/// whichever controllers register it.
pub const ORPHAN_NAMESPACE: &str = "orphan-namespace";

/// The [`ORPHAN_NAMESPACE`] index function.
pub fn orphan_namespace<K: Resource>(obj: &K) -> Vec<String> {
    if controller_uid(obj).is_some() {
        Vec::new()
    } else {
        vec![obj.meta().namespace.clone().unwrap_or_default()]
    }
}

/// Registers [`ORPHAN_NAMESPACE`] on `informer` (once: a controller finding it there already
/// shares it).
pub fn add_orphan_index<K: Watched>(informer: &Informer<K>) {
    if !informer.cache().has_index(ORPHAN_NAMESPACE) {
        informer.add_index(ORPHAN_NAMESPACE, orphan_namespace::<K>);
    }
}

/// The owner an object is claimed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerInfo {
    /// `apps/v1`.
    pub api_version: String,
    /// `ReplicaSet`.
    pub kind: String,
    /// The owner's name.
    pub name: String,
    /// The owner's uid.
    pub uid: String,
}

impl OwnerInfo {
    /// The owner of a typed object.
    pub fn of<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerInfo {
        OwnerInfo {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            name: owner.meta().name.clone().unwrap_or_default(),
            uid: owner.meta().uid.clone().unwrap_or_default(),
        }
    }

    /// The controller ownerReference a dependent carries (controller and blockOwnerDeletion
    /// true, as upstream's `NewControllerRef`).
    pub fn controller_ref(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

/// What one sync does with the candidates.
#[derive(Debug)]
pub struct Claim<K> {
    /// Controlled by the owner and matching: kept.
    pub owned: Vec<Arc<K>>,
    /// Orphans to adopt.
    pub adopt: Vec<Arc<K>>,
    /// Controlled by the owner but no longer matching: to release.
    pub release: Vec<Arc<K>>,
}

impl<K> Default for Claim<K> {
    fn default() -> Self {
        Self {
            owned: Vec::new(),
            adopt: Vec::new(),
            release: Vec::new(),
        }
    }
}

/// Classifies `candidates` for the owner `owner_uid` with `selector` (CTL-7).
pub fn claim_plan<K: Resource>(
    owner_uid: &str,
    selector: &Selector,
    owner_deleting: bool,
    candidates: impl IntoIterator<Item = Arc<K>>,
) -> Claim<K> {
    let mut out = Claim::default();
    for obj in candidates {
        let matches = selector.matches(obj.meta().labels.as_ref());
        match controller_uid(obj.as_ref()) {
            Some(uid) if uid == owner_uid => {
                if matches {
                    out.owned.push(obj);
                } else if !owner_deleting {
                    out.release.push(obj);
                }
            }
            // Controlled by another owner: never ours to touch.
            Some(_) => {}
            None => {
                let obj_deleting = obj.meta().deletion_timestamp.is_some();
                if matches && !owner_deleting && !obj_deleting {
                    out.adopt.push(obj);
                }
            }
        }
    }
    out
}

/// The strategic-merge patch that makes `owner` the controller of the object `uid`.
pub fn adopt_patch(owner: &OwnerInfo, uid: &str) -> serde_json::Value {
    json!({"metadata": {"ownerReferences": [owner.controller_ref()], "uid": uid}})
}

/// The strategic-merge patch that removes `owner`'s reference from the object `uid`.
pub fn release_patch(owner: &OwnerInfo, uid: &str) -> serde_json::Value {
    json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": owner.uid}], "uid": uid}})
}

/// Carries out `plan` and returns the objects the owner controls now: the owned ones plus those
/// adopted. `recheck` re-reads the owner from the API server and fails when it is gone, has
/// another uid or is being deleted; it runs once, before the first adoption. A release that finds
/// the object gone or no longer referencing the owner (404, 422) is done; other errors are
/// returned after the rest of the plan was tried.
pub async fn claim<K, F, Fut>(
    api: &Api<K>,
    owner: &OwnerInfo,
    plan: Claim<K>,
    recheck: F,
) -> Result<Vec<Arc<K>>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + serde::Serialize,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let Claim {
        mut owned,
        adopt,
        release,
    } = plan;
    let mut first_err = None;
    let params = PatchParams::default();
    if !adopt.is_empty() {
        match recheck().await {
            Ok(()) => {
                for obj in adopt {
                    let uid = obj.meta().uid.clone().unwrap_or_default();
                    let patch = adopt_patch(owner, &uid);
                    match api
                        .patch(&obj.name_any(), &params, &Patch::Strategic(patch))
                        .await
                    {
                        Ok(adopted) => owned.push(Arc::new(adopted)),
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => {
                            first_err.get_or_insert(Error::kube(
                                "adopting",
                                object_name(obj.as_ref()),
                                e,
                            ));
                        }
                    }
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    for obj in release {
        let uid = obj.meta().uid.clone().unwrap_or_default();
        let patch = release_patch(owner, &uid);
        match api
            .patch(&obj.name_any(), &params, &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {}
            // Gone, or re-created with another uid / without our reference: nothing to release.
            Err(e) if is_not_found(&e) || has_code(&e, 422) => {}
            Err(e) => {
                first_err.get_or_insert(Error::kube("releasing", object_name(obj.as_ref()), e));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(owned),
    }
}

/// `resolveControllerRef`: the object of kind `K` a controller reference names, when the cache
/// holds it with that uid (a re-created owner of the same name is another owner).
pub fn resolve_controller_ref<K>(
    cache: &Indexed<K>,
    namespace: &str,
    r: &OwnerReference,
) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + ResourceExt + Clone,
{
    if r.kind != K::kind(&()) {
        return None;
    }
    cache
        .get(namespace, &r.name)
        .filter(|o| o.meta().uid.as_deref() == Some(r.uid.as_str()))
}

/// The `recheck` of [`claim`] for an owner read through `api` (upstream's
/// `RecheckDeletionTimestamp` over an uncached get): re-reads it by name and checks it with
/// [`recheck_owner`]; a failed read is an error naming `object` (the owner's `Kind ns/name`).
pub async fn reread_owner<O>(api: &Api<O>, owner: &OwnerInfo, object: String) -> Result<()>
where
    O: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let fresh = api
        .get_opt(&owner.name)
        .await
        .map_err(|e| Error::kube("re-reading before adoption", object, e))?;
    recheck_owner(owner, fresh.as_ref())
}

/// What observes an owner's Pods coming and going through the watch: its [`Expectations`], or
/// its [`crate::runtime::pod_control::PodControl`] when that reads its own creations back (the
/// creation may have been observed by its answer already).
pub trait PodObserver {
    /// The watch showed `pod` of the owner `key` for the first time.
    fn creation_seen(&self, key: &str, pod: &CachedPod);
    /// The watch showed `pod` of the owner `key` deleted (or first seen terminating).
    fn deletion_seen(&self, key: &str, pod: &CachedPod);
}

impl PodObserver for Expectations {
    fn creation_seen(&self, key: &str, _pod: &CachedPod) {
        self.creation_observed(key);
    }

    fn deletion_seen(&self, key: &str, pod: &CachedPod) {
        self.deletion_observed(key, &pod_key(pod));
    }
}

/// Upstream's `addPod` as the ReplicaSet, StatefulSet and DaemonSet controllers share it: a Pod
/// first seen terminating (after a restart) is a deletion, not a creation ([`pod_deleted`]); one
/// with a controller reference is a creation its owner (when `owners` holds it) observes, and
/// queues that owner. `true` for an orphan: the caller queues the owners selecting it, which may
/// adopt it (no creation is observed).
pub fn pod_added<K>(
    owners: &Indexed<K>,
    expectations: &impl PodObserver,
    queue: &WorkQueue<String>,
    pod: &CachedPod,
) -> bool
where
    K: Resource<DynamicType = ()> + ResourceExt + Clone,
{
    if pod.metadata.deletion_timestamp.is_some() {
        pod_deleted(owners, expectations, queue, pod);
        return false;
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let Some(r) = controller_of_object(pod) else {
        return true;
    };
    if let Some(owner) = resolve_controller_ref(owners, ns, r) {
        let key = key_of(owner.as_ref());
        expectations.creation_seen(&key, pod);
        queue.add(key);
    }
    false
}

/// Upstream's `deletePod` as the ReplicaSet, StatefulSet and DaemonSet controllers share it: the
/// Pod's owner (when it has one and `owners` holds it) observes the deletion and is queued.
pub fn pod_deleted<K>(
    owners: &Indexed<K>,
    expectations: &impl PodObserver,
    queue: &WorkQueue<String>,
    pod: &CachedPod,
) where
    K: Resource<DynamicType = ()> + ResourceExt + Clone,
{
    let Some(r) = controller_of_object(pod) else {
        return;
    };
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(owner) = resolve_controller_ref(owners, ns, r) {
        let key = key_of(owner.as_ref());
        expectations.deletion_seen(&key, pod);
        queue.add(key);
    }
}

/// The recheck `claim` needs: `fresh` is the owner as the API server has it now (`None`: gone).
pub fn recheck_owner<K: Resource<DynamicType = ()>>(
    owner: &OwnerInfo,
    fresh: Option<&K>,
) -> Result<()> {
    let reason = match fresh {
        None => "it no longer exists",
        Some(f) if f.meta().uid.as_deref() != Some(owner.uid.as_str()) => {
            "it was deleted and re-created (uid differs)"
        }
        Some(f) if f.meta().deletion_timestamp.is_some() => "it is being deleted",
        Some(_) => return Ok(()),
    };
    Err(Error::Adoption {
        owner: format!("{} {}", owner.kind, owner.name),
        reason: reason.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str, app: &str, controller: Option<&str>, deleting: bool) -> Arc<Pod> {
        let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "labels": {"app": app}});
        if let Some(uid) = controller {
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "x", "uid": uid, "controller": true}]);
        }
        let mut p: Pod = serde_json::from_value(json!({ "metadata": meta })).unwrap();
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        Arc::new(p)
    }

    fn names(v: &[Arc<Pod>]) -> Vec<String> {
        v.iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn ctl7_adopt_release_ignore() {
        let sel = Selector::from_labels(&[("app".to_string(), "web".to_string())].into());
        let candidates = || {
            vec![
                pod("owned", "web", Some("me"), false),
                pod("owned-moved", "db", Some("me"), false),
                pod("orphan", "web", None, false),
                pod("orphan-other", "db", None, false),
                pod("orphan-deleting", "web", None, true),
                pod("theirs", "web", Some("them"), false),
            ]
        };
        struct Case {
            name: &'static str,
            owner_deleting: bool,
            owned: &'static [&'static str],
            adopt: &'static [&'static str],
            release: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "CTL-7 matching orphan adopted, non-matching owned released, others ignored",
                owner_deleting: false,
                owned: &["owned"],
                adopt: &["orphan"],
                release: &["owned-moved"],
            },
            Case {
                name: "CTL-7 an owner being deleted neither adopts nor releases",
                owner_deleting: true,
                owned: &["owned"],
                adopt: &[],
                release: &[],
            },
        ];
        for c in cases {
            let plan = claim_plan("me", &sel, c.owner_deleting, candidates());
            assert_eq!(names(&plan.owned), c.owned, "{}", c.name);
            assert_eq!(names(&plan.adopt), c.adopt, "{}", c.name);
            assert_eq!(names(&plan.release), c.release, "{}", c.name);
        }
    }

    #[test]
    fn ctl6_patches_carry_the_controller_ref_and_the_uid_precondition() {
        let owner = OwnerInfo {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "web".into(),
            uid: "rs-uid".into(),
        };
        assert_eq!(
            adopt_patch(&owner, "pod-uid"),
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web", "uid": "rs-uid", "controller": true, "blockOwnerDeletion": true}],
                "uid": "pod-uid"}})
        );
        assert_eq!(
            release_patch(&owner, "pod-uid"),
            json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": "rs-uid"}],
                "uid": "pod-uid"}})
        );
    }

    #[test]
    fn ctl7_recheck_refuses_gone_recreated_and_deleting_owners() {
        let owner = OwnerInfo {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "p".into(),
            uid: "uid-p".into(),
        };
        assert!(recheck_owner::<Pod>(&owner, None).is_err());
        let other = pod("p", "web", None, false);
        let mut recreated = (*other).clone();
        recreated.metadata.uid = Some("new".into());
        assert!(recheck_owner(&owner, Some(&recreated)).is_err());
        assert!(recheck_owner(&owner, Some(other.as_ref())).is_ok());
        let deleting = pod("p", "web", None, true);
        let err = recheck_owner(&owner, Some(deleting.as_ref())).unwrap_err();
        assert!(err.to_string().contains("being deleted"), "{err}");
    }
}
