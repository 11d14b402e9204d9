//! The userspace backend in real network namespaces: the agent runs in a "node" namespace, echo
//! servers in pod namespaces, clients in the "podclient" (pod source), "client" (external source)
//! and node namespaces. Every test builds its own cluster; all of it is removed on drop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kpr_tests::cluster::{ClusterSpec, NODE_IP, NODE_IP6};
use kpr_tests::probe::parse_probe_output;
use kpr_tests::{
    run_probe, tcp_hold, tcp_request, udp_request, yaml, Agent, AgentOptions, Cgroup, Cluster,
    EndpointSlice, Manifest, Netns, ProbeLine, Service,
};

const BACKEND: &str = "userspace";
const T: Duration = Duration::from_secs(3);
const CHANGE: Duration = Duration::from_secs(10);

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// `web`: clusterIP 10.96.0.10:80 -> pods:8080 (port name `http`), NodePort 30080; the
/// conformance suite's Service.
use kpr_tests::conformance::scenarios::web;

fn slice_all(svc: &Service, cluster: &Cluster) -> EndpointSlice {
    EndpointSlice::for_service(svc).ready_all(cluster.pod_ips())
}

fn start<'c>(cluster: &'c Cluster, balance: &str, files: &[(&str, String)]) -> Agent<'c> {
    Agent::start(
        &cluster.node,
        &AgentOptions::backend(BACKEND).balance(balance),
        files,
    )
    .unwrap()
}

/// `n` sequential TCP requests; returns how many each pod answered. Any failure fails the test.
fn tally_tcp(ns: &Netns, to: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for i in 0..n {
        let reply = tcp_request(ns, to, T)
            .unwrap_or_else(|e| panic!("request {i} to {to} from {}: {e}", ns.name()));
        *counts.entry(reply.pod).or_insert(0) += 1;
    }
    counts
}

#[test]
fn round_robin_spreads_400_connections_evenly_over_4_endpoints() {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let svc = web();
    let agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    let state = agent.state().unwrap();
    let port = state
        .service("default/web:http/TCP")
        .expect("web in /state");
    assert_eq!(port.endpoints.len(), 4, "{port:?}");
    assert_eq!(port.algorithm, "round-robin");

    let node_port = SocketAddr::from((NODE_IP, 30080));
    for (label, ns, to) in [
        (
            "podclient -> clusterIP",
            &cluster.podclient,
            addr("10.96.0.10:80"),
        ),
        ("client -> nodePort", &cluster.client, node_port),
        ("node -> clusterIP", &cluster.node, addr("10.96.0.10:80")),
    ] {
        let counts = tally_tcp(ns, to, 400);
        assert_eq!(
            counts.len(),
            4,
            "{label}: every endpoint got traffic: {counts:?}"
        );
        for (pod, n) in &counts {
            assert!(
                (99..=101).contains(n),
                "{label}: {pod} got {n} of 400 connections: {counts:?}"
            );
        }
    }
}

#[test]
fn least_connection_by_annotation_steers_new_connections_away_from_a_busy_endpoint() {
    least_connection_steers_away_from_busy_endpoint(web().balance("least-conn"), "round-robin");
}

#[test]
fn least_connection_by_node_flag_steers_new_connections_away_from_a_busy_endpoint() {
    least_connection_steers_away_from_busy_endpoint(web(), "least-conn");
}

