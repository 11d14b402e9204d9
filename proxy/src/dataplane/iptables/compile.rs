//! Compiles one service port into iptables rules (pure, no I/O).
//!
//! Owns chain naming and the rules one service port contributes. The layout keeps kube-proxy's
//! shape (a dispatch chain matching every frontend, `statistic --mode nth` round-robin, one DNAT
//! per endpoint) with far fewer chains, because on iptables-nft every chain costs: its
//! `iptables-nft-restore` (1.8.9) spends time proportional to the number of chains in the table on
//! every rule it appends, so kube-proxy's layout (one chain per Service and per endpoint, some
//! 120,000 chains at 20,000 Services) takes more than 12 minutes to load there. Here the chain
//! count does not grow with ClusterIP Services at all. Layout (nat table):
//!
//! ```text
//! PREROUTING/OUTPUT -> KPR-SERVICES
//!   clusterIP of a bucketed port (ClusterIP only, not least-connection):
//!       -d VIP -p P --dport N -j KPR-SVCB-bb    its rules sit in one of 256 bucket chains, each
//!                                               re-matching the frontend (`bucket_chain`)
//!   clusterIP of any other port: [masquerade rule] -j KPR-SVC-h (the chain of its route)
//!   externalIP / LB IP:  [-j KPR-FW-h (loadBalancerSourceRanges: returns when allowed)]
//!       then [masquerade rule] -j KPR-SVC-h, or -j KPR-EXT-h when source classes differ
//!   (dst-type LOCAL | --nodeport-addresses) -> KPR-NODEPORTS: -p P --dport NP, the same
//! KPR-EXT-h: per source class (node: src-type LOCAL, pod: -s clusterCIDR, external: the rest):
//!   masquerade mark when `selection::route` says so, then -> the chain of its route
//! balancing (in a bucket with the frontend match before every rule, in KPR-SVC-h without):
//!   [affinity: recent --rcheck per endpoint -> DNAT]
//!   round-robin: statistic nth per endpoint [recent --set] -> DNAT
//!   least-connection: CONNMARK target id, -> KPR-LC-h (one DNAT to the current pick)
//!   maglev: HMARK (the slot into the mark's low 14 bits, the masquerade bit kept) -> KPR-MGL-h
//!       (64 block rules) -> KPR-MGB-h-bb (256 slots as ranges) -> KPR-MGE-h (clear, DNAT)
//!   no endpoint: MARK reject/drop bit, ACCEPT (the filter table acts on the mark)
//! POSTROUTING -> KPR-POSTROUTING: DNATed -> KPR-HAIRPIN (see `hairpin`); marked -> MASQUERADE
//! ```
//!
//! Hashes are FNV-1a of the service port (and route or endpoint), so names are stable across
//! restarts and never collide with kube-proxy's `KUBE-` chains.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use crate::dataplane::rules::{
    class_routes, family_addrs, family_endpoints, ClassRoute, Tag, TargetIds,
};
use crate::maglev::{MaglevTable, HMARK_RND};
use crate::model::IpFamily;
use crate::model::{Algorithm, Endpoint, ServicePort, ServicePortName};
use crate::selection::{DestKind, EmptyVerdict, SelectedEndpoints};
use crate::state::ProxyState;

pub const SERVICES: &str = "KPR-SERVICES";
pub const NODEPORTS: &str = "KPR-NODEPORTS";
pub const MARK_MASQ_CHAIN: &str = "KPR-MARK-MASQ";
/// Marks for masquerade unless the source is a node address or a pod (shared by every port).
pub const MASQ_EXTERNAL: &str = "KPR-MASQ-EXTERNAL";
pub const POSTROUTING: &str = "KPR-POSTROUTING";
/// Filter table: acts on the drop/reject marks and rejects unexposed clusterIP ports.
pub const FILTER: &str = "KPR-FILTER";
/// Filter table: one REJECT per clusterIP (ports the Service does not expose).
pub const CLUSTER_IPS: &str = "KPR-CLUSTER-IPS";

pub const MARK_MASQ: u32 = 0x4000;
pub const MARK_DROP: u32 = 0x8000;
pub const MARK_REJECT: u32 = 0x10000;

