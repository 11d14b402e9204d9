//! `proxy run`: assembles source, tracker, sync runner, dataplane and HTTP endpoints.

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::{bail, Context};
use ipnet::IpNet;
use proxy::cli::{NodePortAddress, RunArgs, SourceArg};
use proxy::dataplane::{self, Backend, BackendConfig};
use proxy::metrics::Metrics;
use proxy::selection::NodeContext;
use proxy::status::Health;
use proxy::sync::{Runner, SyncTiming};
use proxy::tracker::Tracker;
use proxy::{server, source};
use tokio::sync::mpsc;

/// The node's own addresses: every non-loopback address in this network namespace, once.
fn node_addresses() -> anyhow::Result<Vec<IpAddr>> {
    let mut ips = Vec::new();
    for (_, ip) in proxy::node_ips::interface_addresses().context("listing interface addresses")? {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok(ips)
}

/// `--nodeport-addresses` as CIDRs: `primary` is the Node's primary address of each family,
/// as kube-proxy reads it (the Node object, with `--source kube`), else the addresses of the
/// default routes' interfaces (node_ips).
async fn nodeport_addresses(args: &RunArgs, node_name: &str) -> anyhow::Result<Vec<IpNet>> {
    let mut out: Vec<IpNet> = Vec::new();
    for a in &args.nodeport_addresses {
        let primary = match a {
            NodePortAddress::Cidr(n) => {
                out.push(*n);
                continue;
            }
            NodePortAddress::Primary => primary_addresses(args, node_name).await?,
        };
        out.extend(primary.into_iter().map(IpNet::from));
    }
    out.dedup();
    Ok(out)
}

async fn primary_addresses(args: &RunArgs, node_name: &str) -> anyhow::Result<Vec<IpAddr>> {
    if args.source == SourceArg::Kube {
        let read = match source::kube::client(args.kubeconfig.as_deref()).await {
            Ok(client) => source::kube::primary_node_ips(client, node_name).await,
            Err(e) => Err(e.to_string()),
        };
        match read {
            Ok(ips) if !ips.is_empty() => {
                tracing::info!(
                    ?ips,
                    "--nodeport-addresses primary: the Node {node_name}'s addresses"
                );
                return Ok(ips);
            }
            Ok(_) => tracing::warn!(
                "--nodeport-addresses primary: the Node {node_name} lists no InternalIP or \
                 ExternalIP; using the default routes' interfaces"
            ),
            Err(e) => tracing::warn!(
                "--nodeport-addresses primary: cannot read the Node {node_name} ({e}); using the \
                 default routes' interfaces"
            ),
        }
    }
    let ips = proxy::node_ips::of_default_routes().context("listing interface addresses")?;
    if ips.is_empty() {
        bail!(
            "--nodeport-addresses primary: no Node object and no default route to take the \
             node's primary address from; give the CIDRs"
        );
    }
    tracing::info!(
        ?ips,
        "--nodeport-addresses primary: the default routes' interfaces"
    );
    Ok(ips)
}

async fn backend_config(args: &RunArgs) -> anyhow::Result<BackendConfig> {
    let node_name = match &args.hostname_override {
        Some(n) => n.clone(),
        None => nix::unistd::gethostname()
            .context("reading the host name")?
            .to_string_lossy()
            .into_owned(),
    };
    let nodeport_addresses = nodeport_addresses(args, &node_name).await?;
    let node = NodeContext {
        node_name,
        cluster_cidrs: args.cluster_cidr.clone(),
        node_ips: node_addresses()?,
        masquerade_all: args.masquerade_all,
        zone: None,
        maglev_table_size: args.maglev_table_size,
    };
    Ok(BackendConfig {
        node,
        nodeport_addresses,
        service_cidrs: args.service_cluster_ip_range.clone(),
        default_algorithm: args.balance,
        udp_idle_timeout: args.udp_idle_timeout,
        cgroup_path: args.cgroup_path.clone(),
        bpffs_path: args.bpffs_path.clone(),
        iptables_mode: args.iptables_mode.clone(),
        ebpf_map_sizes: proxy::dataplane::ebpf::MapSizes {
            services: args.bpf_lb_services_max,
            backend_slots: args.bpf_lb_slots_max,
            backends: args.bpf_lb_backends_max,
            affinity: args.bpf_affinity_max,
            sockets: args.bpf_sockets_max,
            flows: args.bpf_flows_max,
            conntrack: args.bpf_ct_max,
            dsr_flows: args.bpf_ct_max,
            source_ranges: args.bpf_source_ranges_max,
        },
        xdp_interfaces: args.xdp_interfaces.clone(),
        nodeport_mode: args.nodeport_mode,
    })
}

async fn start_source(
    args: &RunArgs,
    node_name: &str,
    tx: mpsc::Sender<source::SourceEvent>,
) -> anyhow::Result<()> {
    match &args.source {
        SourceArg::File(dir) => {
            let balance = args.balance;
            if !dir.is_dir() {
                bail!("--source file:{}: not a directory", dir.display());
            }
            let dir = dir.clone();
            let node_name = node_name.to_string();
            tokio::spawn(async move {
                let rescan = std::time::Duration::from_secs(5);
                if let Err(e) = source::file::run(dir.clone(), tx, rescan, balance, node_name).await
                {
                    tracing::error!("file source {}: {e}", dir.display());
                }
            });
        }
        SourceArg::Kube => {
            let client = source::kube::client(args.kubeconfig.as_deref())
                .await
                .context("building the Kubernetes client")?;
            tokio::spawn(source::kube::run(
                client,
                tx,
                args.balance,
                node_name.to_string(),
            ));
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Says whether the eBPF backend starts fresh or reuses what an earlier agent pinned.
fn log_pins(bpffs_path: &std::path::Path) {
    match proxy::dataplane::ebpf::inspect::pinned(bpffs_path) {
        (0, 0) => tracing::info!(
            "ebpf: nothing pinned under {}: starting fresh",
            bpffs_path.display()
        ),
        (maps, links) => tracing::info!(
            "ebpf: reusing {maps} pinned maps and {links} pinned links under {} (their state \
             is kept; links are replaced after the new programs attach)",
            bpffs_path.display()
        ),
    }
}

/// A failed eBPF start also says which kernel features are missing, when a probe finds some.
fn explain_ebpf_failure(backend: proxy::cli::Backend, e: anyhow::Error) -> anyhow::Error {
    if backend != proxy::cli::Backend::Ebpf {
        return e;
    }
    match proxy::dataplane::ebpf::features::missing() {
        Some(missing) => e.context(format!("kernel feature missing: {missing}")),
        None => e,
    }
}

/// With `--config`, the flags as the file sets them (given flags win); every field kpr does not
/// implement is logged, and any that would change how traffic is handled stops the start.
fn resolve_config(args: RunArgs) -> anyhow::Result<RunArgs> {
    use proxy::kube_proxy_config::{self as kpc, Severity};
    let Some(path) = args.config.clone() else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading --config {}", path.display()))?;
    let file = kpc::parse(&text).with_context(|| format!("--config {}", path.display()))?;
    let (resolved, findings) =
        kpc::apply(&file, &args).with_context(|| format!("--config {}", path.display()))?;
    let mut errors = Vec::new();
    for f in &findings {
        match f.severity {
            Severity::Info => tracing::info!("--config {}: {f}", path.display()),
            Severity::Warning => tracing::warn!("--config {}: {f}", path.display()),
            Severity::Error => errors.push(f.to_string()),
        }
    }
    if !errors.is_empty() {
        bail!(
            "--config {}: kpr does not implement what these fields ask, and ignoring them would \
             change how traffic is handled:\n  {}",
            path.display(),
            errors.join("\n  ")
        );
    }
    tracing::info!(config = %path.display(), "settings read from the KubeProxyConfiguration file");
    Ok(resolved)
}

/// The conntrack sysctls, set in this (the node's) network namespace as kube-proxy sets them.
fn setup_conntrack(args: &RunArgs) -> anyhow::Result<()> {
    use proxy::conntrack::sysctls::{self, ConntrackSettings, Outcome, Paths};
    let settings = ConntrackSettings {
        max_per_core: args.conntrack_max_per_core,
        min: args.conntrack_min,
        tcp_established_timeout: args.conntrack_tcp_timeout_established,
        tcp_close_wait_timeout: args.conntrack_tcp_timeout_close_wait,
        tcp_be_liberal: args.conntrack_tcp_be_liberal,
        udp_timeout: args.conntrack_udp_timeout,
        udp_stream_timeout: args.conntrack_udp_timeout_stream,
    };
    for (flag, d) in [
        (
            "--conntrack-tcp-timeout-established",
            settings.tcp_established_timeout,
        ),
        (
            "--conntrack-tcp-timeout-close-wait",
            settings.tcp_close_wait_timeout,
        ),
        ("--conntrack-udp-timeout", settings.udp_timeout),
        (
            "--conntrack-udp-timeout-stream",
            settings.udp_stream_timeout,
        ),
    ] {
        proxy::kube_proxy_config::check_whole_seconds(flag, d)?;
    }
    let paths = Paths {
        netfilter: args.sysctl_net_path.join("netfilter"),
        ..Paths::default()
    };
    let applied = sysctls::apply(&settings, sysctls::cpu_count(), &paths)
        .context("setting the conntrack sysctls (--conntrack-*)")?;
    for a in applied {
        let path = a.path.display();
        match a.outcome {
            Outcome::Set { from } => {
                tracing::info!("conntrack: set {path} to {} (was {from})", a.value)
            }
            Outcome::Unchanged => tracing::debug!("conntrack: {path} is already {}", a.value),
            Outcome::Skipped { reason } => tracing::warn!(
                "conntrack: could not set {path} to {}: {reason}; it is left as it is (host-wide \
                 settings can only be changed from the host's network namespace, and a \
                 container needs a writable /proc/sys/net: --sysctl-net-path)",
                a.value
            ),
        }
    }
    Ok(())
}

/// `--cleanup-other-backends`: once the first sync has programmed this backend, removes the other
/// backends' state from the node (in the background; each outcome logged). Before, the
/// previous backend (an agent of the same DaemonSet that just exited) goes on serving.
fn cleanup_other_backends_once_programmed(args: &RunArgs, health: Arc<Health>) {
    let others: Vec<Backend> = Backend::ALL
        .iter()
        .copied()
        .filter(|&b| b != args.backend)
        .collect();
    let cfg = BackendConfig {
        bpffs_path: args.bpffs_path.clone(),
        cgroup_path: args.cgroup_path.clone(),
        ..BackendConfig::default()
    };
    tokio::spawn(async move {
        health.first_programmed().await;
        let done = tokio::task::spawn_blocking(move || super::cleanup::clean(&others, &cfg)).await;
        match done {
            Ok(done) => {
                for (b, outcome) in done {
                    match outcome {
                        Ok(()) => {
                            tracing::info!("first sync done: the {b} backend's state is cleaned up")
                        }
                        Err(e) => tracing::error!("cleaning up the {b} backend's state: {e}"),
                    }
                }
            }
            Err(e) => {
                tracing::error!("cleaning up the other backends' state: the task failed: {e}")
            }
        }
    });
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let args = resolve_config(args)?;
    let size = args.maglev_table_size.get();
    if args.backend == proxy::cli::Backend::Iptables
        && size > proxy::maglev::IPTABLES_MAX_TABLE_SIZE
    {
        bail!(
            "--maglev-table-size {size}: the iptables backend takes tables of at most {} slots \
             (it carries a flow's slot in the packet mark below the masquerade bit 0x4000); \
             use a smaller prime, or --backend nftables, ebpf or userspace",
            proxy::maglev::IPTABLES_MAX_TABLE_SIZE
        );
    }
    let cfg = backend_config(&args).await?;
    tracing::info!(backend = args.backend.as_str(), node = %cfg.node.node_name, node_ips = ?cfg.node.node_ips, "starting");
    if args.backend == proxy::cli::Backend::Ebpf {
        log_pins(&cfg.bpffs_path);
    }
    let dp = dataplane::build(args.backend, &cfg)
        .map_err(|e| explain_ebpf_failure(args.backend, e.into()))
        .with_context(|| format!("starting the {} backend", args.backend.as_str()))?;
    // After the backend: its rules load nf_conntrack, whose sysctls only exist once it is loaded.
    setup_conntrack(&args)?;
    let metrics = Arc::new(Metrics::with_collectors(
        dp.collector().into_iter().collect(),
    ));
    let health = Arc::new(Health::default());
    let (ev_tx, ev_rx) = mpsc::channel(4096);
    let (q_tx, q_rx) = mpsc::channel(16);
    let health_timeout = (args.sync_period * 2).max(std::time::Duration::from_secs(60));
    server::start(
        server::Listeners {
            metrics: args.metrics_bind_address,
            healthz: args.healthz_bind_address,
            readiness: args.readiness_bind_address,
            hard_fail: args.bind_address_hard_fail,
        },
        metrics.clone(),
        health.clone(),
        health_timeout,
        q_tx,
    )
    .await?;
    if args.cleanup_other_backends {
        cleanup_other_backends_once_programmed(&args, health.clone());
    }
    start_source(&args, &cfg.node.node_name, ev_tx).await?;
    let timing = SyncTiming {
        min_sync_period: args.min_sync_period,
        sync_period: args.sync_period,
        full_sync_period: args.full_sync_period,
    };
    let runner = Runner::new(
        Tracker::new(args.balance, cfg.node.clone()),
        dp,
        timing,
        metrics,
        health,
    );
    tokio::select! {
        _ = runner.run(ev_rx, q_rx) => {}
        _ = shutdown_signal() => tracing::info!("terminating; the dataplane stays programmed for the next start"),
    }
    Ok(())
}
