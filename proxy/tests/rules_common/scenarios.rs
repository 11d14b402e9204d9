//! Backend-independent scenarios: each takes a fresh [`Rig`] and asserts what a client observes.
//! `SCENARIOS` is the table a backend's test file runs (one `#[test]` per row).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use kpr_tests::cluster::{CLIENT_IP, NODE_IP};
use kpr_tests::{tcp_hold, tcp_request, udp_request, ClientError};
use proxy::model::{Algorithm, Protocol};

use super::{addr, service, tally, Rig, DROP_WAIT, TIMEOUT};

/// (name, pods the rig needs, scenario).
pub type Scenario = (&'static str, usize, fn(&mut Rig));

pub const SCENARIOS: &[Scenario] = &[
    (
        "round_robin_over_4_endpoints",
        4,
        round_robin_over_4_endpoints,
    ),
    ("reject_and_drop", 1, reject_and_drop),
    ("nodeport_and_masquerade", 2, nodeport_and_masquerade),
    ("least_conn_avoids_held", 3, least_conn_avoids_held),
    ("session_affinity", 3, session_affinity),
    (
        "load_balancer_source_ranges",
        1,
        load_balancer_source_ranges,
    ),
    ("udp_conntrack_cleanup", 2, udp_conntrack_cleanup),
    ("cleanup_and_leftovers", 1, cleanup_removes_translation),
    ("external_ip_and_hairpin", 2, external_ip_and_hairpin),
    (
        "udp_without_endpoints_is_rejected",
        1,
        udp_without_endpoints_is_rejected,
    ),
    (
        "interleaved_services_each_round_robin",
        4,
        interleaved_services_each_round_robin,
    ),
    ("terminating_fallback", 2, terminating_fallback),
];

/// 400 sequential connections over 4 endpoints: 100 (+-1) each.
pub fn round_robin_over_4_endpoints(rig: &mut Rig) {
    let svc = service("rr", "10.96.0.10", 80, Protocol::Tcp);
    let eps = rig.endpoints(&[0, 1, 2, 3], false);
    rig.set(svc, Some(eps));
    let target = addr("10.96.0.10", 80);
    let replies: Vec<String> = (0..400)
        .map(|i| {
            tcp_request(&rig.cluster.podclient, target, TIMEOUT)
                .unwrap_or_else(|e| panic!("request {i}: {e}"))
                .pod
        })
        .collect();
    let t = tally(replies);
    assert_eq!(t.len(), 4, "{t:?}");
    for (pod, n) in &t {
        assert!((99..=101).contains(n), "{pod} got {n}: {t:?}");
    }
}

/// No endpoints: rejected. Unexposed port on a clusterIP: rejected. Unallocated service
/// address: dropped (silence, not a rejection).
pub fn reject_and_drop(rig: &mut Rig) {
    rig.set(
        service("empty", "10.96.0.20", 80, Protocol::Tcp),
        Some(vec![]),
    );
    let eps = rig.endpoints(&[0], false);
    rig.set(service("one", "10.96.0.21", 80, Protocol::Tcp), Some(eps));
    let c = &rig.cluster.podclient;
    let e = tcp_request(c, addr("10.96.0.20", 80), TIMEOUT).unwrap_err();
    assert!(e.is_rejection(), "no endpoints: {e:?}");
    let e = tcp_request(&rig.cluster.node, addr("10.96.0.20", 80), TIMEOUT).unwrap_err();
    assert!(e.is_rejection(), "no endpoints, from the node: {e:?}");
    assert_eq!(
        tcp_request(c, addr("10.96.0.21", 80), TIMEOUT).unwrap().pod,
        "pod0"
    );
    let e = tcp_request(c, addr("10.96.0.21", 81), TIMEOUT).unwrap_err();
    assert!(e.is_rejection(), "unexposed port: {e:?}");
    let e = tcp_request(c, addr("10.96.0.99", 80), DROP_WAIT).unwrap_err();
    assert_eq!(e, ClientError::Timeout, "unallocated service address");
}

/// NodePort from outside: eTP Cluster masquerades (the pod sees a node address), eTP Local keeps
/// the client address, and eTP Local without a local endpoint drops external clients while pod
/// clients are short-circuited to the cluster endpoints.
pub fn nodeport_and_masquerade(rig: &mut Rig) {
    let mut svc = service("np", "10.96.0.30", 80, Protocol::Tcp);
    svc.node_port = 30080;
    let eps = rig.endpoints(&[0, 1], false);
    rig.set(svc.clone(), Some(eps));
    let np = std::net::SocketAddr::from((NODE_IP, 30080));
    for _ in 0..4 {
        let r = tcp_request(&rig.cluster.client, np, TIMEOUT).expect("nodeport");
        assert_ne!(r.peer.ip(), CLIENT_IP, "eTP Cluster must masquerade: {r:?}");
        let gw = rig.cluster.pod(&r.pod).unwrap().ip.octets();
        assert_eq!(
            r.peer.ip(),
            std::net::IpAddr::from([gw[0], gw[1], gw[2], 1]),
            "masqueraded to the node's address towards the pod"
        );
    }
    let r = tcp_request(&rig.cluster.podclient, addr("10.96.0.30", 80), TIMEOUT).unwrap();
    assert_eq!(
        r.peer.ip(),
        kpr_tests::cluster::PODCLIENT_IP,
        "pod to clusterIP is not masqueraded"
    );

    svc.external_local = true;
    let mut eps = rig.endpoints(&[0], false);
    eps.extend(rig.endpoints(&[1], true));
    rig.set(svc.clone(), Some(eps));
    for _ in 0..4 {
        let r = tcp_request(&rig.cluster.client, np, TIMEOUT).expect("eTP Local");
        assert_eq!(r.pod, "pod0", "only the local endpoint");
        assert_eq!(r.peer.ip(), CLIENT_IP, "eTP Local keeps the client address");
    }

    let eps = rig.endpoints(&[0, 1], true);
    rig.set(svc, Some(eps));
    let e = tcp_request(&rig.cluster.client, np, DROP_WAIT).unwrap_err();
    assert_eq!(
        e,
        ClientError::Timeout,
        "eTP Local, endpoints elsewhere: dropped"
    );
    let r = tcp_request(&rig.cluster.podclient, np, TIMEOUT).expect("pod short-circuit");
    assert!(r.pod == "pod0" || r.pod == "pod1");
}

/// Waits until the backend's live view counts `n` active connections in total.
fn wait_active(rig: &Rig, n: u64) {
    let view = rig.dp.live_view().expect("least-connection live view");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let total: u64 = view.active_connections().values().sum();
        if total == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} active connections, have {:?}",
            view.active_connections()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two held connections land on two endpoints; every new connection then goes to the third.
pub fn least_conn_avoids_held(rig: &mut Rig) {
    let mut svc = service("lc", "10.96.0.40", 80, Protocol::Tcp);
    svc.algorithm = Algorithm::LeastConn;
    let eps = rig.endpoints(&[0, 1, 2], false);
    rig.set(svc, Some(eps));
    let target = addr("10.96.0.40", 80);
    let a = tcp_hold(&rig.cluster.podclient, target).expect("held a");
    wait_active(rig, 1);
    let b = tcp_hold(&rig.cluster.podclient, target).expect("held b");
    wait_active(rig, 2);
    assert_ne!(
        a.reply.pod, b.reply.pod,
        "second connection avoids the first"
    );
    let free: Vec<String> = (0..8)
        .map(|_| {
            let r = tcp_request(&rig.cluster.podclient, target, TIMEOUT).expect("request");
            wait_active(rig, 2);
            r.pod
        })
        .collect();
    for pod in &free {
        assert!(
            *pod != a.reply.pod && *pod != b.reply.pod,
            "went to a loaded endpoint: {free:?} (held on {} and {})",
            a.reply.pod,
            b.reply.pod
        );
    }
    drop(a);
    drop(b);
}

/// ClientIP affinity: one client sticks to one endpoint (the affinity Service arrives in an
/// incremental sync, after a first full one).
pub fn session_affinity(rig: &mut Rig) {
    let eps = rig.endpoints(&[0], false);
    rig.set(service("plain", "10.96.0.51", 80, Protocol::Tcp), Some(eps));
    let mut svc = service("aff", "10.96.0.50", 80, Protocol::Tcp);
    svc.affinity = Some(Duration::from_secs(60));
    let eps = rig.endpoints(&[0, 1, 2], false);
    rig.set(svc, Some(eps));
    let target = addr("10.96.0.50", 80);
    let t = tally((0..20).map(|_| {
        tcp_request(&rig.cluster.podclient, target, TIMEOUT)
            .expect("request")
            .pod
    }));
    assert_eq!(t.len(), 1, "affinity must stick: {t:?}");
}

/// loadBalancerSourceRanges: a client outside the ranges is dropped, inside is served.
pub fn load_balancer_source_ranges(rig: &mut Rig) {
    let mut svc = service("lb", "10.96.0.60", 80, Protocol::Tcp);
    svc.load_balancer_ips = vec!["203.0.113.10".parse().unwrap()];
    svc.source_ranges = vec!["198.51.100.0/24".parse().unwrap()];
    let eps = rig.endpoints(&[0], false);
    rig.set(svc.clone(), Some(eps.clone()));
    let lb = addr("203.0.113.10", 80);
    let e = tcp_request(&rig.cluster.client, lb, DROP_WAIT).unwrap_err();
    assert_eq!(e, ClientError::Timeout, "outside loadBalancerSourceRanges");
    svc.source_ranges = vec!["192.0.2.0/24".parse().unwrap()];
    rig.set(svc, Some(eps));
    assert_eq!(
        tcp_request(&rig.cluster.client, lb, TIMEOUT).unwrap().pod,
        "pod0"
    );
}

/// A UDP flow whose endpoint goes away moves to the new endpoint on its next datagram (the stale
/// conntrack entry was removed), with the same client socket.
pub fn udp_conntrack_cleanup(rig: &mut Rig) {
    let svc = service("dns", "10.96.0.70", 53, Protocol::Udp);
    let eps = rig.endpoints(&[0], false);
    rig.set(svc.clone(), Some(eps));
    let sock = rig
        .cluster
        .podclient
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    let ask = |sock: &UdpSocket| -> String {
        sock.send_to(b"hi", addr("10.96.0.70", 53)).unwrap();
        let mut buf = [0u8; 256];
        let (n, _) = sock.recv_from(&mut buf).expect("udp reply");
        String::from_utf8_lossy(&buf[..n])
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(ask(&sock), "pod0");
    assert_eq!(ask(&sock), "pod0");
    let eps = rig.endpoints(&[1], false);
    rig.set(svc, Some(eps));
    assert_eq!(ask(&sock), "pod1", "stale conntrack entry to pod0 was kept");
}

/// After `cleanup` nothing is translated; a new backend instance over a crashed one's leftovers
/// programs the node again.
pub fn cleanup_removes_translation(rig: &mut Rig) {
    let eps = rig.endpoints(&[0], false);
    rig.set(service("c", "10.96.0.80", 80, Protocol::Tcp), Some(eps));
    let target = addr("10.96.0.80", 80);
    assert_eq!(
        tcp_request(&rig.cluster.podclient, target, TIMEOUT)
            .unwrap()
            .pod,
        "pod0"
    );
    rig.in_node(|dp| dp.cleanup()).expect("cleanup");
    assert!(
        tcp_request(&rig.cluster.podclient, target, DROP_WAIT).is_err(),
        "still translated after cleanup"
    );
    rig.full_sync().expect("full sync after cleanup");
    assert_eq!(
        tcp_request(&rig.cluster.podclient, target, TIMEOUT)
            .unwrap()
            .pod,
        "pod0"
    );
}

/// externalIPs are reached from outside (masqueraded under eTP Cluster); a pod that reaches
/// itself through its Service is masqueraded (hairpin) so that the reply comes back through
/// the node.
pub fn external_ip_and_hairpin(rig: &mut Rig) {
    let mut svc = service("ext", "10.96.0.100", 80, Protocol::Tcp);
    svc.external_ips = vec!["198.51.100.7".parse().unwrap()];
    let eps = rig.endpoints(&[0], false);
    rig.set(svc, Some(eps));
    let r =
        tcp_request(&rig.cluster.client, addr("198.51.100.7", 80), TIMEOUT).expect("externalIP");
    assert_eq!(r.pod, "pod0");
    assert_ne!(r.peer.ip(), CLIENT_IP, "eTP Cluster masquerades: {r:?}");
    let pod0 = &rig.cluster.pods[0];
    let r = tcp_request(&pod0.ns, addr("10.96.0.100", 80), TIMEOUT).expect("hairpin");
    assert_eq!(r.pod, "pod0");
    assert_ne!(
        r.peer.ip(),
        std::net::IpAddr::V4(pod0.ip),
        "hairpin must be masqueraded"
    );
    let other = tcp_request(&rig.cluster.pods[1].ns, addr("10.96.0.100", 80), TIMEOUT).unwrap();
    assert_eq!(
        other.peer.ip(),
        std::net::IpAddr::V4(rig.cluster.pods[1].ip),
        "another pod is not masqueraded"
    );
}

/// A UDP Service without endpoints answers with ICMP unreachable (not silence).
pub fn udp_without_endpoints_is_rejected(rig: &mut Rig) {
    rig.set(
        service("nodns", "10.96.0.110", 53, Protocol::Udp),
        Some(vec![]),
    );
    let e = udp_request(&rig.cluster.podclient, addr("10.96.0.110", 53), TIMEOUT).unwrap_err();
    assert!(e.is_rejection(), "expected an ICMP rejection, got {e:?}");
}

/// Two Services with two endpoints each, connections strictly alternating between them: each
/// Service still alternates between its own endpoints.
pub fn interleaved_services_each_round_robin(rig: &mut Rig) {
    let eps = rig.endpoints(&[0, 1], false);
    rig.set(service("a", "10.96.0.120", 80, Protocol::Tcp), Some(eps));
    let eps = rig.endpoints(&[2, 3], false);
    rig.set(service("b", "10.96.0.121", 80, Protocol::Tcp), Some(eps));
    let mut got: Vec<String> = Vec::new();
    for _ in 0..20 {
        for ip in ["10.96.0.120", "10.96.0.121"] {
            let r = tcp_request(&rig.cluster.podclient, addr(ip, 80), TIMEOUT).expect("request");
            got.push(r.pod);
        }
    }
    let t = tally(got);
    for pod in ["pod0", "pod1", "pod2", "pod3"] {
        assert_eq!(t.get(pod), Some(&10), "{t:?}");
    }
}

/// Serving-and-terminating endpoints are used only while no endpoint is ready.
pub fn terminating_fallback(rig: &mut Rig) {
    let svc = service("term", "10.96.0.130", 80, Protocol::Tcp);
    let mut eps = rig.endpoints(&[0, 1], false);
    eps[0].ready = false;
    eps[0].terminating = true;
    rig.set(svc.clone(), Some(eps.clone()));
    let target = addr("10.96.0.130", 80);
    let t = tally((0..6).map(|_| {
        tcp_request(&rig.cluster.podclient, target, TIMEOUT)
            .expect("request")
            .pod
    }));
    assert_eq!(
        t.keys().cloned().collect::<Vec<_>>(),
        vec!["pod1"],
        "ready only: {t:?}"
    );
    eps[1].ready = false;
    eps[1].serving = false;
    rig.set(svc, Some(eps));
    let t = tally((0..6).map(|_| {
        tcp_request(&rig.cluster.podclient, target, TIMEOUT)
            .expect("request")
            .pod
    }));
    assert_eq!(
        t.keys().cloned().collect::<Vec<_>>(),
        vec!["pod0"],
        "falls back to the serving terminating endpoint: {t:?}"
    );
}
