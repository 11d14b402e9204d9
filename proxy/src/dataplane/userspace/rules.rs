//! The nftables side of the userspace backend: a table that redirects Service traffic to the
//! agent's listeners, rejects Services without endpoints and drops unallocated service addresses.
//!
//! Pure functions: they turn a service port into set elements and a whole state into a script; the
//! backend applies the scripts. IPv4 only (the `ip` family); IPv6 service addresses are reported.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use crate::model::{Protocol, ServicePort};
use crate::selection::{DestKind, EmptyVerdict, SelectedEndpoints};

pub const TABLE: &str = "kpr-userspace";

/// One element of one named set or map, e.g. (`svc_tcp`, `10.96.0.10 . 80`).
pub type Element = (&'static str, String);

/// The table with its sets, maps and chains, redirecting TCP to `tcp_port`.
/// TCP is refused with a reset, the rest with ICMP port unreachable: the kernel sends at most
/// about one ICMP error per second to a destination (`net.ipv4.icmp_ratelimit`), so a TCP client
/// that retried within that second would see its SYN vanish instead of a refusal.
pub fn base_table(tcp_port: u16) -> String {
    let l4 = "meta l4proto { tcp, udp, sctp }";
    format!(
        r#"table ip {TABLE} {{
  set svc_tcp {{ type ipv4_addr . inet_service; }}
  map svc_udp {{ type ipv4_addr . inet_service : inet_service; }}
  set np_tcp {{ type inet_service; }}
  map np_udp {{ type inet_service : inet_service; }}
  set np_ips {{ type ipv4_addr; }}
  set svc_reject {{ type ipv4_addr . inet_proto . inet_service; }}
  set svc_drop {{ type ipv4_addr . inet_proto . inet_service; }}
  set np_reject {{ type inet_proto . inet_service; }}
  set np_drop {{ type inet_proto . inet_service; }}
  set svc_ports {{ type ipv4_addr . inet_proto . inet_service; }}
  set cluster_ips {{ type ipv4_addr; }}
  set service_cidrs {{ type ipv4_addr; flags interval; }}
  chain filter_pre {{
    type filter hook prerouting priority -110; policy accept;
    jump filter_services
  }}
  chain filter_out {{
    type filter hook output priority -110; policy accept;
    jump filter_services
  }}
  chain filter_services {{
    meta l4proto tcp ip daddr . meta l4proto . th dport @svc_reject reject with tcp reset
    {l4} ip daddr . meta l4proto . th dport @svc_reject reject
    {l4} ip daddr . meta l4proto . th dport @svc_drop drop
    meta l4proto tcp ip daddr @np_ips meta l4proto . th dport @np_reject reject with tcp reset
    {l4} ip daddr @np_ips meta l4proto . th dport @np_reject reject
    {l4} ip daddr @np_ips meta l4proto . th dport @np_drop drop
    meta l4proto tcp ip daddr @cluster_ips ip daddr . meta l4proto . th dport != @svc_ports reject with tcp reset
    {l4} ip daddr @cluster_ips ip daddr . meta l4proto . th dport != @svc_ports reject
    ip daddr @service_cidrs ip daddr != @cluster_ips drop
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
    meta l4proto tcp ip daddr . tcp dport @svc_tcp redirect to :{tcp_port}
    meta l4proto udp redirect to : ip daddr . udp dport map @svc_udp
    ip daddr @np_ips meta l4proto tcp tcp dport @np_tcp redirect to :{tcp_port}
    ip daddr @np_ips meta l4proto udp redirect to : udp dport map @np_udp
  }}
}}
"#
    )
}

fn v4(ip: &IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(v) => Some(*v),
        IpAddr::V6(_) => None,
    }
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

/// The UDP listener port serving one destination kind of a service port (0 when there is none).
pub type UdpPortOf<'a> = &'a dyn Fn(DestKind) -> u16;

