//! The CronJob controller (kube-controller-manager v1.34's `cronjob` controller, v2): creates a
//! Job for each schedule time of every CronJob and keeps the CronJob's status.
//!
//! Owns: creating Jobs for CronJobs (named `<cronjob>-<minutes since the epoch>`, controlled by the
//! CronJob), deleting the Jobs that the Replace policy and the history limits remove (background
//! propagation, as upstream), and the CronJob status subresource (`active`, `lastScheduleTime`,
//! `lastSuccessfulTime`). Must not touch: the Pods of those Jobs (the Job controller and the
//! garbage collector handle them), Jobs controlled by anything else, a CronJob's spec.
//!
//! Runs on the shared runtime: the Job and CronJob informers, one work queue named `cronjob`,
//! `--concurrent-cron-job-syncs` workers (5). A sync plans with [`plan`] (cleanup of finished
//! Jobs, then the active list, then the start decision) and applies; every sync re-queues the
//! CronJob for its next schedule time (plus 100 ms), so nothing polls. Time comes from a
//! [`crate::helpers::clock::Clock`], which tests move.
//!
//! Events as upstream's (source `cronjob-controller`): SuccessfulCreate, SuccessfulDelete,
//! SawCompletedJob, MissingJob, UnexpectedJob, JobAlreadyActive, MissSchedule, TooManyMissedTimes,
//! FailedCreate, FailedDelete, FailedGet, UnknownTimeZone, UnparseableSchedule, InvalidSchedule,
//! UnsupportedSchedule, UnParseableCronJobSchedule.

pub mod plan;
pub mod schedule;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, PostParams, PropagationPolicy};
use kube::{Api, Client, Resource, ResourceExt};

use crate::error::{Error, Result};
use crate::helpers::meta::ObjectName as _;
use crate::runtime::apierrors::{
    api_message, is_already_exists, is_not_found, namespace_terminating,
};
use crate::runtime::cache::Indexed;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{self, Informers, NAMESPACE};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

use plan::Decision;

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "cronjob";
/// The events' source component.
pub const COMPONENT: &str = "cronjob-controller";

/// The CronJob controller's settings: `--concurrent-cron-job-syncs` workers and the clock.
pub type Config = crate::runtime::workers::TimedConfig;

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    cron_jobs: Arc<Indexed<CronJob>>,
    jobs: Arc<Indexed<Job>>,
    queue: Arc<WorkQueue<String>>,
    events: Recorder,
}

impl Controller {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let cj_informer = informers.get::<CronJob>();
        let job_informer = informers.get::<Job>();
        let this = Arc::new(Controller {
            events: Recorder::new(client.clone(), COMPONENT),
            client,
            config,
            cron_jobs: cj_informer.cache(),
            jobs: job_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        cj_informer.on_change_of(&this, Controller::on_cron_job);
        job_informer.on_change_of(&this, Controller::on_job);
        this
    }

    /// Waits for the caches, then runs the workers until the queue shuts down.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            "cronjob",
            &[&*self.cron_jobs, &*self.jobs],
            &self.queue,
            self.config.workers,
        )
        .await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    fn on_cron_job(&self, old: Option<&Arc<CronJob>>, new: Option<&Arc<CronJob>>) {
        match (old, new) {
            (Some(old), Some(cur)) => {
                let (os, ns) = (old.spec.as_ref(), cur.spec.as_ref());
                let changed = os.map(|s| (&s.schedule, &s.time_zone))
                    != ns.map(|s| (&s.schedule, &s.time_zone));
                if changed {
                    let key = informer::key_of(cur.as_ref());
                    match plan::requeue_for_changed_schedule(cur, self.config.clock.now()) {
                        Some(after) => self.queue.add_after(key, after),
                        None => self.events.publish(
                            &cur.object_ref(&()),
                            true,
                            "UnParseableCronJobSchedule",
                            format!(
                                "unparseable schedule for cronjob: {}",
                                ns.map(|s| s.schedule.as_str()).unwrap_or_default()
                            ),
                        ),
                    }
                    return;
                }
                self.queue.add(informer::key_of(cur.as_ref()));
            }
            (_, Some(cj)) | (Some(cj), None) => self.queue.add(informer::key_of(cj.as_ref())),
            (None, None) => {}
        }
    }

