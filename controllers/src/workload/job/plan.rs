//! The Job controller's decisions, pure over the cached Job, its Pods and the time
//! (kube-controller-manager v1.34's `syncJob`, `manageJob` and `trackJobStatusAndRemoveFinalizers`,
//! split where upstream calls the API server):
//!
//! 1. [`evaluate`]: counts (succeeded and failed from the status, the uncounted UIDs and the
//!    newly finished Pods that still carry the tracking finalizer), the start time, the backoff
//!    record and the finished condition, in v1.34's order: an existing SuccessCriteriaMet or
//!    FailureTarget first, then the pod failure policy (FailJob), the backoff limit, the active
//!    deadline, the per-index limits and the success policy;
//! 2. [`manage`]: what `manageJob` does (JOB-4): delete every active Pod of a finished Job, or of a
//!    suspended one; delete surplus or repeated-index Pods; wait out the failure backoff; create
//!    `min(completions - succeeded, parallelism) - active - terminating` Pods (indexes lowest
//!    pending first) in slow-start batches;
//! 3. [`complete_or_suspend`]: the completion rule (JOB-3 step 4) and the Suspended condition;
//! 4. [`track`]: finished Pods' UIDs into `status.uncountedTerminatedPods`, the interim
//!    FailureTarget / SuccessCriteriaMet condition, the Pods whose tracking finalizer goes;
//!    then (after the finalizers are removed) [`clean_uncounted`] moves UIDs to the counters and
//!    [`enact_finished`] adds Complete or Failed once nothing is uncounted or terminating.
//!
//! Feature gates are those v1.34 turns on by default (JobPodReplacementPolicy, JobManagedBy,
//! JobSuccessPolicy, JobBackoffLimitPerIndex, PodIndexLabel): terminal conditions are delayed
//! behind FailureTarget / SuccessCriteriaMet and terminating Pods are counted.
//!
//! The 2019 controller (the one JOB-3/4 were first written for) counted results from Pod phases;
//! v1.34 counts through finalizers so that no Pod result is lost when Pods are deleted: this
//! follows v1.34.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::backoff::{self, Record};
use super::failure_policy::{match_policy, Action};
use super::indexed::{self, Intervals};
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::pods;

/// The finalizer that keeps a Job's Pods until their result is counted.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Upstream's `MaxUncountedPods`: finished Pods handled per sync.
pub const MAX_UNCOUNTED_PODS: usize = 500;
/// Upstream's `MaxPodCreateDeletePerSync`.
pub const MAX_POD_CREATE_DELETE_PER_SYNC: usize = 500;
/// Upstream's `SyncJobBatchPeriod`: Pod events and status updates are batched this long.
pub const SYNC_JOB_BATCH_PERIOD: Duration = Duration::from_secs(1);

/// Condition types and reasons, as `batch/v1` names them.
pub mod cond {
    /// Type.
    pub const COMPLETE: &str = crate::helpers::job::COMPLETE;
    /// Type.
    pub const FAILED: &str = crate::helpers::job::FAILED;
    /// Type.
    pub const SUSPENDED: &str = "Suspended";
    /// Type.
    pub const FAILURE_TARGET: &str = "FailureTarget";
    /// Type.
    pub const SUCCESS_CRITERIA_MET: &str = "SuccessCriteriaMet";
    /// Reason.
    pub const BACKOFF_LIMIT_EXCEEDED: &str = "BackoffLimitExceeded";
    /// Reason.
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// Reason.
    pub const POD_FAILURE_POLICY: &str = "PodFailurePolicy";
    /// Reason.
    pub const FAILED_INDEXES: &str = "FailedIndexes";
    /// Reason.
    pub const MAX_FAILED_INDEXES_EXCEEDED: &str = "MaxFailedIndexesExceeded";
    /// Reason.
    pub const SUCCESS_POLICY: &str = "SuccessPolicy";
    /// Reason.
    pub const COMPLETIONS_REACHED: &str = "CompletionsReached";
}

pub use crate::helpers::job::{finished_condition as finished_type, is_finished};
/// Whether the Pod carries the tracking finalizer.
pub fn has_tracking_finalizer(pod: &CachedPod) -> bool {
    pod.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

fn uid(pod: &CachedPod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}
fn spec(job: &Job) -> k8s_openapi::api::batch::v1::JobSpec {
    job.spec.clone().unwrap_or_default()
}

/// Whether `spec.suspend` is true.
pub fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

/// Only failed Pods are replaced (`onlyReplaceFailedPods`): podReplacementPolicy Failed, or a
/// pod failure policy (which implies it).
pub fn only_replace_failed(job: &Job) -> bool {
    let s = spec(job);
    s.pod_replacement_policy.as_deref() == Some("Failed") || s.pod_failure_policy.is_some()
}

/// `isPodFailed`: Failed, or (unless only failed Pods are replaced) being deleted without having
/// succeeded: an orphan that never reaches Failed still counts.
pub fn is_pod_failed(pod: &CachedPod, job: &Job) -> bool {
    if pod.phase() == "Failed" {
        return true;
    }
    if only_replace_failed(job) {
        return false;
    }
    pod.metadata.deletion_timestamp.is_some() && pod.phase() != "Succeeded"
}

fn find_condition<'a>(conds: &'a [JobCondition], t: &str) -> Option<&'a JobCondition> {
    conds.iter().find(|c| c.type_ == t)
}

