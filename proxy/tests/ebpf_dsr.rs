//! Direct server return (`--nodeport-mode dsr|hybrid`) between two nodes, each running the real
//! agent with `--backend ebpf`, and an outside client on their LAN:
//!
//! ```text
//!                 client 192.0.2.100 (br0: a bridge, the LAN)
//!                   |ca                          |cb
//!            eth0 192.0.2.1                eth0 192.0.2.2
//!              node A  (agent)               node B  (agent) --pod0 10.244.1.1
//!   routes 10.244.1.0/24 via node B                             |
//!                                                   pod 10.244.1.2 (TCP+UDP echo on 8080)
//! ```
//!
//! The client sends to node A's nodePorts; the only endpoint is the pod behind node B. In dsr
//! mode the pod must see the client's own address, the answers must reach the client's
//! connected sockets from node A's nodePort, and no answer may pass node A: packet captures
//! (AF_PACKET, which sees a frame before tc ingress and after tc egress) on node A's and node
//! B's LAN interfaces, and the DSR programs' counters (`KPR_DSR_STATS`), show it. snat mode is
//! the contrast (masqueraded, the answers come back through node A), hybrid the mix (DSR for
//! TCP, masquerade for UDP). With XDP on node A's LAN interface, XDP sends a TCP flow's later
//! packets on itself (`KPR_XDP_STATS`) and leaves what must carry the option to tc.
//!
//! Run as root: `cargo test -p proxy --features kpr-tests/root --test ebpf_dsr`.

mod ebpf_support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use ebpf_support::*;
use kpr_tests::{yaml, Agent, Cgroup, EchoServer, Endpoint, EndpointSlice, Netns, Service};
use proxy::dataplane::ebpf::dsr::DsrCounts;
use proxy::dataplane::ebpf::xdp::XdpCounts;
use proxy_common::DSR_OPT_TYPE;

/// Not a test: the body of the client processes the shared fixture can spawn.
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    run_client(&spec);
}

const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
const NODE_A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const NODE_B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
/// The Service's LoadBalancer IP, which the client routes through node A (as a load balancer
/// would send to it).
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const TCP_NODE_PORT: u16 = 30080;
const UDP_NODE_PORT: u16 = 30081;
const REQUESTS: usize = 4;

/// One test at a time: each starts two agents, which load and verify the programs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The namespaces and links of the module doc, and the pod's echo server. Fields drop in order:
/// the server before the namespaces.
struct Lab {
    _echo: EchoServer,
    client: Netns,
    a: Netns,
    b: Netns,
    _pod: Netns,
}

impl Lab {
    fn new() -> Lab {
        let client = Netns::new("dsrc").expect("client namespace");
        let a = Netns::new("dsra").expect("node A namespace");
        let b = Netns::new("dsrb").expect("node B namespace");
        let pod = Netns::new("dsrp").expect("pod namespace");
        client
            .ip_batch(&[
                "link add br0 type bridge".into(),
                format!("addr add {CLIENT}/24 dev br0"),
                "link set br0 up".into(),
                format!("link add ca type veth peer name eth0 netns {}", a.name()),
                format!("link add cb type veth peer name eth0 netns {}", b.name()),
                "link set ca master br0".into(),
                "link set cb master br0".into(),
                "link set ca up".into(),
                "link set cb up".into(),
                format!("route add {LB_IP}/32 via {NODE_A}"),
            ])
            .expect("the client's LAN");
        a.ip_batch(&[
            format!("addr add {NODE_A}/24 dev eth0"),
            "link set eth0 up".into(),
            format!("route add 10.244.1.0/24 via {NODE_B}"),
        ])
        .expect("node A's addresses and routes");
        b.ip_batch(&[
            format!("addr add {NODE_B}/24 dev eth0"),
            "link set eth0 up".into(),
            format!(
                "link add pod0 type veth peer name eth0 netns {}",
                pod.name()
            ),
            "addr add 10.244.1.1/24 dev pod0".into(),
            "link set pod0 up".into(),
        ])
        .expect("node B's addresses and its pod's link");
        pod.ip_batch(&[
            format!("addr add {POD}/24 dev eth0"),
            "link set eth0 up".into(),
            "route add default via 10.244.1.1".into(),
        ])
        .expect("the pod's address and route");
        for node in [&a, &b] {
            node.sysctl("net.ipv4.ip_forward", "1").expect("forwarding");
        }
        let echo = EchoServer::start(&pod, "pod", kpr_tests::cluster::ECHO_PORT)
            .expect("the pod's echo server");
        Lab {
            _echo: echo,
            client,
            a,
            b,
            _pod: pod,
        }
    }
}

