//! `cargo xtask cluster up|down|env|status`: a reference cluster on this machine, left running in
//! the background for kubectl, the agent, the e2e suite and benchmarks. Always etcd and
//! kube-apiserver of the pinned release with TLS and RBAC; optionally kube-controller-manager or
//! kpr's controller-manager, kube-scheduler, and kwok nodes. With `--nodes N`, N real nodes
//! (containerd and kubelet, see [`nodes`]) in network namespaces, the control plane in the
//! cluster network's namespace, CoreDNS, and kpr's agent (or kube-proxy, when asked for)
//! deployed as a user deploys it.
//!
//! `up` records what it started in `<target>/cluster/state.json`; `down` stops every process whose
//! command line names the cluster's directory (so also those of an `up` interrupted half-way or
//! a state file lost), kills the nodes' containers, unmounts and deletes the namespaces; Ctrl-C
//! during `up` does the same. Owns `<target>/cluster` (`<target>/cluster-<name>` for `--name`).

pub mod chaos;
pub mod e2e;
pub mod helm;
pub mod hpa_demo;
pub mod nodes;
pub mod smoke;
pub mod statefulset_demo;
pub mod switch;
pub mod usage;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand, ValueEnum};
use controlplane::{network, ControlPlane, Lifetime, Options};
use serde_json::json;

