//! Kernel tests of the eBPF dataplane's tc path: traffic from outside the node (the harness's
//! `client` namespace, 192.0.2.100) to nodeIP:nodePort, translated by `kpr_tc_ingress` attached
//! (TCX) to every interface of the test's node namespace, with real echo servers in pod
//! namespaces. The dataplane is built on a thread inside the node namespace; nothing is attached
//! in the machine's own namespace.
//!
//! Run as root: `cargo test -p proxy --features kpr-tests/root --test ebpf_tc`.

mod ebpf_support;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ebpf_support::*;
use kpr_tests::cluster::{CLIENT_IP, NODE_IP};
use kpr_tests::ClientError;
use proxy::model::Protocol;
use proxy::state::ProxyState;

/// Not a test: the body of the client processes the shared fixture can spawn.
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    run_client(&spec);
}

const NODE_PORT: u16 = 30080;

fn node_port() -> SocketAddr {
    SocketAddr::from((NODE_IP, NODE_PORT))
}

/// A NodePort Service (clusterIP 10.96.0.10:80, nodePort 30080) over pods `idx`; pods listed in
/// `remote` run on another node.
fn node_port_service(
    fx: &Fixture,
    proto: Protocol,
    idx: &[usize],
    remote: &[usize],
    local: bool,
) -> ProxyState {
    let n = name("web", proto);
    let mut svc = service(&n, VIP, 80);
    svc.node_port = NODE_PORT;
    svc.external_local = local;
    let mut eps = fx.endpoints(idx);
    for (e, i) in eps.iter_mut().zip(idx) {
        if remote.contains(i) {
            e.node = Some("other-node".into());
        }
    }
    let mut state = ProxyState::default();
    state.set_port(svc, eps);
    state
}

fn tcp(fx: &Fixture, n: usize) -> Vec<Result<kpr_tests::Reply, ClientError>> {
    (0..n)
        .map(|_| kpr_tests::tcp_request(&fx.cluster.client, node_port(), Duration::from_secs(2)))
        .collect()
}

