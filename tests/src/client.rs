//! Clients that talk to the echo servers through the proxy, and a tiny HTTP/1.1 GET for the agent's
//! `/healthz` and `/state`.
//!
//! Every client exists twice: `*_here` runs in the calling thread's namespace (the `probe` binary
//! uses these), and the plain name takes a [`Netns`] and runs inside it. Errors say what the network
//! did (refused, reset, timed out, closed) so tests can assert the exact failure.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use crate::netns::Netns;

/// What an echo server answered: the pod it runs in and the client address it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub pod: String,
    /// The source address as the pod saw it (shows whether the proxy masqueraded).
    pub peer: SocketAddr,
}

/// How a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("connection refused")]
    Refused,
    #[error("connection reset")]
    Reset,
    #[error("host or network unreachable")]
    Unreachable,
    #[error("timed out")]
    Timeout,
    #[error("closed before a reply")]
    Closed,
    #[error("{0}")]
    Other(String),
}

impl ClientError {
    /// An active rejection (RST or ICMP), as opposed to silence or success.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self,
            ClientError::Refused | ClientError::Reset | ClientError::Unreachable
        )
    }
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::ConnectionRefused => ClientError::Refused,
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
                ClientError::Reset
            }
            ErrorKind::TimedOut | ErrorKind::WouldBlock => ClientError::Timeout,
            ErrorKind::UnexpectedEof => ClientError::Closed,
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => ClientError::Unreachable,
            _ => ClientError::Other(e.to_string()),
        }
    }
}

/// Parses `<pod> <ip>:<port>` (with or without the trailing newline).
pub fn parse_reply(line: &str) -> Result<Reply, ClientError> {
    let bad = || {
        ClientError::Other(format!(
            "unexpected reply {line:?}, expected `<pod> <ip>:<port>`"
        ))
    };
    let (pod, peer) = line.trim_end().split_once(' ').ok_or_else(bad)?;
    Ok(Reply {
        pod: pod.to_string(),
        peer: peer.parse().map_err(|_| bad())?,
    })
}

fn run_in<T: Send>(
    ns: &Netns,
    f: impl FnOnce() -> Result<T, ClientError> + Send,
) -> Result<T, ClientError> {
    ns.run(f).map_err(|e| ClientError::Other(e.to_string()))?
}

/// A TCP connection that is kept open (for least-connection and "established connections survive").
#[derive(Debug)]
pub struct HeldConn {
    reader: BufReader<TcpStream>,
    pub reply: Reply,
}

impl HeldConn {
    /// Sends `msg` plus a newline and reads the echoed line back.
    pub fn echo(&mut self, msg: &str) -> Result<String, ClientError> {
        self.reader
            .get_mut()
            .write_all(format!("{msg}\n").as_bytes())?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(ClientError::Closed);
        }
        Ok(line.trim_end().to_string())
    }

    /// The connection still carries data both ways.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.echo("alive?"), Ok(s) if s == "alive?")
    }

    /// Closes the connection (FIN).
    pub fn close(self) {
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }
}

/// Connects and reads the greeting line, here (in the calling thread's namespace).
pub fn tcp_hold_here(addr: SocketAddr, timeout: Duration) -> Result<HeldConn, ClientError> {
    greeted(TcpStream::connect_timeout(&addr, timeout)?, timeout)
}

/// Whether this kernel has SCTP (some kernels are built without it).
pub fn sctp_supported() -> bool {
    sctp_socket(SocketAddr::from(([127, 0, 0, 1], 0))).is_ok()
}

fn sctp_socket(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::from(libc::IPPROTO_SCTP)),
    )
}

/// One SCTP request here (a one-to-one association behaves as a stream): connect, read the
/// greeting, check one echo round trip, close.
pub fn sctp_request_here(addr: SocketAddr, timeout: Duration) -> Result<Reply, ClientError> {
    let sock = sctp_socket(addr).map_err(|e| {
        ClientError::Other(format!("SCTP socket: {e} (does this kernel have SCTP?)"))
    })?;
    sock.connect_timeout(&addr.into(), timeout)?;
    request_on(greeted(TcpStream::from(sock), timeout)?)
}

/// The greeting of a fresh stream connection.
fn greeted(stream: TcpStream, timeout: Duration) -> Result<HeldConn, ClientError> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(ClientError::Closed);
    }
    let reply = parse_reply(&line)?;
    Ok(HeldConn { reader, reply })
}

/// One TCP request here: connect, read the greeting, check one echo round trip, close.
pub fn tcp_request_here(addr: SocketAddr, timeout: Duration) -> Result<Reply, ClientError> {
    request_on(tcp_hold_here(addr, timeout)?)
}