/// A LoadBalancer Service (eTP Cluster) with a TCP and a UDP port and their nodePorts; its one
/// endpoint is the pod behind node B.
fn manifests() -> Vec<(&'static str, String)> {
    let svc = Service::new("web")
        .load_balancer(&LB_IP.to_string())
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .named("tcp")
        .node_port(TCP_NODE_PORT)
        .udp(80, 8080)
        .named("udp")
        .node_port(UDP_NODE_PORT);
    let slice = EndpointSlice::for_service(&svc).endpoint(Endpoint::ready(POD).on_node("node-b"));
    vec![("web.yaml", yaml(&[&svc, &slice]))]
}

/// Starts the agent of `node` (address `ip`) in `mode`, its socket programs on `cgroup`, with
/// the XDP program on `xdp` (its `--xdp-interfaces`) if any.
fn agent<'n>(
    node: &'n Netns,
    cgroup: &Cgroup,
    ip: Ipv4Addr,
    mode: &str,
    xdp: Option<&str>,
) -> Agent<'n> {
    // The harness opens nodePorts on node A's address (its `--nodeport-addresses`); node B
    // opens them on its own too, as every node of a cluster does.
    let mut opts = agent_options(cgroup)
        .arg("--nodeport-addresses")
        .arg(format!("{ip}/32"))
        .arg("--nodeport-mode")
        .arg(mode);
    if let Some(interface) = xdp {
        opts = opts.arg("--xdp-interfaces").arg(interface);
    }
    Agent::start(node, &opts, &manifests()).unwrap_or_else(|e| panic!("agent on {ip}: {e}"))
}

/// Both nodes' agents in one `--nodeport-mode`, each on a cgroup of its own (the agents are
/// dropped first, as the fields are declared).
struct Agents<'l> {
    a: Agent<'l>,
    b: Agent<'l>,
    _cgroups: (Cgroup, Cgroup),
}

impl<'l> Agents<'l> {
    fn start(lab: &'l Lab, mode: &str) -> Self {
        Self::start_with_xdp(lab, mode, None)
    }

    /// With the XDP program on node A's `xdp` interface.
    fn start_with_xdp(lab: &'l Lab, mode: &str, xdp: Option<&str>) -> Self {
        let tag = if xdp.is_some() { "x" } else { "" };
        let cgroups = (
            Cgroup::new(&format!("{mode}{tag}a")).unwrap(),
            Cgroup::new(&format!("{mode}{tag}b")).unwrap(),
        );
        Agents {
            a: agent(&lab.a, &cgroups.0, NODE_A, mode, xdp),
            b: agent(&lab.b, &cgroups.1, NODE_B, mode, None),
            _cgroups: cgroups,
        }
    }
}

fn maps_of(agent: &Agent) -> PathBuf {
    agent.bpffs_path().expect("an ebpf agent").join("maps")
}

fn dsr_counts(agent: &Agent) -> DsrCounts {
    DsrCounts::from_pin(&maps_of(agent)).expect("reading KPR_DSR_STATS")
}

/// One IPv4 TCP/UDP frame a capture saw.
#[derive(Debug, Clone, Copy)]
struct Frame {
    outgoing: bool,
    proto: u8,
    src: SocketAddr,
    dst: SocketAddr,
    /// The first IPv4 option's type, if the header has options.
    option: Option<u8>,
}

/// An AF_PACKET socket on one interface of a namespace: every frame the interface receives
/// (before tc ingress) and sends (after tc egress).
struct Capture {
    fd: OwnedFd,
}

