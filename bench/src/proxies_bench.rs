//! The proxies row (`cargo xtask bench --source kube`): the real kube-proxy (iptables mode with
//! the host's iptables and with iptables-legacy, nftables mode; the reference release's binary) next to every kpr backend's agent, each fed by the same
//! real kube-apiserver and measured from outside the same way.
//!
//! Per size N: a reference control plane; N Services (clusterIP `Workload::cluster_ip(i)`, the
//! last ones NodePort as in the file-fed rows) and one EndpointSlice each with M ready endpoints
//! are written through the API (timed apart). Then, for each proxy in turn, a fresh node namespace
//! with its pods (M + 1 of them: every Service leaves one pod out, which the changes below move
//! in) and a relay to the API server inside it; the proxy starts there with its normal flags and
//! a kubeconfig, and is measured:
//!
//! - first full programming: from the process's start to the last Service answering a connection
//!   from the pod client;
//! - network programming latency, from the write's return (the object is in the API server; the
//!   write's own time is reported apart) to the first connection that shows it:
//!   a Service's EndpointSlice rewritten to the one pod it did not have (observed when that pod
//!   answers), a Service added whose slice was written two seconds before (observed when it
//!   answers), and the last endpoint of a Service removed (observed when it rejects), spread over
//!   the Services and at least a second apart (both proxies' default minimum sync period is 1 s);
//! - the process's CPU seconds (its own and its waited-for children's, as kube-proxy runs
//!   iptables-restore) and peak RSS over the run; kernel memory (machine-wide, Slab + vmalloc +
//!   per-cpu) before the start and after the first full programming;
//! - connect latency to the last Service against the pod client's loopback, and how evenly its
//!   connections spread over its endpoints.
//!
//! Every change is undone through the API after each proxy's run, so every proxy sees the same
//! objects. Nothing here reads a proxy's own metrics.
//!
//! Owns the control plane, the node namespaces and the processes of this row; the echo servers,
//! the address plan and the client measurements are [`crate::server`]'s, [`crate::workload`]'s and
//! [`crate::traffic`]'s.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::{ControlPlane, Options, Relay};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_tests::cluster::{CLUSTER_CIDR, ECHO_PORT, NODE_IP, NODE_NAME};
use kpr_tests::{Agent, AgentOptions, Cgroup, Netns};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use crate::api_state;
use crate::report::xml;
use crate::traffic::{self, InCgroup, Latency};
use crate::workload::{service_cidrs, Workload, MAX_SERVICES, SERVICE_PORT};

/// Default sizes of a full run.
pub const SIZES: &str = "1000,5000,20000";
/// Default proxies, in the order they run.
pub const PROXIES: &str = "kube-proxy-iptables,kube-proxy-iptables-legacy,kube-proxy-nftables,\
                           kpr-userspace,kpr-nftables,\
                           kpr-iptables-legacy,kpr-iptables-nft,kpr-ebpf";
/// The namespace of the benchmark's Services.
const NAMESPACE: &str = "bench";

/// One proxy under test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proxy {
    /// kube-proxy of the reference release in this `--proxy-mode` (`iptables-legacy`: iptables
    /// mode with iptables-legacy first on its PATH; plain `iptables` runs whatever the host's
    /// `iptables` is).
    KubeProxy(&'static str),
    /// kpr's agent with this backend (`iptables-legacy` / `iptables-nft` pick the iptables
    /// flavour).
    Kpr(String),
}

impl Proxy {
    pub fn parse(name: &str) -> anyhow::Result<Proxy> {
        match name {
            "kube-proxy-iptables" => Ok(Proxy::KubeProxy("iptables")),
            "kube-proxy-iptables-legacy" => Ok(Proxy::KubeProxy("iptables-legacy")),
            "kube-proxy-nftables" => Ok(Proxy::KubeProxy("nftables")),
            "kube-proxy-ipvs" => bail!(
                "--proxies kube-proxy-ipvs: not measured: kube-proxy's ipvs mode is deprecated \
                 upstream and this benchmark does not load the ip_vs modules it needs"
            ),
            _ => match name.strip_prefix("kpr-") {
                Some(
                    b @ ("userspace" | "nftables" | "iptables-legacy" | "iptables-nft" | "ebpf"),
                ) => Ok(Proxy::Kpr(b.to_string())),
                _ => bail!(
                    "--proxies {name}: unknown (kube-proxy-iptables, kube-proxy-iptables-legacy, \
                     kube-proxy-nftables, \
                     kpr-userspace, kpr-nftables, kpr-iptables-legacy, kpr-iptables-nft, kpr-ebpf)"
                ),
            },
        }
    }

    pub fn name(&self) -> String {
        match self {
            Proxy::KubeProxy("iptables-legacy") => "kube-proxy iptables (legacy)".into(),
            Proxy::KubeProxy(mode) => format!("kube-proxy {mode}"),
            Proxy::Kpr(backend) => format!("kpr {backend}"),
        }
    }
}

/// Sizes and sample counts of the row.
#[derive(Debug, Clone)]
pub struct Plan {
    pub sizes: Vec<usize>,
    pub proxies: Vec<Proxy>,
    pub endpoints: usize,
    /// EndpointSlice rewrites measured per proxy and size.
    pub endpoint_changes: usize,
    /// Services added per proxy and size.
    pub service_adds: usize,
    /// Connections to the last Service (and to the loopback reference) for connect latency.
    pub latency_samples: usize,
    /// Connections to the last Service whose spread over its endpoints is reported.
    pub balance_connections: usize,
    /// How long a proxy may take to program everything before it is reported as not finishing.
    pub start_limit: Duration,
    /// How long one proxy's changes may take in all: a proxy whose every sync takes tens of
    /// seconds at a size is stopped there, its row reporting the changes it got through.
    pub churn_limit: Duration,
    /// Start a size from the API state an earlier run kept for it, when there is one.
    pub reuse_api_state: bool,
}

impl Plan {
    pub fn from_args(args: &crate::BenchArgs) -> anyhow::Result<Plan> {
        let sizes: Vec<usize> = if args.quick {
            vec![500]
        } else {
            args.proxy_sizes.clone()
        };
        let services_room = MAX_SERVICES - 1_000;
        if let Some(&n) = sizes.iter().find(|&&n| !(10..=services_room).contains(&n)) {
            bail!(
                "--proxy-sizes {n}: must be 10..={services_room} (the address plan holds the \
                 clusterIPs and the added Services)"
            );
        }
        let names: Vec<String> = if let Some(names) = &args.proxies {
            names.clone()
        } else if args.quick {
            // One kube-proxy mode and kpr's two fastest-moving backends: the smoke checks the
            // path, not the numbers.
            ["kube-proxy-nftables", "kpr-nftables", "kpr-ebpf"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            PROXIES.split(',').map(|s| s.trim().to_string()).collect()
        };
        let proxies = names
            .iter()
            .map(|n| Proxy::parse(n))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Plan {
            sizes,
            proxies,
            endpoints: args.endpoints.min(32),
            endpoint_changes: if args.quick { 6 } else { 100 },
            service_adds: if args.quick { 3 } else { 34 },
            latency_samples: if args.quick { 200 } else { 1_000 },
            balance_connections: if args.quick { 400 } else { 4_000 },
            start_limit: Duration::from_secs(if args.quick { 180 } else { 900 }),
            churn_limit: Duration::from_secs(if args.quick { 180 } else { 600 }),
            reuse_api_state: args.reuse_api_state,
        })
    }
}

