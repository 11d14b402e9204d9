//! The kernel's conntrack table over ctnetlink (NETLINK_NETFILTER, subsystem CTNETLINK): event
//! subscription, table dumps and deletion of one entry by its tuple and id.
//!
//! Owns the wire: requests, replies, multicast events, and decoding an entry into [`CtEntry`].
//! Knows nothing of Services or least-connection: the parent module decides which entries are
//! stale, `events` what an event means for connection counts. A socket belongs to the network
//! namespace of the thread that opened it.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{
    DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NLM_F_ACK, NLM_F_CREATE,
    NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use crate::model::IpFamily;

/// `CTA_ID`: the entry's id, stable for its life (not decoded by the message crate).
const CTA_ID: u16 = 12;
/// `IPS_DST_NAT`: the entry's destination was translated.
const IPS_DST_NAT: u32 = 1 << 5;
/// Multicast groups of conntrack events (`NFNLGRP_CONNTRACK_{NEW,UPDATE,DESTROY}`).
const GROUPS: [u32; 3] = [1, 2, 3];
/// Large enough for any datagram the kernel sends on these sockets (dump batches are one page
/// or a few).
const RECV_BUFFER: usize = 1 << 16;

/// The conntrack table of an address family.
fn proto_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

/// One direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
}

/// What an event reports about its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    New,
    Update,
    Destroy,
}

/// One conntrack entry, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CtEntry {
    pub id: Option<u32>,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP, ...).
    pub protocol: u8,
    pub orig: Option<Flow>,
    pub reply: Option<Flow>,
    pub mark: u32,
    pub status: u32,
    /// `TCP_CONNTRACK_*` when the entry carries TCP protocol info.
    pub tcp_state: Option<u8>,
    /// The original tuple as the kernel sent it: what a delete request names.
    pub(super) orig_tuple: Vec<Tuple>,
}

impl CtEntry {
    /// The status bit of a translated destination, for entries built by hand.
    pub const DST_NAT: u32 = IPS_DST_NAT;

    /// Whether the entry's destination was translated (DNAT).
    pub fn dst_nat(&self) -> bool {
        self.status & IPS_DST_NAT != 0
    }

    fn decode(attributes: &[ConntrackAttribute]) -> CtEntry {
        let mut e = CtEntry::default();
        for a in attributes {
            match a {
                ConntrackAttribute::CtaTupleOrig(t) => {
                    let (flow, protocol) = decode_tuple(t);
                    e.orig = flow;
                    e.protocol = protocol;
                    e.orig_tuple = t.clone();
                }
                ConntrackAttribute::CtaTupleReply(t) => e.reply = decode_tuple(t).0,
                ConntrackAttribute::CtaMark(m) => e.mark = *m,
                ConntrackAttribute::CtaStatus(s) => e.status = s.bits(),
                ConntrackAttribute::CtaProtoInfo(infos) => {
                    for info in infos {
                        if let ProtoInfo::TCP(tcp) = info {
                            for t in tcp {
                                if let ProtoInfoTCP::State(s) = t {
                                    e.tcp_state = Some(*s);
                                }
                            }
                        }
                    }
                }
                ConntrackAttribute::Other(nla) if nla.kind() == CTA_ID && nla.value_len() == 4 => {
                    let mut be = [0u8; 4];
                    nla.emit_value(&mut be);
                    e.id = Some(u32::from_be_bytes(be));
                }
                _ => {}
            }
        }
        e
    }
}

