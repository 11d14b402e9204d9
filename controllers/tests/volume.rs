//! The volume controllers (persistentvolume-binder, persistentvolume-protection,
//! persistentvolumeclaim-protection, ephemeral-volume) end to end against the reference control
//! plane, once with kube-controller-manager (`upstream_*`) and once with our `controller-manager`
//! (`kpr_*`), both with `--controllers` naming those four (kube-controller-manager's names, which
//! ours takes too). The same checks hold for both. No kubelet and no scheduler run: Pods are
//! bound by `spec.nodeName`, the test plays the scheduler (the selected-node annotation) and the
//! external provisioner (a volume pre-bound to the claim).
//!
//! - binding: static volumes of several sizes, classes, access modes and modes, and claims each
//!   with one right answer (the smallest that fits, the access-mode group with the fewest modes,
//!   the selector, the volumeMode, a claimRef pre-binding winning over a smaller volume, a
//!   claim naming its volume); both sides' phases, claimRef/volumeName, capacity, access modes
//!   and the bind-completed / bound-by-controller annotations as upstream writes them;
//! - bad input: a claim naming a volume of another class (VolumeMismatch), one no volume fits of
//!   a class that does not exist (ProvisioningFailed naming the class), one with a selector
//!   matching nothing and no class (FailedBinding); each stays unbound with its Event;
//! - delayed binding: a WaitForFirstConsumer claim stays Pending with the WaitForFirstConsumer
//!   Event until the selected-node annotation, then gets the storage-provisioner annotations and
//!   the ExternalProvisioning Event; the provisioner's volume is bound; an Immediate class's
//!   claim is handed over at once;
//! - reclaim: claims deleted: the Retain volume becomes Released and stays, the Delete host-path
//!   volume (under /tmp, absent) is deleted, the Delete NFS volume becomes Failed with
//!   VolumeFailedDelete, the provisioned volume is Released and left to its provisioner; a bound
//!   claim whose volume is deleted becomes Lost;
//! - protection: a claim used by a scheduled Pod keeps its finalizer (and stays) while the Pod
//!   exists; a Bound volume deleted stays until its claim goes;
//! - ephemeral: a Pod's ephemeral volume gets its claim (owner, labels, spec); a claim of that
//!   name the Pod does not own gets the Warning FailedBinding Event on the Pod;
//! - expansion: a Bound claim of an expandable class asks for more; a CSI volume's claim gets the
//!   ExternalExpanding Event (an external resizer's job), a GCE PD volume's (migrated to CSI) the
//!   Event naming the migration and the storage-resizer annotation naming the CSI driver;
//! - VolumeAttributesClass protection: a class gets the `kubernetes.io/vac-protection`
//!   finalizer; deleted while a claim and a volume name it, it stays until both are gone;
//! - attach/detach: a Pod on a node whose kubelet leaves attaching to the controller gets a
//!   VolumeAttachment for its CSI volume (named as the CSI attacher names it; none for a driver
//!   whose CSIDriver says `attachRequired: false`); the test plays the external-attacher
//!   (`status.attached`), and the node's `volumesAttached` lists the volume with the
//!   SuccessfulAttachVolume Event; a Pod on a second node using the same ReadWriteOnce volume
//!   gets the Multi-Attach Event naming the first Pod and no attachment; the first Pod deleted
//!   while kubelet (the test) reports the volume in use: it stays attached and reported until
//!   `volumesInUse` lets go, then leaves `volumesAttached` and is detached, and the second node
//!   gets its attachment, attached, reported, and detached when its Pod goes; an attachment the
//!   test makes itself on a managed node is left alone throughout.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{client_with_namespace, create_in};
use common::events::recorded_by;
use common::{Cluster, Flavour};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{
    CSIDriver, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// kube-controller-manager's names of the controllers under test; ours takes the same.
const CONTROLLERS: &str = "persistentvolume-binder-controller,persistentvolume-protection-controller,persistentvolumeclaim-protection-controller,ephemeral-volume-controller,volumeattributesclass-protection-controller,persistentvolume-expander-controller,persistentvolume-attach-detach-controller";

const NS: &str = "volumes";
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
const BINDER: &str = "persistentvolume-controller";

struct Fixture<'a> {
    cluster: &'a Cluster,
    pvs: Api<PersistentVolume>,
    pvcs: Api<PersistentVolumeClaim>,
    pods: Api<Pod>,
    events: Api<Event>,
    /// Events about volumes (cluster-scoped objects' Events go to `default`).
    volume_events: Api<Event>,
    /// Host-path directories under /tmp unique to the flavour (the Delete deleter removes them).
    tmp: String,
}

fn pv(
    name: &str,
    size: &str,
    class: &str,
    modes: &[&str],
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": modes,
            "storageClassName": class,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": format!("/data/{name}")},
        }
    });
    json_patch::merge(&mut v, &extra);
    v
}

