//! Maglev consistent hashing (`kpr.io/balance: maglev`) with real traffic, on every backend
//! (eBPF, userspace, nftables, iptables: iptables hashes with the kernel's HMARK, so its oracle
//! is `proxy::maglev::hmark_hash` rather than the other backends' shared flow hash).
//!
//! Two one-node clusters (`Cluster`) with the same addresses stand for two nodes of one cluster:
//! each node namespace runs its own agent with the same Service (an externalIP) and the same
//! four endpoints. The external client of each sends the same flows (source `192.0.2.100:P` for
//! fixed ports P, bound before `connect()`), so a flow enters either node as the same 5-tuple.
//!
//! Shown per backend:
//! - every flow reaches the endpoint the agent's own Maglev table (`proxy::maglev`, the oracle)
//!   gives it, on both nodes: the dataplane renders that exact table and hash, and both nodes
//!   pick the same endpoint for the same flow;
//! - after one of the four endpoints is removed on node A, new flows are compared between A
//!   (three endpoints) and B (still four): every flow B sends to the removed endpoint moves, and
//!   the flows that move beyond those are no more than the tables predict (the table-level bound,
//!   1/N + 1 percentage point over 10,000 flows, is `proxy::maglev`'s unit test);
//! - all four endpoints get flows (the spread in proportion to the slots, M/N rounded, is the
//!   unit tests' and `/state`'s check);
//! - UDP flows (one datagram each) follow the same table on both nodes;
//! - on iptables over IPv6 (an IPv6-only Service's NodePort from outside), TCP and UDP flows
//!   follow the IPv6 table's HMARK slots (ip6tables folds each address into one word);
//! - `/state` and `proxy inspect` show the table: its size and each endpoint's slots; on eBPF,
//!   `proxy trace --src-port` names the slot the programs took; on iptables, the slot HMARK
//!   gives, and without the source port each endpoint's share of the slots.
//!
//! Needs root, the `proxy` and `probe` binaries (`cargo build -p proxy -p kpr-tests --bins`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kpr_tests::client::{tcp_request_from, udp_request_from};
use kpr_tests::cluster::{ClusterSpec, CLIENT_IP, CLIENT_IP6, ECHO_PORT, NODE_IP6, PODCLIENT_IP};
use kpr_tests::{
    run_probe, yaml, Agent, AgentOptions, Cgroup, Cluster, EndpointSlice, ProbeLine, Service,
};
use proxy::maglev::{hmark_hash, MaglevTable, TableSize, HMARK_RND};

const PODS: usize = 4;
/// The Service's externalIP: the client reaches it through the node (its default route).
const EXTERNAL_IP: &str = "203.0.113.10";
const VIP: &str = "10.96.0.10";
const PORT: u16 = 80;
/// Flows per phase and node: enough for every endpoint to get some, few enough to stay quick.
const FLOWS: u16 = 160;
const TIMEOUT: Duration = Duration::from_secs(3);

fn service() -> Service {
    Service::new("web")
        .cluster_ip(VIP)
        .tcp(PORT, ECHO_PORT)
        .named("http")
        .udp(PORT, ECHO_PORT)
        .named("dns")
        .external_ip(EXTERNAL_IP)
        .balance("maglev")
}

fn manifests(cluster: &Cluster, without: Option<usize>) -> String {
    let svc = service();
    let slice = cluster
        .pods
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != without)
        .fold(EndpointSlice::for_service(&svc), |s, (_, p)| s.ready(p.ip));
    yaml(&[&svc, &slice])
}

/// One node: its namespaces, agent and (eBPF) cgroup.
struct Node {
    cluster: Cluster,
    cgroup: Option<Cgroup>,
}

fn node(backend: &str) -> Node {
    let cluster = Cluster::new(ClusterSpec::pods(PODS)).expect("cluster");
    let cgroup = (backend == "ebpf").then(|| Cgroup::new("maglev").expect("test cgroup"));
    Node { cluster, cgroup }
}

fn start<'a>(n: &'a Node, backend: &str) -> Agent<'a> {
    let mut opts = AgentOptions::backend(backend);
    if let Some(c) = &n.cgroup {
        opts = opts.cgroup(c);
    }
    let agent = Agent::start(
        &n.cluster.node,
        &opts,
        &[("web.yaml", manifests(&n.cluster, None))],
    )
    .expect("agent starts");
    wait_endpoints(&agent, PODS);
    agent
}