/// Five long connections on pod0 while it is the only endpoint, then three idle endpoints join:
/// new connections must avoid pod0 until its connections close.
fn least_connection_steers_away_from_busy_endpoint(svc: Service, node_balance: &str) {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let only_pod0 = EndpointSlice::for_service(&svc).ready(cluster.pods[0].ip);
    let agent = start(
        &cluster,
        node_balance,
        &[("web.yaml", yaml(&[&svc, &only_pod0]))],
    );
    let vip = addr("10.96.0.10:80");

    // Five long connections, all on pod0 (the only endpoint yet).
    let mut held: Vec<_> = (0..5)
        .map(|_| tcp_hold(&cluster.client, vip).unwrap())
        .collect();
    assert!(held.iter().all(|c| c.reply.pod == "pod0"));

    agent
        .write_manifest("web.yaml", &yaml(&[&svc, &slice_all(&svc, &cluster)]))
        .unwrap();
    let state = agent
        .wait_for("4 endpoints for web", CHANGE, |s| {
            s.service("default/web:http/TCP")
                .is_some_and(|p| p.endpoints.len() == 4)
        })
        .unwrap();
    let port = state.service("default/web:http/TCP").unwrap();
    assert_eq!(
        port.algorithm, "least-conn",
        "from the annotation or --balance"
    );
    let pod0 = port
        .endpoints
        .iter()
        .find(|e| e.addr == "10.244.1.2:8080")
        .expect("pod0 listed");
    assert_eq!(
        pod0.active,
        Some(5),
        "the userspace backend counts active connections exactly"
    );

    // New short connections go to the idle endpoints only; with round-robin pod0 would get 1 in 4.
    let counts = tally_tcp(&cluster.client, vip, 30);
    assert_eq!(
        counts.get("pod0"),
        None,
        "pod0 holds 5 connections and must get none: {counts:?}"
    );
    assert_eq!(counts.len(), 3, "{counts:?}");

    // Once the long connections close, pod0 is preferred again (it is among the least loaded).
    assert!(
        held.iter_mut().all(|c| c.is_alive()),
        "long connections survived the resync"
    );
    held.into_iter().for_each(|c| c.close());
    agent
        .wait_for("pod0 idle", CHANGE, |s| {
            s.service("default/web:http/TCP")
                .and_then(|p| {
                    p.endpoints
                        .iter()
                        .find(|e| e.addr == "10.244.1.2:8080")
                        .map(|e| e.active == Some(0))
                })
                .unwrap_or(false)
        })
        .unwrap();
    let counts = tally_tcp(&cluster.client, vip, 8);
    assert!(counts.get("pod0").copied().unwrap_or(0) >= 1, "{counts:?}");
}

#[test]
fn session_affinity_client_ip_sticks_to_one_endpoint_per_client() {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let svc = web().affinity(60);
    let _agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    for (label, ns) in [
        ("podclient", &cluster.podclient),
        ("client", &cluster.client),
        ("node", &cluster.node),
    ] {
        let counts = tally_tcp(ns, addr("10.96.0.10:80"), 20);
        assert_eq!(
            counts.len(),
            1,
            "{label}: all 20 connections on one endpoint: {counts:?}"
        );
    }
}

