//! The cgroup socket programs' logic: translate a service address to a backend at `connect()` /
//! `sendmsg()`, translate it back for `recvmsg()` / `getpeername()`, and account open sockets.
//!
//! Maglev Services: a socket takes the slot of its flow hash ([`flow_hash`]): its bound 5-tuple,
//! or its cookie when it is not bound yet.
//!
//! One body serves both families: `V6` selects the context's address field (`user_ip4` or
//! `user_ip6`; the verifier lets each program touch only its own family's), and is a constant of
//! each program, so the other family's code is not in it. An IPv6 socket that reaches an IPv4
//! Service through a v4-mapped address (`::ffff:10.96.0.10`, a dual-stack socket) is translated
//! as IPv4 and given the backend's v4-mapped address.

use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    EbpfContext,
};
use aya_log_ebpf::warn;
use proxy_common::{
    hash::{flow_hash_v4, flow_hash_v6, jhash_words, FLOW_SEED},
    AffinityKey, Backend, RevNatKey, RevNatValue, ServiceKey, ServiceValue, SockBackend,
    CLIENT_NETNS, PROTO_SCTP, PROTO_TCP, PROTO_UDP, SCOPE_SOCKET, SCOPE_V6, SVC_F_DROP_EMPTY,
    SVC_F_SOURCE_RANGES,
};

use crate::lb;
use crate::maps::{
    KPR_BACKENDS, KPR_CONFIG, KPR_CONFIG6, KPR_REVNAT, KPR_SERVICES, KPR_SOCKS, KPR_UDP_FWD,
};

/// Let the syscall proceed.
pub const ALLOW: i32 = 1;
/// Fail the syscall (with the errno set by `bpf_set_retval`, EPERM otherwise).
pub const DENY: i32 = 0;

const ECONNREFUSED: i32 = 111;

/// How a translated socket is accounted.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `connect()`: one backend per socket, released at `sock_release`.
    Connect,
    /// `sendmsg()` on an unconnected UDP socket: per (socket, service) flow, no release.
    Sendmsg,
}

/// A service frontend seen by a socket, the socket's identity and its Maglev flow hash.
struct Request {
    key: ServiceKey,
    cookie: u64,
    flow_hash: u32,
}

/// Word 2 of a v4-mapped IPv6 address (`::ffff:0:0/96`) as the context holds it.
const V4_MAPPED: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The address a socket program sees, as the maps key it: an IPv4 address (also a v4-mapped one
/// in an IPv6 program) in word 0, else the IPv6 address; and whether it is IPv6.
#[inline(always)]
fn user_addr<const V6: bool>(sa: &bpf_sock_addr) -> ([u32; 4], bool) {
    if !V6 {
        return ([sa.user_ip4, 0, 0, 0], false);
    }
    let a = sa.user_ip6;
    if a[0] == 0 && a[1] == 0 && a[2] == V4_MAPPED {
        ([a[3], 0, 0, 0], false)
    } else {
        (a, true)
    }
}

/// Writes `addr` (as [`user_addr`] returned it) back into the context.
#[inline(always)]
fn set_user_addr<const V6: bool>(sa: &mut bpf_sock_addr, addr: [u32; 4], v6: bool) {
    if !V6 {
        sa.user_ip4 = addr[0];
        return;
    }
    let words = if v6 { addr } else { [0, 0, V4_MAPPED, addr[0]] };
    // One 4-byte store per word at its own offset: a whole-array assignment becomes a copy loop
    // through a moved context pointer, which the verifier refuses ("dereference of modified ctx
    // ptr").
    let dst = &raw mut sa.user_ip6;
    // SAFETY: `dst` points into the context the kernel passed, valid for the program's run.
    unsafe {
        core::ptr::write_volatile(&raw mut (*dst)[0], words[0]);
        core::ptr::write_volatile(&raw mut (*dst)[1], words[1]);
        core::ptr::write_volatile(&raw mut (*dst)[2], words[2]);
        core::ptr::write_volatile(&raw mut (*dst)[3], words[3]);
    }
}

/// connect4/6 / sendmsg4/6: rewrite a service destination to a backend.
#[inline(always)]
pub fn translate<const V6: bool, C: EbpfContext>(
    ctx: &C,
    sa: *mut bpf_sock_addr,
    mode: Mode,
) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr for the program's run.
    let sa = unsafe { &mut *sa };
    let proto = sa.protocol as u8;
    if proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP {
        return ALLOW;
    }
    let (addr, v6) = user_addr::<V6>(sa);
    let key = ServiceKey {
        addr,
        port: sa.user_port as u16,
        proto,
        scope: if v6 {
            SCOPE_SOCKET | SCOPE_V6
        } else {
            SCOPE_SOCKET
        },
    };
    // SAFETY: the value is copied out at once.
    let Some(svc) = (unsafe { KPR_SERVICES.get(key).copied() }) else {
        return not_a_frontend(&key, v6);
    };
    // loadBalancerSourceRanges: the node itself is allowed; a pod's source address is not known
    // yet at connect(), so its connection goes out untranslated and the tc program on the node's
    // side of its interface checks the address.
    if svc.flags & SVC_F_SOURCE_RANGES != 0 && !from_node(ctx) {
        return ALLOW;
    }
    // SAFETY: helpers valid for cgroup sock_addr programs (kernel >= 5.7).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let flow_hash = flow_hash::<V6>(sa, &key, v6, cookie);
    let req = Request {
        key,
        cookie,
        flow_hash,
    };
    let Some(backend) = choose(ctx, &svc, &req, mode) else {
        return refuse(&svc);
    };
    remember_reverse(&req, &backend);
    set_user_addr::<V6>(sa, backend.addr, v6);
    sa.user_port = u32::from(backend.port);
    ALLOW
}

