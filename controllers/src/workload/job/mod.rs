//! The Job controller (kube-controller-manager v1.34's `job` controller): runs Pods for every Job
//! until its completions succeed or it fails, counting every Pod result exactly once.
//!
//! Owns: creating and deleting a Job's Pods, the `batch.kubernetes.io/job-tracking` finalizer on
//! them (added at creation, removed once the Pod's result is in the Job's status, also from
//! orphaned Pods of deleted or finished Jobs), adopting matching orphan Pods, and the Job status
//! subresource. Must not touch: a Job's spec or metadata, Jobs whose `spec.managedBy` names
//! another controller, Pods controlled by anything else.
//!
//! Runs on the shared runtime: the Job and Pod informers, a work queue `job` and an orphan-Pod
//! queue, `--concurrent-job-syncs` workers (5) each. A sync plans with [`plan`] (see its steps)
//! and applies in upstream's order: claim, delete or create Pods (slow-start batches, CTL-10),
//! write the status with the newly finished Pods' UIDs in `uncountedTerminatedPods` (and the
//! interim FailureTarget / SuccessCriteriaMet condition), remove their finalizers, move the
//! UIDs to the counters, then add Complete or Failed. Status writes are full updates with the
//! cached resourceVersion (a conflict re-queues), made only when something changed. Pod events
//! are batched for 1 s, as upstream's `SyncJobBatchPeriod`.
//!
//! Events as upstream (source `job-controller`): SuccessfulCreate, FailedCreate,
//! SuccessfulDelete, FailedDelete (recorded by [`crate::runtime::pod_control`], upstream's
//! `RealPodControl`, which also keeps the expectations; a failed removal of the tracking
//! finalizer before a deletion is reported as the deletion's failure), Completed, TooManySucceededPods, the
//! failure reason (BackoffLimitExceeded, DeadlineExceeded, PodFailurePolicy, ...), Suspended,
//! Resumed, UnknownCompletionMode.
//!
//! `ttlSecondsAfterFinished` is not handled here: as upstream, it is the separate
//! `ttl-after-finished` controller, a module of its own.

pub mod backoff;
pub mod failure_policy;
pub mod indexed;
pub mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use crate::helpers::meta::ObjectName as _;
use crate::helpers::selector::Selector;
use crate::runtime::apierrors::is_not_found;
use crate::runtime::cache::Indexed;
use crate::runtime::claim::{self, OwnerInfo, ORPHAN_NAMESPACE};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{self, EventHandlers, Informers, CONTROLLER_UID, NAMESPACE};
use crate::runtime::pod_control::{Deleted, Owner, PodControl};
use crate::runtime::pods;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_key_workers, run_workers_of, wait_for_caches, SyncKey};
use crate::runtime::written::Written;

use crate::runtime::cached_pod::CachedPod;
use plan::{Ctx, Manage, SYNC_JOB_BATCH_PERIOD, TRACKING_FINALIZER};

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "job";
/// The orphan-Pod queue's name, as upstream.
pub const ORPHAN_QUEUE_NAME: &str = "job_orphan_pod";
/// The events' source component.
pub const COMPONENT: &str = "job-controller";
/// `spec.managedBy` of Jobs this controller manages (or none).
pub const CONTROLLER_NAME: &str = "kubernetes.io/job-controller";

/// The Job controller's settings: `--concurrent-job-syncs` workers and the clock.
pub type Config = crate::runtime::workers::TimedConfig;

/// An orphan-queue item: one Pod, or every Pod of a (deleted or finished) Job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OrphanKey {
    /// `namespace`, `name` of a Pod.
    Pod(String, String),
    /// `namespace`, `uid` of a Job.
    Job(String, String),
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    jobs: Arc<Indexed<Job>>,
    pods: Arc<Indexed<CachedPod>>,
    queue: Arc<WorkQueue<String>>,
    orphans: Arc<WorkQueue<OrphanKey>>,
    /// Creates and deletes the Job's Pods; holds the expectations.
    pod_control: PodControl,
    /// Per Job key: uids of Pods whose finalizer removal was issued and not yet seen.
    finalizer_expectations: Mutex<HashMap<String, HashSet<String>>>,
    backoff: Mutex<plan::BackoffStore>,
    /// Uids of Jobs marked finished whose update the cache has not shown yet.
    finished_jobs: Mutex<HashSet<String>>,
    /// The Job status this controller wrote, read instead of the cached Job until the cache shows
    /// the write: a sync planned from an older status would miss the Pods the write counted
    /// (their finalizers going, they are no longer counted from the Pods) and create
    /// replacements for them (`kpr-bench --lagging-watch`, docs/RELIABILITY.md).
    written: Written<Job>,
    events: Recorder,
}

