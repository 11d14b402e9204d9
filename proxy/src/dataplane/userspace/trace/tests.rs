use super::*;

/// The parts of `nft -j list table ip kpr-userspace` for: web 10.96.0.10:80/TCP (NodePort
/// 30080) with endpoints, dns 10.96.0.53:53/UDP (its UDP socket :41000), empty 10.96.0.11:80
/// with none, local 10.96.0.12:80 NodePort 30082 under eTP Local with no endpoint anywhere.
const TABLE: &str = r#"{"nftables": [
 {"metainfo": {"version": "1.0.6"}},
 {"table": {"family": "ip", "name": "kpr-userspace", "handle": 3}},
 {"set": {"family": "ip", "name": "svc_tcp", "table": "kpr-userspace", "type": ["ipv4_addr", "inet_service"], "elem": [{"concat": ["10.96.0.10", 80]}]}},
 {"map": {"family": "ip", "name": "svc_udp", "table": "kpr-userspace", "type": ["ipv4_addr", "inet_service"], "map": "inet_service", "elem": [[{"concat": ["10.96.0.53", 53]}, 41000]]}},
 {"set": {"family": "ip", "name": "np_tcp", "table": "kpr-userspace", "type": "inet_service", "elem": [30080]}},
 {"set": {"family": "ip", "name": "np_ips", "table": "kpr-userspace", "type": "ipv4_addr", "elem": ["192.0.2.1"]}},
 {"set": {"family": "ip", "name": "svc_reject", "table": "kpr-userspace", "type": ["ipv4_addr", "inet_proto", "inet_service"], "elem": [{"concat": ["10.96.0.11", "tcp", 80]}]}},
 {"set": {"family": "ip", "name": "svc_drop", "table": "kpr-userspace", "type": ["ipv4_addr", "inet_proto", "inet_service"]}},
 {"set": {"family": "ip", "name": "np_drop", "table": "kpr-userspace", "type": ["inet_proto", "inet_service"], "elem": [{"concat": ["tcp", 30082]}]}},
 {"set": {"family": "ip", "name": "svc_ports", "table": "kpr-userspace", "type": ["ipv4_addr", "inet_proto", "inet_service"], "elem": [{"concat": ["10.96.0.10", "tcp", 80]}, {"concat": ["10.96.0.53", "udp", 53]}, {"concat": ["10.96.0.11", "tcp", 80]}]}},
 {"set": {"family": "ip", "name": "cluster_ips", "table": "kpr-userspace", "type": "ipv4_addr", "elem": ["10.96.0.10", "10.96.0.11", "10.96.0.53"]}},
 {"set": {"family": "ip", "name": "service_cidrs", "table": "kpr-userspace", "type": "ipv4_addr", "flags": ["interval"], "elem": [{"prefix": {"addr": "10.96.0.0", "len": 16}}]}}
]}"#;

fn run(dst: &str, port: u16, proto: Protocol) -> (KernelVerdict, Vec<String>) {
    let t = TableSnapshot::parse(TABLE).unwrap();
    let q = TraceQuery {
        src: "10.244.200.2".parse().unwrap(),
        src_port: None,
        dst: dst.parse().unwrap(),
        port,
        proto,
    };
    let mut steps = Vec::new();
    (kernel(&t, &q, &mut steps), steps)
}

#[test]
fn the_table_redirects_rejects_and_drops_as_the_kernel_would() {
    let (v, steps) = run("10.96.0.10", 80, Protocol::Tcp);
    assert_eq!(v, KernelVerdict::Redirect("the TCP listener".into()));
    assert!(steps[0].contains("@svc_tcp"), "{steps:?}");
    let (v, _) = run("10.96.0.53", 53, Protocol::Udp);
    assert_eq!(
        v,
        KernelVerdict::Redirect("the Service port's UDP socket :41000".into())
    );
    let (v, _) = run("192.0.2.1", 30080, Protocol::Tcp);
    assert_eq!(v, KernelVerdict::Redirect("the TCP listener".into()));
    let (v, _) = run("10.96.0.11", 80, Protocol::Tcp);
    assert_eq!(
        v,
        KernelVerdict::Reject("the Service has no usable endpoint".into())
    );
    let (v, _) = run("192.0.2.1", 30082, Protocol::Tcp);
    assert!(matches!(v, KernelVerdict::Drop(_)), "{v:?}");
    let (v, _) = run("10.96.0.10", 81, Protocol::Tcp);
    assert_eq!(
        v,
        KernelVerdict::Reject("a clusterIP port the Service does not have".into())
    );
    let (v, _) = run("10.96.0.10", 80, Protocol::Udp);
    assert!(
        matches!(v, KernelVerdict::Reject(_)),
        "UDP to a TCP port: {v:?}"
    );
    let (v, _) = run("10.96.0.99", 80, Protocol::Tcp);
    assert_eq!(
        v,
        KernelVerdict::Drop("an unallocated address of the Service CIDR".into())
    );
    let (v, _) = run("192.0.2.1", 22, Protocol::Tcp);
    assert_eq!(v, KernelVerdict::Untouched);
}
