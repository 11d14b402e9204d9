//! Compiles one service port and its selected endpoints into the map entries the programs need,
//! without ids (ids are assigned by `programmed`). Pure: no maps, no I/O.
//!
//! The socket programs serve local clients (node processes and pods), so per
//! docs/SERVICE-SEMANTICS.md (and `selection::route`): the clusterIP uses the cluster endpoints;
//! nodePort, externalIPs and LB IPs use the cluster endpoints when eTP is Local (pod/node sources
//! are short-circuited) and the external endpoints otherwise. Address translation at the socket
//! keeps the client's own source, so no masquerade is involved on this path.
//!
//! With the tc path attached, every external frontend also gets a `SCOPE_EXTERNAL` entry for
//! traffic from outside the node: the external endpoints (eTP), masqueraded unless eTP is Local
//! (or always with `--masquerade-all`). With `--nodeport-mode dsr` (`hybrid`: TCP only) an IPv4
//! tc frontend that would be masqueraded because eTP is Cluster is marked [`SVC_F_DSR`] instead:
//! direct server return (proxy-ebpf's `dsr.rs`); `--masquerade-all` keeps masquerading. SCTP frontends are written (the socket programs would
//! translate them) but no kernel runs them for SCTP sockets, and the tc path skips SCTP.
//!
//! loadBalancerSourceRanges flag both entries of each LB IP ([`SVC_F_SOURCE_RANGES`]) and list,
//! for its tc frontend, the sources allowed: the ranges, the LB IP itself and the node's
//! addresses (as the rule backends do), all of the LB IP's family.
//!
//! Maglev (`kpr.io/balance: maglev`): a set's slots are its Maglev table (the node's
//! `--maglev-table-size` slots, each a backend id) instead of one slot per backend; the programs
//! look a flow's slot up by its hash. Both paths use the table: the tc path hashes the packet's
//! 5-tuple, the socket path the socket's bound source and the Service address (see
//! `proxy-ebpf/src/sock.rs`).
//!
//! Address families: each family's frontends use that family's backend sets (a connection never
//! changes family), so a dual-stack Service port has up to four sets; IPv6 frontend keys carry
//! [`SCOPE_V6`]. A nodePort is opened on the node addresses of the families the Service has.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use aya::maps::lpm_trie::Key;
use ipnet::IpNet;
use proxy_common::{
    ServiceKey, SrcRangeKey, ALG_LEAST_CONN, ALG_MAGLEV, ALG_ROUND_ROBIN, FAMILY_V4, FAMILY_V6,
    SCOPE_EXTERNAL, SCOPE_SOCKET, SCOPE_V6, SRC_RANGE_FRONTEND_BITS, SVC_F_AFFINITY,
    SVC_F_DROP_EMPTY, SVC_F_DSR, SVC_F_MASQUERADE, SVC_F_SOURCE_RANGES,
};

use crate::maglev::MaglevTable;
use crate::model::{Algorithm, Endpoint, IpFamily, Protocol, ServicePort};
use crate::selection::{EmptyVerdict, SelectedEndpoints};

/// An endpoint as the maps know it: address, port and protocol. Ordered IPv4 before IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Protocol,
}

impl BackendAddr {
    pub fn socket_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.addr, self.port)
    }
}

/// Which backend set of a service port a frontend uses: the cluster or the external endpoints,
/// of one address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    Cluster,
    External,
    Cluster6,
    External6,
}

impl SetKind {
    pub const ALL: [SetKind; 4] = [
        SetKind::Cluster,
        SetKind::External,
        SetKind::Cluster6,
        SetKind::External6,
    ];

    /// The cluster (`external` false) or external set of `family`.
    pub fn of(external: bool, family: IpFamily) -> SetKind {
        match (external, family) {
            (false, IpFamily::V4) => SetKind::Cluster,
            (true, IpFamily::V4) => SetKind::External,
            (false, IpFamily::V6) => SetKind::Cluster6,
            (true, IpFamily::V6) => SetKind::External6,
        }
    }

