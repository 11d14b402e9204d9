//! Kernel tests of socket destruction (`dataplane::ebpf::sockterm`): when an endpoint leaves, the
//! sockets that socket-level balancing connected to it are destroyed (socket iterators +
//! `bpf_sock_destroy`, Linux 6.5+), and nothing else is. Real programs on a test cgroup, client
//! processes in the pod-client namespace (which the dataplane, on the test's thread in the
//! machine's namespace, reaches through `/run/netns`), echo servers in pod namespaces that keep
//! answering after their endpoint was removed (so a socket left alone would go on working).
//!
//! Run as root: `cargo test -p proxy --features kpr-tests/root --test ebpf_sock_destroy --
//! --nocapture` (the UDP test prints its time-to-new-endpoint figures; `KPR_SOCKDESTROY_RUNS=N`
//! repeats it N times, default 5, for docs/BENCHMARKS.md).

mod ebpf_support;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::ChildStdout;
use std::time::{Duration, Instant};

use ebpf_support::*;
use proxy::dataplane::ebpf::sockterm::{self, Support, TermCounts};
use proxy::model::Protocol;
use proxy::state::ProxyState;

/// Not a test: the body of the client processes the tests spawn (see `ebpf_support::run_client`).
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    run_client(&spec);
}

/// How long a client may keep talking to a removed endpoint before the test calls it stuck.
/// Not a timing assertion: without destruction the client never moves at all.
const STUCK: Duration = Duration::from_secs(10);

/// The next `KPR` line of a client, or None at its end.
fn next_line(out: &mut BufReader<ChildStdout>) -> Option<String> {
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).expect("reading the client") == 0 {
            return None;
        }
        if let Some(i) = line.find("KPR ") {
            return Some(line[i + 4..].trim_end().to_string());
        }
    }
}

/// Whether this kernel can destroy sockets (the kfunc is in its BTF: Linux 6.5+), checking that
/// the dataplane agrees (a kernel that can, with programs that failed to load, fails here). On a
/// kernel that cannot (the VM matrix's 6.1), the tests assert the documented fallback instead:
/// nothing is destroyed and the sockets keep their endpoint.
fn kernel_destroys(fx: &mut Fixture) -> bool {
    let support = sockterm::probe();
    let can = matches!(support, Support::Kfunc(_));
    assert_eq!(
        fx.dp().destroys_sockets(),
        can,
        "the kernel probe says {support:?}; the dataplane disagrees (see the log)"
    );
    if !can {
        println!("this kernel cannot destroy sockets ({support:?}): checking the fallback");
    }
    can
}

