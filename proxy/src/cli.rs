//! The `proxy` command line. Flags keep kube-proxy's names where they mean the same thing.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use ipnet::IpNet;

use crate::model::Algorithm;

/// kpr: a kube-proxy replacement with userspace, iptables, nftables and eBPF dataplanes.
#[derive(Debug, Parser)]
#[command(name = "proxy", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Parses a command line like `Cli::try_parse_from`, and for `run` also records which flags were
/// given (on the command line or through their environment variable): those win over a
/// `--config` file, the others take the file's value.
pub fn parse_from<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command().try_get_matches_from(argv)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let (Command::Run(args), Some(("run", run))) = (&mut cli.command, matches.subcommand()) {
        args.given = run
            .ids()
            .filter(|id| {
                matches!(
                    run.value_source(id.as_str()),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            })
            .map(|id| id.as_str().to_string())
            .collect();
    }
    Ok(cli)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: watch Services and EndpointSlices and program the dataplane.
    Run(Box<RunArgs>),
    /// Show what a running agent has programmed: Services, endpoints, active connections, last sync.
    Inspect(InspectArgs),
    /// Which Service, endpoint set and decision a new connection gets, from the eBPF backend's
    /// pinned maps or the nftables backend's tables as they are (works while the agent is down).
    Trace(TraceArgs),
    /// Remove everything a backend ever installed (rules, tables, maps, pins, attachments).
    Cleanup(CleanupArgs),
}

pub use crate::dataplane::Backend;

/// What `proxy cleanup --backend` removes: one backend's leftovers, or (`all`) every backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupTarget {
    All,
    One(Backend),
}

impl CleanupTarget {
    /// The backends to clean, in order.
    pub fn backends(self) -> Vec<Backend> {
        match self {
            CleanupTarget::All => Backend::ALL.to_vec(),
            CleanupTarget::One(b) => vec![b],
        }
    }
}

impl std::str::FromStr for CleanupTarget {
    type Err = crate::error::DataplaneError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(CleanupTarget::All),
            one => one.parse().map(CleanupTarget::One),
        }
    }
}

/// Where Services and EndpointSlices come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceArg {
    /// `kube`: the Kubernetes API (kubeconfig or in-cluster).
    Kube,
    /// `file:DIR`: a directory of manifests, reloaded on change.
    File(PathBuf),
}

fn parse_source(s: &str) -> Result<SourceArg, String> {
    match s.split_once(':') {
        _ if s == "kube" => Ok(SourceArg::Kube),
        Some(("file", dir)) if !dir.is_empty() => Ok(SourceArg::File(PathBuf::from(dir))),
        _ => Err(format!("expected `kube` or `file:DIR`, found {s:?}")),
    }
}

/// One `--nodeport-addresses` entry: a CIDR, or kube-proxy's `primary` (the Node's primary
/// addresses, one per family: resolved at start, see `cmd::run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddress {
    Cidr(IpNet),
    Primary,
}

impl std::fmt::Display for NodePortAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodePortAddress::Cidr(n) => n.fmt(f),
            NodePortAddress::Primary => f.write_str("primary"),
        }
    }
}

fn parse_nodeport_address(s: &str) -> Result<NodePortAddress, String> {
    match s {
        "primary" => Ok(NodePortAddress::Primary),
        _ => parse_cidr(s)
            .map(NodePortAddress::Cidr)
            .map_err(|e| format!("{e}, or `primary`")),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 100ms, 30s or 1m: {e}"))
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s)
        .ok_or_else(|| format!("expected round-robin, least-conn or maglev, found {s:?}"))
}

fn parse_table_size(s: &str) -> Result<crate::maglev::TableSize, String> {
    s.parse()
}

/// Largest map size accepted (entries): far beyond any cluster, short of sizes whose
/// preallocation alone would take gigabytes.
const MAP_SIZE_MAX: u32 = 1 << 26;

fn parse_map_size(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of entries"))?;
    if !(1..=MAP_SIZE_MAX).contains(&n) {
        return Err(format!("{n} entries: a map size is 1 to {MAP_SIZE_MAX}"));
    }
    Ok(n)
}

