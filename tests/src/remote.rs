//! A backend "on another node" for traffic from outside the node, added to a [`Cluster`]:
//!
//! ```text
//!   node --cl===eth0-- client (forwards) --rm===eth0-- remote (10.244.250.2/24, echo server)
//! ```
//!
//! The node routes 10.244.250.0/24 through the client, so a NodePort flow to this backend goes
//! back out of the node's interface it came in by: the case the eBPF backend's XDP program sends
//! itself (`XDP_TX`), and the hairpin every proxy makes for a backend on another node.
//!
//! The client's veth gets an XDP program that passes everything: a veth hands what its peer's XDP
//! sends to its stack only when it runs an XDP program itself (the kernel's `veth_xdp_flush`),
//! which a NIC does not need. Transmit checksum offload is off on the client's and the remote's
//! veths: a local socket's packet leaves a veth with only the pseudo-header summed (the skb says
//! the rest is to do), which a frame XDP sends on cannot carry, so its receiver would drop it;
//! packets from a wire, as XDP on a NIC gets them, carry their whole checksum. Both need
//! `ethtool` (`cargo xtask setup` installs it). Owns the namespace, the link and the echo server;
//! all go on drop.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::process::Command;

use crate::cluster::{Cluster, CLIENT_IP, ECHO_PORT};
use crate::echo::EchoServer;
use crate::netns::{run_cmd, Netns};
use crate::HarnessError;

/// The remote backend's address.
pub const REMOTE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 250, 2);
/// The name its echo server answers with.
pub const REMOTE_NAME: &str = "remote";

/// The remote backend (see the module doc).
pub struct Remote {
    _echo: EchoServer,
    _link: OwnedFd,
    ns: Netns,
}

impl Remote {
    /// Adds the backend behind `cluster`'s client.
    pub fn new(cluster: &Cluster) -> Result<Remote, HarnessError> {
        let client = &cluster.client;
        let ns = Netns::new("remote")?;
        client.ip_batch(&[
            format!("link add rm type veth peer name eth0 netns {}", ns.name()),
            "addr add 10.244.250.1/24 dev rm".into(),
            "link set rm up".into(),
        ])?;
        client.sysctl("net.ipv4.ip_forward", "1")?;
        ns.ip_batch(&[
            format!("addr add {REMOTE_IP}/24 dev eth0"),
            "link set eth0 up".into(),
            "route add default via 10.244.250.1".into(),
        ])?;
        cluster.node.ip(&[
            "route",
            "add",
            "10.244.250.0/24",
            "via",
            &CLIENT_IP.to_string(),
        ])?;
        let link = client
            .run(|| xdp_pass("eth0"))?
            .map_err(|e| HarnessError::Io {
                what: format!("a pass-all XDP program on eth0 of {}", client.name()),
                source: e,
            })?;
        for netns in [client, &ns] {
            tx_checksum_offload_off(netns, "eth0")?;
        }
        let echo = EchoServer::start(&ns, REMOTE_NAME, ECHO_PORT)?;
        Ok(Remote {
            _echo: echo,
            _link: link,
            ns,
        })
    }

    /// The echo server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((REMOTE_IP, ECHO_PORT))
    }

    /// Its namespace.
    pub fn netns(&self) -> &Netns {
        &self.ns
    }
}

/// Turns transmit checksum offload off on `dev` of `netns` (`ethtool -K DEV tx off`): its local
/// sockets' packets then leave with their whole checksum, which a frame XDP sends on must carry
/// (see the module doc).
pub fn tx_checksum_offload_off(netns: &Netns, dev: &str) -> Result<(), HarnessError> {
    run_cmd(Command::new("ip").args([
        "netns",
        "exec",
        netns.name(),
        "ethtool",
        "-K",
        dev,
        "tx",
        "off",
    ]))
    .map(drop)
}

/// Loads `r0 = XDP_PASS; exit` and attaches it to `interface` of the calling thread's namespace
/// in native mode; the link lasts as long as the returned fd.
pub fn xdp_pass(interface: &str) -> std::io::Result<OwnedFd> {
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_PROG_TYPE_XDP: u32 = 6;
    const BPF_XDP: u32 = 37;
    const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
    let insns: [u64; 2] = [
        // mov64 r0, 2 (opcode 0xb7; the immediate is the high word)
        0xb7 | (2u64 << 32),
        // exit
        0x95,
    ];
    let license = c"GPL";
    // The head of `union bpf_attr` for BPF_PROG_LOAD, up to expected_attach_type.
    #[repr(C)]
    #[derive(Default)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }
    // The head of `union bpf_attr` for BPF_LINK_CREATE.
    #[repr(C)]
    struct LinkCreate {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
    }
    let load = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: BPF_XDP,
        ..ProgLoad::default()
    };
    let prog = bpf(BPF_PROG_LOAD, &load)?;
    let name = std::ffi::CString::new(interface).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(std::io::Error::last_os_error());
    }
    let create = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: XDP_FLAGS_DRV_MODE,
    };
    bpf(BPF_LINK_CREATE, &create)
}

/// The bpf(2) command `cmd` with `attr`, returning the fd it creates.
fn bpf<T>(cmd: libc::c_long, attr: &T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a live struct laid out as the head of the kernel's `union bpf_attr` for
    // `cmd`, and its size is what the kernel is told.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *const T).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
