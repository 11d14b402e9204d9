//! The workload controllers row (`cargo xtask bench --controllers`): the ReplicaSet, Deployment
//! and garbage collector controllers of kpr's `controller-manager` next to
//! kube-controller-manager's, on the REAL control plane of `kpr-controlplane` (kube-apiserver,
//! etcd, the upstream kube-scheduler and kwok nodes, whose Pods become Running and Ready without
//! containers; built by `cargo xtask setup --k8s`).
//!
//! Per controller manager, on a fresh control plane of its own: N kwok nodes; the manager is
//! started and proven ready by a one-replica warm-up Deployment in a namespace of its own; then D
//! Deployments of R replicas are created at once (64 requests in flight) and the clock runs until
//! every one is complete; then every Deployment's Pod template is changed (a new image: a rolling
//! update with the default 25 % surge and unavailability) and the clock runs again until every
//! one is complete. "Complete" is what `kubectl rollout status` decides (see
//! [`Rollout::status`]), seen through a watch.
//!
//! What is measured, identically for every manager, from outside it: the API requests it issued,
//! from the API server's audit log (a policy that logs, at Metadata level and once per request,
//! only `system:kube-controller-manager` and the ServiceAccounts of `kube-system`: the identities
//! kube-controller-manager uses with `--use-service-account-credentials`, and the one kpr's runs
//! as here, `kube-system/kpr-controller-manager`, so that API Priority and Fairness puts both in
//! the same `workload-high` level), its CPU seconds (utime + stime from /proc/PID/stat) and its
//! peak memory (VmHWM), read just before it is stopped.
//!
//! kube-scheduler and kwok serve every row alike, both lifted so that they are not what is
//! measured: the scheduler's client limit (`--kube-api-qps=1000`; at its default, 50 requests/s,
//! it binds 10,000 Pods in no less than 200 s) and kwok's Pod stage workers (32 instead of 4:
//! with 4, a full run's rolling update had thousands of bound Pods waiting for kwok to make them
//! Running, and thousands more to delete).
//!
//! Owns: its control planes, the `kpr-controller-manager` ServiceAccount and binding it creates in
//! them, `target/bench/controllers.json`, `controllers.md`, `controllers-audit-policy.json` and
//! `controllers-kwok.json`.
//! Touches nothing else.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::{ControlPlane, Options};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::BenchArgs;

/// The size: 1,000 Deployments x 10 replicas on 500 kwok nodes.
pub const DEPLOYMENTS: usize = 1_000;
pub const REPLICAS: usize = 10;
pub const NODES: usize = 500;
/// `--quick`: a smoke run of every manager (a rolling update still takes several steps).
const QUICK: Sizes = Sizes {
    deployments: 5,
    replicas: 4,
    nodes: 3,
};
/// API requests in flight while creating or changing the Deployments.
pub(crate) const WRITE_CONCURRENCY: usize = 64;
/// A kwok node's allocatable Pods (as `controlplane`'s kwok nodes).
pub(crate) const PODS_PER_NODE: usize = 110;
/// The images before and after the rolling update (kwok runs no container: never pulled).
pub(crate) const IMAGE: &str = "registry.k8s.io/pause:3.10";
pub(crate) const NEW_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// kpr's controller-manager's ServiceAccount (in `kube-system`, like kube-controller-manager's).
const KPR_SERVICE_ACCOUNT: &str = "kpr-controller-manager";
/// Flags that lift a Go client's rate limit (kube-controller-manager's own row, kube-scheduler).
pub(crate) const UNTHROTTLED: &[&str] = &["--kube-api-qps=1000", "--kube-api-burst=1000"];
/// The controllers measured, in both managers' syntax.
const CONTROLLERS: &str = "replicaset,deployment,garbagecollector";

/// How big a run is.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sizes {
    pub deployments: usize,
    pub replicas: usize,
    pub nodes: usize,
}

impl Sizes {
    /// The sizes the flags ask for (`--quick`: the smoke size), checked against the nodes' room.
    pub fn from_args(args: &BenchArgs) -> anyhow::Result<Sizes> {
        let sizes = if args.quick {
            QUICK
        } else {
            Sizes {
                deployments: args.deployments,
                replicas: args.replicas,
                nodes: args.kwok_nodes,
            }
        };
        if sizes.deployments == 0 || sizes.replicas == 0 || sizes.nodes == 0 {
            bail!(
                "--deployments {}, --replicas {}, --kwok-nodes {}: each must be at least 1",
                sizes.deployments,
                sizes.replicas,
                sizes.nodes
            );
        }
        // A rolling update surges by up to a quarter (rounded up) per Deployment.
        let peak = sizes.deployments * (sizes.replicas + sizes.replicas.div_ceil(4));
        if peak > sizes.nodes * PODS_PER_NODE {
            bail!(
                "--deployments {} x --replicas {}: up to {peak} Pods during the rolling update, \
                 more than {} kwok nodes hold ({PODS_PER_NODE} each)",
                sizes.deployments,
                sizes.replicas,
                sizes.nodes
            );
        }
        Ok(sizes)
    }

    fn pods(&self) -> usize {
        self.deployments * self.replicas
    }
}

/// One controller manager as it is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    /// `controller-manager --controllers=replicaset,deployment,garbagecollector`, its defaults.
    Kpr,
    /// `controller-manager --controllers=*`: every controller in one process, as a cluster runs
    /// it (the endpoint controllers beside the workload ones share its Pod cache); for its memory.
    KprAll,
    /// kube-controller-manager with its defaults (client limit 20 requests/s and burst 30 per
    /// controller; 5 ReplicaSet, 5 Deployment and 20 garbage collector workers).
    Upstream,
    /// The same with the client limit lifted: what its algorithms cost, like kpr's, which has no
    /// client limit.
    UpstreamUnthrottled,
}

impl Manager {
    /// `--managers` values, in the order they run by default.
    pub const NAMES: &[&str] = &["kpr", "upstream", "upstream-unthrottled", "kpr-all"];

