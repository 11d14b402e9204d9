//! The volume expand controller (kube-controller-manager v1.34's
//! `persistentvolume-expander-controller`, `pkg/controller/volume/expand`): a Bound claim whose
//! storage request grew past its capacity is handed to whoever expands its volume.
//!
//! - A volume of an in-tree plugin migrated to CSI (GCE PD, AWS EBS, Azure Disk and File, Cinder,
//!   vSphere, Portworx: every such plugin's migration is on in v1.34) gets the Normal
//!   `ExternalExpanding` Event "CSI migration enabled for kubernetes.io/<plugin>; waiting for
//!   external resizer to expand the pvc" and the claim the `volume.kubernetes.io/storage-resizer`
//!   annotation naming the CSI driver, which the driver's external-resizer watches for.
//! - Any other volume (CSI, and the in-tree kinds kube-controller-manager cannot expand) gets the
//!   Normal `ExternalExpanding` Event "waiting for an external controller to expand this PVC":
//!   the CSI external-resizer does the work.
//!
//! Not built: expanding a volume in-process for an in-tree plugin kube-controller-manager still
//! expands itself. v1.34 has none left but FlexVolume drivers installed under
//! `--flex-volume-plugin-dir`, which kpr does not load (docs/VOLUMES.md).
//!
//! Owns the claim's resizer annotation and those Events. Queue `volume_expand`, one worker.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::helpers::quantity::Quantity;
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{key_of, split_key, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name (`--controllers`, logs).
pub const NAME: &str = "persistentvolume-expander";

/// The work queue's name and the Events' source, as upstream.
pub const QUEUE_NAME: &str = "volume_expand";

/// The claim annotation naming the CSI driver whose external-resizer expands it.
pub const ANN_RESIZER: &str = "volume.kubernetes.io/storage-resizer";

/// The volume annotation of a resize in progress (upstream's `AnnPreResizeCapacity`).
pub const ANN_PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

/// The Event reason, as upstream's `events.ExternalExpanding`.
pub const EXTERNAL_EXPANDING: &str = "ExternalExpanding";

/// The in-tree volume kinds migrated to CSI: the PersistentVolume source field, the in-tree
/// plugin's name and the CSI driver that took it over (csi-translation-lib's table).
const MIGRATED: &[(&str, &str, &str)] = &[
    (
        "gcePersistentDisk",
        "kubernetes.io/gce-pd",
        "pd.csi.storage.gke.io",
    ),
    (
        "awsElasticBlockStore",
        "kubernetes.io/aws-ebs",
        "ebs.csi.aws.com",
    ),
    (
        "azureDisk",
        "kubernetes.io/azure-disk",
        "disk.csi.azure.com",
    ),
    (
        "azureFile",
        "kubernetes.io/azure-file",
        "file.csi.azure.com",
    ),
    ("cinder", "kubernetes.io/cinder", "cinder.csi.openstack.org"),
    (
        "vsphereVolume",
        "kubernetes.io/vsphere-volume",
        "csi.vsphere.vmware.com",
    ),
    (
        "portworxVolume",
        "kubernetes.io/portworx-volume",
        "pxd.portworx.com",
    ),
];

/// What a claim needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Not Bound, not grown, or its volume is not bound to it.
    Nothing,
    /// The volume is not bound to this claim (upstream returns an error and retries).
    NotBoundToClaim,
    /// An in-tree volume migrated to CSI: the Event, then the resizer annotation.
    Migrated {
        plugin: &'static str,
        driver: &'static str,
    },
    /// Someone else expands it: the Event.
    External,
}

fn storage(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Quantity {
    list.and_then(|l| l.get("storage"))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or_default()
}

/// A claim's storage request.
fn requested(pvc: &PersistentVolumeClaim) -> Quantity {
    storage(
        pvc.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    )
}

/// A claim's storage capacity (its status).
fn capacity(pvc: &PersistentVolumeClaim) -> Quantity {
    storage(pvc.status.as_ref().and_then(|s| s.capacity.as_ref()))
}

/// Whether a claim is queued: Bound (upstream's `enqueuePVC`).
pub fn bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Bound")
}

/// `syncHandler`'s decision for a claim and its volume.
pub fn plan(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> Step {
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let ours = claim_ref.is_some_and(|r| {
        r.namespace == pvc.metadata.namespace && r.uid.is_some() && r.uid == pvc.metadata.uid
    });
    if !ours {
        return Step::NotBoundToClaim;
    }
    let (requested, capacity) = (requested(pvc), capacity(pvc));
    let resizing = pv
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANN_PRE_RESIZE_CAPACITY));
    if requested <= capacity && !resizing {
        return Step::Nothing;
    }
    let source = pv
        .spec
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_default();
    match MIGRATED
        .iter()
        .find(|(field, _, _)| !source[*field].is_null())
    {
        Some((_, plugin, driver)) => Step::Migrated { plugin, driver },
        None => Step::External,
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    volumes: Arc<Indexed<PersistentVolume>>,
    recorder: Recorder,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handler on the shared claim informer (and reads volumes from
    /// the shared volume cache).
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let pvc_informer = informers.get::<PersistentVolumeClaim>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), QUEUE_NAME),
            client,
            claims: pvc_informer.cache(),
            volumes: informers.get::<PersistentVolume>().cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        // Added and deleted Bound claims, and updates where the request or the capacity grew
        // (upstream's handlers: a capacity that grew lets a finished resize be cleaned up).
        pvc_informer.on_change_of(&this, |c, old, new| {
            let grew = |get: fn(&PersistentVolumeClaim) -> Quantity| match (old, new) {
                (Some(o), Some(n)) => get(n) > get(o),
                _ => true,
            };
            let Some(pvc) = new.or(old) else { return };
            if bound(pvc) && (grew(requested) || grew(capacity)) {
                c.queue.add(key_of(&**pvc));
            }
        });
        this
    }

    /// Waits for the caches, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            NAME,
            &[&*self.claims, &*self.volumes],
            &self.queue,
            1,
        )
        .await;
    }
}

