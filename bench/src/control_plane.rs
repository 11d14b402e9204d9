//! The control-plane row: the EndpointSlice controller's cold start against the REAL
//! kube-apiserver (the reference control plane of `kpr-controlplane`, built by
//! `cargo xtask setup --k8s`), kpr's controller next to kube-controller-manager's own.
//!
//! For each controller in turn, on a fresh control plane of its own (so neither sees the other's
//! slices, and both start from the same etcd): a Node, N Services and M Pods per Service are
//! created through the API (concurrently), each Pod then given a Running, Ready status with a pod
//! IP the way a kubelet reports it (the seeding, timed apart); then the controller's process is
//! started and the clock runs until every Service has EndpointSlices holding all M ready
//! endpoints, labelled as that controller's (`endpointslice.kubernetes.io/managed-by`), seen
//! through a watch. kpr's is the `controller-manager` binary built with `--release`
//! (`--controllers=endpointslice`, its default concurrency); upstream's is kube-controller-manager
//! with `--controllers=endpointslice` and its defaults (client QPS 20, burst 30, 5 concurrent
//! Service syncs), as `ControlPlane::start_upstream_controller_manager` runs it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::{ControlPlane, Options};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::json;

use super::Plan;

const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// API requests in flight while seeding.
const SEED_CONCURRENCY: usize = 64;
const NODE: &str = "bench-node";

/// Both cold starts on the same seeded objects.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStart {
    pub services: usize,
    pub pods_per_service: usize,
    /// The reference release (kube-apiserver, etcd's client, kube-controller-manager).
    pub kubernetes: String,
    pub runs: Vec<ControllerRun>,
}

/// One controller's cold start on a fresh, freshly seeded control plane.
#[derive(Debug, Clone, Serialize)]
pub struct ControllerRun {
    /// `kpr` or `kube-controller-manager`.
    pub controller: String,
    /// The `managed-by` label value of its slices.
    pub managed_by: String,
    /// Creating the Node, Services and Pods and setting the Pods' status (not timed below).
    pub seed_seconds: f64,
    /// Controller process start to the last Service having all its ready endpoints in slices.
    pub seconds: Option<f64>,
    /// Slices it had written by then.
    pub slices: usize,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Controller {
    Kpr,
    /// kube-controller-manager as it ships (client limit 20 requests/s, burst 30).
    Upstream,
    /// kube-controller-manager with its client limit lifted (`--kube-api-qps=1000
    /// --kube-api-burst=1000`): what its algorithm costs, like kpr's, which has no client limit.
    UpstreamUnthrottled,
}

/// The flags that lift kube-controller-manager's client-side rate limit.
const UNTHROTTLED: &[&str] = &["--kube-api-qps=1000", "--kube-api-burst=1000"];

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Kpr => "kpr",
            Controller::Upstream => "kube-controller-manager",
            Controller::UpstreamUnthrottled => "kube-controller-manager --kube-api-qps=1000",
        }
    }

    fn managed_by(self) -> &'static str {
        match self {
            // kpr's writes upstream's value (it replaces that controller); each runs on a
            // control plane of its own here.
            Controller::Kpr | Controller::Upstream | Controller::UpstreamUnthrottled => {
                "endpointslice-controller.k8s.io"
            }
        }
    }
}

fn controller_manager_bin() -> PathBuf {
    crate::kpr_binary("controller-manager")
}

/// Checks that kpr's controller-manager (built by `cargo xtask bench` in the same cargo run as
/// the agent and this benchmark, so the shared crates are built once with one feature set) and the
/// reference binaries (`cargo xtask setup --k8s`) are there.
pub fn check_binaries() -> anyhow::Result<()> {
    let bin = controller_manager_bin();
    if !bin.is_file() {
        anyhow::bail!(
            "{} is missing: run the benchmark through `cargo xtask bench`, which builds it",
            bin.display()
        );
    }
    controlplane::Binaries::locate()?;
    Ok(())
}