    pub fn parse(name: &str) -> anyhow::Result<Manager> {
        match name.trim() {
            "kpr" => Ok(Manager::Kpr),
            "kpr-all" => Ok(Manager::KprAll),
            "upstream" | "kube-controller-manager" => Ok(Manager::Upstream),
            "upstream-unthrottled" => Ok(Manager::UpstreamUnthrottled),
            other => bail!(
                "--managers: unknown controller manager {other:?} (known: {})",
                Manager::NAMES.join(", ")
            ),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Manager::Kpr => "kpr controller-manager",
            Manager::KprAll => "kpr controller-manager --controllers=*",
            Manager::Upstream => "kube-controller-manager",
            Manager::UpstreamUnthrottled => "kube-controller-manager --kube-api-qps=1000",
        }
    }

    pub(crate) fn tag(self) -> &'static str {
        match self {
            Manager::Kpr => "kpr",
            Manager::KprAll => "kpr-all",
            Manager::Upstream => "kcm",
            Manager::UpstreamUnthrottled => "kcm-unthrottled",
        }
    }

    /// Its process's name in the control plane (and its log's).
    pub(crate) fn process(self) -> &'static str {
        match self {
            Manager::Kpr | Manager::KprAll => "kpr-controller-manager",
            Manager::Upstream | Manager::UpstreamUnthrottled => "kube-controller-manager",
        }
    }
}

/// Every manager's run, with what the report needs to say how and where it was measured.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadBench {
    pub command: String,
    pub sizes: Sizes,
    /// The reference release (kube-apiserver, kube-scheduler, kube-controller-manager).
    pub kubernetes: String,
    pub kernel: String,
    pub date: String,
    pub commit: String,
    pub runs: Vec<ManagerRun>,
}

/// One controller manager on its fresh control plane.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ManagerRun {
    pub manager: String,
    /// Its command line, minus credentials and paths.
    pub flags: Vec<String>,
    /// Process start to the warm-up Deployment complete.
    pub ready_seconds: Option<f64>,
    /// From the first create to every Deployment complete.
    pub create: Option<Phase>,
    /// From the first template change to every Deployment complete at its new generation.
    pub rolling_update: Option<Phase>,
    pub requests: Option<Requests>,
    /// utime + stime over the process's life, until the rolling update was complete.
    pub cpu_seconds: Option<f64>,
    /// VmHWM then.
    pub peak_memory_mib: Option<f64>,
    pub error: Option<String>,
}

/// One timed phase.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub seconds: f64,
    /// The manager's CPU seconds during the phase.
    pub cpu_seconds: f64,
    /// Deployments whose Progressing condition said ProgressDeadlineExceeded at some point of the
    /// phase (`kubectl rollout status` fails on those; they are waited for anyway).
    pub deadline_exceeded: usize,
}

/// The manager's API requests, from the audit log, by when they were received.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Requests {
    /// Before the first create: start-up (discovery, lists, watches) and the warm-up Deployment.
    pub startup: u64,
    /// From the first create to the first template change.
    pub create: u64,
    /// From the first template change to every Deployment complete.
    pub rolling_update: u64,
    /// After that, until the process was stopped.
    pub after: u64,
    pub total: u64,
    /// Per audited user (kube-controller-manager runs each controller as its own ServiceAccount).
    pub by_user: BTreeMap<String, u64>,
    /// Per `verb resource[/subresource]`.
    pub by_kind: BTreeMap<String, u64>,
    /// Responses that were not 2xx, per HTTP code (409: a conflict, an update on a stale copy).
    pub failed_by_code: BTreeMap<u16, u64>,
}

impl Requests {
    /// The requests of the measured work: creating and updating the Deployments.
    pub fn work(&self) -> u64 {
        self.create + self.rolling_update
    }
}

/// The command that reproduces a run (as the report shows it).
pub fn command(args: &BenchArgs, sizes: Sizes, managers: &[Manager]) -> String {
    let mut command = String::from("cargo xtask bench");
    if args.controllers {
        command.push_str(" --controllers");
    }
    if args.quick {
        command.push_str(" --quick");
    } else {
        write!(
            command,
            " --deployments {} --replicas {} --kwok-nodes {}",
            sizes.deployments, sizes.replicas, sizes.nodes
        )
        .unwrap();
    }
    if managers.len() != Manager::NAMES.len() {
        write!(command, " --managers {}", args.managers.join(",")).unwrap();
    }
    command
}

/// The output files, under `out_dir`.
pub const JSON_FILE: &str = "controllers.json";
pub const MARKDOWN_FILE: &str = "controllers.md";
const AUDIT_POLICY_FILE: &str = "controllers-audit-policy.json";
const KWOK_CONFIG_FILE: &str = "controllers-kwok.json";
/// kwok's Pod stage workers (its default is 4).
const KWOK_POD_PARALLELISM: u32 = 32;

/// Checks the binaries every row needs: kpr's controller-manager (built by `cargo xtask bench`)
/// and the reference kube-controller-manager, kube-scheduler and kwok.
pub fn check_binaries() -> anyhow::Result<()> {
    super::control_plane::check_binaries()?;
    let bins = controlplane::Binaries::locate()?;
    for name in ["kube-controller-manager", "kube-scheduler", "kwok"] {
        if !bins.path(name).is_file() {
            bail!(
                "{name} is not in {}: build the reference binaries with `cargo xtask setup --k8s`",
                bins.dir().display()
            );
        }
    }
    Ok(())
}

