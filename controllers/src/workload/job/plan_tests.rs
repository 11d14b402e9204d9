//! Table tests of the Job plan, named after the rule IDs (JOB-1..JOB-5) and, beyond them,
//! v1.34's rules (backoff, podFailurePolicy, finalizer tracking, condition order). Time is fixed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::backoff::{self, Record};
use super::failure_policy::{match_policy, Action};
use super::indexed::{self, Intervals};
use super::plan::*;
use crate::runtime::cached_pod::CachedPod;

const NOW: &str = "2026-11-26T10:00:00Z";

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn now() -> Timestamp {
    ts(NOW)
}

/// A Job with `spec` merged over a minimal one (backoffLimit 6, parallelism 1 as defaulted).
fn job(spec: serde_json::Value, status: serde_json::Value) -> Job {
    let mut base = json!({
        "parallelism": 1, "backoffLimit": 6,
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "job-uid"}},
        "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "job-uid"}},
                     "spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}},
    });
    for (k, v) in spec.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "pi", "namespace": "ns", "uid": "job-uid", "generation": 1},
        "spec": base, "status": status,
    }))
    .unwrap()
}

#[derive(Clone, Copy)]
struct P {
    name: &'static str,
    phase: &'static str,
    finalizer: bool,
    index: Option<i32>,
    exit_code: Option<i32>,
    deleting: bool,
    finished_at: &'static str,
}

const RUNNING: P = P {
    name: "",
    phase: "Running",
    finalizer: true,
    index: None,
    exit_code: None,
    deleting: false,
    finished_at: "2026-11-26T09:59:50Z",
};

fn p(name: &'static str, phase: &'static str) -> P {
    P {
        name,
        phase,
        exit_code: match phase {
            "Failed" => Some(1),
            "Succeeded" => Some(0),
            _ => None,
        },
        ..RUNNING
    }
}

fn pod(p: P) -> Arc<CachedPod> {
    let mut meta = json!({"name": p.name, "namespace": "ns", "uid": format!("uid-{}", p.name),
        "creationTimestamp": "2026-11-26T09:00:00Z",
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pi",
                             "uid": "job-uid", "controller": true}]});
    if p.finalizer {
        meta["finalizers"] = json!([TRACKING_FINALIZER]);
    }
    if let Some(ix) = p.index {
        meta["annotations"] = json!({ indexed::COMPLETION_INDEX: ix.to_string() });
    }
    if p.deleting {
        meta["deletionTimestamp"] = json!("2026-11-26T09:59:00Z");
    }
    let mut status = json!({"phase": p.phase});
    if let Some(code) = p.exit_code {
        status["containerStatuses"] = json!([{"name": "c", "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": code,
                "finishedAt": p.finished_at}}}]);
    }
    Arc::new(serde_json::from_value(json!({"metadata": meta, "status": status})).unwrap())
}

