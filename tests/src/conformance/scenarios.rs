//! The scenario table: every rule of docs/SERVICE-SEMANTICS.md as Services + EndpointSlices, then
//! steps (connections from a pod, the node, an endpoint or an external client) with the expected
//! outcome. Pod `i` is `pod<i>` at `10.244.(i+1).2`, its echo server on 8080; the node is `node`.

use super::{Expect, From, Probe, Proto, Scenario, Src, Step, UdpFlow};
use crate::manifest::{yaml, Endpoint, EndpointSlice, Service};

const VIP: &str = "10.96.0.10:80";
const NODE_PORT: &str = "192.0.2.1:30080";
const ALL: &[&str] = &["pod0", "pod1", "pod2", "pod3"];
const WEB: &str = "default/web:http/TCP";

/// Pod `i`'s address.
pub fn pod_ip(i: usize) -> String {
    format!("10.244.{}.2", i + 1)
}

/// `web`: clusterIP 10.96.0.10:80 -> 8080 (port `http`), NodePort 30080.
pub fn web() -> Service {
    Service::new("web")
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .named("http")
        .node_port(30080)
}

fn with_ready(svc: Service, pods: &[usize]) -> String {
    let slice = pods
        .iter()
        .fold(EndpointSlice::for_service(&svc), |s, &i| s.ready(pod_ip(i)));
    yaml(&[&svc, &slice])
}

fn with(svc: Service, endpoints: Vec<Endpoint>) -> String {
    let slice = endpoints
        .into_iter()
        .fold(EndpointSlice::for_service(&svc), |s, e| s.endpoint(e));
    yaml(&[&svc, &slice])
}

fn web_all() -> String {
    with_ready(web(), &[0, 1, 2, 3])
}

fn web_pod0() -> String {
    with_ready(web(), &[0])
}

fn web_none() -> String {
    with_ready(web(), &[])
}

/// `count` back-to-back TCP connections.
fn probe_of(from: From, to: &'static str, count: usize, expect: Expect) -> Probe {
    Probe {
        from,
        proto: Proto::Tcp,
        to,
        count,
        every_ms: 0,
        expect,
    }
}

fn probe(from: From, to: &'static str, count: usize, expect: Expect) -> Step {
    Step::Probe(probe_of(from, to, count, expect))
}

fn udp(from: From, to: &'static str, count: usize, expect: Expect) -> Step {
    Step::Probe(Probe {
        proto: Proto::Udp,
        ..probe_of(from, to, count, expect)
    })
}

const fn served(pods: &'static [&'static str], src: Src) -> Expect {
    Expect::Served {
        pods,
        all_seen: true,
        src,
    }
}

/// Answered, each time by one of `pods` (one flow sticks to one of them).
const fn by_one_of(pods: &'static [&'static str]) -> Expect {
    Expect::Served {
        pods,
        all_seen: false,
        src: Src::Any,
    }
}

const DNS_VIP: &str = "10.96.0.53:53";
const DNS: &str = "default/dns:dns/UDP";

/// `dns`: UDP clusterIP 10.96.0.53:53 -> 8080 (port `dns`).
fn dns() -> Service {
    Service::new("dns")
        .cluster_ip("10.96.0.53")
        .udp(53, 8080)
        .named("dns")
}

/// The table. Each entry names the docs/SERVICE-SEMANTICS.md rule(s) it checks.
pub fn all() -> Vec<Scenario> {
    let mut v = destinations();
    v.extend(selection());
    v.extend(balancing());
    v.extend(translation());
    v.extend(conntrack());
    v.extend(health_check());
    v.extend(inputs());
    v
}