fn parse_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map(|n| n.trunc())
        .map_err(|_| format!("{s:?} is not a CIDR like 10.244.0.0/16"))
}

#[derive(Debug, Clone, PartialEq, Args)]
pub struct RunArgs {
    /// kube-proxy's configuration file: a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1,
    /// YAML or JSON), e.g. the `config.conf` of kubeadm's kube-proxy ConfigMap. Its fields set the
    /// flags not given on the command line; a field kpr does not implement is reported at start.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Dataplane backend (with --config, the file's `mode` unless this flag is given).
    #[arg(long, value_enum, default_value = "userspace")]
    pub backend: Backend,
    /// `kube` or `file:DIR`.
    #[arg(long, value_parser = parse_source, default_value = "kube")]
    pub source: SourceArg,
    /// kubeconfig for the kube source (default: in-cluster, then $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Node-wide balancing algorithm; a Service overrides it with the annotation kpr.io/balance.
    #[arg(long, value_parser = parse_algorithm, default_value = "round-robin")]
    pub balance: Algorithm,
    /// Slots of every Maglev table (Services balanced with maglev): a prime, the same on every
    /// node so that a flow picks the same endpoint on each; more than 100 x a Service's
    /// endpoints is recommended. The iptables backend takes at most 16381 and writes about one
    /// rule per slot per Maglev Service port (a smaller prime keeps its rule count down).
    #[arg(long, default_value = "16381", value_parser = parse_table_size)]
    pub maglev_table_size: crate::maglev::TableSize,
    /// This node's name (endpoints with this nodeName are local). Default: the host name.
    #[arg(long, env = "NODE_NAME")]
    pub hostname_override: Option<String>,
    /// Pod CIDRs: sources inside are pod sources (comma-separated).
    #[arg(long, value_parser = parse_cidr, value_delimiter = ',')]
    pub cluster_cidr: Vec<IpNet>,
    /// Service CIDRs: traffic to an unallocated address inside is dropped (comma-separated).
    #[arg(long, value_parser = parse_cidr, value_delimiter = ',')]
    pub service_cluster_ip_range: Vec<IpNet>,
    /// Node addresses that accept nodePort traffic (comma-separated CIDRs; `primary`: the Node's
    /// primary address of each family, as kube-proxy's, from the Node object with `--source
    /// kube`, else from the interface of the default route). Default: all node IPs.
    #[arg(long, value_parser = parse_nodeport_address, value_delimiter = ',')]
    pub nodeport_addresses: Vec<NodePortAddress>,
    /// Masquerade (SNAT) all Service traffic.
    #[arg(long)]
    pub masquerade_all: bool,
    /// At most one sync per this period.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub min_sync_period: Duration,
    /// A sync at least this often.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub sync_period: Duration,
    /// A full resync at least this often.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    pub full_sync_period: Duration,
    /// How long an idle UDP session of the userspace backend is kept.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub udp_idle_timeout: Duration,
    /// Metrics and /state address.
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub metrics_bind_address: SocketAddr,
    /// /healthz address.
    #[arg(long, default_value = "0.0.0.0:10256")]
    pub healthz_bind_address: SocketAddr,
    /// Exit when the metrics or healthz address is taken, instead of serving without it and
    /// binding it once free (kube-proxy's flag and default).
    #[arg(long)]
    pub bind_address_hard_fail: bool,
    /// After the first sync has programmed this backend, remove what the other backends left
    /// on the node (as `proxy cleanup --backend B` for each), so switching backends is make
    /// before break: the previous backend's rules serve until this one's do.
    #[arg(long)]
    pub cleanup_other_backends: bool,
    /// kpr's own /healthz and /readyz address, for the DaemonSet's probes (deploy/proxy.yaml:
    /// 0.0.0.0:10266): unlike the healthz address, no kube-proxy on the node answers it. A
    /// taken address fails the start.
    #[arg(long)]
    pub readiness_bind_address: Option<SocketAddr>,
    /// cgroup v2 directory the eBPF socket programs attach to (default: the cgroup2 mount root).
    #[arg(long)]
    pub cgroup_path: Option<PathBuf>,
    /// bpffs directory where the eBPF backend pins maps and links.
    #[arg(long, default_value = "/sys/fs/bpf/kpr")]
    pub bpffs_path: PathBuf,
    /// eBPF map sizes (entries). A map pinned by an earlier agent with another size is resized
    /// at start with its entries carried over; the start log gives each map's kernel memory.
    /// Frontends (address, port, protocol) and backend sets: KPR_SERVICES, KPR_RR.
    #[arg(long, default_value_t = 262_144, value_parser = parse_map_size)]
    pub bpf_lb_services_max: u32,
    /// eBPF: backend slots over all sets (KPR_SLOTS; a maglev Service takes
    /// --maglev-table-size slots per set).
    #[arg(long, default_value_t = 1_048_576, value_parser = parse_map_size)]
    pub bpf_lb_slots_max: u32,
    /// eBPF: distinct endpoints (KPR_BACKENDS, KPR_COUNTERS).
    #[arg(long, default_value_t = 1_048_576, value_parser = parse_map_size)]
    pub bpf_lb_backends_max: u32,
    /// eBPF: session-affinity entries (KPR_AFFINITY, LRU: allocated whole at creation).
    #[arg(long, default_value_t = 65_536, value_parser = parse_map_size)]
    pub bpf_affinity_max: u32,
    /// eBPF: translated sockets tracked for least-connection and socket destruction (KPR_SOCKS).
    #[arg(long, default_value_t = 262_144, value_parser = parse_map_size)]
    pub bpf_sockets_max: u32,
    /// eBPF: reverse translations and unconnected-UDP flows (KPR_REVNAT, KPR_UDP_FWD; LRU:
    /// allocated whole at creation).
    #[arg(long, default_value_t = 262_144, value_parser = parse_map_size)]
    pub bpf_flows_max: u32,
    /// eBPF: flows of traffic from outside the node tracked by the tc program (KPR_CT; LRU:
    /// allocated whole at creation).
    #[arg(long, default_value_t = 262_144, value_parser = parse_map_size)]
    pub bpf_ct_max: u32,
    /// eBPF: loadBalancerSourceRanges entries (KPR_SRC_RANGES).
    #[arg(long, default_value_t = 65_536, value_parser = parse_map_size)]
    pub bpf_source_ranges_max: u32,
    /// eBPF: the node's external interfaces (comma-separated) that get the XDP program, in native
    /// mode: NodePort / externalIP / LoadBalancer flows whose packets go straight back out (to a
    /// backend on another node, or the reply to an outside client) are translated there, before
    /// the kernel builds an skb. An interface where XDP cannot attach keeps the tc path (said at
    /// start). Empty: tc only.
    #[arg(long, value_delimiter = ',')]
    pub xdp_interfaces: Vec<String>,
    /// eBPF: how NodePort / externalIP / LoadBalancer traffic (externalTrafficPolicy Cluster) from
    /// outside goes to a backend: `snat` masquerades it to the node (replies come back through
    /// it); `dsr` keeps the client's address and carries the Service address to the backend's
    /// node in an IPv4 option, whose agent (dsr or hybrid too) answers the client directly
    /// (IPv4 only; docs/ARCHITECTURE.md lists the limits); `hybrid`: dsr for TCP, snat for UDP.
    #[arg(long, value_enum, default_value = "snat")]
    pub nodeport_mode: crate::dataplane::NodePortMode,
    /// iptables flavour: legacy or nft (default: detected).
    #[arg(long, value_parser = ["legacy", "nft"])]
    pub iptables_mode: Option<String>,
    /// Maximum number of NAT connections to track per CPU core (0 leaves nf_conntrack_max as it
    /// is and ignores --conntrack-min). nf_conntrack_max is global to the host: it is set only
    /// where it can be, as kube-proxy does.
    #[arg(long, default_value_t = 32 * 1024)]
    pub conntrack_max_per_core: u32,
    /// Minimum nf_conntrack_max, whatever --conntrack-max-per-core gives.
    #[arg(long, default_value_t = 128 * 1024)]
    pub conntrack_min: u32,
    /// Where the node network namespace's `net` sysctls are (`/proc/sys/net`). A container that
    /// is not privileged has /proc/sys read-only: deploy/proxy.yaml mounts the node's
    /// /proc/sys/net writable elsewhere (a procfs file reads and writes the namespace of the
    /// process using it, so through the mount the agent sets its own, the node's) and names it here.
    #[arg(long, default_value = "/proc/sys/net")]
    pub sysctl_net_path: PathBuf,
    /// nf_conntrack_tcp_timeout_established of the node's network namespace (0 leaves it as is).
    #[arg(long, value_parser = parse_duration, default_value = "24h")]
    pub conntrack_tcp_timeout_established: Duration,
    /// nf_conntrack_tcp_timeout_close_wait of the node's network namespace (0 leaves it as is).
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    pub conntrack_tcp_timeout_close_wait: Duration,
    /// Set nf_conntrack_tcp_be_liberal (out-of-window TCP packets are not marked INVALID).
    #[arg(long)]
    pub conntrack_tcp_be_liberal: bool,
    /// nf_conntrack_udp_timeout (UNREPLIED UDP) of the node's network namespace (0 leaves it).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub conntrack_udp_timeout: Duration,
    /// nf_conntrack_udp_timeout_stream (ASSURED UDP) of the node's network namespace (0 leaves
    /// it).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub conntrack_udp_timeout_stream: Duration,
    /// The flags given on the command line or by environment (clap ids), filled by
    /// [`parse_from`]: a `--config` file does not override them.
    #[arg(skip)]
    pub given: BTreeSet<String>,
}