    pub fn family(self) -> IpFamily {
        match self {
            SetKind::Cluster | SetKind::External => IpFamily::V4,
            SetKind::Cluster6 | SetKind::External6 => IpFamily::V6,
        }
    }

    pub fn is_external(self) -> bool {
        matches!(self, SetKind::External | SetKind::External6)
    }

    /// Position in [`SetKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One frontend (service address) and how it picks from its set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend {
    pub key: ServiceKey,
    pub set: SetKind,
    pub flags: u16,
    pub algorithm: u8,
    pub affinity_timeout_s: u32,
}

/// One allowed source prefix of a tc frontend guarded by loadBalancerSourceRanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrcRange {
    pub frontend: ServiceKey,
    pub net: IpNet,
}

impl SrcRange {
    /// The `KPR_SRC_RANGES` key.
    pub fn key(&self) -> Key<SrcRangeKey> {
        Key::new(
            SRC_RANGE_FRONTEND_BITS + u32::from(self.net.prefix_len()),
            SrcRangeKey {
                frontend: self.frontend,
                src: addr_words(self.net.network()),
            },
        )
    }
}

/// Everything one service port needs in the maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredService {
    /// The cluster endpoints, IPv4 before IPv6 (each family's set is its part of the list).
    pub cluster: Vec<BackendAddr>,
    /// `None` when no frontend uses an external set, or they equal the cluster sets.
    pub external: Option<Vec<BackendAddr>>,
    pub frontends: Vec<Frontend>,
    /// clusterIP marker keys (port 0, protocol 0): other ports of these addresses are refused.
    pub vips: Vec<ServiceKey>,
    /// Sources allowed to the tc frontends of LB IPs with loadBalancerSourceRanges.
    pub source_ranges: Vec<SrcRange>,
    /// A Maglev port's tables by [`SetKind::index`]: the set's slots are its table's slots
    /// (`selection` built them; none for other algorithms).
    pub maglev: [Option<Arc<MaglevTable>>; 4],
}

impl DesiredService {
    /// The backends of a set (an absent external set is the cluster set).
    pub fn set(&self, kind: SetKind) -> &[BackendAddr] {
        let all = match (kind.is_external(), &self.external) {
            (true, Some(ext)) => ext,
            _ => &self.cluster,
        };
        family_part(all, kind.family())
    }

    /// The Maglev table of a set, for a Maglev Service port.
    pub fn maglev_table(&self, kind: SetKind) -> Option<&MaglevTable> {
        self.maglev[kind.index()].as_deref()
    }

    /// The sets the frontends use, in [`SetKind::ALL`] order.
    pub fn kinds(&self) -> Vec<SetKind> {
        let mut kinds: Vec<SetKind> = self.frontends.iter().map(|f| f.set).collect();
        kinds.sort_unstable();
        kinds.dedup();
        kinds
    }
}

/// The part of a sorted backend list (IPv4 before IPv6) of one family.
fn family_part(all: &[BackendAddr], family: IpFamily) -> &[BackendAddr] {
    let first_v6 = all.partition_point(|b| b.addr.is_ipv4());
    match family {
        IpFamily::V4 => &all[..first_v6],
        IpFamily::V6 => &all[first_v6..],
    }
}

/// Node-wide inputs of the compilation.
#[derive(Debug, Clone, Default)]
pub struct CompileContext {
    /// The node addresses that accept nodePort traffic.
    pub nodeport_ips: Vec<IpAddr>,
    /// The tc path is attached: also write `SCOPE_EXTERNAL` frontends for traffic from outside.
    pub tc: bool,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// The node's addresses (always allowed by loadBalancerSourceRanges).
    pub node_ips: Vec<IpAddr>,
    /// `--nodeport-mode`.
    pub nodeport_mode: crate::dataplane::NodePortMode,
}

