use super::*;

/// The parts of an `ip kpr` table that `nft -j list table ip kpr` printed for: web 10.96.0.10:80
/// (NodePort 30080) with two endpoints, empty 10.96.0.11:80 with none, sticky 10.96.0.12:80
/// with session affinity, and lb 192.0.2.10:80 with loadBalancerSourceRanges 198.51.100.0/24.
const TABLE: &str = r#"{"nftables": [
 {"metainfo": {"version": "1.0.6"}},
 {"table": {"family": "ip", "name": "kpr", "handle": 1}},
 {"set": {"family": "ip", "name": "cluster_cidrs", "table": "kpr", "type": "ipv4_addr", "flags": ["interval"], "elem": [{"prefix": {"addr": "10.244.0.0", "len": 16}}]}},
 {"set": {"family": "ip", "name": "node_srcs", "table": "kpr", "type": "ipv4_addr", "flags": ["interval"], "elem": ["192.168.77.2", {"prefix": {"addr": "127.0.0.0", "len": 8}}]}},
 {"set": {"family": "ip", "name": "nodeport_ips", "table": "kpr", "type": "ipv4_addr", "flags": ["interval"], "elem": ["192.168.77.2"]}},
 {"set": {"family": "ip", "name": "service_cidrs", "table": "kpr", "type": "ipv4_addr", "flags": ["interval"], "elem": [{"prefix": {"addr": "10.96.0.0", "len": 16}}]}},
 {"set": {"family": "ip", "name": "cluster_ips", "table": "kpr", "type": "ipv4_addr", "elem": ["10.96.0.10", "10.96.0.11", "10.96.0.12"]}},
 {"map": {"family": "ip", "name": "fe", "table": "kpr", "type": ["ipv4_addr", "inet_proto", "inet_service"], "map": "mark", "elem": [[{"concat": ["10.96.0.10", "tcp", 80]}, 2], [{"concat": ["10.96.0.11", "tcp", 80]}, 1], [{"concat": ["10.96.0.12", "tcp", 80]}, 3], [{"concat": ["192.0.2.10", "tcp", 80]}, 2]]}},
 {"map": {"family": "ip", "name": "np", "table": "kpr", "type": ["inet_proto", "inet_service"], "map": "mark", "elem": [[{"concat": ["tcp", 30080]}, 2]]}},
 {"set": {"family": "ip", "name": "npmasq_ext", "table": "kpr", "type": ["inet_proto", "inet_service"], "elem": [{"concat": ["tcp", 30080]}]}},
 {"set": {"family": "ip", "name": "fw_protected", "table": "kpr", "type": ["ipv4_addr", "inet_proto", "inet_service"], "elem": [{"concat": ["192.0.2.10", "tcp", 80]}]}},
 {"set": {"family": "ip", "name": "fw_allowed", "table": "kpr", "type": ["ipv4_addr", "inet_proto", "inet_service", "ipv4_addr"], "flags": ["interval"], "elem": [{"concat": ["192.0.2.10", "tcp", 80, {"prefix": {"addr": "198.51.100.0", "len": 24}}]}]}},
 {"map": {"family": "ip", "name": "targets", "table": "kpr", "type": "mark", "map": "verdict", "elem": [[1, {"goto": {"target": "empty_reject"}}]]}},
 {"map": {"family": "ip", "name": "aff_lookup", "table": "kpr", "type": "mark", "map": "verdict", "elem": [[3, {"jump": {"target": "aff_10800"}}]]}},
 {"map": {"family": "ip", "name": "aff_10800", "table": "kpr", "type": ["mark", "ipv4_addr"], "map": "ipv4_addr", "flags": ["timeout", "dynamic"], "elem": [[{"elem": {"val": {"concat": [3, "10.244.7.7"]}, "timeout": 10800, "expires": 10700}}, "10.244.2.6"]]}},
 {"map": {"family": "ip", "name": "affp_10800", "table": "kpr", "type": ["mark", "ipv4_addr"], "map": "inet_service", "flags": ["timeout", "dynamic"], "elem": [[{"elem": {"val": {"concat": [3, "10.244.7.7"]}, "timeout": 10800, "expires": 10700}}, 8080]]}},
 {"set": {"family": "ip", "name": "rr_n2", "table": "kpr", "type": "mark", "elem": [2, 3]}},
 {"map": {"family": "ip", "name": "slots_tcp_2", "table": "kpr", "type": ["mark", "integer"], "map": ["ipv4_addr", "inet_service"], "elem": [[{"concat": [2, 0]}, {"concat": ["10.244.1.5", 8080]}], [{"concat": [2, 1]}, {"concat": ["10.244.2.6", 8080]}]]}},
 {"map": {"family": "ip", "name": "slots_tcp_3", "table": "kpr", "type": ["mark", "integer"], "map": ["ipv4_addr", "inet_service"], "elem": [[{"concat": [3, 0]}, {"concat": ["10.244.1.5", 8080]}], [{"concat": [3, 1]}, {"concat": ["10.244.2.6", 8080]}]]}}
]}"#;