fn names(pods: &[Arc<CachedPod>]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

fn eval(job: &Job, pods: Vec<Arc<CachedPod>>) -> Ctx {
    evaluate(job, pods, HashSet::new(), &Record::default(), now())
}

fn finished_reason(ctx: &Ctx) -> Option<(String, String)> {
    ctx.finished
        .as_ref()
        .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
}

#[test]
fn job4_manage_creates_up_to_parallelism_and_remaining_completions() {
    type Case = (
        &'static str,
        serde_json::Value,
        serde_json::Value,
        Vec<P>,
        Manage,
    );
    let create = |n| Manage::Create {
        count: n,
        indexes: vec![],
    };
    let cases: Vec<Case> = vec![
        (
            "JOB-4 completions 5, parallelism 2, nothing yet: create 2",
            json!({"completions": 5, "parallelism": 2}),
            json!({}),
            vec![],
            create(2),
        ),
        (
            "JOB-4 one running: create 1 more",
            json!({"completions": 5, "parallelism": 2}),
            json!({}),
            vec![p("a", "Running")],
            create(1),
        ),
        (
            "JOB-4 four succeeded (counted), none running: only 1 completion left",
            json!({"completions": 5, "parallelism": 2}),
            json!({"succeeded": 4}),
            vec![],
            create(1),
        ),
        (
            "JOB-4 newly succeeded Pods (finalizer still on) count too",
            json!({"completions": 5, "parallelism": 2}),
            json!({"succeeded": 3}),
            vec![p("s", "Succeeded")],
            create(1),
        ),
        (
            "JOB-4 without completions, nothing succeeded: parallelism",
            json!({"parallelism": 3}),
            json!({}),
            vec![p("a", "Running")],
            create(2),
        ),
        (
            "JOB-4 without completions, one succeeded: keep what runs, create nothing",
            json!({"parallelism": 3}),
            json!({"succeeded": 1}),
            vec![p("a", "Running")],
            Manage::Nothing,
        ),
        (
            "JOB-4 more active than parallelism: delete the surplus",
            json!({"completions": 5, "parallelism": 1}),
            json!({}),
            vec![p("a", "Running"), p("b", "Pending")],
            Manage::Delete(vec![pod(p("b", "Pending"))]),
        ),
        (
            "suspend deletes every active Pod",
            json!({"completions": 5, "parallelism": 2, "suspend": true}),
            json!({}),
            vec![p("a", "Running"), p("b", "Running")],
            Manage::Delete(vec![pod(p("a", "Running")), pod(p("b", "Running"))]),
        ),
        (
            "a failure 5 s ago: the replacement waits out the 10 s backoff",
            json!({"completions": 5, "parallelism": 1}),
            json!({}),
            vec![P {
                finished_at: "2026-11-26T09:59:55Z",
                ..p("f", "Failed")
            }],
            Manage::Backoff(Duration::from_secs(5)),
        ),
        (
            "a failure 11 s ago: replaced now",
            json!({"completions": 5, "parallelism": 1}),
            json!({}),
            vec![P {
                finished_at: "2026-11-26T09:59:49Z",
                ..p("f", "Failed")
            }],
            create(1),
        ),
        (
            "podReplacementPolicy Failed: a terminating Pod is not replaced yet",
            json!({"completions": 5, "parallelism": 1, "podReplacementPolicy": "Failed"}),
            json!({}),
            vec![P {
                deleting: true,
                ..p("t", "Running")
            }],
            Manage::Nothing,
        ),
        (
            "podReplacementPolicy TerminatingOrFailed: a terminating Pod is replaced at once",
            json!({"completions": 5, "parallelism": 1, "backoffLimit": 6,
                   "podReplacementPolicy": "TerminatingOrFailed"}),
            json!({"failed": 0}),
            vec![P {
                deleting: true,
                finished_at: "2026-11-26T09:00:00Z",
                ..p("t", "Running")
            }],
            create(1),
        ),
    ];
    for (name, spec, status, pods, want) in cases {
        let j = job(spec, status);
        let ctx = eval(&j, pods.into_iter().map(pod).collect());
        let got = manage(&ctx, now());
        match (&got, &want) {
            (Manage::Delete(g), Manage::Delete(w)) => assert_eq!(names(g), names(w), "{name}"),
            _ => assert_eq!(got, want, "{name}"),
        }
    }
}

#[test]
fn job3_completion_with_and_without_completions() {
    type Case = (
        &'static str,
        serde_json::Value,
        serde_json::Value,
        i32,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            "JOB-3 completions reached, nothing active: complete",
            json!({"completions": 2}),
            json!({"succeeded": 2}),
            0,
            true,
        ),
        (
            "JOB-3 completions reached but a Pod still runs: not yet",
            json!({"completions": 2}),
            json!({"succeeded": 2}),
            1,
            false,
        ),
        (
            "JOB-3 one short of completions: not complete",
            json!({"completions": 2}),
            json!({"succeeded": 1}),
            0,
            false,
        ),
        (
            "JOB-3 no completions: any success once nothing runs completes",
            json!({}),
            json!({"succeeded": 1}),
            0,
            true,
        ),
        (
            "JOB-3 no completions, success but a Pod runs: not yet",
            json!({}),
            json!({"succeeded": 1}),
            1,
            false,
        ),
        (
            "JOB-3 no completions, nothing succeeded: not complete",
            json!({}),
            json!({}),
            0,
            false,
        ),
    ];
    for (name, spec, status, active, want) in cases {
        let j = job(spec, status);
        let mut ctx = eval(&j, vec![]);
        complete_or_suspend(&mut ctx, true, active, now());
        assert_eq!(
            finished_reason(&ctx),
            want.then(|| (
                cond::SUCCESS_CRITERIA_MET.to_string(),
                cond::COMPLETIONS_REACHED.to_string()
            )),
            "{name}"
        );
    }
}