/// kpr's cold start, then kube-controller-manager's, with the plan's control-plane sizes. A run
/// that fails is reported in its row (and returned in the error list) without stopping the other.
pub fn cold_start(plan: &Plan) -> anyhow::Result<(ColdStart, Vec<String>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (services, pods) = (plan.cp_services, plan.cp_pods);
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for controller in [
        Controller::Kpr,
        Controller::Upstream,
        Controller::UpstreamUnthrottled,
    ] {
        let mut run = ControllerRun {
            controller: controller.name().into(),
            managed_by: controller.managed_by().into(),
            seed_seconds: 0.0,
            seconds: None,
            slices: 0,
            error: None,
        };
        if let Err(e) = measure(&rt, controller, services, pods, &mut run) {
            let e = format!("{e:#}");
            failures.push(format!("endpointslice cold start, {}: {e}", run.controller));
            run.error = Some(e);
        }
        runs.push(run);
    }
    Ok((
        ColdStart {
            services,
            pods_per_service: pods,
            kubernetes: controlplane::kubernetes_version().into(),
            runs,
        },
        failures,
    ))
}

fn measure(
    rt: &tokio::runtime::Runtime,
    controller: Controller,
    services: usize,
    pods: usize,
    run: &mut ControllerRun,
) -> anyhow::Result<()> {
    let tag = format!("bench-{}", controller.name());
    let mut cp = ControlPlane::start(Options::minimal(controlplane::run_dir(&tag)))
        .context("starting the reference control plane")?;
    let ns = cp.test_namespace("bench")?;
    let client = rt.block_on(cp.client())?;
    let seed_start = Instant::now();
    rt.block_on(seed(&client, &ns, services, pods))
        .context("seeding")?;
    run.seed_seconds = seed_start.elapsed().as_secs_f64();
    println!(
        "  {}: seeded {services} Services x {pods} ready Pods in {:.1} s",
        controller.name(),
        run.seed_seconds
    );

    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let waiter = rt.spawn(wait_complete(
        client.clone(),
        ns.clone(),
        controller.managed_by(),
        services,
        pods,
        ready_tx,
    ));
    // The watch's initial list is done before the controller starts.
    rt.block_on(ready_rx)
        .context("the EndpointSlice watch ended before it started")?;
    let start = Instant::now();
    match controller {
        Controller::Kpr => cp.spawn_program(
            "kpr-controller-manager",
            &controller_manager_bin(),
            vec![
                format!("--kubeconfig={}", cp.admin_kubeconfig().display()),
                "--controllers=endpointslice".into(),
            ],
        )?,
        Controller::Upstream => cp.start_upstream_controller_manager("endpointslice")?,
        Controller::UpstreamUnthrottled => {
            cp.start_upstream_controller_manager_with("endpointslice", UNTHROTTLED)?
        }
    }
    let log = cp.log(match controller {
        Controller::Kpr => "kpr-controller-manager",
        Controller::Upstream | Controller::UpstreamUnthrottled => "kube-controller-manager",
    });
    // Generous: kube-controller-manager's default client limit (20 QPS) makes ~20 slices a second.
    let timeout = Duration::from_secs(120 + services as u64 / 5);
    let outcome = rt.block_on(async {
        tokio::time::timeout(timeout, waiter)
            .await
            .map_err(|_| anyhow::anyhow!("not complete after {timeout:?}"))?
            .context("the watch task")?
    });
    let elapsed = start.elapsed();
    match outcome {
        Ok(slices) => {
            run.slices = slices;
            run.seconds = Some(elapsed.as_secs_f64());
            println!(
                "  {}: every Service's slices complete {:.2} s after the controller started ({slices} slices)",
                controller.name(),
                elapsed.as_secs_f64()
            );
            Ok(())
        }
        Err(e) => Err(e.context(format!(
            "last lines of {}:\n{}",
            log.display(),
            controlplane::process::tail(&log, 20)
        ))),
    }
}

