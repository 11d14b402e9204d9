//! What the path for traffic from outside the node (`nodeport`) needs of a packet, for its two
//! hooks: tc (`TcContext`: the skb helpers read, write and fix checksums) and XDP (`XdpContext`:
//! direct packet access, the checksums updated here as the skb helpers would).
//!
//! Owns only the access to the packet and the hook's verdicts; which flow a packet belongs to and
//! how it is translated is `nodeport`'s.

use aya_ebpf::{
    bindings::{bpf_fib_lookup, xdp_action, BPF_F_MARK_MANGLED_0, TC_ACT_OK, TC_ACT_SHOT},
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_redirect_neigh},
    programs::{TcContext, XdpContext},
    EbpfContext,
};
use proxy_common::{CtKey, XDP_STAT_PASS_NEW, XDP_STAT_PASS_ROUTE, XDP_STAT_TX};

use crate::maps::{KPR_CT, KPR_TC_AGAIN, KPR_TC_DSR, KPR_XDP_STATS};

pub const FIB_SUCCESS: i64 = 0;
const FIB_NO_NEIGH: i64 = 7;

/// A hook's access to the packet and its verdicts.
pub trait Pkt: EbpfContext {
    /// Leave the packet to the stack (or, for XDP, to the tc program after it).
    const PASS: i32;
    const DROP: i32;
    /// Whether a translated packet is routed before it is rewritten (see `nodeport::deliver`).
    const ROUTES_FIRST: bool;
    /// Whether new flows are balanced here. XDP passes a flow's first packet to tc, which
    /// balances it and records the flow; XDP translates every later packet. That keeps the
    /// least-connection loop and the route-first delivery off one path through the verifier,
    /// which together took it past its 1M instructions on 6.1.
    const BALANCES: bool;
    fn load<T>(&self, off: usize) -> Result<T, i64>;
    fn store<T>(&self, off: usize, v: &T) -> Result<(), i64>;
    /// As `bpf_l3_csum_replace` (`size` 4).
    fn l3_csum_replace(&self, off: usize, from: u64, to: u64, size: u64) -> Result<(), i64>;
    /// As `bpf_l4_csum_replace`: the low 4 bits of `flags` the size (2, 4, or 0 when `to` is a
    /// checksum difference), `BPF_F_MARK_MANGLED_0` for UDP's "no checksum".
    fn l4_csum_replace(&self, off: usize, from: u64, to: u64, flags: u64) -> Result<(), i64>;
    fn ingress_ifindex(&self) -> u32;
    /// Whether a packet whose translation the FIB routed as `rc`/`p` is translated and sent here;
    /// when not, it is passed on untouched (XDP sends only back out of the interface it came in
    /// by; anything else, a local pod or a neighbour to resolve, is tc's).
    fn sends(&self, rc: i64, p: &bpf_fib_lookup) -> bool;
    /// Sends the translated packet where the FIB said.
    fn send(&self, rc: i64, p: &bpf_fib_lookup) -> Result<i32, i64>;
    /// A SYN on the 4-tuple of an earlier connection (`nodeport::reused_tcp_tuple`).
    fn again(&self, key: &CtKey) -> i32;
    /// Hands the packet to the DSR program (`KPR_TC_DSR`, proxy-ebpf's `dsr.rs`): a DSR flow's
    /// packet that must carry the frontend, or one that arrives carrying it. Returns only when the
    /// packet stays here: `None` when tc's tail call failed (this node runs no DSR), the verdict
    /// when XDP leaves the packet to tc (it cannot grow a packet by an IP option).
    fn dsr(&self) -> Option<i32>;
    /// Counts a verdict of the XDP program (tc counts nothing).
    fn count(&self, _stat: u32) {}
}

