//! The apps row's hpa workload (`--apps-workloads hpa`): kpr's horizontal Pod autoscaler next to
//! kube-controller-manager's over N autoscalers, on a fresh reference control plane of its own,
//! started as the other apps workloads' are ([`wc::start_control_plane`]), with the scripted
//! `metrics.k8s.io` server of [`controlplane::metrics_server`] registered through the aggregation
//! layer (the same source the HPA differential suite uses).
//!
//! Before the manager starts: N Deployments of [`REPLICAS`] replicas (no Deployment controller
//! runs: the autoscaler only needs their scale subresource) and their Pods, bound through
//! `spec.nodeName` to a Node kwok does not manage and made Running and Ready since long ago
//! through the status subresource, each requesting [`CPU_REQUEST_MILLI`]m CPU and reporting half
//! of it; then N autoscaling/v2 autoscalers, one per Deployment: 1 to 10 replicas, CPU at 50 %
//! of the requests, scale-down stabilisation 0 s (the default 300 s would only measure a wait).
//! Both managers run with only `--controllers=horizontalpodautoscaling` and the same
//! `--horizontal-pod-autoscaler-sync-period` (`--hpa-sync-period`: kube-controller-manager's
//! default 15 s, as a user runs them; 1 s with `--quick`).
//!
//! Clocks: ready is from the manager's start until every autoscaler shows its first decision
//! (ScalingActive True, a current CPU utilisation of 50 %); then every Pod reports its full
//! request (100 %) and the first phase runs until every Deployment is scaled to
//! 2 x [`REPLICAS`]; then every Pod reports a quarter (25 %) and the second phase runs until
//! every Deployment is scaled to 1. Both phases are bounded below by the sync period (each
//! autoscaler is looked at once per period): what scales is how late the last of N is, and the
//! requests, CPU and memory that takes.
//!
//! Owns: its control plane and its metrics server. The row is [`apps_bench`]'s ([`AppsRun`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::metrics_server::{self, Script};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use super::apps_bench::{AppsRun, Phase, Sizes};
use super::workload_controllers::{
    self as wc, count_requests, cpu_seconds, guarded, vm_hwm_kib, Files, Manager, IMAGE,
    WRITE_CONCURRENCY,
};

/// The Node the Pods are bound to; kwok does not manage it.
pub const NODE: &str = "hpa-node";
/// Each Deployment's replicas (and Pods) before scaling.
pub const REPLICAS: i32 = 2;
/// Each Pod's CPU request.
pub const CPU_REQUEST_MILLI: u32 = 100;
/// When every Pod started and became Ready: long before, so no Pod is within the autoscaler's
/// CPU initialisation period or initial readiness delay.
const STARTED: &str = "2026-01-01T00:00:00Z";

fn deployment_name(i: usize) -> String {
    format!("d-{i:04}")
}

fn pod_name(i: usize, r: i32) -> String {
    format!("{}-{r}", deployment_name(i))
}