fn pvc(
    name: &str,
    size: &str,
    class: &str,
    modes: &[&str],
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {
            "resources": {"requests": {"storage": size}},
            "accessModes": modes,
            "storageClassName": class,
        }
    });
    json_patch::merge(&mut v, &extra);
    v
}

const RWO: &[&str] = &["ReadWriteOnce"];

impl Fixture<'_> {
    async fn create_pv(&self, v: serde_json::Value) {
        let obj: PersistentVolume = serde_json::from_value(v).unwrap();
        self.pvs.create(&PostParams::default(), &obj).await.unwrap();
    }

    async fn create_pvc(&self, v: serde_json::Value) -> PersistentVolumeClaim {
        create_in(&self.pvcs.clone().into_client(), NS, v).await
    }

    async fn pv_phase(&self, name: &str) -> Result<PersistentVolume, String> {
        let v = self.pvs.get_opt(name).await.unwrap().ok_or("gone")?;
        Ok(v)
    }

    /// Waits until the volume's phase is `phase`.
    async fn volume_in(&self, name: &str, phase: &str) -> PersistentVolume {
        self.cluster
            .eventually_showing(
                &format!("PersistentVolume {name} {phase}"),
                WAIT,
                POLL,
                || async {
                    let v = self.pv_phase(name).await?;
                    let p = v
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default();
                    if p == phase {
                        Ok(v)
                    } else {
                        Err(format!("phase {p:?}"))
                    }
                },
            )
            .await
    }

    /// Waits until the claim's phase is `phase`.
    async fn claim_in(&self, name: &str, phase: &str) -> PersistentVolumeClaim {
        self.cluster
            .eventually_showing(
                &format!("PersistentVolumeClaim {name} {phase}"),
                WAIT,
                POLL,
                || async {
                    let c = self.pvcs.get_opt(name).await.unwrap().ok_or("gone")?;
                    let p = c
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default();
                    if p == phase {
                        Ok(c)
                    } else {
                        Err(format!("phase {p:?}"))
                    }
                },
            )
            .await
    }

    /// Waits for the Event `reason` with `message` about `object`, recorded by `component`.
    async fn event(&self, object: &str, reason: &str, message: &str, component: &str) {
        self.cluster
            .eventually_showing(
                &format!("the {reason} Event of {object}"),
                WAIT,
                POLL,
                || async {
                    let api = if object.starts_with("pv-") {
                        &self.volume_events
                    } else {
                        &self.events
                    };
                    let seen = recorded_by(
                        api,
                        &format!("involvedObject.name={object},reason={reason}"),
                        component,
                    )
                    .await;
                    let messages: Vec<String> =
                        seen.iter().filter_map(|e| e.message.clone()).collect();
                    if messages.iter().any(|m| m == message) {
                        Ok(())
                    } else {
                        Err(format!("{messages:?}"))
                    }
                },
            )
            .await;
    }

    async fn gone<K>(&self, api: &Api<K>, name: &str)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        self.cluster
            .eventually(&format!("{name} gone"), WAIT, POLL, || async {
                api.get_opt(name).await.unwrap().is_none().then_some(())
            })
            .await;
    }
}

fn annotations(meta: &kube::core::ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations.clone().unwrap_or_default()
}

/// The binding's annotations (`pv.kubernetes.io/bind-completed`, `.../bound-by-controller`).
fn binding_annotations(meta: &kube::core::ObjectMeta) -> BTreeMap<String, String> {
    let mut a = annotations(meta);
    a.retain(|k, _| k == BIND_COMPLETED || k == BOUND_BY_CONTROLLER);
    a
}

fn yes(keys: &[&str]) -> BTreeMap<String, String> {
    keys.iter()
        .map(|k| (k.to_string(), "yes".to_string()))
        .collect()
}

