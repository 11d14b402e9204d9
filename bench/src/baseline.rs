//! The comparison points, in namespaces of their own: kube-proxy's iptables layout (KUBE-SERVICES
//! -> KUBE-SVC-* -> KUBE-SEP-* with `statistic` probabilities, loaded with iptables-restore),
//! kube-proxy's nftables layout (a verdict map dispatching to one chain per Service and one per
//! endpoint, loaded with `nft -f`), and the floor: the client talking to the pod directly.
//!
//! Owns the generated rulesets (written under `target/bench/`) and the timing of their loads.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kpr_tests::cluster::CLUSTER_CIDR;
use serde::Serialize;
use xtask::exec::Cmd;

use super::traffic::{self, Latency};
use super::workload::{Workload, SERVICE_PORT};
use super::{kernel_memory_kib, Plan};

/// kube-proxy-style iptables chain name for Service `i` (`kind` SVC or SEP, endpoint `j`).
fn chain(kind: &str, i: usize, j: Option<usize>) -> String {
    match j {
        Some(j) => format!("KUBE-{kind}-{i:06X}-{j:02}"),
        None => format!("KUBE-{kind}-{i:06X}"),
    }
}

/// The `iptables-restore` input for `w`, as kube-proxy writes the nat table.
pub fn iptables_ruleset(w: &Workload) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    for c in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        writeln!(chains, ":{c} - [0:0]").unwrap();
    }
    rules.push_str(concat!(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n",
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n",
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n",
        "-A KUBE-POSTROUTING -j MASQUERADE --random-fully\n",
    ));
    let mut nodeports = String::new();
    for i in 0..w.services {
        let (svc, ip, name) = (
            chain("SVC", i, None),
            Workload::cluster_ip(i),
            Workload::name(i),
        );
        writeln!(chains, ":{svc} - [0:0]").unwrap();
        writeln!(rules, "-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"bench/{name}:http cluster IP\" -m tcp --dport {SERVICE_PORT} -j {svc}").unwrap();
        writeln!(rules, "-A {svc} ! -s {CLUSTER_CIDR} -d {ip}/32 -p tcp -m tcp --dport {SERVICE_PORT} -j KUBE-MARK-MASQ").unwrap();
        if let Some(np) = w.node_port(i) {
            writeln!(nodeports, "-A KUBE-NODEPORTS -p tcp -m comment --comment \"bench/{name}:http\" -m tcp --dport {np} -j KUBE-MARK-MASQ").unwrap();
            writeln!(
                nodeports,
                "-A KUBE-NODEPORTS -p tcp -m tcp --dport {np} -j {svc}"
            )
            .unwrap();
        }
        let eps = w.endpoint_ips(i);
        for (j, ep) in eps.iter().enumerate() {
            let sep = chain("SEP", i, Some(j));
            writeln!(chains, ":{sep} - [0:0]").unwrap();
            let left = eps.len() - j;
            if left > 1 {
                let p = 1.0 / left as f64;
                writeln!(rules, "-A {svc} -m comment --comment \"bench/{name}:http -> {ep}:8080\" -m statistic --mode random --probability {p:.11} -j {sep}").unwrap();
            } else {
                writeln!(
                    rules,
                    "-A {svc} -m comment --comment \"bench/{name}:http -> {ep}:8080\" -j {sep}"
                )
                .unwrap();
            }
            writeln!(rules, "-A {sep} -s {ep}/32 -j KUBE-MARK-MASQ").unwrap();
            writeln!(
                rules,
                "-A {sep} -p tcp -m tcp -j DNAT --to-destination {ep}:8080"
            )
            .unwrap();
        }
    }
    rules.push_str(&nodeports);
    rules.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
    format!("*nat\n{chains}{rules}COMMIT\n")
}