/// Measures the workload under `manager` on a control plane of its own into `run`.
pub(crate) fn measure(
    rt: &tokio::runtime::Runtime,
    manager: Manager,
    z: Sizes,
    files: Files<'_>,
    run: &mut AppsRun,
) -> anyhow::Result<()> {
    let n = z.hpa_autoscalers;
    let tag = format!("apps-hpa-{}", manager.tag());
    let (mut cp, client, audit_log) = wc::start_control_plane(rt, &tag, 1, files)?;
    let serving = cp
        .pki
        .server("scripted-metrics", &["localhost"])
        .context("a serving certificate for the scripted metrics server")?;
    let (port, script) = rt
        .block_on(metrics_server::start(&serving.cert, &serving.key))
        .context("starting the scripted metrics server")?;
    rt.block_on(metrics_server::register(
        &client,
        port,
        Duration::from_secs(60),
    ))?;
    let ns = cp.test_namespace("hpa")?;

    let clock = Instant::now();
    rt.block_on(guarded(
        &mut cp,
        Duration::from_secs(600 + n as u64 / 5),
        create_targets(client.clone(), &ns, n, &script),
    ))
    .with_context(|| format!("creating {n} Deployments and their Pods"))?;
    println!(
        "  {}: hpa: {n} Deployments and {} Pods created in {:.1} s",
        manager.name(),
        n * REPLICAS as usize,
        clock.elapsed().as_secs_f64()
    );

    // The watches are listed before the clock starts.
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let (hpa_tx, mut active) = tokio::sync::watch::channel(0usize);
    let (scale_tx, mut scales) = tokio::sync::watch::channel(BTreeMap::<i32, usize>::new());
    let (ready_a, ready_a_rx) = tokio::sync::oneshot::channel();
    let (ready_b, ready_b_rx) = tokio::sync::oneshot::channel();
    let trackers = [
        rt.spawn(track_hpas(hpas.clone(), hpa_tx, ready_a)),
        rt.spawn(track_scales(deployments, scale_tx, ready_b)),
    ];
    rt.block_on(async {
        ready_a_rx.await?;
        ready_b_rx.await
    })
    .context("a watch ended before its first listing")?;
    rt.block_on(create_hpas(hpas, n))?;

    let label = format!("{}: hpa", manager.name());
    let clock = Instant::now();
    let sync = format!(
        "--horizontal-pod-autoscaler-sync-period={}s",
        z.hpa_sync_seconds
    );
    let (flags, pid) = wc::start_manager(&mut cp, manager, "horizontalpodautoscaling", &[&sync])?;
    run.flags = flags;
    let timeout = Duration::from_secs(300 + n as u64 / 5);
    let first = async {
        loop {
            if *active.borrow_and_update() >= n {
                return anyhow::Ok(());
            }
            active.changed().await.context("the watch ended")?;
        }
    };
    if let Err(e) = rt.block_on(guarded(&mut cp, timeout, first)) {
        bail!(
            "{e:#}: {} of {n} autoscalers active; the manager's log: {}",
            *active.borrow(),
            wc::manager_log_tail(&cp, manager)
        );
    }
    run.ready_seconds = Some(clock.elapsed().as_secs_f64());
    println!(
        "  {label}: {n} autoscalers active {:.2} s after the manager started",
        clock.elapsed().as_secs_f64()
    );

    let mut cpu = cpu_seconds(pid)?;
    let mut bounds = Vec::new();
    for (usage, want) in [
        (CPU_REQUEST_MILLI, 2 * REPLICAS),
        (CPU_REQUEST_MILLI / 4, 1),
    ] {
        bounds.push(Timestamp::now());
        let clock = Instant::now();
        set_usage(&script, &ns, n, Some(usage));
        let wait = async {
            loop {
                if scales.borrow_and_update().get(&want) == Some(&n) {
                    return anyhow::Ok(());
                }
                scales.changed().await.context("the watch ended")?;
            }
        };
        if let Err(e) = rt.block_on(guarded(&mut cp, timeout, wait)) {
            bail!(
                "{e:#}: Deployments by replicas {:?}, want {n} at {want}; the manager's log: {}",
                *scales.borrow(),
                wc::manager_log_tail(&cp, manager)
            );
        }
        let seconds = clock.elapsed().as_secs_f64();
        let now = cpu_seconds(pid)?;
        run.phases.push(Phase {
            name: format!("{n} scaled to {want}"),
            seconds,
            cpu_seconds: now - cpu,
        });
        cpu = now;
        println!(
            "  {label}: {n} Deployments scaled to {want} {seconds:.2} s after their Pods \
             reported {}%",
            usage * 100 / CPU_REQUEST_MILLI
        );
    }
    run.peak_memory_mib = Some(vm_hwm_kib(pid)? as f64 / 1024.0);
    bounds.push(Timestamp::now());
    for t in trackers {
        t.abort();
    }
    cp.stop(manager.process());
    match count_requests(&audit_log, [bounds[0], bounds[1], bounds[2]]) {
        Ok(q) => run.requests = Some(q),
        Err(e) => run.error = Some(format!("counting requests: {e:#}")),
    }
    Ok(())
}

/// Every Pod of the `n` Deployments reports `cpu_milli`.
fn set_usage(script: &Script, ns: &str, n: usize, cpu_milli: Option<u32>) {
    for i in 0..n {
        let app = deployment_name(i);
        for r in 0..REPLICAS {
            script.set(ns, &pod_name(i, r), &[("app", &app)], cpu_milli);
        }
    }
}

/// The Node (no kwok annotation), the `n` Deployments and their Pods, Running and Ready since
/// [`STARTED`], each reporting half its request.
async fn create_targets(
    client: kube::Client,
    ns: &str,
    n: usize,
    script: &Script,
) -> anyhow::Result<()> {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
    }))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {NODE}"))?;
    let (deployments, pods): (Api<Deployment>, Api<Pod>) = (
        Api::namespaced(client.clone(), ns),
        Api::namespaced(client, ns),
    );
    let requests = json!({"requests": {"cpu": format!("{CPU_REQUEST_MILLI}m")}});
    let targets = (0..n).map(|i| (i, None));
    let pods_of = (0..n).flat_map(|i| (0..REPLICAS).map(move |r| (i, Some(r))));
    futures::stream::iter(targets.chain(pods_of))
        .map(|(i, replica)| {
            let (deployments, pods, requests) = (deployments.clone(), pods.clone(), &requests);
            async move {
                let app = deployment_name(i);
                let container = json!({"name": "c", "image": IMAGE, "resources": requests});
                let Some(r) = replica else {
                    let d: Deployment = serde_json::from_value(json!({
                        "metadata": {"name": app},
                        "spec": {"replicas": REPLICAS,
                            "selector": {"matchLabels": {"app": app}},
                            "template": {"metadata": {"labels": {"app": app}},
                                "spec": {"containers": [container]}}}}))?;
                    deployments
                        .create(&PostParams::default(), &d)
                        .await
                        .with_context(|| format!("creating Deployment {app}"))?;
                    return anyhow::Ok(());
                };
                let name = pod_name(i, r);
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"app": app}},
                    "spec": {"nodeName": NODE, "containers": [container]}}))?;
                pods.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating Pod {name}"))?;
                let status = json!({"status": {"phase": "Running", "startTime": STARTED,
                    "conditions": [{"type": "Ready", "status": "True",
                        "lastTransitionTime": STARTED}]}});
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("making Pod {name} Running and Ready"))?;
                Ok(())
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    set_usage(script, ns, n, Some(CPU_REQUEST_MILLI / 2));
    Ok(())
}

