//! Compiles one service port into kube-proxy-style iptables chains (pure, no I/O).
//!
//! Owns chain naming and the rules of the per-Service chains. Layout (nat table):
//!
//! ```text
//! PREROUTING/OUTPUT -> KPR-SERVICES:  -d clusterIP -p P --dport N -> KPR-CIP-h
//!                                     -d externalIP/LB IP ... -> KPR-EXT-h (or KPR-FW-h for LB
//!                                     IPs with loadBalancerSourceRanges)
//! KPR-SERVICES (dst-type LOCAL) -> KPR-NODEPORTS: -p P --dport NP -> KPR-EXT-h
//! KPR-CIP-h / KPR-EXT-h: per source class (node: src-type LOCAL, pod: -s clusterCIDR,
//!            external: the rest):
//!            KPR-MARK-MASQ when `selection::route` says so, then -> KPR-SVC-h of its route
//! KPR-SVC-h: [CONNMARK id, least-connection] [recent --rcheck per endpoint, affinity]
//!            statistic nth round-robin -> KPR-SEP-h | -> KPR-LC-h (least-connection pick)
//!            | MARK reject/drop bit (no endpoint; the filter table acts on it)
//! KPR-SEP-h: hairpin -> KPR-MARK-MASQ, [recent --set], DNAT to the endpoint
//! ```
//!
//! Hashes are FNV-1a of the service port (and route or endpoint), so names are stable across
//! restarts and never collide with kube-proxy's `KUBE-` chains.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

use crate::dataplane::nftables::compile::{Representatives, Tag, TargetIds};
use crate::dataplane::ProxyState;
use crate::model::{Algorithm, Endpoint, ServicePort, ServicePortName};
use crate::selection::{route, DestKind, EmptyVerdict, SelectedEndpoints};

pub const SERVICES: &str = "KPR-SERVICES";
pub const NODEPORTS: &str = "KPR-NODEPORTS";
pub const MARK_MASQ_CHAIN: &str = "KPR-MARK-MASQ";
pub const POSTROUTING: &str = "KPR-POSTROUTING";
/// Filter table: acts on the drop/reject marks and rejects unexposed clusterIP ports.
pub const FILTER: &str = "KPR-FILTER";
/// Filter table: one REJECT per clusterIP (ports the Service does not expose).
pub const CLUSTER_IPS: &str = "KPR-CLUSTER-IPS";

pub const MARK_MASQ: u32 = 0x4000;
pub const MARK_DROP: u32 = 0x8000;
pub const MARK_REJECT: u32 = 0x10000;

/// FNV-1a, 64 bits: stable chain-name hashes without a crypto dependency.
pub fn hash(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016X}")
}

/// The endpoint chain of `ep` for the service port called `spn`.
pub fn sep_chain(spn: &str, ep: SocketAddrV4) -> String {
    format!("KPR-SEP-{}", hash(&[spn, &ep.to_string()]))
}

/// A least-connection target: the chain whose single rule the controller rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LcTarget {
    pub id: u32,
    pub chain: String,
    pub spn: String,
    pub endpoints: Vec<SocketAddrV4>,
}

/// Everything one service port contributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    /// Chains owned by this service port (nat table), with their rules (without `-A NAME`).
    pub chains: BTreeMap<String, Vec<String>>,
    /// Rules it adds to KPR-SERVICES.
    pub services: Vec<String>,
    /// Rules it adds to KPR-NODEPORTS.
    pub nodeports: Vec<String>,
    /// clusterIPs (filter table reject of unexposed ports).
    pub cluster_ips: Vec<Ipv4Addr>,
    /// Least-connection targets (their chains are written from the controller's pick).
    pub lc: Vec<LcTarget>,
}

const CLASS_NODE: usize = 0;
const CLASS_POD: usize = 1;

fn v4(addrs: &[IpAddr]) -> Vec<Ipv4Addr> {
    addrs
        .iter()
        .filter_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
        .collect()
}

