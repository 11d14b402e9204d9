//! The network of a cluster with real nodes, made of network namespaces so this machine's own
//! networking is never touched: `<prefix>-net` holds a bridge (the "Docker network" of kind:
//! 172.18.0.1/16, where the control plane listens), and every node `<prefix>-node-<i>` is a
//! namespace with one veth on that bridge (172.18.0.<10+i>), a default route to it, and a route
//! to every other node's pod CIDR (10.244.<i>.0/24) through that node, as kind's kindnet routes.
//! A dual-stack network adds kind's IPv6 Docker network beside it: the bridge has
//! fc00:f853:ccd:e793::1/64, node i fc00:f853:ccd:e793::<10+i> and the pod CIDR
//! fd00:10:244:<i>::/64, routed the same way.
//!
//! Owns: the namespaces named by its prefix, their links, routes and sysctls. Not the pods'
//! network inside a node (the node's CNI plugin makes that).

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context as _};

/// The control plane's address in the cluster network (kind's Docker network gateway).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 1);
const PREFIX_LEN: u8 = 16;
/// The control plane's IPv6 address in a dual-stack cluster network (kind's IPv6 Docker network).
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfc00, 0xf853, 0xccd, 0xe793, 0, 0, 0, 1);
const PREFIX_LEN6: u8 = 64;
/// The pods' IPv6 addresses, every node's /64 inside it (kind's default dual-stack podSubnet is a
/// /56 of it).
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/56";
/// The Services' IPv6 addresses in a dual-stack cluster (kind's default).
pub const SERVICE_CIDR6: &str = "fd00:10:96::/112";

/// One node's place in the network.
#[derive(Debug, Clone)]
pub struct NodeAddress {
    /// 1-based.
    pub index: usize,
    /// `<prefix>-node-<index>`, also the netns name and the Kubernetes node name.
    pub name: String,
    pub netns: PathBuf,
    pub ip: Ipv4Addr,
    /// `10.244.<index>.0/24`.
    pub pod_cidr: String,
    /// In a dual-stack network: `fc00:f853:ccd:e793::<10+index>` and `fd00:10:244:<index>::/64`.
    pub v6: Option<NodeAddress6>,
}

/// A node's IPv6 place in a dual-stack network.
#[derive(Debug, Clone)]
pub struct NodeAddress6 {
    pub ip: Ipv6Addr,
    pub pod_cidr: String,
}

impl NodeAddress {
    /// `--node-ip` of the node's kubelet: its IPv4 address, then its IPv6 one if it has one.
    pub fn node_ips(&self) -> String {
        match &self.v6 {
            Some(v6) => format!("{},{}", self.ip, v6.ip),
            None => self.ip.to_string(),
        }
    }
}

/// A cluster network: which namespaces, which addresses.
#[derive(Debug, Clone)]
pub struct ClusterNetwork {
    pub prefix: String,
    pub nodes: Vec<NodeAddress>,
    /// Whether the network carries IPv6 too.
    pub dual_stack: bool,
}

impl ClusterNetwork {
    /// The plan for `nodes` nodes, IPv4 only or `dual_stack` (nothing is created).
    pub fn plan(prefix: &str, nodes: usize, dual_stack: bool) -> anyhow::Result<ClusterNetwork> {
        if nodes == 0 || nodes > 200 {
            bail!("a cluster network has 1 to 200 nodes, not {nodes}");
        }
        let nodes = (1..=nodes)
            .map(|index| {
                let name = format!("{prefix}-node-{index}");
                NodeAddress {
                    index,
                    netns: netns_path(&name),
                    name,
                    ip: Ipv4Addr::new(172, 18, 0, 10 + index as u8),
                    pod_cidr: format!("10.244.{index}.0/24"),
                    v6: dual_stack.then(|| NodeAddress6 {
                        ip: Ipv6Addr::new(
                            0xfc00,
                            0xf853,
                            0xccd,
                            0xe793,
                            0,
                            0,
                            0,
                            10 + index as u16,
                        ),
                        pod_cidr: format!("fd00:10:244:{index:x}::/64"),
                    }),
                }
            })
            .collect();
        Ok(ClusterNetwork {
            prefix: prefix.to_string(),
            nodes,
            dual_stack,
        })
    }

    /// The control plane's namespace, `<prefix>-net`.
    pub fn hub(&self) -> String {
        format!("{}-net", self.prefix)
    }

    pub fn hub_netns(&self) -> PathBuf {
        netns_path(&self.hub())
    }

