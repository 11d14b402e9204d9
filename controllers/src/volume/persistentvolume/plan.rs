//! What the PersistentVolume controller does with one claim ([`plan_claim`]: upstream's
//! `syncUnboundClaim` / `syncBoundClaim`) and one volume ([`plan_volume`]: `syncVolume`), and
//! how a released volume is reclaimed ([`reclaim`], [`deleter`]), over the cached objects, as
//! kube-controller-manager v1.34's `pkg/controller/volume/persistentvolume/pv_controller.go`.
//!
//! Owns the decisions only; the writes (and their order: the volume first, then the claim) are
//! [`super`]'s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use super::index::{
    claim_class, claim_has_class, claim_phase, claim_ref, claim_volume_name, find_best_match,
    is_volume_bound_to_claim, volume_mode_mismatch, volume_phase, volume_unsatisfying,
};

/// `pv.kubernetes.io/bind-completed`: the claim's binding has been completed once.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// `pv.kubernetes.io/bound-by-controller`: the binding was made by the controller, not the user.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// `volume.kubernetes.io/selected-node`: the Node the scheduler chose for a delayed claim.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// `volume.kubernetes.io/storage-provisioner`: who is to provision the claim's volume.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Its deprecated beta spelling, written beside it as upstream still does.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// `pv.kubernetes.io/provisioned-by`: the plugin or provisioner that created a volume.
pub const ANN_DYNAMICALLY_PROVISIONED: &str = "pv.kubernetes.io/provisioned-by";
/// `pv.kubernetes.io/migrated-to`: the CSI driver an in-tree volume migrated to.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// The annotations marking the default StorageClass.
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
pub const ANN_BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";

/// The in-tree provisioners whose volumes v1.34 hands to a CSI driver (CSI migration, on and
/// locked for all of them): the claim is annotated for the driver.
pub const MIGRATED: &[(&str, &str)] = &[
    ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
    ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
    ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
    ("kubernetes.io/azure-file", "file.csi.azure.com"),
    ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
    ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
    ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
];

/// The in-tree host-path plugin (kube-controller-manager's only in-tree provisioner and deleter
/// left, for testing).
pub const HOST_PATH_PLUGIN: &str = "kubernetes.io/host-path";

/// An Event to record: Warning or Normal, reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ev {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

fn normal(reason: &'static str, message: impl Into<String>) -> Ev {
    Ev {
        warning: false,
        reason,
        message: message.into(),
    }
}

fn warning(reason: &'static str, message: impl Into<String>) -> Ev {
    Ev {
        warning: true,
        reason,
        message: message.into(),
    }
}

/// What to do with a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimStep {
    /// Nothing to write.
    Nothing,
    /// Record the Event (if any), then make the claim's status Pending without a volume
    /// (`updateClaimStatus(Pending, nil)`: written only when it differs).
    Pending(Option<Ev>),
    /// Record the Event only (the status stays as it is).
    Event(Ev),
    /// Make the claim Lost and record the Event (only when it was not Lost already).
    Lost(Ev),
    /// Bind the claim and the named volume (`bind`: volume claimRef, volume Bound, claim
    /// volumeName and annotations, claim Bound with the volume's capacity and modes).
    Bind(String),
    /// Give the claim the default StorageClass (`assignDefaultStorageClass`).
    AssignClass(String),
    /// Annotate the claim for the external provisioner and record ExternalProvisioning
    /// (`provisionClaimOperationExternal`).
    ProvisionExternal(String),
    /// Annotate the claim for the in-tree provisioner, which then fails with the Event (the
    /// host-path provisioner, off as kube-controller-manager's `--enable-hostpath-provisioner`
    /// is by default).
    ProvisionInTreeFails { provisioner: String, event: Ev },
    /// Record the Event, then fail the sync with the error.
    Fail(Option<Ev>, String),
}

/// What the claim's sync sees besides the claim.
pub struct ClaimWorld<'a> {
    /// Every PersistentVolume.
    pub volumes: &'a [Arc<PersistentVolume>],
    /// The volume `spec.volumeName` names, when it has one and the volume exists.
    pub named_volume: Option<&'a PersistentVolume>,
    /// The claim's StorageClass, when it names one that exists.
    pub class: Option<&'a StorageClass>,
    /// The default StorageClass (`GetDefaultClass`), when there is one.
    pub default_class: Option<&'a str>,
    /// The not yet scheduled, not terminated Pods using the claim, by name.
    pub unscheduled_pods: Vec<String>,
}

