//! `cargo xtask cluster chaos <scenario>`: a disruption under load on a cluster with real nodes,
//! measured from pods on every node and from outside the nodes (issue 42's scenarios; see
//! docs/RELIABILITY.md).
//!
//! The load: a `backend` Deployment of agnhost `netexec` (HTTP on 8080, UDP on 8081) behind a
//! LoadBalancer Service (its address, 198.51.100.10, published in its status by the harness as a
//! cloud's controller would, and routed by the hub to the first node), and `cargo xtask load`
//! ([`crate::load`]) started as a process of this machine inside the network namespace of a
//! client Pod on every node (and in that node's cgroup, where the eBPF backend's socket programs
//! see a node's processes) against the ClusterIP, another node's NodePort and the LoadBalancer
//! address, and inside the cluster network's hub (outside the nodes) against every node's
//! NodePort and the LoadBalancer address.
//!
//! Scenarios:
//! - `agent-restart`: `kubectl rollout restart` of the Service proxy's DaemonSet (kpr's agent,
//!   or kube-proxy on a `--proxy kube-proxy` cluster), waited for with `rollout status`;
//! - `agent-upgrade`: the same DaemonSet moved to a new image with `kubectl set image` (a new tag
//!   and digest of kpr's image, from `--upgrade-binaries`, or of kube-proxy's, imported into the
//!   nodes first, as a pull would), waited for the same way;
//! - `endpoint-removal`: the Deployment scaled down by half, then one of the remaining Pods
//!   deleted: when each removed endpoint left the EndpointSlice (polled), when it last answered a
//!   new connection or a UDP request, and what failed meanwhile;
//! - `proxy-switch`: the nodes' Service proxy switched, as README's steps do (`cargo xtask
//!   cluster proxy`'s [`super::switch::switch`]): kpr to another backend (`--to kpr
//!   --to-backend B`), kube-proxy to kpr, kpr back to kube-proxy (`--to kube-proxy`); the
//!   leftovers check after it;
//! - `soak`: `--duration` seconds of constant churn: every second `--churn` Services (selecting
//!   the backend) change their port, so the agents reprogram and the EndpointSlices change, and
//!   every 10th round a Deployment of 3 Pods is scaled up or down (Pods created, scheduled,
//!   deleted); the changes are the harness's own API requests (a kube client, all of a round's
//!   at once), so a round lasts a second unless the API server is slower than that (a kubectl
//!   process per round took about 2 s: half the rate asked for);
//!   the agents', controller-managers' and schedulers' resident memory and open descriptors
//!   sampled every 15 s: flat, or a leak;
//! - `apiserver-outage`: kube-apiserver stopped for `--outage` seconds (etcd, the nodes, the
//!   proxies and the controllers keep running), started again with its own command line, etcd
//!   compacted at its revision (every watch from before must relist), then the endpoint-removal
//!   steps: the dataplane must serve through the outage and follow the changes after it.
//!
//! Each run writes `report.json` (every client's report and the timeline) and `report.md` (the
//! table) under `<cluster dir>/chaos/<scenario>-<unix ms>/` and prints the table.
//!
//! Owns: the `kpr-chaos` namespace and the scenario runs; the load client is [`crate::load`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::{Args, ValueEnum};
use controlplane::network::netns_path;
use serde_json::{json, Value};

use super::Cluster;
use crate::deploy;
use crate::exec::Cmd;
use crate::load::unix_ms;

const NAMESPACE: &str = "kpr-chaos";
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.56";
const NODE_PORT_TCP: u16 = 30180;
const NODE_PORT_UDP: u16 = 30181;
/// The backend Service's LoadBalancer address (TEST-NET-2), published by the harness and routed
/// by the hub to the first node.
const LB_IP: &str = "198.51.100.10";
/// How long a load client may wait for every target to answer before it counts.
const WARMUP_SECONDS: u64 = 30;
/// This machine's cgroup2 hierarchy; each node's subtree is `<this>/<node>`.
const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// `kubectl rollout restart` of the Service proxy's DaemonSet under load.
    AgentRestart,
    /// The Service proxy's DaemonSet moved to a new image (a new tag and digest, imported into
    /// every node first) with `kubectl set image` under load.
    AgentUpgrade,
    /// Scale the backend Deployment down, then delete a Pod, under load.
    EndpointRemoval,
    /// Switch the nodes' Service proxy (`--to`, `--to-backend`, `--to-mode`) under load.
    ProxySwitch,
    /// Stop kube-apiserver for `--outage` s, start it, compact etcd, then remove endpoints.
    ApiserverOutage,
    /// `--duration` s of constant churn (`--churn` Service changes a second, Pods created and
    /// deleted) with the components' memory and open files sampled.
    Soak,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::AgentRestart => "agent-restart",
            Scenario::AgentUpgrade => "agent-upgrade",
            Scenario::EndpointRemoval => "endpoint-removal",
            Scenario::ProxySwitch => "proxy-switch",
            Scenario::ApiserverOutage => "apiserver-outage",
            Scenario::Soak => "soak",
        }
    }
}

#[derive(Debug, Args)]
pub struct ChaosArgs {
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// New TCP connections per second, per client and target.
    #[arg(long, default_value_t = 25.0)]
    pub rate: f64,
    /// Long-lived TCP connections per client and target.
    #[arg(long, default_value_t = 2)]
    pub long: usize,
    /// Seconds of load before the disruption and after it has converged.
    #[arg(long, default_value_t = 10)]
    pub settle: u64,
    /// The backend Deployment's replicas (endpoint-removal scales it to half).
    #[arg(long, default_value_t = 4)]
    pub replicas: usize,
    /// proxy-switch: the Service proxy to switch the nodes to.
    #[arg(long, value_enum)]
    pub to: Option<super::nodes::Proxy>,
    /// proxy-switch: kpr's backend after the switch (with --to kpr).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(deploy::BACKENDS), default_value = deploy::DEFAULT_BACKEND)]
    pub to_backend: String,
    /// proxy-switch: kube-proxy's mode after the switch (with --to kube-proxy).
    #[arg(long, value_enum, default_value_t = super::nodes::Mode::Nftables)]
    pub to_mode: super::nodes::Mode,
    /// apiserver-outage: seconds kube-apiserver stays stopped.
    #[arg(long, default_value_t = 60)]
    pub outage: u64,
    /// soak: seconds of churn.
    #[arg(long, default_value_t = 3600)]
    pub duration: u64,
    /// soak: Service changes a second (each a changed port, so its EndpointSlices change too).
    #[arg(long, default_value_t = 10)]
    pub churn: u32,
    /// soak: the Pods the churn Deployment is scaled up to every 20th round (and down to 0 ten
    /// rounds later): Pods created and deleted, each with its Events.
    #[arg(long, default_value_t = 3)]
    pub churn_pods: u32,
    /// endpoint-removal: backend Pods deleted one after another (each replaced before the next),
    /// after the scale-down; many give the lag's distribution (p50 / p99).
    #[arg(long, default_value_t = 1)]
    pub deletions: usize,
    /// agent-upgrade on kpr: the build the new image carries (default: the cluster's
    /// `--binaries`).
    #[arg(long, value_enum)]
    pub upgrade_binaries: Option<crate::Profile>,
}

/// One load client: where it runs and its process.
struct Client {
    label: String,
    /// `pod` (a client Pod's namespace) or `outside` (the cluster network's hub).
    from: &'static str,
    child: Child,
    out: PathBuf,
}

