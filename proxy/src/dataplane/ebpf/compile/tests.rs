//! Which frontends and backend sets a service port compiles to, case by case.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::*;
use crate::model::fixtures;
use crate::selection::select;

const NODE: &str = "node-a";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn svc() -> ServicePort {
    fixtures::service_port("web", "10.96.0.10")
}

fn ep(last: u8, node: &str) -> Endpoint {
    fixtures::endpoint(Ipv4Addr::new(10, 244, 0, last), node)
}

fn run(svc: &ServicePort, eps: &[Endpoint]) -> DesiredService {
    let sel = select(svc, eps, NODE);
    compile(svc, &sel, &ctx(false))
}

fn ctx(tc: bool) -> CompileContext {
    CompileContext {
        nodeport_ips: vec![ip("192.168.1.10")],
        tc,
        masquerade_all: false,
        node_ips: vec!["192.168.1.10".parse().unwrap()],
        nodeport_mode: Default::default(),
    }
}

fn last_octets(set: &[BackendAddr]) -> Vec<u8> {
    set.iter()
        .map(|b| match b.addr {
            IpAddr::V4(v4) => v4.octets()[3],
            IpAddr::V6(v6) => v6.octets()[15],
        })
        .collect()
}

#[test]
fn cluster_ip_maps_to_sorted_cluster_set_in_network_order() {
    let d = run(&svc(), &[ep(3, NODE), ep(1, "other"), ep(2, NODE)]);
    assert_eq!(last_octets(&d.cluster), vec![1, 2, 3]);
    assert_eq!(d.external, None);
    assert_eq!(d.frontends.len(), 1);
    let f = &d.frontends[0];
    assert_eq!(f.key.addr[0].to_ne_bytes(), [10, 96, 0, 10]);
    assert_eq!(f.key.port, 80u16.to_be());
    assert_eq!(f.key.proto, 6);
    assert_eq!(f.set, SetKind::Cluster);
    assert_eq!(f.flags, 0);
}

#[test]
fn node_port_and_external_ips_share_the_cluster_set_under_etp_cluster() {
    let mut s = svc();
    s.node_port = 30080;
    s.external_ips = vec![ip("203.0.113.5")];
    let d = run(&s, &[ep(1, NODE), ep(2, "other")]);
    let keys: Vec<([u8; 4], u16)> = d
        .frontends
        .iter()
        .map(|f| (f.key.addr[0].to_ne_bytes(), u16::from_be(f.key.port)))
        .collect();
    assert_eq!(
        keys,
        vec![
            ([10, 96, 0, 10], 80),
            ([203, 0, 113, 5], 80),
            ([192, 168, 1, 10], 30080)
        ]
    );
    assert!(d.frontends.iter().all(|f| f.set == SetKind::Cluster));
    assert_eq!(d.external, None, "identical external set is not duplicated");
}

#[test]
fn internal_local_gives_external_frontends_their_own_set() {
    let mut s = svc();
    s.node_port = 30080;
    s.internal_local = true;
    let d = run(&s, &[ep(1, NODE), ep(2, "other")]);
    assert_eq!(last_octets(&d.cluster), vec![1]);
    assert_eq!(last_octets(d.external.as_ref().unwrap()), vec![1, 2]);
    assert_eq!(d.frontends[0].set, SetKind::Cluster);
    assert_eq!(d.frontends[1].set, SetKind::External);
}

#[test]
fn etp_local_short_circuits_local_clients_to_cluster_endpoints() {
    let mut s = svc();
    s.node_port = 30080;
    s.external_local = true;
    let d = run(&s, &[ep(1, "other"), ep(2, "other")]);
    assert_eq!(last_octets(&d.cluster), vec![1, 2]);
    assert!(d.frontends.iter().all(|f| f.set == SetKind::Cluster));
    assert!(d.frontends.iter().all(|f| f.flags & SVC_F_DROP_EMPTY == 0));
}