fn destinations() -> Vec<Scenario> {
    vec![
        // Destinations: clusterIP:port for everyone on the node (pod source keeps its address).
        Scenario::new("cluster_ip_from_pod", web_all).steps(vec![probe(
            From::Pod,
            VIP,
            8,
            served(ALL, Src::Preserved),
        )]),
        // Destinations: clusterIP:port from the node itself.
        Scenario::new("cluster_ip_from_node", web_all).steps(vec![probe(
            From::Node,
            VIP,
            8,
            served(ALL, Src::Any),
        )]),
        // Destinations: nodeIP:nodePort for everyone; masquerade: external traffic, eTP Cluster.
        Scenario::new("node_port_from_external", web_all).steps(vec![probe(
            From::External,
            NODE_PORT,
            8,
            served(ALL, Src::Masqueraded),
        )]),
        // Destinations: nodeIP:nodePort from the node itself.
        Scenario::new("node_port_from_node", web_all).steps(vec![probe(
            From::Node,
            NODE_PORT,
            8,
            served(ALL, Src::Any),
        )]),
        // Destinations: nodePort only on --nodeport-addresses (192.0.2.1/32): the node's pod-side
        // address 10.244.201.1 is not one of them, so nothing answers there (nothing listens).
        Scenario::new("node_port_only_on_nodeport_addresses", web_all).steps(vec![
            probe(From::Pod, "10.244.200.1:30080", 1, Expect::NotServed),
            probe(From::Pod, NODE_PORT, 4, served(ALL, Src::Any)),
        ]),
        // Destinations: externalIP:port for everyone; masquerade for external sources.
        Scenario::new("external_ip", || {
            with_ready(web().external_ip("203.0.113.10"), &[0, 1, 2, 3])
        })
        .steps(vec![
            probe(
                From::External,
                "203.0.113.10:80",
                8,
                served(ALL, Src::Masqueraded),
            ),
            // A pod source to an external destination: the contract does not say whether it is
            // masqueraded (kube-proxy does under eTP Cluster; the eBPF socket path does not).
            probe(From::Pod, "203.0.113.10:80", 8, served(ALL, Src::Any)),
        ]),
        // Destinations: LoadBalancer ingress IP:port, no source ranges.
        Scenario::new("load_balancer_ip", || {
            with_ready(web().load_balancer("198.51.100.10"), &[0, 1, 2, 3])
        })
        .steps(vec![probe(
            From::External,
            "198.51.100.10:80",
            8,
            served(ALL, Src::Masqueraded),
        )]),
        // Destinations: LB IP with loadBalancerSourceRanges containing the client.
        Scenario::new("load_balancer_source_range_allows", || {
            with_ready(
                web()
                    .load_balancer("198.51.100.10")
                    .lb_source_range("192.0.2.0/24"),
                &[0, 1, 2, 3],
            )
        })
        .steps(vec![probe(
            From::External,
            "198.51.100.10:80",
            8,
            served(ALL, Src::Masqueraded),
        )]),
        // Destinations: LB IP with loadBalancerSourceRanges not containing the client: dropped,
        // from outside and from a pod alike; the node itself is always allowed, and the
        // clusterIP still serves pods.
        Scenario::new("load_balancer_source_range_denies", || {
            with_ready(
                web()
                    .load_balancer("198.51.100.10")
                    .lb_source_range("203.0.113.0/24"),
                &[0, 1, 2, 3],
            )
        })
        .steps(vec![
            probe(From::External, "198.51.100.10:80", 1, Expect::Drop),
            probe(From::Pod, VIP, 4, served(ALL, Src::Preserved)),
            probe(From::Pod, "198.51.100.10:80", 1, Expect::Drop),
            probe(From::Node, "198.51.100.10:80", 4, served(ALL, Src::Any)),
        ]),
    ]
}

fn local_and_remote(svc: Service, local: &[usize], remote: &[usize]) -> String {
    let mut eps: Vec<Endpoint> = local.iter().map(|&i| Endpoint::ready(pod_ip(i))).collect();
    eps.extend(
        remote
            .iter()
            .map(|&i| Endpoint::ready(pod_ip(i)).on_node("other")),
    );
    with(svc, eps)
}