/// Runs every manager in turn at `sizes`, writes controllers.json and controllers.md under
/// `out_dir` and prints the table. A run that fails is reported in its row (and returned in the
/// error list) without stopping the others.
pub fn run(
    sizes: Sizes,
    managers: &[Manager],
    out_dir: &Path,
    command: String,
) -> anyhow::Result<(WorkloadBench, Vec<String>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (policy, kwok_config) = write_config_files(out_dir)?;
    let files = Files {
        audit_policy: &policy,
        kwok_config: &kwok_config,
    };
    let mut bench = WorkloadBench {
        command,
        sizes,
        kubernetes: controlplane::kubernetes_version().into(),
        kernel: super::report::read_trim("/proc/sys/kernel/osrelease"),
        date: super::report::now_utc(),
        commit: super::report::tree_state(),
        runs: Vec::new(),
    };
    let mut failures = Vec::new();
    for &manager in managers {
        println!(
            "bench: workload controllers, {}: {} Deployments x {} replicas on {} kwok nodes",
            manager.name(),
            sizes.deployments,
            sizes.replicas,
            sizes.nodes
        );
        let mut run = ManagerRun {
            manager: manager.name().into(),
            ..ManagerRun::default()
        };
        if let Err(e) = measure(&rt, manager, sizes, files, &mut run) {
            let e = format!("{e:#}");
            failures.push(format!("workload controllers, {}: {e}", run.manager));
            run.error = Some(e);
        }
        bench.runs.push(run);
    }
    write(&bench, out_dir)?;
    Ok((bench, failures))
}

/// Writes the audit policy and kwok's configuration under `out_dir` (created if missing) and
/// returns their paths, in that order; every control plane of a run shares them.
pub(crate) fn write_config_files(out_dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(out_dir)?;
    let policy = out_dir.join(AUDIT_POLICY_FILE);
    std::fs::write(&policy, audit_policy().to_string())
        .with_context(|| format!("writing {}", policy.display()))?;
    let kwok_config = out_dir.join(KWOK_CONFIG_FILE);
    std::fs::write(&kwok_config, kwok_configuration().to_string())
        .with_context(|| format!("writing {}", kwok_config.display()))?;
    Ok((policy, kwok_config))
}

/// One audit event per request (no RequestReceived stage: a request logs at ResponseComplete, a
/// watch also at ResponseStarted, and the reader counts audit IDs), only for the controller
/// managers' identities, at Metadata level (no bodies: the log stays small and cheap to write).
fn audit_policy() -> serde_json::Value {
    json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "Metadata", "users": ["system:kube-controller-manager"]},
            {"level": "Metadata", "userGroups": ["system:serviceaccounts:kube-system"]},
            {"level": "None"},
        ],
    })
}

/// kwok's configuration: only more Pod stage workers (no Stage objects: kwok keeps its default
/// node and Pod stages).
fn kwok_configuration() -> serde_json::Value {
    json!({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {"podPlayStageParallelism": KWOK_POD_PARALLELISM},
    })
}

/// The configuration files every control plane of a run shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Files<'a> {
    pub(crate) audit_policy: &'a Path,
    pub(crate) kwok_config: &'a Path,
}

