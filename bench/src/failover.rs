//! Leader fail-over under load (issue 42, scenario 5): two replicas of the controller manager and
//! two of the scheduler, each pair electing a leader through its Lease, on the reference
//! kube-apiserver with kwok nodes; D Deployments of R replicas are created at once, and when a
//! third of their Pods are bound the leader of each pair is killed with SIGKILL. Measured, for
//! kpr (its `controller-manager` and `scheduler`) and for kube-controller-manager and
//! kube-scheduler alike:
//!
//! - takeover: SIGKILL to the Lease naming the other replica (bounded below by the Lease
//!   duration, 15 s by default for all four);
//! - duplicates: Pods beyond a Deployment's replicas, and ReplicaSets beyond one per Deployment,
//!   once every Deployment is available (the stale-cache failure a new leader can cause);
//! - unscheduled: Pods without a node at the end (lost bindings);
//! - the time from the creations to every Deployment available.
//!
//! Both managers run the deployment, replicaset and garbagecollector controllers with their
//! default client limits; both schedulers their default profile. The leader is the replica started
//! first (the second starts once the first holds the Lease), so the one killed is known.
//!
//! Owns `<out>/failover.{json,md}`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::{ControlPlane, Options};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde::Serialize;

use crate::workload_controllers::{
    deployment, kpr_kubeconfig, start_ready_kwok_nodes, write_config_files,
};

/// The sizes: 100 Deployments of 10 replicas on 50 kwok nodes.
pub const DEPLOYMENTS: usize = 100;
pub const REPLICAS: usize = 10;
pub const NODES: usize = 50;
/// --quick.
pub const QUICK: (usize, usize, usize) = (20, 5, 10);

pub const JSON_FILE: &str = "failover.json";
pub const MARKDOWN_FILE: &str = "failover.md";

/// Whose controller manager and scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    Kpr,
    Upstream,
}

impl Plane {
    pub fn parse(name: &str) -> anyhow::Result<Plane> {
        match name {
            "kpr" => Ok(Plane::Kpr),
            "upstream" => Ok(Plane::Upstream),
            other => bail!("unknown --failover-planes entry {other:?}: kpr or upstream"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Plane::Kpr => "kpr controller-manager + scheduler",
            Plane::Upstream => "kube-controller-manager + kube-scheduler",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Plane::Kpr => "kpr",
            Plane::Upstream => "upstream",
        }
    }

    /// The Leases (kube-system) of the controller manager and the scheduler.
    fn leases(self) -> (&'static str, &'static str) {
        match self {
            Plane::Kpr => ("kpr-controller-manager", "kpr-scheduler"),
            Plane::Upstream => ("kube-controller-manager", "kube-scheduler"),
        }
    }
}

/// One plane's run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PlaneRun {
    pub plane: String,
    pub deployments: usize,
    pub replicas: usize,
    pub nodes: usize,
    /// Pods bound when the leaders were killed.
    pub bound_at_kill: usize,
    /// SIGKILL to the other replica named in the Lease.
    pub manager_takeover_seconds: Option<f64>,
    pub scheduler_takeover_seconds: Option<f64>,
    /// Creations to every Deployment available.
    pub seconds: Option<f64>,
    /// Pods beyond the Deployments' replicas, summed.
    pub duplicate_pods: usize,
    /// ReplicaSets beyond one per Deployment.
    pub extra_replicasets: usize,
    /// Pods with no node at the end.
    pub unscheduled: usize,
    pub error: Option<String>,
}

pub fn run(
    sizes: (usize, usize, usize),
    planes: &[Plane],
    out_dir: &Path,
) -> anyhow::Result<(Vec<PlaneRun>, Vec<String>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (_, kwok_config) = write_config_files(out_dir)?;
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for &plane in planes {
        let (deployments, replicas, nodes) = sizes;
        println!(
            "bench: leader fail-over, {}: {deployments} Deployments x {replicas} replicas on {nodes} kwok nodes",
            plane.name()
        );
        let mut run = PlaneRun {
            plane: plane.name().into(),
            deployments,
            replicas,
            nodes,
            ..PlaneRun::default()
        };
        if let Err(e) = measure(&rt, plane, sizes, &kwok_config, &mut run) {
            let e = format!("{e:#}");
            failures.push(format!("leader fail-over, {}: {e}", run.plane));
            run.error = Some(e);
        }
        println!("{}", row(&run));
        runs.push(run);
    }
    std::fs::write(
        out_dir.join(JSON_FILE),
        serde_json::to_string_pretty(&runs)?,
    )?;
    std::fs::write(out_dir.join(MARKDOWN_FILE), markdown(&runs))?;
    println!("{}", markdown(&runs));
    Ok((runs, failures))
}

