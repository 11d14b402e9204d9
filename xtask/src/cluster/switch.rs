//! `cargo xtask cluster proxy` and `cargo xtask cluster leftovers`: switching the Service proxy of
//! a running cluster with real nodes, step by step as README tells a user to (kubectl on manifests
//! of deploy/, rendered only for this cluster's API server address, cgroup2 root and release), and
//! the inventory of what every proxy leaves on the nodes, checked against the one that runs.
//!
//! Switches ([`switch`]):
//! - kpr to kpr with another backend: README "Switch backends" (re-apply deploy/proxy.yaml; the
//!   new agent's `--cleanup-other-backends` removes the previous backend's state after its
//!   first sync);
//! - kpr to kube-proxy: README "Roll back to kube-proxy" (kube-proxy's manifest and its rollout,
//!   then delete the agent's DaemonSet and wait for its pods, then deploy/cleanup.yaml);
//! - kube-proxy to kpr: README "Replace kube-proxy on a running cluster" (deploy/proxy.yaml and
//!   its rollout, then delete kube-proxy's DaemonSet and wait for its pods, then
//!   deploy/kube-proxy-cleanup.yaml);
//! - kube-proxy to kube-proxy in the other mode: its ConfigMap and a restart of the DaemonSet;
//!   kube-proxy removes the other mode's rules itself when it starts (`platformCleanup` in
//!   cmd/kube-proxy/app/server_linux.go: nftables mode removes the iptables and IPVS rules,
//!   iptables mode the nftables tables), which the leftovers check verifies;
//! - to or from `none`: the removal or the deployment alone.
//!
//! Leftovers ([`check`]): per node, inside its network namespace, the nftables tables, the user
//! chains of iptables and ip6tables in both flavours (legacy and nft), the tc qdiscs and filters
//! and the TCX programs of every interface; inside its mount namespace (containerd's, seen through
//! `/proc/<pid>/root`), the pins under its bpffs and the cgroup programs of its cgroup2 root.
//! Each is attributed to its owner: kpr's backends (`ip kpr` nftables, `ip kpr-userspace`
//! userspace (it has no other state: its listeners die with the agent), `KPR-` chains iptables,
//! pins under `kpr/`, cgroup and TCX programs and `kpr_tc_ingress` filters ebpf: nothing else on
//! these nodes attaches eBPF programs to those hooks), kube-proxy's modes (`KUBE-` chains other
//! than the kubelet's iptables; `ip kube-proxy` and `ip6 kube-proxy` nftables), the kubelet
//! (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`, `KUBE-FIREWALL`), iptables-nft's own tables, or
//! other. State of a proxy other than the running one (state.json's `proxy`) is a leftover.
//!
//! Owns: `<cluster dir>/switch` (the manifests as applied), the `proxy` entry of state.json after
//! `up` wrote it, and the namespace `switch-tour` of the tour's Service.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use controlplane::network::netns_path;

use super::nodes::{self, Mode, Proxy, ProxyChoice};
use super::Cluster;
use crate::deploy;
use crate::exec::Cmd;

#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {
    /// The Service proxy to switch the nodes to.
    #[arg(long, value_enum, required_unless_present = "tour")]
    pub proxy: Option<Proxy>,
    /// kpr's backend (with --proxy kpr).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(deploy::BACKENDS), default_value = deploy::DEFAULT_BACKEND)]
    pub backend: String,
    /// kube-proxy's mode (with --proxy kube-proxy).
    #[arg(long, value_enum, default_value_t = Mode::Nftables)]
    pub mode: Mode,
    /// Every switch in turn (kpr on each backend, kube-proxy in both modes, kpr again), each
    /// followed by the leftovers check and a request to a ClusterIP Service from a pod on every
    /// node; a table at the end.
    #[arg(long, conflicts_with = "proxy")]
    pub tour: bool,
}

/// `cargo xtask cluster proxy`.
pub fn run(cluster: &Cluster, args: &ProxyArgs) -> anyhow::Result<()> {
    if args.tour {
        let rows = tour(cluster)?;
        let failed = rows.iter().filter(|r| !r.passed()).count();
        if failed > 0 {
            bail!(
                "{failed} of {} tour steps failed (see the table)",
                rows.len()
            );
        }
        return Ok(());
    }
    let Some(proxy) = args.proxy else {
        bail!("--proxy kpr|kube-proxy|none, or --tour");
    };
    let to = ProxyChoice {
        proxy,
        backend: args.backend.clone(),
        mode: args.mode,
    };
    let live = Live::open(cluster)?;
    let started = Instant::now();
    switch(&live, &to)?;
    println!(
        "[ok] the nodes run {} ({:.0} s)",
        to.describe(),
        started.elapsed().as_secs_f64()
    );
    settle(&live)?;
    require_clean(&live)
}

/// Fails naming every leftover of a proxy other than the running one.
pub(super) fn require_clean(live: &Live) -> anyhow::Result<()> {
    let found = check(live)?;
    if !found.is_empty() {
        bail!(
            "{} leftovers of another proxy:\n  {}",
            found.len(),
            found.join("\n  ")
        );
    }
    Ok(())
}

/// `cargo xtask cluster leftovers`.
pub fn leftovers(cluster: &Cluster) -> anyhow::Result<()> {
    let live = Live::open(cluster)?;
    require_clean(&live)
}

