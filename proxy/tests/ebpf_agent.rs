//! The real agent binary with `--backend ebpf`: `proxy run` in the node namespace of a kpr-tests
//! cluster, its socket programs on a test cgroup, its pins under a private `--bpffs-path`, its
//! tc program on the node namespace's interfaces; Services from manifest files. `proxy trace` and
//! `proxy inspect --maps` are checked against what the programs really do.
//!
//! Run as root: `cargo test -p proxy --features kpr-tests/root --test ebpf_agent`.

mod ebpf_support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ebpf_support::*;
use kpr_tests::cluster::{ClusterSpec, CLIENT_IP, NODE_IP, PODCLIENT_IP};
use kpr_tests::{yaml, Agent, Cgroup, Cluster, EndpointSlice, Service};
use proxy::dataplane::ebpf::inspect::MapSnapshot;
use proxy::dataplane::ebpf::trace::{netns_cookie, trace, Decision, TraceRequest};
use proxy::model::Protocol;

/// Not a test: the body of the client processes the tests spawn.
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    run_client(&spec);
}

/// One agent at a time: each loads and verifies the programs, which is slow on small or emulated
/// machines (the VM matrix), and the agents' starts would race for the 30 s ready timeout.
static ONE_AGENT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_agent() -> std::sync::MutexGuard<'static, ()> {
    ONE_AGENT.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn agent_balances_cluster_ip_and_node_port_with_the_ebpf_backend() {
    let _one = one_agent();
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let cgroup = Cgroup::new("agent").unwrap();
    let svc = Service::new("web")
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .named("http")
        .node_port(30080);
    let slice = EndpointSlice::for_service(&svc).ready_all(cluster.pod_ips());
    let opts = agent_options(&cgroup);
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

/// Four Services in the maps: round-robin, least-conn, affinity, no endpoints.
fn trace_manifests(cluster: &Cluster) -> String {
    let ips = cluster.pod_ips();
    let rr = Service::new("rr")
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .node_port(30080);
    let lc = Service::new("lc")
        .cluster_ip("10.96.0.11")
        .tcp(80, 8080)
        .balance("least-conn");
    let aff = Service::new("aff")
        .cluster_ip("10.96.0.12")
        .tcp(80, 8080)
        .affinity(600);
    let empty = Service::new("empty").cluster_ip("10.96.0.13").tcp(80, 8080);
    let rr_s = EndpointSlice::for_service(&rr).ready_all(ips.clone());
    let lc_s = EndpointSlice::for_service(&lc).ready_all(ips.clone());
    let aff_s = EndpointSlice::for_service(&aff).ready_all(ips);
    let empty_s = EndpointSlice::for_service(&empty);
    yaml(&[&rr, &rr_s, &lc, &lc_s, &aff, &aff_s, &empty, &empty_s])
}

/// The decision for a new connection from the pod client to `dst`, from the pinned maps.
fn decide(bpffs: &std::path::Path, dst: &str, netns_cookie: Option<u64>) -> Decision {
    let dst: std::net::SocketAddrV4 = dst.parse().unwrap();
    let snap = MapSnapshot::read(bpffs).expect("reading the pinned maps");
    let req = TraceRequest {
        src: PODCLIENT_IP.into(),
        dst: (*dst.ip()).into(),
        port: dst.port(),
        proto: Protocol::Tcp,
        external: false,
        netns_cookie,
        sport: None,
    };
    trace(&snap, &req).decision
}

/// The address of the pod a client line (`pod NAME`) names.
fn pod_ip(cluster: &Cluster, line: &str) -> IpAddr {
    let name = line
        .strip_prefix("pod ")
        .unwrap_or_else(|| panic!("{line}"));
    cluster.pod(name).expect("a pod of the cluster").ip.into()
}

fn picked(d: &Decision, algorithm: &str) -> IpAddr {
    match d {
        Decision::Picked {
            algorithm: a,
            backend,
            ..
        } if *a == algorithm => backend.addr,
        other => panic!("expected a {algorithm} pick, got {other:?}"),
    }
}

/// Runs the proxy binary (reads pins only; no networking) and returns stdout, asserting success.
fn proxy_out(args: &[&str]) -> String {
    kpr_tests::proxy_stdout(std::process::Command::new(env!("CARGO_BIN_EXE_proxy")).args(args))
}

#[test]
fn trace_predicts_each_decision_and_inspect_shows_the_maps() {
    let _one = one_agent();
    let cluster = Cluster::new(ClusterSpec::pods(3)).unwrap();
    let cgroup = Cgroup::new("trace").unwrap();
    let opts = agent_options(&cgroup);
    let agent = Agent::start(
        &cluster.node,
        &opts,
        &[("svc.yaml", trace_manifests(&cluster))],
    )
    .unwrap_or_else(|e| panic!("agent: {e}"));
    let bpffs = agent.bpffs_path().expect("ebpf agent").to_path_buf();
    let pc = &cluster.podclient;

    // Round-robin: the predicted endpoint is the one the next connection gets, every time.
    for _ in 0..4 {
        let want = picked(&decide(&bpffs, "10.96.0.10:80", None), "round-robin");
        let got = client_lines(pc, &cgroup, "tcp 10.96.0.10:80 1");
        assert_eq!(pod_ip(&cluster, &got[0]), want, "{}", agent.log());
    }

    // Least-connection: two held connections; the prediction is the idle third endpoint.
    let mut held = spawn_client(pc, &cgroup, "hold 10.96.0.11:80 2");
    let mut out = std::io::BufReader::new(held.stdout.take().unwrap());
    let mut busy = Vec::new();
    loop {
        let mut line = String::new();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0);
        match kpr_lines(&line).first().map(String::as_str) {
            Some("ready") => break,
            Some(l) => busy.push(pod_ip(&cluster, l)),
            None => {}
        }
    }
    let want = picked(&decide(&bpffs, "10.96.0.11:80", None), "least-conn");
    assert!(
        !busy.contains(&want),
        "{want} already has a connection: {busy:?}"
    );
    let got = client_lines(pc, &cgroup, "tcp 10.96.0.11:80 1");
    assert_eq!(pod_ip(&cluster, &got[0]), want);
    drop(held.stdin.take());
    let _ = held.wait();

    // Affinity: after one connection, the client's namespace sticks to that endpoint.
    let netns = std::path::Path::new("/run/netns").join(pc.name());
    let cookie = netns_cookie(&netns).expect("netns cookie");
    assert!(
        !matches!(
            decide(&bpffs, "10.96.0.12:80", Some(cookie)),
            Decision::AffinityHit(_)
        ),
        "no entry before the first connection"
    );
    let first = client_lines(pc, &cgroup, "tcp 10.96.0.12:80 1");
    let stuck = pod_ip(&cluster, &first[0]);
    match decide(&bpffs, "10.96.0.12:80", Some(cookie)) {
        Decision::AffinityHit(b) => assert_eq!(b.addr, stuck),
        other => panic!("expected an affinity hit on {stuck}, got {other:?}"),
    }
    // Another client (no entry for it) gets the algorithm's pick.
    picked(
        &decide(&bpffs, "10.96.0.12:80", Some(cookie ^ 1)),
        "round-robin",
    );

    // No endpoints: rejected, and a real connect is refused.
    assert_eq!(
        decide(&bpffs, "10.96.0.13:80", None),
        Decision::NoEndpoints {
            dropped: false,
            external: false
        }
    );
    let got = client_lines(pc, &cgroup, "tcp 10.96.0.13:80 1");
    assert!(got[0].starts_with("err"), "{got:?}");
    // A clusterIP's other port, an unallocated service address, and no service at all.
    assert_eq!(
        decide(&bpffs, "10.96.0.10:81", None),
        Decision::RejectedPort
    );
    assert_eq!(
        decide(&bpffs, "10.96.0.77:80", None),
        Decision::DroppedUnallocated
    );
    assert_eq!(
        decide(&bpffs, "198.51.100.7:80", None),
        Decision::PassThrough
    );

    // The commands print the same, straight from the pins.
    let pins = bpffs.to_string_lossy().into_owned();
    let netns_arg = netns.to_string_lossy().into_owned();
    let args = [
        "trace",
        "--bpffs-path",
        &pins,
        "--netns",
        &netns_arg,
        "10.244.200.2",
        "10.96.0.12:80/tcp",
    ];
    let t = proxy_out(&args);
    assert!(
        t.contains("service frontend 10.96.0.12:80/TCP") && t.contains("3 backends"),
        "{t}"
    );
    assert!(
        t.contains(&format!("decision: affinity hit: -> {stuck}:8080")),
        "{t}"
    );
    let t = proxy_out(&[
        "trace",
        "--bpffs-path",
        &pins,
        "10.244.200.2",
        "10.96.0.13:80",
    ]);
    assert!(t.contains("decision: rejected: no endpoints"), "{t}");
    let inspect = proxy_out(&["inspect", "--maps", "--bpffs-path", &pins]);
    eprintln!("{inspect}");
    for want in [
        "10.96.0.10:80/TCP",
        "least-conn",
        "affinity 600s",
        "(no endpoints: connections are rejected)",
        &format!("affinity netns cookie {cookie} -> {stuck}:8080"),
        // No endpoint left any Service here (ebpf_sock_destroy.rs destroys some).
        "sockets destroyed (connected to endpoints that left): 0 tcp, 0 udp",
    ] {
        assert!(inspect.contains(want), "{want:?} missing:\n{inspect}");
    }
    // The agent says at start whether it destroys the sockets of removed endpoints: it does
    // where the kernel has the kfunc (6.5+), and says why not elsewhere (the VM matrix's 6.1).
    let said = match proxy::dataplane::ebpf::sockterm::probe() {
        proxy::dataplane::ebpf::sockterm::Support::Kfunc(_) => {
            "sockets connected to a removed endpoint are destroyed"
        }
        proxy::dataplane::ebpf::sockterm::Support::Missing(_) => {
            "sockets connected to a removed endpoint are not destroyed: this kernel has no \
             bpf_sock_destroy kfunc (Linux 6.5+)"
        }
    };
    assert!(agent.log().contains(said), "{said:?}:\n{}", agent.log());
    let json: serde_json::Value = serde_json::from_str(&proxy_out(&[
        "inspect",
        "--maps",
        "--json",
        "--bpffs-path",
        &pins,
    ]))
    .expect("inspect --maps --json prints JSON");
    assert_eq!(json["sockets_destroyed"]["tcp"], 0, "{json}");
    let aff = json["frontends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["frontend"] == "10.96.0.12:80/TCP")
        .expect("the affinity Service in the JSON");
    assert_eq!(aff["affinity_seconds"], 600, "{aff}");
    assert_eq!(
        aff["affinity"][0]["netns_cookie"],
        cookie.to_string(),
        "{aff}"
    );
    // Counters are per endpoint, shared by the Services using it: 4 (rr) + 3 (lc) + 1 (aff)
    // connections went to these three endpoints, none is still open.
    let snap = MapSnapshot::read(&bpffs).unwrap();
    let rr = snap
        .frontend(
            Ipv4Addr::new(10, 96, 0, 10).into(),
            80,
            Protocol::Tcp,
            false,
        )
        .unwrap();
    assert_eq!(rr.slots.iter().map(|s| s.total).sum::<u64>(), 8);
    assert!(rr.slots.iter().all(|s| s.active == 0), "{:?}", rr.slots);

    // The tc path: the nodePort frontend as an outside client sees it.
    for _ in 0..3 {
        let req = TraceRequest {
            src: CLIENT_IP.into(),
            dst: NODE_IP.into(),
            port: 30080,
            proto: Protocol::Tcp,
            external: true,
            netns_cookie: None,
            sport: None,
        };
        let d = trace(&MapSnapshot::read(&bpffs).unwrap(), &req).decision;
        let want = picked(&d, "round-robin");
        let r = kpr_tests::tcp_request(
            &cluster.client,
            (NODE_IP, 30080).into(),
            Duration::from_secs(2),
        )
        .unwrap_or_else(|e| panic!("nodePort: {e}\n{}", agent.log()));
        assert_eq!(cluster.pod(&r.pod).unwrap().ip, want);
    }
    let t = proxy_out(&[
        "trace",
        "--bpffs-path",
        &pins,
        "--from-outside",
        "192.0.2.100",
        "192.0.2.1:30080/tcp",
    ]);
    assert!(
        t.contains("tc path") && t.contains("decision: round-robin: next connection ->"),
        "{t}"
    );
}

#[test]
fn program_logs_reach_the_agent_log_and_a_full_map_names_the_service_and_counts() {
    let _one = one_agent();
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let cgroup = Cgroup::new("full").unwrap();
    let web = Service::new("web").cluster_ip("10.96.0.10").tcp(80, 8080);
    let web_s = EndpointSlice::for_service(&web).ready_all(cluster.pod_ips());
    let opts = agent_options(&cgroup);
    let mut agent = Agent::start(&cluster.node, &opts, &[("web.yaml", yaml(&[&web, &web_s]))])
        .unwrap_or_else(|e| panic!("agent: {e}"));
    agent.kill();
    // Restarted with one socket slot and three service entries (web takes two: its frontend
    // and its clusterIP): the pinned maps are resized down, web's entries carried over.
    agent
        .restart_with(&["--bpf-sockets-max=1", "--bpf-lb-services-max=3"])
        .unwrap_or_else(|e| panic!("restart with tiny maps: {e}"));
    agent
        .wait_for_log(
            "map KPR_SERVICES resized from 262144 to 3 entries",
            Duration::from_secs(5),
        )
        .unwrap_or_else(|e| panic!("{e}:\n{}", agent.log()));

    // The second held socket finds KPR_SOCKS full: the program's aya-log warning is in the log.
    let mut held = spawn_client(&cluster.podclient, &cgroup, "hold 10.96.0.10:80 2");
    let mut out = std::io::BufReader::new(held.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("KPR ready") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "{}",
            agent.log()
        );
    }
    agent
        .wait_for_log("KPR_SOCKS is full", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}:\n{}", agent.log()));
    drop(held.stdin.take());
    let _ = held.wait();

    // A second Service does not fit: the sync error names the map and the Service port.
    let api = Service::new("api").cluster_ip("10.96.0.20").tcp(80, 8080);
    let api_s = EndpointSlice::for_service(&api).ready_all(cluster.pod_ips());
    agent
        .write_manifest("api.yaml", &yaml(&[&api, &api_s]))
        .unwrap();
    let log = agent
        .wait_for_log("KPR_SERVICES is full (3 entries)", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}:\n{}", agent.log()));
    assert!(log.contains("Service port default/api"), "{log}");
    let metrics = agent.metrics().unwrap();
    let full = metrics
        .lines()
        .find(|l| l.starts_with("kpr_map_full_total{map=\"KPR_SERVICES\"}"))
        .unwrap_or_else(|| panic!("no kpr_map_full_total for KPR_SERVICES:\n{metrics}"));
    let n: f64 = full.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1.0, "{full}");
    // The Service that fits keeps working.
    let got = client_lines(&cluster.podclient, &cgroup, "tcp 10.96.0.10:80 2");
    assert_eq!(pod_counts(&got).len(), 2, "{got:?}");
}
