//! Drains the programs' aya-log ring buffer into the `log` facade, which `tracing-subscriber`'s
//! `init()` forwards to tracing (its `tracing-log` feature), from a small thread.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use aya::Ebpf;
use aya_log::EbpfLogger;

/// Stops and joins the drain thread when dropped.
pub struct LogDrain {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LogDrain {
    /// Starts draining; `None` (with a warning) when the object has no log map.
    pub fn start(ebpf: &mut Ebpf) -> Option<LogDrain> {
        let mut logger = match EbpfLogger::init(ebpf) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("ebpf: program logs are not drained: {e}");
                return None;
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stop_thread = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("kpr-ebpf-log".into())
            .spawn(move || {
                let fd = logger.as_raw_fd();
                while !stop_thread.load(Ordering::Relaxed) {
                    let mut pfd = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd for the duration of the call.
                    let ready = unsafe { libc::poll(&mut pfd, 1, 200) };
                    if ready > 0 {
                        logger.flush();
                    }
                }
            })
            .ok()?;
        Some(LogDrain {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for LogDrain {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