impl Capture {
    fn open(ns: &Netns, interface: &str) -> Capture {
        let interface = interface.to_string();
        let fd = ns
            .run(move || -> std::io::Result<OwnedFd> {
                let proto = (libc::ETH_P_ALL as u16).to_be();
                // SAFETY: plain arguments.
                let raw = unsafe {
                    libc::socket(
                        libc::AF_PACKET,
                        libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        i32::from(proto),
                    )
                };
                if raw < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: a new fd owned by nothing else.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                let name = std::ffi::CString::new(interface).map_err(std::io::Error::other)?;
                // SAFETY: a NUL-terminated name.
                let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
                if ifindex == 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: all-zero is a valid sockaddr_ll.
                let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                sll.sll_family = libc::AF_PACKET as u16;
                sll.sll_protocol = proto;
                sll.sll_ifindex = ifindex as i32;
                // SAFETY: `sll` is a live sockaddr_ll of the size given.
                let rc = unsafe {
                    libc::bind(
                        fd.as_raw_fd(),
                        (&sll as *const libc::sockaddr_ll).cast(),
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(fd)
            })
            .expect("entering the namespace")
            .expect("an AF_PACKET capture");
        let c = Capture { fd };
        // Frames of any interface queued between socket() and bind().
        c.frames();
        c
    }

    /// The IPv4 TCP/UDP frames captured since the last call.
    fn frames(&self) -> Vec<Frame> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            // SAFETY: all-zero is a valid sockaddr_ll.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: `buf` and `sll` are live buffers of the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "capture: {e}");
                return out;
            }
            if let Some(f) = parse_frame(&buf[..n as usize], sll.sll_pkttype) {
                out.push(f);
            }
        }
    }
}

