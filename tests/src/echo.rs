//! Echo servers that play the pods: TCP and UDP on one port, bound inside a pod namespace, and
//! SCTP on the same port where the kernel has SCTP.
//!
//! TCP (and SCTP, a one-to-one association served as a stream): on accept, writes one line
//! `<pod-name> <peer-ip>:<peer-port>\n`, then echoes what it receives. UDP: answers each datagram with `<pod-name> <peer-ip>:<peer-port>`. A server can be
//! stopped (its port then refuses connections) and started again; it always stops on drop, closing
//! the connections it still holds, so no thread outlives the harness.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::netns::Netns;
use crate::HarnessError;

/// How often blocked server threads look at the stop flag.
const POLL: Duration = Duration::from_millis(10);

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    active: AtomicUsize,
    accepted: AtomicUsize,
    next_id: AtomicUsize,
    /// Clones of open connections, so `stop` can shut them down.
    conns: Mutex<HashMap<usize, TcpStream>>,
}

/// A running TCP+UDP echo server.
#[derive(Debug)]
pub struct EchoServer {
    name: String,
    port: u16,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl EchoServer {
    /// Binds TCP and UDP `0.0.0.0:port` inside `ns` and serves as pod `name`.
    pub fn start(ns: &Netns, name: &str, port: u16) -> Result<EchoServer, HarnessError> {
        Self::start_dual(ns, name, port, None)
    }

    /// As [`EchoServer::start`], and also on `[ip6]:port` when given (a specific IPv6 address, so
    /// IPv4 peers keep showing as IPv4).
    pub fn start_dual(
        ns: &Netns,
        name: &str,
        port: u16,
        ip6: Option<Ipv6Addr>,
    ) -> Result<EchoServer, HarnessError> {
        let mut addrs = vec![SocketAddr::from(([0, 0, 0, 0], port))];
        addrs.extend(ip6.map(|ip| SocketAddr::from((ip, port))));
        let bound = ns.run(|| -> std::io::Result<Vec<(TcpListener, UdpSocket)>> {
            addrs
                .iter()
                .map(|a| Ok((TcpListener::bind(a)?, UdpSocket::bind(a)?)))
                .collect()
        })?;
        let sctp = ns.run(|| -> std::io::Result<Vec<TcpListener>> {
            if !crate::client::sctp_supported() {
                return Ok(Vec::new());
            }
            addrs
                .iter()
                .filter(|a| a.is_ipv4())
                .map(sctp_listener)
                .collect()
        })?;
        let sockets = bound.map_err(|e| HarnessError::Io {
            what: format!(
                "binding echo server {name} on {addrs:?} in netns {}",
                ns.name()
            ),
            source: e,
        })?;
        let sctp = sctp.map_err(|e| HarnessError::Io {
            what: format!("binding SCTP echo server {name} on {addrs:?}"),
            source: e,
        })?;
        Self::serve(name, port, sockets, sctp)
    }

    fn serve(
        name: &str,
        port: u16,
        sockets: Vec<(TcpListener, UdpSocket)>,
        sctp: Vec<TcpListener>,
    ) -> Result<EchoServer, HarnessError> {
        let io = |what: &str, e| HarnessError::Io {
            what: format!("echo server {name}: {what}"),
            source: e,
        };
        let shared = Arc::new(Shared::default());
        let mut threads = Vec::new();
        for (listener, udp) in sockets {
            listener
                .set_nonblocking(true)
                .map_err(|e| io("nonblocking listener", e))?;
            udp.set_read_timeout(Some(POLL))
                .map_err(|e| io("udp timeout", e))?;
            let (tcp_shared, udp_shared) = (shared.clone(), shared.clone());
            let (tcp_name, udp_name) = (name.to_string(), name.to_string());
            threads.push(std::thread::spawn(move || {
                accept_loop(&tcp_name, &listener, &tcp_shared)
            }));
            threads.push(std::thread::spawn(move || {
                udp_loop(&udp_name, &udp, &udp_shared)
            }));
        }
        for listener in sctp {
            listener
                .set_nonblocking(true)
                .map_err(|e| io("nonblocking SCTP listener", e))?;
            let (sctp_shared, sctp_name) = (shared.clone(), name.to_string());
            threads.push(std::thread::spawn(move || {
                accept_loop(&sctp_name, &listener, &sctp_shared)
            }));
        }
        Ok(EchoServer {
            name: name.to_string(),
            port,
            shared,
            threads,
        })
    }

    /// The pod name it answers with.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// TCP connections currently open.
    pub fn active(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// TCP connections accepted since start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Stops serving: closes the listeners (the port refuses from now on) and every open connection.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for (_, conn) in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            let _ = conn.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An SCTP one-to-one listener on `addr`, as a `TcpListener` (accept, read and write are the
/// same system calls on a stream-style SCTP socket).
fn sctp_listener(addr: &SocketAddr) -> std::io::Result<TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(*addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::from(libc::IPPROTO_SCTP)),
    )?;
    sock.set_reuse_address(true)?;
    sock.bind(&(*addr).into())?;
    sock.listen(128)?;
    Ok(TcpListener::from(sock))
}

fn accept_loop(name: &str, listener: &TcpListener, shared: &Arc<Shared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                shared.active.fetch_add(1, Ordering::SeqCst);
                let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
                if let Ok(clone) = stream.try_clone() {
                    shared
                        .conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, clone);
                }
                let (shared, name) = (shared.clone(), name.to_string());
                workers.push(std::thread::spawn(move || {
                    let _ = serve_conn(&name, stream, peer, &shared);
                    shared
                        .conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                    shared.active.fetch_sub(1, Ordering::SeqCst);
                }));
                workers.retain(|w| !w.is_finished());
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(_) => std::thread::sleep(POLL),
        }
    }
    // Stop listening now, for every copy of the descriptor: a process forked by another thread
    // may hold one until its exec, and would otherwise keep accepting (then resetting) connections.
    let _ = nix::sys::socket::shutdown(listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    for w in workers {
        let _ = w.join();
    }
}

fn serve_conn(
    name: &str,
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(POLL * 5))?;
    stream.write_all(format!("{name} {peer}\n").as_bytes())?;
    let mut buf = [0u8; 4096];
    while !shared.stop.load(Ordering::SeqCst) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => stream.write_all(&buf[..n])?,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn udp_loop(name: &str, udp: &UdpSocket, shared: &Shared) {
    let mut buf = [0u8; 2048];
    while !shared.stop.load(Ordering::SeqCst) {
        if let Ok((_, peer)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(format!("{name} {peer}").as_bytes(), peer);
        }
    }
}