const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// Checks both sides of the binding of claim `claim` to volume `volume`; `user_named_volume`: the
/// claim named the volume itself, `user_prebound`: the volume's claimRef was the user's.
async fn bound(
    f: &Fixture<'_>,
    claim: &str,
    volume: &str,
    user_named_volume: bool,
    user_prebound: bool,
) {
    let c = f.claim_in(claim, "Bound").await;
    let v = f.volume_in(volume, "Bound").await;
    let flavour = f.cluster.flavour;
    assert_eq!(
        c.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(volume),
        "{flavour:?}: {claim}"
    );
    let r = v.spec.as_ref().unwrap().claim_ref.clone().unwrap();
    assert_eq!(
        (
            r.kind.as_deref(),
            r.namespace.as_deref(),
            r.name.as_deref(),
            r.uid.as_deref()
        ),
        (
            Some("PersistentVolumeClaim"),
            Some(NS),
            Some(claim),
            c.metadata.uid.as_deref()
        ),
        "{flavour:?}: claimRef of {volume}"
    );
    let status = c.status.clone().unwrap();
    let vspec = v.spec.clone().unwrap();
    assert_eq!(
        status.capacity, vspec.capacity,
        "{flavour:?}: capacity of {claim}"
    );
    assert_eq!(
        status.access_modes, vspec.access_modes,
        "{flavour:?}: access modes of {claim}"
    );
    let want_claim = if user_named_volume {
        yes(&[BIND_COMPLETED])
    } else {
        yes(&[BIND_COMPLETED, BOUND_BY_CONTROLLER])
    };
    assert_eq!(
        binding_annotations(&c.metadata),
        want_claim,
        "{flavour:?}: annotations of {claim}"
    );
    let want_volume = if user_prebound {
        yes(&[])
    } else {
        yes(&[BOUND_BY_CONTROLLER])
    };
    assert_eq!(
        binding_annotations(&v.metadata),
        want_volume,
        "{flavour:?}: annotations of {volume}"
    );
}

async fn binding(f: &Fixture<'_>) {
    let gold = json!({"metadata": {"labels": {"tier": "gold"}}});
    for v in [
        pv("pv-small", "1Gi", "slow", RWO, json!({})),
        pv("pv-medium", "5Gi", "slow", RWO, json!({})),
        pv("pv-large", "10Gi", "slow", RWO, json!({})),
        pv(
            "pv-rwx",
            "5Gi",
            "slow",
            &["ReadWriteOnce", "ReadWriteMany"],
            json!({}),
        ),
        pv("pv-fast", "2Gi", "fast", RWO, json!({})),
        pv("pv-gold", "3Gi", "slow", RWO, gold),
        pv(
            "pv-block",
            "4Gi",
            "slow",
            RWO,
            json!({"spec": {"volumeMode": "Block"}}),
        ),
        pv(
            "pv-prebound",
            "8Gi",
            "slow",
            RWO,
            json!({"spec": {"claimRef": {"namespace": NS, "name": "c-prebound"}}}),
        ),
        pv("pv-other", "1Gi", "other", RWO, json!({})),
    ] {
        f.create_pv(v).await;
    }
    for v in [
        "pv-small",
        "pv-medium",
        "pv-large",
        "pv-rwx",
        "pv-fast",
        "pv-gold",
        "pv-block",
        "pv-prebound",
        "pv-other",
    ] {
        f.volume_in(v, "Available").await;
    }
    let gold_selector = json!({"spec": {"selector": {"matchLabels": {"tier": "gold"}}}});
    for c in [
        pvc("c-gold", "2Gi", "slow", RWO, gold_selector),
        pvc("c-small", "1Gi", "slow", RWO, json!({})),
        pvc("c-medium", "4Gi", "slow", RWO, json!({})),
        pvc("c-rwx", "4Gi", "slow", &["ReadWriteMany"], json!({})),
        pvc("c-fast", "1Gi", "fast", RWO, json!({})),
        pvc(
            "c-block",
            "1Gi",
            "slow",
            RWO,
            json!({"spec": {"volumeMode": "Block"}}),
        ),
        pvc("c-prebound", "1Gi", "slow", RWO, json!({})),
        pvc(
            "c-named",
            "1Gi",
            "slow",
            RWO,
            json!({"spec": {"volumeName": "pv-large"}}),
        ),
        // Bad input.
        pvc(
            "c-mismatch",
            "1Gi",
            "slow",
            RWO,
            json!({"spec": {"volumeName": "pv-other"}}),
        ),
        pvc("c-toobig", "100Gi", "slow", RWO, json!({})),
        pvc(
            "c-nomatch",
            "1Gi",
            "",
            RWO,
            json!({"spec": {"selector": {"matchLabels": {"tier": "platinum"}}}}),
        ),
    ] {
        f.create_pvc(c).await;
    }
    for (claim, volume, named, prebound) in [
        ("c-gold", "pv-gold", false, false),
        ("c-small", "pv-small", false, false),
        ("c-medium", "pv-medium", false, false),
        ("c-rwx", "pv-rwx", false, false),
        ("c-fast", "pv-fast", false, false),
        ("c-block", "pv-block", false, false),
        ("c-prebound", "pv-prebound", false, true),
        ("c-named", "pv-large", true, false),
    ] {
        bound(f, claim, volume, named, prebound).await;
    }
    f.event(
        "c-mismatch",
        "VolumeMismatch",
        "Cannot bind to requested volume \"pv-other\": storageClassName does not match",
        BINDER,
    )
    .await;
    f.claim_in("c-mismatch", "Pending").await;
    f.event(
        "c-toobig",
        "ProvisioningFailed",
        "storageclass.storage.k8s.io \"slow\" not found",
        BINDER,
    )
    .await;
    f.event(
        "c-nomatch",
        "FailedBinding",
        "no persistent volumes available for this claim and no storage class is set",
        BINDER,
    )
    .await;
    f.claim_in("c-nomatch", "Pending").await;
    f.volume_in("pv-other", "Available").await;
    let toobig = f.pvcs.get("c-toobig").await.unwrap();
    assert_eq!(
        toobig.spec.as_ref().unwrap().volume_name,
        None,
        "{:?}: c-toobig got a volume",
        f.cluster.flavour
    );
}

