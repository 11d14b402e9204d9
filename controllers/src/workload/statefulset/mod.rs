//! The StatefulSet controller (kube-controller-manager v1.34's `statefulset` controller): Pods
//! with sticky ordinal identities (`<set>-<ordinal>`, the pod-name and pod-index labels,
//! hostname and subdomain), one PersistentVolumeClaim per claim template and ordinal
//! (`<claim>-<set>-<ordinal>`, created before the Pod, owned per the
//! persistentVolumeClaimRetentionPolicy), OrderedReady and Parallel management, RollingUpdate
//! from the highest ordinal down to the partition, OnDelete, and the ControllerRevision history.
//!
//! Owns: creating and deleting the set's Pods, creating its claims and setting the claims'
//! owner references to the set and Pods, adopting matching orphan Pods and revisions, creating,
//! renumbering and deleting the set's ControllerRevisions, and the set's status subresource.
//! Must not touch: the set's spec or metadata, objects controlled by anything else, claims'
//! contents after creation, or anything of a set being deleted beyond its status (the garbage
//! collector removes its Pods; claims stay unless the retention policy made the set own them).
//!
//! Runs on the shared runtime: the StatefulSet, Pod, ControllerRevision and
//! PersistentVolumeClaim informers (handlers as upstream: Pod events wake the owning set, orphans
//! wake every set selecting them, a Pod turning Ready wakes its set again after minReadySeconds),
//! one work queue named `statefulset`, `--concurrent-statefulset-syncs` workers (5). A sync
//! (upstream's `sync` and `UpdateStatefulSet`) adopts orphan revisions, claims the Pods, decides
//! with [`plan`] and applies: the update revision (created, or renumbered on a rollback), the
//! Pod and claim actions (one after another for OrderedReady, each pass in slow-start batches for
//! Parallel), the status, then the history truncation.
//!
//! Differences from upstream: expectations of the Pods a sync creates and deletes keep the next
//! sync from acting on a cache that has not seen them (upstream has none and relies on
//! AlreadyExists errors and retries); a Pod is relabelled with a merge patch where upstream
//! replaces the whole Pod; the status is written with a merge patch naming every field.
//!
//! Events as upstream's `StatefulPodControl` records them on the set (source
//! `statefulset-controller`): SuccessfulCreate / FailedCreate, SuccessfulDelete / FailedDelete and
//! SuccessfulUpdate / FailedUpdate for Pods ("create Pod web-0 in StatefulSet web successful"),
//! SuccessfulCreate / FailedCreate for claims, ConflictingController for a claim whose other
//! controller makes its retention policy ignored.

pub mod plan;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::helpers::meta::ObjectName as _;
use crate::helpers::selector::Selector;
use crate::runtime::apierrors::{api_message, is_already_exists, is_not_found};
use crate::runtime::batch::slow_start_batch;
use crate::runtime::cache::Indexed;
use crate::runtime::claim::{self, OwnerInfo};
use crate::runtime::events::Recorder;
use crate::runtime::expectations::Expectations;
use crate::runtime::history;
use crate::runtime::informer::{self, controller_uid, EventHandlers, Informers, NAMESPACE};
use crate::runtime::pods::{available_after, pod_key};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey, WorkersConfig};

use crate::runtime::cached_pod::CachedPod;
use plan::{Action, DeleteReason, Group, Pass, UpdateRevision};

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "statefulset";

/// The events' source component, as upstream names it.
pub const COMPONENT: &str = "statefulset-controller";

/// Pod cache index: key = `namespace/<parent>` for a Pod named `<parent>-<digits>`: the Pods a
/// set named `<parent>` may own (upstream lists the namespace and filters on `isMemberOf`).
pub const MEMBER: &str = "statefulset-member";

/// The StatefulSet controller's settings: concurrent syncs (`--concurrent-statefulset-syncs`,
/// default 5).
pub type Config = WorkersConfig<5>;

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    sets: Arc<Indexed<StatefulSet>>,
    pods: Arc<Indexed<CachedPod>>,
    revisions: Arc<Indexed<ControllerRevision>>,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    queue: Arc<WorkQueue<String>>,
    expectations: Expectations,
    events: Recorder,
}

fn member_index(p: &CachedPod) -> Vec<String> {
    plan::member_key(p).into_iter().collect()
}

use crate::helpers::meta::controller_of_object as controller_of;

