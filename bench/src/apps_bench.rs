//! The apps row (`cargo xtask bench --apps`): the Job, DaemonSet, StatefulSet and CronJob controllers of
//! kpr's `controller-manager` next to kube-controller-manager's, on the same reference control
//! plane as the workload controllers row ([`workload_controllers`]: etcd, kube-apiserver with
//! the audit policy, kube-scheduler with its client limit lifted, kwok nodes whose Pods become
//! Running and Ready without containers, and Job Pods Succeeded: kwok's default Pod stages
//! complete every running Pod a Job owns).
//!
//! Workloads ([`Workload`]), each measured per controller manager started with only its
//! controller (`--controllers=job`, `daemonset`, `statefulset`, `cronjob`, `podgc`,
//! `resourcequota` or `horizontalpodautoscaling`, the same names in both):
//! - jobs: N Jobs of C completions with parallelism P created at once; the clock runs until every
//!   Job has the Complete condition.
//! - daemonset: one DaemonSet over every kwok node (M); the clock runs until M Pods are updated
//!   and available; then its template changes (RollingUpdate, maxUnavailable 10 %) and the clock
//!   runs until M Pods are updated and available again.
//! - statefulset: S StatefulSets of R replicas (OrderedReady) created at once; the clock runs
//!   until every one has R ready replicas at one revision.
//! - cronjobs: C CronJobs scheduled every minute, created just after a minute starts; the clock
//!   runs from the next minute (their first scheduled time) until every one has created its Job
//!   and recorded lastScheduleTime. No warm-up object: the controller has most of a minute to
//!   sync before the first scheduled time, and a CronJob could not prove it sooner. `--quick`
//!   leaves it out of the default workloads (it waits for a minute); naming it runs it.
//! - podgc: N terminated Pods created before the manager starts with `--controllers=podgc` and
//!   `--terminated-pod-gc-threshold=T`; the clock runs from its start until T are left. Always on a
//!   control plane of its own, even with `--quick` ([`super::apps_podgc`] runs it).
//! - quota: N objects (Pods, ConfigMaps, Secrets) and three ResourceQuotas created before the
//!   manager starts with `--controllers=resourcequota`; the clock runs from its start until every
//!   quota's usage is recorded, then from deleting a tenth of them until the usage shows it.
//!   Always on a control plane of its own ([`super::apps_quota`]).
//! - hpa: N Deployments with their Pods and N autoscalers over a scripted metrics API; ready is
//!   every autoscaler's first decision, then the clock runs from the Pods' usage doubling until
//!   every Deployment is scaled up, and from its dropping until every one is scaled down.
//!   Always on a control plane of its own ([`super::apps_hpa`]).
//!
//! "Done" is what `kubectl rollout status` (or `kubectl wait --for=condition=Complete` for a Job)
//! decides, seen through a watch. At full size every workload gets a fresh control plane and
//! manager of its own, so the manager's start-up, CPU and peak memory are that workload's; with
//! `--quick` one control plane per manager runs every workload in turn (its manager started with
//! all their controllers) to keep the smoke short, and requests and CPU are counted per workload
//! by the phases' time windows (peak memory is then the manager's so far).
//!
//! Requests, CPU and memory are read as the workload controllers row reads them (audit log per
//! identity, /proc/PID/stat, VmHWM), by that module's functions.
//!
//! Owns: its control planes, `target/bench/apps.json` and `apps.md`. Touches nothing else.

use std::collections::HashMap;
use std::fmt::Debug;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::ControlPlane;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use super::workload_controllers::{
    self as wc, count_requests, cpu_seconds, guarded, kinds_summary, pods_summary, vm_hwm_kib,
    Files, Manager, Requests, IMAGE, NEW_IMAGE, WRITE_CONCURRENCY,
};
use super::BenchArgs;

/// The sizes: 1,000 Jobs x 5 completions (parallelism 5), a DaemonSet over 1,000 kwok
/// nodes, 100 StatefulSets x 3 replicas.
pub const JOBS: usize = 1_000;
pub const JOB_COMPLETIONS: usize = 5;
pub const DAEMONSET_NODES: usize = 1_000;
pub const STATEFULSETS: usize = 100;
pub const STATEFULSET_REPLICAS: usize = 3;
pub const CRONJOBS: usize = 1_000;
/// 10,000 terminated Pods; kube-controller-manager's `--terminated-pod-gc-threshold` set to
/// 1,000 for both managers.
pub const PODGC_PODS: usize = 10_000;
pub const PODGC_THRESHOLD: usize = 1_000;
/// The quota size: 10,000 objects under three ResourceQuotas.
pub const QUOTA_OBJECTS: usize = 10_000;
/// The autoscaler count: 1,000 HorizontalPodAutoscalers, one per Deployment.
pub const HPA_AUTOSCALERS: usize = 1_000;
/// `--quick`: a smoke of each workload.
const QUICK: Sizes = Sizes {
    jobs: 3,
    job_completions: 2,
    job_parallelism: 2,
    daemonset_nodes: 3,
    statefulsets: 2,
    statefulset_replicas: 2,
    cronjobs: 2,
    podgc_pods: 20,
    podgc_threshold: 10,
    quota_objects: 20,
    hpa_autoscalers: 3,
    hpa_sync_seconds: 1,
};
/// The DaemonSet's rolling update's maxUnavailable.
const DAEMONSET_MAX_UNAVAILABLE: &str = "10%";
/// Pods placed per kwok node when sizing the Job and StatefulSet clusters (a node holds
/// [`wc::PODS_PER_NODE`]; the rest is headroom for the warm-up objects).
const PODS_PER_NODE_PLANNED: usize = 100;
/// The managers measured unless `--apps-managers` says otherwise (kube-controller-manager at its
/// default client limit, `upstream`, can be added: it spends most of its time waiting on it).
pub const MANAGERS: &str = "kpr,upstream-unthrottled";

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sizes {
    pub jobs: usize,
    pub job_completions: usize,
    pub job_parallelism: usize,
    pub daemonset_nodes: usize,
    pub statefulsets: usize,
    pub statefulset_replicas: usize,
    pub cronjobs: usize,
    pub podgc_pods: usize,
    pub podgc_threshold: usize,
    pub quota_objects: usize,
    pub hpa_autoscalers: usize,
    /// Both managers' `--horizontal-pod-autoscaler-sync-period`, in seconds.
    pub hpa_sync_seconds: usize,
}

