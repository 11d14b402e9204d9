//! The TTL-after-finished controller (kube-controller-manager v1.34's `ttl-after-finished`
//! controller, a controller of its own there and here): deletes a finished Job
//! `spec.ttlSecondsAfterFinished` seconds after its Complete or Failed condition turned True,
//! with foreground propagation so its Pods go first.
//!
//! Owns: deleting finished Jobs that carry a TTL. Must not touch anything else. A Job is looked
//! at when it changes and re-queued for the moment its TTL expires; before deleting, it is read
//! afresh from the API server (the TTL may have been changed) and deleted with its uid as a
//! precondition.

use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, Preconditions, PropagationPolicy};
use kube::{Api, Client, ResourceExt};

use crate::error::{Error, Result};
use crate::helpers::meta::ObjectName as _;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{self, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

use crate::helpers::job::{self as jobutil, is_finished};

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "ttl_jobs_to_delete";

/// The TTL-after-finished controller's settings: `--concurrent-ttl-after-finished-syncs` workers and the clock.
pub type Config = crate::runtime::workers::TimedConfig;

/// When a finished Job with a TTL expires: the Complete/Failed transition time plus the TTL.
/// `None` when the Job has no TTL, is not finished or is being deleted; `Err` when the terminal
/// condition has no transition time.
pub fn expires_at(job: &Job) -> std::result::Result<Option<Timestamp>, String> {
    let Some(ttl) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
        return Ok(None);
    };
    if job.metadata.deletion_timestamp.is_some() || !is_finished(job) {
        return Ok(None);
    }
    let finished_at = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter().find(|c| {
                (c.type_ == jobutil::COMPLETE || c.type_ == jobutil::FAILED) && c.status == "True"
            })
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .ok_or_else(|| {
            format!(
                "{}: unable to find the time when the Job finished",
                job.object_name()
            )
        })?;
    finished_at
        .0
        .checked_add(SignedDuration::from_secs(i64::from(ttl)))
        .map(Some)
        .map_err(|e| format!("{}: spec.ttlSecondsAfterFinished: {e}", job.object_name()))
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    jobs: Arc<Indexed<Job>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handler on the shared Job informer.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let job_informer = informers.get::<Job>();
        let this = Arc::new(Controller {
            client,
            config,
            jobs: job_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        let weak: Weak<Controller> = Arc::downgrade(&this);
        job_informer.on_change(Box::new(move |_, new| {
            if let (Some(c), Some(job)) = (weak.upgrade(), new) {
                if job.metadata.deletion_timestamp.is_none()
                    && matches!(expires_at(job), Ok(Some(_)))
                {
                    c.queue.add(informer::key_of(job.as_ref()));
                }
            }
        }));
        this
    }

    /// Waits for the cache, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            "ttl-after-finished",
            &[&*self.jobs],
            &self.queue,
            self.config.workers,
        )
        .await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    /// `Some(expiry)` when `job` is due now; otherwise re-queued for its expiry.
    fn due(&self, key: &str, job: &Job) -> Result<Option<Timestamp>> {
        let at = expires_at(job).map_err(|reason| Error::Invalid {
            object: job.object_name(),
            reason,
        })?;
        let Some(at) = at else { return Ok(None) };
        let left = at.duration_since(self.config.clock.now());
        if left.is_positive() {
            self.queue.add_after(key.to_string(), left.unsigned_abs());
            return Ok(None);
        }
        Ok(Some(at))
    }
}

impl SyncKey for Controller {
    /// One look at the Job `key` (`processJob`).
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let Some(job) = self.jobs.get(ns, name) else {
            return Ok(());
        };
        if self.due(key, &job)?.is_none() {
            return Ok(());
        }
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let Some(fresh) = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube("reading", job.object_name(), e))?
        else {
            return Ok(());
        };
        if self.due(key, &fresh)?.is_none() {
            return Ok(());
        }
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: Some(Preconditions {
                uid: fresh.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        tracing::debug!(job = %fresh.object_name(), "cleaning up finished Job");
        match api.delete(&fresh.name_any(), &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(Error::kube("deleting", fresh.object_name(), e)),
        }
    }
}

/// A finished Job's remaining TTL at `now` (zero when expired), for tests and logs.
pub fn remaining(job: &Job, now: Timestamp) -> Option<Duration> {
    let at = expires_at(job).ok()??;
    let left = at.duration_since(now);
    Some(if left.is_negative() {
        Duration::ZERO
    } else {
        left.unsigned_abs()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(spec: serde_json::Value, status: serde_json::Value) -> Job {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pi", "namespace": "ns", "uid": "job-uid"},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn ttl_expires_after_the_terminal_condition() {
        let now: Timestamp = "2026-11-26T10:00:00Z".parse().unwrap();
        let j = job(
            json!({"ttlSecondsAfterFinished": 100, "template": {}}),
            json!({"conditions": [{"type": "Complete", "status": "True",
                                   "lastTransitionTime": "2026-11-26T09:59:00Z"}]}),
        );
        assert_eq!(remaining(&j, now), Some(Duration::from_secs(40)));
        let unfinished = job(
            json!({"ttlSecondsAfterFinished": 100, "template": {}}),
            json!({}),
        );
        assert_eq!(remaining(&unfinished, now), None);
    }
}
