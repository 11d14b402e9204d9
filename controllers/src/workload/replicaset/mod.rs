//! The ReplicaSet controller (kube-controller-manager v1.34's `replicaset` controller): keeps
//! `spec.replicas` active Pods for every ReplicaSet and reports them in its status.
//!
//! Owns: creating and deleting the Pods a ReplicaSet controls, adopting matching orphan Pods and
//! releasing owned Pods that no longer match, and the ReplicaSet status subresource. Must not
//! touch: Pods controlled by anything else, a ReplicaSet's spec or metadata, or the Pods of a
//! ReplicaSet being deleted (the garbage collector removes those; such a ReplicaSet only gets its
//! status written).
//!
//! Runs on the shared runtime: the ReplicaSet and Pod informers (handlers as upstream: Pod
//! creations and deletions are observed against expectations, orphans wake every ReplicaSet that
//! selects them, a changed controller reference wakes the old and the new owner), one work queue
//! named `replicaset`, `--concurrent-replicaset-syncs` workers (5). A sync (RS-3) plans with
//! [`plan`] over the caches and applies: claims, creations in slow-start batches (CTL-10),
//! concurrent deletions ignoring NotFound (CTL-11), then the status through the status
//! subresource (one re-read and retry on failure, as upstream). Expectations keep a sync from
//! acting again before its own creations and deletions are seen; a restarted controller starts
//! with none and acts only on a complete cache, so it creates no extra Pods.
//!
//! Pods are created and deleted through [`crate::runtime::pod_control`] (upstream's
//! `RealPodControl`), which raises and lowers the expectations and records the Events on the
//! ReplicaSet (source `replicaset-controller`): SuccessfulCreate "Created pod: <name>" per Pod
//! created, FailedCreate (Warning) "Error creating: <error>" per failed creation unless the
//! namespace is terminating, SuccessfulDelete "Deleted pod: <name>" per Pod deleted and
//! FailedDelete (Warning) "Error deleting: <error>" per failed deletion other than NotFound. They
//! are written in the background by [`crate::runtime::events`] and never fail or delay a sync.
//!
//! Nothing is exported for the Deployment controller: it only scales ReplicaSets.
//!
//! The same machinery runs the ReplicationController controller ([`replication`]), as upstream's
//! `pkg/controller/replication` is a thin adapter over this controller's base: [`Base`] is
//! generic over the [`Flavor`] of object it keeps Pods for, which reads its object as a
//! ReplicaSet for the [`plan`] and names its queue, its Events' source and its status fields.

pub mod plan;
pub mod replication;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::runtime::apierrors::api_message;
use crate::runtime::cache::Indexed;
use crate::runtime::claim::{self, OwnerInfo, ORPHAN_NAMESPACE};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{
    self, EventHandlers, Informers, Watched, CONTROLLER_UID, NAMESPACE,
};
use crate::runtime::pod_control::{Deleted, Owner, PodControl};
use crate::runtime::pods;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, BurstConfig, SyncKey};

use crate::runtime::cached_pod::CachedPod;
use plan::Manage;

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "replicaset";

/// Pod cache index: key = `namespace/value` of the Pod's `pod-template-hash` label, which the
/// selectors of a Deployment's ReplicaSets require: the related Pods of a scale-down (RS-7) are
/// found without scanning the namespace.
pub const TEMPLATE_HASH: &str = "pod-template-hash";

/// The events' source component, as upstream names it.
pub const COMPONENT: &str = "replicaset-controller";

/// Event reasons, as upstream's `controller_utils.go` (recorded by the pod control).
pub use crate::runtime::pod_control::{
    FAILED_CREATE, FAILED_DELETE, SUCCESSFUL_CREATE, SUCCESSFUL_DELETE,
};

/// A change of a ReplicaSet's Pod that needs no Pod created or deleted waits this long
/// (runtime's [`crate::runtime::queue::STATUS_COALESCE`]).
pub use crate::runtime::queue::STATUS_COALESCE;

/// The status fields a ReplicaSet's status write names (absent ones as null, so a value that
/// went away is cleared).
pub const STATUS_FIELDS: &[&str] = &[
    "availableReplicas",
    "conditions",
    "fullyLabeledReplicas",
    "observedGeneration",
    "readyReplicas",
    "replicas",
    "terminatingReplicas",
];