#[test]
fn job_failure_conditions_backoff_limit_deadline_and_pod_failure_policy() {
    let fail_job_on_42 = json!({"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]});
    type Case = (
        &'static str,
        serde_json::Value,
        serde_json::Value,
        Vec<P>,
        Option<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        (
            "backoffLimit 1: two failures exceed it (FailureTarget first)",
            json!({"completions": 3, "backoffLimit": 1}),
            json!({"failed": 1}),
            vec![p("f", "Failed")],
            Some((cond::FAILURE_TARGET, cond::BACKOFF_LIMIT_EXCEEDED)),
        ),
        (
            "backoffLimit 1: one failure does not",
            json!({"completions": 3, "backoffLimit": 1}),
            json!({}),
            vec![p("f", "Failed")],
            None,
        ),
        (
            "JOB-5 (controller side): active longer than activeDeadlineSeconds",
            json!({"completions": 3, "activeDeadlineSeconds": 60}),
            json!({"startTime": "2026-11-26T09:58:00Z"}),
            vec![p("a", "Running")],
            Some((cond::FAILURE_TARGET, cond::DEADLINE_EXCEEDED)),
        ),
        (
            "a suspended Job's deadline does not run",
            json!({"completions": 3, "activeDeadlineSeconds": 60, "suspend": true}),
            json!({"startTime": "2026-11-26T09:58:00Z"}),
            vec![],
            None,
        ),
        (
            "podFailurePolicy FailJob on exit code 42",
            json!({"completions": 3, "podFailurePolicy": fail_job_on_42}),
            json!({}),
            vec![P {
                exit_code: Some(42),
                ..p("f", "Failed")
            }],
            Some((cond::FAILURE_TARGET, cond::POD_FAILURE_POLICY)),
        ),
        (
            "podFailurePolicy: another exit code is counted, not fatal",
            json!({"completions": 3, "podFailurePolicy": fail_job_on_42}),
            json!({}),
            vec![P {
                exit_code: Some(3),
                ..p("f", "Failed")
            }],
            None,
        ),
        (
            "an existing FailureTarget becomes Failed with its reason",
            json!({"completions": 3}),
            json!({"conditions": [{"type": "FailureTarget", "status": "True",
                "reason": "BackoffLimitExceeded", "message": "m"}]}),
            vec![],
            Some((cond::FAILED, cond::BACKOFF_LIMIT_EXCEEDED)),
        ),
    ];
    for (name, spec, status, pods, want) in cases {
        let j = job(spec, status);
        let ctx = eval(&j, pods.into_iter().map(pod).collect());
        assert_eq!(
            finished_reason(&ctx),
            want.map(|(t, r)| (t.to_string(), r.to_string())),
            "{name}"
        );
    }
    // The deadline not yet passed: look again when it does.
    let j = job(
        json!({"completions": 3, "activeDeadlineSeconds": 60}),
        json!({"startTime": "2026-11-26T09:59:30Z"}),
    );
    assert_eq!(
        eval(&j, vec![]).deadline_requeue,
        Some(Duration::from_secs(30)),
        "JOB-5 re-sync when the deadline passes"
    );
}

#[test]
fn pod_failure_policy_rules_match_in_order() {
    let policy: k8s_openapi::api::batch::v1::PodFailurePolicy = serde_json::from_value(json!({"rules": [
        {"action": "Ignore", "onExitCodes": {"containerName": "other", "operator": "In", "values": [1]}},
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [1, 2]}},
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1, 2]}},
    ]}))
    .unwrap();
    let cases: &[(&str, i32, bool, Option<Action>, bool)] = &[
        (
            "Count rule on 1 (the Ignore rule names another container)",
            1,
            true,
            Some(Action::Count),
            false,
        ),
        (
            "FailJob on an exit code not in the list",
            7,
            true,
            Some(Action::FailJob),
            true,
        ),
        (
            "exit code 0 matches no onExitCodes rule",
            0,
            true,
            None,
            false,
        ),
    ];
    for (name, code, count, action, fail) in cases {
        let v = match_policy(
            Some(&policy),
            &pod(P {
                exit_code: Some(*code),
                ..p("x", "Failed")
            }),
        );
        assert_eq!(
            (v.count, v.action, v.fail_job.is_some()),
            (*count, *action, *fail),
            "{name}"
        );
    }
    let v = match_policy(
        Some(&policy),
        &pod(P {
            exit_code: Some(7),
            ..p("x", "Failed")
        }),
    );
    assert_eq!(
        v.fail_job.as_deref(),
        Some("Container c for pod ns/x failed with exit code 7 matching FailJob rule at index 2"),
        "the FailureTarget message names container, Pod, code, action and rule"
    );
}