/// One node of a running cluster, as switching and the inventory need it.
#[derive(Debug, Clone)]
pub struct NodeRef {
    pub name: String,
    pub netns: PathBuf,
    /// The node's containerd: its mount namespace is the node's.
    pub containerd_pid: u32,
}

impl NodeRef {
    /// A path inside the node's mount namespace (through `/proc/<pid>/root`).
    fn path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{inside}", self.containerd_pid))
    }
}

/// A running cluster with real nodes, from its state file.
pub struct Live {
    pub cluster: Cluster,
    pub(super) kubeconfig: PathBuf,
    pub(super) apiserver_port: u16,
    version: String,
    pub nodes: Vec<NodeRef>,
    /// The cluster's address families (state.json's `ip_family`).
    pub ip_families: deploy::IpFamilies,
}

impl Live {
    pub fn open(cluster: &Cluster) -> anyhow::Result<Live> {
        let state = super::read_state(cluster)?;
        let kubeconfig = state["kubeconfig"]
            .as_str()
            .context("the cluster's state names no kubeconfig")?;
        let server = state["server"]
            .as_str()
            .context("the cluster's state names no server")?;
        let apiserver_port = server
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .with_context(|| format!("no port in the cluster's server {server:?}"))?;
        let count = state["nodes"].as_u64().unwrap_or(0);
        if count == 0 {
            bail!(
                "cluster {} has no real nodes: `cargo xtask cluster --name {} up --nodes N`",
                cluster.name,
                cluster.name
            );
        }
        let mut nodes = Vec::new();
        for index in 1..=count {
            let name = format!("{}-node-{index}", cluster.name);
            let process = format!("{name}-containerd");
            let pid = state["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"].as_str() == Some(process.as_str()))
                .and_then(|p| p["pid"].as_u64())
                .with_context(|| format!("the cluster's state has no process {process}"))?
                as u32;
            if !controlplane::process::alive(pid) {
                bail!(
                    "{process} (pid {pid}) is not running: `cargo xtask cluster --name {} status`",
                    cluster.name
                );
            }
            nodes.push(NodeRef {
                netns: netns_path(&name),
                name,
                containerd_pid: pid,
            });
        }
        Ok(Live {
            cluster: cluster.clone(),
            kubeconfig: PathBuf::from(kubeconfig),
            apiserver_port,
            version: state["kubernetes"]
                .as_str()
                .unwrap_or(controlplane::kubernetes_version())
                .to_string(),
            nodes,
            ip_families: super::state_ip_families(&state),
        })
    }

    fn state_path(&self) -> PathBuf {
        self.cluster.dir.join("state.json")
    }

    /// The proxy state.json says the nodes run.
    pub fn proxy(&self) -> anyhow::Result<ProxyChoice> {
        let state = super::read_state(&self.cluster)?;
        let text = state["proxy"]
            .as_str()
            .context("the cluster's state names no proxy")?;
        parse_choice(text)
    }

    /// Records in state.json what the nodes run from now on.
    pub(super) fn set_proxy(&self, choice: &ProxyChoice) -> anyhow::Result<()> {
        let mut state = super::read_state(&self.cluster)?;
        state["proxy"] = choice.describe().into();
        fs::write(self.state_path(), serde_json::to_string_pretty(&state)?)?;
        Ok(())
    }

    /// `kubectl <args>` against the cluster; returns its output.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        println!("$ kubectl {}", args.join(" "));
        self.kubectl_quiet(args)
    }

    /// [`Live::kubectl`] without printing the command line (polling).
    fn kubectl_quiet(&self, args: &[&str]) -> anyhow::Result<String> {
        Cmd::new(crate::k8s::bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .quiet()
            .read()
    }

    /// Writes `text` to `<cluster dir>/switch/<file>` and returns the path.
    pub(super) fn write_manifest(&self, file: &str, text: &str) -> anyhow::Result<PathBuf> {
        let dir = self.cluster.dir.join("switch");
        fs::create_dir_all(&dir)?;
        let path = dir.join(file);
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// `kubectl apply -f` of `text`, written as `file` first.
    fn apply(&self, file: &str, text: &str) -> anyhow::Result<PathBuf> {
        let path = self.write_manifest(file, text)?;
        self.kubectl(&["apply", "-f", &path.to_string_lossy()])?;
        Ok(path)
    }

    /// `kubectl -n kube-system rollout status daemonset/<name>`; a failure shows the pods and the
    /// latest events.
    pub(super) fn rollout(&self, daemonset: &str) -> anyhow::Result<()> {
        let what = format!("daemonset/{daemonset}");
        let waited = self.kubectl(&[
            "-n",
            deploy::SYSTEM_NAMESPACE,
            "rollout",
            "status",
            &what,
            "--timeout=180s",
        ]);
        if let Err(e) = waited {
            let pods = self
                .kubectl_quiet(&["get", "pods", "-A", "-o", "wide"])
                .unwrap_or_else(|e| format!("{e:#}"));
            let events = self
                .kubectl_quiet(&["get", "events", "-A", "--sort-by=.lastTimestamp"])
                .unwrap_or_else(|e| format!("{e:#}"));
            let events: Vec<&str> = events.lines().rev().take(25).collect();
            return Err(e.context(format!(
                "waiting for {what}; pods:\n{pods}\nlatest events:\n{}",
                events.into_iter().rev().collect::<Vec<_>>().join("\n")
            )));
        }
        Ok(())
    }

    /// `kubectl -n kube-system delete daemonset <name> --cascade=foreground`: returns once its
    /// pods are gone too (their rules must not come back after the cleanup).
    fn delete_daemonset(&self, name: &str) -> anyhow::Result<()> {
        self.kubectl(&[
            "-n",
            deploy::SYSTEM_NAMESPACE,
            "delete",
            "daemonset",
            name,
            "--cascade=foreground",
            "--timeout=180s",
            // A switch that failed after this step can be run again.
            "--ignore-not-found",
        ])?;
        let left = self.kubectl_quiet(&[
            "-n",
            deploy::SYSTEM_NAMESPACE,
            "get",
            "pods",
            "-l",
            &format!("{}={name}", daemonset_label(name)),
            "-o",
            "name",
        ])?;
        if !left.trim().is_empty() {
            bail!("daemonset {name} is deleted but its pods are not: {left}");
        }
        Ok(())
    }

    /// Applies deploy/<file> rendered as `text`, waits for its DaemonSet, deletes it again.
    pub(super) fn run_once(&self, file: &str, text: &str, daemonset: &str) -> anyhow::Result<()> {
        let path = self.apply(file, text)?;
        self.rollout(daemonset)?;
        self.kubectl(&["delete", "-f", &path.to_string_lossy(), "--timeout=180s"])?;
        Ok(())
    }
}

/// The pod label of the DaemonSets this module deletes.
fn daemonset_label(name: &str) -> &'static str {
    if name == "kube-proxy" {
        "k8s-app"
    } else {
        "app.kubernetes.io/name"
    }
}