async fn delayed(f: &Fixture<'_>) {
    let classes: Api<StorageClass> = Api::all(f.pvcs.clone().into_client());
    for (name, mode) in [("wffc", "WaitForFirstConsumer"), ("immediate", "Immediate")] {
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": name},
            "provisioner": "example.com/external",
            "volumeBindingMode": mode,
            "reclaimPolicy": "Delete",
        }))
        .unwrap();
        classes.create(&PostParams::default(), &sc).await.unwrap();
    }
    let claim = f
        .create_pvc(pvc("c-wffc", "1Gi", "wffc", RWO, json!({})))
        .await;
    f.event(
        "c-wffc",
        "WaitForFirstConsumer",
        "waiting for first consumer to be created before binding",
        BINDER,
    )
    .await;
    f.claim_in("c-wffc", "Pending").await;
    let c = f.pvcs.get("c-wffc").await.unwrap();
    assert!(
        !annotations(&c.metadata).contains_key("volume.kubernetes.io/storage-provisioner"),
        "{:?}: provisioning started before a node was selected",
        f.cluster.flavour
    );
    // The scheduler's choice.
    f.pvcs
        .patch(
            "c-wffc",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-a"}}})),
        )
        .await
        .unwrap();
    let message = "Waiting for a volume to be created either by the external provisioner 'example.com/external' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.";
    f.event("c-wffc", "ExternalProvisioning", message, BINDER)
        .await;
    let c = f.pvcs.get("c-wffc").await.unwrap();
    let ann = annotations(&c.metadata);
    for k in [
        "volume.kubernetes.io/storage-provisioner",
        "volume.beta.kubernetes.io/storage-provisioner",
    ] {
        assert_eq!(
            ann.get(k).map(String::as_str),
            Some("example.com/external"),
            "{:?}: {k}",
            f.cluster.flavour
        );
    }
    // The provisioner's volume, pre-bound to the claim.
    f.create_pv(pv(
        "pv-provisioned",
        "1Gi",
        "wffc",
        RWO,
        json!({
            "metadata": {"annotations": {"pv.kubernetes.io/provisioned-by": "example.com/external"}},
            "spec": {"persistentVolumeReclaimPolicy": "Delete",
                     "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": NS,
                                  "name": "c-wffc", "uid": claim.metadata.uid}},
        }),
    ))
    .await;
    bound(f, "c-wffc", "pv-provisioned", false, true).await;

    f.create_pvc(pvc("c-immediate", "1Gi", "immediate", RWO, json!({})))
        .await;
    f.event("c-immediate", "ExternalProvisioning", message, BINDER)
        .await;
}

