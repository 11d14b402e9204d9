//! NodePort, externalIP and LoadBalancer IP traffic that arrives from outside the node (where no
//! socket program ran), translated per flow with connection tracking in `KPR_CT`, by the tc
//! program (`kpr_tc_ingress`, every interface) and, where the agent attaches it, the XDP program
//! (`kpr_xdp`, the node's external interfaces), one body for both (`pkt::Pkt` is the difference).
//!
//! A new flow (TCP SYN, or any UDP datagram) to a `SCOPE_EXTERNAL` frontend picks a backend like
//! the socket path (Maglev by the hash of the packet's 5-tuple, as nftables' `jhash` computes
//! it); its forward entry rewrites the destination to the backend (and, with
//! masquerade, the source to the node), its reply entry undoes both on the way back. Translated
//! packets are forwarded with a FIB lookup and a redirect, because a masqueraded packet carries a
//! node address as source and the stack would drop it as martian. XDP leaves a flow's first
//! packet to tc, which balances it, and sends a later packet only back out of the interface it
//! came in by (a backend on another node, or the reply to an outside client): anything else it
//! passes on untouched, and tc, finding the flow's entry, translates it. A frontend without backends is
//! dropped (Local policy) or left untranslated, so the node's own stack answers a nodePort with a
//! reset / port unreachable. A LoadBalancer frontend with loadBalancerSourceRanges drops new flows
//! from sources outside them (`KPR_SRC_RANGES`); pods' connections to it arrive here too, as the
//! socket path leaves them untranslated.
//!
//! Direct server return (`SVC_F_DSR` frontends, `CT_F_DSR` flows, packets carrying the DSR
//! option) is the DSR program's (`dsr.rs`), reached by a tail call (`Pkt::dsr`): a new flow to
//! such a frontend, a DSR flow's SYN or UDP datagram, and a packet carrying the option.
//!
//! One body serves both families, instantiated per family (`V6`) at the top: IPv4, and IPv6 whose
//! transport header follows the fixed header (a packet with extension headers is left to the
//! stack). IPv6 has no header checksum; its addresses enter the transport checksum through
//! `bpf_csum_diff`.

