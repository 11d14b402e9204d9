//! `cargo xtask load`: the load client of the chaos scenarios (`cargo xtask cluster chaos`). Runs
//! in whatever network namespace it is started in (a pod's, a node's, the cluster network's hub)
//! against agnhost `netexec` servers behind a Service, until a stop file appears:
//! - a steady rate of new TCP connections per target (HTTP `GET /hostname`, `Connection: close`);
//! - long-lived TCP connections, one HTTP/1.1 keep-alive request every interval on each;
//! - UDP request/response flows (netexec's UDP `hostname` command), one request every interval
//!   from one socket, so each flow is one conntrack entry as a real client's is.
//!
//! Counts, per target and kind, failed connects, connections broken once established (reset or
//! closed), timeouts, and the longest gap between two answers of a flow; remembers which server
//! (its hostname: the Pod's name) answered first and last, and when, so the caller can tell when
//! a removed endpoint stopped being chosen. Prints one JSON report on stdout.
//!
//! Only std: threads, blocking sockets and timeouts; no runtime, so its timings are the
//! kernel's and the run's own.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::{json, Value};

/// How long a connect, a request or a UDP reply may take before it counts as a timeout.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How many failure events a kind keeps with their time (the counts are complete).
const KEPT_EVENTS: usize = 200;

#[derive(Debug, Args, Clone)]
pub struct LoadArgs {
    /// A target: `NAME=TCP_ADDR,UDP_ADDR` (e.g. `clusterip=10.96.0.20:80,10.96.0.20:81`);
    /// repeatable.
    #[arg(long = "target", required = true)]
    pub targets: Vec<String>,
    /// New TCP connections per second, per target.
    #[arg(long, default_value_t = 25.0)]
    pub rate: f64,
    /// Long-lived TCP connections per target.
    #[arg(long, default_value_t = 2)]
    pub long: usize,
    /// UDP flows per target.
    #[arg(long, default_value_t = 1)]
    pub udp: usize,
    /// Milliseconds between two requests of a long-lived connection or a UDP flow.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
    /// Stop when this file exists.
    #[arg(long)]
    pub stop_file: PathBuf,
    /// Stop after this many seconds at the latest.
    #[arg(long, default_value_t = 900)]
    pub max_seconds: u64,
    /// Who runs this client (copied into the report).
    #[arg(long, default_value = "client")]
    pub label: String,
    /// Before counting, wait up to this many seconds until every target answers once over TCP
    /// and UDP (0: count from the first attempt). A Deployment's `rollout status` returns when
    /// its Pods are available, before the EndpointSlice change has reached every node's proxy:
    /// a load started then measures that propagation (refusals for "no endpoints"), not the
    /// disruption under test.
    #[arg(long, default_value_t = 30)]
    pub warmup_seconds: u64,
    /// Created once the warm-up is over and counting starts (for a runner that waits on it).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
}

/// Milliseconds since the epoch: the clients and the scenario runner share this machine's clock.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One target's addresses.
#[derive(Debug, Clone)]
struct Target {
    name: String,
    tcp: SocketAddr,
    udp: SocketAddr,
}

fn parse_target(spec: &str) -> anyhow::Result<Target> {
    let (name, addrs) = spec
        .split_once('=')
        .with_context(|| format!("--target {spec:?}: expected NAME=TCP_ADDR,UDP_ADDR"))?;
    let (tcp, udp) = addrs
        .split_once(',')
        .with_context(|| format!("--target {spec:?}: expected NAME=TCP_ADDR,UDP_ADDR"))?;
    Ok(Target {
        name: name.to_string(),
        tcp: tcp.parse().with_context(|| format!("--target {spec:?}"))?,
        udp: udp.parse().with_context(|| format!("--target {spec:?}"))?,
    })
}

/// Why one exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// The connection was not established (refused, unreachable, no answer to the SYN).
    Connect(String),
    /// Established, then reset or closed before the answer.
    Broken(String),
    /// Established, no answer in time.
    Timeout,
}