fn selector(job: &Job) -> std::result::Result<Selector, String> {
    Selector::parse(job.spec.as_ref().and_then(|s| s.selector.as_ref()))
}

fn managed_externally(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.managed_by.as_deref())
        .is_some_and(|m| m != CONTROLLER_NAME)
}

/// The strategic merge patch removing the tracking finalizer.
fn remove_finalizer_patch() -> serde_json::Value {
    json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}})
}

impl Controller {
    /// Registers the controller's indexes and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let job_informer = informers.get::<Job>();
        let pod_informer = informers.get::<CachedPod>();
        claim::add_orphan_index(&pod_informer);
        let events = Recorder::new(client.clone(), COMPONENT);
        let this = Arc::new(Controller {
            pod_control: PodControl::new(client.clone(), events.clone()),
            events,
            client,
            config,
            jobs: job_informer.cache(),
            pods: pod_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            orphans: WorkQueue::new(ORPHAN_QUEUE_NAME),
            finalizer_expectations: Mutex::default(),
            backoff: Mutex::default(),
            finished_jobs: Mutex::default(),
            written: Written::new(),
        });
        job_informer.on_change_of(&this, Controller::on_job);
        pod_informer.on_events_of(
            &this,
            EventHandlers {
                added: Controller::pod_added,
                updated: Controller::pod_updated,
                deleted: Controller::pod_gone,
            },
        );
        this
    }

    /// Waits for the caches, then runs the Job and orphan workers until the queues shut down.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches("job", &[&*self.jobs, &*self.pods]).await;
        tracing::info!(workers = self.config.workers, "job controller started");
        let jobs = run_key_workers(&self, &self.queue, self.config.workers);
        let orphans = run_workers_of(
            &self,
            &self.orphans,
            self.config.workers,
            |this, key: OrphanKey| async move { this.sync_orphan(&key).await },
        );
        futures::future::join(jobs, orphans).await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
        self.orphans.shut_down();
    }

    // ---- handlers ----

    fn backoff_forget(&self, key: &str) {
        self.backoff.lock().expect("backoff lock").remove(key);
    }

    fn finalizer_observed(&self, key: &str, uid: &str) {
        if let Some(set) = self
            .finalizer_expectations
            .lock()
            .expect("finalizer expectations lock")
            .get_mut(key)
        {
            set.remove(uid);
        }
    }

    fn enqueue_batched(&self, job: &Job) {
        self.queue
            .add_after(informer::key_of(job), SYNC_JOB_BATCH_PERIOD);
    }

    fn on_job(&self, old: Option<&Arc<Job>>, new: Option<&Arc<Job>>) {
        if let Some(job) = new.or(old) {
            self.written.forget(
                job.metadata.namespace.as_deref().unwrap_or_default(),
                job.metadata.name.as_deref().unwrap_or_default(),
            );
        }
        match (old, new) {
            (None, Some(job)) => self.queue.add(informer::key_of(job.as_ref())),
            (Some(old), Some(cur)) => {
                if old.metadata.uid != cur.metadata.uid {
                    self.job_deleted(old);
                    self.queue.add(informer::key_of(cur.as_ref()));
                    return;
                }
                let key = informer::key_of(cur.as_ref());
                if plan::is_finished(cur) {
                    // The finalizers should be gone already: a backstop.
                    self.orphans.add(OrphanKey::Job(
                        cur.metadata.namespace.clone().unwrap_or_default(),
                        cur.metadata.uid.clone().unwrap_or_default(),
                    ));
                    return;
                }
                if old.metadata.generation == cur.metadata.generation {
                    self.enqueue_batched(cur);
                } else {
                    self.queue.add(key.clone());
                }
                let start = cur.status.as_ref().and_then(|s| s.start_time.as_ref());
                let cur_ads = cur.spec.as_ref().and_then(|s| s.active_deadline_seconds);
                let old_ads = old.spec.as_ref().and_then(|s| s.active_deadline_seconds);
                if let (Some(start), Some(ads)) = (start, cur_ads) {
                    if old_ads != Some(ads) {
                        let end = start
                            .0
                            .checked_add(jiff::SignedDuration::from_secs(ads))
                            .unwrap_or(start.0);
                        let left = end.duration_since(self.config.clock.now());
                        let left = if left.is_negative() {
                            Duration::ZERO
                        } else {
                            left.unsigned_abs()
                        };
                        self.queue.add_after(key, left);
                    }
                }
            }
            (Some(gone), None) => self.job_deleted(gone),
            (None, None) => {}
        }
    }

    fn job_deleted(&self, job: &Job) {
        let key = informer::key_of(job);
        self.queue.add(key.clone());
        if let Some(uid) = job.metadata.uid.as_ref() {
            self.finished_jobs
                .lock()
                .expect("finished lock")
                .remove(uid);
            self.orphans.add(OrphanKey::Job(
                job.metadata.namespace.clone().unwrap_or_default(),
                uid.clone(),
            ));
        }
        self.backoff_forget(&key);
    }

    fn resolve(&self, pod: &CachedPod) -> Option<Arc<Job>> {
        let r = informer::controller_uid(pod)?;
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let r = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.uid == r)?;
        claim::resolve_controller_ref(&self.jobs, ns, r)
    }

    /// Jobs whose selector matches an orphan Pod.
    fn selecting(&self, pod: &CachedPod) -> Vec<Arc<Job>> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.jobs
            .index(NAMESPACE, ns)
            .into_iter()
            .filter(|j| {
                selector(j)
                    .is_ok_and(|s| !s.is_everything() && s.matches(pod.metadata.labels.as_ref()))
            })
            .collect()
    }

    /// Whether this controller issued the removal of `pod`'s tracking finalizer and has not seen
    /// it in the cache yet.
    fn finalizer_removal_pending(&self, job: &Job, pod: &CachedPod) -> bool {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.finalizer_expectations
            .lock()
            .expect("finalizer expectations lock")
            .get(&informer::key_of(job))
            .is_some_and(|pending| pending.contains(uid))
    }

    fn orphan_pod(&self, pod: &CachedPod) {
        self.orphans.add(OrphanKey::Pod(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.name_any(),
        ));
    }

    /// A Pod deleted from the cache (the last state it had).
    fn pod_gone(&self, pod: &CachedPod) {
        self.pod_deleted(pod, true);
    }

    fn pod_added(&self, pod: &CachedPod) {
        if pod.metadata.deletion_timestamp.is_some() {
            self.pod_deleted(pod, false);
            return;
        }
        if informer::controller_uid(pod).is_some() {
            if let Some(job) = self.resolve(pod) {
                let key = informer::key_of(job.as_ref());
                self.pod_control.expectations().creation_observed(&key);
                self.enqueue_batched(&job);
            }
            return;
        }
        if plan::has_tracking_finalizer(pod) {
            self.orphan_pod(pod);
        }
        for job in self.selecting(pod) {
            self.enqueue_batched(&job);
        }
    }

    fn pod_updated(&self, old: &CachedPod, cur: &CachedPod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            return;
        }
        if cur.metadata.deletion_timestamp.is_some() {
            self.pod_deleted(cur, false);
            return;
        }
        let finalizer_removed = !plan::has_tracking_finalizer(cur);
        let uid = cur.metadata.uid.clone().unwrap_or_default();
        let (old_ref, cur_ref) = (
            informer::controller_uid(old).map(str::to_string),
            informer::controller_uid(cur).map(str::to_string),
        );
        let ref_changed = old_ref != cur_ref;
        if ref_changed && old_ref.is_some() {
            if let Some(job) = self.resolve(old) {
                if finalizer_removed {
                    self.finalizer_observed(&informer::key_of(job.as_ref()), &uid);
                }
                self.enqueue_batched(&job);
            }
        }
        if cur_ref.is_some() {
            if let Some(job) = self.resolve(cur) {
                if finalizer_removed {
                    self.finalizer_observed(&informer::key_of(job.as_ref()), &uid);
                }
                self.enqueue_batched(&job);
            }
            return;
        }
        if plan::has_tracking_finalizer(cur) {
            self.orphan_pod(cur);
        }
        if old.metadata.labels != cur.metadata.labels || ref_changed {
            for job in self.selecting(cur) {
                self.enqueue_batched(&job);
            }
        }
    }

    fn pod_deleted(&self, pod: &CachedPod, last: bool) {
        let has_finalizer = plan::has_tracking_finalizer(pod);
        if informer::controller_uid(pod).is_none() {
            if has_finalizer {
                self.orphan_pod(pod);
            }
            return;
        }
        let job = self.resolve(pod);
        let Some(job) = job.filter(|j| !plan::is_finished(j)) else {
            if has_finalizer {
                self.orphan_pod(pod);
            }
            return;
        };
        let key = informer::key_of(job.as_ref());
        self.pod_control
            .expectations()
            .deletion_observed(&key, &pods::pod_key(pod));
        if last || !has_finalizer {
            self.finalizer_observed(&key, pod.metadata.uid.as_deref().unwrap_or_default());
        }
        self.enqueue_batched(&job);
    }

    // ---- orphans ----

    /// Removes the tracking finalizer from orphaned Pods (`syncOrphanPod`).
    pub async fn sync_orphan(&self, key: &OrphanKey) -> Result<()> {
        match key {
            OrphanKey::Pod(ns, name) => match self.pods.get(ns, name) {
                None => Ok(()),
                Some(p) => self.handle_orphan(&p).await,
            },
            OrphanKey::Job(_, uid) => {
                for p in self.pods.index(CONTROLLER_UID, uid) {
                    if let Err(e) = self.handle_orphan(&p).await {
                        tracing::warn!(pod = %pods::pod_key(&p), "removing the tracking finalizer: {e}");
                    }
                }
                Ok(())
            }
        }
    }

    async fn handle_orphan(&self, pod: &CachedPod) -> Result<()> {
        if let Some(r) = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
        {
            if r.kind != "Job" || r.api_version != "batch/v1" {
                return Ok(());
            }
            if let Some(job) = self.resolve(pod) {
                if managed_externally(&job) || !plan::is_finished(&job) {
                    return Ok(());
                }
                if self.finalizer_removal_pending(&job, pod) {
                    // This controller's own patch removed it (or is removing it) and the cache
                    // has not shown that yet: the Job's Complete update, which queues this
                    // backstop, often arrives before the last Pods' updates. Upstream patches
                    // again; that is one request per such Pod for nothing. A failed removal
                    // drops the expectation, so the backstop still covers it.
                    return Ok(());
                }
            }
        }
        if !plan::has_tracking_finalizer(pod) {
            return Ok(());
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(remove_finalizer_patch()),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(
                "removing the tracking finalizer of",
                pods::pod_key(pod),
                e,
            )),
        }
    }

    // ---- sync ----

    /// The Pods this Job controls after claiming (`getPodsForJob`): adopted orphans get the
    /// tracking finalizer too.
    async fn pods_for_job(&self, job: &Arc<Job>) -> Result<Vec<Arc<CachedPod>>> {
        let sel = selector(job).map_err(|reason| Error::Invalid {
            object: job.object_name(),
            reason: format!("spec.selector: {reason}"),
        })?;
        let ns = job.metadata.namespace.as_deref().unwrap_or_default();
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let mut candidates = self.pods.index(CONTROLLER_UID, &uid);
        candidates.extend(self.pods.index(ORPHAN_NAMESPACE, ns));
        let owner = OwnerInfo::of(job.as_ref());
        let claim_plan = claim::claim_plan(
            &uid,
            &sel,
            job.metadata.deletion_timestamp.is_some(),
            candidates,
        );
        let adopting: HashSet<String> = claim_plan
            .adopt
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let api: Api<CachedPod> = Api::namespaced(self.client.clone(), ns);
        let jobs_api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let recheck = || claim::reread_owner(&jobs_api, &owner, job.object_name());
        let mut pods = claim::claim(&api, &owner, claim_plan, recheck).await?;
        for p in pods.iter_mut() {
            let adopted = p
                .metadata
                .uid
                .as_ref()
                .is_some_and(|u| adopting.contains(u));
            if adopted && !plan::has_tracking_finalizer(p) {
                let patch = json!({"metadata": {"finalizers": [TRACKING_FINALIZER]}});
                match api
                    .patch(
                        &p.name_any(),
                        &PatchParams::default(),
                        &Patch::Strategic(patch),
                    )
                    .await
                {
                    Ok(updated) => *p = Arc::new(updated),
                    Err(e) => {
                        return Err(Error::kube(
                            "adding the tracking finalizer to",
                            pods::pod_key(p),
                            e,
                        ))
                    }
                }
            }
        }
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }
}