fn v4_endpoints(eps: &[Endpoint]) -> Vec<SocketAddrV4> {
    eps.iter()
        .filter_map(|e| match e.addr {
            IpAddr::V4(a) => Some(SocketAddrV4::new(a, e.port)),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// Compiles one service port; `ids` keeps least-connection conntrack marks stable.
pub fn compile(
    state: &ProxyState,
    spn: &ServicePortName,
    reps: &Representatives,
    ids: &mut TargetIds,
) -> Compiled {
    let (Some(svc), Some(sel)) = (state.services.get(spn), state.selected.get(spn)) else {
        ids.retain(spn, &[]);
        return Compiled::default();
    };
    let name = spn.to_string();
    let mut b = Builder {
        svc,
        sel,
        state,
        reps,
        ids,
        spn,
        name: &name,
        out: Compiled::default(),
        tags: Vec::new(),
    };
    b.build();
    let tags = std::mem::take(&mut b.tags);
    b.ids.retain(spn, &tags);
    b.out
}

struct Builder<'a> {
    svc: &'a ServicePort,
    sel: &'a SelectedEndpoints,
    state: &'a ProxyState,
    reps: &'a Representatives,
    ids: &'a mut TargetIds,
    spn: &'a ServicePortName,
    name: &'a str,
    out: Compiled,
    tags: Vec<Tag>,
}

impl Builder<'_> {
    fn build(&mut self) {
        let proto = self.svc.protocol.lower();
        let port = self.svc.port;
        let cips = v4(&self.svc.cluster_ips);
        if !cips.is_empty() {
            let fe = self.frontend_chain(DestKind::ClusterIp);
            for ip in &cips {
                self.out.services.push(format!(
                    "-d {ip}/32 -p {proto} -m {proto} --dport {port} -m comment --comment \"{} cluster IP\" -j {fe}",
                    self.name
                ));
            }
            self.out.cluster_ips = cips;
        }
        let ext_ips = v4(&self.svc.external_ips);
        let lb_ips = v4(&self.svc.load_balancer_ips);
        let has_v4 = !self.out.cluster_ips.is_empty() || !ext_ips.is_empty() || !lb_ips.is_empty();
        if ext_ips.is_empty() && lb_ips.is_empty() && (self.svc.node_port == 0 || !has_v4) {
            return;
        }
        let fe = self.frontend_chain(DestKind::ExternalIp);
        for ip in ext_ips {
            self.out.services.push(format!(
                "-d {ip}/32 -p {proto} -m {proto} --dport {port} -m comment --comment \"{} external IP\" -j {fe}",
                self.name
            ));
        }
        if !lb_ips.is_empty() {
            let target = if self.svc.source_ranges.is_empty() {
                fe.clone()
            } else {
                self.firewall_chain(&fe, &lb_ips)
            };
            for ip in lb_ips {
                self.out.services.push(format!(
                    "-d {ip}/32 -p {proto} -m {proto} --dport {port} -m comment --comment \"{} loadbalancer IP\" -j {target}",
                    self.name
                ));
            }
        }
        if self.svc.node_port != 0 && has_v4 {
            self.out.nodeports.push(format!(
                "-p {proto} -m {proto} --dport {} -m comment --comment \"{} node port\" -j {fe}",
                self.svc.node_port, self.name
            ));
        }
    }

    /// KPR-FW-h: loadBalancerSourceRanges (plus the node itself and the LB IP itself).
    fn firewall_chain(&mut self, fe: &str, lb_ips: &[Ipv4Addr]) -> String {
        let chain = format!("KPR-FW-{}", hash(&[self.name, "fw"]));
        let mut rules = Vec::new();
        for r in &self.svc.source_ranges {
            if let ipnet::IpNet::V4(n) = r {
                rules.push(format!("-s {} -j {fe}", n.trunc()));
            }
        }
        for ip in lb_ips {
            rules.push(format!("-s {ip}/32 -j {fe}"));
        }
        rules.push(format!("-m addrtype --src-type LOCAL -j {fe}"));
        rules.push(format!("-j MARK --or-mark {MARK_DROP:#x}"));
        self.out.chains.insert(chain.clone(), rules);
        chain
    }

    /// KPR-CIP-h (clusterIP) or KPR-EXT-h (externalIP, LB IP, nodePort): masquerade and route
    /// per source class.
    fn frontend_chain(&mut self, dest: DestKind) -> String {
        let (group, prefix) = if dest.is_external() {
            ("ext", "KPR-EXT")
        } else {
            ("cluster", "KPR-CIP")
        };
        let chain = format!("{prefix}-{}", hash(&[self.name, group]));
        let mut routes: Vec<(usize, String, bool)> = Vec::new();
        for class in 0..3 {
            let Some(src) = self.reps.0[class] else {
                continue;
            };
            let r = route(self.svc, self.sel, &self.state.node, src, dest);
            let local = r.empty == EmptyVerdict::Drop;
            let tag = if r.endpoints == self.sel.cluster.as_slice() {
                Tag::Cluster(local)
            } else {
                Tag::External(local)
            };
            let target = self.target_chain(tag, r.endpoints, r.empty);
            routes.push((class, target, r.masquerade));
        }
        let uniform = routes
            .windows(2)
            .all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2);
        let mut rules = Vec::new();
        for (i, (class, target, masq)) in routes.iter().enumerate() {
            let last = i + 1 == routes.len();
            let matches: Vec<String> = if uniform || last {
                vec![String::new()]
            } else {
                self.class_matches(*class)
            };
            for m in matches {
                if *masq {
                    rules.push(format!("{m}-j {MARK_MASQ_CHAIN}"));
                }
                rules.push(format!("{m}-j {target}"));
            }
            if uniform {
                break;
            }
        }
        self.out.chains.insert(chain.clone(), rules);
        chain
    }

    /// Match prefixes selecting a source class (each ends with a space).
    fn class_matches(&self, class: usize) -> Vec<String> {
        match class {
            CLASS_NODE => vec!["-m addrtype --src-type LOCAL ".to_string()],
            CLASS_POD => self
                .state
                .node
                .cluster_cidrs
                .iter()
                .filter_map(|c| match c {
                    ipnet::IpNet::V4(n) => Some(format!("-s {} ", n.trunc())),
                    ipnet::IpNet::V6(_) => None,
                })
                .collect(),
            _ => vec![String::new()],
        }
    }

    /// KPR-SVC-h for one route: balancing over its endpoints, or the empty verdict.
    fn target_chain(&mut self, tag: Tag, endpoints: &[Endpoint], empty: EmptyVerdict) -> String {
        let chain = format!("KPR-SVC-{}", hash(&[self.name, &format!("{tag:?}")]));
        if self.out.chains.contains_key(&chain) {
            return chain;
        }
        let eps = v4_endpoints(endpoints);
        let mut rules = Vec::new();
        if eps.is_empty() {
            let bit = match empty {
                EmptyVerdict::Reject => MARK_REJECT,
                EmptyVerdict::Drop => MARK_DROP,
            };
            rules.push(format!("-j MARK --or-mark {bit:#x}"));
            // Stop nat traversal here: a frontend chain must not go on to another class's route
            // and add a second verdict bit. The filter table acts on the mark.
            rules.push("-j ACCEPT".to_string());
            self.out.chains.insert(chain.clone(), rules);
            return chain;
        }
        let lc = self.svc.algorithm == Algorithm::LeastConn;
        if lc {
            let id = self
                .ids
                .get(self.spn, tag, &eps, self.svc.affinity.is_some());
            self.tags.push(tag);
            rules.push(format!("-j CONNMARK --set-xmark {id:#x}/0xffffffff"));
            let lc_chain = format!("KPR-LC-{}", hash(&[self.name, &format!("{tag:?}")]));
            // Its one rule (the pick) is written by the backend from the least-connection table.
            self.out.chains.insert(lc_chain.clone(), Vec::new());
            self.out.lc.push(LcTarget {
                id,
                chain: lc_chain,
                spn: self.name.to_string(),
                endpoints: eps.clone(),
            });
        }
        if let Some(t) = self.svc.affinity {
            let secs = t.as_secs().max(1);
            for ep in &eps {
                let sep = sep_chain(self.name, *ep);
                rules.push(format!(
                    "-m recent --name {sep} --rcheck --seconds {secs} --reap -j {sep}"
                ));
            }
        }
        if let Some(lc_target) = self.out.lc.last().filter(|_| lc) {
            rules.push(format!("-j {}", lc_target.chain));
        } else {
            let n = eps.len();
            for (i, ep) in eps.iter().enumerate() {
                let sep = sep_chain(self.name, *ep);
                if i + 1 < n {
                    rules.push(format!(
                        "-m statistic --mode nth --every {} --packet 0 -j {sep}",
                        n - i
                    ));
                } else {
                    rules.push(format!("-j {sep}"));
                }
            }
        }
        for ep in &eps {
            self.endpoint_chain(*ep);
        }
        self.out.chains.insert(chain.clone(), rules);
        chain
    }

    fn endpoint_chain(&mut self, ep: SocketAddrV4) {
        let sep = sep_chain(self.name, ep);
        let proto = self.svc.protocol.lower();
        let mut rules = vec![format!("-s {}/32 -j {MARK_MASQ_CHAIN}", ep.ip())];
        if self.svc.affinity.is_some() {
            rules.push(format!("-m recent --name {sep} --set"));
        }
        rules.push(format!(
            "-p {proto} -m {proto} -j DNAT --to-destination {ep}"
        ));
        self.out.chains.insert(sep, rules);
    }
}
