//! Map keys and values shared by the agent (`proxy`) and the eBPF programs (`proxy-ebpf`).
//!
//! Everything here is `#[repr(C)]`, `Copy`, with explicit padding and no `Option` or `bool`, so the
//! kernel and userspace agree on the byte layout. With the `user` feature the types implement
//! `aya::Pod` so userspace can put them into maps.
//!
//! Addresses are `[u32; 4]` in network byte order: an IPv4 address fills word 0 and leaves the
//! other words zero, an IPv6 address fills all four. The `family` fields tell them apart, and a
//! frontend key carries [`SCOPE_V6`] in its scope, so an IPv6 address whose last 96 bits are zero
//! never shares a key with an IPv4 one. Ports are in network byte order too, as the kernel hands
//! them to the programs.
//!
//! The maps (names as the eBPF object declares them, all pinned by name):
//!
//! | map | kind | key | value |
//! | --- | --- | --- | --- |
//! | `KPR_SERVICES` | hash | [`ServiceKey`] (frontend) | [`ServiceValue`] |
//! | `KPR_SLOTS` | hash | [`SlotKey`] (set id, slot 0..count; a Maglev set's table) | backend id `u32` |
//! | `KPR_BACKENDS` | hash | backend id `u32` | [`Backend`] |
//! | `KPR_COUNTERS` | hash | backend id `u32` | [`BackendCounters`] |
//! | `KPR_RR` | hash | set id `u32` | round-robin cursor `u32` |
//! | `KPR_AFFINITY` | LRU hash | [`AffinityKey`] | [`AffinityValue`] |
//! | `KPR_SOCKS` | hash | socket cookie `u64` | [`SockBackend`] |
//! | `KPR_REVNAT` | LRU hash | [`RevNatKey`] | [`RevNatValue`] |
//! | `KPR_UDP_FWD` | LRU hash | [`RevNatKey`] (socket, service) | [`SockBackend`] |
//! | `KPR_CT` | LRU hash | [`CtKey`] | [`CtValue`] (tc path) |
//! | `KPR_CONFIG` | array (1) | 0 | [`NodeConfig`] (tc path) |
//! | `KPR_CONFIG6` | array (1) | 0 | [`NodeConfig6`] (IPv6) |
//! | `KPR_SRC_RANGES` | LPM trie | prefix length + [`SrcRangeKey`] | `u8` (1: allowed) |
//! | `KPR_SOCK_TERM` | hash | backend id `u32` (removed) | [`Backend`] (its address) |
//! | `KPR_SOCK_TERM_STATS` | array ([`TERM_STATS`]) | [`TERM_TCP_DESTROYED`].. | `u64` count |
//! | `KPR_XDP_STATS` | per-CPU array ([`XDP_STATS`]) | [`XDP_STAT_TX`].. | `u64` count |
//! | `KPR_DSR` | LRU hash | [`CtKey`] (a DSR flow's reply: backend -> client) | [`DsrFrontend`] |
//! | `KPR_DSR_STATS` | per-CPU array ([`DSR_STATS`]) | [`DSR_STAT_OPT_ADDED`].. | `u64` count |
#![no_std]

pub mod hash;

/// IANA protocol numbers as they appear in [`ServiceKey::proto`] and [`Backend::proto`].
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;

/// Address families (`AF_INET`, `AF_INET6`).
pub const FAMILY_V4: u8 = 2;
pub const FAMILY_V6: u8 = 10;

/// [`ServiceKey::scope`]: the frontend as local sockets see it (cgroup programs).
pub const SCOPE_SOCKET: u8 = 0;
/// [`ServiceKey::scope`]: the frontend as traffic from outside the node sees it (tc program).
pub const SCOPE_EXTERNAL: u8 = 1;
/// [`ServiceKey::scope`] bit: the frontend's address is IPv6 (ORed into either scope).
pub const SCOPE_V6: u8 = 1 << 1;

/// [`ServiceValue::algorithm`] values.
pub const ALG_ROUND_ROBIN: u8 = 0;
pub const ALG_LEAST_CONN: u8 = 1;
/// Maglev consistent hashing: the set's slots are its Maglev table (`count` of them, the
/// node's table size), and a flow takes slot [`hash::slot_of`] of its [`hash`] flow hash.
pub const ALG_MAGLEV: u8 = 2;