/// Starts replica `i` of the plane's controller manager and scheduler.
fn start_replica(
    cp: &mut ControlPlane,
    plane: Plane,
    i: usize,
    kpr_kubeconfig: Option<&Path>,
) -> anyhow::Result<(String, String)> {
    let manager = format!("{}-manager-{i}", plane.tag());
    let scheduler = format!("{}-scheduler-{i}", plane.tag());
    let scheduler_kubeconfig = cp.kubeconfig_for_user("system:kube-scheduler", None)?;
    match plane {
        Plane::Kpr => {
            let kubeconfig = kpr_kubeconfig.context("kpr's kubeconfig")?;
            cp.spawn_program(
                &manager,
                &crate::kpr_binary("controller-manager"),
                vec![
                    format!("--kubeconfig={}", kubeconfig.display()),
                    "--controllers=deployment,replicaset,garbagecollector".into(),
                    "--leader-elect".into(),
                    format!("--leader-elect-identity={manager}"),
                ],
            )?;
            cp.spawn_program(
                &scheduler,
                &crate::kpr_binary("scheduler"),
                vec![
                    format!("--kubeconfig={}", scheduler_kubeconfig.display()),
                    "--leader-elect=true".into(),
                    format!("--leader-elect-identity={scheduler}"),
                ],
            )?;
        }
        Plane::Upstream => {
            let kubeconfig = cp.kubeconfig_for_user("system:kube-controller-manager", None)?;
            let kcm = cp.binaries.path("kube-controller-manager");
            cp.spawn_program(
                &manager,
                &kcm,
                vec![
                    format!("--kubeconfig={}", kubeconfig.display()),
                    format!("--authentication-kubeconfig={}", kubeconfig.display()),
                    format!("--authorization-kubeconfig={}", kubeconfig.display()),
                    "--controllers=deployment-controller,replicaset-controller,garbage-collector-controller".into(),
                    "--leader-elect=true".into(),
                    "--secure-port=0".into(),
                    // Each controller as its own ServiceAccount, as the bootstrap RBAC
                    // grants (kube-controller-manager's own user may not create ReplicaSets).
                    "--use-service-account-credentials=true".into(),
                    format!(
                        "--service-account-private-key-file={}",
                        cp.pki.sa_key.display()
                    ),
                    format!("--root-ca-file={}", cp.pki.ca_cert.display()),
                ],
            )?;
            let ks = cp.binaries.path("kube-scheduler");
            cp.spawn_program(
                &scheduler,
                &ks,
                vec![
                    format!("--kubeconfig={}", scheduler_kubeconfig.display()),
                    format!(
                        "--authentication-kubeconfig={}",
                        scheduler_kubeconfig.display()
                    ),
                    format!(
                        "--authorization-kubeconfig={}",
                        scheduler_kubeconfig.display()
                    ),
                    "--leader-elect=true".into(),
                    "--secure-port=0".into(),
                ],
            )?;
        }
    }
    Ok((manager, scheduler))
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec.and_then(|s| s.holder_identity))
        .filter(|h| !h.is_empty())
}