fn selector_of(set: &StatefulSet) -> std::result::Result<Selector, Error> {
    Selector::parse(set.spec.as_ref().map(|s| &s.selector)).map_err(|e| Error::Invalid {
        object: set.object_name(),
        reason: format!("spec.selector: {e}"),
    })
}

/// What applying one sync's passes did.
#[derive(Default)]
struct Applied {
    /// Names of the Pods whose creation or deletion was attempted.
    attempted: HashSet<String>,
    /// The rolling update's deletion failed (the status keeps the Pod counted as current).
    rolling_delete_failed: bool,
}

impl Controller {
    /// Registers the controller's index and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let set_informer = informers.get::<StatefulSet>();
        let pod_informer = informers.get::<CachedPod>();
        let rev_informer = informers.get::<ControllerRevision>();
        let claim_informer = informers.get::<PersistentVolumeClaim>();
        pod_informer.add_index(MEMBER, member_index);
        let this = Arc::new(Controller {
            events: Recorder::new(client.clone(), COMPONENT),
            client,
            config,
            sets: set_informer.cache(),
            pods: pod_informer.cache(),
            revisions: rev_informer.cache(),
            claims: claim_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            expectations: Expectations::new(),
        });
        set_informer.on_change_of(&this, Controller::on_set);
        pod_informer.on_events_of(
            &this,
            EventHandlers {
                added: Controller::pod_added,
                updated: Controller::pod_updated,
                deleted: Controller::pod_deleted,
            },
        );
        this
    }

    /// Waits for the caches, then runs the workers until the queue shuts down.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            "statefulset",
            &[&*self.sets, &*self.pods, &*self.revisions, &*self.claims],
            &self.queue,
            self.config.workers,
        )
        .await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    // ---- handlers (upstream's addStatefulset/updateStatefulset/deleteStatefulset and
    // addPod/updatePod/deletePod) ----

    fn on_set(&self, old: Option<&Arc<StatefulSet>>, new: Option<&Arc<StatefulSet>>) {
        match (old, new) {
            (_, Some(cur)) => {
                if let Some(old) = old {
                    if old.metadata.uid != cur.metadata.uid {
                        self.expectations.delete(&informer::key_of(old.as_ref()));
                    }
                }
                self.queue.add(informer::key_of(cur.as_ref()));
            }
            (Some(gone), None) => {
                let key = informer::key_of(gone.as_ref());
                self.expectations.delete(&key);
                self.queue.add(key);
            }
            (None, None) => {}
        }
    }

    fn resolve(&self, ns: &str, r: &OwnerReference) -> Option<Arc<StatefulSet>> {
        claim::resolve_controller_ref(&self.sets, ns, r)
    }

    /// `getStatefulSetsForPod`: the sets of the Pod's namespace whose non-empty selector matches.
    fn selecting(&self, pod: &CachedPod) -> Vec<Arc<StatefulSet>> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        self.sets
            .index(NAMESPACE, &ns)
            .into_iter()
            .filter(|s| {
                selector_of(s).is_ok_and(|sel| {
                    !sel.is_everything() && sel.matches(pod.metadata.labels.as_ref())
                })
            })
            .collect()
    }

    fn enqueue_selecting(&self, pod: &CachedPod) {
        let sets = self.selecting(pod);
        if sets.len() > 1 {
            tracing::warn!(pod = %pod_key(pod), "more than one StatefulSet selects this Pod's labels");
        }
        for s in sets {
            self.queue.add(informer::key_of(s.as_ref()));
        }
    }

    fn pod_added(&self, pod: &CachedPod) {
        if claim::pod_added(&self.sets, &self.expectations, &self.queue, pod) {
            self.enqueue_selecting(pod);
        }
    }

    fn pod_updated(&self, old: &CachedPod, cur: &CachedPod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            return;
        }
        let ns = cur.metadata.namespace.as_deref().unwrap_or_default();
        let labels_changed = old.metadata.labels != cur.metadata.labels;
        let (cur_ref, old_ref) = (controller_of(cur), controller_of(old));
        let ref_changed = cur_ref != old_ref;
        if ref_changed {
            if let Some(set) = old_ref.and_then(|r| self.resolve(ns, r)) {
                self.queue.add(informer::key_of(set.as_ref()));
            }
        }
        if let Some(r) = cur_ref {
            let Some(set) = self.resolve(ns, r) else {
                return;
            };
            let key = informer::key_of(set.as_ref());
            if cur.metadata.deletion_timestamp.is_some()
                && old.metadata.deletion_timestamp.is_none()
            {
                // A deletion this controller issued is seen once the Pod terminates.
                self.expectations.deletion_observed(&key, &pod_key(cur));
            }
            self.queue.add(key.clone());
            let min_ready = plan::min_ready_seconds(&set);
            if let Some(after) = available_after(old, cur, min_ready) {
                self.queue.add_after(key, after);
            }
            return;
        }
        if labels_changed || ref_changed {
            self.enqueue_selecting(cur);
        }
    }

    fn pod_deleted(&self, pod: &CachedPod) {
        claim::pod_deleted(&self.sets, &self.expectations, &self.queue, pod);
    }

    // ---- sync ----
}