/// What one proxy showed at one size.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    pub proxy: String,
    pub services: usize,
    /// Seconds from the process's start to the last Service answering; `None` if it did not
    /// within the limit (then `reached` says how far it got).
    pub first_programming_s: Option<f64>,
    /// kpr only: from the end of the initial listing to the end of the first sync, as the agent
    /// logs it (the listing's end is not visible from outside).
    pub programmed_after_listing_s: Option<f64>,
    /// kpr rule backends only: that first sync's planning and applying (nft or
    /// iptables-restore taking the transaction), in seconds, as the agent logs them.
    pub first_sync_plan_apply_s: Option<(f64, f64)>,
    pub reached: Option<String>,
    /// EndpointSlice rewritten to another pod, write to first connection answered by it.
    pub endpoint_change: Option<Latency>,
    /// Service created (its slice a second before), write to first connection answered.
    pub service_added: Option<Latency>,
    /// A Service's last endpoint removed, write to first connection rejected.
    pub endpoint_removed: Option<Latency>,
    /// How long the API server took to answer those writes (not part of the latencies above,
    /// which start when the write returned).
    pub api_write: Option<Latency>,
    /// Changes that were not observed within 30 s each.
    pub changes_missed: usize,
    pub cpu_s: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub kernel_mem_kib: Option<i64>,
    pub latency_at_n: Option<Latency>,
    pub loopback: Option<Latency>,
    /// Largest deviation of an endpoint's share of the last Service's connections from an even
    /// split, in percent.
    pub balance_max_dev_pct: Option<f64>,
    /// Measurements that could not be taken, and why (the row's other columns still hold).
    pub notes: Vec<String>,
    pub error: Option<String>,
}

/// One size: how long the API writes took, and every proxy's row.
#[derive(Debug, Clone, Serialize)]
pub struct SizeRun {
    pub services: usize,
    pub endpoints: usize,
    pub load_s: f64,
    /// When the objects were not written by this run but taken from a kept API state: when and
    /// by which tree they were written (`load_s` is that run's write time).
    pub reused_state: Option<String>,
    pub rows: Vec<Row>,
}

/// The whole row, as written to target/bench/proxies.json.
#[derive(Debug, Clone, Serialize)]
pub struct ProxiesBench {
    pub command: String,
    pub date: String,
    pub tree: String,
    pub kubernetes: String,
    pub kernel: String,
    pub iptables: String,
    pub runs: Vec<SizeRun>,
}

/// The reference binaries this row needs.
pub fn check_binaries() -> anyhow::Result<()> {
    let bins = controlplane::Binaries::locate()?;
    for name in ["kube-apiserver", "etcd", "kube-proxy"] {
        if !bins.path(name).is_file() {
            bail!(
                "{name} is not in {}: build the reference binaries with `cargo xtask setup --k8s`",
                bins.dir().display()
            );
        }
    }
    Ok(())
}

