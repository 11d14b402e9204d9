//! The kernel's byte layout of the elements' keys and values, for loading them over netlink
//! (`crate::nft::netlink`) instead of as text.
//!
//! Owns the encoding and nothing else; it must agree with the types the skeleton declares
//! (`ruleset`), which a test checks by loading the same elements both ways and comparing what
//! nft lists. nf_tables lays a concatenation out field by field, each padded with zeros to a
//! multiple of 4 bytes; addresses, protocols and ports in network order, `mark` and the integers
//! of `typeof ct mark . numgen` in host order. Interval sets (`fw_allowed`) store ranges, not
//! keys: their elements stay text.

use std::borrow::Cow;
use std::net::IpAddr;

use super::elements::{Key, Value};
use crate::model::{IpFamily, Protocol};
use crate::nft::netlink::{Data, NFPROTO_IPV4, NFPROTO_IPV6};

/// The `nfgenmsg` family of a family's table.
pub fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

fn addr(out: &mut Vec<u8>, a: &IpAddr) {
    match a {
        IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
        IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
    }
}

fn protocol(out: &mut Vec<u8>, p: Protocol) {
    out.extend_from_slice(&[p.number(), 0, 0, 0]);
}

fn port(out: &mut Vec<u8>, port: u16) {
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
}

/// Whether `key` belongs to an interval set, whose elements are loaded as text.
pub fn loads_as_text(key: &Key) -> bool {
    matches!(key, Key::Allowed(_))
}

/// Writes `key` as its set stores it into `out` (cleared first); `false` for a key of an
/// interval set ([`loads_as_text`]).
pub fn key(key: &Key, out: &mut Vec<u8>) -> bool {
    out.clear();
    match key {
        Key::Addr(a) => addr(out, a),
        Key::Hairpin(a) => {
            addr(out, a);
            addr(out, a);
        }
        Key::AddrPort(a, p, n) => {
            addr(out, a);
            protocol(out, *p);
            port(out, *n);
        }
        Key::ProtoPort(p, n) => {
            protocol(out, *p);
            port(out, *n);
        }
        Key::Target(id) => out.extend_from_slice(&id.to_ne_bytes()),
        Key::Slot(id, slot) => {
            out.extend_from_slice(&id.to_ne_bytes());
            out.extend_from_slice(&slot.to_ne_bytes());
        }
        Key::Allowed(_) => return false,
    }
    true
}

/// A map element's data: the value's bytes (written into `scratch`) or its verdict's chain
/// (written into `chain`).
pub fn data<'a>(
    value: &Value,
    scratch: &'a mut Vec<u8>,
    chain: &'a mut Cow<'static, str>,
) -> Data<'a> {
    scratch.clear();
    match value {
        Value::Target(id) => {
            scratch.extend_from_slice(&id.to_ne_bytes());
            Data::Value(scratch)
        }
        Value::Endpoint(a, n) => {
            addr(scratch, a);
            port(scratch, *n);
            Data::Value(scratch)
        }
        Value::Verdict(v) => {
            let (jump, name) = v.chain();
            *chain = name;
            if jump {
                Data::Jump(chain)
            } else {
                Data::Goto(chain)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::nftables::elements::Verdict;

    #[test]
    fn concatenations_pad_each_field_to_four_bytes() {
        let mut out = Vec::new();
        let k = Key::AddrPort([10, 96, 0, 1].into(), Protocol::Udp, 53);
        assert!(key(&k, &mut out));
        assert_eq!(out, [10, 96, 0, 1, 17, 0, 0, 0, 0, 53, 0, 0]);
        assert!(key(&Key::ProtoPort(Protocol::Tcp, 30080), &mut out));
        assert_eq!(out, [6, 0, 0, 0, 0x75, 0x80, 0, 0]);
        assert!(key(&Key::Slot(7, 2), &mut out));
        assert_eq!(out, [7u32.to_ne_bytes(), 2u32.to_ne_bytes()].concat());
        let allowed = Key::Allowed(Box::new((
            [10, 0, 0, 1].into(),
            Protocol::Tcp,
            80,
            "10.1.0.0/16".into(),
        )));
        assert!(!key(&allowed, &mut out), "interval keys stay text");
        assert!(loads_as_text(&allowed) && !loads_as_text(&k));
    }

    #[test]
    fn verdicts_go_to_or_jump_to_their_chain() {
        let mut scratch = Vec::new();
        let mut chain = Cow::Borrowed("");
        let v = Value::Verdict(Verdict::RoundRobin(17, 3));
        assert_eq!(data(&v, &mut scratch, &mut chain), Data::Goto("rr_17_3"));
        let v = Value::Verdict(Verdict::AffinityLookup(30));
        assert_eq!(data(&v, &mut scratch, &mut chain), Data::Jump("aff_30"));
        let v = Value::Endpoint([10, 1, 0, 5].into(), 8080);
        assert_eq!(
            data(&v, &mut scratch, &mut chain),
            Data::Value(&[10, 1, 0, 5, 0x1f, 0x90, 0, 0])
        );
    }
}