fn has_annotation(meta: &kube::core::ObjectMeta, key: &str) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// `IsDelayBindingMode`: the claim's class exists and binds WaitForFirstConsumer.
pub fn delay_binding(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
) -> Result<bool, String> {
    let name = claim_class(claim);
    if name.is_empty() {
        return Ok(false);
    }
    let Some(class) = class else {
        return Ok(false);
    };
    match class.volume_binding_mode.as_deref() {
        None => Err(format!(
            "VolumeBindingMode not set for StorageClass {name:?}"
        )),
        Some(mode) => Ok(mode == "WaitForFirstConsumer"),
    }
}

/// `syncClaim`.
pub fn plan_claim(claim: &PersistentVolumeClaim, w: &ClaimWorld<'_>) -> ClaimStep {
    if has_annotation(&claim.metadata, ANN_BIND_COMPLETED) {
        plan_bound_claim(claim, w)
    } else {
        plan_unbound_claim(claim, w)
    }
}

fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `syncUnboundClaim`.
fn plan_unbound_claim(claim: &PersistentVolumeClaim, w: &ClaimWorld<'_>) -> ClaimStep {
    let volume_name = claim_volume_name(claim);
    if volume_name.is_empty() {
        let delay = match delay_binding(claim, w.class) {
            Ok(d) => d,
            Err(e) => return ClaimStep::Fail(None, e),
        };
        let found = match find_best_match(claim, w.volumes, delay) {
            Ok(v) => v,
            Err(e) => {
                return ClaimStep::Fail(
                    None,
                    format!("error finding PV for claim {:?}: {e}", claim_key(claim)),
                )
            }
        };
        if let Some(volume) = found {
            return ClaimStep::Bind(volume.metadata.name.clone().unwrap_or_default());
        }
        if !claim_has_class(claim) {
            if let Some(class) = w.default_class {
                return ClaimStep::AssignClass(class.to_string());
            }
        }
        let selected = has_annotation(&claim.metadata, ANN_SELECTED_NODE);
        if delay && !selected {
            return ClaimStep::Pending(Some(wait_event(&w.unscheduled_pods)));
        }
        let class = claim_class(claim);
        if !class.is_empty() {
            return provision(&class, w.class);
        }
        return ClaimStep::Pending(Some(normal(
            "FailedBinding",
            "no persistent volumes available for this claim and no storage class is set",
        )));
    }
    // The user asked for a specific volume.
    let Some(volume) = w.named_volume else {
        return ClaimStep::Pending(None);
    };
    let vname = volume.metadata.name.as_deref().unwrap_or_default();
    if claim_ref(volume).is_none() {
        return match volume_unsatisfying(volume, claim) {
            Some(why) => ClaimStep::Pending(Some(warning(
                "VolumeMismatch",
                format!("Cannot bind to requested volume {vname:?}: {why}"),
            ))),
            None => ClaimStep::Bind(vname.to_string()),
        };
    }
    if is_volume_bound_to_claim(volume, claim) {
        return ClaimStep::Bind(vname.to_string());
    }
    let ev = warning(
        "FailedBinding",
        format!("volume {vname:?} already bound to a different claim."),
    );
    if !has_annotation(&claim.metadata, ANN_BOUND_BY_CONTROLLER) {
        return ClaimStep::Pending(Some(ev));
    }
    let (ns, name, _) = claim_ref(volume).unwrap_or_default();
    ClaimStep::Fail(
        Some(ev),
        format!(
            "invalid binding of claim {:?} to volume {vname:?}: volume already claimed by \"{ns}/{name}\"",
            claim_key(claim)
        ),
    )
}

/// `emitEventForUnboundDelayBindingClaim`.
fn wait_event(unscheduled: &[String]) -> Ev {
    match unscheduled {
        [] => normal(
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding",
        ),
        [one] => normal(
            "WaitForPodScheduled",
            format!("waiting for pod {one} to be scheduled"),
        ),
        many => normal(
            "WaitForPodScheduled",
            format!("waiting for pods {} to be scheduled", many.join(",")),
        ),
    }
}

/// `provisionClaim` / `findProvisionablePlugin`.
fn provision(class_name: &str, class: Option<&StorageClass>) -> ClaimStep {
    let Some(class) = class else {
        return ClaimStep::Event(warning(
            "ProvisioningFailed",
            format!("storageclass.storage.k8s.io {class_name:?} not found"),
        ));
    };
    let provisioner = class.provisioner.as_str();
    if let Some((_, csi)) = MIGRATED.iter().find(|(p, _)| *p == provisioner) {
        return ClaimStep::ProvisionExternal(csi.to_string());
    }
    if provisioner == HOST_PATH_PLUGIN {
        return ClaimStep::ProvisionInTreeFails {
            provisioner: provisioner.to_string(),
            event: warning(
                "ProvisioningFailed",
                format!(
                    "Failed to create provisioner: provisioning in volume plugin {HOST_PATH_PLUGIN:?} is disabled"
                ),
            ),
        };
    }
    if provisioner.starts_with("kubernetes.io/") {
        return ClaimStep::Event(warning(
            "ProvisioningFailed",
            format!("no volume plugin matched name: {provisioner}"),
        ));
    }
    ClaimStep::ProvisionExternal(provisioner.to_string())
}