#[test]
fn internal_local_without_local_endpoints_drops_instead_of_rejecting() {
    let mut s = svc();
    s.internal_local = true;
    let d = run(&s, &[ep(1, "other")]);
    assert!(d.cluster.is_empty());
    assert_eq!(d.frontends[0].flags & SVC_F_DROP_EMPTY, SVC_F_DROP_EMPTY);
    let none = run(&s, &[]);
    assert_eq!(none.frontends[0].flags & SVC_F_DROP_EMPTY, 0);
}

#[test]
fn affinity_and_least_conn_are_carried_to_every_frontend() {
    let mut s = svc();
    s.node_port = 30080;
    s.affinity = Some(Duration::from_secs(10800));
    s.algorithm = Algorithm::LeastConn;
    let d = run(&s, &[ep(1, NODE)]);
    for f in &d.frontends {
        assert_eq!(f.flags & SVC_F_AFFINITY, SVC_F_AFFINITY);
        assert_eq!(f.affinity_timeout_s, 10800);
        assert_eq!(f.algorithm, ALG_LEAST_CONN);
    }
}

#[test]
fn each_family_uses_its_own_backend_sets_and_keys() {
    let mut s = svc();
    s.cluster_ips = vec![ip("10.96.0.10"), ip("fd00::10")];
    s.node_port = 30080;
    let v6 = |last: u8| Endpoint {
        addr: IpAddr::V6(format!("fd00:10:244::{last}").parse().unwrap()),
        ..ep(last, NODE)
    };
    let sel = select(&s, &[ep(1, NODE), ep(2, NODE), v6(7)], NODE);
    let mut c = ctx(false);
    c.nodeport_ips.push(ip("2001:db8::10"));
    let d = compile(&s, &sel, &c);
    // IPv4 before IPv6 in the one sorted list; each family's set is its part.
    assert_eq!(last_octets(&d.cluster), vec![1, 2, 7]);
    assert_eq!(last_octets(d.set(SetKind::Cluster)), vec![1, 2]);
    assert_eq!(last_octets(d.set(SetKind::Cluster6)), vec![7]);
    assert_eq!(d.kinds(), vec![SetKind::Cluster, SetKind::Cluster6]);
    let v6_keys: Vec<&Frontend> = d
        .frontends
        .iter()
        .filter(|f| f.key.scope & SCOPE_V6 != 0)
        .collect();
    // The IPv6 clusterIP and the nodePort on the node's IPv6 address.
    assert_eq!(v6_keys.len(), 2, "{:?}", d.frontends);
    assert!(v6_keys.iter().all(|f| f.set == SetKind::Cluster6));
    assert_eq!(
        addr_from_words(v6_keys[0].key.addr, true),
        ip("fd00::10"),
        "the whole address is in the key"
    );
    assert_eq!(d.vips.len(), 2);
    // An IPv4-only Service opens no nodePort on the IPv6 address.
    let v4_only = compile(&svc_with_node_port(), &sel, &c);
    assert!(v4_only
        .frontends
        .iter()
        .all(|f| f.key.scope & SCOPE_V6 == 0));
}

#[test]
fn an_ipv6_address_with_a_zero_tail_is_not_an_ipv4_key() {
    // Word 0 of `a60:a::` equals 10.96.0.10's; the scope tells them apart.
    let v4 = service_key(ip("10.96.0.10"), 80, Protocol::Tcp);
    let v6 = service_key(ip("a60:a::"), 80, Protocol::Tcp);
    assert_eq!(v4.addr[0], v6.addr[0]);
    assert_ne!(v4, v6);
    assert_eq!(addr_from_words(v6.addr, key_is_v6(&v6)), ip("a60:a::"));
    assert_eq!(addr_from_words(v4.addr, key_is_v6(&v4)), ip("10.96.0.10"));
}

fn svc_with_node_port() -> ServicePort {
    let mut s = svc();
    s.node_port = 30080;
    s
}

#[test]
fn udp_port_keys_carry_the_udp_protocol() {
    let mut s = svc();
    s.protocol = Protocol::Udp;
    let d = run(&s, &[ep(1, NODE)]);
    assert_eq!(d.frontends[0].key.proto, 17);
    assert_eq!(d.cluster[0].proto, Protocol::Udp);
}