/// Runs every size; returns the results and the failures (a proxy that errors is a failure; one
/// that does not finish within the limit is reported, not failed).
pub fn run(
    plan: &Plan,
    out_dir: &Path,
    command: String,
) -> anyhow::Result<(ProxiesBench, Vec<String>)> {
    let mut bench = ProxiesBench {
        command,
        date: crate::report::now_utc(),
        tree: crate::report::tree_state(),
        kubernetes: controlplane::kubernetes_version().to_string(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        iptables: std::process::Command::new("iptables")
            .arg("-V")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default(),
        runs: Vec::new(),
    };
    let mut failed = Vec::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    for &n in &plan.sizes {
        println!(
            "bench: proxies fed by kube-apiserver {}, {n} Services x {} endpoints",
            bench.kubernetes, plan.endpoints
        );
        match size(plan, n, out_dir, &bench.tree, &rt) {
            Ok(run) => {
                for row in &run.rows {
                    if let Some(e) = &row.error {
                        failed.push(format!("{} at {n}: {e}", row.proxy));
                    }
                }
                bench.runs.push(run);
            }
            Err(e) => failed.push(format!("proxies at {n}: {e:#}")),
        }
        // After every size: a long run that stops later keeps what it measured.
        write(&bench, out_dir)?;
    }
    Ok((bench, failed))
}

/// Seconds from the `initial listing programmed N ms after it completed` line of a kpr agent's
/// log.
fn programmed_after_listing(log: &str) -> Option<f64> {
    const MARK: &str = "initial listing programmed ";
    let rest = &log[log.find(MARK)? + MARK.len()..];
    let ms: f64 = rest.split(" ms").next()?.trim().parse().ok()?;
    Some(ms / 1e3)
}

/// Seconds of planning and of applying from the first `<backend>: full sync ... plan_ms=P
/// apply_ms=A` line of a kpr agent's log (the rule backends log one per full sync).
fn first_sync_plan_apply(log: &str) -> Option<(f64, f64)> {
    let line = log.lines().find(|l| l.contains(": full sync "))?;
    let field = |name: &str| -> Option<f64> {
        let rest = &line[line.find(name)? + name.len()..];
        rest.split_whitespace().next()?.parse::<f64>().ok()
    };
    Some((field("plan_ms=")? / 1e3, field("apply_ms=")? / 1e3))
}

/// `: plan P, apply A` for a split first sync, else nothing.
fn plan_apply(split: Option<(f64, f64)>) -> String {
    split
        .map(|(p, a)| format!(": plan {p:.2}, apply {a:.2}"))
        .unwrap_or_default()
}

/// How many clusterIPs a size uses: its Services and every proxy's added ones.
fn clusterips_used(plan: &Plan, n: usize) -> usize {
    n + plan.proxies.len() * plan.service_adds
}

/// The API server's service range for a size: the harness's 10.96.0.0/16 while the clusterIPs
/// fit in it (with room for the API server's own `kubernetes` Service), else 10.96.0.0/12.
fn api_service_cidr(clusterips: usize) -> String {
    if service_cidrs(clusterips).len() == 1 && clusterips < 65_000 {
        controlplane::SERVICE_CIDR.to_string()
    } else {
        "10.96.0.0/12".to_string()
    }
}

fn size(
    plan: &Plan,
    n: usize,
    out_dir: &Path,
    tree: &str,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<SizeRun> {
    let service_cidr = api_service_cidr(clusterips_used(plan, n));
    let mut record = api_state::Record {
        format: api_state::FORMAT,
        services: n,
        endpoints: plan.endpoints,
        service_cidr: service_cidr.clone(),
        kubernetes: controlplane::kubernetes_version().to_string(),
        load_s: 0.0,
        date: crate::report::now_utc(),
        // The tree the run was built from, as its report gives it (the workspace may have
        // changed since).
        tree: tree.to_string(),
    };
    let kept = if plan.reuse_api_state {
        let kept = api_state::find(out_dir, &record)?;
        if kept.is_none() {
            println!(
                "  no API state kept for {} under {}: writing it",
                record.key(),
                out_dir.display()
            );
        }
        kept
    } else {
        None
    };
    let cp = ControlPlane::start(Options {
        service_cidr,
        etcd_data: kept.as_ref().map(api_state::Kept::etcd),
        ..Options::minimal(controlplane::run_dir(&format!("bench-proxies-{n}")))
    })?;
    let client = rt.block_on(cp.client())?;
    let w = Workload::v4(n, plan.endpoints, pod_ips(plan.endpoints + 1));
    let (load_s, reused_state) = match &kept {
        Some(kept) => {
            rt.block_on(check_kept(&client, n))
                .with_context(|| format!("the API state kept in {}", kept.dir.display()))?;
            let r = &kept.record;
            println!(
                "  {n} Services and {n} EndpointSlices from the API state kept in {} (written \
                 through the API in {:.1} s, {}, tree {})",
                kept.dir.display(),
                r.load_s,
                r.date,
                r.tree
            );
            (r.load_s, Some(format!("{}, tree {}", r.date, r.tree)))
        }
        None => {
            let start = Instant::now();
            rt.block_on(load(&client, &w))?;
            let load_s = start.elapsed().as_secs_f64();
            println!(
                "  {n} Services and {n} EndpointSlices written through the API in {load_s:.1} s"
            );
            (load_s, None)
        }
    };
    record.load_s = load_s;
    let mut rows = Vec::new();
    for (k, proxy) in plan.proxies.iter().enumerate() {
        println!("  {}", proxy.name());
        let mut row = Row {
            proxy: proxy.name(),
            services: n,
            ..Row::default()
        };
        // Each proxy adds Services of its own indexes: a clusterIP just released by the previous
        // proxy's clean-up is not reused at once.
        let added_from = n + k * plan.service_adds;
        let api = ApiSide {
            cp: &cp,
            client: &client,
            rt,
        };
        if let Err(e) = measure(plan, &api, &w, proxy, added_from, &mut row) {
            println!("  {}: error: {e:#}", proxy.name());
            row.error = Some(format!("{e:#}"));
        }
        // Whatever the run changed goes back, so the next proxy sees the same objects.
        rt.block_on(restore(
            &client,
            &w,
            plan.endpoint_changes,
            added_from,
            plan.service_adds,
        ))
        .context("undoing the changes through the API")?;
        // A run stopped later keeps this row in its log.
        if let Ok(json) = serde_json::to_string(&row) {
            println!("    row: {json}");
        }
        rows.push(row);
    }
    // Every change is undone: what etcd holds now is what the load wrote, kept for the next run
    // of this size once etcd has stopped.
    let etcd = cp.dir.join("etcd");
    drop(cp);
    if kept.is_none() && n >= api_state::KEEP_FROM {
        match api_state::keep(out_dir, &etcd, &record) {
            Ok(dir) => println!("  API state kept in {} (--reuse-api-state)", dir.display()),
            Err(e) => println!("  the API state was not kept: {e:#}"),
        }
    }
    Ok(SizeRun {
        services: n,
        endpoints: plan.endpoints,
        load_s,
        reused_state,
        rows,
    })
}

/// A kept state holds the size's Services: the namespace lists `n` of them (one page of one
/// item and the count of the rest, not a list of `n` objects).
async fn check_kept(client: &Client, n: usize) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let page = api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await?;
    let count = page.items.len() as u64 + page.metadata.remaining_item_count.unwrap_or(0) as u64;
    if count != n as u64 {
        bail!("it holds {count} Services in namespace {NAMESPACE}, not {n}");
    }
    Ok(())
}

/// The pod addresses of a cluster of `pods` pods (the harness's plan: pod `i` at 10.244.(i+1).2).
fn pod_ips(pods: usize) -> Vec<Ipv4Addr> {
    (0..pods)
        .map(|i| Ipv4Addr::new(10, 244, u8::try_from(i + 1).expect("< 200 pods"), 2))
        .collect()
}

/// Service `i` of the address plan, NodePort when `node_port` is given.
fn service(i: usize, node_port: Option<u16>) -> Service {
    let mut port = json!({"name": "http", "port": SERVICE_PORT, "targetPort": ECHO_PORT,
                          "protocol": "TCP"});
    let kind = match node_port {
        Some(np) => {
            port["nodePort"] = json!(np);
            "NodePort"
        }
        None => "ClusterIP",
    };
    serde_json::from_value(json!({
        "metadata": {"name": Workload::name(i), "namespace": NAMESPACE},
        "spec": {"type": kind, "clusterIP": Workload::cluster_ip(i).to_string(),
                 "ports": [port]}
    }))
    .expect("a valid Service")
}

fn slice(i: usize, ips: &[Ipv4Addr]) -> EndpointSlice {
    let endpoints: Vec<_> = ips
        .iter()
        .map(|ip| {
            json!({"addresses": [ip.to_string()], "conditions": {"ready": true},
                         "nodeName": NODE_NAME})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{}-1", Workload::name(i)), "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": Workload::name(i),
                                "endpointslice.kubernetes.io/managed-by": "kpr-bench"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": ECHO_PORT, "protocol": "TCP"}]
    }))
    .expect("a valid EndpointSlice")
}

/// Whether a failed write is the API server being overloaded (a timeout, 429, 5xx), which a
/// client retries, rather than a refusal of the object.
fn overloaded(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            matches!(s.code, 429 | 500 | 503 | 504)
                || s.message.contains("Timeout: request did not complete")
        }
        _ => false,
    }
}

/// Runs a create, retrying (up to 5 times, 1 s apart) while the API server is overloaded: at
/// 100,000 Services it can time out allocating a clusterIP under load, and one such write must
/// not end the whole run. A Service created by an attempt that timed out is a 409 on the retry,
/// which counts as done.
async fn retrying<T, F, Fut>(mut create: F) -> Result<(), kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match create().await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if attempt > 0 && s.code == 409 => return Ok(()),
            Err(e) if overloaded(&e) && attempt < 5 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The namespace, the Node (kube-proxy reads its addresses) and every Service and slice, 64
