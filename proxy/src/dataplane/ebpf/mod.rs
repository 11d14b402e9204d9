//! The eBPF dataplane: socket-level load balancing with cgroup programs, driven by hash maps that
//! this module fills from the selected endpoints.
//!
//! Owns: the embedded eBPF object (`object`), loading and attaching it with pins under bpffs
//! (`attach`), the map handles (`maps`, full syncs written with batch operations through
//! `batch`), compiling a service port to map entries (`compile`),
//! the programmed state and its per-service diff (`programmed`), live counters (`live`), the
//! program log drain (`logs`) and destroying the sockets of removed backends (`sockterm`). It never decides which endpoints are usable (`selection` does).
//!
//! What the programs do (proxy-ebpf): `connect4`/`connect6` rewrite a TCP/UDP connect() to a
//! service frontend (clusterIP, externalIP, LB IP, nodeIP:nodePort) to one backend of the same
//! family, by round-robin (an atomic per-set cursor: exact across CPUs), least-connection (min
//! over per-backend active counters, ties round-robin) and session affinity (per client network
//! namespace); `sendmsg4/6` do the same per (socket, service) flow for unconnected UDP;
//! `recvmsg4/6` and `getpeername4/6` show the service address; `sock_release` gives back the
//! socket's active count. Each family's frontends use that family's backend sets
//! (`compile::SetKind`); IPv6 frontend keys carry `SCOPE_V6`. A frontend
//! without backends fails connect()/sendmsg() at once: with ECONNREFUSED (Reject), or with EPERM
//! where the semantics say drop (a Local policy with endpoints on other nodes only).
//!
//! The tc program (`tc`) handles NodePort, externalIP and LB IP traffic from outside the node, in
//! IPv4 and IPv6: DNAT to the external endpoints, masquerade to the node address of the family
//! unless eTP is Local, reverse translation of replies, flows tracked in `KPR_CT` (LRU).
//!
//! loadBalancerSourceRanges: the tc program drops a new flow to a guarded LB IP whose source
//! `KPR_SRC_RANGES` does not hold (the ranges, the LB IP, the node's addresses). A socket has no
//! source address yet at connect(), so the socket programs translate a guarded LB IP only for
//! the node's own sockets (its network namespace cookie is in `KPR_CONFIG`) and leave a pod's
//! connection untranslated: the tc program on the node's side of the pod's interface checks the
//! pod's address. Without the tc path such a connection leaves the node for the real load
//! balancer, which enforces the ranges itself.
//!
//! Not done: IPv6 packets with extension headers before the transport header are left to the
//! stack by the tc program; tc masquerade keeps the client's
//! source port (two external clients using the same source port towards the same backend
//! collide); SCTP, with a warning (the kernel's SCTP connect() runs no cgroup connect4 program,
//! and the tc program handles TCP and UDP only).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::Ebpf;
use proxy_common::{NodeConfig, NodeConfig6};

use crate::dataplane::{BackendConfig, Dataplane};

use crate::error::DataplaneError;
use crate::model::{IpFamily, ServicePortName};
use crate::state::{ChangeSet, LiveView, ProxyState, SocketsDestroyed, SyncStats};

pub mod attach;
mod batch;
pub mod compile;
pub mod counters;
pub mod dsr;
pub mod features;
pub mod inspect;
pub mod live;
mod logs;
pub mod maps;
pub mod object;
pub mod programmed;
pub mod resize;
pub mod route;
pub mod sockterm;
pub mod tc;
pub mod trace;
pub mod xdp;

pub use attach::MapSizes;
pub use live::EbpfLive;
pub use tc::TcInterfaces;

use attach::Pins;
use maps::Maps;
use programmed::Programmed;

/// Construction options beyond [`BackendConfig`].
#[derive(Debug, Clone)]
pub struct EbpfOptions {
    pub map_sizes: MapSizes,
    /// Where the tc program attaches, in the network namespace of the thread that constructs the
    /// dataplane. Default: every non-loopback interface (what a node agent needs). Tests that
    /// construct the dataplane outside a namespace of their own must pass `Off`.
    pub tc: TcInterfaces,
    /// Interfaces of that namespace that get the XDP program (`--xdp-interfaces`).
    pub xdp: Vec<String>,
}

