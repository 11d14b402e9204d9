//! `ip route get` over rtnetlink, for `proxy trace`: the interface the node's routing sends an
//! address by. The XDP program sends a packet itself only when the FIB sends it back out of the
//! interface it arrived on, so which hook carries a flow's later packets is a question of
//! routes. Reads only; owns no state.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_route::route::{RouteAttribute, RouteMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The interface the node routes `dst` by (`ip route get DST`'s `dev`), in the calling thread's
/// network namespace. A local address routes by `lo`.
pub fn interface_to(dst: IpAddr) -> io::Result<String> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut msg = RouteMessage::default();
    msg.header.address_family = match dst {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    msg.attributes.push(RouteAttribute::Destination(dst.into()));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetRoute(msg)),
    );
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    socket.send(&bytes, 0)?;
    let mut buf = vec![0u8; 8192];
    let n = socket.recv(&mut &mut buf[..], 0)?;
    let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[..n])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let oif = match reply.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(route)) => {
            route.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            })
        }
        NetlinkPayload::Error(e) => {
            return Err(e
                .code
                .map(|c| io::Error::from_raw_os_error(-c.get()))
                .unwrap_or_else(|| io::Error::other("RTM_GETROUTE: error without a code")));
        }
        other => {
            return Err(io::Error::other(format!(
                "RTM_GETROUTE: unexpected answer {other:?}"
            )))
        }
    };
    let oif = oif.ok_or_else(|| io::Error::other(format!("the route to {dst} has no device")))?;
    nix::net::if_::if_indextoname(oif)
        .map(|n| n.to_string_lossy().into_owned())
        .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_routes_by_lo() {
        assert_eq!(interface_to("127.0.0.1".parse().unwrap()).unwrap(), "lo");
    }
}