#[test]
fn a_refused_endpoint_is_skipped_and_the_client_never_sees_the_refusal() {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let svc = web();
    let _agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    cluster.stop_echo(2);
    let counts = tally_tcp(&cluster.podclient, addr("10.96.0.10:80"), 40);
    assert_eq!(counts.get("pod2"), None, "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 40);
    assert_eq!(
        counts.len(),
        3,
        "the other three share the load: {counts:?}"
    );
}

#[test]
fn a_service_without_endpoints_rejects_at_once() {
    let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
    let empty = Service::new("empty")
        .cluster_ip("10.96.0.20")
        .tcp(80, 8080)
        .named("http");
    let no_slice = Service::new("noslice")
        .cluster_ip("10.96.0.21")
        .tcp(80, 8080)
        .named("http");
    let files = [(
        "empty.yaml",
        yaml(&[&empty, &EndpointSlice::for_service(&empty), &no_slice]),
    )];
    let _agent = start(&cluster, "round-robin", &files);
    for (label, ns) in [
        ("podclient", &cluster.podclient),
        ("client", &cluster.client),
        ("node", &cluster.node),
    ] {
        for vip in ["10.96.0.20:80", "10.96.0.21:80"] {
            let started = Instant::now();
            let err = tcp_request(ns, addr(vip), T).expect_err("no endpoint can answer");
            let took = started.elapsed();
            assert!(
                err.is_rejection(),
                "{label} -> {vip}: expected refused/reset/unreachable, got {err:?}"
            );
            assert!(
                took < Duration::from_secs(1),
                "{label} -> {vip}: rejection took {took:?}"
            );
        }
    }
}

#[test]
fn udp_requests_are_answered_by_every_endpoint() {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let svc = Service::new("dns")
        .cluster_ip("10.96.0.53")
        .udp(53, 8080)
        .named("dns")
        .node_port(30053);
    let _agent = start(
        &cluster,
        "round-robin",
        &[("dns.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    let node_port = SocketAddr::from((NODE_IP, 30053));
    for (label, ns, to) in [
        ("podclient", &cluster.podclient, addr("10.96.0.53:53")),
        ("node", &cluster.node, addr("10.96.0.53:53")),
        ("client", &cluster.client, addr("10.96.0.53:53")),
        ("client via nodePort", &cluster.client, node_port),
    ] {
        let mut counts = BTreeMap::new();
        for i in 0..20 {
            let r = udp_request(ns, to, T)
                .unwrap_or_else(|e| panic!("{label}: datagram {i} to {to}: {e}"));
            *counts.entry(r.pod).or_insert(0) += 1;
        }
        assert_eq!(
            counts.len(),
            4,
            "{label}: each new client port is a new session: {counts:?}"
        );
    }
}

#[test]
fn an_endpoint_removed_from_the_manifests_gets_no_new_connections() {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let svc = web();
    let agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    let vip = addr("10.96.0.10:80");
    assert_eq!(tally_tcp(&cluster.client, vip, 8).len(), 4);

    let three = EndpointSlice::for_service(&svc).ready_all(cluster.pod_ips().into_iter().take(3));
    agent
        .write_manifest("web.yaml", &yaml(&[&svc, &three]))
        .unwrap();
    agent
        .wait_for("3 endpoints", CHANGE, |s| {
            s.service("default/web:http/TCP")
                .is_some_and(|p| p.endpoints.len() == 3)
        })
        .unwrap();
    for (label, ns) in [
        ("client", &cluster.client),
        ("podclient", &cluster.podclient),
        ("node", &cluster.node),
    ] {
        let counts = tally_tcp(ns, vip, 30);
        assert_eq!(counts.get("pod3"), None, "{label}: {counts:?}");
        assert_eq!(counts.len(), 3, "{label}: {counts:?}");
    }

    agent.remove_manifest("web.yaml").unwrap();
    agent
        .wait_for("web gone", CHANGE, |s| {
            s.service("default/web:http/TCP").is_none()
        })
        .unwrap();
    let err = tcp_request(&cluster.client, vip, T).expect_err("the Service is gone");
    assert!(
        err.is_rejection() || err == kpr_tests::ClientError::Timeout,
        "{err:?}"
    );
}

#[test]
fn node_port_and_cluster_ip_work_from_every_source() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let svc = web();
    let _agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    let node_port = SocketAddr::from((NODE_IP, 30080));
    for (label, ns, to) in [
        ("client -> nodePort", &cluster.client, node_port),
        (
            "client -> clusterIP",
            &cluster.client,
            addr("10.96.0.10:80"),
        ),
        (
            "podclient -> clusterIP",
            &cluster.podclient,
            addr("10.96.0.10:80"),
        ),
        ("podclient -> nodePort", &cluster.podclient, node_port),
        ("node -> clusterIP", &cluster.node, addr("10.96.0.10:80")),
        ("node -> nodePort", &cluster.node, node_port),
    ] {
        let counts = tally_tcp(ns, to, 4);
        assert_eq!(counts.len(), 2, "{label}: {counts:?}");
    }
}

/// `kubectl get services,endpointslices -A -o json` writes one `kind: List`: its Services and
/// EndpointSlices are served, and what cannot be used (a Pod item, a Service without clusterIP, a
/// hostile file next to it) is listed by `proxy inspect` under "input problems" with file, object
/// and field, without holding up the rest.
#[test]
fn a_kubectl_list_is_served_and_what_cannot_be_used_is_listed_by_inspect() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let svc = web();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "default", "uid": "1b8f3d6a-2c9e-4a07"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        "status": {"phase": "Running"},
    });
    let unallocated = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "my-service", "namespace": "default"},
        "spec": {"selector": {"app": "MyApp"}, "ports": [{"protocol": "TCP", "port": 80, "targetPort": 9376}]},
    });
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [svc.to_value(), pod, slice_all(&svc, &cluster).to_value(), unallocated],
    });
    let deep = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {}\n",
        "[".repeat(1 << 20)
    );
    let agent = start(
        &cluster,
        "round-robin",
        &[("dump.json", list.to_string()), ("deep.yaml", deep)],
    );
    let state = agent
        .wait_for("three input problems", CHANGE, |s| s.errors.len() >= 3)
        .unwrap();
    assert_eq!(state.errors.len(), 3, "{:#?}", state.errors);
    assert_eq!(
        tally_tcp(&cluster.client, addr("10.96.0.10:80"), 4).len(),
        2
    );
    let inspect = cluster
        .node
        .exec(agent.binary())
        .unwrap()
        .arg("inspect")
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{inspect:?}");
    let printed = String::from_utf8_lossy(&inspect.stdout);
    let problems = printed
        .split_once("\ninput problems:\n")
        .unwrap_or_else(|| panic!("no input problems in:\n{printed}"))
        .1;
    for wanted in [
        "dump.json: Pod default/web-0: items[1].kind: the file source uses only Service, \
         EndpointSlice and Node objects",
        "dump.json: Service default/my-service: items[3].spec.clusterIP: missing: the file \
         source has no IP allocator",
        "deep.yaml: document #0: line 3: recursion limit exceeded",
    ] {
        assert!(
            problems.lines().any(|l| l.contains(wanted)),
            "{wanted:?} missing from:\n{printed}"
        );
    }
}

