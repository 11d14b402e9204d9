//! The `Dataplane` trait: what a backend must do with the core's selected endpoints.
//!
//! A backend is a compiler from [`ProxyState`] to its own dataplane. It never re-decides which
//! endpoint is usable (that is `selection`'s job) and it touches only the service ports named in the
//! [`ChangeSet`], except on a full sync.

use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::error::DataplaneError;
use crate::model::Algorithm;
use crate::selection::NodeContext;
use crate::state::{ChangeSet, LiveView, ProxyState, SyncStats};

pub mod ebpf;
pub mod iptables;
pub mod nftables;
pub mod rules;
pub mod userspace;

/// Which dataplane programs the Services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Backend {
    /// A proxy in this process that owns every connection (nftables redirect).
    Userspace,
    /// kube-proxy-style NAT rules written with iptables-restore.
    Iptables,
    /// NAT through nftables maps, changed incrementally.
    Nftables,
    /// eBPF socket-level and tc load balancing with hash maps.
    Ebpf,
}

/// Node-wide settings every backend is built from (the agent fills it from its flags).
///
/// Backends may add fields they need; keep each one documented with the flag that sets it.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// Who this node is (name, pod CIDRs, own addresses, `--masquerade-all`).
    pub node: NodeContext,
    /// `--nodeport-addresses`: node addresses that accept nodePort traffic; empty means the node's
    /// primary addresses (`node.node_ips`).
    pub nodeport_addresses: Vec<IpNet>,
    /// `--service-cluster-ip-range`: packets to an unallocated address inside are dropped.
    pub service_cidrs: Vec<IpNet>,
    /// `--balance`: the node-wide default (a Service may override it by annotation).
    pub default_algorithm: Algorithm,
    /// `--udp-idle-timeout`: how long a UDP session without traffic is kept.
    pub udp_idle_timeout: Duration,
    /// `--cgroup-path` (ebpf): the cgroup v2 directory the socket programs attach to.
    pub cgroup_path: Option<PathBuf>,
    /// `--bpffs-path` (ebpf): where maps and links are pinned.
    pub bpffs_path: PathBuf,
    /// `--iptables-mode` (iptables): `legacy`, `nft`, or `None` to detect.
    pub iptables_mode: Option<String>,
    /// `--bpf-*-max` (ebpf): the maps' sizes; pinned maps of other sizes are resized.
    pub ebpf_map_sizes: ebpf::MapSizes,
    /// `--xdp-interfaces` (ebpf): where the XDP program attaches.
    pub xdp_interfaces: Vec<String>,
    /// `--nodeport-mode` (ebpf): how external traffic to a backend is sent on.
    pub nodeport_mode: NodePortMode,
}

/// `--nodeport-mode`: how the eBPF backend's tc path sends NodePort / externalIP / LB IP traffic
/// (externalTrafficPolicy Cluster) on to its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NodePortMode {
    /// Masquerade to the node address: replies come back through this node (kube-proxy's way).
    #[default]
    Snat,
    /// Direct server return: the client's address is kept, the Service address travels to the
    /// backend's node in an IPv4 option, and that node answers the client directly. Every node
    /// that has backends must run the eBPF backend in dsr or hybrid mode too. IPv4 only.
    Dsr,
    /// DSR for TCP, masquerade for UDP.
    Hybrid,
}

impl NodePortMode {
    /// Whether flows of `proto` are sent by DSR.
    pub fn dsr_for(self, proto: crate::model::Protocol) -> bool {
        match self {
            NodePortMode::Snat => false,
            NodePortMode::Dsr => true,
            NodePortMode::Hybrid => proto == crate::model::Protocol::Tcp,
        }
    }

    /// Whether this node takes part in DSR (its programs record and answer DSR flows).
    pub fn is_dsr(self) -> bool {
        self != NodePortMode::Snat
    }
}

impl BackendConfig {
    /// The node addresses that accept nodePort traffic: those inside `--nodeport-addresses`, or
    /// all node IPs when it is not given.
    pub fn nodeport_ips(&self) -> Vec<std::net::IpAddr> {
        self.node
            .node_ips
            .iter()
            .copied()
            .filter(|ip| {
                self.nodeport_addresses.is_empty()
                    || self.nodeport_addresses.iter().any(|n| n.contains(ip))
            })
            .collect()
    }
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            node: NodeContext::default(),
            nodeport_addresses: Vec::new(),
            service_cidrs: Vec::new(),
            default_algorithm: Algorithm::RoundRobin,
            udp_idle_timeout: Duration::from_secs(60),
            cgroup_path: None,
            bpffs_path: PathBuf::from("/sys/fs/bpf/kpr"),
            iptables_mode: None,
            ebpf_map_sizes: ebpf::MapSizes::default(),
            xdp_interfaces: Vec::new(),
            nodeport_mode: NodePortMode::Snat,
        }
    }
}