fn kubectl(kubeconfig: &str) -> Cmd {
    Cmd::new(crate::k8s::bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
}

pub fn run(cluster: &Cluster, args: &ChaosArgs) -> anyhow::Result<Outcome> {
    let state = super::read_state(cluster)?;
    let kubeconfig = state["kubeconfig"]
        .as_str()
        .context("the cluster's state names no kubeconfig")?
        .to_string();
    let proxy = state["proxy"].as_str().unwrap_or("?").to_string();
    ensure!(
        state["nodes"].as_u64().unwrap_or(0) > 0,
        "chaos needs real nodes: `cargo xtask cluster up --nodes 3`"
    );
    let k = || kubectl(&kubeconfig);
    let run_dir = cluster
        .dir
        .join("chaos")
        .join(format!("{}-{}", args.scenario.name(), unix_ms()));
    fs::create_dir_all(&run_dir)?;
    let nodes = node_ips(&k)?;
    // Built and imported before the load starts: the build would load the machine the clients
    // share.
    let upgrade = if args.scenario == Scenario::AgentUpgrade {
        Some(prepare_upgrade(cluster, &state, &k, &run_dir, args)?)
    } else {
        None
    };
    let hub_name = format!("{}-net", cluster.name);
    deploy_workload(&k, &run_dir, &hub_name, &nodes, args.replicas)?;
    let cluster_ip = k()
        .args(["get", "service", "backend", "-n", NAMESPACE])
        .args(["-o", "jsonpath={.spec.clusterIP}"])
        .read()?;
    let stop_file = run_dir.join("stop");
    let mut clients = Vec::new();
    let started = (|| -> anyhow::Result<()> {
        for (i, (node, _)) in nodes.iter().enumerate() {
            let (_, other_ip) = &nodes[(i + 1) % nodes.len()];
            let pid = pod_pid(&k, &format!("chaos-client-{node}"))?;
            let targets = vec![
                format!("clusterip={cluster_ip}:80,{cluster_ip}:81"),
                format!("nodeport={other_ip}:{NODE_PORT_TCP},{other_ip}:{NODE_PORT_UDP}"),
                format!("loadbalancer={LB_IP}:80,{LB_IP}:81"),
            ];
            clients.push(start_client(
                &format!("pod-{node}"),
                "pod",
                Some(node),
                &format!("/proc/{pid}/ns/net"),
                &targets,
                args,
                &stop_file,
                &run_dir,
            )?);
        }
        let mut targets: Vec<String> = nodes
            .iter()
            .map(|(_, ip)| format!("nodeport={ip}:{NODE_PORT_TCP},{ip}:{NODE_PORT_UDP}"))
            .collect();
        targets.push(format!("loadbalancer={LB_IP}:80,{LB_IP}:81"));
        let hub = netns_path(&hub_name);
        clients.push(start_client(
            "outside",
            "outside",
            None,
            &hub.to_string_lossy(),
            &targets,
            args,
            &stop_file,
            &run_dir,
        )?);
        Ok(())
    })();
    let outcome = started.and_then(|()| {
        wait_counting(&mut clients, &run_dir)?;
        println!(
            "==> load from {} clients; {} s before the disruption",
            clients.len(),
            args.settle
        );
        std::thread::sleep(Duration::from_secs(args.settle));
        ensure_running(&mut clients)?;
        match args.scenario {
            Scenario::AgentRestart => agent_restart(&k, &proxy, args),
            Scenario::AgentUpgrade => agent_upgrade(
                &k,
                upgrade.as_ref().context("the upgrade was not prepared")?,
                args,
            ),
            Scenario::EndpointRemoval => endpoint_removal(&k, args),
            Scenario::ProxySwitch => proxy_switch(cluster, args),
            Scenario::ApiserverOutage => apiserver_outage(cluster, &k, args),
            Scenario::Soak => soak(cluster, &kubeconfig, &run_dir, args),
        }
    });
    fs::write(&stop_file, "")?;
    let mut reports = Vec::new();
    let mut failed = None;
    for client in clients {
        let from = client.from;
        match collect(client) {
            Ok(report) => reports.push((from, report)),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    // The scenario's own error first: a client that failed because of it says less.
    let timeline = outcome?;
    if let Some(e) = failed {
        return Err(e);
    }
    let rows = rows(&timeline, &reports);
    let report = summarize(args.scenario, &proxy, &timeline, &reports, &rows);
    fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(&json!({
            "scenario": args.scenario.name(),
            "proxy": proxy,
            "timeline": timeline,
            "clients": reports.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
        }))?,
    )?;
    fs::write(run_dir.join("report.md"), &report)?;
    println!("{report}");
    println!("report: {}", run_dir.join("report.md").display());
    Ok(Outcome {
        report: run_dir.join("report.md"),
        rows,
    })
}

/// What a run measured, by source, target and kind of flow.
pub struct Outcome {
    pub report: PathBuf,
    rows: Rows,
}

impl Outcome {
    /// The issue's goal for a kernel backend's restart, on TCP: no failed new connection, no
    /// broken long-lived one, and every flow answered. UDP is reported, not judged: a datagram
    /// has no connection to break, and its timeouts are the report's to show (the restart's
    /// lost UDP replies this smoke found are fixed: docs/RELIABILITY.md, scenario 1).
    pub fn check_tcp_unbroken(&self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        for ((from, target, kind), r) in &self.rows {
            if r.ok == 0 {
                problems.push(format!("{from} -> {target} {kind}: nothing answered"));
            }
            if *kind != "UDP" && (r.connect_failed > 0 || r.broken > 0) {
                problems.push(format!(
                    "{from} -> {target} {kind}: {} failed connects, {} broken connections",
                    r.connect_failed, r.broken
                ));
            }
        }
        ensure!(
            problems.is_empty(),
            "{} (report: {})",
            problems.join("; "),
            self.report.display()
        );
        Ok(())
    }
}

impl ChaosArgs {
    /// `cargo xtask test`'s smoke of scenario 1: the agent restarted under a lighter load, 5 s of
    /// it before and after.
    pub fn restart_smoke() -> ChaosArgs {
        ChaosArgs {
            scenario: Scenario::AgentRestart,
            rate: 10.0,
            long: 2,
            settle: 5,
            replicas: 2,
            to: None,
            to_backend: deploy::DEFAULT_BACKEND.to_string(),
            to_mode: super::nodes::Mode::Nftables,
            outage: 60,
            duration: 0,
            churn: 0,
            churn_pods: 3,
            deletions: 1,
            upgrade_binaries: None,
        }
    }
}

/// Every node's name and InternalIP (IPv4).
fn node_ips(k: &dyn Fn() -> Cmd) -> anyhow::Result<Vec<(String, String)>> {
    let text = k()
        .args([
            "get",
            "nodes",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}"#,
        ])
        .read()?;
    let nodes: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let (name, ips) = l.split_once(' ')?;
            let ip = crate::kind::of_family(ips, false)?;
            Some((name.to_string(), ip.to_string()))
        })
        .collect();
    ensure!(
        !nodes.is_empty(),
        "the cluster has no nodes with an IPv4 InternalIP"
    );
    Ok(nodes)
}

