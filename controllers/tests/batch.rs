//! The batch controllers (job, cronjob, ttl-after-finished) end to end against the reference control plane with
//! kwok nodes, once with kube-controller-manager (`upstream_*`), once with our
//! `controller-manager` (`kpr_*`), and the two runs compared (`differential_*`). One control
//! plane per flavour; all nine scenarios of a flavour run concurrently, once per test binary, on
//! the first test that asks (so the CronJob scenarios wait for one minute boundary together).
//! The scenarios are in `batch/scenarios.rs`; docs/WORKLOADS.md lists what they prove and the
//! accepted differences.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;
/// This suite's own modules, in `batch/`.
mod batch {
    pub mod harness;
    pub mod scenarios;
}

use batch::{harness, scenarios};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use harness::{Flavour, Run};
use scenarios::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    Parallel,
    Indexed,
    BackoffLimit,
    PodFailurePolicy,
    CronForbid,
    CronReplace,
    Suspend,
    Deadline,
    Ttl,
}

const ALL: [Scenario; 9] = [
    Scenario::Parallel,
    Scenario::Indexed,
    Scenario::BackoffLimit,
    Scenario::PodFailurePolicy,
    Scenario::CronForbid,
    Scenario::CronReplace,
    Scenario::Suspend,
    Scenario::Deadline,
    Scenario::Ttl,
];

type Results = Arc<BTreeMap<Scenario, Result<Outcome, String>>>;

async fn run_one(flavour: Flavour, scenario: Scenario) -> anyhow::Result<Outcome> {
    let tag = format!("{scenario:?}").to_lowercase();
    let run = Run::new(flavour, &tag).await?;
    match scenario {
        Scenario::Parallel => scenarios::parallel(&run).await,
        Scenario::Indexed => scenarios::indexed(&run).await,
        Scenario::BackoffLimit => scenarios::backoff_limit(&run).await,
        Scenario::PodFailurePolicy => scenarios::pod_failure_policy(&run).await,
        Scenario::CronForbid => scenarios::cron(&run, "Forbid").await,
        Scenario::CronReplace => scenarios::cron(&run, "Replace").await,
        Scenario::Suspend => scenarios::suspend(&run).await,
        Scenario::Deadline => scenarios::deadline(&run).await,
        Scenario::Ttl => scenarios::ttl(&run).await,
    }
}

/// Every scenario's outcome under `flavour`, all run concurrently on first request.
async fn results(flavour: Flavour) -> Results {
    type Cell = Arc<tokio::sync::OnceCell<Results>>;
    static MEMO: Mutex<BTreeMap<Flavour, Cell>> = Mutex::new(BTreeMap::new());
    let cell = MEMO
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(flavour)
        .or_default()
        .clone();
    cell.get_or_init(|| async move {
        // Start the control plane once before the scenarios ask for it concurrently.
        if let Err(e) = Run::shared(flavour) {
            let e = format!("{e:#}");
            return Arc::new(ALL.iter().map(|s| (*s, Err(e.clone()))).collect());
        }
        let runs = ALL.iter().map(|s| async move {
            let r = run_one(flavour, *s)
                .await
                .map_err(|e| format!("{flavour:?} {s:?}: {e:#}"));
            (*s, r)
        });
        Arc::new(futures::future::join_all(runs).await.into_iter().collect())
    })
    .await
    .clone()
}

async fn outcome(flavour: Flavour, scenario: Scenario) -> Outcome {
    match &results(flavour).await[&scenario] {
        Ok(o) => o.clone(),
        Err(e) => panic!("{e}"),
    }
}

async fn check(flavour: Flavour, scenario: Scenario) {
    let o = outcome(flavour, scenario).await;
    if std::env::var_os("KPR_BATCH_SHOW").is_some() {
        eprintln!(
            "{flavour:?} {scenario:?}: {:#}",
            serde_json::json!(o.record)
        );
    }
    assert!(
        o.problems.is_empty(),
        "{flavour:?} {scenario:?} broke {} expectation(s):\n{}\nrecord: {:#?}",
        o.problems.len(),
        o.problems.join("\n"),
        o.record
    );
}

/// The two flavours' records must be equal: every field is an observable both controllers
/// produce the same way (docs/WORKLOADS.md lists what is left out and why).
async fn differential(scenario: Scenario) {
    let (up, ours) = futures::future::join(results(Flavour::Upstream), results(Flavour::Kpr)).await;
    let (up, ours) = match (&up[&scenario], &ours[&scenario]) {
        (Ok(u), Ok(o)) => (u.record.clone(), o.record.clone()),
        (u, o) => panic!("{scenario:?} did not run on both: upstream {u:?}, kpr {o:?}"),
    };
    assert_eq!(
        ours, up,
        "{scenario:?}: kpr's record (left) differs from kube-controller-manager's (right)"
    );
}

common::scenario_tests! {
    Parallel => upstream_job_parallelism_2_of_5, kpr_job_parallelism_2_of_5, differential_job_parallelism_2_of_5;
    Indexed => upstream_indexed_job, kpr_indexed_job, differential_indexed_job;
    BackoffLimit => upstream_job_backoff_limit, kpr_job_backoff_limit, differential_job_backoff_limit;
    PodFailurePolicy => upstream_job_pod_failure_policy, kpr_job_pod_failure_policy, differential_job_pod_failure_policy;
    CronForbid => upstream_cronjob_forbid, kpr_cronjob_forbid, differential_cronjob_forbid;
    CronReplace => upstream_cronjob_replace, kpr_cronjob_replace, differential_cronjob_replace;
    Suspend => upstream_job_suspend_resume, kpr_job_suspend_resume, differential_job_suspend_resume;
    Deadline => upstream_job_active_deadline, kpr_job_active_deadline, differential_job_active_deadline;
    Ttl => upstream_ttl_after_finished, kpr_ttl_after_finished, differential_ttl_after_finished;
}