fn parse_frame(b: &[u8], pkttype: u8) -> Option<Frame> {
    if b.len() < 14 + 20 || b[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &b[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let proto = ip[9];
    if (proto != 6 && proto != 17) || ip.len() < ihl + 4 {
        return None;
    }
    let addr = |o: usize| Ipv4Addr::new(ip[o], ip[o + 1], ip[o + 2], ip[o + 3]);
    let port = |o: usize| u16::from_be_bytes([ip[ihl + o], ip[ihl + o + 1]]);
    Some(Frame {
        outgoing: pkttype == libc::PACKET_OUTGOING,
        proto,
        src: SocketAddr::from((addr(12), port(0))),
        dst: SocketAddr::from((addr(16), port(2))),
        option: (ihl > 20).then(|| ip[20]),
    })
}

/// REQUESTS TCP and REQUESTS UDP requests from the client to node A's nodePorts, each on a
/// connected socket (so an answer is taken only from the address the client sent to).
fn requests(lab: &Lab) -> (Vec<kpr_tests::Reply>, Vec<kpr_tests::Reply>) {
    let t = Duration::from_secs(3);
    let tcp = (0..REQUESTS)
        .map(|i| {
            kpr_tests::tcp_request(&lab.client, SocketAddr::from((NODE_A, TCP_NODE_PORT)), t)
                .unwrap_or_else(|e| panic!("TCP request {i} to node A's nodePort: {e:?}"))
        })
        .collect();
    let udp = (0..REQUESTS)
        .map(|i| {
            kpr_tests::udp_request(&lab.client, SocketAddr::from((NODE_A, UDP_NODE_PORT)), t)
                .unwrap_or_else(|e| panic!("UDP request {i} to node A's nodePort: {e:?}"))
        })
        .collect();
    (tcp, udp)
}

/// `proxy inspect --maps` / `proxy trace` in `node`, on `agent`'s pins.
fn proxy_cmd(node: &Netns, agent: &Agent, args: &[&str]) -> String {
    let pins = agent
        .bpffs_path()
        .expect("pins")
        .to_string_lossy()
        .into_owned();
    kpr_tests::proxy_stdout(
        node.exec(agent.binary())
            .expect("a command in the node namespace")
            .args(args)
            .args(["--bpffs-path", &pins]),
    )
}

/// Every request was answered by the pod, which saw the client's own address (dsr).
fn answered_with_the_clients_address(tcp: &[kpr_tests::Reply], udp: &[kpr_tests::Reply]) {
    for r in tcp.iter().chain(udp) {
        assert_eq!(r.pod, "pod", "{r:?}");
        assert_eq!(
            r.peer.ip(),
            IpAddr::V4(CLIENT),
            "dsr keeps the client's address: the pod saw {r:?}"
        );
    }
}

fn is_from_pod(f: &Frame) -> bool {
    f.src.ip() == IpAddr::V4(POD)
}

#[test]
fn dsr_answers_the_client_from_the_backends_node_with_its_address_kept() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let agents = Agents::start(&lab, "dsr");
    let (agent_a, agent_b) = (&agents.a, &agents.b);
    let (cap_a, cap_b) = (Capture::open(&lab.a, "eth0"), Capture::open(&lab.b, "eth0"));
    let (before_a, before_b) = (dsr_counts(agent_a), dsr_counts(agent_b));

    let (tcp, udp) = requests(&lab);

    let (frames_a, frames_b) = (cap_a.frames(), cap_b.frames());
    let a = dsr_counts(agent_a).since(before_a);
    let b = dsr_counts(agent_b).since(before_b);
    eprintln!("node A (entry): {a:?}\nnode B (backend): {b:?}");
    answered_with_the_clients_address(&tcp, &udp);
    // Node A: the client's packets go on to the pod (the first of a TCP flow and every UDP
    // datagram with the option), and nothing of the pod's comes back.
    let to_pod: Vec<&Frame> = frames_a
        .iter()
        .filter(|f| f.outgoing && f.dst.ip() == IpAddr::V4(POD))
        .collect();
    let syns_with_option = to_pod
        .iter()
        .filter(|f| f.proto == 6 && f.option == Some(DSR_OPT_TYPE))
        .count();
    let udp_to_pod: Vec<&&Frame> = to_pod.iter().filter(|f| f.proto == 17).collect();
    assert!(
        syns_with_option >= REQUESTS,
        "node A sends each TCP flow's SYN to the pod with the DSR option: {to_pod:#?}"
    );
    assert_eq!(udp_to_pod.len(), REQUESTS, "{to_pod:#?}");
    assert!(
        udp_to_pod.iter().all(|f| f.option == Some(DSR_OPT_TYPE)),
        "every UDP datagram carries the option: {udp_to_pod:#?}"
    );
    let replies_at_a: Vec<&Frame> = frames_a.iter().filter(|f| is_from_pod(f)).collect();
    assert!(
        replies_at_a.is_empty(),
        "no answer of the pod passes node A in dsr mode: {replies_at_a:#?}"
    );
    assert!(
        frames_a
            .iter()
            .all(|f| f.outgoing || f.src.ip() == IpAddr::V4(CLIENT)),
        "node A receives nothing but the client's packets: {frames_a:#?}"
    );
    // Node B: the answers leave for the client from node A's nodePorts.
    let answered = |port: u16| {
        frames_b
            .iter()
            .filter(|f| {
                f.outgoing
                    && f.src == SocketAddr::from((NODE_A, port))
                    && f.dst.ip() == IpAddr::V4(CLIENT)
            })
            .count()
    };
    assert!(
        answered(TCP_NODE_PORT) >= 3 * REQUESTS,
        "node B answers each TCP flow (SYN-ACK, greeting, echo) from node A's nodePort: \
         {frames_b:#?}"
    );
    assert_eq!(answered(UDP_NODE_PORT), REQUESTS, "{frames_b:#?}");
    // The LoadBalancer IP the same way: answered from LB_IP:80 by node B.
    let lb = SocketAddr::from((LB_IP, 80));
    let t = Duration::from_secs(3);
    let r = kpr_tests::tcp_request(&lab.client, lb, t)
        .unwrap_or_else(|e| panic!("TCP to the LoadBalancer IP: {e:?}"));
    assert_eq!(r.peer.ip(), IpAddr::V4(CLIENT), "{r:?}");
    let r = kpr_tests::udp_request(&lab.client, lb, t)
        .unwrap_or_else(|e| panic!("UDP to the LoadBalancer IP: {e:?}"));
    assert_eq!(r.peer.ip(), IpAddr::V4(CLIENT), "{r:?}");
    let lb_frames = cap_b.frames();
    assert!(
        lb_frames
            .iter()
            .any(|f| f.outgoing && f.src == lb && f.dst.ip() == IpAddr::V4(CLIENT)),
        "node B answers from the LoadBalancer IP: {lb_frames:#?}"
    );
    assert!(
        !cap_a.frames().iter().any(is_from_pod),
        "no answer passes node A"
    );
    // The counters say the same.
    assert!(
        a.options_added >= 2 * REQUESTS as u64 && a.options_failed == 0,
        "node A: {a:?}"
    );
    assert_eq!(
        (a.recorded, a.replies_rewritten),
        (0, 0),
        "node A has no backend: {a:?}"
    );
    assert!(b.recorded >= 2 * REQUESTS as u64, "node B: {b:?}");
    assert_eq!(
        b.replies_rewritten as usize,
        answered(TCP_NODE_PORT) + answered(UDP_NODE_PORT),
        "node B rewrote exactly the answers it sent: {b:?}"
    );
    assert_eq!(b.options_added, 0, "{b:?}");
    // What the tools say.
    let inspect = proxy_cmd(&lab.a, agent_a, &["inspect", "--maps"]);
    // Pinned TCX links from 6.6; netlink filters, which have no pin, before.
    let egress = if proxy::dataplane::ebpf::tc::tcx_supported() {
        "egress program on eth0"
    } else {
        "egress program not pinned"
    };
    assert!(
        inspect.contains(&format!("DSR (--nodeport-mode dsr|hybrid), {egress}")),
        "{inspect}"
    );
    assert!(inspect.contains("[round-robin, dsr]"), "{inspect}");
    let trace = proxy_cmd(
        &lab.a,
        agent_a,
        &[
            "trace",
            "--from-outside",
            &CLIENT.to_string(),
            &format!("{NODE_A}:{TCP_NODE_PORT}/tcp"),
        ],
    );
    assert!(trace.contains("dsr: not masqueraded"), "{trace}");
    let inspect_b = proxy_cmd(&lab.b, agent_b, &["inspect", "--maps"]);
    assert!(inspect_b.contains("replies answered from the frontend"));
    // `/metrics` on each node shows what its maps hold.
    for agent in [agent_a, agent_b] {
        let c = dsr_counts(agent);
        let text = agent.metrics().expect("GET /metrics");
        for (event, n) in [
            ("option_added", c.options_added),
            ("option_failed", c.options_failed),
            ("recorded", c.recorded),
            ("reply_rewritten", c.replies_rewritten),
        ] {
            let line = format!("kpr_dsr_packets_total{{event=\"{event}\"}} {n}\n");
            assert!(text.contains(&line), "{line:?} missing:\n{text}");
        }
    }
}

#[test]
fn snat_sends_the_answers_back_through_the_node_the_client_sent_to() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let agents = Agents::start(&lab, "snat");
    let cap_a = Capture::open(&lab.a, "eth0");

    let (tcp, udp) = requests(&lab);

    let frames_a = cap_a.frames();
    for r in tcp.iter().chain(&udp) {
        assert_eq!(r.pod, "pod", "{r:?}");
        assert_eq!(
            r.peer.ip(),
            IpAddr::V4(NODE_A),
            "snat masquerades to node A: {r:?}"
        );
    }
    let replies_at_a = frames_a.iter().filter(|f| is_from_pod(f)).count();
    assert!(
        replies_at_a >= 2 * REQUESTS,
        "the pod's answers come back through node A: {frames_a:#?}"
    );
    assert!(
        frames_a.iter().all(|f| f.option.is_none()),
        "no DSR option in snat mode: {frames_a:#?}"
    );
    for agent in [&agents.a, &agents.b] {
        assert_eq!(dsr_counts(agent), DsrCounts::default());
    }
}

