//! kpr's eBPF programs. Only execution lives here: which endpoints a kind of traffic may use is
//! decided in userspace (`proxy::selection`) and written into the maps (`maps`).
//!
//! Programs: `kpr_connect4`, `kpr_sendmsg4`, `kpr_recvmsg4`, `kpr_getpeername4` and their IPv6
//! twins `kpr_connect6`, `kpr_sendmsg6`, `kpr_recvmsg6`, `kpr_getpeername6` (cgroup sock_addr),
//! `kpr_sock_release` (cgroup sock); `kpr_tc_ingress` (tc clsact ingress, both families);
//! `kpr_tc_dsr` (the tc program's tail call for direct server return) and `kpr_tc_egress` (tc
//! egress: DSR replies answered from the frontend), both only in `--nodeport-mode dsr|hybrid`;
//! `kpr_xdp` (XDP on the node's external interfaces: the same path as tc for the flows it can send
//! straight back out);
//! `kpr_term_tcp`, `kpr_term_udp` (socket iterators that destroy the sockets of removed backends).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![feature(asm_experimental_arch)]
#![expect(
    internal_features,
    reason = "atomic_xadd: the bpf target has no CAS, so no AtomicU32::fetch_add"
)]

mod atomic;
mod dsr;
mod lb;
mod maps;
mod nodeport;
mod pkt;
mod sock;
mod sockterm;

use aya_ebpf::{
    macros::{cgroup_sock, cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, SockContext, TcContext, XdpContext},
};

#[cgroup_sock_addr(connect4)]
pub fn kpr_connect4(ctx: SockAddrContext) -> i32 {
    sock::translate::<false, _>(&ctx, ctx.sock_addr, sock::Mode::Connect)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn kpr_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::translate::<false, _>(&ctx, ctx.sock_addr, sock::Mode::Sendmsg)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn kpr_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::reverse::<false, _>(&ctx, ctx.sock_addr)
}

#[cgroup_sock_addr(getpeername4)]
pub fn kpr_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::reverse::<false, _>(&ctx, ctx.sock_addr)
}

#[cgroup_sock_addr(connect6)]
pub fn kpr_connect6(ctx: SockAddrContext) -> i32 {
    sock::translate::<true, _>(&ctx, ctx.sock_addr, sock::Mode::Connect)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn kpr_sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::translate::<true, _>(&ctx, ctx.sock_addr, sock::Mode::Sendmsg)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn kpr_recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::reverse::<true, _>(&ctx, ctx.sock_addr)
}

#[cgroup_sock_addr(getpeername6)]
pub fn kpr_getpeername6(ctx: SockAddrContext) -> i32 {
    sock::reverse::<true, _>(&ctx, ctx.sock_addr)
}

#[cgroup_sock(sock_release)]
pub fn kpr_sock_release(ctx: SockContext) -> i32 {
    sock::release(&ctx)
}

#[classifier]
pub fn kpr_tc_ingress(ctx: TcContext) -> i32 {
    nodeport::ingress(&ctx)
}

#[classifier]
pub fn kpr_tc_dsr(ctx: TcContext) -> i32 {
    dsr::handoff(&ctx)
}

#[classifier]
pub fn kpr_tc_egress(ctx: TcContext) -> i32 {
    dsr::egress(&ctx)
}

#[xdp]
pub fn kpr_xdp(ctx: XdpContext) -> u32 {
    nodeport::ingress(&ctx) as u32
}

// aya-ebpf 0.2 has no macro for iterator programs: the section name is what the loader reads
// ("iter/..." is a BPF_TRACE_ITER tracing program; the agent names the target at load time).
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub extern "C" fn kpr_term_tcp(ctx: *mut sockterm::IterSockCtx) -> i32 {
    sockterm::visit(ctx, sockterm::Proto::Tcp)
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/udp")]
pub extern "C" fn kpr_term_udp(ctx: *mut sockterm::IterSockCtx) -> i32 {
    sockterm::visit(ctx, sockterm::Proto::Udp)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
