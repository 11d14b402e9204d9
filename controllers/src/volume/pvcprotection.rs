//! The PVC protection controller (kube-controller-manager v1.34's
//! `persistentvolumeclaim-protection`, `pkg/controller/volume/pvcprotection`): every
//! PersistentVolumeClaim not being deleted gets the `kubernetes.io/pvc-protection` finalizer; a
//! claim being deleted loses it once no Pod uses it, so a claim outlives its deletion request
//! while a Pod still mounts it.
//!
//! A Pod uses a claim ([`pod_uses_claim`], upstream's `podUsesPVC`) when it is scheduled (has a
//! Node) and names the claim in a claim volume, or (unless it is shut down: deleted with grace 0)
//! has a generic ephemeral volume whose claim is this one and is the claim's controller. As
//! upstream, the cache is asked first and, when it finds no user, a live list of the
//! namespace's Pods is.
//!
//! Owns that finalizer only. One queue (`pvcprotection`), one worker; decisions are [`plan`]'s
//! and [`pod_uses_claim`]'s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::helpers::meta;
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::{claim_keys, CachedPod, POD_CLAIMS};
use crate::runtime::informer::{split_key, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name (`--controllers`, logs).
pub const NAME: &str = "persistentvolumeclaim-protection";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "pvcprotection";

/// The finalizer.
pub const FINALIZER: &str = "kubernetes.io/pvc-protection";

/// What to do with a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    AddFinalizer,
    /// Being deleted with the finalizer: remove it if no Pod uses the claim.
    RemoveUnlessUsed,
}

fn has_finalizer(c: &PersistentVolumeClaim) -> bool {
    c.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// `processPVC`'s decision before the Pods are looked at.
pub fn plan(c: &PersistentVolumeClaim) -> Step {
    match (c.metadata.deletion_timestamp.is_some(), has_finalizer(c)) {
        (true, true) => Step::RemoveUnlessUsed,
        (false, false) => Step::AddFinalizer,
        _ => Step::Nothing,
    }
}

/// What [`pod_uses_claim`] reads of a Pod, from a cached or a listed one.
pub struct PodView<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
    pub node_name: &'a str,
    /// Deleted with grace period 0 (`podIsShutDown`).
    pub shut_down: bool,
    /// Its volumes: name, claim name (claim volume), whether ephemeral.
    pub volumes: Vec<(&'a str, Option<&'a str>, bool)>,
}

impl<'a> PodView<'a> {
    pub fn of_cached(p: &'a CachedPod) -> PodView<'a> {
        let spec = p.spec.as_ref();
        let volumes = spec.iter().flat_map(|s| s.volumes.iter().flatten());
        PodView::new(
            &p.metadata,
            spec.and_then(|s| s.node_name.as_deref()),
            volumes.map(|v| {
                let claim = v.persistent_volume_claim.as_ref();
                (
                    v.name.as_str(),
                    claim.map(|c| c.claim_name.as_str()),
                    v.ephemeral.is_some(),
                )
            }),
        )
    }

    pub fn of_pod(p: &'a Pod) -> PodView<'a> {
        let spec = p.spec.as_ref();
        let volumes = spec.iter().flat_map(|s| s.volumes.iter().flatten());
        PodView::new(
            &p.metadata,
            spec.and_then(|s| s.node_name.as_deref()),
            volumes.map(|v| {
                let claim = v.persistent_volume_claim.as_ref();
                (
                    v.name.as_str(),
                    claim.map(|c| c.claim_name.as_str()),
                    v.ephemeral.is_some(),
                )
            }),
        )
    }

    /// The view of a Pod's metadata, node and volumes (name, claim name, whether ephemeral).
    fn new(
        meta: &'a ObjectMeta,
        node_name: Option<&'a str>,
        volumes: impl Iterator<Item = (&'a str, Option<&'a str>, bool)>,
    ) -> PodView<'a> {
        PodView {
            namespace: meta.namespace.as_deref().unwrap_or_default(),
            name: meta.name.as_deref().unwrap_or_default(),
            uid: meta.uid.as_deref(),
            node_name: node_name.unwrap_or_default(),
            shut_down: meta.deletion_timestamp.is_some()
                && meta.deletion_grace_period_seconds == Some(0),
            volumes: volumes.collect(),
        }
    }
}

/// `podUsesPVC`.
pub fn pod_uses_claim(pod: &PodView<'_>, claim: &PersistentVolumeClaim) -> bool {
    if pod.node_name.is_empty() {
        return false;
    }
    let cname = claim.metadata.name.as_deref().unwrap_or_default();
    let for_pod = || {
        claim.metadata.namespace.as_deref() == Some(pod.namespace)
            && meta::controller_uid(&claim.metadata).is_some()
            && meta::controller_uid(&claim.metadata) == pod.uid
    };
    pod.volumes.iter().any(|(vname, claim_name, ephemeral)| {
        *claim_name == Some(cname)
            || (!pod.shut_down
                && *ephemeral
                && format!("{}-{vname}", pod.name) == cname
                && for_pod())
    })
}

/// The running controller.
pub struct Controller {
    client: Client,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    pods: Arc<Indexed<CachedPod>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handlers on the shared claim and Pod informers.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let pvc_informer = informers.get::<PersistentVolumeClaim>();
        let pod_informer = informers.get::<CachedPod>();
        pod_informer.add_index(POD_CLAIMS, claim_keys);
        let this = Arc::new(Controller {
            client,
            claims: pvc_informer.cache(),
            pods: pod_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        pvc_informer.on_change_of(&this, |c, _, new| {
            if let Some(pvc) = new {
                if plan(pvc) != Step::Nothing {
                    c.queue.add(format!(
                        "{}/{}",
                        pvc.metadata.namespace.as_deref().unwrap_or_default(),
                        pvc.metadata.name.as_deref().unwrap_or_default()
                    ));
                }
            }
        });
        // `podAddedDeletedUpdated` / `enqueuePVCs`: a Pod deleted, terminated or not scheduled
        // may have let its claims go.
        pod_informer.on_change_of(&this, |c, old, new| {
            let enqueue = |p: &CachedPod, deleted: bool| {
                let scheduled = p.node_name().is_some();
                if !deleted && !p.is_terminal() && scheduled {
                    return;
                }
                for key in claim_keys(p) {
                    c.queue.add(key);
                }
            };
            match (old, new) {
                (_, Some(p)) => {
                    enqueue(p, false);
                    if let Some(o) = old.filter(|o| o.metadata.uid != p.metadata.uid) {
                        enqueue(o, true);
                    }
                }
                (Some(o), None) => enqueue(o, true),
                (None, None) => {}
            }
        });
        this
    }

    /// Waits for the caches, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, NAME, &[&*self.claims, &*self.pods], &self.queue, 1).await;
    }