/// [`ServiceValue::flags`]: with no backend, drop (Local policy with endpoints elsewhere) instead of
/// rejecting.
pub const SVC_F_DROP_EMPTY: u16 = 1 << 0;
/// [`ServiceValue::flags`]: session affinity ClientIP (timeout in `affinity_timeout_s`).
pub const SVC_F_AFFINITY: u16 = 1 << 1;
/// [`ServiceValue::flags`]: the tc path masquerades (SNAT to the node) this frontend's traffic.
pub const SVC_F_MASQUERADE: u16 = 1 << 2;

/// [`ServiceValue::flags`]: a marker entry (port 0, protocol 0) saying the address is a clusterIP:
/// a port or protocol the Service does not expose is rejected instead of routed.
pub const SVC_F_VIP: u16 = 1 << 3;

/// [`ServiceValue::flags`]: loadBalancerSourceRanges guard this LoadBalancer frontend. The tc path
/// admits a new flow only when `KPR_SRC_RANGES` holds its (frontend, source); the socket path
/// translates only the node's own sockets (the node is always allowed) and leaves a pod's
/// connection untranslated, to the tc path on the node's side of the pod's interface, which sees
/// the pod's address.
pub const SVC_F_SOURCE_RANGES: u16 = 1 << 4;

/// [`ServiceValue::flags`]: direct server return (`--nodeport-mode dsr|hybrid`) for this tc
/// frontend: a new flow is not masqueraded; the frontend travels to the backend's node in an IPv4
/// option ([`DSR_OPT_TYPE`]) and that node's tc egress program answers the client from the
/// frontend itself.
pub const SVC_F_DSR: u16 = 1 << 5;

/// Bits of a [`SrcRangeKey`] taken by its frontend: an LPM trie entry's prefix length is this
/// plus the source prefix length, so the frontend always matches exactly.
pub const SRC_RANGE_FRONTEND_BITS: u32 = 160;

/// [`AffinityKey::kind`]: the client is identified by its network namespace cookie (socket path,
/// where the source address is not known yet at `connect()`).
pub const CLIENT_NETNS: u8 = 0;
/// [`AffinityKey::kind`]: the client is identified by its source address (tc path).
pub const CLIENT_ADDR: u8 = 1;

/// A service frontend: destination address, port and protocol, per scope.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    /// Network byte order; IPv4 in word 0.
    pub addr: [u32; 4],
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    /// [`SCOPE_SOCKET`] or [`SCOPE_EXTERNAL`], with [`SCOPE_V6`] for an IPv6 address.
    pub scope: u8,
}

/// What a frontend translates to: a backend set and how to pick from it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceValue {
    /// The backend set: slots `(set_id, 0..count)` in `KPR_SLOTS`.
    pub set_id: u32,
    /// Number of slots in the set: its backends, or with [`ALG_MAGLEV`] its Maglev table's
    /// slots; 0 means reject (or drop, see [`SVC_F_DROP_EMPTY`]).
    pub count: u32,
    /// Session affinity timeout in seconds (with [`SVC_F_AFFINITY`]).
    pub affinity_timeout_s: u32,
    /// `SVC_F_*` bits.
    pub flags: u16,
    /// [`ALG_ROUND_ROBIN`], [`ALG_LEAST_CONN`] or [`ALG_MAGLEV`].
    pub algorithm: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
}

/// One slot of a backend set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlotKey {
    pub set_id: u32,
    pub slot: u32,
}

/// An endpoint: where a connection is translated to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend {
    /// Network byte order; IPv4 in word 0.
    pub addr: [u32; 4],
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

/// Per-backend counters, written by the programs with atomic adds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    /// Open sockets (cgroup path) translated to this backend; the least-connection input.
    pub active: u64,
    /// Connections ever translated to this backend.
    pub total: u64,
}

/// Session affinity: one client of one backend set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// [`CLIENT_NETNS`]: the netns cookie in words 0-1; [`CLIENT_ADDR`]: the source address.
    pub client: [u32; 4],
    pub set_id: u32,
    /// [`CLIENT_NETNS`] or [`CLIENT_ADDR`].
    pub kind: u8,
    pub _pad: [u8; 3],
}

/// The backend a client sticks to, and when it last used it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` of the last connection.
    pub last_used_ns: u64,
}

/// Which backend a socket was translated to (decremented from the counters at `sock_release`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockBackend {
    pub backend_id: u32,
    pub _pad: u32,
}

/// Reverse translation of the cgroup path: a socket and the backend address it talks to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNatKey {
    pub cookie: u64,
    /// The backend address (network byte order).
    pub addr: [u32; 4],
    /// The backend port (network byte order).
    pub port: u16,
    pub _pad: [u8; 6],
}