impl RunArgs {
    /// Whether the flag with this clap id (the field name) was given rather than defaulted.
    pub fn was_given(&self, id: &str) -> bool {
        self.given.contains(id)
    }
}

#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The agent's metrics address (where /state is served).
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub metrics_bind_address: SocketAddr,
    /// Print JSON instead of tables (the agent's /state, or with --maps the map snapshot).
    #[arg(long)]
    pub json: bool,
    /// eBPF backend: read the pinned maps under --bpffs-path instead of asking the agent
    /// (frontends, backends, active connections, affinity entries; works while the agent is down).
    #[arg(long)]
    pub maps: bool,
    /// bpffs directory of the eBPF backend's pins (with --maps).
    #[arg(long, default_value = "/sys/fs/bpf/kpr")]
    pub bpffs_path: PathBuf,
}

/// A destination `ADDR:PORT/PROTO` or `[ADDR]:PORT/PROTO` (protocol tcp, udp or sctp; default
/// tcp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceDestination {
    pub addr: std::net::IpAddr,
    pub port: u16,
    pub proto: crate::model::Protocol,
}

fn parse_destination(s: &str) -> Result<TraceDestination, String> {
    let (addr_port, proto) = s.split_once('/').unwrap_or((s, "tcp"));
    let proto = match proto.to_ascii_lowercase().as_str() {
        "tcp" => crate::model::Protocol::Tcp,
        "udp" => crate::model::Protocol::Udp,
        "sctp" => crate::model::Protocol::Sctp,
        other => return Err(format!("protocol {other:?}: expected tcp, udp or sctp")),
    };
    let sa: std::net::SocketAddr = addr_port.parse().map_err(|_| {
        format!("{addr_port:?} is not an ADDR:PORT like 10.96.0.10:80 or [fd00:10:96::a]:80")
    })?;
    Ok(TraceDestination {
        addr: sa.ip(),
        port: sa.port(),
        proto,
    })
}

