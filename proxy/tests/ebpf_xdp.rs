//! Kernel tests of the eBPF dataplane's XDP program (`kpr_xdp`, `--xdp-interfaces`): NodePort
//! traffic from outside the node (the harness's `client` namespace, 192.0.2.100) arriving on the
//! node's veth `cl`, native XDP attached there and tc on every interface, as the agent runs.
//!
//! A backend "on another node" is `kpr_tests::remote` (10.244.250.2, behind the client
//! namespace): a flow to it goes back out of `cl`, the case XDP sends itself (XDP_TX); a flow to a
//! pod of the node is passed to tc. That module says what the client's side needs so that a veth
//! behaves as a NIC would.
//!
//! Run as root: `cargo test -p proxy --features kpr-tests/root --test ebpf_xdp`.

mod ebpf_support;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ebpf_support::*;
use kpr_tests::cluster::NODE_IP;
use kpr_tests::remote::{Remote, REMOTE_IP, REMOTE_NAME as REMOTE};
use proxy::dataplane::ebpf::xdp::XdpCounts;
use proxy::dataplane::Dataplane;
use proxy::model::Protocol;
use proxy::state::ProxyState;

/// Not a test: the body of the client processes the shared fixture can spawn.
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    run_client(&spec);
}

const NODE_PORT: u16 = 30090;

fn node_port() -> SocketAddr {
    SocketAddr::from((NODE_IP, NODE_PORT))
}

fn remote_backend(fx: &Fixture) -> Remote {
    Remote::new(&fx.cluster).expect("the remote backend behind the client (kpr_tests::remote)")
}

/// A NodePort Service (nodePort 30090, eTP Cluster: masqueraded) over the remote backend and
/// the node's pods `local`.
fn service(fx: &Fixture, proto: Protocol, remote: bool, local: &[usize]) -> ProxyState {
    let mut svc = ebpf_support::service(&name("xdp", proto), VIP, 80);
    svc.node_port = NODE_PORT;
    let mut eps = fx.endpoints(local);
    if remote {
        let mut e = fx.endpoints(&[0]).remove(0);
        e.addr = IpAddr::V4(REMOTE_IP);
        e.node = Some("other-node".into());
        eps.push(e);
    }
    let mut state = ProxyState::default();
    state.set_port(svc, eps);
    state
}

fn requests(fx: &Fixture, proto: Protocol, n: usize) -> Vec<kpr_tests::Reply> {
    (0..n)
        .map(|i| {
            let r = match proto {
                Protocol::Udp => {
                    kpr_tests::udp_request(&fx.cluster.client, node_port(), Duration::from_secs(2))
                }
                _ => {
                    kpr_tests::tcp_request(&fx.cluster.client, node_port(), Duration::from_secs(2))
                }
            };
            r.unwrap_or_else(|e| panic!("request {i} through the node port: {e:?}"))
        })
        .collect()
}

/// `proxy trace --from-outside` of the client's connection to the node port, run in the node's
/// namespace on the fixture's pins (as a user runs it on the node).
fn trace(fx: &Fixture, proto: Protocol) -> String {
    let pins = fx.cfg.bpffs_path.to_string_lossy().into_owned();
    let dst = format!("{}/{}", node_port(), proto.as_str().to_lowercase());
    kpr_tests::proxy_stdout(
        fx.cluster
            .node
            .exec(env!("CARGO_BIN_EXE_proxy"))
            .expect("a command in the node namespace")
            .args(["trace", "--bpffs-path", &pins, "--from-outside"])
            .arg(kpr_tests::cluster::CLIENT_IP.to_string())
            .arg(&dst),
    )
}

fn counts(fx: &mut Fixture) -> XdpCounts {
    fx.dp().xdp_counts().expect("reading KPR_XDP_STATS")
}

#[test]
fn a_flow_to_a_backend_behind_the_external_interface_is_sent_back_out_by_xdp() {
    let mut fx = Fixture::with_xdp("xdptx", 1, &["cl"]);
    assert_eq!(fx.dp().xdp_interfaces(), vec!["cl".to_string()]);
    let _remote = remote_backend(&fx);
    for proto in [Protocol::Tcp, Protocol::Udp] {
        let mut state = service(&fx, proto, true, &[]);
        fx.sync(&mut state, &full());
        let before = counts(&mut fx);
        let replies = requests(&fx, proto, 6);
        let after = counts(&mut fx);
        for r in &replies {
            assert_eq!(r.pod, REMOTE, "{proto:?}: {r:?}");
            assert_eq!(
                r.peer.ip(),
                IpAddr::V4(NODE_IP),
                "{proto:?}: eTP Cluster masquerades to the node: {r:?}"
            );
        }
        // Each request's first packet is balanced by tc (passed on); every later packet either
        // way crosses `cl` inbound once and is XDP's: at least each request's answer.
        let delta = after.since(before);
        assert!(
            delta.sent >= replies.len() as u64,
            "{proto:?}: XDP sent {} packets for {} requests: {before:?} -> {after:?}",
            delta.sent,
            replies.len()
        );
        // At least: a SYN the client retransmits is passed again.
        assert!(
            delta.passed_new >= replies.len() as u64,
            "{proto:?}: each request's first packet left to tc: {before:?} -> {after:?}"
        );
        assert_eq!(
            delta.passed_route, 0,
            "{proto:?}: nothing of these flows is left to tc: {before:?} -> {after:?}"
        );
        // `proxy trace` says what the counters show.
        let t = trace(&fx, proto);
        for want in [
            "XDP on cl: the first packet is passed to tc",
            "later packets to the backend: sent back out of cl by XDP",
            "the backend's replies: sent back out of cl by XDP",
        ] {
            assert!(t.contains(want), "{proto:?}: {want:?} missing:\n{t}");
        }
    }
}