impl Sizes {
    /// The sizes the flags ask for (`--quick`: the smoke size); each must be at least 1.
    pub fn from_args(args: &BenchArgs) -> anyhow::Result<Sizes> {
        if args.quick {
            return Ok(QUICK);
        }
        let sizes = Sizes {
            jobs: args.jobs,
            job_completions: args.job_completions,
            job_parallelism: args.job_parallelism,
            daemonset_nodes: args.daemonset_nodes,
            statefulsets: args.statefulsets,
            statefulset_replicas: args.statefulset_replicas,
            cronjobs: args.cronjobs,
            podgc_pods: args.podgc_pods,
            podgc_threshold: args.podgc_threshold,
            quota_objects: args.quota_objects,
            hpa_autoscalers: args.hpa_autoscalers,
            hpa_sync_seconds: args.hpa_sync_period,
        };
        for (flag, v) in [
            ("--jobs", sizes.jobs),
            ("--job-completions", sizes.job_completions),
            ("--job-parallelism", sizes.job_parallelism),
            ("--daemonset-nodes", sizes.daemonset_nodes),
            ("--statefulsets", sizes.statefulsets),
            ("--statefulset-replicas", sizes.statefulset_replicas),
            ("--cronjobs", sizes.cronjobs),
            ("--podgc-pods", sizes.podgc_pods),
            ("--podgc-threshold", sizes.podgc_threshold),
            ("--quota-objects", sizes.quota_objects),
            ("--hpa-autoscalers", sizes.hpa_autoscalers),
            ("--hpa-sync-period", sizes.hpa_sync_seconds),
        ] {
            if v == 0 {
                bail!("{flag} 0: must be at least 1");
            }
        }
        if sizes.podgc_threshold >= sizes.podgc_pods {
            bail!(
                "--podgc-threshold {} must be below --podgc-pods {}: nothing would be collected",
                sizes.podgc_threshold,
                sizes.podgc_pods
            );
        }
        Ok(sizes)
    }
}

/// One measured workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Jobs,
    DaemonSet,
    StatefulSet,
    CronJobs,
    PodGc,
    Quota,
    Hpa,
}

impl Workload {
    /// `--apps-workloads` values, in the order they run by default.
    pub const NAMES: &[&str] = &[
        "jobs",
        "daemonset",
        "statefulset",
        "cronjobs",
        "podgc",
        "quota",
        "hpa",
    ];

    pub fn parse(name: &str) -> anyhow::Result<Workload> {
        match name.trim() {
            "jobs" | "job" => Ok(Workload::Jobs),
            "daemonset" | "daemonsets" => Ok(Workload::DaemonSet),
            "statefulset" | "statefulsets" => Ok(Workload::StatefulSet),
            "cronjobs" | "cronjob" => Ok(Workload::CronJobs),
            "podgc" => Ok(Workload::PodGc),
            "quota" | "resourcequota" => Ok(Workload::Quota),
            "hpa" | "horizontalpodautoscaling" => Ok(Workload::Hpa),
            other => bail!(
                "--apps-workloads: unknown workload {other:?} (known: {})",
                Workload::NAMES.join(", ")
            ),
        }
    }

    pub(crate) fn tag(self) -> &'static str {
        match self {
            Workload::Jobs => "jobs",
            Workload::DaemonSet => "daemonset",
            Workload::StatefulSet => "statefulset",
            Workload::CronJobs => "cronjobs",
            Workload::PodGc => "podgc",
            Workload::Quota => "quota",
            Workload::Hpa => "hpa",
        }
    }

    /// Its controller's name in both managers' `--controllers`.
    fn controller(self) -> &'static str {
        match self {
            Workload::Jobs => "job",
            Workload::DaemonSet => "daemonset",
            Workload::StatefulSet => "statefulset",
            Workload::CronJobs => "cronjob",
            Workload::PodGc => "podgc",
            Workload::Quota => "resourcequota",
            Workload::Hpa => "horizontalpodautoscaling",
        }
    }

    /// What is created, as the table says it.
    pub(crate) fn describe(self, z: &Sizes, nodes: usize) -> String {
        match self {
            Workload::Jobs => format!(
                "{} Jobs x {} completions (parallelism {})",
                z.jobs, z.job_completions, z.job_parallelism
            ),
            Workload::DaemonSet => format!(
                "1 DaemonSet over {nodes} nodes, then a rolling update (maxUnavailable {})",
                DAEMONSET_MAX_UNAVAILABLE
            ),
            Workload::StatefulSet => format!(
                "{} StatefulSets x {} replicas (OrderedReady)",
                z.statefulsets, z.statefulset_replicas
            ),
            Workload::CronJobs => format!(
                "{} CronJobs every minute; done: seconds from the scheduled minute to every Job \
                 created",
                z.cronjobs
            ),
            Workload::PodGc => format!(
                "{} terminated Pods, --terminated-pod-gc-threshold={}; done: seconds from the \
                 manager's start to {} left",
                z.podgc_pods, z.podgc_threshold, z.podgc_threshold
            ),
            Workload::Quota => format!(
                "{} objects (half Pods, a quarter ConfigMaps, the rest Secrets) under 3 \
                 ResourceQuotas; done: seconds from the manager's start to every usage \
                 recorded; second phase: a tenth of the Pods and ConfigMaps deleted, to the \
                 usage showing it",
                z.quota_objects
            ),
            Workload::Hpa => format!(
                "{} autoscalers over {} Deployments of {} Pods, sync period {} s; ready: to \
                 every first decision; done: usage 50 -> 100 %, to all scaled to {}; second \
                 phase: 100 -> 25 %, to all scaled to 1",
                z.hpa_autoscalers,
                z.hpa_autoscalers,
                super::apps_hpa::REPLICAS,
                z.hpa_sync_seconds,
                2 * super::apps_hpa::REPLICAS
            ),
        }
    }

    /// The kwok nodes it needs: the DaemonSet's size, or room for every Pod the others create
    /// (a Job's finished Pods are kept, so all its completions count).
    fn nodes(self, z: &Sizes) -> usize {
        match self {
            Workload::Jobs => (z.jobs * z.job_completions).div_ceil(PODS_PER_NODE_PLANNED),
            Workload::DaemonSet => z.daemonset_nodes,
            Workload::StatefulSet => {
                (z.statefulsets * z.statefulset_replicas).div_ceil(PODS_PER_NODE_PLANNED)
            }
            // Its Jobs are not run: no Job controller is started.
            Workload::CronJobs => 1,
            // Its Pods are bound to a Node kwok does not manage (`apps_podgc`).
            Workload::PodGc | Workload::Quota | Workload::Hpa => 1,
        }
        .max(1)
    }

    /// Whether it needs a control plane of its own even with `--quick`: podgc's Pods exist
    /// before its manager starts, and every terminated Pod counts toward the threshold (another
    /// workload's finished Pods would be collected with them); quota counts every object of its
    /// namespace from the manager's start; hpa serves a metrics API of its own.
    pub(crate) fn own_control_plane(self) -> bool {
        matches!(self, Workload::PodGc | Workload::Quota | Workload::Hpa)
    }

    /// Pods it creates (the bound of its phases' timeout).
    fn pods(self, z: &Sizes) -> usize {
        match self {
            Workload::Jobs => z.jobs * z.job_completions,
            Workload::DaemonSet => 2 * z.daemonset_nodes,
            Workload::StatefulSet => z.statefulsets * z.statefulset_replicas,
            Workload::CronJobs => 0,
            Workload::PodGc => z.podgc_pods,
            Workload::Quota => z.quota_objects / 2,
            Workload::Hpa => z.hpa_autoscalers * super::apps_hpa::REPLICAS as usize,
        }
    }
}