/// The ExternalProvisioning Event's message.
pub fn external_provisioning_message(provisioner: &str) -> String {
    format!(
        "Waiting for a volume to be created either by the external provisioner '{provisioner}' \
         or manually by the system administrator. If volume creation is delayed, please verify \
         that the provisioner is running and correctly registered."
    )
}

/// `syncBoundClaim`.
fn plan_bound_claim(claim: &PersistentVolumeClaim, w: &ClaimWorld<'_>) -> ClaimStep {
    let lost = |reason, message: &str| {
        if claim_phase(claim) == "Lost" {
            ClaimStep::Nothing
        } else {
            ClaimStep::Lost(warning(reason, message))
        }
    };
    if claim_volume_name(claim).is_empty() {
        return lost(
            "ClaimLost",
            "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
        );
    }
    let Some(volume) = w.named_volume else {
        return lost(
            "ClaimLost",
            "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
        );
    };
    match claim_ref(volume) {
        None => ClaimStep::Bind(volume.metadata.name.clone().unwrap_or_default()),
        Some((_, _, uid)) if Some(uid) == claim.metadata.uid.as_deref() => {
            ClaimStep::Bind(volume.metadata.name.clone().unwrap_or_default())
        }
        Some(_) => lost(
            "ClaimMisbound",
            "Two claims are bound to the same volume, this one is bound incorrectly",
        ),
    }
}

/// What to do with a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeStep {
    Nothing,
    /// Write the phase (Available, Bound) into the status, message cleared.
    Phase(&'static str),
    /// Make the volume Released unless it is Released or Failed already, then reclaim it.
    Release,
    /// Queue the claim `namespace/name` for its sync (it finishes the binding).
    SyncClaim(String),
    /// The two VolumeMismatch Events: on the volume, on the claim.
    Mismatch {
        volume: Ev,
        claim: Ev,
    },
    /// `unbindVolume`: drop the claimRef (bound by the controller) or its uid (pre-bound by the
    /// user), then make the volume Available.
    Unbind,
}

/// `syncVolume`. `claim` is the claim its claimRef names, when it exists with the claimRef's
/// uid (the caller looks it up in the cache and then, as upstream, asks the API server before
/// taking it for gone).
pub fn plan_volume(volume: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> VolumeStep {
    let phase = volume_phase(volume);
    let set = |p: &'static str| {
        if phase == p {
            VolumeStep::Nothing
        } else {
            VolumeStep::Phase(p)
        }
    };
    let Some((_, _, uid)) = claim_ref(volume) else {
        return set("Available");
    };
    if uid.is_empty() {
        return set("Available");
    }
    let Some(claim) = claim else {
        return VolumeStep::Release;
    };
    let vname = volume.metadata.name.as_deref().unwrap_or_default();
    let bound_to = claim_volume_name(claim);
    if bound_to.is_empty() {
        if volume_mode_mismatch(claim, volume) {
            let cname = claim.metadata.name.as_deref().unwrap_or_default();
            return VolumeStep::Mismatch {
                volume: warning(
                    "VolumeMismatch",
                    format!(
                        "Cannot bind PersistentVolume to requested PersistentVolumeClaim {cname:?} due to incompatible volumeMode."
                    ),
                ),
                claim: warning(
                    "VolumeMismatch",
                    format!(
                        "Cannot bind PersistentVolume {vname:?} to requested PersistentVolumeClaim due to incompatible volumeMode."
                    ),
                ),
            };
        }
        return VolumeStep::SyncClaim(claim_key(claim));
    }
    if bound_to == vname {
        return set("Bound");
    }
    let provisioned = has_annotation(&volume.metadata, ANN_DYNAMICALLY_PROVISIONED);
    if provisioned && reclaim_policy(volume) == "Delete" {
        return VolumeStep::Release;
    }
    VolumeStep::Unbind
}

/// The volume's reclaim policy ("" when unset).
pub fn reclaim_policy(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or_default()
}

/// What reclaiming a released volume does (`reclaimVolume`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reclaim {
    /// Retain, or a volume migrated to CSI (its provisioner reclaims it).
    Keep,
    /// Delete: see [`deleter`].
    Delete,
    /// Mark the volume Failed with the Event (only when it was not Failed already).
    Fail(Ev),
}