    fn owner_of(&self, job: &Job) -> Option<Arc<CronJob>> {
        let r = plan::controller_of(&job.metadata)?;
        let ns = job.metadata.namespace.as_deref().unwrap_or_default();
        crate::runtime::claim::resolve_controller_ref(&self.cron_jobs, ns, r)
    }

    fn on_job(&self, old: Option<&Arc<Job>>, new: Option<&Arc<Job>>) {
        if let (Some(o), Some(n)) = (old, new) {
            if o.metadata.resource_version == n.metadata.resource_version {
                return;
            }
            if plan::controller_of(&o.metadata) != plan::controller_of(&n.metadata) {
                if let Some(cj) = self.owner_of(o) {
                    self.queue.add(informer::key_of(cj.as_ref()));
                }
            }
        }
        if let Some(j) = new.or(old) {
            if let Some(cj) = self.owner_of(j) {
                self.queue.add(informer::key_of(cj.as_ref()));
            }
        }
    }

    /// The Jobs whose controller reference names this CronJob (upstream matches by name).
    fn jobs_of(&self, cj: &CronJob) -> Vec<Arc<Job>> {
        let ns = cj.metadata.namespace.as_deref().unwrap_or_default();
        let name = cj.metadata.name.as_deref().unwrap_or_default();
        let mut jobs: Vec<Arc<Job>> = self
            .jobs
            .index(NAMESPACE, ns)
            .into_iter()
            .filter(|j| plan::controller_of(&j.metadata).is_some_and(|r| r.name == name))
            .collect();
        jobs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        jobs
    }

    fn event(&self, cj: &CronJob, warning: bool, reason: &str, message: String) {
        self.events
            .publish(&cj.object_ref(&()), warning, reason, message);
    }

    /// Deletes a Job with background propagation (upstream's `deleteJob`); on success it leaves
    /// the active list.
    async fn delete_job(&self, cj: &mut CronJob, ns: &str, name: &str, uid: &str) -> bool {
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => {
                if let Some(s) = cj.status.as_mut() {
                    plan::delete_from_active(s, uid);
                }
                self.event(cj, false, "SuccessfulDelete", format!("Deleted job {name}"));
                true
            }
            Err(e) => {
                self.event(
                    cj,
                    true,
                    "FailedDelete",
                    format!("Deleted job: {}", api_message(&e)),
                );
                tracing::warn!(cronjob = %cj.object_name(), job = name, "deleting Job: {e}");
                false
            }
        }
    }
}

impl SyncKey for Controller {
    /// One sync of the CronJob `key`.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let Some(cached) = self.cron_jobs.get(ns, name) else {
            return Ok(());
        };
        let jobs = self.jobs_of(&cached);
        let mut cj = cached.as_ref().clone();
        cj.status.get_or_insert_with(Default::default);

        // cleanupFinishedJobs
        let mut update = false;
        for job in plan::jobs_to_clean(&cj, &jobs) {
            let uid = job.metadata.uid.clone().unwrap_or_default();
            if self.delete_job(&mut cj, ns, &job.name_any(), &uid).await {
                update = true;
            }
        }
        // The deleted Jobs are gone for the rest of this sync.
        let jobs: Vec<Arc<Job>> = {
            let cleaned: Vec<String> = plan::jobs_to_clean(cached.as_ref(), &jobs)
                .iter()
                .filter_map(|j| j.metadata.uid.clone())
                .collect();
            jobs.into_iter()
                .filter(|j| !cleaned.contains(j.metadata.uid.as_ref().unwrap_or(&String::new())))
                .collect()
        };

        let (requeue, sync_update, sync_err) = self.sync_cron_job(&mut cj, &jobs).await;
        update |= sync_update;
        if update {
            let api: Api<CronJob> = Api::namespaced(self.client.clone(), ns);
            api.replace_status(name, &PostParams::default(), &cj)
                .await
                .map_err(|e| Error::kube("writing status of", cj.object_name(), e))?;
        }
        if let Some(after) = requeue {
            self.queue.add_after(key.to_string(), after);
            return Ok(());
        }
        sync_err.map_or(Ok(()), Err)
    }
}

