//! Case-by-case tests of docs/SERVICE-SEMANTICS.md "Choosing endpoints" and masquerade rules.

use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::model::{Algorithm, Protocol, ServicePortName};

const NODE: &str = "node-a";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn svc(internal_local: bool, external_local: bool) -> ServicePort {
    ServicePort {
        name: ServicePortName::new("default", "web", "", Protocol::Tcp),
        cluster_ips: vec![ip("10.96.0.10")],
        port: 80,
        protocol: Protocol::Tcp,
        node_port: 30080,
        external_ips: vec![],
        load_balancer_ips: vec![],
        source_ranges: vec![],
        affinity: None,
        external_local,
        internal_local,
        health_check_node_port: 0,
        algorithm: Algorithm::RoundRobin,
    }
}

/// `state` is one of "ready", "terminating-serving", "terminating", "notready".
fn ep(last_octet: u8, node: &str, state: &str) -> Endpoint {
    let (ready, serving, terminating) = match state {
        "ready" => (true, true, false),
        "terminating-serving" => (false, true, true),
        "terminating" => (false, false, true),
        "notready" => (false, false, false),
        other => panic!("unknown endpoint state {other}"),
    };
    Endpoint {
        addr: IpAddr::V4(Ipv4Addr::new(10, 244, 0, last_octet)),
        port: 8080,
        node: Some(node.into()),
        zone: None,
        ready,
        serving,
        terminating,
        hints: None,
    }
}

fn octets(eps: &[Endpoint]) -> Vec<u8> {
    eps.iter()
        .map(|e| match e.addr {
            IpAddr::V4(v4) => v4.octets()[3],
            IpAddr::V6(_) => unreachable!(),
        })
        .collect()
}

fn ctx() -> NodeContext {
    NodeContext {
        node_name: NODE.into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        node_ips: vec![ip("192.0.2.10")],
        masquerade_all: false,
        zone: None,
        maglev_table_size: Default::default(),
    }
}

struct SelectCase {
    name: &'static str,
    internal_local: bool,
    external_local: bool,
    endpoints: Vec<Endpoint>,
    cluster: Vec<u8>,
    external: Vec<u8>,
    cluster_empty: EmptyVerdict,
    external_empty: EmptyVerdict,
}

#[test]
fn selection_rules_case_by_case() {
    let cases = vec![
        SelectCase {
            name: "ready endpoints are used, not-ready ones are not",
            internal_local: false,
            external_local: false,
            endpoints: vec![
                ep(1, NODE, "ready"),
                ep(2, "b", "notready"),
                ep(3, "b", "ready"),
            ],
            cluster: vec![1, 3],
            external: vec![1, 3],
            cluster_empty: EmptyVerdict::Reject,
            external_empty: EmptyVerdict::Reject,
        },
        SelectCase {
            name: "serving-terminating ignored while any endpoint is ready",
            internal_local: false,
            external_local: false,
            endpoints: vec![ep(1, NODE, "terminating-serving"), ep(2, "b", "ready")],
            cluster: vec![2],
            external: vec![2],
            cluster_empty: EmptyVerdict::Reject,
            external_empty: EmptyVerdict::Reject,
        },
        SelectCase {
            name: "no ready endpoint: fall back to serving-terminating ones",
            internal_local: false,
            external_local: false,
            endpoints: vec![
                ep(1, NODE, "terminating-serving"),
                ep(2, "b", "terminating"),
                ep(3, "b", "notready"),
            ],
            cluster: vec![1],
            external: vec![1],
            cluster_empty: EmptyVerdict::Reject,
            external_empty: EmptyVerdict::Reject,
        },
        SelectCase {
            name: "terminating but not serving is never used",
            internal_local: false,
            external_local: false,
            endpoints: vec![ep(1, NODE, "terminating"), ep(2, "b", "notready")],
            cluster: vec![],
            external: vec![],
            cluster_empty: EmptyVerdict::Reject,
            external_empty: EmptyVerdict::Reject,
        },
        SelectCase {
            name: "internalTrafficPolicy Local keeps only local endpoints for cluster traffic",
            internal_local: true,
            external_local: false,
            endpoints: vec![ep(1, NODE, "ready"), ep(2, "b", "ready")],
            cluster: vec![1],
            external: vec![1, 2],
            cluster_empty: EmptyVerdict::Drop,
            external_empty: EmptyVerdict::Reject,
        },
        SelectCase {
            name: "iTP Local with endpoints only elsewhere: empty, dropped not rejected",
            internal_local: true,
            external_local: false,
            endpoints: vec![ep(2, "b", "ready")],
            cluster: vec![],
            external: vec![2],
            cluster_empty: EmptyVerdict::Drop,
            external_empty: EmptyVerdict::Reject,
        },
        SelectCase {
            name: "eTP Local keeps only local ready endpoints for external traffic",
            internal_local: false,
            external_local: true,
            endpoints: vec![ep(1, NODE, "ready"), ep(2, "b", "ready")],
            cluster: vec![1, 2],
            external: vec![1],
            cluster_empty: EmptyVerdict::Reject,
            external_empty: EmptyVerdict::Drop,
        },
        SelectCase {
            name:
                "eTP Local falls back to local serving-terminating even when remote ones are ready",
            internal_local: false,
            external_local: true,
            endpoints: vec![ep(1, NODE, "terminating-serving"), ep(2, "b", "ready")],
            cluster: vec![2],
            external: vec![1],
            cluster_empty: EmptyVerdict::Reject,
            external_empty: EmptyVerdict::Drop,
        },
        SelectCase {
            name: "no endpoints at all: both sets empty and rejected even under Local policies",
            internal_local: true,
            external_local: true,
            endpoints: vec![],
            cluster: vec![],
            external: vec![],
            cluster_empty: EmptyVerdict::Reject,
            external_empty: EmptyVerdict::Reject,
        },
    ];
    for case in cases {
        let s = svc(case.internal_local, case.external_local);
        let sel = select(&s, &case.endpoints, NODE);
        assert_eq!(
            octets(&sel.cluster),
            case.cluster,
            "{}: cluster set",
            case.name
        );
        assert_eq!(
            octets(&sel.external),
            case.external,
            "{}: external set",
            case.name
        );
        assert_eq!(
            sel.empty_verdict(case.internal_local),
            case.cluster_empty,
            "{}: cluster verdict",
            case.name
        );
        assert_eq!(
            sel.empty_verdict(case.external_local),
            case.external_empty,
            "{}: external verdict",
            case.name
        );
    }
}

