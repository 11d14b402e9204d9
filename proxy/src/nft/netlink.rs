//! nf_tables over netlink for the one job nft's text is slow at: filling the sets and maps of a
//! table that was just created with a large number of elements.
//!
//! Owns the NETLINK_NETFILTER socket of these writes, the batch framing (`NFNL_MSG_BATCH_BEGIN`
//! / `END`), `NFT_MSG_NEWSETELEM` messages, reading their acknowledgements, and the
//! table-existence query. Knows nothing of kpr's sets: callers pass each key and value already in
//! the set's own byte layout (the nftables backend encodes them). At 100,000 Services x 4
//! endpoints (1.1 million elements) the nftables backend's first full sync took 2.0 s this way
//! and 6.6 s through `nft -f`, most of which is nft parsing and evaluating the element text. A
//! socket belongs to the network namespace of the thread that opened it, as `nft` does.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd as _;

use netlink_packet_core::{
    ErrorBuffer, NetlinkBuffer, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CREATE, NLM_F_REQUEST,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use crate::error::DataplaneError;

// From <linux/netfilter/nfnetlink.h> and <linux/netfilter/nf_tables.h>.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
// From <linux/netlink.h>.
const NLA_F_NESTED: u16 = 1 << 15;
const NLMSG_ERROR: u16 = 2;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSG_HDRLEN: usize = 16;

/// `nfgenmsg.nfgen_family` of an `ip` table.
pub const NFPROTO_IPV4: u8 = 2;
/// `nfgenmsg.nfgen_family` of an `ip6` table.
pub const NFPROTO_IPV6: u8 = 10;

/// Bytes of messages sent as one batch: the kernel takes a batch in one datagram, which must
/// fit the socket's send buffer, and a full load at 100,000 Services is tens of megabytes.
const BATCH_BYTES: usize = 4 << 20;
/// Bytes of elements in one message: the element list is one attribute, whose length is 16 bits.
const LIST_BYTES: usize = 60 * 1024;
/// Large enough for any datagram the kernel answers with (an error carries its text, not the
/// request: the socket asks for capped acknowledgements).
const RECV_BUFFER: usize = 1 << 16;

/// The data of a map element: a value in the map's data layout, or a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data<'a> {
    Value(&'a [u8]),
    Jump(&'a str),
    Goto(&'a str),
}

fn socket() -> Result<Socket, DataplaneError> {
    let context = "opening a netfilter netlink socket";
    let socket = Socket::new(NETLINK_NETFILTER).map_err(|e| DataplaneError::io(context, e))?;
    socket
        .set_cap_ack(true)
        .and_then(|()| socket.set_ext_ack(true))
        .and_then(|()| socket.set_rx_buf_sz(1 << 20))
        .map_err(|e| DataplaneError::io(context, e))?;
    let sndbuf = (BATCH_BYTES + 2 * LIST_BYTES) as libc::c_int;
    // SAFETY: setsockopt on an open socket with a c_int option value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            (&sndbuf as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(DataplaneError::io(
            "raising the netlink send buffer (SO_SNDBUFFORCE needs CAP_NET_ADMIN)",
            io::Error::last_os_error(),
        ));
    }
    Ok(socket)
}

/// Appends a netlink message header and the `nfgenmsg` after it; returns where it starts.
fn begin_message(
    buf: &mut Vec<u8>,
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[family, 0]);
    buf.extend_from_slice(&res_id.to_be_bytes());
    start
}

/// Writes the length of the message starting at `start`.
fn end_message(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

fn attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    pad(buf);
}