#[test]
fn backoff_doubles_from_10s_to_at_most_10_minutes() {
    let last = ts("2026-11-26T10:00:00Z");
    let cases: &[(i32, u64)] = &[
        (0, 0),
        (1, 10),
        (2, 20),
        (3, 40),
        (6, 320),
        (7, 600),
        (20, 600),
    ];
    for (failures, secs) in cases {
        let want = if *failures == 0 { 0 } else { *secs };
        assert_eq!(
            backoff::remaining(*failures, Some(last), last),
            Duration::from_secs(want),
            "{failures} consecutive failures"
        );
    }
    assert_eq!(
        backoff::remaining(2, Some(last), ts("2026-11-26T10:00:15Z")),
        Duration::from_secs(5),
        "the wait counts from the last failure"
    );
    // A success resets the count; failures after it count again.
    let ok = pod(P {
        finished_at: "2026-11-26T09:59:00Z",
        ..p("ok", "Succeeded")
    });
    let before = pod(P {
        finished_at: "2026-11-26T09:58:00Z",
        ..p("f1", "Failed")
    });
    let after = pod(P {
        finished_at: "2026-11-26T09:59:30Z",
        ..p("f2", "Failed")
    });
    let prev = Record {
        failures_after_last_success: 4,
        last_failure_time: Some(ts("2026-11-26T09:50:00Z")),
    };
    let rec = backoff::next_record(&prev, &[ok], &[before, after]);
    assert_eq!(
        rec,
        Record {
            failures_after_last_success: 1,
            last_failure_time: Some(ts("2026-11-26T09:59:30Z")),
        }
    );
}