/// A condition with both times `now` (`newCondition`).
pub fn new_condition(
    t: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> JobCondition {
    JobCondition {
        type_: t.into(),
        status: status.into(),
        reason: (!reason.is_empty()).then(|| reason.into()),
        message: (!message.is_empty()).then(|| message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// `ensureJobConditionStatus`: sets the condition of type `t` (a new False one is not added);
/// returns whether the list changed.
pub fn ensure_condition(
    conds: &mut Vec<JobCondition>,
    t: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    if let Some(c) = conds.iter_mut().find(|c| c.type_ == t) {
        if c.status != status
            || c.reason.as_deref().unwrap_or_default() != reason
            || c.message.as_deref().unwrap_or_default() != message
        {
            *c = new_condition(t, status, reason, message, now);
            return true;
        }
        return false;
    }
    if status != "False" {
        conds.push(new_condition(t, status, reason, message, now));
        return true;
    }
    false
}

/// One sync's working state (upstream's `syncJobCtx`).
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The Job with the status this sync is building.
    pub job: Job,
    /// The Job's Pods (claimed).
    pub pods: Vec<Arc<CachedPod>>,
    /// The active ones.
    pub active: Vec<Arc<CachedPod>>,
    /// Ready active Pods.
    pub ready: i32,
    /// Terminating Pods.
    pub terminating: i32,
    /// Succeeded Pods so far (counted, uncounted and new).
    pub succeeded: i32,
    /// Failed Pods so far (counted, uncounted and new ones the policy does not ignore).
    pub failed: i32,
    /// The condition that ends the Job, once decided.
    pub finished: Option<JobCondition>,
    /// Indexed: succeeded indexes in the status before this sync.
    pub prev_succeeded_indexes: Intervals,
    /// Indexed: succeeded indexes now.
    pub succeeded_indexes: Intervals,
    /// Indexed with backoffLimitPerIndex: failed indexes.
    pub failed_indexes: Option<Intervals>,
    /// The backoff record after this sync's newly finished Pods.
    pub backoff: Record,
    /// Pods whose finalizer removal is still to be observed (they were counted already).
    pub expected_rm_finalizers: HashSet<String>,
    /// UIDs in `status.uncountedTerminatedPods.succeeded` at the start.
    pub uncounted_succeeded: HashSet<String>,
    /// UIDs in `status.uncountedTerminatedPods.failed` at the start.
    pub uncounted_failed: HashSet<String>,
    /// backoffLimitPerIndex: per index, the failed Pod whose finalizer waits for its replacement.
    pub delayed_per_index: BTreeMap<i32, Arc<CachedPod>>,
    /// Re-sync after this long for the active deadline.
    pub deadline_requeue: Option<Duration>,
    /// The Job reached the per-sync limit of uncounted Pods.
    pub reached_max_uncounted: bool,
}

fn completions(job: &Job) -> i32 {
    spec(job).completions.unwrap_or(0)
}

fn has_backoff_limit_per_index(job: &Job) -> bool {
    spec(job).backoff_limit_per_index.is_some()
}

/// `getValidPodsWithFilter`: Pods with the finalizer, not in `uncounted`, not already being
/// un-finalized, with a valid index for Indexed Jobs, passing `filter`.
fn valid_pods(
    ctx: &Ctx,
    uncounted: Option<&HashSet<String>>,
    filter: impl Fn(&CachedPod) -> bool,
) -> Vec<Arc<CachedPod>> {
    let indexed = indexed::is_indexed(&ctx.job);
    let completions = completions(&ctx.job);
    ctx.pods
        .iter()
        .filter(|p| {
            let u = uid(p);
            has_tracking_finalizer(p)
                && !uncounted.is_some_and(|s| s.contains(&u))
                && !ctx.expected_rm_finalizers.contains(&u)
                && (!indexed || indexed::valid_index(p, completions).is_some())
                && filter(p)
        })
        .cloned()
        .collect()
}

/// Newly finished Pods not yet in the status (`getNewFinishedPods`).
fn new_finished(ctx: &Ctx) -> (Vec<Arc<CachedPod>>, Vec<Arc<CachedPod>>) {
    let succeeded = valid_pods(ctx, Some(&ctx.uncounted_succeeded), |p| {
        p.phase() == "Succeeded"
    });
    let job = ctx.job.clone();
    let failed = valid_pods(ctx, Some(&ctx.uncounted_failed), |p| is_pod_failed(p, &job));
    (succeeded, failed)
}

/// `isIndexFailed`.
fn is_index_failed(job: &Job, pod: &CachedPod) -> bool {
    let s = spec(job);
    let mut counted = false;
    if is_pod_failed(pod, job) {
        if s.pod_failure_policy.is_some() {
            let v = match_policy(s.pod_failure_policy.as_ref(), pod);
            if v.action == Some(Action::FailIndex) {
                return true;
            }
            counted = v.count;
        } else {
            counted = true;
        }
    }
    counted && indexed::index_failure_count(pod) >= s.backoff_limit_per_index.unwrap_or(0)
}

/// `pastBackoffLimitOnFailure`: with restartPolicy OnFailure, container restarts of running and
/// pending Pods count as failures.
fn past_backoff_limit_on_failure(job: &Job, pods: &[Arc<CachedPod>]) -> bool {
    let s = spec(job);
    let restart = s
        .template
        .spec
        .as_ref()
        .and_then(|p| p.restart_policy.as_deref())
        .unwrap_or_default();
    if restart != "OnFailure" {
        return false;
    }
    let mut restarts = 0;
    for p in pods {
        if matches!(p.phase(), "Running" | "Pending") {
            let st = p.status.clone().unwrap_or_default();
            for cs in st
                .init_container_statuses
                .iter()
                .flatten()
                .chain(st.container_statuses.iter().flatten())
            {
                restarts += cs.restart_count;
            }
        }
    }
    let limit = s.backoff_limit.unwrap_or(6);
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= limit
    }
}

/// `pastActiveDeadline`.
fn past_active_deadline(job: &Job, now: Timestamp) -> bool {
    let (Some(ads), Some(start)) = (
        spec(job).active_deadline_seconds,
        job.status.as_ref().and_then(|s| s.start_time.as_ref()),
    ) else {
        return false;
    };
    if is_suspended(job) {
        return false;
    }
    now.duration_since(start.0).as_secs() >= ads
}

/// `matchSuccessPolicy`: the message when a rule of `spec.successPolicy` is met.
fn match_success_policy(job: &Job, succeeded: &Intervals) -> Option<String> {
    let s = spec(job);
    let policy = s.success_policy.as_ref()?;
    if succeeded.is_empty() {
        return None;
    }
    let completions = s.completions.unwrap_or(0);
    for (index, rule) in policy.rules.iter().enumerate() {
        if let Some(indexes) = rule.succeeded_indexes.as_deref() {
            let required = Intervals::parse(indexes, completions);
            if required.is_empty() {
                continue;
            }
            let contained: i32 = (0..completions)
                .filter(|i| required.has(*i) && succeeded.has(*i))
                .count() as i32;
            if contained == required.total() || rule.succeeded_count.is_some_and(|c| contained >= c)
            {
                return Some(format!("Matched rules at index {index}"));
            }
        } else if let Some(c) = rule.succeeded_count {
            if succeeded.total() >= c {
                return Some(format!("Matched rules at index {index}"));
            }
        }
    }
    None
}

/// `calculateSucceededIndexes`: (indexes in the status, with newly succeeded Pods added).
fn succeeded_indexes(job: &Job, pods: &[Arc<CachedPod>]) -> (Intervals, Intervals) {
    let c = completions(job);
    let prev = Intervals::parse(
        job.status
            .as_ref()
            .and_then(|s| s.completed_indexes.as_deref())
            .unwrap_or_default(),
        c,
    );
    let new: Vec<i32> = pods
        .iter()
        .filter(|p| p.phase() == "Succeeded" && has_tracking_finalizer(p))
        .filter_map(|p| indexed::valid_index(p, c))
        .collect();
    let now = prev.with_indexes(new);
    (prev, now)
}

/// `calculateFailedIndexes`.
fn failed_indexes(job: &Job, pods: &[Arc<CachedPod>]) -> Intervals {
    let c = completions(job);
    let prev = job
        .status
        .as_ref()
        .and_then(|s| s.failed_indexes.as_deref())
        .map(|s| Intervals::parse(s, c))
        .unwrap_or_default();
    let new: Vec<i32> = pods
        .iter()
        .filter(|p| has_tracking_finalizer(p) && is_index_failed(job, p))
        .filter_map(|p| indexed::valid_index(p, c))
        .collect();
    prev.with_indexes(new)
}

/// `getPodsWithDelayedDeletionPerIndex`.
fn delayed_per_index(ctx: &Ctx) -> BTreeMap<i32, Arc<CachedPod>> {
    let active = indexed::indexes_of(&ctx.active);
    let c = completions(&ctx.job);
    let mut out: BTreeMap<i32, Arc<CachedPod>> = BTreeMap::new();
    let job = ctx.job.clone();
    for p in valid_pods(ctx, None, |p| is_pod_failed(p, &job)) {
        let Some(ix) = indexed::valid_index(&p, c) else {
            continue;
        };
        if ctx.succeeded_indexes.has(ix)
            || ctx.failed_indexes.as_ref().is_some_and(|f| f.has(ix))
            || active.contains(&ix)
        {
            continue;
        }
        match out.get(&ix) {
            Some(last)
                if !(indexed::index_absolute_failure_count(last)
                    <= indexed::index_absolute_failure_count(&p)
                    && backoff::finished_time(&p) >= backoff::finished_time(last)) => {}
            _ => {
                out.insert(ix, p);
            }
        }
    }
    out
}

/// Step 1 of a sync: counts, start time, backoff record and the finished condition.
/// `pods` are the claimed Pods; `prev_backoff` the record kept in memory for this Job.
pub fn evaluate(
    job: &Job,
    pods: Vec<Arc<CachedPod>>,
    expected_rm_finalizers: HashSet<String>,
    prev_backoff: &Record,
    now: Timestamp,
) -> Ctx {
    let mut job = job.clone();
    let status = job.status.get_or_insert_with(JobStatus::default);
    let uncounted = status
        .uncounted_terminated_pods
        .get_or_insert_with(UncountedTerminatedPods::default)
        .clone();
    let active = pods::filter_active_pods(&pods);
    let ready = active.iter().filter(|p| pods::is_pod_ready(p)).count() as i32;
    let terminating = pods.iter().filter(|p| pods::is_pod_terminating(p)).count() as i32;
    let mut ctx = Ctx {
        job,
        active,
        ready,
        terminating,
        succeeded: 0,
        failed: 0,
        finished: None,
        prev_succeeded_indexes: Intervals::default(),
        succeeded_indexes: Intervals::default(),
        failed_indexes: None,
        backoff: Record::default(),
        expected_rm_finalizers,
        uncounted_succeeded: uncounted.succeeded.iter().flatten().cloned().collect(),
        uncounted_failed: uncounted.failed.iter().flatten().cloned().collect(),
        delayed_per_index: BTreeMap::new(),
        deadline_requeue: None,
        reached_max_uncounted: false,
        pods,
    };
    let (new_succeeded, new_failed) = new_finished(&ctx);
    let s = spec(&ctx.job);
    let status = ctx.job.status.clone().unwrap_or_default();
    let non_ignored = new_failed
        .iter()
        .filter(|p| match_policy(s.pod_failure_policy.as_ref(), p).count)
        .count() as i32;
    ctx.succeeded = status.succeeded.unwrap_or(0)
        + new_succeeded.len() as i32
        + ctx.uncounted_succeeded.len() as i32;
    ctx.failed = status.failed.unwrap_or(0) + non_ignored + ctx.uncounted_failed.len() as i32;

    // First start: the start time, unless suspended.
    if status.start_time.is_none() && !is_suspended(&ctx.job) {
        ctx.job.status.as_mut().expect("set above").start_time = Some(Time(now));
    }
    ctx.backoff = backoff::next_record(prev_backoff, &new_succeeded, &new_failed);

    let conds = status.conditions.clone().unwrap_or_default();
    let backoff_limit = s.backoff_limit.unwrap_or(6);
    // 1. A SuccessCriteriaMet or FailureTarget from an earlier sync stands.
    ctx.finished = find_condition(&conds, cond::SUCCESS_CRITERIA_MET)
        .filter(|c| c.status == "True")
        .cloned();
    if ctx.finished.is_none() {
        if let Some(ft) =
            find_condition(&conds, cond::FAILURE_TARGET).filter(|c| c.status == "True")
        {
            ctx.finished = Some(new_condition(
                cond::FAILED,
                "True",
                ft.reason.as_deref().unwrap_or_default(),
                ft.message.as_deref().unwrap_or_default(),
                now,
            ));
        } else if let Some(msg) = fail_job_message(&ctx.job, &ctx.pods) {
            // 2. The pod failure policy's FailJob.
            ctx.finished = Some(new_condition(
                cond::FAILURE_TARGET,
                "True",
                cond::POD_FAILURE_POLICY,
                &msg,
                now,
            ));
        }
    }
    // 3. The backoff limit and the active deadline.
    if ctx.finished.is_none() {
        if ctx.failed > backoff_limit || past_backoff_limit_on_failure(&ctx.job, &ctx.pods) {
            ctx.finished = Some(failure_condition(
                cond::BACKOFF_LIMIT_EXCEEDED,
                "Job has reached the specified backoff limit",
                now,
            ));
        } else if past_active_deadline(&ctx.job, now) {
            ctx.finished = Some(failure_condition(
                cond::DEADLINE_EXCEEDED,
                "Job was active longer than specified deadline",
                now,
            ));
        } else if let (Some(ads), false) = (s.active_deadline_seconds, is_suspended(&ctx.job)) {
            let start = ctx
                .job
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0)
                .unwrap_or(now);
            let left = start
                .checked_add(jiff::SignedDuration::from_secs(ads))
                .map(|end| end.duration_since(now))
                .unwrap_or_default();
            ctx.deadline_requeue = Some(if left.is_negative() {
                Duration::ZERO
            } else {
                left.unsigned_abs()
            });
        }
    }
    // 4. Indexed: per-index limits and the success policy.
    if indexed::is_indexed(&ctx.job) {
        let (prev, now_ix) = succeeded_indexes(&ctx.job, &ctx.pods);
        ctx.prev_succeeded_indexes = prev;
        ctx.succeeded_indexes = now_ix;
        ctx.succeeded = ctx.succeeded_indexes.total();
        if has_backoff_limit_per_index(&ctx.job) {
            let failed = failed_indexes(&ctx.job, &ctx.pods);
            if ctx.finished.is_none() {
                if s.max_failed_indexes.is_some_and(|m| failed.total() > m) {
                    ctx.finished = Some(failure_condition(
                        cond::MAX_FAILED_INDEXES_EXCEEDED,
                        "Job has exceeded the specified maximal number of failed indexes",
                        now,
                    ));
                } else if failed.total() > 0
                    && failed.total() + ctx.succeeded_indexes.total() >= completions(&ctx.job)
                {
                    ctx.finished = Some(failure_condition(
                        cond::FAILED_INDEXES,
                        "Job has failed indexes",
                        now,
                    ));
                }
            }
            ctx.failed_indexes = Some(failed);
            ctx.delayed_per_index = delayed_per_index(&ctx);
        }
        if ctx.finished.is_none() {
            if let Some(msg) = match_success_policy(&ctx.job, &ctx.succeeded_indexes) {
                ctx.finished = Some(new_condition(
                    cond::SUCCESS_CRITERIA_MET,
                    "True",
                    cond::SUCCESS_POLICY,
                    &msg,
                    now,
                ));
            }
        }
    }
    ctx
}

/// A failure found this sync: FailureTarget first (v1.34 delays Failed until the Pods are
/// gone).
fn failure_condition(reason: &str, message: &str, now: Timestamp) -> JobCondition {
    new_condition(cond::FAILURE_TARGET, "True", reason, message, now)
}

/// `getFailJobMessage`: the FailJob message of the first failed Pod a FailJob rule matches.
fn fail_job_message(job: &Job, pods: &[Arc<CachedPod>]) -> Option<String> {
    let policy = spec(job).pod_failure_policy?;
    pods.iter()
        .filter(|p| is_pod_failed(p, job))
        .find_map(|p| match_policy(Some(&policy), p).fail_job)
}

/// What to do with the Pods this sync.
#[derive(Debug, Clone, PartialEq)]
pub enum Manage {
    /// Nothing (also when manageJob is not called).
    Nothing,
    /// The Job is finishing: delete these active Pods, keeping their finalizers (their result
    /// is counted when they are gone).
    DeleteFinished(Vec<Arc<CachedPod>>),
    /// Suspended, surplus or repeated-index Pods: remove the finalizer, then delete.
    Delete(Vec<Arc<CachedPod>>),
    /// Replacements must wait out the failure backoff: look again after this long.
    Backoff(Duration),
    /// Create Pods: `count` of them; for an Indexed Job one per index of `indexes`.
    Create {
        /// How many.
        count: usize,
        /// The indexes (Indexed Jobs).
        indexes: Vec<i32>,
    },
}

/// `activePodsForRemoval`: repeated or invalid indexes first, then by deletion order.
pub fn active_pods_for_removal(
    job: &Job,
    active: &[Arc<CachedPod>],
    at_least: usize,
) -> Vec<Arc<CachedPod>> {
    let sort = |v: &mut Vec<Arc<CachedPod>>| {
        let ranks = vec![0; v.len()];
        pods::sort_for_deletion(v, &ranks, None);
    };
    let (mut rm, mut left) = if indexed::is_indexed(job) {
        indexed::duplicated_for_removal(active, completions(job), sort)
    } else {
        (Vec::new(), active.to_vec())
    };
    if rm.len() < at_least {
        sort(&mut left);
        let need = at_least - rm.len();
        rm.extend(left.into_iter().take(need));
    }
    rm
}

/// Step 2 (`manageJob`, JOB-4), given the evaluation. Called only when the expectations are
/// satisfied and the Job is not being deleted, or when the Job is finishing.
pub fn manage(ctx: &Ctx, now: Timestamp) -> Manage {
    if ctx.finished.is_some() {
        return Manage::DeleteFinished(ctx.active.clone());
    }
    let job = &ctx.job;
    let s = spec(job);
    let active = ctx.active.len() as i32;
    if is_suspended(job) {
        return Manage::Delete(active_pods_for_removal(job, &ctx.active, ctx.active.len()));
    }
    let parallelism = s.parallelism.unwrap_or(1);
    let want_active = match s.completions {
        // Without completions: keep what runs once something succeeded.
        None if ctx.succeeded > 0 => active,
        None => parallelism,
        Some(c) => (c - ctx.succeeded).clamp(0, parallelism.max(0)),
    };
    let rm_at_least = (active - want_active).max(0) as usize;
    let mut rm = active_pods_for_removal(job, &ctx.active, rm_at_least);
    rm.truncate(MAX_POD_CREATE_DELETE_PER_SYNC);
    if !rm.is_empty() {
        return Manage::Delete(rm);
    }
    let terminating = if only_replace_failed(job) {
        ctx.terminating
    } else {
        0
    };
    let diff = want_active - terminating - active;
    if diff <= 0 {
        return Manage::Nothing;
    }
    if !has_backoff_limit_per_index(job) {
        let wait = ctx.backoff.remaining(now);
        if !wait.is_zero() {
            return Manage::Backoff(wait);
        }
    }
    let mut diff = (diff as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC);
    let mut indexes = Vec::new();
    if indexed::is_indexed(job) {
        let mut other = ctx.failed_indexes.clone().unwrap_or_default();
        if only_replace_failed(job) {
            let terminating: Vec<Arc<CachedPod>> = ctx
                .pods
                .iter()
                .filter(|p| pods::is_pod_terminating(p))
                .cloned()
                .collect();
            other = other.with_indexes(indexed::indexes_of(&terminating));
        }
        indexes = indexed::first_pending(
            diff,
            completions(job),
            &ctx.succeeded_indexes,
            &indexed::indexes_of(&ctx.active),
            &other,
        );
        if has_backoff_limit_per_index(job) {
            let mut now_ready = Vec::new();
            let mut min_wait: Option<Duration> = None;
            for ix in indexes {
                let wait = match ctx.delayed_per_index.get(&ix) {
                    None => Duration::ZERO,
                    Some(last) => backoff::remaining(
                        indexed::index_absolute_failure_count(last) + 1,
                        Some(backoff::finished_time(last)),
                        now,
                    ),
                };
                if wait.is_zero() {
                    now_ready.push(ix);
                } else {
                    min_wait = Some(min_wait.map_or(wait, |m| m.min(wait)));
                }
            }
            if now_ready.is_empty() {
                if let Some(w) = min_wait {
                    return Manage::Backoff(w);
                }
            }
            indexes = now_ready;
        }
        diff = indexes.len();
    }
    if diff == 0 {
        return Manage::Nothing;
    }
    Manage::Create {
        count: diff,
        indexes,
    }
}

/// The Pod to create (`CreatePodsWithGenerateName` on the template with the tracking finalizer;
/// for an index: the index annotation and label, hostname `<job>-<index>`, `JOB_COMPLETION_INDEX`
/// from the label, and with backoffLimitPerIndex the failure-count annotations carried over from
/// the Pod it replaces).
pub fn pod_from_template(job: &Job, index: Option<i32>, replaced: Option<&CachedPod>) -> Pod {
    let s = spec(job);
    let mut template: PodTemplateSpec = s.template.clone();
    let name = job.metadata.name.clone().unwrap_or_default();
    let mut meta = template.metadata.take().unwrap_or_default();
    let mut pod_spec = template.spec.take().unwrap_or_default();
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.into());
    }
    if let Some(ix) = index {
        let field_path = format!("metadata.labels['{}']", indexed::COMPLETION_INDEX);
        for c in pod_spec
            .init_containers
            .iter_mut()
            .flatten()
            .chain(pod_spec.containers.iter_mut())
        {
            let env = c.env.get_or_insert_with(Vec::new);
            if !env.iter().any(|e| e.name == indexed::COMPLETION_INDEX_ENV) {
                env.push(EnvVar {
                    name: indexed::COMPLETION_INDEX_ENV.into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            api_version: None,
                            field_path: field_path.clone(),
                        }),
                        ..Default::default()
                    }),
                });
            }
        }
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(indexed::COMPLETION_INDEX.into(), ix.to_string());
        if has_backoff_limit_per_index(job) {
            let (mut counted, mut ignored) = (0, 0);
            if let Some(p) = replaced {
                (counted, ignored) = indexed::index_failure_counts(p);
                if match_policy(s.pod_failure_policy.as_ref(), p).count {
                    counted += 1;
                } else {
                    ignored += 1;
                }
            }
            annotations.insert(indexed::INDEX_FAILURE_COUNT.into(), counted.to_string());
            if ignored > 0 {
                annotations.insert(
                    indexed::INDEX_IGNORED_FAILURE_COUNT.into(),
                    ignored.to_string(),
                );
            }
        }
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(indexed::COMPLETION_INDEX.into(), ix.to_string());
        pod_spec.hostname = Some(format!("{name}-{ix}"));
    }
    // `CreatePodsWithGenerateName`: the template's Pod, with the index in its generateName.
    let owner = crate::runtime::claim::OwnerInfo::of(job);
    let mut pod = crate::runtime::pod_control::pod_from_template(
        &PodTemplateSpec {
            metadata: Some(meta),
            spec: Some(pod_spec),
        },
        &owner,
    );
    if let Some(ix) = index {
        pod.metadata.generate_name = Some(indexed::generate_name_with_index(&name, ix));
    }
    pod.metadata.namespace = job.metadata.namespace.clone();
    pod
}