use aya_ebpf::{
    bindings::{bpf_fib_lookup, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::{bpf_csum_diff, bpf_ktime_get_ns},
    maps::lpm_trie::Key,
};
use proxy_common::{
    hash::{flow_hash_v4, flow_hash_v6},
    AffinityKey, CtKey, CtValue, ServiceKey, ServiceValue, SrcRangeKey, CLIENT_ADDR, CT_F_DSR,
    CT_F_REPLY, CT_F_SNAT, DSR_OPT_TYPE, FAMILY_V4, FAMILY_V6, PROTO_TCP, PROTO_UDP,
    SCOPE_EXTERNAL, SCOPE_V6, SRC_RANGE_FRONTEND_BITS, SVC_F_DROP_EMPTY, SVC_F_DSR,
    SVC_F_MASQUERADE, SVC_F_SOURCE_RANGES, XDP_STAT_PASS_NEW,
};

use crate::lb;
use crate::maps::{KPR_BACKENDS, KPR_CONFIG, KPR_CONFIG6, KPR_CT, KPR_SERVICES, KPR_SRC_RANGES};
use crate::pkt::{route, Pkt};

pub(crate) const ETH_HLEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
/// An IPv4 header without options.
pub(crate) const IP_HLEN: usize = 20;
pub(crate) const IP_CSUM_OFF: usize = ETH_HLEN + 10;
const IP_SRC_OFF: usize = ETH_HLEN + 12;
const IP_DST_OFF: usize = ETH_HLEN + 16;
const IP6_NEXTHDR_OFF: usize = ETH_HLEN + 6;
const IP6_SRC_OFF: usize = ETH_HLEN + 8;
const IP6_DST_OFF: usize = ETH_HLEN + 24;
const IP6_HLEN: usize = 40;
const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_ACK: u8 = 0x10;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// What differs between the families, so that the IPv4 path works on a `u32` address as it
/// always did (its verification cost is the least-connection loop's, once) and IPv6 on four
/// words: each family is its own instantiation of the code below.
pub(crate) trait Fam {
    type Addr: Copy;
    const FAMILY: u8;
    /// The frontend scope of traffic from outside, with the family's bit.
    const SCOPE: u8;
    const SRC_OFF: usize;
    const DST_OFF: usize;
    /// Address bits (the source part of a `KPR_SRC_RANGES` key).
    const BITS: u32;
    /// The address as the maps hold it.
    fn words(a: Self::Addr) -> [u32; 4];
    fn from_words(w: [u32; 4]) -> Self::Addr;
    /// Equality and zero tests with one branch each: every branch on map-loaded data after the
    /// least-connection loop is walked once per state that leaves the loop.
    fn same(a: Self::Addr, b: Self::Addr) -> bool;
    fn is_zero(a: Self::Addr) -> bool;
    /// The protocol, L4 offset and addresses of a TCP/UDP packet of the family.
    fn parse<C: Pkt>(ctx: &C) -> Result<Option<Header<Self::Addr>>, i64>;
    /// Rewrites one address with the checksums it is part of.
    fn set_addr<C: Pkt>(
        ctx: &C,
        pkt: &Packet<Self>,
        off: usize,
        old: Self::Addr,
        new: Self::Addr,
    ) -> Result<(), i64>
    where
        Self: Sized;
    /// Fills the family, source and destination of a FIB lookup.
    fn fib(p: &mut bpf_fib_lookup, src: Self::Addr, dst: Self::Addr);
    /// The masquerade source (zero: none configured).
    fn masquerade_addr() -> Self::Addr;
}

pub(crate) struct V4;
struct V6;

/// What a family's header says: (protocol, L4 offset, source, destination).
type Header<A> = (u8, usize, A, A);

impl Fam for V4 {
    type Addr = u32;
    const FAMILY: u8 = FAMILY_V4;
    const SCOPE: u8 = SCOPE_EXTERNAL;
    const SRC_OFF: usize = IP_SRC_OFF;
    const DST_OFF: usize = IP_DST_OFF;
    const BITS: u32 = 32;

    #[inline(always)]
    fn words(a: u32) -> [u32; 4] {
        [a, 0, 0, 0]
    }

    #[inline(always)]
    fn from_words(w: [u32; 4]) -> u32 {
        w[0]
    }

    #[inline(always)]
    fn same(a: u32, b: u32) -> bool {
        a == b
    }

    #[inline(always)]
    fn is_zero(a: u32) -> bool {
        a == 0
    }

    #[inline(always)]
    fn parse<C: Pkt>(ctx: &C) -> Result<Option<Header<u32>>, i64> {
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
        Ok(Some((
            proto,
            l4,
            ctx.load(IP_SRC_OFF)?,
            ctx.load(IP_DST_OFF)?,
        )))
    }

    #[inline(always)]
    fn set_addr<C: Pkt>(
        ctx: &C,
        pkt: &Packet<V4>,
        off: usize,
        old: u32,
        new: u32,
    ) -> Result<(), i64> {
        if old == new {
            return Ok(());
        }
        let flags = BPF_F_PSEUDO_HDR as u64 | l4_flags(pkt.proto) | 4;
        ctx.l4_csum_replace(pkt.csum_off(), old as u64, new as u64, flags)?;
        ctx.l3_csum_replace(IP_CSUM_OFF, old as u64, new as u64, 4)?;
        ctx.store(off, &new)?;
        Ok(())
    }

    #[inline(always)]
    fn fib(p: &mut bpf_fib_lookup, src: u32, dst: u32) {
        p.family = AF_INET;
        p.__bindgen_anon_3.ipv4_src = src;
        p.__bindgen_anon_4.ipv4_dst = dst;
    }

    #[inline(always)]
    fn masquerade_addr() -> u32 {
        match KPR_CONFIG.get(0) {
            Some(c) => c.masq_addr[0],
            None => 0,
        }
    }
}

impl Fam for V6 {
    type Addr = [u32; 4];
    const FAMILY: u8 = FAMILY_V6;
    const SCOPE: u8 = SCOPE_EXTERNAL | SCOPE_V6;
    const SRC_OFF: usize = IP6_SRC_OFF;
    const DST_OFF: usize = IP6_DST_OFF;
    const BITS: u32 = 128;

    #[inline(always)]
    fn words(a: [u32; 4]) -> [u32; 4] {
        a
    }

    #[inline(always)]
    fn from_words(w: [u32; 4]) -> [u32; 4] {
        w
    }

    #[inline(always)]
    fn same(a: [u32; 4], b: [u32; 4]) -> bool {
        ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3])) == 0
    }

    #[inline(always)]
    fn is_zero(a: [u32; 4]) -> bool {
        (a[0] | a[1] | a[2] | a[3]) == 0
    }

    #[inline(always)]
    fn parse<C: Pkt>(ctx: &C) -> Result<Option<Header<[u32; 4]>>, i64> {
        let vtc: u8 = ctx.load(ETH_HLEN)?;
        if vtc >> 4 != 6 {
            return Ok(None);
        }
        // Only a transport header right after the fixed header: extension headers (fragments
        // among them) are left to the stack.
        let proto: u8 = ctx.load(IP6_NEXTHDR_OFF)?;
        if proto != PROTO_TCP && proto != PROTO_UDP {
            return Ok(None);
        }
        let saddr: [u32; 4] = ctx.load(IP6_SRC_OFF)?;
        let daddr: [u32; 4] = ctx.load(IP6_DST_OFF)?;
        Ok(Some((proto, ETH_HLEN + IP6_HLEN, saddr, daddr)))
    }

    #[inline(always)]
    fn set_addr<C: Pkt>(
        ctx: &C,
        pkt: &Packet<V6>,
        off: usize,
        old: [u32; 4],
        new: [u32; 4],
    ) -> Result<(), i64> {
        if Self::same(old, new) {
            return Ok(());
        }
        let mut from = old;
        let mut to = new;
        // SAFETY: both buffers are 16-byte stack arrays that live across the call.
        let diff = unsafe { bpf_csum_diff(from.as_mut_ptr(), 16, to.as_mut_ptr(), 16, 0) };
        if diff < 0 {
            return Err(diff);
        }
        // IPv6 has no header checksum; size 0: `diff` is a checksum difference already, folded
        // into the transport checksum's pseudo-header part.
        let flags = BPF_F_PSEUDO_HDR as u64 | l4_flags(pkt.proto);
        ctx.l4_csum_replace(pkt.csum_off(), 0, diff as u64, flags)?;
        ctx.store(off, &new)?;
        Ok(())
    }

    #[inline(always)]
    fn fib(p: &mut bpf_fib_lookup, src: [u32; 4], dst: [u32; 4]) {
        p.family = AF_INET6;
        p.__bindgen_anon_3.ipv6_src = src;
        p.__bindgen_anon_4.ipv6_dst = dst;
    }

    #[inline(always)]
    fn masquerade_addr() -> [u32; 4] {
        match KPR_CONFIG6.get(0) {
            Some(c) => c.masq_addr,
            None => [0; 4],
        }
    }
}

