//! `proxy trace SRC DST:PORT/PROTO`: which Service, endpoint set and decision a new connection
//! gets, worked out from the eBPF backend's pinned maps, the nftables backend's tables or the
//! iptables backend's chains as they are, or, for the userspace backend, its table and the
//! running agent's listener state (`GET /trace`).

use anyhow::Context;
use proxy::cli::{TraceArgs, TraceBackend};
use proxy::dataplane::ebpf::inspect::MapSnapshot;
use proxy::dataplane::ebpf::trace::{self, TraceRequest};

/// The nftables backend: the family's table of this network namespace.
fn run_nftables(args: &TraceArgs) -> anyhow::Result<()> {
    use proxy::dataplane::nftables::trace as nft_trace;
    let family = proxy::model::IpFamily::of(&args.dst.addr);
    let table = nft_trace::read_table(family)
        .context("proxy trace: reading the kpr table (run it in the node's network namespace)")?;
    let req = nft_trace::TraceRequest {
        src: args.src,
        dst: args.dst.addr,
        port: args.dst.port,
        proto: args.dst.proto,
    };
    print!(
        "{}",
        nft_trace::render(&req, &nft_trace::trace(&table, &req))
    );
    Ok(())
}

/// The iptables backend: the family's `KPR-` chains of this network namespace.
fn run_iptables(args: &TraceArgs) -> anyhow::Result<()> {
    use proxy::dataplane::iptables::exec::Mode;
    use proxy::dataplane::iptables::trace::{self as ipt, Env, Snapshot};
    let mode = match args.iptables_mode.as_deref() {
        Some(m) => Mode::parse(m)?,
        None => Mode::detect(),
    };
    let tool = mode.tool(proxy::model::IpFamily::of(&args.dst.addr));
    let snap = Snapshot::read(tool).context(
        "proxy trace: reading the iptables rules (run it in the node's network namespace)",
    )?;
    if !snap.programmed() {
        anyhow::bail!(
            "proxy trace: {} shows no KPR-SERVICES chain: the iptables backend has not programmed \
             this network namespace in {} mode (--iptables-mode)",
            tool.binary("save"),
            match mode {
                Mode::Legacy => "legacy",
                Mode::Nft => "nft",
            }
        );
    }
    let req = ipt::TraceRequest {
        src: args.src,
        src_port: args.src_port,
        dst: args.dst.addr,
        port: args.dst.port,
        proto: args.dst.proto,
    };
    let t = ipt::trace(&snap, &Env::read(), &req)
        .map_err(|e| anyhow::anyhow!("proxy trace: {}: {e}", tool.binary("save")))?;
    print!("{}", ipt::render(&req, tool, &t));
    Ok(())
}

/// The userspace backend: the kernel's verdict from the `kpr-userspace` table, then (for a
/// redirected connection) the agent's listener.
fn run_userspace(args: &TraceArgs) -> anyhow::Result<()> {
    use proxy::dataplane::userspace::trace::{kernel, read_table, render_kernel, KernelVerdict};
    use proxy::dataplane::{TraceQuery, TraceView};
    let q = TraceQuery {
        src: args.src,
        src_port: args.src_port,
        dst: args.dst.addr,
        port: args.dst.port,
        proto: args.dst.proto,
    };
    let table = read_table(proxy::model::IpFamily::of(&q.dst)).context(
        "proxy trace: reading the kpr-userspace table (run it in the node's network namespace)",
    )?;
    let mut steps = Vec::new();
    let verdict = kernel(&table, &q, &mut steps);
    print!("{}", render_kernel(&q, &steps));
    let decision = match verdict {
        KernelVerdict::Reject(why) => format!("reject ({why})"),
        KernelVerdict::Drop(why) => format!("drop ({why})"),
        KernelVerdict::Untouched => "untouched: not a Service address of this table".into(),
        KernelVerdict::Redirect(_) => {
            let mut url = format!(
                "http://{}/trace?src={}&dst={}&port={}&proto={}",
                args.metrics_bind_address,
                q.src,
                q.dst,
                q.port,
                q.proto.as_str()
            );
            if let Some(p) = q.src_port {
                url.push_str(&format!("&src_port={p}"));
            }
            let resp = reqwest::blocking::get(&url)
                .with_context(|| format!("proxy trace: asking the agent ({url})"))?;
            let status = resp.status();
            if !status.is_success() {
                anyhow::bail!(
                    "proxy trace: {url}: {status}: {}",
                    resp.text().unwrap_or_default().trim()
                );
            }
            let view: TraceView = resp
                .json()
                .with_context(|| format!("proxy trace: {url}: not a trace"))?;
            for s in &view.steps {
                println!("{s}");
            }
            view.decision
        }
    };
    println!("decision: {decision}");
    Ok(())
}