/// One autoscaler per Deployment.
async fn create_hpas(api: Api<HorizontalPodAutoscaler>, n: usize) -> anyhow::Result<()> {
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = deployment_name(i);
                let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {
                        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                            "name": name},
                        "minReplicas": 1, "maxReplicas": 10,
                        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 50}}}],
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}}))?;
                api.create(&PostParams::default(), &hpa)
                    .await
                    .with_context(|| format!("creating HorizontalPodAutoscaler {name}"))
                    .map(drop)
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// Whether an autoscaler has made its first decision: ScalingActive True and a current CPU
/// utilisation.
fn active(h: &HorizontalPodAutoscaler) -> bool {
    let Some(s) = &h.status else { return false };
    let scaling_active = s
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "ScalingActive" && c.status == "True");
    let measured = s.current_metrics.iter().flatten().any(|m| {
        m.resource
            .as_ref()
            .is_some_and(|r| r.current.average_utilization.is_some())
    });
    scaling_active && measured
}

/// Publishes how many autoscalers are [`active`]. Signals `ready` after the first listing.
async fn track_hpas(
    api: Api<HorizontalPodAutoscaler>,
    tx: tokio::sync::watch::Sender<usize>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut seen: BTreeMap<String, bool> = BTreeMap::new();
    let mut ready = Some(ready);
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    while let Some(event) = stream.try_next().await? {
        match event {
            watcher::Event::Init => seen.clear(),
            watcher::Event::InitApply(h) | watcher::Event::Apply(h) => {
                seen.insert(h.metadata.name.clone().unwrap_or_default(), active(&h));
            }
            watcher::Event::Delete(h) => {
                seen.remove(h.metadata.name.as_deref().unwrap_or_default());
            }
            watcher::Event::InitDone => {
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
            }
        }
        tx.send_replace(seen.values().filter(|&&a| a).count());
    }
    Ok(())
}

/// Publishes how many Deployments have each `spec.replicas`. Signals `ready` after the first
/// listing.
async fn track_scales(
    api: Api<Deployment>,
    tx: tokio::sync::watch::Sender<BTreeMap<i32, usize>>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut replicas: BTreeMap<String, i32> = BTreeMap::new();
    let mut ready = Some(ready);
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    while let Some(event) = stream.try_next().await? {
        match event {
            watcher::Event::Init => replicas.clear(),
            watcher::Event::InitApply(d) | watcher::Event::Apply(d) => {
                let r = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                replicas.insert(d.metadata.name.clone().unwrap_or_default(), r);
            }
            watcher::Event::Delete(d) => {
                replicas.remove(d.metadata.name.as_deref().unwrap_or_default());
            }
            watcher::Event::InitDone => {
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
            }
        }
        let mut counts = BTreeMap::new();
        for &r in replicas.values() {
            *counts.entry(r).or_default() += 1;
        }
        tx.send_replace(counts);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_means_a_decision_on_a_measured_utilisation() {
        let hpa = |status: serde_json::Value| -> HorizontalPodAutoscaler {
            serde_json::from_value(json!({"metadata": {"name": "h"}, "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "d"}, "maxReplicas": 10},
                "status": status}))
            .unwrap()
        };
        let metric = json!([{"type": "Resource", "resource": {"name": "cpu",
            "current": {"averageUtilization": 50, "averageValue": "50m"}}}]);
        let condition = |status: &str| {
            json!([{"type": "ScalingActive", "status": status,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}])
        };
        let cases = [
            (
                "ScalingActive True, utilisation measured",
                json!({"desiredReplicas": 2, "currentMetrics": metric, "conditions": condition("True")}),
                true,
            ),
            (
                "no metrics read",
                json!({"desiredReplicas": 2, "conditions": condition("True")}),
                false,
            ),
            (
                "ScalingActive False",
                json!({"desiredReplicas": 2, "currentMetrics": metric, "conditions": condition("False")}),
                false,
            ),
        ];
        for (name, status, want) in cases {
            assert_eq!(active(&hpa(status)), want, "{name}");
        }
    }

    #[test]
    fn names_sort_in_creation_order() {
        assert!(deployment_name(9) < deployment_name(10));
        assert_eq!(pod_name(7, 1), "d-0007-1");
    }
}