impl Default for EbpfOptions {
    fn default() -> Self {
        EbpfOptions {
            map_sizes: MapSizes::default(),
            tc: TcInterfaces::All,
            xdp: Vec::new(),
        }
    }
}

/// The longest an incremental sync goes without looking for new interfaces for the tc program.
const TC_REFRESH: Duration = Duration::from_secs(1);

/// Recorded writes after which a full sync flushes them (about 10,000 service ports of one
/// clusterIP and a few endpoints).
pub const BATCH_CHUNK: usize = 65_536;

/// How the last full sync reached the kernel (for tests and the benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// `BPF_MAP_*_BATCH` syscalls.
    pub batches: usize,
    /// Writes made one syscall each (a kernel without batch operations).
    pub singles: usize,
}

/// A deleted TCP backend whose connections drain (see `EbpfDataplane::destroy_released`).
struct Draining {
    id: u32,
    backend: proxy_common::Backend,
    addr: (IpAddr, u16),
    /// The service ports that listed its endpoint when it was deleted.
    ports: Vec<ServicePortName>,
}

/// The `ebpf` backend.
pub struct EbpfDataplane {
    pins: Pins,
    compile_ctx: compile::CompileContext,
    tc: tc::TcAttacher,
    xdp: xdp::XdpAttacher,
    maps: Maps,
    programmed: Programmed,
    last_batch: BatchStats,
    /// When the tc program was last attached to new interfaces.
    tc_refreshed: Option<Instant>,
    /// Destroys the sockets of removed backends (None: this kernel cannot, said at start).
    term: Option<sockterm::SockTerminator>,
    /// TCP backends deleted from the maps whose endpoint a Service port still lists
    /// (terminating, not ready): their connections drain until it is listed no more.
    draining: Vec<Draining>,
    /// The node configuration with the service ranges, held back on a fresh start until the
    /// first sync has written the Services: the socket program refuses a connect() to an address
    /// of the range it finds no Service for, which before that sync would be every ClusterIP
    /// (while another proxy still serves them, e.g. kube-proxy before it is removed).
    pending_config: Option<(NodeConfig, NodeConfig6)>,
    _logs: Option<logs::LogDrain>,
    /// Keeps the loaded programs' file descriptors; the links are pinned.
    _ebpf: Ebpf,
}

