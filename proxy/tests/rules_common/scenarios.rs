//! Scenarios shared by the two rule backends (nftables, iptables) that need the in-process
//! dataplane: UDP conntrack cleanup, cleanup/leftovers, per-Service round-robin counters. Each
//! takes a fresh [`Rig`]. The Service semantics themselves are checked for every backend by the
//! conformance suite (`kpr_tests::conformance`, `cargo test -p kpr-tests --features root --test conformance`).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use kpr_tests::tcp_request;
use proxy::model::Protocol;

use super::{addr, service, tally, Rig, DROP_WAIT, TIMEOUT};

/// (name, pods the rig needs, scenario).
pub type Scenario = (&'static str, usize, fn(&mut Rig));

pub const SCENARIOS: &[Scenario] = &[
    ("udp_conntrack_cleanup", 2, udp_conntrack_cleanup),
    (
        "udp_flow_survives_an_agent_start",
        3,
        udp_flow_survives_an_agent_start,
    ),
    ("cleanup_and_leftovers", 1, cleanup_removes_translation),
    (
        "interleaved_services_each_round_robin",
        4,
        interleaved_services_each_round_robin,
    ),
    (
        "round_robin_over_many_then_few_endpoints",
        MANY_PODS,
        round_robin_over_many_then_few_endpoints,
    ),
];

/// More endpoints than the nftables backend has static round-robin rules for (16).
const MANY_PODS: usize = 18;

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

/// An unconnected UDP socket in the pod-client namespace, with the replies' timeout.
fn pod_udp_socket(rig: &Rig) -> UdpSocket {
    let sock = rig
        .cluster
        .podclient
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    sock
}

/// A UDP flow whose endpoint goes away moves to the new endpoint on its next datagram (the stale
/// conntrack entry was removed), with the same client socket.
pub fn udp_conntrack_cleanup(rig: &mut Rig) {
    let svc = service("dns", "10.96.0.70", 53, Protocol::Udp);
    let eps = rig.endpoints(&[0], false);
    rig.set(svc.clone(), Some(eps));
    let sock = pod_udp_socket(rig);
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

/// An agent that starts over rules already in place sees every Service port "become
/// reachable" (its state starts empty); the conntrack cleanup that follows must leave the live
/// flows its serving endpoints answer. Deleting one loses a reply in flight: it comes back from
/// the endpoint's address, no longer translated, and the client's connected socket drops it
/// (`cluster chaos agent-restart` saw one UDP request in ~140 time out per restart before).
pub fn udp_flow_survives_an_agent_start(rig: &mut Rig) {
    use proxy::conntrack::netlink::CtSocket;
    use proxy::model::IpFamily;
    let svc = service("dns", "10.96.0.71", 53, Protocol::Udp);
    let eps = rig.endpoints(&[0, 1, 2], false);
    rig.set(svc.clone(), Some(eps.clone()));
    let sock = pod_udp_socket(rig);
    sock.send_to(b"hi", addr("10.96.0.71", 53)).unwrap();
    let mut buf = [0u8; 256];
    sock.recv_from(&mut buf).expect("udp reply");
    let port = sock.local_addr().unwrap().port();
    let vip: std::net::IpAddr = "10.96.0.71".parse().unwrap();
    // The flow's entry: its endpoint, as the table holds it now.
    let flow = |rig: &mut Rig| {
        rig.in_node(|_| CtSocket::open().and_then(|mut s| s.dump(IpFamily::V4)))
            .expect("conntrack dump")
            .into_iter()
            .filter(|e| e.protocol == 17)
            .find(|e| e.orig.is_some_and(|o| o.dst == vip && o.sport == port))
            .and_then(|e| e.reply.map(|r| r.src))
    };
    let endpoint = flow(rig).expect("the flow's conntrack entry");
    // The agent starts again: an empty state, every port set anew, one sync.
    rig.state = proxy::state::ProxyState::new(super::node_context());
    let changes = rig.update_state(&svc.name, Some((svc.clone(), eps)));
    assert!(changes.became_reachable.contains(&svc.name));
    rig.sync(&changes).expect("sync");
    assert_eq!(
        flow(rig),
        Some(endpoint),
        "the live flow's conntrack entry was deleted by the start's cleanup"
    );
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

/// Round robin stays exact when a Service has more endpoints than the nftables backend's static
/// count rules cover (a chain for that count is created), when it shrinks to another such count,
/// and when it shrinks to a count the static rules cover (its target moves from a verdict element
/// to a count set in one transaction).
pub fn round_robin_over_many_then_few_endpoints(rig: &mut Rig) {
    let svc = service("many", "10.96.0.130", 80, Protocol::Tcp);
    for n in [MANY_PODS, MANY_PODS - 1, 5, MANY_PODS] {
        let idx: Vec<usize> = (0..n).collect();
        let eps = rig.endpoints(&idx, false);
        rig.set(svc.clone(), Some(eps));
        let got: Vec<String> = (0..2 * n)
            .map(|_| {
                tcp_request(&rig.cluster.podclient, addr("10.96.0.130", 80), TIMEOUT)
                    .expect("request")
                    .pod
            })
            .collect();
        let t = tally(got);
        assert_eq!(t.len(), n, "{n} endpoints: {t:?}");
        assert!(t.values().all(|c| *c == 2), "{n} endpoints: {t:?}");
    }
}