fn selection() -> Vec<Scenario> {
    vec![
        // Choosing 1: ready endpoints only; not-ready (not serving) endpoints are never used.
        Scenario::new("not_ready_endpoints_are_not_used", || {
            with(
                web(),
                vec![
                    Endpoint::not_ready(pod_ip(0)),
                    Endpoint::ready(pod_ip(1)),
                    Endpoint::not_ready(pod_ip(2)),
                    Endpoint::ready(pod_ip(3)),
                ],
            )
        })
        .steps(vec![probe(
            From::Pod,
            VIP,
            8,
            served(&["pod1", "pod3"], Src::Preserved),
        )]),
        // Choosing 1: ready endpoints are preferred over serving-terminating ones.
        Scenario::new("ready_preferred_over_terminating", || {
            with(
                web(),
                vec![Endpoint::ready(pod_ip(0)), Endpoint::terminating(pod_ip(1))],
            )
        })
        .steps(vec![probe(
            From::Pod,
            VIP,
            6,
            served(&["pod0"], Src::Preserved),
        )]),
        // Choosing 1: no ready endpoint -> fall back to serving+terminating ones.
        Scenario::new("terminating_fallback", || {
            with(
                web(),
                vec![
                    Endpoint::terminating(pod_ip(0)),
                    Endpoint::terminating(pod_ip(1)),
                    Endpoint::not_ready(pod_ip(2)),
                ],
            )
        })
        .steps(vec![probe(
            From::Pod,
            VIP,
            6,
            served(&["pod0", "pod1"], Src::Preserved),
        )]),
        // Choosing 1: internalTrafficPolicy Local -> only local endpoints.
        Scenario::new("internal_traffic_local", || {
            local_and_remote(web().internal_traffic_local(), &[0, 1], &[2, 3])
        })
        .steps(vec![probe(
            From::Pod,
            VIP,
            8,
            served(&["pod0", "pod1"], Src::Preserved),
        )]),
        // Choosing 3: iTP Local with endpoints elsewhere but none here -> dropped.
        Scenario::new("internal_traffic_local_none_here_drops", || {
            local_and_remote(web().internal_traffic_local(), &[], &[0, 1])
        })
        .steps(vec![probe(From::Pod, VIP, 1, Expect::Drop)]),
        // Choosing 2 + masquerade: eTP Local -> only local endpoints, client address kept.
        Scenario::new("external_traffic_local", || {
            local_and_remote(web().external_traffic_local(), &[0, 1], &[2, 3])
        })
        .steps(vec![probe(
            From::External,
            NODE_PORT,
            8,
            served(&["pod0", "pod1"], Src::Preserved),
        )]),
        // Choosing 2: eTP Local falls back to local serving-terminating endpoints.
        Scenario::new("external_traffic_local_terminating_fallback", || {
            with(
                web().external_traffic_local(),
                vec![
                    Endpoint::terminating(pod_ip(0)),
                    Endpoint::ready(pod_ip(1)).on_node("other"),
                ],
            )
        })
        .steps(vec![probe(
            From::External,
            NODE_PORT,
            4,
            served(&["pod0"], Src::Preserved),
        )]),
        // Choosing 3: eTP Local with endpoints elsewhere but none here -> dropped.
        Scenario::new("external_traffic_local_none_here_drops", || {
            local_and_remote(web().external_traffic_local(), &[], &[0, 1])
        })
        .steps(vec![probe(From::External, NODE_PORT, 1, Expect::Drop)]),
        // Choosing 2: a pod source to an external destination of an eTP Local Service is
        // short-circuited to all cluster endpoints.
        Scenario::new("external_traffic_local_pod_short_circuit", || {
            local_and_remote(web().external_traffic_local(), &[0], &[1, 2, 3])
        })
        .steps(vec![probe(From::Pod, NODE_PORT, 8, served(ALL, Src::Any))]),
        // Choosing 3: no usable endpoint -> actively rejected (clusterIP and nodePort).
        Scenario::new("reject_without_endpoints", web_none).steps(vec![
            probe(From::Pod, VIP, 1, Expect::Reject),
            probe(From::External, NODE_PORT, 1, Expect::Reject),
        ]),
        // Choosing 3 + inputs 1: a UDP port without endpoints is rejected (ICMP unreachable).
        Scenario::new("udp_without_endpoints_is_rejected", || {
            let svc = Service::new("dns")
                .cluster_ip("10.96.0.53")
                .udp(53, 8080)
                .named("dns");
            with_ready(svc, &[])
        })
        .steps(vec![udp(From::Pod, "10.96.0.53:53", 1, Expect::Reject)]),
        // Choosing 3: only not-ready endpoints is no usable endpoint -> rejected.
        Scenario::new("reject_with_only_not_ready_endpoints", || {
            with(web(), vec![Endpoint::not_ready(pod_ip(0))])
        })
        .steps(vec![probe(From::Pod, VIP, 1, Expect::Reject)]),
        // Choosing 3: an address in the service CIDR that belongs to no Service -> dropped.
        Scenario::new("drop_unallocated_service_address", web_all).steps(vec![
            probe(From::Pod, "10.96.0.99:80", 1, Expect::Drop),
            probe(From::Pod, VIP, 4, served(ALL, Src::Preserved)),
        ]),
        // Choosing 4: a port the Service does not expose on its clusterIP -> rejected.
        Scenario::new("port_not_exposed_is_rejected", web_all).steps(vec![probe(
            From::Pod,
            "10.96.0.10:81",
            1,
            Expect::Reject,
        )]),
        // Choosing 4: protocols match exactly; UDP to a TCP-only port is not served.
        Scenario::new("protocol_matched_exactly", web_all).steps(vec![udp(
            From::Pod,
            VIP,
            1,
            Expect::NotServed,
        )]),
    ]
}