/// What to run: sizes, workloads and managers, from the flags.
#[derive(Debug, Clone)]
pub struct Plan {
    pub sizes: Sizes,
    pub workloads: Vec<Workload>,
    pub managers: Vec<Manager>,
    /// One control plane per manager for every workload (`--quick`), or one per workload.
    pub shared: bool,
}

impl Plan {
    pub fn from_args(args: &BenchArgs) -> anyhow::Result<Plan> {
        let workloads = args
            .apps_workloads
            .iter()
            .map(|w| Workload::parse(w))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let managers = args
            .apps_managers
            .iter()
            .map(|m| Manager::parse(m).context("--apps-managers"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if workloads.is_empty() || managers.is_empty() {
            bail!("--apps-workloads and --apps-managers must each name at least one");
        }
        let mut workloads = workloads;
        let defaults = args.apps_workloads.join(",") == Workload::NAMES.join(",");
        if args.quick && defaults {
            // A smoke must not wait for a minute to start.
            workloads.retain(|&w| w != Workload::CronJobs);
        }
        Ok(Plan {
            sizes: Sizes::from_args(args)?,
            workloads,
            managers,
            shared: args.quick,
        })
    }
}

/// The command that reproduces a run (as the report shows it).
pub fn command(args: &BenchArgs, plan: &Plan) -> String {
    let mut command = String::from("cargo xtask bench");
    if args.apps {
        command.push_str(" --apps");
    }
    if args.quick {
        command.push_str(" --quick");
    } else {
        let z = plan.sizes;
        write!(
            command,
            " --jobs {} --job-completions {} --job-parallelism {} --daemonset-nodes {} \
             --statefulsets {} --statefulset-replicas {} --cronjobs {} --podgc-pods {} \
             --podgc-threshold {} --quota-objects {} --hpa-autoscalers {} --hpa-sync-period {}",
            z.jobs,
            z.job_completions,
            z.job_parallelism,
            z.daemonset_nodes,
            z.statefulsets,
            z.statefulset_replicas,
            z.cronjobs,
            z.podgc_pods,
            z.podgc_threshold,
            z.quota_objects,
            z.hpa_autoscalers,
            z.hpa_sync_seconds
        )
        .unwrap();
    }
    if args.apps_workloads.len() != Workload::NAMES.len() {
        write!(
            command,
            " --apps-workloads {}",
            args.apps_workloads.join(",")
        )
        .unwrap();
    }
    if args.apps_managers.join(",") != MANAGERS {
        write!(command, " --apps-managers {}", args.apps_managers.join(",")).unwrap();
    }
    command
}

/// The output files, under `out_dir`.
pub const JSON_FILE: &str = "apps.json";
pub const MARKDOWN_FILE: &str = "apps.md";

/// Every run, with what the report needs to say how and where it was measured.
#[derive(Debug, Clone, Serialize)]
pub struct AppsBench {
    pub command: String,
    pub sizes: Sizes,
    /// One control plane per manager for every workload (`--quick`).
    pub shared: bool,
    pub kubernetes: String,
    pub kernel: String,
    pub date: String,
    pub commit: String,
    pub runs: Vec<AppsRun>,
}

/// One workload under one controller manager.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AppsRun {
    pub workload: String,
    /// What was created.
    pub what: String,
    pub manager: String,
    /// Its command line, minus credentials and paths.
    pub flags: Vec<String>,
    pub nodes: usize,
    /// Process start to the warm-up objects done.
    pub ready_seconds: Option<f64>,
    /// The timed phases, in order.
    pub phases: Vec<Phase>,
    /// Its requests: `create` counts the first phase, `rolling_update` the second.
    pub requests: Option<Requests>,
    /// The manager's peak memory (VmHWM) when the last phase was done.
    pub peak_memory_mib: Option<f64>,
    /// What was checked of the outcome beyond the clock's condition (podgc: which Pods were kept).
    pub check: Option<String>,
    pub error: Option<String>,
}

/// One timed phase.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    pub seconds: f64,
    /// The manager's CPU seconds during the phase.
    pub cpu_seconds: f64,
}

/// Runs every workload under every manager, writes apps.json and apps.md under `out_dir` and
/// prints the table. A run that fails is reported in its row (and returned in the error list)
/// without stopping the others.
pub fn run(
    plan: &Plan,
    out_dir: &Path,
    command: String,
) -> anyhow::Result<(AppsBench, Vec<String>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (policy, kwok_config) = wc::write_config_files(out_dir)?;
    let files = Files {
        audit_policy: &policy,
        kwok_config: &kwok_config,
    };
    let mut bench = AppsBench {
        command,
        sizes: plan.sizes,
        shared: plan.shared,
        kubernetes: controlplane::kubernetes_version().into(),
        kernel: super::report::read_trim("/proc/sys/kernel/osrelease"),
        date: super::report::now_utc(),
        commit: super::report::tree_state(),
        runs: Vec::new(),
    };
    let mut failures = Vec::new();
    for workloads in &sessions(plan) {
        for &manager in &plan.managers {
            let runs = session(&rt, manager, workloads, plan.sizes, files);
            for r in &runs {
                if let Some(e) = &r.error {
                    failures.push(format!("apps, {}, {}: {e}", r.workload, r.manager));
                }
            }
            bench.runs.extend(runs);
        }
    }
    write(&bench, out_dir)?;
    Ok((bench, failures))
}

/// The workloads each control plane runs: all on one (`--quick`) or one each; podgc, quota and
/// hpa always have one of their own each ([`Workload::own_control_plane`]).
fn sessions(plan: &Plan) -> Vec<Vec<Workload>> {
    if !plan.shared {
        return plan.workloads.iter().map(|&w| vec![w]).collect();
    }
    let (own, rest): (Vec<Workload>, Vec<Workload>) =
        plan.workloads.iter().partition(|w| w.own_control_plane());
    std::iter::once(rest)
        .chain(own.into_iter().map(|w| vec![w]))
        .filter(|s| !s.is_empty())
        .collect()
}