/// writes in flight.
async fn load(client: &Client, w: &Workload) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating the bench namespace")?;
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE_NAME},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP.to_string()}]}
    }))?;
    let nodes = Api::<Node>::all(client.clone());
    nodes.create(&PostParams::default(), &node).await?;
    nodes
        .patch_status(
            NODE_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": node.status})),
        )
        .await?;
    let services = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(0..w.services)
        .map(|i| {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                let (svc, pp) = (service(i, w.node_port(i)), PostParams::default());
                retrying(|| services.create(&pp, &svc))
                    .await
                    .with_context(|| format!("creating Service {}", Workload::name(i)))?;
                let sl = slice(i, &w.endpoint_ips(i));
                retrying(|| slices.create(&pp, &sl))
                    .await
                    .with_context(|| format!("creating the slice of {}", Workload::name(i)))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<()>()
        .await
}

/// The Services whose slices the changes rewrite: spread evenly, the last one never (first
/// programming waits on it).
fn changed_services(n: usize, changes: usize) -> Vec<usize> {
    let changes = changes.min(n - 1);
    let mut picked: Vec<usize> = (0..changes).map(|k| k * (n - 1) / changes).collect();
    picked.dedup();
    picked
}

/// Undoes [`measure`]'s changes: every rewritten slice gets its endpoints back and the added
/// Services (from index `added_from`, `adds` of them) are deleted with their slices.
async fn restore(
    client: &Client,
    w: &Workload,
    changes: usize,
    added_from: usize,
    adds: usize,
) -> anyhow::Result<()> {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE);
    let services = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    for i in changed_services(w.services, changes) {
        let name = format!("{}-1", Workload::name(i));
        let current = slices.get(&name).await?;
        let mut back = slice(i, &w.endpoint_ips(i));
        back.metadata.resource_version = current.metadata.resource_version;
        slices.replace(&name, &PostParams::default(), &back).await?;
    }
    for i in added_from..added_from + adds {
        let gone = |r: Result<_, kube::Error>| match r {
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            other => other,
        };
        gone(
            services
                .delete(&Workload::name(i), &DeleteParams::default())
                .await
                .map(drop),
        )?;
        gone(
            slices
                .delete(
                    &format!("{}-1", Workload::name(i)),
                    &DeleteParams::default(),
                )
                .await
                .map(drop),
        )?;
    }
    Ok(())
}

/// The control plane of one size, a client of it, and the runtime that client runs on.
#[derive(Clone, Copy)]
struct ApiSide<'a> {
    cp: &'a ControlPlane,
    client: &'a Client,
    rt: &'a tokio::runtime::Runtime,
}