impl Failure {
    fn describe(&self) -> String {
        match self {
            Failure::Connect(e) => format!("connect: {e}"),
            Failure::Broken(e) => format!("broken: {e}"),
            Failure::Timeout => "timeout".into(),
        }
    }
}

/// The counts of one kind of flow to one target.
#[derive(Debug, Default)]
struct Tally {
    attempts: u64,
    ok: u64,
    connect_failed: u64,
    broken: u64,
    timeouts: u64,
    longest_gap_ms: u64,
    /// hostname -> (answers, first, last) in unix ms.
    answered_by: BTreeMap<String, (u64, u64, u64)>,
    /// (unix ms, what, the server that answered last on this flow, if known).
    events: Vec<(u64, String, String)>,
}

impl Tally {
    fn answered(&mut self, hostname: &str) {
        self.attempts += 1;
        self.ok += 1;
        let now = unix_ms();
        let entry = self
            .answered_by
            .entry(hostname.to_string())
            .or_insert((0, now, now));
        entry.0 += 1;
        entry.2 = now;
    }

    fn failed(&mut self, failure: &Failure, last_server: &str) {
        self.attempts += 1;
        match failure {
            Failure::Connect(_) => self.connect_failed += 1,
            Failure::Broken(_) => self.broken += 1,
            Failure::Timeout => self.timeouts += 1,
        }
        if self.events.len() < KEPT_EVENTS {
            self.events
                .push((unix_ms(), failure.describe(), last_server.to_string()));
        }
    }

    fn gap(&mut self, gap: Duration) {
        self.longest_gap_ms = self.longest_gap_ms.max(gap.as_millis() as u64);
    }

    fn to_json(&self) -> Value {
        json!({
            "attempts": self.attempts,
            "ok": self.ok,
            "connect_failed": self.connect_failed,
            "broken": self.broken,
            "timeouts": self.timeouts,
            "longest_gap_ms": self.longest_gap_ms,
            "answered_by": self.answered_by.iter().map(|(host, (n, first, last))| {
                (host.clone(), json!({"answers": n, "first_ms": first, "last_ms": last}))
            }).collect::<serde_json::Map<_, _>>(),
            "events": self.events.iter().map(|(t, what, server)| {
                json!({"at_ms": t, "what": what, "last_server": server})
            }).collect::<Vec<_>>(),
        })
    }
}

type Shared = Arc<Mutex<Tally>>;

/// The request of a new connection, or of a keep-alive one.
fn request(keep_alive: bool) -> &'static [u8] {
    if keep_alive {
        b"GET /hostname HTTP/1.1\r\nHost: load\r\n\r\n"
    } else {
        b"GET /hostname HTTP/1.1\r\nHost: load\r\nConnection: close\r\n\r\n"
    }
}

fn io_failure(e: &std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Failure::Timeout,
        _ => Failure::Broken(e.kind().to_string()),
    }
}