#[test]
fn a_malformed_manifest_is_reported_by_file_and_field_while_other_services_keep_working() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let svc = web();
    let broken = "apiVersion: v1\nkind: Service\nmetadata:\n  name: broken\n  namespace: default\n\
                  spec:\n  clusterIP: 10.96.0.30\n  ports:\n  - port: eighty\n    targetPort: 8080\n";
    let agent = start(
        &cluster,
        "round-robin",
        &[
            ("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)])),
            ("broken.yaml", broken.to_string()),
        ],
    );
    let state = agent
        .wait_for("an input error", CHANGE, |s| !s.errors.is_empty())
        .unwrap();
    let err = state
        .errors
        .iter()
        .find(|e| e.contains("broken.yaml"))
        .unwrap_or_else(|| panic!("{:?}", state.errors));
    assert!(
        err.contains("spec.ports[0].port"),
        "the error names the field: {err}"
    );
    let log = agent.wait_for_log("broken.yaml", CHANGE).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("broken.yaml") && l.contains("spec.ports[0].port")),
        "the log names file and field:\n{log}"
    );
    assert_eq!(
        tally_tcp(&cluster.client, addr("10.96.0.10:80"), 4).len(),
        2
    );

    // Changes after the bad file are still programmed.
    let api = Service::new("api")
        .cluster_ip("10.96.0.11")
        .tcp(80, 8080)
        .named("http");
    agent
        .write_manifest("api.yaml", &yaml(&[&api, &slice_all(&api, &cluster)]))
        .unwrap();
    agent
        .wait_for("api programmed", CHANGE, |s| {
            s.service("default/api:http/TCP").is_some()
        })
        .unwrap();
    assert_eq!(
        tally_tcp(&cluster.podclient, addr("10.96.0.11:80"), 4).len(),
        2
    );
}

#[test]
fn the_probe_binary_is_a_client_process_with_the_same_answers() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let svc = web();
    let dns = Service::new("dns")
        .cluster_ip("10.96.0.53")
        .udp(53, 8080)
        .named("dns");
    let files = [
        ("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)])),
        ("dns.yaml", yaml(&[&dns, &slice_all(&dns, &cluster)])),
    ];
    let _agent = start(&cluster, "round-robin", &files);
    // As a plain process in the pod-client namespace.
    let out = cluster
        .podclient
        .command(env!("CARGO_BIN_EXE_probe"))
        .args(["tcp", "10.96.0.10:80", "--count", "6"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = parse_probe_output(&text).unwrap();
    assert_eq!(lines.len(), 6, "{text}");
    let pod0 = lines
        .iter()
        .filter(|l| matches!(l, ProbeLine::Reply(r) if r.pod == "pod0"))
        .count();
    assert_eq!(pod0, 3, "round-robin over two endpoints: {text}");

    // Held connections, from a process inside a test cgroup (as the eBPF tests run them).
    let cgroup = Cgroup::new("probe").unwrap();
    let held = run_probe(
        &cluster.client,
        Some(&cgroup),
        &["tcp", "10.96.0.10:80", "--count", "2", "--hold", "1"],
    )
    .unwrap();
    assert!(held.success, "{held:?}");
    let alive = held
        .lines
        .iter()
        .filter(|l| matches!(l, ProbeLine::Alive(_)))
        .count();
    assert_eq!(alive, 2, "{held:?}");

    let udp = run_probe(
        &cluster.node,
        None,
        &["udp", "10.96.0.53:53", "--count", "4"],
    )
    .unwrap();
    assert!(udp.success, "{udp:?}");
    assert_eq!(udp.replies().len(), 4);

    // A failure is printed, not hidden, and fails the exit status.
    let refused = run_probe(
        &cluster.client,
        None,
        &["tcp", &format!("{}:9", cluster.pods[0].ip)],
    )
    .unwrap();
    assert!(!refused.success);
    assert_eq!(refused.errors(), vec!["refused"]);
}

#[test]
fn external_ips_and_load_balancer_ips_reach_the_endpoints() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let ext = Service::new("ext")
        .cluster_ip("10.96.0.40")
        .tcp(80, 8080)
        .named("http")
        .external_ip("203.0.113.10");
    let lb = Service::new("lb")
        .cluster_ip("10.96.0.41")
        .tcp(80, 8080)
        .named("http")
        .node_port(30081)
        .load_balancer("198.51.100.10");
    let files = [
        ("ext.yaml", yaml(&[&ext, &slice_all(&ext, &cluster)])),
        ("lb.yaml", yaml(&[&lb, &slice_all(&lb, &cluster)])),
    ];
    let _agent = start(&cluster, "round-robin", &files);
    for (label, ns) in [
        ("client", &cluster.client),
        ("podclient", &cluster.podclient),
        ("node", &cluster.node),
    ] {
        for to in ["203.0.113.10:80", "198.51.100.10:80"] {
            let counts = tally_tcp(ns, addr(to), 4);
            assert_eq!(counts.len(), 2, "{label} -> {to}: {counts:?}");
        }
    }
}

#[test]
fn load_balancer_source_ranges_admit_only_listed_sources() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let lb = Service::new("lb")
        .cluster_ip("10.96.0.41")
        .tcp(80, 8080)
        .named("http")
        .node_port(30081)
        .load_balancer("198.51.100.10")
        .lb_source_range("10.244.200.0/24");
    let _agent = start(
        &cluster,
        "round-robin",
        &[("lb.yaml", yaml(&[&lb, &slice_all(&lb, &cluster)]))],
    );
    assert!(
        tcp_request(&cluster.podclient, addr("198.51.100.10:80"), T).is_ok(),
        "listed source"
    );
    let accepted = |c: &Cluster| {
        c.pods
            .iter()
            .map(|p| p.echo_counts().unwrap().1)
            .sum::<usize>()
    };
    let before = accepted(&cluster);
    let err = tcp_request(&cluster.client, addr("198.51.100.10:80"), T)
        .expect_err("192.0.2.100 is not listed");
    // The userspace proxy learns the source only after the kernel accepted the connection, so
    // "dropped" shows as a close without a byte; no endpoint may see the connection.
    assert!(
        err.is_rejection()
            || matches!(
                err,
                kpr_tests::ClientError::Timeout | kpr_tests::ClientError::Closed
            ),
        "{err:?}"
    );
    assert_eq!(
        accepted(&cluster),
        before,
        "no endpoint was reached from an unlisted source"
    );
}