fn lc_web() -> Service {
    web().balance("least-conn")
}

/// `web` over the pods `pods`, each in zone-a (pods 0 and 1) or zone-b and hinted for it, and the
/// node's own Node object in `node_zone`.
fn zoned(pods: &[usize], node_zone: &str) -> String {
    let svc = web();
    let slice = pods.iter().fold(EndpointSlice::for_service(&svc), |s, &i| {
        let zone = if i < 2 { "zone-a" } else { "zone-b" };
        s.endpoint(Endpoint::ready(pod_ip(i)).zone(zone).hint_zone(zone))
    });
    let node = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": crate::cluster::NODE_NAME,
                     "labels": {"topology.kubernetes.io/zone": node_zone}},
    });
    yaml(&[&svc, &slice, &node])
}

fn balancing() -> Vec<Scenario> {
    vec![
        // Balancing: round-robin, 400 connections over 4 endpoints = 100 +-1 each.
        Scenario::new("round_robin", web_all).steps(vec![
            probe(From::Pod, VIP, 400, Expect::Exact(ALL)),
            probe(From::External, NODE_PORT, 400, Expect::Exact(ALL)),
        ]),
        // Balancing: least-connection (annotation overrides the node default): five held
        // connections on pod0, then three idle endpoints join; new connections avoid pod0.
        Scenario::new("least_connection", || with_ready(lc_web(), &[0])).steps(vec![
            Step::Hold {
                from: From::Pod,
                to: VIP,
                count: 5,
                pods: &["pod0"],
            },
            Step::Update {
                manifests: || with_ready(lc_web(), &[0, 1, 2, 3]),
                service: WEB,
                endpoints: 4,
            },
            // Paced: a pick moves one conntrack event plus one dataplane update after each new
            // connection (module docs of conntrack::leastconn); under emulation (the VM matrix)
            // an iptables-restore takes longer than back-to-back connections.
            Step::Probe(Probe {
                every_ms: 400,
                ..probe_of(
                    From::Pod,
                    VIP,
                    12,
                    served(&["pod1", "pod2", "pod3"], Src::Preserved),
                )
            }),
        ]),
        // Balancing: least-connection under a burst. Eight connections opened back to back and
        // held, faster than conntrack events reach the rule backends: they must spread over the
        // four idle endpoints (round-robin gives two each), never pile onto one.
        Scenario::new("least_connection_burst", || {
            with_ready(lc_web(), &[0, 1, 2, 3])
        })
        .steps(vec![Step::Burst {
            from: From::Pod,
            to: VIP,
            count: 8,
            pods: ALL,
            min: 1,
            max: 3,
        }]),
        // Balancing: least-connection with short connections, unpaced: each closes before the
        // next opens, so every endpoint is always tied for least and the spread must stay close
        // to round-robin's (100 each).
        Scenario::new("least_connection_short_connections", || {
            with_ready(lc_web(), &[0, 1, 2, 3])
        })
        .steps(vec![probe(
            From::Pod,
            VIP,
            400,
            Expect::Spread {
                pods: ALL,
                min: 70,
                max: 130,
            },
        )]),
        // Balancing, topology: zone hints (trafficDistribution PreferClose) keep the node's
        // traffic in its zone (its Node manifest's label) while the zone has endpoints, then
        // every endpoint serves it; a relabelled node follows its new zone.
        Scenario::new("topology_zone_hints", || zoned(&[0, 1, 2, 3], "zone-a")).steps(vec![
            probe(From::Pod, VIP, 20, served(&["pod0", "pod1"], Src::Any)),
            probe(
                From::External,
                NODE_PORT,
                20,
                served(&["pod0", "pod1"], Src::Any),
            ),
            Step::Update {
                manifests: || zoned(&[2, 3], "zone-a"),
                service: WEB,
                endpoints: 2,
            },
            probe(From::Pod, VIP, 20, served(&["pod2", "pod3"], Src::Any)),
            Step::Update {
                manifests: || zoned(&[0, 1, 2, 3], "zone-b"),
                service: WEB,
                endpoints: 4,
            },
            probe(From::Pod, VIP, 20, served(&["pod2", "pod3"], Src::Any)),
        ]),
        // Balancing: session affinity ClientIP sticks per client.
        Scenario::new("session_affinity", || {
            with_ready(web().affinity(60), &[0, 1, 2, 3])
        })
        .steps(vec![
            probe(From::Pod, VIP, 20, Expect::Sticky),
            probe(From::External, NODE_PORT, 20, Expect::Sticky),
        ]),
        // Inputs 1 + balancing: UDP ports are translated and balanced.
        Scenario::new("udp", || {
            let svc = Service::new("dns")
                .cluster_ip("10.96.0.53")
                .udp(53, 8080)
                .named("dns");
            with_ready(svc, &[0, 1, 2, 3])
        })
        .steps(vec![udp(
            From::Pod,
            "10.96.0.53:53",
            8,
            served(ALL, Src::Preserved),
        )]),
    ]
}