impl SyncKey for Controller {
    /// One sync of the Job `key` (`syncJob`).
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let Some(job) = self.written.fresh(ns, name, self.jobs.get(ns, name)) else {
            self.pod_control.expectations().delete(key);
            self.finalizer_expectations
                .lock()
                .expect("finalizer expectations lock")
                .remove(key);
            self.backoff_forget(key);
            return Ok(());
        };
        if managed_externally(&job) {
            return Ok(());
        }
        let uid = job.metadata.uid.clone().unwrap_or_default();
        if plan::is_finished(&job) {
            self.backoff_forget(key);
            self.finished_jobs
                .lock()
                .expect("finished lock")
                .remove(&uid);
            return Ok(());
        }
        if self
            .finished_jobs
            .lock()
            .expect("finished lock")
            .contains(&uid)
        {
            // Marked finished by this controller; the cache has not shown it yet.
            return Ok(());
        }
        let mode = job.spec.as_ref().and_then(|s| s.completion_mode.as_deref());
        if !matches!(mode, None | Some("NonIndexed") | Some("Indexed")) {
            self.events.publish(
                &job.object_ref(&()),
                true,
                "UnknownCompletionMode",
                "Skipped Job sync because completion mode is unknown".into(),
            );
            return Ok(());
        }
        let satisfied = self.pod_control.expectations().satisfied(key);
        let pods = self.pods_for_job(&job).await?;
        let now = self.config.clock.now();
        let prev_backoff = self
            .backoff
            .lock()
            .expect("backoff lock")
            .get(key)
            .cloned()
            .unwrap_or_default();
        let expected_rm = self
            .finalizer_expectations
            .lock()
            .expect("finalizer expectations lock")
            .get(key)
            .cloned()
            .unwrap_or_default();
        let mut ctx = plan::evaluate(&job, pods, expected_rm, &prev_backoff, now);
        if let Some(after) = ctx.deadline_requeue {
            self.queue.add_after(key.to_string(), after);
        }
        let pod_api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let owner = Owner {
            key: key.to_string(),
            ..Owner::of(job.as_ref(), job.object_name())
        };
        let mut active = ctx.active.len() as i32;
        let mut manage_err = None;
        let mut suspend_changed = false;
        if ctx.finished.is_some() {
            // Delete the active Pods, keeping their finalizers: their results are counted once
            // they are gone.
            let victims = ctx.active.clone();
            let (ready, deleted, err) = self.delete_pods(&owner, &pod_api, &victims, false).await;
            if deleted != active || !satisfied {
                // Pods may remain, or be in flight: not finished yet.
                ctx.finished = None;
            }
            active -= deleted;
            ctx.terminating += deleted;
            ctx.ready -= ready;
            manage_err = err;
        } else {
            let manage_called = satisfied && job.metadata.deletion_timestamp.is_none();
            if manage_called {
                match plan::manage(&ctx, now) {
                    Manage::Nothing | Manage::DeleteFinished(_) => {}
                    Manage::Delete(victims) => {
                        let (ready, deleted, err) =
                            self.delete_pods(&owner, &pod_api, &victims, true).await;
                        active -= deleted;
                        ctx.terminating += deleted;
                        ctx.ready -= ready;
                        manage_err = err;
                    }
                    Manage::Backoff(wait) => {
                        self.queue
                            .add_after(key.to_string(), wait.max(SYNC_JOB_BATCH_PERIOD));
                        // As upstream's manageJob, which returns 0 active here.
                        active = 0;
                    }
                    Manage::Create { count, indexes } => {
                        let (created_ok, err) =
                            self.create_pods(&owner, &job, &ctx, count, &indexes).await;
                        active += created_ok as i32;
                        manage_err = err;
                    }
                }
            }
            let (changed, event) = plan::complete_or_suspend(&mut ctx, manage_called, active, now);
            suspend_changed = changed;
            if let Some((reason, message)) = event {
                self.events
                    .publish(&job.object_ref(&()), false, reason, message.into());
            }
        }
        let status = ctx.job.status.get_or_insert_with(Default::default);
        let needs_update = suspend_changed
            || status.active.unwrap_or(0) != active
            || status.ready != Some(ctx.ready)
            || status.terminating != Some(ctx.terminating);
        status.active = (active != 0).then_some(active);
        status.ready = Some(ctx.ready);
        status.terminating = Some(ctx.terminating);
        self.track_and_remove_finalizers(key, ctx, needs_update)
            .await?;
        manage_err.map_or(Ok(()), Err)
    }
}