/// The kind of object the controller keeps Pods for (upstream's `NewBaseController` arguments:
/// the informer and client adapters, the kind, the queue name and the Event source).
pub trait Flavor: Send + Sync + 'static {
    /// The API object watched, cached and written.
    type Object: Watched + Serialize + ResourceExt + Resource<Scope = NamespaceResourceScope>;
    /// Its kind, for its Pods' controller references and errors.
    const KIND: plan::Kind;
    /// The controller's name in logs (kube-controller-manager's `--controllers` name).
    const NAME: &'static str;
    /// The work queue's (and its metrics') name.
    const QUEUE_NAME: &'static str;
    /// The Events' source component.
    const COMPONENT: &'static str;
    /// Every field of its status, named in a status write.
    const STATUS_FIELDS: &'static [&'static str];

    /// The object as the plan reads it: a ReplicaSet with its metadata, spec and status.
    fn view(obj: Arc<Self::Object>) -> Arc<ReplicaSet>;
}

/// ReplicaSets: the object is its own view.
pub struct ReplicaSets;

impl Flavor for ReplicaSets {
    type Object = ReplicaSet;
    const KIND: plan::Kind = plan::REPLICA_SET;
    const NAME: &'static str = "replicaset";
    const QUEUE_NAME: &'static str = QUEUE_NAME;
    const COMPONENT: &'static str = COMPONENT;
    const STATUS_FIELDS: &'static [&'static str] = STATUS_FIELDS;

    fn view(obj: Arc<ReplicaSet>) -> Arc<ReplicaSet> {
        obj
    }
}

/// The ReplicaSet controller.
pub type Controller = Base<ReplicaSets>;

/// The ReplicaSet controller's settings: concurrent syncs (`--concurrent-replicaset-syncs`,
/// default 5); creations or deletions per sync (upstream's `BurstReplicas`, 500).
pub type Config = BurstConfig<5, { plan::BURST_REPLICAS }>;

/// The running controller, for objects of the flavor `F`.
pub struct Base<F: Flavor> {
    client: Client,
    config: Config,
    /// The objects (ReplicaSets or ReplicationControllers) as cached.
    replica_sets: Arc<Indexed<F::Object>>,
    pods: Arc<Indexed<CachedPod>>,
    queue: Arc<WorkQueue<String>>,
    /// Creates and deletes the Pods; holds the expectations.
    pod_control: PodControl,
}

fn template_hash(p: &CachedPod) -> Vec<String> {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(TEMPLATE_HASH))
        .map(|h| {
            vec![format!(
                "{}/{h}",
                p.metadata.namespace.as_deref().unwrap_or_default()
            )]
        })
        .unwrap_or_default()
}

/// An error of one sync's replica management, with the message the ReplicaFailure condition
/// carries.
struct ManageError {
    message: String,
    error: Error,
}

