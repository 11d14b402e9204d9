//! `kpr-bench`, what `cargo xtask bench` runs: N Services (default 20,000) with M endpoints per kpr
//! backend, next to kube-proxy's iptables and nftables layouts and a direct connection to the pod
//! (the floor). `cargo xtask bench` builds this binary and the `proxy` agent with `--release` and
//! runs it with the same flags, so the backends are measured as they ship, not unoptimized.
//! Everything runs in network namespaces (and, for eBPF, a cgroup) this command creates; the
//! harness's guards remove them even on error or panic.
//!
//! Owns the plan (sizes and sample counts from the flags) and the order of the runs; the workload
//! is in [`workload`], the kpr backends in [`backend`], the baselines in [`baseline`], the client
//! measurements in [`traffic`], the outputs (table, JSON, SVG, markdown) in [`report`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;
use kpr_tests::{Cluster, ClusterSpec};

mod api_state;
mod apps_bench;
mod apps_hpa;
mod apps_podgc;
mod apps_quota;
mod backend;
mod baseline;
mod control_plane;
mod failover;
mod lagging;
mod nodeport_bench;
mod proxies_bench;
mod report;
mod scheduler_bench;
mod server;
mod traffic;
mod workload;
mod workload_controllers;

use baseline::{Flavour, Layout};
use proxy::model::IpFamily;

/// One of kpr's own binaries (`controller-manager`, `scheduler`): the one built beside this
/// benchmark's executable, in the same cargo run and profile (`cargo xtask bench` builds them
/// together), so the numbers are of the build the benchmark was asked for.
pub fn kpr_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)))
        .unwrap_or_else(|| xtask::target_dir().join("release").join(name))
}
use report::{BackendRow, Report};

