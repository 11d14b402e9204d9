//! The batch scenarios, each in its own namespace, driven the same way on both flavours; each
//! returns what it observed ([`Record`], compared between flavours) and the expectations it saw
//! broken ([`Outcome::problems`]). The test finishes Pods as a kubelet would (see the harness).
//!
//! 1. `parallel`: completions 5, parallelism 2: never more than 2 Pods running, 5 created, Complete.
//! 2. `indexed`: Indexed, completions 3, parallelism 2: each index once, completedIndexes "0-2".
//! 3. `backoff_limit`: backoffLimit 1: the second failure fails the Job (BackoffLimitExceeded);
//!    the replacement after the first failure waits the 10 s pod failure backoff.
//! 4. `pod_failure_policy`: exit code 42 matches a FailJob rule: Failed (PodFailurePolicy) at once.
//! 5. `cron_forbid`: a CronJob (Forbid, one successful Job kept) whose earlier Job still runs
//!    skips the due minute (JobAlreadyActive), starts it once the earlier Job completed, and
//!    deletes the earlier Job when the new one completes (history limit 1).
//! 6. `cron_replace`: the same with Replace: the running earlier Job is deleted and the due
//!    minute's Job started.
//! 7. `suspend`: a Job created suspended runs no Pod (Suspended, JobSuspended); resumed, it runs
//!    and completes (Suspended turns False, JobResumed).
//! 8. `deadline`: activeDeadlineSeconds 2 with Pods that never finish: DeadlineExceeded, the
//!    running Pods deleted (their results counted as failed once gone), then Failed.
//! 9. `ttl`: ttlSecondsAfterFinished 0: the completed Job is deleted (foreground propagation;
//!    nothing runs the garbage collector here, so it stays marked for deletion).
//!
//! The CronJobs wait for no minute boundary: the test stands in for an earlier run, one minute
//! before the most recent minute boundary: it creates that run's Job, lists it active in the
//! CronJob's status with `lastScheduleTime` at that minute, and makes the CronJob its
//! controller. The most recent minute is then due at once, with the earlier Job still running.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use serde_json::json;

use super::harness::{conditions, has_condition, job_of, pod_template, running, Run, State};

/// What a scenario observed, compared between flavours.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Record {
    /// Pods the Job controller created.
    pub pods_created: usize,
    /// The most Pods of the Job seen running at once.
    pub max_running: usize,
    /// Completion indexes of the created Pods, sorted (Indexed).
    pub indexes: Vec<i32>,
    /// The Job's True conditions at the end, in order: (type, reason).
    pub conditions: Vec<(String, String)>,
    /// `status.succeeded`, `status.failed` at the end.
    pub counts: (i32, i32),
    /// `status.completedIndexes` at the end.
    pub completed_indexes: String,
    /// CronJobs: Jobs created, by scheduled minute relative to the first ("+0", "+1").
    pub jobs_created: Vec<String>,
    /// CronJobs: Jobs deleted, likewise.
    pub jobs_deleted: Vec<String>,
    /// CronJobs: the CronJob's event reasons (sorted).
    pub events: Vec<String>,
    /// Whether the replacement after a failure waited the backoff (at least 9 s).
    pub backoff_waited: Option<bool>,
    /// Pods created so far when the test finished each Pod (the creations per step).
    pub created_per_step: Vec<usize>,
    /// TTL: whether the finished Job was deleted with foreground propagation.
    pub foreground_deletion: Option<bool>,
}

/// A scenario's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub record: Record,
    pub problems: Vec<String>,
}

fn job_manifest(name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut s = json!({"template": pod_template()});
    for (k, v) in spec.as_object().expect("an object") {
        s[k] = v.clone();
    }
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": s})
}