/// The namespace, the backend Deployment and Service, and a client Pod on every node; waits for
/// them.
fn deploy_workload(
    k: &dyn Fn() -> Cmd,
    run_dir: &Path,
    hub: &str,
    nodes: &[(String, String)],
    replicas: usize,
) -> anyhow::Result<()> {
    let labels = json!({"app": "backend"});
    let mut items = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "backend", "namespace": NAMESPACE},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        // A backend that shuts down gracefully: it keeps serving for 5 s after
                        // SIGTERM (agnhost's --delay-shutdown), while its endpoint is
                        // terminating, then exits.
                        "terminationGracePeriodSeconds": 10,
                        "containers": [{
                            "name": "netexec", "image": AGNHOST,
                            "args": ["netexec", "--http-port=8080", "--udp-port=8081",
                                     "--delay-shutdown=5"],
                            "ports": [{"containerPort": 8080, "protocol": "TCP"},
                                      {"containerPort": 8081, "protocol": "UDP"}],
                            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        }],
                    },
                },
            },
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "backend", "namespace": NAMESPACE},
            "spec": {
                "type": "LoadBalancer",
                "selector": labels,
                "ports": [
                    {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP",
                     "nodePort": NODE_PORT_TCP},
                    {"name": "udp", "port": 81, "targetPort": 8081, "protocol": "UDP",
                     "nodePort": NODE_PORT_UDP},
                ],
            },
        }),
    ];
    for (node, _) in nodes {
        items.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("chaos-client-{node}"), "namespace": NAMESPACE},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "client", "image": AGNHOST, "args": ["pause"]}],
            },
        }));
    }
    let file = run_dir.join("workload.json");
    fs::write(
        &file,
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
    )?;
    k().args(["apply", "-f"]).arg(&file).run()?;
    // The LoadBalancer address as a cloud's load balancer controller would publish it (the
    // clusters run none); the hub routes it to the first node, as an L2 or BGP announcement would.
    k().args([
        "patch",
        "service",
        "backend",
        "-n",
        NAMESPACE,
        "--subresource=status",
    ])
    .args(["--type=merge", "-p"])
    .arg(json!({"status": {"loadBalancer": {"ingress": [{"ip": LB_IP}]}}}).to_string())
    .run()?;
    Cmd::new("ip")
        .args([
            "-n",
            hub,
            "route",
            "replace",
            &format!("{LB_IP}/32"),
            "via",
            &nodes[0].1,
        ])
        .run()?;
    // A run after an endpoint-removal one starts from the full count again.
    k().args(["scale", "deployment/backend", "-n", NAMESPACE])
        .arg(format!("--replicas={replicas}"))
        .run()?;
    k().args(["rollout", "status", "deployment/backend", "-n", NAMESPACE])
        .arg("--timeout=180s")
        .run()?;
    for (node, _) in nodes {
        k().args(["wait", "--for=condition=Ready", "-n", NAMESPACE])
            .arg(format!("pod/chaos-client-{node}"))
            .arg("--timeout=120s")
            .run()?;
    }
    Ok(())
}

/// A process of the Pod `name` (any: they share its network namespace), found by the Pod's UID in
/// the processes' cgroup paths (the kubelet's cgroupfs layout `.../pod<uid>/...`).
fn pod_pid(k: &dyn Fn() -> Cmd, name: &str) -> anyhow::Result<u32> {
    let uid = k()
        .args([
            "get",
            "pod",
            name,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .read()?;
    let needles = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
    for entry in fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if needles.iter().any(|n| cgroup.contains(n.as_str())) {
            return Ok(pid);
        }
    }
    bail!("no process of Pod {NAMESPACE}/{name} (uid {uid}) found by its cgroup")
}

/// Starts one load client in the network namespace `netns` (and the node's cgroup, for a client
/// on a node), its report going to `<run_dir>/<label>.json`.
#[allow(clippy::too_many_arguments)]
fn start_client(
    label: &str,
    from: &'static str,
    node: Option<&str>,
    netns: &str,
    targets: &[String],
    args: &ChaosArgs,
    stop_file: &Path,
    run_dir: &Path,
) -> anyhow::Result<Client> {
    // This very program, by the link that stays valid while it runs: `cargo xtask test` rebuilds
    // target/debug/xtask before its cluster steps, and the path `current_exe` then returns ends in
    // " (deleted)", which no shell can run.
    let exe = format!("/proc/{}/exe", std::process::id());
    let mut load = vec![
        "nsenter".to_string(),
        format!("--net={netns}"),
        "--".into(),
        exe,
        "load".into(),
        format!("--rate={}", args.rate),
        format!("--long={}", args.long),
        format!("--stop-file={}", stop_file.display()),
        format!("--label={label}"),
        format!("--ready-file={}", ready_file(run_dir, label).display()),
        format!("--warmup-seconds={WARMUP_SECONDS}"),
    ];
    for t in targets {
        load.push(format!("--target={t}"));
    }
    let script = match node {
        Some(node) => format!(
            "echo $$ > {CGROUP2_ROOT}/{node}/cgroup.procs && exec {}",
            load.join(" ")
        ),
        None => format!("exec {}", load.join(" ")),
    };
    let out = run_dir.join(format!("{label}.json"));
    let child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out)?)
        .stderr(fs::File::create(run_dir.join(format!("{label}.log")))?)
        .spawn()
        .with_context(|| format!("starting the load client {label}"))?;
    println!("[load] {label}: {}", targets.join(" "));
    Ok(Client {
        label: label.to_string(),
        from,
        child,
        out,
    })
}

/// The file a client creates once every target has answered and it counts (`load --ready-file`).
fn ready_file(run_dir: &Path, label: &str) -> PathBuf {
    run_dir.join(format!("{label}.ready"))
}