fn wait_endpoints(agent: &Agent<'_>, n: usize) {
    agent
        .wait_for(
            &format!("web with {n} endpoints"),
            Duration::from_secs(15),
            |s| {
                s.service("default/web:http/TCP")
                    .is_some_and(|w| w.endpoints.len() == n && w.algorithm == "maglev")
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
}

/// The endpoint (`ip:8080`) of the pod that answered.
fn endpoint_of(cluster: &Cluster, pod: &str) -> SocketAddr {
    cluster
        .pod(pod)
        .unwrap_or_else(|| panic!("unknown pod {pod:?}"))
        .echo_addr()
}

/// The endpoint each TCP flow from the external client (ports `first..first + FLOWS`) reached.
fn external_flows(
    cluster: &Cluster,
    agent: &Agent<'_>,
    first: u16,
) -> Vec<(SocketAddr, SocketAddr)> {
    flows(cluster, agent, first, FLOWS, false)
}

/// The endpoint each of `n` flows (TCP, or UDP: one datagram each) from the external client
/// reached.
fn flows(
    cluster: &Cluster,
    agent: &Agent<'_>,
    first: u16,
    n: u16,
    udp: bool,
) -> Vec<(SocketAddr, SocketAddr)> {
    let to = SocketAddr::new(EXTERNAL_IP.parse().unwrap(), PORT);
    (first..first + n)
        .map(|port| {
            let from = SocketAddr::new(IpAddr::V4(CLIENT_IP), port);
            let r = if udp {
                udp_request_from(&cluster.client, from, to, TIMEOUT)
            } else {
                tcp_request_from(&cluster.client, from, to, TIMEOUT)
            };
            let r = r.unwrap_or_else(|e| panic!("flow {from} -> {to}: {e}\n{}", agent.log()));
            // External traffic to the externalIP is masqueraded: on iptables, the masquerade
            // mark survives the HMARK rules that put the slot in the same packet mark.
            assert_ne!(
                r.peer.ip(),
                IpAddr::V4(CLIENT_IP),
                "flow {from} -> {to}: the endpoint saw the client's own address (no masquerade)"
            );
            (from, endpoint_of(cluster, &r.pod))
        })
        .collect()
}

fn table(cluster: &Cluster, without: Option<usize>) -> MaglevTable {
    let eps = cluster
        .pods
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != without)
        .map(|(_, p)| p.echo_addr());
    MaglevTable::new(eps, TableSize::default())
}

/// The endpoint the table gives a flow on `backend`: iptables takes the slot of the kernel's
/// HMARK hash, every other backend that of the shared flow hash.
fn pick(
    backend: &str,
    t: &MaglevTable,
    from: SocketAddr,
    dst: SocketAddr,
    udp: bool,
) -> SocketAddr {
    let slot = if backend == "iptables" {
        let proto = if udp { 17 } else { 6 };
        t.slot_of(hmark_hash(from, dst, proto, HMARK_RND))
    } else {
        t.slot_of(proxy::maglev::flow_hash(from, dst))
    };
    t.at(slot).expect("a table with endpoints")
}

/// Every flow reached the endpoint the table gives it.
fn assert_follows(
    backend: &str,
    what: &str,
    flows: &[(SocketAddr, SocketAddr)],
    t: &MaglevTable,
    dst: SocketAddr,
) {
    let udp = what.contains("UDP");
    let wrong: Vec<String> = flows
        .iter()
        .filter_map(|(from, got)| {
            let want = pick(backend, t, *from, dst, udp);
            (want != *got).then(|| format!("{from}: reached {got}, table says {want}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} flows off the Maglev table:\n{}",
        wrong.len(),
        flows.len(),
        wrong.join("\n")
    );
}

/// `proxy inspect` prints each port's table: size and slots per endpoint.
fn assert_inspect_prints_the_table(cluster: &Cluster, agent: &Agent<'_>) {
    let out = cluster
        .node
        .exec(agent.binary())
        .expect("a command in the node namespace")
        .arg("inspect")
        .output()
        .expect("proxy inspect runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let (first, slots) = table(cluster, None).slot_counts()[0];
    let line =
        format!("maglev table (cluster IPv4): 16381 slots; slots per endpoint: {first} {slots},");
    assert_eq!(
        text.matches(&line).count(),
        2,
        "one table per port (TCP and UDP):\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `/state` shows the table: the default size and each endpoint's slots, M/N rounded.
fn assert_state_shows_table(agent: &Agent<'_>, n: usize) {
    let state = agent.state().expect("/state");
    let web = state.raw["services"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "default/web:http/TCP"))
        .cloned()
        .expect("web in /state");
    let tables = web["maglev"].as_array().cloned().unwrap_or_default();
    assert_eq!(tables.len(), 1, "one table (cluster IPv4): {web}");
    assert_eq!(tables[0]["table_size"], 16381);
    let slots: Vec<u64> = tables[0]["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .map(|p| p[1].as_u64().expect("a count"))
        .collect();
    assert_eq!(slots.len(), n);
    let (lo, hi) = (16381 / n as u64, 16381u64.div_ceil(n as u64));
    assert!(slots.iter().all(|c| (lo..=hi).contains(c)), "{slots:?}");
}

/// `proxy trace --src-port` names the flow's Maglev slot and the endpoint the flow reached.
fn assert_trace_gives_the_slot(
    agent: &Agent<'_>,
    bpffs: &std::path::Path,
    (from, reached): (SocketAddr, SocketAddr),
    t: &MaglevTable,
    dst: SocketAddr,
) {
    let out = std::process::Command::new(agent.binary())
        .args([
            "trace",
            &from.ip().to_string(),
            &format!("{dst}/tcp"),
            "--from-outside",
        ])
        .args(["--src-port", &from.port().to_string(), "--bpffs-path"])
        .arg(bpffs)
        .output()
        .expect("proxy trace runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let slot = t.slot_of(proxy::maglev::flow_hash(from, dst));
    assert!(
        text.contains(&format!("-> {reached} (slot {slot})"))
            && text.contains(&format!("maglev table slot {slot} of 16381")),
        "proxy trace for {from}:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn maglev(backend: &str) {
    let (a, b) = (node(backend), node(backend));
    let (agent_a, agent_b) = (start(&a, backend), start(&b, backend));
    assert_state_shows_table(&agent_a, PODS);
    let dst = SocketAddr::new(EXTERNAL_IP.parse().unwrap(), PORT);
    let full = table(&a.cluster, None);

    // The same flows through both nodes: the same endpoint each, the table's.
    let on_a = external_flows(&a.cluster, &agent_a, 20000);
    let on_b = external_flows(&b.cluster, &agent_b, 20000);
    assert_follows(backend, "node A", &on_a, &full, dst);
    assert_follows(backend, "node B", &on_b, &full, dst);
    assert_eq!(
        on_a, on_b,
        "the same flow picks the same endpoint on both nodes"
    );
    if let Some(bpffs) = agent_a.bpffs_path() {
        assert_trace_gives_the_slot(&agent_a, bpffs, on_a[0], &full, dst);
    }
    if backend == "iptables" {
        assert_iptables_trace_gives_the_slot(&a.cluster, &agent_a, on_a[0], &full, dst);
    }
    // UDP flows too (one datagram each), through both nodes.
    let udp_a = flows(&a.cluster, &agent_a, 25000, 40, true);
    let udp_b = flows(&b.cluster, &agent_b, 25000, 40, true);
    assert_follows(backend, "node A, UDP", &udp_a, &full, dst);
    assert_eq!(
        udp_a, udp_b,
        "the same UDP flow picks the same endpoint on both nodes"
    );
    assert_inspect_prints_the_table(&a.cluster, &agent_a);
    let mut spread: BTreeMap<SocketAddr, usize> = BTreeMap::new();
    for (_, ep) in &on_a {
        *spread.entry(*ep).or_default() += 1;
    }
    assert_eq!(spread.len(), PODS, "every endpoint gets flows: {spread:?}");

    // Node A loses endpoint 1; new flows through both nodes.
    let gone = a.cluster.pods[1].echo_addr();
    agent_a
        .write_manifest("web.yaml", &manifests(&a.cluster, Some(1)))
        .unwrap();
    wait_endpoints(&agent_a, PODS - 1);
    assert_state_shows_table(&agent_a, PODS - 1);
    let after_a = external_flows(&a.cluster, &agent_a, 30000);
    let after_b = external_flows(&b.cluster, &agent_b, 30000);
    assert_follows(
        backend,
        "node A without one endpoint",
        &after_a,
        &table(&a.cluster, Some(1)),
        dst,
    );
    assert_follows(backend, "node B", &after_b, &full, dst);
    let on_gone = after_b.iter().filter(|(_, ep)| *ep == gone).count();
    let moved: Vec<usize> = (0..after_a.len())
        .filter(|i| after_a[*i].1 != after_b[*i].1)
        .collect();
    let extra = moved.iter().filter(|i| after_b[**i].1 != gone).count();
    println!(
        "{backend}: {} flows, {on_gone} on the removed endpoint, {} moved ({extra} of them from \
         endpoints that stayed)",
        after_a.len(),
        moved.len()
    );
    assert_eq!(
        moved.len() - extra,
        on_gone,
        "every flow of the removed endpoint moves"
    );
    // What the tables say for these flows: extra moves are the table's, not the dataplane's.
    let predicted_extra = after_b
        .iter()
        .filter(|(from, ep)| {
            *ep != gone && pick(backend, &table(&a.cluster, Some(1)), *from, dst, false) != *ep
        })
        .count();
    assert_eq!(extra, predicted_extra);
    assert!(
        extra * 100 <= after_a.len() * 2,
        "at most 2% of the flows move between endpoints that stayed ({extra})"
    );
}

#[test]
fn nftables_maglev() {
    maglev("nftables");
}

#[test]
fn userspace_maglev() {
    maglev("userspace");
}

#[test]
fn ebpf_maglev_tc_path() {
    maglev("ebpf");
}

/// The eBPF socket path: a pod's socket bound to a source port hashes its 5-tuple at
/// `connect()`, so it takes the table's endpoint; unbound sockets hash their cookie and spread.
#[test]
fn ebpf_maglev_socket_path() {
    let n = node("ebpf");
    let agent = start(&n, "ebpf");
    let cgroup = n.cgroup.as_ref();
    let to = format!("{VIP}:{PORT}");
    let bind = format!("{PODCLIENT_IP}:21000");
    let count = FLOWS.to_string();
    let out = run_probe(
        &n.cluster.podclient,
        cgroup,
        &["tcp", &to, "--count", &count, "--bind", &bind],
    )
    .unwrap();
    assert!(
        out.success,
        "{:?}\n{}\n{}",
        out.lines,
        out.stderr,
        agent.log()
    );
    let flows: Vec<(SocketAddr, SocketAddr)> = out
        .lines
        .iter()
        .enumerate()
        .map(|(k, l)| match l {
            ProbeLine::Reply(r) => (
                SocketAddr::new(IpAddr::V4(PODCLIENT_IP), 21000 + k as u16),
                endpoint_of(&n.cluster, &r.pod),
            ),
            other => panic!("flow {k}: {other:?}"),
        })
        .collect();
    let dst = SocketAddr::new(VIP.parse().unwrap(), PORT);
    assert_follows("ebpf", "socket path", &flows, &table(&n.cluster, None), dst);
    let out = run_probe(&n.cluster.podclient, cgroup, &["tcp", &to, "--count", "60"]).unwrap();
    let mut pods: Vec<String> = out.replies().iter().map(|r| r.pod.clone()).collect();
    pods.sort();
    pods.dedup();
    assert_eq!(pods.len(), PODS, "unbound sockets spread: {pods:?}");
}

/// iptables: HMARK hashes the flow into the table's slots (the kernel's hash, not the other
/// backends' flow hash, so the oracle is `hmark_hash`); both nodes pick alike, a removed
/// endpoint moves only about its own flows, and `proxy trace --src-port` names the slot.
#[test]
fn iptables_maglev() {
    maglev("iptables");
}

/// IPv6 on iptables (ip6tables' HMARK folds each address into one word, four words XORed): an
/// IPv6-only Service's NodePort, reached from outside on the node's IPv6 address, sends every
/// flow (TCP, and UDP datagrams) to the endpoint of the IPv6 table's HMARK slot, masqueraded.
#[test]
fn iptables_maglev_ipv6() {
    let cluster = Cluster::new(ClusterSpec::pods(PODS).dual_stack()).expect("cluster");
    let svc = Service::new("web6")
        .cluster_ips(&["fd00:10:96::80"])
        .tcp(PORT, ECHO_PORT)
        .named("http")
        .node_port(30180)
        .udp(PORT, ECHO_PORT)
        .named("dns")
        .node_port(30180)
        .balance("maglev");
    let slice = EndpointSlice::for_service(&svc)
        .ipv6()
        .ready_all(cluster.pod_ip6s());
    let agent = Agent::start(
        &cluster.node,
        &AgentOptions::backend("iptables").dual_stack(),
        &[("web6.yaml", yaml(&[&svc, &slice]))],
    )
    .expect("agent starts");
    agent
        .wait_for("web6 with its endpoints", Duration::from_secs(15), |s| {
            s.service("default/web6:http/TCP")
                .is_some_and(|w| w.endpoints.len() == PODS && w.algorithm == "maglev")
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let echo6 = |pod: &str| {
        let p = cluster
            .pod(pod)
            .unwrap_or_else(|| panic!("unknown pod {pod:?}"));
        SocketAddr::new(IpAddr::V6(p.ip6.expect("an IPv6 pod")), ECHO_PORT)
    };
    let t = MaglevTable::new(
        cluster
            .pods
            .iter()
            .map(|p| SocketAddr::new(IpAddr::V6(p.ip6.expect("an IPv6 pod")), ECHO_PORT)),
        TableSize::default(),
    );
    let dst = SocketAddr::new(IpAddr::V6(NODE_IP6), 30180);
    for udp in [false, true] {
        let what = if udp {
            "UDP over IPv6"
        } else {
            "TCP over IPv6"
        };
        let mut reached = BTreeMap::new();
        let flows: Vec<(SocketAddr, SocketAddr)> = (24000..24000 + FLOWS)
            .map(|port| {
                let from = SocketAddr::new(IpAddr::V6(CLIENT_IP6), port);
                let r = if udp {
                    udp_request_from(&cluster.client, from, dst, TIMEOUT)
                } else {
                    tcp_request_from(&cluster.client, from, dst, TIMEOUT)
                };
                let r =
                    r.unwrap_or_else(|e| panic!("{what} {from} -> {dst}: {e}\n{}", agent.log()));
                assert_ne!(
                    r.peer.ip(),
                    IpAddr::V6(CLIENT_IP6),
                    "{what} {from}: the endpoint saw the client's own address (no masquerade)"
                );
                *reached.entry(r.pod.clone()).or_insert(0) += 1;
                (from, echo6(&r.pod))
            })
            .collect();
        assert_follows("iptables", what, &flows, &t, dst);
        assert_eq!(
            reached.len(),
            PODS,
            "{what}: every endpoint gets flows: {reached:?}"
        );
    }
}

/// iptables carries the slot in the packet mark below the masquerade bit: a table larger than
/// 16381 slots is refused at start, naming the flag.
#[test]
fn iptables_refuses_a_table_past_the_mark_bits() {
    let n = node("iptables");
    let refused = Agent::start(
        &n.cluster.node,
        &AgentOptions::backend("iptables")
            .arg("--maglev-table-size")
            .arg("32749"),
        &[],
    );
    let e = refused.expect_err("iptables with a 32749-slot table must not start");
    assert!(
        e.to_string().contains(
            "--maglev-table-size 32749: the iptables backend takes tables of at most 16381 slots"
        ),
        "{e}"
    );
}

/// `proxy trace --backend iptables --src-port` walks the HMARK rules to the flow's slot and
/// endpoint; without the source port it gives each endpoint its share of the slots.
fn assert_iptables_trace_gives_the_slot(
    cluster: &Cluster,
    agent: &Agent<'_>,
    (from, reached): (SocketAddr, SocketAddr),
    t: &MaglevTable,
    dst: SocketAddr,
) {
    let trace = |port: Option<u16>| {
        let mut cmd = cluster
            .node
            .exec(agent.binary())
            .expect("a command in the node namespace");
        cmd.args([
            "trace",
            "--backend",
            "iptables",
            &from.ip().to_string(),
            &format!("{dst}/tcp"),
        ]);
        if let Some(p) = port {
            cmd.args(["--src-port", &p.to_string()]);
        }
        let out = cmd.output().expect("proxy trace runs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let text = trace(Some(from.port()));
    let slot = t.slot_of(hmark_hash(from, dst, 6, HMARK_RND));
    assert!(
        text.contains(&format!(
            "decision: dnat to {reached} (maglev: the flow's maglev table slot {slot} of 16381)"
        )),
        "proxy trace for {from}:\n{text}"
    );
    let text = trace(None);
    for (ep, slots) in t.slot_counts() {
        let share = f64::from(slots) / 16381.0 * 100.0;
        assert!(
            text.contains(&format!("{ep} {share:.1}%"))
                || text.contains(&format!("{ep} {share:.0}%")),
            "each endpoint's share of the slots ({ep}: {share:.1}%):\n{text}"
        );
    }
}