/// The backends `proxy trace` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceBackend {
    /// The pinned maps under --bpffs-path.
    Ebpf,
    /// The `ip kpr` / `ip6 kpr` table of this network namespace (run it in the node's).
    Nftables,
    /// The `KPR-` chains of this network namespace (`iptables-save` / `ip6tables-save` of
    /// --iptables-mode; run it in the node's).
    Iptables,
    /// The `kpr-userspace` table of this network namespace and the running agent's listeners
    /// (`GET /trace` on --metrics-bind-address).
    Userspace,
}

#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// Whose state to read.
    #[arg(long, value_enum, default_value = "ebpf")]
    pub backend: TraceBackend,
    /// The client's address (IPv4 or IPv6, of the destination's family).
    pub src: std::net::IpAddr,
    /// The destination, `ADDR:PORT/PROTO` (e.g. 10.96.0.10:80/tcp, [fd00:10:96::a]:80/tcp).
    #[arg(value_parser = parse_destination)]
    pub dst: TraceDestination,
    /// The connection comes from outside the node (tc path: NodePort, externalIP, LB IP);
    /// default: a socket on the node or in a pod (cgroup programs).
    #[arg(long)]
    pub from_outside: bool,
    /// The client's source port: Maglev Services hash it with the addresses and the Service
    /// port (on the socket path, the port the socket bound before connect()).
    #[arg(long)]
    pub src_port: Option<u16>,
    /// With --from-outside: the interface the client's packets arrive on (default: the one the
    /// node routes the client's address by). Says which hook, XDP or tc, carries the flow.
    #[arg(long, requires = "from_outside")]
    pub in_interface: Option<String>,
    /// The client's network namespace (e.g. /run/netns/NAME, /proc/PID/ns/net): socket-path
    /// session affinity is keyed by it.
    #[arg(long)]
    pub netns: Option<PathBuf>,
    /// bpffs directory of the eBPF backend's pins.
    #[arg(long, default_value = "/sys/fs/bpf/kpr")]
    pub bpffs_path: PathBuf,
    /// The iptables backend's mode (`legacy` or `nft`); default: the one whose tables hold
    /// rules, as the agent detects it.
    #[arg(long)]
    pub iptables_mode: Option<String>,
    /// The userspace backend: the agent's metrics address (where `/trace` is served).
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub metrics_bind_address: SocketAddr,
}

