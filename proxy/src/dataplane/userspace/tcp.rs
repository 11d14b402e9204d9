//! The TCP listeners of the userspace backend: one socket per address family for every TCP
//! Service. nftables redirects Service traffic here; `SO_ORIGINAL_DST` (`IP6T_SO_ORIGINAL_DST` in
//! IPv6) says which Service was meant. Each connection is spliced
//! to an endpoint; an endpoint that refuses is skipped for the next one before the client sees an
//! error.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use socket2::{Domain, Type};
use tokio::net::{TcpListener, TcpStream};

use super::balancer::{Balancer, Flow};
use super::table::Table;
use crate::model::{IpFamily, Protocol};
use crate::selection::{route, DestKind, EmptyVerdict, NodeContext};

/// How long one endpoint may take to accept before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything a connection handler reads.
#[derive(Clone)]
pub struct Shared {
    pub table: Arc<RwLock<Table>>,
    pub balancer: Arc<Balancer>,
    pub node: Arc<NodeContext>,
}

/// The address the client meant, before nftables redirected it.
fn original_dst(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    if stream.local_addr()?.is_ipv4() {
        let sin = getsockopt(stream, sockopt::OriginalDst)?;
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        Ok(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)).into())
    } else {
        let sin6 = getsockopt(stream, sockopt::Ip6tOriginalDst)?;
        let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
        Ok(SocketAddrV6::new(ip, u16::from_be(sin6.sin6_port), 0, 0).into())
    }
}

/// A TCP listener of `family` on an ephemeral port (IPv6 only for IPv6: each family's table
/// redirects to its own listener).
pub fn bind(family: IpFamily) -> std::io::Result<std::net::TcpListener> {
    let (domain, any) = match family {
        IpFamily::V4 => (Domain::IPV4, SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))),
        IpFamily::V6 => (Domain::IPV6, SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))),
    };
    let sock = socket2::Socket::new(domain, Type::STREAM, None)?;
    if family == IpFamily::V6 {
        sock.set_only_v6(true)?;
    }
    sock.bind(&any.into())?;
    sock.listen(4096)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// Whether a LoadBalancer destination accepts this source (loadBalancerSourceRanges, plus the node
/// itself and the LB IP itself).
pub fn lb_source_allowed(
    ranges: &[ipnet::IpNet],
    node: &NodeContext,
    src: IpAddr,
    lb_ip: IpAddr,
) -> bool {
    ranges.is_empty()
        || src == lb_ip
        || node.node_ips.contains(&src)
        || src.is_loopback()
        || ranges.iter().any(|r| r.contains(&src))
}

/// Closes a connection with a TCP reset, so the client sees "connection refused/reset" at once.
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Accepts connections until the task is aborted.
pub async fn serve(listener: TcpListener, shared: Shared) {
    loop {
        match listener.accept().await {
            Ok((client, peer)) => {
                let shared = shared.clone();
                tokio::spawn(async move { handle(client, peer, shared).await });
            }
            Err(e) => {
                tracing::warn!("userspace TCP accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle(mut client: TcpStream, peer: SocketAddr, shared: Shared) {
    let dst = match original_dst(&client) {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(%peer, "no original destination ({e}): not a redirected connection");
            return reset(client);
        }
    };
    let resolved = shared
        .table
        .read()
        .expect("table lock")
        .resolve(dst, Protocol::Tcp);
    let Some((entry, kind)) = resolved else {
        tracing::debug!(%peer, %dst, "no Service at this destination any more");
        return reset(client);
    };
    if kind == DestKind::LoadBalancer
        && !lb_source_allowed(&entry.svc.source_ranges, &shared.node, peer.ip(), dst.ip())
    {
        tracing::debug!(%peer, %dst, service = %entry.svc.name, "source outside loadBalancerSourceRanges");
        return drop(client);
    }
    let r = route(&entry.svc, &entry.sel, &shared.node, peer.ip(), kind);
    let maglev = entry
        .sel
        .maglev_table(r.endpoints, IpFamily::of(&peer.ip()));
    let flow = Flow {
        client: peer,
        service: dst,
    };
    let mut refused = Vec::new();
    loop {
        let Some(ep) = shared.balancer.pick(
            &entry.svc,
            r.endpoints,
            maglev.map(|t| &**t),
            flow,
            &refused,
        ) else {
            if r.empty == EmptyVerdict::Drop && refused.is_empty() {
                return drop(client);
            }
            tracing::debug!(%peer, service = %entry.svc.name, "no usable endpoint: resetting");
            return reset(client);
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(ep)).await {
            Ok(Ok(mut upstream)) => {
                let _active = shared.balancer.acquire(ep);
                let _ = upstream.set_nodelay(true);
                let _ = client.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                return;
            }
            Ok(Err(e)) => {
                tracing::info!(service = %entry.svc.name, endpoint = %ep, "endpoint refused ({e}); trying another")
            }
            Err(_) => {
                tracing::info!(service = %entry.svc.name, endpoint = %ep, "endpoint did not answer in {CONNECT_TIMEOUT:?}; trying another")
            }
        }
        refused.push(ep);
    }
}
