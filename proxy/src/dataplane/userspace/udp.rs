//! The UDP side of the userspace backend: one socket per UDP service port and destination kind
//! (nftables maps the Service address to that socket's port), a session per client with an idle
//! timeout, replies sent from the exact address the client's datagram was redirected to (IP_PKTINFO)
//! so conntrack turns them back into the Service address.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags, SockaddrStorage};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use super::balancer::{ActiveGuard, Flow};
use super::tcp::{lb_source_allowed, Shared};
use crate::error::DataplaneError;
use crate::model::{IpFamily, ServicePortName};
use crate::selection::{route, DestKind};

/// Receives one datagram with the local address it was sent to (the address nftables redirected
/// it to), from an IPv4 socket with IP_PKTINFO or an IPv6 one with IPV6_RECVPKTINFO.
fn recv_pktinfo(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr, Option<IpAddr>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(libc::in6_pktinfo);
    let msg = socket::recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())?;
    let mut local = None;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(pi) => {
                local = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(pi.ipi_addr.s_addr))));
            }
            ControlMessageOwned::Ipv6PacketInfo(pi) => {
                local = Some(IpAddr::V6(Ipv6Addr::from(pi.ipi6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    let from = msg
        .address
        .and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| SocketAddr::V4((*v4).into()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into())))
        })
        .ok_or_else(|| std::io::Error::other("datagram without a source address"))?;
    Ok((msg.bytes, from, local))
}

/// Sends `data` to `to` from the local address `from` (the one the client's datagram arrived
/// at), so conntrack turns the reply back into the Service address.
fn send_from(
    fd: RawFd,
    data: &[u8],
    to: SocketAddr,
    from: Option<IpAddr>,
) -> std::io::Result<usize> {
    let iov = [IoSlice::new(data)];
    // The source address in the family's packet-info message; none when there is no address of
    // the destination's family to reply from.
    let pi4 = match (to, from) {
        (SocketAddr::V4(_), Some(IpAddr::V4(from))) => Some(libc::in_pktinfo {
            ipi_ifindex: 0,
            ipi_spec_dst: libc::in_addr {
                s_addr: u32::from(from).to_be(),
            },
            ipi_addr: libc::in_addr { s_addr: 0 },
        }),
        _ => None,
    };
    let pi6 = match (to, from) {
        (SocketAddr::V6(_), Some(IpAddr::V6(from))) => Some(libc::in6_pktinfo {
            ipi6_addr: libc::in6_addr {
                s6_addr: from.octets(),
            },
            ipi6_ifindex: 0,
        }),
        _ => None,
    };
    let c4 = pi4.as_ref().map(ControlMessage::Ipv4PacketInfo);
    let c6 = pi6.as_ref().map(ControlMessage::Ipv6PacketInfo);
    let cmsg: &[ControlMessage] = match (&c4, &c6) {
        (Some(c), _) | (_, Some(c)) => std::slice::from_ref(c),
        _ => &[],
    };
    let dest = SockaddrStorage::from(to);
    Ok(socket::sendmsg(
        fd,
        &iov,
        cmsg,
        MsgFlags::empty(),
        Some(&dest),
    )?)
}

/// A UDP socket of `family` on an ephemeral port that reports each datagram's local address.
fn bind_listener(family: IpFamily) -> std::io::Result<std::net::UdpSocket> {
    let sock = match family {
        IpFamily::V4 => {
            let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
            socket::setsockopt(&sock, socket::sockopt::Ipv4PacketInfo, &true)?;
            sock
        }
        IpFamily::V6 => {
            let sock = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None)?;
            sock.set_only_v6(true)?;
            sock.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)).into())?;
            let sock = std::net::UdpSocket::from(sock);
            socket::setsockopt(&sock, socket::sockopt::Ipv6RecvPacketInfo, &true)?;
            sock
        }
    };
    sock.set_nonblocking(true)?;
    Ok(sock)
}