/// kube-proxy's nftables layout for `w` (table `ip kube-proxy`).
pub fn nft_ruleset(w: &Workload) -> String {
    let mut s =
        String::from("table ip kube-proxy\ndelete table ip kube-proxy\ntable ip kube-proxy {\n");
    s.push_str("  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n");
    s.push_str("  map service-nodeports { type inet_proto . inet_service : verdict; }\n");
    s.push_str("  chain mark-for-masquerade { meta mark set meta mark | 0x4000; }\n");
    s.push_str("  chain services { ip daddr . meta l4proto . th dport vmap @service-ips; fib daddr type local meta l4proto . th dport vmap @service-nodeports; }\n");
    s.push_str(
        "  chain nat-prerouting { type nat hook prerouting priority dstnat; jump services; }\n",
    );
    s.push_str("  chain nat-output { type nat hook output priority -100; jump services; }\n");
    s.push_str("  chain nat-postrouting { type nat hook postrouting priority srcnat; meta mark & 0x4000 == 0 return; meta mark set meta mark ^ 0x4000; masquerade fully-random; }\n");
    for i in 0..w.services {
        s.push_str(&nft_service_chains(w, i, w.endpoints));
    }
    s.push_str("}\n");
    for i in 0..w.services {
        let ip = Workload::cluster_ip(i);
        writeln!(s, "add element ip kube-proxy service-ips {{ {ip} . tcp . {SERVICE_PORT} : goto service-{i} }}").unwrap();
        if let Some(np) = w.node_port(i) {
            writeln!(
                s,
                "add element ip kube-proxy service-nodeports {{ tcp . {np} : goto external-{i} }}"
            )
            .unwrap();
        }
    }
    s
}

/// The chains of Service `i` using its first `count` endpoints.
fn nft_service_chains(w: &Workload, i: usize, count: usize) -> String {
    let mut s = String::new();
    let ip = Workload::cluster_ip(i);
    let eps = &w.endpoint_ips(i)[..count];
    let vmap: Vec<String> = (0..count)
        .map(|j| format!("{j} : goto endpoint-{i}-{j}"))
        .collect();
    writeln!(s, "  chain service-{i} {{ ip daddr {ip} tcp dport {SERVICE_PORT} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade; numgen random mod {count} vmap {{ {} }}; }}", vmap.join(", ")).unwrap();
    if w.node_port(i).is_some() {
        writeln!(
            s,
            "  chain external-{i} {{ jump mark-for-masquerade; goto service-{i}; }}"
        )
        .unwrap();
    }
    for (j, ep) in eps.iter().enumerate() {
        writeln!(s, "  chain endpoint-{i}-{j} {{ ip saddr {ep} jump mark-for-masquerade; meta l4proto tcp dnat to {ep}:8080; }}").unwrap();
    }
    s
}

/// One endpoint change as kube-proxy's nft mode writes it: Service `i`'s chain rewritten with
/// `count` endpoints.
fn nft_change(w: &Workload, i: usize, count: usize) -> String {
    format!(
        "flush chain ip kube-proxy service-{i}\ntable ip kube-proxy {{\n{}\n}}\n",
        nft_service_chains(w, i, count)
            .lines()
            .next()
            .unwrap_or_default()
    )
}

/// Measurements of one baseline at one size.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BaselineResult {
    pub name: String,
    pub services: usize,
    pub load_ms: f64,
    pub change_ms: Option<f64>,
    pub change_what: String,
    pub kernel_mem_kib: Option<i64>,
    pub latency_10: Option<Latency>,
    pub latency_n: Option<Latency>,
    pub rps: Option<f64>,
    pub rps_ratio: Option<f64>,
    /// Median over interleaved blocks of the Service/direct p50 ratio.
    pub direct_latency_ratio: Option<f64>,
    /// Median over blocks of the Service/loopback p50 ratio at 10 Services and at N.
    pub loopback_ratio_10: Option<f64>,
    pub loopback_ratio_n: Option<f64>,
    pub rr_deviation_pct: Option<f64>,
}

/// Runs `program file` inside `ns` (a namespace of ours), timed.
fn load(ns: &kpr_tests::Netns, program: &[&str], file: &Path) -> anyhow::Result<Duration> {
    let start = Instant::now();
    Cmd::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(program)
        .arg(file)
        .run()?;
    Ok(start.elapsed())
}

/// Which iptables implementation loads kube-proxy's iptables layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Legacy,
    Nft,
}