/// Bucket chains of the ClusterIP-only service ports: enough that a bucket stays short (about 80
/// ports at 20,000), few enough that iptables-nft-restore stays fast.
pub const BUCKETS: u16 = 256;

/// FNV-1a, 64 bits: stable chain-name hashes without a crypto dependency.
fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// FNV-1a of `parts` as 16 hex digits.
pub fn hash(parts: &[&str]) -> String {
    format!("{:016X}", fnv(parts))
}

/// The bucket a ClusterIP-only service port's rules live in.
pub fn bucket_of(spn: &str) -> u16 {
    (fnv(&[spn]) % u64::from(BUCKETS)) as u16
}

/// The chain of bucket `b`.
pub fn bucket_chain(b: u16) -> String {
    format!("KPR-SVCB-{b:02X}")
}

/// The `recent` list remembering which clients went to `ep` (session affinity).
pub fn affinity_list(spn: &str, ep: SocketAddr) -> String {
    format!("KPR-AFF-{}", hash(&[spn, &ep.to_string()]))
}

/// A least-connection target: the chain whose single rule the controller rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LcTarget {
    pub id: u32,
    pub chain: String,
    pub spn: String,
    pub protocol: &'static str,
    /// Session affinity: the pick also records the client in its `recent` list.
    pub affinity: bool,
    pub endpoints: Vec<SocketAddr>,
}

impl LcTarget {
    /// The chain's rules: new connections go round-robin over `picks` (the endpoints tied for
    /// the fewest connections), kube-proxy's `statistic --mode nth` pattern.
    pub fn pick_rules(&self, picks: &[SocketAddr]) -> Vec<String> {
        picks
            .iter()
            .enumerate()
            .map(|(i, pick)| {
                let left = picks.len() - i;
                let nth = if left > 1 {
                    format!("-m statistic --mode nth --every {left} --packet 0 ")
                } else {
                    String::new()
                };
                let record = if self.affinity {
                    format!(
                        "-m recent --name {} --set ",
                        affinity_list(&self.spn, *pick)
                    )
                } else {
                    String::new()
                };
                format!(
                    "-A {} -p {} {nth}{record}-j DNAT --to-destination {pick}",
                    self.chain, self.protocol
                )
            })
            .collect()
    }
}

/// The rules a bucketed service port puts into its bucket chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucketed {
    pub bucket: u16,
    /// Complete rules without `-A CHAIN`.
    pub rules: Vec<String>,
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
    /// Its rules in a bucket chain (ClusterIP-only ports).
    pub bucket: Option<Bucketed>,
    /// clusterIPs (filter table reject of unexposed ports).
    pub cluster_ips: Vec<IpAddr>,
    /// Addresses of the endpoints it may DNAT to (hairpin masquerade).
    pub endpoint_ips: BTreeSet<IpAddr>,
    /// Least-connection targets (their chains are written from the controller's pick).
    pub lc: Vec<LcTarget>,
}

/// The packet mark bits that carry a Maglev slot (below [`MARK_MASQ`]).
pub const MAGLEV_SLOT_MASK: u32 = 0x3fff;
/// Slots per Maglev block chain, and the mark bits that choose the block.
const MAGLEV_BLOCK: usize = 256;
const MAGLEV_BLOCK_MASK: u32 = 0x3f00;