impl Controller {
    /// Creates `count` Pods in slow-start batches; returns how many were (or will be)
    /// created and the first error.
    async fn create_pods(
        &self,
        owner: &Owner,
        job: &Arc<Job>,
        ctx: &Ctx,
        count: usize,
        indexes: &[i32],
    ) -> (usize, Option<Error>) {
        self.pod_control.expect(&owner.key, count, &[]);
        let created = self
            .pod_control
            .create_pods(owner, count, |i| {
                let index = indexes.get(i).copied();
                let replaced = index.and_then(|ix| ctx.delayed_per_index.get(&ix).cloned());
                Ok(plan::pod_from_template(job, index, replaced.as_deref()))
            })
            .await;
        (created.done, created.error)
    }

    /// Deletes `victims` concurrently; with `manage` (`deleteJobPods`) the tracking finalizer
    /// goes first and the deletions are expected, without it (`deleteActivePods` of a finished
    /// Job) the finalizer stays and nothing is expected. Returns (ready deleted, deleted, first
    /// error).
    async fn delete_pods(
        &self,
        owner: &Owner,
        api: &Api<Pod>,
        victims: &[Arc<CachedPod>],
        manage: bool,
    ) -> (i32, i32, Option<Error>) {
        let names: Vec<String> = victims.iter().map(|p| p.name_any()).collect();
        if manage {
            let keys: Vec<String> = victims.iter().map(|p| pods::pod_key(p)).collect();
            self.pod_control.expect(&owner.key, 0, &keys);
        }
        let outcomes = self
            .pod_control
            .delete_pods_after(owner, &names, manage, |i| {
                let p = &victims[i];
                async move {
                    if manage && plan::has_tracking_finalizer(p) {
                        api.patch(
                            &p.name_any(),
                            &PatchParams::default(),
                            &Patch::Strategic(remove_finalizer_patch()),
                        )
                        .await?;
                    }
                    Ok(())
                }
            })
            .await;
        let (mut ready, mut deleted, mut first) = (0, 0, None);
        for (p, outcome) in victims.iter().zip(outcomes) {
            match outcome {
                Deleted::Deleted | Deleted::Gone => deleted += 1,
                Deleted::Failed(e) => {
                    first.get_or_insert(e);
                    continue;
                }
            }
            if pods::is_pod_ready(p) {
                ready += 1;
            }
        }
        (ready, deleted, first)
    }

