//! Pod control (client-go's `controller.RealPodControl` with the expectations the workload
//! controllers keep around it): creating a controller's Pods from its template and deleting them,
//! with the Events upstream records on the controller, and the controller's expectations raised
//! before and lowered for every creation or deletion its watch will never show.
//!
//! Owns: the Pod a template makes (`GetPodFromTemplate`: the template's labels, annotations,
//! finalizers and spec, `generateName: <controller>-`, the controller reference), the create and
//! delete calls, their Events (SuccessfulCreate "Created pod: <name>", FailedCreate (Warning)
//! "Error creating: <error>" unless the namespace is being deleted, SuccessfulDelete "Deleted pod:
//! <name>", FailedDelete (Warning) "Error deleting: <error>" unless the Pod is already gone), the
//! slow-start batches of a sync's creations (CTL-10) and its concurrent deletions (CTL-11), and
//! the bookkeeping of [`Expectations`] around them:
//!
//! - [`PodControl::expect`] before a sync creates or deletes anything (upstream's
//!   `SetExpectations`: the record is replaced, and its 5-minute clock restarts);
//! - a creation that failed, was refused because the namespace is being deleted, could not be
//!   built, or was never attempted after a failing batch is observed at once: the watch will
//!   never show it;
//! - a deletion that failed (also as NotFound) is observed at once, by the Pod's key.
//!
//! The controllers observe what their watch shows (`creation_observed`, `deletion_observed` in
//! their Pod handlers) on [`PodControl::expectations`], and ask it whether a sync may act.
//!
//! Differs from upstream: a creation refused because the namespace is being deleted lowers the
//! expectations too (upstream leaves them to expire after 5 minutes; nothing more is created in
//! that namespace either way, and the record does not outlive the controller object).
//!
//! A controller that asks for it ([`PodControl::reading_own_creations`]) also reads its own
//! creations: a creation's answer observes it, and the created Pod is kept
//! ([`crate::runtime::unseen_creations`]) until the informer shows it, so the next sync plans
//! from the cache plus those Pods without waiting for the watch. Its Pod handlers then report
//! what the watch shows through [`PodControl::creation_shown`] and [`PodControl::pod_gone`]
//! rather than on the expectations directly.
//!
//! The StatefulSet controller's Pods are not made here: upstream's `StatefulPodControl` names
//! them, writes other Events and acts one Pod at a time; the CronJob controller creates Jobs.
//! Both read their API errors through [`crate::runtime::apierrors`].

use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};

use crate::error::Error;
use crate::runtime::apierrors::{api_message, is_not_found, namespace_terminating};
use crate::runtime::batch::slow_start_batch;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::claim::OwnerInfo;
use crate::runtime::events::Recorder;
use crate::runtime::expectations::Expectations;
use crate::runtime::unseen_creations::UnseenCreations;

/// Event reason of a Pod created (upstream's `SuccessfulCreatePodReason`).
pub const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
/// Event reason of a creation that failed (`FailedCreatePodReason`).
pub const FAILED_CREATE: &str = "FailedCreate";
/// Event reason of a Pod deleted (`SuccessfulDeletePodReason`).
pub const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
/// Event reason of a deletion that failed (`FailedDeletePodReason`).
pub const FAILED_DELETE: &str = "FailedDelete";

/// Upstream's `SlowStartInitialBatchSize`: the first batch of a sync's creations.
pub const SLOW_START_INITIAL_BATCH: usize = 1;

/// The longest object name (a DNS subdomain).
const MAX_NAME_LEN: usize = 253;

/// The `generateName` of a controller's Pods (upstream's `getPodsPrefix`): `<name>-`, or the
/// name alone when the dash would make it too long.
pub fn generate_name_prefix(controller_name: &str) -> String {
    if controller_name.len() < MAX_NAME_LEN {
        format!("{controller_name}-")
    } else {
        controller_name.to_string()
    }
}