/// Step 3: after `manage` (or without it), with `active` the active count it left. The
/// completion rule (JOB-3 step 4) or, when `manage_called`, the Suspended condition. Returns
/// whether the Suspended condition changed, and the event to record (reason, message).
pub fn complete_or_suspend(
    ctx: &mut Ctx,
    manage_called: bool,
    active: i32,
    now: Timestamp,
) -> (bool, Option<(&'static str, &'static str)>) {
    let s = spec(&ctx.job);
    let complete = match s.completions {
        // Any success, once nothing runs, completes a Job without completions.
        None => ctx.succeeded > 0 && active == 0,
        Some(c) => ctx.succeeded >= c && active == 0,
    };
    if complete {
        ctx.finished = Some(new_condition(
            cond::SUCCESS_CRITERIA_MET,
            "True",
            cond::COMPLETIONS_REACHED,
            "Reached expected number of succeeded pods",
            now,
        ));
        return (false, None);
    }
    if !manage_called {
        return (false, None);
    }
    let suspended = is_suspended(&ctx.job);
    let status = ctx.job.status.get_or_insert_with(JobStatus::default);
    let conds = status.conditions.get_or_insert_with(Vec::new);
    if suspended {
        let changed = ensure_condition(
            conds,
            cond::SUSPENDED,
            "True",
            "JobSuspended",
            "Job suspended",
            now,
        );
        return (changed, changed.then_some(("Suspended", "Job suspended")));
    }
    let changed = ensure_condition(
        conds,
        cond::SUSPENDED,
        "False",
        "JobResumed",
        "Job resumed",
        now,
    );
    if changed {
        // The active deadline counts from the resumption.
        status.start_time = Some(Time(now));
        return (true, Some(("Resumed", "Job resumed")));
    }
    (false, None)
}