impl<F: Flavor> Base<F> {
    /// Registers the controller's indexes and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Self> {
        let rs_informer = informers.get::<F::Object>();
        let pod_informer = informers.get::<CachedPod>();
        claim::add_orphan_index(&pod_informer);
        pod_informer.add_index(TEMPLATE_HASH, template_hash);
        let this = Arc::new(Base {
            pod_control: PodControl::new(
                client.clone(),
                Recorder::new(client.clone(), F::COMPONENT),
            ),
            client,
            config,
            replica_sets: rs_informer.cache(),
            pods: pod_informer.cache(),
            queue: WorkQueue::new(F::QUEUE_NAME),
        });
        rs_informer.on_change_of(&this, Self::on_replica_set);
        pod_informer.on_events_of(
            &this,
            EventHandlers {
                added: Self::pod_added,
                updated: Self::pod_updated,
                deleted: Self::pod_deleted,
            },
        );
        this
    }

    /// Waits for the ReplicaSet and Pod caches, then runs the workers until the queue shuts down.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            F::NAME,
            &[&*self.replica_sets, &*self.pods],
            &self.queue,
            self.config.workers,
        )
        .await;
    }

    /// Stops the workers (the queue stops handing out keys).
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    // ---- handlers (upstream's addRS/updateRS/deleteRS, addPod/updatePod/deletePod) ----

    fn on_replica_set(&self, old: Option<&Arc<F::Object>>, new: Option<&Arc<F::Object>>) {
        match (old, new) {
            (_, Some(cur)) => {
                if let Some(old) = old {
                    if old.meta().uid != cur.meta().uid {
                        // Deleted and re-created under the same name between two events.
                        self.replica_set_deleted(old);
                    }
                }
                self.queue.add(informer::key_of(cur.as_ref()));
            }
            (Some(gone), None) => self.replica_set_deleted(gone),
            (None, None) => {}
        }
    }

    fn replica_set_deleted(&self, rs: &F::Object) {
        let key = informer::key_of(rs);
        // A ReplicaSet re-created under this name starts clean.
        self.pod_control.expectations().delete(&key);
        self.queue.add(key);
    }

    /// The object a controller reference names, if it is in the cache with that uid.
    fn resolve(&self, ns: &str, r: &OwnerReference) -> Option<Arc<F::Object>> {
        crate::runtime::claim::resolve_controller_ref(&self.replica_sets, ns, r)
    }

    /// The ReplicaSets of the Pod's namespace whose (non-empty, valid) selector matches it.
    fn selecting(&self, pod: &CachedPod) -> Vec<Arc<F::Object>> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        self.replica_sets
            .index(NAMESPACE, &ns)
            .into_iter()
            .filter(|rs| {
                plan::selector(F::KIND, &F::view(rs.clone()))
                    .is_ok_and(|s| !s.is_everything() && s.matches(pod.metadata.labels.as_ref()))
            })
            .collect()
    }

    fn enqueue_selecting(&self, pod: &CachedPod) {
        let rss = self.selecting(pod);
        if rss.len() > 1 {
            tracing::warn!(
                pod = %pods::pod_key(pod),
                kind = F::KIND.kind,
                "more than one controller of this kind selects this Pod's labels"
            );
        }
        for rs in rss {
            self.queue.add(informer::key_of(rs.as_ref()));
        }
    }

    fn pod_added(&self, pod: &CachedPod) {
        let expectations = self.pod_control.expectations();
        if claim::pod_added(&self.replica_sets, expectations, &self.queue, pod) {
            self.enqueue_selecting(pod);
        }
    }

    fn pod_updated(&self, old: &CachedPod, cur: &CachedPod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            return;
        }
        let labels_changed = old.metadata.labels != cur.metadata.labels;
        if cur.metadata.deletion_timestamp.is_some() {
            // A graceful deletion started: replace the Pod now, not when it is gone.
            self.pod_deleted(cur);
            if labels_changed {
                self.pod_deleted(old);
            }
            return;
        }
        let ns = cur.metadata.namespace.as_deref().unwrap_or_default();
        let (cur_ref, old_ref) = (plan::controller_of(cur), plan::controller_of(old));
        let ref_changed = cur_ref != old_ref;
        if ref_changed {
            if let Some(rs) = old_ref.and_then(|r| self.resolve(ns, r)) {
                self.queue.add(informer::key_of(rs.as_ref()));
            }
        }
        if let Some(r) = cur_ref {
            if let Some(rs) = self.resolve(ns, r) {
                let key = informer::key_of(rs.as_ref());
                if ref_changed
                    || labels_changed
                    || pods::is_pod_active(old) != pods::is_pod_active(cur)
                {
                    self.queue.add(key.clone());
                } else {
                    self.queue.add_coalesced(key.clone(), STATUS_COALESCE);
                }
                let min_ready = plan::min_ready_seconds(&F::view(rs));
                if let Some(after) = pods::available_after(old, cur, min_ready) {
                    // Look again when the Pod turns available.
                    self.queue.add_after(key, after);
                }
            }
            return;
        }
        if labels_changed || ref_changed {
            self.enqueue_selecting(cur);
        }
    }

    fn pod_deleted(&self, pod: &CachedPod) {
        let expectations = self.pod_control.expectations();
        claim::pod_deleted(&self.replica_sets, expectations, &self.queue, pod);
    }

    // ---- sync ----

    /// Pods related to `rs` for the scale-down ranking (RS-7): those selected by any ReplicaSet
    /// with the same controller; none when `rs` has no controller, as upstream.
    fn related_pods(&self, rs: &ReplicaSet) -> Vec<Arc<CachedPod>> {
        let Some(owner) = plan::controller_of(rs) else {
            return Vec::new();
        };
        let siblings: Vec<Arc<ReplicaSet>> = self
            .replica_sets
            .index(CONTROLLER_UID, &owner.uid)
            .into_iter()
            .map(F::view)
            .collect();
        plan::related_pods(F::KIND, &siblings, |sibling| {
            let ns = sibling.metadata.namespace.as_deref().unwrap_or_default();
            match plan::selector_label(sibling, TEMPLATE_HASH) {
                Some(hash) => self.pods.index(TEMPLATE_HASH, &format!("{ns}/{hash}")),
                None => self.pods.index(NAMESPACE, ns),
            }
        })
    }
}

