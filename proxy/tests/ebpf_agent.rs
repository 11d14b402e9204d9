//! The real agent binary with `--backend ebpf`: `proxy run` in the node namespace of a kpr-tests
//! cluster, its socket programs on a test cgroup, its pins under a private `--bpffs-path`, its
//! tc program on the node namespace's interfaces; Services from manifest files.
//!
//! Run as root: `cargo test -p proxy --test ebpf_agent`.

mod ebpf_support;

use std::net::SocketAddr;
use std::time::Duration;

use ebpf_support::*;
use kpr_tests::cluster::{ClusterSpec, NODE_IP};
use kpr_tests::{yaml, Agent, AgentOptions, Cgroup, Cluster, EndpointSlice, Service};

/// Not a test: the body of the client processes the tests spawn.
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    run_client(&spec);
}

#[test]
fn agent_balances_cluster_ip_and_node_port_with_the_ebpf_backend() {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let cgroup = Cgroup::new("agent").unwrap();
    let svc = Service::new("web")
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .named("http")
        .node_port(30080);
    let slice = EndpointSlice::for_service(&svc).ready_all(cluster.pod_ips());
    let opts = AgentOptions::backend("ebpf")
        .cgroup(&cgroup)
        .binary(env!("CARGO_BIN_EXE_proxy"));
    let agent = Agent::start(&cluster.node, &opts, &[("web.yaml", yaml(&[&svc, &slice]))])
        .unwrap_or_else(|e| panic!("agent: {e}"));
    // Local client (pod source) through the cgroup programs: exact round-robin.
    let lines = client_lines(&cluster.podclient, &cgroup, "tcp 10.96.0.10:80 40");
    let counts = pod_counts(&lines);
    assert_eq!(counts.len(), 4, "{counts:?}\n{}", agent.log());
    assert!(counts.values().all(|&c| c == 10), "{counts:?}");
    // External client through the tc program on the node's interfaces.
    let node_port = SocketAddr::from((NODE_IP, 30080));
    let mut pods = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let r = kpr_tests::tcp_request(&cluster.client, node_port, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("nodePort: {e}\n{}", agent.log()));
        assert_eq!(
            r.peer.ip(),
            std::net::IpAddr::V4(NODE_IP),
            "masqueraded: {r:?}"
        );
        pods.insert(r.pod);
    }
    assert_eq!(pods.len(), 4, "{pods:?}");
}