/// A workload that has a control plane of its own ([`Workload::own_control_plane`]) under
/// `manager`: its row, with the error in it when it failed.
fn own_session(
    rt: &tokio::runtime::Runtime,
    manager: Manager,
    w: Workload,
    z: Sizes,
    files: Files<'_>,
) -> AppsRun {
    let mut run = AppsRun {
        workload: w.tag().into(),
        what: w.describe(&z, 1),
        manager: manager.name().into(),
        nodes: 1,
        ..AppsRun::default()
    };
    println!("bench: apps, {}: {}", manager.name(), run.what);
    let measured = match w {
        Workload::PodGc => super::apps_podgc::measure(rt, manager, z, files, &mut run),
        Workload::Quota => super::apps_quota::measure(rt, manager, z, files, &mut run),
        Workload::Hpa => super::apps_hpa::measure(rt, manager, z, files, &mut run),
        _ => Err(anyhow::anyhow!("{} shares its control plane", w.tag())),
    };
    if let Err(e) = measured {
        run.error = Some(format!("{e:#}"));
    }
    run
}

/// One control plane and manager running `workloads` in turn; one row each.
fn session(
    rt: &tokio::runtime::Runtime,
    manager: Manager,
    workloads: &[Workload],
    sizes: Sizes,
    files: Files<'_>,
) -> Vec<AppsRun> {
    if let [w] = *workloads {
        if w.own_control_plane() {
            return vec![own_session(rt, manager, w, sizes, files)];
        }
    }
    let nodes = workloads.iter().map(|w| w.nodes(&sizes)).max().unwrap_or(1);
    let mut runs: Vec<AppsRun> = workloads
        .iter()
        .map(|&w| AppsRun {
            workload: w.tag().into(),
            what: w.describe(&sizes, nodes),
            manager: manager.name().into(),
            nodes,
            ..AppsRun::default()
        })
        .collect();
    let names: Vec<&str> = workloads.iter().map(|w| w.tag()).collect();
    println!(
        "bench: apps, {}: {} on {nodes} kwok nodes",
        manager.name(),
        names.join(", ")
    );
    // Row `failed` failed with `e`; the later ones of the session never ran.
    let fail = |runs: &mut [AppsRun], failed: usize, e: anyhow::Error| {
        runs[failed].error = Some(format!("{e:#}"));
        for r in &mut runs[failed + 1..] {
            r.error = Some("not run: an earlier workload on its control plane failed".into());
        }
    };
    let tag = format!("apps-{}-{}", names.join("-"), manager.tag());
    let mut s = match Session::start(rt, manager, workloads, nodes, files, &tag) {
        Ok(s) => s,
        Err(e) => {
            // The start-up serves every row alike.
            let e = format!("{e:#}");
            for r in &mut runs {
                r.error = Some(e.clone());
            }
            return runs;
        }
    };
    for (r, w) in runs.iter_mut().zip(workloads) {
        r.flags.clone_from(&s.flags);
        // A CronJob has no warm-up: its row has no readiness to show.
        r.ready_seconds = (*w != Workload::CronJobs).then_some(s.ready_seconds);
    }
    let mut windows = Vec::new();
    for (i, &w) in workloads.iter().enumerate() {
        match s.measure(rt, w, sizes, nodes, &mut runs[i]) {
            Ok(window) => windows.push(window),
            Err(e) => {
                fail(&mut runs, i, e);
                break;
            }
        }
    }
    // Stopped before the log is read: requests still in flight are logged on the way out.
    s.cp.stop(manager.process());
    for (run, window) in runs.iter_mut().zip(windows) {
        match count_requests(&s.audit_log, window) {
            Ok(q) => {
                println!(
                    "  {}: {}: {} API requests for the work ({} + {})",
                    manager.name(),
                    run.workload,
                    q.work(),
                    q.create,
                    q.rolling_update
                );
                run.requests = Some(q);
            }
            Err(e) => run.error = Some(format!("counting requests: {e:#}")),
        }
    }
    runs
}

/// A control plane with a controller manager proven ready.
struct Session {
    cp: ControlPlane,
    client: kube::Client,
    audit_log: std::path::PathBuf,
    manager: Manager,
    pid: u32,
    flags: Vec<String>,
    ready_seconds: f64,
}

impl Session {
    /// The control plane, then the manager with the workloads' controllers, then one small
    /// object per workload (a Job of one completion, a DaemonSet on one node, a StatefulSet of
    /// one replica) in a namespace of its own, which proves those controllers synced and working.
    fn start(
        rt: &tokio::runtime::Runtime,
        manager: Manager,
        workloads: &[Workload],
        nodes: usize,
        files: Files<'_>,
        tag: &str,
    ) -> anyhow::Result<Session> {
        let (mut cp, client, audit_log) = wc::start_control_plane(rt, tag, nodes, files)?;
        let warmup_ns = cp.test_namespace("warmup")?;
        let controllers: Vec<&str> = workloads.iter().map(|w| w.controller()).collect();
        let started = Instant::now();
        let (flags, pid) = wc::start_manager(&mut cp, manager, &controllers.join(","), &[])?;
        let mut s = Session {
            cp,
            client,
            audit_log,
            manager,
            pid,
            flags,
            ready_seconds: 0.0,
        };
        let client = s.client.clone();
        let warmups = workloads.iter().map(|&w| {
            let client = client.clone();
            let ns = warmup_ns.clone();
            async move {
                match w {
                    Workload::Jobs => {
                        warm_up(Api::namespaced(client, &ns), job("warmup", 1, 1), 1).await
                    }
                    Workload::DaemonSet => {
                        let mut ds = daemonset("warmup");
                        let spec = ds.spec.as_mut().and_then(|s| s.template.spec.as_mut());
                        spec.expect("a Pod spec").node_selector =
                            Some([("kubernetes.io/hostname".into(), "kwok-node-0".into())].into());
                        warm_up(Api::namespaced(client, &ns), ds, 1).await
                    }
                    Workload::StatefulSet => {
                        warm_up(Api::namespaced(client, &ns), statefulset("warmup", 1), 1).await
                    }
                    // Nothing a CronJob does can be seen before a minute starts.
                    Workload::CronJobs => Ok(()),
                    Workload::PodGc | Workload::Quota | Workload::Hpa => {
                        bail!("{} runs on a control plane of its own", w.tag())
                    }
                }
                .with_context(|| format!("the {} warm-up", w.tag()))
            }
        });
        let result = rt.block_on(guarded(&mut s.cp, Duration::from_secs(180), async {
            futures::future::try_join_all(warmups).await.map(drop)
        }));
        if let Err(e) = result {
            return Err(s.explain(rt, e, &warmup_ns));
        }
        s.ready_seconds = started.elapsed().as_secs_f64();
        println!(
            "  {}: ready (warm-up objects done) {:.1} s after it started",
            manager.name(),
            s.ready_seconds
        );
        Ok(s)
    }