/// The FIB lookup of `p` for this packet (`p.ifindex` set to the ingress interface).
#[inline(always)]
pub fn route<C: Pkt>(ctx: &C, p: &mut bpf_fib_lookup) -> i64 {
    p.ifindex = ctx.ingress_ifindex();
    // SAFETY: params point to a live, correctly sized struct.
    unsafe {
        fib_lookup(
            ctx.as_ptr(),
            p,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    }
}

impl Pkt for TcContext {
    const PASS: i32 = TC_ACT_OK;
    const DROP: i32 = TC_ACT_SHOT;
    const ROUTES_FIRST: bool = false;
    const BALANCES: bool = true;

    #[inline(always)]
    fn load<T>(&self, off: usize) -> Result<T, i64> {
        TcContext::load(self, off)
    }

    #[inline(always)]
    fn store<T>(&self, off: usize, v: &T) -> Result<(), i64> {
        TcContext::store(self, off, v, 0)
    }

    #[inline(always)]
    fn l3_csum_replace(&self, off: usize, from: u64, to: u64, size: u64) -> Result<(), i64> {
        TcContext::l3_csum_replace(self, off, from, to, size)
    }

    #[inline(always)]
    fn l4_csum_replace(&self, off: usize, from: u64, to: u64, flags: u64) -> Result<(), i64> {
        TcContext::l4_csum_replace(self, off, from, to, flags)
    }

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        // SAFETY: reading a field of the program's own context.
        unsafe { (*self.skb.skb).ingress_ifindex }
    }

    #[inline(always)]
    fn sends(&self, _rc: i64, _p: &bpf_fib_lookup) -> bool {
        true
    }

    /// A redirect out of the interface the FIB picks (bypassing the input route check, which
    /// would drop a masqueraded packet whose source is a node address); a neighbour not resolved
    /// yet is resolved by the kernel.
    #[inline(always)]
    fn send(&self, rc: i64, p: &bpf_fib_lookup) -> Result<i32, i64> {
        if rc == FIB_SUCCESS {
            TcContext::store(self, 0, &p.dmac, 0)?;
            TcContext::store(self, 6, &p.smac, 0)?;
            // SAFETY: helper with plain arguments.
            return Ok(unsafe { bpf_redirect(p.ifindex, 0) } as i32);
        }
        if rc == FIB_NO_NEIGH {
            // SAFETY: no neighbour parameters; the kernel resolves the next hop itself.
            return Ok(
                unsafe { bpf_redirect_neigh(p.ifindex, core::ptr::null_mut(), 0, 0) } as i32,
            );
        }
        Ok(TC_ACT_OK)
    }

    /// The entry forgotten, and the program run again on this SYN (a tail call into itself,
    /// `KPR_TC_AGAIN`), which now finds no entry and balances it as a new connection. Falling
    /// through to the new-flow path instead made the verifier walk that path once more, past
    /// 6.1's limit of 1,000,000 processed instructions; a tail call costs the verifier nothing
    /// (docs/RELIABILITY.md). Should the tail call fail (the map not filled yet), the SYN is
    /// dropped and the client's retransmission is balanced.
    #[inline(always)]
    fn again(&self, key: &CtKey) -> i32 {
        let _ = KPR_CT.remove(key);
        // SAFETY: a tail call with the program's own context; it does not return on success.
        unsafe { KPR_TC_AGAIN.tail_call(self, 0) };
        TC_ACT_SHOT
    }

    /// A tail call: the DSR program's own verification, not this program's.
    #[inline(always)]
    fn dsr(&self) -> Option<i32> {
        // SAFETY: a tail call with the program's own context; it does not return on success.
        unsafe { KPR_TC_DSR.tail_call(self, 0) };
        None
    }
}

impl Pkt for XdpContext {
    const PASS: i32 = xdp_action::XDP_PASS as i32;
    const DROP: i32 = xdp_action::XDP_DROP as i32;
    const ROUTES_FIRST: bool = true;
    const BALANCES: bool = false;

    #[inline(always)]
    fn load<T>(&self, off: usize) -> Result<T, i64> {
        // SAFETY: `at` checked the bounds; packet data need not be aligned.
        Ok(unsafe { core::ptr::read_unaligned(at::<T>(self, off)?) })
    }

