//! Topology-aware routing through the real API server, on every backend: the agent (fed by the
//! reference kube-apiserver, `--source kube`) reads its Node's `topology.kubernetes.io/zone`
//! label, and an EndpointSlice whose endpoints are hinted for two zones (`hints.forZones`, as
//! the EndpointSlice controller writes them for `trafficDistribution: PreferClose`) sends the
//! node's traffic only to its own zone's endpoints; once its zone has none, to all of them
//! (kube-proxy's fallback: hints are ignored when none is for this zone).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use controlplane::Relay;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_tests::cluster::{ClusterSpec, ECHO_PORT, NODE_NAME};
use kpr_tests::{run_probe, Agent, AgentOptions, Cgroup, Cluster, ProbeLine};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

/// The zone of the node under test; the other endpoints are in `zone-b`.
const ZONE: &str = "zone-a";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The node the agent runs as, in `ZONE` (created once per test binary; the tests share it).
async fn ensure_node(client: &kube::Client) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE_NAME, "labels": {"topology.kubernetes.io/zone": ZONE}}
    }))
    .unwrap();
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating Node {NODE_NAME}: {e}"),
    }
}

/// The slice of `web`: one endpoint per pod address, with its zone and zone hint.
fn slice(ns: &str, endpoints: &[(std::net::Ipv4Addr, &str)]) -> EndpointSlice {
    let eps: Vec<serde_json::Value> = endpoints
        .iter()
        .map(|(ip, zone)| {
            json!({"addresses": [ip.to_string()], "zone": zone,
                   "conditions": {"ready": true},
                   "hints": {"forZones": [{"name": zone}]}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "web-1", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": ECHO_PORT, "protocol": "TCP"}],
        "endpoints": eps,
    }))
    .unwrap()
}

/// The pods that answered 12 connections from the pod client (each failure counts as "-").
fn answered(cluster: &Cluster, cgroup: Option<&Cgroup>, to: SocketAddr) -> Vec<String> {
    let to = to.to_string();
    let out = run_probe(
        &cluster.podclient,
        cgroup,
        &["tcp", &to, "--count", "12", "--timeout", "2"],
    )
    .unwrap();
    let mut pods: Vec<String> = out
        .lines
        .iter()
        .map(|l| match l {
            ProbeLine::Reply(r) => r.pod.clone(),
            _ => "-".into(),
        })
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

fn eventually(cluster: &Cluster, cgroup: Option<&Cgroup>, to: SocketAddr, want: &[&str]) {
    let start = Instant::now();
    loop {
        let got = answered(cluster, cgroup, to);
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "connections to {to} answered by {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn prefer_close(backend: &str, extra: &[&str]) {
    let cp = controlplane::shared().unwrap();
    let rt = runtime();
    let client = rt.block_on(cp.client()).unwrap();
    rt.block_on(ensure_node(&client));
    let ns = cp.test_namespace("topology").unwrap();
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": ECHO_PORT}],
                 "trafficDistribution": "PreferClose"}}))
    .unwrap();
    let svc = rt
        .block_on(
            Api::<Service>::namespaced(client.clone(), &ns).create(&PostParams::default(), &svc),
        )
        .unwrap();
    let vip: std::net::IpAddr = svc.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    let cluster = Cluster::new(ClusterSpec::pods(3)).unwrap();
    let ip = |i: usize| cluster.pods[i].ip;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns);
    rt.block_on(slices.create(
        &PostParams::default(),
        &slice(&ns, &[(ip(0), ZONE), (ip(1), "zone-b"), (ip(2), ZONE)]),
    ))
    .unwrap();

    // The agent reaches the loopback-only API server through a relay inside its namespace.
    let listener = cluster
        .node
        .run(|| std::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let api: SocketAddr = format!("127.0.0.1:{}", cp.ports.apiserver).parse().unwrap();
    let relay = Relay::start(listener, api).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "{}-topology-kubeconfig",
        kpr_tests::netns::unique_prefix()
    ));
    std::fs::write(
        &dir,
        cp.admin_kubeconfig_for(&format!("https://{}", relay.addr()))
            .unwrap(),
    )
    .unwrap();
    let cgroup = (backend == "ebpf").then(|| Cgroup::new("topology").unwrap());
    let mut opts = AgentOptions::backend(backend);
    opts.kubeconfig = Some(dir.clone());
    opts.cgroup = cgroup.as_ref().map(|c| c.path().to_path_buf());
    opts.extra_args = extra.iter().map(|s| s.to_string()).collect();
    let agent = Agent::start(&cluster.node, &opts, &[]).unwrap();

    let to = SocketAddr::new(vip, 80);
    eventually(&cluster, cgroup.as_ref(), to, &["pod0", "pod2"]);

    // Its zone loses its endpoints: every endpoint hint is for zone-b now, none for this
    // node's zone, so the hints are ignored and zone-b serves.
    let patch = json!({"endpoints": slice(&ns, &[(ip(1), "zone-b")]).endpoints});
    rt.block_on(slices.patch("web-1", &PatchParams::default(), &Patch::Merge(patch)))
        .unwrap();
    eventually(&cluster, cgroup.as_ref(), to, &["pod1"]);

    // Back: the zone's own endpoint again.
    let patch = json!({"endpoints": slice(&ns, &[(ip(0), ZONE), (ip(1), "zone-b")]).endpoints});
    rt.block_on(slices.patch("web-1", &PatchParams::default(), &Patch::Merge(patch)))
        .unwrap();
    eventually(&cluster, cgroup.as_ref(), to, &["pod0"]);
    drop(agent);
    let _ = std::fs::remove_file(&dir);
}

#[test]
fn userspace_prefers_its_zone() {
    prefer_close("userspace", &[]);
}

#[test]
fn nftables_prefers_its_zone() {
    prefer_close("nftables", &[]);
}

#[test]
fn iptables_nft_prefers_its_zone() {
    prefer_close("iptables", &["--iptables-mode", "nft"]);
}

#[test]
fn iptables_legacy_prefers_its_zone() {
    prefer_close("iptables", &["--iptables-mode", "legacy"]);
}

#[test]
fn ebpf_prefers_its_zone() {
    prefer_close("ebpf", &[]);
}
