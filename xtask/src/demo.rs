//! `cargo xtask demo`: the agent on a one-node cluster made of network namespaces.
//!
//! Builds nothing (the caller builds `proxy` and `probe` first). Creates pod namespaces with echo
//! servers, writes a Service and its EndpointSlice for the agent's file source, runs the agent in
//! the node namespace, sends connections from the external client namespace to the Service's
//! NodePort, prints which endpoint got how many, removes one endpoint from the manifests and shows
//! the traffic moving, prints `proxy inspect`, and removes everything (the harness guards do, also
//! on error).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use kpr_tests::cluster::{ClusterSpec, CLIENT_IP, NODE_IP};
use kpr_tests::{tcp_request, yaml, Agent, AgentOptions, Cgroup, Cluster, EndpointSlice, Service};
use xtask::exec::Cmd;
use xtask::target_dir;

/// Options of the demo.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Dataplane the agent programs.
    #[arg(long, default_value = "userspace", value_parser = ["userspace", "nftables", "iptables", "ebpf"])]
    pub backend: String,
    /// Node-wide balancing algorithm.
    #[arg(long, default_value = "round-robin", value_parser = ["round-robin", "least-conn"])]
    pub balance: String,
    /// Number of pod namespaces (endpoints), 2 to 199.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..200))]
    pub pods: u16,
    /// Connections per round.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
}

const SERVICE_PORT: &str = "default/web:http/TCP";
const NODE_PORT: u16 = 30080;

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let proxy = target_dir().join("debug/proxy");
    anyhow::ensure!(
        proxy.is_file(),
        "no agent at {}: build it: cargo build -p proxy (cargo xtask demo does this)",
        proxy.display()
    );
    println!(
        "== kpr demo: backend {}, balance {}, {} pods, {} connections per round",
        args.backend, args.balance, args.pods, args.connections
    );
    let cluster = Cluster::new(ClusterSpec::pods(usize::from(args.pods)))
        .context("building the namespaces")?;
    print_topology(&cluster);

    // The eBPF backend attaches to a cgroup of its own, never to the machine's root cgroup.
    let cgroup = (args.backend == "ebpf")
        .then(|| Cgroup::new("demo"))
        .transpose()?;
    let mut opts = AgentOptions::backend(&args.backend)
        .balance(&args.balance)
        .binary(&proxy);
    if let Some(cg) = &cgroup {
        opts = opts.cgroup(cg);
    }

    let svc = Service::new("web")
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .named("http")
        .node_port(NODE_PORT);
    let all = EndpointSlice::for_service(&svc).ready_all(cluster.pod_ips());
    let agent = Agent::start(&cluster.node, &opts, &[("web.yaml", yaml(&[&svc, &all]))])
        .context("starting the agent")?;
    println!(
        "agent running in netns {}; manifests in {}",
        cluster.node.name(),
        agent.manifest_dir().display()
    );

    let target = SocketAddr::from((NODE_IP, NODE_PORT));
    println!(
        "\n-- round 1: {} connections from {CLIENT_IP} to nodePort {target}",
        args.connections
    );
    print_table(&cluster, &send(&cluster, target, args.connections));

    let removed = cluster.pods.last().ok_or_else(|| anyhow!("no pods"))?;
    let remaining = EndpointSlice::for_service(&svc)
        .ready_all(cluster.pod_ips().into_iter().filter(|ip| *ip != removed.ip));
    agent.write_manifest("web.yaml", &yaml(&[&svc, &remaining]))?;
    let want = usize::from(args.pods) - 1;
    let started = Instant::now();
    agent
        .wait_for("the endpoint removal", Duration::from_secs(15), |s| {
            s.service(SERVICE_PORT)
                .is_some_and(|p| p.endpoints.len() == want)
        })
        .map_err(|e| anyhow!("{e}"))?;
    println!(
        "\n-- removed {} ({}) from the EndpointSlice; the agent applied it in {:?}",
        removed.name,
        removed.ip,
        started.elapsed()
    );
    println!("-- round 2: {} connections to {target}", args.connections);
    print_table(&cluster, &send(&cluster, target, args.connections));

    println!("\n-- proxy inspect (in the node namespace)");
    Cmd::new("ip")
        .args(["netns", "exec", cluster.node.name()])
        .arg(&proxy)
        .args([
            "inspect",
            "--metrics-bind-address",
            kpr_tests::agent::METRICS_ADDR,
        ])
        .run()?;

    drop(agent);
    drop(cgroup);
    let prefix = cluster.prefix().to_string();
    drop(cluster);
    println!("\n== cleaned up: agent stopped, namespaces {prefix}-* removed");
    Ok(())
}

fn print_topology(cluster: &Cluster) {
    println!("namespaces:");
    println!(
        "  {:<28} node, {NODE_IP} (nodePort address), forwards between the links",
        cluster.node.name()
    );
    println!(
        "  {:<28} external client {CLIENT_IP}",
        cluster.client.name()
    );
    for pod in &cluster.pods {
        println!(
            "  {:<28} {} echo server on {}",
            pod.ns.name(),
            pod.name,
            pod.echo_addr()
        );
    }
}

/// Sequential connections; outcome label (pod name or `error: ...`) -> count.
fn send(cluster: &Cluster, target: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let label = match tcp_request(&cluster.client, target, Duration::from_secs(2)) {
            Ok(reply) => reply.pod,
            Err(e) => format!("error: {e}"),
        };
        *counts.entry(label).or_insert(0) += 1;
    }
    counts
}

fn print_table(cluster: &Cluster, counts: &BTreeMap<String, usize>) {
    let total: usize = counts.values().sum::<usize>().max(1);
    println!(
        "  {:<10} {:<16} {:>11}  share",
        "endpoint", "address", "connections"
    );
    for pod in &cluster.pods {
        let n = counts.get(&pod.name).copied().unwrap_or(0);
        let bar = "#".repeat(n * 40 / total);
        println!(
            "  {:<10} {:<16} {:>11}  {bar}",
            pod.name,
            pod.echo_addr().to_string(),
            n
        );
    }
    for (label, n) in counts.iter().filter(|(l, _)| cluster.pod(l).is_none()) {
        println!("  {label:<27} {n:>11}");
    }
}
