//! The CronJob controller's decisions, pure over the cached CronJob, its Jobs and the time
//! (kube-controller-manager v1.34's `cronjob_controllerv2.go` and `utils.go`): which finished
//! Jobs the history limits remove, how `status.active` follows the Jobs, the most recent missed
//! schedule time (with `startingDeadlineSeconds` and the more-than-100-missed warning), whether
//! to start a Job now under the concurrency policy, the Job to create and when to look again.
//!
//! The 2019 controller polled (a 10 s `syncAll` over listed Jobs) and named Jobs after the
//! scheduled time in seconds; v1.34 runs on informers and a work queue with each CronJob re-queued
//! for its next schedule time (CJ-2), and names Jobs after the scheduled time in minutes (CJ-1):
//! this follows v1.34.

use crate::helpers::meta::ObjectName as _;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job, JobSpec};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;

use super::schedule::{load_location, Schedule};

/// The annotation carrying a Job's scheduled time (RFC 3339 in the CronJob's zone).
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// Upstream's `nextScheduleDelta`: a re-queue lands this long after the schedule time, so the
/// sync sees the time as passed.
pub const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);

/// How many missed start times make the "too many missed start times" warning.
pub const MANY_MISSED: i64 = 100;

pub use crate::helpers::job::finished_condition;
pub use crate::helpers::meta::controller_of;

fn time(t: Option<&Time>) -> Option<Timestamp> {
    t.map(|t| t.0)
}

/// The spec string the schedule is parsed from (`formatSchedule`): a schedule naming `TZ`
/// itself is used as written (the bool says so: upstream warns it is not supported); otherwise
/// a loadable `spec.timeZone` is prefixed as `TZ=<zone>`.
pub fn format_schedule(cj: &CronJob) -> (String, bool) {
    let spec = cj.spec.as_ref();
    let schedule = spec.map(|s| s.schedule.clone()).unwrap_or_default();
    if schedule.contains("TZ") {
        return (schedule, true);
    }
    match spec.and_then(|s| s.time_zone.as_deref()) {
        Some(tz) if load_location(tz).is_ok() => (format!("TZ={tz} {schedule}"), false),
        _ => (schedule, false),
    }
}

/// How many schedule times were missed (`missedSchedulesType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// None.
    None,
    /// At most [`MANY_MISSED`].
    Few,
    /// More than [`MANY_MISSED`].
    Many,
}

/// `mostRecentScheduleTime`: the earliest time considered (creation, last schedule, or the
/// starting deadline when `with_deadline`), the most recent schedule time at or before `now`
/// after it, and how many were missed.
pub fn most_recent_schedule_time(
    cj: &CronJob,
    now: Timestamp,
    schedule: &Schedule,
    with_deadline: bool,
) -> Result<(Timestamp, Option<Timestamp>, Missed), String> {
    let status = cj.status.as_ref();
    let mut earliest = time(status.and_then(|s| s.last_schedule_time.as_ref()))
        .or_else(|| time(cj.metadata.creation_timestamp.as_ref()))
        .unwrap_or(now);
    if with_deadline {
        if let Some(d) = cj.spec.as_ref().and_then(|s| s.starting_deadline_seconds) {
            let deadline = now
                .checked_sub(jiff::SignedDuration::from_secs(d))
                .unwrap_or(now);
            if deadline > earliest {
                earliest = deadline;
            }
        }
    }
    let Some(t1) = schedule.next(earliest) else {
        return Ok((earliest, None, Missed::None));
    };
    let Some(t2) = schedule.next(t1) else {
        return Ok((earliest, (now >= t1).then_some(t1), Missed::None));
    };
    if now < t1 {
        return Ok((earliest, None, Missed::None));
    }
    if now < t2 {
        return Ok((earliest, Some(t1), Missed::None));
    }
    // Go rounds the period to the second and truncates the elapsed time.
    let between_ms = t2.duration_since(t1).as_millis();
    let between = ((between_ms + 500).div_euclid(1000)) as i64;
    if between < 1 {
        return Err("time difference between two schedules is less than 1 second".into());
    }
    let elapsed = now.duration_since(t1).as_secs();
    let missed = elapsed / between + 1;
    let potential = t1
        .checked_add(jiff::SignedDuration::from_secs((missed - 2) * between))
        .map_err(|e| e.to_string())?;
    let mut most_recent = None;
    let mut t = schedule.next(potential);
    while let Some(cur) = t {
        if cur > now {
            break;
        }
        most_recent = Some(cur);
        t = schedule.next(cur);
    }
    let kind = if missed > MANY_MISSED {
        Missed::Many
    } else {
        Missed::Few
    };
    Ok((earliest, most_recent, kind))
}