#[test]
fn a_flow_to_a_pod_of_the_node_is_left_to_tc() {
    let mut fx = Fixture::with_xdp("xdplocal", 2, &["cl"]);
    let mut state = service(&fx, Protocol::Tcp, false, &[0, 1]);
    fx.sync(&mut state, &full());
    let replies = requests(&fx, Protocol::Tcp, 4);
    let pods: BTreeSet<&str> = replies.iter().map(|r| r.pod.as_str()).collect();
    assert_eq!(
        pods.len(),
        2,
        "round-robin over the node's pods: {replies:?}"
    );
    let c = counts(&mut fx);
    assert_eq!(c.sent, 0, "{c:?}");
    assert!(
        c.passed_route >= replies.len() as u64,
        "every flow's packets passed to tc: {c:?}"
    );
    // `/metrics` reads the same maps at each scrape.
    let collectors = fx.dp().collector().into_iter().collect();
    let text = proxy::metrics::Metrics::with_collectors(collectors).encode();
    for (outcome, n) in [
        ("sent", c.sent),
        ("passed_route", c.passed_route),
        ("passed_new", c.passed_new),
    ] {
        let line = format!("kpr_xdp_packets_total{{outcome=\"{outcome}\"}} {n}\n");
        assert!(text.contains(&line), "{line:?} missing:\n{text}");
    }
    // `proxy trace` says the same: the route to the picked pod leaves by its veth.
    let t = trace(&fx, Protocol::Tcp);
    for want in [
        "XDP on cl: the first packet is passed to tc",
        "later packets to the backend: passed to tc (the route to 10.244.",
        "no XDP there: tc",
    ] {
        assert!(t.contains(want), "{want:?} missing:\n{t}");
    }
}

#[test]
fn a_restarted_agent_swaps_its_program_into_the_pinned_link() {
    let mut fx = Fixture::with_xdp("xdprestart", 1, &["cl"]);
    let _remote = remote_backend(&fx);
    let mut state = service(&fx, Protocol::Tcp, true, &[]);
    fx.sync(&mut state, &full());
    requests(&fx, Protocol::Tcp, 2);
    drop(fx.dp.take());
    let pinned = fx.cfg.bpffs_path.join("links").join("xdp-cl");
    assert!(pinned.exists(), "{} pinned", pinned.display());
    let before = proxy::dataplane::ebpf::xdp::XdpCounts::from_pin(&fx.cfg.bpffs_path.join("maps"))
        .expect("the pinned stats");
    requests(&fx, Protocol::Tcp, 2);
    let after = proxy::dataplane::ebpf::xdp::XdpCounts::from_pin(&fx.cfg.bpffs_path.join("maps"))
        .expect("the pinned stats");
    assert!(
        after.sent > before.sent,
        "XDP keeps sending with no agent: {after:?}"
    );
    let cfg = fx.cfg.clone();
    let dp = fx
        .cluster
        .node
        .run(move || proxy::dataplane::ebpf::EbpfDataplane::new(&cfg))
        .unwrap()
        .expect("restart in the node namespace: the second XDP attach of `cl` must not fail");
    fx.dp = Some(dp);
    assert_eq!(fx.dp().xdp_interfaces(), vec!["cl".to_string()]);
    assert!(
        fx.dp().xdp_refused().is_empty(),
        "{:?}",
        fx.dp().xdp_refused()
    );
    fx.sync(&mut state, &full());
    let before = counts(&mut fx);
    requests(&fx, Protocol::Tcp, 2);
    assert!(
        counts(&mut fx).sent > before.sent,
        "the new agent's program sends"
    );
}

#[test]
fn an_interface_without_native_xdp_keeps_the_tc_path() {
    // Loopback has generic XDP only.
    let mut fx = Fixture::with_xdp("xdplo", 1, &["lo", "cl"]);
    let refused = fx.dp().xdp_refused();
    assert_eq!(
        refused.iter().map(|(i, _)| i.as_str()).collect::<Vec<_>>(),
        vec!["lo"],
        "{refused:?}"
    );
    assert_eq!(fx.dp().xdp_interfaces(), vec!["cl".to_string()]);
    let mut state = service(&fx, Protocol::Tcp, false, &[0]);
    fx.sync(&mut state, &full());
    assert_eq!(requests(&fx, Protocol::Tcp, 2).len(), 2);
}