/// A dataplane backend.
pub trait Dataplane: Send {
    /// The backend's name as `--backend` spells it.
    fn name(&self) -> &'static str;

    /// Programs the changes (or everything, when `changes.full`).
    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
    ) -> Result<SyncStats, DataplaneError>;

    /// Removes everything this backend ever installed.
    fn cleanup(&mut self) -> Result<(), DataplaneError>;

    /// Live counters for `proxy inspect`, if the backend has any.
    fn live_view(&self) -> Option<std::sync::Arc<dyn LiveView>> {
        None
    }

    /// Metrics the backend reads at each scrape (counters kept in the kernel), if it has any.
    fn collector(&self) -> Option<Box<dyn prometheus_client::collector::Collector>> {
        None
    }

    /// The address families the backend programs; a Service's addresses of another family
    /// are reported as not served (`proxy inspect`, `kpr_service_ports_unserved`).
    fn families(&self) -> &'static [crate::model::IpFamily] {
        &[crate::model::IpFamily::V4]
    }

    /// `GET /trace`: what the backend's own state (not the kernel's) decides for a new
    /// connection. Only the userspace backend decides in the agent; the others' decisions are in
    /// the kernel, and `proxy trace --backend NAME` reads them there.
    fn trace(&self, q: &TraceQuery) -> Result<TraceView, String> {
        let _ = q;
        Err(format!(
            "the {name} backend decides in the kernel, not in the agent: run `proxy trace \
             --backend {name}` in the node's network namespace",
            name = self.name()
        ))
    }
}

/// A new connection `proxy trace` asks the agent about (`GET /trace?src=&dst=&port=&proto=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct TraceQuery {
    pub src: std::net::IpAddr,
    #[serde(default)]
    pub src_port: Option<u16>,
    pub dst: std::net::IpAddr,
    pub port: u16,
    pub proto: crate::model::Protocol,
}

/// The agent's answer: the steps it took and its decision (`dnat to ...`, `reject (...)`,
/// `drop (...)`, as `proxy trace` prints them), with the endpoints it may pick.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct TraceView {
    pub steps: Vec<String>,
    pub decision: String,
    pub endpoints: Vec<std::net::SocketAddr>,
}

impl Backend {
    /// Every backend, in the order `proxy cleanup --backend all` cleans them.
    pub const ALL: [Backend; 4] = [
        Backend::Userspace,
        Backend::Nftables,
        Backend::Iptables,
        Backend::Ebpf,
    ];

    /// The name `--backend` spells.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Userspace => "userspace",
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
            Backend::Ebpf => "ebpf",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Backend {
    type Err = DataplaneError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| DataplaneError::UnknownBackend(s.to_string()))
    }
}

/// Whether the calling thread's network namespace has IPv6 (no `/proc/sys/net/ipv6` when the
/// kernel was booted with `ipv6.disable=1`).
pub fn kernel_has_ipv6() -> bool {
    std::path::Path::new("/proc/sys/net/ipv6").exists()
}

/// The families a backend's tables can exist in here: both, or IPv4 alone where the kernel has
/// no IPv6.
pub fn kernel_families() -> &'static [crate::model::IpFamily] {
    if kernel_has_ipv6() {
        &crate::model::IpFamily::ALL
    } else {
        &[crate::model::IpFamily::V4]
    }
}

/// Builds a backend.
pub fn build(backend: Backend, cfg: &BackendConfig) -> Result<Box<dyn Dataplane>, DataplaneError> {
    Ok(match backend {
        Backend::Userspace => Box::new(userspace::UserspaceDataplane::new(cfg)?),
        Backend::Nftables => Box::new(nftables::NftablesDataplane::new(cfg)?),
        Backend::Iptables => Box::new(iptables::IptablesFamilies::new(cfg)?),
        Backend::Ebpf => Box::new(ebpf::EbpfDataplane::new(cfg)?),
    })
}

/// Removes whatever a backend installed, whether or not an agent is running.
pub fn cleanup(backend: Backend, cfg: &BackendConfig) -> Result<(), DataplaneError> {
    match backend {
        Backend::Userspace => userspace::cleanup(cfg),
        Backend::Nftables => nftables::cleanup(cfg),
        Backend::Iptables => iptables::cleanup(cfg),
        Backend::Ebpf => ebpf::cleanup(cfg),
    }
}