/// The Maglev flow hash of a socket's connection to `key`. A socket bound to a source port (and
/// address) before `connect()` hashes its 5-tuple as the tc path and nftables hash the packets
/// (the same flow picks the same slot on every node). An unbound socket has no source port yet
/// (the kernel picks it after this program), so its cookie stands in for the source: each
/// socket is its own flow, spread over the table like any hash.
#[inline(always)]
fn flow_hash<const V6: bool>(sa: &bpf_sock_addr, key: &ServiceKey, v6: bool, cookie: u64) -> u32 {
    // SAFETY: `sk` of a sock_addr context is the kernel's full socket (PTR_TO_SOCKET, never
    // null), readable for the program's run.
    let sk = unsafe { &*sa.__bindgen_anon_1.sk };
    // `src_port` is in host byte order (the maps and nftables use network order).
    let sport = (sk.src_port as u16).to_be();
    if sport == 0 {
        return jhash_words(
            &[cookie as u32, (cookie >> 32) as u32, key.addr[0], u32::from(key.port)],
            FLOW_SEED,
        );
    }
    if !V6 {
        return flow_hash_v4(sk.src_ip4, key.addr[0], sport, key.port);
    }
    let src = [sk.src_ip6[0], sk.src_ip6[1], sk.src_ip6[2], sk.src_ip6[3]];
    if !v6 {
        // An IPv4 Service through a v4-mapped address: the source is v4-mapped too.
        return flow_hash_v4(src[3], key.addr[0], sport, key.port);
    }
    flow_hash_v6(&src, &key.addr, sport, key.port)
}

/// Whether the socket lives in the node's own network namespace.
#[inline(always)]
fn from_node<C: EbpfContext>(ctx: &C) -> bool {
    let Some(cfg) = KPR_CONFIG.get(0) else {
        return false;
    };
    // SAFETY: helper valid for cgroup sock_addr programs (kernel >= 5.7).
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    cfg.host_netns != 0 && netns == cfg.host_netns
}

/// The backend for this request: the flow's earlier choice for unconnected UDP, else a new pick.
#[inline(always)]
fn choose<C: EbpfContext>(
    ctx: &C,
    svc: &ServiceValue,
    req: &Request,
    mode: Mode,
) -> Option<Backend> {
    let flow = RevNatKey {
        cookie: req.cookie,
        addr: req.key.addr,
        port: req.key.port,
        _pad: [0; 6],
    };
    if mode == Mode::Sendmsg && svc.count != 0 {
        // SAFETY: copied out at once.
        if let Some(prev) = unsafe { KPR_UDP_FWD.get(flow).copied() } {
            if let Some(b) = backend(prev.backend_id) {
                return Some(b);
            }
        }
    }
    // SAFETY: helper valid for cgroup sock_addr programs (kernel >= 5.7).
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let client = AffinityKey {
        client: [netns as u32, (netns >> 32) as u32, 0, 0],
        set_id: svc.set_id,
        kind: CLIENT_NETNS,
        _pad: [0; 3],
    };
    let id = lb::pick(svc, &client, req.flow_hash)?;
    let b = backend(id)?;
    match mode {
        Mode::Connect => {
            if !account_socket(req.cookie, id) {
                warn!(
                    ctx,
                    "kpr: KPR_SOCKS is full; socket not counted for least-connection"
                );
            }
        }
        Mode::Sendmsg => {
            lb::count_connection(id, false);
            let value = SockBackend {
                backend_id: id,
                _pad: 0,
            };
            let _ = KPR_UDP_FWD.insert(flow, value, 0);
        }
    }
    Some(b)
}