impl EbpfDataplane {
    /// Loads the programs, attaches the socket programs to `cfg.cgroup_path` and the tc program
    /// to every non-loopback interface of the calling thread's network namespace, and pins maps
    /// and links under `cfg.bpffs_path`, with the default map sizes.
    pub fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        Self::with_options(
            cfg,
            EbpfOptions {
                map_sizes: cfg.ebpf_map_sizes,
                xdp: cfg.xdp_interfaces.clone(),
                ..EbpfOptions::default()
            },
        )
    }

    /// As [`EbpfDataplane::new`], with explicit options. A pinned map of another size than
    /// asked for is resized, its entries carried over (see [`resize`]).
    pub fn with_options(cfg: &BackendConfig, opts: EbpfOptions) -> Result<Self, DataplaneError> {
        let dsr = cfg.nodeport_mode.is_dsr();
        let mut sizes = opts.map_sizes;
        if !dsr || opts.tc == TcInterfaces::Off {
            // KPR_DSR is an LRU map, allocated whole: no room for flows that never come.
            sizes.dsr_flows = 1;
        }
        object::embedded()?;
        let cgroup_path = cfg
            .cgroup_path
            .as_ref()
            .ok_or_else(|| DataplaneError::Unsupported {
                backend: "ebpf",
                feature: "running without --cgroup-path (the cgroup v2 directory the socket \
                      programs attach to, e.g. the cgroup2 mount's root on a node)"
                    .into(),
            })?;
        let cgroup = attach::check_cgroup(cgroup_path)?;
        let pins = Pins {
            root: cfg.bpffs_path.clone(),
        };
        attach::prepare_bpffs(&pins.root)?;
        let btf = sockterm::kernel_btf();
        let mut support = match &btf {
            Ok(btf) => sockterm::probe_btf(btf),
            Err(why) => sockterm::Support::Missing(why.clone()),
        };
        let mut resized = resize::set_aside(&pins, &sizes)?;
        let mut ebpf = attach::load(&pins, &sizes, &mut support)?;
        resize::copy_entries(&pins, &mut resized)?;
        let logs = logs::LogDrain::start(&mut ebpf);
        let mut maps = Maps::take(&mut ebpf)?;
        let programmed = Programmed::recover(&maps)?;
        let nodeport_ips = cfg.nodeport_ips();
        let (svc_net, svc_mask) = service_range(cfg);
        let config = NodeConfig {
            masq_addr: [masquerade_addr(cfg, &nodeport_ips), 0, 0, 0],
            svc_net,
            svc_mask,
            host_netns: own_netns_cookie(),
        };
        let config6 = config6(cfg, &nodeport_ips);
        // Pins of an earlier agent hold its Services: the ranges may apply at once.
        let pending_config = if programmed.is_empty() {
            maps.set_config(NodeConfig {
                svc_net: 0,
                svc_mask: 0,
                ..config
            })?;
            maps.set_config6(NodeConfig6 {
                svc_net: [0; 4],
                svc_mask: [0; 4],
                ..config6
            })?;
            Some((config, config6))
        } else {
            maps.set_config(config)?;
            maps.set_config6(config6)?;
            None
        };
        attach::attach_all(&mut ebpf, &cgroup, &pins)?;
        if dsr && nodeport_ips.iter().any(IpAddr::is_ipv6) {
            tracing::warn!(
                "ebpf: --nodeport-mode {:?} is IPv4 only: IPv6 NodePort / external traffic stays \
                 masqueraded",
                cfg.nodeport_mode
            );
        }
        if dsr && opts.tc == TcInterfaces::Off {
            tracing::warn!(
                "ebpf: --nodeport-mode {:?} needs the tc path, which is off: no DSR",
                cfg.nodeport_mode
            );
        }
        let mut tc = tc::TcAttacher::new(&mut ebpf, opts.tc, pins.links(), dsr)?;
        tc.refresh(&mut ebpf)?;
        let mut xdp = xdp::XdpAttacher::new(&mut ebpf, opts.xdp, pins.links())?;
        xdp.refresh(&mut ebpf)?;
        resize::finish(&pins, resized)?;
        let term = sockterm::SockTerminator::new(&mut ebpf, &support, btf.as_ref().ok());
        drop(btf);
        attach::log_verified(&ebpf);
        resize::log_footprints(&pins);
        Ok(EbpfDataplane {
            pins,
            compile_ctx: compile::CompileContext {
                tc: tc.enabled(),
                nodeport_ips,
                masquerade_all: cfg.node.masquerade_all,
                node_ips: cfg.node.node_ips.clone(),
                nodeport_mode: cfg.nodeport_mode,
            },
            tc,
            xdp,
            maps,
            programmed,
            last_batch: BatchStats::default(),
            tc_refreshed: Some(Instant::now()),
            term,
            draining: Vec::new(),
            pending_config,
            _logs: logs,
            _ebpf: ebpf,
        })
    }

    /// The backend set ids of a service port, cluster set first (tests, `proxy inspect`).
    pub fn set_ids(&self, name: &ServicePortName) -> Vec<u32> {
        self.programmed.set_ids(name)
    }

    /// How the last full sync's writes reached the kernel.
    pub fn last_batch(&self) -> BatchStats {
        self.last_batch
    }

    /// Whether the programs' aya-log records are being drained into `log`/tracing.
    pub fn logs_drained(&self) -> bool {
        self._logs.is_some()
    }

    /// Interfaces the tc program is attached to.
    pub fn tc_interfaces(&self) -> Vec<String> {
        self.tc.attached().iter().cloned().collect()
    }

    /// Interfaces the XDP program is attached to.
    pub fn xdp_interfaces(&self) -> Vec<String> {
        self.xdp.attached().iter().cloned().collect()
    }

    /// What the XDP program did since the maps were created.
    pub fn xdp_counts(&self) -> Result<xdp::XdpCounts, DataplaneError> {
        xdp::XdpCounts::from_pin(&self.pins.maps())
    }

    /// Whether the DSR programs are in place (`--nodeport-mode dsr|hybrid` with the tc path).
    pub fn dsr(&self) -> bool {
        self.tc.dsr()
    }

    /// What the DSR programs did since the maps were created.
    pub fn dsr_counts(&self) -> Result<dsr::DsrCounts, DataplaneError> {
        dsr::DsrCounts::from_pin(&self.pins.maps())
    }

    /// Interfaces named for XDP that did not take it, with the reason.
    pub fn xdp_refused(&self) -> Vec<(String, String)> {
        let mut refused: Vec<(String, String)> = self
            .xdp
            .refused()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(why) = self.xdp.unloaded() {
            refused.push(("(every interface)".into(), why.to_string()));
        }
        refused
    }

    /// Whether sockets connected to removed endpoints are destroyed (the kernel can, and the
    /// iterator programs loaded).
    pub fn destroys_sockets(&self) -> bool {
        self.term.is_some()
    }

    /// Destroys the sockets connected to the backends this sync deleted. A failure is logged,
    /// not returned: the maps are programmed, and a resync would not bring the backends back.
    ///
    /// As kube-proxy: UDP flows leave an endpoint as soon as it is no longer used (its UDP
    /// conntrack entries are deleted then), but TCP connections to an endpoint that a Service
    /// port still lists (terminating, or not ready) are left to drain: that backend waits in
    /// `draining` until a later sync finds it listed by none of those ports, and only then are
    /// its connections reset.
    fn destroy_released(
        &mut self,
        state: &ProxyState,
        touched: &[&ServicePortName],
        full: bool,
    ) -> SocketsDestroyed {
        let released = self.programmed.take_released();
        if self.term.is_none() {
            return SocketsDestroyed::default();
        }
        let touched_set: std::collections::HashSet<&ServicePortName> =
            touched.iter().copied().collect();
        // A full sync looks at every port (one that is gone lists nothing).
        let touches = |d: &Draining| full || d.ports.iter().any(|n| touched_set.contains(n));
        let recheck = self.draining.iter().any(touches);
        let tcp_released = released
            .iter()
            .any(|(_, b)| b.proto == proxy_common::PROTO_TCP);
        // Who lists which address, over the ports this sync touched (only when needed).
        let mut listing: std::collections::HashMap<(IpAddr, u16), Vec<&ServicePortName>> =
            std::collections::HashMap::new();
        if recheck || tcp_released {
            for name in touched {
                if let Some(p) = state.get(name) {
                    for e in p.endpoints.iter() {
                        listing.entry((e.addr, e.port)).or_default().push(name);
                    }
                }
            }
        }
        let mut doomed = Vec::new();
        self.draining.retain(|d| {
            let rechecked = touches(d);
            let listed_elsewhere = d.ports.iter().any(|n| {
                !touched_set.contains(n)
                    && state
                        .get(n)
                        .is_some_and(|p| p.endpoints.iter().any(|e| (e.addr, e.port) == d.addr))
            });
            if !rechecked || listed_elsewhere || listing.contains_key(&d.addr) {
                return true;
            }
            doomed.push((d.id, d.backend));
            false
        });
        for (id, b) in released {
            if b.proto == proxy_common::PROTO_TCP {
                if let Some(a) = programmed::backend_addr(&b) {
                    if let Some(ports) = listing.get(&(a.addr, a.port)) {
                        self.draining.push(Draining {
                            id,
                            backend: b,
                            addr: (a.addr, a.port),
                            ports: ports.iter().map(|n| (*n).clone()).collect(),
                        });
                        continue;
                    }
                }
            }
            doomed.push((id, b));
        }
        let released = doomed;
        let Some(term) = &mut self.term else {
            return SocketsDestroyed::default();
        };
        if released.is_empty() {
            return SocketsDestroyed::default();
        }
        match term.run(&mut self._ebpf, &released) {
            Ok(c) => {
                if c.tcp_failed + c.udp_failed > 0 {
                    tracing::warn!(
                        "ebpf: the kernel refused to destroy {} TCP and {} UDP sockets of \
                         removed endpoints",
                        c.tcp_failed,
                        c.udp_failed
                    );
                }
                if c.tcp + c.udp > 0 {
                    tracing::info!(
                        backends = released.len(),
                        tcp = c.tcp,
                        udp = c.udp,
                        "ebpf: destroyed the sockets connected to removed endpoints"
                    );
                }
                SocketsDestroyed {
                    tcp: c.tcp,
                    udp: c.udp,
                }
            }
            Err(e) => {
                tracing::error!("ebpf: destroying the sockets of removed endpoints: {e}");
                SocketsDestroyed::default()
            }
        }
    }

    /// Where maps and links are pinned.
    pub fn bpffs_path(&self) -> &std::path::Path {
        &self.pins.root
    }

    /// Reads the live counters (per endpoint: active and total connections).
    pub fn live(&self) -> EbpfLive {
        EbpfLive::new(self.pins.maps())
    }

    /// Attaches the tc program to new interfaces (a pod's veth) and forgets removed ones: on
    /// every full sync, and on incremental syncs at most every [`TC_REFRESH`]. Listing the
    /// interfaces costs a thread that enters the dataplane's namespace, which would be most of
    /// an incremental sync's time.
    fn refresh_tc(&mut self, full: bool) -> Result<(), DataplaneError> {
        let due = self.tc_refreshed.is_none_or(|t| t.elapsed() >= TC_REFRESH);
        if self.tc.enabled() && (full || due) {
            self.tc.refresh(&mut self._ebpf)?;
            // An external interface named for XDP that appears later (a bond brought up after
            // the agent) is attached by the same refresh.
            self.xdp.refresh(&mut self._ebpf)?;
            self.tc_refreshed = Some(Instant::now());
        }
        Ok(())
    }

    /// Applies the writes recorded since [`Maps::begin_batch`] (adding to `last_batch`); the
    /// first error is kept.
    fn flush_batch(&mut self, ops: &mut usize, first_err: &mut Option<DataplaneError>) {
        match self.programmed.flush(&mut self.maps, ops) {
            Ok(report) => {
                self.last_batch.batches += report.batches;
                self.last_batch.singles += report.singles;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }

    fn sync_one(
        &mut self,
        state: &ProxyState,
        name: &ServicePortName,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        let port = state.get(name);
        let desired = port.map(|p| compile::compile(&p.service, &p.selected, &self.compile_ctx));
        if port.is_some_and(|p| p.service.protocol == crate::model::Protocol::Sctp) {
            tracing::warn!(
                "ebpf: Service port {name} is SCTP, which the ebpf backend does not translate \
                 (the kernel runs no socket program for SCTP connect(); the tc path is TCP/UDP)"
            );
        }
        self.programmed
            .apply(&mut self.maps, name, desired.as_ref(), ops)
    }
}

impl Dataplane for EbpfDataplane {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
    ) -> Result<SyncStats, DataplaneError> {
        // Removed service ports first, so that an address one of them frees and another takes
        // in the same sync ends up with the new owner's entry.
        let candidates: Vec<&ServicePortName> = if changes.full {
            self.programmed.names().collect()
        } else {
            changes.changed.iter().collect()
        };
        let removed: Vec<ServicePortName> = candidates
            .into_iter()
            .filter(|name| !state.contains(name))
            .cloned()
            .collect();
        let present: Vec<&ServicePortName> = if changes.full {
            state.names().collect()
        } else {
            changes
                .changed
                .iter()
                .filter(|name| state.contains(name))
                .collect()
        };
        let touched = removed.len() + present.len();
        self.refresh_tc(changes.full)?;
        let mut ops = 0;
        let mut first_err = None;
        // A full sync records its writes and applies them with batch operations, a chunk of
        // service ports at a time: each chunk is flushed as one batch was (puts in datapath
        // order, then deletes), a port's writes never span two chunks, and what is recorded
        // never outgrows a chunk (one batch of every port's writes was a large part of the
        // agent's peak at 100,000 Services: docs/BENCHMARKS.md). Incremental syncs write the
        // changed service ports' entries one by one.
        if changes.full {
            self.programmed.reserve(present.len());
            self.maps.begin_batch();
            self.last_batch = BatchStats::default();
        }
        for name in removed.iter().chain(present) {
            if let Err(e) = self.sync_one(state, name, &mut ops) {
                tracing::error!("ebpf: {e}");
                first_err.get_or_insert(e);
            }
            if changes.full && self.maps.pending_len() >= BATCH_CHUNK {
                self.flush_batch(&mut ops, &mut first_err);
                self.maps.begin_batch();
            }
        }
        if changes.full {
            self.flush_batch(&mut ops, &mut first_err);
        }
        if changes.full && self.programmed.needs_sweep {
            if let Err(e) = self.programmed.sweep(&mut self.maps, &mut ops) {
                first_err.get_or_insert(e);
            }
        }
        // After the maps stopped pointing at them: a reconnect cannot get the same backend.
        let touched_names: Vec<&ServicePortName> = if changes.full {
            state.names().collect()
        } else {
            changes.changed.iter().collect()
        };
        let sockets_destroyed = self.destroy_released(state, &touched_names, changes.full);
        if first_err.is_none() {
            if let Some((config, config6)) = self.pending_config {
                self.maps.set_config(config)?;
                self.maps.set_config6(config6)?;
                self.pending_config = None;
                tracing::info!(
                    "ebpf: the Services are written: connections to unallocated service \
                     addresses are refused from now on"
                );
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(SyncStats {
                full: changes.full,
                service_ports: self.programmed.len(),
                touched,
                operations: ops,
                sockets_destroyed,
            }),
        }
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        if self.tc.enabled() {
            self.tc.detach_netlink_filters()?;
        }
        attach::unpin_all(&self.pins)
    }

    fn live_view(&self) -> Option<Arc<dyn LiveView>> {
        Some(Arc::new(self.live()))
    }

    fn collector(&self) -> Option<Box<dyn prometheus_client::collector::Collector>> {
        Some(Box::new(counters::KernelCounters::new(inspect::maps_dir(
            &self.pins.root,
        ))))
    }

    fn families(&self) -> &'static [IpFamily] {
        &IpFamily::ALL
    }
}