fn measure(
    rt: &tokio::runtime::Runtime,
    manager: Manager,
    sizes: Sizes,
    files: Files<'_>,
    run: &mut ManagerRun,
) -> anyhow::Result<()> {
    let (mut cp, client, audit_log) = start_control_plane(
        rt,
        &format!("workload-{}", manager.tag()),
        sizes.nodes,
        files,
    )?;
    let ns = cp.test_namespace("bench")?;
    let warmup_ns = cp.test_namespace("warmup")?;

    // The manager, and the warm-up Deployment that proves its controllers are synced and working.
    let started = Instant::now();
    let (flags, pid) = start_manager(&mut cp, manager, CONTROLLERS, &[])?;
    run.flags = flags;
    let log = cp.log(manager.process());
    // A failed phase says what the Pods were doing and what the manager last logged.
    let explain = |e: anyhow::Error, ns: &str| {
        let pods = rt.block_on(pods_summary(&client, ns));
        e.context(format!(
            "Pods in {ns}: {pods}; last lines of {}:\n{}",
            log.display(),
            controlplane::process::tail(&log, 20)
        ))
    };

    let warmup: Api<Deployment> = Api::namespaced(client.clone(), &warmup_ns);
    rt.block_on(guarded(&mut cp, Duration::from_secs(180), async {
        warmup
            .create(&PostParams::default(), &deployment("warmup", 1))
            .await
            .context("creating the warm-up Deployment")?;
        loop {
            let d = warmup.get("warmup").await?;
            if Rollout::of(&d).status(1) == Status::Complete {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }))
    .context("waiting for the warm-up Deployment (1 replica) to complete")
    .map_err(|e| explain(e, &warmup_ns))?;
    run.ready_seconds = Some(started.elapsed().as_secs_f64());
    println!(
        "  {}: ready (warm-up Deployment complete) {:.1} s after it started",
        manager.name(),
        started.elapsed().as_secs_f64()
    );

    // The tracker's watch is listed before the clock starts.
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let (target, target_rx) = tokio::sync::watch::channel(1i64);
    let (progress_tx, progress_rx) = tokio::sync::watch::channel(Progress::default());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let tracker = rt.spawn(track(api.clone(), target_rx, progress_tx, ready_tx));
    rt.block_on(ready_rx)
        .context("the Deployment watch ended before its first listing")?;

    let timeout = Duration::from_secs(600 + sizes.pods() as u64 / 2);
    let names: Vec<String> = (0..sizes.deployments).map(|i| format!("d-{i}")).collect();

    // Phase 1: every Deployment created at once.
    let cpu0 = cpu_seconds(pid)?;
    let t_create = Timestamp::now();
    let clock = Instant::now();
    let creates = {
        let api = api.clone();
        let replicas = sizes.replicas;
        let names = names.clone();
        async move {
            futures::stream::iter(names)
                .map(|name| {
                    let api = api.clone();
                    async move {
                        api.create(&PostParams::default(), &deployment(&name, replicas))
                            .await
                            .with_context(|| format!("creating Deployment {name}"))?;
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(WRITE_CONCURRENCY)
                .try_collect::<()>()
                .await
        }
    };
    let deadline = rt
        .block_on(guarded(
            &mut cp,
            timeout,
            phase(
                "create",
                manager,
                creates,
                progress_rx.clone(),
                (1, sizes.deployments),
            ),
        ))
        .context("creating the Deployments")
        .map_err(|e| explain(e, &ns))?;
    let cpu1 = cpu_seconds(pid)?;
    run.create = Some(Phase {
        seconds: clock.elapsed().as_secs_f64(),
        cpu_seconds: cpu1 - cpu0,
        deadline_exceeded: deadline,
    });
    println!(
        "  {}: {} Deployments complete {:.2} s after the first create",
        manager.name(),
        sizes.deployments,
        clock.elapsed().as_secs_f64()
    );

    // Phase 2: every Deployment's template changed at once (generation 1 -> 2).
    target.send_replace(2);
    let t_update = Timestamp::now();
    let clock = Instant::now();
    let updates = {
        let api = api.clone();
        async move {
            futures::stream::iter(names)
                .map(|name| {
                    let api = api.clone();
                    async move {
                        let patch = json!({"spec": {"template": {"spec": {"containers": [
                            {"name": "c", "image": NEW_IMAGE}
                        ]}}}});
                        let d = api
                            .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                            .await
                            .with_context(|| format!("changing Deployment {name}'s image"))?;
                        let generation = d.metadata.generation.unwrap_or_default();
                        if generation != 2 {
                            bail!(
                                "Deployment {name}: metadata.generation {generation} after the \
                                 template change, expected 2"
                            );
                        }
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(WRITE_CONCURRENCY)
                .try_collect::<()>()
                .await
        }
    };
    let deadline = rt
        .block_on(guarded(
            &mut cp,
            timeout,
            phase(
                "rolling update",
                manager,
                updates,
                progress_rx.clone(),
                (2, sizes.deployments),
            ),
        ))
        .context("the rolling update")
        .map_err(|e| explain(e, &ns))?;
    let cpu2 = cpu_seconds(pid)?;
    let t_done = Timestamp::now();
    run.rolling_update = Some(Phase {
        seconds: clock.elapsed().as_secs_f64(),
        cpu_seconds: cpu2 - cpu1,
        deadline_exceeded: deadline,
    });
    run.cpu_seconds = Some(cpu2);
    run.peak_memory_mib = Some(vm_hwm_kib(pid)? as f64 / 1024.0);
    println!(
        "  {}: rolling update complete {:.2} s after the first change; {:.1} CPU s, peak {:.1} MiB",
        manager.name(),
        clock.elapsed().as_secs_f64(),
        cpu2,
        run.peak_memory_mib.unwrap_or_default()
    );
    tracker.abort();

    // Stopped before the log is read: requests still in flight are logged on the way out.
    cp.stop(manager.process());
    let requests = count_requests(&audit_log, [t_create, t_update, t_done])?;
    println!(
        "  {}: {} API requests for the work ({} creating, {} updating), {} in all",
        manager.name(),
        requests.work(),
        requests.create,
        requests.rolling_update,
        requests.total
    );
    run.requests = Some(requests);
    Ok(())
}

/// A fresh reference control plane for one run (directory `run_dir(tag)`): etcd, kube-apiserver
/// with the audit policy of `files`, kube-scheduler with its client limit lifted, kwok with
/// `nodes` Ready nodes and no not-ready taint. Returns it, an admin client and the audit log.
pub(crate) fn start_control_plane(
    rt: &tokio::runtime::Runtime,
    tag: &str,
    nodes: usize,
    files: Files<'_>,
) -> anyhow::Result<(ControlPlane, kube::Client, PathBuf)> {
    let dir = controlplane::run_dir(tag);
    // Inside the control plane's directory, which `start` empties before kube-apiserver starts.
    let audit_log = dir.join("audit.log");
    let mut opts = Options::minimal(&dir);
    opts.apiserver_flags = vec![
        format!("--audit-policy-file={}", files.audit_policy.display()),
        format!("--audit-log-path={}", audit_log.display()),
        // Never rotated (0 means lumberjack's default, 100 MB), so one file holds every request.
        "--audit-log-maxsize=1000000".into(),
    ];
    let mut cp = ControlPlane::start(opts).context("starting the reference control plane")?;
    let scheduler_kubeconfig = cp.kubeconfig_for_user("system:kube-scheduler", None)?;
    let mut scheduler_args = vec![
        format!("--kubeconfig={}", scheduler_kubeconfig.display()),
        format!(
            "--authentication-kubeconfig={}",
            scheduler_kubeconfig.display()
        ),
        format!(
            "--authorization-kubeconfig={}",
            scheduler_kubeconfig.display()
        ),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
    ];
    scheduler_args.extend(UNTHROTTLED.iter().map(|s| s.to_string()));
    let scheduler = cp.binaries.path("kube-scheduler");
    cp.spawn_program("kube-scheduler", &scheduler, scheduler_args)?;
    let client = start_ready_kwok_nodes(rt, &mut cp, nodes, files.kwok_config)?;
    Ok((cp, client, audit_log))
}

/// Starts kwok with `nodes` nodes, waits until they are Ready and lifts the not-ready taint the
/// API server puts on every new Node (TaintNodesByCondition; the node lifecycle controller that
/// lifts it runs in no row, so it is lifted here for all alike). Returns an admin client.
pub(crate) fn start_ready_kwok_nodes(
    rt: &tokio::runtime::Runtime,
    cp: &mut ControlPlane,
    nodes: usize,
    kwok_config: &Path,
) -> anyhow::Result<kube::Client> {
    start_kwok(cp, nodes, kwok_config).context("starting kwok")?;
    let client = rt.block_on(cp.client())?;
    rt.block_on(wait_nodes_ready(
        &client,
        nodes,
        Duration::from_secs(60 + nodes as u64 / 5),
    ))?;
    cp.kubectl_run(
        &[
            "taint",
            "nodes",
            "--all",
            "node.kubernetes.io/not-ready:NoSchedule-",
        ],
        None,
    )
    .context("lifting the kwok nodes' not-ready taint")?;
    Ok(client)
}

/// Starts `manager` with `--controllers=<controllers>` (the same names for both managers) and
/// `extra` flags (both managers' own, e.g. `--terminated-pod-gc-threshold=1000`) on `cp`, and
/// returns its flags as the report shows them (no credentials or paths) and its pid.
pub(crate) fn start_manager(
    cp: &mut ControlPlane,
    manager: Manager,
    controllers: &str,
    extra: &[&str],
) -> anyhow::Result<(Vec<String>, u32)> {
    let mut flags = vec![format!("--controllers={controllers}")];
    if manager == Manager::KprAll {
        flags = vec!["--controllers=*".to_string()];
    }
    flags.extend(extra.iter().map(|s| s.to_string()));
    match manager {
        Manager::Kpr | Manager::KprAll => {
            let kubeconfig = kpr_kubeconfig(cp)?;
            let mut args = vec![format!("--kubeconfig={}", kubeconfig.display())];
            args.extend(flags.iter().cloned());
            let program = crate::kpr_binary("controller-manager");
            cp.spawn_program(manager.process(), &program, args)?;
        }
        Manager::Upstream => cp.start_upstream_controller_manager_with(controllers, extra)?,
        Manager::UpstreamUnthrottled => {
            flags.extend(UNTHROTTLED.iter().map(|s| s.to_string()));
            let with: Vec<&str> = UNTHROTTLED.iter().chain(extra).copied().collect();
            cp.start_upstream_controller_manager_with(controllers, &with)?;
        }
    }
    let pid = cp
        .pids()
        .into_iter()
        .find(|(name, _)| name == manager.process())
        .map(|(_, pid)| pid)
        .context("the controller manager's process is not in the control plane's list")?;
    Ok((flags, pid))
}

/// The path and last 20 lines of `manager`'s log on `cp`, for an error message.
pub(crate) fn manager_log_tail(cp: &ControlPlane, manager: Manager) -> String {
    let log = cp.log(manager.process());
    format!(
        "{}:\n{}",
        log.display(),
        controlplane::process::tail(&log, 20)
    )
}

/// kwok as `ControlPlane::start_kwok` runs it, plus `config` and warnings-only logs (at info it
/// logs every lease renewal of every node), managing `nodes` nodes `kwok-node-<i>` created here
/// like that function's (110 Pods each, no taints but the API server's not-ready one).
fn start_kwok(cp: &mut ControlPlane, nodes: usize, config: &Path) -> anyhow::Result<()> {
    let args = vec![
        format!("--kubeconfig={}", cp.admin_kubeconfig().display()),
        format!("--config={}", config.display()),
        "--v=WARN".into(),
        "--manage-all-nodes=false".into(),
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
        "--manage-nodes-with-label-selector=".into(),
        "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom".into(),
        "--disregard-status-with-label-selector=".into(),
        format!("--cidr={}", controlplane::CLUSTER_CIDR),
        "--node-ip=10.0.0.1".into(),
        "--node-lease-duration-seconds=40".into(),
        "--server-address=127.0.0.1:0".into(),
    ];
    let kwok = cp.binaries.path("kwok");
    cp.spawn_program("kwok", &kwok, args)?;
    let items: Vec<serde_json::Value> = (0..nodes)
        .map(|i| {
            let name = format!("kwok-node-{i}");
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                    "kwok.x-k8s.io/node": "fake"},
                    "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                               "kubernetes.io/os": "linux", "type": "kwok"},
                },
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi",
                                    "pods": PODS_PER_NODE.to_string()},
                    "capacity": {"cpu": "32", "memory": "256Gi",
                                 "pods": PODS_PER_NODE.to_string()},
                    "phase": "Running",
                },
            })
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    cp.kubectl_run(&["apply", "-f", "-"], Some(&list.to_string()))
        .context("creating the kwok nodes")?;
    Ok(())
}

/// A kubeconfig for kpr's controller-manager as ServiceAccount `kube-system/kpr-controller-manager`
/// bound to cluster-admin: a token identity in the same API Priority and Fairness level as
/// kube-controller-manager's controllers (an admin certificate would be in `system:masters`,
/// which is exempt from it).
pub(crate) fn kpr_kubeconfig(cp: &ControlPlane) -> anyhow::Result<PathBuf> {
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": KPR_SERVICE_ACCOUNT, "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": KPR_SERVICE_ACCOUNT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": KPR_SERVICE_ACCOUNT,
                       "namespace": "kube-system"}]},
    ]});
    cp.kubectl_run(&["apply", "-f", "-"], Some(&objects.to_string()))
        .context("creating kpr's ServiceAccount and its binding")?;
    let token = cp.service_account_token("kube-system", KPR_SERVICE_ACCOUNT)?;
    cp.kubeconfig_for_token(
        "kpr-controller-manager.kubeconfig",
        &token,
        &cp.server_url(),
    )
}

