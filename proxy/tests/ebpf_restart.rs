//! Restart safety of the eBPF backend with the real agent binary: `proxy run --backend ebpf` in
//! the node namespace of a kpr-tests cluster, socket programs on a test cgroup, pins under a
//! private `--bpffs-path`. The agent is killed with SIGKILL while a client talks through a
//! Service; the pinned maps and links keep the established connection and keep balancing new
//! ones; a restarted agent reuses the pins and reconciles what changed while it was down;
//! `proxy cleanup` removes every pin and attachment.
//!
//! Run as root: `cargo test -p proxy --features kpr-tests/root --test ebpf_restart`.

mod ebpf_support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use ebpf_support::*;
use kpr_tests::cluster::ClusterSpec;
use kpr_tests::{yaml, Agent, Cgroup, Cluster, EndpointSlice, Service};
use proxy::dataplane::ebpf::inspect::{cgroup_programs, MapSnapshot};
use proxy::model::Protocol;

/// Not a test: the body of the client processes the tests spawn.
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    match spec.strip_prefix("converse ") {
        Some(addr) => converse(addr.parse().expect("converse ADDR")),
        None => run_client(&spec),
    }
}

/// Client command `converse ADDR`: one TCP connection; every stdin line is echoed through it and
/// printed as `KPR echo LINE` (or `KPR err ...`).
fn converse(addr: SocketAddr) {
    let mut conn = kpr_tests::client::tcp_hold_here(addr, Duration::from_secs(3)).expect("connect");
    println!("KPR pod {}", conn.reply.pod);
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lines() {
        match conn.echo(&line.expect("stdin")) {
            Ok(r) => println!("KPR echo {r}"),
            Err(e) => println!("KPR err {e:?}"),
        }
        std::io::stdout().flush().unwrap();
    }
}

/// A `converse` client process in the test cgroup.
struct Conversation {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pod: String,
}

impl Conversation {
    fn start(ns: &kpr_tests::Netns, cgroup: &Cgroup, addr: SocketAddr) -> Conversation {
        let mut child = spawn_client(ns, cgroup, &format!("converse {addr}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut c = Conversation {
            child,
            stdin,
            stdout,
            pod: String::new(),
        };
        let first = c.next_line();
        c.pod = first
            .strip_prefix("pod ")
            .unwrap_or_else(|| panic!("converse: {first}"))
            .to_string();
        c
    }

    fn next_line(&mut self) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("reading client");
            assert!(n > 0, "the converse client exited");
            if let Some(i) = line.find("KPR ") {
                return line[i + 4..].trim_end().to_string();
            }
        }
    }

    /// Sends one line through the connection and returns what came back.
    fn say(&mut self, msg: &str) -> String {
        let stdin = self.stdin.as_mut().expect("open");
        writeln!(stdin, "{msg}").expect("writing to the client");
        stdin.flush().unwrap();
        self.next_line()
    }
}

