//! The ephemeral volume controller (kube-controller-manager v1.34's `ephemeral-volume`,
//! `pkg/controller/volume/ephemeral`): for each generic ephemeral volume of a Pod, the claim
//! `<pod>-<volume>` from the volume's template (its labels, annotations and spec), owned by the
//! Pod (controller, blocking its deletion), so it goes with the Pod. A claim of that name that the
//! Pod does not control is left alone and reported: a Warning FailedBinding Event on the Pod,
//! "ephemeral volume <volume>: PVC <ns>/<claim> was not created for pod <ns>/<pod> (pod is not
//! owner)", and the sync fails (retried).
//!
//! Owns creating those claims only. Pods are queued when added (not being deleted, with an
//! ephemeral volume) and when a claim one of them uses is deleted, as upstream. One queue
//! (`ephemeral_volume`), one worker; what to create is [`plan`]'s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::PostParams;
use kube::core::ObjectMeta;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::helpers::meta;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::{claim_keys, CachedPod, POD_CLAIMS};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{split_key, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name (`--controllers`, logs).
pub const NAME: &str = "ephemeral-volume";

/// The work queue's name and the Events' source component, as upstream.
pub const QUEUE_NAME: &str = "ephemeral_volume";

fn has_ephemeral(p: &CachedPod) -> bool {
    p.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.ephemeral.is_some())
}

/// What to do for one ephemeral volume of a Pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The claim exists and the Pod controls it.
    Nothing,
    /// Create this claim.
    Create(Box<PersistentVolumeClaim>),
    /// A claim of that name exists that the Pod does not control: this error.
    Conflict { volume: String, error: String },
}

/// `handleVolume` for each ephemeral volume of the Pod, in order; `existing(name)` is the
/// cached claim of that name in the Pod's namespace. Nothing for a Pod being deleted.
pub fn plan(
    pod: &CachedPod,
    existing: impl Fn(&str) -> Option<Arc<PersistentVolumeClaim>>,
) -> Vec<Step> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut steps = Vec::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(eph) = &v.ephemeral else { continue };
        let claim = format!("{name}-{}", v.name);
        if let Some(pvc) = existing(&claim) {
            let controlled = pvc.metadata.namespace.as_deref() == Some(ns)
                && meta::controller_uid(&pvc.metadata) == Some(uid);
            steps.push(if controlled {
                Step::Nothing
            } else {
                Step::Conflict {
                    volume: v.name.clone(),
                    error: format!(
                        "PVC {ns}/{claim} was not created for pod {ns}/{name} (pod is not owner)"
                    ),
                }
            });
            continue;
        }
        let template = eph.volume_claim_template.clone().unwrap_or_default();
        let tmeta = template.metadata.unwrap_or_default();
        steps.push(Step::Create(Box::new(PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(claim),
                namespace: Some(ns.to_string()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: name.to_string(),
                    uid: uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                annotations: tmeta.annotations,
                labels: tmeta.labels,
                ..Default::default()
            },
            spec: Some(template.spec),
            status: None,
        })));
    }
    steps
}

/// The running controller.
pub struct Controller {
    client: Client,
    recorder: Recorder,
    pods: Arc<Indexed<CachedPod>>,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    queue: Arc<WorkQueue<String>>,
}

fn pod_key(p: &CachedPod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Controller {
    /// Registers the controller's handlers on the shared Pod and claim informers.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let pod_informer = informers.get::<CachedPod>();
        pod_informer.add_index(POD_CLAIMS, claim_keys);
        let pvc_informer = informers.get::<PersistentVolumeClaim>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), QUEUE_NAME),
            client,
            pods: pod_informer.cache(),
            claims: pvc_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        // `enqueuePod`, on adds only, as upstream.
        pod_informer.on_change_of(&this, |c, old, new| {
            if let (None, Some(p)) = (old, new) {
                c.enqueue(p);
            }
        });
        // `onPVCDelete`: the Pods using a deleted claim get it back.
        pvc_informer.on_change_of(&this, |c, old, new| {
            if let (Some(pvc), None) = (old, new) {
                let key = format!(
                    "{}/{}",
                    pvc.metadata.namespace.as_deref().unwrap_or_default(),
                    pvc.metadata.name.as_deref().unwrap_or_default()
                );
                for p in c.pods.index(POD_CLAIMS, &key) {
                    c.enqueue(&p);
                }
            }
        });
        this
    }

    fn enqueue(&self, p: &CachedPod) {
        if p.metadata.deletion_timestamp.is_none() && has_ephemeral(p) {
            self.queue.add(pod_key(p));
        }
    }

    /// Waits for the caches, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, NAME, &[&*self.pods, &*self.claims], &self.queue, 1).await;
    }
}

impl SyncKey for Controller {
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(pod) = self.pods.get(ns, name) else {
            return Ok(());
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        for step in plan(&pod, |claim| self.claims.get(ns, claim)) {
            let (volume, error) = match step {
                Step::Nothing => continue,
                Step::Conflict { volume, error } => (volume, error),
                Step::Create(pvc) => {
                    let claim = pvc.metadata.name.clone().unwrap_or_default();
                    match api.create(&PostParams::default(), &pvc).await {
                        Ok(_) => continue,
                        Err(e) => {
                            // Upstream's message: the client error as Go prints it.
                            let message = crate::runtime::apierrors::api_message(&e);
                            let vol = claim
                                .strip_prefix(&format!("{name}-"))
                                .unwrap_or(&claim)
                                .to_string();
                            (vol, format!("create PVC {claim}: {message}"))
                        }
                    }
                }
            };
            let regarding = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(ns.to_string()),
                name: Some(name.to_string()),
                uid: pod.metadata.uid.clone(),
                resource_version: pod.metadata.resource_version.clone(),
                ..Default::default()
            };
            self.recorder.publish(
                &regarding,
                true,
                "FailedBinding",
                format!("ephemeral volume {volume}: {error}"),
            );
            return Err(Error::Invalid {
                object: format!("Pod {key}"),
                reason: format!("ephemeral volume {volume}: {error}"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_claim_per_ephemeral_volume_owned_by_the_pod_or_a_conflict() {
        let pod: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
            "spec": {"volumes": [
                {"name": "a", "ephemeral": {"volumeClaimTemplate": {
                    "metadata": {"labels": {"l": "1"}}, "spec": {"storageClassName": "c"}}}},
                {"name": "b", "persistentVolumeClaim": {"claimName": "x"}},
                {"name": "c", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            ]}
        }))
        .unwrap();
        let foreign: Arc<PersistentVolumeClaim> = Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "p-c", "namespace": "ns"}}))
                .unwrap(),
        );
        let steps = plan(&pod, |n| (n == "p-c").then(|| foreign.clone()));
        let [Step::Create(created), Step::Conflict { volume, error }] = &steps[..] else {
            panic!("{steps:?}")
        };
        assert_eq!(created.metadata.name.as_deref(), Some("p-a"));
        let owner = &created.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.uid.as_str(),
                owner.controller,
                owner.block_owner_deletion
            ),
            ("uid-p", Some(true), Some(true))
        );
        assert_eq!(created.metadata.labels.as_ref().unwrap()["l"], "1");
        assert_eq!(
            created.spec.as_ref().unwrap().storage_class_name.as_deref(),
            Some("c")
        );
        assert_eq!(volume, "c");
        assert_eq!(
            error,
            "PVC ns/p-c was not created for pod ns/p (pod is not owner)"
        );
    }
}