fn translation() -> Vec<Scenario> {
    vec![
        // Masquerade: hairpin (an endpoint reaching itself through its own Service) is SNATed.
        Scenario::new("hairpin_is_masqueraded", web_pod0).steps(vec![probe(
            From::Endpoint(0),
            VIP,
            3,
            served(&["pod0"], Src::Masqueraded),
        )]),
        // Masquerade: pod-to-Service traffic to another pod keeps the pod's address.
        Scenario::new("pod_to_service_keeps_source", web_pod0).steps(vec![probe(
            From::Endpoint(1),
            VIP,
            3,
            served(&["pod0"], Src::Preserved),
        )]),
        // Agent: `proxy inspect`/`/state` shows the same Services and endpoints for every backend
        // (every backend is compared with this one table).
        Scenario::new("state_is_the_same_for_every_backend", || {
            let dns = Service::new("dns")
                .cluster_ip("10.96.0.53")
                .udp(53, 8080)
                .named("dns");
            format!(
                "{}---\n{}",
                with(
                    web(),
                    vec![
                        Endpoint::ready(pod_ip(0)),
                        Endpoint::terminating(pod_ip(1)),
                        Endpoint::not_ready(pod_ip(2)),
                    ]
                ),
                with_ready(dns, &[3])
            )
        })
        .steps(vec![Step::State(&[
            (
                WEB,
                &["10.244.1.2:8080", "10.244.2.2:8080", "10.244.3.2:8080"],
            ),
            ("default/dns:dns/UDP", &["10.244.4.2:8080"]),
        ])]),
    ]
}

fn conntrack() -> Vec<Scenario> {
    vec![
        // Translation: the UDP conntrack entries of an endpoint that went away are removed, so a
        // flow (one client socket) moves to the remaining endpoints instead of staying on it.
        Scenario::new("udp_flow_leaves_a_removed_endpoint", || {
            with_ready(dns(), &[0])
        })
        .steps(vec![Step::UdpFlow(UdpFlow {
            from: From::Pod,
            to: DNS_VIP,
            before: served(&["pod0"], Src::Any),
            update: || with_ready(dns(), &[1, 2]),
            service: DNS,
            endpoints: 2,
            after: by_one_of(&["pod1", "pod2"]),
        })]),
        // Translation: also when a Service goes from zero endpoints to some, the flow that was
        // rejected meanwhile is not black-holed. (Every backend rejects those datagrams before
        // conntrack confirms an entry for them, so there is no stale entry to begin with; the
        // scenario holds them to the outcome the users of kubernetes#59368 lacked.)
        Scenario::new("udp_flow_reaches_endpoints_that_appear", || {
            with_ready(dns(), &[])
        })
        .steps(vec![Step::UdpFlow(UdpFlow {
            from: From::Pod,
            to: DNS_VIP,
            before: Expect::NotServed,
            update: || with_ready(dns(), &[1]),
            service: DNS,
            endpoints: 1,
            after: served(&["pod1"], Src::Any),
        })]),
    ]
}

