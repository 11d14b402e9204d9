//! Direct server return (`--nodeport-mode dsr|hybrid`, IPv4): a NodePort / externalIP / LB IP
//! flow whose frontend has `SVC_F_DSR` is DNATed to its backend without masquerade, and the
//! frontend (the address and port the client sent to) travels to the backend's node in an IPv4
//! option ([`DSR_OPT_TYPE`], 8 bytes after the fixed header) on the packets that need it: a TCP
//! flow's SYN, every UDP datagram. The backend's node records it and rewrites the backend's
//! replies on their way out to the frontend's address and port, so they go to the client
//! directly, never back through the node the client sent to.
//!
//! Two programs, apart from the tc program so that none of this enters its verification (it is a
//! tail call away, `KPR_TC_DSR`):
//! - `kpr_tc_dsr` (a tail call of `kpr_tc_ingress`): on the node the client sent to, balances a
//!   new flow to a DSR frontend (`nodeport::balance`, as the tc program does for the others),
//!   adds the option to a DSR flow's packet (`bpf_skb_adjust_room` at the network header: IHL, total
//!   length and header checksum fixed) and sends it on as the tc program would
//!   (`nodeport::deliver`); on the backend's node, records a packet's option in `KPR_DSR` and
//!   leaves the packet to the stack, option and all (the kernel ignores an unknown option).
//! - `kpr_tc_egress` (tc egress of the node's interfaces): a packet whose (source, destination)
//!   is a recorded flow's reply gets the frontend as its source (checksums fixed).

