//! kpr's `scheduler` next to kube-scheduler v1.34 on one reference control plane (etcd and
//! kube-apiserver; nodes are API objects, no kubelet or kwok is needed to schedule):
//!
//! 1. Feasibility: for every probe Pod (requests incl. init and sidecar containers, extended
//!    resources, Pod slots, taints of each effect, a cordoned node, required node affinity and
//!    nodeSelector, NodeAffinity's PreFilter narrowing by matchFields, topology spread
//!    DoNotSchedule with minDomains and node inclusion policies, required pod affinity and
//!    anti-affinity both ways, host ports incl. hostIP) on every probe node, both schedulers
//!    agree whether it fits, and where it does not, on the FitError message word for word
//!    (`diff_probes`).
//! 2. Placement: the same 162-Pod workload on identical nodes, three runs per scheduler, ours no
//!    worse than kube-scheduler on utilisation, spread skew and preferred-affinity satisfaction
//!    within stated tolerances (`diff_placement`). Both tables are printed (`--nocapture`).
//!
//! 3. Preemption and topology spread over bound Pods whose status comes after binding: the
//!    nominated node and victims, or the node, of issue 37's cases and upstream's preemption
//!    tables, upstream's expected answer under both schedulers (`diff_preemption`).
//!
//! 4. Volumes, with kube-controller-manager's persistentvolume-binder completing the bindings:
//!    a StatefulSet-like set on local WaitForFirstConsumer volumes (nodes chosen, volumes bound,
//!    a deleted Pod back on its volume's node), Pods that fit nowhere for their volumes (a full
//!    node, a zone, CSI attach limits, no matching volume, a missing or unbound immediate claim)
//!    and a claim to provision: the same outcome under both schedulers (`diff_volumes`).
//!
//! The parts run at once; they share no nodes or namespaces (3 and 4 share the `*-place`
//! schedulers with 2, on nodes of their own).
//! Requires the reference binaries (`cargo xtask setup --k8s`).

/// This suite's own modules, in `scheduler/`.
mod scheduler {
    pub mod diff_cluster;
    pub mod diff_placement;
    pub mod diff_preemption;
    pub mod diff_probes;
    pub mod diff_volumes;
}

use scheduler::diff_cluster::{DiffCluster, Impl};
use scheduler::{diff_placement, diff_preemption, diff_probes, diff_volumes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_scheduler_matches_kube_scheduler() {
    let mut cluster = DiffCluster::start("scheduler-differential")
        .await
        .expect("starting the control plane");
    diff_probes::setup(&cluster.client)
        .await
        .expect("probe nodes and fixture Pods");
    diff_placement::setup(&cluster.client)
        .await
        .expect("placement nodes");
    diff_preemption::setup(&cluster.client)
        .await
        .expect("preemption rows' nodes");
    diff_volumes::setup(&cluster.client)
        .await
        .expect("volume nodes, classes, volumes and CSINodes");
    tokio::task::block_in_place(|| {
        cluster
            .cp
            .start_upstream_controller_manager_with("persistentvolume-binder", &[])
    })
    .expect("starting kube-controller-manager's persistentvolume-binder");
    cluster
        .start_schedulers()
        .await
        .expect("starting kube-scheduler and kpr's scheduler");
    let logs = cluster.cp.logs_dir();
    let client = &cluster.client;
    let sets = diff_placement::Set::all();
    let (probes, placements, preemption, volumes) = tokio::join!(
        diff_probes::run(client),
        futures::future::join_all(sets.iter().map(|s| diff_placement::run(client, *s))),
        diff_preemption::run(client),
        diff_volumes::run(client),
    );
    let mut failures = Vec::new();
    match volumes {
        Ok(r) => {
            eprintln!("volume steps:\n{}", r.table());
            failures.extend(r.differences());
        }
        Err(e) => failures.push(format!("volumes: {e:#}")),
    }
    match preemption {
        Ok(r) => {
            eprintln!("preemption and spread rows:\n{}", r.table());
            failures.extend(r.differences());
        }
        Err(e) => failures.push(format!("preemption rows: {e:#}")),
    }
    match probes {
        Ok(r) => {
            eprintln!(
                "feasibility: {} probes x {} probe nodes, {} copies in {:.1?}\n{}",
                r.feasible.len(),
                diff_probes::nodes().len(),
                r.copies,
                r.elapsed,
                r.table()
            );
            for (probe, m) in &r.nowhere_messages {
                eprintln!("fits nowhere, same FitError under both: {probe}: {m}");
            }
            if !r.reruns_agreed.is_empty() {
                eprintln!(
                    "pairs that differed once and agreed when run alone: {:?}",
                    r.reruns_agreed
                );
            }
            for (probe, target, u, k) in &r.differences {
                failures.push(format!(
                    "probe {probe} on {target}: kube-scheduler {u:?}, kpr {k:?}"
                ));
            }
        }
        Err(e) => failures.push(format!("feasibility probes: {e:#}")),
    }
    let mut runs = std::collections::BTreeMap::<Impl, Vec<_>>::new();
    for (set, r) in sets.iter().zip(placements) {
        match r {
            Ok(p) => runs.entry(set.imp).or_default().push(p),
            Err(e) => failures.push(format!("placement {set:?}: {e:#}")),
        }
    }
    if let (Some(u), Some(k)) = (runs.get(&Impl::Upstream), runs.get(&Impl::Kpr)) {
        let (table, worse) = diff_placement::compare(u, k);
        eprintln!("{table}");
        failures.extend(worse.into_iter().map(|w| format!("placement: {w}")));
    }
    // A panic in either scheduler is a failure, whatever the comparisons say (listed with the
    // rest here; the control plane's drop would fail the test on it too).
    if let Err(e) =
        controlplane::PanicGuard::from_start(&logs, "the differential run").into_result()
    {
        failures.push(e);
    }
    assert!(
        failures.is_empty(),
        "{} difference(s) (scheduler logs in {}):\n{}",
        failures.len(),
        logs.display(),
        failures.join("\n")
    );
}
