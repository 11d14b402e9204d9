//! kpr's `scheduler` binary end to end against the reference kube-apiserver with kwok nodes (no
//! kube-scheduler): Pods with resource requests, taints and tolerations, required and preferred
//! node affinity, topology spread, pod anti-affinity and priorities are bound where they may be
//! and nowhere else; an unschedulable Pod gets the PodScheduled=False condition and the
//! FailedScheduling Event and is scheduled when a fitting node appears; a high-priority Pod
//! preempts the right victim; a burst of 300 Pods gets all its Scheduled Events soon after the last
//! bind. One control plane for the binary; the cases run concurrently.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

/// This suite's own modules, in `scheduler/`.
mod scheduler {
    pub mod burst;
    pub mod cases;
    pub mod harness;
}

use scheduler::harness::{run_case, Cluster, Scheduler};
use scheduler::{burst, cases};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_scheduler_places_pods_where_they_may_go() {
    let cluster = Cluster::start("scheduler-kpr", Scheduler::Kpr)
        .await
        .expect("starting a control plane with kpr's scheduler");
    let all = cases::all();
    let (results, burst) = tokio::join!(
        futures::future::join_all(all.iter().map(|c| run_case(&cluster.client, c))),
        burst::run(&cluster.client)
    );
    let mut failures: Vec<String> = all
        .iter()
        .zip(&results)
        .filter_map(|(c, r)| r.as_ref().err().map(|e| format!("{}: {e:#}", c.name)))
        .collect();
    match burst {
        Ok(b) => eprintln!(
            "event burst: all bound {:?} after the first create, all Scheduled Events {:?} later",
            b.bound_after, b.events_after
        ),
        Err(e) => failures.push(format!("event burst: {e:#}")),
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed (scheduler log: {}):\n{}",
        failures.len(),
        cluster.cp.log("kpr-scheduler").display(),
        failures.join("\n")
    );
}