/// `kpr nftables`, `kube-proxy iptables`, `none` (what [`ProxyChoice::describe`] writes).
pub fn parse_choice(text: &str) -> anyhow::Result<ProxyChoice> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut choice = ProxyChoice {
        proxy: Proxy::None,
        backend: deploy::DEFAULT_BACKEND.to_string(),
        mode: Mode::Nftables,
    };
    match words.as_slice() {
        ["none"] => {}
        ["kpr", backend] if deploy::BACKENDS.contains(backend) => {
            choice.proxy = Proxy::Kpr;
            choice.backend = backend.to_string();
        }
        ["kube-proxy", "iptables"] => {
            choice.proxy = Proxy::KubeProxy;
            choice.mode = Mode::Iptables;
        }
        ["kube-proxy", "nftables"] => choice.proxy = Proxy::KubeProxy,
        _ => bail!("unknown proxy {text:?} in the cluster's state (expected `kpr <backend>`, `kube-proxy <mode>` or `none`)"),
    }
    Ok(choice)
}

/// Switches the nodes from what state.json says they run to `to`, recording each step's outcome
/// in state.json. Does not check for leftovers ([`check`] does).
pub fn switch(live: &Live, to: &ProxyChoice) -> anyhow::Result<()> {
    let from = live.proxy()?;
    println!("== {} -> {}", from.describe(), to.describe());
    if from.describe() == to.describe() {
        println!("[ok] the nodes already run {}", to.describe());
        return Ok(());
    }
    // Make before break: the new proxy serves every node before the old one goes, so no new
    // connection finds the Service unserved. Meanwhile both program the same Services (their
    // NAT chains both match a new connection; the first to translate it decides, and the
    // connection keeps that translation in conntrack after the other's rules go).
    match (from.proxy, to.proxy) {
        (Proxy::KubeProxy, Proxy::KubeProxy) => kube_proxy_mode(live, to),
        (Proxy::Kpr, Proxy::Kpr) | (Proxy::None, _) => deploy_proxy(live, to),
        (Proxy::Kpr, _) => {
            deploy_proxy(live, to)?;
            remove_kpr(live)
        }
        (Proxy::KubeProxy, _) => {
            deploy_proxy(live, to)?;
            remove_kube_proxy(live)
        }
    }
}

pub(super) fn none() -> ProxyChoice {
    ProxyChoice {
        proxy: Proxy::None,
        backend: deploy::DEFAULT_BACKEND.to_string(),
        mode: Mode::Nftables,
    }
}

/// README "Roll back to kube-proxy", after kube-proxy's reinstallation.
fn remove_kpr(live: &Live) -> anyhow::Result<()> {
    live.delete_daemonset(deploy::AGENT_DAEMONSET)?;
    let text = deploy::render_file(deploy::CLEANUP_MANIFEST, &deploy::Render::default())?;
    // The cgroup2 root these nodes' agents attached to (as in nodes::kpr_manifest).
    let text = deploy::with_cgroup_root_in(deploy::CLEANUP_MANIFEST, &text, CGROUP2_ROOT)?;
    live.run_once(deploy::CLEANUP_MANIFEST, &text, deploy::CLEANUP_DAEMONSET)
}

/// README "Replace kube-proxy on a running cluster", after kpr's deployment.
fn remove_kube_proxy(live: &Live) -> anyhow::Result<()> {
    live.delete_daemonset("kube-proxy")?;
    let text = deploy::render_file(
        deploy::KUBE_PROXY_CLEANUP_MANIFEST,
        &deploy::Render::default(),
    )?;
    let text = deploy::with_kube_proxy_version(&text, &live.version)?;
    live.run_once(
        deploy::KUBE_PROXY_CLEANUP_MANIFEST,
        &text,
        deploy::KUBE_PROXY_CLEANUP_DAEMONSET,
    )
}