/// Removes everything the ebpf backend pinned under `cfg.bpffs_path` (detaching its programs),
/// whether or not an agent is running. Nothing pinned is not an error.
pub fn cleanup(cfg: &BackendConfig) -> Result<(), DataplaneError> {
    tc::detach_netlink_filters()?;
    attach::unpin_all(&Pins {
        root: cfg.bpffs_path.clone(),
    })
}

/// The first IPv4 `--service-cluster-ip-range` as (network, mask) in network byte order; (0, 0)
/// when there is none.
fn service_range(cfg: &BackendConfig) -> (u32, u32) {
    cfg.service_cidrs
        .iter()
        .find_map(|net| match net {
            ipnet::IpNet::V4(v4) => Some((
                compile::v4_word(v4.network()),
                compile::v4_word(v4.netmask()),
            )),
            ipnet::IpNet::V6(_) => None,
        })
        .unwrap_or((0, 0))
}

/// The IPv6 settings: the first IPv6 service range and masquerade address (zero when none).
fn config6(cfg: &BackendConfig, nodeport_ips: &[IpAddr]) -> NodeConfig6 {
    let mut c = NodeConfig6::default();
    if let Some(net) = cfg.service_cidrs.iter().find_map(|n| match n {
        ipnet::IpNet::V6(v6) => Some(*v6),
        ipnet::IpNet::V4(_) => None,
    }) {
        c.svc_net = compile::addr_words(IpAddr::V6(net.network()));
        c.svc_mask = compile::addr_words(IpAddr::V6(net.netmask()));
    }
    let masq = nodeport_ips
        .iter()
        .chain(&cfg.node.node_ips)
        .find(|ip| ip.is_ipv6() && !ip.is_loopback());
    if let Some(ip) = masq {
        c.masq_addr = compile::addr_words(*ip);
    }
    c
}

/// The source address masqueraded tc traffic gets: the first IPv4 nodePort address, else the
/// first IPv4 node address (0: masquerade disabled, with a warning).
fn masquerade_addr(cfg: &BackendConfig, nodeport_ips: &[IpAddr]) -> u32 {
    let v4 = nodeport_ips
        .iter()
        .chain(&cfg.node.node_ips)
        .find_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        });
    match v4 {
        Some(ip) => compile::v4_word(ip),
        None => {
            tracing::warn!("ebpf: no IPv4 node address: traffic from outside is not masqueraded");
            0
        }
    }
}

/// The cookie of the calling thread's network namespace (the node's: the agent runs there), as
/// the socket programs' `bpf_get_netns_cookie` returns it; 0 (never matched) where the kernel
/// cannot tell (`SO_NETNS_COOKIE` needs 5.14), with a warning.
fn own_netns_cookie() -> u64 {
    trace::current_netns_cookie().unwrap_or_else(|e| {
        tracing::warn!(
            "ebpf: reading this network namespace's cookie (SO_NETNS_COOKIE): {e}; LoadBalancer \
             IPs with loadBalancerSourceRanges are then translated for no local socket"
        );
        0
    })
}