/// The rules of one Maglev block chain: slots `first..first + owner.len()`, each owned by the
/// endpoint `owner[i]` (an index into `ep_chains`). Every endpoint but the block's most common
/// one gets a rule per aligned range of slots it owns whole (slots past the table's end match
/// whatever is convenient, no flow has them); the most common one is the last rule, unmatched.
fn block_rules(first: usize, owner: &[usize], ep_chains: &[String]) -> Vec<String> {
    let mut count = vec![0usize; ep_chains.len()];
    for o in owner {
        count[*o] += 1;
    }
    let common = (0..count.len())
        .max_by_key(|i| (count[*i], std::cmp::Reverse(*i)))
        .unwrap_or(0);
    let mut rules = Vec::new();
    // Aligned ranges [lo, lo + size) inside the block, halved until one endpoint owns them.
    fn cover(
        lo: usize,
        size: usize,
        first: usize,
        owner: &[usize],
        common: usize,
        ep_chains: &[String],
        rules: &mut Vec<String>,
    ) {
        let end = (lo + size).min(owner.len());
        if lo >= end {
            return;
        }
        let o = owner[lo];
        if owner[lo..end].iter().all(|x| *x == o) {
            if o != common {
                let mask = MAGLEV_SLOT_MASK & !(size as u32 - 1);
                rules.push(format!(
                    "-m mark --mark {:#x}/{mask:#x} -j {}",
                    first + lo,
                    ep_chains[o]
                ));
            }
            return;
        }
        let half = size / 2;
        cover(lo, half, first, owner, common, ep_chains, rules);
        cover(lo + half, half, first, owner, common, ep_chains, rules);
    }
    cover(0, MAGLEV_BLOCK, first, owner, common, ep_chains, &mut rules);
    rules.push(format!("-j {}", ep_chains[common]));
    rules
}

/// Indices into `rules::SOURCE_CLASSES`.
const CLASS_NODE: usize = 0;
const CLASS_POD: usize = 1;
const CLASS_EXTERNAL: usize = 2;

