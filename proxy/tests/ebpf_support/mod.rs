//! Shared fixture of the eBPF kernel tests: a kpr-tests cluster (pods with echo servers, a pod
//! client namespace), a dedicated test cgroup, a private bpffs mount, the `EbpfDataplane` under
//! test, and client PROCESSES that run inside the test cgroup (the socket programs only see
//! sockets of processes in that cgroup).
//!
//! Client processes are this test binary re-executed with `KPR_EBPF_CLIENT` set, running the
//! ignored helper `client_process_entry` (see `run_client`). Everything is removed by `Drop`,
//! also when a test panics: programs detached and pins removed (dataplane cleanup), the bpffs
//! unmounted, the cgroup (and whatever runs in it) and the namespaces removed.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the shared fixture"
)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use kpr_tests::{Cgroup, Cluster, ClusterSpec};
use proxy::dataplane::ebpf::{EbpfDataplane, EbpfOptions, MapSizes, TcInterfaces};
use proxy::dataplane::{BackendConfig, Dataplane};
use proxy::model::{Algorithm, Endpoint, Protocol, ServicePort, ServicePortName};
use proxy::selection::NodeContext;
use proxy::state::{ChangeSet, ProxyState, SyncStats};

pub const NODE: &str = "node";
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const CLIENT_ENV: &str = "KPR_EBPF_CLIENT";

/// A private bpffs mounted on a temp directory (the machine's /sys/fs/bpf is left alone).
pub struct Bpffs {
    dir: PathBuf,
}

impl Bpffs {
    pub fn mount(tag: &str) -> Bpffs {
        let dir =
            std::env::temp_dir().join(format!("{}-bpffs-{tag}", kpr_tests::netns::unique_prefix()));
        std::fs::create_dir_all(&dir).expect("creating the bpffs mount point");
        nix::mount::mount(
            Some("bpf"),
            &dir,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("mounting bpffs on {}: {e}", dir.display()));
        Bpffs { dir }
    }

    /// Where the dataplane pins (a subdirectory it creates).
    pub fn pin_root(&self) -> PathBuf {
        self.dir.join("kpr")
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Cluster + cgroup + bpffs + dataplane. Field order is drop order (after `Drop::drop`).
pub struct Fixture {
    pub dp: Option<EbpfDataplane>,
    pub cfg: BackendConfig,
    pub cgroup: Cgroup,
    /// Held for its `Drop` (unmounts after the dataplane cleaned up its pins).
    pub _bpffs: Bpffs,
    pub cluster: Cluster,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(mut dp) = self.dp.take() {
            let _ = dp.cleanup();
        }
        let _ = proxy::dataplane::ebpf::cleanup(&self.cfg);
    }
}

impl Fixture {
    /// `pods` pods with echo servers on :8080, and the dataplane attached to a fresh cgroup.
    pub fn new(tag: &str, pods: usize) -> Fixture {
        Self::with_sizes(tag, pods, MapSizes::default())
    }

    pub fn with_sizes(tag: &str, pods: usize, sizes: MapSizes) -> Fixture {
        let mut fx = Self::bare(tag, pods);
        fx.dp = Some(
            EbpfDataplane::with_options(&fx.cfg, socket_only(sizes)).expect("EbpfDataplane::new"),
        );
        fx
    }

    /// Cluster, cgroup and bpffs, no dataplane yet.
    fn bare(tag: &str, pods: usize) -> Fixture {
        let cluster = Cluster::new(ClusterSpec::pods(pods)).expect("building the test cluster");
        let cgroup = Cgroup::new(tag).expect("creating the test cgroup");
        let bpffs = Bpffs::mount(tag);
        let cfg = BackendConfig {
            node: NodeContext {
                node_name: NODE.into(),
                cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
                node_ips: vec![IpAddr::V4(kpr_tests::cluster::NODE_IP)],
                masquerade_all: false,
                zone: None,
                maglev_table_size: Default::default(),
            },
            service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
            cgroup_path: Some(cgroup.path().to_path_buf()),
            bpffs_path: bpffs.pin_root(),
            ..BackendConfig::default()
        };
        Fixture {
            dp: None,
            cfg,
            cgroup,
            _bpffs: bpffs,
            cluster,
        }
    }

    /// Like [`Fixture::new`], but the dataplane is built on a thread inside the node namespace with
    /// the tc program on all of the node's interfaces (as the agent runs on a node).
    pub fn with_tc(tag: &str, pods: usize) -> Fixture {
        Self::with_xdp(tag, pods, &[])
    }