/// Finishes the Job's Pods one at a time, oldest first, with `exit_code(n)` for the n-th, until
/// `done` holds; before each, waits until `want_running(n)` Pods run (the Job controller has
/// caught up), so the steps are the same whatever the timing. Returns when each Pod was
/// finished.
async fn drive(
    run: &Run,
    job: &str,
    want_running: impl Fn(usize) -> usize,
    exit_code: impl Fn(usize) -> i32,
    done: impl Fn(&State) -> bool,
) -> anyhow::Result<Vec<(String, Instant, usize)>> {
    let mut finished: Vec<(String, Instant, usize)> = Vec::new();
    loop {
        let next = run
            .wait_for(
                &format!("a running Pod of Job {job}, or the Job done"),
                |s| {
                    if done(s) {
                        return Some(None);
                    }
                    let mut pods: Vec<_> = s
                        .pods_of(job)
                        .into_iter()
                        .filter(|p| running(p) && p.metadata.deletion_timestamp.is_none())
                        .filter(|p| {
                            !finished
                                .iter()
                                .any(|(n, _, _)| Some(n) == p.metadata.name.as_ref())
                        })
                        .collect();
                    if pods.len() < want_running(finished.len()) {
                        return None;
                    }
                    pods.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
                    pods.first().map(|p| p.metadata.name.clone())
                },
            )
            .await?;
        let Some(pod) = next else { return Ok(finished) };
        let created = run
            .state()
            .pods_seen
            .iter()
            .filter(|(_, j)| j == job)
            .count();
        run.finish(&pod, exit_code(finished.len())).await?;
        finished.push((pod, Instant::now(), created));
    }
}

fn job_record(s: &State, job: &str) -> Record {
    let j = s.jobs.get(job);
    let st = j.and_then(|j| j.status.clone()).unwrap_or_default();
    let mut indexes: Vec<i32> = s
        .pods_of(job)
        .iter()
        .filter_map(|p| {
            p.metadata
                .annotations
                .as_ref()?
                .get("batch.kubernetes.io/job-completion-index")?
                .parse()
                .ok()
        })
        .collect();
    indexes.sort();
    Record {
        pods_created: s.pods_seen.iter().filter(|(_, j)| j == job).count(),
        max_running: s.max_running.get(job).copied().unwrap_or(0),
        indexes,
        conditions: j.map(conditions).unwrap_or_default(),
        counts: (st.succeeded.unwrap_or(0), st.failed.unwrap_or(0)),
        completed_indexes: st.completed_indexes.unwrap_or_default(),
        ..Default::default()
    }
}

