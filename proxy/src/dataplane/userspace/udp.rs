//! The UDP side of the userspace backend: one socket per UDP service port and destination kind
//! (nftables maps the Service address to that socket's port), a session per client with an idle
//! timeout, replies sent from the exact address the client's datagram was redirected to (IP_PKTINFO)
//! so conntrack turns them back into the Service address.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags, SockaddrIn};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use super::balancer::ActiveGuard;
use super::tcp::{lb_source_allowed, Shared};
use crate::error::DataplaneError;
use crate::model::ServicePortName;
use crate::selection::{route, DestKind};

fn recv_pktinfo(
    fd: RawFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddrV4, Option<Ipv4Addr>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(libc::in_pktinfo);
    let msg = socket::recvmsg::<SockaddrIn>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())?;
    let mut local = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::Ipv4PacketInfo(pi) = c {
            local = Some(Ipv4Addr::from(u32::from_be(pi.ipi_addr.s_addr)));
        }
    }
    let from = msg
        .address
        .ok_or_else(|| std::io::Error::other("datagram without a source address"))?;
    Ok((msg.bytes, SocketAddrV4::new(from.ip(), from.port()), local))
}

fn send_from(
    fd: RawFd,
    data: &[u8],
    to: SocketAddrV4,
    from: Option<Ipv4Addr>,
) -> std::io::Result<usize> {
    let dest = SockaddrIn::from(to);
    let pi = libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr {
            s_addr: u32::from(from.unwrap_or(Ipv4Addr::UNSPECIFIED)).to_be(),
        },
        ipi_addr: libc::in_addr { s_addr: 0 },
    };
    let with = [ControlMessage::Ipv4PacketInfo(&pi)];
    let cmsgs: &[ControlMessage] = if from.is_some() { &with } else { &[] };
    Ok(socket::sendmsg(
        fd,
        &[IoSlice::new(data)],
        cmsgs,
        MsgFlags::empty(),
        Some(&dest),
    )?)
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

type ListenerKey = (ServicePortName, DestKind);

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
        let sock = std::net::UdpSocket::bind("0.0.0.0:0")
            .map_err(|e| DataplaneError::io(format!("binding a UDP socket for {}", key.0), e))?;
        socket::setsockopt(&sock, socket::sockopt::Ipv4PacketInfo, &true)
            .map_err(|e| DataplaneError::io("setting IP_PKTINFO", e.into()))?;
        sock.set_nonblocking(true)
            .map_err(|e| DataplaneError::io("setting a UDP socket non-blocking", e))?;
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
        let mut sessions: HashMap<SocketAddrV4, Session> = HashMap::new();
        let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<(SocketAddrV4, SocketAddr)>();
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
        sessions: &mut HashMap<SocketAddrV4, Session>,
        ended: &mpsc::UnboundedSender<(SocketAddrV4, SocketAddr)>,
        data: &[u8],
        client: SocketAddrV4,
        local: Option<Ipv4Addr>,
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
        let src = std::net::IpAddr::V4(*client.ip());
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
            let Some(ep) = self.shared.balancer.pick(&entry.svc, r.endpoints, src, &[]) else {
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
        client: SocketAddrV4,
        local: Option<Ipv4Addr>,
        endpoint: SocketAddr,
        ended: mpsc::UnboundedSender<(SocketAddrV4, SocketAddr)>,
    ) -> std::io::Result<Session> {
        let upstream = Arc::new(UdpSocket::bind("0.0.0.0:0").await?);
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
