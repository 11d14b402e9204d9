//! Conntrack events for connection accounting: the kernel's event multicast read over ctnetlink
//! ([`super::netlink`]), reduced to [`CtEvent`], on a reader thread ([`EventStream`]).
//!
//! Owns what an event means for a connection count (opened, still open, closing) and recovery
//! from lost events: when the socket overflows, the reader dumps the table and hands over a
//! [`CtUpdate::Snapshot`] of every entry instead, so counts are rebuilt, never left drifting.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::netlink::{CtEntry, CtSocket, EventKind};
use crate::error::DataplaneError;
use crate::model::IpFamily;

/// What happened to a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtEventKind {
    New,
    Update,
    Destroy,
}

/// `TCP_CONNTRACK_*` states from FIN_WAIT to CLOSE: the connection started closing.
const TCP_CLOSING: std::ops::RangeInclusive<u8> = 4..=8;

/// One conntrack event (or, in a snapshot, one live entry), reduced to what connection
/// accounting needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtEvent {
    pub kind: CtEventKind,
    /// The kernel's conntrack id (stable for the life of the entry).
    pub id: u32,
    /// The conntrack mark (the target id the rule backends set).
    pub mark: u32,
    /// IP protocol number.
    pub protocol: u8,
    /// The reply tuple's source: the endpoint the connection was translated to.
    pub endpoint: Option<SocketAddr>,
    /// `TCP_CONNTRACK_*`, when the entry is TCP.
    pub tcp_state: Option<u8>,
}

impl CtEvent {
    /// The event of an entry; `None` without an id (nothing to track it by).
    pub fn from_entry(kind: CtEventKind, e: &CtEntry) -> Option<CtEvent> {
        let endpoint = e.reply.map(|r| SocketAddr::new(r.src, r.sport));
        Some(CtEvent {
            kind,
            id: e.id?,
            mark: e.mark,
            protocol: e.protocol,
            endpoint,
            tcp_state: e.tcp_state,
        })
    }

    /// Whether the connection no longer counts as active after this event: destroyed, or a TCP
    /// connection that started closing (FIN seen, or reset).
    pub fn closes(&self) -> bool {
        match self.kind {
            CtEventKind::Destroy => true,
            CtEventKind::New | CtEventKind::Update => {
                self.tcp_state.is_some_and(|s| TCP_CLOSING.contains(&s))
            }
        }
    }
}

/// What the reader hands over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtUpdate {
    Event(CtEvent),
    /// Events were lost (the socket buffer overflowed): every entry in the table now, each as a
    /// `New` event with its current TCP state. Replaces what the events had built.
    Snapshot(Vec<CtEvent>),
}

/// The event socket's receive buffer: a burst of short connections produces events faster than
/// one read loop drains them.
const EVENT_BUFFER_BYTES: usize = 16 << 20;
/// How often a waiting reader checks whether it should stop.
const TICK: Duration = Duration::from_millis(200);

/// A reader thread on the conntrack event multicast of the network namespace it was started in.
pub struct EventStream {
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl EventStream {
    /// Subscribes in the calling thread's network namespace; `on_update` runs on the reader
    /// thread for every event (and for every snapshot after lost events). The thread ends
    /// when the stream is dropped.
    pub fn start<F>(mut on_update: F) -> Result<EventStream, DataplaneError>
    where
        F: FnMut(CtUpdate) + Send + 'static,
    {
        let mut events = CtSocket::subscribe(EVENT_BUFFER_BYTES, TICK)
            .map_err(|e| DataplaneError::io("subscribing to conntrack events over netlink", e))?;
        let mut requests = CtSocket::open().map_err(|e| {
            DataplaneError::io("opening a conntrack netlink socket for table dumps", e)
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let reader = std::thread::Builder::new()
            .name("kpr-ct-events".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    let read = events.recv_events(|kind, entry| {
                        let kind = match kind {
                            EventKind::New => CtEventKind::New,
                            EventKind::Update => CtEventKind::Update,
                            EventKind::Destroy => CtEventKind::Destroy,
                        };
                        if let Some(ev) = CtEvent::from_entry(kind, &entry) {
                            on_update(CtUpdate::Event(ev));
                        }
                    });
                    match read {
                        Ok(()) => {}
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock
                                    | std::io::ErrorKind::TimedOut
                                    | std::io::ErrorKind::Interrupted
                            ) => {}
                        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                            tracing::warn!(
                                "least-connection: conntrack events were lost (socket buffer \
                                 full); recounting from a table dump"
                            );
                            let dumped: std::io::Result<Vec<CtEvent>> =
                                IpFamily::ALL
                                    .into_iter()
                                    .map(|f| requests.dump(f))
                                    .try_fold(Vec::new(), |mut all, entries| {
                                        all.extend(entries?.iter().filter_map(|e| {
                                            CtEvent::from_entry(CtEventKind::New, e)
                                        }));
                                        Ok(all)
                                    });
                            match dumped {
                                Ok(all) => on_update(CtUpdate::Snapshot(all)),
                                Err(e) => tracing::error!(
                                    "least-connection: dumping the conntrack table failed: {e}"
                                ),
                            }
                        }
                        Err(e) => {
                            tracing::error!(
                                "least-connection: reading conntrack events failed, counts stop \
                                 following connections: {e}"
                            );
                            return;
                        }
                    }
                }
            })
            .map_err(|e| DataplaneError::io("spawning the conntrack event reader", e))?;
        Ok(EventStream {
            stop,
            reader: Some(reader),
        })
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: CtEventKind, tcp_state: Option<u8>) -> CtEvent {
        CtEvent {
            kind,
            id: 9,
            mark: 7,
            protocol: 6,
            endpoint: Some("10.244.1.2:8080".parse().unwrap()),
            tcp_state,
        }
    }

    #[test]
    fn closing_tcp_states_and_destroy_close_and_the_rest_do_not() {
        // SYN_SENT, ESTABLISHED
        assert!(!ev(CtEventKind::New, Some(1)).closes());
        assert!(!ev(CtEventKind::Update, Some(3)).closes());
        // FIN_WAIT, TIME_WAIT, CLOSE
        for s in [4, 7, 8] {
            assert!(ev(CtEventKind::Update, Some(s)).closes(), "state {s}");
        }
        assert!(ev(CtEventKind::Destroy, None).closes());
        // UDP updates carry no TCP state and keep the flow open.
        assert!(!ev(CtEventKind::Update, None).closes());
    }
}