struct RouteCase {
    name: &'static str,
    external_local: bool,
    src: &'static str,
    dest: DestKind,
    endpoints: Vec<u8>,
    masquerade: bool,
}

#[test]
fn routing_and_masquerade_case_by_case() {
    let endpoints = vec![ep(1, NODE, "ready"), ep(2, "b", "ready")];
    let cases = vec![
        RouteCase {
            name: "pod to clusterIP: all endpoints, no SNAT",
            external_local: false,
            src: "10.244.5.5",
            dest: DestKind::ClusterIp,
            endpoints: vec![1, 2],
            masquerade: false,
        },
        RouteCase {
            name: "node to clusterIP: no SNAT needed",
            external_local: false,
            src: "192.0.2.10",
            dest: DestKind::ClusterIp,
            endpoints: vec![1, 2],
            masquerade: false,
        },
        RouteCase {
            name: "outside cluster CIDR to clusterIP: SNAT",
            external_local: false,
            src: "198.51.100.7",
            dest: DestKind::ClusterIp,
            endpoints: vec![1, 2],
            masquerade: true,
        },
        RouteCase {
            name: "external to nodePort, eTP Cluster: all endpoints, SNAT",
            external_local: false,
            src: "198.51.100.7",
            dest: DestKind::NodePort,
            endpoints: vec![1, 2],
            masquerade: true,
        },
        RouteCase {
            name: "external to nodePort, eTP Local: local only, client IP kept",
            external_local: true,
            src: "198.51.100.7",
            dest: DestKind::NodePort,
            endpoints: vec![1],
            masquerade: false,
        },
        RouteCase {
            name: "external to LB IP, eTP Local: local only, client IP kept",
            external_local: true,
            src: "198.51.100.7",
            dest: DestKind::LoadBalancer,
            endpoints: vec![1],
            masquerade: false,
        },
        RouteCase {
            name: "pod to externalIP, eTP Local: short-circuit to cluster endpoints",
            external_local: true,
            src: "10.244.5.5",
            dest: DestKind::ExternalIp,
            endpoints: vec![1, 2],
            masquerade: false,
        },
        RouteCase {
            name: "node to nodePort, eTP Local: cluster endpoints, SNAT",
            external_local: true,
            src: "192.0.2.10",
            dest: DestKind::NodePort,
            endpoints: vec![1, 2],
            masquerade: true,
        },
        RouteCase {
            name: "pod to nodePort, eTP Cluster: SNAT like kube-proxy",
            external_local: false,
            src: "10.244.5.5",
            dest: DestKind::NodePort,
            endpoints: vec![1, 2],
            masquerade: true,
        },
    ];
    let ctx = ctx();
    for case in cases {
        let s = svc(false, case.external_local);
        let sel = select(&s, &endpoints, NODE);
        let r = route(&s, &sel, &ctx, ip(case.src), case.dest);
        assert_eq!(
            octets(r.endpoints),
            case.endpoints,
            "{}: endpoints",
            case.name
        );
        assert_eq!(r.masquerade, case.masquerade, "{}: masquerade", case.name);
    }
}

#[test]
fn masquerade_all_snats_everything() {
    let mut c = ctx();
    c.masquerade_all = true;
    let s = svc(false, false);
    let sel = select(&s, &[ep(1, NODE, "ready")], NODE);
    assert!(route(&s, &sel, &c, ip("10.244.5.5"), DestKind::ClusterIp).masquerade);
}