/// `nextScheduleTimeDuration`: how long until the schedule time after the most recent one (plus
/// [`NEXT_SCHEDULE_DELTA`]); zero when that is already past.
pub fn next_schedule_duration(cj: &CronJob, now: Timestamp, schedule: &Schedule) -> Duration {
    let from = match most_recent_schedule_time(cj, now, schedule, false) {
        Err(_) => now,
        Ok((_, Some(t), _)) => t,
        Ok((earliest, None, Missed::None)) => earliest,
        Ok((_, None, _)) => now,
    };
    let Some(next) = schedule.next(from) else {
        // Never again within five years: look again then.
        return Duration::from_secs(5 * 365 * 24 * 3600);
    };
    let at = next.checked_add(NEXT_SCHEDULE_DELTA).unwrap_or(next);
    if at <= now {
        Duration::ZERO
    } else {
        at.duration_since(now).unsigned_abs()
    }
}

/// `nextScheduleTime`: the schedule time to act on now, if any, and whether more than
/// [`MANY_MISSED`] were missed (upstream then records TooManyMissedTimes).
pub fn next_schedule_time(
    cj: &CronJob,
    now: Timestamp,
    schedule: &Schedule,
) -> Result<(Option<Timestamp>, bool), String> {
    let (_, most_recent, missed) = most_recent_schedule_time(cj, now, schedule, true)?;
    match most_recent {
        Some(t) if t <= now => Ok((Some(t), missed == Missed::Many)),
        _ => Ok((None, false)),
    }
}

/// `<cronjob>-<scheduled time in minutes since the epoch>`.
pub fn job_name(cj: &CronJob, scheduled: Timestamp) -> String {
    format!(
        "{}-{}",
        cj.metadata.name.as_deref().unwrap_or_default(),
        scheduled.as_second().div_euclid(60)
    )
}

/// The controller reference a CronJob's Jobs carry.
pub fn controller_ref(cj: &CronJob) -> OwnerReference {
    crate::runtime::claim::OwnerInfo::of(cj).controller_ref()
}

/// `getJobFromTemplate2`: the Job for `scheduled`, with the template's labels and annotations,
/// the scheduled-timestamp annotation in the CronJob's zone and the controller reference.
pub fn job_from_template(cj: &CronJob, scheduled: Timestamp) -> Result<Job, String> {
    let spec = cj
        .spec
        .as_ref()
        .ok_or_else(|| format!("{}: field spec is missing", cj.object_name()))?;
    let template = &spec.job_template;
    let meta = template.metadata.clone().unwrap_or_default();
    let tz = load_location(spec.time_zone.as_deref().unwrap_or_default())
        .map_err(|e| format!("{}: spec.timeZone: {e}", cj.object_name()))?;
    let mut annotations = meta.annotations.unwrap_or_default();
    let zoned = scheduled.to_zoned(tz);
    annotations.insert(
        SCHEDULED_TIMESTAMP.to_string(),
        zoned
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
            .replace("+00:00", "Z"),
    );
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name(cj, scheduled)),
            namespace: cj.metadata.namespace.clone(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..Default::default()
        },
        spec: Some(template.spec.clone().unwrap_or_else(JobSpec::default)),
        status: None,
    })
}

/// An ObjectReference to a Job as `ref.GetReference` makes it.
pub fn job_ref(job: &Job) -> ObjectReference {
    let mut r = job.object_ref(&());
    r.api_version = Some("batch/v1".into());
    r.kind = Some("Job".into());
    r
}