#[test]
fn a_connected_udp_socket_reaches_another_endpoint_once_its_endpoint_leaves() {
    let runs: usize = std::env::var("KPR_SOCKDESTROY_RUNS")
        .ok()
        .map(|v| v.parse().expect("KPR_SOCKDESTROY_RUNS"))
        .unwrap_or(5);
    let mut fx = Fixture::new("sdudp", 3);
    let destroys = kernel_destroys(&mut fx);
    let n = name("dns", Protocol::Udp);
    let vip = SocketAddr::from((VIP, 53));
    let all = [0, 1, 2];
    let mut state = ProxyState::default();
    state.set_port(service(&n, VIP, 53), fx.endpoints(&all));
    fx.sync(&mut state, &full());
    let mut latencies = Vec::new();
    let mut syncs = Vec::new();
    let mut destroyed = 0;
    for run in 0..runs {
        let mut client = fx.client(&format!("udpconn {vip}"));
        let stdin = client.stdin.take();
        let mut out = BufReader::new(client.stdout.take().expect("stdout"));
        // The endpoint the socket got at connect(): its first replies.
        let first = loop {
            let line = next_line(&mut out).expect("the client ended before a reply");
            if let Some(rest) = line.strip_prefix("udp ") {
                break rest.split(' ').next().unwrap().to_string();
            }
        };
        let gone = fx
            .cluster
            .pods
            .iter()
            .position(|p| p.name == first)
            .unwrap_or_else(|| panic!("reply from unknown pod {first}"));
        let stay: Vec<usize> = all.iter().copied().filter(|&i| i != gone).collect();
        set_endpoints(&mut state, &n, fx.endpoints(&stay));
        let removed_at = epoch_ms();
        let sync_started = Instant::now();
        let stats = fx.sync(&mut state, &changed(&[&n]));
        let sync_ms = sync_started.elapsed().as_secs_f64() * 1e3;
        destroyed += stats.sockets_destroyed.udp;
        if !destroys {
            udp_stays(&mut out, &first, &stats);
            drop(stdin);
            let _ = client.wait();
            return;
        }
        assert!(
            stats.sockets_destroyed.udp >= 1,
            "run {run}: the sync destroyed no UDP socket: {stats:?}"
        );
        let started = Instant::now();
        let mut seen = Vec::new();
        let (to, at) = loop {
            assert!(
                started.elapsed() < STUCK,
                "run {run}: the client still talks to {first} after its endpoint left: {seen:?}"
            );
            let line = next_line(&mut out).expect("the client ended");
            seen.push(line.clone());
            let Some(rest) = line.strip_prefix("udp ") else {
                continue;
            };
            let mut words = rest.split(' ');
            let pod = words.next().unwrap().to_string();
            let at: u128 = words.next().unwrap().parse().unwrap();
            if pod != first {
                break (pod, at);
            }
        };
        assert!(
            stay.iter().any(|&i| fx.cluster.pods[i].name == to),
            "run {run}: moved to {to}"
        );
        latencies.push(at.saturating_sub(removed_at));
        syncs.push(sync_ms);
        println!(
            "run {run}: {first} left; the sync (with the destroy) took {sync_ms:.1} ms; {to} \
             answered {} ms after the removal; the client saw {seen:?}",
            at.saturating_sub(removed_at)
        );
        drop(stdin);
        let _ = client.wait();
        // Back to three endpoints for the next run.
        set_endpoints(&mut state, &n, fx.endpoints(&all));
        fx.sync(&mut state, &changed(&[&n]));
    }
    latencies.sort_unstable();
    syncs.sort_by(f64::total_cmp);
    let rank = |len: usize, p: usize| (len * p).div_ceil(100).saturating_sub(1);
    println!(
        "connected UDP, datagram every 100 ms: time from the endpoint's removal (sync start) to \
         the first reply from another endpoint over {runs} runs: p50 {} ms, p99 {} ms, max {} ms; \
         the sync that destroyed the socket: p50 {:.1} ms, p99 {:.1} ms",
        latencies[rank(runs, 50)],
        latencies[rank(runs, 99)],
        latencies.last().unwrap(),
        syncs[rank(runs, 50)],
        syncs[rank(runs, 99)],
    );
    let totals = TermCounts::from_pin(&maps_dir(&fx.cfg.bpffs_path)).expect("stats pin");
    assert_eq!(totals.udp, destroyed, "{totals:?}");
    assert_eq!(totals.tcp, 0, "{totals:?}");
}

