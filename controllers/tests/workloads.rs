//! The workload controllers (replicaset, deployment, garbagecollector) end to end against the
//! reference control plane, once with kube-controller-manager (`upstream_*`), once with our
//! `controller-manager` (`kpr_*`), and the two runs compared (`differential_*`). Each flavour gets
//! a fresh control plane of its own: etcd, kube-apiserver, kube-scheduler, kwok nodes and that
//! controller manager; every scenario runs in its own namespace on it, once per test binary
//! (the per-flavour and the differential test of a scenario share the run).
//!
//! Scenarios (docs/WORKLOADS.md says what each proves and which differences are accepted):
//! 1-2 rollout and undo, 3 proportional scaling, 4 scale-down ranking, 5 cascading deletion,
//! 6 release of a relabelled Pod, 7 (ours only) a controller manager killed mid-rollout, 8 a
//! Deployment paused at zero replicas (issue 37).
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;
/// This suite's own modules, in `workloads/`.
mod workloads {
    pub mod compare;
    pub mod harness;
    pub mod scenarios;
    pub mod world;
}

use workloads::compare::{check, differential, Scenario};
use workloads::harness::{start_cluster, Flavour, Run};
use workloads::scenarios;

async fn restart(flavour: Flavour) {
    let cluster = std::sync::Arc::new(
        tokio::task::block_in_place(|| {
            start_cluster(flavour, &format!("restart-{}", flavour.tag()))
        })
        .expect("starting a control plane"),
    );
    let run = Run::on(cluster, "restart").await.expect("a namespace");
    let outcome = scenarios::restart_mid_rollout(&run)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    if std::env::var_os("KPR_WORKLOADS_SHOW").is_some() {
        eprintln!(
            "{flavour:?} restart: {:#}",
            serde_json::json!(outcome.record)
        );
    }
    assert!(
        outcome.problems.is_empty(),
        "{flavour:?} restart mid-rollout broke {} expectation(s):\n{}\nrecord: {:#?}",
        outcome.problems.len(),
        outcome.problems.join("\n"),
        outcome.record
    );
}

common::scenario_tests! {
    RolloutAndUndo => upstream_rollout_and_undo, kpr_rollout_and_undo, differential_rollout_and_undo;
    ProportionalScaling => upstream_proportional_scaling, kpr_proportional_scaling, differential_proportional_scaling;
    ScaleDownRanking => upstream_scale_down_ranking, kpr_scale_down_ranking, differential_scale_down_ranking;
    CascadingDeletion => upstream_cascading_deletion, kpr_cascading_deletion, differential_cascading_deletion;
    ReleaseRelabelledPod => upstream_release_relabelled_pod, kpr_release_relabelled_pod, differential_release_relabelled_pod;
    PausedAtZero => upstream_paused_at_zero, kpr_paused_at_zero, differential_paused_at_zero;
}

/// Scenario 7 with our controller manager: SIGKILL mid-rollout, restart, no extra Pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_restart_mid_rollout() {
    restart(Flavour::Kpr).await;
}

/// Scenario 7 with kube-controller-manager: shows the scenario itself holds on the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_restart_mid_rollout() {
    restart(Flavour::Upstream).await;
}
