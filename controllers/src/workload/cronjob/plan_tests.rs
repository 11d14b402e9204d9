//! Table tests of the CronJob plan, named after the rule IDs (CJ-1..CJ-4) with v1.34's
//! behaviour where it goes beyond them; time is fixed per case (the clock tests move).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::plan::*;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A CronJob created at `created` with `spec` merged over a minimal one.
fn cron_job(created: &str, spec: serde_json::Value, status: serde_json::Value) -> CronJob {
    let mut base = json!({
        "schedule": "* * * * *",
        "timeZone": "UTC",
        "jobTemplate": {"metadata": {"labels": {"app": "pi"}, "annotations": {"a": "b"}},
                        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}],
                                                       "restartPolicy": "Never"}}}},
    });
    for (k, v) in spec.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "pi", "namespace": "ns", "uid": "cj-uid",
                     "creationTimestamp": created},
        "spec": base,
        "status": status,
    }))
    .unwrap()
}

fn job(name: &str, uid: &str, finished: Option<(&str, &str)>, start: Option<&str>) -> Arc<Job> {
    let mut status = json!({});
    if let Some(s) = start {
        status["startTime"] = json!(s);
    }
    if let Some((t, at)) = finished {
        status["conditions"] = json!([{"type": t, "status": "True", "lastTransitionTime": at}]);
        if t == "Complete" {
            status["completionTime"] = json!(at);
        }
    }
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "pi",
                    "uid": "cj-uid", "controller": true}]},
            "status": status,
        }))
        .unwrap(),
    )
}

fn active(names: &[&str]) -> serde_json::Value {
    json!(names
        .iter()
        .map(
            |n| json!({"kind": "Job", "apiVersion": "batch/v1", "namespace": "ns", "name": n,
                        "uid": format!("uid-{n}")})
        )
        .collect::<Vec<_>>())
}

#[test]
fn cj1_job_names_are_the_scheduled_minute_and_carry_the_template() {
    let cj = cron_job(
        "2019-03-04T00:00:00Z",
        json!({"timeZone": "Europe/Berlin"}),
        json!({}),
    );
    let at = ts("2019-03-04T01:30:00Z");
    // v1.34 names by minutes since the epoch (CJ-1's example pi-1551660600 is seconds).
    assert_eq!(job_name(&cj, at), "pi-25861050", "CJ-1 name in minutes");
    let j = job_from_template(&cj, at).unwrap();
    let meta = &j.metadata;
    assert_eq!(meta.name.as_deref(), Some("pi-25861050"));
    assert_eq!(
        meta.labels.as_ref().unwrap()["app"],
        "pi",
        "CJ-1 template labels"
    );
    let ann = meta.annotations.as_ref().unwrap();
    assert_eq!(ann["a"], "b", "CJ-1 template annotations");
    assert_eq!(
        ann[SCHEDULED_TIMESTAMP], "2019-03-04T02:30:00+01:00",
        "CJ-1 scheduled timestamp in the CronJob's zone"
    );
    let owner = &meta.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("CronJob", "cj-uid", Some(true))
    );
    let utc = cron_job("2019-03-04T00:00:00Z", json!({}), json!({}));
    let j = job_from_template(&utc, at).unwrap();
    assert_eq!(
        j.metadata.annotations.unwrap()[SCHEDULED_TIMESTAMP],
        "2019-03-04T01:30:00Z",
        "CJ-1 UTC timestamp is written with Z, as Go's RFC 3339"
    );
}