fn connect(addr: SocketAddr) -> Result<TcpStream, Failure> {
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut => Failure::Connect("timed out".into()),
        kind => Failure::Connect(kind.to_string()),
    })?;
    let _ = stream.set_read_timeout(Some(TIMEOUT));
    let _ = stream.set_write_timeout(Some(TIMEOUT));
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Reads one HTTP response (status line, headers, a Content-Length body) and returns its body.
fn read_response(reader: &mut impl BufRead) -> Result<String, Failure> {
    let mut line = String::new();
    let mut content_length = None;
    let mut first = true;
    loop {
        line.clear();
        let n = reader.read_line(&mut line).map_err(|e| io_failure(&e))?;
        if n == 0 {
            return Err(Failure::Broken("closed before the answer".into()));
        }
        if first {
            if !line.starts_with("HTTP/1.1 200") {
                return Err(Failure::Broken(format!("status {:?}", line.trim())));
            }
            first = false;
            continue;
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let len = content_length.ok_or_else(|| Failure::Broken("no Content-Length".into()))?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).map_err(|e| io_failure(&e))?;
    Ok(String::from_utf8_lossy(&body).trim().to_string())
}

/// One new connection: connect, ask, read the answer, close.
fn new_connection(addr: SocketAddr) -> Result<String, Failure> {
    let mut stream = connect(addr)?;
    stream
        .write_all(request(false))
        .map_err(|e| io_failure(&e))?;
    let mut reader = BufReader::new(stream);
    read_response(&mut reader)
}

/// New connections to `target` at `rate` a second until `stop`; each in a thread of its own so a
/// slow one does not delay the next.
fn new_connections(target: Target, rate: f64, tally: Shared, stop: Arc<AtomicBool>) {
    let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let start = Instant::now();
    let last_ok = Arc::new(Mutex::new(Instant::now()));
    let mut in_flight: Vec<JoinHandle<()>> = Vec::new();
    let mut n: u32 = 0;
    while !stop.load(Ordering::SeqCst) {
        let tally = tally.clone();
        let last_ok = last_ok.clone();
        let addr = target.tcp;
        in_flight.push(std::thread::spawn(move || {
            let result = new_connection(addr);
            let mut tally = tally.lock().unwrap();
            match result {
                Ok(hostname) => {
                    let mut last = last_ok.lock().unwrap();
                    tally.gap(last.elapsed());
                    *last = Instant::now();
                    tally.answered(&hostname);
                }
                Err(failure) => tally.failed(&failure, ""),
            }
        }));
        in_flight.retain(|h| !h.is_finished());
        n += 1;
        let next = start + period * n;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    for h in in_flight {
        let _ = h.join();
    }
    let mut tally = tally.lock().unwrap();
    let gap = last_ok.lock().unwrap().elapsed();
    tally.gap(gap);
}

/// One long-lived connection (reconnected when it breaks) with a request every `interval`.
fn long_lived(target: Target, interval: Duration, tally: Shared, stop: Arc<AtomicBool>) {
    let mut last_ok = Instant::now();
    let mut server = String::new();
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        next += interval;
        if conn.is_none() {
            match connect(target.tcp).and_then(|s| {
                let reader = s.try_clone().map_err(|e| Failure::Connect(e.to_string()))?;
                Ok((s, BufReader::new(reader)))
            }) {
                Ok(c) => conn = Some(c),
                Err(failure) => {
                    tally.lock().unwrap().failed(&failure, &server);
                    continue;
                }
            }
        }
        let (stream, reader) = conn.as_mut().expect("connected above");
        let result = stream
            .write_all(request(true))
            .map_err(|e| io_failure(&e))
            .and_then(|()| read_response(reader));
        let mut tally = tally.lock().unwrap();
        match result {
            Ok(hostname) => {
                tally.gap(last_ok.elapsed());
                last_ok = Instant::now();
                tally.answered(&hostname);
                server = hostname;
            }
            Err(failure) => {
                tally.failed(&failure, &server);
                conn = None;
            }
        }
        // A request that waited for its timeout is followed at once by the next.
        if next < Instant::now() {
            next = Instant::now();
        }
    }
    tally.lock().unwrap().gap(last_ok.elapsed());
}

/// One UDP flow: one socket, a `hostname` request every `interval`, the answer awaited; the
/// socket is connected again after an error that is not a timeout.
fn udp_flow(target: Target, interval: Duration, tally: Shared, stop: Arc<AtomicBool>) {
    // A refused connect is tried again every interval, each try counted: one refusal must not
    // leave the flow empty for the rest of the run.
    let socket = loop {
        match connected_udp(target.udp) {
            Ok(s) => break s,
            Err(e) => {
                tally
                    .lock()
                    .unwrap()
                    .failed(&Failure::Connect(e.to_string()), "");
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(interval);
            }
        }
    };
    let _ = socket.set_read_timeout(Some(TIMEOUT.min(interval * 10)));
    let mut last_ok = Instant::now();
    let mut server = String::new();
    let mut next = Instant::now();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::SeqCst) {
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        next += interval;
        let result = socket
            .send(b"hostname")
            .and_then(|_| socket.recv(&mut buf))
            .map(|n| String::from_utf8_lossy(&buf[..n]).trim().to_string());
        let mut tally = tally.lock().unwrap();
        match result {
            Ok(hostname) => {
                tally.gap(last_ok.elapsed());
                last_ok = Instant::now();
                tally.answered(&hostname);
                server = hostname;
            }
            // ICMP port unreachable comes back as a refused receive.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                tally.failed(&Failure::Connect("refused".into()), &server)
            }
            Err(e) => {
                tally.failed(&io_failure(&e), &server);
                // As an application does when its socket fails (not on a mere timeout): connect
                // again, which the eBPF socket program balances anew. A socket kpr destroyed
                // because its endpoint left (ECONNABORTED, then EDESTADDRREQ) needs it.
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    let _ = socket.connect(target.udp);
                }
            }
        }
        if next < Instant::now() {
            next = Instant::now();
        }
    }
    tally.lock().unwrap().gap(last_ok.elapsed());
}