#[test]
fn hairpin_is_an_endpoint_reaching_itself() {
    let e = ep(1, NODE, "ready");
    assert!(is_hairpin(ip("10.244.0.1"), &e));
    assert!(!is_hairpin(ip("10.244.0.2"), &e));
}

#[test]
fn health_check_counts_local_ready_only() {
    let s = svc(false, true);
    let sel = select(
        &s,
        &[
            ep(1, NODE, "ready"),
            ep(2, NODE, "terminating-serving"),
            ep(3, "b", "ready"),
        ],
        NODE,
    );
    assert_eq!(sel.local_ready, [1, 0]);
    let sel = select(&s, &[ep(2, NODE, "terminating-serving")], NODE);
    assert_eq!(
        sel.local_ready,
        [0, 0],
        "all local endpoints terminating: health check says 503"
    );
}

#[test]
fn source_classification() {
    let c = ctx();
    assert_eq!(c.source_kind(ip("10.244.3.3")), SourceKind::Pod);
    assert_eq!(c.source_kind(ip("192.0.2.10")), SourceKind::Node);
    assert_eq!(c.source_kind(ip("127.0.0.1")), SourceKind::Node);
    assert_eq!(c.source_kind(ip("198.51.100.1")), SourceKind::External);
}

/// `ep` with topology hints.
fn hinted(last_octet: u8, node: &str, state: &str, zones: &[&str], nodes: &[&str]) -> Endpoint {
    Endpoint {
        hints: Some(Arc::new(crate::model::Hints {
            zones: zones.iter().map(|z| Name::from(*z)).collect(),
            nodes: nodes.iter().map(|n| Name::from(*n)).collect(),
        })),
        ..ep(last_octet, node, state)
    }
}

#[test]
fn zone_hints_keep_cluster_traffic_in_the_nodes_zone() {
    let s = svc(false, false);
    let eps = [
        hinted(1, "b", "ready", &["z1"], &[]),
        hinted(2, "c", "ready", &["z2"], &[]),
        hinted(3, "d", "ready", &["z1"], &[]),
    ];
    let sel = select_in(&s, &eps, NODE, Some("z1"));
    assert_eq!(octets(&sel.cluster), [1, 3]);
    assert_eq!(
        octets(&sel.external),
        [1, 3],
        "eTP Cluster uses the same set"
    );
    // No endpoint for this zone, or no zone label on the node: hints are ignored.
    assert_eq!(
        octets(&select_in(&s, &eps, NODE, Some("z3")).cluster),
        [1, 2, 3]
    );
    assert_eq!(octets(&select_in(&s, &eps, NODE, None).cluster), [1, 2, 3]);
}

#[test]
fn one_ready_endpoint_without_hints_disables_them() {
    let s = svc(false, false);
    let eps = [
        hinted(1, "b", "ready", &["z1"], &[]),
        ep(2, "c", "ready"),
        // Not ready: its missing hint does not count.
        ep(3, "c", "notready"),
    ];
    assert_eq!(
        octets(&select_in(&s, &eps, NODE, Some("z1")).cluster),
        [1, 2]
    );
    let eps = [
        hinted(1, "b", "ready", &["z1"], &[]),
        ep(3, "c", "notready"),
    ];
    assert_eq!(octets(&select_in(&s, &eps, NODE, Some("z1")).cluster), [1]);
}

#[test]
fn node_hints_win_over_zone_hints_and_local_policies_over_both() {
    let eps = [
        hinted(1, NODE, "ready", &["z1"], &[NODE]),
        hinted(2, "b", "ready", &["z1"], &["b"]),
    ];
    let sel = select_in(&svc(false, false), &eps, NODE, Some("z1"));
    assert_eq!(octets(&sel.cluster), [1]);
    // Hinted for another node only: the zone hints decide.
    let sel = select_in(&svc(false, false), &eps, "c", Some("z1"));
    assert_eq!(octets(&sel.cluster), [1, 2]);
    // internalTrafficPolicy Local: local endpoints, whatever the hints.
    let eps = [
        hinted(1, NODE, "ready", &["z2"], &[]),
        hinted(2, "b", "ready", &["z1"], &[]),
    ];
    let sel = select_in(&svc(true, false), &eps, NODE, Some("z1"));
    assert_eq!(octets(&sel.cluster), [1]);
    assert_eq!(
        octets(&sel.external),
        [2],
        "eTP Cluster: the zone's endpoints"
    );
}

#[test]
fn hints_never_hide_that_endpoints_exist_elsewhere() {
    // Only terminating endpoints: hints are about ready ones, the fallback ignores them.
    let s = svc(false, false);
    let eps = [hinted(1, "b", "terminating-serving", &["z2"], &[])];
    let sel = select_in(&s, &eps, NODE, Some("z1"));
    assert_eq!(octets(&sel.cluster), [1]);
    assert!(sel.any_usable);
}
