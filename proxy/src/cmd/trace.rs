//! `proxy trace SRC DST:PORT/PROTO`: which Service, endpoint set and decision a new connection
//! gets, worked out from the eBPF backend's pinned maps or the nftables backend's tables as they
//! are.

use anyhow::Context;
use proxy::cli::{TraceArgs, TraceBackend};
use proxy::dataplane::ebpf::inspect::MapSnapshot;
use proxy::dataplane::ebpf::trace::{self, TraceRequest};

/// The nftables backend: the family's table of this network namespace.
fn run_nftables(args: &TraceArgs) -> anyhow::Result<()> {
    use proxy::dataplane::nftables::trace::{self as nft_trace, TableSnapshot};
    let family = proxy::model::IpFamily::of(&args.dst.addr);
    let table = TableSnapshot::read(family)
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

pub fn run(args: &TraceArgs) -> anyhow::Result<()> {
    if args.src.is_ipv4() != args.dst.addr.is_ipv4() {
        anyhow::bail!(
            "proxy trace: source {} and destination {} are of different address families (a \
             connection never changes family)",
            args.src,
            args.dst.addr
        );
    }
    if args.backend == TraceBackend::Nftables {
        return run_nftables(args);
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
    if let (trace::Decision::Picked { slot, .. }, Some(f)) = (&t.decision, &t.frontend) {
        if f.is_maglev() {
            println!("maglev table slot {slot} of {}", f.value.count);
        }
    }
    Ok(())
}