/// The Pod `owner` creates from `template` (upstream's `GetPodFromTemplate`): the template's
/// labels, annotations and finalizers (empty ones left out) and its spec, `generateName` from
/// the owner's name ([`generate_name_prefix`]), and the controller reference. Whether the
/// template is complete (labels, a spec) is the caller's to check: it names its own fields.
pub fn pod_from_template(template: &PodTemplateSpec, owner: &OwnerInfo) -> Pod {
    let meta = template.metadata.as_ref();
    Pod {
        metadata: ObjectMeta {
            labels: meta
                .and_then(|m| m.labels.clone())
                .filter(|l| !l.is_empty()),
            annotations: meta
                .and_then(|m| m.annotations.clone())
                .filter(|a| !a.is_empty()),
            finalizers: meta
                .and_then(|m| m.finalizers.clone())
                .filter(|f| !f.is_empty()),
            generate_name: Some(generate_name_prefix(&owner.name)),
            owner_references: Some(vec![owner.controller_ref()]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// The controller object Pods are created and deleted for.
#[derive(Debug, Clone)]
pub struct Owner {
    /// Its expectations key, `namespace/name`.
    pub key: String,
    /// `Kind namespace/name`, for errors.
    pub object: String,
    /// Its namespace: where its Pods live.
    pub namespace: String,
    /// What its Events are about.
    pub reference: ObjectReference,
}

impl Owner {
    /// The owner `obj`, named `object` in errors (`Kind ns/name`).
    pub fn of<K: Resource<DynamicType = ()>>(obj: &K, object: String) -> Owner {
        let namespace = obj.meta().namespace.clone().unwrap_or_default();
        Owner {
            key: format!(
                "{namespace}/{}",
                obj.meta().name.as_deref().unwrap_or_default()
            ),
            object,
            namespace,
            reference: obj.object_ref(&()),
        }
    }
}

/// What a sync's creations came to.
#[derive(Debug, Default)]
pub struct Created {
    /// Creations that succeeded or were refused because the namespace is being deleted (upstream
    /// counts those as done: nothing else can be created there).
    pub done: usize,
    /// The first failure; the creations after its batch were not attempted.
    pub error: Option<Error>,
}

/// One deletion's outcome, in the order asked.
#[derive(Debug)]
pub enum Deleted {
    /// The Pod was deleted (its deletion is expected through the watch).
    Deleted,
    /// It was already gone (404): no Event, no error for the sync.
    Gone,
    /// It failed (FailedDelete recorded).
    Failed(Error),
}

/// Creates and deletes the Pods of one controller's objects; see the module doc.
pub struct PodControl {
    client: Client,
    events: Recorder,
    expectations: Expectations,
    /// With [`PodControl::reading_own_creations`]: the Pods created and not yet shown.
    unseen: Option<UnseenCreations>,
}

impl PodControl {
    /// Pod control through `client`, recording on `events` (the controller's recorder: the Events
    /// carry its source component).
    pub fn new(client: Client, events: Recorder) -> Self {
        Self {
            client,
            events,
            expectations: Expectations::new(),
            unseen: None,
        }
    }

    /// This control's creations are observed by their answers and read back until the watch
    /// shows them (see the module doc).
    pub fn reading_own_creations(mut self) -> Self {
        self.unseen = Some(UnseenCreations::default());
        self
    }

    /// The informer showed the Pod `name` of the owner `key` for the first time (its add
    /// handler): one creation is observed, unless its answer observed it already.
    pub fn creation_shown(&self, key: &str, name: &str) {
        match &self.unseen {
            Some(u) => u.shown(key, name, &self.expectations),
            None => self.expectations.creation_observed(key),
        }
    }

    /// The informer showed the Pod `name` of the owner `key` deleted or terminating: nothing
    /// is kept of its creation any more (the deletion expectations are the caller's).
    pub fn pod_gone(&self, key: &str, name: &str) {
        if let Some(u) = &self.unseen {
            u.gone(key, name);
        }
    }

    /// The Pods created for `key` that the informer has not shown yet (none unless
    /// [`PodControl::reading_own_creations`]). Read before the cache, so that a Pod moving from
    /// here to the cache meanwhile is found there.
    pub fn unseen_creations(&self, key: &str) -> Vec<std::sync::Arc<CachedPod>> {
        self.unseen.as_ref().map(|u| u.of(key)).unwrap_or_default()
    }

    /// Forgets the owner `key` (it was deleted): its expectations and kept creations.
    pub fn forget(&self, key: &str) {
        self.expectations.delete(key);
        if let Some(u) = &self.unseen {
            u.forget(key);
        }
    }

    /// The expectations the creations and deletions here raise; the controller's Pod handlers
    /// observe on them and its syncs ask them whether they may act.
    pub fn expectations(&self) -> &Expectations {
        &self.expectations
    }

    /// The recorder the Pod Events are written with.
    pub fn events(&self) -> &Recorder {
        &self.events
    }

    /// Before a sync's creations and deletions (upstream's `SetExpectations`): `creations` Pods
    /// and the deletion of the Pods `deletions` (`ns/name`) are expected from now on; the record
    /// of `key` is replaced.
    pub fn expect(&self, key: &str, creations: usize, deletions: &[String]) {
        self.expectations.expect(key, creations, deletions);
    }

    /// Creates `pod` in `owner`'s namespace (`RealPodControl.CreatePods`) and records the Event:
    /// SuccessfulCreate with the name the API server gave it, or FailedCreate unless the
    /// namespace is being deleted. Expectations are the caller's.
    pub async fn create_pod(&self, owner: &Owner, pod: &Pod) -> Result<Pod, kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &owner.namespace);
        match api.create(&PostParams::default(), pod).await {
            Ok(created) => {
                let message = format!("Created pod: {}", created.name_any());
                self.events
                    .publish(&owner.reference, false, SUCCESSFUL_CREATE, message);
                Ok(created)
            }
            Err(e) => {
                if !namespace_terminating(&e) {
                    let message = format!("Error creating: {}", api_message(&e));
                    self.events
                        .publish(&owner.reference, true, FAILED_CREATE, message);
                }
                Err(e)
            }
        }
    }

    /// Deletes the Pod `name` of `owner`'s namespace (`RealPodControl.DeletePod`) and records
    /// the Event: SuccessfulDelete, or FailedDelete unless it was already gone. Expectations are
    /// the caller's.
    pub async fn delete_pod(&self, owner: &Owner, name: &str) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &owner.namespace);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                let message = format!("Deleted pod: {name}");
                self.events
                    .publish(&owner.reference, false, SUCCESSFUL_DELETE, message);
                Ok(())
            }
            Err(e) => {
                self.delete_failed(owner, &e);
                Err(e)
            }
        }
    }

    fn delete_failed(&self, owner: &Owner, e: &kube::Error) {
        if !is_not_found(e) {
            let message = format!("Error deleting: {}", api_message(e));
            self.events
                .publish(&owner.reference, true, FAILED_DELETE, message);
        }
    }

    /// A sync's `count` creations for `owner` (expected with [`PodControl::expect`] before), in
    /// slow-start batches (CTL-10): `make(i)` builds the i-th Pod. A creation that fails, cannot
    /// be built (no Event: nothing reached the API server) or is refused because the namespace is
    /// being deleted is observed at once, and so are those never attempted after a failing
    /// batch.
    pub async fn create_pods<F>(&self, owner: &Owner, count: usize, make: F) -> Created
    where
        F: Fn(usize) -> Result<Pod, Error>,
    {
        let key = owner.key.as_str();
        if let Some(u) = &self.unseen {
            u.sending(key, count);
        }
        // A creation's answer: with the Pod made, or None (nothing made, the watch will never
        // show it: observed now).
        let answered = |made: Option<Pod>| {
            if made.is_none() {
                self.expectations.creation_observed(key);
            }
            if let Some(u) = &self.unseen {
                u.answered(key, made.map(CachedPod::from), &self.expectations);
            }
        };
        let attempted = AtomicUsize::new(0);
        let (done, error) = slow_start_batch(count, SLOW_START_INITIAL_BATCH, |i| {
            let (attempted, make, answered) = (&attempted, &make, &answered);
            async move {
                attempted.fetch_add(1, Ordering::Relaxed);
                let outcome = match make(i) {
                    Err(e) => Err(e),
                    Ok(pod) => match self.create_pod(owner, &pod).await {
                        Ok(made) => {
                            answered(Some(made));
                            return Ok(());
                        }
                        Err(e) if namespace_terminating(&e) => {
                            answered(None);
                            return Ok(());
                        }
                        Err(e) => Err(Error::kube("creating Pod for", owner.object.clone(), e)),
                    },
                };
                answered(None);
                outcome
            }
        })
        .await;
        // Nor will those never attempted after a failing batch.
        for _ in attempted.load(Ordering::Relaxed)..count {
            answered(None);
        }
        Created { done, error }
    }

    /// A sync's deletions of the Pods `names` of `owner`'s namespace, all at once (CTL-11). With
    /// `expected`, they were expected with [`PodControl::expect`] and each that fails is
    /// observed at once. `before(i)` runs first for the i-th Pod (the Job controller removes its
    /// tracking finalizer there); its failure counts as the deletion's. Outcomes in `names`'
    /// order.
    pub async fn delete_pods_after<B, Fut>(
        &self,
        owner: &Owner,
        names: &[String],
        expected: bool,
        before: B,
    ) -> Vec<Deleted>
    where
        B: Fn(usize) -> Fut,
        Fut: std::future::Future<Output = Result<(), kube::Error>>,
    {
        let results = futures::future::join_all(names.iter().enumerate().map(|(i, name)| {
            let before = &before;
            async move {
                if let Err(e) = before(i).await {
                    self.delete_failed(owner, &e);
                    return Err(e);
                }
                self.delete_pod(owner, name).await
            }
        }))
        .await;
        names
            .iter()
            .zip(results)
            .map(|(name, r)| {
                let Err(e) = r else {
                    return Deleted::Deleted;
                };
                let pod_key = format!("{}/{name}", owner.namespace);
                if expected {
                    self.expectations.deletion_observed(&owner.key, &pod_key);
                }
                if is_not_found(&e) {
                    Deleted::Gone
                } else {
                    Deleted::Failed(Error::kube("deleting Pod", pod_key, e))
                }
            })
            .collect()
    }

    /// [`PodControl::delete_pods_after`] with nothing before each deletion, expected.
    pub async fn delete_pods(&self, owner: &Owner, names: &[String]) -> Vec<Deleted> {
        self.delete_pods_after(owner, names, true, |_| async { Ok(()) })
            .await
    }
}

impl crate::runtime::claim::PodObserver for PodControl {
    fn creation_seen(&self, key: &str, pod: &CachedPod) {
        self.creation_shown(key, pod.metadata.name.as_deref().unwrap_or_default());
    }

    fn deletion_seen(&self, key: &str, pod: &CachedPod) {
        self.pod_gone(key, pod.metadata.name.as_deref().unwrap_or_default());
        self.expectations
            .deletion_observed(key, &crate::runtime::pods::pod_key(pod));
    }
}

#[cfg(test)]
#[path = "pod_control_tests.rs"]
mod tests;