/// Runs `work` unless a control-plane process dies (checked every second) or `timeout` passes.
pub(crate) async fn guarded<T>(
    cp: &mut ControlPlane,
    timeout: Duration,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let alive = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Err(e) = cp.check_alive() {
                return e;
            }
        }
    };
    tokio::select! {
        r = work => r,
        e = alive => Err(e),
        _ = tokio::time::sleep(timeout) => bail!("not done after {timeout:?}"),
    }
}

/// Makes the writes and waits until the tracker counts `n` Deployments complete at `generation`
/// (its count for an earlier target does not do), printing the count every 30 s. Returns how
/// many had ProgressDeadlineExceeded on the way.
async fn phase(
    what: &str,
    manager: Manager,
    writes: impl std::future::Future<Output = anyhow::Result<()>>,
    mut progress: tokio::sync::watch::Receiver<Progress>,
    (generation, n): (i64, usize),
) -> anyhow::Result<usize> {
    let start = Instant::now();
    let wait = async {
        let mut report = tokio::time::interval(Duration::from_secs(30));
        report.tick().await;
        loop {
            let p = *progress.borrow_and_update();
            if p.generation == generation && p.complete >= n {
                return anyhow::Ok(p.deadline_exceeded);
            }
            tokio::select! {
                changed = progress.changed() => {
                    changed.context("the Deployment watch ended")?;
                }
                _ = report.tick() => println!(
                    "  {}: {what}: {}/{n} Deployments complete after {:.0} s",
                    manager.name(), p.complete, start.elapsed().as_secs_f64()
                ),
            }
        }
    };
    let ((), deadline) = tokio::try_join!(writes, wait)?;
    Ok(deadline)
}