impl Drop for Conversation {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const VIP: &str = "10.96.0.10";

fn web(ips: &[Ipv4Addr]) -> String {
    let svc = Service::new("web").cluster_ip(VIP).tcp(80, 8080);
    let slice = EndpointSlice::for_service(&svc).ready_all(ips.to_vec());
    yaml(&[&svc, &slice])
}

/// Waits until the maps give the Service `n` backends.
fn wait_backends(bpffs: &Path, n: u32, agent: &Agent) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let count = MapSnapshot::read(bpffs)
            .ok()
            .and_then(|s| {
                s.frontend(VIP.parse().unwrap(), 80, Protocol::Tcp, false)
                    .map(|f| f.value.count)
            })
            .unwrap_or(u32::MAX);
        if count == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the maps never had {n} backends (last {count})\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the agent's binary in the node namespace with `args`; (success, stdout + stderr).
fn proxy_cmd(cluster: &Cluster, agent: &Agent, args: &[&str]) -> (bool, String) {
    let out = cluster
        .node
        .exec(agent.binary())
        .unwrap()
        .args(args)
        .output()
        .expect("running proxy");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Waits until every socket attach point of `cgroup` has exactly `n` programs (a replaced or
/// unpinned link is released after an RCU grace period).
fn wait_attached(cgroup: &Cgroup, n: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let progs = cgroup_programs(cgroup.path()).expect("BPF_PROG_QUERY on the test cgroup");
        if progs.iter().all(|(_, c)| *c == n) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {progs:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigkill_keeps_connections_and_balancing_restart_reconciles_cleanup_removes_all() {
    let cluster = Cluster::new(ClusterSpec::pods(3)).unwrap();
    let cgroup = Cgroup::new("restart").unwrap();
    let ips = cluster.pod_ips();
    let opts = agent_options(&cgroup);
    let agent = Agent::start(&cluster.node, &opts, &[("web.yaml", web(&ips))])
        .unwrap_or_else(|e| panic!("agent: {e}"));
    let bpffs = agent.bpffs_path().expect("ebpf agent").to_path_buf();
    wait_backends(&bpffs, 3, &agent);
    wait_attached(&cgroup, 1, "one program per attach point");
    let vip: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let mut conv = Conversation::start(&cluster.podclient, &cgroup, vip);
    assert_eq!(conv.say("before"), "echo before");

    // SIGKILL: no cleanup runs, the pins keep everything in the kernel.
    let status = agent.kill().expect("the agent was running");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert_eq!(conv.say("during the outage"), "echo during the outage");
    let lines = client_lines(&cluster.podclient, &cgroup, &format!("tcp {vip} 6"));
    let counts = pod_counts(&lines);
    assert_eq!(counts.len(), 3, "new connections while down: {lines:?}");
    assert!(counts.values().all(|&c| c == 2), "{counts:?}");
    // The maps can be read with no agent: the held connection is counted on its pod.
    let (ok, out) = proxy_cmd(
        &cluster,
        &agent,
        &[
            "inspect",
            "--maps",
            "--bpffs-path",
            &bpffs.to_string_lossy(),
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains("10.96.0.10:80/TCP"), "{out}");
    let conv_ip = cluster.pod(&conv.pod).expect("a pod of the cluster").ip;
    let conv_line = out
        .lines()
        .find(|l| l.contains(&format!("{conv_ip}:8080")))
        .unwrap_or_else(|| panic!("no slot line for {conv_ip}:\n{out}"));
    assert!(conv_line.contains("active 1 "), "{out}");

    // A change while down: one endpoint (not the conversation's) leaves the manifests.
    let removed = cluster
        .pods
        .iter()
        .find(|p| p.name != conv.pod)
        .expect("another pod");
    let kept: Vec<Ipv4Addr> = ips.iter().copied().filter(|ip| *ip != removed.ip).collect();
    agent.write_manifest("web.yaml", &web(&kept)).unwrap();
    agent.restart().unwrap_or_else(|e| panic!("restart: {e}"));
    assert!(
        agent.log().contains("ebpf: reusing"),
        "the restarted agent says it reuses the pins:\n{}",
        agent.log()
    );
    wait_backends(&bpffs, 2, &agent);
    assert_eq!(conv.say("after the restart"), "echo after the restart");
    let lines = client_lines(&cluster.podclient, &cgroup, &format!("tcp {vip} 8"));
    let pods: BTreeSet<String> = pod_counts(&lines).into_keys().collect();
    assert!(!pods.contains(&removed.name), "{lines:?}");
    assert_eq!(pods.len(), 2, "{lines:?}");
    wait_attached(&cgroup, 1, "links replaced, not added");
    drop(conv);

    agent.stop();
    let (ok, out) = proxy_cmd(
        &cluster,
        &agent,
        &[
            "cleanup",
            "--backend",
            "ebpf",
            "--bpffs-path",
            &bpffs.to_string_lossy(),
            "--cgroup-path",
            &cgroup.path().to_string_lossy(),
        ],
    );
    assert!(ok, "{out}");
    assert!(!bpffs.exists(), "pins left: {}", bpffs.display());
    // `proxy cleanup --cgroup-path` returns once the programs are detached.
    let progs = cgroup_programs(cgroup.path()).unwrap();
    assert!(
        progs.iter().all(|(_, c)| *c == 0),
        "programs left: {progs:?}"
    );
    // Without the programs the VIP is just an address nobody answers.
    let lines = client_lines(&cluster.podclient, &cgroup, &format!("tcp {vip} 1"));
    assert!(lines[0].starts_with("err"), "{lines:?}");
}