impl<F: Flavor> SyncKey for Base<F> {
    /// One sync of the ReplicaSet `key` (RS-3).
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let Some(object) = self.replica_sets.get(ns, name) else {
            self.pod_control.expectations().delete(key);
            return Ok(());
        };
        let rs = F::view(object.clone());
        let satisfied = self.pod_control.expectations().satisfied(key);
        let selector = match plan::selector(F::KIND, &rs) {
            Ok(s) => s,
            Err(e) => {
                // Upstream drops the key: nothing can be done until the ReplicaSet changes.
                tracing::error!("{e}");
                return Ok(());
            }
        };
        let uid = rs.metadata.uid.clone().unwrap_or_default();
        let mut listed = self.pods.index(CONTROLLER_UID, &uid);
        listed.extend(self.pods.index(ORPHAN_NAMESPACE, ns));
        let active = pods::filter_active_pods(&plan::candidates(F::KIND, &rs, listed));

        let owner = OwnerInfo::of(object.as_ref());
        let deleting = rs.metadata.deletion_timestamp.is_some();
        let plan = claim::claim_plan(&uid, &selector, deleting, active);
        let rs_api: Api<F::Object> = Api::namespaced(self.client.clone(), ns);
        let recheck = || claim::reread_owner(&rs_api, &owner, F::KIND.object_name(&rs));
        let claim_api: Api<CachedPod> = Api::namespaced(self.client.clone(), ns);
        let mut active = claim::claim(&claim_api, &owner, plan, recheck).await?;
        active.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

        let related = if active.len() as i64 > i64::from(plan::desired_replicas(&rs)) {
            self.related_pods(&rs)
        } else {
            Vec::new()
        };
        let action = plan::manage(
            &rs,
            &active,
            &related,
            satisfied,
            self.config.burst_replicas,
            Timestamp::now(),
        );
        let manage_err = match action {
            Manage::Nothing => None,
            Manage::Create(n) => self.create_pods(key, &object, &rs, n).await,
            Manage::Delete(victims) => self.delete_pods(key, &object, &victims).await,
        };

        let evaluated_at = Timestamp::now();
        let status = plan::calculate_status(
            &rs,
            &active,
            manage_err.as_ref().map(|e| e.message.as_str()),
            evaluated_at,
        );
        let written = self.write_status(&rs_api, &rs, status, satisfied).await?;
        if let Some(e) = manage_err {
            return Err(e.error);
        }
        if let Some(after) = plan::requeue_after(&written, &active, evaluated_at, Timestamp::now())
        {
            self.queue.add_after(key.to_string(), after);
        }
        Ok(())
    }
}

impl<F: Flavor> Base<F> {
    /// Creates `n` Pods in slow-start batches (RS-4, CTL-10); the pod control observes the
    /// creations that failed or were never attempted, since the watch will never show them.
    async fn create_pods(
        &self,
        key: &str,
        object: &F::Object,
        rs: &ReplicaSet,
        n: usize,
    ) -> Option<ManageError> {
        let pod = match plan::pod_from_template(F::KIND, rs) {
            Ok(p) => p,
            Err(e) => {
                return Some(ManageError {
                    message: e.to_string(),
                    error: e,
                })
            }
        };
        let owner = owner::<F>(key, object);
        self.pod_control.expect(key, n, &[]);
        tracing::debug!(rs = %owner.object, creating = n, "too few replicas");
        let created = self
            .pod_control
            .create_pods(&owner, n, |_| Ok(pod.clone()))
            .await;
        created.error.map(|error| ManageError {
            message: kube_message(&error),
            error,
        })
    }

