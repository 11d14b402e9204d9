//! `proxy trace`: the decision the eBPF programs would make for a NEW connection, worked out from
//! a [`MapSnapshot`] the way `proxy-ebpf` decides (`sock.rs` for the socket path, `nodeport.rs` for
//! traffic from outside the node, `lb.rs` for the pick). Reads only; the real cursor is not moved.

use std::fmt;
use std::net::IpAddr;

use proxy_common::{
    ALG_LEAST_CONN, ALG_MAGLEV, SVC_F_AFFINITY, SVC_F_DROP_EMPTY, SVC_F_SOURCE_RANGES,
};

use super::compile::BackendAddr;
use super::inspect::{AffinityClient, FrontendView, MapSnapshot, SlotView};
use crate::model::Protocol;

/// Least-connection scans at most this many slots (proxy-ebpf's `MAX_LC_SCAN`).
pub const MAX_LC_SCAN: u32 = 128;

/// One connection to trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub port: u16,
    pub proto: Protocol,
    /// From outside the node (tc path) instead of a socket on the node (cgroup path).
    pub external: bool,
    /// The client's network namespace cookie (socket-path affinity is keyed by it).
    pub netns_cookie: Option<u64>,
    /// The client's source port: Maglev hashes it (tc path: the packet's; socket path: the
    /// port the socket bound before `connect()`).
    pub sport: Option<u16>,
}

/// What happens to the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not a Service frontend: the programs leave it alone.
    PassThrough,
    /// An unallocated address of the service range: the connection fails (EPERM / dropped).
    DroppedUnallocated,
    /// A clusterIP, but not this port or protocol: refused.
    RejectedPort,
    /// A Service without usable endpoints: refused (ECONNREFUSED), or dropped for a Local policy
    /// (by the socket program refusing connect() with EPERM, or on the tc path, `external`, by
    /// dropping the packet).
    NoEndpoints { dropped: bool, external: bool },
    /// A LoadBalancer IP whose loadBalancerSourceRanges do not admit the source: dropped.
    DroppedSourceRange,
    /// The client's affinity entry (within the timeout) names this backend.
    AffinityHit(BackendAddr),
    /// The algorithm picks this backend from the set.
    Picked {
        algorithm: &'static str,
        slot: u32,
        backend: BackendAddr,
    },
    /// A Maglev Service, traced without a source port: the slot depends on it (and on the
    /// socket's cookie for a socket that is not bound before `connect()`).
    MaglevNeedsSourcePort,
    /// The maps are inconsistent (a slot or backend entry is missing).
    Broken(String),
}

/// The answer: which frontend, which endpoint set, which decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub frontend: Option<FrontendView>,
    pub decision: Decision,
    /// The socket program left the connection untranslated (a pod's connection to a guarded
    /// LoadBalancer IP) and this is the tc program's decision on the node's side.
    pub via_tc: bool,
}

/// Works out the decision for `req` from `snap`.
pub fn trace(snap: &MapSnapshot, req: &TraceRequest) -> Trace {
    let Some(f) = snap.frontend(req.dst, req.port, req.proto, req.external) else {
        let decision = if !req.external && snap.vips.contains(&req.dst) {
            Decision::RejectedPort
        } else if !req.external && snap.in_service_range(req.dst) {
            Decision::DroppedUnallocated
        } else {
            Decision::PassThrough
        };
        return Trace {
            frontend: None,
            decision,
            via_tc: false,
        };
    };
    let guarded = f.value.flags & SVC_F_SOURCE_RANGES != 0;
    if guarded && !req.external && !snap.is_node_netns(req.netns_cookie) {
        let outside = TraceRequest {
            external: true,
            ..*req
        };
        return Trace {
            via_tc: true,
            ..trace(snap, &outside)
        };
    }
    if guarded && req.external && !f.source_ranges.iter().any(|n| n.contains(&req.src)) {
        return Trace {
            decision: Decision::DroppedSourceRange,
            frontend: Some(f.clone()),
            via_tc: false,
        };
    }
    Trace {
        decision: decide(f, req),
        frontend: Some(f.clone()),
        via_tc: false,
    }
}