fn decode_tuple(tuple: &[Tuple]) -> (Option<Flow>, u8) {
    let (mut src, mut dst, mut sport, mut dport, mut protocol) = (None, None, 0, 0, 0);
    for part in tuple {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(parts) => {
                for p in parts {
                    match p {
                        ProtoTuple::Protocol(p) => protocol = u8::from(*p),
                        ProtoTuple::SourcePort(p) => sport = *p,
                        ProtoTuple::DestinationPort(p) => dport = *p,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let flow = src.zip(dst).map(|(src, dst)| Flow {
        src,
        dst,
        sport,
        dport,
    });
    (flow, protocol)
}

/// A ctnetlink socket: either subscribed to the event groups or used for requests.
pub struct CtSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl CtSocket {
    /// A request socket (dumps, deletes) in the calling thread's network namespace.
    pub fn open() -> io::Result<CtSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(CtSocket {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUFFER],
        })
    }

    /// A socket subscribed to every conntrack event (new, update, destroy) with a receive
    /// buffer of `rcvbuf` bytes (forced past `net.core.rmem_max`, which needs CAP_NET_ADMIN; a
    /// refusal falls back to the limit). Reads wake at least every `tick` so that the reader
    /// can notice it should stop.
    pub fn subscribe(rcvbuf: usize, tick: Duration) -> io::Result<CtSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        for g in GROUPS {
            socket.add_membership(g)?;
        }
        let fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
        let size = rcvbuf as libc::c_int;
        if setsockopt(fd, libc::SO_RCVBUFFORCE, &size).is_err() {
            socket.set_rx_buf_sz(size)?;
        }
        let tv = libc::timeval {
            tv_sec: tick.as_secs() as libc::time_t,
            tv_usec: tick.subsec_micros() as libc::suseconds_t,
        };
        setsockopt(fd, libc::SO_RCVTIMEO, &tv)?;
        Ok(CtSocket {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUFFER],
        })
    }

    /// Waits for the next datagram of events and hands each event to `f`. Returns
    /// `ErrorKind::WouldBlock`/`TimedOut` when the tick passed with nothing, and the raw
    /// `ENOBUFS` error when the kernel dropped events because the buffer was full.
    pub fn recv_events(&mut self, mut f: impl FnMut(EventKind, CtEntry)) -> io::Result<()> {
        let n = self.recv()?;
        for_each_message(&self.buf[..n], |header, payload| {
            if let NetlinkPayload::InnerMessage(msg) = payload {
                let kind_attrs = match &msg.inner {
                    NetfilterMessageInner::Conntrack(ConntrackMessage::New(a)) => {
                        let new = header.flags & (NLM_F_CREATE | NLM_F_EXCL) != 0;
                        Some((
                            if new {
                                EventKind::New
                            } else {
                                EventKind::Update
                            },
                            a,
                        ))
                    }
                    NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(a)) => {
                        Some((EventKind::Destroy, a))
                    }
                    _ => None,
                };
                if let Some((kind, attrs)) = kind_attrs {
                    f(kind, CtEntry::decode(attrs));
                }
            }
            Ok(true)
        })
    }

    /// Every entry of `family` in the table.
    pub fn dump(&mut self, family: IpFamily) -> io::Result<Vec<CtEntry>> {
        let seq = self.send(
            family,
            NLM_F_REQUEST | NLM_F_DUMP,
            ConntrackMessage::Get(Vec::new()),
        )?;
        let mut out = Vec::new();
        loop {
            let n = self.recv()?;
            let mut done = false;
            for_each_message(&self.buf[..n], |header, payload| {
                if header.sequence_number != seq {
                    return Ok(true);
                }
                match payload {
                    NetlinkPayload::InnerMessage(msg) => {
                        if let NetfilterMessageInner::Conntrack(ConntrackMessage::New(a)) =
                            &msg.inner
                        {
                            out.push(CtEntry::decode(a));
                        }
                    }
                    NetlinkPayload::Done(_) => done = true,
                    NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                    _ => {}
                }
                Ok(!done)
            })?;
            if done {
                return Ok(out);
            }
        }
    }

    /// Deletes one entry, named by its original tuple and (when known) its id, so that an entry
    /// that replaced it under the same tuple survives. `Ok(false)`: it was already gone.
    pub fn delete(&mut self, entry: &CtEntry) -> io::Result<bool> {
        let Some(family) = entry.orig.map(|o| IpFamily::of(&o.src)) else {
            return Ok(false);
        };
        // A delete without a tuple flushes the whole table: never send one.
        if entry.orig_tuple.is_empty() {
            return Ok(false);
        }
        let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(entry.orig_tuple.clone())];
        if let Some(id) = entry.id {
            attrs.push(ConntrackAttribute::Other(DefaultNla::new(
                CTA_ID,
                id.to_be_bytes().to_vec(),
            )));
        }
        let seq = self.send(
            family,
            NLM_F_REQUEST | NLM_F_ACK,
            ConntrackMessage::Delete(attrs),
        )?;
        loop {
            let n = self.recv()?;
            let mut answer = None;
            for_each_message(&self.buf[..n], |header, payload| {
                if header.sequence_number == seq {
                    if let NetlinkPayload::Error(e) = payload {
                        answer = Some(match e.code {
                            None => Ok(true),
                            Some(c) if -c.get() == libc::ENOENT => Ok(false),
                            Some(_) => Err(e.to_io()),
                        });
                        return Ok(false);
                    }
                }
                Ok(true)
            })?;
            if let Some(a) = answer {
                return a;
            }
        }
    }

    fn send(&mut self, family: IpFamily, flags: u16, msg: ConntrackMessage) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::from(NetfilterMessage::new(
                NetfilterHeader::new(proto_family(family), 0, 0),
                msg,
            )),
        );
        packet.finalize();
        let mut bytes = vec![0; packet.buffer_len()];
        packet.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        Ok(self.seq)
    }

    fn recv(&mut self) -> io::Result<usize> {
        let mut slice = &mut self.buf[..];
        self.socket.recv(&mut slice, 0)
    }
}

/// Calls `f` for each netlink message of a datagram until it returns `Ok(false)`. A message the
/// crate cannot decode is skipped with a warning: one odd entry never stops a stream.
fn for_each_message(
    mut bytes: &[u8],
    mut f: impl FnMut(&NetlinkHeader, &NetlinkPayload<NetfilterMessage>) -> io::Result<bool>,
) -> io::Result<()> {
    while bytes.len() >= 16 {
        let len = u32::from_ne_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        if len < 16 || len > bytes.len() {
            break;
        }
        match NetlinkMessage::<NetfilterMessage>::deserialize(&bytes[..len]) {
            Ok(msg) => {
                if !f(&msg.header, &msg.payload)? {
                    return Ok(());
                }
            }
            Err(e) => tracing::warn!("conntrack netlink: skipping a message: {e}"),
        }
        // Messages start on 4-byte boundaries.
        bytes = &bytes[((len + 3) & !3).min(bytes.len())..];
    }
    Ok(())
}

fn setsockopt<T>(fd: std::os::fd::RawFd, option: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live `T` of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