async fn reclaim(f: &Fixture<'_>) {
    let absent = format!("{}/absent", f.tmp);
    for v in [
        pv("pv-retain", "1Gi", "reclaim", RWO, json!({})),
        pv(
            "pv-delete",
            "2Gi",
            "reclaim",
            RWO,
            json!({"spec": {"persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": absent}}}),
        ),
        pv(
            "pv-nfs",
            "3Gi",
            "reclaim",
            RWO,
            json!({"spec": {"persistentVolumeReclaimPolicy": "Delete", "hostPath": null,
                            "nfs": {"server": "192.0.2.1", "path": "/exports"}}}),
        ),
        pv("pv-vanishing", "4Gi", "reclaim", RWO, json!({})),
    ] {
        f.create_pv(v).await;
    }
    for v in ["pv-retain", "pv-delete", "pv-nfs", "pv-vanishing"] {
        f.volume_in(v, "Available").await;
    }
    for (c, size) in [
        ("c-retain", "1Gi"),
        ("c-delete", "2Gi"),
        ("c-nfs", "3Gi"),
        ("c-vanishing", "4Gi"),
    ] {
        f.create_pvc(pvc(c, size, "reclaim", RWO, json!({}))).await;
    }
    for (c, v) in [
        ("c-retain", "pv-retain"),
        ("c-delete", "pv-delete"),
        ("c-nfs", "pv-nfs"),
        ("c-vanishing", "pv-vanishing"),
    ] {
        bound(f, c, v, false, false).await;
    }
    for c in ["c-retain", "c-delete", "c-nfs", "c-wffc"] {
        f.pvcs.delete(c, &DeleteParams::default()).await.unwrap();
    }
    let retained = f.volume_in("pv-retain", "Released").await;
    assert!(
        retained.spec.unwrap().claim_ref.is_some(),
        "{:?}: a Released volume keeps its claimRef",
        f.cluster.flavour
    );
    f.gone(&f.pvs, "pv-delete").await;
    f.volume_in("pv-nfs", "Failed").await;
    f.event(
        "pv-nfs",
        "VolumeFailedDelete",
        "error getting deleter volume plugin for volume \"pv-nfs\": no deletable volume plugin matched",
        BINDER,
    )
    .await;
    // Provisioned by an external provisioner: Released, and left to it.
    f.volume_in("pv-provisioned", "Released").await;

    // A bound claim's volume deleted (its pv-protection finalizer dropped by hand): Lost.
    f.pvs
        .delete("pv-vanishing", &DeleteParams::default())
        .await
        .unwrap();
    f.pvs
        .patch(
            "pv-vanishing",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    f.gone(&f.pvs, "pv-vanishing").await;
    f.claim_in("c-vanishing", "Lost").await;
    f.event(
        "c-vanishing",
        "ClaimLost",
        "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
        BINDER,
    )
    .await;
    // Still there for the other flavour's check of the end state.
    let provisioned = f.pvs.get("pv-provisioned").await.unwrap();
    assert_eq!(provisioned.metadata.deletion_timestamp, None);
}

fn finalizers(meta: &kube::core::ObjectMeta) -> Vec<String> {
    meta.finalizers.clone().unwrap_or_default()
}