    /// `e` with what the namespace's Pods were doing and what the manager last logged.
    fn explain(&self, rt: &tokio::runtime::Runtime, e: anyhow::Error, ns: &str) -> anyhow::Error {
        let pods = rt.block_on(pods_summary(&self.client, ns));
        let log = self.cp.log(self.manager.process());
        e.context(format!(
            "Pods in {ns}: {pods}; last lines of {}:\n{}",
            log.display(),
            controlplane::process::tail(&log, 20)
        ))
    }

    /// Runs workload `w` in a fresh namespace and fills `run`'s phases and memory; returns the
    /// audit windows [first phase start, second phase start, done].
    fn measure(
        &mut self,
        rt: &tokio::runtime::Runtime,
        w: Workload,
        z: Sizes,
        nodes: usize,
        run: &mut AppsRun,
    ) -> anyhow::Result<[Timestamp; 3]> {
        let ns = self.cp.test_namespace(w.tag())?;
        let timeout = Duration::from_secs(600 + w.pods(&z) as u64 / 2);
        let result = match w {
            Workload::Jobs => {
                let objects = (0..z.jobs)
                    .map(|i| job(&format!("j-{i}"), z.job_completions, z.job_parallelism))
                    .collect();
                let api = Api::namespaced(self.client.clone(), &ns);
                self.phases(rt, api, objects, z.job_completions, timeout, run, None)
            }
            Workload::DaemonSet => {
                let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &ns);
                let change = {
                    let api = api.clone();
                    async move {
                        let patch = json!({"spec": {"template": {"spec": {"containers": [
                            {"name": "c", "image": NEW_IMAGE}
                        ]}}}});
                        api.patch("ds", &PatchParams::default(), &Patch::Strategic(&patch))
                            .await
                            .context("changing the DaemonSet's image")?;
                        anyhow::Ok(())
                    }
                };
                self.phases(
                    rt,
                    api,
                    vec![daemonset("ds")],
                    nodes,
                    timeout,
                    run,
                    Some(Box::pin(change)),
                )
            }
            Workload::StatefulSet => {
                let objects = (0..z.statefulsets)
                    .map(|i| statefulset(&format!("s-{i}"), z.statefulset_replicas))
                    .collect();
                let api = Api::namespaced(self.client.clone(), &ns);
                self.phases(rt, api, objects, z.statefulset_replicas, timeout, run, None)
            }
            Workload::CronJobs => self.cronjobs(rt, &ns, z.cronjobs, timeout, run),
            Workload::PodGc | Workload::Quota | Workload::Hpa => {
                bail!("{} runs on a control plane of its own", w.tag())
            }
        };
        let window = result.map_err(|e| self.explain(rt, e, &ns))?;
        let memory = vm_hwm_kib(self.pid)? as f64 / 1024.0;
        run.peak_memory_mib = Some(memory);
        Ok(window)
    }

    /// The CronJobs, created once a minute has just started; the phase's time is counted from
    /// the next minute, their first scheduled time. Fails when any was first scheduled later
    /// (created after that minute started: too many to create in time).
    fn cronjobs(
        &mut self,
        rt: &tokio::runtime::Runtime,
        ns: &str,
        n: usize,
        timeout: Duration,
        run: &mut AppsRun,
    ) -> anyhow::Result<[Timestamp; 3]> {
        let scheduled = rt.block_on(minute_just_started());
        let objects = (0..n).map(|i| cronjob(&format!("c-{i}"))).collect();
        let api: Api<CronJob> = Api::namespaced(self.client.clone(), ns);
        let window = self.phases(rt, api.clone(), objects, 1, timeout, run, None)?;
        let late: Vec<String> = rt
            .block_on(api.list(&Default::default()))?
            .items
            .iter()
            .filter(|c| {
                let last = c
                    .status
                    .as_ref()
                    .and_then(|s| s.last_schedule_time.as_ref());
                last.map(|t| t.0) != Some(scheduled)
            })
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        if !late.is_empty() {
            bail!(
                "{} of {n} CronJobs were not first scheduled at {scheduled} (e.g. {}): creating \
                 them took past that minute; use fewer --cronjobs",
                late.len(),
                late[0]
            );
        }
        let waited = scheduled.duration_since(window[0]).as_secs_f64();
        if let Some(p) = run.phases.first_mut() {
            p.seconds -= waited;
        }
        println!(
            "  {}: cronjobs: every Job created {:.2} s after the scheduled minute",
            self.manager.name(),
            run.phases.first().map_or(0.0, |p| p.seconds)
        );
        Ok(window)
    }

    /// Phase 1: `objects` created (64 requests in flight) until each is done with `expected`
    /// at generation 1; phase 2 if `change` is given: it is made, and the clock runs until each
    /// object is done at generation 2.
    #[allow(clippy::too_many_arguments)]
    fn phases<K: Tracked>(
        &mut self,
        rt: &tokio::runtime::Runtime,
        api: Api<K>,
        objects: Vec<K>,
        expected: usize,
        timeout: Duration,
        run: &mut AppsRun,
        change: Option<futures::future::BoxFuture<'static, anyhow::Result<()>>>,
    ) -> anyhow::Result<[Timestamp; 3]> {
        let label = format!("{}: {}", self.manager.name(), run.workload);
        let n = objects.len();
        let expected = i32::try_from(expected).context("size beyond i32")?;
        // The tracker's watch is listed before the clock starts.
        let (target, target_rx) = tokio::sync::watch::channel(1i64);
        let (progress_tx, progress_rx) = tokio::sync::watch::channel(Progress::default());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let tracker = rt.spawn(track(
            api.clone(),
            expected,
            target_rx,
            progress_tx,
            ready_tx,
        ));
        rt.block_on(ready_rx)
            .context("the watch ended before its first listing")?;

        let cpu0 = cpu_seconds(self.pid)?;
        let t1 = Timestamp::now();
        let clock = Instant::now();
        let creates = async move {
            futures::stream::iter(objects)
                .map(|object| {
                    let api = api.clone();
                    async move {
                        let name = object.meta().name.clone().unwrap_or_default();
                        api.create(&PostParams::default(), &object)
                            .await
                            .with_context(|| format!("creating {} {name}", K::kind(&())))?;
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(WRITE_CONCURRENCY)
                .try_collect::<()>()
                .await
        };
        let first = K::FIRST_PHASE;
        rt.block_on(guarded(
            &mut self.cp,
            timeout,
            phase(&label, first, creates, progress_rx.clone(), (1, n)),
        ))
        .with_context(|| format!("{first}: {n} x {}", K::kind(&())))?;
        let cpu1 = cpu_seconds(self.pid)?;
        run.phases.push(Phase {
            name: first.into(),
            seconds: clock.elapsed().as_secs_f64(),
            cpu_seconds: cpu1 - cpu0,
        });
        println!(
            "  {label}: {first} {:.2} s after the first create",
            clock.elapsed().as_secs_f64()
        );
        let t2 = Timestamp::now();
        if let Some(change) = change {
            target.send_replace(2);
            let clock = Instant::now();
            rt.block_on(guarded(
                &mut self.cp,
                timeout,
                phase(&label, "rolling update", change, progress_rx, (2, n)),
            ))
            .context("the rolling update")?;
            let cpu2 = cpu_seconds(self.pid)?;
            run.phases.push(Phase {
                name: "rolling update".into(),
                seconds: clock.elapsed().as_secs_f64(),
                cpu_seconds: cpu2 - cpu1,
            });
            println!(
                "  {label}: rolling update done {:.2} s after the change",
                clock.elapsed().as_secs_f64()
            );
        }
        let t3 = Timestamp::now();
        tracker.abort();
        Ok([t1, t2, t3])
    }
}

/// Creates `object` and polls it until it is done with `expected` at generation 1.
async fn warm_up<K: Tracked>(api: Api<K>, object: K, expected: i32) -> anyhow::Result<()> {
    let name = object.meta().name.clone().unwrap_or_default();
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {} {name}", K::kind(&())))?;
    loop {
        if api.get(&name).await?.done(1, expected) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A kind whose objects the tracker counts as done.
trait Tracked:
    kube::Resource<DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The first phase's name in the table.
    const FIRST_PHASE: &'static str;
    /// Whether the object is done at spec generation `target` or later, with `expected`
    /// completions (Job), nodes (DaemonSet) or replicas (StatefulSet).
    fn done(&self, target: i64, expected: i32) -> bool;
}

impl Tracked for Job {
    const FIRST_PHASE: &'static str = "all Complete";

    /// `kubectl wait --for=condition=Complete`.
    fn done(&self, _target: i64, expected: i32) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        status.succeeded.unwrap_or_default() >= expected
            && status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Complete" && c.status == "True")
    }
}

impl Tracked for DaemonSet {
    const FIRST_PHASE: &'static str = "all available";

    /// kubectl's DaemonSetStatusViewer (status observed at the spec's generation, every
    /// scheduled Pod updated and available), with the desired count checked to be every node.
    fn done(&self, target: i64, expected: i32) -> bool {
        let generation = self.metadata.generation.unwrap_or_default();
        let Some(s) = &self.status else {
            return false;
        };
        generation >= target
            && s.observed_generation.unwrap_or_default() >= generation
            && s.desired_number_scheduled == expected
            && s.updated_number_scheduled.unwrap_or_default() >= expected
            && s.number_available.unwrap_or_default() >= expected
    }
}

impl Tracked for StatefulSet {
    const FIRST_PHASE: &'static str = "all ready";

    /// kubectl's StatefulSetStatusViewer for the default RollingUpdate strategy without a
    /// partition: status observed at the spec's generation, every replica ready, and the current
    /// revision the update revision.
    fn done(&self, target: i64, expected: i32) -> bool {
        let generation = self.metadata.generation.unwrap_or_default();
        let Some(s) = &self.status else {
            return false;
        };
        generation >= target
            && s.observed_generation.unwrap_or_default() >= generation
            && s.ready_replicas.unwrap_or_default() >= expected
            && s.update_revision.is_some()
            && s.current_revision == s.update_revision
    }
}

impl Tracked for CronJob {
    const FIRST_PHASE: &'static str = "every Job created";

    /// Its first scheduled time has come: a Job was created for it and recorded.
    fn done(&self, _target: i64, _expected: i32) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.last_schedule_time.is_some())
    }
}