/// Compiles `svc` with its selected endpoints.
pub fn compile(svc: &ServicePort, sel: &SelectedEndpoints, ctx: &CompileContext) -> DesiredService {
    let nodeport_ips = &ctx.nodeport_ips;
    let mut out = DesiredService {
        cluster: backends(&sel.cluster, svc.protocol),
        ..DesiredService::default()
    };
    let algorithm = match svc.algorithm {
        Algorithm::RoundRobin => ALG_ROUND_ROBIN,
        Algorithm::LeastConn => ALG_LEAST_CONN,
        Algorithm::Maglev => ALG_MAGLEV,
    };
    let (affinity_flag, affinity_timeout_s) = match svc.affinity {
        Some(t) => (
            SVC_F_AFFINITY,
            u32::try_from(t.as_secs()).unwrap_or(u32::MAX),
        ),
        None => (0, 0),
    };
    let frontend = |ip: IpAddr, port: u16, external: bool, local_policy: bool| Frontend {
        key: service_key(ip, port, svc.protocol),
        set: SetKind::of(external, IpFamily::of(&ip)),
        flags: affinity_flag | empty_flag(sel, local_policy),
        algorithm,
        affinity_timeout_s,
    };
    // Traffic from outside the node: the external set, masqueraded unless eTP is Local.
    let masquerade = if ctx.masquerade_all || !svc.external_local {
        SVC_F_MASQUERADE
    } else {
        0
    };
    // Direct server return where it would masquerade because eTP is Cluster (IPv4 only).
    let dsr = !ctx.masquerade_all && !svc.external_local && ctx.nodeport_mode.dsr_for(svc.protocol);
    let tc_frontend = |ip: IpAddr, port: u16| {
        let mut f = frontend(ip, port, true, svc.external_local);
        f.key.scope |= SCOPE_EXTERNAL;
        if dsr && ip.is_ipv4() {
            f.flags |= SVC_F_DSR;
        } else {
            f.flags |= masquerade;
        }
        f
    };
    let (ext_set, ext_local) = if svc.external_local {
        (false, svc.internal_local)
    } else {
        (true, false)
    };
    let guarded = |ip: &IpAddr| !svc.source_ranges.is_empty() && svc.load_balancer_ips.contains(ip);
    let external_addrs = svc.external_ips.iter().chain(&svc.load_balancer_ips);
    let mut externals: Vec<(IpAddr, u16)> = external_addrs.map(|ip| (*ip, svc.port)).collect();
    if svc.node_port != 0 {
        // A nodePort serves the families the Service has, as kube-proxy's per-family proxiers do.
        externals.extend(
            nodeport_ips
                .iter()
                .filter(|ip| svc.has_family(IpFamily::of(ip)))
                .map(|ip| (*ip, svc.node_port)),
        );
    }
    for ip in &svc.cluster_ips {
        out.vips.push(vip_key(*ip));
        out.frontends
            .push(frontend(*ip, svc.port, false, svc.internal_local));
    }
    for (ip, port) in externals {
        // A nodePort on an LB IP's address is not guarded: only the LB IP's own port is.
        let guard = if guarded(&ip) && port == svc.port {
            SVC_F_SOURCE_RANGES
        } else {
            0
        };
        let mut f = frontend(ip, port, ext_set, ext_local);
        f.flags |= guard;
        out.frontends.push(f);
        if ctx.tc && svc.protocol != Protocol::Sctp {
            let mut f = tc_frontend(ip, port);
            f.flags |= guard;
            if guard != 0 {
                out.source_ranges
                    .extend(allowed_sources(svc, ip, ctx).map(|net| SrcRange {
                        frontend: f.key,
                        net,
                    }));
            }
            out.frontends.push(f);
        }
    }
    dedup_frontends(&mut out.frontends);
    let mut seen = std::collections::HashSet::new();
    out.source_ranges.retain(|r| seen.insert(*r));
    let external = backends(&sel.external, svc.protocol);
    // Per family: an external set equal to the cluster set is the cluster set.
    let same = |f: IpFamily| family_part(&external, f) == family_part(&out.cluster, f);
    for f in &mut out.frontends {
        if f.set.is_external() && same(f.set.family()) {
            f.set = SetKind::of(false, f.set.family());
        }
    }
    if out.frontends.iter().any(|f| f.set.is_external()) {
        out.external = Some(external);
    }
    if let Some(tables) = sel.maglev.as_deref() {
        for kind in out.kinds() {
            let set = if kind.is_external() {
                &tables.external
            } else {
                &tables.cluster
            };
            out.maglev[kind.index()] = Some(set.of(kind.family()).clone());
        }
    }
    out
}

