//! A one-node cluster made of network namespaces:
//!
//! ```text
//!   pod i (10.244.(i+1).2/24) --eth0===p<i>-- node (ip_forward=1) --cl===eth0-- client (192.0.2.100/24)
//!   podclient (10.244.200.2/24) --eth0===pc--/   node side: 10.244.(i+1).1, 10.244.200.1, 192.0.2.1
//! ```
//!
//! With [`ClusterSpec::dual_stack`], every link also gets IPv6: pod i `fd00:10:244:<i+1>::2/64`
//! (node side `::1`), podclient `fd00:10:244:c8::2`, client `2001:db8:2::100/64` and node
//! `2001:db8:2::1` (added with `nodad`, so they are usable at once).
//!
//! Every non-node namespace has a default route via the node, so the service CIDR, node ports,
//! external IPs and LoadBalancer IPs all reach the node. The node's own default route points at the
//! client namespace (the "outside world"), so node-originated traffic to a service address has a
//! route, as on a real node. Veth pairs are created directly between the namespaces (never in the
//! machine's own namespace). Owns the namespaces and the pods' echo servers; all removed on drop.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;

use crate::echo::EchoServer;
use crate::netns::{unique_prefix, Netns};
use crate::HarnessError;

/// The node's address for NodePort traffic (node side of the client link).
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The external client's address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
/// The pod-source client's address (inside the cluster CIDR).
pub const PODCLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 200, 2);
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// IPv6 counterparts (dual-stack clusters only).
pub const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x100);
pub const PODCLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 200, 0, 0, 0, 2);
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/48";
pub const SERVICE_CIDR6: &str = "fd00:10:96::/112";
/// The node name the agent is started with; endpoints with this `nodeName` are local.
pub const NODE_NAME: &str = "node";
/// The port every echo server listens on (TCP and UDP).
pub const ECHO_PORT: u16 = 8080;

/// What to build.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Number of pod namespaces (at most 199).
    pub pods: usize,
    /// Start an echo server in every pod.
    pub echo: bool,
    /// Give every link IPv6 addresses as well.
    pub ipv6: bool,
}

impl ClusterSpec {
    pub fn pods(n: usize) -> ClusterSpec {
        ClusterSpec {
            pods: n,
            echo: true,
            ipv6: false,
        }
    }

    /// IPv4 and IPv6 on every link.
    pub fn dual_stack(mut self) -> Self {
        self.ipv6 = true;
        self
    }
}

/// One pod: its namespace, name (what its echo server answers with) and address.
#[derive(Debug)]
pub struct Pod {
    /// Declared first: the echo server stops before the namespace goes.
    echo: Mutex<Option<EchoServer>>,
    pub name: String,
    pub ip: Ipv4Addr,
    /// Set in dual-stack clusters.
    pub ip6: Option<Ipv6Addr>,
    pub ns: Netns,
}

impl Pod {
    /// `ip:8080`.
    pub fn echo_addr(&self) -> SocketAddr {
        SocketAddr::from((self.ip, ECHO_PORT))
    }

    /// The running echo server's (active, accepted) TCP connection counts, if it runs.
    pub fn echo_counts(&self) -> Option<(usize, usize)> {
        let echo = self.echo.lock().unwrap_or_else(|p| p.into_inner());
        echo.as_ref().map(|e| (e.active(), e.accepted()))
    }

    /// (Re)starts the echo server.
    pub fn start_echo(&self) -> Result<(), HarnessError> {
        let mut echo = self.echo.lock().unwrap_or_else(|p| p.into_inner());
        if echo.is_none() {
            *echo = Some(EchoServer::start_dual(
                &self.ns, &self.name, ECHO_PORT, self.ip6,
            )?);
        }
        Ok(())
    }

    /// Stops the echo server: its port refuses connections from now on.
    pub fn stop_echo(&self) {
        let taken = self.echo.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut e) = taken {
            e.stop();
        }
    }
}

/// The namespaces of one test cluster. Fields drop in declaration order: echo servers (in `pods`)
/// stop before the namespaces go.
#[derive(Debug)]
pub struct Cluster {
    pub pods: Vec<Pod>,
    pub podclient: Netns,
    pub client: Netns,
    pub node: Netns,
    prefix: String,
}

/// The name the task description uses for the same thing.
pub type Topology = Cluster;

