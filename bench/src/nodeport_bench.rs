//! `--nodeport`: traffic from outside the node to a NodePort whose backend is on another node,
//! through the eBPF backend's tc program, its XDP program, and the nftables backend, one after
//! the other on the same topology (`kpr_tests::remote`: client -> node -> back out to the
//! backend behind the client, masqueraded, and the replies the same way back); and the eBPF
//! backend's tc program with direct server return (`--nodeport-mode dsr`): the remote namespace
//! then runs a dataplane of its own in dsr mode (the backend's node), which answers the client
//! from the nodePort directly, so the replies skip the node.
//!
//! Per row: new TCP connections (connect, greeting, one echo round trip, close) and UDP
//! request/response (a new socket, so a new flow, each time) from `THREADS` client threads for
//! `--nodeport-seconds` each, as requests per second and the latency's p50 / p99; for XDP, the
//! packets it sent itself and passed to tc (`KPR_XDP_STATS`), so the row shows which path the
//! packets took. The numbers are this machine's: veth pairs, one process for client and
//! backend, 2 CPUs shared with the echo servers (docs/BENCHMARKS.md).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kpr_tests::client::{tcp_request_here, udp_request_here};
use kpr_tests::cluster::{Cluster, ClusterSpec, CLIENT_IP, NODE_IP};
use kpr_tests::remote::{Remote, REMOTE_IP, REMOTE_NAME};
use proxy::dataplane::ebpf::dsr::DsrCounts;
use proxy::dataplane::ebpf::xdp::XdpCounts;
use proxy::dataplane::NodePortMode;
use proxy::model::{Algorithm, Endpoint, Protocol, ServicePort, ServicePortName};
use proxy::state::{ChangeSet, ProxyState};
use serde::Serialize;

use crate::backend::Worker;
use crate::traffic::{summarize, Latency};
use crate::workload::backend_config;

pub const JSON_FILE: &str = "nodeport.json";
pub const MARKDOWN_FILE: &str = "nodeport.md";
const NODE_PORT: u16 = 30100;
/// The remote backend's TCP server (the benchmark's; the UDP one is the harness's).
const TCP_PORT: u16 = 8081;
const THREADS: usize = 2;
const TIMEOUT: Duration = Duration::from_secs(2);

/// One measured path.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub path: String,
    pub tcp: Load,
    pub udp: Load,
    /// XDP's own counts over the row (eBPF XDP only).
    pub xdp: Option<XdpCounts>,
    /// DSR's counts over the row (DSR only): the node's (options added) and the backend's
    /// node's (options recorded, replies rewritten).
    pub dsr: Option<(DsrCounts, DsrCounts)>,
}

/// One kind of request over the row's seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    pub per_second: f64,
    pub latency: Latency,
    pub failed: usize,
}

/// The paths measured: (label, backend, XDP interfaces, NodePort mode).
const PATHS: [(&str, &str, &[&str], NodePortMode); 4] = [
    ("kpr ebpf, tc", "ebpf", &[], NodePortMode::Snat),
    ("kpr ebpf, XDP", "ebpf", &["cl"], NodePortMode::Snat),
    ("kpr ebpf, tc, DSR", "ebpf", &[], NodePortMode::Dsr),
    ("kpr nftables", "nftables", &[], NodePortMode::Snat),
];

pub fn run(seconds: u64, out_dir: &Path, command: String) -> anyhow::Result<Vec<Row>> {
    let duration = Duration::from_secs(seconds);
    let mut rows = Vec::new();
    for (label, backend, xdp, mode) in PATHS {
        println!("bench: NodePort to a backend on another node, {label}, {seconds} s each way");
        rows.push(measure(label, backend, xdp, mode, duration).with_context(|| label.to_string())?);
    }
    let out = serde_json::json!({ "command": command, "seconds": seconds, "rows": rows });
    std::fs::write(out_dir.join(JSON_FILE), serde_json::to_string_pretty(&out)?)?;
    let md = markdown(&command, &rows);
    std::fs::write(out_dir.join(MARKDOWN_FILE), &md)?;
    println!("{md}");
    Ok(rows)
}