impl Controller {
    /// `syncCronJob`: returns when to look again, whether the status changed, and an error.
    async fn sync_cron_job(
        &self,
        cj: &mut CronJob,
        jobs: &[Arc<Job>],
    ) -> (Option<Duration>, bool, Option<Error>) {
        let ns = cj.metadata.namespace.clone().unwrap_or_default();
        let now = self.config.clock.now();
        let job_api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let mut status = cj.status.clone().unwrap_or_default();
        let mut found = plan::reconcile_active(&mut status, jobs);
        let mut update = found.changed;
        if !found.not_listed.is_empty() {
            // Our cache may lag our own status writes: ask the API server before calling a Job
            // unexpected. When it lists one of them, the rest of this sync works on that fresh
            // CronJob (as upstream does), reconciled again.
            let api: Api<CronJob> = Api::namespaced(self.client.clone(), &ns);
            let fresh = match api.get(&cj.name_any()).await {
                Ok(c) => c,
                Err(e) => {
                    return (
                        None,
                        update,
                        Some(Error::kube("reading", cj.object_name(), e)),
                    )
                }
            };
            let fresh_lists = |uid: &str| {
                fresh
                    .status
                    .as_ref()
                    .and_then(|s| s.active.as_ref())
                    .is_some_and(|a| a.iter().any(|r| r.uid.as_deref() == Some(uid)))
            };
            let listed_fresh = found
                .not_listed
                .iter()
                .any(|j| fresh_lists(j.metadata.uid.as_deref().unwrap_or_default()));
            if listed_fresh {
                *cj = fresh.clone();
                status = cj.status.clone().unwrap_or_default();
                found = plan::reconcile_active(&mut status, jobs);
                update |= found.changed;
            }
            for j in &found.not_listed {
                self.event(
                    cj,
                    true,
                    "UnexpectedJob",
                    format!(
                        "Saw a job that the controller did not create or forgot: {}",
                        j.name_any()
                    ),
                );
            }
        }
        cj.status = Some(status);
        for (job, cond) in &found.saw_completed {
            self.event(
                cj,
                false,
                "SawCompletedJob",
                format!("Saw completed job: {job}, condition: {cond}"),
            );
        }
        for r in &found.maybe_missing {
            let name = r.name.clone().unwrap_or_default();
            match job_api.get_opt(&name).await {
                Ok(None) => {
                    self.event(
                        cj,
                        false,
                        "MissingJob",
                        format!("Active job went missing: {name}"),
                    );
                    if let Some(s) = cj.status.as_mut() {
                        plan::delete_from_active(s, r.uid.as_deref().unwrap_or_default());
                    }
                    update = true;
                }
                Ok(Some(_)) => {}
                Err(e) => {
                    return (
                        None,
                        update,
                        Some(Error::kube("reading Job", format!("{ns}/{name}"), e)),
                    )
                }
            }
        }

        let (_, tz_warning) = plan::format_schedule(cj);
        let decision = plan::decide(cj, now);
        if tz_warning
            && !matches!(
                decision,
                Decision::Deleting | Decision::UnknownTimeZone(_) | Decision::Suspended
            )
        {
            let schedule = cj
                .spec
                .as_ref()
                .map(|s| s.schedule.clone())
                .unwrap_or_default();
            self.event(cj, true, "UnsupportedSchedule", format!("CRON_TZ or TZ used in schedule {schedule:?} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details"));
        }
        let schedule = cj
            .spec
            .as_ref()
            .map(|s| s.schedule.clone())
            .unwrap_or_default();
        match decision {
            Decision::Deleting | Decision::Suspended => (None, update, None),
            Decision::UnknownTimeZone(e) => {
                let tz = cj
                    .spec
                    .as_ref()
                    .and_then(|s| s.time_zone.clone())
                    .unwrap_or_default();
                self.event(
                    cj,
                    true,
                    "UnknownTimeZone",
                    format!("invalid timeZone: {tz:?}: {e}"),
                );
                (None, update, None)
            }
            Decision::Unparseable(e) => {
                self.event(
                    cj,
                    true,
                    "UnparseableSchedule",
                    format!("unparseable schedule: {schedule:?} : {e}"),
                );
                (None, update, None)
            }
            Decision::Invalid(e) => {
                self.event(
                    cj,
                    true,
                    "InvalidSchedule",
                    format!("invalid schedule: {schedule} : {e}"),
                );
                (None, update, None)
            }
            Decision::NotYet(after) | Decision::AlreadyProcessed(after) => {
                (Some(after), update, None)
            }
            Decision::MissedDeadline { scheduled, requeue } => {
                let at = scheduled.strftime("%a, %d %b %Y %H:%M:%S %z").to_string();
                self.event(
                    cj,
                    true,
                    "MissSchedule",
                    format!("Missed scheduled time to start a job: {at}"),
                );
                (Some(requeue), update, None)
            }
            Decision::Forbidden(after) => {
                self.event(cj, false, "JobAlreadyActive", "Not starting job because prior execution is running and concurrency policy is Forbid".into());
                (Some(after), update, None)
            }
            Decision::Start {
                scheduled,
                replace,
                too_many_missed,
                requeue,
            } => {
                if too_many_missed {
                    self.event(cj, true, "TooManyMissedTimes", "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into());
                }
                for r in replace {
                    let (rns, rname) = (
                        r.namespace.clone().unwrap_or_else(|| ns.clone()),
                        r.name.clone().unwrap_or_default(),
                    );
                    let api: Api<Job> = Api::namespaced(self.client.clone(), &rns);
                    let job = match api.get(&rname).await {
                        Ok(j) => j,
                        Err(e) => {
                            self.event(
                                cj,
                                true,
                                "FailedGet",
                                format!("Get job: {}", api_message(&e)),
                            );
                            return (
                                None,
                                update,
                                Some(Error::kube("reading Job", format!("{rns}/{rname}"), e)),
                            );
                        }
                    };
                    let uid = job.metadata.uid.clone().unwrap_or_default();
                    if !self.delete_job(cj, &rns, &rname, &uid).await {
                        return (
                            None,
                            update,
                            Some(Error::Invalid {
                                object: cj.object_name(),
                                reason: format!("could not replace job {rns}/{rname}"),
                            }),
                        );
                    }
                    update = true;
                }
                let job = match plan::job_from_template(cj, scheduled) {
                    Ok(j) => j,
                    Err(reason) => {
                        return (
                            None,
                            update,
                            Some(Error::Invalid {
                                object: cj.object_name(),
                                reason,
                            }),
                        )
                    }
                };
                let created = match job_api.create(&PostParams::default(), &job).await {
                    Ok(j) => {
                        self.event(
                            cj,
                            false,
                            "SuccessfulCreate",
                            format!("Created job {}", j.name_any()),
                        );
                        j
                    }
                    Err(e) if is_already_exists(&e) => {
                        let existing = match job_api.get(&job.name_any()).await {
                            Ok(j) => j,
                            Err(e) => {
                                return (
                                    None,
                                    update,
                                    Some(Error::kube("reading Job", job.name_any(), e)),
                                )
                            }
                        };
                        let ours = plan::controller_of(&existing.metadata)
                            .is_some_and(|r| Some(&r.uid) == cj.metadata.uid.as_ref());
                        let uid = existing.metadata.uid.clone().unwrap_or_default();
                        let listed = cj
                            .status
                            .as_ref()
                            .and_then(|s| s.active.as_ref())
                            .is_some_and(|a| {
                                a.iter().any(|r| r.uid.as_deref() == Some(uid.as_str()))
                            });
                        if !ours || listed {
                            return (None, update, None);
                        }
                        tracing::info!(cronjob = %cj.object_name(), job = %existing.name_any(), "Job already exists");
                        existing
                    }
                    Err(e) => {
                        if !namespace_terminating(&e) && !is_not_found(&e) {
                            self.event(
                                cj,
                                true,
                                "FailedCreate",
                                format!("Error creating job: {}", api_message(&e)),
                            );
                        }
                        return (
                            None,
                            update,
                            Some(Error::kube("creating Job for", cj.object_name(), e)),
                        );
                    }
                };
                let status = cj.status.get_or_insert_with(Default::default);
                let job_ref: ObjectReference = plan::job_ref(&created);
                status.active.get_or_insert_with(Vec::new).push(job_ref);
                status.last_schedule_time = Some(Time(scheduled));
                (Some(requeue), true, None)
            }
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod plan_tests;
