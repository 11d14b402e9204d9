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
//! (or always with `--masquerade-all`). SCTP frontends are written (the socket programs would
//! translate them) but no kernel runs them for SCTP sockets, and the tc path skips SCTP.
//!
//! loadBalancerSourceRanges flag both entries of each LB IP ([`SVC_F_SOURCE_RANGES`]) and list,
//! for its tc frontend, the sources allowed: the ranges, the LB IP itself and the node's
//! addresses (as the rule backends do).

use std::net::{IpAddr, Ipv4Addr};

use aya::maps::lpm_trie::Key;
use ipnet::{IpNet, Ipv4Net};
use proxy_common::{
    ServiceKey, SrcRangeKey, ALG_LEAST_CONN, ALG_ROUND_ROBIN, FAMILY_V4, SCOPE_EXTERNAL,
    SCOPE_SOCKET, SRC_RANGE_FRONTEND_BITS, SVC_F_AFFINITY, SVC_F_DROP_EMPTY, SVC_F_MASQUERADE,
    SVC_F_SOURCE_RANGES,
};

use crate::model::{Algorithm, Endpoint, Protocol, ServicePort};
use crate::selection::{EmptyVerdict, SelectedEndpoints};

/// An endpoint as the maps know it: IPv4 address, port and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub proto: Protocol,
}

impl BackendAddr {
    pub fn socket_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(IpAddr::V4(self.addr), self.port)
    }
}

/// Which backend set of a service port a frontend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    Cluster,
    External,
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
    pub net: Ipv4Net,
}

impl SrcRange {
    /// The `KPR_SRC_RANGES` key.
    pub fn key(&self) -> Key<SrcRangeKey> {
        Key::new(
            SRC_RANGE_FRONTEND_BITS + u32::from(self.net.prefix_len()),
            SrcRangeKey {
                frontend: self.frontend,
                src: [v4_word(self.net.network()), 0, 0, 0],
            },
        )
    }
}

/// Everything one service port needs in the maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredService {
    pub cluster: Vec<BackendAddr>,
    /// `None` when no frontend uses the external set, or it equals the cluster set.
    pub external: Option<Vec<BackendAddr>>,
    pub frontends: Vec<Frontend>,
    /// IPv6 addresses of this service port that were not programmed (IPv6 is not implemented).
    pub skipped_v6: Vec<IpAddr>,
    /// clusterIP marker keys (port 0, protocol 0): other ports of these addresses are refused.
    pub vips: Vec<ServiceKey>,
    /// Sources allowed to the tc frontends of LB IPs with loadBalancerSourceRanges.
    pub source_ranges: Vec<SrcRange>,
}