#[test]
fn terminating_serving_endpoints_are_used_only_when_none_is_ready() {
    let cluster = Cluster::new(ClusterSpec::pods(3)).unwrap();
    let svc = web();
    let ips = cluster.pod_ips();
    let mixed = EndpointSlice::for_service(&svc)
        .ready(ips[0])
        .endpoint(kpr_tests::Endpoint::terminating(ips[1]))
        .endpoint(kpr_tests::Endpoint::not_ready(ips[2]));
    let agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &mixed]))],
    );
    let counts = tally_tcp(&cluster.podclient, addr("10.96.0.10:80"), 6);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        vec!["pod0"],
        "only the ready one: {counts:?}"
    );

    let only_terminating = EndpointSlice::for_service(&svc)
        .endpoint(kpr_tests::Endpoint::terminating(ips[1]))
        .endpoint(kpr_tests::Endpoint::not_ready(ips[2]));
    agent
        .write_manifest("web.yaml", &yaml(&[&svc, &only_terminating]))
        .unwrap();
    agent
        .wait_for("pod0 gone", CHANGE, |s| {
            s.service("default/web:http/TCP")
                .is_some_and(|p| !p.endpoints.iter().any(|e| e.addr == "10.244.1.2:8080"))
        })
        .unwrap();
    let counts = tally_tcp(&cluster.podclient, addr("10.96.0.10:80"), 6);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        vec!["pod1"],
        "fallback to serving-terminating: {counts:?}"
    );
}

#[test]
fn ports_and_protocols_a_service_does_not_expose_are_not_proxied() {
    let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
    let svc = web();
    let _agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    let err = tcp_request(&cluster.podclient, addr("10.96.0.10:81"), T)
        .expect_err("port 81 is not exposed");
    assert!(
        err.is_rejection() || err == kpr_tests::ClientError::Timeout,
        "{err:?}"
    );
    let err =
        udp_request(&cluster.podclient, addr("10.96.0.10:80"), T).expect_err("UDP is not exposed");
    assert!(
        err.is_rejection() || err == kpr_tests::ClientError::Timeout,
        "{err:?}"
    );
    assert!(tcp_request(&cluster.podclient, addr("10.96.0.10:80"), T).is_ok());
}

#[test]
fn a_pod_reaches_itself_through_its_service_hairpin() {
    let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
    let svc = web();
    let _agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    let r = tcp_request(&cluster.pods[0].ns, addr("10.96.0.10:80"), T).unwrap();
    assert_eq!(r.pod, "pod0");
    assert_ne!(
        r.peer.ip(),
        cluster.pods[0].ip,
        "hairpin traffic is masqueraded"
    );
}