/// Starts `proxy` in a fresh node namespace and measures it (module doc).
fn measure(
    plan: &Plan,
    api: &ApiSide,
    w: &Workload,
    proxy: &Proxy,
    added_from: usize,
    row: &mut Row,
) -> anyhow::Result<()> {
    let ApiSide { cp, client, rt } = *api;
    let site = crate::site(plan.endpoints + 1)?;
    if site.cluster.pod_ips() != w.pods {
        bail!(
            "the cluster's pods are at {:?}, the workload expects {:?}",
            site.cluster.pod_ips(),
            w.pods
        );
    }
    let in_node = site
        .cluster
        .node
        .run(|| std::net::TcpListener::bind("127.0.0.1:0"))??;
    let api: SocketAddr = format!("127.0.0.1:{}", cp.ports.apiserver).parse()?;
    let relay = Relay::start(in_node, api)?;
    let dir = cp
        .dir
        .join(format!("proxy-{}", proxy.name().replace(' ', "-")));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        cp.admin_kubeconfig_for(&format!("https://{}", relay.addr()))?,
    )?;
    let cgroup = match proxy {
        Proxy::Kpr(b) if b == "ebpf" => Some(Cgroup::new("bench-proxies")?),
        _ => None,
    };
    let kernel_before = crate::kernel_memory_kib();
    let started = Instant::now();
    let running = Running::start(
        proxy,
        &site.cluster.node,
        &kubeconfig,
        &dir,
        cgroup.as_ref(),
        plan,
        clusterips_used(plan, w.services),
    )?;
    let _in = cgroup.as_ref().map(InCgroup::enter).transpose()?;
    let podclient = &site.cluster.podclient;
    let last = SocketAddr::new(
        IpAddr::V4(Workload::cluster_ip(w.services - 1)),
        SERVICE_PORT,
    );
    // First full programming: the last Service answers.
    let answered = podclient.run(|| {
        let deadline = started + plan.start_limit;
        while Instant::now() < deadline {
            if kpr_tests::client::tcp_request_here(last, PROBE_TIMEOUT).is_ok() {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    })?;
    running.check()?;
    match answered {
        Some(t) => {
            row.first_programming_s = Some(t.as_secs_f64());
            row.programmed_after_listing_s = running.programmed_after_listing_s();
            row.first_sync_plan_apply_s = running.first_sync_plan_apply_s();
            match row.programmed_after_listing_s {
                Some(l) => println!(
                    "    first full programming: {:.2} s ({l:.2} s after the listing{})",
                    t.as_secs_f64(),
                    plan_apply(row.first_sync_plan_apply_s)
                ),
                None => println!("    first full programming: {:.2} s", t.as_secs_f64()),
            }
        }
        None => {
            // How far it got: a sample of Services spread over the whole range.
            let sample: Vec<usize> = (0..SAMPLED).map(|k| k * w.services / SAMPLED).collect();
            let answering = podclient.run(|| {
                sample
                    .iter()
                    .filter(|&&i| {
                        let to = SocketAddr::new(IpAddr::V4(Workload::cluster_ip(i)), SERVICE_PORT);
                        kpr_tests::client::tcp_request_here(to, Duration::from_millis(200)).is_ok()
                    })
                    .count()
            })?;
            row.reached = Some(format!(
                "the last Service did not answer within {:?} ({answering} of {SAMPLED} Services \
                 sampled over the range did)",
                plan.start_limit
            ));
            println!("    {}", row.reached.as_deref().unwrap_or_default());
            row.cpu_s = running.cpu_s();
            row.peak_rss_mib = running.peak_rss_mib();
            return Ok(());
        }
    }
    row.kernel_mem_kib = kernel_before
        .zip(crate::kernel_memory_kib())
        .map(|(before, after)| after - before);
    // Connect latency at N, against the loopback reference on the same client.
    // A proxy that fails some connections here (kube-proxy reprogramming after its first sync)
    // gets that written in its row; the rest of the row is still measured.
    match traffic::latency(podclient, last, plan.latency_samples) {
        Ok(l) => row.latency_at_n = Some(l),
        Err(e) => row.notes.push(format!("connect @N: {e:#}")),
    }
    row.loopback = Some(traffic::latency(
        podclient,
        SocketAddr::from(crate::LOOPBACK_SERVER),
        plan.latency_samples,
    )?);
    // Balance: how evenly the last Service's connections spread over its endpoints (kube-proxy
    // picks at random; kpr round-robins by default).
    match traffic::distribution(podclient, last, plan.balance_connections) {
        Ok(counts) => {
            row.balance_max_dev_pct = Some(traffic::max_deviation_pct(&counts, w.endpoints));
        }
        Err(e) => row.notes.push(format!("balance: {e:#}")),
    }
    // Network programming latency.
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE);
    let services = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    let mut endpoint_samples = Vec::new();
    let mut write_samples = Vec::new();
    let churn_started = Instant::now();
    let planned = plan.endpoint_changes + 2 * plan.service_adds;
    let mut done = 0usize;
    let over = |done: usize| {
        let over = churn_started.elapsed() > plan.churn_limit;
        if over {
            println!(
                "    changes stopped after {done} of {planned}: the {} s limit",
                plan.churn_limit.as_secs()
            );
        }
        over
    };
    for i in changed_services(w.services, plan.endpoint_changes) {
        if over(done) {
            break;
        }
        done += 1;
        let outsider = w.pods[(i + w.endpoints) % w.pods.len()];
        let want = format!("pod{}", (i + w.endpoints) % w.pods.len());
        let to = SocketAddr::new(IpAddr::V4(Workload::cluster_ip(i)), SERVICE_PORT);
        pace();
        let body = with_version(slice(i, &[outsider]), rt, &slices, i)?;
        let name = format!("{}-1", Workload::name(i));
        let sent = Instant::now();
        rt.block_on(slices.replace(&name, &PostParams::default(), &body))
            .with_context(|| format!("rewriting the slice of {}", Workload::name(i)))?;
        let sent = written(sent, &mut write_samples);
        match observe(podclient, to, Expect::AnsweredBy(want), sent)? {
            Some(t) => endpoint_samples.push(t),
            None => row.changes_missed += 1,
        }
    }
    let mut add_samples = Vec::new();
    for k in 0..plan.service_adds {
        if churn_started.elapsed() > plan.churn_limit {
            break;
        }
        done += 1;
        let i = added_from + k;
        let to = SocketAddr::new(IpAddr::V4(Workload::cluster_ip(i)), SERVICE_PORT);
        let ips = [w.pods[k % w.pods.len()]];
        // The slice first, untimed: the Service's creation is then the one change, as an
        // endpoint change is, rather than two writes a minimum sync period apart.
        rt.block_on(slices.create(&PostParams::default(), &slice(i, &ips)))
            .with_context(|| format!("adding the slice of {}", Workload::name(i)))?;
        // Two minimum sync periods: the slice's own sync must not hold back the Service's.
        pace();
        pace();
        let sent = Instant::now();
        rt.block_on(services.create(&PostParams::default(), &service(i, None)))
            .with_context(|| format!("adding Service {}", Workload::name(i)))?;
        let sent = written(sent, &mut write_samples);
        match observe(podclient, to, Expect::Answered, sent)? {
            Some(t) => add_samples.push(t),
            None => row.changes_missed += 1,
        }
    }
    // The last endpoint of some of the rewritten Services removed: observed when the Service
    // rejects connections (both proxies reject a Service without endpoints).
    let mut removed_samples = Vec::new();
    for &i in changed_services(w.services, plan.endpoint_changes)
        .iter()
        .take(plan.service_adds)
    {
        if churn_started.elapsed() > plan.churn_limit {
            break;
        }
        done += 1;
        let to = SocketAddr::new(IpAddr::V4(Workload::cluster_ip(i)), SERVICE_PORT);
        pace();
        let body = with_version(slice(i, &[]), rt, &slices, i)?;
        let name = format!("{}-1", Workload::name(i));
        let sent = Instant::now();
        rt.block_on(slices.replace(&name, &PostParams::default(), &body))
            .with_context(|| format!("emptying the slice of {}", Workload::name(i)))?;
        let sent = written(sent, &mut write_samples);
        match observe(podclient, to, Expect::Rejected, sent)? {
            Some(t) => removed_samples.push(t),
            None => row.changes_missed += 1,
        }
    }
    if done < planned {
        row.notes.push(format!(
            "changes stopped after {done} of {planned}: the {} s limit for one proxy's changes",
            plan.churn_limit.as_secs()
        ));
    }
    running.check()?;
    row.endpoint_change =
        (!endpoint_samples.is_empty()).then(|| traffic::summarize(endpoint_samples));
    row.service_added = (!add_samples.is_empty()).then(|| traffic::summarize(add_samples));
    row.endpoint_removed =
        (!removed_samples.is_empty()).then(|| traffic::summarize(removed_samples));
    row.api_write = (!write_samples.is_empty()).then(|| traffic::summarize(write_samples));
    row.cpu_s = running.cpu_s();
    row.peak_rss_mib = running.peak_rss_mib();
    println!(
        "    endpoint change p50/p99 {} ms, Service added {} ms, last endpoint removed {} ms, {} missed; CPU {:.1} s, peak RSS {:.1} MiB",
        ms_pair(row.endpoint_change.as_ref()),
        ms_pair(row.service_added.as_ref()),
        ms_pair(row.endpoint_removed.as_ref()),
        row.changes_missed,
        row.cpu_s.unwrap_or(f64::NAN),
        row.peak_rss_mib.unwrap_or(f64::NAN)
    );
    drop(relay);
    Ok(())
}

/// The moment a write returned (the object is in the API server from then on: time zero of a
/// change), recording how long the write took.
fn written(sent: Instant, samples: &mut Vec<Duration>) -> Instant {
    let now = Instant::now();
    samples.push(now - sent);
    now
}

/// The slice as it is now, with `new`'s endpoints: a replace needs the current resourceVersion.
fn with_version(
    mut new: EndpointSlice,
    rt: &tokio::runtime::Runtime,
    slices: &Api<EndpointSlice>,
    i: usize,
) -> anyhow::Result<EndpointSlice> {
    let current = rt.block_on(slices.get(&format!("{}-1", Workload::name(i))))?;
    new.metadata.resource_version = current.metadata.resource_version;
    Ok(new)
}

/// Changes at least a second apart: both kube-proxy and kpr sync at most once per second by
/// default, and a change right after a sync would measure that wait, not the proxy.
fn pace() {
    std::thread::sleep(Duration::from_millis(1_100));
}

/// Services probed, spread over the range, when a proxy did not program the last one in time.
const SAMPLED: usize = 20;

/// A probe's connect and read timeout while a change is awaited. A SYN sent before the proxy
/// programmed a new Service is dropped, not refused, so a probe's timeout is the resolution of
/// the measurement; an answered connection here takes well under a millisecond.
const PROBE_TIMEOUT: Duration = Duration::from_millis(10);