/// `web` as an eTP Local LoadBalancer Service with healthCheckNodePort 32000.
fn checked_web() -> Service {
    web()
        .load_balancer("198.51.100.10")
        .external_traffic_local()
        .health_check_node_port(32000)
}

fn health_check() -> Vec<Scenario> {
    vec![
        // Translation: healthCheckNodePort answers 200 with the count of local endpoints, and
        // 503 once no local endpoint is ready (here: the only local one is terminating).
        Scenario::new("health_check_node_port", || {
            local_and_remote(checked_web(), &[0, 1], &[2])
        })
        .steps(vec![
            Step::Http {
                from: From::External,
                to: "192.0.2.1:32000",
                status: 200,
                body: "\"localEndpoints\":2",
            },
            Step::Update {
                manifests: || {
                    with(
                        checked_web(),
                        vec![
                            Endpoint::terminating(pod_ip(0)),
                            Endpoint::ready(pod_ip(2)).on_node("other"),
                        ],
                    )
                },
                service: WEB,
                endpoints: 2,
            },
            Step::Http {
                from: From::External,
                to: "192.0.2.1:32000",
                status: 503,
                body: "\"localEndpoints\":0",
            },
        ]),
    ]
}

fn inputs() -> Vec<Scenario> {
    vec![
        // Inputs 1: SCTP ports are translated and balanced (clusterIP from a pod; its tests run
        // where the kernel has SCTP, see `needs_sctp`).
        Scenario::new("sctp", || {
            let svc = Service::new("assoc")
                .cluster_ip("10.96.0.60")
                .port(80, 8080, "SCTP")
                .named("assoc");
            with_ready(svc, &[0, 1, 2, 3])
        })
        .steps(vec![Step::Probe(Probe {
            from: From::Pod,
            proto: Proto::Sctp,
            to: "10.96.0.60:80",
            count: 8,
            every_ms: 0,
            expect: served(ALL, Src::Preserved),
        })]),
        // Inputs 1: headless Services (clusterIP None) and ExternalName Services are ignored.
        Scenario::new("headless_and_external_name_are_ignored", || {
            let headless = Service::new("db")
                .cluster_ip("None")
                .tcp(80, 8080)
                .named("http");
            let alias = Service::new("alias")
                .external_name("example.com")
                .tcp(80, 80)
                .named("http");
            format!(
                "{}---\n{}---\n{}",
                with_ready(headless, &[1]),
                yaml(&[&alias]),
                web_all()
            )
        })
        .steps(vec![
            Step::State(&[(
                WEB,
                &[
                    "10.244.1.2:8080",
                    "10.244.2.2:8080",
                    "10.244.3.2:8080",
                    "10.244.4.2:8080",
                ],
            )]),
            probe(From::Pod, VIP, 4, served(ALL, Src::Preserved)),
        ]),
        // Inputs 2: a Service labelled service-proxy-name belongs to another proxy: its
        // clusterIP is then an unallocated service address for us (dropped).
        Scenario::new("other_service_proxy_name_is_ignored", || {
            with_ready(
                web().label("service.kubernetes.io/service-proxy-name", "other"),
                &[0, 1],
            )
        })
        .steps(vec![probe(From::Pod, VIP, 1, Expect::Drop)]),
        // Inputs 5: a bad Service never stops the others.
        Scenario::new("bad_input_does_not_stop_other_services", || {
            let bad = Service::new("bad").cluster_ip("10.96.0.300").tcp(80, 8080);
            format!("{}---\n{}", with_ready(bad, &[1]), web_all())
        })
        .steps(vec![probe(From::Pod, VIP, 8, served(ALL, Src::Preserved))]),
    ]
}