/// Waits until every client counts: each has had every target answer once (the Services
/// programmed on every node), so what the scenario measures starts from a converged cluster.
fn wait_counting(clients: &mut [Client], run_dir: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(WARMUP_SECONDS + 10);
    for c in clients.iter_mut() {
        while !ready_file(run_dir, &c.label).exists() {
            if let Some(status) = c.child.try_wait()? {
                bail!(
                    "the load client {} exited during its warm-up ({status}); see {}",
                    c.label,
                    run_dir.join(format!("{}.log", c.label)).display()
                );
            }
            ensure!(
                Instant::now() < deadline,
                "the load client {} is still warming up after {} s",
                c.label,
                WARMUP_SECONDS + 10
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// Fails when a client already exited (its log says why).
fn ensure_running(clients: &mut [Client]) -> anyhow::Result<()> {
    for c in clients.iter_mut() {
        if let Some(status) = c.child.try_wait()? {
            bail!(
                "the load client {} exited early ({status}); see {}",
                c.label,
                c.out.with_extension("log").display()
            );
        }
    }
    Ok(())
}

/// Waits for a stopped client and reads its report.
fn collect(mut client: Client) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = client.child.try_wait()? {
            ensure!(
                status.success(),
                "the load client {} failed ({status}); see {}",
                client.label,
                client.out.with_extension("log").display()
            );
            break;
        }
        if Instant::now() > deadline {
            let _ = client.child.kill();
            let _ = client.child.wait();
            bail!("the load client {} did not stop in 30 s", client.label);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = fs::read_to_string(&client.out)?;
    serde_json::from_str(text.trim())
        .with_context(|| format!("the report of {}: {}", client.label, client.out.display()))
}

/// The Service proxy's DaemonSet on a cluster whose state says `proxy`.
fn proxy_daemonset(proxy: &str, scenario: Scenario) -> anyhow::Result<&'static str> {
    if proxy.starts_with("kube-proxy") {
        Ok("kube-proxy")
    } else if proxy.starts_with("kpr") {
        Ok(deploy::AGENT_DAEMONSET)
    } else {
        bail!(
            "{} needs a Service proxy; this cluster runs {proxy:?}",
            scenario.name()
        )
    }
}

/// Scenario 1: the proxy's DaemonSet restarted; the timeline.
fn agent_restart(k: &dyn Fn() -> Cmd, proxy: &str, args: &ChaosArgs) -> anyhow::Result<Value> {
    let daemonset = proxy_daemonset(proxy, Scenario::AgentRestart)?;
    let ds = format!("daemonset/{daemonset}");
    let restart_ms = unix_ms();
    k().args(["rollout", "restart", &ds, "-n", "kube-system"])
        .run()?;
    roll_out(k, daemonset, restart_ms, args)
}

/// Waits for the DaemonSet's rollout begun at `began_ms`, then `--settle` s of load; the timeline.
fn roll_out(
    k: &dyn Fn() -> Cmd,
    daemonset: &str,
    began_ms: u64,
    args: &ChaosArgs,
) -> anyhow::Result<Value> {
    let ds = format!("daemonset/{daemonset}");
    let restart_ms = began_ms;
    k().args([
        "rollout",
        "status",
        &ds,
        "-n",
        "kube-system",
        "--timeout=300s",
    ])
    .run()?;
    let rolled_out_ms = unix_ms();
    println!(
        "==> {ds} rolled out in {:.1} s; {} s more load",
        (rolled_out_ms - restart_ms) as f64 / 1000.0,
        args.settle
    );
    std::thread::sleep(Duration::from_secs(args.settle));
    Ok(json!({
        "daemonset": daemonset,
        "restart_ms": restart_ms,
        "rolled_out_ms": rolled_out_ms,
        "removed": [],
        "window_ms": [restart_ms, rolled_out_ms],
    }))
}

/// Scenario 1's upgrade, made ready before the load starts: a new image of the Service proxy
/// (kpr's from `--upgrade-binaries`, or kube-proxy's), with its own tag and a marker file so its
/// digest differs from the running one, imported into every node's containerd (the nodes pull
/// nothing: this is the pull).
struct Upgrade {
    daemonset: &'static str,
    /// The DaemonSet's `spec.selector.matchLabels` as a label selector.
    selector: String,
    /// The image the DaemonSet's first container runs.
    running: String,
    /// The new image as the DaemonSet names it.
    new: String,
    /// `container=image` for every container (init containers too) that ran `running`.
    set: Vec<String>,
}

fn prepare_upgrade(
    cluster: &Cluster,
    state: &Value,
    k: &dyn Fn() -> Cmd,
    run_dir: &Path,
    args: &ChaosArgs,
) -> anyhow::Result<Upgrade> {
    let proxy = state["proxy"].as_str().unwrap_or("?");
    let daemonset = proxy_daemonset(proxy, Scenario::AgentUpgrade)?;
    let spec: Value = serde_json::from_str(
        &k().args([
            "get",
            "daemonset",
            daemonset,
            "-n",
            "kube-system",
            "-o",
            "json",
        ])
        .read()?,
    )?;
    let pod_spec = &spec["spec"]["template"]["spec"];
    let running = pod_spec["containers"][0]["image"]
        .as_str()
        .context("the DaemonSet's first container names no image")?
        .to_string();
    let tag = format!("upgrade-{}", unix_ms());
    let (mut image, short) = if daemonset == "kube-proxy" {
        let image = crate::images::kube_proxy(&crate::k8s::bin_dir().join("kube-proxy"))?;
        let name = format!("{}-{tag}", image.name);
        (
            crate::images::Image {
                name: name.clone(),
                ..image
            },
            name,
        )
    } else {
        let profile = match args.upgrade_binaries {
            Some(profile) => profile,
            None => match state["binaries"].as_str() {
                Some("debug") => crate::Profile::Debug,
                _ => crate::Profile::Release,
            },
        };
        crate::bench::build(profile)?;
        let out = crate::target_dir().join("cluster-images");
        fs::create_dir_all(&out)?;
        let image = super::nodes::kpr_image(profile, &out)?;
        let short = format!("kpr:{tag}");
        (
            crate::images::Image {
                name: format!("docker.io/library/{short}"),
                ..image
            },
            short,
        )
    };
    image.entries.push(crate::images::Entry::text(
        "/etc/kpr-upgrade",
        &format!("{}\n", image.name),
        0o644,
    ));
    let archive = run_dir.join("upgrade-image.tar");
    crate::images::write_archive(&image, &archive)?;
    let imported = Instant::now();
    let ctr = controlplane::cluster::find_program("ctr")?;
    let mut nodes = 0;
    for entry in fs::read_dir(cluster.dir.join("nodes"))? {
        let socket = entry?.path().join("containerd.sock");
        if !socket.exists() {
            continue;
        }
        Cmd::new(&ctr)
            .arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io", "images", "import", "--no-unpack"])
            .arg(&archive)
            .run()
            .with_context(|| format!("importing {} through {}", image.name, socket.display()))?;
        nodes += 1;
    }
    ensure!(
        nodes > 0,
        "no node's containerd under {}",
        cluster.dir.join("nodes").display()
    );
    println!(
        "==> {} imported into {nodes} nodes in {:.1} s; {daemonset}: {running} -> {short}",
        image.name,
        imported.elapsed().as_secs_f64()
    );
    let mut set = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in pod_spec[list].as_array().into_iter().flatten() {
            if c["image"].as_str() == Some(running.as_str()) {
                set.push(format!(
                    "{}={short}",
                    c["name"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    let selector = spec["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("the DaemonSet has no matchLabels")?
        .iter()
        .map(|(key, v)| format!("{key}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",");
    Ok(Upgrade {
        daemonset,
        selector,
        running,
        new: short,
        set,
    })
}

/// Scenario 1's upgrade: the DaemonSet's containers that ran the old image set to the new one;
/// the timeline, with both images, once every Pod of the DaemonSet runs the new one.
fn agent_upgrade(k: &dyn Fn() -> Cmd, up: &Upgrade, args: &ChaosArgs) -> anyhow::Result<Value> {
    let Upgrade {
        daemonset,
        selector,
        running,
        new: short,
        set,
    } = up;
    let began_ms = unix_ms();
    k().args([
        "set",
        "image",
        &format!("daemonset/{daemonset}"),
        "-n",
        "kube-system",
    ])
    .args(set)
    .run()?;
    let mut timeline = roll_out(k, daemonset, began_ms, args)?;
    let images = k()
        .args(["get", "pods", "-n", "kube-system", "-l", selector])
        .args([
            "-o",
            "jsonpath={range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}",
        ])
        .read()?;
    let pods: Vec<&str> = images.lines().filter(|l| !l.is_empty()).collect();
    ensure!(
        !pods.is_empty() && pods.iter().all(|i| *i == short),
        "after the rollout the {daemonset} Pods run {pods:?}, not {short}"
    );
    timeline["image_from"] = json!(running);
    timeline["image_to"] = json!(short);
    timeline["containers_set"] = json!(set);
    Ok(timeline)
}

/// Scenario 2: the nodes' Service proxy switched as README says; the timeline.
fn proxy_switch(cluster: &Cluster, args: &ChaosArgs) -> anyhow::Result<Value> {
    let Some(proxy) = args.to else {
        bail!("proxy-switch needs --to kpr|kube-proxy|none (and --to-backend or --to-mode)");
    };
    let to = super::nodes::ProxyChoice {
        proxy,
        backend: args.to_backend.clone(),
        mode: args.to_mode,
    };
    let live = super::switch::Live::open(cluster)?;
    let from = live.proxy()?.describe();
    let switch_ms = unix_ms();
    super::switch::switch(&live, &to)?;
    let switched_ms = unix_ms();
    super::switch::settle(&live)?;
    let leftovers = super::switch::check(&live)?;
    println!(
        "==> {from} -> {} in {:.1} s, {} leftovers; {} s more load",
        to.describe(),
        (switched_ms - switch_ms) as f64 / 1000.0,
        leftovers.len(),
        args.settle
    );
    std::thread::sleep(Duration::from_secs(args.settle));
    Ok(json!({
        "from": from,
        "to": to.describe(),
        "switch_ms": switch_ms,
        "switched_ms": switched_ms,
        "leftovers": leftovers,
        "removed": [],
        "window_ms": [switch_ms, switched_ms],
    }))
}

/// What starts a process again as it was: its command line, environment, working directory and
/// network namespace, read from /proc before it stops.
struct Relaunch {
    argv: Vec<std::ffi::OsString>,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    cwd: PathBuf,
    netns: fs::File,
}

impl Relaunch {
    fn read(pid: u32) -> anyhow::Result<Relaunch> {
        use std::os::unix::ffi::OsStringExt as _;
        let words = |what: &str| -> anyhow::Result<Vec<Vec<u8>>> {
            let raw = fs::read(format!("/proc/{pid}/{what}"))
                .with_context(|| format!("reading /proc/{pid}/{what}"))?;
            Ok(raw
                .split(|b| *b == 0)
                .filter(|w| !w.is_empty())
                .map(<[u8]>::to_vec)
                .collect())
        };
        let argv: Vec<_> = words("cmdline")?
            .into_iter()
            .map(std::ffi::OsString::from_vec)
            .collect();
        ensure!(!argv.is_empty(), "process {pid} has no command line");
        let env = words("environ")?
            .into_iter()
            .filter_map(|w| {
                let at = w.iter().position(|b| *b == b'=')?;
                Some((
                    std::ffi::OsString::from_vec(w[..at].to_vec()),
                    std::ffi::OsString::from_vec(w[at + 1..].to_vec()),
                ))
            })
            .collect();
        Ok(Relaunch {
            argv,
            env,
            cwd: fs::read_link(format!("/proc/{pid}/cwd"))?,
            netns: fs::File::open(format!("/proc/{pid}/ns/net"))?,
        })
    }

    /// Starts it again, detached as `up` starts it, its output appended to `log`; the pid.
    fn start(&self, log: &Path) -> anyhow::Result<u32> {
        use std::os::fd::AsRawFd as _;
        use std::os::unix::process::CommandExt as _;
        let out = fs::OpenOptions::new().append(true).create(true).open(log)?;
        let netns = self.netns.as_raw_fd();
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // SAFETY: setns and setsid are async-signal-safe; the fd outlives the spawn.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(netns, libc::CLONE_NEWNET) != 0 || libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {:?} again", self.argv[0]))?;
        Ok(child.id())
    }
}

/// The pid of the process state.json records as `name`, and its index there.
fn recorded(state: &Value, name: &str) -> anyhow::Result<(usize, u32)> {
    let processes = state["processes"]
        .as_array()
        .context("state.json lists no processes")?;
    let i = processes
        .iter()
        .position(|p| p["name"] == name)
        .with_context(|| format!("state.json lists no {name}"))?;
    let pid = processes[i]["pid"]
        .as_u64()
        .context("a process without a pid")? as u32;
    Ok((i, pid))
}

/// Scenario 7: churn for `--duration` s with the components sampled; the timeline carries the
/// samples.
fn soak(
    cluster: &Cluster,
    kubeconfig: &str,
    run_dir: &Path,
    args: &ChaosArgs,
) -> anyhow::Result<Value> {
    let k = || kubectl(kubeconfig);
    let ports = |tick: u64| {
        json!([{"name": "http", "port": 80 + (tick % 2),
                "targetPort": 8080 + (tick % 2) as u16, "protocol": "TCP"}])
    };
    let names: Vec<String> = (0..args.churn).map(|i| format!("churn-{i}")).collect();
    let items: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"selector": {"app": "backend"}, "ports": ports(0)},
            })
        })
        .collect();
    let churn_file = run_dir.join("churn.json");
    fs::write(
        &churn_file,
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
    )?;
    k().args(["apply", "-f"]).arg(&churn_file).quiet().run()?;
    let pods = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "churn-pods", "namespace": NAMESPACE},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "churn-pods"}},
            "template": {
                "metadata": {"labels": {"app": "churn-pods"}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "pause", "image": AGNHOST, "args": ["pause"]}],
                },
            },
        },
    });
    fs::write(run_dir.join("churn-pods.json"), pods.to_string())?;
    k().args(["apply", "-f"])
        .arg(run_dir.join("churn-pods.json"))
        .quiet()
        .run()?;
    let sample = || {
        json!({
            "at_ms": unix_ms(),
            "processes": super::usage::snapshot(cluster),
        })
    };
    // The churn's own client: a round's changes sent at once, each a merge patch.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = rt.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        anyhow::Ok(kube::Client::try_from(config)?)
    })?;
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), NAMESPACE);
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(client, NAMESPACE);
    let patch = kube::api::PatchParams::default();
    let start_ms = unix_ms();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut next_sample = Instant::now();
    let mut tick = 0u64;
    let (mut changes, mut failed) = (0u64, 0u64);
    let mut first_error = None;
    // Rounds that took longer than their second (the API server slower than the churn).
    let mut late_rounds = 0u64;
    println!(
        "==> soak: {} s, {} Service changes a second, a Deployment scaled 0 <-> {} every 10th round",
        args.duration, args.churn, args.churn_pods
    );
    while started.elapsed() < Duration::from_secs(args.duration) {
        let second = Instant::now();
        if Instant::now() >= next_sample {
            samples.push(sample());
            next_sample += Duration::from_secs(15);
        }
        let body = kube::api::Patch::Merge(json!({"spec": {"ports": ports(tick)}}));
        // Every 10th round the Pods' Deployment too, up and down in turn.
        let scale = tick.is_multiple_of(10).then(|| {
            let replicas = if (tick / 10).is_multiple_of(2) {
                args.churn_pods
            } else {
                0
            };
            kube::api::Patch::Merge(json!({"spec": {"replicas": replicas}}))
        });
        let (patched, scaled) = rt.block_on(async {
            futures::join!(
                futures::future::join_all(names.iter().map(|n| services.patch(n, &patch, &body))),
                async {
                    match &scale {
                        Some(body) => Some(deployments.patch("churn-pods", &patch, body).await),
                        None => None,
                    }
                }
            )
        });
        let results = (patched.into_iter().map(|r| r.map(drop))).chain(scaled.map(|r| r.map(drop)));
        for result in results {
            match result {
                Ok(()) => changes += 1,
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| format!("{e}"));
                }
            }
        }
        tick += 1;
        match Duration::from_secs(1).checked_sub(second.elapsed()) {
            Some(rest) => std::thread::sleep(rest),
            None => late_rounds += 1,
        }
    }
    samples.push(sample());
    let end_ms = unix_ms();
    let seconds = started.elapsed().as_secs_f64();
    // Leave nothing of the churn for the next run.
    k().args(["delete", "-n", NAMESPACE, "--ignore-not-found"])
        .args(names.iter().map(|n| format!("service/{n}")))
        .arg("deployment/churn-pods")
        .quiet()
        .run()?;
    Ok(json!({
        "removed": [],
        "window_ms": [start_ms, end_ms],
        "ticks": tick,
        "changes": changes,
        "changes_per_second": changes as f64 / seconds.max(1.0),
        "late_rounds": late_rounds,
        "failed_changes": failed,
        "first_error": first_error,
        "samples": samples,
    }))
}

