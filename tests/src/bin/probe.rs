//! `probe`: the harness's clients as a command, for tests that need client *processes* (the eBPF
//! tests put them in a cgroup). Runs in whatever namespace it is started in.
//!
//! ```text
//! probe tcp|sctp ADDR [--count N] [--hold SECS] [--timeout SECS] [--bind IP:PORT]
//! probe udp ADDR [--count N] [--timeout SECS] [--session [--every MS]]
//! probe http ADDR [--timeout SECS]
//! ```
//! Prints one line per request: `<pod> <peer-ip>:<peer-port>` on success, `error <kind>` on failure
//! (kind: refused, reset, unreachable, timeout, closed, other: ...). With `--hold`, each TCP
//! connection is opened, its greeting printed, and all are kept open SECS seconds, checked alive
//! (`alive <pod>` / `dead <pod>`), then closed. With `--session`, every UDP request goes out of
//! one connected socket (one flow; a socket whose connect() failed, or that failed with an error
//! other than a timeout or a refusal, is made again for the next request). `--bind IP:PORT` (tcp) binds request k to IP:PORT+k before connecting (fixed
//! 5-tuples, for Maglev). `--every MS` waits MS milliseconds between requests (any mode but `--hold`). `http` prints `http <status> <body>` of `GET /`.
//! Exit status 0 when every request succeeded, 1 otherwise.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use kpr_tests::client::{
    http_get_here, sctp_request_here, tcp_hold_here, tcp_request_from_here, tcp_request_here,
    udp_request_here, Reply, UdpSession,
};
use kpr_tests::ClientError;

struct Opts {
    proto: String,
    addr: SocketAddr,
    count: usize,
    hold: Option<u64>,
    timeout: Duration,
    session: bool,
    every: Duration,
    bind: Option<SocketAddr>,
}

fn parse(args: &[String]) -> anyhow::Result<Opts> {
    let usage = "usage: probe tcp|udp|sctp|http ADDR [--count N] [--hold SECS] [--timeout SECS] \
                 [--session] [--every MS]";
    let (proto, addr) = match args {
        [p, a, ..] if ["tcp", "udp", "sctp", "http"].contains(&p.as_str()) => (p.clone(), a),
        _ => bail!("{usage}"),
    };
    let addr = addr
        .parse()
        .with_context(|| format!("ADDR {addr:?} is not IP:PORT"))?;
    let mut opts = Opts {
        proto,
        addr,
        count: 1,
        hold: None,
        timeout: Duration::from_secs(2),
        session: false,
        every: Duration::ZERO,
        bind: None,
    };
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        if flag == "--session" {
            opts.session = true;
            continue;
        }
        let value = rest
            .next()
            .with_context(|| format!("{flag} needs a value; {usage}"))?;
        if flag == "--bind" {
            opts.bind = Some(
                value
                    .parse()
                    .with_context(|| format!("--bind {value:?} is not IP:PORT"))?,
            );
            continue;
        }
        let n: u64 = value
            .parse()
            .with_context(|| format!("{flag} {value:?} is not a number"))?;
        match flag.as_str() {
            "--count" => opts.count = n as usize,
            "--hold" => opts.hold = Some(n),
            "--timeout" => opts.timeout = Duration::from_secs(n),
            "--every" => opts.every = Duration::from_millis(n),
            _ => bail!("unknown flag {flag}; {usage}"),
        }
    }
    if opts.hold.is_some() && opts.proto != "tcp" {
        bail!("--hold is for tcp only");
    }
    if opts.session && opts.proto != "udp" {
        bail!("--session is for udp only");
    }
    if opts.bind.is_some() && (opts.proto != "tcp" || opts.hold.is_some()) {
        bail!("--bind is for tcp requests only");
    }
    Ok(opts)
}

fn show_error(e: &ClientError) -> String {
    match e {
        ClientError::Refused => "error refused".into(),
        ClientError::Reset => "error reset".into(),
        ClientError::Unreachable => "error unreachable".into(),
        ClientError::Timeout => "error timeout".into(),
        ClientError::Closed => "error closed".into(),
        ClientError::Other(m) => format!("error other: {m}"),
    }
}

fn hold(opts: &Opts, secs: u64) -> bool {
    let mut held = Vec::new();
    let mut ok = true;
    for _ in 0..opts.count {
        match tcp_hold_here(opts.addr, opts.timeout) {
            Ok(c) => {
                println!("{} {}", c.reply.pod, c.reply.peer);
                held.push(c);
            }
            Err(e) => {
                println!("{}", show_error(&e));
                ok = false;
            }
        }
    }
    std::thread::sleep(Duration::from_secs(secs));
    for mut c in held {
        let alive = c.is_alive();
        println!("{} {}", if alive { "alive" } else { "dead" }, c.reply.pod);
        ok &= alive;
        c.close();
    }
    ok
}

/// Prints one request's outcome; returns whether it succeeded.
fn report(r: Result<Reply, ClientError>) -> bool {
    match r {
        Ok(r) => {
            println!("{} {}", r.pod, r.peer);
            true
        }
        Err(e) => {
            println!("{}", show_error(&e));
            false
        }
    }
}

/// `--session`: every request from one connected UDP socket, made again after a failed connect()
/// and, as applications do, after the socket itself failed (aborted or disconnected: the ebpf
/// backend destroys a socket whose endpoint left; a timeout or an ICMP refusal keeps it).
fn session(opts: &Opts) -> bool {
    let mut sock: Option<UdpSession> = None;
    let mut ok = true;
    for i in 0..opts.count {
        if i > 0 {
            std::thread::sleep(opts.every);
        }
        let r = match &sock {
            Some(s) => s.request(),
            None => UdpSession::here(opts.addr, opts.timeout).and_then(|s| {
                let r = s.request();
                sock = Some(s);
                r
            }),
        };
        if matches!(r, Err(ClientError::Reset | ClientError::Other(_))) {
            sock = None;
        }
        ok &= report(r);
    }
    ok
}

fn http(opts: &Opts) -> bool {
    match http_get_here(opts.addr, "/", opts.timeout) {
        Ok((status, body)) => {
            println!("http {status} {}", body.replace('\n', " "));
            true
        }
        Err(e) => {
            println!("{}", show_error(&e));
            false
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = parse(&args)?;
    let ok = match (opts.hold, opts.proto.as_str()) {
        (Some(secs), _) => hold(&opts, secs),
        (None, "http") => http(&opts),
        (None, "udp") if opts.session => session(&opts),
        (None, proto) => {
            let mut ok = true;
            for i in 0..opts.count {
                if i > 0 {
                    std::thread::sleep(opts.every);
                }
                let from = opts.bind.map(|b| {
                    let port = b.port() + u16::try_from(i).expect("--count fits the port range");
                    SocketAddr::new(b.ip(), port)
                });
                ok &= report(match (proto, from) {
                    ("tcp", Some(from)) => tcp_request_from_here(from, opts.addr, opts.timeout),
                    ("tcp", None) => tcp_request_here(opts.addr, opts.timeout),
                    ("sctp", _) => sctp_request_here(opts.addr, opts.timeout),
                    _ => udp_request_here(opts.addr, opts.timeout),
                });
            }
            ok
        }
    };
    std::process::exit(if ok { 0 } else { 1 });
}