    /// Writes the Job's status (a full update with its resourceVersion) and returns the Job as
    /// written.
    async fn write_status(&self, job: &Job) -> Result<Job> {
        let api: Api<Job> = Api::namespaced(
            self.client.clone(),
            job.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let written = api
            .replace_status(&job.name_any(), &PostParams::default(), job)
            .await
            .map_err(|e| Error::kube("writing status of", job.object_name(), e))?;
        self.written
            .record(job.metadata.resource_version.clone(), written.clone());
        Ok(written)
    }

    /// `trackJobStatusAndRemoveFinalizers` with `flushUncountedAndRemoveFinalizers`.
    async fn track_and_remove_finalizers(
        &self,
        key: &str,
        mut ctx: Ctx,
        needs_update: bool,
    ) -> Result<()> {
        let now = self.config.clock.now();
        let tracking = plan::track(&mut ctx, needs_update, now);
        let mut needs_flush = tracking.needs_flush;
        if needs_flush {
            ctx.job = self.write_status(&ctx.job).await?;
            self.backoff
                .lock()
                .expect("backoff lock")
                .insert(key.to_string(), ctx.backoff.clone());
            needs_flush = false;
        }
        let mut with_finalizer = tracking.with_finalizer;
        let mut rm_err = None;
        if !tracking.remove_finalizer.is_empty() {
            {
                let mut exp = self
                    .finalizer_expectations
                    .lock()
                    .expect("finalizer expectations lock");
                let set = exp.entry(key.to_string()).or_default();
                for p in &tracking.remove_finalizer {
                    set.insert(p.metadata.uid.clone().unwrap_or_default());
                }
            }
            let ns = ctx.job.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let results = futures::future::join_all(tracking.remove_finalizer.iter().map(|p| {
                let api = &api;
                async move {
                    let r = api
                        .patch(
                            &p.name_any(),
                            &PatchParams::default(),
                            &Patch::Strategic(remove_finalizer_patch()),
                        )
                        .await;
                    (p, r)
                }
            }))
            .await;
            for (p, r) in results {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                match r {
                    Ok(_) => {
                        with_finalizer.remove(&uid);
                    }
                    Err(e) => {
                        self.finalizer_observed(key, &uid);
                        if is_not_found(&e) {
                            with_finalizer.remove(&uid);
                        } else {
                            rm_err.get_or_insert(Error::kube(
                                "removing the tracking finalizer of",
                                pods::pod_key(p),
                                e,
                            ));
                        }
                    }
                }
            }
        }
        let status = ctx.job.status.get_or_insert_with(Default::default);
        if plan::clean_uncounted(status, &with_finalizer) {
            needs_flush = true;
        }
        if let Some(e) = rm_err {
            if needs_flush {
                self.write_status(&ctx.job).await?;
            }
            return Err(e);
        }
        let finished = plan::enact_finished(&mut ctx, now);
        if finished {
            needs_flush = true;
        }
        if needs_flush {
            let written = self.write_status(&ctx.job).await?;
            if finished {
                self.record_finished(&written, ctx.finished.as_ref());
                if let Some(uid) = written.metadata.uid.clone() {
                    self.finished_jobs
                        .lock()
                        .expect("finished lock")
                        .insert(uid);
                }
            }
        }
        Ok(())
    }

    fn record_finished(&self, job: &Job, cond: Option<&k8s_openapi::api::batch::v1::JobCondition>) {
        let Some(cond) = cond else { return };
        let r = job.object_ref(&());
        if cond.type_ == plan::cond::COMPLETE {
            let completions = job.spec.as_ref().and_then(|s| s.completions);
            let succeeded = job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0);
            if completions.is_some_and(|c| succeeded > c) {
                self.events.publish(
                    &r,
                    true,
                    "TooManySucceededPods",
                    "Too many succeeded pods running after completion count reached".into(),
                );
            }
            self.events
                .publish(&r, false, "Completed", "Job completed".into());
        } else {
            self.events.publish(
                &r,
                true,
                cond.reason.as_deref().unwrap_or_default(),
                cond.message.clone().unwrap_or_default(),
            );
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod plan_tests;

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