/// The service address a socket believes it talks to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevNatValue {
    pub addr: [u32; 4],
    pub port: u16,
    pub _pad: [u8; 2],
}

/// A flow of the tc path, as seen in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}

/// What the tc path did to a flow: the translated addresses and when it last saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtValue {
    /// The address to rewrite the packet's addresses to (forward: backend; reply: frontend).
    pub nat_addr: [u32; 4],
    /// With masquerade: the source address to write (forward) or restore (reply).
    pub snat_addr: [u32; 4],
    pub nat_port: u16,
    pub snat_port: u16,
    pub backend_id: u32,
    pub last_seen_ns: u64,
    /// `CT_F_*` bits.
    pub flags: u32,
    pub _pad: u32,
}

/// Node-wide settings, written by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeConfig {
    /// The address masqueraded traffic gets as its source (network byte order; IPv4 in word 0).
    pub masq_addr: [u32; 4],
    /// `--service-cluster-ip-range` (IPv4, network byte order): connects to an address inside
    /// that belongs to no Service fail (the "dropped" of the semantics). Mask 0: no range.
    pub svc_net: u32,
    pub svc_mask: u32,
    /// The node's network namespace cookie: sockets there are the node itself (0: unknown).
    pub host_netns: u64,
}

/// Node-wide settings of IPv6, written by the agent (a map of its own, so that maps pinned by an
/// agent without IPv6 keep their layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeConfig6 {
    /// The address masqueraded IPv6 traffic gets as its source (all zero: not masqueraded).
    pub masq_addr: [u32; 4],
    /// The IPv6 `--service-cluster-ip-range`: network and mask, network byte order (mask all
    /// zero: no range).
    pub svc_net: [u32; 4],
    pub svc_mask: [u32; 4],
}

/// The data of a `KPR_SRC_RANGES` key: a tc frontend (scope [`SCOPE_EXTERNAL`]), matched
/// exactly ([`SRC_RANGE_FRONTEND_BITS`]), then a source address, matched by prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SrcRangeKey {
    pub frontend: ServiceKey,
    /// Network byte order; IPv4 in word 0.
    pub src: [u32; 4],
}

/// [`CtValue::flags`]: the entry is the reply direction of a flow.
pub const CT_F_REPLY: u32 = 1 << 0;
/// [`CtValue::flags`]: the flow was masqueraded.
pub const CT_F_SNAT: u32 = 1 << 1;

/// [`CtValue::flags`]: a forward entry of a DSR flow: its packets that carry the frontend to the
/// backend's node (a TCP SYN, every UDP datagram) go through the DSR program (`KPR_TC_DSR`).
pub const CT_F_DSR: u32 = 1 << 2;

/// The IPv4 option that carries a DSR flow's frontend to the backend's node: type (copied flag,
/// class 0, number 30: RFC 4727's experimental value), length 8, then the frontend's port and
/// address as the client sent them (network byte order).
pub const DSR_OPT_TYPE: u8 = 0x9e;
pub const DSR_OPT_LEN: u8 = 8;

/// The frontend a DSR flow's replies are answered from (`KPR_DSR` value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsrFrontend {
    /// Network byte order; IPv4 in word 0.
    pub addr: [u32; 4],
    /// Network byte order.
    pub port: u16,
    pub _pad: [u8; 2],
}

/// `KPR_DSR_STATS` indices. On the node a client's flow enters by: packets sent on towards the
/// backend with the DSR option added; packets dropped because the option could not be added
/// (the client's packet carries IP options already, or the skb could not grow). On the backend's
/// node: packets whose option was read and recorded in `KPR_DSR`; replies rewritten on egress to
/// the frontend's address and port.
pub const DSR_STAT_OPT_ADDED: u32 = 0;
pub const DSR_STAT_OPT_FAILED: u32 = 1;
pub const DSR_STAT_RECORDED: u32 = 2;
pub const DSR_STAT_REPLY_REWRITTEN: u32 = 3;
/// Entries of `KPR_DSR_STATS`.
pub const DSR_STATS: u32 = 4;

/// `KPR_SOCK_TERM_STATS` indices: sockets the iterators destroyed, and destroys the kernel
/// refused, by protocol.
pub const TERM_TCP_DESTROYED: u32 = 0;
pub const TERM_UDP_DESTROYED: u32 = 1;
pub const TERM_TCP_FAILED: u32 = 2;
pub const TERM_UDP_FAILED: u32 = 3;
/// Entries of `KPR_SOCK_TERM_STATS`.
pub const TERM_STATS: u32 = 4;

