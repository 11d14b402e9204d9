//! Conntrack events as the `conntrack -E -o id` stream prints them, parsed into [`CtEvent`].
//!
//! Owns the event line format and the event stream process. The stream is the kernel's netlink
//! event multicast (NF_CONNTRACK_EVENTS), relayed by the conntrack CLI: nothing is polled.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Child, Command, Stdio};

use crate::error::DataplaneError;

/// What happened to a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtEventKind {
    New,
    Update,
    Destroy,
}

/// One conntrack event, reduced to what connection accounting needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtEvent {
    pub kind: CtEventKind,
    /// The kernel's conntrack id (stable for the life of the entry).
    pub id: u64,
    /// The conntrack mark (the target id the rule backends set).
    pub mark: u32,
    /// `tcp`, `udp`, `sctp`, ...
    pub proto: String,
    /// The reply tuple's source: the endpoint the connection was translated to.
    pub endpoint: Option<SocketAddrV4>,
    /// The TCP state, when the event names one (`ESTABLISHED`, `TIME_WAIT`, ...).
    pub tcp_state: Option<String>,
}

impl CtEvent {
    /// Whether the connection no longer counts as active after this event: destroyed, or a TCP
    /// connection that started closing (FIN seen, or reset).
    pub fn closes(&self) -> bool {
        match self.kind {
            CtEventKind::Destroy => true,
            CtEventKind::New => false,
            CtEventKind::Update => matches!(
                self.tcp_state.as_deref(),
                Some("FIN_WAIT" | "CLOSE_WAIT" | "LAST_ACK" | "TIME_WAIT" | "CLOSE")
            ),
        }
    }
}

const TCP_STATES: &[&str] = &[
    "NONE",
    "SYN_SENT",
    "SYN_RECV",
    "ESTABLISHED",
    "FIN_WAIT",
    "CLOSE_WAIT",
    "LAST_ACK",
    "TIME_WAIT",
    "CLOSE",
    "SYN_SENT2",
];

/// Parses one line of `conntrack -E -o id` output; `None` for lines that are not IPv4 events.
pub fn parse_line(line: &str) -> Option<CtEvent> {
    let mut words = line.split_whitespace();
    let kind = match words.next()? {
        "[NEW]" => CtEventKind::New,
        "[UPDATE]" => CtEventKind::Update,
        "[DESTROY]" => CtEventKind::Destroy,
        _ => return None,
    };
    let proto = words.next()?.to_string();
    let (mut id, mut mark, mut tcp_state) = (None, 0u32, None);
    let (mut srcs, mut sports) = (Vec::new(), Vec::new());
    for w in words {
        if let Some((k, v)) = w.split_once('=') {
            match k {
                "src" => srcs.push(v.parse::<Ipv4Addr>().ok()),
                "sport" => sports.push(v.parse::<u16>().ok()),
                "mark" => mark = v.parse().unwrap_or(0),
                "id" => id = v.parse::<u64>().ok(),
                _ => {}
            }
        } else if TCP_STATES.contains(&w) {
            tcp_state = Some(w.to_string());
        }
    }
    let endpoint = match (srcs.get(1), sports.get(1)) {
        (Some(Some(ip)), Some(Some(port))) => Some(SocketAddrV4::new(*ip, *port)),
        _ => None,
    };
    Some(CtEvent {
        kind,
        id: id?,
        mark,
        proto,
        endpoint,
        tcp_state,
    })
}

/// A running `conntrack -E` process in the calling thread's network namespace.
pub struct EventStream {
    child: Child,
}

/// `conntrack -E -b`: the event socket's receive buffer (the kernel caps it at
/// `net.core.rmem_max` unless the process may raise it, which the agent, with NET_ADMIN, may).
const EVENT_BUFFER_BYTES: &str = "16777216";

impl EventStream {
    /// Starts the stream; `on_event` runs on a reader thread for every parsed event. The thread
    /// ends when the process does (on drop).
    pub fn start<F>(mut on_event: F) -> Result<EventStream, DataplaneError>
    where
        F: FnMut(CtEvent) + Send + 'static,
    {
        let mut child = Command::new("conntrack")
            // A large socket buffer: a burst of short connections produces events faster than
            // one read loop drains them, and an overrun loses events (counts then drift).
            .args(["-E", "-e", "NEW,UPDATE,DESTROY", "-o", "id", "-f", "ipv4"])
            .args(["-b", EVENT_BUFFER_BYTES])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                DataplaneError::io(
                    "starting `conntrack -E` for least-connection accounting (is conntrack installed?)",
                    e,
                )
            })?;
        let stdout = child.stdout.take().expect("stdout was piped");
        let stderr = child.stderr.take().expect("stderr was piped");
        std::thread::Builder::new()
            .name("kpr-ct-stderr".into())
            .spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.starts_with("NOTICE") {
                        tracing::debug!("least-connection: conntrack -E: {line}");
                    } else {
                        // e.g. "WARNING: We have hit ENOBUFS! We are losing events."
                        tracing::warn!("least-connection: conntrack -E: {line}");
                    }
                }
            })
            .map_err(|e| DataplaneError::io("spawning the conntrack stderr reader", e))?;
        std::thread::Builder::new()
            .name("kpr-ct-events".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(ev) = parse_line(&line) {
                        on_event(ev);
                    }
                }
            })
            .map_err(|e| DataplaneError::io("spawning the conntrack event reader", e))?;
        Ok(EventStream { child })
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_new_tcp_event_with_reply_endpoint_and_mark() {
        let ev = parse_line(
            "    [NEW] tcp      6 120 SYN_SENT src=10.0.0.1 dst=10.96.0.10 sport=40000 dport=80 \
             [UNREPLIED] src=10.244.1.2 dst=10.0.0.1 sport=8080 dport=40000 mark=5 id=123456",
        )
        .expect("an event");
        assert_eq!(ev.kind, CtEventKind::New);
        assert_eq!(ev.id, 123456);
        assert_eq!(ev.mark, 5);
        assert_eq!(ev.endpoint, Some("10.244.1.2:8080".parse().unwrap()));
        assert_eq!(ev.tcp_state.as_deref(), Some("SYN_SENT"));
        assert!(!ev.closes());
    }

    #[test]
    fn time_wait_update_and_destroy_close() {
        let tw = parse_line(
            " [UPDATE] tcp      6 120 TIME_WAIT src=1.1.1.1 dst=2.2.2.2 sport=1 dport=2 \
             src=3.3.3.3 dst=1.1.1.1 sport=2 dport=1 [ASSURED] mark=7 id=9",
        )
        .unwrap();
        assert!(tw.closes());
        let d = parse_line(
            "[DESTROY] udp      17 src=1.1.1.1 dst=2.2.2.2 sport=1 dport=2 \
             src=3.3.3.3 dst=1.1.1.1 sport=2 dport=1 mark=7 id=10",
        )
        .unwrap();
        assert!(d.closes());
        assert_eq!(d.proto, "udp");
    }

    #[test]
    fn other_lines_are_ignored() {
        assert_eq!(
            parse_line("conntrack v1.4.7 (conntrack-tools): 3 flow events"),
            None
        );
        assert_eq!(parse_line(""), None);
    }
}
