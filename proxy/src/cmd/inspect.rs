//! `proxy inspect`: prints what a running agent has programmed, read from its `/state` endpoint.

use anyhow::Context;
use proxy::cli::InspectArgs;
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

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
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