fn measure(
    label: &str,
    backend: &str,
    xdp: &[&str],
    mode: NodePortMode,
    duration: Duration,
) -> anyhow::Result<Row> {
    let cluster = Cluster::new(ClusterSpec {
        echo: false,
        ..ClusterSpec::pods(0)
    })?;
    crate::tune_client(&cluster.client)?;
    let remote = Remote::new(&cluster).context("the backend behind the client")?;
    // TCP to the benchmark's own server (the harness's echo server polls its listener every
    // 10 ms, server.rs); UDP to the harness's, which answers at once.
    let tcp_backend = SocketAddr::from((REMOTE_IP, TCP_PORT));
    let _server = crate::server::Server::start(remote.netns(), REMOTE_NAME, tcp_backend)?;
    let cgroup = (backend == "ebpf")
        .then(|| kpr_tests::Cgroup::new("nodeport"))
        .transpose()?;
    let bpffs = Path::new("/sys/fs/bpf").join(format!("{}-nodeport", cluster.prefix()));
    let mut cfg = backend_config(1, proxy::model::IpFamily::V4, cgroup.as_ref(), &bpffs);
    cfg.xdp_interfaces = xdp.iter().map(|i| i.to_string()).collect();
    cfg.nodeport_mode = mode;
    let dsr = mode.is_dsr();
    // DSR: the backend's node runs a dataplane in dsr mode too (the remote namespace).
    let remote_cgroup = dsr
        .then(|| kpr_tests::Cgroup::new("nodeport-backend"))
        .transpose()?;
    let remote_bpffs = Path::new("/sys/fs/bpf").join(format!("{}-nodeport-b", cluster.prefix()));
    let mut remote_cfg = backend_config(
        1,
        proxy::model::IpFamily::V4,
        remote_cgroup.as_ref(),
        &remote_bpffs,
    );
    remote_cfg.nodeport_mode = mode;
    if dsr {
        // The client namespace is the client and the router to the backend: a forward packet
        // that keeps the client's address (DSR) arrives there with a source of its own, which
        // the kernel drops as martian unless told to accept it.
        for key in [
            "net.ipv4.conf.all.accept_local",
            "net.ipv4.conf.eth0.accept_local",
        ] {
            cluster.client.sysctl(key, "1")?;
        }
    }
    let result = (|| -> anyhow::Result<Row> {
        let worker = Worker::start(&cluster.node, backend, cfg)?;
        let remote_worker = dsr
            .then(|| Worker::start(remote.netns(), backend, remote_cfg))
            .transpose()?;
        let state = service(&[
            (Protocol::Tcp, TCP_PORT),
            (Protocol::Udp, remote.addr().port()),
        ]);
        for w in std::iter::once(&worker).chain(&remote_worker) {
            w.sync(
                &state,
                ChangeSet {
                    full: true,
                    ..ChangeSet::default()
                },
            )?;
        }
        let target = SocketAddr::from((NODE_IP, NODE_PORT));
        // Both ways answered before the clock starts (and the path checked).
        let first = kpr_tests::tcp_request(&cluster.client, target, TIMEOUT)
            .map_err(|e| anyhow::anyhow!("a first request through {label}: {e:?}"))?;
        let seen_as = if dsr { CLIENT_IP } else { NODE_IP };
        anyhow::ensure!(
            first.pod == REMOTE_NAME && first.peer.ip() == IpAddr::V4(seen_as),
            "{label}: answered by {} seen from {} (the remote backend, seen from {seen_as}, \
             expected)",
            first.pod,
            first.peer
        );
        let maps = bpffs.join("maps");
        let remote_maps = remote_bpffs.join("maps");
        let before = (!xdp.is_empty())
            .then(|| XdpCounts::from_pin(&maps))
            .transpose()?;
        let dsr_before = dsr
            .then(|| -> anyhow::Result<_> {
                Ok((
                    DsrCounts::from_pin(&maps)?,
                    DsrCounts::from_pin(&remote_maps)?,
                ))
            })
            .transpose()?;
        let tcp = load(&cluster, duration, || {
            tcp_request_here(target, TIMEOUT).is_ok()
        })?;
        let udp = load(&cluster, duration, || {
            udp_request_here(target, TIMEOUT).is_ok()
        })?;
        let xdp = before
            .map(|before| XdpCounts::from_pin(&maps).map(|after| after.since(before)))
            .transpose()?;
        let dsr = dsr_before
            .map(|(node, backend)| -> anyhow::Result<_> {
                Ok((
                    DsrCounts::from_pin(&maps)?.since(node),
                    DsrCounts::from_pin(&remote_maps)?.since(backend),
                ))
            })
            .transpose()?;
        drop(remote_worker);
        drop(worker);
        Ok(Row {
            path: label.to_string(),
            tcp,
            udp,
            xdp,
            dsr,
        })
    })();
    let _ = std::fs::remove_dir_all(&bpffs);
    let _ = std::fs::remove_dir_all(&remote_bpffs);
    result
}