/// kube-proxy in another mode: the ConfigMap changes, the DaemonSet's pods do not (a ConfigMap
/// change rolls nothing), so they are restarted; the new ones remove the old mode's rules.
fn kube_proxy_mode(live: &Live, to: &ProxyChoice) -> anyhow::Result<()> {
    let text = nodes::kube_proxy_manifest_for(live.apiserver_port, to.mode, live.ip_families)?;
    live.apply("kube-proxy.yaml", &text)?;
    live.set_proxy(to)?;
    live.kubectl(&[
        "-n",
        deploy::SYSTEM_NAMESPACE,
        "rollout",
        "restart",
        "daemonset/kube-proxy",
    ])?;
    live.rollout("kube-proxy")
}

/// Applies the proxy's manifest and waits for its DaemonSet (README "Switch backends" for kpr to
/// kpr: the same apply).
fn deploy_proxy(live: &Live, to: &ProxyChoice) -> anyhow::Result<()> {
    match to.proxy {
        Proxy::None => {}
        Proxy::Kpr => {
            let text = nodes::kpr_manifest_for(live.apiserver_port, &to.backend, live.ip_families)?;
            live.apply(deploy::AGENT_MANIFEST, &text)?;
            live.set_proxy(to)?;
            live.rollout(deploy::AGENT_DAEMONSET)?;
        }
        Proxy::KubeProxy => {
            let text =
                nodes::kube_proxy_manifest_for(live.apiserver_port, to.mode, live.ip_families)?;
            live.apply("kube-proxy.yaml", &text)?;
            live.set_proxy(to)?;
            live.rollout("kube-proxy")?;
        }
    }
    live.set_proxy(to)
}

/// The nodes' cgroup2 root (each sees its own subtree there: controlplane::nodes).
pub(super) const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";

// ---------------------------------------------------------------------------------------------
// Leftovers

/// Owners that are not a Service proxy.
const KUBELET: &str = "kubelet";
const IPTABLES_NFT: &str = "iptables-nft";
const OTHER: &str = "other";
/// A sysctl a proxy changed, shown but not a leftover: it is no rule, and neither kube-proxy
/// `--cleanup` nor anything else restores it (the node may have wanted it anyway).
const SYSCTL: &str = "(note)";
/// The iterators the kernel's bpf_preload puts in every bpffs it mounts.
const BPFFS: &str = "bpffs";
const BPFFS_PRELOADED: &[&str] = &["maps.debug", "progs.debug"];

/// The chains the kubelet makes (pkg/kubelet/kubelet_network_linux.go), whatever the proxy.
const KUBELET_CHAINS: &[&str] = &["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY", "KUBE-FIREWALL"];

/// One thing found on a node and whose it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Item {
    /// `kpr nftables`, `kube-proxy iptables` (as [`ProxyChoice::describe`]), or `kubelet`,
    /// `iptables-nft`, `other`.
    pub owner: String,
    /// `nft table`, `iptables-nft chain`, `bpf pin`, `cgroup program`, `tcx program`, ...
    pub kind: String,
    pub what: String,
}

impl Item {
    fn new(owner: &str, kind: &str, what: impl Into<String>) -> Item {
        Item {
            owner: owner.to_string(),
            kind: kind.to_string(),
            what: what.into(),
        }
    }
}

pub(crate) fn is_proxy(owner: &str) -> bool {
    owner.starts_with("kpr ") || owner.starts_with("kube-proxy ")
}

/// How long [`settle`] waits for the running proxy's state.
const SETTLE: Duration = Duration::from_secs(90);