    #[inline(always)]
    fn store<T>(&self, off: usize, v: &T) -> Result<(), i64> {
        // SAFETY: as `load`.
        unsafe { core::ptr::write_unaligned(at::<T>(self, off)?, core::ptr::read(v)) };
        Ok(())
    }

    #[inline(always)]
    fn l3_csum_replace(&self, off: usize, from: u64, to: u64, _size: u64) -> Result<(), i64> {
        let old: u16 = Pkt::load(self, off)?;
        Pkt::store(self, off, &replace(old, from as u32, to as u32))
    }

    #[inline(always)]
    fn l4_csum_replace(&self, off: usize, from: u64, to: u64, flags: u64) -> Result<(), i64> {
        let old: u16 = Pkt::load(self, off)?;
        let mangled_0 = flags & BPF_F_MARK_MANGLED_0 as u64 != 0;
        if mangled_0 && old == 0 {
            // UDP over IPv4 without a checksum stays without.
            return Ok(());
        }
        let mut new = if flags & 0xf == 0 {
            !fold(add(!old as u32 & 0xffff, to as u32))
        } else {
            replace(old, from as u32, to as u32)
        };
        if mangled_0 && new == 0 {
            new = 0xffff;
        }
        Pkt::store(self, off, &new)
    }

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        // SAFETY: reading a field of the program's own context.
        unsafe { (*self.ctx).ingress_ifindex }
    }

    #[inline(always)]
    fn sends(&self, rc: i64, p: &bpf_fib_lookup) -> bool {
        let back_out = rc == FIB_SUCCESS && p.ifindex == Pkt::ingress_ifindex(self);
        if !back_out {
            self.count(XDP_STAT_PASS_ROUTE);
        }
        back_out
    }

    #[inline(always)]
    fn send(&self, _rc: i64, p: &bpf_fib_lookup) -> Result<i32, i64> {
        Pkt::store(self, 0, &p.dmac)?;
        Pkt::store(self, 6, &p.smac)?;
        self.count(XDP_STAT_TX);
        Ok(xdp_action::XDP_TX as i32)
    }

    #[inline(always)]
    fn again(&self, _key: &CtKey) -> i32 {
        self.count(XDP_STAT_PASS_NEW);
        Self::PASS
    }

    #[inline(always)]
    fn dsr(&self) -> Option<i32> {
        self.count(XDP_STAT_PASS_ROUTE);
        Some(Self::PASS)
    }

    #[inline(always)]
    fn count(&self, stat: u32) {
        if let Some(n) = KPR_XDP_STATS.get_ptr_mut(stat) {
            // SAFETY: a per-CPU array value, this CPU's own.
            unsafe { *n += 1 };
        }
    }
}

/// A pointer to `size_of::<T>()` bytes of packet at `off`, checked against the packet's end in
/// the form the verifier follows.
#[inline(always)]
fn at<T>(ctx: &XdpContext, off: usize) -> Result<*mut T, i64> {
    let start = ctx.data();
    if start + off + core::mem::size_of::<T>() > ctx.data_end() {
        return Err(-1);
    }
    Ok((start + off) as *mut T)
}

/// One's complement addition with the end-around carry.
#[inline(always)]
fn add(a: u32, b: u32) -> u32 {
    let s = a.wrapping_add(b);
    s.wrapping_add((s < b) as u32)
}

#[inline(always)]
fn fold(s: u32) -> u16 {
    let s = (s & 0xffff) + (s >> 16);
    ((s & 0xffff) + (s >> 16)) as u16
}

/// The checksum `old` with the 16- or 32-bit field `from` replaced by `to` (RFC 1624:
/// HC' = ~(~HC + ~m + m')), in the byte order the packet holds them.
#[inline(always)]
fn replace(old: u16, from: u32, to: u32) -> u16 {
    !fold(add(add(!old as u32 & 0xffff, !from), to))
}
