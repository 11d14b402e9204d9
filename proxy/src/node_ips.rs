//! The node's own addresses ([`interface_addresses`]: every address of its interfaces but
//! loopback and IPv6 link-local ones), and its primary address of each family without an API
//! server: the first address of the interface that holds the default route (`/proc/net/route`,
//! `/proc/net/ipv6_route`), as kubelet chooses a node IP when given none.
//! `--nodeport-addresses primary` falls back to it when the Node object cannot be read
//! (`source::kube::primary_node_ips` is the first choice). Reads only; owns no state.

use std::net::IpAddr;

/// The interface of the IPv4 default route in `/proc/net/route`'s text (destination and mask
/// 0), the lowest metric first.
pub fn v4_default_interface(route: &str) -> Option<String> {
    route
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000")
                .then(|| (f[6].parse::<u32>().unwrap_or(u32::MAX), f[0].to_string()))
        })
        .min()
        .map(|(_, iface)| iface)
}

/// The interface of the IPv6 default route in `/proc/net/ipv6_route`'s text (`::/0`, not the
/// loopback's unreachable entry), the lowest metric first.
pub fn v6_default_interface(route: &str) -> Option<String> {
    route
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // dest plen src splen nexthop metric refcnt use flags iface
            (f.len() == 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00" && f[9] != "lo").then(
                || {
                    (
                        u32::from_str_radix(f[5], 16).unwrap_or(u32::MAX),
                        f[9].to_string(),
                    )
                },
            )
        })
        .min()
        .map(|(_, iface)| iface)
}

/// Every address of this network namespace's interfaces, with its interface, in the kernel's
/// order, but loopback and IPv6 link-local ones (no node address).
pub fn interface_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    Ok(nix::ifaddrs::getifaddrs()?
        .filter_map(|ifa| {
            let a = ifa.address?;
            let ip = match (a.as_sockaddr_in(), a.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (_, Some(v6)) => IpAddr::V6(v6.ip()),
                _ => return None,
            };
            let link_local = matches!(ip, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80);
            (!ip.is_loopback() && !link_local).then_some((ifa.interface_name, ip))
        })
        .collect())
}

/// The first address of each family on the interface of that family's default route, in this
/// network namespace.
pub fn of_default_routes() -> std::io::Result<Vec<IpAddr>> {
    let v4 = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| v4_default_interface(&t));
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route")
        .ok()
        .and_then(|t| v6_default_interface(&t));
    let addrs = interface_addresses()?;
    let first = |iface: &Option<String>, v6: bool| {
        let iface = iface.as_deref()?;
        addrs
            .iter()
            .find_map(|(name, ip)| (name == iface && ip.is_ipv6() == v6).then_some(*ip))
    };
    Ok([first(&v4, false), first(&v6, true)]
        .into_iter()
        .flatten()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_route_interfaces() {
        let route =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     p0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                     eth1\t00000000\t010200C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
                     eth0\t00000000\t020200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n";
        assert_eq!(v4_default_interface(route).as_deref(), Some("eth0"));
        assert_eq!(v4_default_interface("Iface\tDestination\n"), None);
        let route6 = "fd000010024400010000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     p1\n\
                      00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000064 00000400 00000001 00000000 00000003     cl\n\
                      00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";
        assert_eq!(v6_default_interface(route6).as_deref(), Some("cl"));
    }
}