/// `byJobStartTime`: Jobs with a start time first, oldest first; ties by name.
fn by_start_time(a: &Job, b: &Job) -> std::cmp::Ordering {
    let start = |j: &Job| time(j.status.as_ref().and_then(|s| s.start_time.as_ref()));
    match (start(a), start(b)) {
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (x, y) if x == y => a.metadata.name.cmp(&b.metadata.name),
        (x, y) => x.cmp(&y),
    }
}

/// `cleanupFinishedJobs`: the finished Jobs beyond `successfulJobsHistoryLimit` and
/// `failedJobsHistoryLimit`, oldest first. Nothing when neither limit is set.
pub fn jobs_to_clean(cj: &CronJob, jobs: &[Arc<Job>]) -> Vec<Arc<Job>> {
    let Some(spec) = cj.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (kind, limit) in [
        ("Complete", spec.successful_jobs_history_limit),
        ("Failed", spec.failed_jobs_history_limit),
    ] {
        let Some(limit) = limit else { continue };
        let mut finished: Vec<Arc<Job>> = jobs
            .iter()
            .filter(|j| finished_condition(j) == Some(kind))
            .cloned()
            .collect();
        let n = finished.len() as i64 - i64::from(limit);
        if n <= 0 {
            continue;
        }
        finished.sort_by(|a, b| by_start_time(a, b));
        out.extend(finished.into_iter().take(n as usize));
    }
    out
}

/// Removes the Job `uid` from `status.active`.
pub fn delete_from_active(status: &mut CronJobStatus, uid: &str) {
    if let Some(active) = status.active.as_mut() {
        active.retain(|r| r.uid.as_deref() != Some(uid));
    }
}

fn in_active(status: &CronJobStatus, uid: &str) -> bool {
    status
        .active
        .iter()
        .flatten()
        .any(|r| r.uid.as_deref() == Some(uid))
}