/// The sources loadBalancerSourceRanges let reach LB IP `lb`: the ranges, `lb` itself and the
/// node's addresses, those of `lb`'s family.
fn allowed_sources<'a>(
    svc: &'a ServicePort,
    lb: IpAddr,
    ctx: &'a CompileContext,
) -> impl Iterator<Item = IpNet> + 'a {
    let family = IpFamily::of(&lb);
    let ranges = svc.source_ranges.iter().map(IpNet::trunc);
    let hosts = std::iter::once(lb)
        .chain(ctx.node_ips.iter().copied())
        .map(IpNet::from);
    ranges
        .chain(hosts)
        .filter(move |n| IpFamily::of(&n.addr()) == family)
}

/// Two addresses of a Service can coincide (an externalIP that is also a node IP): the first one
/// (clusterIP before externals) wins, as one key can hold one entry.
fn dedup_frontends(frontends: &mut Vec<Frontend>) {
    let mut seen = std::collections::HashSet::new();
    frontends.retain(|f| seen.insert(f.key));
}

fn empty_flag(sel: &SelectedEndpoints, local_policy: bool) -> u16 {
    match sel.empty_verdict(local_policy) {
        EmptyVerdict::Drop => SVC_F_DROP_EMPTY,
        EmptyVerdict::Reject => 0,
    }
}

fn backends(endpoints: &[Endpoint], proto: Protocol) -> Vec<BackendAddr> {
    let mut out: Vec<BackendAddr> = endpoints
        .iter()
        .map(|e| BackendAddr {
            addr: e.addr,
            port: e.port,
            proto,
        })
        .collect();
    // A stable order keeps slots stable across syncs, so one changed endpoint moves few slots;
    // it also puts IPv4 before IPv6, which `family_part` relies on.
    out.sort();
    out.dedup();
    out
}

/// The socket scope of an address's family.
fn socket_scope(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => SCOPE_SOCKET,
        IpAddr::V6(_) => SCOPE_SOCKET | SCOPE_V6,
    }
}

/// The socket-scope map key of `ip:port/proto`.
pub fn service_key(ip: IpAddr, port: u16, proto: Protocol) -> ServiceKey {
    ServiceKey {
        addr: addr_words(ip),
        port: port.to_be(),
        proto: proto.number(),
        scope: socket_scope(ip),
    }
}

/// The marker key saying `ip` is a clusterIP.
pub fn vip_key(ip: IpAddr) -> ServiceKey {
    ServiceKey {
        addr: addr_words(ip),
        port: 0,
        proto: 0,
        scope: socket_scope(ip),
    }
}

/// An address as the maps hold it: IPv4 in word 0, IPv6 in all four (network byte order).
pub fn addr_words(ip: IpAddr) -> [u32; 4] {
    match ip {
        IpAddr::V4(v4) => [v4_word(v4), 0, 0, 0],
        IpAddr::V6(v6) => {
            let o = v6.octets();
            std::array::from_fn(|i| {
                u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
            })
        }
    }
}

/// The inverse of [`addr_words`], given the family.
pub fn addr_from_words(words: [u32; 4], v6: bool) -> IpAddr {
    if !v6 {
        return IpAddr::V4(v4_from_word(words[0]));
    }
    let mut o = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        o[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    IpAddr::V6(Ipv6Addr::from(o))
}

/// Whether a frontend key is IPv6.
pub fn key_is_v6(key: &ServiceKey) -> bool {
    key.scope & SCOPE_V6 != 0
}

/// The family constant the maps use for an address.
pub fn family_of(ip: &IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => FAMILY_V4,
        IpAddr::V6(_) => FAMILY_V6,
    }
}

/// An IPv4 address as the kernel's `__be32` read as a native u32.
pub fn v4_word(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// The inverse of [`v4_word`].
pub fn v4_from_word(word: u32) -> Ipv4Addr {
    Ipv4Addr::from(word.to_ne_bytes())
}

#[cfg(test)]
mod tests;