fn run(src: &str, dst: &str, port: u16) -> Trace {
    let t = TableSnapshot::parse(TABLE).unwrap();
    trace(
        &t,
        &TraceRequest {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            port,
            proto: Protocol::Tcp,
        },
    )
}

fn eps(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn a_pod_to_a_cluster_ip_gets_the_round_robin_slots() {
    let t = run("10.244.3.3", "10.96.0.10", 80);
    assert_eq!(
        t.decision,
        Decision::Dnat {
            endpoints: eps(&["10.244.1.5:8080", "10.244.2.6:8080"]),
            how: "round robin over 2 slots".into()
        }
    );
    assert!(t.steps[0].contains("from_pod"), "{:?}", t.steps);
    assert!(t.steps.iter().any(|s| s.contains("in @fe -> ct mark 2")));
    assert!(t
        .steps
        .iter()
        .any(|s| s.contains("rrb_2") && s.contains("@rr_n2")));
    assert!(!t.masquerade);
}

#[test]
fn empty_services_reject_and_unknown_addresses_are_told_apart() {
    assert_eq!(
        run("10.244.3.3", "10.96.0.11", 80).decision,
        Decision::Reject("the Service has no usable endpoint".into())
    );
    assert!(matches!(
        run("10.244.3.3", "10.96.0.10", 81).decision,
        Decision::Reject(_)
    ));
    assert!(matches!(
        run("10.244.3.3", "10.96.9.9", 80).decision,
        Decision::Drop(_)
    ));
    assert_eq!(
        run("10.244.3.3", "10.1.1.1", 80).decision,
        Decision::Untouched
    );
}

#[test]
fn affinity_entries_pick_the_clients_endpoint() {
    let t = run("10.244.7.7", "10.96.0.12", 80);
    assert_eq!(
        t.decision,
        Decision::Dnat {
            endpoints: eps(&["10.244.2.6:8080"]),
            how: "session affinity".into()
        }
    );
    let other = run("10.244.8.8", "10.96.0.12", 80);
    assert!(other
        .steps
        .iter()
        .any(|s| s.contains("no entry for [3 . 10.244.8.8]")));
    assert!(matches!(other.decision, Decision::Dnat { ref endpoints, .. } if endpoints.len() == 2));
}

#[test]
fn node_ports_masquerade_external_clients_and_source_ranges_filter() {
    let t = run("203.0.113.9", "192.168.77.2", 30080);
    assert!(t.steps[0].contains("from_ext"));
    assert!(t.masquerade);
    assert!(matches!(t.decision, Decision::Dnat { .. }));
    assert_eq!(
        run("203.0.113.9", "192.0.2.10", 80).decision,
        Decision::Drop("loadBalancerSourceRanges".into())
    );
    assert!(matches!(
        run("198.51.100.7", "192.0.2.10", 80).decision,
        Decision::Dnat { .. }
    ));
    assert!(matches!(
        run("192.168.77.2", "192.0.2.10", 80).decision,
        Decision::Dnat { .. }
    ));
}