    /// Deletes `victims` concurrently (RS-4, CTL-11): a failed deletion is observed at once; a Pod
    /// already gone is no error; of the other failures, the first is returned.
    async fn delete_pods(
        &self,
        key: &str,
        object: &F::Object,
        victims: &[Arc<CachedPod>],
    ) -> Option<ManageError> {
        let keys: Vec<String> = victims.iter().map(|p| pods::pod_key(p)).collect();
        let names: Vec<String> = victims.iter().map(|p| p.name_any()).collect();
        let owner = owner::<F>(key, object);
        self.pod_control.expect(key, 0, &keys);
        tracing::debug!(rs = %owner.object, deleting = victims.len(), "too many replicas");
        let deleted = self.pod_control.delete_pods(&owner, &names).await;
        deleted.into_iter().find_map(|d| match d {
            Deleted::Failed(error) => Some(ManageError {
                message: format!("unable to delete pods: {}", kube_message(&error)),
                error,
            }),
            Deleted::Deleted | Deleted::Gone => None,
        })
    }

    /// Writes `status` through the status subresource unless nothing changed (upstream's
    /// `updateReplicaSetStatus`) or the sync started mid-burst ([`plan::status_write`]), as a
    /// merge patch naming every status field (absent ones as null) and carrying the ReplicaSet's
    /// uid as a precondition. Upstream replaces the status
    /// with the cached resourceVersion and, on a conflict, reads the object and tries again: a
    /// conflict there is only ever with another writer of the spec (the Deployment controller
    /// scaling), whose change this status does not contradict, so the patch saves the failed write
    /// and the read. A re-created ReplicaSet (other uid) refuses the patch; the error requeues.
    async fn write_status(
        &self,
        api: &Api<F::Object>,
        rs: &Arc<ReplicaSet>,
        status: k8s_openapi::api::apps::v1::ReplicaSetStatus,
        expectations_satisfied: bool,
    ) -> Result<Arc<ReplicaSet>> {
        // Unchanged, or mid-burst (see plan::status_write); observedGeneration is the generation
        // this sync acted on.
        let Some(status) = plan::status_write(rs, status, expectations_satisfied) else {
            return Ok(rs.clone());
        };
        let patch = status_patch(rs, &status, F::STATUS_FIELDS);
        let written = api
            .patch_status(
                &rs.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| Error::kube("writing status of", F::KIND.object_name(rs), e))?;
        Ok(F::view(Arc::new(written)))
    }
}

/// The pod control's owner for the object `key` (its Events are about `object`).
fn owner<F: Flavor>(key: &str, object: &F::Object) -> Owner {
    Owner {
        key: key.to_string(),
        ..Owner::of(object, crate::helpers::meta::object_name(object))
    }
}

/// The API server's message of a failed call (the error itself for anything else): what the
/// ReplicaFailure condition carries, as upstream's `err.Error()`.
fn kube_message(e: &Error) -> String {
    match e {
        Error::Kube { source, .. } => api_message(source),
        other => other.to_string(),
    }
}

/// The merge patch that sets a status to exactly `status`: every one of the kind's status
/// `fields` is named (null when absent, so a value that went away is cleared), nothing else is
/// (a ReplicationController's status has no terminatingReplicas), and `metadata.uid` makes the
/// write fail on a re-created object of the same name.
fn status_patch(
    rs: &ReplicaSet,
    status: &k8s_openapi::api::apps::v1::ReplicaSetStatus,
    fields: &[&str],
) -> serde_json::Value {
    let mut body = serde_json::to_value(status).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(present) = body.as_object_mut() {
        present.retain(|k, _| fields.contains(&k.as_str()));
        for field in fields {
            present
                .entry(field.to_string())
                .or_insert(serde_json::Value::Null);
        }
    }
    serde_json::json!({
        "metadata": {"uid": rs.metadata.uid},
        "status": body,
    })
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