#[test]
fn tc_frontends_use_the_external_set_and_masquerade_under_etp_cluster() {
    let mut s = svc();
    s.node_port = 30080;
    let sel = select(&s, &[ep(1, NODE), ep(2, "other")], NODE);
    let d = compile(&s, &sel, &ctx(true));
    let tc: Vec<&Frontend> = d
        .frontends
        .iter()
        .filter(|f| f.key.scope == SCOPE_EXTERNAL)
        .collect();
    assert_eq!(tc.len(), 1);
    assert_eq!(u16::from_be(tc[0].key.port), 30080);
    assert_eq!(tc[0].flags & SVC_F_MASQUERADE, SVC_F_MASQUERADE);
    assert_eq!(
        tc[0].set,
        SetKind::Cluster,
        "same endpoints: the set is shared"
    );
}

/// The tc frontend's (masquerade, dsr) flags of `s` under `mode`.
fn tc_flags(s: &ServicePort, mode: crate::dataplane::NodePortMode, masquerade_all: bool) -> u16 {
    let sel = select(s, &[ep(1, NODE), ep(2, "other")], NODE);
    let mut c = ctx(true);
    c.nodeport_mode = mode;
    c.masquerade_all = masquerade_all;
    let d = compile(s, &sel, &c);
    let tc = d
        .frontends
        .iter()
        .find(|f| f.key.scope == SCOPE_EXTERNAL)
        .unwrap();
    tc.flags & (SVC_F_MASQUERADE | SVC_F_DSR)
}

#[test]
fn nodeport_mode_dsr_replaces_the_masquerade_of_etp_cluster() {
    use crate::dataplane::NodePortMode::{Dsr, Hybrid, Snat};
    let mut tcp = svc();
    tcp.node_port = 30080;
    let mut udp = tcp.clone();
    udp.protocol = Protocol::Udp;
    assert_eq!(tc_flags(&tcp, Snat, false), SVC_F_MASQUERADE);
    assert_eq!(tc_flags(&tcp, Dsr, false), SVC_F_DSR);
    assert_eq!(tc_flags(&udp, Dsr, false), SVC_F_DSR);
    assert_eq!(tc_flags(&tcp, Hybrid, false), SVC_F_DSR);
    assert_eq!(
        tc_flags(&udp, Hybrid, false),
        SVC_F_MASQUERADE,
        "hybrid: UDP SNAT"
    );
    assert_eq!(
        tc_flags(&tcp, Dsr, true),
        SVC_F_MASQUERADE,
        "--masquerade-all keeps masquerading"
    );
    let mut local = tcp.clone();
    local.external_local = true;
    assert_eq!(tc_flags(&local, Dsr, false), 0, "eTP Local: unchanged");
}

#[test]
fn nodeport_mode_dsr_leaves_ipv6_frontends_masqueraded() {
    let mut s = svc();
    s.cluster_ips = vec![ip("fd00:10:96::10")];
    s.node_port = 30080;
    let sel = select(&s, &[], NODE);
    let mut c = ctx(true);
    c.nodeport_ips = vec![ip("2001:db8::10")];
    c.nodeport_mode = crate::dataplane::NodePortMode::Dsr;
    let d = compile(&s, &sel, &c);
    let tc = d
        .frontends
        .iter()
        .find(|f| f.key.scope & SCOPE_EXTERNAL != 0)
        .unwrap();
    assert_eq!(tc.flags & (SVC_F_MASQUERADE | SVC_F_DSR), SVC_F_MASQUERADE);
}

#[test]
fn tc_frontends_under_etp_local_keep_the_client_and_use_local_endpoints() {
    let mut s = svc();
    s.node_port = 30080;
    s.external_local = true;
    let sel = select(&s, &[ep(1, NODE), ep(2, "other")], NODE);
    let d = compile(&s, &sel, &ctx(true));
    let tc = d
        .frontends
        .iter()
        .find(|f| f.key.scope == SCOPE_EXTERNAL)
        .unwrap();
    assert_eq!(tc.flags & SVC_F_MASQUERADE, 0);
    assert_eq!(tc.set, SetKind::External);
    assert_eq!(last_octets(d.external.as_ref().unwrap()), vec![1]);
    let socket = d
        .frontends
        .iter()
        .find(|f| f.key.scope == SCOPE_SOCKET && f.key.port == 30080u16.to_be())
        .unwrap();
    assert_eq!(
        socket.set,
        SetKind::Cluster,
        "local clients are short-circuited"
    );
}