/// What [`track`] decided.
#[derive(Debug, Clone, Default)]
pub struct Tracking {
    /// Pods whose tracking finalizer goes now.
    pub remove_finalizer: Vec<Arc<CachedPod>>,
    /// UIDs of Pods still carrying the finalizer (those not yet un-finalized).
    pub with_finalizer: HashSet<String>,
    /// The status must be written before the finalizers are removed.
    pub needs_flush: bool,
}

/// `canRemoveFinalizer`.
fn can_remove_finalizer(ctx: &Ctx, pod: &CachedPod, considered_failed: bool) -> bool {
    if ctx.job.metadata.deletion_timestamp.is_some()
        || ctx.finished.is_some()
        || pod.phase() == "Succeeded"
    {
        return true;
    }
    if !considered_failed {
        return false;
    }
    if has_backoff_limit_per_index(&ctx.job) {
        if let Some(ix) = indexed::completion_index(pod) {
            if ctx
                .delayed_per_index
                .get(&ix)
                .is_some_and(|p| p.metadata.uid == pod.metadata.uid)
            {
                return false;
            }
        }
    }
    true
}

/// `cleanUncountedPodsWithoutFinalizers`: UIDs whose Pod no longer has the finalizer move from
/// `uncountedTerminatedPods` to the counters. Returns whether the status changed.
pub fn clean_uncounted(status: &mut JobStatus, with_finalizer: &HashSet<String>) -> bool {
    let u = status
        .uncounted_terminated_pods
        .get_or_insert_with(UncountedTerminatedPods::default);
    let mut changed = false;
    let succeeded = u.succeeded.take().unwrap_or_default();
    let kept: Vec<String> = succeeded
        .iter()
        .filter(|x| with_finalizer.contains(*x))
        .cloned()
        .collect();
    let moved_s = (succeeded.len() - kept.len()) as i32;
    u.succeeded = (!kept.is_empty()).then_some(kept);
    let failed = u.failed.take().unwrap_or_default();
    let kept: Vec<String> = failed
        .iter()
        .filter(|x| with_finalizer.contains(*x))
        .cloned()
        .collect();
    let moved_f = (failed.len() - kept.len()) as i32;
    u.failed = (!kept.is_empty()).then_some(kept);
    if moved_s > 0 {
        status.succeeded = Some(status.succeeded.unwrap_or(0) + moved_s);
        changed = true;
    }
    if moved_f > 0 {
        status.failed = Some(status.failed.unwrap_or(0) + moved_f);
        changed = true;
    }
    changed
}