    /// Like [`Fixture::with_tc`], with the XDP program on the node's `interfaces` too.
    pub fn with_xdp(tag: &str, pods: usize, interfaces: &[&str]) -> Fixture {
        let mut fx = Self::bare(tag, pods);
        fx.cfg.xdp_interfaces = interfaces.iter().map(|i| i.to_string()).collect();
        let cfg = fx.cfg.clone();
        let dp = fx
            .cluster
            .node
            .run(move || EbpfDataplane::new(&cfg))
            .expect("entering the node namespace")
            .expect("EbpfDataplane::new in the node namespace");
        fx.dp = Some(dp);
        fx
    }

    /// A new dataplane on the same pins (an agent restart).
    pub fn restart(&mut self) {
        self.restart_with(MapSizes::default());
    }

    /// A new dataplane on the same pins, asking for other map sizes.
    pub fn restart_with(&mut self, sizes: MapSizes) {
        let opts = socket_only(sizes);
        self.dp = Some(EbpfDataplane::with_options(&self.cfg, opts).expect("restart"));
    }

    pub fn dp(&mut self) -> &mut EbpfDataplane {
        self.dp.as_mut().expect("dataplane")
    }

    /// Endpoints for pods `idx` (0-based), ready, on the node `NODE`.
    pub fn endpoints(&self, idx: &[usize]) -> Vec<Endpoint> {
        idx.iter()
            .map(|&i| Endpoint {
                addr: IpAddr::V4(self.cluster.pods[i].ip),
                port: kpr_tests::cluster::ECHO_PORT,
                node: Some(NODE.into()),
                zone: None,
                ready: true,
                serving: true,
                terminating: false,
                hints: None,
            })
            .collect()
    }

    /// Syncs `state` (recomputing the selection) with the given change set.
    pub fn sync(&mut self, state: &mut ProxyState, changes: &ChangeSet) -> SyncStats {
        // The tests build their state before they know the node: select again for it.
        let mut on_node = ProxyState::new(self.cfg.node.clone());
        for (_, port) in state.iter() {
            on_node.set_port(port.service.clone(), port.endpoints.to_vec());
        }
        *state = on_node;
        self.dp().sync(state, changes).expect("sync")
    }

    /// Runs a client process in the pod-client namespace, inside the test cgroup.
    pub fn client(&self, spec: &str) -> Child {
        spawn_client(&self.cluster.podclient, &self.cgroup, spec)
    }

    /// Runs a client to completion and returns its `KPR` lines.
    pub fn client_lines(&self, spec: &str) -> Vec<String> {
        client_lines(&self.cluster.podclient, &self.cgroup, spec)
    }
}

/// Replaces the endpoints of service port `n` (which must be in `state`).
pub fn set_endpoints(state: &mut ProxyState, n: &ServicePortName, eps: Vec<Endpoint>) {
    let svc = state
        .get(n)
        .expect("the service port is set")
        .service
        .clone();
    state.set_port(svc, eps);
}

/// Changes the Service definition of service port `n` (which must be in `state`).
pub fn edit_service(
    state: &mut ProxyState,
    n: &ServicePortName,
    edit: impl FnOnce(&mut ServicePort),
) {
    let port = state.get(n).expect("the service port is set");
    let mut svc = (*port.service).clone();
    let eps = port.endpoints.to_vec();
    edit(&mut svc);
    state.set_port(svc, eps);
}

/// Runs this test binary as a client process (`client_process_entry`) in `ns`, inside `cgroup`.
pub fn spawn_client(ns: &kpr_tests::Netns, cgroup: &Cgroup, spec: &str) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd: Command = ns.exec(&exe).expect("netns exec");
    cmd.args([
        "--ignored",
        "--exact",
        "client_process_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CLIENT_ENV, spec)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    cgroup.add_on_exec(&mut cmd).expect("cgroup");
    cmd.spawn().expect("spawning the client process")
}

/// Runs a client to completion and returns its `KPR` lines.
pub fn client_lines(ns: &kpr_tests::Netns, cgroup: &Cgroup, spec: &str) -> Vec<String> {
    let child = spawn_client(ns, cgroup, spec);
    let out = child.wait_with_output().expect("client output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client `{spec}` failed: {:?}\n{stdout}",
        out.status
    );
    let lines = kpr_lines(&stdout);
    assert!(
        !lines.is_empty(),
        "client `{spec}` printed no result:\n{stdout}"
    );
    lines
}

/// Options for a dataplane built on the test's own thread, which is in the machine's network
/// namespace: no tc attachment there, ever.
pub fn socket_only(map_sizes: MapSizes) -> EbpfOptions {
    EbpfOptions {
        map_sizes,
        tc: TcInterfaces::Off,
        xdp: Vec::new(),
    }
}

/// A client process holding connections until dropped.
pub struct Held {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Kept open so the client can still print its exit lines (no EPIPE).
    _stdout: BufReader<std::process::ChildStdout>,
    pub pods: Vec<String>,
}

impl Held {
    /// Starts `hold ADDR N` and waits until all N connections are open.
    pub fn start(fx: &Fixture, addr: SocketAddr, n: usize) -> Held {
        let mut child = fx.client(&format!("hold {addr} {n}"));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let mut pods = Vec::new();
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).expect("reading the client") == 0 {
                break;
            }
            let line = line.trim_end();
            if let Some(rest) = line.find("KPR ").map(|i| &line[i + 4..]) {
                if rest == "ready" {
                    break;
                }
                let pod = rest
                    .strip_prefix("pod ")
                    .unwrap_or_else(|| panic!("hold client: {rest}"));
                pods.push(pod.to_string());
            }
        }
        assert_eq!(
            pods.len(),
            n,
            "hold client opened {} of {n} connections",
            pods.len()
        );
        Held {
            child,
            stdin,
            _stdout: reader,
            pods,
        }
    }

