//! kpr's eBPF programs. Only execution lives here: which endpoints a kind of traffic may use is
//! decided in userspace (`proxy::selection`) and written into the maps this object declares.
#![no_std]
#![no_main]

use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

#[cgroup_sock_addr(connect4)]
pub fn kpr_connect4(_ctx: SockAddrContext) -> i32 {
    1
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