#[test]
fn cj1_history_limits_delete_the_oldest_finished_jobs() {
    let done = |n: &str, start: &str| job(n, n, Some(("Complete", start)), Some(start));
    let failed = |n: &str, start: &str| job(n, n, Some(("Failed", start)), Some(start));
    let jobs = vec![
        done("c1", "2026-01-01T00:01:00Z"),
        done("c2", "2026-01-01T00:02:00Z"),
        done("c3", "2026-01-01T00:03:00Z"),
        done("c4", "2026-01-01T00:04:00Z"),
        done("c5", "2026-01-01T00:05:00Z"),
        failed("f1", "2026-01-01T00:01:30Z"),
        failed("f2", "2026-01-01T00:02:30Z"),
        job("running", "running", None, Some("2026-01-01T00:00:00Z")),
    ];
    type Case = (&'static str, serde_json::Value, &'static [&'static str]);
    let cases: &[Case] = &[
        (
            "CJ-1 defaults 3 and 1: two complete and one failed go, oldest first",
            json!({"successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1}),
            &["c1", "c2", "f1"],
        ),
        (
            "CJ-1 limit 0 removes every finished Job of that kind, running ones stay",
            json!({"successfulJobsHistoryLimit": 0, "failedJobsHistoryLimit": 5}),
            &["c1", "c2", "c3", "c4", "c5"],
        ),
        ("CJ-1 no limits set: nothing is removed", json!({}), &[]),
    ];
    for (name, spec, want) in cases {
        let cj = cron_job("2026-01-01T00:00:00Z", spec.clone(), json!({}));
        let got: Vec<String> = jobs_to_clean(&cj, &jobs)
            .iter()
            .map(|j| j.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(got, *want, "{name}");
    }
}

#[test]
fn cj3_active_list_follows_the_jobs() {
    let cj = cron_job(
        "2026-01-01T00:00:00Z",
        json!({}),
        json!({"active": active(&["done", "running", "gone"]),
               "lastSuccessfulTime": "2026-01-01T00:00:00Z"}),
    );
    let jobs = vec![
        job(
            "done",
            "uid-done",
            Some(("Complete", "2026-01-01T00:05:00Z")),
            None,
        ),
        job("running", "uid-running", None, None),
        job("stray", "uid-stray", None, None),
        job(
            "old",
            "uid-old",
            Some(("Complete", "2026-01-01T00:03:00Z")),
            None,
        ),
    ];
    let mut status = cj.status.clone().unwrap();
    let r = reconcile_active(&mut status, &jobs);
    let names = |refs: &[ObjectReference]| -> Vec<String> {
        refs.iter().map(|r| r.name.clone().unwrap()).collect()
    };
    assert!(r.changed, "CJ-3 step 1 changes the status");
    assert_eq!(
        r.saw_completed,
        vec![("done".to_string(), "Complete")],
        "CJ-3 step 1: a finished listed Job leaves the active list"
    );
    assert_eq!(
        names(status.active.as_ref().unwrap()),
        ["running", "gone"],
        "CJ-3 step 1: running and unknown Jobs stay until checked"
    );
    assert_eq!(
        names(&r.maybe_missing),
        ["gone"],
        "CJ-3 step 2: a listed Job not in the cache is checked with the API server"
    );
    assert_eq!(
        r.not_listed
            .iter()
            .map(|j| j.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["stray"],
        "CJ-3: an unfinished Job missing from the list is reported (UnexpectedJob)"
    );
    assert_eq!(
        status.last_successful_time.unwrap().0,
        ts("2026-01-01T00:05:00Z"),
        "lastSuccessfulTime is the latest completion"
    );
}

#[test]
fn cj3_decisions_at_a_fixed_time() {
    let now = ts("2026-11-26T10:00:30Z");
    type Case = (
        &'static str,
        &'static str,
        serde_json::Value,
        serde_json::Value,
        Decision,
    );
    let start = |at: &str, replace: &[&str], requeue_ms: u64| Decision::Start {
        scheduled: ts(at),
        replace: serde_json::from_value(active(replace)).unwrap(),
        too_many_missed: false,
        requeue: Duration::from_millis(requeue_ms),
    };
    let cases: Vec<Case> = vec![
        (
            "CJ-3 step 4: nothing due yet requeues for the next time (+100 ms)",
            "2026-11-26T10:00:10Z",
            json!({}),
            json!({}),
            Decision::NotYet(Duration::from_millis(30_100)),
        ),
        (
            "CJ-3 steps 5 and 8: the most recent of several missed times only",
            "2026-11-26T09:55:10Z",
            json!({}),
            json!({}),
            start("2026-11-26T10:00:00Z", &[], 30_100),
        ),
        (
            "CJ-3 step 6: Forbid with an active Job skips the run",
            "2026-11-26T09:55:10Z",
            json!({"concurrencyPolicy": "Forbid"}),
            json!({"active": active(&["pi-1"]), "lastScheduleTime": "2026-11-26T09:59:00Z"}),
            Decision::Forbidden(Duration::from_millis(30_100)),
        ),
        (
            "CJ-3 step 6: Forbid without an active Job starts",
            "2026-11-26T09:55:10Z",
            json!({"concurrencyPolicy": "Forbid"}),
            json!({"lastScheduleTime": "2026-11-26T09:59:00Z"}),
            start("2026-11-26T10:00:00Z", &[], 30_100),
        ),
        (
            "CJ-3 step 7: Replace deletes every active Job first",
            "2026-11-26T09:55:10Z",
            json!({"concurrencyPolicy": "Replace"}),
            json!({"active": active(&["pi-1", "pi-2"]), "lastScheduleTime": "2026-11-26T09:59:00Z"}),
            start("2026-11-26T10:00:00Z", &["pi-1", "pi-2"], 30_100),
        ),
        (
            "CJ-3 Allow (the default) runs beside active Jobs",
            "2026-11-26T09:55:10Z",
            json!({"concurrencyPolicy": "Allow"}),
            json!({"active": active(&["pi-1"]), "lastScheduleTime": "2026-11-26T09:59:00Z"}),
            start("2026-11-26T10:00:00Z", &[], 30_100),
        ),
        (
            "suspend: nothing starts",
            "2026-11-26T09:55:10Z",
            json!({"suspend": true}),
            json!({}),
            Decision::Suspended,
        ),
        (
            "startingDeadlineSeconds: only times after now - deadline count, an older one is skipped",
            "2026-11-26T09:55:10Z",
            json!({"schedule": "0 * * * *", "startingDeadlineSeconds": 10}),
            json!({"lastScheduleTime": "2026-11-26T09:00:00Z"}),
            Decision::NotYet(Duration::from_millis(3_570_100)),
        ),
        (
            "startingDeadlineSeconds: within the deadline it starts",
            "2026-11-26T09:55:10Z",
            json!({"schedule": "0 * * * *", "startingDeadlineSeconds": 60}),
            json!({"lastScheduleTime": "2026-11-26T09:00:00Z"}),
            start("2026-11-26T10:00:00Z", &[], 3_570_100),
        ),
        (
            "a time already in lastScheduleTime is not run twice",
            "2026-11-26T09:55:10Z",
            json!({}),
            json!({"lastScheduleTime": "2026-11-26T10:00:00Z"}),
            Decision::NotYet(Duration::from_millis(30_100)),
        ),
        (
            "a Job of that name in the active list is not created twice",
            "2026-11-26T09:55:10Z",
            json!({}),
            json!({"active": active(&["pi-29928120"]), "lastScheduleTime": "2026-11-26T09:59:00Z"}),
            Decision::AlreadyProcessed(Duration::from_millis(30_100)),
        ),
        (
            "an unknown spec.timeZone starts nothing (UnknownTimeZone)",
            "2026-11-26T09:55:10Z",
            json!({"timeZone": "Mars/Olympus"}),
            json!({}),
            Decision::UnknownTimeZone(String::new()),
        ),
        (
            "an unparseable schedule starts nothing (UnparseableSchedule)",
            "2026-11-26T09:55:10Z",
            json!({"schedule": "61 * * * *"}),
            json!({}),
            Decision::Unparseable(String::new()),
        ),
    ];
    for (name, created, spec, status, want) in cases {
        let cj = cron_job(created, spec, status);
        let got = decide(&cj, now);
        match (&got, &want) {
            (Decision::UnknownTimeZone(_), Decision::UnknownTimeZone(_))
            | (Decision::Unparseable(_), Decision::Unparseable(_)) => {}
            _ => assert_eq!(got, want, "{name}"),
        }
    }
}

#[test]
fn cj3_too_many_missed_start_times_are_flagged_and_the_latest_still_runs() {
    let now = ts("2026-11-26T10:00:30Z");
    type Case = (&'static str, &'static str, Option<i64>, bool);
    let cases: &[Case] = &[
        (
            "more than 100 missed: TooManyMissedTimes, the latest time runs",
            "2026-11-26T08:00:10Z",
            None,
            true,
        ),
        (
            "exactly 100 missed: no warning",
            "2026-11-26T08:20:10Z",
            None,
            false,
        ),
        (
            "startingDeadlineSeconds bounds the count: no warning",
            "2026-11-26T08:00:10Z",
            Some(300),
            false,
        ),
    ];
    for (name, created, deadline, want_warning) in cases {
        let spec = match deadline {
            Some(d) => json!({"startingDeadlineSeconds": d}),
            None => json!({}),
        };
        let cj = cron_job(created, spec, json!({}));
        match decide(&cj, now) {
            Decision::Start {
                scheduled,
                too_many_missed,
                ..
            } => {
                assert_eq!(scheduled, ts("2026-11-26T10:00:00Z"), "{name}");
                assert_eq!(too_many_missed, *want_warning, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn cj4_requeue_lands_just_after_the_next_schedule_time() {
    // No polling: each sync re-queues for the next time plus 100 ms.
    let cases: &[(&str, &str, &str, &str, u64)] = &[
        (
            "every minute, half way through",
            "* * * * *",
            "2026-11-26T10:00:30Z",
            "2026-11-26T10:00:00Z",
            30_100,
        ),
        (
            "hourly at :15",
            "15 * * * *",
            "2026-11-26T10:20:00Z",
            "2026-11-26T10:15:00Z",
            3_300_100,
        ),
        (
            "a changed schedule is timed from the last schedule time",
            "*/5 * * * *",
            "2026-11-26T10:01:00Z",
            "2026-11-26T10:00:00Z",
            240_100,
        ),
    ];
    for (name, schedule, now, last, want_ms) in cases {
        let cj = cron_job(
            "2026-01-01T00:00:00Z",
            json!({ "schedule": schedule }),
            json!({ "lastScheduleTime": last }),
        );
        assert_eq!(
            requeue_for_changed_schedule(&cj, ts(now)),
            Some(Duration::from_millis(*want_ms)),
            "CJ-4 {name}"
        );
    }
}

#[test]
fn format_schedule_prefixes_the_time_zone_unless_the_schedule_names_one() {
    let cases: &[(&str, serde_json::Value, &str, bool)] = &[
        (
            "zone prefixed",
            json!({"timeZone": "Asia/Tokyo"}),
            "TZ=Asia/Tokyo * * * * *",
            false,
        ),
        (
            "CRON_TZ in the schedule is used as written (UnsupportedSchedule)",
            json!({"schedule": "CRON_TZ=UTC 0 * * * *", "timeZone": null}),
            "CRON_TZ=UTC 0 * * * *",
            true,
        ),
        (
            "an unknown zone is not prefixed",
            json!({"timeZone": "Mars/Olympus"}),
            "* * * * *",
            false,
        ),
    ];
    for (name, spec, want, warn) in cases {
        let cj = cron_job("2026-01-01T00:00:00Z", spec.clone(), json!({}));
        assert_eq!(format_schedule(&cj), (want.to_string(), *warn), "{name}");
    }
}