impl SyncKey for Controller {
    /// One sync of the set `key`.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let Some(set) = self.sets.get(ns, name) else {
            self.expectations.delete(key);
            return Ok(());
        };
        if !self.expectations.satisfied(key) {
            // The watch will show this sync's creations and deletions and queue the set again.
            return Ok(());
        }
        let selector = match selector_of(&set) {
            Ok(s) => s,
            Err(e) => {
                // Upstream drops the key: nothing can be done until the set changes.
                tracing::error!("{e}");
                return Ok(());
            }
        };
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let owner = OwnerInfo::of(set.as_ref());
        let set_api: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
        let rev_api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), ns);
        let pod_api: Api<CachedPod> = Api::namespaced(self.client.clone(), ns);
        let recheck = || claim::reread_owner(&set_api, &owner, set.object_name());

        // adoptOrphanRevisions
        let mut revisions =
            history::owned_or_orphan(self.revisions.index(NAMESPACE, ns), &selector, &uid);
        if revisions
            .iter()
            .any(|r| controller_uid(r.as_ref()).is_none())
        {
            recheck().await?;
            for r in revisions.iter_mut() {
                if controller_uid(r.as_ref()).is_none() {
                    *r = Arc::new(history::adopt(&rev_api, &owner, r).await?);
                }
            }
        }

        // getPodsForStatefulSet: members of the set by name, claimed by selector.
        let candidates = self.pods.index(MEMBER, key);
        let deleting = set.metadata.deletion_timestamp.is_some();
        let claim_plan = claim::claim_plan(&uid, &selector, deleting, candidates);
        let mut pods = claim::claim(&pod_api, &owner, claim_plan, recheck).await?;
        pods.sort_by_key(|p| plan::ordinal(p));

        history::sort(&mut revisions);
        let result = self.update_set(key, &set, &pods, &revisions).await;
        let (status, current, update, err) = match result {
            Ok((s, c, u)) => (Some(s), Some(c), Some(u), None),
            Err((c, u, e)) => (None, c, u, Some(e)),
        };
        let truncated = self
            .truncate_history(
                &set,
                &pods,
                &revisions,
                current.as_deref(),
                update.as_deref(),
            )
            .await;
        if let Some(e) = err {
            return Err(e);
        }
        truncated?;
        let min_ready = plan::min_ready_seconds(&set);
        if let Some(status) = status {
            if min_ready > 0 && status.available_replicas.unwrap_or(0) != plan::replicas(&set) {
                self.queue
                    .add_after(key.to_string(), Duration::from_secs(min_ready as u64));
            }
        }
        Ok(())
    }
}