struct Session {
    upstream: Arc<UdpSocket>,
    endpoint: SocketAddr,
    last: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
    _active: ActiveGuard,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A service port's destination kind in one family: each has its own socket, which nftables
/// redirects that family's datagrams to.
type ListenerKey = (ServicePortName, DestKind, IpFamily);

/// The UDP sockets of every UDP service port.
pub struct UdpListeners {
    rt: tokio::runtime::Handle,
    shared: Shared,
    idle: Duration,
    epoch: Instant,
    sockets: HashMap<ListenerKey, (u16, tokio::task::JoinHandle<()>)>,
}

impl Drop for UdpListeners {
    fn drop(&mut self) {
        for (_, task) in self.sockets.values() {
            task.abort();
        }
    }
}

impl UdpListeners {
    pub fn new(rt: tokio::runtime::Handle, shared: Shared, idle: Duration) -> Self {
        UdpListeners {
            rt,
            shared,
            idle,
            epoch: Instant::now(),
            sockets: HashMap::new(),
        }
    }

    /// The port of the socket serving `key`, opening it when it does not exist yet.
    pub fn ensure(&mut self, key: ListenerKey) -> Result<u16, DataplaneError> {
        if let Some((port, _)) = self.sockets.get(&key) {
            return Ok(*port);
        }
        let sock = bind_listener(key.2).map_err(|e| {
            DataplaneError::io(format!("opening an {} UDP socket for {}", key.2, key.0), e)
        })?;
        let port = sock
            .local_addr()
            .map_err(|e| DataplaneError::io("reading a UDP socket's port", e))?
            .port();
        let _guard = self.rt.enter();
        let sock = Arc::new(
            UdpSocket::from_std(sock)
                .map_err(|e| DataplaneError::io("registering a UDP socket", e))?,
        );
        let ctx = ListenerCtx {
            sock,
            key: key.clone(),
            shared: self.shared.clone(),
            idle: self.idle,
            epoch: self.epoch,
        };
        let task = self.rt.spawn(ctx.serve());
        self.sockets.insert(key, (port, task));
        Ok(port)
    }

    /// The ports of the open sockets.
    pub fn ports(&self) -> Vec<u16> {
        self.sockets.values().map(|(port, _)| *port).collect()
    }

    /// Closes the sockets of keys not kept.
    pub fn retain(&mut self, keep: impl Fn(&ListenerKey) -> bool) {
        self.sockets.retain(|k, (_, task)| {
            let keep = keep(k);
            if !keep {
                task.abort();
            }
            keep
        });
    }
}

/// The Service address a datagram of `kind` was sent to, for its Maglev flow. nftables redirected
/// it to this socket, so the datagram no longer carries it: a listener serves one kind of one
/// family, whose address is the port's clusterIP of that family (or its first externalIP / LB
/// IP of that family: a Service with several of those hashes all of them as the first); a
/// nodePort's is the node address the datagram arrived at (`local`).
fn service_address(
    svc: &crate::model::ServicePort,
    kind: DestKind,
    family: IpFamily,
    local: Option<IpAddr>,
) -> SocketAddr {
    let of_family = |ips: &[IpAddr]| ips.iter().copied().find(|ip| IpFamily::of(ip) == family);
    let ip = match kind {
        DestKind::ClusterIp => of_family(&svc.cluster_ips),
        DestKind::ExternalIp => of_family(&svc.external_ips),
        DestKind::LoadBalancer => of_family(&svc.load_balancer_ips),
        DestKind::NodePort => local,
    };
    let port = if kind == DestKind::NodePort {
        svc.node_port
    } else {
        svc.port
    };
    let unspecified = match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip.unwrap_or(unspecified), port)
}

struct ListenerCtx {
    sock: Arc<UdpSocket>,
    key: ListenerKey,
    shared: Shared,
    idle: Duration,
    epoch: Instant,
}