#[test]
fn traffic_policies_local_use_only_this_nodes_endpoints() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let ips = cluster.pod_ips();
    // pod0 runs on this node, pod1 on another one (reachable through the node all the same).
    let etp = Service::new("etp")
        .cluster_ip("10.96.0.50")
        .tcp(80, 8080)
        .named("http")
        .node_port(30082)
        .external_traffic_local();
    let etp_slice = EndpointSlice::for_service(&etp)
        .ready(ips[0])
        .endpoint(kpr_tests::Endpoint::ready(ips[1]).on_node("other"));
    let itp = Service::new("itp")
        .cluster_ip("10.96.0.51")
        .tcp(80, 8080)
        .named("http")
        .internal_traffic_local();
    let itp_slice = EndpointSlice::for_service(&itp)
        .ready(ips[0])
        .endpoint(kpr_tests::Endpoint::ready(ips[1]).on_node("other"));
    let remote = Service::new("remote")
        .cluster_ip("10.96.0.52")
        .tcp(80, 8080)
        .named("http")
        .node_port(30083)
        .external_traffic_local();
    let remote_slice = EndpointSlice::for_service(&remote)
        .endpoint(kpr_tests::Endpoint::ready(ips[1]).on_node("other"));
    let files = [
        ("etp.yaml", yaml(&[&etp, &etp_slice])),
        ("itp.yaml", yaml(&[&itp, &itp_slice])),
        ("remote.yaml", yaml(&[&remote, &remote_slice])),
    ];
    let _agent = start(&cluster, "round-robin", &files);
    let pods = |counts: BTreeMap<String, usize>| counts.into_keys().collect::<Vec<_>>();

    assert_eq!(
        pods(tally_tcp(
            &cluster.client,
            SocketAddr::from((NODE_IP, 30082)),
            6
        )),
        vec!["pod0"],
        "eTP Local, external source"
    );
    assert_eq!(
        pods(tally_tcp(&cluster.podclient, addr("10.96.0.50:80"), 6)),
        vec!["pod0", "pod1"],
        "clusterIP ignores eTP"
    );
    assert_eq!(
        pods(tally_tcp(
            &cluster.podclient,
            SocketAddr::from((NODE_IP, 30082)),
            6
        )),
        vec!["pod0", "pod1"],
        "a pod source to an eTP Local nodePort is short-circuited to all endpoints"
    );
    assert_eq!(
        pods(tally_tcp(&cluster.podclient, addr("10.96.0.51:80"), 6)),
        vec!["pod0"],
        "iTP Local"
    );

    // eTP Local with no endpoint here: external traffic is dropped, cluster traffic still works.
    let err = tcp_request(&cluster.client, SocketAddr::from((NODE_IP, 30083)), T)
        .expect_err("no local endpoint");
    assert!(
        matches!(
            err,
            kpr_tests::ClientError::Timeout | kpr_tests::ClientError::Closed
        ),
        "dropped (the userspace proxy can only close what it accepted), not served: {err:?}"
    );
    assert_eq!(
        pods(tally_tcp(&cluster.podclient, addr("10.96.0.52:80"), 2)),
        vec!["pod1"]
    );
}