impl Controller {
    /// `UpdateStatefulSet` up to the history truncation: the revisions, the update, the status.
    /// Returns the status and the current and update revision names, or the error with the
    /// names known so far.
    async fn update_set(
        &self,
        key: &str,
        set: &Arc<StatefulSet>,
        pods: &[Arc<CachedPod>],
        revisions: &[Arc<ControllerRevision>],
    ) -> std::result::Result<
        (StatefulSetStatus, String, String),
        (Option<String>, Option<String>, Error),
    > {
        let ns = set.metadata.namespace.clone().unwrap_or_default();
        let rev_api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let owner = OwnerInfo::of(set.as_ref());
        let decided = plan::revisions(set, revisions).map_err(|e| (None, None, e))?;
        let mut collision_count = decided.collision_count;
        let update_rev: Arc<ControllerRevision> = match decided.update {
            UpdateRevision::Existing(r) => r,
            UpdateRevision::Renumber(r, n) => Arc::new(
                history::renumber(&rev_api, &r, n)
                    .await
                    .map_err(|e| (None, None, e))?,
            ),
            UpdateRevision::Create(r) => Arc::new(
                history::create(&rev_api, &owner, &r, &mut collision_count)
                    .await
                    .map_err(|e| (None, None, e))?,
            ),
        };
        let current_rev = decided.current.unwrap_or_else(|| update_rev.clone());
        let (cur_name, upd_name) = (current_rev.name_any(), update_rev.name_any());
        let claims = self.claims.clone();
        let claim_ns = ns.clone();
        let lookup = move |n: &str| claims.get(&claim_ns, n);
        let names = || (Some(cur_name.clone()), Some(upd_name.clone()));
        let planned = plan::update(&plan::Inputs {
            set,
            pods,
            current: &current_rev,
            update: &update_rev,
            collision_count,
            claim: &lookup,
            now: Timestamp::now(),
        });
        tracing::debug!(
            set = key,
            current = %cur_name,
            update = %upd_name,
            pods = ?pods
                .iter()
                .map(|p| (p.name_any(), plan::pod_revision(p).to_string(), p.metadata.deletion_timestamp.is_some()))
                .collect::<Vec<_>>(),
            "sync"
        );
        let upd = planned.map_err(|e| {
            let (c, u) = names();
            (c, u, e)
        })?;
        let applied = self.apply(key, set, &upd.passes, upd.parallel).await;
        let (applied, apply_err) = match applied {
            Ok(a) => (a, None),
            Err((a, e)) => (a, Some(e)),
        };
        let mut status = upd.status;
        if applied.rolling_delete_failed {
            status.current_replicas = status.current_replicas.map(|c| c + 1);
        }
        plan::complete_rolling_update(set, &mut status);
        let written = self.write_status(set, &status).await;
        if let Some(e) = apply_err {
            let (c, u) = names();
            return Err((c, u, e));
        }
        if let Err(e) = written {
            let (c, u) = names();
            return Err((c, u, e));
        }
        Ok((status, cur_name, upd_name))
    }

    /// `truncateHistory`.
    async fn truncate_history(
        &self,
        set: &StatefulSet,
        pods: &[Arc<CachedPod>],
        sorted: &[Arc<ControllerRevision>],
        current: Option<&str>,
        update: Option<&str>,
    ) -> Result<()> {
        let ns = set.metadata.namespace.clone().unwrap_or_default();
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        for r in plan::revisions_to_truncate(set, pods, sorted, current, update) {
            history::delete(&api, &r).await?;
        }
        Ok(())
    }

    /// Applies the passes: each pass's groups one after the other (OrderedReady) or in
    /// slow-start batches (Parallel); the first failing pass ends the sync. Expectations are
    /// raised for every creation and deletion planned and lowered for those that failed or were
    /// never attempted.
    async fn apply(
        &self,
        key: &str,
        set: &StatefulSet,
        passes: &[Pass],
        parallel: bool,
    ) -> std::result::Result<Applied, (Applied, Error)> {
        let mut creates = Vec::new();
        let mut deletes = Vec::new();
        for a in passes.iter().flatten().flatten() {
            match a {
                Action::CreatePod(p) => creates.push(informer::key_of(p.as_ref())),
                Action::DeletePod { pod, .. } => deletes.push(pod_key(pod)),
                _ => {}
            }
        }
        if !creates.is_empty() || !deletes.is_empty() {
            self.expectations.expect(key, creates.len(), &deletes);
        }
        let applied = Mutex::new(Applied::default());
        let mut first_err = None;
        for pass in passes {
            let run = |i: usize| self.run_group(key, set, &pass[i], &applied);
            let err = if parallel {
                slow_start_batch(pass.len(), 1, run).await.1
            } else {
                let mut err = None;
                for i in 0..pass.len() {
                    if let Err(e) = run(i).await {
                        err = Some(e);
                        break;
                    }
                }
                err
            };
            if let Some(e) = err {
                first_err = Some(e);
                break;
            }
        }
        let applied = applied.into_inner().expect("applied lock");
        for k in &creates {
            if !applied.attempted.contains(k) {
                self.expectations.creation_observed(key);
            }
        }
        for k in &deletes {
            if !applied.attempted.contains(k) {
                self.expectations.deletion_observed(key, k);
            }
        }
        match first_err {
            Some(e) => Err((applied, e)),
            None => Ok(applied),
        }
    }

    fn publish(&self, set: &StatefulSet, warning: bool, reason: &str, message: String) {
        let r: ObjectReference = set.object_ref(&());
        self.events.publish(&r, warning, reason, message);
    }

