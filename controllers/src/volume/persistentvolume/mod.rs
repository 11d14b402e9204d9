//! The PersistentVolume controller (kube-controller-manager v1.34's `persistentvolume-binder`,
//! `pkg/controller/volume/persistentvolume`): binds claims to volumes and keeps both sides'
//! status, hands claims to external provisioners, and reclaims released volumes.
//!
//! - A claim without a volume gets the best matching one ([`index::find_best_match`]: class,
//!   access modes, the smallest big enough, selector, volumeMode; a volume pre-bound to it by its
//!   claimRef first). Binding writes, in upstream's order: the volume's claimRef (and
//!   `pv.kubernetes.io/bound-by-controller: "yes"` when the controller chose it), its phase
//!   Bound; the claim's volumeName (`bound-by-controller` when the controller set it) and
//!   `pv.kubernetes.io/bind-completed: "yes"`; its status Bound with the volume's access modes
//!   and capacity.
//! - A claim of a WaitForFirstConsumer class waits (Event WaitForFirstConsumer, or
//!   WaitForPodScheduled naming its unscheduled Pods) until the scheduler annotates it with
//!   `volume.kubernetes.io/selected-node`; a claim of a class with a provisioner and no volume
//!   to bind is annotated `volume.kubernetes.io/storage-provisioner` (and the beta spelling) for
//!   the external provisioner, with the ExternalProvisioning Event; the provisioner's volume,
//!   pre-bound to the claim, is then bound.
//! - A bound claim whose volume is gone (or bound to another claim) becomes Lost; a volume whose
//!   claim is gone becomes Released and is reclaimed by its policy: Retain keeps it, Delete
//!   deletes it when kube-controller-manager would (the in-tree host-path deleter) and leaves it
//!   to its external provisioner otherwise.
//!
//! Decisions are [`plan`]'s; this module reads the caches, applies a step with the API's
//! writes (full updates of the cached object, as upstream: a conflict fails the sync, retried)
//! and queues. Two queues, `claims` and `volumes`, one worker each, and every claim and volume
//! queued again every `--pvclaimbinder-sync-period` (15 s), as upstream, which retries a Pending
//! claim only then (a new volume does not queue the claims that could use it).
//!
//! Differs from upstream: no recycler (a volume of policy Recycle becomes Failed, see
//! docs/VOLUMES.md), no in-tree provisioning (host-path provisioning is off by default upstream
//! too), no CSI migration annotation rewriting, and no `kubernetes.io/pv-controller` finalizer
//! (upstream adds it only to volumes provisioned by an in-tree plugin, which kpr never has).

pub mod index;
pub mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, Resource};

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::{claim_keys, CachedPod, POD_CLAIMS};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{split_key, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_workers_of, wait_for_caches};

use index::{claim_phase, claim_volume_name, volume_phase};
use plan::{ClaimStep, ClaimWorld, Deleter, Ev, Reclaim, VolumeStep};

/// The controller's name: its `--controllers` name, its Events' source and its logs'.
pub const NAME: &str = "persistentvolume-binder";

/// The Events' source component, as upstream's recorder names it.
pub const COMPONENT: &str = "persistentvolume-controller";

/// The claim queue's and the volume queue's names, as upstream.
pub const CLAIM_QUEUE: &str = "claims";
pub const VOLUME_QUEUE: &str = "volumes";

/// The controller's settings.
#[derive(Clone)]
pub struct Config {
    /// How often every claim and volume is synced again (`--pvclaimbinder-sync-period`).
    pub sync_period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            sync_period: Duration::from_secs(15),
        }
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    recorder: Recorder,
    volumes: Arc<Indexed<PersistentVolume>>,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    classes: Arc<Indexed<StorageClass>>,
    pods: Arc<Indexed<CachedPod>>,
    claim_queue: Arc<WorkQueue<String>>,
    volume_queue: Arc<WorkQueue<String>>,
}

