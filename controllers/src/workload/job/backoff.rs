//! The Job's Pod failure backoff (kube-controller-manager v1.34's `backoff_utils.go`): after
//! failures, replacement Pods wait 10 s doubling per consecutive failure since the last success,
//! at most 10 minutes, counted from the last failure's finish time. Upstream keeps the record in
//! memory only (a restarted controller starts without delays); so does this.
//!
//! Older controllers capped the backoff at 6 minutes (`MaxJobBackOff`); v1.34's
//! `MaxJobPodFailureBackOff` is 10 minutes: this follows v1.34.

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::cached_pod::CachedPod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// `DefaultJobPodFailureBackOff`.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(10);
/// `MaxJobPodFailureBackOff`.
pub const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// Failures since the last success and when the last one finished.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// Consecutive failures after the last success.
    pub failures_after_last_success: i32,
    /// When the last of them finished.
    pub last_failure_time: Option<Timestamp>,
}

/// `getFinishedTime`: the latest container finish time (if every container terminated), else
/// the Ready=False transition, else the deletion time less the grace period, else creation.
pub fn finished_time(p: &CachedPod) -> Timestamp {
    let status = p.status.as_ref();
    let containers = status.and_then(|s| s.container_statuses.as_ref());
    let mut latest: Option<Timestamp> = None;
    let mut all_terminated = containers.is_some_and(|c| !c.is_empty());
    for cs in containers.into_iter().flatten() {
        match cs
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
        {
            Some(t) => latest = Some(latest.map_or(t.0, |l| l.max(t.0))),
            None => all_terminated = false,
        }
    }
    if all_terminated {
        if let Some(t) = latest {
            return t;
        }
    }
    let ready_false = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref());
    if let Some(t) = ready_false {
        return t.0;
    }
    if let Some(d) = p.metadata.deletion_timestamp.as_ref() {
        let grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
        return d
            .0
            .checked_sub(SignedDuration::from_secs(grace))
            .unwrap_or(d.0);
    }
    p.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `newBackoffRecord`: the record after this sync's newly finished Pods.
pub fn next_record(
    prev: &Record,
    new_succeeded: &[Arc<CachedPod>],
    new_failed: &[Arc<CachedPod>],
) -> Record {
    let mut rec = prev.clone();
    let mut failed: Vec<Timestamp> = new_failed.iter().map(|p| finished_time(p)).collect();
    failed.sort();
    if new_succeeded.is_empty() {
        if let Some(last) = failed.last() {
            rec.failures_after_last_success += failed.len() as i32;
            rec.last_failure_time = Some(*last);
        }
        return rec;
    }
    rec.failures_after_last_success = 0;
    rec.last_failure_time = None;
    let last_success = new_succeeded
        .iter()
        .map(|p| finished_time(p))
        .max()
        .expect("non-empty");
    for t in failed.iter().rev() {
        if *t <= last_success {
            break;
        }
        if rec.last_failure_time.is_none() {
            rec.last_failure_time = Some(*t);
        }
        rec.failures_after_last_success += 1;
    }
    rec
}

/// `getRemainingTimeForFailuresCount`: how long creations must still wait.
pub fn remaining(failures: i32, last_failure: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(last) = last_failure else {
        return Duration::ZERO;
    };
    if failures <= 0 {
        return Duration::ZERO;
    }
    let mut backoff = DEFAULT_BACKOFF;
    for _ in 1..failures {
        backoff *= 2;
        if backoff >= MAX_BACKOFF {
            backoff = MAX_BACKOFF;
            break;
        }
    }
    let elapsed = now.duration_since(last);
    let elapsed = if elapsed.is_negative() {
        Duration::ZERO
    } else {
        elapsed.unsigned_abs()
    };
    backoff.saturating_sub(elapsed)
}

impl Record {
    /// How long creations must still wait at `now`.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        remaining(
            self.failures_after_last_success,
            self.last_failure_time,
            now,
        )
    }
}