use crate::exec::Cmd;
use crate::{target_dir, workspace_root};

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Which cluster: its directory `<target>/cluster-<name>` and the prefix of its network
    /// namespaces (`kpr`, the default, is `<target>/cluster`).
    #[arg(long, global = true, default_value = "kpr")]
    pub name: String,
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Start the control plane in the background and print how to use it.
    Up(UpArgs),
    /// Stop every process of the cluster and remove its directory.
    Down,
    /// Print `export KUBECONFIG=...` (and PATH for the reference kubectl) to eval.
    Env,
    /// Which processes run; a dead one is shown with the last lines of its log.
    Status,
    /// Upstream's e2e suite (Services by default) against the cluster's real nodes.
    E2e(e2e::E2eArgs),
    /// Switch the nodes' Service proxy (another kpr backend, back to kube-proxy, forward to kpr)
    /// the way README says, then check that nothing of the previous one is left.
    Proxy(switch::ProxyArgs),
    /// For each Service proxy (kube-proxy iptables and nftables, kpr on every backend) a fresh
    /// cluster `e2e`, upstream's e2e Services suite, and a table of the outcomes.
    Matrix(e2e::MatrixArgs),
    /// deploy/smoke.yaml (the kind smoke test) checked from a pod on every node and from every
    /// node: ClusterIP by DNS name, every node's NodePort.
    Smoke,
    /// The chart deploy/helm/kpr on a cluster without a Service proxy: helm install, smoke,
    /// helm upgrade to another backend with the kube-proxy ConfigMap, smoke, helm uninstall, and
    /// nothing left (in the API, and on the nodes after deploy/cleanup.yaml).
    Helm(helm::HelmArgs),
    /// The HorizontalPodAutoscaler on real metrics (a cluster up with --metrics-server): a
    /// resource-consumer Deployment under CPU load, then none; replicas over time and the HPA's
    /// Events, whoever runs its controller.
    HpaDemo(hpa_demo::HpaDemoArgs),
    /// A StatefulSet keeps its data (a cluster up with --nodes N --local-path): the tutorial's
    /// StatefulSet, each replica's file read back by its next Pod on the node of its volume,
    /// scale down and up, `whenScaled: Delete`, the namespace deleted; each step timed.
    StatefulsetDemo,
    /// List what every Service proxy left on each node (rules, eBPF pins, links) and check that
    /// only the running proxy's own state is there.
    Leftovers,
    /// A disruption under load (docs/RELIABILITY.md): `agent-restart` restarts the Service
    /// proxy's DaemonSet, `agent-upgrade` moves it to a new image, `endpoint-removal` scales the backend down and deletes a Pod,
    /// `proxy-switch` switches the nodes' Service proxy, `apiserver-outage` stops kube-apiserver
    /// and compacts etcd, `soak` churns Services and Pods with the components' memory and open
    /// files sampled, while `cargo xtask load` runs from a pod on every node and from outside the
    /// nodes; a report and a table of failed connects, broken connections, timeouts and the
    /// longest gaps.
    Chaos(chaos::ChaosArgs),
    /// `cargo xtask test`'s last step alone (on the debug binaries it expects built): the
    /// one-node cluster `smoke`, a few Services specs, `cluster smoke`, an agent restart under
    /// load, the cluster down.
    E2eSmoke,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Who runs the controllers: kube-controller-manager (all of them); kpr, whose
    /// controller-manager runs every controller kpr has, beside a kube-controller-manager that
    /// runs only the ones kpr lacks (none started when kpr has them all); kpr-only, no
    /// kube-controller-manager whatever kpr lacks (named at start); or nobody.
    #[arg(long, value_enum, default_value_t = Controllers::Upstream)]
    pub controllers: Controllers,
    /// Who schedules Pods: kube-scheduler, kpr's scheduler, or nobody.
    #[arg(long, value_enum, default_value_t = Who::Upstream)]
    pub scheduler: Who,
    /// How many kwok nodes (simulated: their Pods become Running and Ready without containers).
    #[arg(long, default_value_t = 0)]
    pub kwok_nodes: usize,
    /// How many real nodes (kubelet and containerd, each in a network namespace of its own).
    #[arg(long, default_value_t = 0)]
    pub nodes: usize,
    /// The Service proxy on the real nodes: kpr's agent (deploy/proxy.yaml), kube-proxy, or none.
    #[arg(long, value_enum, default_value_t = nodes::Proxy::Kpr)]
    pub proxy: nodes::Proxy,
    /// kpr's backend (with --proxy kpr).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(crate::deploy::BACKENDS), default_value = crate::deploy::DEFAULT_BACKEND)]
    pub backend: String,
    /// kube-proxy's mode (with --proxy kube-proxy).
    #[arg(long, value_enum, default_value_t = nodes::Mode::Nftables)]
    pub mode: nodes::Mode,
    /// Which build of kpr's binaries the cluster runs: the nodes' kpr image (with --nodes) and
    /// the control plane's controller-manager and scheduler.
    #[arg(long, value_enum, default_value_t = crate::Profile::Release)]
    pub binaries: crate::Profile,
    /// The cluster's address families: `dual` gives the API server an IPv6 service range too
    /// (fd00:10:96::/112), and the real nodes, their pods and the Service proxy both families,
    /// laid out as kind lays out a dual-stack cluster.
    #[arg(long, value_enum, default_value_t = crate::deploy::IpFamilies::Ipv4)]
    pub ip_family: crate::deploy::IpFamilies,
    /// Deploy metrics-server (the pinned release, built here) on the real nodes, so the resource
    /// metrics API (`kubectl top`, the HPA) has the kubelets' samples; needs --nodes (kwok nodes
    /// have no kubelet: without it a cluster has no metrics.k8s.io and the HPA says so).
    #[arg(long)]
    pub metrics_server: bool,
    /// Deploy kind's default storage on the real nodes: rancher's local-path-provisioner (the
    /// pinned release, built here) and its StorageClass `standard`, marked default,
    /// WaitForFirstConsumer, reclaim Delete, so claims get volumes on their Pod's node; needs
    /// --nodes.
    #[arg(long)]
    pub local_path: bool,
}

/// Who runs the controllers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Controllers {
    /// kube-controller-manager, every controller.
    Upstream,
    /// kpr's controller-manager, and kube-controller-manager for what kpr lacks.
    Kpr,
    /// kpr's controller-manager alone.
    KprOnly,
    /// Nobody.
    None,
}

impl Controllers {
    /// Whether kpr's controller-manager runs.
    pub fn kpr(self) -> bool {
        matches!(self, Controllers::Kpr | Controllers::KprOnly)
    }

