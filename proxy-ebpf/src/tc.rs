//! The tc (clsact ingress) program: NodePort, externalIP and LoadBalancer IP traffic that arrives
//! from outside the node (where no socket program ran), translated per flow with connection
//! tracking in `KPR_CT`.
//!
//! A new flow (TCP SYN, or any UDP datagram) to a `SCOPE_EXTERNAL` frontend picks a backend like
//! the socket path; its forward entry rewrites the destination to the backend (and, with
//! masquerade, the source to the node), its reply entry undoes both on the way back. Translated
//! packets are forwarded with a FIB lookup and a redirect, because a masqueraded packet carries a
//! node address as source and the stack would drop it as martian. A frontend without backends is
//! dropped (Local policy) or left untranslated, so the node's own stack answers a nodePort with a
//! reset / port unreachable. A LoadBalancer frontend with loadBalancerSourceRanges drops new flows
//! from sources outside them (`KPR_SRC_RANGES`); pods' connections to it arrive here too, as the
//! socket path leaves them untranslated.

use aya_ebpf::{
    bindings::{bpf_fib_lookup, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT},
    helpers::{bpf_fib_lookup as fib_lookup, bpf_ktime_get_ns, bpf_redirect, bpf_redirect_neigh},
    maps::lpm_trie::Key,
    programs::TcContext,
    EbpfContext,
};
use proxy_common::{
    AffinityKey, CtKey, CtValue, ServiceKey, SrcRangeKey, CLIENT_ADDR, CT_F_REPLY, CT_F_SNAT,
    FAMILY_V4, PROTO_TCP, PROTO_UDP, SCOPE_EXTERNAL, SRC_RANGE_FRONTEND_BITS, SVC_F_DROP_EMPTY,
    SVC_F_MASQUERADE, SVC_F_SOURCE_RANGES,
};

use crate::lb;
use crate::maps::{KPR_BACKENDS, KPR_CONFIG, KPR_CT, KPR_SERVICES, KPR_SRC_RANGES};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IP_CSUM_OFF: usize = ETH_HLEN + 10;
const IP_SRC_OFF: usize = ETH_HLEN + 12;
const IP_DST_OFF: usize = ETH_HLEN + 16;
const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_ACK: u8 = 0x10;
const AF_INET: u8 = 2;
const FIB_SUCCESS: i64 = 0;
const FIB_NO_NEIGH: i64 = 7;

/// The 5-tuple of an IPv4 TCP/UDP packet and where its L4 header is.
struct Packet {
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
    proto: u8,
    l4: usize,
    tcp_flags: u8,
}

impl Packet {
    fn key(&self) -> CtKey {
        CtKey {
            saddr: [self.saddr, 0, 0, 0],
            daddr: [self.daddr, 0, 0, 0],
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            family: FAMILY_V4,
            _pad: [0; 2],
        }
    }

    fn csum_off(&self) -> usize {
        if self.proto == PROTO_TCP {
            self.l4 + 16
        } else {
            self.l4 + 6
        }
    }
}

#[inline(always)]
pub fn ingress(ctx: &TcContext) -> i32 {
    match try_ingress(ctx) {
        Ok(action) => action,
        Err(_) => TC_ACT_OK,
    }
}

fn try_ingress(ctx: &TcContext) -> Result<i32, i64> {
    let Some(pkt) = parse(ctx)? else {
        return Ok(TC_ACT_OK);
    };
    // SAFETY: copied out at once.
    if let Some(ct) = unsafe { KPR_CT.get(pkt.key()).copied() } {
        if !stale_udp(&pkt, &ct) {
            touch(&pkt);
            apply(ctx, &pkt, &ct)?;
            return forward(ctx, &pkt, &ct);
        }
        // A UDP flow towards an endpoint that went away is forgotten and chosen again, so the
        // client is not black-holed (TCP flows are left alone, as the semantics ask).
        let _ = KPR_CT.remove(pkt.key());
    }
    let is_new = pkt.proto == PROTO_UDP
        || (pkt.tcp_flags & TCP_FLAG_SYN != 0 && pkt.tcp_flags & TCP_FLAG_ACK == 0);
    if !is_new {
        return Ok(TC_ACT_OK);
    }
    let key = ServiceKey {
        addr: [pkt.daddr, 0, 0, 0],
        port: pkt.dport,
        proto: pkt.proto,
        scope: SCOPE_EXTERNAL,
    };
    // SAFETY: copied out at once.
    let Some(svc) = (unsafe { KPR_SERVICES.get(key).copied() }) else {
        return Ok(TC_ACT_OK);
    };
    // Looked up whether the frontend is guarded or not: a lookup on one path only leaves the
    // verifier two stack layouts that it cannot merge, and it then walks everything after this
    // (the least-connection loop) twice, past its 1M instruction limit.
    let allowed = source_allowed(&key, pkt.saddr);
    if svc.flags & SVC_F_SOURCE_RANGES != 0 && !allowed {
        return Ok(TC_ACT_SHOT);
    }
    let client = AffinityKey {
        client: [pkt.saddr, 0, 0, 0],
        set_id: svc.set_id,
        kind: CLIENT_ADDR,
        _pad: [0; 3],
    };
    let Some(id) = lb::pick(&svc, &client) else {
        if svc.flags & SVC_F_DROP_EMPTY != 0 {
            return Ok(TC_ACT_SHOT);
        }
        return Ok(TC_ACT_OK);
    };
    // SAFETY: copied out at once.
    let Some(backend) = (unsafe { KPR_BACKENDS.get(id).copied() }) else {
        return Ok(TC_ACT_OK);
    };
    lb::count_connection(id, false);
    let masq = if svc.flags & SVC_F_MASQUERADE != 0 {
        masquerade_addr()
    } else {
        0
    };
    let fwd = open_flow(&pkt, backend.addr[0], backend.port, masq, id);
    apply(ctx, &pkt, &fwd)?;
    forward(ctx, &pkt, &fwd)
}

