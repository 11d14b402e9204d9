//! `cargo xtask kind --local --matrix`: every path README's kind guide describes, on one engine,
//! each followed by the smoke test: an IPv4 cluster brought up with the eBPF backend, switched to
//! nftables, iptables and userspace, rolled back to kube-proxy ("Roll back to kube-proxy":
//! kpr's DaemonSet deleted, deploy/cleanup.yaml, `kubeadm init phase addon kube-proxy`) and
//! forward again ("Replace kube-proxy on a running cluster": deploy/kube-proxy-cleanup.yaml, then
//! deploy/proxy.yaml); then a dual-stack cluster (deploy/kind-config-dual.yaml) through every
//! backend. Prints a table of the steps, their times and the smoke test's answers, also written
//! to `<target>/kind/MATRIX.md`.

use std::fmt::Write as _;
use std::fs;
use std::time::Instant;

use anyhow::Context as _;

use super::{hybrid_cgroups, step, Kind, HYBRID_CGROUP2, TIMEOUT};
use crate::deploy::{self, IpFamilies, Render};

/// The backends in the order the matrix goes through them (eBPF first: the one kind's nodes
/// need the most for, bpffs and the cgroup v2 root).
const ORDER: &[&str] = &["ebpf", "nftables", "iptables", "userspace"];

struct Row {
    cluster: &'static str,
    step: String,
    seconds: f64,
    outcome: Result<Vec<String>, String>,
}

/// Runs the matrix on `base` (the engine and node image set up); fails at the end if a step did.
pub(super) fn run(base: &Kind) -> anyhow::Result<()> {
    // Checked before the first cluster, not at the chart's step 20 minutes in.
    anyhow::ensure!(
        crate::helm::binary().is_file(),
        "the matrix installs the chart with helm, and {} is missing: `cargo xtask setup --helm` \
         builds it",
        crate::helm::binary().display()
    );
    let started = Instant::now();
    let mut rows = Vec::new();
    let path = crate::target_dir().join("kind/MATRIX.md");
    for families in [IpFamilies::Ipv4, IpFamilies::Dual] {
        let label = match families {
            IpFamilies::Ipv4 => "IPv4",
            IpFamilies::Dual => "dual-stack",
        };
        let kind = with(base, ORDER[0], families);
        let mut record =
            |step: String, kind: &Kind, f: &dyn Fn(&Kind) -> anyhow::Result<Vec<String>>| {
                let at = Instant::now();
                let outcome = f(kind).map_err(|e| format!("{e:#}"));
                let seconds = at.elapsed().as_secs_f64();
                println!(
                    "[matrix] {label} {step}: {:.0} s, {}",
                    seconds,
                    if outcome.is_ok() { "ok" } else { "FAILED" }
                );
                let ok = outcome.is_ok();
                rows.push(Row {
                    cluster: label,
                    step,
                    seconds,
                    outcome,
                });
                // Kept up to date as the matrix goes: a run cut short still leaves its rows.
                let _ = fs::write(&path, table(&rows, started.elapsed().as_secs_f64()));
                ok
            };
        let up_ok = record(format!("create, deploy {}", ORDER[0]), &kind, &|k| {
            let existed = k.timed("create the cluster", || k.create_cluster())?;
            k.timed("build and load the image", || k.build_and_load_image())?;
            let dir = k.render_manifests()?;
            k.timed("deploy", || k.deploy(&dir, existed))?;
            let mut lines = settled(k, &format!("kpr {}", k.render.backend))?;
            lines.extend(k.smoke_test(&dir, true)?);
            Ok(lines)
        });
        if up_ok {
            for backend in &ORDER[1..] {
                let next = with(base, backend, families);
                record(format!("switch to {backend}"), &next, &|k| switch(k));
            }
            if families == IpFamilies::Ipv4 {
                let last = with(base, ORDER[ORDER.len() - 1], families);
                if record("roll back to kube-proxy".into(), &last, &|k| rollback(k)) {
                    let first = with(base, ORDER[0], families);
                    record(
                        format!("replace kube-proxy with kpr ({})", ORDER[0]),
                        &first,
                        &|k| forward(k),
                    );
                }
            } else {
                // The chart on the dual-stack cluster (after its backends), with both families.
                let nft = with(base, "nftables", families);
                for (what, f) in super::helm::STEPS {
                    if !record((*what).to_owned(), &nft, f) {
                        break;
                    }
                }
            }
        }
        record("delete the cluster".into(), &kind, &|k| {
            k.cmd("kind")
                .args(["delete", "cluster", "--name", &k.render.cluster])
                .run()?;
            Ok(Vec::new())
        });
    }
    let table = table(&rows, started.elapsed().as_secs_f64());
    step("matrix");
    println!("{table}");
    fs::write(&path, &table).with_context(|| format!("writing {}", path.display()))?;
    println!("(written to {})", path.display());
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.outcome.is_err())
        .map(|r| format!("{} {}", r.cluster, r.step))
        .collect();
    anyhow::ensure!(failed.is_empty(), "failed: {}", failed.join("; "));
    Ok(())
}