fn decide(f: &FrontendView, req: &TraceRequest) -> Decision {
    if f.value.count == 0 {
        return Decision::NoEndpoints {
            dropped: f.value.flags & SVC_F_DROP_EMPTY != 0,
            external: req.external,
        };
    }
    if f.value.flags & SVC_F_AFFINITY != 0 {
        if let Some(b) = sticky(f, req) {
            return Decision::AffinityHit(b);
        }
    }
    if f.value.algorithm == ALG_MAGLEV {
        let Some(sport) = req.sport else {
            return Decision::MaglevNeedsSourcePort;
        };
        let hash = crate::maglev::flow_hash(
            std::net::SocketAddr::new(req.src, sport),
            std::net::SocketAddr::new(req.dst, req.port),
        );
        let n = proxy_common::hash::slot_of(hash, f.value.count);
        return picked(f, slot(f, n));
    }
    let Some(cursor) = f.cursor else {
        return Decision::Broken(format!(
            "{}: no round-robin cursor for set {}",
            f.frontend(),
            f.value.set_id
        ));
    };
    let pick = if f.value.algorithm == ALG_LEAST_CONN {
        least_conn(f, cursor)
    } else {
        slot(f, cursor % f.value.count)
    };
    picked(f, pick)
}

fn picked(f: &FrontendView, pick: Option<&SlotView>) -> Decision {
    match pick {
        Some(s) => match s.addr {
            Some(backend) => Decision::Picked {
                algorithm: f.algorithm(),
                slot: s.slot,
                backend,
            },
            None => Decision::Broken(format!(
                "{}: backend id {} has no readable entry",
                f.frontend(),
                s.backend_id
            )),
        },
        None => Decision::Broken(format!(
            "{}: set {} is missing a slot below {}",
            f.frontend(),
            f.value.set_id,
            f.value.count
        )),
    }
}

fn slot(f: &FrontendView, n: u32) -> Option<&SlotView> {
    f.slots.iter().find(|s| s.slot == n)
}

/// Fewest active connections; ties go to the first slot at or after the cursor.
fn least_conn(f: &FrontendView, cursor: u32) -> Option<&SlotView> {
    // The program's own scan: u32 arithmetic from the cursor, at most MAX_LC_SCAN slots.
    let count = f.value.count;
    crate::balance::least_loaded(
        (0..count.min(MAX_LC_SCAN)).filter_map(|i| slot(f, cursor.wrapping_add(i) % count)),
        |s| s.active,
    )
}

/// The client's live affinity entry: by address on the tc path, by netns cookie on the socket path.
fn sticky(f: &FrontendView, req: &TraceRequest) -> Option<BackendAddr> {
    let client = if req.external {
        AffinityClient::Addr(req.src)
    } else {
        AffinityClient::Netns(req.netns_cookie?)
    };
    let timeout_ns = u64::from(f.value.affinity_timeout_s) * 1_000_000_000;
    let entry = f
        .affinity
        .iter()
        .find(|a| a.client == client && a.idle_ns <= timeout_ns)?;
    f.slots
        .iter()
        .find(|s| s.backend_id == entry.backend_id)
        .and_then(|s| s.addr)
}