/// Whether loadBalancerSourceRanges admit `saddr` to `frontend`.
#[inline(always)]
fn source_allowed(frontend: &ServiceKey, saddr: u32) -> bool {
    let key = Key::new(
        SRC_RANGE_FRONTEND_BITS + 32,
        SrcRangeKey {
            frontend: *frontend,
            src: [saddr, 0, 0, 0],
        },
    );
    KPR_SRC_RANGES.get(&key).is_some()
}

/// Records both directions of a new flow and returns the forward entry.
#[inline(always)]
fn open_flow(pkt: &Packet, baddr: u32, bport: u16, masq: u32, id: u32) -> CtValue {
    let now = now_ns();
    let snat = if masq != 0 { CT_F_SNAT } else { 0 };
    let fwd = CtValue {
        nat_addr: [baddr, 0, 0, 0],
        snat_addr: [masq, 0, 0, 0],
        nat_port: bport,
        snat_port: pkt.sport,
        backend_id: id,
        last_seen_ns: now,
        flags: snat,
        _pad: 0,
    };
    let reply_key = CtKey {
        saddr: [baddr, 0, 0, 0],
        daddr: [if masq != 0 { masq } else { pkt.saddr }, 0, 0, 0],
        sport: bport,
        dport: pkt.sport,
        proto: pkt.proto,
        family: FAMILY_V4,
        _pad: [0; 2],
    };
    let reply = CtValue {
        nat_addr: [pkt.daddr, 0, 0, 0],
        snat_addr: [pkt.saddr, 0, 0, 0],
        nat_port: pkt.dport,
        snat_port: pkt.sport,
        backend_id: id,
        last_seen_ns: now,
        flags: CT_F_REPLY | snat,
        _pad: 0,
    };
    let _ = KPR_CT.insert(pkt.key(), fwd, 0);
    let _ = KPR_CT.insert(reply_key, reply, 0);
    fwd
}

/// A forward UDP entry whose backend no longer exists.
#[inline(always)]
fn stale_udp(pkt: &Packet, ct: &CtValue) -> bool {
    pkt.proto == PROTO_UDP
        && ct.flags & CT_F_REPLY == 0
        && KPR_BACKENDS.get_ptr(ct.backend_id).is_none()
}

#[inline(always)]
fn touch(pkt: &Packet) {
    if let Some(v) = KPR_CT.get_ptr_mut(pkt.key()) {
        // SAFETY: a map value pointer valid for the program's run.
        unsafe { (*v).last_seen_ns = now_ns() };
    }
}

/// Rewrites the packet as `ct` says (forward: dst to backend, src to node; reply: src to the
/// frontend, dst back to the client).
#[inline(always)]
fn apply(ctx: &TcContext, pkt: &Packet, ct: &CtValue) -> Result<(), i64> {
    let snat = ct.flags & CT_F_SNAT != 0;
    if ct.flags & CT_F_REPLY != 0 {
        set_addr(ctx, pkt, IP_SRC_OFF, pkt.saddr, ct.nat_addr[0])?;
        set_port(ctx, pkt, pkt.l4, pkt.sport, ct.nat_port)?;
        if snat {
            set_addr(ctx, pkt, IP_DST_OFF, pkt.daddr, ct.snat_addr[0])?;
        }
    } else {
        set_addr(ctx, pkt, IP_DST_OFF, pkt.daddr, ct.nat_addr[0])?;
        set_port(ctx, pkt, pkt.l4 + 2, pkt.dport, ct.nat_port)?;
        if snat {
            set_addr(ctx, pkt, IP_SRC_OFF, pkt.saddr, ct.snat_addr[0])?;
        }
    }
    Ok(())
}

