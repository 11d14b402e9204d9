//! The VolumeAttributesClass protection controller (kube-controller-manager v1.34's
//! `volumeattributesclass-protection-controller`, `pkg/controller/volume/vacprotection`): every
//! VolumeAttributesClass not being deleted gets the `kubernetes.io/vac-protection` finalizer; a
//! class being deleted loses it once no PersistentVolume and no PersistentVolumeClaim refers to
//! it, so a class in use outlives its deletion request.
//!
//! A claim refers to a class through `spec.volumeAttributesClassName`,
//! `status.currentVolumeAttributesClassName` and `status.modifyVolumeStatus.targetVolumeAttributesClassName`;
//! a volume through `spec.volumeAttributesClassName` (upstream's `getPVCReferencedVACNames` and
//! `getPVReferencedVACNames`). As upstream, only the informers' caches are read, so a claim created
//! at the moment the class is deleted can race the removal (upstream's comment on the controller
//! says the same).
//!
//! Owns that finalizer only. One queue (`vacprotection`), one worker, as upstream; the decision is
//! [`plan`]'s.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name (`--controllers`, logs).
pub const NAME: &str = "volumeattributesclass-protection";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "vacprotection";

/// The finalizer.
pub const FINALIZER: &str = "kubernetes.io/vac-protection";

/// The claim and volume indexes by the class names they refer to.
const BY_VAC: &str = "volumeAttributesClassName";

/// What to do with a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    AddFinalizer,
    RemoveFinalizer,
}

fn has_finalizer(vac: &VolumeAttributesClass) -> bool {
    vac.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// `processVAC`: a deletion candidate (being deleted, with the finalizer) that nothing uses loses
/// it; a class not being deleted without it gets it.
pub fn plan(vac: &VolumeAttributesClass, in_use: bool) -> Step {
    match (
        vac.metadata.deletion_timestamp.is_some(),
        has_finalizer(vac),
    ) {
        (true, true) if !in_use => Step::RemoveFinalizer,
        (false, false) => Step::AddFinalizer,
        _ => Step::Nothing,
    }
}

/// The class names a claim refers to.
pub fn claim_classes(pvc: &PersistentVolumeClaim) -> Vec<String> {
    let spec = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.clone());
    let status = pvc.status.as_ref();
    let current = status.and_then(|s| s.current_volume_attributes_class_name.clone());
    let target = status
        .and_then(|s| s.modify_volume_status.as_ref())
        .and_then(|m| m.target_volume_attributes_class_name.clone());
    let names: BTreeSet<String> = [spec, current, target]
        .into_iter()
        .flatten()
        .filter(|n| !n.is_empty())
        .collect();
    names.into_iter().collect()
}

/// The class name a volume refers to.
pub fn volume_classes(pv: &PersistentVolume) -> Vec<String> {
    pv.spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.clone())
        .filter(|n| !n.is_empty())
        .into_iter()
        .collect()
}