/// Waits until every node holds state of the running proxy, and returns how long that took
/// (`None`: not within [`SETTLE`], or the nodes run none). A DaemonSet's rollout is done when its
/// pods run, not when they have programmed anything: kube-proxy has no readiness probe, and a
/// new kube-proxy removes the other mode's rules only as it starts, so checking for leftovers
/// right after the rollout finds rules that are about to go.
pub fn settle(live: &Live) -> anyhow::Result<Option<f64>> {
    let running = live.proxy()?.describe();
    if running == "none" {
        return Ok(None);
    }
    let started = Instant::now();
    loop {
        let mut pending = Vec::new();
        for node in &live.nodes {
            let items = inventory(node).with_context(|| format!("listing {}", node.name))?;
            if !items.iter().any(|i| i.owner == running) {
                pending.push(node.name.as_str());
            }
        }
        let waited = started.elapsed();
        if pending.is_empty() {
            println!(
                "[ok] {running} has programmed every node ({:.0} s after its rollout)",
                waited.as_secs_f64()
            );
            return Ok(Some(waited.as_secs_f64()));
        }
        if waited > SETTLE {
            println!(
                "[note] nothing of {running} on {} after {:.0} s",
                pending.join(", "),
                waited.as_secs_f64()
            );
            return Ok(None);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Lists every node's state, prints a table per node, and returns the leftovers: what belongs
/// to a proxy other than the one state.json names, one line per node, owner and kind.
pub fn check(live: &Live) -> anyhow::Result<Vec<String>> {
    let running = live.proxy()?.describe();
    let mut leftovers = Vec::new();
    for node in &live.nodes {
        let items = inventory(node).with_context(|| format!("listing {}", node.name))?;
        println!("{} (runs {running}):", node.name);
        for ((owner, kind), whats) in grouped(&items) {
            let mark = if is_proxy(owner) && owner != running {
                let line = format!("{}: {owner}: {}", node.name, summary(kind, &whats));
                leftovers.push(line);
                "LEFTOVER"
            } else {
                ""
            };
            println!(
                "  {mark:<8} {owner:<20} {}",
                summary(kind, &whats).replace('\n', " ")
            );
        }
        if running != "none" && !items.iter().any(|i| i.owner == running) {
            println!("  [note] nothing of {running} found on {}", node.name);
        }
    }
    if leftovers.is_empty() && running == "none" {
        println!("[ok] leftovers: none (nothing of any Service proxy is on the nodes)");
    } else if leftovers.is_empty() {
        println!("[ok] leftovers: none (only {running}'s own state is on the nodes)");
    } else {
        println!("[FAIL] leftovers of another proxy:");
        for line in &leftovers {
            println!("  {line}");
        }
    }
    Ok(leftovers)
}

/// Items by (owner, kind), in a stable order.
fn grouped(items: &[Item]) -> BTreeMap<(&str, &str), Vec<&str>> {
    let mut groups: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for item in items {
        groups
            .entry((item.owner.as_str(), item.kind.as_str()))
            .or_default()
            .push(item.what.as_str());
    }
    groups
}

/// `nft table: ip kpr` or `iptables-nft chains (12): nat KUBE-SERVICES, nat KUBE-NODEPORTS, ...`.
fn summary(kind: &str, whats: &[&str]) -> String {
    const SHOWN: usize = 5;
    let mut out = if whats.len() == 1 {
        format!("{kind}: ")
    } else {
        format!("{kind}s ({}): ", whats.len())
    };
    out.push_str(&whats[..whats.len().min(SHOWN)].join(", "));
    if whats.len() > SHOWN {
        out.push_str(", ...");
    }
    out
}

/// Everything of interest on one node.
pub fn inventory(node: &NodeRef) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    let tables = in_netns(node, &["nft", "list", "tables"])?;
    items.extend(nft_tables(&tables));
    for (tool, kind) in [
        ("iptables-legacy-save", "iptables-legacy chain"),
        ("iptables-nft-save", "iptables-nft chain"),
        ("ip6tables-legacy-save", "ip6tables-legacy chain"),
        ("ip6tables-nft-save", "ip6tables-nft chain"),
    ] {
        // Their warnings ("iptables-legacy tables present") go to standard error: merged and
        // skipped by the parser (comments), so they do not clutter the table.
        let saved = in_netns(node, &["sh", "-c", &format!("{tool} 2>&1")])?;
        items.extend(chains(&saved, kind));
    }
    items.extend(tc_items(node)?);
    items.extend(pins(node)?);
    items.extend(cgroup_programs(node)?);
    items.extend(in_node_netns(node)?);
    items.sort();
    Ok(items)
}

/// Runs a command in the node's network namespace and returns its output.
fn in_netns(node: &NodeRef, argv: &[&str]) -> anyhow::Result<String> {
    Cmd::new("nsenter")
        .arg(format!("--net={}", node.netns.display()))
        .arg("--")
        .args(argv)
        .quiet()
        .read()
}

/// `nft list tables` attributed.
pub(crate) fn nft_tables(listing: &str) -> Vec<Item> {
    listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("table "))
        .map(|table| {
            let owner = match table.split_once(' ') {
                Some(("ip", "kpr")) => "kpr nftables",
                Some(("ip", "kpr-userspace")) => "kpr userspace",
                Some(("ip" | "ip6", "kube-proxy")) => "kube-proxy nftables",
                Some(("ip" | "ip6", "filter" | "nat" | "mangle" | "raw" | "security")) => {
                    IPTABLES_NFT
                }
                _ => OTHER,
            };
            Item::new(owner, "nft table", table)
        })
        .collect()
}

/// The user chains of an `iptables-save` output (builtin chains have a policy, user chains `-`),
/// as `table CHAIN`, attributed.
pub(crate) fn chains(saved: &str, kind: &str) -> Vec<Item> {
    let mut table = "";
    let mut out = Vec::new();
    for line in saved.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim();
        } else if let Some(rest) = line.strip_prefix(':') {
            let mut words = rest.split_whitespace();
            let (Some(chain), Some("-")) = (words.next(), words.next()) else {
                continue;
            };
            let owner = if chain.starts_with("KPR-") {
                "kpr iptables"
            } else if KUBELET_CHAINS.contains(&chain) {
                KUBELET
            } else if chain.starts_with("KUBE-") {
                "kube-proxy iptables"
            } else {
                OTHER
            };
            out.push(Item::new(owner, kind, format!("{table} {chain}")));
        }
    }
    out
}

/// clsact qdiscs and the tc filters on them (the eBPF backend's attachment on kernels without
/// TCX, as a netlink filter named `kpr_tc_ingress`).
fn tc_items(node: &NodeRef) -> anyhow::Result<Vec<Item>> {
    let qdiscs = Cmd::new("tc")
        .args(["-n", &node.name, "qdisc", "show"])
        .quiet()
        .read()?;
    let mut out = Vec::new();
    for line in qdiscs.lines().filter(|l| l.contains("clsact")) {
        let Some(dev) = line.split_whitespace().skip_while(|w| *w != "dev").nth(1) else {
            continue;
        };
        let mut filters = 0;
        for direction in ["ingress", "egress"] {
            let listed = Cmd::new("tc")
                .args(["-n", &node.name, "filter", "show", "dev", dev, direction])
                .quiet()
                .read()?;
            for filter in listed.lines().filter(|l| l.starts_with("filter")) {
                filters += 1;
                let owner = if filter.contains("kpr") {
                    "kpr ebpf"
                } else {
                    OTHER
                };
                let name = filter
                    .split_whitespace()
                    .find(|w| w.starts_with("kpr"))
                    .unwrap_or("filter");
                out.push(Item::new(
                    owner,
                    "tc filter",
                    format!("{dev} {direction} {name}"),
                ));
            }
        }
        if filters == 0 {
            out.push(Item::new(
                OTHER,
                "clsact qdisc",
                format!("{dev} (no filters)"),
            ));
        }
    }
    Ok(out)
}