/// `KPR_XDP_STATS` indices: packets the XDP program translated and sent back out of their
/// interface; packets of a flow it passed to tc because their translation goes elsewhere (a pod
/// of this node, a neighbour not resolved yet); first packets of flows (a SYN reusing an earlier
/// flow's 4-tuple, a UDP flow whose endpoint left, included) passed to tc, which balances them.
/// Everything else (not a service flow) passes uncounted.
pub const XDP_STAT_TX: u32 = 0;
pub const XDP_STAT_PASS_ROUTE: u32 = 1;
pub const XDP_STAT_PASS_NEW: u32 = 2;
/// Entries of `KPR_XDP_STATS`.
pub const XDP_STATS: u32 = 3;

/// The instruction the socket iterators carry where they call the `bpf_sock_destroy` kfunc: a
/// `call` with `src_reg` 2 (`BPF_PSEUDO_KFUNC_CALL`) whose immediate is a placeholder. The loader
/// the agent uses (aya 0.14) does not resolve kfunc calls, so the agent writes the kfunc's BTF id
/// of the running kernel into the immediate before it loads the object (little-endian bytes:
/// opcode 0x85, registers 0x20, offset 0, immediate [`KFUNC_PLACEHOLDER_IMM`]).
pub const KFUNC_CALL_PLACEHOLDER: u64 = ((KFUNC_PLACEHOLDER_IMM as u64) << 32) | 0x2085;
/// The placeholder immediate ("kpr1" read as a little-endian word).
pub const KFUNC_PLACEHOLDER_IMM: u32 = 0x3172_706b;

#[cfg(feature = "user")]
mod pod {
    use super::*;

    // SAFETY: every type is #[repr(C)], Copy, made of integers only, with explicit padding fields,
    // so any byte pattern is a valid value and there are no implicit padding bytes.
    unsafe impl aya::Pod for ServiceKey {}
    unsafe impl aya::Pod for ServiceValue {}
    unsafe impl aya::Pod for SlotKey {}
    unsafe impl aya::Pod for Backend {}
    unsafe impl aya::Pod for BackendCounters {}
    unsafe impl aya::Pod for AffinityKey {}
    unsafe impl aya::Pod for AffinityValue {}
    unsafe impl aya::Pod for SockBackend {}
    unsafe impl aya::Pod for RevNatKey {}
    unsafe impl aya::Pod for RevNatValue {}
    unsafe impl aya::Pod for CtKey {}
    unsafe impl aya::Pod for CtValue {}
    unsafe impl aya::Pod for NodeConfig {}
    unsafe impl aya::Pod for NodeConfig6 {}
    unsafe impl aya::Pod for SrcRangeKey {}
    unsafe impl aya::Pod for DsrFrontend {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// The sizes are part of the kernel/userspace contract: no implicit padding anywhere.
    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<ServiceKey>(), 16 + 2 + 1 + 1);
        assert_eq!(size_of::<ServiceValue>(), 4 + 4 + 4 + 2 + 1 + 1);
        assert_eq!(size_of::<SlotKey>(), 8);
        assert_eq!(size_of::<Backend>(), 16 + 2 + 1 + 1);
        assert_eq!(size_of::<BackendCounters>(), 16);
        assert_eq!(size_of::<AffinityKey>(), 16 + 4 + 1 + 3);
        assert_eq!(size_of::<AffinityValue>(), 16);
        assert_eq!(size_of::<SockBackend>(), 8);
        assert_eq!(size_of::<RevNatKey>(), 8 + 16 + 2 + 6);
        assert_eq!(size_of::<RevNatValue>(), 16 + 2 + 2);
        assert_eq!(size_of::<CtKey>(), 16 + 16 + 2 + 2 + 1 + 1 + 2);
        assert_eq!(size_of::<CtValue>(), 16 + 16 + 2 + 2 + 4 + 8 + 4 + 4);
        assert_eq!(size_of::<NodeConfig>(), 16 + 4 + 4 + 8);
        assert_eq!(size_of::<NodeConfig6>(), 16 * 3);
        assert_eq!(size_of::<SrcRangeKey>(), 20 + 16);
        assert_eq!(size_of::<DsrFrontend>(), 16 + 2 + 2);
        assert_eq!(
            SRC_RANGE_FRONTEND_BITS as usize,
            size_of::<ServiceKey>() * 8
        );
    }
}