/// Waits until a minute has just started (at least a second ago, so that clocks a little apart
/// agree on which minute it is) and returns the next minute: the first scheduled time of an
/// every-minute CronJob created now.
async fn minute_just_started() -> Timestamp {
    let now = Timestamp::now();
    let into_minute = now.as_second().rem_euclid(60);
    if into_minute > 5 {
        let wait = 61 - into_minute;
        println!("  waiting {wait} s for a minute to start");
        tokio::time::sleep(Duration::from_secs(wait as u64)).await;
    }
    let now = Timestamp::now().as_second();
    Timestamp::from_second(now - now.rem_euclid(60) + 60).expect("a time in range")
}

/// How many tracked objects are done at the target generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Progress {
    generation: i64,
    done: usize,
}

/// Watches `api`'s objects and publishes how many are done at the generation `target` holds,
/// re-counted when it changes. Signals `ready` after the first listing.
async fn track<K: Tracked>(
    api: Api<K>,
    expected: i32,
    mut target: tokio::sync::watch::Receiver<i64>,
    tx: tokio::sync::watch::Sender<Progress>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut ready = Some(ready);
    let mut objects: HashMap<String, K> = HashMap::new();
    let mut generation = *target.borrow_and_update();
    loop {
        tokio::select! {
            event = stream.try_next() => match event? {
                None => return Ok(()),
                Some(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    objects.insert(o.meta().name.clone().unwrap_or_default(), o);
                }
                Some(watcher::Event::Delete(o)) => {
                    objects.remove(o.meta().name.as_deref().unwrap_or_default());
                }
                Some(watcher::Event::Init) => {}
                Some(watcher::Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
            },
            changed = target.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                generation = *target.borrow_and_update();
            }
        }
        // A full recount per event: at most a thousand objects, and cheap predicates.
        let done = objects
            .values()
            .filter(|o| o.done(generation, expected))
            .count();
        let now = Progress { generation, done };
        tx.send_if_modified(|p| std::mem::replace(p, now) != now);
    }
}

/// Makes the writes and waits until the tracker counts `n` objects done at `generation`,
/// printing the count every 30 s.
async fn phase(
    label: &str,
    what: &str,
    writes: impl std::future::Future<Output = anyhow::Result<()>>,
    mut progress: tokio::sync::watch::Receiver<Progress>,
    (generation, n): (i64, usize),
) -> anyhow::Result<()> {
    let start = Instant::now();
    let wait = async {
        let mut report = tokio::time::interval(Duration::from_secs(30));
        report.tick().await;
        loop {
            let p = *progress.borrow_and_update();
            if p.generation == generation && p.done >= n {
                return anyhow::Ok(());
            }
            tokio::select! {
                changed = progress.changed() => {
                    changed.context("the watch ended")?;
                }
                _ = report.tick() => println!(
                    "  {label}: {what}: {}/{n} done after {:.0} s",
                    p.done, start.elapsed().as_secs_f64()
                ),
            }
        }
    };
    tokio::try_join!(writes, wait)?;
    Ok(())
}

/// A Job of `completions` Pods, `parallelism` at a time; kwok completes each Pod once Running.
fn job(name: &str, completions: usize, parallelism: usize) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": IMAGE}],
                },
            },
        },
    }))
    .expect("a valid Job")
}