/// Every pin under the node's bpffs (its mount namespace's /sys/fs/bpf).
fn pins(node: &NodeRef) -> anyhow::Result<Vec<Item>> {
    let root = node.path("/sys/fs/bpf");
    let mut files = Vec::new();
    walk(&root, &root, &mut files)?;
    Ok(files
        .into_iter()
        .map(|pin| {
            let owner = if pin.starts_with("kpr/") {
                "kpr ebpf"
            } else if BPFFS_PRELOADED.contains(&pin.as_str()) {
                BPFFS
            } else {
                OTHER
            };
            Item::new(owner, "bpf pin", pin)
        })
        .collect())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    let entries = fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// The socket programs' cgroup hooks (`bpf_attach_type`), as proxy/src/dataplane/ebpf/inspect.rs.
const CGROUP_HOOKS: [(&str, u32); 9] = [
    ("connect4", 10),
    ("sendmsg4", 14),
    ("recvmsg4", 19),
    ("getpeername4", 29),
    ("connect6", 11),
    ("sendmsg6", 15),
    ("recvmsg6", 20),
    ("getpeername6", 30),
    ("sock_release", 34),
];
/// `BPF_TCX_INGRESS`, `BPF_TCX_EGRESS` (kernel 6.6+).
const TCX_HOOKS: [(&str, u32); 2] = [("ingress", 46), ("egress", 47)];

/// Programs attached to the node's cgroup2 root (where the agent attaches: `--cgroup-path`).
fn cgroup_programs(node: &NodeRef) -> anyhow::Result<Vec<Item>> {
    let root = node.path(CGROUP2_ROOT);
    let dir = fs::File::open(&root).with_context(|| format!("opening {}", root.display()))?;
    let mut out = Vec::new();
    for (hook, attach_type) in CGROUP_HOOKS {
        let count = prog_query(dir.as_raw_fd() as u32, attach_type)
            .with_context(|| format!("BPF_PROG_QUERY {hook} on {}", root.display()))?;
        if count > 0 {
            out.push(Item::new(
                "kpr ebpf",
                "cgroup program",
                format!("{CGROUP2_ROOT} {hook} x{count}"),
            ));
        }
    }
    Ok(out)
}

const ROUTE_LOCALNET: &str = "/proc/sys/net/ipv4/conf/all/route_localnet";

/// What only a thread inside the node's network namespace can see: the TCX programs of every
/// interface, and `route_localnet`.
fn in_node_netns(node: &NodeRef) -> anyhow::Result<Vec<Item>> {
    let netns =
        fs::File::open(&node.netns).with_context(|| format!("opening {}", node.netns.display()))?;
    let found = std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<Vec<Item>> {
            // SAFETY: changes the network namespace of this short-lived thread only.
            if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!(
                    "entering {}: {}",
                    node.netns.display(),
                    std::io::Error::last_os_error()
                );
            }
            let mut out = Vec::new();
            // /proc/sys/net shows the namespace of the thread that opens it.
            let localnet = fs::read_to_string(ROUTE_LOCALNET).unwrap_or_default();
            if localnet.trim() == "1" {
                out.push(Item::new(
                    SYSCTL,
                    "sysctl",
                    "net.ipv4.conf.all.route_localnet=1 (kube-proxy's iptables mode sets it; \
                     nothing resets it)",
                ));
            }
            'interfaces: for (index, name) in interfaces()? {
                for (direction, attach_type) in TCX_HOOKS {
                    match prog_query(index, attach_type) {
                        Ok(0) => {}
                        Ok(count) => out.push(Item::new(
                            "kpr ebpf",
                            "tcx program",
                            format!("{name} {direction} x{count}"),
                        )),
                        // A kernel without TCX (before 6.6).
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break 'interfaces,
                        Err(e) => bail!("BPF_PROG_QUERY tcx {direction} on {name}: {e}"),
                    }
                }
            }
            Ok(out)
        })
        .join()
    });
    found.map_err(|_| anyhow::anyhow!("listing the TCX programs of {} panicked", node.name))?
}

/// The calling thread's network namespace's interfaces: (index, name).
fn interfaces() -> anyhow::Result<Vec<(u32, String)>> {
    // SAFETY: if_nameindex returns an array terminated by a zero entry, freed below; the names are
    // copied before.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            bail!("if_nameindex: {}", std::io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut entry = list;
        while (*entry).if_index != 0 {
            let name = std::ffi::CStr::from_ptr((*entry).if_name)
                .to_string_lossy()
                .into_owned();
            out.push(((*entry).if_index, name));
            entry = entry.add(1);
        }
        libc::if_freenameindex(list);
        Ok(out)
    }
}

/// `union bpf_attr` as `BPF_PROG_QUERY` reads it (`target_fd` is `target_ifindex` for TCX).
#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

const BPF_PROG_QUERY: libc::c_long = 16;