    /// Creates the namespaces, the bridge, the veths and the routes (after removing what a
    /// previous cluster of the same prefix left).
    pub fn create(&self) -> anyhow::Result<()> {
        delete_namespaces(&self.prefix)?;
        let hub = self.hub();
        ip(&["netns", "add", &hub])?;
        ipn(&hub, &["link", "set", "lo", "up"])?;
        ipn(&hub, &["link", "add", "br0", "type", "bridge"])?;
        ipn(
            &hub,
            &[
                "addr",
                "add",
                &format!("{GATEWAY}/{PREFIX_LEN}"),
                "dev",
                "br0",
            ],
        )?;
        if self.dual_stack {
            // nodad: the address is usable at once (nothing else on this bridge can own it).
            let gateway6 = format!("{GATEWAY6}/{PREFIX_LEN6}");
            ipn(&hub, &["addr", "add", &gateway6, "dev", "br0", "nodad"])?;
            sysctl(&hub, "net.ipv6.conf.all.forwarding", "1")?;
        }
        ipn(&hub, &["link", "set", "br0", "up"])?;
        sysctl(&hub, "net.ipv4.ip_forward", "1")?;
        for node in &self.nodes {
            let ns = &node.name;
            ip(&["netns", "add", ns])?;
            let hub_end = format!("veth{}", node.index);
            ipn(
                &hub,
                &[
                    "link", "add", &hub_end, "type", "veth", "peer", "name", "eth0", "netns", ns,
                ],
            )?;
            ipn(&hub, &["link", "set", &hub_end, "master", "br0", "up"])?;
            ipn(ns, &["link", "set", "lo", "up"])?;
            ipn(
                ns,
                &[
                    "addr",
                    "add",
                    &format!("{}/{PREFIX_LEN}", node.ip),
                    "dev",
                    "eth0",
                ],
            )?;
            ipn(ns, &["link", "set", "eth0", "up"])?;
            ipn(
                ns,
                &["route", "add", "default", "via", &GATEWAY.to_string()],
            )?;
            // The hub routes replies to pods (pods reach the API server without masquerade).
            ipn(
                &hub,
                &["route", "add", &node.pod_cidr, "via", &node.ip.to_string()],
            )?;
            if let Some(v6) = &node.v6 {
                let address = format!("{}/{PREFIX_LEN6}", v6.ip);
                ipn(ns, &["addr", "add", &address, "dev", "eth0", "nodad"])?;
                ipn(
                    ns,
                    &[
                        "-6",
                        "route",
                        "add",
                        "default",
                        "via",
                        &GATEWAY6.to_string(),
                    ],
                )?;
                ipn(
                    &hub,
                    &[
                        "-6",
                        "route",
                        "add",
                        &v6.pod_cidr,
                        "via",
                        &v6.ip.to_string(),
                    ],
                )?;
                sysctl(ns, "net.ipv6.conf.all.forwarding", "1")?;
            }
            for (key, value) in [
                ("net.ipv4.ip_forward", "1"),
                // What kube-proxy (and kpr) need for Service traffic between pods on one bridge.
                ("net.bridge.bridge-nf-call-iptables", "1"),
                ("net.bridge.bridge-nf-call-ip6tables", "1"),
            ] {
                sysctl(ns, key, value)?;
            }
        }
        for node in &self.nodes {
            for other in self.nodes.iter().filter(|o| o.index != node.index) {
                ipn(
                    &node.name,
                    &[
                        "route",
                        "add",
                        &other.pod_cidr,
                        "via",
                        &other.ip.to_string(),
                    ],
                )?;
                if let Some(other6) = &other.v6 {
                    let via = other6.ip.to_string();
                    ipn(
                        &node.name,
                        &["-6", "route", "add", &other6.pod_cidr, "via", &via],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Deletes every namespace of this prefix.
    pub fn delete(&self) -> anyhow::Result<()> {
        delete_namespaces(&self.prefix)
    }
}

pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Deletes the namespaces `<prefix>-net` and `<prefix>-node-*`.
pub fn delete_namespaces(prefix: &str) -> anyhow::Result<()> {
    let Ok(entries) = fs::read_dir("/run/netns") else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name == format!("{prefix}-net")
            || name
                .strip_prefix(&format!("{prefix}-node-"))
                .is_some_and(|i| i.parse::<usize>().is_ok());
        if ours {
            ip(&["netns", "delete", &name])?;
        }
    }
    Ok(())
}

/// `ip <args>`.
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    run(Command::new("ip").args(args))
}

/// `ip -n <ns> <args>`.
pub fn ipn(ns: &str, args: &[&str]) -> anyhow::Result<()> {
    run(Command::new("ip").arg("-n").arg(ns).args(args))
}

/// `sysctl -w key=value` inside namespace `ns` (through /proc/sys, which shows the namespace of
/// the process reading it).
fn sysctl(ns: &str, key: &str, value: &str) -> anyhow::Result<()> {
    run(Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-q", "-w"])
        .arg(format!("{key}={value}")))
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