/// One TCP request here from the source address `from` (a fixed 5-tuple, for Maglev): bound
/// before `connect()`, closed with a reset so that no TIME_WAIT holds the tuple.
pub fn tcp_request_from_here(
    from: SocketAddr,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Reply, ClientError> {
    let domain = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    sock.bind(&from.into())?;
    sock.connect_timeout(&addr.into(), timeout)?;
    sock.set_linger(Some(Duration::ZERO))?;
    request_on(greeted(sock.into(), timeout)?)
}

/// [`tcp_request_from_here`] inside `ns`.
pub fn tcp_request_from(
    ns: &Netns,
    from: SocketAddr,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Reply, ClientError> {
    run_in(ns, || tcp_request_from_here(from, addr, timeout))
}

/// One UDP request from the source address `from` inside `ns` (see [`UdpSession::from_here`]).
pub fn udp_request_from(
    ns: &Netns,
    from: SocketAddr,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Reply, ClientError> {
    run_in(ns, || UdpSession::from_here(from, addr, timeout)?.request())
}

/// One echo round trip on a greeted connection, then close.
fn request_on(mut conn: HeldConn) -> Result<Reply, ClientError> {
    let echoed = conn.echo("ping")?;
    if echoed != "ping" {
        return Err(ClientError::Other(format!(
            "echo of \"ping\" came back as {echoed:?}"
        )));
    }
    let reply = conn.reply.clone();
    conn.close();
    Ok(reply)
}

/// One UDP request here: a datagram from a fresh socket, one answer expected.
pub fn udp_request_here(addr: SocketAddr, timeout: Duration) -> Result<Reply, ClientError> {
    UdpSession::here(addr, timeout)?.request()
}

/// A UDP socket kept for several requests: one flow, so one endpoint should answer all of them.
#[derive(Debug)]
pub struct UdpSession {
    sock: UdpSocket,
}

impl UdpSession {
    /// Connects a fresh socket bound to `from` to `addr` here (a fixed 5-tuple, for Maglev).
    pub fn from_here(
        from: SocketAddr,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<UdpSession, ClientError> {
        let sock = UdpSocket::bind(from)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.connect(addr)?;
        Ok(UdpSession { sock })
    }

    /// Connects a fresh socket to `addr` here (in the calling thread's namespace).
    pub fn here(addr: SocketAddr, timeout: Duration) -> Result<UdpSession, ClientError> {
        let sock = UdpSocket::bind(match addr {
            SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
            SocketAddr::V6(_) => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
        })?;
        sock.set_read_timeout(Some(timeout))?;
        sock.connect(addr)?;
        Ok(UdpSession { sock })
    }

    /// One datagram out, one answer back.
    pub fn request(&self) -> Result<Reply, ClientError> {
        self.sock.send(b"ping")?;
        let mut buf = [0u8; 2048];
        let n = self.sock.recv(&mut buf)?;
        parse_reply(&String::from_utf8_lossy(&buf[..n]))
    }
}

/// HTTP/1.1 GET here; returns the status code and the body.
pub fn http_get_here(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), ClientError> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_http(&String::from_utf8_lossy(&raw))
}

fn parse_http(text: &str) -> Result<(u16, String), ClientError> {
    let bad =
        |what: &str| ClientError::Other(format!("malformed HTTP response ({what}): {text:?}"));
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("status line"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| bad("chunked body"))?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// One TCP request from inside `ns` (see [`tcp_request_here`]).
pub fn tcp_request(ns: &Netns, addr: SocketAddr, timeout: Duration) -> Result<Reply, ClientError> {
    run_in(ns, || tcp_request_here(addr, timeout))
}

/// A held TCP connection from inside `ns` (the socket stays in `ns`). Reads time out after 5 s.
pub fn tcp_hold(ns: &Netns, addr: SocketAddr) -> Result<HeldConn, ClientError> {
    run_in(ns, || tcp_hold_here(addr, Duration::from_secs(5)))
}

/// One UDP request from inside `ns`.
pub fn udp_request(ns: &Netns, addr: SocketAddr, timeout: Duration) -> Result<Reply, ClientError> {
    run_in(ns, || udp_request_here(addr, timeout))
}

/// A UDP session from inside `ns` (the socket stays in `ns`).
pub fn udp_session(
    ns: &Netns,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<UdpSession, ClientError> {
    run_in(ns, || UdpSession::here(addr, timeout))
}

/// HTTP GET from inside `ns`.
pub fn http_get(
    ns: &Netns,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), ClientError> {
    run_in(ns, || http_get_here(addr, path, timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_garbage_does_not() {
        let r = parse_reply("pod0 10.244.200.2:40000\n").unwrap();
        assert_eq!(r.pod, "pod0");
        assert_eq!(r.peer, "10.244.200.2:40000".parse().unwrap());
        assert!(matches!(parse_reply("pod0"), Err(ClientError::Other(_))));
        assert!(matches!(
            parse_reply("pod0 nonsense"),
            Err(ClientError::Other(_))
        ));
    }

    #[test]
    fn http_plain_and_chunked_bodies() {
        let plain = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\nno";
        assert_eq!(parse_http(plain).unwrap(), (503, "no".to_string()));
        let chunked =
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_http(chunked).unwrap(), (200, "abcde".to_string()));
        assert!(parse_http("garbage").is_err());
    }
}