#[test]
fn node_port_from_outside_is_balanced_and_masqueraded() {
    let mut fx = Fixture::with_tc("tcnp", 4);
    let mut state = node_port_service(&fx, Protocol::Tcp, &[0, 1, 2, 3], &[], false);
    fx.sync(&mut state, &full());
    let replies: Vec<kpr_tests::Reply> = tcp(&fx, 8)
        .into_iter()
        .map(|r| r.expect("request through the node port"))
        .collect();
    let pods: BTreeSet<&str> = replies.iter().map(|r| r.pod.as_str()).collect();
    assert_eq!(pods.len(), 4, "round-robin over the 4 pods: {replies:?}");
    for r in &replies {
        assert_eq!(
            r.peer.ip(),
            IpAddr::V4(NODE_IP),
            "eTP Cluster masquerades to the node: {r:?}"
        );
    }
    let live = fx.dp().live().counters().unwrap();
    assert_eq!(live.values().map(|c| c.total).sum::<u64>(), 8, "{live:?}");
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address_and_local_endpoints() {
    let mut fx = Fixture::with_tc("tclocal", 4);
    let mut state = node_port_service(&fx, Protocol::Tcp, &[0, 1, 2, 3], &[2, 3], true);
    fx.sync(&mut state, &full());
    let replies: Vec<kpr_tests::Reply> = tcp(&fx, 6)
        .into_iter()
        .map(|r| r.expect("request"))
        .collect();
    let pods: BTreeSet<&str> = replies.iter().map(|r| r.pod.as_str()).collect();
    let local: BTreeSet<&str> = [0, 1]
        .iter()
        .map(|&i| fx.cluster.pods[i].name.as_str())
        .collect();
    assert_eq!(pods, local, "only this node's endpoints: {replies:?}");
    for r in &replies {
        assert_eq!(
            r.peer.ip(),
            IpAddr::V4(CLIENT_IP),
            "eTP Local keeps the client: {r:?}"
        );
    }
}

#[test]
fn udp_node_port_replies_come_from_the_node_port() {
    let mut fx = Fixture::with_tc("tcudp", 2);
    let mut state = node_port_service(&fx, Protocol::Udp, &[0, 1], &[], false);
    fx.sync(&mut state, &full());
    // The client's socket is connected to nodeIP:30080: an untranslated reply would be discarded.
    let r = kpr_tests::udp_request(&fx.cluster.client, node_port(), Duration::from_secs(2))
        .expect("UDP through the node port");
    assert!(fx.cluster.pods.iter().any(|p| p.name == r.pod), "{r:?}");
    assert_eq!(r.peer.ip(), IpAddr::V4(NODE_IP), "{r:?}");
}

#[test]
fn node_port_without_endpoints_is_refused() {
    let mut fx = Fixture::with_tc("tcnone", 1);
    let mut state = node_port_service(&fx, Protocol::Tcp, &[], &[], false);
    fx.sync(&mut state, &full());
    let start = std::time::Instant::now();
    let r = tcp(&fx, 1).remove(0);
    assert_eq!(r, Err(ClientError::Refused));
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn tc_links_are_pinned_per_interface_and_removed_by_cleanup() {
    let mut fx = Fixture::with_tc("tcpin", 1);
    let root = fx.dp().bpffs_path().to_path_buf();
    let tcx = proxy::dataplane::ebpf::tc::tcx_supported();
    for iface in ["cl", "pc", "p0"] {
        if tcx {
            assert!(
                root.join(format!("links/tc-{iface}")).exists(),
                "tc link on {iface}"
            );
        } else {
            // Before 6.6: a netlink filter on the clsact qdisc, which needs no pin.
            assert!(
                tc_filter_names(&fx, iface).contains("kpr_tc_ingress"),
                "{iface}"
            );
        }
    }
    assert!(!root.join("links/tc-lo").exists());
    proxy::dataplane::Dataplane::cleanup(fx.dp()).expect("cleanup");
    assert!(!root.exists());
    for iface in ["cl", "pc", "p0"] {
        assert!(
            !tc_filter_names(&fx, iface).contains("kpr_tc_ingress"),
            "{iface}"
        );
    }
    // Without the tc program the node port is just a closed port of the node.
    let mut state = node_port_service(&fx, Protocol::Tcp, &[0], &[], false);
    state.node = fx.cfg.node.clone();
    assert_eq!(tcp(&fx, 1).remove(0), Err(ClientError::Refused));
    drop(state);
}

/// The node port's endpoints become the one pod that is not `gone` (of a two-pod fixture),
/// synced; that pod's index.
fn keep_only_the_other(
    fx: &mut Fixture,
    state: &mut ProxyState,
    proto: Protocol,
    gone: &str,
) -> usize {
    let keep = fx.cluster.pods.iter().position(|p| p.name != gone).unwrap();
    let n = name("web", proto);
    set_endpoints(state, &n, fx.endpoints(&[keep]));
    fx.sync(state, &changed(&[&n]));
    keep
}

#[test]
fn udp_flow_to_a_removed_endpoint_is_rebalanced() {
    let mut fx = Fixture::with_tc("tcudpgone", 2);
    let mut state = node_port_service(&fx, Protocol::Udp, &[0, 1], &[], false);
    fx.sync(&mut state, &full());
    let ask = |sock: &std::net::UdpSocket| -> String {
        sock.send(b"ping").expect("send");
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("UDP reply");
        String::from_utf8_lossy(&buf[..n])
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let sock = fx
        .cluster
        .client
        .run(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s.connect(node_port()).unwrap();
            s
        })
        .unwrap();
    let first = ask(&sock);
    assert_eq!(ask(&sock), first, "one flow stays on its endpoint");
    // The endpoint the flow uses goes away; the same socket (same 5-tuple) must get the other.
    let keep = keep_only_the_other(&mut fx, &mut state, Protocol::Udp, &first);
    assert_eq!(ask(&sock), fx.cluster.pods[keep].name);
}

/// One TCP request from the client's `CLIENT_IP:port` to the node port: the pod that answered
/// and how many times the client's kernel retransmitted (the SYN included). The socket closes
/// with a reset (SO_LINGER 0), leaving no TIME_WAIT, so the same 4-tuple can connect again at
/// once: a client whose ephemeral ports came round.
fn request_from_port(fx: &Fixture, port: u16) -> (String, u32) {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    fx.cluster
        .client
        .run(move || {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("socket");
            sock.set_reuse_address(true).expect("SO_REUSEADDR");
            sock.bind(&SocketAddr::from((CLIENT_IP, port)).into())
                .expect("bind the fixed source port");
            sock.connect_timeout(&node_port().into(), Duration::from_secs(5))
                .expect("connect through the node port");
            let mut stream: std::net::TcpStream = sock.into();
            stream
                .set_read_timeout(Some(Duration::from_secs(3)))
                .unwrap();
            stream.write_all(b"hello\n").expect("send");
            let mut buf = [0u8; 512];
            let n = stream.read(&mut buf).expect("reply");
            let pod = String::from_utf8_lossy(&buf[..n])
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            // SAFETY: a tcp_info the kernel fills, of the size passed.
            let retrans = unsafe {
                let mut info: libc::tcp_info = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
                let rc = libc::getsockopt(
                    stream.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_INFO,
                    (&mut info as *mut libc::tcp_info).cast(),
                    &mut len,
                );
                assert_eq!(rc, 0, "TCP_INFO");
                info.tcpi_total_retrans
            };
            socket2::SockRef::from(&stream)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            (pod, retrans)
        })
        .expect("client namespace")
}

/// A new connection whose SYN reuses the 4-tuple of an earlier one to an endpoint that is gone
/// since: the tc program forgets the old entry and runs itself again (a tail call), so this very
/// SYN is balanced to an endpoint that exists; the client never retransmits it (before the tail
/// call, the SYN was dropped and only its retransmission a second later got through).
#[test]
fn a_syn_reusing_the_tuple_of_a_removed_endpoint_is_balanced_at_once() {
    let mut fx = Fixture::with_tc("tcreuse", 2);
    let mut state = node_port_service(&fx, Protocol::Tcp, &[0, 1], &[], false);
    fx.sync(&mut state, &full());
    let (first, retrans) = request_from_port(&fx, 41000);
    assert_eq!(retrans, 0, "the first connection needs no retransmission");
    let keep = keep_only_the_other(&mut fx, &mut state, Protocol::Tcp, &first);
    let (second, retrans) = request_from_port(&fx, 41000);
    assert_eq!(
        second, fx.cluster.pods[keep].name,
        "the endpoint that exists"
    );
    assert_eq!(
        retrans, 0,
        "the reusing SYN is balanced when it arrives, not dropped for a retransmission"
    );
}

#[test]
fn restart_in_the_node_keeps_the_tc_path_and_reattaches() {
    let mut fx = Fixture::with_tc("tcrestart", 2);
    let mut state = node_port_service(&fx, Protocol::Tcp, &[0, 1], &[], false);
    fx.sync(&mut state, &full());
    assert!(tcp(&fx, 1).remove(0).is_ok());
    drop(fx.dp.take());
    assert!(
        tcp(&fx, 1).remove(0).is_ok(),
        "pinned tc links keep translating with no agent"
    );
    let cfg = fx.cfg.clone();
    let dp = fx
        .cluster
        .node
        .run(move || proxy::dataplane::ebpf::EbpfDataplane::new(&cfg))
        .unwrap()
        .expect("restart in the node namespace");
    fx.dp = Some(dp);
    assert!(fx.dp().tc_interfaces().contains(&"cl".to_string()));
    fx.sync(&mut state, &full());
    let pods: BTreeSet<String> = tcp(&fx, 4)
        .into_iter()
        .map(|r| r.expect("after restart").pod)
        .collect();
    assert_eq!(pods.len(), 2);
}

/// `tc filter show` of an interface's ingress in the node namespace (empty with TCX links, which
/// tc does not list as filters).
fn tc_filter_names(fx: &Fixture, iface: &str) -> String {
    let out = fx
        .cluster
        .node
        .exec("tc")
        .unwrap()
        .args(["filter", "show", "dev", iface, "ingress"])
        .output()
        .expect("tc filter show");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// loadBalancerSourceRanges in the pinned maps: written with the LB frontends, changed and
/// removed with the Service, and what a crashed agent left is swept by the next one.
#[test]
fn source_ranges_follow_the_service_in_the_maps_and_are_swept_after_a_restart() {
    use proxy::dataplane::ebpf::inspect::MapSnapshot;
    let mut fx = Fixture::with_tc("tcfw", 1);
    let n = name("web", Protocol::Tcp);
    let lb: std::net::Ipv4Addr = "198.51.100.10".parse().unwrap();
    let with_ranges = |fx: &Fixture, ranges: &[&str]| {
        let mut svc = service(&n, VIP, 80);
        svc.load_balancer_ips = vec![IpAddr::V4(lb)];
        svc.source_ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
        let mut state = ProxyState::default();
        state.set_port(svc, fx.endpoints(&[0]));
        state
    };
    let allowed = |fx: &Fixture| -> Vec<String> {
        let snap = MapSnapshot::read(&fx.cfg.bpffs_path).expect("reading the pinned maps");
        let f = snap
            .frontend(IpAddr::V4(lb), 80, Protocol::Tcp, true)
            .expect("the LB IP's tc frontend");
        f.source_ranges.iter().map(|n| n.to_string()).collect()
    };
    let mut state = with_ranges(&fx, &["203.0.113.0/24", "192.0.2.0/25"]);
    fx.sync(&mut state, &full());
    let node = format!("{NODE_IP}/32");
    let mut want = vec![
        "192.0.2.0/25",
        node.as_str(),
        "198.51.100.10/32",
        "203.0.113.0/24",
    ];
    want.sort_unstable();
    assert_eq!(allowed(&fx), want);
    // One range goes: only its entry is deleted.
    let mut state = with_ranges(&fx, &["203.0.113.0/24"]);
    fx.sync(&mut state, &changed(&[&n]));
    let mut want = vec![node.as_str(), "198.51.100.10/32", "203.0.113.0/24"];
    want.sort_unstable();
    assert_eq!(allowed(&fx), want);
    // No ranges: the frontend is not guarded and the trie holds nothing.
    let mut state = with_ranges(&fx, &[]);
    fx.sync(&mut state, &changed(&[&n]));
    assert!(allowed(&fx).is_empty());
    // A crashed agent's entries: the next agent's first full sync keeps only what it claims.
    let mut state = with_ranges(&fx, &["203.0.113.0/24"]);
    fx.sync(&mut state, &changed(&[&n]));
    let dp = fx.dp.take().expect("dataplane");
    std::mem::forget(dp); // a crash: no cleanup, the pins stay
    let cfg = fx.cfg.clone();
    fx.dp = Some(
        fx.cluster
            .node
            .run(move || proxy::dataplane::ebpf::EbpfDataplane::new(&cfg))
            .expect("entering the node namespace")
            .expect("restart"),
    );
    let mut state = with_ranges(&fx, &["192.0.2.0/24"]);
    fx.sync(&mut state, &full());
    let mut want = vec!["192.0.2.0/24", node.as_str(), "198.51.100.10/32"];
    want.sort_unstable();
    assert_eq!(allowed(&fx), want);
}