impl Decision {
    /// The backend the connection goes to, when the decision names one.
    pub fn backend(&self) -> Option<&BackendAddr> {
        match self {
            Decision::AffinityHit(b) | Decision::Picked { backend: b, .. } => Some(b),
            _ => None,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::PassThrough => write!(f, "not a service: passed through unchanged"),
            Decision::DroppedUnallocated => write!(
                f,
                "dropped: an unallocated address of the service range (connect fails with EPERM)"
            ),
            Decision::RejectedPort => write!(
                f,
                "rejected: a clusterIP without this port/protocol (ECONNREFUSED)"
            ),
            Decision::NoEndpoints { dropped: false, .. } => {
                write!(f, "rejected: no endpoints (ECONNREFUSED)")
            }
            Decision::DroppedSourceRange => write!(
                f,
                "dropped: the source is outside the LoadBalancer's loadBalancerSourceRanges"
            ),
            Decision::NoEndpoints {
                dropped: true,
                external: false,
            } => write!(
                f,
                "dropped: no endpoints usable here (Local traffic policy; connect() fails with \
                 EPERM)"
            ),
            Decision::NoEndpoints {
                dropped: true,
                external: true,
            } => write!(
                f,
                "dropped: no endpoints usable here (Local traffic policy; the packet is dropped)"
            ),
            Decision::AffinityHit(b) => {
                write!(f, "affinity hit: -> {}", b.socket_addr())
            }
            Decision::Picked {
                algorithm,
                slot,
                backend,
            } => write!(
                f,
                "{algorithm}: next connection -> {} (slot {slot})",
                backend.socket_addr()
            ),
            Decision::MaglevNeedsSourcePort => write!(
                f,
                "maglev: the slot is the hash of the flow's 5-tuple; give the client's port \
                 (--src-port; a socket not bound before connect() hashes its cookie instead)"
            ),
            Decision::Broken(why) => write!(f, "inconsistent maps: {why}"),
        }
    }
}

/// The hooks that carry a flow from outside the node where the agent runs XDP
/// (`--xdp-interfaces`). XDP passes a flow's first packet to tc, which balances it; it sends a
/// later packet itself only when the route of the translated packet leaves by the interface the
/// packet arrived on (`XDP_TX`), and passes it to tc otherwise (proxy-ebpf's `nodeport.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpPath {
    /// The interfaces with the XDP program attached.
    pub xdp: Vec<String>,
    /// The interface the client's packets arrive on.
    pub ingress: String,
    /// The interface the node routes the backend's address by: the forward packets leave, and
    /// the backend's replies arrive, there.
    pub to_backend: String,
    /// The interface the node routes the client's address by: the replies leave there.
    pub to_client: String,
}

impl XdpPath {
    fn attached(&self, interface: &str) -> bool {
        self.xdp.iter().any(|i| i == interface)
    }

    /// Whether XDP sends the client's packets after the first.
    pub fn forward_by_xdp(&self) -> bool {
        self.attached(&self.ingress) && self.to_backend == self.ingress
    }

    /// Whether XDP sends the backend's replies.
    pub fn replies_by_xdp(&self) -> bool {
        self.attached(&self.to_backend) && self.to_client == self.to_backend
    }

    /// The lines `proxy trace` prints for the flow to `backend`.
    pub fn describe(&self, backend: IpAddr) -> Vec<String> {
        if self.xdp.is_empty() {
            return vec!["XDP: attached nowhere (--xdp-interfaces): tc carries the flow".into()];
        }
        let mut out = Vec::new();
        if self.attached(&self.ingress) {
            out.push(format!(
                "XDP on {}: the first packet is passed to tc, which decides as below",
                self.ingress
            ));
        } else {
            out.push(format!(
                "no XDP on {} (XDP on {}): tc carries the client's packets",
                self.ingress,
                self.xdp.join(", ")
            ));
        }
        if self.forward_by_xdp() {
            out.push(format!(
                "later packets to the backend: sent back out of {} by XDP (XDP_TX)",
                self.ingress
            ));
        } else if self.attached(&self.ingress) {
            out.push(format!(
                "later packets to the backend: passed to tc (the route to {backend} leaves by {}, \
                 not {})",
                self.to_backend, self.ingress
            ));
        }
        if self.replies_by_xdp() {
            out.push(format!(
                "the backend's replies: sent back out of {} by XDP (XDP_TX)",
                self.to_backend
            ));
        } else if self.attached(&self.to_backend) {
            out.push(format!(
                "the backend's replies: arrive on {} and are passed to tc (the route to the \
                 client leaves by {})",
                self.to_backend, self.to_client
            ));
        } else {
            out.push(format!(
                "the backend's replies: arrive on {}, no XDP there: tc",
                self.to_backend
            ));
        }
        out
    }
}