async fn protection(f: &Fixture<'_>) {
    let flavour = f.cluster.flavour;
    // Every claim and volume gets its finalizer.
    let c = f.pvcs.get("c-small").await.unwrap();
    assert!(
        finalizers(&c.metadata).contains(&"kubernetes.io/pvc-protection".to_string()),
        "{flavour:?}"
    );
    let v = f.pvs.get("pv-small").await.unwrap();
    assert!(
        finalizers(&v.metadata).contains(&"kubernetes.io/pv-protection".to_string()),
        "{flavour:?}"
    );

    // A claim used by a scheduled Pod stays while the Pod exists.
    let pod: Pod = create_in(
        &f.pvcs.clone().into_client(),
        NS,
        json!({
            "metadata": {"name": "user"},
            "spec": {"nodeName": "node-a",
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c-medium"}}]}
        }),
    )
    .await;
    f.pvcs
        .delete("c-medium", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = f.pvcs.get("c-medium").await.unwrap();
    assert!(c.metadata.deletion_timestamp.is_some(), "{flavour:?}");
    assert_eq!(
        finalizers(&c.metadata),
        vec!["kubernetes.io/pvc-protection".to_string()],
        "{flavour:?}: a claim in use lost its finalizer"
    );
    f.pods
        .delete(
            &pod.metadata.name.unwrap(),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
    f.gone(&f.pvcs, "c-medium").await;
    f.volume_in("pv-medium", "Released").await;

    // A Bound volume deleted stays until its claim goes.
    f.pvs
        .delete("pv-small", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let v = f.pvs.get("pv-small").await.unwrap();
    assert!(v.metadata.deletion_timestamp.is_some(), "{flavour:?}");
    assert_eq!(
        finalizers(&v.metadata),
        vec!["kubernetes.io/pv-protection".to_string()],
        "{flavour:?}: a Bound volume lost its finalizer"
    );
    f.pvcs
        .delete("c-small", &DeleteParams::default())
        .await
        .unwrap();
    f.gone(&f.pvs, "pv-small").await;
}

async fn ephemeral(f: &Fixture<'_>) {
    let flavour = f.cluster.flavour;
    let client = f.pvcs.clone().into_client();
    let template = json!({
        "metadata": {"labels": {"app": "scratch"}, "annotations": {"note": "from the template"}},
        "spec": {"accessModes": RWO, "storageClassName": "eph",
                 "resources": {"requests": {"storage": "1Gi"}}}
    });
    let pod: Pod = create_in(
        &client,
        NS,
        json!({
            "metadata": {"name": "eph"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                     "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}]}
        }),
    )
    .await;
    let claim = f
        .cluster
        .eventually("the ephemeral claim eph-scratch", WAIT, POLL, || async {
            f.pvcs.get_opt("eph-scratch").await.unwrap()
        })
        .await;
    let owner = &claim.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        (
            "Pod",
            "eph",
            pod.metadata.uid.as_deref().unwrap(),
            Some(true),
            Some(true)
        ),
        "{flavour:?}"
    );
    assert_eq!(
        claim
            .metadata
            .labels
            .clone()
            .unwrap()
            .get("app")
            .map(String::as_str),
        Some("scratch"),
        "{flavour:?}"
    );
    assert_eq!(
        claim
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("note")
            .map(String::as_str),
        Some("from the template"),
        "{flavour:?}"
    );
    let spec = claim.spec.unwrap();
    assert_eq!(
        spec.storage_class_name.as_deref(),
        Some("eph"),
        "{flavour:?}"
    );

    // A claim of that name not owned by the Pod.
    f.create_pvc(pvc("clash-data", "1Gi", "eph", RWO, json!({})))
        .await;
    create_in::<Pod>(
        &client,
        NS,
        json!({
            "metadata": {"name": "clash"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                     "volumes": [{"name": "data", "ephemeral": {"volumeClaimTemplate": {
                         "spec": {"accessModes": RWO, "resources": {"requests": {"storage": "1Gi"}}}}}}]}
        }),
    )
    .await;
    f.event(
        "clash",
        "FailedBinding",
        &format!("ephemeral volume data: PVC {NS}/clash-data was not created for pod {NS}/clash (pod is not owner)"),
        "ephemeral_volume",
    )
    .await;
}

async fn expansion(f: &Fixture<'_>) {
    let flavour = f.cluster.flavour;
    let client = f.pvcs.clone().into_client();
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "grow"},
                "provisioner": "csi.example.com", "allowVolumeExpansion": true}))
            .unwrap(),
        )
        .await
        .unwrap();
    for (kind, source) in [
        (
            "csi",
            json!({"csi": {"driver": "csi.example.com", "volumeHandle": "grow-1"}}),
        ),
        ("gce", json!({"gcePersistentDisk": {"pdName": "grow-2"}})),
    ] {
        let mut spec = source;
        spec["hostPath"] = serde_json::Value::Null;
        spec["claimRef"] = json!({"namespace": NS, "name": format!("c-grow-{kind}")});
        f.pvs
            .create(
                &PostParams::default(),
                &serde_json::from_value(pv(
                    &format!("pv-grow-{kind}"),
                    "1Gi",
                    "grow",
                    &["ReadWriteOnce"],
                    json!({"spec": spec}),
                ))
                .unwrap(),
            )
            .await
            .unwrap();
        f.pvcs
            .create(
                &PostParams::default(),
                &serde_json::from_value(pvc(
                    &format!("c-grow-{kind}"),
                    "1Gi",
                    "grow",
                    RWO,
                    json!({}),
                ))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    for kind in ["csi", "gce"] {
        let name = format!("c-grow-{kind}");
        f.claim_in(&name, "Bound").await;
        f.pvcs
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
            )
            .await
            .unwrap();
    }
    f.event(
        "c-grow-csi",
        "ExternalExpanding",
        "waiting for an external controller to expand this PVC",
        "volume_expand",
    )
    .await;
    f.event(
        "c-grow-gce",
        "ExternalExpanding",
        "CSI migration enabled for kubernetes.io/gce-pd; waiting for external resizer to expand the pvc",
        "volume_expand",
    )
    .await;
    f.cluster
        .eventually(
            "c-grow-gce's storage-resizer annotation",
            WAIT,
            POLL,
            || async {
                let c = f.pvcs.get("c-grow-gce").await.unwrap();
                (annotations(&c.metadata).get("volume.kubernetes.io/storage-resizer")
                    == Some(&"pd.csi.storage.gke.io".to_string()))
                .then_some(())
            },
        )
        .await;
    let csi = f.pvcs.get("c-grow-csi").await.unwrap();
    assert_eq!(
        annotations(&csi.metadata).get("volume.kubernetes.io/storage-resizer"),
        None,
        "{flavour:?}: a CSI claim is its driver's resizer's already"
    );
}