/// N Services per backend next to kube-proxy's iptables and nftables layouts (--quick: 1,000).
/// Run it as `cargo xtask bench [FLAGS]`, which builds it and the agent with --release first.
#[derive(Debug, Clone, Parser)]
#[command(name = "cargo xtask bench", bin_name = "cargo xtask bench")]
pub struct BenchArgs {
    /// Services in the large run.
    #[arg(long, default_value_t = 20_000)]
    pub services: usize,
    /// Endpoints per Service (one pod namespace each, at most 64).
    #[arg(long, default_value_t = 4)]
    pub endpoints: usize,
    /// kpr backends to measure (comma separated): userspace, nftables, iptables (mode detected),
    /// iptables-legacy, iptables-nft, ebpf; one that cannot be built is reported as not available.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "userspace,nftables,iptables-legacy,iptables-nft,ebpf"
    )]
    pub backends: Vec<String>,
    /// Backends measured again with the same Services in IPv6 (IPv6-only clusterIPs, IPv6 pod
    /// endpoints, a dual-stack node), after the IPv4 rows; `none` for none.
    #[arg(long, value_delimiter = ',', default_value = "ebpf,nftables")]
    pub ipv6_backends: Vec<String>,
    /// 1,000 Services and fewer samples (CI); fails only when a backend errors.
    #[arg(long)]
    pub quick: bool,
    /// Seed of the pseudo-random choices (which Services the single changes touch).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Largest size the kube-proxy nftables layout is loaded at (its load time grows with the
    /// square of the chain count: 215 s at 20,000 on kernel 6.x); growth is measured at 1/4, 1/2
    /// and all of this and extrapolated to --services.
    #[arg(long, default_value_t = 4_000)]
    pub nft_baseline_max: usize,
    /// Largest size kube-proxy's iptables layout is loaded at with iptables-nft-restore (whose
    /// load time grows with rules x chains); measured at 1/4, 1/2 and all of this and
    /// extrapolated to --services, like the nft layout. iptables-legacy-restore loads all N.
    #[arg(long, default_value_t = 2_000)]
    pub ipt_nft_baseline_max: usize,
    /// Skip the kube-proxy baselines.
    #[arg(long)]
    pub no_baselines: bool,
    /// Skip the control-plane row (the EndpointSlice controller's cold start, kpr's and
    /// kube-controller-manager's, against the reference kube-apiserver).
    #[arg(long)]
    pub no_control_plane: bool,
    /// Services in the control-plane row (each with --endpoints ready Pods; --quick: 250).
    #[arg(long, default_value_t = CONTROL_PLANE_SERVICES)]
    pub control_plane_services: usize,
    /// Only the control-plane row: no backends, no baselines, no direct-to-pod floor.
    #[arg(long, conflicts_with = "no_control_plane")]
    pub only_control_plane: bool,
    /// Only the workload controllers benchmark: kpr's ReplicaSet, Deployment and garbage
    /// collector controllers next to kube-controller-manager's, on the reference control plane
    /// with kwok nodes (--deployments x --replicas created at once, then a rolling update of all;
    /// with --quick, a smoke size). Outputs target/bench/controllers.{json,md}.
    #[arg(long, conflicts_with_all = ["only_control_plane", "no_controllers"])]
    pub controllers: bool,
    /// Skip the workload controllers smoke that --quick runs.
    #[arg(long)]
    pub no_controllers: bool,
    /// Deployments created at once by the workload controllers benchmark.
    #[arg(long, default_value_t = workload_controllers::DEPLOYMENTS)]
    pub deployments: usize,
    /// Replicas of each of those Deployments.
    #[arg(long, default_value_t = workload_controllers::REPLICAS)]
    pub replicas: usize,
    /// kwok nodes the Pods are scheduled on (110 Pods each at most).
    #[arg(long, default_value_t = workload_controllers::NODES)]
    pub kwok_nodes: usize,
    /// Controller managers the workload controllers benchmark measures, in order: kpr,
    /// upstream (kube-controller-manager's defaults), upstream-unthrottled (its client limit
    /// lifted).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kpr,upstream,upstream-unthrottled"
    )]
    pub managers: Vec<String>,
    /// Only the scheduler benchmark: kpr's scheduler next to kube-scheduler on the reference
    /// control plane with kwok nodes, scheduler_perf's SchedulingBasic and TopologySpreading
    /// workloads at --sched-sizes (with --quick, a smoke size). Outputs
    /// target/bench/scheduler.{json,md}.
    #[arg(long, conflicts_with_all = ["only_control_plane", "controllers", "no_scheduler"])]
    pub scheduler: bool,
    /// Only the leader fail-over scenario (issue 42, scenario 5): two replicas each of the
    /// controller manager and the scheduler, leaders killed with SIGKILL while 100 Deployments
    /// x 10 replicas roll out on 50 kwok nodes (--quick: 20 x 5 on 10); takeover times,
    /// duplicate Pods and ReplicaSets, unscheduled Pods. Outputs target/bench/failover.{json,md}.
    #[arg(long, conflicts_with_all = ["only_control_plane", "controllers", "scheduler"])]
    pub failover: bool,
    /// Whose components the fail-over runs: kpr, upstream (kube-controller-manager and
    /// kube-scheduler), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "kpr,upstream")]
    pub failover_planes: Vec<String>,
    /// Only the lagging-watch scenario (issue 42, scenario 6): kpr's controller-manager with every
    /// watch event applied --lagging-watch-delay late, beside itself without the lag and
    /// kube-controller-manager, while ReplicaSets and StatefulSets scale and Jobs run; overshoot,
    /// undershoot, extra Job Pods. Outputs target/bench/lagging-watch.{json,md}.
    #[arg(long, conflicts_with_all = ["only_control_plane", "controllers", "scheduler", "failover"])]
    pub lagging_watch: bool,
    /// Only the NodePort path benchmark: new TCP connections and UDP requests from outside the
    /// node to a NodePort whose backend is on another node, through the eBPF tc program, the eBPF
    /// XDP program, the eBPF tc program with direct server return and the nftables backend.
    /// Outputs target/bench/nodeport.{json,md}.
    #[arg(long, conflicts_with_all = ["only_control_plane", "controllers", "scheduler", "failover", "lagging_watch"])]
    pub nodeport: bool,
    /// Seconds of each kind of request per path with --nodeport.
    #[arg(long, default_value_t = 10)]
    pub nodeport_seconds: u64,
    /// The watch lag of --lagging-watch, in seconds.
    #[arg(long, default_value_t = 3)]
    pub lagging_watch_delay: u64,
    /// Skip the scheduler smoke that --quick runs.
    #[arg(long)]
    pub no_scheduler: bool,
    /// Scheduler benchmark sizes, NODESxPODS (measured Pods; min(nodes, 1,000) init Pods are
    /// bound first), comma separated.
    #[arg(long, value_delimiter = ',', default_value = scheduler_bench::SIZES)]
    pub sched_sizes: Vec<String>,
    /// Scheduler benchmark workloads: basic (SchedulingBasic), topology-spreading,
    /// pod-anti-affinity, pod-affinity, node-affinity, preferred-topology-spreading, preemption
    /// (PreemptionBasic), csi-pvs (SchedulingCSIPVs: a bound CSI claim per Pod), or all.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = scheduler_bench::DEFAULT_WORKLOADS
    )]
    pub sched_workloads: Vec<String>,
    /// Schedulers the scheduler benchmark measures, in order: kpr, upstream (kube-scheduler).
    #[arg(long, value_delimiter = ',', default_value = "kpr,upstream")]
    pub schedulers: Vec<String>,
    /// Only the apps benchmark: kpr's Job, DaemonSet, StatefulSet and CronJob controllers next to
    /// kube-controller-manager's, on the reference control plane with kwok nodes (with --quick, a
    /// smoke size). Outputs target/bench/apps.{json,md}.
    #[arg(long, conflicts_with_all = ["only_control_plane", "controllers", "scheduler", "no_apps"])]
    pub apps: bool,
    /// Skip the apps smoke that --quick runs.
    #[arg(long)]
    pub no_apps: bool,
    /// Apps benchmark workloads: jobs, daemonset, statefulset, cronjobs, podgc, quota, hpa
    /// (--quick leaves cronjobs out unless named: it waits for a minute to start).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "jobs,daemonset,statefulset,cronjobs,podgc,quota,hpa"
    )]
    pub apps_workloads: Vec<String>,
    /// Controller managers the apps benchmark measures, in order (as --managers).
    #[arg(long, value_delimiter = ',', default_value = apps_bench::MANAGERS)]
    pub apps_managers: Vec<String>,
    /// Jobs created at once by the apps benchmark.
    #[arg(long, default_value_t = apps_bench::JOBS)]
    pub jobs: usize,
    /// Completions of each of those Jobs.
    #[arg(long, default_value_t = apps_bench::JOB_COMPLETIONS)]
    pub job_completions: usize,
    /// Parallelism of each of those Jobs.
    #[arg(long, default_value_t = apps_bench::JOB_COMPLETIONS)]
    pub job_parallelism: usize,
    /// kwok nodes the apps benchmark's DaemonSet covers.
    #[arg(long, default_value_t = apps_bench::DAEMONSET_NODES)]
    pub daemonset_nodes: usize,
    /// StatefulSets created at once by the apps benchmark.
    #[arg(long, default_value_t = apps_bench::STATEFULSETS)]
    pub statefulsets: usize,
    /// Replicas of each of those StatefulSets.
    #[arg(long, default_value_t = apps_bench::STATEFULSET_REPLICAS)]
    pub statefulset_replicas: usize,
    /// Every-minute CronJobs the apps benchmark creates.
    #[arg(long, default_value_t = apps_bench::CRONJOBS)]
    pub cronjobs: usize,
    /// Terminated Pods the apps benchmark's podgc workload creates before the manager starts.
    #[arg(long, default_value_t = apps_bench::PODGC_PODS)]
    pub podgc_pods: usize,
    /// `--terminated-pod-gc-threshold` of both managers in the podgc workload.
    #[arg(long, default_value_t = apps_bench::PODGC_THRESHOLD)]
    pub podgc_threshold: usize,
    /// Objects (Pods, ConfigMaps, Secrets) the apps benchmark's quota workload counts.
    #[arg(long, default_value_t = apps_bench::QUOTA_OBJECTS)]
    pub quota_objects: usize,
    /// HorizontalPodAutoscalers (one per Deployment) of the apps benchmark's hpa workload.
    #[arg(long, default_value_t = apps_bench::HPA_AUTOSCALERS)]
    pub hpa_autoscalers: usize,
    /// Both managers' `--horizontal-pod-autoscaler-sync-period` (seconds) in the hpa workload
    /// (kube-controller-manager's default; --quick uses 1).
    #[arg(long, default_value_t = 15)]
    pub hpa_sync_period: usize,
    /// Where the proxies get their Services: `file` (kpr's agents and our imitations of
    /// kube-proxy's rule layouts, from manifests) or `kube` (only the proxies row: the real
    /// kube-proxy and kpr's agents, each fed by the same reference kube-apiserver; outputs
    /// target/bench/proxies.{json,md}).
    #[arg(long, default_value = "file", value_parser = ["file", "kube"])]
    pub source: String,
    /// Proxies of the `--source kube` row, in order: kube-proxy-iptables (the host's iptables),
    /// kube-proxy-iptables-legacy (iptables-legacy first on its PATH), kube-proxy-nftables,
    /// kpr-userspace, kpr-nftables, kpr-iptables-legacy, kpr-iptables-nft, kpr-ebpf (--quick:
    /// kube-proxy-nftables, kpr-nftables, kpr-ebpf).
    #[arg(long, value_delimiter = ',')]
    pub proxies: Option<Vec<String>>,
    /// Sizes (Services) of the `--source kube` row, comma separated (--quick: 500).
    #[arg(long, value_delimiter = ',', default_value = proxies_bench::SIZES)]
    pub proxy_sizes: Vec<usize>,
    /// Skip the `--source kube` smoke that --quick runs.
    #[arg(long)]
    pub no_proxies: bool,
    /// `--source kube`: start each size from the API state an earlier run kept for it (sizes of
    /// 20,000 Services and more keep theirs under target/bench/api-state/) instead of writing its
    /// Services and slices through the API again; the heading then gives the original write time.
    #[arg(long)]
    pub reuse_api_state: bool,
}

