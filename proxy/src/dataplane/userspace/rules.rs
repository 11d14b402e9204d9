//! The nftables side of the userspace backend: a table that redirects Service traffic to the
//! agent's listeners, rejects Services without endpoints and drops unallocated service addresses.
//!
//! Pure functions: they turn a service port into set elements and a whole state into a script; the
//! backend applies the scripts. One table per address family (`ip kpr-userspace`,
//! `ip6 kpr-userspace`) of the same layout; each family's Service addresses go to its own table and
//! are redirected to that family's listeners.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{IpFamily, Protocol, ServicePort};
use crate::selection::{DestKind, EmptyVerdict, SelectedEndpoints};

pub const TABLE: &str = "kpr-userspace";

/// One element of one named set or map of one family's table, e.g.
/// (IPv4, `svc_tcp`, `10.96.0.10 . 80`).
pub type Element = (IpFamily, &'static str, String);

/// The nft family of a table and the address type of its sets.
pub fn nft_family(family: IpFamily) -> (&'static str, &'static str) {
    match family {
        IpFamily::V4 => ("ip", "ipv4_addr"),
        IpFamily::V6 => ("ip6", "ipv6_addr"),
    }
}

/// One family's table with its sets, maps and chains, redirecting TCP to `tcp_port`.
/// TCP is refused with a reset, the rest with ICMP port unreachable: the kernel sends at most
/// about one ICMP error per second to a destination (`net.ipv4.icmp_ratelimit`), so a TCP client
/// that retried within that second would see its SYN vanish instead of a refusal.
pub fn base_table(family: IpFamily, tcp_port: u16) -> String {
    let l4 = "meta l4proto { tcp, udp, sctp }";
    // The table's family is also the header its rules match addresses with (`ip6 daddr`).
    let (ip, addr) = nft_family(family);
    format!(
        r#"table {ip} {TABLE} {{
  set svc_tcp {{ type {addr} . inet_service; }}
  map svc_udp {{ type {addr} . inet_service : inet_service; }}
  set np_tcp {{ type inet_service; }}
  map np_udp {{ type inet_service : inet_service; }}
  set np_ips {{ type {addr}; }}
  set svc_reject {{ type {addr} . inet_proto . inet_service; }}
  set svc_drop {{ type {addr} . inet_proto . inet_service; }}
  set np_reject {{ type inet_proto . inet_service; }}
  set np_drop {{ type inet_proto . inet_service; }}
  set svc_ports {{ type {addr} . inet_proto . inet_service; }}
  set cluster_ips {{ type {addr}; }}
  set service_cidrs {{ type {addr}; flags interval; }}
  chain filter_pre {{
    type filter hook prerouting priority -110; policy accept;
    jump filter_services
  }}
  chain filter_out {{
    type filter hook output priority -110; policy accept;
    jump filter_services
  }}
  chain filter_services {{
    meta l4proto tcp {ip} daddr . meta l4proto . th dport @svc_reject reject with tcp reset
    {l4} {ip} daddr . meta l4proto . th dport @svc_reject reject
    {l4} {ip} daddr . meta l4proto . th dport @svc_drop drop
    meta l4proto tcp {ip} daddr @np_ips meta l4proto . th dport @np_reject reject with tcp reset
    {l4} {ip} daddr @np_ips meta l4proto . th dport @np_reject reject
    {l4} {ip} daddr @np_ips meta l4proto . th dport @np_drop drop
    meta l4proto tcp {ip} daddr @cluster_ips {ip} daddr . meta l4proto . th dport != @svc_ports reject with tcp reset
    {l4} {ip} daddr @cluster_ips {ip} daddr . meta l4proto . th dport != @svc_ports reject
    {ip} daddr @service_cidrs {ip} daddr != @cluster_ips drop
  }}
  chain nat_pre {{
    type nat hook prerouting priority -100; policy accept;
    jump redirect_services
  }}
  chain nat_out {{
    type nat hook output priority -100; policy accept;
    jump redirect_services
  }}
  chain redirect_services {{
    meta l4proto tcp {ip} daddr . tcp dport @svc_tcp redirect to :{tcp_port}
    meta l4proto udp redirect to : {ip} daddr . udp dport map @svc_udp
    {ip} daddr @np_ips meta l4proto tcp tcp dport @np_tcp redirect to :{tcp_port}
    {ip} daddr @np_ips meta l4proto udp redirect to : udp dport map @np_udp
  }}
}}
"#
    )
}

/// What a destination kind of this service port does with a new connection.
enum Action {
    Redirect,
    Refuse(EmptyVerdict),
}

fn action(sp: &ServicePort, sel: &SelectedEndpoints, kind: DestKind) -> Action {
    let (set, local) = if kind.is_external() {
        (&sel.external, sp.external_local)
    } else {
        (&sel.cluster, sp.internal_local)
    };
    // External destinations of an eTP Local Service also serve pod and node sources from the
    // cluster endpoints: redirect whenever either set has something; the listener decides per source.
    let reachable =
        !set.is_empty() || (kind.is_external() && sp.external_local && !sel.cluster.is_empty());
    if reachable {
        Action::Redirect
    } else {
        Action::Refuse(sel.empty_verdict(local))
    }
}