fn expect<T: PartialEq + std::fmt::Debug>(problems: &mut Vec<String>, what: &str, got: T, want: T) {
    if got != want {
        problems.push(format!("{what}: got {got:?}, want {want:?}"));
    }
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Waits until no Pod of `job` carries the tracking finalizer: every result is counted.
async fn finalizers_gone(run: &Run, job: &str) -> anyhow::Result<()> {
    run.wait_for(
        &format!("the tracking finalizers of Job {job}'s Pods to go"),
        |s| {
            s.pods_of(job)
                .iter()
                .all(|p| {
                    !p.finalizers()
                        .iter()
                        .any(|f| f == "batch.kubernetes.io/job-tracking")
                })
                .then_some(())
        },
    )
    .await
}

/// Scenario 1.
pub async fn parallel(run: &Run) -> anyhow::Result<Outcome> {
    run.create::<Job>(job_manifest(
        "work",
        json!({"completions": 5, "parallelism": 2}),
    ))
    .await?;
    let steps = drive(
        run,
        "work",
        |n| 2.min(5usize.saturating_sub(n)),
        |_| 0,
        |s| {
            s.jobs
                .get("work")
                .is_some_and(|j| has_condition(j, "Complete"))
        },
    )
    .await?;
    finalizers_gone(run, "work").await?;
    let mut record = job_record(&run.state(), "work");
    record.created_per_step = steps.iter().map(|f| f.2).collect();
    let mut problems = Vec::new();
    expect(
        &mut problems,
        "most Pods running at once",
        record.max_running,
        2,
    );
    expect(&mut problems, "Pods created", record.pods_created, 5);
    expect(&mut problems, "succeeded, failed", record.counts, (5, 0));
    expect(
        &mut problems,
        "conditions",
        record.conditions.clone(),
        pairs(&[
            ("SuccessCriteriaMet", "CompletionsReached"),
            ("Complete", "CompletionsReached"),
        ]),
    );
    Ok(Outcome { record, problems })
}

/// Scenario 2.
pub async fn indexed(run: &Run) -> anyhow::Result<Outcome> {
    run.create::<Job>(job_manifest(
        "indexed",
        json!({"completions": 3, "parallelism": 2, "completionMode": "Indexed"}),
    ))
    .await?;
    let steps = drive(
        run,
        "indexed",
        |n| 2.min(3usize.saturating_sub(n)),
        |_| 0,
        |s| {
            s.jobs
                .get("indexed")
                .is_some_and(|j| has_condition(j, "Complete"))
        },
    )
    .await?;
    finalizers_gone(run, "indexed").await?;
    let s = run.state();
    let mut record = job_record(&s, "indexed");
    record.created_per_step = steps.iter().map(|f| f.2).collect();
    let mut problems = Vec::new();
    expect(
        &mut problems,
        "indexes of the created Pods",
        record.indexes.clone(),
        vec![0, 1, 2],
    );
    expect(
        &mut problems,
        "completedIndexes",
        record.completed_indexes.as_str(),
        "0-2",
    );
    expect(
        &mut problems,
        "most Pods running at once",
        record.max_running,
        2,
    );
    for p in s.pods_of("indexed") {
        let ix = p
            .annotations()
            .get("batch.kubernetes.io/job-completion-index")
            .cloned();
        let host = p.spec.as_ref().and_then(|s| s.hostname.clone());
        expect(
            &mut problems,
            "hostname <job>-<index>",
            host,
            ix.map(|i| format!("indexed-{i}")),
        );
    }
    Ok(Outcome { record, problems })
}

/// Scenario 3.
pub async fn backoff_limit(run: &Run) -> anyhow::Result<Outcome> {
    run.create::<Job>(job_manifest(
        "failing",
        json!({"completions": 3, "parallelism": 1, "backoffLimit": 1}),
    ))
    .await?;
    let finished = drive(
        run,
        "failing",
        |_| 1,
        |_| 1,
        |s| {
            s.jobs
                .get("failing")
                .is_some_and(|j| has_condition(j, "Failed"))
        },
    )
    .await?;
    finalizers_gone(run, "failing").await?;
    let mut record = job_record(&run.state(), "failing");
    record.created_per_step = finished.iter().map(|f| f.2).collect();
    // The second Pod is created only after the 10 s pod failure backoff, counted from the first
    // Pod's container finish time (both times from the API server, whole seconds).
    let st = run.state();
    let finish_time = |pod: &str| {
        st.pods.get(pod).and_then(|p| {
            p.status.as_ref()?.container_statuses.as_ref()?[0]
                .state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
                .map(|t| t.0.as_second())
        })
    };
    let created = |pod: &str| {
        st.pods.get(pod).and_then(|p| {
            p.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        })
    };
    record.backoff_waited = match finished.as_slice() {
        [(first, ..), (second, ..), ..] => match (finish_time(first), created(second)) {
            (Some(f), Some(c)) => {
                if std::env::var_os("KPR_BATCH_SHOW").is_some() {
                    eprintln!(
                        "{:?}: replacement created {} s after the failure",
                        run.cluster.flavour,
                        c - f
                    );
                }
                Some(c - f >= 9)
            }
            _ => Some(false),
        },
        _ => Some(false),
    };
    let mut problems = Vec::new();
    expect(&mut problems, "Pods created", record.pods_created, 2);
    expect(&mut problems, "succeeded, failed", record.counts, (0, 2));
    expect(
        &mut problems,
        "conditions",
        record.conditions.clone(),
        pairs(&[
            ("FailureTarget", "BackoffLimitExceeded"),
            ("Failed", "BackoffLimitExceeded"),
        ]),
    );
    expect(
        &mut problems,
        "replacement waited the backoff",
        record.backoff_waited,
        Some(true),
    );
    Ok(Outcome { record, problems })
}

/// Scenario 4.
pub async fn pod_failure_policy(run: &Run) -> anyhow::Result<Outcome> {
    run.create::<Job>(job_manifest(
        "policy",
        json!({"completions": 2, "parallelism": 1, "backoffLimit": 6,
               "podFailurePolicy": {"rules": [
                   {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
                   {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}),
    ))
    .await?;
    let steps = drive(
        run,
        "policy",
        |_| 1,
        |_| 42,
        |s| {
            s.jobs
                .get("policy")
                .is_some_and(|j| has_condition(j, "Failed"))
        },
    )
    .await?;
    finalizers_gone(run, "policy").await?;
    let mut record = job_record(&run.state(), "policy");
    record.created_per_step = steps.iter().map(|f| f.2).collect();
    let mut problems = Vec::new();
    expect(&mut problems, "Pods created", record.pods_created, 1);
    expect(&mut problems, "succeeded, failed", record.counts, (0, 1));
    expect(
        &mut problems,
        "conditions",
        record.conditions.clone(),
        pairs(&[
            ("FailureTarget", "PodFailurePolicy"),
            ("Failed", "PodFailurePolicy"),
        ]),
    );
    Ok(Outcome { record, problems })
}

fn minute_floor(t: Timestamp) -> i64 {
    t.as_second().div_euclid(60) * 60
}

/// The CronJob's Jobs relative to minute `m0`: "+0", "+1", ...
fn relative(names: &[String], m0: i64) -> Vec<String> {
    names
        .iter()
        .filter_map(|n| n.strip_prefix("tick-")?.parse::<i64>().ok())
        .map(|m| format!("+{}", m - m0 / 60))
        .collect()
}

/// Scenarios 5 and 6.
pub async fn cron(run: &Run, policy: &str) -> anyhow::Result<Outcome> {
    // Stay clear of a minute boundary while setting up (a setup wait, not an assertion).
    let into_minute = Timestamp::now().as_second().rem_euclid(60);
    if into_minute > 45 {
        tokio::time::sleep(Duration::from_secs((61 - into_minute) as u64)).await;
    }
    // m0: the minute of an earlier run whose Job is still running; m0 + 60 (the most recent
    // minute) is due now.
    let m0 = minute_floor(Timestamp::now()) - 60;
    let job_name = |m: i64| format!("tick-{}", m / 60);
    let job_spec = json!({"completions": 1, "parallelism": 1, "backoffLimit": 0,
                          "template": pod_template()});
    let cj: CronJob = run
        .create(json!({
            "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick"},
            "spec": {"schedule": "* * * * *", "concurrencyPolicy": policy, "suspend": true,
                     "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 1,
                     "jobTemplate": {"spec": job_spec}}
        }))
        .await?;
    let j1 = job_name(m0);
    let j2 = job_name(m0 + 60);
    // The earlier run, while the CronJob is suspended: its Job, listed active in the CronJob's
    // status with lastScheduleTime at its minute, then given the CronJob as controller (in that
    // order, so no sync sees a Job of the CronJob that the status does not list).
    let earlier = Timestamp::from_second(m0)?.to_string();
    let first: Job = run
        .create(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": j1,
                         "annotations": {"batch.kubernetes.io/cronjob-scheduled-timestamp": earlier}},
            "spec": job_spec,
        }))
        .await?;
    run.patch_cron_job_status(
        "tick",
        json!({"lastScheduleTime": earlier,
               "active": [{"apiVersion": "batch/v1", "kind": "Job", "namespace": run.ns,
                           "name": j1, "uid": first.metadata.uid}]}),
    )
    .await?;
    let jobs: kube::Api<Job> = kube::Api::namespaced(run.client.clone(), &run.ns);
    let owner = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "batch/v1", "kind": "CronJob", "name": "tick", "uid": cj.metadata.uid,
        "controller": true, "blockOwnerDeletion": true}]}});
    match jobs
        .patch(
            &j1,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&owner),
        )
        .await
    {
        Ok(_) => {}
        // Replace may have deleted it already.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e).context("making the CronJob the controller of the first Job"),
    }
    // Resumed only now, so the controller acts once, on the complete setup (a sync racing
    // the test's status write would conflict and retry, recording other events).
    let cron_jobs: kube::Api<CronJob> = kube::Api::namespaced(run.client.clone(), &run.ns);
    cron_jobs
        .patch(
            "tick",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .context("resuming the CronJob")?;
    let first_pod = |job: String| {
        move |s: &State| {
            s.pods
                .values()
                .find(|p| job_of(p) == job && running(p))
                .and_then(|p| p.metadata.name.clone())
        }
    };
    let mut problems = Vec::new();
    match policy {
        "Forbid" => {
            let p1 = run
                .wait_for(&format!("Job {j1}'s Pod"), first_pod(j1.clone()))
                .await?;
            run.wait_for("the due minute skipped (JobAlreadyActive)", |s| {
                s.events
                    .get("tick")
                    .is_some_and(|r| r.iter().any(|r| r == "JobAlreadyActive"))
                    .then_some(())
            })
            .await?;
            if run.state().jobs.contains_key(&j2) {
                problems.push(format!("Job {j2} started while {j1} ran under Forbid"));
            }
            run.finish(&p1, 0).await?;
            let p2 = run
                .wait_for(
                    &format!("Job {j2} once {j1} completed"),
                    first_pod(j2.clone()),
                )
                .await?;
            run.finish(&p2, 0).await?;
            run.wait_for(
                &format!("{j2} complete and {j1} removed (history limit 1)"),
                |s| {
                    (s.jobs
                        .get(&j2)
                        .is_some_and(|j| has_condition(j, "Complete"))
                        && !s.jobs.contains_key(&j1))
                    .then_some(())
                },
            )
            .await?;
        }
        "Replace" => {
            let p2 = run
                .wait_for(&format!("{j1} replaced by {j2}, the due minute"), |s| {
                    (!s.jobs.contains_key(&j1))
                        .then(|| first_pod(j2.clone())(s))
                        .flatten()
                })
                .await?;
            run.finish(&p2, 0).await?;
            run.wait_for(&format!("{j2} complete"), |s| {
                s.jobs
                    .get(&j2)
                    .is_some_and(|j| has_condition(j, "Complete"))
                    .then_some(())
            })
            .await?;
        }
        other => bail!("unknown policy {other}"),
    }
    // Events are written in the background: wait for those the run must have produced before
    // taking the record (any other reason recorded by then is a difference).
    let want_events: &[&str] = match policy {
        "Forbid" => &[
            "JobAlreadyActive",
            "SawCompletedJob",
            "SuccessfulCreate",
            "SuccessfulDelete",
        ],
        _ => &["SawCompletedJob", "SuccessfulCreate", "SuccessfulDelete"],
    };
    run.wait_for(&format!("the CronJob's events {want_events:?}"), |s| {
        let got = s.events.get("tick")?;
        want_events
            .iter()
            .all(|w| got.iter().any(|g| g == w))
            .then_some(())
    })
    .await?;
    // The status shows the last run: lastScheduleTime at the second minute.
    let api: kube::Api<CronJob> = kube::Api::namespaced(run.client.clone(), &run.ns);
    let cj = api.get("tick").await.context("reading the CronJob")?;
    let st = cj.status.unwrap_or_default();
    let last = st.last_schedule_time.map(|t| t.0.as_second());
    expect(&mut problems, "lastScheduleTime", last, Some(m0 + 60));
    let s = run.state();
    let mut events: Vec<String> = s.events.get("tick").cloned().unwrap_or_default();
    events.sort();
    let record = Record {
        jobs_created: relative(&s.jobs_seen, m0),
        jobs_deleted: relative(&s.jobs_deleted, m0),
        events,
        ..Default::default()
    };
    let want_deleted = vec!["+0".to_string()];
    expect(
        &mut problems,
        "Jobs created",
        record.jobs_created.clone(),
        vec!["+0".into(), "+1".into()],
    );
    expect(
        &mut problems,
        "Jobs deleted",
        record.jobs_deleted.clone(),
        want_deleted,
    );
    Ok(Outcome { record, problems })
}