    /// Runs one group: claim creations are all attempted and their errors stop the group before
    /// its next other action (upstream aggregates them and then skips the Pod); any other
    /// failure stops it at once.
    async fn run_group(
        &self,
        key: &str,
        set: &StatefulSet,
        group: &Group,
        applied: &Mutex<Applied>,
    ) -> Result<()> {
        let ns = set.metadata.namespace.clone().unwrap_or_default();
        let set_name = set.name_any();
        let pod_api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let claim_api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let updates_pod = group.iter().find_map(|a| match a {
            Action::PodUpdated { pod } => Some(pod.clone()),
            _ => None,
        });
        let mut claim_errs: Vec<String> = Vec::new();
        let fail = |verb: &str, pod: &str, e: &str| {
            let reason = format!("Failed{}", capitalize(verb));
            let message = format!("{verb} Pod {pod} in StatefulSet {set_name} failed error: {e}");
            self.publish(set, true, &reason, message);
        };
        let mut result: Result<()> = Ok(());
        for action in group {
            tracing::debug!(set = key, ?action, "applying");
            let is_claim = matches!(
                action,
                Action::CreateClaim { .. } | Action::ClaimTerminating { .. }
            );
            if !is_claim && !claim_errs.is_empty() {
                let msg = claim_errs.join(", ");
                let pod = match action {
                    Action::CreatePod(p) => p.name_any(),
                    _ => updates_pod.clone().unwrap_or_default(),
                };
                let verb = if matches!(action, Action::CreatePod(_)) {
                    "create"
                } else {
                    "update"
                };
                fail(verb, &pod, &msg);
                result = Err(Error::Invalid {
                    object: set.object_name(),
                    reason: msg,
                });
                break;
            }
            match action {
                Action::CreateClaim { pod, claim } => {
                    let cname = claim.name_any();
                    match claim_api.create(&PostParams::default(), claim).await {
                        Ok(_) => self.publish(
                            set,
                            false,
                            "SuccessfulCreate",
                            format!(
                                "create Claim {cname} Pod {pod} in StatefulSet {set_name} success"
                            ),
                        ),
                        Err(e) => {
                            if !is_already_exists(&e) {
                                self.publish(
                                    set,
                                    true,
                                    "FailedCreate",
                                    format!("create Claim {cname} for Pod {pod} in StatefulSet {set_name} failed error: {}", api_message(&e)),
                                );
                            }
                            claim_errs
                                .push(format!("failed to create PVC {cname}: {}", api_message(&e)));
                        }
                    }
                }
                Action::ClaimTerminating { claim } => {
                    claim_errs.push(format!("pvc {claim} is being deleted"));
                }
                Action::SetClaimOwners { claim, refs, report } => {
                    let patch = json!({"metadata": {
                        "ownerReferences": refs,
                        "resourceVersion": claim.metadata.resource_version,
                        "uid": claim.metadata.uid,
                    }});
                    let cname = claim.name_any();
                    if let Err(e) = claim_api
                        .patch(&cname, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        if let Some(pod) = report {
                            let msg = format!(
                                "could not update claim {cname} for delete policy ownerRefs: {}",
                                api_message(&e)
                            );
                            fail("update", pod, &msg);
                        }
                        result = Err(Error::kube(
                            "setting the retention policy's owners of",
                            format!("PersistentVolumeClaim {ns}/{cname}"),
                            e,
                        ));
                        break;
                    }
                }
                Action::ConflictingController { claim } => self.publish(
                    set,
                    true,
                    "ConflictingController",
                    format!("PersistentVolumeClaim {claim} has a conflicting OwnerReference that acts as a manging controller, the retention policy is ignored for this claim"),
                ),
                Action::CreatePod(pod) => {
                    let name = pod.name_any();
                    applied
                        .lock()
                        .expect("applied lock")
                        .attempted
                        .insert(informer::key_of(pod.as_ref()));
                    match pod_api.create(&PostParams::default(), pod).await {
                        Ok(_) => self.publish(
                            set,
                            false,
                            "SuccessfulCreate",
                            format!("create Pod {name} in StatefulSet {set_name} successful"),
                        ),
                        Err(e) => {
                            // Already there: the watch shows it (no event, as upstream).
                            self.expectations.creation_observed(key);
                            if !is_already_exists(&e) {
                                fail("create", &name, &api_message(&e));
                            }
                            result = Err(Error::kube("creating Pod for", set.object_name(), e));
                            break;
                        }
                    }
                }
                Action::DeletePod { pod, reason } => {
                    let name = pod.name_any();
                    let pkey = pod_key(pod);
                    applied
                        .lock()
                        .expect("applied lock")
                        .attempted
                        .insert(pkey.clone());
                    match pod_api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => self.publish(
                            set,
                            false,
                            "SuccessfulDelete",
                            format!("delete Pod {name} in StatefulSet {set_name} successful"),
                        ),
                        Err(e) => {
                            self.expectations.deletion_observed(key, &pkey);
                            fail("delete", &name, &api_message(&e));
                            // The rolling update ignores a Pod already gone.
                            if *reason == DeleteReason::Update && is_not_found(&e) {
                                continue;
                            }
                            if *reason == DeleteReason::Update {
                                applied.lock().expect("applied lock").rolling_delete_failed = true;
                            }
                            result = Err(Error::kube("deleting Pod", pkey, e));
                            break;
                        }
                    }
                }
                Action::SetIdentity { pod, labels } => {
                    let patch = json!({"metadata": {
                        "labels": labels,
                        "resourceVersion": pod.metadata.resource_version,
                    }});
                    if let Err(e) = pod_api
                        .patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        fail("update", &pod.name_any(), &api_message(&e));
                        result = Err(Error::kube("relabelling Pod", pod_key(pod), e));
                        break;
                    }
                }
                Action::SetStorage { pod, volumes } => {
                    let patch = json!({"spec": {"volumes": volumes}});
                    if let Err(e) = pod_api
                        .patch(
                            &pod.name_any(),
                            &PatchParams::default(),
                            &Patch::Strategic(patch),
                        )
                        .await
                    {
                        fail("update", &pod.name_any(), &api_message(&e));
                        result = Err(Error::kube("mounting the claims of Pod", pod_key(pod), e));
                        break;
                    }
                }
                Action::PodUpdated { pod } => self.publish(
                    set,
                    false,
                    "SuccessfulUpdate",
                    format!("update Pod {pod} in StatefulSet {set_name} successful"),
                ),
            }
        }
        if result.is_ok() && !claim_errs.is_empty() {
            let msg = claim_errs.join(", ");
            result = Err(Error::Invalid {
                object: set.object_name(),
                reason: msg,
            });
        }
        result
    }

    /// Writes the status unless upstream's `inconsistentStatus` finds nothing to write: a merge
    /// patch naming every field (upstream replaces the status; fields Go omits when zero are
    /// cleared here the same way), the set's uid as precondition.
    async fn write_status(&self, set: &StatefulSet, status: &StatefulSetStatus) -> Result<()> {
        if !plan::needs_status_update(set, status) {
            return Ok(());
        }
        let api: Api<StatefulSet> =
            Api::namespaced(self.client.clone(), &set.namespace().unwrap_or_default());
        let patch = status_patch(set, status);
        api.patch_status(
            &set.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| Error::kube("writing status of", set.object_name(), e))?;
        Ok(())
    }
}