    /// `isBeingUsed`: the cache first, then a live list of the namespace's Pods.
    async fn is_used(&self, claim: &PersistentVolumeClaim, key: &str) -> Result<bool> {
        let cached = self.pods.index(POD_CLAIMS, key);
        if cached
            .iter()
            .any(|p| pod_uses_claim(&PodView::of_cached(p), claim))
        {
            return Ok(true);
        }
        let (ns, _) = split_key(key);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let live = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("listing", format!("the Pods of namespace {ns}"), e))?;
        Ok(live
            .items
            .iter()
            .any(|p| pod_uses_claim(&PodView::of_pod(p), claim)))
    }
}

impl SyncKey for Controller {
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(claim) = self.claims.get(ns, name) else {
            return Ok(());
        };
        let mut new = (*claim).clone();
        let finalizers = new.metadata.finalizers.get_or_insert_with(Vec::new);
        match plan(&claim) {
            Step::Nothing => return Ok(()),
            Step::AddFinalizer => finalizers.push(FINALIZER.to_string()),
            Step::RemoveUnlessUsed => {
                if self.is_used(&claim, key).await? {
                    return Ok(());
                }
                finalizers.retain(|f| f != FINALIZER);
            }
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        match api.replace(name, &PostParams::default(), &new).await {
            Ok(_) => Ok(()),
            Err(e) if apierrors::is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(
                "updating the finalizers of",
                format!("PersistentVolumeClaim {key}"),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(owner_uid: Option<&str>) -> PersistentVolumeClaim {
        let mut v = json!({"metadata": {"name": "p-scratch", "namespace": "ns"}});
        if let Some(uid) = owner_uid {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
                "name": "p", "uid": uid, "controller": true}]);
        }
        serde_json::from_value(v).unwrap()
    }

    fn pod(node: &str, volume: serde_json::Value, shut_down: bool) -> CachedPod {
        let mut v = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
                           "spec": {"nodeName": node, "volumes": [volume]}});
        if shut_down {
            v["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
            v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_scheduled_pods_use_claims_and_ephemeral_ones_only_their_own() {
        let by_name = json!({"name": "d", "persistentVolumeClaim": {"claimName": "p-scratch"}});
        let eph = json!({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}});
        let uses =
            |p: &CachedPod, c: &PersistentVolumeClaim| pod_uses_claim(&PodView::of_cached(p), c);
        assert!(uses(&pod("n", by_name.clone(), false), &claim(None)));
        assert!(!uses(&pod("", by_name.clone(), false), &claim(None)));
        assert!(uses(&pod("n", by_name, true), &claim(None)));
        assert!(uses(&pod("n", eph.clone(), false), &claim(Some("uid-p"))));
        assert!(!uses(
            &pod("n", eph.clone(), false),
            &claim(Some("someone-else"))
        ));
        assert!(!uses(&pod("n", eph, true), &claim(Some("uid-p"))));
    }

    #[test]
    fn the_finalizer_is_added_or_checked() {
        assert_eq!(plan(&claim(None)), Step::AddFinalizer);
        let mut c = claim(None);
        c.metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert_eq!(plan(&c), Step::Nothing);
        c.metadata.deletion_timestamp =
            serde_json::from_value(json!("2024-01-01T00:00:00Z")).unwrap();
        assert_eq!(plan(&c), Step::RemoveUnlessUsed);
    }
}