impl DesiredService {
    /// The backends of a set (an absent external set is the cluster set).
    pub fn set(&self, kind: SetKind) -> &[BackendAddr] {
        match (kind, &self.external) {
            (SetKind::External, Some(ext)) => ext,
            _ => &self.cluster,
        }
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
    /// The node's IPv4 addresses (always allowed by loadBalancerSourceRanges).
    pub node_ips: Vec<Ipv4Addr>,
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
    };
    let (affinity_flag, affinity_timeout_s) = match svc.affinity {
        Some(t) => (
            SVC_F_AFFINITY,
            u32::try_from(t.as_secs()).unwrap_or(u32::MAX),
        ),
        None => (0, 0),
    };
    let frontend = |ip: Ipv4Addr, port: u16, set: SetKind, local_policy: bool| Frontend {
        key: service_key(ip, port, svc.protocol),
        set,
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
    let tc_frontend = |ip: Ipv4Addr, port: u16| {
        let mut f = frontend(ip, port, SetKind::External, svc.external_local);
        f.key.scope = SCOPE_EXTERNAL;
        f.flags |= masquerade;
        f
    };
    let (ext_set, ext_local) = if svc.external_local {
        (SetKind::Cluster, svc.internal_local)
    } else {
        (SetKind::External, false)
    };
    let guarded = |ip: &IpAddr| !svc.source_ranges.is_empty() && svc.load_balancer_ips.contains(ip);
    let external_addrs = svc.external_ips.iter().chain(&svc.load_balancer_ips);
    let mut externals: Vec<(IpAddr, u16)> = external_addrs.map(|ip| (*ip, svc.port)).collect();
    if svc.node_port != 0 {
        externals.extend(nodeport_ips.iter().map(|ip| (*ip, svc.node_port)));
    }
    for ip in &svc.cluster_ips {
        if let IpAddr::V4(v4) = ip {
            out.vips.push(vip_key(*v4));
        }
        match ip {
            IpAddr::V4(v4) => out.frontends.push(frontend(
                *v4,
                svc.port,
                SetKind::Cluster,
                svc.internal_local,
            )),
            IpAddr::V6(_) => out.skipped_v6.push(*ip),
        }
    }
    for (ip, port) in externals {
        let IpAddr::V4(v4) = ip else {
            out.skipped_v6.push(ip);
            continue;
        };
        // A nodePort on an LB IP's address is not guarded: only the LB IP's own port is.
        let guard = if guarded(&ip) && port == svc.port {
            SVC_F_SOURCE_RANGES
        } else {
            0
        };
        let mut f = frontend(v4, port, ext_set, ext_local);
        f.flags |= guard;
        out.frontends.push(f);
        if ctx.tc && svc.protocol != Protocol::Sctp {
            let mut f = tc_frontend(v4, port);
            f.flags |= guard;
            if guard != 0 {
                out.source_ranges
                    .extend(allowed_sources(svc, v4, ctx).map(|net| SrcRange {
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
    let uses_external = out.frontends.iter().any(|f| f.set == SetKind::External);
    let external = backends(&sel.external, svc.protocol);
    if uses_external && external != out.cluster {
        out.external = Some(external);
    } else {
        for f in &mut out.frontends {
            f.set = SetKind::Cluster;
        }
    }
    out
}

/// The sources loadBalancerSourceRanges let reach LB IP `lb`: the IPv4 ranges, `lb` itself and
/// the node's addresses.
fn allowed_sources<'a>(
    svc: &'a ServicePort,
    lb: Ipv4Addr,
    ctx: &'a CompileContext,
) -> impl Iterator<Item = Ipv4Net> + 'a {
    let ranges = svc.source_ranges.iter().filter_map(|r| match r {
        IpNet::V4(n) => Some(n.trunc()),
        IpNet::V6(_) => None,
    });
    let hosts = std::iter::once(lb)
        .chain(ctx.node_ips.iter().copied())
        .map(|ip| Ipv4Net::new(ip, 32).expect("/32 is valid"));
    ranges.chain(hosts)
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
        .filter_map(|e| match e.addr {
            IpAddr::V4(addr) => Some(BackendAddr {
                addr,
                port: e.port,
                proto,
            }),
            IpAddr::V6(_) => None,
        })
        .collect();
    // A stable order keeps slots stable across syncs, so one changed endpoint moves few slots.
    out.sort();
    out.dedup();
    out
}

/// The socket-scope map key of `ip:port/proto`.
pub fn service_key(ip: Ipv4Addr, port: u16, proto: Protocol) -> ServiceKey {
    ServiceKey {
        addr: [v4_word(ip), 0, 0, 0],
        port: port.to_be(),
        proto: proto.number(),
        scope: SCOPE_SOCKET,
    }
}

/// The marker key saying `ip` is a clusterIP.
pub fn vip_key(ip: Ipv4Addr) -> ServiceKey {
    ServiceKey {
        addr: [v4_word(ip), 0, 0, 0],
        port: 0,
        proto: 0,
        scope: SCOPE_SOCKET,
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

/// The address family constant the maps use for IPv4.
pub const V4: u8 = FAMILY_V4;

#[cfg(test)]
mod tests;