/// Scenario 7.
pub async fn suspend(run: &Run) -> anyhow::Result<Outcome> {
    run.create::<Job>(job_manifest(
        "paused",
        json!({"completions": 2, "parallelism": 2, "suspend": true}),
    ))
    .await?;
    run.wait_for("the Suspended condition", |s| {
        s.jobs
            .get("paused")
            .is_some_and(|j| has_condition(j, "Suspended"))
            .then_some(())
    })
    .await?;
    let mut problems = Vec::new();
    expect(
        &mut problems,
        "Pods of a suspended Job",
        run.state().pods_seen.len(),
        0,
    );
    let api: kube::Api<Job> = kube::Api::namespaced(run.client.clone(), &run.ns);
    api.patch(
        "paused",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"suspend": false}})),
    )
    .await
    .context("resuming Job paused")?;
    let steps = drive(
        run,
        "paused",
        |n| 2.min(2usize.saturating_sub(n)),
        |_| 0,
        |s| {
            s.jobs
                .get("paused")
                .is_some_and(|j| has_condition(j, "Complete"))
        },
    )
    .await?;
    finalizers_gone(run, "paused").await?;
    let mut record = job_record(&run.state(), "paused");
    record.created_per_step = steps.iter().map(|f| f.2).collect();
    expect(&mut problems, "Pods created", record.pods_created, 2);
    expect(
        &mut problems,
        "conditions",
        record.conditions.clone(),
        pairs(&[
            ("Suspended=False", "JobResumed"),
            ("SuccessCriteriaMet", "CompletionsReached"),
            ("Complete", "CompletionsReached"),
        ]),
    );
    Ok(Outcome { record, problems })
}