async fn vac_protection(f: &Fixture<'_>) {
    let flavour = f.cluster.flavour;
    let client = f.pvcs.clone().into_client();
    let vacs: Api<VolumeAttributesClass> = Api::all(client.clone());
    vacs.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "gold"}, "driverName": "csi.example.com",
            "parameters": {"iops": "3000"}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    f.cluster
        .eventually(
            "gold has kubernetes.io/vac-protection",
            WAIT,
            POLL,
            || async {
                let v = vacs.get("gold").await.unwrap();
                finalizers(&v.metadata)
                    .contains(&"kubernetes.io/vac-protection".to_string())
                    .then_some(())
            },
        )
        .await;
    // A claim (of a class nobody provisions: it stays Pending) and a released volume name it.
    create_in::<PersistentVolumeClaim>(
        &client,
        NS,
        json!({"metadata": {"name": "c-vac"},
               "spec": {"accessModes": RWO, "storageClassName": "gold-none",
                        "volumeAttributesClassName": "gold",
                        "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    f.pvs
        .create(
            &PostParams::default(),
            &serde_json::from_value(pv(
                "pv-vac",
                "1Gi",
                "gold-none",
                &["ReadWriteOnce"],
                json!({"spec": {"volumeAttributesClassName": "gold", "hostPath": null,
                       "csi": {"driver": "csi.example.com", "volumeHandle": "vac-1"}}}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    vacs.delete("gold", &DeleteParams::default()).await.unwrap();
    let stays = |what: &'static str| {
        let vacs = vacs.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let v = vacs.get("gold").await.unwrap();
            assert!(v.metadata.deletion_timestamp.is_some(), "{flavour:?}");
            assert_eq!(
                finalizers(&v.metadata),
                vec!["kubernetes.io/vac-protection".to_string()],
                "{flavour:?}: a class {what} lost its finalizer"
            );
        }
    };
    stays("a claim and a volume name").await;
    f.pvcs
        .delete("c-vac", &DeleteParams::default())
        .await
        .unwrap();
    f.gone(&f.pvcs, "c-vac").await;
    stays("a volume names").await;
    f.pvs
        .delete("pv-vac", &DeleteParams::default())
        .await
        .unwrap();
    f.gone(&f.pvs, "pv-vac").await;
    f.gone(&vacs, "gold").await;
}

/// The CSI attacher's VolumeAttachment name, computed here from its definition
/// (`csi-` and the hex SHA-256 of handle, driver and node).
fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let d = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{handle}{driver}{node}").as_bytes(),
    );
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

async fn attach_detach(f: &Fixture<'_>) {
    const SOURCE: &str = "attachdetach-controller";
    const DRIVER: &str = "attach.example.com";
    let flavour = f.cluster.flavour;
    let client = f.pvcs.clone().into_client();
    let nodes: Api<Node> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    for n in ["attach-a", "attach-b"] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n,
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    // attach.example.com has no CSIDriver: attaching is required. This one says it is not.
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let noattach: CSIDriver = serde_json::from_value(json!({
        "metadata": {"name": "noattach.example.com"}, "spec": {"attachRequired": false}}))
    .unwrap();
    drivers
        .create(&PostParams::default(), &noattach)
        .await
        .unwrap();
    for (volume, claim, driver) in [
        ("pv-att", "c-att", DRIVER),
        ("pv-noatt", "c-noatt", "noattach.example.com"),
    ] {
        let mut v = pv(volume, "1Gi", "", RWO, json!({}));
        let spec = v["spec"].as_object_mut().unwrap();
        spec.remove("hostPath");
        spec.insert(
            "csi".into(),
            json!({"driver": driver, "volumeHandle": format!("h-{volume}")}),
        );
        spec.insert("claimRef".into(), json!({"namespace": NS, "name": claim}));
        f.create_pv(v).await;
        f.create_pvc(pvc(claim, "1Gi", "", RWO, json!({}))).await;
        f.claim_in(claim, "Bound").await;
    }
    let pod_on = |name: &str, node: &str, claims: &[&str]| {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                     "volumes": volumes}
        })
    };
    // An attachment someone else makes on a managed node (upstream's Conformance spec of the
    // VolumeAttachment API does): neither controller touches it.
    let foreign: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": "foreign-va"},
        "spec": {"attacher": "other.example.com", "nodeName": "attach-a",
                 "source": {"persistentVolumeName": "pv-noatt"}}}))
    .unwrap();
    vas.create(&PostParams::default(), &foreign).await.unwrap();
    create_in::<Pod>(
        &client,
        NS,
        pod_on("att-a", "attach-a", &["c-att", "c-noatt"]),
    )
    .await;
    let name_a = attachment_name("h-pv-att", DRIVER, "attach-a");
    let va = f
        .cluster
        .eventually(
            &format!("VolumeAttachment {name_a}"),
            WAIT,
            POLL,
            || async { vas.get_opt(&name_a).await.unwrap() },
        )
        .await;
    assert_eq!(va.spec.attacher, DRIVER, "{flavour:?}");
    assert_eq!(va.spec.node_name, "attach-a", "{flavour:?}");
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-att"),
        "{flavour:?}"
    );
    let ours = |list: Vec<VolumeAttachment>| -> Vec<String> {
        list.into_iter()
            .filter(|a| a.spec.node_name.starts_with("attach-"))
            .filter(|a| a.metadata.name.as_deref() != Some("foreign-va"))
            .filter_map(|a| a.metadata.name)
            .collect()
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        ours(vas.list(&Default::default()).await.unwrap().items),
        std::slice::from_ref(&name_a),
        "{flavour:?}: a driver without attach got an attachment"
    );

    // The external-attacher attaches it: the node reports it, the Pod hears it.
    let attached = json!({"status": {"attached": true}});
    vas.patch_status(&name_a, &PatchParams::default(), &Patch::Merge(&attached))
        .await
        .unwrap();
    let unique = format!("kubernetes.io/csi/{DRIVER}^h-pv-att");
    let reported = |node: &'static str| {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get(node).await.unwrap();
            n.status
                .and_then(|s| s.volumes_attached)
                .unwrap_or_default()
                .into_iter()
                .map(|v| (v.name, v.device_path))
                .collect::<Vec<_>>()
        }
    };
    f.cluster
        .eventually_showing("attach-a reporting the volume", WAIT, POLL, || async {
            let r = reported("attach-a").await;
            if r == [(unique.clone(), String::new())] {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        })
        .await;
    f.event(
        "att-a",
        "SuccessfulAttachVolume",
        "AttachVolume.Attach succeeded for volume \"pv-att\" ",
        SOURCE,
    )
    .await;

    // A second node wants the ReadWriteOnce volume: refused while the first holds it.
    create_in::<Pod>(&client, NS, pod_on("att-b", "attach-b", &["c-att"])).await;
    f.event(
        "att-b",
        "FailedAttachVolume",
        "Multi-Attach error for volume \"pv-att\" Volume is already used by pod(s) att-a",
        SOURCE,
    )
    .await;
    let name_b = attachment_name("h-pv-att", DRIVER, "attach-b");
    assert!(vas.get_opt(&name_b).await.unwrap().is_none(), "{flavour:?}");

    // Kubelet has it mounted; the Pod goes: no longer reported, but attached until unmounted.
    let in_use = json!({"status": {"volumesInUse": [unique]}});
    nodes
        .patch_status("attach-a", &PatchParams::default(), &Patch::Merge(&in_use))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.pods
        .delete("att-a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        vas.get_opt(&name_a).await.unwrap().is_some(),
        "{flavour:?}: detached while the node still had it in use"
    );
    assert_eq!(
        reported("attach-a").await,
        [(unique.clone(), String::new())],
        "{flavour:?}: a volume still mounted is still reported attached"
    );
    let unmounted = json!({"status": {"volumesInUse": null}});
    nodes
        .patch_status(
            "attach-a",
            &PatchParams::default(),
            &Patch::Merge(&unmounted),
        )
        .await
        .unwrap();
    f.gone(&vas, &name_a).await;
    assert!(reported("attach-a").await.is_empty(), "{flavour:?}");
    f.cluster
        .eventually(
            &format!("VolumeAttachment {name_b}"),
            WAIT,
            POLL,
            || async { vas.get_opt(&name_b).await.unwrap() },
        )
        .await;

    // The external-attacher attaches it (upstream's attach operation waits for that, up to two
    // minutes, and nothing detaches meanwhile).
    vas.patch_status(&name_b, &PatchParams::default(), &Patch::Merge(&attached))
        .await
        .unwrap();
    f.cluster
        .eventually_showing("attach-b reporting the volume", WAIT, POLL, || async {
            let r = reported("attach-b").await;
            if r == [(unique.clone(), String::new())] {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        })
        .await;
    // Cleaned up: the Pod goes, and with it (not in use) the attachment. A new attachment
    // counts as mounted only until the node's next change, and the controller's own
    // volumesAttached write above was one, in both.
    f.pods
        .delete("att-b", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    f.gone(&vas, &name_b).await;
    assert!(
        vas.get_opt("foreign-va").await.unwrap().is_some(),
        "{flavour:?}: another's attachment was deleted"
    );
    vas.delete("foreign-va", &DeleteParams::default())
        .await
        .unwrap();
    for n in ["attach-a", "attach-b"] {
        nodes.delete(n, &DeleteParams::default()).await.unwrap();
    }
}

async fn scenario(flavour: Flavour) {
    let cluster = Cluster::start_minimal(flavour, "volume", CONTROLLERS);
    let client: Client = client_with_namespace(&cluster, NS).await;
    let f = Fixture {
        cluster: &cluster,
        pvs: Api::all(client.clone()),
        pvcs: Api::namespaced(client.clone(), NS),
        pods: Api::namespaced(client.clone(), NS),
        events: Api::namespaced(client.clone(), NS),
        volume_events: Api::namespaced(client.clone(), "default"),
        tmp: format!(
            "/tmp/kpr-volume-test-{}-{}",
            flavour.tag(),
            std::process::id()
        ),
    };
    binding(&f).await;
    delayed(&f).await;
    reclaim(&f).await;
    protection(&f).await;
    ephemeral(&f).await;
    expansion(&f).await;
    vac_protection(&f).await;
    attach_detach(&f).await;
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_volume_controllers() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_volume_controllers() {
    scenario(Flavour::Kpr).await;
}