impl Flavour {
    fn restore(self) -> &'static str {
        match self {
            Flavour::Legacy => "iptables-legacy-restore",
            Flavour::Nft => "iptables-nft-restore",
        }
    }
}

/// Which kube-proxy layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Iptables(Flavour),
    Nftables,
}

impl Layout {
    pub fn name(self) -> String {
        match self {
            Layout::Iptables(f) => format!("kube-proxy iptables ({})", f.restore()),
            Layout::Nftables => "kube-proxy nftables".into(),
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Layout::Iptables(Flavour::Legacy) => "iptables-legacy",
            Layout::Iptables(Flavour::Nft) => "iptables-nft",
            Layout::Nftables => "nft",
        }
    }

    fn render(self, w: &Workload) -> String {
        match self {
            Layout::Iptables(_) => iptables_ruleset(w),
            Layout::Nftables => nft_ruleset(w),
        }
    }

    fn load(self, ns: &kpr_tests::Netns, file: &Path) -> anyhow::Result<Duration> {
        match self {
            Layout::Iptables(f) => load(ns, &[f.restore()], file),
            Layout::Nftables => load(ns, &["nft", "-f"], file),
        }
    }
}

/// Loads the layout for `services` Services in fresh namespaces and measures it; the data plane
/// only when `traffic` (the growth points of the nft layout skip it).
pub fn run(
    plan: &Plan,
    layout: Layout,
    services: usize,
    with_traffic: bool,
) -> anyhow::Result<BaselineResult> {
    let cluster = super::cluster(plan)?;
    let dir = plan.out_dir.join("rulesets");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let w = |n| Workload::v4(n, plan.endpoints, cluster.pod_ips());
    let tag = layout.tag();
    let mut r = BaselineResult {
        name: layout.name(),
        services,
        ..BaselineResult::default()
    };
    let (target10, target) = (addr(10), addr(services));
    if with_traffic {
        let file = dir.join(format!("kube-proxy-{tag}-10.rules"));
        std::fs::write(&file, layout.render(&w(10)))?;
        layout.load(&cluster.node, &file)?;
        let p = traffic::paired(
            &cluster.podclient,
            target10,
            cluster.loopback_addr(),
            plan.latency_samples,
            Duration::ZERO,
        )?;
        (r.latency_10, r.loopback_ratio_10) = (Some(p.service), Some(p.latency_ratio));
    }
    let big = w(services);
    let file = dir.join(format!("kube-proxy-{tag}-{services}.rules"));
    std::fs::write(&file, layout.render(&big))
        .with_context(|| format!("writing {}", file.display()))?;
    let before = kernel_memory_kib();
    r.load_ms = layout.load(&cluster.node, &file)?.as_secs_f64() * 1e3;
    r.kernel_mem_kib = before.zip(kernel_memory_kib()).map(|(a, b)| b - a);
    println!(
        "  {}: load of {services} Services: {:.1} ms",
        r.name, r.load_ms
    );
    r.change_ms = Some(change(plan, layout, &cluster.node, &big, &file)?);
    r.change_what = match layout {
        Layout::Iptables(_) => "whole-table iptables-restore".into(),
        Layout::Nftables => "one Service chain rewritten".into(),
    };
    if with_traffic {
        let direct = cluster.pods[0].echo_addr();
        let ns = &cluster.podclient;
        let p = traffic::paired(ns, target, direct, plan.latency_samples, plan.rate_time)?;
        r.latency_n = Some(p.service);
        r.direct_latency_ratio = Some(p.latency_ratio);
        let lo = cluster.loopback_addr();
        let l = traffic::paired(ns, target, lo, plan.latency_samples, Duration::ZERO)?;
        r.loopback_ratio_n = Some(l.latency_ratio);
        r.rps = Some(p.service_rps);
        r.rps_ratio = Some(p.service_rps / p.direct_rps);
        let counts = traffic::distribution(ns, target, plan.rr_connections)?;
        r.rr_deviation_pct = Some(traffic::max_deviation_pct(&counts, plan.endpoints));
    }
    Ok(r)
}