#[test]
fn cluster_ips_get_a_port_zero_marker() {
    let d = run(&svc(), &[ep(1, NODE)]);
    assert_eq!(d.vips.len(), 1);
    assert_eq!(d.vips[0].addr[0].to_ne_bytes(), [10, 96, 0, 10]);
    assert_eq!((d.vips[0].port, d.vips[0].proto), (0, 0));
}

#[test]
fn source_ranges_guard_only_the_lb_ip_and_list_its_allowed_sources() {
    let mut s = svc();
    s.load_balancer_ips = vec![ip("198.51.100.10")];
    s.external_ips = vec![ip("203.0.113.10")];
    s.node_port = 30080;
    s.source_ranges = vec![
        "192.0.2.0/24".parse().unwrap(),
        "2001:db8::/64".parse().unwrap(),
    ];
    let d = compile(&s, &select(&s, &[ep(1, NODE)], NODE), &ctx(true));
    let guarded: Vec<(u32, u8)> = d
        .frontends
        .iter()
        .filter(|f| f.flags & SVC_F_SOURCE_RANGES != 0)
        .map(|f| (f.key.addr[0], f.key.scope))
        .collect();
    let lb = u32::from_ne_bytes([198, 51, 100, 10]);
    assert_eq!(guarded, vec![(lb, SCOPE_SOCKET), (lb, SCOPE_EXTERNAL)]);
    let allowed: Vec<String> = d.source_ranges.iter().map(|r| r.net.to_string()).collect();
    assert_eq!(
        allowed,
        vec!["192.0.2.0/24", "198.51.100.10/32", "192.168.1.10/32"]
    );
    assert!(d
        .source_ranges
        .iter()
        .all(|r| r.frontend.scope == SCOPE_EXTERNAL && r.frontend.addr[0] == lb));
    let key = d.source_ranges[0].key();
    assert_eq!(key.prefix_len(), SRC_RANGE_FRONTEND_BITS + 24);
    assert_eq!(key.data().src[0], u32::from_ne_bytes([192, 0, 2, 0]));
}

#[test]
fn without_the_tc_path_the_lb_ip_is_still_guarded_but_lists_nothing() {
    let mut s = svc();
    s.load_balancer_ips = vec![ip("198.51.100.10")];
    s.source_ranges = vec!["192.0.2.0/24".parse().unwrap()];
    let d = compile(&s, &select(&s, &[ep(1, NODE)], NODE), &ctx(false));
    assert!(d.source_ranges.is_empty());
    assert!(d
        .frontends
        .iter()
        .any(|f| f.flags & SVC_F_SOURCE_RANGES != 0 && f.key.scope == SCOPE_SOCKET));
}

#[test]
fn maglev_sets_carry_the_selection_tables() {
    let mut s = svc();
    s.algorithm = Algorithm::Maglev;
    s.node_port = 30080;
    s.external_local = true;
    let eps = [ep(1, NODE), ep(2, "other"), ep(3, NODE)];
    let sel = crate::selection::with_maglev(&s, select(&s, &eps, NODE), Default::default());
    let d = compile(&s, &sel, &ctx(true));
    assert!(d.frontends.iter().all(|f| f.algorithm == ALG_MAGLEV));
    let cluster = d.maglev_table(SetKind::Cluster).expect("cluster table");
    assert_eq!(cluster.endpoints().len(), 3);
    assert_eq!(cluster.size(), 16381);
    // External sources under eTP Local: the local endpoints' own table.
    let external = d.maglev_table(SetKind::External).expect("external table");
    assert_eq!(last_octets(d.set(SetKind::External)), vec![1, 3]);
    assert_eq!(external.endpoints().len(), 2);
    assert!(d.maglev_table(SetKind::Cluster6).is_none());
    let rr = run(&svc(), &eps);
    assert!(SetKind::ALL.iter().all(|k| rr.maglev_table(*k).is_none()));
}