/// The NodePort Service over the remote backend (eTP Cluster: masqueraded), a port per protocol
/// and its backend's port.
fn service(ports: &[(Protocol, u16)]) -> ProxyState {
    let mut state = ProxyState::new(crate::workload::node_context());
    for &(protocol, backend_port) in ports {
        let name = ServicePortName::new("bench", "nodeport", "", protocol);
        let svc = ServicePort {
            name,
            cluster_ips: vec![IpAddr::from([10, 96, 0, 100])],
            port: 80,
            protocol,
            node_port: NODE_PORT,
            external_ips: vec![],
            load_balancer_ips: vec![],
            source_ranges: vec![],
            affinity: None,
            external_local: false,
            internal_local: false,
            health_check_node_port: 0,
            algorithm: Algorithm::RoundRobin,
        };
        let endpoint = Endpoint {
            addr: IpAddr::V4(REMOTE_IP),
            port: backend_port,
            node: Some("other-node".into()),
            zone: None,
            ready: true,
            serving: true,
            terminating: false,
            hints: None,
        };
        state.set_port(svc, vec![endpoint]);
    }
    state
}

/// `request` from `THREADS` threads in the client namespace for `duration`.
fn load(
    cluster: &Cluster,
    duration: Duration,
    request: impl Fn() -> bool + Sync,
) -> anyhow::Result<Load> {
    let started = Instant::now();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let request = &request;
                s.spawn(move || -> anyhow::Result<(Vec<Duration>, usize)> {
                    cluster.client.enter()?;
                    let (mut ok, mut failed) = (Vec::new(), 0);
                    while started.elapsed() < duration {
                        let t = Instant::now();
                        if request() {
                            ok.push(t.elapsed());
                        } else {
                            failed += 1;
                        }
                    }
                    Ok((ok, failed))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let failed = results.iter().map(|(_, f)| f).sum();
    let samples: Vec<Duration> = results.into_iter().flat_map(|(ok, _)| ok).collect();
    Ok(Load {
        per_second: samples.len() as f64 / elapsed,
        latency: summarize(samples),
        failed,
    })
}

fn markdown(command: &str, rows: &[Row]) -> String {
    let mut md = format!(
        "## NodePort to a backend on another node\n\n`{command}`\n\n\
         | path | new TCP connections /s | TCP p50 / p99 (µs) | UDP requests /s | UDP p50 / p99 (µs) | failed | XDP: sent / passed to tc | DSR: options sent / replies answered by the backend's node |\n\
         |---|---:|---:|---:|---:|---:|---|---|\n"
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {:.0} | {:.0} / {:.0} | {:.0} | {:.0} / {:.0} | {} | {} | {} |\n",
            r.path,
            r.tcp.per_second,
            r.tcp.latency.p50_us,
            r.tcp.latency.p99_us,
            r.udp.per_second,
            r.udp.latency.p50_us,
            r.udp.latency.p99_us,
            r.tcp.failed + r.udp.failed,
            r.xdp
                .map(|x| format!("{} / {}", x.sent, x.passed_route + x.passed_new))
                .unwrap_or_else(|| "-".into()),
            r.dsr
                .map(|(node, backend)| format!(
                    "{} / {}",
                    node.options_added, backend.replies_rewritten
                ))
                .unwrap_or_else(|| "-".into()),
        ));
    }
    md
}