/// `kind` with another backend.
pub(super) fn with_backend(kind: &Kind, backend: &str) -> Kind {
    with(kind, backend, kind.render.ip_families)
}

/// `base` with another backend and family.
fn with(base: &Kind, backend: &str, families: IpFamilies) -> Kind {
    Kind {
        render: Render {
            backend: backend.to_owned(),
            cluster: base.render.cluster.clone(),
            ip_families: families,
        },
        context: base.context.clone(),
        dry_run: false,
        root: base.root.clone(),
        local: base.local.as_ref().map(|e| crate::docker::Engine {
            pid: e.pid,
            socket: e.socket.clone(),
        }),
        node_image: base.node_image.clone(),
        binaries: base.binaries,
        image: base.image,
        times: Default::default(),
    }
}

/// deploy/proxy.yaml rendered for `kind`, applied and rolled out; the rendered manifests' directory.
fn deploy_agent(kind: &Kind) -> anyhow::Result<std::path::PathBuf> {
    let dir = kind.render_manifests()?;
    kind.kubectl()
        .args(["apply", "-f"])
        .arg(dir.join(deploy::AGENT_MANIFEST))
        .run()?;
    rollout(kind, &format!("daemonset/{}", deploy::AGENT_DAEMONSET))?;
    Ok(dir)
}

/// README's "Switch backends": the agent re-rendered with another backend and applied; the
/// DaemonSet rolls node by node (each new agent cleans the other backends up after its first
/// sync).
fn switch(kind: &Kind) -> anyhow::Result<Vec<String>> {
    step(&format!("switch to {}", kind.render.backend));
    kind.check_cgroup_scope()?;
    let dir = deploy_agent(kind)?;
    let mut lines = settled(kind, &format!("kpr {}", kind.render.backend))?;
    lines.extend(kind.smoke_test(&dir, true)?);
    Ok(lines)
}

/// [`leftovers`] once the nodes are programmed: a rollout is done when the Pods run, not when
/// they have written their rules (kube-proxy has no readiness probe), and an agent removes the
/// other mode's state only as it starts.
pub(super) fn settled(kind: &Kind, running: &str) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + std::time::Duration::from_secs(90);
    loop {
        match leftovers(kind, running) {
            Ok(lines) => return Ok(lines),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(e) => println!("[leftovers] not yet: {e:#}"),
        }
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
}

fn rollout(kind: &Kind, what: &str) -> anyhow::Result<()> {
    kind.kubectl()
        .args([
            "rollout",
            "status",
            what,
            TIMEOUT,
            "-n",
            deploy::SYSTEM_NAMESPACE,
        ])
        .run()
}

/// Applies `text` as `file` (written to the cluster's directory), waits for `daemonset`'s
/// rollout, deletes it again: a run-once DaemonSet.
fn run_once(kind: &Kind, file: &str, text: &str, daemonset: &str) -> anyhow::Result<()> {
    let path = crate::target_dir()
        .join("kind")
        .join(&kind.render.cluster)
        .join(file);
    fs::write(&path, text)?;
    kind.kubectl().args(["apply", "-f"]).arg(&path).run()?;
    rollout(kind, &format!("daemonset/{daemonset}"))?;
    kind.kubectl()
        .args(["delete", "--wait=true", "-f"])
        .arg(&path)
        .run()
}