/// A DaemonSet on every node, rolling with maxUnavailable [`DAEMONSET_MAX_UNAVAILABLE`].
fn daemonset(name: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": DAEMONSET_MAX_UNAVAILABLE}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": IMAGE}]},
            },
        },
    }))
    .expect("a valid DaemonSet")
}

/// A CronJob every minute (Allow); no Job controller runs, so its Jobs only need creating.
fn cronjob(name: &str) -> CronJob {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {"spec": {"template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": IMAGE}],
                },
            }}},
        },
    }))
    .expect("a valid CronJob")
}

/// A StatefulSet of `replicas`, OrderedReady (the default), no volume claims.
fn statefulset(name: &str, replicas: usize) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "OrderedReady",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": IMAGE}]},
            },
        },
    }))
    .expect("a valid StatefulSet")
}

/// The table and the request breakdown, as printed and as written to apps.md.
pub fn markdown(b: &AppsBench) -> String {
    let mut s = String::new();
    writeln!(
        s,
        "Command: `{}`  \nKernel: {}  \nDate: {}  \nTree: {}  \nKubernetes {} (kube-apiserver, \
         kube-scheduler, kube-controller-manager), kwok nodes; {}\n",
        b.command,
        b.kernel,
        b.date,
        b.commit,
        b.kubernetes,
        if b.shared {
            "one control plane per manager for every workload (--quick): peak memory is the \
             manager's after that workload"
        } else {
            "a fresh control plane and manager per workload and manager"
        }
    )
    .unwrap();
    s.push_str(
        "| workload | controller manager | ready (s) | done (s) | rolling update (s) | API \
         requests: phases | CPU in phases (s) | peak memory (MiB) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in &b.runs {
        let what = format!("{} ({})", r.workload, r.what);
        if let Some(e) = &r.error {
            writeln!(
                s,
                "| {what} | {} | FAILED: {} ||||||",
                r.manager,
                e.replace('|', "/").replace('\n', " ")
            )
            .unwrap();
            continue;
        }
        let secs = |i: usize| {
            r.phases
                .get(i)
                .map_or("-".into(), |p| format!("{:.1}", p.seconds))
        };
        let requests = r.requests.as_ref().map_or("-".into(), |q| {
            if r.phases.len() > 1 {
                format!("{} + {} = {}", q.create, q.rolling_update, q.work())
            } else {
                q.create.to_string()
            }
        });
        let cpu: f64 = r.phases.iter().map(|p| p.cpu_seconds).sum();
        let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        writeln!(
            s,
            "| {what} | {} | {} | {} | {} | {requests} | {cpu:.1} | {} |",
            r.manager,
            opt(r.ready_seconds),
            secs(0),
            secs(1),
            opt(r.peak_memory_mib),
        )
        .unwrap();
    }
    let mut summarized = std::collections::HashSet::new();
    for r in &b.runs {
        let Some(q) = &r.requests else { continue };
        // A shared session's log is one: its kinds are the whole session's, said once. podgc,
        // quota and hpa always have their own control plane.
        let own = Workload::parse(&r.workload).is_ok_and(|w| w.own_control_plane());
        let shared = b.shared && !own;
        if shared && !summarized.insert(&r.manager) {
            continue;
        }
        let (kinds, failed) = kinds_summary(q);
        let all = if shared {
            String::new()
        } else if r.workload == Workload::PodGc.tag() {
            format!(
                " (from its start, as the clock; {} in all until it was stopped)",
                q.total
            )
        } else if r.workload == Workload::Quota.tag() {
            format!(
                " (from its start to the last usage recorded: {} + {}; {} in all until it \
                 was stopped)",
                q.create, q.rolling_update, q.total
            )
        } else if r.workload == Workload::Hpa.tag() {
            format!(
                " (the scale-up and scale-down phases: {} + {}; {} before them, from its start \
                 through every first decision; {} in all)",
                q.create, q.rolling_update, q.startup, q.total
            )
        } else {
            format!(
                " ({} in all, {} before the first create)",
                q.total, q.startup
            )
        };
        if shared {
            writeln!(
                s,
                "\n{}, every workload's control plane: by kind: {kinds}; not 2xx: {failed}.",
                r.manager
            )
            .unwrap();
        } else {
            let check = r.check.as_ref().map_or(String::new(), |c| format!(" {c}."));
            writeln!(
                s,
                "\n{}, {}: {} requests in the phases{all}; by kind: {kinds}; not 2xx: \
                 {failed}.{check}",
                r.workload,
                r.manager,
                q.work()
            )
            .unwrap();
        }
    }
    s
}