    /// Closes the connections and waits for the process to exit.
    pub fn release(mut self) {
        self.stdin.take();
        let _ = self.child.wait();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn kpr_lines(out: &str) -> Vec<String> {
    out.lines()
        // libtest prints `test client_process_entry ... ` right before the first line.
        .filter_map(|l| l.find("KPR ").map(|i| l[i + 4..].to_string()))
        .collect()
}

/// Counts of `pod NAME` lines per pod.
pub fn pod_counts(lines: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in lines {
        if let Some(p) = l.strip_prefix("pod ") {
            *m.entry(p.to_string()).or_default() += 1;
        }
    }
    m
}

pub fn name(svc: &str, proto: Protocol) -> ServicePortName {
    ServicePortName::new("default", svc, "", proto)
}

pub fn service(n: &ServicePortName, ip: Ipv4Addr, port: u16) -> ServicePort {
    ServicePort {
        name: n.clone(),
        cluster_ips: vec![IpAddr::V4(ip)],
        port,
        protocol: n.protocol,
        node_port: 0,
        external_ips: vec![],
        load_balancer_ips: vec![],
        source_ranges: vec![],
        affinity: None,
        external_local: false,
        internal_local: false,
        health_check_node_port: 0,
        algorithm: Algorithm::RoundRobin,
    }
}

pub fn full() -> ChangeSet {
    ChangeSet {
        full: true,
        ..ChangeSet::default()
    }
}

pub fn changed(names: &[&ServicePortName]) -> ChangeSet {
    ChangeSet {
        changed: names.iter().map(|n| (*n).clone()).collect(),
        ..ChangeSet::default()
    }
}

/// The client process: runs the command in `KPR_EBPF_CLIENT` and prints `KPR ...` lines.
///
/// Commands: `tcp ADDR N` (N sequential requests), `hold ADDR N` (N open connections until stdin
/// closes), `udp ADDR N` (N datagrams from one unconnected socket), `peer ADDR` (getpeername of a
/// connected socket), `udpconn ADDR` (see [`udp_connected`]), `holdcheck ADDR N [DIRECT]` (see
/// [`hold_and_check`]).
pub fn run_client(spec: &str) {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let addr: SocketAddr = words[1].parse().expect("client address");
    let n: usize = words.get(2).map(|w| w.parse().expect("count")).unwrap_or(1);
    let timeout = Duration::from_secs(3);
    match words[0] {
        "tcp" => {
            for _ in 0..n {
                let start = Instant::now();
                match kpr_tests::client::tcp_request_here(addr, timeout) {
                    Ok(r) => println!("KPR pod {}", r.pod),
                    Err(e) => println!("KPR err {e:?} {}", start.elapsed().as_millis()),
                }
            }
        }
        "hold" => {
            let mut held = Vec::new();
            for _ in 0..n {
                let c = kpr_tests::client::tcp_hold_here(addr, timeout).expect("hold connect");
                println!("KPR pod {}", c.reply.pod);
                held.push(c);
            }
            println!("KPR ready");
            std::io::stdout().flush().unwrap();
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            drop(held);
        }
        "udp" => {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.set_read_timeout(Some(timeout)).unwrap();
            for _ in 0..n {
                sock.send_to(b"ping", addr).expect("send_to");
                let mut buf = [0u8; 512];
                match sock.recv_from(&mut buf) {
                    Ok((len, from)) => {
                        let reply = String::from_utf8_lossy(&buf[..len]).to_string();
                        let pod = reply.split_whitespace().next().unwrap_or("").to_string();
                        println!("KPR udp {pod} from {from}");
                    }
                    Err(e) => println!("KPR err {e}"),
                }
            }
        }
        "udpconn" => udp_connected(addr),
        "holdcheck" => hold_and_check(
            addr,
            n,
            words.get(3).map(|w| w.parse().expect("direct address")),
        ),
        "peer" => {
            let c = std::net::TcpStream::connect_timeout(&addr, timeout).expect("connect");
            println!("KPR peer {}", c.peer_addr().unwrap());
        }
        other => panic!("unknown client command {other}"),
    }
    std::io::stdout().flush().unwrap();
}

/// The maps dir of a fixture (for reading maps directly).
pub fn maps_dir(root: &Path) -> PathBuf {
    root.join("maps")
}

/// The ebpf agent on the test cgroup. Starting it loads and verifies the programs, which takes
/// far longer in an emulated VM (the kernel matrix) than here: a generous ready timeout.
pub fn agent_options(cgroup: &kpr_tests::Cgroup) -> kpr_tests::AgentOptions {
    let mut opts = kpr_tests::AgentOptions::backend("ebpf")
        .cgroup(cgroup)
        .binary(env!("CARGO_BIN_EXE_proxy"));
    opts.ready_timeout = std::time::Duration::from_secs(120);
    opts
}

/// Milliseconds since the Unix epoch (the clock the tests and their client processes share).
pub fn epoch_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}

/// Closes `stop` when stdin reaches its end (the spawning test dropped it).
fn stop_on_stdin_eof() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    stop
}

