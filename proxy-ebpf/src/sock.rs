//! The cgroup socket programs' logic: translate a service address to a backend at `connect()` /
//! `sendmsg()`, translate it back for `recvmsg()` / `getpeername()`, and account open sockets.

use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    EbpfContext,
};
use aya_log_ebpf::warn;
use proxy_common::{
    AffinityKey, Backend, RevNatKey, RevNatValue, ServiceKey, ServiceValue, SockBackend,
    CLIENT_NETNS, PROTO_SCTP, PROTO_TCP, PROTO_UDP, SCOPE_SOCKET, SVC_F_DROP_EMPTY,
    SVC_F_SOURCE_RANGES,
};

use crate::lb;
use crate::maps::{KPR_BACKENDS, KPR_CONFIG, KPR_REVNAT, KPR_SERVICES, KPR_SOCKS, KPR_UDP_FWD};

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

/// A service frontend seen by a socket, and the socket's identity.
struct Request {
    key: ServiceKey,
    cookie: u64,
}

/// connect4 / sendmsg4: rewrite a service destination to a backend.
#[inline(always)]
pub fn translate<C: EbpfContext>(ctx: &C, sa: *mut bpf_sock_addr, mode: Mode) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr for the program's run.
    let sa = unsafe { &mut *sa };
    let proto = sa.protocol as u8;
    if proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP {
        return ALLOW;
    }
    let key = ServiceKey {
        addr: [sa.user_ip4, 0, 0, 0],
        port: sa.user_port as u16,
        proto,
        scope: SCOPE_SOCKET,
    };
    // SAFETY: the value is copied out at once.
    let Some(svc) = (unsafe { KPR_SERVICES.get(key).copied() }) else {
        return not_a_frontend(&key);
    };
    // loadBalancerSourceRanges: the node itself is allowed; a pod's source address is not known
    // yet at connect(), so its connection goes out untranslated and the tc program on the node's
    // side of its interface checks the address.
    if svc.flags & SVC_F_SOURCE_RANGES != 0 && !from_node(ctx) {
        return ALLOW;
    }
    // SAFETY: helpers valid for cgroup sock_addr programs (kernel >= 5.7).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let req = Request { key, cookie };
    let Some(backend) = choose(ctx, &svc, &req, mode) else {
        return refuse(&svc);
    };
    remember_reverse(&req, &backend);
    sa.user_ip4 = backend.addr[0];
    sa.user_port = u32::from(backend.port);
    ALLOW
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
    let id = lb::pick(svc, &client)?;
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
fn not_a_frontend(key: &ServiceKey) -> i32 {
    let marker = ServiceKey {
        addr: key.addr,
        port: 0,
        proto: 0,
        scope: SCOPE_SOCKET,
    };
    if KPR_SERVICES.get_ptr(marker).is_some() {
        // SAFETY: helper valid for cgroup programs (kernel >= 5.18).
        unsafe { bpf_set_retval(-ECONNREFUSED) };
        return DENY;
    }
    if let Some(cfg) = KPR_CONFIG.get(0) {
        if cfg.svc_mask != 0 && key.addr[0] & cfg.svc_mask == cfg.svc_net {
            return DENY;
        }
    }
    ALLOW
}

/// recvmsg4 / getpeername4: show the service address instead of the backend's.
#[inline(always)]
pub fn reverse<C: EbpfContext>(ctx: &C, sa: *mut bpf_sock_addr) -> i32 {
    // SAFETY: as in `translate`.
    let sa = unsafe { &mut *sa };
    // SAFETY: as in `translate`.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = RevNatKey {
        cookie,
        addr: [sa.user_ip4, 0, 0, 0],
        port: sa.user_port as u16,
        _pad: [0; 6],
    };
    // SAFETY: copied out at once.
    if let Some(orig) = unsafe { KPR_REVNAT.get(key).copied() } {
        sa.user_ip4 = orig.addr[0];
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