#[inline(always)]
fn backend(id: u32) -> Option<Backend> {
    // SAFETY: copied out at once.
    unsafe { KPR_BACKENDS.get(id).copied() }
}

/// Counts the socket as active on `id`; a reconnecting socket first gives back its old backend.
/// Returns false when the socket could not be recorded (it is then not counted as active).
#[inline(always)]
fn account_socket(cookie: u64, id: u32) -> bool {
    // SAFETY: copied out at once.
    if let Some(prev) = unsafe { KPR_SOCKS.get(cookie).copied() } {
        lb::release_connection(prev.backend_id);
    }
    let value = SockBackend {
        backend_id: id,
        _pad: 0,
    };
    // Without room the socket is still translated, only not counted as active.
    let active = KPR_SOCKS.insert(cookie, value, 0).is_ok();
    lb::count_connection(id, active);
    active
}

#[inline(always)]
fn remember_reverse(req: &Request, backend: &Backend) {
    let key = RevNatKey {
        cookie: req.cookie,
        addr: backend.addr,
        port: backend.port,
        _pad: [0; 6],
    };
    let value = RevNatValue {
        addr: req.key.addr,
        port: req.key.port,
        _pad: [0; 2],
    };
    let _ = KPR_REVNAT.insert(key, value, 0);
}

/// No backend: reject with ECONNREFUSED, or fail with EPERM for a Local policy's "drop" (a socket
/// program cannot drop silently; failing at once is the closest honest outcome).
#[inline(always)]
fn refuse(svc: &ServiceValue) -> i32 {
    if svc.flags & SVC_F_DROP_EMPTY == 0 {
        // SAFETY: helper valid for cgroup programs (kernel >= 5.18).
        unsafe { bpf_set_retval(-ECONNREFUSED) };
    }
    DENY
}

/// A destination that is no frontend: a clusterIP with another port or protocol is refused
/// (ECONNREFUSED), an unallocated address of the service range fails (EPERM, the socket-level
/// "drop"), anything else is left alone.
#[inline(always)]
fn not_a_frontend(key: &ServiceKey, v6: bool) -> i32 {
    let marker = ServiceKey {
        addr: key.addr,
        port: 0,
        proto: 0,
        scope: key.scope,
    };
    if KPR_SERVICES.get_ptr(marker).is_some() {
        // SAFETY: helper valid for cgroup programs (kernel >= 5.18).
        unsafe { bpf_set_retval(-ECONNREFUSED) };
        return DENY;
    }
    if in_service_range(&key.addr, v6) {
        return DENY;
    }
    ALLOW
}

/// Whether `addr` lies in the `--service-cluster-ip-range` of its family.
#[inline(always)]
fn in_service_range(addr: &[u32; 4], v6: bool) -> bool {
    if !v6 {
        return match KPR_CONFIG.get(0) {
            Some(cfg) => cfg.svc_mask != 0 && addr[0] & cfg.svc_mask == cfg.svc_net,
            None => false,
        };
    }
    let Some(cfg) = KPR_CONFIG6.get(0) else {
        return false;
    };
    let m = cfg.svc_mask;
    let n = cfg.svc_net;
    (m[0] | m[1] | m[2] | m[3]) != 0
        && addr[0] & m[0] == n[0]
        && addr[1] & m[1] == n[1]
        && addr[2] & m[2] == n[2]
        && addr[3] & m[3] == n[3]
}

/// recvmsg4/6 / getpeername4/6: show the service address instead of the backend's.
#[inline(always)]
pub fn reverse<const V6: bool, C: EbpfContext>(ctx: &C, sa: *mut bpf_sock_addr) -> i32 {
    // SAFETY: as in `translate`.
    let sa = unsafe { &mut *sa };
    // SAFETY: as in `translate`.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let (addr, v6) = user_addr::<V6>(sa);
    let key = RevNatKey {
        cookie,
        addr,
        port: sa.user_port as u16,
        _pad: [0; 6],
    };
    // SAFETY: copied out at once.
    if let Some(orig) = unsafe { KPR_REVNAT.get(key).copied() } {
        set_user_addr::<V6>(sa, orig.addr, v6);
        sa.user_port = u32::from(orig.port);
    }
    ALLOW
}

/// sock_release: give the socket's backend its active count back.
#[inline(always)]
pub fn release<C: EbpfContext>(ctx: &C) -> i32 {
    // SAFETY: helper valid for cgroup sock programs (kernel >= 5.8).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: copied out at once.
    if let Some(prev) = unsafe { KPR_SOCKS.get(cookie).copied() } {
        lb::release_connection(prev.backend_id);
        let _ = KPR_SOCKS.remove(cookie);
    }
    ALLOW
}