/// `udpconn ADDR`: a client as DNS resolvers are: one connected UDP socket, a datagram every
/// 100 ms, each reply printed as `udp POD MS` (MS: [`epoch_ms`]); an error of the socket (not a
/// timeout) is printed as `err WHAT MS` and answered by connecting the socket again. Runs until
/// stdin closes.
fn udp_connected(addr: SocketAddr) {
    let every = Duration::from_millis(100);
    let stop = stop_on_stdin_eof();
    let sock = UdpSocket::bind("0.0.0.0:0").expect("bind");
    sock.connect(addr).expect("connect");
    sock.set_read_timeout(Some(every)).unwrap();
    let mut buf = [0u8; 512];
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let tick = Instant::now();
        let result = sock.send(b"ping").and_then(|_| sock.recv(&mut buf));
        match result {
            Ok(len) => {
                let reply = String::from_utf8_lossy(&buf[..len]).to_string();
                let pod = reply.split_whitespace().next().unwrap_or("").to_string();
                println!("KPR udp {pod} {}", epoch_ms());
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                println!("KPR err {:?} {}", e.kind(), epoch_ms());
                if let Err(e) = sock.connect(addr) {
                    println!("KPR err reconnect {e} {}", epoch_ms());
                }
            }
        }
        std::io::stdout().flush().unwrap();
        std::thread::sleep(every.saturating_sub(tick.elapsed()));
    }
}

/// `holdcheck ADDR N [DIRECT]`: opens N connections to ADDR (and one to DIRECT, not through a
/// Service), prints `pod POD` for each and `ready`; then, for every line read from stdin, sends a
/// line on each connection and prints `conn I POD ok` or `conn I POD err WHAT`. Stops at EOF.
fn hold_and_check(addr: SocketAddr, n: usize, direct: Option<SocketAddr>) {
    let timeout = Duration::from_secs(3);
    let mut held = Vec::new();
    for target in std::iter::repeat_n(addr, n).chain(direct) {
        let c = kpr_tests::client::tcp_hold_here(target, timeout).expect("hold connect");
        println!("KPR pod {}", c.reply.pod);
        held.push(c);
    }
    println!("KPR ready");
    std::io::stdout().flush().unwrap();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        if line.is_err() {
            break;
        }
        for (i, c) in held.iter_mut().enumerate() {
            let pod = c.reply.pod.clone();
            match c.echo("check") {
                Ok(echo) if echo == "check" => println!("KPR conn {i} {pod} ok"),
                Ok(other) => println!("KPR conn {i} {pod} err echoed {other:?}"),
                Err(e) => println!("KPR conn {i} {pod} err {e}"),
            }
        }
        std::io::stdout().flush().unwrap();
    }
}