impl SyncKey for Controller {
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(pvc) = self.claims.get(ns, name) else {
            return Ok(());
        };
        let volume = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let Some(pv) = self.volumes.get("", &volume) else {
            return Err(Error::Invalid {
                object: format!("PersistentVolumeClaim {key}"),
                reason: format!("failed to get PV {volume:?}: not found"),
            });
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            uid: pvc.metadata.uid.clone(),
            resource_version: pvc.metadata.resource_version.clone(),
            ..Default::default()
        };
        match plan(&pvc, &pv) {
            Step::Nothing => Ok(()),
            Step::NotBoundToClaim => Err(Error::Invalid {
                object: format!("PersistentVolumeClaim {key}"),
                reason: format!("persistent Volume is not bound to PVC being updated : {key}"),
            }),
            Step::External => {
                self.recorder.publish(
                    &regarding,
                    false,
                    EXTERNAL_EXPANDING,
                    "waiting for an external controller to expand this PVC".into(),
                );
                Ok(())
            }
            Step::Migrated { plugin, driver } => {
                self.recorder.publish(
                    &regarding,
                    false,
                    EXTERNAL_EXPANDING,
                    format!(
                        "CSI migration enabled for {plugin}; waiting for external resizer to \
                         expand the pvc"
                    ),
                );
                let has = pvc
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANN_RESIZER))
                    .is_some_and(|d| d == driver);
                if has {
                    return Ok(());
                }
                let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
                let patch = serde_json::json!({"metadata": {"annotations": {ANN_RESIZER: driver}}});
                match api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if apierrors::is_not_found(&e) => Ok(()),
                    Err(e) => {
                        self.recorder.publish(
                            &regarding,
                            true,
                            EXTERNAL_EXPANDING,
                            format!(
                                "error setting resizer annotation to pvc {key}, with error {}",
                                apierrors::api_message(&e)
                            ),
                        );
                        Err(Error::kube(
                            "setting the resizer annotation of",
                            format!("PersistentVolumeClaim {key}"),
                            e,
                        ))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(request: &str, capacity: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "n", "uid": "u1"},
            "spec": {"volumeName": "v", "resources": {"requests": {"storage": request}}},
            "status": {"phase": "Bound", "capacity": {"storage": capacity}}
        }))
        .unwrap()
    }

    fn volume(source: serde_json::Value, uid: &str) -> PersistentVolume {
        let mut spec = json!({"claimRef": {"namespace": "n", "name": "c", "uid": uid},
                              "capacity": {"storage": "1Gi"}});
        json_patch::merge(&mut spec, &source);
        serde_json::from_value(json!({"metadata": {"name": "v"}, "spec": spec})).unwrap()
    }

    #[test]
    fn a_grown_claim_goes_to_its_resizer() {
        let csi = volume(json!({"csi": {"driver": "d", "volumeHandle": "h"}}), "u1");
        assert_eq!(plan(&claim("1Gi", "1Gi"), &csi), Step::Nothing);
        assert_eq!(plan(&claim("1024Mi", "1Gi"), &csi), Step::Nothing);
        assert_eq!(plan(&claim("2Gi", "1Gi"), &csi), Step::External);
        let gce = volume(json!({"gcePersistentDisk": {"pdName": "p"}}), "u1");
        assert_eq!(
            plan(&claim("2Gi", "1Gi"), &gce),
            Step::Migrated {
                plugin: "kubernetes.io/gce-pd",
                driver: "pd.csi.storage.gke.io"
            }
        );
        let host = volume(json!({"hostPath": {"path": "/x"}}), "u1");
        assert_eq!(plan(&claim("2Gi", "1Gi"), &host), Step::External);
    }

    #[test]
    fn a_volume_bound_elsewhere_is_an_error_and_a_resize_in_progress_is_followed() {
        let other = volume(json!({"csi": {"driver": "d", "volumeHandle": "h"}}), "u2");
        assert_eq!(plan(&claim("2Gi", "1Gi"), &other), Step::NotBoundToClaim);
        let mut resizing = volume(json!({"csi": {"driver": "d", "volumeHandle": "h"}}), "u1");
        resizing.metadata.annotations =
            Some([(ANN_PRE_RESIZE_CAPACITY.to_string(), "1Gi".to_string())].into());
        assert_eq!(plan(&claim("1Gi", "1Gi"), &resizing), Step::External);
    }
}