impl ListenerCtx {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    async fn serve(self) {
        let mut sessions: HashMap<SocketAddr, Session> = HashMap::new();
        let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<(SocketAddr, SocketAddr)>();
        let mut buf = vec![0u8; 65536];
        let fd = self.sock.as_raw_fd();
        loop {
            tokio::select! {
                r = self.sock.async_io(Interest::READABLE, || recv_pktinfo(fd, &mut buf)) => match r {
                    Ok((n, client, local)) => self.datagram(&mut sessions, &ended_tx, &buf[..n], client, local).await,
                    Err(e) => tracing::debug!(service = %self.key.0, "UDP receive failed: {e}"),
                },
                Some((client, endpoint)) = ended_rx.recv() => {
                    if sessions.get(&client).is_some_and(|s| s.endpoint == endpoint) {
                        sessions.remove(&client);
                    }
                }
            }
        }
    }

    async fn datagram(
        &self,
        sessions: &mut HashMap<SocketAddr, Session>,
        ended: &mpsc::UnboundedSender<(SocketAddr, SocketAddr)>,
        data: &[u8],
        client: SocketAddr,
        local: Option<IpAddr>,
    ) {
        let Some(entry) = self
            .shared
            .table
            .read()
            .expect("table lock")
            .get(&self.key.0)
        else {
            return;
        };
        let kind = self.key.1;
        let src = client.ip();
        if kind == DestKind::LoadBalancer
            && !entry
                .svc
                .load_balancer_ips
                .iter()
                .any(|lb| lb_source_allowed(&entry.svc.source_ranges, &self.shared.node, src, *lb))
        {
            return;
        }
        let r = route(&entry.svc, &entry.sel, &self.shared.node, src, kind);
        let current = sessions
            .get(&client)
            .is_some_and(|s| r.endpoints.iter().any(|e| e.socket_addr() == s.endpoint));
        if !current {
            sessions.remove(&client);
            let family = IpFamily::of(&src);
            let maglev = entry.sel.maglev_table(r.endpoints, family);
            let flow = Flow {
                client,
                service: service_address(&entry.svc, kind, family, local),
            };
            let pick =
                self.shared
                    .balancer
                    .pick(&entry.svc, r.endpoints, maglev.map(|t| &**t), flow, &[]);
            let Some(ep) = pick else {
                return;
            };
            match self.open_session(client, local, ep, ended.clone()).await {
                Ok(s) => {
                    sessions.insert(client, s);
                }
                Err(e) => {
                    tracing::warn!(service = %entry.svc.name, endpoint = %ep, "cannot open a UDP session: {e}");
                    return;
                }
            }
        }
        let s = sessions.get(&client).expect("inserted above");
        s.last.store(self.now_ms(), Ordering::Relaxed);
        if let Err(e) = s.upstream.send(data).await {
            tracing::debug!(endpoint = %s.endpoint, "UDP send failed: {e}");
            sessions.remove(&client);
        }
    }

    async fn open_session(
        &self,
        client: SocketAddr,
        local: Option<IpAddr>,
        endpoint: SocketAddr,
        ended: mpsc::UnboundedSender<(SocketAddr, SocketAddr)>,
    ) -> std::io::Result<Session> {
        let any: SocketAddr = match endpoint {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let upstream = Arc::new(UdpSocket::bind(any).await?);
        upstream.connect(endpoint).await?;
        let last = Arc::new(AtomicU64::new(self.now_ms()));
        let (up, listener, idle, epoch, l) = (
            upstream.clone(),
            self.sock.clone(),
            self.idle,
            self.epoch,
            last.clone(),
        );
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            loop {
                match tokio::time::timeout(idle, up.recv(&mut buf)).await {
                    Ok(Ok(n)) => {
                        l.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                        let fd = listener.as_raw_fd();
                        let _ = listener
                            .async_io(Interest::WRITABLE, || {
                                send_from(fd, &buf[..n], client, local)
                            })
                            .await;
                    }
                    Ok(Err(_)) => break,
                    Err(_)
                        if (epoch.elapsed().as_millis() as u64)
                            .saturating_sub(l.load(Ordering::Relaxed))
                            < idle.as_millis() as u64 => {}
                    Err(_) => break,
                }
            }
            let _ = ended.send((client, endpoint));
        });
        Ok(Session {
            upstream,
            endpoint,
            last,
            task,
            _active: self.shared.balancer.acquire(endpoint),
        })
    }
}