/// How many programs are attached directly (not inherited) to `target` at `attach_type`.
fn prog_query(target: u32, attach_type: u32) -> std::io::Result<u32> {
    let mut attr = ProgQueryAttr {
        target,
        attach_type,
        ..ProgQueryAttr::default()
    };
    // SAFETY: BPF_PROG_QUERY reads and writes `attr`, which lives for the call; prog_ids is null
    // and prog_cnt 0, so it only reports the count.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &mut attr as *mut ProgQueryAttr,
            std::mem::size_of::<ProgQueryAttr>() as u32,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr.prog_cnt)
}

// ---------------------------------------------------------------------------------------------
// The tour

/// The namespace of the tour's Service.
const TOUR_NAMESPACE: &str = "switch-tour";
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.56";

/// One row of the tour's table.
#[derive(Debug, Clone)]
pub struct Row {
    pub switch: String,
    /// From the first step to the end of the last rollout.
    pub seconds: f64,
    /// Then until the running proxy had programmed every node.
    pub settled: Option<f64>,
    /// The leftovers found (empty: clean), or why the check failed.
    pub leftovers: Result<Vec<String>, String>,
    /// Per node: which echo pod answered and after how many seconds, or why none did.
    pub answers: Vec<(String, Result<String, String>)>,
    /// Why the switch itself failed.
    pub error: Option<String>,
}

impl Row {
    pub fn passed(&self) -> bool {
        self.error.is_none()
            && self.leftovers.as_ref().is_ok_and(|l| l.is_empty())
            && self.answers.iter().all(|(_, a)| a.is_ok())
    }
}

/// The switches of the tour, in order.
fn tour_steps() -> Vec<ProxyChoice> {
    let kpr = |backend: &str| ProxyChoice {
        proxy: Proxy::Kpr,
        backend: backend.to_string(),
        mode: Mode::Nftables,
    };
    let kube_proxy = |mode| ProxyChoice {
        proxy: Proxy::KubeProxy,
        backend: deploy::DEFAULT_BACKEND.to_string(),
        mode,
    };
    vec![
        kpr("userspace"),
        kpr("iptables"),
        kpr("nftables"),
        kpr("ebpf"),
        kube_proxy(Mode::Iptables),
        kube_proxy(Mode::Nftables),
        kpr("nftables"),
    ]
}

/// The whole sequence on a running cluster: the leftovers check and the Service from every node
/// as it is, then each switch of [`tour_steps`] followed by both; prints the table and returns
/// its rows (a failed step does not stop the tour).
pub fn tour(cluster: &Cluster) -> anyhow::Result<Vec<Row>> {
    let live = Live::open(cluster)?;
    echo_service(&live)?;
    let mut rows = Vec::new();
    let start = live.proxy()?.describe();
    rows.push(observe(&live, format!("(start) {start}"), 0.0, None));
    for (i, to) in tour_steps().iter().enumerate() {
        let from = live.proxy()?.describe();
        let started = Instant::now();
        let result = switch(&live, to);
        let seconds = started.elapsed().as_secs_f64();
        let error = result.err().map(|e| format!("{e:#}"));
        if let Some(e) = &error {
            println!("[FAIL] {from} -> {}: {e}", to.describe());
        }
        let name = format!("{}. {from} -> {}", i + 1, to.describe());
        rows.push(observe(&live, name, seconds, error));
    }
    let table = tour_table(&live, &rows);
    println!("\n{table}");
    let path = live.cluster.dir.join("switch/TOUR.md");
    fs::write(&path, &table)?;
    println!("(also in {})", path.display());
    Ok(rows)
}

/// The leftovers check and the Service from every node, after a switch.
fn observe(live: &Live, switch: String, seconds: f64, error: Option<String>) -> Row {
    let settled = settle(live).ok().flatten();
    let leftovers = check(live).map_err(|e| format!("{e:#}"));
    let answers = live
        .nodes
        .iter()
        .map(|node| {
            let answer = ask_echo(live, node).map_err(|e| format!("{e:#}"));
            match &answer {
                Ok(a) => println!("[ok] from a pod on {}: {a}", node.name),
                Err(e) => println!("[FAIL] from a pod on {}: {e}", node.name),
            }
            (node.name.clone(), answer)
        })
        .collect();
    Row {
        switch,
        seconds,
        settled,
        leftovers,
        answers,
        error,
    }
}

/// The Markdown table of the tour.
fn tour_table(live: &Live, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Tour of `cargo xtask cluster --name {} proxy --tour` ({} nodes, Kubernetes {}):\n",
        live.cluster.name,
        live.nodes.len(),
        live.version
    );
    let _ = writeln!(
        out,
        "| switch | time (+ until programmed) | leftovers found | Service answered from a new pod on ({}) | outcome |",
        live.nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(out, "| --- | --- | --- | --- | --- |");
    for row in rows {
        let leftovers = match &row.leftovers {
            Ok(l) if l.is_empty() => "none".to_string(),
            Ok(l) => l.join("; "),
            Err(e) => format!("check failed: {e}"),
        };
        let answers: Vec<String> = row
            .answers
            .iter()
            .map(|(_, a)| match a {
                Ok(a) => format!("yes ({a})"),
                Err(e) => format!("NO ({})", first_line(e)),
            })
            .collect();
        let outcome = match &row.error {
            Some(e) => format!("FAILED: {}", first_line(e)),
            None if row.passed() => "ok".to_string(),
            None => "FAILED".to_string(),
        };
        let settled = match row.settled {
            Some(s) => format!(" (+{s:.0} s)"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} s{settled} | {leftovers} | {} | {outcome} |",
            row.switch,
            row.seconds,
            answers.join("; ")
        );
    }
    out
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The tour's Service: two agnhost echo pods behind the ClusterIP Service `echo:8080`.
fn echo_service(live: &Live) -> anyhow::Result<()> {
    let text = format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {TOUR_NAMESPACE}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: echo
  namespace: {TOUR_NAMESPACE}
spec:
  replicas: 2
  selector:
    matchLabels:
      app: echo
  template:
    metadata:
      labels:
        app: echo
    spec:
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              app: echo
      containers:
        - name: echo
          image: {AGNHOST}
          imagePullPolicy: Never
          args: ["netexec", "--http-port=8080"]
---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: {TOUR_NAMESPACE}
spec:
  selector:
    app: echo
  ports:
    - port: 8080
      targetPort: 8080
"#
    );
    live.apply("echo.yaml", &text)?;
    live.kubectl(&[
        "-n",
        TOUR_NAMESPACE,
        "rollout",
        "status",
        "deployment/echo",
        "--timeout=180s",
    ])?;
    Ok(())
}