/// The running controller.
pub struct Controller {
    client: Client,
    classes: Arc<Indexed<VolumeAttributesClass>>,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    volumes: Arc<Indexed<PersistentVolume>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's indexes and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let vac_informer = informers.get::<VolumeAttributesClass>();
        let pvc_informer = informers.get::<PersistentVolumeClaim>();
        let pv_informer = informers.get::<PersistentVolume>();
        pvc_informer.add_index(BY_VAC, claim_classes);
        pv_informer.add_index(BY_VAC, volume_classes);
        let this = Arc::new(Controller {
            client,
            classes: vac_informer.cache(),
            claims: pvc_informer.cache(),
            volumes: pv_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        // `vacAddedUpdated`: a class without the finalizer, or being deleted with it.
        vac_informer.on_change_of(&this, |c, _, new| {
            if let Some(vac) = new {
                if !has_finalizer(vac) || vac.metadata.deletion_timestamp.is_some() {
                    c.queue.add(vac.metadata.name.clone().unwrap_or_default());
                }
            }
        });
        // `pvcUpdated` / `pvcDeleted`: the classes a claim stopped referring to, or all of a
        // deleted claim's (a claim added cannot free a class).
        pvc_informer.on_change_of(&this, |c, old, new| {
            let (Some(old), new) = (old, new) else { return };
            let still: Vec<String> = new.map(|p| claim_classes(p)).unwrap_or_default();
            for name in claim_classes(old) {
                if !still.contains(&name) {
                    c.queue.add(name);
                }
            }
        });
        // `pvUpdated` / `pvDeleted`: the same for volumes.
        pv_informer.on_change_of(&this, |c, old, new| {
            let (Some(old), new) = (old, new) else { return };
            let still: Vec<String> = new.map(|p| volume_classes(p)).unwrap_or_default();
            for name in volume_classes(old) {
                if !still.contains(&name) {
                    c.queue.add(name);
                }
            }
        });
        this
    }

    /// Waits for the caches, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            NAME,
            &[&*self.classes, &*self.claims, &*self.volumes],
            &self.queue,
            1,
        )
        .await;
    }

    /// `isBeingUsed`: a volume or a claim in the caches refers to the class.
    fn in_use(&self, name: &str) -> bool {
        !self.volumes.index(BY_VAC, name).is_empty() || !self.claims.index(BY_VAC, name).is_empty()
    }
}

impl SyncKey for Controller {
    async fn sync(&self, name: &str) -> Result<()> {
        let Some(vac) = self.classes.get("", name) else {
            return Ok(());
        };
        let step = plan(&vac, self.in_use(name));
        let mut new = (*vac).clone();
        let finalizers = new.metadata.finalizers.get_or_insert_with(Vec::new);
        match step {
            Step::Nothing => return Ok(()),
            Step::AddFinalizer => finalizers.push(FINALIZER.to_string()),
            Step::RemoveFinalizer => finalizers.retain(|f| f != FINALIZER),
        }
        let api: Api<VolumeAttributesClass> = Api::all(self.client.clone());
        match api.replace(name, &PostParams::default(), &new).await {
            Ok(_) => Ok(()),
            Err(e) if apierrors::is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(
                "updating the finalizers of",
                format!("VolumeAttributesClass {name}"),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vac(v: serde_json::Value) -> VolumeAttributesClass {
        let mut v = v;
        v["driverName"] = json!("csi.example.com");
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_finalizer_comes_on_and_goes_once_unused() {
        let fresh = vac(json!({"metadata": {"name": "gold"}}));
        assert_eq!(plan(&fresh, false), Step::AddFinalizer);
        assert_eq!(plan(&fresh, true), Step::AddFinalizer);
        let protected = vac(json!({"metadata": {"name": "gold", "finalizers": [FINALIZER]}}));
        assert_eq!(plan(&protected, false), Step::Nothing);
        let deleting = vac(
            json!({"metadata": {"name": "gold", "finalizers": [FINALIZER],
            "deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        );
        assert_eq!(plan(&deleting, true), Step::Nothing);
        assert_eq!(plan(&deleting, false), Step::RemoveFinalizer);
        // Being deleted without the finalizer (someone removed it): nothing to add back.
        let gone = vac(json!({"metadata": {"name": "gold",
            "deletionTimestamp": "2024-01-01T00:00:00Z", "finalizers": ["other"]}}));
        assert_eq!(plan(&gone, false), Step::Nothing);
    }

    #[test]
    fn a_claim_refers_through_spec_current_and_target() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "n"},
            "spec": {"volumeAttributesClassName": "gold"},
            "status": {"currentVolumeAttributesClassName": "silver",
                "modifyVolumeStatus": {"targetVolumeAttributesClassName": "gold", "status": "InProgress"}}
        }))
        .unwrap();
        assert_eq!(claim_classes(&pvc), vec!["gold", "silver"]);
        let empty: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c"}, "spec": {"volumeAttributesClassName": ""}
        }))
        .unwrap();
        assert!(claim_classes(&empty).is_empty());
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "v"}, "spec": {"volumeAttributesClassName": "bronze"}
        }))
        .unwrap();
        assert_eq!(volume_classes(&pv), vec!["bronze"]);
    }
}