/// A UDP socket of `addr`'s family on an ephemeral port, connected to `addr`.
fn connected_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(addr)?;
    Ok(socket)
}

/// One UDP request to `addr` and its answer.
fn udp_request(addr: SocketAddr) -> std::io::Result<String> {
    let socket = connected_udp(addr)?;
    socket.set_read_timeout(Some(Duration::from_millis(200)))?;
    socket.send(b"hostname")?;
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// Waits until every target has answered once over TCP and over UDP, for at most `limit`; the
/// milliseconds it took. Fails naming the first target that never answered.
fn warm_up(targets: &[Target], limit: Duration) -> anyhow::Result<u64> {
    let start = Instant::now();
    if limit.is_zero() {
        return Ok(0);
    }
    for t in targets {
        loop {
            let tcp = new_connection(t.tcp).map_err(|f| format!("TCP {}: {}", t.tcp, f.describe()));
            let Err(last) =
                tcp.and_then(|_| udp_request(t.udp).map_err(|e| format!("UDP {}: {e}", t.udp)))
            else {
                break;
            };
            if start.elapsed() > limit {
                bail!(
                    "target {} did not answer within {} s before the load (last: {last})",
                    t.name,
                    limit.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(start.elapsed().as_millis() as u64)
}

pub fn run(args: &LoadArgs) -> anyhow::Result<()> {
    let report = run_load(args)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Runs the load until the stop file appears; the report.
pub fn run_load(args: &LoadArgs) -> anyhow::Result<Value> {
    let targets = args
        .targets
        .iter()
        .map(|t| parse_target(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.interval_ms == 0 {
        bail!("--interval-ms must be positive");
    }
    let interval = Duration::from_millis(args.interval_ms);
    let warmup_ms = warm_up(&targets, Duration::from_secs(args.warmup_seconds))?;
    if let Some(ready) = &args.ready_file {
        std::fs::write(ready, "").with_context(|| format!("creating {}", ready.display()))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let started_ms = unix_ms();
    let mut threads = Vec::new();
    let mut tallies = Vec::new();
    for target in &targets {
        let new: Shared = Arc::default();
        let long: Shared = Arc::default();
        let udp: Shared = Arc::default();
        if args.rate > 0.0 {
            let (t, tally, stop, rate) = (target.clone(), new.clone(), stop.clone(), args.rate);
            threads.push(std::thread::spawn(move || {
                new_connections(t, rate, tally, stop)
            }));
        }
        for _ in 0..args.long {
            let (t, tally, stop) = (target.clone(), long.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                long_lived(t, interval, tally, stop)
            }));
        }
        for _ in 0..args.udp {
            let (t, tally, stop) = (target.clone(), udp.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                udp_flow(t, interval, tally, stop)
            }));
        }
        tallies.push((target.clone(), new, long, udp));
    }
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    while !args.stop_file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let stopped_ms = unix_ms();
    for t in threads {
        let _ = t.join();
    }
    let targets_json: Vec<Value> = tallies
        .iter()
        .map(|(target, new, long, udp)| {
            json!({
                "name": target.name,
                "tcp": target.tcp.to_string(),
                "udp": target.udp.to_string(),
                "new": new.lock().unwrap().to_json(),
                "long": long.lock().unwrap().to_json(),
                "udp_flows": udp.lock().unwrap().to_json(),
            })
        })
        .collect();
    Ok(json!({
        "label": args.label,
        "warmup_ms": warmup_ms,
        "started_ms": started_ms,
        "stopped_ms": stopped_ms,
        "rate": args.rate,
        "long": args.long,
        "udp": args.udp,
        "interval_ms": args.interval_ms,
        "targets": targets_json,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn targets_are_a_name_and_two_addresses() {
        let t = parse_target("clusterip=10.96.0.20:80,10.96.0.20:81").unwrap();
        assert_eq!(t.name, "clusterip");
        assert_eq!(t.tcp, "10.96.0.20:80".parse().unwrap());
        assert_eq!(t.udp, "10.96.0.20:81".parse().unwrap());
        assert!(parse_target("clusterip=10.96.0.20:80").is_err());
    }

    #[test]
    fn responses_are_read_by_their_content_length_and_failures_named() {
        let mut ok = BufReader::new(&b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nbe-1\nrest"[..]);
        assert_eq!(read_response(&mut ok).unwrap(), "be-1");
        let mut closed = BufReader::new(&b"HTTP/1.1 200 OK\r\n"[..]);
        assert!(matches!(
            read_response(&mut closed),
            Err(Failure::Broken(_))
        ));
        let mut error = BufReader::new(&b"HTTP/1.1 503 Unavailable\r\n\r\n"[..]);
        assert!(matches!(read_response(&mut error), Err(Failure::Broken(_))));
    }

    /// A loopback HTTP server answering keep-alive requests with its name, and the load against
    /// it: every exchange answered, by that name.
    #[test]
    fn a_run_against_a_keep_alive_server_counts_every_answer() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = listener.local_addr().unwrap();
        let udp_server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp = udp_server.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut stream = stream;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            let _ = stream
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nsrv1");
                        }
                    }
                });
            }
        });
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok((_, from)) = udp_server.recv_from(&mut buf) {
                let _ = udp_server.send_to(b"srv1", from);
            }
        });
        let dir = std::env::temp_dir().join(format!("kpr-load-test-{}", std::process::id()));
        let stop_file = dir.join("stop");
        let _ = std::fs::remove_file(&stop_file);
        std::fs::create_dir_all(&dir).unwrap();
        let args = LoadArgs {
            targets: vec![format!("local={tcp},{udp}")],
            rate: 20.0,
            long: 2,
            udp: 1,
            interval_ms: 50,
            stop_file: stop_file.clone(),
            max_seconds: 1,
            label: "test".into(),
            warmup_seconds: 5,
            ready_file: Some(dir.join("ready")),
        };
        let report = run_load(&args).unwrap();
        assert!(
            dir.join("ready").exists(),
            "the ready file after the warm-up"
        );
        let _ = std::fs::remove_dir_all(&dir);
        let target = &report["targets"][0];
        for kind in ["new", "long", "udp_flows"] {
            let tally = &target[kind];
            assert!(tally["ok"].as_u64().unwrap() > 3, "{kind}: {tally}");
            assert_eq!(tally["ok"], tally["attempts"], "{kind}: {tally}");
            assert_eq!(tally["answered_by"]["srv1"]["answers"], tally["ok"]);
        }
    }
}
