//! `proxy inspect`: prints what a running agent has programmed, read from its `/state` endpoint,
//! or with `--maps` what the eBPF backend's pinned maps hold (no agent needed).

use anyhow::Context;
use proxy::cli::InspectArgs;
use proxy::dataplane::ebpf::dsr::DsrCounts;
use proxy::dataplane::ebpf::inspect::{AffinityClient, FrontendView, MapSnapshot, SlotView};
use proxy::dataplane::ebpf::resize::{footprints, total_mib, Footprint};
use proxy::dataplane::ebpf::sockterm::TermCounts;
use proxy::dataplane::ebpf::xdp::XdpCounts;
use proxy::status::{ServiceView, StateView};

fn addrs(ips: &[std::net::IpAddr], port: u16) -> String {
    ips.iter()
        .map(|ip| std::net::SocketAddr::new(*ip, port).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn print_service(s: &ServiceView) {
    let mut dests = vec![addrs(&s.cluster_ips, s.port)];
    if s.node_port != 0 {
        dests.push(format!("nodePort {}", s.node_port));
    }
    if !s.external_ips.is_empty() {
        dests.push(format!("externalIPs {}", addrs(&s.external_ips, s.port)));
    }
    if !s.load_balancer_ips.is_empty() {
        dests.push(format!("LB {}", addrs(&s.load_balancer_ips, s.port)));
    }
    let mut flags = vec![s.algorithm.clone()];
    if let Some(t) = s.affinity_seconds {
        flags.push(format!("affinity {t}s"));
    }
    if s.internal_local {
        flags.push("iTP=Local".into());
    }
    if s.external_local {
        flags.push("eTP=Local".into());
    }
    println!("{}  {}  [{}]", s.name, dests.join("  "), flags.join(", "));
    for u in &s.unserved {
        println!("    not served: {u}");
    }
    for m in &s.maglev {
        let slots: Vec<String> = m.slots.iter().map(|(ep, n)| format!("{ep} {n}")).collect();
        println!(
            "    maglev table ({}): {} slots; slots per endpoint: {}",
            m.set,
            m.table_size,
            slots.join(", ")
        );
    }
    if s.endpoints.is_empty() {
        println!("    (no endpoints: connections are rejected)");
    }
    for e in &s.endpoints {
        let state = if e.ready {
            "ready"
        } else if e.serving && e.terminating {
            "serving-terminating"
        } else if e.terminating {
            "terminating"
        } else {
            "not-ready"
        };
        let used = match (e.cluster, e.external) {
            (true, true) => "used",
            (true, false) => "cluster only",
            (false, true) => "external only",
            (false, false) => "unused",
        };
        let active = e
            .active
            .map(|a| format!("  active {a}"))
            .unwrap_or_default();
        let node = e
            .node
            .as_deref()
            .map(|n| format!("  node {n}"))
            .unwrap_or_default();
        println!(
            "    {:<24} {:<20} {:<14}{node}{active}",
            e.addr.to_string(),
            state,
            used
        );
    }
}

/// One backend slot: `slot N  ADDR:PORT  id I  active A  total T`.
pub fn slot_line(s: &SlotView) -> String {
    let addr = s
        .addr
        .map(|a| a.socket_addr().to_string())
        .unwrap_or_else(|| "(missing backend)".into());
    format!(
        "slot {:<3} {addr:<22} id {:<6} active {:<5} total {}",
        s.slot, s.backend_id, s.active, s.total
    )
}

/// A set's slots, one line each; a Maglev set's table as its size and each backend's slots.
pub fn print_slots(f: &FrontendView) {
    if !f.is_maglev() {
        for s in &f.slots {
            println!("    {}", slot_line(s));
        }
        return;
    }
    println!("    maglev table: {} slots", f.value.count);
    for (s, n) in f.maglev_counts() {
        let addr = s
            .addr
            .map(|a| a.socket_addr().to_string())
            .unwrap_or_else(|| "(missing backend)".into());
        println!(
            "    {addr:<22} id {:<6} slots {n:<6} active {:<5} total {}",
            s.backend_id, s.active, s.total
        );
    }
}

fn print_frontend(f: &FrontendView) {
    let path = if f.external { "external" } else { "socket" };
    let mut flags = vec![f.algorithm().to_string()];
    if f.value.flags & proxy_common::SVC_F_AFFINITY != 0 {
        flags.push(format!("affinity {}s", f.value.affinity_timeout_s));
    }
    if f.value.flags & proxy_common::SVC_F_MASQUERADE != 0 {
        flags.push("masquerade".into());
    }
    if f.value.flags & proxy_common::SVC_F_DSR != 0 {
        flags.push("dsr".into());
    }
    if f.value.flags & proxy_common::SVC_F_SOURCE_RANGES != 0 {
        flags.push("source ranges".into());
    }
    let cursor = f
        .cursor
        .map(|c| format!("  cursor {c}"))
        .unwrap_or_default();
    let what = if f.is_maglev() { "slots" } else { "backends" };
    println!(
        "{:<26} {path:<8} set {:<6} {what} {:<4} [{}]{cursor}",
        f.frontend(),
        f.value.set_id,
        f.value.count,
        flags.join(", ")
    );
    if f.value.count == 0 {
        let how = if f.value.flags & proxy_common::SVC_F_DROP_EMPTY != 0 {
            "dropped"
        } else {
            "rejected"
        };
        println!("    (no endpoints: connections are {how})");
    }
    if !f.source_ranges.is_empty() {
        let nets: Vec<String> = f.source_ranges.iter().map(|n| n.to_string()).collect();
        println!("    allowed sources: {}", nets.join(", "));
    }
    print_slots(f);
    for a in &f.affinity {
        let client = match a.client {
            AffinityClient::Netns(c) => format!("netns cookie {c}"),
            AffinityClient::Addr(ip) => format!("client {ip}"),
        };
        let to = f
            .slots
            .iter()
            .find(|s| s.backend_id == a.backend_id)
            .and_then(|s| s.addr)
            .map(|b| b.socket_addr().to_string())
            .unwrap_or_else(|| format!("backend id {}", a.backend_id));
        println!(
            "    affinity {client} -> {to}  idle {:.1}s",
            a.idle_ns as f64 / 1e9
        );
    }
}

fn slot_json(s: &SlotView) -> serde_json::Value {
    serde_json::json!({
        "slot": s.slot,
        "backend_id": s.backend_id,
        "address": s.addr.map(|a| a.socket_addr().to_string()),
        "active": s.active,
        "total": s.total,
    })
}

fn frontend_json(f: &FrontendView) -> serde_json::Value {
    let affinity: Vec<_> = f
        .affinity
        .iter()
        .map(|a| {
            let (kind, client) = match a.client {
                AffinityClient::Netns(c) => ("netns_cookie", c.to_string()),
                AffinityClient::Addr(ip) => ("address", ip.to_string()),
            };
            serde_json::json!({
                kind: client,
                "backend_id": a.backend_id,
                "idle_seconds": a.idle_ns as f64 / 1e9,
            })
        })
        .collect();
    serde_json::json!({
        "frontend": f.frontend(),
        "path": if f.external { "external" } else { "socket" },
        "set_id": f.value.set_id,
        "backends": f.value.count,
        "algorithm": f.algorithm(),
        "affinity_seconds": (f.value.flags & proxy_common::SVC_F_AFFINITY != 0)
            .then_some(f.value.affinity_timeout_s),
        "no_endpoints": (f.value.count == 0).then_some(
            if f.value.flags & proxy_common::SVC_F_DROP_EMPTY != 0 { "drop" } else { "reject" },
        ),
        "cursor": f.cursor,
        "source_ranges": (f.value.flags & proxy_common::SVC_F_SOURCE_RANGES != 0).then(|| {
            f.source_ranges.iter().map(|n| n.to_string()).collect::<Vec<_>>()
        }),
        "slots": (!f.is_maglev()).then(|| f.slots.iter().map(slot_json).collect::<Vec<_>>()),
        "maglev": f.is_maglev().then(|| serde_json::json!({
            "table_size": f.value.count,
            "backends": f.maglev_counts().into_iter().map(|(s, n)| {
                let mut v = slot_json(s);
                v["slots"] = n.into();
                v.as_object_mut().map(|o| o.remove("slot"));
                v
            }).collect::<Vec<_>>(),
        })),
        "affinity": affinity,
    })
}

/// `inspect --maps --json`: the snapshot as one JSON document.
fn maps_json(
    snap: &MapSnapshot,
    destroyed: Option<TermCounts>,
    xdp: &Xdp,
    dsr: &Dsr,
    footprints: &[Footprint],
) -> serde_json::Value {
    serde_json::json!({
        "maps": footprints.iter().map(|f| serde_json::json!({
            "name": f.name,
            "max_entries": f.max_entries,
            "kernel_bytes": f.kernel_bytes,
        })).collect::<Vec<_>>(),
        "frontends": snap.frontends.iter().map(frontend_json).collect::<Vec<_>>(),
        "cluster_ips": snap.vips,
        "sockets_destroyed": destroyed.map(|d| serde_json::json!({
            "tcp": d.tcp,
            "udp": d.udp,
            "tcp_refused": d.tcp_failed,
            "udp_refused": d.udp_failed,
        })),
        "xdp": {
            "interfaces": xdp.interfaces,
            "counts": xdp.counts,
        },
        "dsr": {
            "egress_interfaces": dsr.interfaces,
            "counts": dsr.counts,
        },
    })
}

/// Direct server return as the pins show it: the interfaces with a pinned egress link (TCX),
/// and the DSR programs' counts.
struct Dsr {
    interfaces: Vec<String>,
    counts: Option<DsrCounts>,
}

impl Dsr {
    fn read(bpffs: &std::path::Path, maps_dir: &std::path::Path) -> Dsr {
        Dsr {
            interfaces: proxy::dataplane::ebpf::dsr::pinned_egress_interfaces(bpffs),
            // Absent from the pins of an agent older than DSR.
            counts: DsrCounts::from_pin(maps_dir).ok(),
        }
    }
}

/// The XDP program as the pins show it: the interfaces with a pinned link, and its counts.
struct Xdp {
    interfaces: Vec<String>,
    counts: Option<XdpCounts>,
}

impl Xdp {
    fn read(bpffs: &std::path::Path, maps_dir: &std::path::Path) -> Xdp {
        let interfaces = proxy::dataplane::ebpf::xdp::pinned_interfaces(bpffs);
        Xdp {
            interfaces,
            // Absent from the pins of an agent older than XDP.
            counts: XdpCounts::from_pin(maps_dir).ok(),
        }
    }
}

fn run_maps(args: &InspectArgs) -> anyhow::Result<()> {
    let snap = MapSnapshot::read(&args.bpffs_path).context("proxy inspect --maps")?;
    // Absent from the pins of an agent older than socket destruction.
    let maps_dir = proxy::dataplane::ebpf::inspect::maps_dir(&args.bpffs_path);
    let destroyed = TermCounts::from_pin(&maps_dir).ok();
    let xdp = Xdp::read(&args.bpffs_path, &maps_dir);
    let dsr = Dsr::read(&args.bpffs_path, &maps_dir);
    let footprints = footprints(&maps_dir);
    if args.json {
        println!("{}", maps_json(&snap, destroyed, &xdp, &dsr, &footprints));
        return Ok(());
    }
    let (maps, links) = proxy::dataplane::ebpf::inspect::pinned(&args.bpffs_path);
    println!(
        "ebpf maps under {}: {maps} maps, {links} links pinned, {} frontends, {} clusterIPs \
         (active/total count per endpoint, over every Service using it)",
        args.bpffs_path.display(),
        snap.frontends.len(),
        snap.vips.len()
    );
    if let Some(d) = destroyed {
        println!(
            "sockets destroyed (connected to endpoints that left): {} tcp, {} udp{}",
            d.tcp,
            d.udp,
            if d.tcp_failed + d.udp_failed > 0 {
                format!(
                    " ({} tcp, {} udp refused by the kernel)",
                    d.tcp_failed, d.udp_failed
                )
            } else {
                String::new()
            }
        );
    }
    match (&xdp.interfaces[..], xdp.counts) {
        ([], _) => println!("XDP: attached nowhere (--xdp-interfaces)"),
        (ifaces, counts) => {
            let c = counts.unwrap_or_default();
            println!(
                "XDP on {}: {} packets translated and sent back out, {} of service flows passed \
                 to tc (their route goes elsewhere), {} first packets of flows passed to tc",
                ifaces.join(", "),
                c.sent,
                c.passed_route,
                c.passed_new
            );
        }
    }
    let c = dsr.counts.unwrap_or_default();
    if dsr.interfaces.is_empty() && c == DsrCounts::default() {
        println!("DSR: off (--nodeport-mode snat)");
    } else {
        println!(
            "DSR (--nodeport-mode dsr|hybrid), egress program {}: {} packets sent to a \
             backend with the option, {} dropped (option not added), {} arrived with it \
             (backend here), {} replies answered from the frontend",
            if dsr.interfaces.is_empty() {
                "not pinned (netlink tc filters before Linux 6.6, or none)".to_string()
            } else {
                format!("on {}", dsr.interfaces.join(", "))
            },
            c.options_added,
            c.options_failed,
            c.recorded,
            c.replies_rewritten
        );
    }
    println!(
        "map sizes (--bpf-*-max), {:.1} MiB of kernel memory in all:",
        total_mib(&footprints)
    );
    for f in &footprints {
        println!("  {}: {}", f.name, f.describe());
    }
    for f in &snap.frontends {
        print_frontend(f);
    }
    Ok(())
}

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    if args.maps {
        return run_maps(args);
    }
    let url = format!("http://{}/state", args.metrics_bind_address);
    let body = reqwest::blocking::get(&url)
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.text())
        .with_context(|| {
            format!("reading {url} (is the agent running in this network namespace?)")
        })?;
    if args.json {
        println!("{body}");
        return Ok(());
    }
    let view: StateView = serde_json::from_str(&body).with_context(|| format!("parsing {url}"))?;
    let last = match &view.last_sync {
        Some(l) if l.error.is_some() => {
            format!("last sync FAILED: {}", l.error.as_deref().unwrap_or(""))
        }
        Some(l) => format!(
            "last sync {:.1} ms ({}, {} service ports touched, {} ops)",
            l.duration_ms,
            if l.full { "full" } else { "partial" },
            l.touched,
            l.operations
        ),
        None => "no sync yet".into(),
    };
    println!(
        "backend {}  synced {}  {}  {} service ports",
        view.backend,
        view.synced,
        last,
        view.services.len()
    );
    for s in &view.services {
        print_service(s);
    }
    if !view.errors.is_empty() {
        println!("\ninput problems:");
        for e in &view.errors {
            println!("    {e}");
        }
    }
    Ok(())
}
