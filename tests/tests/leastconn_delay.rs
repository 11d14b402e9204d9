//! How far least-connection's picks lag a new connection on the rule backends whose rules are
//! nf_tables objects (nftables, iptables-nft), measured from outside the agent: `nft monitor`
//! runs in the node's namespace, a pod opens one held connection to a least-connection Service
//! with two idle endpoints, and the delay is the time from just before `connect()` to the first
//! ruleset change the monitor prints (the agent moving the picks off the endpoint that got the
//! connection). The connection is closed and the picks settle before the next sample.
//!
//! Prints p50 / p90 / max per backend (`-- --nocapture`); fails only when a pick does not move at
//! all, never on a duration (timings belong to benchmarks, and this machine's load varies).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use kpr_tests::client::tcp_hold_here;
use kpr_tests::{yaml, Agent, AgentOptions, Cluster, ClusterSpec, EndpointSlice, Service};

const VIP: &str = "10.96.0.10:80";
const SAMPLES: usize = 25;
/// How long a pick may take to move before the sample counts as "never moved".
const MOVE_LIMIT: Duration = Duration::from_secs(5);
/// Quiet time that ends a settle (no more ruleset changes).
const QUIET: Duration = Duration::from_millis(200);

/// `nft monitor` in a namespace; every line it prints arrives with the instant it was read.
struct Monitor {
    child: Child,
    lines: Receiver<(Instant, String)>,
}

impl Monitor {
    fn start(cluster: &Cluster) -> Monitor {
        let mut child = cluster
            .node
            .command("nft")
            .arg("monitor")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("nft monitor starts in the node namespace");
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if !line.trim().is_empty() && tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Monitor { child, lines }
    }

    /// Waits until nothing changed for [`QUIET`].
    fn settle(&self) {
        while self.lines.recv_timeout(QUIET).is_ok() {}
    }

    /// The first change after `since`, if one comes within [`MOVE_LIMIT`].
    fn first_change(&self, since: Instant) -> Option<(Duration, String)> {
        let (at, line) = self.lines.recv_timeout(MOVE_LIMIT).ok()?;
        Some((at.saturating_duration_since(since), line))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn measure(backend_args: &[&str]) {
    let cluster = Cluster::new(ClusterSpec::pods(2)).expect("cluster");
    let svc = Service::new("web")
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .named("http")
        .balance("least-conn");
    let slice = cluster
        .pod_ips()
        .iter()
        .fold(EndpointSlice::for_service(&svc), |s, ip| s.ready(ip));
    let opts = backend_args[1..]
        .iter()
        .fold(AgentOptions::backend(backend_args[0]), |o, a| o.arg(*a));
    let agent = Agent::start(&cluster.node, &opts, &[("web.yaml", yaml(&[&svc, &slice]))])
        .expect("agent starts");
    agent
        .wait_for("web with two endpoints", Duration::from_secs(10), |s| {
            s.service("default/web:http/TCP")
                .is_some_and(|w| w.endpoints.len() == 2)
        })
        .expect("the Service is programmed");
    let monitor = Monitor::start(&cluster);
    std::thread::sleep(Duration::from_millis(500));
    monitor.settle();
    let vip: SocketAddr = VIP.parse().unwrap();
    let mut delays = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let (t0, conn) = cluster
            .podclient
            .run(|| {
                let t0 = Instant::now();
                (t0, tcp_hold_here(vip, Duration::from_secs(5)))
            })
            .expect("enter the pod namespace");
        let conn = conn.unwrap_or_else(|e| panic!("sample {i}: connection failed: {e}"));
        let (delay, line) = monitor.first_change(t0).unwrap_or_else(|| {
            panic!(
                "sample {i}: the picks did not move within {MOVE_LIMIT:?} of a new connection\n{}",
                agent.log()
            )
        });
        if i == 0 {
            println!("    first change seen: {line}");
        }
        delays.push(delay);
        monitor.settle();
        conn.close();
        monitor.settle();
    }
    delays.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{}: connect -> picks moved over {SAMPLES} connections: p50 {:.2} ms, p90 {:.2} ms, \
         max {:.2} ms",
        backend_args.join(" "),
        ms(percentile(&delays, 0.5)),
        ms(percentile(&delays, 0.9)),
        ms(*delays.last().unwrap()),
    );
}

#[test]
fn nftables_picks_follow_a_new_connection() {
    measure(&["nftables"]);
}

#[test]
fn iptables_nft_picks_follow_a_new_connection() {
    measure(&["iptables", "--iptables-mode", "nft"]);
}