impl Cluster {
    pub fn new(spec: ClusterSpec) -> Result<Cluster, HarnessError> {
        assert!(
            spec.pods < 200,
            "at most 199 pods (10.244.200.0/24 is the pod client's)"
        );
        crate::netns::remove_stale();
        let prefix = unique_prefix();
        let mut names = vec![
            format!("{prefix}-node"),
            format!("{prefix}-client"),
            format!("{prefix}-podclient"),
        ];
        names.extend((0..spec.pods).map(|i| format!("{prefix}-pod{i}")));
        let mut all = Netns::add_many(&names)?.into_iter();
        let (Some(node), Some(client), Some(podclient)) = (all.next(), all.next(), all.next())
        else {
            unreachable!("add_many returns every namespace it was given");
        };
        let pod_ns: Vec<Netns> = all.collect();
        let mut sysctls = vec![(&node, "net.ipv4.ip_forward")];
        if spec.ipv6 {
            // Per interface for IPv6: `default` covers the links created below. No duplicate
            // address detection, so link-local addresses (which neighbour discovery uses) work
            // the moment a link is up.
            sysctls.push((&node, "net.ipv6.conf.all.forwarding"));
            sysctls.push((&node, "net.ipv6.conf.default.forwarding"));
        }
        for ns in [&node, &client, &podclient].into_iter().chain(&pod_ns) {
            if spec.ipv6 {
                ns.sysctl("net.ipv6.conf.all.accept_dad", "0")?;
                ns.sysctl("net.ipv6.conf.default.accept_dad", "0")?;
            }
        }
        for (ns, key) in sysctls {
            ns.sysctl(key, "1")?;
        }
        let v6 = |node: Ipv6Addr, other: Ipv6Addr| spec.ipv6.then_some((node, other));
        // One `ip -batch` for the node (links, its addresses, its routes), then one per other
        // namespace: a few processes instead of dozens.
        let mut plan = LinkPlan::default();
        plan.link(
            "cl",
            &client,
            (NODE_IP, CLIENT_IP),
            v6(NODE_IP6, CLIENT_IP6),
        );
        plan.node.push(format!("route add default via {CLIENT_IP}"));
        if spec.ipv6 {
            plan.node
                .push(format!("route add default via {CLIENT_IP6}"));
        }
        let pc_node6 = Ipv6Addr::new(0xfd00, 0x10, 0x244, 200, 0, 0, 0, 1);
        let pc_node4 = Ipv4Addr::new(10, 244, 200, 1);
        plan.link(
            "pc",
            &podclient,
            (pc_node4, PODCLIENT_IP),
            v6(pc_node6, PODCLIENT_IP6),
        );
        let mut pods = Vec::new();
        for (i, ns) in pod_ns.into_iter().enumerate() {
            let third = u8::try_from(i + 1).expect("checked above");
            let ip = Ipv4Addr::new(10, 244, third, 2);
            let node4 = Ipv4Addr::new(10, 244, third, 1);
            let pod6 = Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(third), 0, 0, 0, 2);
            let node6 = Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(third), 0, 0, 0, 1);
            let addrs6 = v6(node6, pod6);
            plan.link(&format!("p{i}"), &ns, (node4, ip), addrs6);
            pods.push(Pod {
                name: format!("pod{i}"),
                ip,
                ip6: addrs6.map(|(_, pod)| pod),
                ns,
                echo: Mutex::new(None),
            });
        }
        node.ip_batch(&plan.node)?;
        for ns in [&client, &podclient]
            .into_iter()
            .chain(pods.iter().map(|p| &p.ns))
        {
            ns.ip_batch(&plan.others.remove(ns.name()).unwrap_or_default())?;
        }
        let cluster = Cluster {
            pods,
            podclient,
            client,
            node,
            prefix,
        };
        if spec.echo {
            for i in 0..spec.pods {
                cluster.start_echo(i)?;
            }
        }
        Ok(cluster)
    }

    /// The prefix every namespace of this cluster starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Endpoint addresses of all pods (`10.244.(i+1).2`).
    pub fn pod_ips(&self) -> Vec<Ipv4Addr> {
        self.pods.iter().map(|p| p.ip).collect()
    }

    /// IPv6 endpoint addresses of all pods (empty unless dual-stack).
    pub fn pod_ip6s(&self) -> Vec<Ipv6Addr> {
        self.pods.iter().filter_map(|p| p.ip6).collect()
    }

    /// (Re)starts pod `i`'s echo server.
    pub fn start_echo(&self, i: usize) -> Result<(), HarnessError> {
        self.pods[i].start_echo()
    }

    /// Stops pod `i`'s echo server: its port refuses connections from now on.
    pub fn stop_echo(&self, i: usize) {
        self.pods[i].stop_echo()
    }

    /// The pod with this name.
    pub fn pod(&self, name: &str) -> Option<&Pod> {
        self.pods.iter().find(|p| p.name == name)
    }
}

/// The `ip` commands that build the routed links: the node's, and each other namespace's.
#[derive(Default)]
struct LinkPlan {
    node: Vec<String>,
    others: std::collections::HashMap<String, Vec<String>>,
}