/// deploy/cleanup.yaml (rendered for the nodes' cgroup v2 root) run once on every node: `proxy
/// cleanup --backend all`.
pub(super) fn run_once_cleanup(kind: &Kind) -> anyhow::Result<()> {
    let mut cleanup = deploy::render_file(deploy::CLEANUP_MANIFEST, &kind.render)?;
    if hybrid_cgroups() {
        cleanup = deploy::with_cgroup_root_in(deploy::CLEANUP_MANIFEST, &cleanup, HYBRID_CGROUP2)?;
    }
    run_once(
        kind,
        deploy::CLEANUP_MANIFEST,
        &cleanup,
        deploy::CLEANUP_DAEMONSET,
    )
}

/// README's "Roll back to kube-proxy", word for word (kube-proxy first, then kpr removed: make
/// before break), then the smoke test through kube-proxy.
fn rollback(kind: &Kind) -> anyhow::Result<Vec<String>> {
    step("roll back to kube-proxy");
    let node = kind.render.api_server_host();
    let cidr = match kind.render.ip_families {
        IpFamilies::Ipv4 => "10.244.0.0/16",
        IpFamilies::Dual => "10.244.0.0/16,fd00:10:244::/56",
    };
    kind.cmd("docker")
        .args([
            "exec",
            &node,
            "kubeadm",
            "init",
            "phase",
            "addon",
            "kube-proxy",
        ])
        .args([
            "--kubeconfig",
            "/etc/kubernetes/admin.conf",
            "--pod-network-cidr",
            cidr,
        ])
        .args(["--control-plane-endpoint", &format!("{node}:6443")])
        .run()?;
    // As kind configures kube-proxy: no conntrack table size (`maxPerCore: 0`). kube-proxy
    // otherwise writes nf_conntrack_max, which a node's network namespace may not
    // (`open /proc/sys/net/netfilter/nf_conntrack_max: permission denied`, and it exits).
    let config = kind
        .kubectl()
        .args(["get", "configmap", "kube-proxy", "-o", "yaml"])
        .args(["-n", deploy::SYSTEM_NAMESPACE])
        .read()?;
    anyhow::ensure!(
        config.contains("maxPerCore: null"),
        "kubeadm's kube-proxy ConfigMap has no `maxPerCore: null`:\n{config}"
    );
    let path = crate::target_dir()
        .join("kind")
        .join(&kind.render.cluster)
        .join("kube-proxy-configmap.yaml");
    fs::write(&path, config.replace("maxPerCore: null", "maxPerCore: 0"))?;
    kind.kubectl().args(["apply", "-f"]).arg(&path).run()?;
    kind.kubectl()
        .args(["rollout", "restart", "daemonset/kube-proxy"])
        .args(["-n", deploy::SYSTEM_NAMESPACE])
        .run()?;
    rollout(kind, "daemonset/kube-proxy")?;
    kind.kubectl()
        .args([
            "delete",
            "daemonset",
            deploy::AGENT_DAEMONSET,
            "--cascade=foreground",
        ])
        .args(["-n", deploy::SYSTEM_NAMESPACE])
        .run()?;
    run_once_cleanup(kind)?;
    let dir = crate::target_dir().join("kind").join(&kind.render.cluster);
    let settle = settled(kind, "kube-proxy iptables");
    if settle.is_err() {
        // What kube-proxy says about it (it has no readiness probe: the rollout says nothing).
        let _ = kind
            .kubectl()
            .args([
                "logs",
                "-n",
                deploy::SYSTEM_NAMESPACE,
                "-l",
                "k8s-app=kube-proxy",
            ])
            .args(["--tail=30", "--prefix"])
            .run();
    }
    let mut lines = settle?;
    lines.extend(kind.smoke_test(&dir, false)?);
    Ok(lines)
}