/// A reference to `obj` as `reference.GetReference` makes it (with its resourceVersion).
fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    obj.object_ref(&())
}

fn name_of<K: Resource>(obj: &K) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

fn key_of_claim(c: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or_default(),
        c.metadata.name.as_deref().unwrap_or_default()
    )
}

fn set_annotation(meta: &mut kube::core::ObjectMeta, key: &str, value: &str) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_string(), value.to_string());
}

fn has_annotation(meta: &kube::core::ObjectMeta, key: &str) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

impl Controller {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let pv_informer = informers.get::<PersistentVolume>();
        let pvc_informer = informers.get::<PersistentVolumeClaim>();
        let sc_informer = informers.get::<StorageClass>();
        let pod_informer = informers.get::<CachedPod>();
        pod_informer.add_index(POD_CLAIMS, claim_keys);
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), COMPONENT),
            client,
            config,
            volumes: pv_informer.cache(),
            claims: pvc_informer.cache(),
            classes: sc_informer.cache(),
            pods: pod_informer.cache(),
            claim_queue: WorkQueue::new(CLAIM_QUEUE),
            volume_queue: WorkQueue::new(VOLUME_QUEUE),
        });
        pvc_informer.on_change_of(&this, |c, old, new| match (old, new) {
            (_, Some(claim)) => c.claim_queue.add(key_of_claim(claim)),
            // A claim deleted: its volume is released now, not at the next resync.
            (Some(claim), None) => {
                let volume = claim_volume_name(claim);
                if !volume.is_empty() {
                    c.volume_queue.add(volume.to_string());
                }
            }
            (None, None) => {}
        });
        pv_informer.on_change_of(&this, |c, old, new| match (old, new) {
            (_, Some(v)) => c.volume_queue.add(name_of(&**v)),
            // A volume deleted: its claim is Lost now, not at the next resync.
            (Some(v), None) => {
                if let Some((ns, name, _)) = index::claim_ref(v) {
                    c.claim_queue.add(format!("{ns}/{name}"));
                }
            }
            (None, None) => {}
        });
        this
    }

    /// Waits for the caches, then runs the workers of both queues and the resync.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(
            NAME,
            &[&*self.volumes, &*self.claims, &*self.classes, &*self.pods],
        )
        .await;
        tracing::info!(controller = NAME, "controller started");
        let claims = run_workers_of(&self, &self.claim_queue, 1, |c, key| async move {
            c.sync_claim(&key).await
        });
        let volumes = run_workers_of(&self, &self.volume_queue, 1, |c, name| async move {
            c.sync_volume(&name).await
        });
        let this = self.clone();
        let resync = async move {
            loop {
                tokio::time::sleep(this.config.sync_period).await;
                this.resync();
            }
        };
        // The resync stops with the workers (queues shut down, or leadership lost).
        tokio::select! {
            _ = async { futures::join!(claims, volumes) } => {}
            () = resync => {}
        }
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.claim_queue.shut_down();
        self.volume_queue.shut_down();
    }

    /// Queues every claim and volume (`resync`).
    fn resync(&self) {
        for c in self.claims.all() {
            self.claim_queue.add(key_of_claim(&c));
        }
        for v in self.volumes.all() {
            self.volume_queue.add(name_of(&*v));
        }
    }

    fn event<K: Resource<DynamicType = ()>>(&self, obj: &K, ev: &Ev) {
        self.recorder
            .publish(&reference(obj), ev.warning, ev.reason, ev.message.clone());
    }

    fn claim_api(&self, ns: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn volume_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// The Pods using the claim that are neither scheduled nor terminated, by name
    /// (`findNonScheduledPodsByPVC`).
    fn unscheduled_pods(&self, key: &str) -> Vec<String> {
        self.pods
            .index(POD_CLAIMS, key)
            .iter()
            .filter(|p| !p.is_terminal())
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or_default()
                    .is_empty()
            })
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    /// `syncClaim` of the claim `namespace/name`.
    async fn sync_claim(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(claim) = self.claims.get(ns, name) else {
            return Ok(());
        };
        let volumes = self.volumes.all();
        let volume_name = claim_volume_name(&claim);
        let named_volume = (!volume_name.is_empty())
            .then(|| self.volumes.get("", volume_name))
            .flatten();
        let class_name = index::claim_class(&claim);
        let class = (!class_name.is_empty())
            .then(|| self.classes.get("", &class_name))
            .flatten();
        let classes = self.classes.all();
        let default = plan::default_class(classes.iter().map(|c| &**c)).map(name_of);
        let world = ClaimWorld {
            volumes: &volumes,
            named_volume: named_volume.as_deref(),
            class: class.as_deref(),
            default_class: default.as_deref(),
            unscheduled_pods: self.unscheduled_pods(key),
        };
        let step = plan::plan_claim(&claim, &world);
        tracing::debug!(controller = NAME, claim = key, ?step, "claim sync");
        let object = || format!("PersistentVolumeClaim {key}");
        match step {
            ClaimStep::Nothing => Ok(()),
            ClaimStep::Event(ev) => {
                self.event(&*claim, &ev);
                Ok(())
            }
            ClaimStep::Pending(ev) => {
                if let Some(ev) = ev {
                    self.event(&*claim, &ev);
                }
                self.update_claim_status(&claim, "Pending", None).await?;
                Ok(())
            }
            ClaimStep::Lost(ev) => {
                let new = self.update_claim_status(&claim, "Lost", None).await?;
                self.event(&new, &ev);
                Ok(())
            }
            ClaimStep::Bind(volume) => {
                let Some(volume) = self.volumes.get("", &volume) else {
                    return Ok(());
                };
                self.bind(&volume, &claim).await
            }
            ClaimStep::AssignClass(class) => {
                let mut new = (*claim).clone();
                if let Some(spec) = new.spec.as_mut() {
                    spec.storage_class_name = Some(class);
                }
                self.claim_api(ns)
                    .replace(name, &PostParams::default(), &new)
                    .await
                    .map_err(|e| Error::kube("assigning the default class to", object(), e))?;
                Ok(())
            }
            ClaimStep::ProvisionExternal(provisioner) => {
                let new = match self.set_claim_provisioner(&claim, &provisioner).await {
                    Ok(new) => new,
                    Err(e) => {
                        self.event(
                            &*claim,
                            &Ev {
                                warning: true,
                                reason: "ProvisioningFailed",
                                message: format!("Error saving claim: {e}"),
                            },
                        );
                        return Err(e);
                    }
                };
                self.event(
                    &new,
                    &Ev {
                        warning: false,
                        reason: "ExternalProvisioning",
                        message: plan::external_provisioning_message(&provisioner),
                    },
                );
                Ok(())
            }
            ClaimStep::ProvisionInTreeFails { provisioner, event } => {
                let new = self.set_claim_provisioner(&claim, &provisioner).await?;
                self.event(&new, &event);
                Ok(())
            }
            ClaimStep::Fail(ev, reason) => {
                if let Some(ev) = ev {
                    self.event(&*claim, &ev);
                }
                Err(Error::Invalid {
                    object: object(),
                    reason,
                })
            }
        }
    }

    /// `setClaimProvisioner`: both provisioner annotations, unless the new one is set already.
    async fn set_claim_provisioner(
        &self,
        claim: &PersistentVolumeClaim,
        provisioner: &str,
    ) -> Result<PersistentVolumeClaim> {
        let ann = claim.metadata.annotations.as_ref();
        if ann
            .and_then(|a| a.get(plan::ANN_STORAGE_PROVISIONER))
            .map(String::as_str)
            == Some(provisioner)
        {
            return Ok(claim.clone());
        }
        let mut new = claim.clone();
        set_annotation(
            &mut new.metadata,
            plan::ANN_BETA_STORAGE_PROVISIONER,
            provisioner,
        );
        set_annotation(
            &mut new.metadata,
            plan::ANN_STORAGE_PROVISIONER,
            provisioner,
        );
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        self.claim_api(ns)
            .replace(&name_of(claim), &PostParams::default(), &new)
            .await
            .map_err(|e| {
                Error::kube(
                    "annotating the provisioner of",
                    format!("PersistentVolumeClaim {}", key_of_claim(claim)),
                    e,
                )
            })
    }

    /// `updateClaimStatus`: the phase, and the volume's access modes and capacity (the capacity
    /// only when the claim becomes Bound), written when they differ.
    async fn update_claim_status(
        &self,
        claim: &PersistentVolumeClaim,
        phase: &str,
        volume: Option<&PersistentVolume>,
    ) -> Result<PersistentVolumeClaim> {
        let mut new = claim.clone();
        let status = new.status.get_or_insert_with(Default::default);
        let mut dirty = false;
        if claim_phase(claim) != phase {
            status.phase = Some(phase.to_string());
            dirty = true;
        }
        match volume {
            None => {
                for gone in [
                    status.access_modes.take().is_some(),
                    status.capacity.take().is_some(),
                    status.current_volume_attributes_class_name.take().is_some(),
                ] {
                    dirty |= gone;
                }
            }
            Some(v) => {
                let spec = v.spec.clone().unwrap_or_default();
                if status.access_modes != spec.access_modes {
                    status.access_modes = spec.access_modes.clone();
                    dirty = true;
                }
                if claim_phase(claim) != phase {
                    let cap = index::volume_capacity(v);
                    let have = status
                        .capacity
                        .as_ref()
                        .and_then(|c| c.get("storage"))
                        .and_then(|q| crate::helpers::quantity::Quantity::parse(&q.0).ok());
                    if have != Some(cap) {
                        status.capacity = spec.capacity.clone();
                        dirty = true;
                    }
                    if claim_phase(claim) == "Pending"
                        && phase == "Bound"
                        && status.current_volume_attributes_class_name
                            != spec.volume_attributes_class_name
                    {
                        status.current_volume_attributes_class_name =
                            spec.volume_attributes_class_name.clone();
                        dirty = true;
                    }
                }
            }
        }
        if !dirty {
            return Ok(claim.clone());
        }
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        self.claim_api(ns)
            .replace_status(&name_of(claim), &PostParams::default(), &new)
            .await
            .map_err(|e| {
                Error::kube(
                    "updating the status of",
                    format!("PersistentVolumeClaim {}", key_of_claim(claim)),
                    e,
                )
            })
    }

    /// `updateVolumePhase`: the phase and message, when the phase differs.
    async fn update_volume_phase(
        &self,
        volume: &PersistentVolume,
        phase: &str,
        message: Option<String>,
    ) -> Result<PersistentVolume> {
        if volume_phase(volume) == phase {
            return Ok(volume.clone());
        }
        let mut new = volume.clone();
        let status = new.status.get_or_insert_with(Default::default);
        status.phase = Some(phase.to_string());
        status.message = message;
        self.volume_api()
            .replace_status(&name_of(volume), &PostParams::default(), &new)
            .await
            .map_err(|e| {
                Error::kube(
                    "updating the status of",
                    format!("PersistentVolume {}", name_of(volume)),
                    e,
                )
            })
    }

    /// `bind`: the volume's side first (claimRef, phase), then the claim's (volumeName and
    /// annotations, status).
    async fn bind(&self, volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> Result<()> {
        let vname = name_of(volume);
        // `GetBindVolumeToClaim`.
        let mut volume = volume.clone();
        let by_controller = !index::is_volume_bound_to_claim(&volume, claim);
        let mut dirty = false;
        let same_ref = index::claim_ref(&volume).is_some_and(|(ns, name, uid)| {
            Some(ns) == claim.metadata.namespace.as_deref()
                && Some(name) == claim.metadata.name.as_deref()
                && Some(uid) == claim.metadata.uid.as_deref()
        });
        if !same_ref {
            volume.spec.get_or_insert_with(Default::default).claim_ref = Some(reference(claim));
            dirty = true;
        }
        if by_controller && !has_annotation(&volume.metadata, plan::ANN_BOUND_BY_CONTROLLER) {
            set_annotation(&mut volume.metadata, plan::ANN_BOUND_BY_CONTROLLER, "yes");
            dirty = true;
        }
        if dirty {
            volume = self
                .volume_api()
                .replace(&vname, &PostParams::default(), &volume)
                .await
                .map_err(|e| Error::kube("binding", format!("PersistentVolume {vname}"), e))?;
        }
        let volume = self.update_volume_phase(&volume, "Bound", None).await?;

        // `bindClaimToVolume`.
        let mut new = claim.clone();
        let mut dirty = false;
        if claim_volume_name(claim) != vname {
            new.spec.get_or_insert_with(Default::default).volume_name = Some(vname.clone());
            if !has_annotation(&new.metadata, plan::ANN_BOUND_BY_CONTROLLER) {
                set_annotation(&mut new.metadata, plan::ANN_BOUND_BY_CONTROLLER, "yes");
            }
            dirty = true;
        }
        if !has_annotation(&new.metadata, plan::ANN_BIND_COMPLETED) {
            set_annotation(&mut new.metadata, plan::ANN_BIND_COMPLETED, "yes");
            dirty = true;
        }
        let claim = if dirty {
            let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
            self.claim_api(ns)
                .replace(&name_of(claim), &PostParams::default(), &new)
                .await
                .map_err(|e| {
                    Error::kube(
                        "binding",
                        format!("PersistentVolumeClaim {}", key_of_claim(claim)),
                        e,
                    )
                })?
        } else {
            new
        };
        self.update_claim_status(&claim, "Bound", Some(&volume))
            .await?;
        Ok(())
    }

    /// `syncVolume` of the volume `name`.
    async fn sync_volume(&self, name: &str) -> Result<()> {
        let Some(volume) = self.volumes.get("", name) else {
            return Ok(());
        };
        let claim = self.claim_of(&volume).await?;
        let step = plan::plan_volume(&volume, claim.as_ref());
        tracing::debug!(controller = NAME, volume = name, ?step, "volume sync");
        match step {
            VolumeStep::Nothing => Ok(()),
            VolumeStep::Phase(p) => self.update_volume_phase(&volume, p, None).await.map(drop),
            VolumeStep::SyncClaim(key) => {
                self.claim_queue.add(key);
                Ok(())
            }
            VolumeStep::Mismatch {
                volume: v_ev,
                claim: c_ev,
            } => {
                self.event(&*volume, &v_ev);
                if let Some(c) = &claim {
                    self.event(c, &c_ev);
                }
                Ok(())
            }
            VolumeStep::Unbind => self.unbind(&volume).await,
            VolumeStep::Release => {
                let volume = match volume_phase(&volume) {
                    "Released" | "Failed" => (*volume).clone(),
                    _ => {
                        tracing::info!(
                            controller = NAME,
                            volume = name,
                            policy = plan::reclaim_policy(&volume),
                            "volume is released and its reclaim policy will be executed"
                        );
                        self.update_volume_phase(&volume, "Released", None).await?
                    }
                };
                self.reclaim(&volume).await
            }
        }
    }

    /// The claim the volume's claimRef names, when it exists with the claimRef's uid: from the
    /// cache, and (as upstream, against a cache behind a provisioner's or the scheduler's
    /// writes) from the API server before a not Released or Failed volume's claim is taken for
    /// gone, or when the cached claim has another uid.
    async fn claim_of(&self, volume: &PersistentVolume) -> Result<Option<PersistentVolumeClaim>> {
        let Some((ns, name, uid)) = index::claim_ref(volume) else {
            return Ok(None);
        };
        if uid.is_empty() {
            return Ok(None);
        }
        let cached = self.claims.get(ns, name);
        let ask = match &cached {
            None => !matches!(volume_phase(volume), "Released" | "Failed"),
            Some(c) => c.metadata.uid.as_deref() != Some(uid),
        };
        let claim = if ask {
            self.claim_api(ns).get_opt(name).await.map_err(|e| {
                Error::kube("reading", format!("PersistentVolumeClaim {ns}/{name}"), e)
            })?
        } else {
            cached.map(|c| (*c).clone())
        };
        Ok(claim.filter(|c| c.metadata.uid.as_deref() == Some(uid)))
    }

    /// `unbindVolume`.
    async fn unbind(&self, volume: &PersistentVolume) -> Result<()> {
        let mut new = volume.clone();
        if has_annotation(&volume.metadata, plan::ANN_BOUND_BY_CONTROLLER) {
            if let Some(spec) = new.spec.as_mut() {
                spec.claim_ref = None;
            }
            if let Some(a) = new.metadata.annotations.as_mut() {
                a.remove(plan::ANN_BOUND_BY_CONTROLLER);
                if a.is_empty() {
                    new.metadata.annotations = None;
                }
            }
        } else if let Some(r) = new.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            r.uid = Some(String::new());
        }
        let vname = name_of(volume);
        let new = self
            .volume_api()
            .replace(&vname, &PostParams::default(), &new)
            .await
            .map_err(|e| Error::kube("unbinding", format!("PersistentVolume {vname}"), e))?;
        self.update_volume_phase(&new, "Available", None)
            .await
            .map(drop)
    }

    /// `reclaimVolume`.
    async fn reclaim(&self, volume: &PersistentVolume) -> Result<()> {
        match plan::reclaim(volume) {
            Reclaim::Keep => Ok(()),
            Reclaim::Fail(ev) => self.fail_volume(volume, &ev).await,
            Reclaim::Delete => self.delete_volume(volume).await,
        }
    }

    /// `updateVolumePhaseWithEvent(Failed)`: the Event only when the phase changes.
    async fn fail_volume(&self, volume: &PersistentVolume, ev: &Ev) -> Result<()> {
        if volume_phase(volume) == "Failed" {
            return Ok(());
        }
        let new = self
            .update_volume_phase(volume, "Failed", Some(ev.message.clone()))
            .await?;
        self.event(&new, ev);
        Ok(())
    }

    /// `deleteVolumeOperation`: the volume read afresh; still released, its deleter runs and the
    /// volume object is deleted, or it is left to the external deleter, or marked Failed.
    async fn delete_volume(&self, volume: &PersistentVolume) -> Result<()> {
        let vname = name_of(volume);
        let Ok(Some(fresh)) = self.volume_api().get_opt(&vname).await else {
            return Ok(());
        };
        let claim = index::claim_ref(&fresh)
            .and_then(|(ns, name, _)| self.claims.get(ns, name))
            .map(|c| (*c).clone());
        if !plan::is_released(&fresh, claim.as_ref()) {
            return Ok(());
        }
        let failed = |message: String| Ev {
            warning: true,
            reason: "VolumeFailedDelete",
            message,
        };
        match plan::deleter(volume) {
            Deleter::External => Ok(()),
            Deleter::Error(message) => self.fail_volume(volume, &failed(message)).await,
            Deleter::HostPath(path) => {
                if let Err(message) = plan::host_path_deletable(&path) {
                    return self.fail_volume(volume, &failed(message)).await;
                }
                if let Err(e) = remove_all(&path) {
                    return self.fail_volume(volume, &failed(format!("{e}"))).await;
                }
                match self
                    .volume_api()
                    .delete(&vname, &DeleteParams::default())
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if apierrors::is_not_found(&e) => Ok(()),
                    // As upstream: the next sync tries again.
                    Err(e) => {
                        tracing::info!(controller = NAME, volume = vname, "deleting: {e}");
                        Ok(())
                    }
                }
            }
        }
    }
}

/// `os.RemoveAll`: the path and everything under it; a missing path is no error.
fn remove_all(path: &str) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    }
}