impl LinkPlan {
    /// A routed veth pair: `node_if` in the node namespace, `eth0` in `other`, with the (node,
    /// other) addresses (/24 for IPv4, /64 for IPv6) and default routes in `other` via the node.
    fn link(
        &mut self,
        node_if: &str,
        other: &Netns,
        (node_ip, other_ip): (Ipv4Addr, Ipv4Addr),
        v6: Option<(Ipv6Addr, Ipv6Addr)>,
    ) {
        if self.node.is_empty() {
            self.node.push("link set lo up".into());
        }
        self.node.push(format!(
            "link add {node_if} type veth peer name eth0 netns {}",
            other.name()
        ));
        self.node
            .push(format!("addr add {node_ip}/24 dev {node_if}"));
        let o = self.others.entry(other.name().to_string()).or_default();
        o.push("link set lo up".into());
        o.push(format!("addr add {other_ip}/24 dev eth0"));
        if let Some((node6, other6)) = v6 {
            self.node
                .push(format!("addr add {node6}/64 dev {node_if} nodad"));
            o.push(format!("addr add {other6}/64 dev eth0 nodad"));
        }
        self.node.push(format!("link set {node_if} up"));
        o.push("link set eth0 up".into());
        o.push(format!("route add default via {node_ip}"));
        if let Some((node6, _)) = v6 {
            // No `-6` in a batch line: the gateway names the family.
            o.push(format!("route add default via {node6}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{tcp_request, udp_request, ClientError};
    use std::time::Duration;

    const T: Duration = Duration::from_secs(2);

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn pods_are_reachable_from_every_client_namespace_without_a_proxy() {
        let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
        for (label, ns, source) in [
            ("client", &cluster.client, CLIENT_IP),
            ("podclient", &cluster.podclient, PODCLIENT_IP),
            ("node", &cluster.node, Ipv4Addr::new(10, 244, 2, 1)),
        ] {
            let r = tcp_request(ns, cluster.pods[1].echo_addr(), T)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_eq!(r.pod, "pod1", "{label}");
            assert_eq!(r.peer.ip(), source, "{label}: routed, not masqueraded");
            let u = udp_request(ns, cluster.pods[0].echo_addr(), T)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_eq!(u.pod, "pod0", "{label}");
        }
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn dual_stack_pods_answer_over_ipv6_from_every_client() {
        let cluster = Cluster::new(ClusterSpec::pods(2).dual_stack()).unwrap();
        let pod1 = SocketAddr::from((cluster.pods[1].ip6.unwrap(), ECHO_PORT));
        for (label, ns, source) in [
            ("client", &cluster.client, CLIENT_IP6),
            ("podclient", &cluster.podclient, PODCLIENT_IP6),
        ] {
            let r = tcp_request(ns, pod1, T).unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_eq!(r.pod, "pod1");
            assert_eq!(r.peer.ip(), source, "{label}");
            let u = udp_request(ns, pod1, T).unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_eq!(u.peer.ip(), source, "{label}");
        }
        let v4 = tcp_request(&cluster.client, cluster.pods[0].echo_addr(), T).unwrap();
        assert_eq!(
            v4.peer.ip(),
            CLIENT_IP,
            "IPv4 peers stay IPv4 (no mapped addresses)"
        );
        assert_eq!(cluster.pod_ip6s().len(), 2);
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn a_stopped_echo_server_refuses_and_restarts() {
        let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
        let addr = cluster.pods[0].echo_addr();
        assert!(tcp_request(&cluster.client, addr, T).is_ok());
        cluster.stop_echo(0);
        assert_eq!(
            tcp_request(&cluster.client, addr, T),
            Err(ClientError::Refused)
        );
        cluster.start_echo(0).unwrap();
        assert_eq!(tcp_request(&cluster.client, addr, T).unwrap().pod, "pod0");
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn held_connections_are_counted_and_closed_by_stop() {
        let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
        let addr = cluster.pods[0].echo_addr();
        let mut held = crate::client::tcp_hold(&cluster.podclient, addr).unwrap();
        assert!(held.is_alive());
        assert_eq!(cluster.pods[0].echo_counts(), Some((1, 1)));
        cluster.stop_echo(0);
        assert!(!held.is_alive(), "stop closes open connections");
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn all_namespaces_are_gone_after_drop() {
        let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
        let prefix = format!("{}-", cluster.prefix());
        drop(cluster);
        let left: Vec<_> = std::fs::read_dir("/run/netns")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let ours: Vec<_> = left.iter().filter(|n| n.starts_with(&prefix)).collect();
        assert!(ours.is_empty(), "left behind: {ours:?}");
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn cleanup_happens_on_panic_too() {
        let prefix = std::sync::Mutex::new(String::new());
        let result = std::panic::catch_unwind(|| {
            let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
            *prefix.lock().unwrap() = format!("{}-", cluster.prefix());
            panic!("test body fails");
        });
        assert!(result.is_err());
        let prefix = prefix.into_inner().unwrap();
        assert!(!prefix.is_empty());
        let ours = std::fs::read_dir("/run/netns")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(ours, 0);
    }
}