/// Median time of a few single-endpoint changes (each applied and reverted).
fn change(
    plan: &Plan,
    layout: Layout,
    ns: &kpr_tests::Netns,
    w: &Workload,
    full: &Path,
) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    let i = w.services / 2;
    for k in 0..plan.baseline_changes {
        let t = match layout {
            // kube-proxy's iptables mode rewrites the table (without MinimizeIPTablesRestore).
            Layout::Iptables(_) => layout.load(ns, full)?,
            Layout::Nftables => {
                let count = if k % 2 == 0 {
                    w.endpoints - 1
                } else {
                    w.endpoints
                };
                let file = full.with_extension(format!("change{k}"));
                std::fs::write(&file, nft_change(w, i, count.max(1)))?;
                layout.load(ns, &file)?
            }
        };
        times.push(t);
    }
    times.sort();
    Ok(traffic::percentile(&times, 50.0).as_secs_f64() * 1e3)
}

fn addr(services: usize) -> SocketAddr {
    SocketAddr::from((Workload::cluster_ip(services - 1), SERVICE_PORT))
}

/// The floor: the client straight to a pod, no Service.
pub fn direct(plan: &Plan) -> anyhow::Result<(Latency, f64)> {
    let cluster = super::cluster(plan)?;
    let ns = &cluster.podclient;
    let pod = cluster.pods[0].echo_addr();
    Ok((
        traffic::latency(ns, pod, plan.latency_samples)?,
        traffic::request_rate(ns, pod, plan.rate_time)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn w(n: usize) -> Workload {
        Workload::v4(
            n,
            4,
            (1..=4).map(|i| Ipv4Addr::new(10, 244, i, 2)).collect(),
        )
    }

    #[test]
    fn iptables_layout_has_kube_proxy_chains_and_probabilities() {
        let text = iptables_ruleset(&w(3));
        assert_eq!(text.matches("-j KUBE-SVC-").count(), 3 + 3); // KUBE-SERVICES + nodeports
        assert_eq!(text.matches("-j DNAT").count(), 12);
        assert!(text.contains("--probability 0.25000000000"));
        assert!(text.contains("--probability 0.33333333333"));
        assert!(text.contains("--probability 0.50000000000"));
        assert!(text.trim_end().ends_with("-j KUBE-NODEPORTS\nCOMMIT"));
    }

    #[test]
    fn nft_layout_has_one_chain_per_service_and_endpoint() {
        let text = nft_ruleset(&w(3));
        assert_eq!(text.matches("chain service-").count(), 3);
        assert_eq!(text.matches("chain endpoint-").count(), 12);
        assert_eq!(
            text.matches("add element ip kube-proxy service-ips")
                .count(),
            3
        );
        assert!(nft_change(&w(3), 1, 3).contains("numgen random mod 3"));
    }

    kpr_tests::needs_root! {
        /// Both layouts and the nft change really load (in a namespace of the test's own).
        #[test]
        fn rulesets_load_into_a_namespace() {
            let ns = kpr_tests::Netns::new("bench-rules").unwrap();
            let dir = std::env::temp_dir().join(format!("{}-bench-rules", ns.name()));
            std::fs::create_dir_all(&dir).unwrap();
            let files = [
                (
                    "ipt-legacy",
                    iptables_ruleset(&w(5)),
                    Layout::Iptables(Flavour::Legacy),
                ),
                (
                    "ipt-nft",
                    iptables_ruleset(&w(5)),
                    Layout::Iptables(Flavour::Nft),
                ),
                ("nft", nft_ruleset(&w(5)), Layout::Nftables),
                ("nft-change", nft_change(&w(5), 2, 3), Layout::Nftables),
            ];
            for (name, text, layout) in files {
                let file = dir.join(name);
                std::fs::write(&file, text).unwrap();
                layout.load(&ns, &file).unwrap();
            }
            let rules = Cmd::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns.name(),
                    "nft",
                    "list",
                    "chain",
                    "ip",
                    "kube-proxy",
                    "service-2",
                ])
                .read()
                .unwrap();
            assert!(rules.contains("numgen random mod 3"), "{rules}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