/// A new pod on `node` asks `http://echo:8080/hostname` (the name through cluster DNS, itself a
/// Service), retrying for 30 s; returns the echo pod that answered and when, counted from the
/// pod's creation.
fn ask_echo(live: &Live, node: &NodeRef) -> anyhow::Result<String> {
    let pod = format!(
        "ask-{}-{}",
        node.name.rsplit('-').next().unwrap_or("0"),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() % 1_000_000)
            .unwrap_or(0)
    );
    let overrides = format!(
        r#"{{"apiVersion":"v1","spec":{{"nodeName":"{}"}}}}"#,
        node.name
    );
    let script = "i=0; while [ $i -lt 30 ]; do \
                  if out=$(curl -sf --max-time 2 http://echo:8080/hostname); then \
                  echo \"$out after $i retries\"; exit 0; fi; i=$((i+1)); sleep 1; done; \
                  echo 'no answer in 30 tries'; exit 1";
    let started = Instant::now();
    live.kubectl(&[
        "-n",
        TOUR_NAMESPACE,
        "run",
        &pod,
        "--restart=Never",
        &format!("--image={AGNHOST}"),
        "--image-pull-policy=Never",
        &format!("--overrides={overrides}"),
        "--command",
        "--",
        "sh",
        "-c",
        script,
    ])?;
    let deadline = started + Duration::from_secs(120);
    let phase = loop {
        let phase = live
            .kubectl_quiet(&[
                "-n",
                TOUR_NAMESPACE,
                "get",
                "pod",
                &pod,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" || Instant::now() > deadline {
            break phase;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let seconds = started.elapsed().as_secs_f64();
    let logs = live
        .kubectl_quiet(&["-n", TOUR_NAMESPACE, "logs", &pod])
        .unwrap_or_default();
    let _ = live.kubectl_quiet(&["-n", TOUR_NAMESPACE, "delete", "pod", &pod, "--wait=false"]);
    match phase.as_str() {
        "Succeeded" => Ok(format!("{} in {seconds:.0} s", logs.trim())),
        "Failed" => bail!("{}", logs.trim()),
        other => bail!(
            "pod {pod} still {other:?} after {seconds:.0} s: {}",
            logs.trim()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_described_choice_parses_back() {
        for backend in deploy::BACKENDS {
            let text = format!("kpr {backend}");
            assert_eq!(parse_choice(&text).unwrap().describe(), text);
        }
        for text in ["kube-proxy iptables", "kube-proxy nftables", "none"] {
            assert_eq!(parse_choice(text).unwrap().describe(), text);
        }
        assert!(parse_choice("kpr ipvs").is_err());
    }

    #[test]
    fn tables_and_chains_are_attributed() {
        let tables = "table ip mangle\ntable ip kpr\ntable ip kpr-userspace\ntable ip6 kube-proxy\ntable inet other\n";
        let owners: Vec<(String, String)> = nft_tables(tables)
            .into_iter()
            .map(|i| (i.what, i.owner))
            .collect();
        assert_eq!(
            owners,
            [
                ("ip mangle", IPTABLES_NFT),
                ("ip kpr", "kpr nftables"),
                ("ip kpr-userspace", "kpr userspace"),
                ("ip6 kube-proxy", "kube-proxy nftables"),
                ("inet other", OTHER),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        let saved = "# Warning: iptables-legacy tables present\n*nat\n:PREROUTING ACCEPT [0:0]\n\
                     :KUBE-SERVICES - [0:0]\n:KPR-SVCB-01 - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n\
                     :CNI-HOSTPORT-DNAT - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";
        let found: Vec<(String, String)> = chains(saved, "iptables-nft chain")
            .into_iter()
            .map(|i| (i.what, i.owner))
            .collect();
        assert_eq!(
            found,
            [
                ("nat KUBE-SERVICES", "kube-proxy iptables"),
                ("nat KPR-SVCB-01", "kpr iptables"),
                ("nat KUBE-KUBELET-CANARY", KUBELET),
                ("nat CNI-HOSTPORT-DNAT", OTHER),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }

    #[test]
    fn summaries_count_and_cut() {
        assert_eq!(summary("nft table", &["ip kpr"]), "nft table: ip kpr");
        let many = ["a", "b", "c", "d", "e", "f"];
        assert_eq!(
            summary("bpf pin", &many),
            "bpf pins (6): a, b, c, d, e, ..."
        );
    }
}