async fn wait_holder(leases: &Api<Lease>, name: &str, timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(h) = holder(leases, name).await {
            return Ok(h);
        }
        if Instant::now() > deadline {
            bail!("no holder of Lease kube-system/{name} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn measure(
    rt: &tokio::runtime::Runtime,
    plane: Plane,
    (deployments, replicas, nodes): (usize, usize, usize),
    kwok_config: &Path,
    run: &mut PlaneRun,
) -> anyhow::Result<()> {
    let dir = controlplane::run_dir(&format!("failover-{}", plane.tag()));
    let mut cp =
        ControlPlane::start(Options::minimal(&dir)).context("starting the control plane")?;
    let client = start_ready_kwok_nodes(rt, &mut cp, nodes, kwok_config)?;
    let kpr_config = match plane {
        Plane::Kpr => Some(kpr_kubeconfig(&cp)?),
        Plane::Upstream => None,
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let (manager_lease, scheduler_lease) = plane.leases();
    // Replica 0 first: once it holds both Leases, replica 1 starts as the standby.
    let (manager0, scheduler0) = start_replica(&mut cp, plane, 0, kpr_config.as_deref())?;
    let manager_leader =
        rt.block_on(wait_holder(&leases, manager_lease, Duration::from_secs(60)))?;
    let scheduler_leader = rt.block_on(wait_holder(
        &leases,
        scheduler_lease,
        Duration::from_secs(60),
    ))?;
    start_replica(&mut cp, plane, 1, kpr_config.as_deref())?;
    std::thread::sleep(Duration::from_secs(5));
    cp.check_alive()?;

    let ns = cp.test_namespace("failover")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let total = deployments * replicas;
    let started = Instant::now();
    rt.block_on(async {
        let creates = (0..deployments).map(|i| {
            let deploys = deploys.clone();
            async move {
                deploys
                    .create(
                        &PostParams::default(),
                        &deployment(&format!("d-{i}"), replicas),
                    )
                    .await
            }
        });
        for r in futures::future::join_all(creates).await {
            r.context("creating a Deployment")?;
        }
        anyhow::Ok(())
    })?;

    // Kill both leaders once a third of the Pods are bound.
    let bound = |list: &[Pod]| {
        list.iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let list = rt.block_on(pods.list(&ListParams::default()))?.items;
        let n = bound(&list);
        if n >= total / 3 {
            run.bound_at_kill = n;
            break;
        }
        if Instant::now() > deadline {
            bail!("only {n} of {total} Pods bound after 300 s, before any kill");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed = Instant::now();
    for name in [&manager0, &scheduler0] {
        if !cp.kill(name) {
            bail!("{name} was not running when its kill was due");
        }
    }
    println!(
        "  leaders killed with {} of {total} Pods bound",
        run.bound_at_kill
    );
    rt.block_on(async {
        let mut manager_done = None;
        let mut scheduler_done = None;
        let deadline = Instant::now() + Duration::from_secs(120);
        while manager_done.is_none() || scheduler_done.is_none() {
            if manager_done.is_none()
                && holder(&leases, manager_lease)
                    .await
                    .is_some_and(|h| h != manager_leader)
            {
                manager_done = Some(killed.elapsed().as_secs_f64());
            }
            if scheduler_done.is_none()
                && holder(&leases, scheduler_lease)
                    .await
                    .is_some_and(|h| h != scheduler_leader)
            {
                scheduler_done = Some(killed.elapsed().as_secs_f64());
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        run.manager_takeover_seconds = manager_done;
        run.scheduler_takeover_seconds = scheduler_done;
    });

    // Every Deployment available.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = rt.block_on(deploys.list(&ListParams::default()))?.items;
        let available = list
            .iter()
            .filter(|d| {
                d.status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0)
                    == replicas as i32
            })
            .count();
        if available == deployments {
            run.seconds = Some(started.elapsed().as_secs_f64());
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // A little longer, for a late duplicate to show.
    std::thread::sleep(Duration::from_secs(10));
    let list = rt.block_on(pods.list(&ListParams::default()))?.items;
    let live: Vec<&Pod> = list
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let mut per_deployment = std::collections::BTreeMap::<String, usize>::new();
    for p in &live {
        let app = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .cloned()
            .unwrap_or_default();
        *per_deployment.entry(app).or_default() += 1;
    }
    run.duplicate_pods = per_deployment
        .values()
        .map(|&n| n.saturating_sub(replicas))
        .sum();
    run.unscheduled = live
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .count();
    let rss = rt
        .block_on(replica_sets.list(&ListParams::default()))?
        .items;
    run.extra_replicasets = rss.len().saturating_sub(deployments);
    if run.seconds.is_none() {
        bail!(
            "not every Deployment was available 600 s after the kill ({} live Pods, {} unscheduled)",
            live.len(),
            run.unscheduled
        );
    }
    cp.check_alive()?;
    Ok(())
}

fn secs(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.1}")).unwrap_or_else(|| "-".into())
}

fn row(r: &PlaneRun) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} |",
        r.plane,
        r.bound_at_kill,
        secs(r.manager_takeover_seconds),
        secs(r.scheduler_takeover_seconds),
        secs(r.seconds),
        r.duplicate_pods,
        r.extra_replicasets,
        r.unscheduled
    )
}

pub fn markdown(runs: &[PlaneRun]) -> String {
    let mut out = String::from(
        "| control plane | Pods bound at the kill | manager takeover (s) | scheduler takeover (s) | creations to all available (s) | duplicate Pods | extra ReplicaSets | unscheduled Pods |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        out.push_str(&row(r));
        out.push('\n');
        if let Some(e) = &r.error {
            out.push_str(&format!("\n{}: {e}\n", r.plane));
        }
    }
    out
}