/// What a connection shows once a change is programmed.
enum Expect {
    /// Answered by this pod.
    AnsweredBy(String),
    /// Answered by any pod.
    Answered,
    /// Refused or reset.
    Rejected,
}

/// Connections to `to` from the pod client until one shows `expect`; the time since `sent`, or
/// `None` after 30 s.
fn observe(
    podclient: &Netns,
    to: SocketAddr,
    expect: Expect,
    sent: Instant,
) -> anyhow::Result<Option<Duration>> {
    Ok(podclient.run(move || {
        while sent.elapsed() < Duration::from_secs(30) {
            let result = kpr_tests::client::tcp_request_here(to, PROBE_TIMEOUT);
            let shown = match (&expect, &result) {
                (Expect::AnsweredBy(pod), Ok(reply)) => reply.pod == *pod,
                (Expect::Answered, Ok(_)) => true,
                (Expect::Rejected, Err(e)) => e.is_rejection(),
                _ => false,
            };
            if shown {
                return Some(sent.elapsed());
            }
        }
        None
    })?)
}

fn ms_pair(l: Option<&Latency>) -> String {
    match l {
        Some(l) => format!("{:.1}/{:.1}", l.p50_us / 1e3, l.p99_us / 1e3),
        None => "-".into(),
    }
}

/// A proxy process in its node namespace: kpr's through the harness's [`Agent`] (which keeps an
/// eBPF agent on its test cgroup and private pins, and cleans up), kube-proxy as a plain child.
enum Running<'n> {
    Kpr(Box<Agent<'n>>, &'n Netns),
    KubeProxy(Child, &'n Netns, PathBuf),
}

impl<'n> Running<'n> {
    fn start(
        proxy: &Proxy,
        node: &'n Netns,
        kubeconfig: &Path,
        dir: &Path,
        cgroup: Option<&Cgroup>,
        plan: &Plan,
        clusterips: usize,
    ) -> anyhow::Result<Running<'n>> {
        match proxy {
            Proxy::Kpr(backend) => {
                let (backend, mode) = crate::backend::backend_and_mode(backend);
                let mut opts = AgentOptions::backend(backend)
                    .kube(kubeconfig)
                    .default_min_sync_period()
                    .binary(crate::kpr_binary("proxy"));
                // The harness passes 10.96.0.0/16; the /16s past it that the clusterIPs reach.
                for cidr in service_cidrs(clusterips).into_iter().skip(1) {
                    opts = opts.arg("--service-cluster-ip-range").arg(cidr);
                }
                opts.ready_timeout = plan.start_limit;
                if let Some(mode) = mode {
                    opts = opts.arg("--iptables-mode").arg(mode);
                }
                if let Some(cg) = cgroup {
                    opts = opts.cgroup(cg);
                }
                Ok(Running::Kpr(
                    Box::new(Agent::start(node, &opts, &[])?),
                    node,
                ))
            }
            Proxy::KubeProxy(mode) => {
                let bins = controlplane::Binaries::locate()?;
                let log_path = dir.join("kube-proxy.log");
                let log = std::fs::File::create(&log_path)?;
                let mut cmd = node.exec(bins.path("kube-proxy"))?;
                let mode = match *mode {
                    "iptables-legacy" => {
                        cmd.env("PATH", legacy_path(dir)?);
                        "iptables"
                    }
                    other => other,
                };
                // Its normal flags for a node like the harness's; the conntrack ones keep it off
                // machine-wide sysctls (0 leaves a setting alone).
                cmd.args(["--proxy-mode", mode, "--kubeconfig"])
                    .arg(kubeconfig)
                    .args(["--hostname-override", NODE_NAME])
                    .args(["--cluster-cidr", CLUSTER_CIDR])
                    .args(["--nodeport-addresses", &format!("{NODE_IP}/32")])
                    .args(["--metrics-bind-address", "127.0.0.1:10249"])
                    .args(["--healthz-bind-address", "127.0.0.1:10256"])
                    .args(["--conntrack-max-per-core", "0"])
                    .args(["--conntrack-tcp-timeout-established", "0"])
                    .args(["--conntrack-tcp-timeout-close-wait", "0"])
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log);
                // Killed with the benchmark, even one that dies without unwinding: a kube-proxy
                // left behind keeps a namespace and its rules alive.
                // SAFETY: prctl(2) is async-signal-safe; nothing is allocated between fork and exec.
                unsafe {
                    std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let child = cmd.spawn().context("starting kube-proxy")?;
                Ok(Running::KubeProxy(child, node, log_path))
            }
        }
    }

    /// An error with the log if the process has exited.
    fn check(&self) -> anyhow::Result<()> {
        if self.pid().is_none() {
            let log = match self {
                Running::Kpr(agent, _) => agent.log(),
                Running::KubeProxy(_, _, path) => std::fs::read_to_string(path).unwrap_or_default(),
            };
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            bail!(
                "the proxy exited; its log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }

    fn ns(&self) -> &'n Netns {
        match self {
            Running::Kpr(_, ns) | Running::KubeProxy(_, ns, _) => ns,
        }
    }

    /// The process name (`/proc/PID/comm`) to find it by in its node namespace.
    fn comm(&self) -> &'static str {
        match self {
            Running::Kpr(..) => "proxy",
            Running::KubeProxy(..) => "kube-proxy",
        }
    }

    /// The process in the node namespace, found by name.
    fn pid(&self) -> Option<u32> {
        crate::backend::pid_named(self.ns(), self.comm())
    }

    /// The agent's own account of its first sync after the initial listing (kpr only). The line
    /// comes at the end of that sync, which may be after the Services already answer (stale
    /// conntrack cleanup runs last): waits a few seconds for it.
    fn programmed_after_listing_s(&self) -> Option<f64> {
        let Running::Kpr(agent, _) = self else {
            return None;
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = programmed_after_listing(&agent.log());
            if found.is_some() || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's first full sync split into planning and applying (kpr rule backends; read
    /// once the agent's line about the listing is there).
    fn first_sync_plan_apply_s(&self) -> Option<(f64, f64)> {
        match self {
            Running::Kpr(agent, _) => first_sync_plan_apply(&agent.log()),
            Running::KubeProxy(..) => None,
        }
    }

    fn cpu_s(&self) -> Option<f64> {
        crate::workload_controllers::cpu_seconds_with_children(self.pid()?).ok()
    }

    fn peak_rss_mib(&self) -> Option<f64> {
        let kib = crate::workload_controllers::vm_hwm_kib(self.pid()?).ok()?;
        Some(kib as f64 / 1024.0)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Running::KubeProxy(child, _, _) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A PATH whose `iptables*` and `ip6tables*` are the legacy (xtables) binaries, ahead of the
/// rest: kube-proxy runs whichever `iptables-restore` its PATH finds.
fn legacy_path(dir: &Path) -> anyhow::Result<std::ffi::OsString> {
    let bin = dir.join("iptables-legacy-bin");
    std::fs::create_dir_all(&bin)?;
    for family in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            let target = which(&format!("{family}-legacy{suffix}")).with_context(|| {
                format!("kube-proxy-iptables-legacy needs {family}-legacy{suffix} on PATH")
            })?;
            let link = bin.join(format!("{family}{suffix}"));
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, link)?;
        }
    }
    let rest = std::env::var_os("PATH").unwrap_or_default();
    Ok(std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&rest)),
    )?)
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The table: one block per size.
pub fn markdown(b: &ProxiesBench) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    writeln!(
        s,
        "{}, tree {}, Kubernetes {}, kernel {}, {}; command: `{}`\n",
        b.date, b.tree, b.kubernetes, b.kernel, b.iptables, b.command
    )
    .unwrap();
    for run in &b.runs {
        writeln!(
            s,
            "### {} Services x {} endpoints (written through the API in {:.1} s{})\n",
            run.services,
            run.endpoints,
            run.load_s,
            match &run.reused_state {
                Some(when) => format!(" by the run of {when}; its API state reused"),
                None => String::new(),
            }
        )
        .unwrap();
        s.push_str(
            "| proxy | first full programming (s) | endpoints replaced p50 / p99 (ms) | Service added p50 / p99 (ms) | last endpoint removed p50 / p99 (ms) | missed | API write p50 / p99 (ms) | CPU (s) | peak RSS (MiB) | kernel mem Δ (KiB) | connect @N p50 / p99 (µs) | @N / loopback p50 | balance: max deviation (%) |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &run.rows {
            let first = match (r.first_programming_s, &r.reached, &r.error) {
                (Some(t), _, Some(e)) => {
                    format!(
                        "{t:.2}, then error: {}",
                        e.lines().next().unwrap_or_default()
                    )
                }
                (None, _, Some(e)) => format!("error: {}", e.lines().next().unwrap_or_default()),
                (Some(t), _, None) => match r.programmed_after_listing_s {
                    Some(l) => format!(
                        "{t:.2} (listing + {l:.2}{})",
                        plan_apply(r.first_sync_plan_apply_s)
                    ),
                    None => format!("{t:.2}"),
                },
                (None, Some(why), None) => why.clone(),
                (None, None, None) => "-".into(),
            };
            let us = |l: &Option<Latency>| {
                l.as_ref()
                    .map(|l| format!("{:.0} / {:.0}", l.p50_us, l.p99_us))
                    .unwrap_or_else(|| "-".into())
            };
            let ratio = match (&r.latency_at_n, &r.loopback) {
                (Some(n), Some(l)) if l.p50_us > 0.0 => format!("{:.2}", n.p50_us / l.p50_us),
                _ => "-".into(),
            };
            writeln!(
                s,
                "| {} | {first} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {ratio} | {} |",
                r.proxy,
                ms_pair(r.endpoint_change.as_ref()).replace('/', " / "),
                ms_pair(r.service_added.as_ref()).replace('/', " / "),
                ms_pair(r.endpoint_removed.as_ref()).replace('/', " / "),
                r.changes_missed,
                ms_pair(r.api_write.as_ref()).replace('/', " / "),
                r.cpu_s
                    .map(|c| format!("{c:.1}"))
                    .unwrap_or_else(|| "-".into()),
                r.peak_rss_mib
                    .map(|m| format!("{m:.1} ({:.1} KiB/Service)", m * 1024.0 / r.services as f64))
                    .unwrap_or_else(|| "-".into()),
                r.kernel_mem_kib
                    .map(|k| k.to_string())
                    .unwrap_or_else(|| "-".into()),
                us(&r.latency_at_n),
                r.balance_max_dev_pct
                    .map(|d| format!("{d:.1}"))
                    .unwrap_or_else(|| "-".into()),
            )
            .unwrap();
        }
        for r in run.rows.iter().filter(|r| !r.notes.is_empty()) {
            writeln!(s, "\n{}: {}", r.proxy, r.notes.join("; ")).unwrap();
        }
        s.push('\n');
    }
    s
}