/// Compiles one service port's `family` side (its addresses and endpoints of that family);
/// `ids` keeps least-connection conntrack marks stable.
pub fn compile(
    state: &ProxyState,
    spn: &ServicePortName,
    ids: &mut TargetIds,
    family: IpFamily,
) -> Compiled {
    let Some(port) = state.get(spn) else {
        ids.retain(spn, &[]);
        return Compiled::default();
    };
    let (svc, sel) = (&*port.service, &port.selected);
    let name = spn.to_string();
    let mut b = Builder {
        svc,
        sel,
        state,
        ids,
        spn,
        name: &name,
        family,
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
    ids: &'a mut TargetIds,
    spn: &'a ServicePortName,
    name: &'a str,
    family: IpFamily,
    out: Compiled,
    tags: Vec<(Tag, IpFamily)>,
}

/// One address as a host match (`/32`, `/128`).
pub fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

impl<'a> Builder<'a> {
    fn build(&mut self) {
        let f = self.family;
        let ext_ips: Vec<IpAddr> = family_addrs(&self.svc.external_ips, f).collect();
        let lb_ips: Vec<IpAddr> = family_addrs(&self.svc.load_balancer_ips, f).collect();
        let cips: Vec<IpAddr> = family_addrs(&self.svc.cluster_ips, f).collect();
        let has_family = !cips.is_empty() || !ext_ips.is_empty() || !lb_ips.is_empty();
        let node_port = self.svc.node_port != 0 && has_family;
        let external = !ext_ips.is_empty() || !lb_ips.is_empty() || node_port;
        if !cips.is_empty() {
            self.cluster_frontends(&cips, external);
        }
        if !external {
            return;
        }
        let suffixes = self.external_suffixes();
        for ip in ext_ips {
            let m = self.ip_match(ip);
            self.dispatch(SERVICES, &m, "external IP", &[], &suffixes);
        }
        if !lb_ips.is_empty() {
            let guard = if self.svc.source_ranges.is_empty() {
                Vec::new()
            } else {
                vec![format!("-j {}", self.firewall_chain(&lb_ips))]
            };
            for ip in lb_ips {
                let m = self.ip_match(ip);
                self.dispatch(SERVICES, &m, "loadbalancer IP", &guard, &suffixes);
            }
        }
        if node_port {
            let proto = self.svc.protocol.lower();
            let m = format!("-p {proto} -m {proto} --dport {} ", self.svc.node_port);
            self.dispatch(NODEPORTS, &m, "node port", &[], &suffixes);
        }
    }

    /// `-d IP -p P -m P --dport N ` (ends with a space).
    fn ip_match(&self, ip: IpAddr) -> String {
        let proto = self.svc.protocol.lower();
        format!(
            "-d {} -p {proto} -m {proto} --dport {} ",
            host(ip),
            self.svc.port
        )
    }

    /// Adds one frontend's rules to a shared chain: `guard` rules, then `suffixes`, each after
    /// the frontend match `m`; the comment names the port on the last (the jump).
    fn dispatch(
        &mut self,
        chain: &str,
        m: &str,
        what: &str,
        guard: &[String],
        suffixes: &[String],
    ) {
        let out = if chain == SERVICES {
            &mut self.out.services
        } else {
            &mut self.out.nodeports
        };
        for (i, s) in guard.iter().chain(suffixes).enumerate() {
            if i + 1 == guard.len() + suffixes.len() {
                out.push(format!(
                    "{m}-m comment --comment \"{} {what}\" {s}",
                    self.name
                ));
            } else {
                out.push(format!("{m}{s}"));
            }
        }
    }

    /// What each class of source this node tells apart gets at `dest`.
    fn routes(&self, dest: DestKind) -> Vec<ClassRoute<'a>> {
        class_routes(self.svc, self.sel, &self.state.node, dest)
    }

    /// The clusterIP frontends: every source class gets the same endpoints there, only the
    /// masquerade decision differs. A port with no other frontend (and not least-connection)
    /// goes into its bucket; others jump to the chain of the cluster route.
    fn cluster_frontends(&mut self, cips: &[IpAddr], external: bool) {
        let routes = self.routes(DestKind::ClusterIp);
        let Some(first) = routes.first() else {
            return;
        };
        let (tag, endpoints, empty) = (first.tag, first.endpoints, first.empty);
        let masq = self.masquerade_rules(&routes);
        let bucketed = !external && cips.len() == 1 && self.svc.algorithm != Algorithm::LeastConn;
        if bucketed {
            let m = self.ip_match(cips[0]);
            let mut rules: Vec<String> = masq.iter().map(|r| format!("{m}{r}")).collect();
            rules.extend(self.balancing(&m, tag, endpoints, empty));
            let bucket = bucket_of(self.name);
            self.out.bucket = Some(Bucketed { bucket, rules });
            let jump = [format!("-j {}", bucket_chain(bucket))];
            self.dispatch(SERVICES, &m, "cluster IP", &[], &jump);
        } else {
            let mut suffixes = masq;
            suffixes.push(format!("-j {}", self.target_chain(tag, endpoints, empty)));
            for &ip in cips {
                let m = self.ip_match(ip);
                self.dispatch(SERVICES, &m, "cluster IP", &[], &suffixes);
            }
        }
        self.out.cluster_ips = cips.to_vec();
    }

    /// Rules (after the frontend match) that mark the classes `routes` masquerade.
    fn masquerade_rules(&self, routes: &[ClassRoute<'_>]) -> Vec<String> {
        if routes.len() == 3 && routes.iter().all(|r| r.masquerade) {
            return vec![format!("-j {MARK_MASQ_CHAIN}")];
        }
        let mut rules = Vec::new();
        for r in routes.iter().filter(|r| r.masquerade) {
            if r.class == CLASS_EXTERNAL {
                rules.push(format!("-j {MASQ_EXTERNAL}"));
            } else {
                for m in self.class_matches(r.class) {
                    rules.push(format!("{m}-j {MARK_MASQ_CHAIN}"));
                }
            }
        }
        rules
    }

    /// The rules (after the frontend match) of an externalIP, LB IP or nodePort frontend: the
    /// route's chain (with the masquerade mark first) when every class gets the same, else the
    /// per-class chain KPR-EXT-h.
    fn external_suffixes(&mut self) -> Vec<String> {
        let routes: Vec<(usize, String, bool)> = self
            .routes(DestKind::ExternalIp)
            .into_iter()
            .map(|r| {
                let target = self.target_chain(r.tag, r.endpoints, r.empty);
                (r.class, target, r.masquerade)
            })
            .collect();
        let uniform = routes
            .windows(2)
            .all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2);
        if uniform {
            let Some((_, target, masq)) = routes.first() else {
                return Vec::new();
            };
            let mut rules = Vec::new();
            if *masq {
                rules.push(format!("-j {MARK_MASQ_CHAIN}"));
            }
            rules.push(format!("-j {target}"));
            return rules;
        }
        let chain = format!("KPR-EXT-{}", hash(&[self.name, "ext"]));
        let mut rules = Vec::new();
        for (i, (class, target, masq)) in routes.iter().enumerate() {
            let matches = if i + 1 == routes.len() {
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
        }
        self.out.chains.insert(chain.clone(), rules);
        vec![format!("-j {chain}")]
    }

    /// KPR-FW-h: loadBalancerSourceRanges. Returns for allowed sources (the ranges, the LB IPs
    /// themselves, the node), marks anything else for drop and stops NAT.
    fn firewall_chain(&mut self, lb_ips: &[IpAddr]) -> String {
        let chain = format!("KPR-FW-{}", hash(&[self.name, "fw"]));
        let mut rules = Vec::new();
        for r in &self.svc.source_ranges {
            if IpFamily::of(&r.addr()) == self.family {
                rules.push(format!("-s {} -j RETURN", r.trunc()));
            }
        }
        for ip in lb_ips {
            rules.push(format!("-s {} -j RETURN", host(*ip)));
        }
        rules.push("-m addrtype --src-type LOCAL -j RETURN".to_string());
        rules.push(format!("-j MARK --or-mark {MARK_DROP:#x}"));
        rules.push("-j ACCEPT".to_string());
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
                .filter(|c| IpFamily::of(&c.addr()) == self.family)
                .map(|c| format!("-s {} ", c.trunc()))
                .collect(),
            _ => vec![String::new()],
        }
    }

    /// KPR-SVC-h for one route: its balancing rules in a chain of its own.
    fn target_chain(&mut self, tag: Tag, endpoints: &[Endpoint], empty: EmptyVerdict) -> String {
        let chain = format!("KPR-SVC-{}", hash(&[self.name, &format!("{tag:?}")]));
        if !self.out.chains.contains_key(&chain) {
            let m = format!("-p {} ", self.svc.protocol.lower());
            let rules = self.balancing(&m, tag, endpoints, empty);
            self.out.chains.insert(chain.clone(), rules);
        }
        chain
    }

    /// The balancing rules of one route, each after the match `m` (which names the protocol,
    /// as DNAT to a port needs).
    fn balancing(
        &mut self,
        m: &str,
        tag: Tag,
        endpoints: &[Endpoint],
        empty: EmptyVerdict,
    ) -> Vec<String> {
        let eps = family_endpoints(endpoints, self.family);
        if eps.is_empty() {
            let bit = match empty {
                EmptyVerdict::Reject => MARK_REJECT,
                EmptyVerdict::Drop => MARK_DROP,
            };
            // ACCEPT stops nat traversal here, so that no other rule adds a second verdict bit;
            // the filter table acts on the mark.
            return vec![
                format!("{m}-j MARK --or-mark {bit:#x}"),
                format!("{m}-j ACCEPT"),
            ];
        }
        self.out.endpoint_ips.extend(eps.iter().map(|e| e.ip()));
        let mut rules = Vec::new();
        let affinity = self.svc.affinity.map(|t| t.as_secs().max(1));
        let lc_id = (self.svc.algorithm == Algorithm::LeastConn).then(|| {
            self.tags.push((tag, self.family));
            self.ids
                .get(self.spn, (tag, self.family), &eps, affinity.is_some())
        });
        if let Some(id) = lc_id {
            rules.push(format!("{m}-j CONNMARK --set-xmark {id:#x}/0xffffffff"));
        }
        if let Some(secs) = affinity {
            for ep in &eps {
                let list = affinity_list(self.name, *ep);
                rules.push(format!(
                    "{m}-m recent --name {list} --rcheck --seconds {secs} --reap -j DNAT --to-destination {ep}"
                ));
            }
        }
        if let Some(id) = lc_id {
            rules.push(format!(
                "{m}-j {}",
                self.lc_chain(tag, id, eps, affinity.is_some())
            ));
            return rules;
        }
        if let Some(table) = self
            .sel
            .maglev_table(endpoints, self.family)
            .filter(|t| !t.is_empty())
            .cloned()
        {
            rules.extend(self.maglev(m, tag, &table, affinity.is_some()));
            return rules;
        }
        let n = eps.len();
        for (i, ep) in eps.iter().enumerate() {
            let nth = if i + 1 < n {
                format!("-m statistic --mode nth --every {} --packet 0 ", n - i)
            } else {
                String::new()
            };
            let record = if affinity.is_some() {
                format!("-m recent --name {} --set ", affinity_list(self.name, *ep))
            } else {
                String::new()
            };
            rules.push(format!("{m}{nth}{record}-j DNAT --to-destination {ep}"));
        }
        rules
    }

    /// Maglev: HMARK hashes the flow into the packet mark's low 14 bits (the slot; the
    /// masquerade bit 0x4000 kept by the offset of whichever of the two HMARK rules matches),
    /// KPR-MGL-h dispatches on the slot's high 6 bits to a block chain of 256 slots, KPR-MGB-h-bb,
    /// which matches the slots (as aligned ranges of one endpoint) of every endpoint but the
    /// block's most common one, which is its last rule; the endpoint's chain KPR-MGE-h clears
    /// the slot bits and DNATs. At most 64 + 256 rules are evaluated for a new connection; the
    /// rules grow with the table size (about M x (1 - 1/N) per route), see docs/ARCHITECTURE.md.
    fn maglev(&mut self, m: &str, tag: Tag, table: &MaglevTable, affinity: bool) -> Vec<String> {
        let h = hash(&[self.name, &format!("{tag:?}")]);
        let proto = self.svc.protocol.lower();
        let hmark = format!(
            "-j HMARK --hmark-tuple src,dst,sport,dport,proto --hmark-mod {} --hmark-rnd {HMARK_RND:#x}",
            table.size()
        );
        // The endpoints' chains, in the table's endpoint order.
        let ep_chains: Vec<String> = table
            .endpoints()
            .iter()
            .map(|ep| {
                let chain = format!(
                    "KPR-MGE-{}",
                    hash(&[self.name, &format!("{tag:?}"), &ep.to_string()])
                );
                let record = if affinity {
                    format!("-m recent --name {} --set ", affinity_list(self.name, *ep))
                } else {
                    String::new()
                };
                let rules = vec![
                    format!("-j MARK --and-mark {:#x}", !MAGLEV_SLOT_MASK),
                    format!("-p {proto} {record}-j DNAT --to-destination {ep}"),
                ];
                self.out.chains.insert(chain.clone(), rules);
                chain
            })
            .collect();
        let owner: Vec<usize> = table.slot_indices().collect();
        let dispatch = format!("KPR-MGL-{h}");
        let blocks = owner.len().div_ceil(MAGLEV_BLOCK);
        let mut dispatch_rules = Vec::new();
        for b in 0..blocks {
            let chain = format!("KPR-MGB-{h}-{b:02X}");
            let lo = b * MAGLEV_BLOCK;
            let slots = &owner[lo..owner.len().min(lo + MAGLEV_BLOCK)];
            self.out
                .chains
                .insert(chain.clone(), block_rules(lo, slots, &ep_chains));
            if b + 1 < blocks {
                dispatch_rules.push(format!(
                    "-m mark --mark {:#x}/{MAGLEV_BLOCK_MASK:#x} -j {chain}",
                    lo
                ));
            } else {
                dispatch_rules.push(format!("-j {chain}"));
            }
        }
        self.out.chains.insert(dispatch.clone(), dispatch_rules);
        vec![
            format!(
                "{m}-m mark --mark {MARK_MASQ:#x}/{MARK_MASQ:#x} {hmark} --hmark-offset {MARK_MASQ:#x}"
            ),
            format!("{m}-m mark ! --mark {MARK_MASQ:#x}/{MARK_MASQ:#x} {hmark}"),
            format!("{m}-j {dispatch}"),
        ]
    }

    /// KPR-LC-h: empty here; its one rule (the pick) is written by the backend from the
    /// least-connection table.
    fn lc_chain(
        &mut self,
        tag: Tag,
        id: u32,
        endpoints: Vec<SocketAddr>,
        affinity: bool,
    ) -> String {
        let chain = format!("KPR-LC-{}", hash(&[self.name, &format!("{tag:?}")]));
        self.out.chains.insert(chain.clone(), Vec::new());
        self.out.lc.push(LcTarget {
            id,
            chain: chain.clone(),
            spn: self.name.to_string(),
            protocol: self.svc.protocol.lower(),
            affinity,
            endpoints,
        });
        chain
    }
}

#[cfg(test)]
mod tests;