#[test]
fn indexed_jobs_give_each_index_once() {
    let j = job(
        json!({"completions": 5, "parallelism": 3, "completionMode": "Indexed"}),
        json!({"completedIndexes": "0", "succeeded": 1}),
    );
    let pods = vec![
        pod(P {
            index: Some(1),
            ..p("i1", "Running")
        }),
        pod(P {
            index: Some(2),
            ..p("i2", "Succeeded")
        }),
    ];
    let ctx = eval(&j, pods);
    assert_eq!(
        ctx.succeeded_indexes.to_string(),
        "0,2",
        "counted 0 and newly succeeded 2"
    );
    assert_eq!(
        manage(&ctx, now()),
        Manage::Create {
            count: 2,
            indexes: vec![3, 4]
        },
        "the lowest indexes neither succeeded nor active"
    );
    // Repeated index: the extra Pod goes.
    let dup = eval(
        &j,
        vec![
            pod(P {
                index: Some(1),
                ..p("a", "Running")
            }),
            pod(P {
                index: Some(1),
                ..p("b", "Pending")
            }),
            pod(P {
                index: Some(9),
                ..p("c", "Running")
            }),
        ],
    );
    match manage(&dup, now()) {
        Manage::Delete(v) => assert_eq!(
            names(&v),
            ["c", "b"],
            "out of range first, then the duplicate"
        ),
        other => panic!("{other:?}"),
    }
    let created = pod_from_template(&j, Some(3), None);
    let meta = &created.metadata;
    assert_eq!(meta.generate_name.as_deref(), Some("pi-3-"));
    assert_eq!(
        meta.annotations.as_ref().unwrap()[indexed::COMPLETION_INDEX],
        "3"
    );
    assert_eq!(
        meta.labels.as_ref().unwrap()[indexed::COMPLETION_INDEX],
        "3"
    );
    assert_eq!(
        meta.finalizers.as_deref(),
        Some(&[TRACKING_FINALIZER.to_string()][..])
    );
    let spec = created.spec.unwrap();
    assert_eq!(spec.hostname.as_deref(), Some("pi-3"));
    let env = &spec.containers[0].env.as_ref().unwrap()[0];
    assert_eq!(env.name, "JOB_COMPLETION_INDEX");
    assert_eq!(
        env.value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "metadata.labels['batch.kubernetes.io/job-completion-index']"
    );
    let plain = pod_from_template(&job(json!({}), json!({})), None, None);
    assert_eq!(plain.metadata.generate_name.as_deref(), Some("pi-"));
}

#[test]
fn indexes_are_written_as_upstream_writes_them() {
    let cases: &[(&str, i32, &str)] = &[
        ("1,3-5,7", 10, "1,3-5,7"),
        ("3,4", 10, "3,4"),
        ("0-2,3", 10, "0-3"),
        ("2-9", 5, "2-4"),
        ("7,1", 5, ""), // parsing stops at the first index out of range
        ("", 5, ""),
    ];
    for (input, completions, want) in cases {
        assert_eq!(
            Intervals::parse(input, *completions).to_string(),
            *want,
            "{input}"
        );
    }
    assert_eq!(
        indexed::first_pending(
            3,
            6,
            &Intervals::parse("0,2", 6),
            &std::collections::BTreeSet::from([1]),
            &Intervals::default()
        ),
        vec![3, 4, 5]
    );
    assert_eq!(
        indexed::generate_name_with_index(&"x".repeat(60), 12).len(),
        58
    );
}

#[test]
fn tracking_counts_each_result_once_and_orders_the_conditions() {
    // Two Pods finished: their UIDs go to uncountedTerminatedPods first.
    let j = job(json!({"completions": 2, "parallelism": 2}), json!({}));
    let pods = vec![pod(p("s1", "Succeeded")), pod(p("s2", "Succeeded"))];
    let mut ctx = eval(&j, pods);
    assert_eq!(ctx.succeeded, 2);
    complete_or_suspend(&mut ctx, true, 0, now());
    let t = track(&mut ctx, false, now());
    assert!(t.needs_flush);
    assert_eq!(names(&t.remove_finalizer), ["s1", "s2"]);
    let st = ctx.job.status.clone().unwrap();
    assert_eq!(
        st.uncounted_terminated_pods.unwrap().succeeded.unwrap(),
        ["uid-s1", "uid-s2"],
        "results recorded before the finalizers go"
    );
    let conds: Vec<String> = st
        .conditions
        .unwrap()
        .iter()
        .map(|c| c.type_.clone())
        .collect();
    assert_eq!(conds, ["SuccessCriteriaMet"], "the interim condition first");
    assert!(
        !enact_finished(&mut ctx, now()),
        "not Complete while Pods are uncounted"
    );
    // Finalizers removed: the UIDs move to the counters, then Complete.
    let status = ctx.job.status.as_mut().unwrap();
    assert!(clean_uncounted(status, &HashSet::new()));
    assert_eq!(status.succeeded, Some(2));
    assert!(enact_finished(&mut ctx, now()));
    let st = ctx.job.status.clone().unwrap();
    let conds: Vec<(String, String)> = st
        .conditions
        .unwrap()
        .iter()
        .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        conds,
        [
            (
                "SuccessCriteriaMet".to_string(),
                "CompletionsReached".to_string()
            ),
            ("Complete".to_string(), "CompletionsReached".to_string())
        ],
        "v1.34 order: SuccessCriteriaMet, then Complete"
    );
    assert!(st.completion_time.is_some());

    // A Pod without the finalizer was counted already: it is not counted again.
    let j = job(json!({"completions": 3}), json!({"succeeded": 1}));
    let ctx = eval(
        &j,
        vec![pod(P {
            finalizer: false,
            ..p("old", "Succeeded")
        })],
    );
    assert_eq!(
        ctx.succeeded, 1,
        "a Pod whose finalizer is gone is in status.succeeded"
    );

    // A failing Job: FailureTarget, then Failed once the Pods are gone.
    let j = job(json!({"completions": 3, "backoffLimit": 0}), json!({}));
    let mut ctx = eval(&j, vec![pod(p("f", "Failed"))]);
    let t = track(&mut ctx, false, now());
    assert_eq!(names(&t.remove_finalizer), ["f"]);
    let status = ctx.job.status.as_mut().unwrap();
    clean_uncounted(status, &HashSet::new());
    assert_eq!(status.failed, Some(1));
    assert!(enact_finished(&mut ctx, now()));
    let conds: Vec<String> = ctx
        .job
        .status
        .unwrap()
        .conditions
        .unwrap()
        .iter()
        .map(|c| c.type_.clone())
        .collect();
    assert_eq!(
        conds,
        ["FailureTarget", "Failed"],
        "v1.34 order: FailureTarget, then Failed"
    );
}

