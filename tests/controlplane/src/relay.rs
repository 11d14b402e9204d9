//! A TCP relay between a client and the API server that a test can cut and heal: a network
//! partition between one node's agent and the control plane, while the API server itself keeps
//! running and taking writes. The listener may be bound inside another network namespace (the
//! node's), so the agent there reaches the loopback-only API server through it.
//!
//! Owns: its accept thread and the connections it relays; dropped, it closes them all.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A running relay from `listener` to `target`.
pub struct Relay {
    local: SocketAddr,
    open: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// Relays every connection accepted on `listener` to `target`.
    pub fn start(listener: TcpListener, target: SocketAddr) -> io::Result<Relay> {
        let local = listener.local_addr()?;
        let open = Arc::new(AtomicBool::new(true));
        let stopped = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (o, s, c) = (open.clone(), stopped.clone(), conns.clone());
        thread::Builder::new()
            .name("relay-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if s.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    if !o.load(Ordering::SeqCst) {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    let Ok(server) = TcpStream::connect(target) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    pipe(&client, &server, &c, &o);
                }
            })?;
        Ok(Relay {
            local,
            open,
            stopped,
            conns,
        })
    }

    /// The relay's listening address (`https://<this>` is the API server for its clients).
    pub fn addr(&self) -> SocketAddr {
        self.local
    }

    /// Cuts every relayed connection and refuses new ones until [`Relay::heal`].
    pub fn cut(&self) {
        // Under the lock [`pipe`] registers connections with: one accepted just before the cut
        // is either in the list here or sees the relay closed there, never neither.
        let mut conns = self.conns.lock().expect("relay lock");
        self.open.store(false, Ordering::SeqCst);
        for c in conns.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.cut();
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(self.local);
    }
}

/// Copies both ways between `a` and `b` on two threads, remembering both for [`Relay::cut`];
/// closes both instead when the relay was cut since `a` was accepted.
fn pipe(a: &TcpStream, b: &TcpStream, conns: &Arc<Mutex<Vec<TcpStream>>>, open: &AtomicBool) {
    let clones = (a.try_clone(), a.try_clone(), b.try_clone(), b.try_clone());
    let (Ok(a_read), Ok(a_write), Ok(b_read), Ok(b_write)) = clones else {
        return;
    };
    {
        let mut list = conns.lock().expect("relay lock");
        if !open.load(Ordering::SeqCst) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
            return;
        }
        list.retain(|c| c.peer_addr().is_ok());
        if let (Ok(x), Ok(y)) = (a.try_clone(), b.try_clone()) {
            list.push(x);
            list.push(y);
        }
    }
    copy(a_read, b_write);
    copy(b_read, a_write);
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = thread::Builder::new()
        .name("relay-copy".into())
        .spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
            let _ = from.shutdown(Shutdown::Read);
        });
}