/// What the reconciliation of `status.active` with the Jobs found (first part of
/// `syncCronJob`).
#[derive(Debug, Default, PartialEq)]
pub struct ActiveReconcile {
    /// The status changed.
    pub changed: bool,
    /// Finished Jobs removed from the active list: (name, condition), for SawCompletedJob.
    pub saw_completed: Vec<(String, &'static str)>,
    /// Unfinished Jobs of this CronJob not in the active list (upstream re-reads the CronJob
    /// before calling one unexpected).
    pub not_listed: Vec<Arc<Job>>,
    /// Active references without a Job in the cache (upstream asks the API server).
    pub maybe_missing: Vec<ObjectReference>,
}

/// Reconciles `status.active` with `jobs` (the CronJob's Jobs): finished Jobs leave the active
/// list, `lastSuccessfulTime` follows the latest completion.
pub fn reconcile_active(status: &mut CronJobStatus, jobs: &[Arc<Job>]) -> ActiveReconcile {
    let mut out = ActiveReconcile::default();
    let mut children = HashSet::new();
    for j in jobs {
        let uid = j.metadata.uid.clone().unwrap_or_default();
        children.insert(uid.clone());
        let found = in_active(status, &uid);
        match finished_condition(j) {
            None => {
                if !found {
                    out.not_listed.push(j.clone());
                }
            }
            Some(cond) => {
                if found {
                    delete_from_active(status, &uid);
                    out.saw_completed
                        .push((j.metadata.name.clone().unwrap_or_default(), cond));
                    out.changed = true;
                }
                if cond == "Complete" {
                    let completion =
                        time(j.status.as_ref().and_then(|s| s.completion_time.as_ref()));
                    match (time(status.last_successful_time.as_ref()), completion) {
                        (None, c) => {
                            status.last_successful_time = c.map(Time);
                            out.changed = true;
                        }
                        (Some(last), Some(c)) if c > last => {
                            status.last_successful_time = Some(Time(c));
                            out.changed = true;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    for r in status.active.iter().flatten() {
        if !children.contains(r.uid.as_deref().unwrap_or_default()) {
            out.maybe_missing.push(r.clone());
        }
    }
    out
}

/// What a sync does about starting a Job (the second part of `syncCronJob`).
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Being deleted: nothing.
    Deleting,
    /// `spec.timeZone` is not a known zone (UnknownTimeZone event).
    UnknownTimeZone(String),
    /// `spec.suspend`.
    Suspended,
    /// The schedule does not parse (UnparseableSchedule event).
    Unparseable(String),
    /// The schedule is invalid (InvalidSchedule event).
    Invalid(String),
    /// No schedule time has passed: look again after the duration.
    NotYet(Duration),
    /// The most recent time is past `startingDeadlineSeconds` (MissSchedule event).
    MissedDeadline {
        /// The missed time.
        scheduled: Timestamp,
        /// Look again after.
        requeue: Duration,
    },
    /// The time was already acted on.
    AlreadyProcessed(Duration),
    /// Forbid with a Job still active (JobAlreadyActive event).
    Forbidden(Duration),
    /// Start a Job for `scheduled`, after deleting `replace` (Replace policy).
    Start {
        /// The schedule time.
        scheduled: Timestamp,
        /// Active Jobs to delete first.
        replace: Vec<ObjectReference>,
        /// More than [`MANY_MISSED`] times were missed (TooManyMissedTimes event).
        too_many_missed: bool,
        /// Look again after.
        requeue: Duration,
    },
}

/// Decides whether to start a Job at `now`, given the CronJob with its reconciled status.
pub fn decide(cj: &CronJob, now: Timestamp) -> Decision {
    if cj.metadata.deletion_timestamp.is_some() {
        return Decision::Deleting;
    }
    let spec = cj.spec.clone().unwrap_or_default();
    if let Some(tz) = spec.time_zone.as_deref() {
        if let Err(e) = load_location(tz) {
            return Decision::UnknownTimeZone(e);
        }
    }
    if spec.suspend == Some(true) {
        return Decision::Suspended;
    }
    let (formatted, _) = format_schedule(cj);
    let schedule = match Schedule::parse(&formatted) {
        Ok(s) => s,
        Err(e) => return Decision::Unparseable(e),
    };
    let (scheduled, too_many_missed) = match next_schedule_time(cj, now, &schedule) {
        Ok(x) => x,
        Err(e) => return Decision::Invalid(e),
    };
    let requeue = next_schedule_duration(cj, now, &schedule);
    let Some(scheduled) = scheduled else {
        return Decision::NotYet(requeue);
    };
    if let Some(d) = spec.starting_deadline_seconds {
        let too_late = scheduled
            .checked_add(jiff::SignedDuration::from_secs(d))
            .is_ok_and(|deadline| deadline < now);
        if too_late {
            return Decision::MissedDeadline { scheduled, requeue };
        }
    }
    let status = cj.status.clone().unwrap_or_default();
    let name = job_name(cj, scheduled);
    let listed =
        status.active.iter().flatten().any(|r| {
            r.name.as_deref() == Some(name.as_str()) && r.namespace == cj.metadata.namespace
        });
    if listed || time(status.last_schedule_time.as_ref()) == Some(scheduled) {
        return Decision::AlreadyProcessed(requeue);
    }
    let active = status.active.clone().unwrap_or_default();
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !active.is_empty() => Decision::Forbidden(requeue),
        Some("Replace") => Decision::Start {
            scheduled,
            replace: active,
            too_many_missed,
            requeue,
        },
        _ => Decision::Start {
            scheduled,
            replace: Vec::new(),
            too_many_missed,
            requeue,
        },
    }
}

/// When a CronJob's schedule or zone changed (`updateCronJob`): how long until its next time
/// (`None` when the new schedule does not parse: upstream records UnParseableCronJobSchedule).
pub fn requeue_for_changed_schedule(cj: &CronJob, now: Timestamp) -> Option<Duration> {
    let spec = cj.spec.as_ref()?;
    let formatted = match spec.time_zone.as_deref() {
        Some(tz) if !spec.schedule.contains("TZ") && load_location(tz).is_ok() => {
            format!("TZ={tz} {}", spec.schedule)
        }
        _ => spec.schedule.clone(),
    };
    let schedule = Schedule::parse(&formatted).ok()?;
    Some(next_schedule_duration(cj, now, &schedule))
}