    /// kube-controller-manager's `--controllers`, or `None` when it does not run.
    fn upstream_list(self) -> Option<String> {
        match self {
            Controllers::Upstream => Some("*".to_string()),
            // What kpr lacks, from its descriptor table against kube-controller-manager's list.
            Controllers::Kpr => controllers::manager::upstream::upstream_remainder(),
            Controllers::KprOnly | Controllers::None => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Who {
    Upstream,
    Kpr,
    None,
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let cluster = Cluster::named(&args.name)?;
    match &args.command {
        ClusterCommand::Up(up_args) => up(&cluster, up_args),
        ClusterCommand::Down => down(&cluster),
        ClusterCommand::Env => env(&cluster),
        ClusterCommand::Status => status(&cluster),
        ClusterCommand::Proxy(proxy_args) => switch::run(&cluster, proxy_args),
        ClusterCommand::Leftovers => switch::leftovers(&cluster),
        ClusterCommand::Smoke => smoke::run(&cluster),
        ClusterCommand::Chaos(chaos_args) => chaos::run(&cluster, chaos_args).map(drop),
        ClusterCommand::E2eSmoke => e2e::smoke(),
        ClusterCommand::HpaDemo(demo_args) => hpa_demo::run(&cluster, demo_args),
        ClusterCommand::StatefulsetDemo => statefulset_demo::run(&cluster),
        ClusterCommand::Helm(helm_args) => helm::run(&cluster, helm_args),
        ClusterCommand::Matrix(matrix_args) => e2e::matrix(&args.name, matrix_args),
        ClusterCommand::E2e(e2e_args) => {
            let outcomes = e2e::run(&cluster, e2e_args)?;
            let failed = outcomes.iter().filter(|o| e2e::failed(o)).count();
            if failed > 0 {
                bail!("{failed} e2e specs failed");
            }
            Ok(())
        }
    }
}

/// Which cluster: its directory and its namespaces' prefix.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    pub dir: PathBuf,
}

impl Cluster {
    pub fn named(name: &str) -> anyhow::Result<Cluster> {
        if name.is_empty()
            || name.len() > 12
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            bail!("cluster name {name:?}: 1 to 12 lowercase letters or digits (it prefixes namespace and node names)");
        }
        let dir = if name == "kpr" {
            target_dir().join("cluster")
        } else {
            target_dir().join(format!("cluster-{name}"))
        };
        Ok(Cluster {
            name: name.to_string(),
            dir,
        })
    }

    fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub(crate) fn up(cluster: &Cluster, args: &UpArgs) -> anyhow::Result<()> {
    if cluster.state_path().exists() || !processes_of(&cluster.dir).is_empty() {
        bail!(
            "a cluster already runs in {} (or its processes do): `cargo xtask cluster down` first",
            cluster.dir.display()
        );
    }
    if args.metrics_server && args.nodes == 0 {
        bail!(
            "--metrics-server needs real nodes (--nodes N): it scrapes the kubelets, and kwok \
             nodes have none"
        );
    }
    if args.local_path && args.nodes == 0 {
        bail!(
            "--local-path needs real nodes (--nodes N): its volumes are directories on the \
             node, made by a helper Pod there, and kwok nodes run no Pods"
        );
    }
    crate::k8s::build()?;
    let real_nodes = if args.nodes > 0 {
        Some(nodes::prepare(cluster, args)?)
    } else {
        None
    };
    // The control plane's controller-manager and scheduler are the same build as the nodes'
    // agent (`--binaries`), so what a cluster measures (docs/CONFORMANCE.md's resources) is
    // one build throughout.
    let build_bin = |bin: &str| -> anyhow::Result<PathBuf> {
        match args.binaries {
            // The very build the nodes' image came from (the same package set, so the same
            // features: nothing rebuilt).
            crate::Profile::Release => crate::bench::build_release()?,
            crate::Profile::Debug => Cmd::new("cargo")
                .args(["build", "-p", "controllers", "--bin", bin])
                .dir(workspace_root())
                .run()?,
        }
        Ok(args.binaries.dir().join(bin))
    };
    let controller_manager = if args.controllers.kpr() {
        Some(build_bin("controller-manager")?)
    } else {
        None
    };
    let scheduler = if args.scheduler == Who::Kpr {
        Some(build_bin("scheduler")?)
    } else {
        None
    };
    // The processes are detached (sessions of their own), so Ctrl-C reaches only this process:
    // catch it and take down what was started so far.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let opts = Options {
        lifetime: Lifetime::Detached,
        upstream_controllers: args.controllers.upstream_list(),
        upstream_scheduler: args.scheduler == Who::Upstream,
        scheduler_program: scheduler,
        kwok_nodes: args.kwok_nodes,
        network: real_nodes.as_ref().map(|n| n.control_plane_network()),
        ..dual_stack(Options::minimal(&cluster.dir), args.ip_family)
    };
    let proxy_choice = nodes::ProxyChoice::from_args(args);
    let starting = std::thread::spawn(move || -> anyhow::Result<ControlPlane> {
        let mut cp = ControlPlane::start(opts)?;
        if let Some(binary) = controller_manager {
            let args = vec![
                format!("--kubeconfig={}", cp.admin_kubeconfig().display()),
                // Every controller on by default: the ones turned off upstream above.
                "--controllers=*".to_string(),
                // The cluster CA root-ca-cert-publisher publishes as kube-root-ca.crt (what
                // kube-controller-manager gets as its own --root-ca-file).
                format!("--root-ca-file={}", cp.pki.ca_cert.display()),
                // The CA csrsigning signs kubelets' and clients' certificates with (what
                // kube-controller-manager gets as --cluster-signing-cert-file / -key-file).
                format!("--cluster-signing-cert-file={}", cp.pki.ca_cert.display()),
                format!("--cluster-signing-key-file={}", cp.pki.ca_key.display()),
                // The key serviceaccount-token signs legacy tokens with (what
                // kube-controller-manager gets as --service-account-private-key-file; its public
                // half is kube-apiserver's --service-account-key-file).
                format!(
                    "--service-account-private-key-file={}",
                    cp.pki.sa_key.display()
                ),
            ];
            cp.spawn_program("kpr-controller-manager", &binary, args)?;
        }
        if let Some(real_nodes) = real_nodes {
            real_nodes.start(&mut cp, &proxy_choice)?;
        }
        Ok(cp)
    });
    while !starting.is_finished() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            eprintln!("interrupted: stopping what was started");
            teardown(cluster);
            std::process::exit(130);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cp = match starting.join() {
        Ok(Ok(cp)) => cp,
        Ok(Err(e)) => {
            teardown(cluster);
            return Err(e.context("starting the cluster (everything started was stopped)"));
        }
        Err(_) => {
            teardown(cluster);
            bail!("starting the cluster panicked (everything started was stopped)");
        }
    };
    describe_controllers(args.controllers);
    let kpr_alone = args.controllers.upstream_list().is_none()
        && args.controllers != Controllers::None
        && args.scheduler == Who::Kpr
        && args.nodes > 0
        && args.proxy == nodes::Proxy::Kpr;
    if kpr_alone {
        let upstream = upstream_components(&cluster.dir, &cp)?;
        if !upstream.is_empty() {
            teardown(cluster);
            bail!(
                "the cluster was to run without kube-controller-manager, kube-scheduler and \
                 kube-proxy, but these run: {} (everything started was stopped)",
                upstream.join(", ")
            );
        }
    }
    let kubeconfig = cp.admin_kubeconfig().to_path_buf();
    let server = cp.server_url();
    let logs = cp.dir.join("logs");
    let processes: Vec<_> = cp
        .release()
        .into_iter()
        .map(|(name, pid)| json!({"name": name, "pid": pid, "log": logs.join(format!("{name}.log"))}))
        .collect();
    let state = json!({
        "server": server, "kubeconfig": kubeconfig,
        "kubernetes": controlplane::kubernetes_version(), "processes": processes,
        "nodes": args.nodes,
        "binaries": args.binaries.name(),
        "ip_family": ip_family_name(args.ip_family),
        "proxy": nodes::ProxyChoice::from_args(args).describe(),
        "metrics_server": args.metrics_server,
        "local_path": args.local_path,
        "kpr_alone": kpr_alone,
    });
    fs::write(cluster.state_path(), serde_json::to_string_pretty(&state)?)?;
    println!(
        "cluster up: Kubernetes {} at {server}",
        controlplane::kubernetes_version()
    );
    for p in &processes {
        println!(
            "  {:<24} pid {:<8} log {}",
            p["name"].as_str().unwrap_or("?"),
            p["pid"],
            p["log"].as_str().unwrap_or("?")
        );
    }
    let name_flag = if cluster.name == "kpr" {
        String::new()
    } else {
        format!(" --name {}", cluster.name)
    };
    println!("use it with:  eval \"$(cargo xtask cluster{name_flag} env)\"; kubectl get nodes");
    println!("stop it with: cargo xtask cluster{name_flag} down");
    Ok(())
}

/// `opts` with both families' service and pod ranges for a dual-stack cluster.
fn dual_stack(opts: Options, families: crate::deploy::IpFamilies) -> Options {
    match families {
        crate::deploy::IpFamilies::Ipv4 => opts,
        crate::deploy::IpFamilies::Dual => Options {
            service_cidr: format!("{},{}", opts.service_cidr, network::SERVICE_CIDR6),
            cluster_cidr: format!("{},{}", opts.cluster_cidr, network::CLUSTER_CIDR6),
            ..opts
        },
    }
}

/// `--ip-family`'s value for `families`, as state.json records it.
fn ip_family_name(families: crate::deploy::IpFamilies) -> String {
    families
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// The families state.json records (IPv4 when it names none).
pub(crate) fn state_ip_families(state: &serde_json::Value) -> crate::deploy::IpFamilies {
    state["ip_family"]
        .as_str()
        .and_then(|name| crate::deploy::IpFamilies::from_str(name, false).ok())
        .unwrap_or_default()
}

pub(crate) fn down(cluster: &Cluster) -> anyhow::Result<()> {
    let stopped = teardown(cluster);
    if cluster.dir.exists() {
        fs::remove_dir_all(&cluster.dir)
            .with_context(|| format!("removing {}", cluster.dir.display()))?;
    }
    println!("cluster down: {stopped} processes stopped");
    Ok(())
}

/// Stops every process of the cluster, then what its nodes left (containers, mounts, cgroups,
/// namespaces); returns how many processes there were.
pub fn teardown(cluster: &Cluster) -> usize {
    let stopped = stop_all(&cluster.dir);
    nodes::teardown(cluster);
    stopped
}

fn env(cluster: &Cluster) -> anyhow::Result<()> {
    let state = read_state(cluster)?;
    let kubeconfig = state["kubeconfig"].as_str().unwrap_or_default();
    println!("export KUBECONFIG={kubeconfig}");
    println!("export PATH={}:$PATH", crate::k8s::bin_dir().display());
    Ok(())
}

fn status(cluster: &Cluster) -> anyhow::Result<()> {
    let state = read_state(cluster)?;
    println!("server {}", state["server"].as_str().unwrap_or("?"));
    let mut dead = 0;
    for p in state["processes"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("?");
        let pid = p["pid"].as_u64().unwrap_or(0) as u32;
        if controlplane::process::alive(pid) {
            println!("[running] {name} (pid {pid})");
        } else {
            dead += 1;
            let log = PathBuf::from(p["log"].as_str().unwrap_or_default());
            println!(
                "[DEAD] {name} (pid {pid}); last lines of {}:\n{}",
                log.display(),
                controlplane::process::tail(&log, 20)
            );
        }
    }
    if dead > 0 {
        bail!("{dead} cluster processes are not running");
    }
    Ok(())
}

/// Prints what a failure needs explaining: the machine's load, free memory and disk, and per cluster
/// process whether it runs, its CPU seconds and resident memory, and the last lines of its log.
pub(crate) fn diagnose(cluster: &Cluster) {
    println!("==> cluster diagnosis");
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default();
    println!("loadavg {}", read("/proc/loadavg").trim());
    for line in read("/proc/meminfo").lines() {
        if line.starts_with("MemTotal") || line.starts_with("MemAvailable") {
            println!("{line}");
        }
    }
    println!("disk: {}", crate::free_disk_summary());
    let Ok(state) = read_state(cluster) else {
        println!("(no cluster state)");
        return;
    };
    for p in state["processes"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("?");
        let pid = p["pid"].as_u64().unwrap_or(0) as u32;
        let log = PathBuf::from(p["log"].as_str().unwrap_or_default());
        let usage = process_usage(pid).unwrap_or_else(|| "not running".into());
        println!(
            "--- {name} (pid {pid}): {usage}; last lines of {}:\n{}",
            log.display(),
            controlplane::process::tail(&log, 15)
        );
    }
}

/// "N CPU s, M MiB resident" of a running process, from /proc (clock ticks are 100 Hz on Linux).
fn process_usage(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name, which may itself contain spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Some(format!(
        "{:.1} CPU s, {} MiB resident",
        ticks as f64 / 100.0,
        rss_kib / 1024
    ))
}

pub(crate) fn read_state(cluster: &Cluster) -> anyhow::Result<serde_json::Value> {
    let path = cluster.state_path();
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "no cluster is up ({} is missing): `cargo xtask cluster up`",
            path.display()
        )
    })?;
    Ok(serde_json::from_str(&text)?)
}