pub fn run(args: &TraceArgs) -> anyhow::Result<()> {
    if args.src.is_ipv4() != args.dst.addr.is_ipv4() {
        anyhow::bail!(
            "proxy trace: source {} and destination {} are of different address families (a \
             connection never changes family)",
            args.src,
            args.dst.addr
        );
    }
    match args.backend {
        TraceBackend::Nftables => return run_nftables(args),
        TraceBackend::Iptables => return run_iptables(args),
        TraceBackend::Userspace => return run_userspace(args),
        TraceBackend::Ebpf => {}
    }
    let snap = MapSnapshot::read(&args.bpffs_path).context("proxy trace")?;
    let netns_cookie = match &args.netns {
        Some(p) => Some(
            trace::netns_cookie(p)
                .with_context(|| format!("--netns {}: reading its cookie", p.display()))?,
        ),
        None => None,
    };
    let req = TraceRequest {
        src: args.src,
        dst: args.dst.addr,
        port: args.dst.port,
        proto: args.dst.proto,
        external: args.from_outside,
        netns_cookie,
        sport: args.src_port,
    };
    let path = if req.external {
        "tc path (from outside the node)"
    } else {
        "socket path (cgroup programs)"
    };
    println!(
        "{} -> {}/{}  {path}",
        req.src,
        std::net::SocketAddr::new(req.dst, req.port),
        req.proto.as_str()
    );
    let t = trace::trace(&snap, &req);
    if let Some(f) = &t.frontend {
        println!(
            "service frontend {}  set {}  {} backends  {}",
            f.frontend(),
            f.value.set_id,
            f.value.count,
            f.algorithm()
        );
        super::inspect::print_slots(f);
    }
    if t.via_tc {
        println!(
            "the socket program leaves it untranslated (a LoadBalancer IP with \
             loadBalancerSourceRanges, from a pod): the tc program decides on the node's side"
        );
    }
    println!("decision: {}", t.decision);
    if let (true, Some(f), Some(_)) = (req.external, &t.frontend, t.decision.backend()) {
        if f.value.flags & proxy_common::SVC_F_DSR != 0 {
            println!(
                "dsr: not masqueraded (the backend sees the client's address); the frontend goes \
                 to the backend's node in an IPv4 option, whose agent answers the client from {} \
                 directly (--nodeport-mode dsr|hybrid)",
                f.frontend()
            );
        } else if f.value.flags & proxy_common::SVC_F_MASQUERADE != 0 {
            println!("snat: masqueraded to the node; replies come back through it");
        }
    }
    if let (trace::Decision::Picked { slot, .. }, Some(f)) = (&t.decision, &t.frontend) {
        if f.is_maglev() {
            println!("maglev table slot {slot} of {}", f.value.count);
        }
    }
    if let (true, Some(backend)) = (req.external, t.decision.backend()) {
        for line in xdp_path(args, backend.socket_addr().ip())? {
            println!("{line}");
        }
    }
    Ok(())
}

/// Which hooks carry a flow from outside to `backend`: the pinned XDP links and the node's
/// routes (`--in-interface`, or the route back to the client, for the interface it arrives on).
fn xdp_path(args: &TraceArgs, backend: std::net::IpAddr) -> anyhow::Result<Vec<String>> {
    use proxy::dataplane::ebpf::route::interface_to;
    let xdp = proxy::dataplane::ebpf::xdp::pinned_interfaces(&args.bpffs_path);
    let route = |addr: std::net::IpAddr| {
        interface_to(addr).with_context(|| {
            format!(
                "proxy trace: the node's route to {addr} (run it in the node's network namespace)"
            )
        })
    };
    let path = if xdp.is_empty() {
        trace::XdpPath {
            xdp,
            ingress: String::new(),
            to_backend: String::new(),
            to_client: String::new(),
        }
    } else {
        let to_client = route(args.src)?;
        trace::XdpPath {
            xdp,
            ingress: args
                .in_interface
                .clone()
                .unwrap_or_else(|| to_client.clone()),
            to_backend: route(backend)?,
            to_client,
        }
    };
    Ok(path.describe(backend))
}