/// README's "Replace kube-proxy on a running cluster" (kpr first, then kube-proxy removed: make
/// before break), then the smoke test through kpr.
fn forward(kind: &Kind) -> anyhow::Result<Vec<String>> {
    step("replace kube-proxy with kpr");
    kind.check_cgroup_scope()?;
    let dir = deploy_agent(kind)?;
    kind.kubectl()
        .args(["delete", "daemonset", "kube-proxy", "--cascade=foreground"])
        .args(["-n", deploy::SYSTEM_NAMESPACE])
        .run()?;
    let text = deploy::render_file(deploy::KUBE_PROXY_CLEANUP_MANIFEST, &kind.render)?;
    let text = deploy::with_kube_proxy_version(&text, &crate::k8s::kubernetes_version()?)?;
    run_once(
        kind,
        deploy::KUBE_PROXY_CLEANUP_MANIFEST,
        &text,
        deploy::KUBE_PROXY_CLEANUP_DAEMONSET,
    )?;
    let mut lines = settled(kind, &format!("kpr {}", kind.render.backend))?;
    lines.extend(kind.smoke_test(&dir, true)?);
    Ok(lines)
}

fn table(rows: &[Row], total: f64) -> String {
    let mut out =
        String::from("| cluster | step | time | smoke test |\n| --- | --- | --- | --- |\n");
    for row in rows {
        let outcome = match &row.outcome {
            Ok(lines) if lines.is_empty() => "-".to_owned(),
            Ok(lines) => lines.join("<br>"),
            Err(e) => format!("FAILED: {}", e.lines().next().unwrap_or_default()),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} s | {outcome} |",
            row.cluster, row.step, row.seconds
        );
    }
    let _ = writeln!(out, "\nin all: {:.0} s", total);
    out
}

/// What the kind nodes hold of any Service proxy (nftables tables, iptables and ip6tables chains of
/// both flavours, bpffs pins under kpr/, tc filters named kpr), attributed as `cargo xtask cluster
/// leftovers` attributes them; fails on anything of a proxy other than `running` (as
/// [`crate::cluster::nodes::ProxyChoice::describe`] names it: `kpr nftables`, `kube-proxy
/// iptables`; `none`: nothing may be left), and, unless `none`, if a node holds nothing of it.
pub(super) fn leftovers(kind: &Kind, running: &str) -> anyhow::Result<Vec<String>> {
    use crate::cluster::switch::{chains, is_proxy, nft_tables};
    let mut found = Vec::new();
    for node in kind.node_names() {
        let exec = |script: &str| {
            kind.cmd("docker")
                .args(["exec", &node, "sh", "-c", script])
                .quiet()
                .read()
        };
        let mut items = nft_tables(&exec("nft list tables")?);
        for (tool, what) in [
            ("iptables-legacy-save", "iptables-legacy chain"),
            ("iptables-nft-save", "iptables-nft chain"),
            ("ip6tables-legacy-save", "ip6tables-legacy chain"),
            ("ip6tables-nft-save", "ip6tables-nft chain"),
        ] {
            items.extend(chains(&exec(&format!("{tool} 2>&1"))?, what));
        }
        let pins = exec("[ ! -d /sys/fs/bpf/kpr ] || find /sys/fs/bpf/kpr -mindepth 1")?;
        let filters = exec(
            "for d in $(ls /sys/class/net); do tc filter show dev $d ingress 2>/dev/null; \
             tc filter show dev $d egress 2>/dev/null; done | grep -o 'kpr[a-z_]*' || true",
        )?;
        let mut mine = 0;
        for (owner, what) in items
            .iter()
            .map(|i| (i.owner.clone(), format!("{} {}", i.kind, i.what)))
            .chain(
                pins.lines()
                    .map(|p| ("kpr ebpf".to_owned(), format!("bpf pin {p}"))),
            )
            .chain(
                filters
                    .lines()
                    .map(|f| ("kpr ebpf".to_owned(), format!("tc filter {f}"))),
            )
        {
            if owner == running {
                mine += 1;
            } else if is_proxy(&owner) {
                found.push(format!("{node}: {owner}: {what}"));
            }
        }
        if running != "none" && mine == 0 {
            found.push(format!("{node}: nothing of {running}"));
        }
        println!("[leftovers] {node}: {mine} items of {running}");
    }
    anyhow::ensure!(
        found.is_empty(),
        "the nodes hold state of another proxy than {running}:\n  {}",
        found.join("\n  ")
    );
    Ok(vec![format!("leftovers: only {running}")])
}