/// Step 4 (`trackJobStatusAndRemoveFinalizers` up to the first write): finished Pods into the
/// uncounted lists, the indexes, the interim FailureTarget / SuccessCriteriaMet condition (and
/// `ctx.finished` turned into the terminal Failed / Complete to add later).
pub fn track(ctx: &mut Ctx, mut needs_flush: bool, now: Timestamp) -> Tracking {
    let indexed_job = indexed::is_indexed(&ctx.job);
    let completions = completions(&ctx.job);
    let s = spec(&ctx.job);
    if indexed_job {
        ctx.pods
            .sort_by_key(|p| indexed::completion_index(p).unwrap_or(-1));
    }
    let with_finalizer: HashSet<String> = ctx
        .pods
        .iter()
        .filter(|p| has_tracking_finalizer(p) && !ctx.expected_rm_finalizers.contains(&uid(p)))
        .map(|p| uid(p))
        .collect();
    let status = ctx.job.status.get_or_insert_with(JobStatus::default);
    if clean_uncounted(status, &with_finalizer) {
        needs_flush = true;
    }
    let mut remove = Vec::new();
    let mut new_indexes = Vec::new();
    let mut uncounted_s: Vec<String> = status
        .uncounted_terminated_pods
        .as_ref()
        .and_then(|u| u.succeeded.clone())
        .unwrap_or_default();
    let mut uncounted_f: Vec<String> = status
        .uncounted_terminated_pods
        .as_ref()
        .and_then(|u| u.failed.clone())
        .unwrap_or_default();
    let finished_not_success = ctx
        .finished
        .as_ref()
        .is_some_and(|c| !(c.type_ == cond::SUCCESS_CRITERIA_MET && c.status == "True"));
    for pod in ctx.pods.clone() {
        let u = uid(&pod);
        if !has_tracking_finalizer(&pod) || ctx.expected_rm_finalizers.contains(&u) {
            continue;
        }
        let considered_failed = is_pod_failed(&pod, &ctx.job);
        if !can_remove_finalizer(ctx, &pod, considered_failed) {
            continue;
        }
        remove.push(pod.clone());
        if pod.phase() == "Succeeded" && !ctx.uncounted_failed.contains(&u) {
            if indexed_job {
                if let Some(ix) = indexed::valid_index(&pod, completions) {
                    if !ctx.prev_succeeded_indexes.has(ix) {
                        new_indexes.push(ix);
                        needs_flush = true;
                    }
                }
            } else if !ctx.uncounted_succeeded.contains(&u) {
                needs_flush = true;
                uncounted_s.push(u.clone());
            }
        } else if considered_failed || finished_not_success {
            // A finishing Job counts every Pod that did not succeed as failed.
            let valid = !indexed_job || indexed::valid_index(&pod, completions).is_some();
            if !ctx.uncounted_failed.contains(&u)
                && valid
                && match_policy(s.pod_failure_policy.as_ref(), &pod).count
            {
                needs_flush = true;
                uncounted_f.push(u.clone());
            }
        }
        if new_indexes.len() + uncounted_s.len() + uncounted_f.len() >= MAX_UNCOUNTED_PODS {
            ctx.reached_max_uncounted = true;
            break;
        }
    }
    let status = ctx.job.status.get_or_insert_with(JobStatus::default);
    let u = status
        .uncounted_terminated_pods
        .get_or_insert_with(UncountedTerminatedPods::default);
    u.succeeded = (!uncounted_s.is_empty()).then_some(uncounted_s);
    u.failed = (!uncounted_f.is_empty()).then_some(uncounted_f);
    if indexed_job {
        ctx.succeeded_indexes = ctx.succeeded_indexes.with_indexes(new_indexes);
        let text = ctx.succeeded_indexes.to_string();
        if status.completed_indexes.as_deref().unwrap_or_default() != text {
            needs_flush = true;
        }
        status.succeeded = Some(ctx.succeeded_indexes.total());
        status.completed_indexes = Some(text);
        let failed = ctx.failed_indexes.as_ref().map(|f| f.to_string());
        if status.failed_indexes != failed {
            status.failed_indexes = failed;
            needs_flush = true;
        }
    }
    // The interim conditions go in before the finalizers are removed.
    if let Some(f) = ctx.finished.clone() {
        let conds = status.conditions.get_or_insert_with(Vec::new);
        if f.type_ == cond::FAILURE_TARGET {
            conds.push(f.clone());
            needs_flush = true;
            ctx.finished = Some(new_condition(
                cond::FAILED,
                "True",
                f.reason.as_deref().unwrap_or_default(),
                f.message.as_deref().unwrap_or_default(),
                now,
            ));
        } else if f.type_ == cond::SUCCESS_CRITERIA_MET && f.status == "True" {
            let present = find_condition(conds, cond::SUCCESS_CRITERIA_MET)
                .is_some_and(|c| c.status == "True");
            if !present {
                conds.push(f.clone());
                needs_flush = true;
            }
            ctx.finished = Some(new_condition(
                cond::COMPLETE,
                "True",
                f.reason.as_deref().unwrap_or_default(),
                f.message.as_deref().unwrap_or_default(),
                now,
            ));
        }
    }
    Tracking {
        remove_finalizer: remove,
        with_finalizer,
        needs_flush,
    }
}