fn write(b: &ProxiesBench, out_dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out_dir)?;
    let json = out_dir.join("proxies.json");
    std::fs::write(&json, serde_json::to_string_pretty(b)?)?;
    let md = out_dir.join("proxies.md");
    let text = markdown(b);
    std::fs::write(&md, &text)?;
    let svg = out_dir.join("proxies.svg");
    std::fs::write(&svg, chart(b))?;
    println!("\n{text}");
    println!(
        "wrote {}\nwrote {}\nwrote {}",
        json.display(),
        md.display(),
        svg.display()
    );
    Ok(())
}

/// One panel per metric, Services on the x axis (log scale), one line per proxy; the y axes are
/// logarithmic too, since kube-proxy and kpr differ by orders of magnitude.
pub fn chart(b: &ProxiesBench) -> String {
    use std::fmt::Write as _;
    type Metric = (&'static str, fn(&Row) -> Option<f64>);
    let metrics: [Metric; 4] = [
        ("first full programming (s)", |r| r.first_programming_s),
        ("endpoints replaced p99 (ms)", |r| {
            r.endpoint_change.map(|l| l.p99_us / 1e3)
        }),
        ("CPU over the run (s)", |r| r.cpu_s),
        ("peak RSS (MiB)", |r| r.peak_rss_mib),
    ];
    let colors = [
        "#c0392b", "#e67e22", "#7f8c8d", "#2980b9", "#16a085", "#8e44ad", "#27ae60",
    ];
    let proxies: Vec<String> = {
        let mut names: Vec<String> = Vec::new();
        for r in b.runs.iter().flat_map(|run| &run.rows) {
            if !names.contains(&r.proxy) {
                names.push(r.proxy.clone());
            }
        }
        names
    };
    let sizes: Vec<f64> = b.runs.iter().map(|r| r.services as f64).collect();
    let (pw, ph, margin) = (420.0, 260.0, 60.0);
    let width = 2.0 * (pw + margin) + 200.0;
    let height = 2.0 * (ph + margin) + 40.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n"
    );
    writeln!(
        s,
        "<text x=\"10\" y=\"18\" font-size=\"14\">kube-proxy and kpr fed by kube-apiserver {}, \
         kernel {} (log scales)</text>",
        b.kubernetes, b.kernel
    )
    .unwrap();
    let log = |v: f64| v.max(1e-6).log10();
    let (xmin, xmax) = sizes.iter().fold((f64::MAX, f64::MIN), |(a, z), &v| {
        (a.min(log(v)), z.max(log(v)))
    });
    for (m, (title, get)) in metrics.iter().enumerate() {
        let ox = margin + (m % 2) as f64 * (pw + margin);
        let oy = 40.0 + (m / 2) as f64 * (ph + margin);
        writeln!(
            s,
            "<text x=\"{ox}\" y=\"{}\" font-size=\"12\">{}</text>",
            oy + 12.0,
            xml(title)
        )
        .unwrap();
        let values: Vec<f64> = b
            .runs
            .iter()
            .flat_map(|run| run.rows.iter().filter_map(get))
            .filter(|v| *v > 0.0)
            .collect();
        if values.is_empty() {
            continue;
        }
        let (ymin, ymax) = values.iter().fold((f64::MAX, f64::MIN), |(a, z), &v| {
            (a.min(log(v)), z.max(log(v)))
        });
        let (ymin, ymax) = (ymin.floor(), ymax.ceil().max(ymin.floor() + 1.0));
        let top = oy + 20.0;
        let x = |v: f64| {
            if xmax > xmin {
                ox + (log(v) - xmin) / (xmax - xmin) * pw
            } else {
                ox + pw / 2.0
            }
        };
        let y = |v: f64| top + ph - (log(v) - ymin) / (ymax - ymin) * ph;
        writeln!(
            s,
            "<rect x=\"{ox}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>"
        )
        .unwrap();
        let mut decade = ymin;
        while decade <= ymax {
            let v = 10f64.powf(decade);
            writeln!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                ox - 4.0,
                y(v) + 4.0,
                if v >= 1.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v}")
                }
            )
            .unwrap();
            decade += 1.0;
        }
        for &n in &sizes {
            writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{n:.0}</text>",
                x(n),
                top + ph + 14.0
            )
            .unwrap();
        }
        for (k, proxy) in proxies.iter().enumerate() {
            let points: Vec<String> = b
                .runs
                .iter()
                .filter_map(|run| {
                    let row = run.rows.iter().find(|r| &r.proxy == proxy)?;
                    let v = get(row).filter(|v| *v > 0.0)?;
                    Some(format!("{:.1},{:.1}", x(run.services as f64), y(v)))
                })
                .collect();
            let color = colors[k % colors.len()];
            if points.len() > 1 {
                writeln!(
                    s,
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>",
                    points.join(" ")
                )
                .unwrap();
            }
            for p in &points {
                let (px, py) = p.split_once(',').expect("formatted above");
                writeln!(
                    s,
                    "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{color}\"/>"
                )
                .unwrap();
            }
        }
    }
    for (k, proxy) in proxies.iter().enumerate() {
        let ly = 60.0 + 18.0 * k as f64;
        let lx = 2.0 * (pw + margin) + 10.0;
        writeln!(
            s,
            "<rect x=\"{lx}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{ly}\">{}</text>",
            ly - 10.0,
            colors[k % colors.len()],
            lx + 16.0,
            xml(proxy)
        )
        .unwrap();
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_account_of_its_first_sync_is_read_from_its_log() {
        let log = "2026-11-26T18:00:00Z  INFO proxy::sync: initial listing complete; programming \
                   the dataplane\n2026-11-26T18:00:01Z  INFO proxy::sync: initial listing \
                   programmed 612 ms after it completed service_ports=20000 sync_ms=480.5\n";
        assert_eq!(programmed_after_listing(log), Some(0.612));
        assert_eq!(programmed_after_listing("no such line"), None);
        let log = "2026-11-28T06:00:01Z  INFO proxy::dataplane::rules::driver: nftables: full \
                   sync service_ports=100000 operations=700012 plan_ms=1875.25 apply_ms=4210.5\n";
        assert_eq!(first_sync_plan_apply(log), Some((1.87525, 4.2105)));
        assert_eq!(
            plan_apply(first_sync_plan_apply(log)),
            ": plan 1.88, apply 4.21"
        );
        assert_eq!(first_sync_plan_apply("no such line"), None);
    }

    #[test]
    fn proxy_names_parse_and_ipvs_says_why_not() {
        assert_eq!(
            Proxy::parse("kube-proxy-nftables").unwrap(),
            Proxy::KubeProxy("nftables")
        );
        assert_eq!(
            Proxy::parse("kpr-iptables-nft").unwrap(),
            Proxy::Kpr("iptables-nft".into())
        );
        let ipvs = Proxy::parse("kube-proxy-ipvs").unwrap_err().to_string();
        assert!(ipvs.contains("not measured"), "{ipvs}");
        assert!(Proxy::parse("kpr-bogus").is_err());
        for name in PROXIES.split(',') {
            Proxy::parse(name.trim()).unwrap();
        }
    }

    #[test]
    fn changes_are_spread_and_never_touch_the_last_service() {
        let picked = changed_services(1_000, 100);
        assert_eq!(picked.len(), 100);
        assert_eq!(picked[0], 0);
        assert!(picked.windows(2).all(|w| w[1] - w[0] >= 9));
        assert!(picked.iter().all(|&i| i < 999));
        // Fewer Services than changes: each at most once.
        assert_eq!(changed_services(10, 100), (0..9).collect::<Vec<_>>());
    }

    fn row(proxy: &str, services: usize, first: f64) -> Row {
        Row {
            proxy: proxy.into(),
            services,
            first_programming_s: Some(first),
            endpoint_change: Some(Latency {
                p50_us: 4_000.0,
                p99_us: 6_000.0,
                samples: 100,
            }),
            cpu_s: Some(1.5),
            peak_rss_mib: Some(40.0),
            ..Row::default()
        }
    }

    #[test]
    fn the_table_and_the_chart_show_every_proxy_and_size() {
        let b = ProxiesBench {
            command: "cargo xtask bench --source kube".into(),
            date: "2026-11-26 12:00 UTC".into(),
            tree: "abc1234".into(),
            kubernetes: "v1.34.4".into(),
            kernel: "6.18".into(),
            iptables: "iptables v1.8.9 (nf_tables)".into(),
            runs: [1_000, 20_000]
                .iter()
                .map(|&n| SizeRun {
                    services: n,
                    endpoints: 4,
                    load_s: 1.0,
                    reused_state: None,
                    rows: vec![
                        row("kube-proxy nftables", n, 10.0),
                        Row {
                            reached: Some("the last Service did not answer within 900s".into()),
                            first_programming_s: None,
                            ..row("kube-proxy iptables", n, 0.0)
                        },
                        row("kpr ebpf", n, 0.5),
                    ],
                })
                .collect(),
        };
        let md = markdown(&b);
        assert_eq!(
            md.matches("| kpr ebpf | 0.50 | 4.0 / 6.0 |").count(),
            2,
            "{md}"
        );
        assert!(md.contains("did not answer within 900s"), "{md}");
        let svg = chart(&b);
        // Four panels, a line per proxy that has two points in a panel.
        assert_eq!(svg.matches("<polyline").count(), 4 * 2 + 3, "{svg}");
        assert!(svg.contains("kube-proxy iptables"));
    }
}