/// Prints the table and writes apps.json and apps.md.
fn write(b: &AppsBench, out_dir: &Path) -> anyhow::Result<()> {
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
    fn done_as_kubectl_decides() {
        let complete = json!({"metadata": {"name": "j", "generation": 1},
            "status": {"succeeded": 5, "conditions": [{"type": "Complete", "status": "True"}]}});
        let job = |v: serde_json::Value| serde_json::from_value::<Job>(v).unwrap();
        let mut not_yet = complete.clone();
        not_yet["status"]["conditions"][0]["status"] = json!("False");
        let mut short = complete.clone();
        short["status"]["succeeded"] = json!(4);
        let cases = [
            ("Job Complete with every completion", job(complete), true),
            ("Job without the Complete condition", job(not_yet), false),
            ("Job short of its completions", job(short), false),
        ];
        for (name, j, want) in cases {
            assert_eq!(j.done(1, 5), want, "{name}");
        }

        let ds = json!({"metadata": {"name": "ds", "generation": 2},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": 3,
                       "currentNumberScheduled": 3, "numberMisscheduled": 0, "numberReady": 3,
                       "updatedNumberScheduled": 3, "numberAvailable": 3}});
        let set = |patch: &[(&str, serde_json::Value)]| {
            let mut v = ds.clone();
            for (k, x) in patch {
                v["status"][*k] = x.clone();
            }
            serde_json::from_value::<DaemonSet>(v).unwrap()
        };
        let cases = [
            (
                "DaemonSet updated and available on every node",
                set(&[]),
                2,
                true,
            ),
            ("DaemonSet spec older than the target", set(&[]), 3, false),
            (
                "DaemonSet status not observed at its generation",
                set(&[("observedGeneration", json!(1))]),
                2,
                false,
            ),
            (
                "DaemonSet not yet desired on every node",
                set(&[("desiredNumberScheduled", json!(2))]),
                2,
                false,
            ),
            (
                "DaemonSet rolling: a node still runs the old Pod",
                set(&[("updatedNumberScheduled", json!(2))]),
                2,
                false,
            ),
            (
                "DaemonSet Pod not available",
                set(&[("numberAvailable", json!(2))]),
                2,
                false,
            ),
        ];
        for (name, d, target, want) in cases {
            assert_eq!(d.done(target, 3), want, "{name}");
        }

        let sts = json!({"metadata": {"name": "s", "generation": 1},
            "status": {"observedGeneration": 1, "replicas": 3, "readyReplicas": 3,
                       "currentRevision": "s-1", "updateRevision": "s-1"}});
        let set = |patch: &[(&str, serde_json::Value)]| {
            let mut v = sts.clone();
            for (k, x) in patch {
                v["status"][*k] = x.clone();
            }
            serde_json::from_value::<StatefulSet>(v).unwrap()
        };
        let cases = [
            (
                "StatefulSet every replica ready at one revision",
                set(&[]),
                true,
            ),
            (
                "StatefulSet a replica not ready",
                set(&[("readyReplicas", json!(2))]),
                false,
            ),
            (
                "StatefulSet status not observed",
                set(&[("observedGeneration", json!(0))]),
                false,
            ),
            (
                "StatefulSet current revision behind the update revision",
                set(&[("currentRevision", json!("s-0"))]),
                false,
            ),
            (
                "StatefulSet without revisions yet",
                set(&[
                    ("currentRevision", json!(null)),
                    ("updateRevision", json!(null)),
                ]),
                false,
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(s.done(1, 3), want, "{name}");
        }
    }

    #[test]
    fn nodes_hold_every_pod_and_the_daemonset_gets_its_size() {
        let z = Sizes {
            jobs: 1_000,
            job_completions: 5,
            job_parallelism: 5,
            daemonset_nodes: 1_000,
            statefulsets: 100,
            statefulset_replicas: 3,
            cronjobs: 1_000,
            podgc_pods: 10_000,
            podgc_threshold: 1_000,
            quota_objects: 10_000,
            hpa_autoscalers: 1_000,
            hpa_sync_seconds: 15,
        };
        let cases = [
            ("Jobs: every completion's Pod is kept", Workload::Jobs, 50),
            ("DaemonSet: one node per Pod", Workload::DaemonSet, 1_000),
            ("StatefulSets: 300 Pods", Workload::StatefulSet, 3),
            (
                "podgc: its Pods are on a Node of their own",
                Workload::PodGc,
                1,
            ),
            ("quota: its Pods too", Workload::Quota, 1),
            ("hpa: its Pods too", Workload::Hpa, 1),
        ];
        for (name, w, want) in cases {
            assert_eq!(w.nodes(&z), want, "{name}");
        }
        for w in [
            Workload::Jobs,
            Workload::DaemonSet,
            Workload::StatefulSet,
            Workload::CronJobs,
        ] {
            assert!(w.nodes(&QUICK) >= 1, "{w:?} quick");
            assert!(
                w.nodes(&QUICK) * wc::PODS_PER_NODE >= w.pods(&QUICK),
                "{w:?} quick fits"
            );
        }
    }

    #[test]
    fn a_cronjob_is_done_once_its_first_schedule_is_recorded() {
        let cj = |status: serde_json::Value| {
            serde_json::from_value::<CronJob>(json!({"metadata": {"name": "c"},
                "spec": {"schedule": "* * * * *", "jobTemplate": {}}, "status": status}))
            .unwrap()
        };
        let scheduled = cj(json!({"lastScheduleTime": "2026-11-26T07:01:00Z"}));
        assert!(scheduled.done(1, 1), "lastScheduleTime recorded");
        assert!(!cj(json!({})).done(1, 1), "never scheduled yet");
        assert!(!cronjob("c").done(1, 1), "as created");
    }

    #[test]
    fn quick_leaves_the_cronjobs_out_of_the_defaults_only() {
        use clap::Parser as _;
        let plan = |args: &[&str]| {
            let args = BenchArgs::try_parse_from([&["kpr-bench"], args].concat()).unwrap();
            Plan::from_args(&args).unwrap().workloads
        };
        let all = [
            Workload::Jobs,
            Workload::DaemonSet,
            Workload::StatefulSet,
            Workload::CronJobs,
            Workload::PodGc,
            Workload::Quota,
            Workload::Hpa,
        ];
        assert_eq!(plan(&["--apps"]), all, "a full run has every workload");
        assert_eq!(
            plan(&["--quick"]),
            [all[0], all[1], all[2], all[4], all[5], all[6]],
            "the smoke waits for no minute"
        );
        assert_eq!(
            plan(&["--quick", "--apps-workloads", "cronjobs"]),
            [Workload::CronJobs],
            "named, it runs"
        );
    }

    #[test]
    fn workload_names_parse_and_unknown_ones_are_named() {
        for (name, want) in [
            ("jobs", Workload::Jobs),
            (" daemonset", Workload::DaemonSet),
            ("statefulsets", Workload::StatefulSet),
            ("cronjob", Workload::CronJobs),
            ("podgc", Workload::PodGc),
            ("resourcequota", Workload::Quota),
            ("hpa", Workload::Hpa),
        ] {
            assert_eq!(Workload::parse(name).unwrap(), want, "{name}");
        }
        let e = Workload::parse("replicaset").unwrap_err().to_string();
        assert!(
            e.contains("\"replicaset\"") && e.contains("jobs, daemonset"),
            "{e}"
        );
    }

    #[test]
    fn podgc_quota_and_hpa_have_a_control_plane_of_their_own() {
        use clap::Parser as _;
        let sessions = |args: &[&str]| {
            let args = BenchArgs::try_parse_from([&["kpr-bench"], args].concat()).unwrap();
            sessions(&Plan::from_args(&args).unwrap())
        };
        use Workload::*;
        assert_eq!(
            sessions(&["--quick"]),
            [
                vec![Jobs, DaemonSet, StatefulSet],
                vec![PodGc],
                vec![Quota],
                vec![Hpa]
            ],
            "quick: the others share one, podgc, quota and hpa one each"
        );
        assert_eq!(
            sessions(&["--quick", "--apps-workloads", "podgc"]),
            [vec![PodGc]],
            "quick, podgc alone"
        );
        assert_eq!(
            sessions(&["--apps", "--apps-workloads", "jobs,podgc,hpa"]),
            [vec![Jobs], vec![PodGc], vec![Hpa]],
            "full size: one each"
        );
    }

    #[test]
    fn the_podgc_threshold_must_leave_something_to_collect() {
        use clap::Parser as _;
        let sizes = |args: &[&str]| {
            let args = BenchArgs::try_parse_from([&["kpr-bench"], args].concat()).unwrap();
            Sizes::from_args(&args)
        };
        let z = sizes(&["--apps"]).unwrap();
        assert_eq!((z.podgc_pods, z.podgc_threshold), (10_000, 1_000));
        let e = sizes(&["--podgc-pods", "100", "--podgc-threshold", "100"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--podgc-threshold 100 must be below --podgc-pods 100"),
            "{e}"
        );
        assert!(sizes(&["--podgc-threshold", "0"]).is_err());
    }
}