/// Scenario 8.
pub async fn deadline(run: &Run) -> anyhow::Result<Outcome> {
    run.create::<Job>(job_manifest(
        "late",
        json!({"completions": 2, "parallelism": 2, "activeDeadlineSeconds": 2}),
    ))
    .await?;
    run.wait_for("the Job to fail on its deadline", |s| {
        s.jobs
            .get("late")
            .is_some_and(|j| has_condition(j, "Failed"))
            .then_some(())
    })
    .await?;
    finalizers_gone(run, "late").await?;
    let record = job_record(&run.state(), "late");
    let mut problems = Vec::new();
    expect(&mut problems, "Pods created", record.pods_created, 2);
    expect(&mut problems, "succeeded, failed", record.counts, (0, 2));
    expect(
        &mut problems,
        "conditions",
        record.conditions.clone(),
        pairs(&[
            ("FailureTarget", "DeadlineExceeded"),
            ("Failed", "DeadlineExceeded"),
        ]),
    );
    Ok(Outcome { record, problems })
}

/// Scenario 9.
pub async fn ttl(run: &Run) -> anyhow::Result<Outcome> {
    run.create::<Job>(job_manifest(
        "brief",
        json!({"completions": 1, "parallelism": 1, "ttlSecondsAfterFinished": 0}),
    ))
    .await?;
    let steps = drive(
        run,
        "brief",
        |_| 1,
        |_| 0,
        |s| {
            s.jobs
                .get("brief")
                .is_some_and(|j| has_condition(j, "Complete"))
        },
    )
    .await?;
    let _ = steps;
    let mut record = run
        .wait_for("the finished Job to be deleted", |s| {
            let deleting = !s.jobs.contains_key("brief")
                || s.jobs["brief"].metadata.deletion_timestamp.is_some();
            deleting.then(|| job_record(s, "brief"))
        })
        .await?;
    let s = run.state();
    let foreground = s
        .jobs
        .get("brief")
        .map(|j| j.finalizers().iter().any(|f| f == "foregroundDeletion"));
    record.foreground_deletion = foreground;
    let mut problems = Vec::new();
    expect(
        &mut problems,
        "deleted with foreground propagation",
        foreground,
        Some(true),
    );
    Ok(Outcome { record, problems })
}
