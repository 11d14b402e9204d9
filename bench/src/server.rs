//! The pods' servers for the benchmark: the harness's echo protocol (greeting line
//! `<pod> <peer-ip>:<peer-port>`, then echo) on a blocking accept loop with TCP_NODELAY, so a
//! connection is served the moment it arrives (the harness's echo server polls its listener every
//! 10 ms, which would hide every dataplane difference under that sleep).
//!
//! Owns its listener and connection threads; dropping it stops accepting, closes the connections
//! it still holds and joins the accept thread.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::Context as _;
use kpr_tests::Netns;

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    next: AtomicUsize,
    conns: Mutex<HashMap<usize, TcpStream>>,
}

/// One pod's server.
pub struct Server {
    /// A handle on the listening socket, to wake the blocked accept on drop.
    listener: TcpListener,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `addr` inside `ns` and answers as pod `name`.
    pub fn start(ns: &Netns, name: &str, addr: SocketAddr) -> anyhow::Result<Server> {
        let listener = ns.run(|| TcpListener::bind(addr))?.with_context(|| {
            format!(
                "binding the bench server {name} on {addr} in netns {}",
                ns.name()
            )
        })?;
        let handle = listener
            .try_clone()
            .context("duplicating the bench listener")?;
        let shared = Arc::new(Shared::default());
        let (s, name) = (shared.clone(), name.to_string());
        let accept = std::thread::spawn(move || accept_loop(&name, &listener, &s));
        Ok(Server {
            listener: handle,
            shared,
            accept: Some(accept),
        })
    }
}

fn accept_loop(name: &str, listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            Err(_) => break,
        };
        let id = shared.next.fetch_add(1, Ordering::SeqCst);
        if let Ok(clone) = stream.try_clone() {
            shared
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, clone);
        }
        let (shared, name) = (shared.clone(), name.to_string());
        std::thread::spawn(move || {
            let _ = serve(&name, stream);
            shared
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }
}

fn serve(name: &str, mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr()?;
    stream.write_all(format!("{name} {peer}\n").as_bytes())?;
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf)? {
            0 => return Ok(()),
            n => stream.write_all(&buf[..n])?,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
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
        // shutdown(2) on a listening socket makes the blocked accept(2) return EINVAL.
        // SAFETY: a plain syscall on a descriptor this struct owns.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}