/// A Deployment as `kubectl create deployment NAME --image=IMAGE --replicas=R` makes it.
pub(crate) fn deployment(name: &str, replicas: usize) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": IMAGE}]},
            },
        },
    }))
    .expect("a valid Deployment")
}

/// Waits until `n` Nodes report Ready (kwok initializes them).
async fn wait_nodes_ready(
    client: &kube::Client,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        let ready = nodes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|node| {
                node.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{ready} of {n} kwok nodes Ready after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How many of the namespace's Pods are unscheduled, scheduled but not Ready, Ready, and
/// terminating (or why they could not be listed).
pub(crate) async fn pods_summary(client: &kube::Client, ns: &str) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => return format!("not listed ({e})"),
    };
    let (mut unscheduled, mut not_ready, mut ready, mut terminating) = (0, 0, 0, 0);
    for pod in &pods {
        let is_ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if pod.metadata.deletion_timestamp.is_some() {
            terminating += 1;
        } else if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
        {
            unscheduled += 1;
        } else if is_ready {
            ready += 1;
        } else {
            not_ready += 1;
        }
    }
    format!(
        "{} ({unscheduled} unscheduled, {not_ready} scheduled but not Ready, {ready} Ready, \
         {terminating} terminating)",
        pods.len()
    )
}

/// How many tracked Deployments are complete at the target generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Progress {
    /// The target the counts are for.
    generation: i64,
    complete: usize,
    /// Those that reported ProgressDeadlineExceeded since the target was set.
    deadline_exceeded: usize,
}

/// Watches the namespace's Deployments and publishes how many are complete at the generation
/// `target` holds, re-counted when it changes. Signals `ready` after the first listing.
async fn track(
    api: Api<Deployment>,
    mut target: tokio::sync::watch::Receiver<i64>,
    tx: tokio::sync::watch::Sender<Progress>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut ready = Some(ready);
    let mut rollouts: HashMap<String, Rollout> = HashMap::new();
    let mut complete: HashSet<String> = HashSet::new();
    let mut exceeded: HashSet<String> = HashSet::new();
    let mut generation = *target.borrow_and_update();
    loop {
        let names: Vec<String> = tokio::select! {
            event = stream.try_next() => match event? {
                None => return Ok(()),
                Some(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                    let name = d.metadata.name.clone().unwrap_or_default();
                    rollouts.insert(name.clone(), Rollout::of(&d));
                    vec![name]
                }
                Some(watcher::Event::Delete(d)) => {
                    let name = d.metadata.name.clone().unwrap_or_default();
                    rollouts.remove(&name);
                    vec![name]
                }
                Some(watcher::Event::Init) => Vec::new(),
                Some(watcher::Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                    Vec::new()
                }
            },
            changed = target.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                generation = *target.borrow_and_update();
                complete.clear();
                exceeded.clear();
                rollouts.keys().cloned().collect()
            }
        };
        for name in names {
            match rollouts.get(&name).map(|r| r.status(generation)) {
                Some(Status::Complete) => {
                    complete.insert(name);
                }
                Some(Status::DeadlineExceeded) => {
                    complete.remove(&name);
                    exceeded.insert(name);
                }
                Some(Status::Waiting) | None => {
                    complete.remove(&name);
                }
            }
        }
        let now = Progress {
            generation,
            complete: complete.len(),
            deadline_exceeded: exceeded.len(),
        };
        tx.send_if_modified(|p| std::mem::replace(p, now) != now);
    }
}

/// What `kubectl rollout status` looks at in a Deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Rollout {
    generation: i64,
    observed_generation: i64,
    spec_replicas: Option<i32>,
    replicas: i32,
    updated_replicas: i32,
    available_replicas: i32,
    deadline_exceeded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Waiting,
    Complete,
    DeadlineExceeded,
}

impl Rollout {
    fn of(d: &Deployment) -> Rollout {
        let status = d.status.clone().unwrap_or_default();
        Rollout {
            generation: d.metadata.generation.unwrap_or_default(),
            observed_generation: status.observed_generation.unwrap_or_default(),
            spec_replicas: d.spec.as_ref().and_then(|s| s.replicas),
            replicas: status.replicas.unwrap_or_default(),
            updated_replicas: status.updated_replicas.unwrap_or_default(),
            available_replicas: status.available_replicas.unwrap_or_default(),
            deadline_exceeded: status.conditions.iter().flatten().any(|c| {
                c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
            }),
        }
    }

    /// kubectl's DeploymentStatusViewer, for a Deployment whose spec is at generation `target`
    /// or later: its status must be observed at its generation, then a progress deadline exceeded
    /// is a failure, and it is complete once every replica is updated, no old one is left and
    /// every updated one is available.
    fn status(&self, target: i64) -> Status {
        if self.generation < target || self.observed_generation < self.generation {
            return Status::Waiting;
        }
        if self.deadline_exceeded {
            return Status::DeadlineExceeded;
        }
        let complete = self
            .spec_replicas
            .is_none_or(|want| self.updated_replicas >= want)
            && self.replicas <= self.updated_replicas
            && self.available_replicas >= self.updated_replicas;
        if complete {
            Status::Complete
        } else {
            Status::Waiting
        }
    }
}

/// The fields of an audit event the count needs.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    user: AuditUser,
    object_ref: Option<AuditObject>,
    response_status: Option<AuditStatus>,
    request_received_timestamp: Timestamp,
}

#[derive(Debug, Deserialize)]
struct AuditUser {
    username: String,
}

#[derive(Debug, Deserialize)]
struct AuditObject {
    resource: Option<String>,
    subresource: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AuditStatus {
    code: Option<u16>,
}

/// Reads the audit log (one control plane's: only the measured manager's identities are logged).
pub(crate) fn count_requests(path: &Path, bounds: [Timestamp; 3]) -> anyhow::Result<Requests> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    count_events(&text, bounds).with_context(|| format!("in {}", path.display()))
}