#[test]
fn a_running_pod_keeps_its_finalizer_and_a_terminating_one_delays_the_end() {
    let j = job(json!({"completions": 1}), json!({}));
    let mut ctx = eval(&j, vec![pod(p("r", "Running"))]);
    let t = track(&mut ctx, false, now());
    assert!(
        t.remove_finalizer.is_empty(),
        "a running Pod keeps its finalizer"
    );
    // Finishing with a Pod still terminating: the terminal condition waits.
    let j = job(json!({"completions": 3, "backoffLimit": 0}), json!({}));
    let mut ctx = eval(
        &j,
        vec![
            pod(p("f", "Failed")),
            pod(P {
                deleting: true,
                ..p("t", "Running")
            }),
        ],
    );
    assert!(ctx.finished.is_some());
    track(&mut ctx, false, now());
    let status = ctx.job.status.as_mut().unwrap();
    clean_uncounted(status, &HashSet::new());
    assert!(
        !enact_finished(&mut ctx, now()),
        "Failed waits for terminating Pods"
    );
}

#[test]
fn suspend_and_resume_conditions() {
    let j = job(json!({"completions": 2, "suspend": true}), json!({}));
    let mut ctx = eval(&j, vec![]);
    assert!(
        ctx.job.status.as_ref().unwrap().start_time.is_none(),
        "a Job created suspended gets no start time"
    );
    let (changed, event) = complete_or_suspend(&mut ctx, true, 0, now());
    assert!(changed);
    assert_eq!(event, Some(("Suspended", "Job suspended")));
    let c = &ctx
        .job
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()),
        ("Suspended", "True", Some("JobSuspended"))
    );
    // Resumed: the condition turns False and the start time restarts.
    let resumed = job(
        json!({"completions": 2, "suspend": false}),
        json!({"startTime": "2026-11-26T09:00:00Z",
               "conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended",
                               "message": "Job suspended"}]}),
    );
    let mut ctx = eval(&resumed, vec![]);
    let (changed, event) = complete_or_suspend(&mut ctx, true, 0, now());
    assert!(changed);
    assert_eq!(event, Some(("Resumed", "Job resumed")));
    let st = ctx.job.status.unwrap();
    assert_eq!(
        st.start_time.unwrap().0,
        now(),
        "the deadline counts from resumption"
    );
    assert_eq!(st.conditions.unwrap()[0].status, "False");
}