#[test]
fn one_udp_flow_stays_on_one_endpoint() {
    let cluster = Cluster::new(ClusterSpec::pods(4)).unwrap();
    let svc = Service::new("dns")
        .cluster_ip("10.96.0.53")
        .udp(53, 8080)
        .named("dns");
    let _agent = start(
        &cluster,
        "round-robin",
        &[("dns.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    for (label, ns) in [
        ("podclient", &cluster.podclient),
        ("client", &cluster.client),
        ("node", &cluster.node),
    ] {
        let session = kpr_tests::udp_session(ns, addr("10.96.0.53:53"), T).unwrap();
        let first = session.request().unwrap_or_else(|e| panic!("{label}: {e}"));
        for i in 1..10 {
            let r = session
                .request()
                .unwrap_or_else(|e| panic!("{label}: datagram {i}: {e}"));
            assert_eq!(
                r.pod, first.pod,
                "{label}: datagram {i} of one flow changed endpoint"
            );
        }
    }
}

/// A UDP client that keeps its socket across an agent restart is served by the new process on
/// its next datagram, from every source: the new process listens on new ports, and the flow's
/// conntrack entry (towards the old process's closed port, or untranslated when the client sent
/// while no agent ran) is removed at its first sync.
/// Without that, the flow's datagrams were refused until the client changed its socket
/// (`cluster chaos agent-restart` measured a UDP flow unanswered for 21 s).
#[test]
fn a_udp_flow_that_keeps_its_socket_is_served_after_a_restart() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let svc = Service::new("dns")
        .cluster_ip("10.96.0.53")
        .udp(53, 8080)
        .named("dns")
        .node_port(30053);
    let agent = start(
        &cluster,
        "round-robin",
        &[("dns.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    let flows = [
        ("podclient", &cluster.podclient, addr("10.96.0.53:53")),
        ("client", &cluster.client, addr("10.96.0.53:53")),
        (
            "client via nodePort",
            &cluster.client,
            SocketAddr::from((NODE_IP, 30053)),
        ),
    ];
    let sessions: Vec<_> = flows
        .iter()
        .map(|(label, ns, to)| {
            let session = kpr_tests::udp_session(ns, *to, T).unwrap();
            session
                .request()
                .unwrap_or_else(|e| panic!("{label}: before the restart: {e}"));
            session
        })
        .collect();
    // The flows keep sending while no agent runs (a DaemonSet's rollout leaves that gap).
    agent.stop();
    for session in &sessions {
        assert!(session.request().is_err(), "answered while no agent runs");
    }
    agent.restart().unwrap();
    for ((label, _, _), session) in flows.iter().zip(&sessions) {
        session
            .request()
            .unwrap_or_else(|e| panic!("{label}: the same socket after the restart: {e}"));
    }
}

#[test]
fn a_restarted_agent_serves_again_with_the_same_balancing() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let svc = web();
    let agent = start(
        &cluster,
        "round-robin",
        &[("web.yaml", yaml(&[&svc, &slice_all(&svc, &cluster)]))],
    );
    assert_eq!(
        tally_tcp(&cluster.client, addr("10.96.0.10:80"), 4).len(),
        2
    );
    agent.restart().unwrap();
    let state = agent.state().unwrap();
    assert!(state.synced, "{:?}", state.raw);
    let metrics = agent.metrics().unwrap();
    assert!(
        metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds"),
        "kube-proxy's metric names after the restart:\n{metrics}"
    );
    let counts = tally_tcp(&cluster.client, addr("10.96.0.10:80"), 10);
    assert_eq!(
        counts.values().copied().collect::<Vec<_>>(),
        vec![5, 5],
        "{counts:?}"
    );
}

/// A dual-stack Service is served on both families, each by its own family's endpoints (a
/// connection never changes family), from a pod, from outside (nodePort on both node addresses)
/// and from the node; an IPv6-only Service is served too, and nothing is reported unserved.
#[test]
fn dual_stack_is_served_on_both_families_by_their_own_endpoints() {
    let cluster = Cluster::new(ClusterSpec::pods(2).dual_stack()).unwrap();
    let svc = Service::new("ds")
        .cluster_ips(&["10.96.0.60", "fd00:10:96::60"])
        .tcp(80, 8080)
        .named("http")
        .node_port(30090);
    let v4 = slice_all(&svc, &cluster);
    let v6 = EndpointSlice::for_service(&svc)
        .ipv6()
        .ready_all(cluster.pod_ip6s());
    let only6 = Service::new("v6only")
        .cluster_ips(&["fd00:10:96::61"])
        .tcp(80, 8080)
        .named("http");
    let only6_slice = EndpointSlice::for_service(&only6)
        .ipv6()
        .ready_all(cluster.pod_ip6s());
    let files = [
        ("ds.yaml", yaml(&[&svc, &v4, &v6])),
        ("v6only.yaml", yaml(&[&only6, &only6_slice])),
    ];
    let opts = AgentOptions::backend(BACKEND).dual_stack();
    let agent = Agent::start(&cluster.node, &opts, &files).unwrap();
    for (label, ns, to) in [
        (
            "podclient -> clusterIP",
            &cluster.podclient,
            addr("10.96.0.60:80"),
        ),
        (
            "podclient -> IPv6 clusterIP",
            &cluster.podclient,
            addr("[fd00:10:96::60]:80"),
        ),
        (
            "client -> nodePort",
            &cluster.client,
            SocketAddr::from((NODE_IP, 30090)),
        ),
        (
            "client -> IPv6 nodePort",
            &cluster.client,
            SocketAddr::from((NODE_IP6, 30090)),
        ),
        ("node -> clusterIP", &cluster.node, addr("10.96.0.60:80")),
        (
            "node -> IPv6 clusterIP",
            &cluster.node,
            addr("[fd00:10:96::60]:80"),
        ),
        (
            "podclient -> IPv6-only Service",
            &cluster.podclient,
            addr("[fd00:10:96::61]:80"),
        ),
    ] {
        let mut pods = BTreeMap::new();
        for i in 0..4 {
            let r = tcp_request(ns, to, T).unwrap_or_else(|e| panic!("{label}: request {i}: {e}"));
            assert_eq!(
                r.peer.is_ipv4(),
                to.is_ipv4(),
                "{label}: an endpoint of the other family answered: {r:?}"
            );
            *pods.entry(r.pod).or_insert(0) += 1;
        }
        assert_eq!(pods.len(), 2, "{label}: {pods:?}");
    }
    let state = agent.state().unwrap();
    for name in ["default/ds:http/TCP", "default/v6only:http/TCP"] {
        let s = state
            .service(name)
            .unwrap_or_else(|| panic!("{name} in {state:?}"));
        assert!(s.unserved.is_empty(), "{name}: {:?}", s.unserved);
    }
    let metrics = agent.metrics().unwrap();
    assert!(
        metrics.contains("kpr_service_ports_unserved{family=\"IPv6\"} 0"),
        "{metrics}"
    );
}

/// A node without an IPv6 address serves a dual-stack Service's IPv4 side and reports the IPv6
/// side as not served (/state, metrics, the log), IPv6-only Services likewise. Six ports become
/// unserved at once: the log says so in one line naming the first ones (not one line each, which
/// at 20,000 Services floods it), and says it once, not again at every full resync.
#[test]
fn a_node_without_ipv6_reports_what_it_cannot_serve() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let svc = Service::new("ds")
        .cluster_ips(&["10.96.0.60", "fd00:10:96::60"])
        .tcp(80, 8080)
        .named("http");
    let mut files = vec![(
        "ds.yaml".to_string(),
        yaml(&[&svc, &slice_all(&svc, &cluster)]),
    )];
    let mut names = vec!["default/ds:http/TCP".to_string()];
    for i in 0..5 {
        let name = format!("v6only{i}");
        let only6 = Service::new(&name)
            .cluster_ips(&[&format!("fd00:10:96::6{i}")])
            .tcp(80, 8080)
            .named("http");
        files.push((format!("{name}.yaml"), yaml(&[&only6])));
        names.push(format!("default/{name}:http/TCP"));
    }
    let files: Vec<(&str, String)> = files.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let mut opts = AgentOptions::backend(BACKEND);
    opts.extra_args
        .extend(["--full-sync-period".to_string(), "1s".to_string()]);
    let agent = Agent::start(&cluster.node, &opts, &files).unwrap();
    let counts = tally_tcp(&cluster.podclient, addr("10.96.0.60:80"), 4);
    assert_eq!(counts.len(), 2, "{counts:?}");
    let reason = "IPv6: the node has no IPv6 address";
    let summary =
        "6 Service ports: their IPv6 addresses are not served: the node has no IPv6 address";
    let log = agent.wait_for_log(summary, CHANGE).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains(summary) && l.contains("default/ds:http/TCP")),
        "one line names the first ports:\n{log}"
    );
    // A change after a second is synced in full (--full-sync-period 1s): nothing is warned of
    // again. A port that becomes unserved later is named on its own.
    std::thread::sleep(Duration::from_millis(1_200));
    let plain = Service::new("plain")
        .cluster_ip("10.96.0.70")
        .tcp(80, 8080)
        .named("http");
    agent
        .write_manifest("plain.yaml", &yaml(&[&plain]))
        .unwrap();
    agent
        .wait_for("the plain Service", CHANGE, |s| {
            s.service("default/plain:http/TCP").is_some()
        })
        .unwrap();
    let metrics = agent.metrics().unwrap();
    let full_syncs: f64 = metrics
        .lines()
        .find(|l| l.contains("sync_full_proxy_rules_duration_seconds_count"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no full sync count in the metrics:\n{metrics}"));
    assert!(
        full_syncs >= 2.0,
        "the change was synced in full: {full_syncs}"
    );
    let warnings = |log: &str| {
        log.lines()
            .filter(|l| l.contains("addresses are not served"))
            .count()
    };
    assert_eq!(warnings(&agent.log()), 1, "{}", agent.log());
    let late = Service::new("late6")
        .cluster_ips(&["fd00:10:96::69"])
        .tcp(80, 8080)
        .named("http");
    agent.write_manifest("late6.yaml", &yaml(&[&late])).unwrap();
    let log = agent
        .wait_for_log(
            "Service port default/late6:http/TCP: its IPv6 addresses are not served",
            CHANGE,
        )
        .unwrap();
    assert_eq!(warnings(&log), 2, "{log}");
    let state = agent.state().unwrap();
    for name in &names {
        let s = state
            .service(name)
            .unwrap_or_else(|| panic!("{name} in {state:?}"));
        assert_eq!(s.unserved, [reason], "{name}");
    }
    let metrics = agent.metrics().unwrap();
    assert!(
        metrics.contains("kpr_service_ports_unserved{family=\"IPv6\"} 7"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kpr_service_ports_unserved{family=\"IPv4\"} 0"),
        "{metrics}"
    );
}