/// Every process whose command line mentions `dir` (each component is given a file in it).
/// The upstream components kpr replaces: kube-controller-manager, kube-scheduler, kube-proxy.
const UPSTREAM_COMPONENTS: [&str; 3] = ["kube-controller-manager", "kube-scheduler", "kube-proxy"];

/// Says which controllers kube-controller-manager runs beside kpr's, or what a cluster without it
/// lacks.
fn describe_controllers(who: Controllers) {
    let lacking = controllers::manager::upstream::not_replaced();
    match who {
        Controllers::Kpr if lacking.is_empty() => println!(
            "controllers: kpr's controller-manager runs every controller kube-controller-manager \
             would; kube-controller-manager not started"
        ),
        Controllers::Kpr => println!(
            "controllers: kpr's controller-manager, and kube-controller-manager for the {} kpr \
             lacks: {}",
            lacking.len(),
            lacking.join(", ")
        ),
        Controllers::KprOnly if !lacking.is_empty() => println!(
            "controllers: kpr's controller-manager alone; nobody runs what kube-controller-manager \
             would and kpr lacks: {}",
            lacking.join(", ")
        ),
        _ => {}
    }
}

/// Processes of the cluster and Pods that are kube-controller-manager, kube-scheduler or
/// kube-proxy, each named with where it was found.
fn upstream_components(dir: &Path, cp: &ControlPlane) -> anyhow::Result<Vec<String>> {
    let mut found: Vec<String> = processes_of(dir)
        .into_iter()
        .filter_map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let base = program_name(&cmdline)?;
            UPSTREAM_COMPONENTS
                .contains(&base.as_str())
                .then(|| format!("process {base} (pid {pid})"))
        })
        .collect();
    let pods: serde_json::Value =
        serde_json::from_str(&cp.kubectl_run(&["get", "pods", "-A", "-o", "json"], None)?)?;
    for pod in pods["items"].as_array().into_iter().flatten() {
        let containers = pod["spec"]["containers"].as_array().into_iter().flatten();
        for c in containers {
            let words = c["command"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(std::iter::once(&c["image"]))
                .filter_map(|w| w.as_str());
            if let Some(component) = words
                .flat_map(|w| UPSTREAM_COMPONENTS.iter().filter(move |u| w.contains(*u)))
                .next()
            {
                found.push(format!(
                    "{component} in Pod {}/{}",
                    pod["metadata"]["namespace"].as_str().unwrap_or("?"),
                    pod["metadata"]["name"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    Ok(found)
}

/// The file name of the program a `/proc/<pid>/cmdline` ran (its first word's last component).
pub(crate) fn program_name(cmdline: &[u8]) -> Option<String> {
    let program = cmdline.split(|&b| b == 0).next()?;
    let program = String::from_utf8_lossy(program);
    program.rsplit('/').next().map(str::to_string)
}

fn processes_of(dir: &Path) -> Vec<u32> {
    // With the separator: `<target>/cluster` must not match `<target>/cluster-sw`'s processes.
    let needle = format!("{}/", dir.to_string_lossy());
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// Stops every process of the cluster in `dir`; returns how many there were.
fn stop_all(dir: &Path) -> usize {
    let pids = processes_of(dir);
    std::thread::scope(|s| {
        for &pid in &pids {
            s.spawn(move || controlplane::process::terminate(pid, Duration::from_secs(10)));
        }
    });
    pids.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deploy::IpFamilies;

    #[test]
    fn state_json_records_the_families_by_their_flag_value() {
        assert_eq!(ip_family_name(IpFamilies::Dual), "dual");
        assert_eq!(ip_family_name(IpFamilies::Ipv4), "ipv4");
        for families in [IpFamilies::Ipv4, IpFamilies::Dual] {
            let state = json!({"ip_family": ip_family_name(families)});
            assert_eq!(state_ip_families(&state), families);
        }
        assert_eq!(state_ip_families(&json!({})), IpFamilies::Ipv4);
    }
}