#[test]
fn hybrid_returns_tcp_directly_and_masquerades_udp() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let agents = Agents::start(&lab, "hybrid");
    let cap_a = Capture::open(&lab.a, "eth0");

    let (tcp, udp) = requests(&lab);

    let frames_a = cap_a.frames();
    for r in &tcp {
        assert_eq!(r.peer.ip(), IpAddr::V4(CLIENT), "TCP by DSR: {r:?}");
    }
    for r in &udp {
        assert_eq!(r.peer.ip(), IpAddr::V4(NODE_A), "UDP masqueraded: {r:?}");
    }
    let back: Vec<&Frame> = frames_a.iter().filter(|f| is_from_pod(f)).collect();
    assert!(
        back.iter().all(|f| f.proto == 17) && back.len() >= REQUESTS,
        "only UDP answers pass node A: {back:#?}"
    );
    let a = dsr_counts(&agents.a);
    assert!(
        a.options_added >= REQUESTS as u64,
        "an option on each TCP flow's SYN: {a:?}"
    );
    assert!(
        frames_a
            .iter()
            .filter(|f| f.outgoing && f.proto == 17)
            .all(|f| f.option.is_none()),
        "no option on masqueraded UDP: {frames_a:#?}"
    );
}

/// XDP on node A's LAN interface in dsr mode: XDP cannot grow a packet by the option, so it
/// leaves each flow's first packet (and every UDP datagram, which carries the option) to tc,
/// and sends a TCP flow's later packets on to node B itself; the answers still go from node B
/// straight to the client, with the client's address kept.
#[test]
fn dsr_with_xdp_sends_a_tcp_flows_later_packets_by_xdp_and_the_rest_by_tc() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    // What XDP sends out of node A's eth0 arrives on the LAN's port `ca` as a NIC's frames
    // would, with what `kpr_tests::remote` sets up for the same reason: a pass-all XDP program
    // on the veth peer, and whole checksums from the client's sockets.
    let _pass = lab
        .client
        .run(|| kpr_tests::remote::xdp_pass("ca"))
        .expect("entering the client namespace")
        .expect("a pass-all XDP program on ca");
    for dev in ["br0", "ca"] {
        kpr_tests::remote::tx_checksum_offload_off(&lab.client, dev)
            .expect("ethtool -K tx off (cargo xtask setup installs ethtool)");
    }
    let agents = Agents::start_with_xdp(&lab, "dsr", Some("eth0"));
    let cap_a = Capture::open(&lab.a, "eth0");
    let xdp = || XdpCounts::from_pin(&maps_of(&agents.a)).expect("reading KPR_XDP_STATS");
    let (xdp_before, dsr_before) = (xdp(), dsr_counts(&agents.a));

    let (tcp, udp) = requests(&lab);

    let x = xdp().since(xdp_before);
    let d = dsr_counts(&agents.a).since(dsr_before);
    eprintln!("node A: XDP {x:?}, DSR {d:?}");
    answered_with_the_clients_address(&tcp, &udp);
    // Each TCP flow: its SYN passed to tc (which adds the option), then at least its ACK,
    // request and FIN sent by XDP. Each UDP datagram carries the option: passed to tc.
    assert!(
        x.passed_new >= 2 * REQUESTS as u64,
        "each TCP flow's SYN and each UDP flow's first datagram left to tc: {x:?}"
    );
    assert!(
        x.sent >= 3 * REQUESTS as u64,
        "a TCP flow's later packets sent on by XDP: {x:?}"
    );
    assert!(
        d.options_added >= 2 * REQUESTS as u64 && d.options_failed == 0,
        "tc added the option to each SYN and datagram: {d:?}"
    );
    let replies_at_a: Vec<Frame> = cap_a.frames().into_iter().filter(is_from_pod).collect();
    assert!(
        replies_at_a.is_empty(),
        "no answer of the pod passes node A: {replies_at_a:#?}"
    );
    let trace = proxy_cmd(
        &lab.a,
        &agents.a,
        &[
            "trace",
            "--from-outside",
            &CLIENT.to_string(),
            &format!("{NODE_A}:{TCP_NODE_PORT}/tcp"),
        ],
    );
    for want in [
        "XDP on eth0: the first packet is passed to tc",
        "later packets to the backend: sent back out of eth0 by XDP",
        "dsr: not masqueraded",
    ] {
        assert!(trace.contains(want), "{want:?} missing:\n{trace}");
    }
}