/// `enactJobFinished`: adds the terminal condition (and completionTime for Complete) once no
/// Pod is uncounted or terminating. Returns whether the Job is finished now.
pub fn enact_finished(ctx: &mut Ctx, now: Timestamp) -> bool {
    let Some(f) = ctx.finished.clone() else {
        return false;
    };
    if ctx.reached_max_uncounted {
        return false;
    }
    let status = ctx.job.status.get_or_insert_with(JobStatus::default);
    if let Some(u) = status.uncounted_terminated_pods.as_ref() {
        let n = u.succeeded.as_ref().map_or(0, Vec::len) + u.failed.as_ref().map_or(0, Vec::len);
        if n > 0 {
            return false;
        }
    }
    if ctx.terminating > 0 {
        return false;
    }
    let conds = status.conditions.get_or_insert_with(Vec::new);
    ensure_condition(
        conds,
        &f.type_,
        &f.status,
        f.reason.as_deref().unwrap_or_default(),
        f.message.as_deref().unwrap_or_default(),
        now,
    );
    if f.type_ == cond::COMPLETE {
        status.completion_time =
            find_condition(conds, cond::COMPLETE).and_then(|c| c.last_transition_time.clone());
    }
    true
}

/// Counts the Pods of `pods` that are Ready.
pub fn count_ready(pods: &[Arc<CachedPod>]) -> i32 {
    pods.iter().filter(|p| pods::is_pod_ready(p)).count() as i32
}

/// The in-memory backoff records, by Job key.
pub type BackoffStore = HashMap<String, Record>;