/// Creates the Node, the Services, and the Pods with a kubelet-like Running/Ready status.
async fn seed(
    client: &kube::Client,
    ns: &str,
    services: usize,
    pods_per_service: usize,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .context("creating the Node")?;

    let svc_api: Api<Service> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..services)
        .map(|s| {
            let api = svc_api.clone();
            async move {
                let name = format!("svc-{s}");
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"selector": {"app": name},
                             "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
                }))?;
                api.create(&PostParams::default(), &svc)
                    .await
                    .with_context(|| format!("creating Service {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(SEED_CONCURRENCY)
        .try_collect::<()>()
        .await?;

    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..services * pods_per_service)
        .map(|n| {
            let api = pod_api.clone();
            async move {
                let (s, p) = (n / pods_per_service, n % pods_per_service);
                let name = format!("svc-{s}-{p}");
                let ip = format!("10.{}.{}.{}", 64 + n / 65536, (n / 256) % 256, n % 256);
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"app": format!("svc-{s}")}},
                    "spec": {"nodeName": NODE,
                             "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                }))?;
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating Pod {name}"))?;
                let status = json!({"status": {
                    "phase": "Running",
                    "hostIP": "10.0.0.1",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "conditions": [
                        {"type": "Initialized", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "Ready", "status": "True"},
                        {"type": "PodScheduled", "status": "True"},
                    ],
                }});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("setting the status of Pod {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(SEED_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    Ok(())
}

/// Watches the namespace's slices managed by `managed_by` until every one of `services` Services
/// has `pods` ready endpoints in them; returns how many slices there are then. Signals `ready` once
/// the initial listing is done.
async fn wait_complete(
    client: kube::Client,
    ns: String,
    managed_by: &'static str,
    services: usize,
    pods: usize,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<usize> {
    let api: Api<EndpointSlice> = Api::namespaced(client, &ns);
    let cfg = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={managed_by}"));
    let mut stream = std::pin::pin!(watcher(api, cfg));
    let mut ready = Some(ready);
    // slice name -> (Service, ready endpoints); Service -> ready endpoints over its slices.
    let mut slices: HashMap<String, (String, usize)> = HashMap::new();
    let mut per_service: HashMap<String, usize> = HashMap::new();
    let mut complete = 0usize;
    let mut apply = |name: String, entry: Option<(String, usize)>| {
        let mut change = |svc: &str, delta: isize| {
            let total = per_service.entry(svc.to_string()).or_default();
            let before = *total == pods;
            *total = total.checked_add_signed(delta).unwrap_or(0);
            match (before, *total == pods) {
                (false, true) => complete += 1,
                (true, false) => complete -= 1,
                _ => {}
            }
        };
        if let Some((svc, n)) = slices.remove(&name) {
            change(&svc, -(n as isize));
        }
        if let Some((svc, n)) = entry {
            change(&svc, n as isize);
            slices.insert(name, (svc, n));
        }
        complete
    };
    while let Some(event) = stream.try_next().await? {
        let done = match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                let name = s.metadata.name.clone().unwrap_or_default();
                let svc = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_SERVICE_NAME))
                    .cloned()
                    .unwrap_or_default();
                // Through JSON: the field's Rust type differs between k8s-openapi's API versions.
                let endpoints = serde_json::to_value(&s.endpoints).unwrap_or_default();
                let n = endpoints.as_array().map_or(0, |all| {
                    all.iter()
                        .filter(|e| e["conditions"]["ready"] == json!(true))
                        .count()
                });
                apply(name, Some((svc, n)))
            }
            watcher::Event::Delete(s) => apply(s.metadata.name.clone().unwrap_or_default(), None),
            watcher::Event::Init => continue,
            watcher::Event::InitDone => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
                continue;
            }
        };
        if done == services {
            return Ok(slices.len());
        }
    }
    bail!("the EndpointSlice watch ended")
}