/// One sample of a process in the soak: (at_ms, rss_kib, fds, anon_kib).
type Sample = (u64, u64, u64, u64);

/// The least-squares slope of a memory measure (`kib` of each sample) over the second half of a
/// series, in MiB an hour.
/// The first half holds the warm-up (informers listing, caches filling, bounded queues reaching
/// their working size), which the quarter-to-quarter growth counts as growth; a leak keeps
/// rising after it, a bounded process levels off, so the second half's slope tells them apart.
fn late_slope_mib_per_hour(v: &[Sample], kib: impl Fn(&Sample) -> u64) -> Option<f64> {
    let half = &v[v.len() / 2..];
    if half.len() < 2 {
        return None;
    }
    let n = half.len() as f64;
    let t0 = half[0].0;
    let xs: Vec<f64> = half
        .iter()
        .map(|s| (s.0 - t0) as f64 / 3_600_000.0)
        .collect();
    let ys: Vec<f64> = half.iter().map(|s| kib(s) as f64 / 1024.0).collect();
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// The soak's table: per component, the resident set and open descriptors over the run (of the
/// instance that grew most), the growth between the first and the last quarter, and the slope
/// over the second half ([`late_slope_mib_per_hour`]) of the resident set and of its anonymous
/// part (`RssAnon`: the resident set also counts the binary's file pages, which the kernel drops
/// and reads again under memory pressure, so it can look flat while the heap rises).
fn soak_table(timeline: &Value) -> String {
    // component -> pid -> samples
    type Series = BTreeMap<u64, Vec<Sample>>;
    let mut series: BTreeMap<String, Series> = BTreeMap::new();
    for s in timeline["samples"].as_array().into_iter().flatten() {
        let at = s["at_ms"].as_u64().unwrap_or(0);
        for p in s["processes"].as_array().into_iter().flatten() {
            let c = p["component"].as_str().unwrap_or("?").to_string();
            let pid = p["pid"].as_u64().unwrap_or(0);
            series.entry(c).or_default().entry(pid).or_default().push((
                at,
                p["rss_kib"].as_u64().unwrap_or(0),
                p["fds"].as_u64().unwrap_or(0),
                p["anon_kib"].as_u64().unwrap_or(0),
            ));
        }
    }
    let mut md = format!(
        "{} churn rounds, {} changes ({:.1} a second; {} failed{}; {} rounds over their \
         second); samples every 15 s.\n\n",
        timeline["ticks"],
        timeline["changes"],
        timeline["changes_per_second"].as_f64().unwrap_or(0.0),
        timeline["failed_changes"],
        timeline["first_error"]
            .as_str()
            .map(|e| format!(", the first: {e}"))
            .unwrap_or_default(),
        timeline["late_rounds"],
    );
    md.push_str(
        "| component | instances | RSS first (MiB) | RSS last (MiB) | RSS max (MiB) | growth, first to last quarter | slope, second half (MiB/h) | anonymous slope, second half (MiB/h) | fds first | fds last | fds max |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mib = |kib: f64| kib / 1024.0;
    let slope = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:+.2}"));
    for (component, pids) in &series {
        // The instance seen longest, then the one that grew most.
        let worst = pids
            .values()
            .filter(|v| v.len() >= 4)
            .map(|v| {
                let q = v.len() / 4;
                let mean = |xs: &[Sample]| {
                    xs.iter().map(|x| x.1 as f64).sum::<f64>() / xs.len().max(1) as f64
                };
                let growth = mean(&v[v.len() - q..]) / mean(&v[..q]) - 1.0;
                (growth, v)
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let Some((growth, v)) = worst else { continue };
        let (first, last) = (v[0], v[v.len() - 1]);
        md.push_str(&format!(
            "| {component} | {} | {:.1} | {:.1} | {:.1} | {:+.1} % | {} | {} | {} | {} | {} |\n",
            pids.len(),
            mib(first.1 as f64),
            mib(last.1 as f64),
            mib(v.iter().map(|x| x.1).max().unwrap_or(0) as f64),
            growth * 100.0,
            slope(late_slope_mib_per_hour(v, |s| s.1)),
            slope(late_slope_mib_per_hour(v, |s| s.3)),
            first.2,
            last.2,
            v.iter().map(|x| x.2).max().unwrap_or(0),
        ));
    }
    md
}

/// Scenario 4: kube-apiserver stopped and started again, etcd compacted, then endpoints
/// removed; the timeline.
fn apiserver_outage(
    cluster: &Cluster,
    k: &dyn Fn() -> Cmd,
    args: &ChaosArgs,
) -> anyhow::Result<Value> {
    let mut state = super::read_state(cluster)?;
    let (entry, pid) = recorded(&state, "kube-apiserver")?;
    let log = PathBuf::from(
        state["processes"][entry]["log"]
            .as_str()
            .context("kube-apiserver has no log in state.json")?,
    );
    let again = Relaunch::read(pid)?;
    let stop_ms = unix_ms();
    // SIGTERM first; kube-apiserver's graceful shutdown can wait on its open requests (watches
    // among them) for a minute or more, so after 20 s it is killed, as a crash would end it.
    let signal = |sig: i32| {
        // SAFETY: a signal to a pid state.json recorded and /proc just showed.
        unsafe { libc::kill(pid as i32, sig) };
    };
    let wait_gone = |for_: Duration| {
        let deadline = Instant::now() + for_;
        while controlplane::process::alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        !controlplane::process::alive(pid)
    };
    signal(libc::SIGTERM);
    let how = if wait_gone(Duration::from_secs(20)) {
        "SIGTERM"
    } else {
        signal(libc::SIGKILL);
        ensure!(
            wait_gone(Duration::from_secs(10)),
            "kube-apiserver (pid {pid}) did not stop, even killed"
        );
        "SIGKILL after 20 s of SIGTERM"
    };
    let stopped_ms = unix_ms();
    println!(
        "==> kube-apiserver stopped ({how}, {:.1} s); {} s without it",
        (stopped_ms - stop_ms) as f64 / 1000.0,
        args.outage
    );
    std::thread::sleep(
        Duration::from_secs(args.outage)
            .saturating_sub(Duration::from_millis(stopped_ms - stop_ms)),
    );
    let start_ms = unix_ms();
    let new_pid = again.start(&log)?;
    // `down` stops what state.json records: the new process from now on.
    state["processes"][entry]["pid"] = json!(new_pid);
    fs::write(
        cluster.dir.join("state.json"),
        serde_json::to_string_pretty(&state)?,
    )?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while k()
        .args(["get", "--raw", "/readyz"])
        .quiet()
        .read()
        .is_err()
    {
        ensure!(
            Instant::now() < deadline,
            "kube-apiserver (pid {new_pid}) not ready 120 s after its start; log: {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ready_ms = unix_ms();
    // etcd's history compacted at its revision: watches from before the outage get 410 Gone.
    let (_, etcd) = recorded(&state, "etcd")?;
    let cmdline = fs::read(format!("/proc/{etcd}/cmdline"))?;
    let client_url = String::from_utf8_lossy(&cmdline)
        .split('\0')
        .find_map(|a| a.strip_prefix("--listen-client-urls=").map(str::to_string))
        .context("etcd's command line has no --listen-client-urls")?;
    let etcdctl = crate::k8s::bin_dir().join("etcdctl");
    let netns = format!("--net=/proc/{etcd}/ns/net");
    let revision = controlplane::cluster::compact_etcd_with(
        || {
            let mut cmd = Command::new("nsenter");
            cmd.args([netns.as_str(), "--"]).arg(&etcdctl);
            cmd
        },
        &client_url,
    )?;
    println!(
        "==> kube-apiserver ready {:.1} s after its start; etcd compacted at revision {revision}; \
         {} s of load, then the endpoints change",
        (ready_ms - start_ms) as f64 / 1000.0,
        args.settle
    );
    std::thread::sleep(Duration::from_secs(args.settle));
    let mut timeline = endpoint_removal(k, args)?;
    let end = timeline["window_ms"][1].as_u64();
    timeline["stop_ms"] = json!(stop_ms);
    timeline["stopped_ms"] = json!(stopped_ms);
    timeline["stopped_by"] = json!(how);
    timeline["start_ms"] = json!(start_ms);
    timeline["ready_ms"] = json!(ready_ms);
    timeline["compacted_revision"] = json!(revision);
    timeline["window_ms"] = json!([stop_ms, end]);
    Ok(timeline)
}

/// The backend Pods: name -> whether it is being deleted.
fn backend_pods(k: &dyn Fn() -> Cmd) -> anyhow::Result<BTreeMap<String, bool>> {
    let text = k()
        .args(["get", "pods", "-n", NAMESPACE, "-l", "app=backend", "-o"])
        .arg(r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}"#)
        .quiet()
        .read()?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some((parts.next()?.to_string(), parts.next().is_some()))
        })
        .collect())
}

/// The Pods the backend Service's EndpointSlices list as ready.
fn ready_endpoints(k: &dyn Fn() -> Cmd) -> anyhow::Result<BTreeSet<String>> {
    let text = k()
        .args(["get", "endpointslices", "-n", NAMESPACE])
        .args(["-l", "kubernetes.io/service-name=backend", "-o"])
        .arg(r#"jsonpath={range .items[*].endpoints[*]}{.targetRef.name} {.conditions.ready}{"\n"}{end}"#)
        .quiet()
        .read()?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (name, ready) = l.split_once(' ')?;
            (ready.trim() == "true").then(|| name.to_string())
        })
        .collect())
}