/// A NUL-terminated string attribute.
fn attr_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    buf.extend_from_slice(&((5 + s.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    pad(buf);
}

fn pad(buf: &mut Vec<u8>) {
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn nest_start(buf: &mut Vec<u8>, ty: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u16.to_ne_bytes());
    buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    start
}

fn nest_end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// One reply of the kernel: the sequence number it answers and its error (0: acknowledged).
#[derive(Debug)]
struct Reply {
    seq: u32,
    error: i32,
    message: Option<String>,
    ty: u16,
}

/// Reads every reply already queued. The kernel handles a request while it is being sent, so
/// when `send` has returned, every answer to it is queued.
fn drain(socket: &Socket) -> Result<Vec<Reply>, DataplaneError> {
    let mut replies = Vec::new();
    let mut buf = vec![0u8; RECV_BUFFER];
    loop {
        let n = match socket.recv(&mut &mut buf[..], libc::MSG_DONTWAIT) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(replies),
            Err(e) => return Err(DataplaneError::io("reading nf_tables' answers", e)),
        };
        let mut at = 0;
        while let Ok(msg) = NetlinkBuffer::new_checked(&buf[at..n]) {
            let mut reply = Reply {
                seq: msg.sequence_number(),
                error: 0,
                message: None,
                ty: msg.message_type(),
            };
            if let (NLMSG_ERROR, Ok(err)) = (reply.ty, ErrorBuffer::new_checked(msg.payload())) {
                reply.error = err.code().map_or(0, |c| c.get());
                // The request's header follows (capped: not its payload), then the extended
                // acknowledgement's attributes. Its length field is the request's, so it is read
                // unchecked.
                let request = err.payload();
                if request.len() >= NLMSG_HDRLEN {
                    reply.seq = NetlinkBuffer::new(request).sequence_number();
                    if msg.flags() & NLM_F_ACK_TLVS != 0 {
                        reply.message = ack_message(&request[NLMSG_HDRLEN..]);
                    }
                }
            }
            replies.push(reply);
            at += (msg.length() as usize).next_multiple_of(4);
            if at >= n {
                break;
            }
        }
    }
}

/// The text of an extended acknowledgement (`NLMSGERR_ATTR_MSG`), if it has one.
fn ack_message(mut tlvs: &[u8]) -> Option<String> {
    while tlvs.len() >= 4 {
        let len = u16::from_ne_bytes([tlvs[0], tlvs[1]]) as usize;
        let ty = u16::from_ne_bytes([tlvs[2], tlvs[3]]);
        if len < 4 || len > tlvs.len() {
            return None;
        }
        if ty == NLMSGERR_ATTR_MSG {
            let text = &tlvs[4..len];
            let text = text.split(|b| *b == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        tlvs = &tlvs[len.next_multiple_of(4).min(tlvs.len())..];
    }
    None
}

fn errno_text(error: i32) -> String {
    io::Error::from_raw_os_error(-error).to_string()
}

/// Whether the table `family` `name` exists (`NFT_MSG_GETTABLE`).
pub fn table_exists(family: u8, name: &str) -> Result<bool, DataplaneError> {
    let socket = socket()?;
    let mut buf = Vec::new();
    let start = begin_message(
        &mut buf,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE,
        NLM_F_REQUEST | NLM_F_ACK,
        1,
        family,
        0,
    );
    attr_str(&mut buf, NFTA_TABLE_NAME, name);
    end_message(&mut buf, start);
    send(&socket, &buf)?;
    let replies = drain(&socket)?;
    let error = replies
        .iter()
        .find(|r| r.ty == NLMSG_ERROR && r.error != 0)
        .map(|r| r.error);
    match error {
        None if replies.is_empty() => Err(DataplaneError::Other(format!(
            "nf_tables did not answer the query for table {name}"
        ))),
        None => Ok(true),
        Some(e) if e == -libc::ENOENT => Ok(false),
        Some(e) => Err(DataplaneError::Command {
            command: format!("netlink: get table {name}"),
            detail: errno_text(e),
        }),
    }
}

fn send(socket: &Socket, buf: &[u8]) -> Result<(), DataplaneError> {
    let sent = socket
        .send(buf, 0)
        .map_err(|e| DataplaneError::io("sending to nf_tables over netlink", e))?;
    if sent != buf.len() {
        return Err(DataplaneError::Other(format!(
            "netlink: sent {sent} of {} bytes to nf_tables",
            buf.len()
        )));
    }
    Ok(())
}

/// Adds elements to existing sets and maps of one table. Elements are gathered per set (callers
/// pass them in any order) into messages of up to [`LIST_BYTES`] of elements, and the messages
/// go in batches of about [`BATCH_BYTES`]: each batch is one transaction, so a failure leaves the
/// earlier batches applied. Meant for a table that was just created and serves nothing yet;
/// changes to a table in use go through one `nft` transaction instead.
pub struct ElementWriter {
    socket: Socket,
    table: String,
    /// The batch being built: complete messages after the batch's opening.
    buf: Vec<u8>,
    seq: u32,
    /// Per family (`nfgenmsg` family) and set, the encoded elements not in a message yet.
    lists: Vec<(u8, HashMap<String, Vec<u8>>)>,
    /// The family and set of each element message of the batch being built, by sequence number.
    messages: Vec<(u32, u8, String)>,
    elements: usize,
}

impl ElementWriter {
    /// A writer to the table `name` of every family, in the calling thread's network namespace.
    pub fn new(name: &str) -> Result<ElementWriter, DataplaneError> {
        let mut w = ElementWriter {
            socket: socket()?,
            table: name.to_string(),
            buf: Vec::new(),
            seq: 0,
            lists: Vec::new(),
            messages: Vec::new(),
            elements: 0,
        };
        w.batch_marker(NFNL_MSG_BATCH_BEGIN);
        Ok(w)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Appends the message that opens or closes a batch (`ty`: `NFNL_MSG_BATCH_BEGIN`/`END`).
    fn batch_marker(&mut self, ty: u16) {
        let seq = self.next_seq();
        let start = begin_message(
            &mut self.buf,
            ty,
            NLM_F_REQUEST,
            seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        end_message(&mut self.buf, start);
    }

    /// Adds one element to `set` of the table in `family` (`NFPROTO_IPV4`/`NFPROTO_IPV6`): `key`
    /// and a value in the set's layout (concatenated fields each padded to 4 bytes).
    pub fn add(
        &mut self,
        family: u8,
        set: &str,
        key: &[u8],
        data: Option<Data<'_>>,
    ) -> Result<(), DataplaneError> {
        let f = match self.lists.iter().position(|(f, _)| *f == family) {
            Some(f) => f,
            None => {
                self.lists.push((family, HashMap::new()));
                self.lists.len() - 1
            }
        };
        let sets = &mut self.lists[f].1;
        if !sets.contains_key(set) {
            sets.insert(set.to_string(), Vec::new());
        }
        let list = sets.get_mut(set).expect("inserted above");
        encode_element(list, key, data);
        self.elements += 1;
        if list.len() >= LIST_BYTES {
            let list = std::mem::take(list);
            self.push_message(family, set, &list);
            if self.buf.len() >= BATCH_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Appends one `NFT_MSG_NEWSETELEM` message carrying `list` to the batch.
    fn push_message(&mut self, family: u8, set: &str, list: &[u8]) {
        let seq = self.next_seq();
        let message = begin_message(
            &mut self.buf,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
            seq,
            family,
            0,
        );
        attr_str(&mut self.buf, NFTA_SET_ELEM_LIST_TABLE, &self.table);
        attr_str(&mut self.buf, NFTA_SET_ELEM_LIST_SET, set);
        let nest = nest_start(&mut self.buf, NFTA_SET_ELEM_LIST_ELEMENTS);
        self.buf.extend_from_slice(list);
        nest_end(&mut self.buf, nest);
        end_message(&mut self.buf, message);
        self.messages.push((seq, family, set.to_string()));
    }

    /// Sends the batch built so far as one transaction and checks every answer.
    fn flush(&mut self) -> Result<(), DataplaneError> {
        if self.messages.is_empty() {
            return Ok(());
        }
        self.batch_marker(NFNL_MSG_BATCH_END);
        send(&self.socket, &self.buf)?;
        let replies = drain(&self.socket)?;
        let messages = std::mem::take(&mut self.messages);
        self.buf.clear();
        self.batch_marker(NFNL_MSG_BATCH_BEGIN);
        if let Some(r) = replies.iter().find(|r| r.error != 0) {
            let what = messages
                .iter()
                .find(|m| m.0 == r.seq)
                .map(|(_, family, set)| {
                    let family = if *family == NFPROTO_IPV6 { "ip6" } else { "ip" };
                    format!("add element {family} {} {set}", self.table)
                })
                .unwrap_or_else(|| format!("a batch of elements for table {}", self.table));
            let mut detail = errno_text(r.error);
            if let Some(m) = &r.message {
                detail = format!("{detail}: {m}");
            }
            return Err(DataplaneError::Command {
                command: format!("netlink: {what}"),
                detail,
            });
        }
        let acked = replies.iter().filter(|r| r.ty == NLMSG_ERROR).count();
        if acked < messages.len() {
            return Err(DataplaneError::Other(format!(
                "netlink: nf_tables acknowledged {acked} of {} element messages for table {}",
                messages.len(),
                self.table
            )));
        }
        Ok(())
    }

    /// Sends what is left; returns how many elements were written in all.
    pub fn finish(mut self) -> Result<usize, DataplaneError> {
        self.push_lists()?;
        self.flush()?;
        Ok(self.elements)
    }

    /// Puts every set's remaining elements into messages, sending full batches.
    fn push_lists(&mut self) -> Result<(), DataplaneError> {
        let lists = std::mem::take(&mut self.lists);
        for (family, sets) in lists {
            for (set, list) in sets.into_iter().filter(|(_, l)| !l.is_empty()) {
                self.push_message(family, &set, &list);
                if self.buf.len() >= BATCH_BYTES {
                    self.flush()?;
                }
            }
        }
        Ok(())
    }
}

/// Appends one element (`NFTA_LIST_ELEM`: its key and, for a map, its data) to an element list.
fn encode_element(buf: &mut Vec<u8>, key: &[u8], data: Option<Data<'_>>) {
    let element = nest_start(buf, NFTA_LIST_ELEM);
    let k = nest_start(buf, NFTA_SET_ELEM_KEY);
    attr(buf, NFTA_DATA_VALUE, key);
    nest_end(buf, k);
    if let Some(data) = data {
        let d = nest_start(buf, NFTA_SET_ELEM_DATA);
        match data {
            Data::Value(v) => attr(buf, NFTA_DATA_VALUE, v),
            Data::Jump(chain) | Data::Goto(chain) => {
                let code = if matches!(data, Data::Jump(_)) {
                    NFT_JUMP
                } else {
                    NFT_GOTO
                };
                let v = nest_start(buf, NFTA_DATA_VERDICT);
                attr(buf, NFTA_VERDICT_CODE, &code.to_be_bytes());
                attr_str(buf, NFTA_VERDICT_CHAIN, chain);
                nest_end(buf, v);
            }
        }
        nest_end(buf, d);
    }
    nest_end(buf, element);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nests_cover_their_contents() {
        let mut buf = Vec::new();
        let n = nest_start(&mut buf, 3);
        attr(&mut buf, 1, &[1, 2, 3]);
        attr_str(&mut buf, 2, "kpr");
        nest_end(&mut buf, n);
        assert_eq!(buf.len(), 4 + 8 + 8);
        assert_eq!(u16::from_ne_bytes([buf[0], buf[1]]), 20);
        assert_eq!(u16::from_ne_bytes([buf[2], buf[3]]), 3 | NLA_F_NESTED);
        assert_eq!(&buf[4..12], &[7, 0, 1, 0, 1, 2, 3, 0]);
        assert_eq!(&buf[12..20], &[8, 0, 2, 0, b'k', b'p', b'r', 0]);
    }

    kpr_tests::needs_root! {
        #[test]
        fn elements_are_gathered_into_one_message_per_set() {
            // Opens a socket (in this namespace) but sends nothing: full batches only.
            let mut w = ElementWriter::new("kpr").expect("netfilter netlink socket");
            for i in 0u32..10 {
                let set = if i % 2 == 0 { "fe" } else { "targets" };
                w.add(NFPROTO_IPV4, set, &i.to_ne_bytes(), None).unwrap();
                w.add(NFPROTO_IPV6, set, &i.to_ne_bytes(), None).unwrap();
            }
            w.push_lists().unwrap();
            let mut sets: Vec<(u8, &str)> = w
                .messages
                .iter()
                .map(|(_, f, s)| (*f, s.as_str()))
                .collect();
            sets.sort();
            assert_eq!(
                sets,
                [
                    (NFPROTO_IPV4, "fe"),
                    (NFPROTO_IPV4, "targets"),
                    (NFPROTO_IPV6, "fe"),
                    (NFPROTO_IPV6, "targets")
                ]
            );
            assert_eq!(w.elements, 20);
        }
    }

    #[test]
    fn an_extended_acknowledgement_gives_its_text() {
        let mut tlvs = Vec::new();
        attr(&mut tlvs, 2, &7u32.to_ne_bytes());
        attr_str(&mut tlvs, NLMSGERR_ATTR_MSG, "no such set");
        assert_eq!(ack_message(&tlvs).as_deref(), Some("no such set"));
        assert_eq!(ack_message(&[]), None);
    }
}
