//! What more than one controller reads of a Job, as upstream's `pkg/controller/job/util`: whether
//! it has finished (the Complete or Failed condition True). The Job, CronJob and
//! ttl-after-finished controllers share it.

use k8s_openapi::api::batch::v1::Job;

/// The condition type of a Job that succeeded.
pub const COMPLETE: &str = "Complete";
/// The condition type of a Job that failed.
pub const FAILED: &str = "Failed";

/// Which terminal condition the Job has, if any (`IsJobFinished` with the type).
pub fn finished_condition(job: &Job) -> Option<&'static str> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find_map(|c| match (c.type_.as_str(), c.status.as_str()) {
            (COMPLETE, "True") => Some(COMPLETE),
            (FAILED, "True") => Some(FAILED),
            _ => None,
        })
}

/// Whether the Job has finished (`IsJobFinished`).
pub fn is_finished(job: &Job) -> bool {
    finished_condition(job).is_some()
}