#[inline(always)]
fn l4_flags(pkt: &Packet) -> u64 {
    if pkt.proto == PROTO_UDP {
        BPF_F_MARK_MANGLED_0 as u64
    } else {
        0
    }
}

#[inline(always)]
fn set_addr(ctx: &TcContext, pkt: &Packet, off: usize, old: u32, new: u32) -> Result<(), i64> {
    if old == new {
        return Ok(());
    }
    let flags = BPF_F_PSEUDO_HDR as u64 | l4_flags(pkt) | 4;
    ctx.l4_csum_replace(pkt.csum_off(), old as u64, new as u64, flags)?;
    ctx.l3_csum_replace(IP_CSUM_OFF, old as u64, new as u64, 4)?;
    ctx.store(off, &new, 0)?;
    Ok(())
}

#[inline(always)]
fn set_port(ctx: &TcContext, pkt: &Packet, off: usize, old: u16, new: u16) -> Result<(), i64> {
    if old == new {
        return Ok(());
    }
    ctx.l4_csum_replace(pkt.csum_off(), old as u64, new as u64, l4_flags(pkt) | 2)?;
    ctx.store(off, &new, 0)?;
    Ok(())
}

/// Sends the translated packet out of the interface the FIB picks (bypassing the input route
/// check, which would drop a masqueraded packet whose source is a node address).
#[inline(always)]
fn forward(ctx: &TcContext, pkt: &Packet, ct: &CtValue) -> Result<i32, i64> {
    let (src, dst, sport, dport) = if ct.flags & CT_F_REPLY != 0 {
        let dst = if ct.flags & CT_F_SNAT != 0 {
            ct.snat_addr[0]
        } else {
            pkt.daddr
        };
        (ct.nat_addr[0], dst, ct.nat_port, pkt.dport)
    } else {
        let src = if ct.flags & CT_F_SNAT != 0 {
            ct.snat_addr[0]
        } else {
            pkt.saddr
        };
        (src, ct.nat_addr[0], pkt.sport, ct.nat_port)
    };
    // SAFETY: an all-zero bpf_fib_lookup is valid (plain integers and unions of integers).
    let mut p: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = pkt.proto;
    p.sport = sport;
    p.dport = dport;
    p.__bindgen_anon_1.tot_len = 0;
    p.__bindgen_anon_3.ipv4_src = src;
    p.__bindgen_anon_4.ipv4_dst = dst;
    // SAFETY: reading the ingress ifindex from the context.
    p.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    // SAFETY: params point to a live, correctly sized struct.
    let rc = unsafe {
        fib_lookup(
            ctx.as_ptr(),
            &mut p,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    };
    if rc == FIB_SUCCESS {
        ctx.store(0, &p.dmac, 0)?;
        ctx.store(6, &p.smac, 0)?;
        // SAFETY: helper with plain arguments.
        return Ok(unsafe { bpf_redirect(p.ifindex, 0) } as i32);
    }
    if rc == FIB_NO_NEIGH {
        // SAFETY: no neighbour parameters; the kernel resolves the next hop itself.
        return Ok(unsafe { bpf_redirect_neigh(p.ifindex, core::ptr::null_mut(), 0, 0) } as i32);
    }
    Ok(TC_ACT_OK)
}

#[inline(always)]
fn parse(ctx: &TcContext) -> Result<Option<Packet>, i64> {
    let eth_proto: u16 = ctx.load(12)?;
    if u16::from_be(eth_proto) != ETH_P_IP {
        return Ok(None);
    }
    let vihl: u8 = ctx.load(ETH_HLEN)?;
    if vihl >> 4 != 4 {
        return Ok(None);
    }
    let frag: u16 = ctx.load(ETH_HLEN + 6)?;
    // A non-first fragment has no L4 header; more-fragments packets are left to the stack too.
    if u16::from_be(frag) & 0x3fff != 0 {
        return Ok(None);
    }
    let proto: u8 = ctx.load(ETH_HLEN + 9)?;
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Ok(None);
    }
    let l4 = ETH_HLEN + ((vihl & 0x0f) as usize) * 4;
    let tcp_flags = if proto == PROTO_TCP {
        ctx.load::<u8>(l4 + 13)?
    } else {
        0
    };
    Ok(Some(Packet {
        saddr: ctx.load(IP_SRC_OFF)?,
        daddr: ctx.load(IP_DST_OFF)?,
        sport: ctx.load(l4)?,
        dport: ctx.load(l4 + 2)?,
        proto,
        l4,
        tcp_flags,
    }))
}

#[inline(always)]
fn masquerade_addr() -> u32 {
    match KPR_CONFIG.get(0) {
        Some(c) => c.masq_addr[0],
        None => 0,
    }
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}