/// Counts requests (distinct audit IDs; a watch logs twice) by phase, bounded by the times the
/// create phase started, the rolling update started and it was done.
fn count_events(text: &str, [create, update, done]: [Timestamp; 3]) -> anyhow::Result<Requests> {
    let mut seen = HashSet::new();
    let mut r = Requests::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: AuditEvent =
            serde_json::from_str(line).with_context(|| format!("audit event on line {}", i + 1))?;
        if !seen.insert(e.audit_id) {
            continue;
        }
        let t = e.request_received_timestamp;
        let bucket = if t < create {
            &mut r.startup
        } else if t < update {
            &mut r.create
        } else if t < done {
            &mut r.rolling_update
        } else {
            &mut r.after
        };
        *bucket += 1;
        r.total += 1;
        *r.by_user.entry(e.user.username).or_default() += 1;
        let resource = match e.object_ref {
            Some(AuditObject {
                resource: Some(res),
                subresource: Some(sub),
            }) => format!("{res}/{sub}"),
            Some(AuditObject {
                resource: Some(res),
                ..
            }) => res,
            // Discovery and other non-resource URLs.
            _ => "(non-resource)".into(),
        };
        *r.by_kind
            .entry(format!("{} {resource}", e.verb))
            .or_default() += 1;
        if let Some(code) = e.response_status.and_then(|s| s.code) {
            if !(200..300).contains(&code) {
                *r.failed_by_code.entry(code).or_default() += 1;
            }
        }
    }
    Ok(r)
}

/// utime + stime of process `pid`, in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    stat_seconds(pid, CpuTimes::Own)
}

/// utime + stime + cutime + cstime of process `pid` (its own CPU and that of the children it
/// has waited for, such as kube-proxy's iptables-restore runs), in seconds.
pub(crate) fn cpu_seconds_with_children(pid: u32) -> anyhow::Result<f64> {
    stat_seconds(pid, CpuTimes::WithChildren)
}

/// Which CPU times of /proc/PID/stat to add up.
#[derive(Clone, Copy)]
enum CpuTimes {
    /// utime, stime (fields 14 and 15).
    Own,
    /// utime, stime, cutime, cstime (fields 14 to 17).
    WithChildren,
}

fn stat_seconds(pid: u32, times: CpuTimes) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat, times)
        .map(|ticks| ticks as f64 / clock_ticks())
        .with_context(|| format!("no CPU times in /proc/{pid}/stat: {stat}"))
}

/// The CPU time fields of /proc/PID/stat, added up (counted after the parenthesized command,
/// which may hold spaces).
fn parse_cpu_ticks(stat: &str, times: CpuTimes) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let count = match times {
        CpuTimes::Own => 2,
        CpuTimes::WithChildren => 4,
    };
    fields
        .get(11..11 + count)?
        .iter()
        .map(|f| f.parse::<u64>().ok())
        .sum()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// VmHWM of process `pid`, in KiB.
pub(crate) fn vm_hwm_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no VmHWM in /proc/{pid}/status"))
}

/// Request kinds named in the markdown summary (all of them are in the JSON).
const TOP_KINDS: usize = 10;

/// The table and the request breakdown, as printed and as written to controllers.md.
pub fn markdown(b: &WorkloadBench) -> String {
    let mut s = String::new();
    let z = b.sizes;
    writeln!(s, "Command: `{}`  \nKernel: {}  \nDate: {}  \nTree: {}  \nKubernetes {} (kube-apiserver, kube-scheduler, kube-controller-manager), {} Deployments x {} replicas on {} kwok nodes\n",
        b.command, b.kernel, b.date, b.commit, b.kubernetes, z.deployments, z.replicas, z.nodes).unwrap();
    s.push_str("| controller manager | ready (s) | create: all complete (s) | rolling update: all complete (s) | API requests: create + update (all) | CPU (s) | peak memory (MiB) |\n|---|---|---|---|---|---|---|\n");
    for r in &b.runs {
        let secs = |p: &Option<Phase>| {
            p.as_ref()
                .map_or("-".into(), |p| format!("{:.1}", p.seconds))
        };
        let requests = r.requests.as_ref().map_or("-".into(), |q| {
            format!(
                "{} + {} = {} ({})",
                q.create,
                q.rolling_update,
                q.work(),
                q.total
            )
        });
        let opt = |v: Option<f64>, d: usize| v.map_or("-".into(), |v| format!("{v:.d$}"));
        match &r.error {
            Some(e) => writeln!(
                s,
                "| {} | FAILED: {} |||||| ",
                r.manager,
                e.replace('|', "/").replace('\n', " ")
            )
            .unwrap(),
            None => writeln!(
                s,
                "| {} | {} | {} | {} | {requests} | {} | {} |",
                r.manager,
                opt(r.ready_seconds, 1),
                secs(&r.create),
                secs(&r.rolling_update),
                opt(r.cpu_seconds, 1),
                opt(r.peak_memory_mib, 1),
            )
            .unwrap(),
        }
    }
    for r in &b.runs {
        let Some(q) = &r.requests else { continue };
        let (kinds, failed) = kinds_summary(q);
        writeln!(
            s,
            "\n{}: {} requests in all ({} before the first create, {} after the rolling update was complete); {}; not 2xx: {}.",
            r.manager,
            q.total,
            q.startup,
            q.after,
            kinds,
            failed
        )
        .unwrap();
        for (what, p) in [("create", &r.create), ("rolling update", &r.rolling_update)] {
            if let Some(p) = p.as_ref().filter(|p| p.deadline_exceeded > 0) {
                writeln!(s, "\n{}: {what}: {} Deployments reported ProgressDeadlineExceeded on the way (`kubectl rollout status` fails on those).", r.manager, p.deadline_exceeded).unwrap();
            }
        }
    }
    s
}

/// The most frequent request kinds (`verb resource N`, the rest summed) and the responses that
/// were not 2xx (`code: N`, or "none"), as the markdown summaries print them.
pub(crate) fn kinds_summary(q: &Requests) -> (String, String) {
    let mut kinds: Vec<(&String, &u64)> = q.by_kind.iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    // The most frequent kinds; the rest (mostly one list and one watch per resource for the
    // garbage collector's graph) summed.
    let rest: u64 = kinds.iter().skip(TOP_KINDS).map(|(_, n)| **n).sum();
    let mut kinds: Vec<String> = kinds
        .iter()
        .take(TOP_KINDS)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    if rest > 0 {
        kinds.push(format!(
            "{rest} more of {} other kinds",
            q.by_kind.len() - TOP_KINDS
        ));
    }
    let failed: Vec<String> = q
        .failed_by_code
        .iter()
        .map(|(code, n)| format!("{code}: {n}"))
        .collect();
    let failed = if failed.is_empty() {
        "none".to_string()
    } else {
        failed.join(", ")
    };
    (kinds.join(", "), failed)
}