use aya_ebpf::{
    bindings::{bpf_adj_room_mode::BPF_ADJ_ROOM_NET, TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use proxy_common::{
    CtKey, DsrFrontend, ServiceKey, CT_F_DSR, DSR_OPT_LEN, DSR_OPT_TYPE, DSR_STAT_OPT_ADDED,
    DSR_STAT_OPT_FAILED, DSR_STAT_RECORDED, DSR_STAT_REPLY_REWRITTEN, FAMILY_V4, SCOPE_EXTERNAL,
};

use crate::maps::{KPR_CT, KPR_DSR, KPR_DSR_STATS, KPR_SERVICES};
use crate::nodeport::{
    balance, deliver, parse, set_port, Fam, Packet, ETH_HLEN, ETH_P_IP, IP_CSUM_OFF, IP_HLEN, V4,
};
use crate::pkt::Pkt;

/// `kpr_tc_dsr`: the packet the tc program handed over (see the module doc).
#[inline(always)]
pub fn handoff(ctx: &TcContext) -> i32 {
    try_handoff(ctx).unwrap_or(TC_ACT_SHOT)
}

fn try_handoff(ctx: &TcContext) -> Result<i32, i64> {
    if !is_ipv4(ctx)? {
        return Ok(TC_ACT_OK);
    }
    let Some(mut pkt) = parse::<TcContext, V4>(ctx)? else {
        return Ok(TC_ACT_OK);
    };
    if pkt.l4 > ETH_HLEN + IP_HLEN && ctx.load::<u8>(ETH_HLEN + IP_HLEN)? == DSR_OPT_TYPE {
        return record(ctx, &pkt);
    }
    // SAFETY: copied out at once.
    let ct = match unsafe { KPR_CT.get(pkt.key()).copied() } {
        // A later packet of a DSR flow that must carry the frontend.
        Some(ct) if ct.flags & CT_F_DSR != 0 => ct,
        Some(ct) => return deliver(ctx, &pkt, &ct),
        // A new flow to a DSR frontend: balanced here, as the tc program would.
        None => {
            let key = ServiceKey {
                addr: V4::words(pkt.daddr),
                port: pkt.dport,
                proto: pkt.proto,
                scope: SCOPE_EXTERNAL,
            };
            // SAFETY: copied out at once.
            let Some(svc) = (unsafe { KPR_SERVICES.get(key).copied() }) else {
                return Ok(TC_ACT_OK);
            };
            match balance::<TcContext, V4>(&pkt, &key, &svc, CT_F_DSR) {
                Ok(fwd) => fwd,
                Err(verdict) => return Ok(verdict),
            }
        }
    };
    if add_option(ctx, &mut pkt).is_err() {
        count(DSR_STAT_OPT_FAILED);
        return Ok(TC_ACT_SHOT);
    }
    count(DSR_STAT_OPT_ADDED);
    deliver(ctx, &pkt, &ct)
}

/// Inserts the option carrying the packet's destination (the frontend) right after the fixed
/// IPv4 header, and moves `pkt.l4` past it. A packet with options of its own is refused.
#[inline(always)]
fn add_option(ctx: &TcContext, pkt: &mut Packet<V4>) -> Result<(), i64> {
    if pkt.l4 != ETH_HLEN + IP_HLEN {
        return Err(-1);
    }
    // Version/IHL with the TOS byte, and the total length: the 16-bit words that change.
    let old_vihl: u16 = ctx.load(ETH_HLEN)?;
    let old_len: u16 = ctx.load(ETH_HLEN + 2)?;
    ctx.adjust_room(i32::from(DSR_OPT_LEN), BPF_ADJ_ROOM_NET, 0)?;
    // Bytes as they sit in the packet: IHL 7 (20 + 8 bytes), the TOS byte kept.
    let vihl_bytes = old_vihl.to_ne_bytes();
    let new_vihl = u16::from_ne_bytes([0x40 | (5 + DSR_OPT_LEN / 4), vihl_bytes[1]]);
    let new_len = (u16::from_be(old_len) + u16::from(DSR_OPT_LEN)).to_be();
    let port = pkt.dport.to_ne_bytes();
    let opt0 = u32::from_ne_bytes([DSR_OPT_TYPE, DSR_OPT_LEN, port[0], port[1]]);
    let opt1 = pkt.daddr;
    Pkt::store(ctx, ETH_HLEN, &new_vihl)?;
    ctx.l3_csum_replace(IP_CSUM_OFF, u64::from(old_vihl), u64::from(new_vihl), 2)?;
    Pkt::store(ctx, ETH_HLEN + 2, &new_len)?;
    ctx.l3_csum_replace(IP_CSUM_OFF, u64::from(old_len), u64::from(new_len), 2)?;
    // The room the helper made is zeroed: the option's words replace zeros in the checksum.
    Pkt::store(ctx, ETH_HLEN + IP_HLEN, &opt0)?;
    ctx.l3_csum_replace(IP_CSUM_OFF, 0, u64::from(opt0), 4)?;
    Pkt::store(ctx, ETH_HLEN + IP_HLEN + 4, &opt1)?;
    ctx.l3_csum_replace(IP_CSUM_OFF, 0, u64::from(opt1), 4)?;
    pkt.l4 += usize::from(DSR_OPT_LEN);
    Ok(())
}

/// On the backend's node: remembers the frontend of the packet's flow for its replies, and
/// leaves the packet to the stack.
#[inline(always)]
fn record(ctx: &TcContext, pkt: &Packet<V4>) -> Result<i32, i64> {
    let len: u8 = ctx.load(ETH_HLEN + IP_HLEN + 1)?;
    if len != DSR_OPT_LEN || pkt.l4 < ETH_HLEN + IP_HLEN + usize::from(DSR_OPT_LEN) {
        return Ok(TC_ACT_OK);
    }
    let frontend = DsrFrontend {
        addr: [ctx.load(ETH_HLEN + IP_HLEN + 4)?, 0, 0, 0],
        port: ctx.load(ETH_HLEN + IP_HLEN + 2)?,
        _pad: [0; 2],
    };
    let _ = KPR_DSR.insert(reply_key(pkt), frontend, 0);
    count(DSR_STAT_RECORDED);
    Ok(TC_ACT_OK)
}

/// The key of a forward packet's replies: backend -> client.
#[inline(always)]
fn reply_key(pkt: &Packet<V4>) -> CtKey {
    CtKey {
        saddr: V4::words(pkt.daddr),
        daddr: V4::words(pkt.saddr),
        sport: pkt.dport,
        dport: pkt.sport,
        proto: pkt.proto,
        family: FAMILY_V4,
        _pad: [0; 2],
    }
}

/// `kpr_tc_egress`: a recorded DSR flow's reply leaves with the frontend as its source.
#[inline(always)]
pub fn egress(ctx: &TcContext) -> i32 {
    let _ = try_egress(ctx);
    TC_ACT_OK
}

fn try_egress(ctx: &TcContext) -> Result<(), i64> {
    if !is_ipv4(ctx)? {
        return Ok(());
    }
    let Some(pkt) = parse::<TcContext, V4>(ctx)? else {
        return Ok(());
    };
    // SAFETY: copied out at once.
    let Some(frontend) = (unsafe { KPR_DSR.get(pkt.key()).copied() }) else {
        return Ok(());
    };
    V4::set_addr(ctx, &pkt, V4::SRC_OFF, pkt.saddr, frontend.addr[0])?;
    set_port(ctx, &pkt, pkt.l4, pkt.sport, frontend.port)?;
    count(DSR_STAT_REPLY_REWRITTEN);
    Ok(())
}

#[inline(always)]
fn is_ipv4(ctx: &TcContext) -> Result<bool, i64> {
    let eth_proto: u16 = Pkt::load(ctx, 12)?;
    Ok(u16::from_be(eth_proto) == ETH_P_IP)
}

#[inline(always)]
fn count(stat: u32) {
    if let Some(n) = KPR_DSR_STATS.get_ptr_mut(stat) {
        // SAFETY: a per-CPU array value, this CPU's own.
        unsafe { *n += 1 };
    }
}