/// The control-plane row's default size: every Service, Pod and status goes through the real
/// kube-apiserver twice (once per controller), and kube-controller-manager writes about 20 slices
/// a second (its default client QPS: 49 s for 1,000 Services), so N is smaller than the
/// dataplane's: 20,000 would take about 3 minutes of seeding per controller and 17 minutes of
/// kube-controller-manager; 2,000 keeps the row near 3 minutes.
pub const CONTROL_PLANE_SERVICES: usize = 2_000;

/// Sizes and sample counts of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub services: usize,
    pub endpoints: usize,
    pub seed: u64,
    pub changes: usize,
    pub baseline_changes: usize,
    /// Single changes stop after this long (at least 3 are made); the table shows how many ran.
    pub change_budget: Duration,
    pub latency_samples: usize,
    pub rate_time: Duration,
    pub rr_connections: usize,
    pub long_conns: usize,
    pub short_per_long: usize,
    pub agent_timeout: Duration,
    pub nft_sizes: Vec<usize>,
    pub ipt_nft_sizes: Vec<usize>,
    /// The control-plane row: Services, and ready Pods per Service.
    pub cp_services: usize,
    pub cp_pods: usize,
    pub out_dir: PathBuf,
}

impl Plan {
    fn new(args: &BenchArgs) -> anyhow::Result<Plan> {
        if args.endpoints == 0 || args.endpoints > 64 {
            bail!(
                "--endpoints {}: must be 1..=64 (one pod namespace each)",
                args.endpoints
            );
        }
        let services = if args.quick { 1_000 } else { args.services };
        if !(10..=workload::MAX_SERVICES).contains(&services) {
            bail!(
                "--services {services}: must be 10..={} (the address plan)",
                workload::MAX_SERVICES
            );
        }
        let growth = |max: usize| {
            let max = max.min(services).max(10);
            let mut sizes: Vec<usize> = if args.quick {
                vec![max.min(1_000)]
            } else {
                vec![max / 4, max / 2, max]
            };
            sizes.retain(|&n| n >= 10);
            sizes.dedup();
            sizes
        };
        Ok(Plan {
            services,
            endpoints: args.endpoints,
            seed: args.seed,
            changes: if args.quick { 20 } else { 50 },
            baseline_changes: if args.quick { 2 } else { 3 },
            change_budget: Duration::from_secs(if args.quick { 20 } else { 120 }),
            latency_samples: if args.quick { 200 } else { 1_000 },
            rate_time: Duration::from_millis(if args.quick { 500 } else { 2_000 }),
            rr_connections: if args.quick { 2_000 } else { 10_000 },
            long_conns: if args.quick { 16 } else { 40 },
            short_per_long: 5,
            // 420 s at 20,000, growing with N (the agent parses N Services from YAML).
            agent_timeout: Duration::from_secs(if args.quick {
                120
            } else {
                420.max(services as u64 * 21 / 1_000)
            }),
            nft_sizes: growth(args.nft_baseline_max),
            ipt_nft_sizes: growth(args.ipt_nft_baseline_max),
            cp_services: if args.quick {
                250
            } else {
                args.control_plane_services.max(1)
            },
            cp_pods: args.endpoints,
            out_dir: xtask::target_dir().join("bench"),
        })
    }
}