/// The network namespace cookie of the namespace at `path` (e.g. `/run/netns/NAME` or
/// `/proc/PID/ns/net`): what the socket programs key affinity by.
pub fn netns_cookie(path: &std::path::Path) -> std::io::Result<u64> {
    let file = std::fs::File::open(path)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            current_netns_cookie()
        })
        .join()
        .map_err(|_| std::io::Error::other("netns cookie thread panicked"))?
    })
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`, Linux 5.14).
pub fn current_netns_cookie() -> std::io::Result<u64> {
    // SAFETY: socket(2) with constant arguments; the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    socket_netns_cookie(&sock)
}

/// `SO_NETNS_COOKIE` of a socket.
fn socket_netns_cookie(sock: &impl std::os::fd::AsRawFd) -> std::io::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of the sizes given, for the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_common::{ServiceValue, ALG_ROUND_ROBIN};
    use std::net::Ipv4Addr;

    use crate::dataplane::ebpf::inspect::AffinityView;

    fn slot(n: u32, active: u64) -> SlotView {
        SlotView {
            slot: n,
            backend_id: n + 1,
            addr: Some(BackendAddr {
                addr: IpAddr::V4(Ipv4Addr::new(10, 244, n as u8, 2)),
                port: 8080,
                proto: Protocol::Tcp,
            }),
            active,
            total: 0,
        }
    }

    fn frontend(algorithm: u8, actives: &[u64], cursor: u32) -> FrontendView {
        FrontendView {
            addr: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
            port: 80,
            proto: Some(Protocol::Tcp),
            external: false,
            value: ServiceValue {
                set_id: 7,
                count: actives.len() as u32,
                algorithm,
                ..ServiceValue::default()
            },
            slots: actives
                .iter()
                .enumerate()
                .map(|(i, a)| slot(i as u32, *a))
                .collect(),
            cursor: Some(cursor),
            affinity: vec![],
            source_ranges: vec![],
        }
    }

    fn req(external: bool, netns_cookie: Option<u64>) -> TraceRequest {
        TraceRequest {
            src: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 100)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
            port: 80,
            proto: Protocol::Tcp,
            external,
            netns_cookie,
            sport: None,
        }
    }

    #[test]
    fn maglev_takes_the_slot_of_the_flow_hash() {
        let mut f = frontend(ALG_MAGLEV, &[0; 251], 0);
        f.value.count = 251;
        assert_eq!(
            decide(&f, &req(true, None)),
            Decision::MaglevNeedsSourcePort
        );
        let r = TraceRequest {
            sport: Some(40000),
            ..req(true, None)
        };
        let hash = crate::maglev::flow_hash(
            "192.0.2.100:40000".parse().unwrap(),
            "10.96.0.10:80".parse().unwrap(),
        );
        let expect = proxy_common::hash::slot_of(hash, 251);
        assert_eq!(picked_slot(decide(&f, &r)), expect);
    }

    fn picked_slot(d: Decision) -> u32 {
        match d {
            Decision::Picked { slot, .. } => slot,
            other => panic!("not a pick: {other:?}"),
        }
    }

    #[test]
    fn round_robin_takes_the_cursor_modulo_the_count() {
        let f = frontend(ALG_ROUND_ROBIN, &[0, 0, 0], 7);
        assert_eq!(picked_slot(decide(&f, &req(false, None))), 1);
    }

    #[test]
    fn least_conn_takes_the_minimum_and_breaks_ties_from_the_cursor() {
        let f = frontend(ALG_LEAST_CONN, &[2, 1, 1, 3], 2);
        assert_eq!(picked_slot(decide(&f, &req(false, None))), 2);
        let f = frontend(ALG_LEAST_CONN, &[2, 1, 1, 3], 3);
        assert_eq!(picked_slot(decide(&f, &req(false, None))), 1);
    }

    #[test]
    fn affinity_hits_only_the_same_client_within_the_timeout() {
        let mut f = frontend(ALG_ROUND_ROBIN, &[0, 0], 0);
        f.value.flags = SVC_F_AFFINITY;
        f.value.affinity_timeout_s = 10;
        f.affinity = vec![
            AffinityView {
                client: AffinityClient::Netns(42),
                backend_id: 2,
                idle_ns: 1_000_000_000,
            },
            AffinityView {
                client: AffinityClient::Addr(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 100))),
                backend_id: 2,
                idle_ns: 11_000_000_000,
            },
        ];
        let hit = decide(&f, &req(false, Some(42)));
        assert!(
            matches!(hit, Decision::AffinityHit(b) if b.addr == IpAddr::V4(Ipv4Addr::new(10, 244, 1, 2)))
        );
        // Another namespace, or no namespace given: the algorithm decides.
        assert_eq!(picked_slot(decide(&f, &req(false, Some(43)))), 0);
        assert_eq!(picked_slot(decide(&f, &req(false, None))), 0);
        // The tc-path entry of that address has expired.
        assert_eq!(picked_slot(decide(&f, &req(true, None))), 0);
    }

    #[test]
    fn source_ranges_drop_outsiders_on_the_tc_path_and_send_pods_there() {
        let mut sock = frontend(ALG_ROUND_ROBIN, &[0, 0], 0);
        sock.value.flags = SVC_F_SOURCE_RANGES;
        let mut tc = sock.clone();
        tc.external = true;
        tc.source_ranges = vec!["192.0.2.0/24".parse().unwrap()];
        let snap = MapSnapshot {
            frontends: vec![sock, tc],
            config: Some(proxy_common::NodeConfig {
                host_netns: 1,
                ..Default::default()
            }),
            ..MapSnapshot::default()
        };
        let from = |src: [u8; 4], external: bool, netns: u64| {
            trace(
                &snap,
                &TraceRequest {
                    src: IpAddr::V4(Ipv4Addr::from(src)),
                    ..req(external, Some(netns))
                },
            )
        };
        // Outside: the source decides.
        assert!(matches!(
            from([192, 0, 2, 7], true, 0).decision,
            Decision::Picked { .. }
        ));
        assert_eq!(
            from([203, 0, 113, 7], true, 0).decision,
            Decision::DroppedSourceRange
        );
        // The node itself is translated at the socket.
        let node = from([10, 244, 9, 9], false, 1);
        assert!(!node.via_tc && matches!(node.decision, Decision::Picked { .. }));
        // A pod is left to the tc path, which drops an address outside the ranges.
        let pod = from([10, 244, 9, 9], false, 2);
        assert!(pod.via_tc);
        assert_eq!(pod.decision, Decision::DroppedSourceRange);
    }

    fn path(xdp: &[&str], ingress: &str, to_backend: &str, to_client: &str) -> XdpPath {
        XdpPath {
            xdp: xdp.iter().map(|s| s.to_string()).collect(),
            ingress: ingress.into(),
            to_backend: to_backend.into(),
            to_client: to_client.into(),
        }
    }

    #[test]
    fn xdp_sends_only_what_its_route_sends_back_out_of_the_same_interface() {
        // A backend on another node behind the external interface: both ways by XDP.
        let hairpin = path(&["eth0"], "eth0", "eth0", "eth0");
        assert!(hairpin.forward_by_xdp() && hairpin.replies_by_xdp());
        // A pod of this node: the forward packets leave by its veth, the replies arrive there.
        let local = path(&["eth0"], "eth0", "veth1", "eth0");
        assert!(!local.forward_by_xdp() && !local.replies_by_xdp());
        let lines = local.describe("10.244.0.5".parse().unwrap()).join("\n");
        assert!(lines.contains("passed to tc (the route to 10.244.0.5 leaves by veth1, not eth0)"));
        assert!(lines.contains("arrive on veth1, no XDP there: tc"));
        // Arriving on an interface without XDP: tc, whatever the backend's route.
        let other = path(&["eth0"], "eth1", "eth0", "eth1");
        assert!(!other.forward_by_xdp());
        assert!(
            !other.replies_by_xdp(),
            "the replies leave by eth1, not eth0"
        );
        assert_eq!(
            path(&[], "eth0", "eth0", "eth0").describe("10.0.0.1".parse().unwrap()),
            vec!["XDP: attached nowhere (--xdp-interfaces): tc carries the flow".to_string()]
        );
    }

    #[test]
    fn missing_slots_are_reported_not_guessed() {
        let mut f = frontend(ALG_ROUND_ROBIN, &[0, 0], 1);
        f.slots.truncate(1);
        assert!(matches!(decide(&f, &req(false, None)), Decision::Broken(_)));
    }
}