#[test]
fn a_held_tcp_connection_drains_while_its_endpoint_terminates_and_is_reset_once_removed() {
    let mut fx = Fixture::new("sdtcp", 3);
    let destroys = kernel_destroys(&mut fx);
    let n = name("web", Protocol::Tcp);
    let vip = SocketAddr::from((VIP, 80));
    let mut state = ProxyState::default();
    state.set_port(service(&n, VIP, 80), fx.endpoints(&[0, 1, 2]));
    fx.sync(&mut state, &full());
    // Three connections through the Service (exact round-robin: one per pod), and one straight
    // to pod0's address, which no Service translated.
    let pod0 = fx.cluster.pods[0].name.clone();
    let direct = SocketAddr::from((fx.cluster.pods[0].ip, kpr_tests::cluster::ECHO_PORT));
    let mut client = fx.client(&format!("holdcheck {vip} 3 {direct}"));
    let mut stdin = client.stdin.take().expect("stdin");
    let mut out = BufReader::new(client.stdout.take().expect("stdout"));
    let mut pods = Vec::new();
    loop {
        let line = next_line(&mut out).expect("the client ended before ready");
        if line == "ready" {
            break;
        }
        pods.push(line.strip_prefix("pod ").expect("pod line").to_string());
    }
    let mut through_service = pods[..3].to_vec();
    through_service.sort();
    let mut names: Vec<String> = fx.cluster.pods.iter().map(|p| p.name.clone()).collect();
    names.sort();
    assert_eq!(through_service, names, "one connection per pod");
    assert_eq!(pods[3], pod0, "the direct connection");

    // First pod0 terminates: no new connection goes there, and (as kube-proxy) its TCP
    // connection is left to drain.
    let mut eps = fx.endpoints(&[0, 1, 2]);
    eps[0].ready = false;
    eps[0].terminating = true;
    set_endpoints(&mut state, &n, eps);
    let stats = fx.sync(&mut state, &changed(&[&n]));
    assert_eq!(stats.sockets_destroyed.tcp, 0, "terminating: {stats:?}");
    let draining = check(&mut stdin, &mut out, pods.len());
    for (i, pod) in pods.iter().enumerate() {
        assert_eq!(draining[i], format!("conn {i} {pod} ok"), "{draining:?}");
    }

    // Then it is gone from the Service: its connection through the Service is reset.
    set_endpoints(&mut state, &n, fx.endpoints(&[1, 2]));
    let stats = fx.sync(&mut state, &changed(&[&n]));
    assert_eq!(
        stats.sockets_destroyed.tcp,
        u64::from(destroys),
        "{stats:?}"
    );
    assert_eq!(stats.sockets_destroyed.udp, 0, "{stats:?}");
    let results = check(&mut stdin, &mut out, pods.len());
    for (i, pod) in pods.iter().enumerate() {
        let line = &results[i];
        let want_ok = !destroys || i == 3 || *pod != pod0;
        if want_ok {
            assert_eq!(*line, format!("conn {i} {pod} ok"), "{results:?}");
        } else {
            assert_eq!(
                *line,
                format!("conn {i} {pod} err connection reset"),
                "the connection to the removed endpoint: {results:?}"
            );
        }
    }
    drop(stdin);
    let _ = client.wait();
    let totals = TermCounts::from_pin(&maps_dir(&fx.cfg.bpffs_path)).expect("stats pin");
    assert_eq!(
        (totals.tcp, totals.udp),
        (u64::from(destroys), 0),
        "{totals:?}"
    );
    // A new connection goes to the endpoints that stay.
    let lines = fx.client_lines(&format!("tcp {vip} 4"));
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("pod ") && *l != format!("pod {pod0}")),
        "{lines:?}"
    );
}

/// The fallback (a kernel without the kfunc): the sync destroyed nothing, and the socket keeps
/// its endpoint (the pod still answers) for the next ten replies.
fn udp_stays(out: &mut BufReader<ChildStdout>, first: &str, stats: &proxy::state::SyncStats) {
    assert_eq!(stats.sockets_destroyed.udp, 0, "{stats:?}");
    let mut replies = Vec::new();
    while replies.len() < 10 {
        let line = next_line(out).expect("the client ended");
        assert!(!line.starts_with("err "), "the socket failed: {line}");
        if let Some(rest) = line.strip_prefix("udp ") {
            replies.push(rest.split(' ').next().unwrap().to_string());
        }
    }
    assert!(replies.iter().all(|p| p == first), "{replies:?}");
}

/// Asks a `holdcheck` client to use each of its `n` connections; returns its `n` answers.
fn check(
    stdin: &mut std::process::ChildStdin,
    out: &mut BufReader<ChildStdout>,
    n: usize,
) -> Vec<String> {
    writeln!(stdin, "check").unwrap();
    stdin.flush().unwrap();
    let mut results = Vec::new();
    while results.len() < n {
        results.push(next_line(out).expect("the client ended before its checks"));
    }
    results
}