/// A cluster with the benchmark's servers in its pods, and one on the pod client's loopback.
/// Fields drop in order: the servers stop before the namespaces go.
pub struct Site {
    _servers: Vec<server::Server>,
    pub cluster: Cluster,
}

/// The server on the pod client's own loopback: a request to it crosses no link and no node,
/// so no dataplane's rules or maps, and its latency follows only the machine's speed. The
/// reference that `@N / @10` divides each side by.
pub const LOOPBACK_SERVER: ([u8; 4], u16) = ([127, 0, 0, 1], 8081);

impl Site {
    pub fn loopback_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(LOOPBACK_SERVER)
    }
}

impl std::ops::Deref for Site {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

/// A fresh cluster: node, client, pod client and one pod per endpoint, each serving on
/// `pod-ip:8080` (see [`server`]).
pub fn cluster(plan: &Plan) -> anyhow::Result<Site> {
    site(plan.endpoints)
}

/// A fresh cluster of `pods` pods with the benchmark's servers (see [`cluster`]).
pub fn site(pods: usize) -> anyhow::Result<Site> {
    site_of(pods, false)
}

/// Lets a namespace that opens connections at the benchmark's rates reuse its ports: without
/// these, tens of thousands of closed connections in TIME_WAIT exhaust the default port range
/// within seconds, and what is measured is the wait for a free port.
pub fn tune_client(ns: &kpr_tests::Netns) -> anyhow::Result<()> {
    for (key, value) in [
        ("net.ipv4.tcp_tw_reuse", "1"),
        ("net.ipv4.ip_local_port_range", "1024 65000"),
    ] {
        ns.sysctl(key, value)?;
    }
    Ok(())
}

/// [`site`], dual-stack when `ipv6`: every pod also has an IPv6 address, served as well.
pub fn site_of(pods: usize, ipv6: bool) -> anyhow::Result<Site> {
    let mut spec = ClusterSpec {
        echo: false,
        ..ClusterSpec::pods(pods)
    };
    if ipv6 {
        spec = spec.dual_stack();
    }
    let cluster = Cluster::new(spec)?;
    tune_client(&cluster.podclient)?;
    let mut servers = cluster
        .pods
        .iter()
        .map(|p| server::Server::start(&p.ns, &p.name, p.echo_addr()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for p in &cluster.pods {
        if let Some(ip6) = p.ip6 {
            let addr = std::net::SocketAddr::from((ip6, p.echo_addr().port()));
            servers.push(server::Server::start(&p.ns, &p.name, addr)?);
        }
    }
    servers.push(server::Server::start(
        &cluster.podclient,
        "loopback",
        LOOPBACK_SERVER.into(),
    )?);
    Ok(Site {
        _servers: servers,
        cluster,
    })
}

/// Slab + vmalloc + per-cpu kernel memory (KiB) from /proc/meminfo: machine-wide, so a delta
/// around a load includes whatever else the machine did meanwhile.
pub fn kernel_memory_kib() -> Option<i64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<i64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(field("Slab:")? + field("VmallocUsed:")? + field("Percpu:")?)
}

/// Errors are printed with their whole context chain, as xtask prints its own.
fn main() -> ExitCode {
    match run(&BenchArgs::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark and writes the outputs under `target/bench/`.
fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: kpr-bench is an unoptimized build: run it as `cargo xtask bench`, which \
             builds it with --release"
        );
    }
    let plan = Plan::new(args)?;
    std::fs::create_dir_all(&plan.out_dir)?;
    // `--controllers` runs it alone; `--quick` runs its smoke size after the rest.
    let controllers = if args.controllers
        || (args.quick && !args.no_controllers && !args.scheduler && !args.apps)
    {
        let managers = args
            .managers
            .iter()
            .map(|m| workload_controllers::Manager::parse(m))
            .collect::<anyhow::Result<Vec<_>>>()?;
        workload_controllers::check_binaries()?;
        Some((workload_controllers::Sizes::from_args(args)?, managers))
    } else {
        None
    };
    // `--scheduler` runs it alone; `--quick` runs its smoke size last.
    let scheduler = if args.scheduler
        || (args.quick && !args.no_scheduler && !args.controllers && !args.apps)
    {
        let sched = scheduler_bench::Plan::from_args(args)?;
        scheduler_bench::check_binaries(&sched)?;
        Some(sched)
    } else {
        None
    };
    // `--apps` runs it alone; `--quick` runs its smoke size after the workload controllers.
    let apps = if args.apps || (args.quick && !args.no_apps && !args.controllers && !args.scheduler)
    {
        workload_controllers::check_binaries()?;
        Some(apps_bench::Plan::from_args(args)?)
    } else {
        None
    };
    // `--source kube` runs it alone; `--quick` runs its smoke size after the file-fed rows.
    let proxies = if args.source == "kube"
        || (args.quick && !args.no_proxies && !args.controllers && !args.scheduler && !args.apps)
    {
        proxies_bench::check_binaries()?;
        Some(proxies_bench::Plan::from_args(args)?)
    } else {
        None
    };
    if args.source == "kube" {
        let proxies = proxies.expect("set with --source kube");
        let command = format!(
            "cargo xtask bench {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        );
        let (_, failed) = proxies_bench::run(&proxies, &plan.out_dir, command)?;
        if !failed.is_empty() {
            bail!("failed:\n  {}", failed.join("\n  "));
        }
        return Ok(());
    }
    if args.apps {
        let apps = apps.expect("set with --apps");
        let command = apps_bench::command(args, &apps);
        let (_, failed) = apps_bench::run(&apps, &plan.out_dir, command)?;
        if !failed.is_empty() {
            bail!("failed:\n  {}", failed.join("\n  "));
        }
        return Ok(());
    }
    if args.nodeport {
        let command = format!(
            "cargo xtask bench {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        );
        nodeport_bench::run(args.nodeport_seconds, &plan.out_dir, command)?;
        return Ok(());
    }
    if args.lagging_watch {
        workload_controllers::check_binaries()?;
        let delay = std::time::Duration::from_secs(args.lagging_watch_delay);
        let (_, failed) = lagging::run(&plan.out_dir, delay)?;
        if !failed.is_empty() {
            bail!("failed:\n  {}", failed.join("\n  "));
        }
        return Ok(());
    }
    if args.failover {
        let planes = args
            .failover_planes
            .iter()
            .map(|p| failover::Plane::parse(p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        workload_controllers::check_binaries()?;
        let sizes = if args.quick {
            failover::QUICK
        } else {
            (failover::DEPLOYMENTS, failover::REPLICAS, failover::NODES)
        };
        let (_, failed) = failover::run(sizes, &planes, &plan.out_dir)?;
        if !failed.is_empty() {
            bail!("failed:\n  {}", failed.join("\n  "));
        }
        return Ok(());
    }
    if args.scheduler {
        let sched = scheduler.expect("set with --scheduler");
        let command = scheduler_bench::command(args);
        let (_, failed) = scheduler_bench::run(&sched, &plan.out_dir, command)?;
        if !failed.is_empty() {
            bail!("failed:\n  {}", failed.join("\n  "));
        }
        return Ok(());
    }
    if args.controllers {
        let (sizes, managers) = controllers.expect("set with --controllers");
        let command = workload_controllers::command(args, sizes, &managers);
        let (_, failed) = workload_controllers::run(sizes, &managers, &plan.out_dir, command)?;
        if !failed.is_empty() {
            bail!("failed:\n  {}", failed.join("\n  "));
        }
        return Ok(());
    }
    if !args.no_control_plane {
        control_plane::check_binaries()?;
    }
    println!(
        "bench: {} Services x {} endpoints, backends {:?}",
        plan.services, plan.endpoints, args.backends
    );
    let mut report = Report::new(&plan, args);
    let mut failed = Vec::new();
    if !args.only_control_plane {
        let (floor_latency, floor_rps) = baseline::direct(&plan)?;
        report.direct = Some((floor_latency, floor_rps));
    }
    let backends: &[String] = if args.only_control_plane {
        &[]
    } else {
        &args.backends
    };
    let ipv6: Vec<(&String, IpFamily)> = if args.only_control_plane {
        Vec::new()
    } else {
        args.ipv6_backends
            .iter()
            .filter(|b| !b.is_empty() && *b != "none")
            .map(|b| (b, IpFamily::V6))
            .collect()
    };
    let runs = backends.iter().map(|b| (b, IpFamily::V4)).chain(ipv6);
    for (name, family) in runs {
        let label = match family {
            IpFamily::V4 => name.clone(),
            IpFamily::V6 => format!("{name} IPv6"),
        };
        println!("bench: backend {label}");
        let row = match backend::run(&plan, name, family) {
            Ok(result) => {
                failed.extend(result.errors.iter().map(|e| format!("{label}: {e}")));
                BackendRow::Measured(Box::new(result))
            }
            Err(e) if is_unavailable(&e) => BackendRow::NotAvailable(format!("{e:#}")),
            Err(e) => {
                failed.push(format!("{label}: {e:#}"));
                BackendRow::Failed(format!("{e:#}"))
            }
        };
        report.backends.push((label, row));
    }
    if !args.no_control_plane {
        println!(
            "bench: EndpointSlice cold start against kube-apiserver {}, {} Services x {} Pods",
            controlplane::kubernetes_version(),
            plan.cp_services,
            plan.cp_pods
        );
        match control_plane::cold_start(&plan) {
            Ok((r, failures)) => {
                failed.extend(failures);
                report.control_plane = Some(r);
            }
            Err(e) => failed.push(format!("endpointslice cold start: {e:#}")),
        }
    }
    if !args.no_baselines && !args.only_control_plane {
        let mut runs = vec![(Layout::Iptables(Flavour::Legacy), plan.services, true)];
        for (layout, sizes) in [
            (Layout::Nftables, &plan.nft_sizes),
            (Layout::Iptables(Flavour::Nft), &plan.ipt_nft_sizes),
        ] {
            for (k, &n) in sizes.iter().enumerate() {
                runs.push((layout, n, k + 1 == sizes.len()));
            }
        }
        for (layout, n, with_traffic) in runs {
            println!("bench: {} at {n}", layout.name());
            match baseline::run(&plan, layout, n, with_traffic) {
                Ok(r) => report.baselines.push(r),
                Err(e) => failed.push(format!("{} at {n}: {e:#}", layout.name())),
            }
        }
    }
    if let Some(proxies) = proxies {
        let command = format!(
            "cargo xtask bench {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        );
        match proxies_bench::run(&proxies, &plan.out_dir, command) {
            Ok((_, failures)) => failed.extend(failures),
            Err(e) => failed.push(format!("proxies: {e:#}")),
        }
    }
    if let Some((sizes, managers)) = controllers {
        let command = workload_controllers::command(args, sizes, &managers);
        match workload_controllers::run(sizes, &managers, &plan.out_dir, command) {
            Ok((_, failures)) => failed.extend(failures),
            Err(e) => failed.push(format!("workload controllers: {e:#}")),
        }
    }
    if let Some(apps) = apps {
        let command = apps_bench::command(args, &apps);
        match apps_bench::run(&apps, &plan.out_dir, command) {
            Ok((_, failures)) => failed.extend(failures),
            Err(e) => failed.push(format!("apps: {e:#}")),
        }
    }
    if let Some(sched) = scheduler {
        let command = scheduler_bench::command(args);
        match scheduler_bench::run(&sched, &plan.out_dir, command) {
            Ok((_, failures)) => failed.extend(failures),
            Err(e) => failed.push(format!("scheduler: {e:#}")),
        }
    }
    report.failures.clone_from(&failed);
    report.write()?;
    if !failed.is_empty() {
        bail!("failed:\n  {}", failed.join("\n  "));
    }
    Ok(())
}

/// A backend that this agent cannot build here (not wired into `build`, or a feature it reports
/// as unfinished) is "not available", not a failure.
fn is_unavailable(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    text.starts_with("building backend")
        && (text.contains("does not support") || text.contains("kernel feature missing"))
}