#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// Which backend's leftovers to remove; `all` removes every backend's.
    #[arg(long, default_value = "all")]
    pub backend: CleanupTarget,
    /// bpffs directory of the eBPF backend's pins.
    #[arg(long, default_value = "/sys/fs/bpf/kpr")]
    pub bpffs_path: PathBuf,
    /// cgroup the eBPF programs were attached to.
    #[arg(long)]
    pub cgroup_path: Option<PathBuf>,
    /// iptables flavour: legacy or nft (default: both).
    #[arg(long, value_parser = ["legacy", "nft"])]
    pub iptables_mode: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_flags_parse_like_kube_proxy() {
        let cli = Cli::try_parse_from([
            "proxy",
            "run",
            "--backend",
            "nftables",
            "--source",
            "file:/tmp/m",
            "--balance",
            "least-conn",
            "--hostname-override",
            "n1",
            "--cluster-cidr",
            "10.244.0.0/16,fd00::/64",
            "--min-sync-period",
            "100ms",
            "--nodeport-addresses",
            "192.0.2.0/24",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.backend, Backend::Nftables);
        assert_eq!(r.source, SourceArg::File("/tmp/m".into()));
        assert_eq!(r.balance, Algorithm::LeastConn);
        assert_eq!(r.cluster_cidr.len(), 2);
        assert_eq!(r.min_sync_period, Duration::from_millis(100));
    }

    #[test]
    fn map_size_flags_set_the_ebpf_maps_and_reject_sizes_out_of_range() {
        let Command::Run(r) = Cli::try_parse_from([
            "proxy",
            "run",
            "--bpf-ct-max",
            "1048576",
            "--bpf-flows-max=4096",
        ])
        .unwrap()
        .command
        else {
            panic!("run")
        };
        assert_eq!((r.bpf_ct_max, r.bpf_flows_max), (1_048_576, 4096));
        assert_eq!(r.bpf_affinity_max, 65_536, "the default");
        let e = Cli::try_parse_from(["proxy", "run", "--bpf-lb-services-max", "0"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--bpf-lb-services-max") && e.contains("1 to"),
            "{e}"
        );
        let e = Cli::try_parse_from(["proxy", "run", "--bpf-ct-max", "lots"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a number of entries"), "{e}");
    }

    #[test]
    fn trace_destination_parses_address_port_and_protocol() {
        let cli = Cli::try_parse_from(["proxy", "trace", "10.0.0.1", "10.96.0.10:53/udp"]).unwrap();
        let Command::Trace(t) = cli.command else {
            panic!("not trace")
        };
        assert_eq!(t.dst.port, 53);
        assert_eq!(t.dst.proto, crate::model::Protocol::Udp);
        assert_eq!(t.backend, TraceBackend::Ebpf, "the default");
        let cli = Cli::try_parse_from([
            "proxy",
            "trace",
            "--backend",
            "nftables",
            "10.0.0.1",
            "10.96.0.10:53/udp",
        ])
        .unwrap();
        let Command::Trace(t) = cli.command else {
            panic!("not trace")
        };
        assert_eq!(t.backend, TraceBackend::Nftables);
        let cli = Cli::try_parse_from([
            "proxy",
            "trace",
            "--backend",
            "iptables",
            "--iptables-mode",
            "legacy",
            "10.0.0.1",
            "10.96.0.10:80",
        ])
        .unwrap();
        let Command::Trace(t) = cli.command else {
            panic!("not trace")
        };
        assert_eq!(t.backend, TraceBackend::Iptables);
        assert_eq!(t.iptables_mode.as_deref(), Some("legacy"));
        let cli = Cli::try_parse_from([
            "proxy",
            "trace",
            "--backend",
            "userspace",
            "--metrics-bind-address",
            "127.0.0.1:20249",
            "10.0.0.1",
            "10.96.0.10:80",
        ])
        .unwrap();
        let Command::Trace(t) = cli.command else {
            panic!("not trace")
        };
        assert_eq!(t.backend, TraceBackend::Userspace);
        assert_eq!(t.metrics_bind_address.port(), 20249);
        let e = Cli::try_parse_from(["proxy", "trace", "10.0.0.1", "10.96.0.10:80/icmp"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected tcp, udp or sctp"), "{e}");
        let e = Cli::try_parse_from(["proxy", "trace", "10.0.0.1", "10.96.0.10"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not an ADDR:PORT"), "{e}");
        let cli = Cli::try_parse_from(["proxy", "trace", "fd00::1", "[fd00:10:96::a]:80"]).unwrap();
        let Command::Trace(t) = cli.command else {
            panic!("not trace")
        };
        assert_eq!(
            t.dst.addr,
            "fd00:10:96::a".parse::<std::net::IpAddr>().unwrap()
        );
        assert_eq!((t.dst.port, t.dst.proto), (80, crate::model::Protocol::Tcp));
    }

    #[test]
    fn parse_from_records_the_given_run_flags() {
        let cli = parse_from(["proxy", "run", "--backend", "ebpf", "--conntrack-min=5"]).unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert!(r.was_given("backend") && r.was_given("conntrack_min"));
        assert!(!r.was_given("sync_period") && !r.was_given("config"));
        assert_eq!(r.sync_period, Duration::from_secs(30), "defaulted");
    }

    #[test]
    fn bad_values_say_what_was_expected() {
        let e = Cli::try_parse_from(["proxy", "run", "--source", "etcd"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected `kube` or `file:DIR`"), "{e}");
        let e = Cli::try_parse_from(["proxy", "run", "--cluster-cidr", "10.0.0.0/33"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a CIDR"), "{e}");
        let e = Cli::try_parse_from(["proxy", "run", "--maglev-table-size", "16384"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--maglev-table-size 16384: is not a prime"),
            "{e}"
        );
        let Command::Run(r) = Cli::try_parse_from(["proxy", "run", "--balance", "maglev"])
            .unwrap()
            .command
        else {
            panic!("not run")
        };
        assert_eq!(
            (r.balance, r.maglev_table_size.get()),
            (Algorithm::Maglev, 16381)
        );
    }
}