/// The set elements of one service port. `udp_port` gives the listener of each destination kind.
pub fn elements(
    sp: &ServicePort,
    sel: &SelectedEndpoints,
    udp_port: UdpPortOf<'_>,
) -> Vec<Element> {
    let mut out = Vec::new();
    let proto = sp.protocol.lower();
    for (ip, kind) in super::table::destinations(sp) {
        let Some(ip) = v4(&ip) else { continue };
        if kind == DestKind::ClusterIp {
            out.push(("svc_ports", format!("{ip} . {proto} . {}", sp.port)));
        }
        match (action(sp, sel, kind), sp.protocol) {
            (Action::Redirect, Protocol::Tcp) => {
                out.push(("svc_tcp", format!("{ip} . {}", sp.port)))
            }
            (Action::Redirect, Protocol::Udp) => out.push((
                "svc_udp",
                format!("{ip} . {} : {}", sp.port, udp_port(kind)),
            )),
            (Action::Redirect, Protocol::Sctp) => {}
            (Action::Refuse(EmptyVerdict::Reject), _) => {
                out.push(("svc_reject", format!("{ip} . {proto} . {}", sp.port)))
            }
            (Action::Refuse(EmptyVerdict::Drop), _) => {
                out.push(("svc_drop", format!("{ip} . {proto} . {}", sp.port)))
            }
        }
    }
    if sp.node_port != 0 {
        let np = sp.node_port;
        match (action(sp, sel, DestKind::NodePort), sp.protocol) {
            (Action::Redirect, Protocol::Tcp) => out.push(("np_tcp", np.to_string())),
            (Action::Redirect, Protocol::Udp) => {
                out.push(("np_udp", format!("{np} : {}", udp_port(DestKind::NodePort))))
            }
            (Action::Redirect, Protocol::Sctp) => {}
            (Action::Refuse(EmptyVerdict::Reject), _) => {
                out.push(("np_reject", format!("{proto} . {np}")))
            }
            (Action::Refuse(EmptyVerdict::Drop), _) => {
                out.push(("np_drop", format!("{proto} . {np}")))
            }
        }
    }
    out
}

/// Appends `add element` / `delete element` commands for a batch of elements.
pub fn element_commands(script: &mut String, verb: &str, elements: &[Element]) {
    let mut by_set: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
    for (set, e) in elements {
        by_set.entry(set).or_default().push(e);
    }
    for (set, elems) in by_set {
        for chunk in elems.chunks(2000) {
            let _ = writeln!(
                script,
                "{verb} element ip {TABLE} {set} {{ {} }}",
                chunk.join(", ")
            );
        }
    }
}

/// Elements of the node-wide sets: nodePort addresses, service CIDRs, cluster IPs.
pub fn node_elements(
    nodeport_ips: &[IpAddr],
    service_cidrs: &[IpNet],
    cluster_ips: &BTreeSet<Ipv4Addr>,
) -> Vec<Element> {
    let mut out: Vec<Element> = nodeport_ips
        .iter()
        .filter_map(v4)
        .map(|ip| ("np_ips", ip.to_string()))
        .collect();
    out.extend(
        service_cidrs
            .iter()
            .filter(|c| matches!(c, IpNet::V4(_)))
            .map(|c| ("service_cidrs", c.to_string())),
    );
    out.extend(cluster_ips.iter().map(|ip| ("cluster_ips", ip.to_string())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{fixtures, Endpoint};
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
        let e = elements(&s, &sel, &|k| {
            if k == DestKind::NodePort {
                4001
            } else {
                4000
            }
        });
        assert_eq!(
            e,
            vec![
                ("svc_ports", "10.96.0.10 . udp . 53".to_string()),
                ("svc_udp", "10.96.0.10 . 53 : 4000".to_string()),
                ("svc_udp", "192.0.2.50 . 53 : 4000".to_string()),
                ("np_udp", "30053 : 4001".to_string()),
            ]
        );
    }

    #[test]
    fn service_without_endpoints_is_rejected_everywhere() {
        let s = sp(Protocol::Tcp, 30053);
        let sel = select(&s, &[], "n");
        let e = elements(&s, &sel, &|_| 0);
        assert_eq!(
            e,
            vec![
                ("svc_ports", "10.96.0.10 . tcp . 53".to_string()),
                ("svc_reject", "10.96.0.10 . tcp . 53".to_string()),
                ("svc_reject", "192.0.2.50 . tcp . 53".to_string()),
                ("np_reject", "tcp . 30053".to_string()),
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
        let e = elements(&s, &sel, &|_| 0);
        assert!(
            e.contains(&("svc_drop", "10.96.0.10 . tcp . 53".to_string())),
            "{e:?}"
        );
        assert!(
            e.contains(&("svc_tcp", "192.0.2.50 . 53".to_string())),
            "external traffic is eTP Cluster: {e:?}"
        );
    }
}