/// One EndpointSlice poll: when it started, and the Pods it found ready.
type Poll = (u64, BTreeSet<String>);

/// Scenario 3: scale down by half, then delete one remaining Pod; the timeline with, per removed
/// Pod, when it was removed and when its endpoint stopped being ready.
fn endpoint_removal(k: &dyn Fn() -> Cmd, args: &ChaosArgs) -> anyhow::Result<Value> {
    // Polls the EndpointSlices: which Pods each poll found ready, and when (the poll's start).
    let stop = Arc::new(AtomicBool::new(false));
    let polls: Arc<Mutex<Vec<Poll>>> = Arc::default();
    let poller = {
        let (stop, polls) = (stop.clone(), polls.clone());
        let k = k().clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let k = || k.clone();
                let at = unix_ms();
                if let Ok(ready) = ready_endpoints(&k) {
                    polls.lock().unwrap().push((at, ready));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let result = (|| -> anyhow::Result<Vec<Value>> {
        let mut removed = Vec::new();
        let before = backend_pods(k)?;
        let down_to = (args.replicas / 2).max(1);
        let scale_ms = unix_ms();
        k().args(["scale", "deployment/backend", "-n", NAMESPACE])
            .arg(format!("--replicas={down_to}"))
            .run()?;
        // After an API server outage the controllers' caches may take a while to relist (for
        // kube-controller-manager, over 30 s): the wait is long and its time is reported.
        let deadline = Instant::now() + Duration::from_secs(180);
        let scaled_away = loop {
            let now = backend_pods(k)?;
            let gone: Vec<String> = before
                .keys()
                .filter(|p| now.get(*p).is_none_or(|deleting| *deleting))
                .cloned()
                .collect();
            if gone.len() >= before.len() - down_to {
                break gone;
            }
            ensure!(
                Instant::now() < deadline,
                "scaled to {down_to}: only {gone:?} are being deleted after 180 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let acted_ms = unix_ms();
        for pod in &scaled_away {
            removed.push(
                json!({"pod": pod, "how": "scale down", "removed_ms": scale_ms,
                                "deleting_ms": acted_ms}),
            );
        }
        println!(
            "==> scaled down: {scaled_away:?} being deleted {:.1} s after the scale; {} s of load",
            (acted_ms - scale_ms) as f64 / 1000.0,
            args.settle
        );
        std::thread::sleep(Duration::from_secs(args.settle));
        for i in 1..=args.deletions {
            let victim = backend_pods(k)?
                .into_iter()
                .find(|(_, deleting)| !deleting)
                .map(|(name, _)| name)
                .context("no backend Pod left to delete")?;
            let delete_ms = unix_ms();
            k().args(["delete", "pod", &victim, "-n", NAMESPACE, "--wait=false"])
                .run()?;
            removed.push(json!({"pod": victim, "how": "pod deleted", "removed_ms": delete_ms}));
            k().args(["rollout", "status", "deployment/backend", "-n", NAMESPACE])
                .arg("--timeout=120s")
                .run()?;
            // Between deletions the replacement gets load for a while before the next goes, so
            // each removal is measured against a settled set of endpoints.
            let pause = if i == args.deletions { args.settle } else { 3 };
            println!(
                "==> deletion {i}/{}: {victim} deleted and replaced; {pause} s of load",
                args.deletions
            );
            std::thread::sleep(Duration::from_secs(pause));
        }
        Ok(removed)
    })();
    stop.store(true, Ordering::SeqCst);
    let _ = poller.join();
    let mut removed = result?;
    let polls = polls.lock().unwrap();
    for r in &mut removed {
        let pod = r["pod"].as_str().unwrap_or_default().to_string();
        let removed_ms = r["removed_ms"].as_u64().unwrap_or(0);
        // The first poll started after the removal that no longer found it ready.
        let not_ready = polls
            .iter()
            .find(|(at, ready)| *at >= removed_ms && !ready.contains(&pod))
            .map(|(at, _)| *at);
        r["not_ready_ms"] = json!(not_ready);
    }
    let window = [
        removed.first().and_then(|r| r["removed_ms"].as_u64()),
        removed.last().and_then(|r| r["removed_ms"].as_u64()),
    ];
    Ok(json!({
        "removed": removed,
        // The disruption: from the first removal to the last plus the settle time.
        "window_ms": [window[0], window[1].map(|t| t + args.settle * 1000)],
    }))
}

/// Sums of one row of the table.
#[derive(Debug, Default, Clone)]
struct Row {
    attempts: u64,
    ok: u64,
    connect_failed: u64,
    broken: u64,
    /// Of `broken`: on a connection whose server was a removed endpoint.
    broken_removed: u64,
    /// Failures of any kind inside the disruption's window (plus the 2 s a request may take).
    in_window: u64,
    timeouts: u64,
    longest_gap_ms: u64,
}

/// The table's rows: per source, target and kind of flow.
type Rows = BTreeMap<(String, String, &'static str), Row>;

/// Every client's counts summed per source, target and kind of flow.
fn rows(timeline: &Value, reports: &[(&str, Value)]) -> Rows {
    let removed: BTreeSet<String> = timeline["removed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["pod"].as_str().map(str::to_string))
        .collect();
    let window = (
        timeline["window_ms"][0].as_u64().unwrap_or(0),
        timeline["window_ms"][1]
            .as_u64()
            .unwrap_or(u64::MAX)
            .saturating_add(2000),
    );
    let mut rows = Rows::new();
    for (from, report) in reports {
        for target in report["targets"].as_array().into_iter().flatten() {
            let name = target["name"].as_str().unwrap_or("?").to_string();
            for (key, kind) in [
                ("new", "new TCP"),
                ("long", "long-lived TCP"),
                ("udp_flows", "UDP"),
            ] {
                let t = &target[key];
                let row = rows
                    .entry((from.to_string(), name.clone(), kind))
                    .or_default();
                let n = |f: &str| t[f].as_u64().unwrap_or(0);
                row.attempts += n("attempts");
                row.ok += n("ok");
                row.connect_failed += n("connect_failed");
                row.broken += n("broken");
                row.timeouts += n("timeouts");
                row.longest_gap_ms = row.longest_gap_ms.max(n("longest_gap_ms"));
                row.in_window += t["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["at_ms"].as_u64())
                    .filter(|at| (window.0..=window.1).contains(at))
                    .count() as u64;
                row.broken_removed += t["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|e| {
                        e["what"].as_str().unwrap_or("").starts_with("broken")
                            && removed.contains(e["last_server"].as_str().unwrap_or(""))
                    })
                    .count() as u64;
            }
        }
    }
    rows
}

/// The markdown report: the table per source, target and kind, then the timeline.
fn summarize(
    scenario: Scenario,
    proxy: &str,
    timeline: &Value,
    reports: &[(&str, Value)],
    rows: &Rows,
) -> String {
    let mut md = format!("## chaos {} on {proxy}\n\n", scenario.name());
    md.push_str(
        "| from | target | flows | attempts | answered | failed connects | broken (removed endpoint) | timeouts | failures in the disruption | longest gap |\n",
    );
    md.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for ((from, target, kind), r) in rows {
        md.push_str(&format!(
            "| {from} | {target} | {kind} | {} | {} | {} | {} ({}) | {} | {} | {} ms |\n",
            r.attempts,
            r.ok,
            r.connect_failed,
            r.broken,
            r.broken_removed,
            r.timeouts,
            r.in_window,
            r.longest_gap_ms
        ));
    }
    md.push('\n');
    let warmups: Vec<String> = reports
        .iter()
        .map(|(_, r)| {
            format!(
                "{} {} ms",
                r["label"].as_str().unwrap_or("?"),
                r["warmup_ms"].as_u64().unwrap_or(0)
            )
        })
        .collect();
    md.push_str(&format!(
        "Counted from the moment every target had answered each client once (warm-up: {}).\n\n",
        warmups.join(", ")
    ));
    match scenario {
        Scenario::AgentRestart => {
            let ms = |f: &str| timeline[f].as_u64().unwrap_or(0);
            md.push_str(&format!(
                "`kubectl rollout restart daemonset/{}`: rolled out in {:.1} s.\n",
                timeline["daemonset"].as_str().unwrap_or("?"),
                ms("rolled_out_ms").saturating_sub(ms("restart_ms")) as f64 / 1000.0
            ));
        }
        Scenario::AgentUpgrade => {
            let ms = |f: &str| timeline[f].as_u64().unwrap_or(0);
            md.push_str(&format!(
                "`kubectl set image daemonset/{}` {} -> {} ({}): rolled out in {:.1} s.\n",
                timeline["daemonset"].as_str().unwrap_or("?"),
                timeline["image_from"].as_str().unwrap_or("?"),
                timeline["image_to"].as_str().unwrap_or("?"),
                timeline["containers_set"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str()?.split('=').next())
                    .collect::<Vec<_>>()
                    .join(", "),
                ms("rolled_out_ms").saturating_sub(ms("restart_ms")) as f64 / 1000.0
            ));
        }
        Scenario::ProxySwitch => {
            let ms = |f: &str| timeline[f].as_u64().unwrap_or(0);
            let leftovers: Vec<&str> = timeline["leftovers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            md.push_str(&format!(
                "{} -> {}: switched in {:.1} s; leftovers of another proxy after it: {}.\n",
                timeline["from"].as_str().unwrap_or("?"),
                timeline["to"].as_str().unwrap_or("?"),
                ms("switched_ms").saturating_sub(ms("switch_ms")) as f64 / 1000.0,
                if leftovers.is_empty() {
                    "none".to_string()
                } else {
                    leftovers.join("; ")
                }
            ));
        }
        Scenario::Soak => md.push_str(&soak_table(timeline)),
        Scenario::EndpointRemoval | Scenario::ApiserverOutage => {
            if scenario == Scenario::ApiserverOutage {
                let ms = |f: &str| timeline[f].as_u64().unwrap_or(0);
                md.push_str(&format!(
                    "kube-apiserver stopped ({}) for {:.1} s, ready {:.1} s after its start; etcd \
                     compacted at revision {}; then the endpoints changed:\n\n",
                    timeline["stopped_by"].as_str().unwrap_or("?"),
                    ms("start_ms").saturating_sub(ms("stop_ms")) as f64 / 1000.0,
                    ms("ready_ms").saturating_sub(ms("start_ms")) as f64 / 1000.0,
                    ms("compacted_revision")
                ));
            }
            if let Some(r) = timeline["removed"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["deleting_ms"].is_u64()))
            {
                let ms = |f: &str| r[f].as_u64().unwrap_or(0);
                md.push_str(&format!(
                    "The scale-down's Pods were being deleted {:.1} s after `kubectl scale` (the \
                     controllers' reaction).\n\n",
                    ms("deleting_ms").saturating_sub(ms("removed_ms")) as f64 / 1000.0
                ));
            }
            md.push_str(
                "| removed Pod | how | endpoint not ready after | last new connection answered after | last UDP answer after |\n|---|---|---:|---:|---:|\n",
            );
            for r in timeline["removed"].as_array().into_iter().flatten() {
                let pod = r["pod"].as_str().unwrap_or("?");
                let removed_ms = r["removed_ms"].as_u64().unwrap_or(0);
                let since = |t: Option<u64>| match t {
                    Some(t) if t >= removed_ms => {
                        format!("{:.2} s", (t - removed_ms) as f64 / 1000.0)
                    }
                    Some(_) => "before".into(),
                    None => "never".into(),
                };
                let not_ready = r["not_ready_ms"].as_u64();
                md.push_str(&format!(
                    "| {pod} | {} | {} | {} | {} |\n",
                    r["how"].as_str().unwrap_or("?"),
                    since(not_ready),
                    since(last_answer(reports, "new", pod)),
                    since(last_answer(reports, "udp_flows", pod)),
                ));
            }
            md.push_str(&lag_summary(&removal_lags(timeline, reports)));
        }
    }
    md
}

/// Per removed Pod whose endpoint was seen to leave: how long after that its last new TCP
/// connection was answered (0 when none was answered after it left).
fn removal_lags(timeline: &Value, reports: &[(&str, Value)]) -> Vec<u64> {
    timeline["removed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let pod = r["pod"].as_str()?;
            let left = r["not_ready_ms"].as_u64()?;
            let last = last_answer(reports, "new", pod).unwrap_or(0);
            Some(last.saturating_sub(left))
        })
        .collect()
}

/// When `pod` last answered a flow of kind `key` (`new`, `udp_flows`) of any client and target.
fn last_answer(reports: &[(&str, Value)], key: &str, pod: &str) -> Option<u64> {
    reports
        .iter()
        .flat_map(|(_, rep)| rep["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t[key]["answered_by"][pod]["last_ms"].as_u64())
        .max()
}

/// The lags' distribution: the endpoint-removal goal is that no new connection reaches a
/// removed endpoint once the change is visible, so every lag above the poll's 200 ms and the
/// agent's programming time is a finding.
fn lag_summary(lags: &[u64]) -> String {
    if lags.is_empty() {
        return String::new();
    }
    let mut sorted = lags.to_vec();
    sorted.sort_unstable();
    let rank =
        |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    format!(
        "\nOver {} removals, the last new TCP connection a removed Pod answered, after its endpoint \
         left the EndpointSlice (polled every 200 ms): p50 {} ms, p99 {} ms, max {} ms; {} of {} \
         removals had none answered after it left.\n",
        sorted.len(),
        rank(0.50),
        rank(0.99),
        sorted[sorted.len() - 1],
        sorted.iter().filter(|l| **l == 0).count(),
        sorted.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A soak's timeline of one component: RSS (KiB) by minute, from `rss`.
    fn timeline(rss: impl Fn(u64) -> u64) -> Value {
        let samples: Vec<Value> = (0..=60)
            .map(|min| {
                json!({
                    "at_ms": min * 60_000,
                    "processes": [{"component": "c", "pid": 1, "rss_kib": rss(min) + 30 * 1024,
                                   "anon_kib": rss(min), "fds": 9}],
                })
            })
            .collect();
        json!({"ticks": 1, "changes": 1, "changes_per_second": 1.0, "late_rounds": 0,
               "failed_changes": 0, "samples": samples})
    }

    fn row(md: &str) -> Vec<String> {
        let line = md
            .lines()
            .find(|l| l.starts_with("| c |"))
            .expect("the row");
        line.split('|').map(|c| c.trim().to_string()).collect()
    }

    #[test]
    fn a_leak_keeps_its_slope_and_a_warm_up_does_not() {
        // 1 MiB an hour from start to end: the second half rises at the same rate.
        let leak = row(&soak_table(&timeline(|min| 40 * 1024 + min * 1024 / 60)));
        assert_eq!(leak[7], "+1.00", "{leak:?}");
        assert_eq!(
            leak[8], "+1.00",
            "the anonymous part rises as much: {leak:?}"
        );
        // 8 MiB in the first 10 minutes, then level: the quarters differ, the second half is flat.
        let warm = row(&soak_table(&timeline(|min| 40 * 1024 + min.min(10) * 820)));
        assert_ne!(warm[6], "+0.0 %", "{warm:?}");
        assert_eq!(warm[7], "+0.00", "{warm:?}");
        assert_eq!(warm[8], "+0.00", "{warm:?}");
    }
}