/// The UDP listener port serving one destination kind of a service port in one family (0 when
/// there is none).
pub type UdpPortOf<'a> = &'a dyn Fn(DestKind, IpFamily) -> u16;

/// The set elements of one service port in the tables of `families` (the families the node
/// serves). `udp_port` gives the listener of each destination kind and family.
pub fn elements(
    sp: &ServicePort,
    sel: &SelectedEndpoints,
    families: &[IpFamily],
    udp_port: UdpPortOf<'_>,
) -> Vec<Element> {
    let mut out = Vec::new();
    let proto = sp.protocol.lower();
    for (ip, kind) in super::table::destinations(sp) {
        let f = IpFamily::of(&ip);
        if !families.contains(&f) {
            continue;
        }
        if kind == DestKind::ClusterIp {
            out.push((f, "svc_ports", format!("{ip} . {proto} . {}", sp.port)));
        }
        match (action(sp, sel, kind), sp.protocol) {
            (Action::Redirect, Protocol::Tcp) => {
                out.push((f, "svc_tcp", format!("{ip} . {}", sp.port)))
            }
            (Action::Redirect, Protocol::Udp) => out.push((
                f,
                "svc_udp",
                format!("{ip} . {} : {}", sp.port, udp_port(kind, f)),
            )),
            (Action::Redirect, Protocol::Sctp) => {}
            (Action::Refuse(EmptyVerdict::Reject), _) => {
                out.push((f, "svc_reject", format!("{ip} . {proto} . {}", sp.port)))
            }
            (Action::Refuse(EmptyVerdict::Drop), _) => {
                out.push((f, "svc_drop", format!("{ip} . {proto} . {}", sp.port)))
            }
        }
    }
    if sp.node_port != 0 {
        let np = sp.node_port;
        // A nodePort serves the families the Service has, as kube-proxy's per-family proxiers do.
        for &f in families.iter().filter(|f| sp.has_family(**f)) {
            match (action(sp, sel, DestKind::NodePort), sp.protocol) {
                (Action::Redirect, Protocol::Tcp) => out.push((f, "np_tcp", np.to_string())),
                (Action::Redirect, Protocol::Udp) => out.push((
                    f,
                    "np_udp",
                    format!("{np} : {}", udp_port(DestKind::NodePort, f)),
                )),
                (Action::Redirect, Protocol::Sctp) => {}
                (Action::Refuse(EmptyVerdict::Reject), _) => {
                    out.push((f, "np_reject", format!("{proto} . {np}")))
                }
                (Action::Refuse(EmptyVerdict::Drop), _) => {
                    out.push((f, "np_drop", format!("{proto} . {np}")))
                }
            }
        }
    }
    out
}

/// Appends `add element` / `delete element` commands for a batch of elements.
pub fn element_commands(script: &mut String, verb: &str, elements: &[Element]) {
    let mut by_set: std::collections::BTreeMap<(IpFamily, &str), Vec<&str>> =
        std::collections::BTreeMap::new();
    for (f, set, e) in elements {
        by_set.entry((*f, set)).or_default().push(e);
    }
    for ((f, set), elems) in by_set {
        let fam = nft_family(f).0;
        for chunk in elems.chunks(2000) {
            let _ = writeln!(
                script,
                "{verb} element {fam} {TABLE} {set} {{ {} }}",
                chunk.join(", ")
            );
        }
    }
}