fn capitalize(verb: &str) -> String {
    let mut c = verb.chars();
    c.next()
        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
        .unwrap_or_default()
}

/// The merge patch setting a set's status to `status` as Go encodes it: zero counters and empty
/// strings that Go omits are null (cleared), `replicas` and `availableReplicas` always present,
/// conditions cleared (upstream writes none).
pub fn status_patch(set: &StatefulSet, status: &StatefulSetStatus) -> Value {
    let nz = |v: Option<i32>| {
        v.filter(|n| *n != 0)
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    let ns = |v: &Option<String>| {
        v.as_ref()
            .filter(|s| !s.is_empty())
            .map(|s| Value::from(s.as_str()))
            .unwrap_or(Value::Null)
    };
    json!({
        "metadata": {"uid": set.metadata.uid},
        "status": {
            "observedGeneration": status.observed_generation.filter(|g| *g != 0),
            "replicas": status.replicas,
            "readyReplicas": nz(status.ready_replicas),
            "currentReplicas": nz(status.current_replicas),
            "updatedReplicas": nz(status.updated_replicas),
            "availableReplicas": status.available_replicas.unwrap_or(0),
            "currentRevision": ns(&status.current_revision),
            "updateRevision": ns(&status.update_revision),
            "collisionCount": status.collision_count,
            "conditions": Value::Null,
        }
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod plan_tests;

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