/// The 5-tuple of a TCP/UDP packet and where its L4 header is.
pub(crate) struct Packet<F: Fam> {
    pub(crate) saddr: F::Addr,
    pub(crate) daddr: F::Addr,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
    pub(crate) l4: usize,
    pub(crate) tcp_flags: u8,
}

impl<F: Fam> Packet<F> {
    #[inline(always)]
    pub(crate) fn key(&self) -> CtKey {
        CtKey {
            saddr: F::words(self.saddr),
            daddr: F::words(self.daddr),
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            family: F::FAMILY,
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

/// The program's body for one hook: the packet's verdict.
#[inline(always)]
pub fn ingress<C: Pkt>(ctx: &C) -> i32 {
    let Ok(eth_proto) = ctx.load::<u16>(12) else {
        return C::PASS;
    };
    let r = match u16::from_be(eth_proto) {
        ETH_P_IP => try_ingress::<C, V4>(ctx),
        ETH_P_IPV6 => try_ingress::<C, V6>(ctx),
        _ => return C::PASS,
    };
    r.unwrap_or(C::PASS)
}

fn try_ingress<C: Pkt, F: Fam>(ctx: &C) -> Result<i32, i64> {
    let Some(pkt) = parse::<C, F>(ctx)? else {
        return Ok(C::PASS);
    };
    // A packet carrying a DSR flow's frontend in its first IPv4 option: the flow's backend is on
    // this node, and the DSR program records the frontend for its replies (`dsr.rs`). Such a
    // packet is addressed to the backend, never to a frontend: without DSR here it goes on
    // untranslated. XDP leaves it to tc as any packet it has no flow of (and the verifier could
    // not follow the bounds of this read there).
    if C::BALANCES
        && F::FAMILY == FAMILY_V4
        && pkt.l4 > ETH_HLEN + IP_HLEN
        && ctx.load::<u8>(ETH_HLEN + IP_HLEN)? == DSR_OPT_TYPE
    {
        return Ok(ctx.dsr().unwrap_or(C::PASS));
    }
    // SAFETY: copied out at once.
    if let Some(ct) = unsafe { KPR_CT.get(pkt.key()).copied() } {
        if reused_tcp_tuple(&pkt, &ct) {
            // The entry of an earlier TCP connection whose 4-tuple this new connection's SYN
            // reuses: tc forgets it and balances the SYN as a new connection (`Pkt::again`).
            return Ok(ctx.again(&pkt.key()));
        }
        if !stale_udp(pkt.proto, &ct) {
            touch(&pkt);
            if ct.flags & CT_F_DSR != 0 && (pkt.proto == PROTO_UDP || is_syn(pkt.tcp_flags)) {
                // A DSR flow's packet that must carry the frontend: a UDP datagram, a
                // retransmitted SYN.
                return Ok(dsr_or_forget(ctx, &pkt));
            }
            return deliver(ctx, &pkt, &ct);
        }
        if !C::BALANCES {
            ctx.count(XDP_STAT_PASS_NEW);
            return Ok(C::PASS);
        }
        // A UDP flow towards an endpoint that went away is forgotten and chosen again, so the
        // client is not black-holed (TCP flows are left alone, as the semantics ask).
        let _ = KPR_CT.remove(pkt.key());
    }
    let is_new = pkt.proto == PROTO_UDP || is_syn(pkt.tcp_flags);
    if !is_new {
        return Ok(C::PASS);
    }
    if !C::BALANCES {
        ctx.count(XDP_STAT_PASS_NEW);
        return Ok(C::PASS);
    }
    let key = ServiceKey {
        addr: F::words(pkt.daddr),
        port: pkt.dport,
        proto: pkt.proto,
        scope: F::SCOPE,
    };
    // SAFETY: copied out at once.
    let Some(svc) = (unsafe { KPR_SERVICES.get(key).copied() }) else {
        return Ok(C::PASS);
    };
    if svc.flags & SVC_F_DSR != 0 {
        // Direct server return: the DSR program balances the flow and adds the option to the
        // packet it sends on, so none of that enters this program's verification.
        return Ok(ctx.dsr().unwrap_or(C::DROP));
    }
    match balance::<C, F>(&pkt, &key, &svc, 0) {
        Ok(fwd) => deliver(ctx, &pkt, &fwd),
        Err(verdict) => Ok(verdict),
    }
}

/// Picks a backend for a new flow to the frontend `key` (its entry `svc`) and records the flow
/// (`dsr`: [`CT_F_DSR`] or 0, for its forward entry): the forward entry, or the verdict for the
/// packet when no backend is picked.
#[inline(always)]
pub(crate) fn balance<C: Pkt, F: Fam>(
    pkt: &Packet<F>,
    key: &ServiceKey,
    svc: &ServiceValue,
    dsr: u32,
) -> Result<CtValue, i32> {
    // Looked up whether the frontend is guarded or not: a lookup on one path only leaves the
    // verifier two stack layouts that it cannot merge, and it then walks everything after this
    // (the least-connection loop) twice, past its 1M instruction limit.
    let allowed = source_allowed::<F>(key, pkt.saddr);
    if svc.flags & SVC_F_SOURCE_RANGES != 0 && !allowed {
        return Err(C::DROP);
    }
    let client = AffinityKey {
        client: F::words(pkt.saddr),
        set_id: svc.set_id,
        kind: CLIENT_ADDR,
        _pad: [0; 3],
    };
    // Straight-line and unconditional (only Maglev reads it): a branch here would give the
    // verifier two states to carry through the least-connection loop.
    let (s, d) = (F::words(pkt.saddr), F::words(pkt.daddr));
    let flow_hash = if F::FAMILY == FAMILY_V4 {
        flow_hash_v4(s[0], d[0], pkt.sport, pkt.dport)
    } else {
        flow_hash_v6(&s, &d, pkt.sport, pkt.dport)
    };
    let Some(id) = lb::pick(svc, &client, flow_hash) else {
        if svc.flags & SVC_F_DROP_EMPTY != 0 {
            return Err(C::DROP);
        }
        return Err(C::PASS);
    };
    // SAFETY: copied out at once.
    let Some(backend) = (unsafe { KPR_BACKENDS.get(id).copied() }) else {
        return Err(C::PASS);
    };
    lb::count_connection(id, false);
    let masq = if svc.flags & SVC_F_MASQUERADE != 0 {
        F::masquerade_addr()
    } else {
        F::from_words([0; 4])
    };
    Ok(open_flow(
        pkt,
        F::from_words(backend.addr),
        backend.port,
        masq,
        id,
        dsr,
    ))
}

/// A TCP SYN without ACK: a connection's first packet.
#[inline(always)]
fn is_syn(tcp_flags: u8) -> bool {
    tcp_flags & TCP_FLAG_SYN != 0 && tcp_flags & TCP_FLAG_ACK == 0
}

/// Hands a DSR flow's packet to the DSR program, which adds the option and sends it on. Where
/// that program is not there (the node left DSR since the flow began), the flow is forgotten and
/// the packet dropped: the client's next packet is balanced anew.
#[inline(always)]
fn dsr_or_forget<C: Pkt, F: Fam>(ctx: &C, pkt: &Packet<F>) -> i32 {
    match ctx.dsr() {
        Some(verdict) => verdict,
        None => {
            let _ = KPR_CT.remove(pkt.key());
            C::DROP
        }
    }
}

/// Whether loadBalancerSourceRanges admit `saddr` to `frontend`.
#[inline(always)]
fn source_allowed<F: Fam>(frontend: &ServiceKey, saddr: F::Addr) -> bool {
    let key = Key::new(
        SRC_RANGE_FRONTEND_BITS + F::BITS,
        SrcRangeKey {
            frontend: *frontend,
            src: F::words(saddr),
        },
    );
    KPR_SRC_RANGES.get(&key).is_some()
}

/// Records both directions of a new flow and returns the forward entry (`masq` zero: not
/// masqueraded; `dsr`: [`CT_F_DSR`] or 0, for the forward entry).
#[inline(always)]
fn open_flow<F: Fam>(
    pkt: &Packet<F>,
    baddr: F::Addr,
    bport: u16,
    masq: F::Addr,
    id: u32,
    dsr: u32,
) -> CtValue {
    let now = now_ns();
    let masqueraded = !F::is_zero(masq);
    let snat = if masqueraded { CT_F_SNAT } else { 0 };
    let fwd = CtValue {
        nat_addr: F::words(baddr),
        snat_addr: F::words(masq),
        nat_port: bport,
        snat_port: pkt.sport,
        backend_id: id,
        last_seen_ns: now,
        flags: snat | dsr,
        _pad: 0,
    };
    let reply_key = CtKey {
        saddr: F::words(baddr),
        daddr: F::words(if masqueraded { masq } else { pkt.saddr }),
        sport: bport,
        dport: pkt.sport,
        proto: pkt.proto,
        family: F::FAMILY,
        _pad: [0; 2],
    };
    let reply = CtValue {
        nat_addr: F::words(pkt.daddr),
        snat_addr: F::words(pkt.saddr),
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
fn stale_udp(proto: u8, ct: &CtValue) -> bool {
    proto == PROTO_UDP
        && ct.flags & CT_F_REPLY == 0
        && KPR_BACKENDS.get_ptr(ct.backend_id).is_none()
}

/// How long after a flow's last packet a SYN on its 4-tuple may still be a retransmission of its
/// first SYN (Linux retransmits one after 1 s, 3 s and 7 s).
const SYN_RETRANSMIT_NS: u64 = 10_000_000_000;

/// A TCP SYN (no ACK) on the 4-tuple of an earlier connection: the client's ephemeral ports came
/// round again (Linux walks them per destination, so a client at a steady connection rate reuses
/// a port after minutes), and the entry, never removed for a closed TCP connection, would send the
/// new connection to the old one's backend, even a removed or terminating one (measured by
/// `cargo xtask cluster chaos endpoint-removal`, docs/RELIABILITY.md). A SYN within the
/// retransmission window of a flow whose backend still exists keeps the flow.
#[inline(always)]
fn reused_tcp_tuple<F: Fam>(pkt: &Packet<F>, ct: &CtValue) -> bool {
    pkt.proto == PROTO_TCP
        && ct.flags & CT_F_REPLY == 0
        && pkt.tcp_flags & TCP_FLAG_SYN != 0
        && pkt.tcp_flags & TCP_FLAG_ACK == 0
        && (KPR_BACKENDS.get_ptr(ct.backend_id).is_none()
            || now_ns().wrapping_sub(ct.last_seen_ns) > SYN_RETRANSMIT_NS)
}

#[inline(always)]
fn touch<F: Fam>(pkt: &Packet<F>) {
    if let Some(v) = KPR_CT.get_ptr_mut(pkt.key()) {
        // SAFETY: a map value pointer valid for the program's run.
        unsafe { (*v).last_seen_ns = now_ns() };
    }
}

/// Rewrites the packet as `ct` says (forward: dst to backend, src to node; reply: src to the
/// frontend, dst back to the client).
#[inline(always)]
fn apply<C: Pkt, F: Fam>(ctx: &C, pkt: &Packet<F>, ct: &CtValue) -> Result<(), i64> {
    let snat = ct.flags & CT_F_SNAT != 0;
    if ct.flags & CT_F_REPLY != 0 {
        F::set_addr(ctx, pkt, F::SRC_OFF, pkt.saddr, F::from_words(ct.nat_addr))?;
        set_port(ctx, pkt, pkt.l4, pkt.sport, ct.nat_port)?;
        if snat {
            F::set_addr(ctx, pkt, F::DST_OFF, pkt.daddr, F::from_words(ct.snat_addr))?;
        }
    } else {
        F::set_addr(ctx, pkt, F::DST_OFF, pkt.daddr, F::from_words(ct.nat_addr))?;
        set_port(ctx, pkt, pkt.l4 + 2, pkt.dport, ct.nat_port)?;
        if snat {
            F::set_addr(ctx, pkt, F::SRC_OFF, pkt.saddr, F::from_words(ct.snat_addr))?;
        }
    }
    Ok(())
}

#[inline(always)]
fn l4_flags(proto: u8) -> u64 {
    if proto == PROTO_UDP {
        BPF_F_MARK_MANGLED_0 as u64
    } else {
        0
    }
}

#[inline(always)]
pub(crate) fn set_port<C: Pkt, F: Fam>(
    ctx: &C,
    pkt: &Packet<F>,
    off: usize,
    old: u16,
    new: u16,
) -> Result<(), i64> {
    if old == new {
        return Ok(());
    }
    ctx.l4_csum_replace(
        pkt.csum_off(),
        old as u64,
        new as u64,
        l4_flags(pkt.proto) | 2,
    )?;
    ctx.store(off, &new)?;
    Ok(())
}

/// Translates the packet and sends it where the FIB routes it. A hook that sends only some
/// routes (`Pkt::ROUTES_FIRST`: XDP) routes first and passes the packet on untouched when it
/// does not send it; tc translates first, as it always did: routing first keeps the route's
/// state alive across the rewrite, which on 6.1 took the verifier past its 1M instructions.
#[inline(always)]
pub(crate) fn deliver<C: Pkt, F: Fam>(ctx: &C, pkt: &Packet<F>, ct: &CtValue) -> Result<i32, i64> {
    if C::ROUTES_FIRST {
        let (rc, p) = route_of(ctx, pkt, ct);
        if !ctx.sends(rc, &p) {
            return Ok(C::PASS);
        }
        apply(ctx, pkt, ct)?;
        return ctx.send(rc, &p);
    }
    apply(ctx, pkt, ct)?;
    let (rc, p) = route_of(ctx, pkt, ct);
    ctx.send(rc, &p)
}

/// The FIB lookup of the flow's translated packet.
#[inline(always)]
fn route_of<C: Pkt, F: Fam>(ctx: &C, pkt: &Packet<F>, ct: &CtValue) -> (i64, bpf_fib_lookup) {
    let (src, dst, sport, dport) = if ct.flags & CT_F_REPLY != 0 {
        let dst = if ct.flags & CT_F_SNAT != 0 {
            F::from_words(ct.snat_addr)
        } else {
            pkt.daddr
        };
        (F::from_words(ct.nat_addr), dst, ct.nat_port, pkt.dport)
    } else {
        let src = if ct.flags & CT_F_SNAT != 0 {
            F::from_words(ct.snat_addr)
        } else {
            pkt.saddr
        };
        (src, F::from_words(ct.nat_addr), pkt.sport, ct.nat_port)
    };
    // SAFETY: an all-zero bpf_fib_lookup is valid (plain integers and unions of integers).
    let mut p: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    p.l4_protocol = pkt.proto;
    p.sport = sport;
    p.dport = dport;
    p.__bindgen_anon_1.tot_len = 0;
    F::fib(&mut p, src, dst);
    let rc = route(ctx, &mut p);
    (rc, p)
}

#[inline(always)]
pub(crate) fn parse<C: Pkt, F: Fam>(ctx: &C) -> Result<Option<Packet<F>>, i64> {
    let Some((proto, l4, saddr, daddr)) = F::parse(ctx)? else {
        return Ok(None);
    };
    let tcp_flags = if proto == PROTO_TCP {
        ctx.load::<u8>(l4 + 13)?
    } else {
        0
    };
    Ok(Some(Packet {
        saddr,
        daddr,
        sport: ctx.load(l4)?,
        dport: ctx.load(l4 + 2)?,
        proto,
        l4,
        tcp_flags,
    }))
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}