/// Elements of the node-wide sets of `families`' tables: nodePort addresses, service CIDRs,
/// cluster IPs.
pub fn node_elements(
    families: &[IpFamily],
    nodeport_ips: &[IpAddr],
    service_cidrs: &[IpNet],
    cluster_ips: &BTreeSet<IpAddr>,
) -> Vec<Element> {
    let served = |ip: &IpAddr| families.contains(&IpFamily::of(ip));
    let mut out: Vec<Element> = nodeport_ips
        .iter()
        .filter(|ip| served(ip))
        .map(|ip| (IpFamily::of(ip), "np_ips", ip.to_string()))
        .collect();
    out.extend(
        service_cidrs
            .iter()
            .filter(|c| served(&c.addr()))
            .map(|c| (IpFamily::of(&c.addr()), "service_cidrs", c.to_string())),
    );
    out.extend(
        cluster_ips
            .iter()
            .filter(|ip| served(ip))
            .map(|ip| (IpFamily::of(ip), "cluster_ips", ip.to_string())),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        fixtures, Endpoint,
        IpFamily::{V4, V6},
    };
    use crate::selection::select;

    fn sp(protocol: Protocol, node_port: u16) -> ServicePort {
        let mut svc = fixtures::service_port("s", "10.96.0.10");
        svc.name.protocol = protocol;
        ServicePort {
            port: 53,
            protocol,
            node_port,
            external_ips: vec!["192.0.2.50".parse().unwrap()],
            ..svc
        }
    }

    fn ep() -> Endpoint {
        Endpoint {
            port: 53,
            node: None,
            ..fixtures::endpoint([10, 244, 1, 2].into(), "")
        }
    }

    #[test]
    fn service_with_endpoints_is_redirected_on_every_destination() {
        let s = sp(Protocol::Udp, 30053);
        let sel = select(&s, &[ep()], "n");
        let e = elements(&s, &sel, &[V4], &|k, _| {
            if k == DestKind::NodePort {
                4001
            } else {
                4000
            }
        });
        assert_eq!(
            e,
            vec![
                (V4, "svc_ports", "10.96.0.10 . udp . 53".to_string()),
                (V4, "svc_udp", "10.96.0.10 . 53 : 4000".to_string()),
                (V4, "svc_udp", "192.0.2.50 . 53 : 4000".to_string()),
                (V4, "np_udp", "30053 : 4001".to_string()),
            ]
        );
    }

    #[test]
    fn service_without_endpoints_is_rejected_everywhere() {
        let s = sp(Protocol::Tcp, 30053);
        let sel = select(&s, &[], "n");
        let e = elements(&s, &sel, &[V4], &|_, _| 0);
        assert_eq!(
            e,
            vec![
                (V4, "svc_ports", "10.96.0.10 . tcp . 53".to_string()),
                (V4, "svc_reject", "10.96.0.10 . tcp . 53".to_string()),
                (V4, "svc_reject", "192.0.2.50 . tcp . 53".to_string()),
                (V4, "np_reject", "tcp . 30053".to_string()),
            ]
        );
    }

    #[test]
    fn local_policy_with_remote_endpoints_only_is_dropped() {
        let mut s = sp(Protocol::Tcp, 0);
        s.internal_local = true;
        let remote = Endpoint {
            node: Some("other".into()),
            ..ep()
        };
        let sel = select(&s, &[remote], "n");
        let e = elements(&s, &sel, &[V4], &|_, _| 0);
        assert!(
            e.contains(&(V4, "svc_drop", "10.96.0.10 . tcp . 53".to_string())),
            "{e:?}"
        );
        assert!(
            e.contains(&(V4, "svc_tcp", "192.0.2.50 . 53".to_string())),
            "external traffic is eTP Cluster: {e:?}"
        );
    }

    #[test]
    fn each_family_goes_to_its_own_table_and_listener() {
        let mut s = sp(Protocol::Udp, 30053);
        s.cluster_ips.push("fd00:10:96::10".parse().unwrap());
        s.external_ips.clear();
        let sel = select(&s, &[ep()], "n");
        let port = |_, f| if f == V4 { 4000 } else { 6000 };
        assert_eq!(
            elements(&s, &sel, &[V4, V6], &port),
            vec![
                (V4, "svc_ports", "10.96.0.10 . udp . 53".to_string()),
                (V4, "svc_udp", "10.96.0.10 . 53 : 4000".to_string()),
                (V6, "svc_ports", "fd00:10:96::10 . udp . 53".to_string()),
                (V6, "svc_udp", "fd00:10:96::10 . 53 : 6000".to_string()),
                (V4, "np_udp", "30053 : 4000".to_string()),
                (V6, "np_udp", "30053 : 6000".to_string()),
            ]
        );
        // A node that serves IPv4 only programs nothing of IPv6, nodePort included.
        assert!(elements(&s, &sel, &[V4], &port)
            .iter()
            .all(|(f, _, _)| *f == V4));
        // An IPv4-only Service's nodePort is not opened in the IPv6 table.
        let v4_only = sp(Protocol::Tcp, 30080);
        assert!(
            elements(&v4_only, &select(&v4_only, &[ep()], "n"), &[V4, V6], &port)
                .iter()
                .all(|(f, _, _)| *f == V4)
        );
    }

    #[test]
    fn node_elements_follow_the_served_families() {
        let ips: Vec<IpAddr> = vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
        let cidrs: Vec<IpNet> = vec![
            "10.96.0.0/16".parse().unwrap(),
            "fd00:10:96::/112".parse().unwrap(),
        ];
        let cluster: BTreeSet<IpAddr> = [
            "10.96.0.1".parse().unwrap(),
            "fd00:10:96::1".parse().unwrap(),
        ]
        .into();
        let both = node_elements(&[V4, V6], &ips, &cidrs, &cluster);
        assert!(
            both.contains(&(V6, "service_cidrs", "fd00:10:96::/112".to_string())),
            "{both:?}"
        );
        assert!(
            both.contains(&(V6, "np_ips", "2001:db8::1".to_string())),
            "{both:?}"
        );
        assert_eq!(both.len(), 6);
        let v4 = node_elements(&[V4], &ips, &cidrs, &cluster);
        assert_eq!(v4.len(), 3);
        assert!(v4.iter().all(|(f, _, _)| *f == V4));
        let mut script = String::new();
        element_commands(&mut script, "add", &both);
        assert!(
            script.contains("add element ip6 kpr-userspace cluster_ips { fd00:10:96::1 }"),
            "{script}"
        );
        assert!(
            script.contains("add element ip kpr-userspace cluster_ips { 10.96.0.1 }"),
            "{script}"
        );
    }
}
