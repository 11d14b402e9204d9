//! Destroying the sockets connected to removed backends: the bodies of the `iter/tcp` and
//! `iter/udp` programs. The agent puts the removed backends into `KPR_SOCK_TERM` and reads each
//! iterator once per network namespace; for every socket of that namespace the program looks up
//! the backend its `connect()` was translated to (`KPR_SOCKS`, by socket cookie, written by
//! `connect4/6`) and, when that backend is being removed and the socket still talks to its port,
//! calls the `bpf_sock_destroy` kfunc (Linux 6.5+): a TCP connection is aborted (the peer gets a
//! reset, the application ECONNABORTED), a connected UDP socket is disconnected with
//! ECONNABORTED pending, so the application's next send or receive fails and a reconnect is
//! balanced again.
//!
//! Only sockets that the cgroup programs translated are in `KPR_SOCKS`; everything else in the
//! namespace is left alone whatever it is connected to.

use aya_ebpf::helpers::bpf_get_socket_cookie;
use proxy_common::{
    FAMILY_V4, KFUNC_CALL_PLACEHOLDER, TERM_TCP_DESTROYED, TERM_TCP_FAILED, TERM_UDP_DESTROYED,
    TERM_UDP_FAILED,
};

use crate::atomic;
use crate::maps::{KPR_SOCKS, KPR_SOCK_TERM, KPR_SOCK_TERM_STATS};

/// The context of a `tcp` or `udp` socket iterator (`struct bpf_iter__tcp` / `bpf_iter__udp`):
/// every field is 8 bytes wide in the context whatever its type, and only the socket is read.
#[repr(C)]
pub struct IterSockCtx {
    _meta: *mut core::ffi::c_void,
    /// `struct sock_common *` (tcp) or `struct udp_sock *` (udp): null at the end of a pass.
    sk: *mut core::ffi::c_void,
}

#[derive(Clone, Copy)]
pub enum Proto {
    Tcp,
    Udp,
}

/// `struct sock_common` offsets that have not moved since the struct exists (the kernel's own
/// socket lookups read the address and port pairs as words): `skc_daddr`, `skc_dport`,
/// `skc_family`.
const SKC_DADDR: usize = 0;
const SKC_DPORT: usize = 12;
const SKC_FAMILY: usize = 16;
const AF_INET: u16 = 2;

#[inline(always)]
pub fn visit(ctx: *mut IterSockCtx, proto: Proto) -> i32 {
    // SAFETY: the kernel passes the iterator context; the socket field is read at its offset.
    let sk = unsafe { (*ctx).sk };
    if sk.is_null() {
        return 0;
    }
    // SAFETY: `sk` is a trusted socket pointer for the program's run; in tracing programs this
    // helper takes any `sock_common`-based pointer.
    let cookie = unsafe { bpf_get_socket_cookie(sk) };
    // SAFETY: copied out at once.
    let Some(sb) = (unsafe { KPR_SOCKS.get(cookie).copied() }) else {
        return 0;
    };
    // SAFETY: copied out at once.
    let Some(backend) = (unsafe { KPR_SOCK_TERM.get(sb.backend_id).copied() }) else {
        return 0;
    };
    // A socket reconnected elsewhere without kpr (to an address no Service has) keeps its old
    // `KPR_SOCKS` entry: leave it unless it still talks to the backend's port (and address).
    let base = sk as *const u8;
    // SAFETY: reads of `sock_common` fields through the trusted pointer; the verifier checks
    // them against the kernel's BTF.
    let (dport, family, daddr) = unsafe {
        (
            core::ptr::read_volatile(base.add(SKC_DPORT) as *const u16),
            core::ptr::read_volatile(base.add(SKC_FAMILY) as *const u16),
            core::ptr::read_volatile(base.add(SKC_DADDR) as *const u32),
        )
    };
    if dport != backend.port {
        return 0;
    }
    if backend.family == FAMILY_V4 && family == AF_INET && daddr != backend.addr[0] {
        return 0;
    }
    let ok = sock_destroy(sk) == 0;
    let idx = match (proto, ok) {
        (Proto::Tcp, true) => TERM_TCP_DESTROYED,
        (Proto::Udp, true) => TERM_UDP_DESTROYED,
        (Proto::Tcp, false) => TERM_TCP_FAILED,
        (Proto::Udp, false) => TERM_UDP_FAILED,
    };
    if let Some(count) = KPR_SOCK_TERM_STATS.get_ptr_mut(idx) {
        // SAFETY: an 8-byte aligned u64 array value, only ever updated atomically.
        unsafe { atomic::add_u64(count, 1) };
    }
    0
}

/// `int bpf_sock_destroy(struct sock_common *sk)`, called through the placeholder instruction
/// that the agent resolves to the kfunc's BTF id before loading (see
/// `proxy_common::KFUNC_CALL_PLACEHOLDER`). The calling convention is a helper's: argument in r1,
/// result in r0, r1-r5 clobbered.
#[inline(always)]
fn sock_destroy(sk: *mut core::ffi::c_void) -> i64 {
    let ret: i64;
    // SAFETY: the instruction is a kfunc call once the agent has patched it (the program is not
    // loaded otherwise); it reads r1 and writes r0 and clobbers r1-r5 as every call does.
    unsafe {
        core::arch::asm!(
            ".8byte {insn}",
            insn = const KFUNC_CALL_PLACEHOLDER,
            inout("r1") sk => _,
            lateout("r0") ret,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        );
    }
    ret
}