/// `reclaimVolume`.
pub fn reclaim(volume: &PersistentVolume) -> Reclaim {
    if volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_MIGRATED_TO))
        .is_some_and(|m| !m.is_empty())
    {
        return Reclaim::Keep;
    }
    match reclaim_policy(volume) {
        "Retain" => Reclaim::Keep,
        "Delete" => Reclaim::Delete,
        "Recycle" => {
            let spec = volume.spec.as_ref();
            let recyclable = spec.is_some_and(|s| s.host_path.is_some() || s.nfs.is_some());
            Reclaim::Fail(warning(
                "VolumeFailedRecycle",
                if recyclable {
                    // Upstream runs a recycler Pod (`rm -rf` of the volume) here; not built.
                    "Recycle is not supported by kpr's persistentvolume-binder (kube-controller-manager runs a recycler Pod)"
                } else {
                    "No recycler plugin found for the volume!"
                },
            ))
        }
        _ => Reclaim::Fail(warning(
            "VolumeUnknownReclaimPolicy",
            "Volume has unrecognized PersistentVolumeReclaimPolicy",
        )),
    }
}

/// Who deletes a released volume of policy Delete (`findDeletablePlugin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleter {
    /// An external provisioner (or CSI driver) does: nothing to do here.
    External,
    /// The in-tree host-path deleter: removes the directory (only under `/tmp/`), then the
    /// volume object.
    HostPath(String),
    /// No deleter: the volume is marked Failed with a VolumeFailedDelete Event of this message.
    Error(String),
}

/// `findDeletablePlugin` with kube-controller-manager's in-tree plugins (host-path, nfs, fc,
/// iscsi, csi: only host-path deletes).
pub fn deleter(volume: &PersistentVolume) -> Deleter {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let ann = volume.metadata.annotations.as_ref();
    let spec = volume.spec.as_ref();
    let host_path = || {
        spec.and_then(|s| s.host_path.as_ref())
            .map(|h| h.path.clone())
    };
    if let Some(plugin) = ann
        .and_then(|a| a.get(ANN_DYNAMICALLY_PROVISIONED))
        .filter(|p| !p.is_empty())
    {
        if plugin == HOST_PATH_PLUGIN {
            return match host_path() {
                Some(p) => Deleter::HostPath(p),
                None => Deleter::Error(format!(
                    "failed to create deleter for volume {name:?}: spec.PersistentVolumeSource.HostPath is nil"
                )),
            };
        }
        if !plugin.starts_with("kubernetes.io/") {
            return Deleter::External;
        }
        return Deleter::Error(format!("no volume plugin matched name: {plugin}"));
    }
    if ann.is_some_and(|a| a.contains_key(ANN_MIGRATED_TO)) {
        return Deleter::External;
    }
    if spec.is_some_and(|s| s.csi.is_some()) {
        return Deleter::External;
    }
    if let Some(p) = host_path() {
        return Deleter::HostPath(p);
    }
    let undeletable = spec.is_some_and(|s| s.nfs.is_some() || s.fc.is_some() || s.iscsi.is_some());
    let why = if undeletable {
        "no deletable volume plugin matched"
    } else {
        "no volume plugin matched"
    };
    Deleter::Error(format!(
        "error getting deleter volume plugin for volume {name:?}: {why}"
    ))
}

/// Whether the host-path deleter takes the path (`/tmp/.+` anywhere in it, as upstream's
/// unanchored pattern), else its error.
pub fn host_path_deletable(path: &str) -> Result<(), String> {
    let ok = path
        .match_indices("/tmp/")
        .any(|(i, _)| path.len() > i + "/tmp/".len());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "host_path deleter only supports /tmp/.+ but received provided {path}"
        ))
    }
}

/// `isVolumeReleased`: the volume has a claimRef with a uid, and its claim is gone (or has
/// another uid, or is bound to another volume).
pub fn is_released(volume: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> bool {
    let Some((_, _, uid)) = claim_ref(volume) else {
        return false;
    };
    if uid.is_empty() {
        return false;
    }
    match claim {
        Some(c) if c.metadata.uid.as_deref() == Some(uid) => {
            let bound = claim_volume_name(c);
            !bound.is_empty() && Some(bound) != volume.metadata.name.as_deref()
        }
        _ => true,
    }
}

/// `GetDefaultClass`: of the classes annotated default, the newest (the first by name among
/// equally new ones).
pub fn default_class<'a>(
    classes: impl IntoIterator<Item = &'a StorageClass>,
) -> Option<&'a StorageClass> {
    let mut defaults: Vec<&StorageClass> = classes
        .into_iter()
        .filter(|c| {
            let a = c.metadata.annotations.as_ref();
            let is = |k| a.and_then(|a| a.get(k)).is_some_and(|v| v == "true");
            is(ANN_DEFAULT_CLASS) || is(ANN_BETA_DEFAULT_CLASS)
        })
        .collect();
    defaults.sort_by(|a, b| {
        let ta = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let tb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
        tb.cmp(&ta)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    defaults.first().copied()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