/// Prints the table and writes controllers.json and controllers.md.
fn write(b: &WorkloadBench, out_dir: &Path) -> anyhow::Result<()> {
    let md = markdown(b);
    println!("\n{md}");
    for (file, text) in [
        (JSON_FILE, serde_json::to_string_pretty(b)?),
        (MARKDOWN_FILE, md),
    ] {
        let path = out_dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_status_as_kubectl_decides() {
        let done = Rollout {
            generation: 2,
            observed_generation: 2,
            spec_replicas: Some(10),
            replicas: 10,
            updated_replicas: 10,
            available_replicas: 10,
            deadline_exceeded: false,
        };
        let cases = [
            (
                "complete at the target generation",
                done,
                2,
                Status::Complete,
            ),
            ("complete beyond the target", done, 1, Status::Complete),
            (
                "spec older than the target",
                Rollout {
                    generation: 1,
                    observed_generation: 1,
                    ..done
                },
                2,
                Status::Waiting,
            ),
            (
                "status not observed at the spec's generation",
                Rollout {
                    observed_generation: 1,
                    ..done
                },
                2,
                Status::Waiting,
            ),
            (
                "not every replica updated",
                Rollout {
                    updated_replicas: 9,
                    replicas: 9,
                    available_replicas: 9,
                    ..done
                },
                2,
                Status::Waiting,
            ),
            (
                "old replicas pending termination",
                Rollout {
                    replicas: 12,
                    ..done
                },
                2,
                Status::Waiting,
            ),
            (
                "updated replicas not all available",
                Rollout {
                    available_replicas: 8,
                    ..done
                },
                2,
                Status::Waiting,
            ),
            (
                "progress deadline exceeded",
                Rollout {
                    deadline_exceeded: true,
                    updated_replicas: 3,
                    ..done
                },
                2,
                Status::DeadlineExceeded,
            ),
            (
                "no spec.replicas: only old and available replicas count",
                Rollout {
                    spec_replicas: None,
                    updated_replicas: 10,
                    ..done
                },
                2,
                Status::Complete,
            ),
        ];
        for (name, rollout, target, want) in cases {
            assert_eq!(rollout.status(target), want, "{name}");
        }
    }

    fn event(id: &str, user: &str, verb: &str, resource: &str, code: u16, at: &str) -> String {
        let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
        let mut object = json!({"resource": res, "namespace": "bench"});
        if !sub.is_empty() {
            object["subresource"] = json!(sub);
        }
        json!({"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
               "auditID": id, "stage": "ResponseComplete", "verb": verb,
               "user": {"username": user, "groups": ["system:serviceaccounts"]},
               "objectRef": object, "responseStatus": {"metadata": {}, "code": code},
               "requestReceivedTimestamp": at, "stageTimestamp": at})
        .to_string()
    }

    #[test]
    fn requests_counted_once_each_by_phase() {
        let rs = "system:serviceaccount:kube-system:replicaset-controller";
        let kcm = "system:kube-controller-manager";
        let mut watch_started = event("w", kcm, "watch", "pods", 200, "2026-01-01T00:00:00.5Z");
        watch_started = watch_started.replace("ResponseComplete", "ResponseStarted");
        let log = [
            watch_started,
            event(
                "a",
                rs,
                "create",
                "pods",
                201,
                "2026-01-01T00:00:10.000001Z",
            ),
            event(
                "b",
                rs,
                "update",
                "replicasets/status",
                409,
                "2026-01-01T00:00:19.9Z",
            ),
            event("c", rs, "delete", "pods", 200, "2026-01-01T00:00:20Z"),
            // The watch's end, logged again under the same audit ID.
            event("w", kcm, "watch", "pods", 200, "2026-01-01T00:00:00.5Z"),
            event(
                "d",
                rs,
                "update",
                "replicasets/status",
                200,
                "2026-01-01T00:00:31Z",
            ),
            String::new(),
        ]
        .join("\n");
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let bounds = [
            at("2026-01-01T00:00:10Z"),
            at("2026-01-01T00:00:20Z"),
            at("2026-01-01T00:00:30Z"),
        ];
        let r = count_events(&log, bounds).unwrap();
        let want = Requests {
            startup: 1,
            create: 2,
            rolling_update: 1,
            after: 1,
            total: 5,
            by_user: BTreeMap::from([(kcm.to_string(), 1), (rs.to_string(), 4)]),
            by_kind: BTreeMap::from([
                ("create pods".to_string(), 1),
                ("delete pods".to_string(), 1),
                ("update replicasets/status".to_string(), 2),
                ("watch pods".to_string(), 1),
            ]),
            failed_by_code: BTreeMap::from([(409, 1)]),
        };
        assert_eq!(r, want);
        assert_eq!(r.work(), 3);
    }

    #[test]
    fn cpu_ticks_after_a_command_with_spaces() {
        let stat = "4242 (kube controller) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 8 0 10 100 10";
        assert_eq!(parse_cpu_ticks(stat, CpuTimes::Own), Some(1290));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1", CpuTimes::Own), None);
        // With the waited-for children's cutime and cstime (fields 16 and 17).
        let stat = "4242 (kube-proxy) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 700 8 20 0 8 0 10 100 10";
        assert_eq!(parse_cpu_ticks(stat, CpuTimes::Own), Some(1290));
        assert_eq!(parse_cpu_ticks(stat, CpuTimes::WithChildren), Some(1998));
        assert_eq!(
            parse_cpu_ticks(
                "4242 (x) S 1 2 3 4 5 6 7 8 9 10 11 12",
                CpuTimes::WithChildren
            ),
            None
        );
    }
}
