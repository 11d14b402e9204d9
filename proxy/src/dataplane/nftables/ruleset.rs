//! The fixed part of the `ip kpr` and `ip6 kpr` tables: sets, maps, base chains and their rules.
//! Both families have the same layout; [`Fam`] holds what differs (the table, the address type,
//! the header expressions), and every function here takes the family it renders.
//!
//! Owns the table layout. Packets are dispatched through data maps, never through one chain per
//! Service: loading that layout grows with the square of the chain count (kube-proxy's nftables
//! mode, which has it, took 480 s to program 20,000 Services in docs/BENCHMARKS.md):
//!
//! ```text
//! nat prerouting: source class by set (node / pod / external) -> from_<class>
//! nat output:     from_node
//! from_<class>:   masquerade mark from @masq_<class> / @npmasq_<class>;
//!                 ct mark <- target id from @fe_<class>, @fe (ip . proto . port)
//!                 or @np_<class>, @np (proto . port, daddr in @nodeport_ips)
//! dispatch:       ct mark vmap @aff_lookup (jump aff_T: dnat from the affinity map on a hit)
//!                 ct mark vmap @targets    (goto lc | maglev | empty_reject | empty_drop | rr_N_B)
//!                 ct mark & 15 vmap { B : goto rrb_B } (round robin, B: counter bucket)
//! rrb_B:          per protocol and N in 1..=16: ct mark @rr_nN
//!                 dnat to ct mark . numgen inc mod N map @slots_<protocol>_B
//! rr_N_B:         the same for one N > 16, created when a target first needs it
//! maglev:         per protocol: dnat to ct mark . jhash saddr . daddr . sport . dport mod M
//!                 seed S map @maglev_<protocol> (a Maglev target's table, M slots: the
//!                 node's --maglev-table-size; S: proxy_common::hash::FLOW_SEED)
//! lc:             per protocol: dnat to ct mark . numgen inc mod LC_SLOTS map
//!                 @lc_pick_<protocol> (the endpoints tied for least, kept by the
//!                 least-connection controller)
//! nat postrouting: record affinity (ct mark vmap @aff_record), masquerade marked and hairpin
//! filter input/forward/output (new): drop/reject marks, reject unexposed clusterIP ports,
//!                 drop unallocated service CIDR addresses
//! filter prerouting (dstnat-10): loadBalancerSourceRanges via @fw_protected / @fw_allowed
//! ```
//!
//! The target id lives in the conntrack mark so that conntrack events name the target
//! (least-connection accounting). Must not touch anything outside the two `kpr` tables.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::OnceLock;

use ipnet::IpNet;

use super::compile::RR_BUCKETS;
use crate::model::IpFamily;

/// What differs between the IPv4 and the IPv6 table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fam {
    pub family: IpFamily,
    /// The table every command of the family addresses.
    pub table: &'static str,
    /// The header of addresses in expressions (`ip saddr`, `dnat ip to`).
    pub ip: &'static str,
    /// The address type of sets and maps.
    pub addr: &'static str,
    /// The transport protocol as a payload load (see `base_rules` on why not `meta l4proto`).
    pub protocol: &'static str,
    /// The node's own loopback sources.
    pub loopback: &'static str,
    /// The client part of a session-affinity key, and the types of the two affinity maps
    /// (endpoint address, endpoint port) keyed by `ct mark . <client>`.
    pub affinity_client: &'static str,
    pub affinity_types: (&'static str, &'static str),
}

/// The seed of the IPv6 affinity key (`jhash ip6 saddr ... seed 0x6b7072`, [`V6`]).
pub const AFFINITY_V6_SEED: u32 = 0x6b7072;

/// The IPv6 affinity key nftables computes for `client` (`jhash ip6 saddr mod 4294967295 seed
/// 0x6b7072`): the kernel's jhash of the address's 16 bytes, scaled as `nft_jhash_eval` does.
/// `proxy trace` looks a client's entry up with it.
pub fn affinity_v6_key(client: std::net::Ipv6Addr) -> u32 {
    proxy_common::hash::slot_of(
        proxy_common::hash::jhash_bytes(&client.octets(), AFFINITY_V6_SEED),
        u32::MAX,
    )
}

/// The name of both families' tables.
pub const TABLE_NAME: &str = "kpr";

pub const V4: Fam = Fam {
    family: IpFamily::V4,
    table: "ip kpr",
    ip: "ip",
    addr: "ipv4_addr",
    protocol: "ip protocol",
    loopback: "127.0.0.0/8",
    affinity_client: "ip saddr",
    affinity_types: (
        "type mark . ipv4_addr : ipv4_addr",
        "type mark . ipv4_addr : inet_service",
    ),
};

pub const V6: Fam = Fam {
    family: IpFamily::V6,
    table: "ip6 kpr",
    ip: "ip6",
    addr: "ipv6_addr",
    // The next header of the fixed header: extension headers before the transport header (rare
    // on Service traffic) make such a packet miss the loadBalancerSourceRanges check's key.
    protocol: "ip6 nexthdr",
    loopback: "::1/128",
    // A 32-bit hash of the client address, not the address: nft 1.0.6 builds the key of a
    // dynamic-map `update` wrongly past 16 bytes (the data overwrites the end of `mark . ipv6`,
    // so entries never match). Two clients of one target whose hashes collide share an
    // affinity entry, i.e. an endpoint of that same target: affinity is then shared, never wrong.
    affinity_client: "jhash ip6 saddr mod 4294967295 seed 0x6b7072",
    affinity_types: (
        "typeof ct mark . jhash ip6 saddr mod 4294967295 seed 0x6b7072 : ip6 daddr",
        "typeof ct mark . jhash ip6 saddr mod 4294967295 seed 0x6b7072 : tcp dport",
    ),
};

/// The rendering of `family`.
pub fn fam(family: IpFamily) -> Fam {
    match family {
        IpFamily::V4 => V4,
        IpFamily::V6 => V6,
    }
}

/// Slots of a least-connection target in `lc_pick_*`: its picks (the endpoints tied for the fewest
/// connections) fill them in turn and new connections walk them. 12 spreads evenly over 1, 2, 3,
/// 4 and 6 picks and within one connection per 12 otherwise.
pub const LC_SLOTS: usize = 12;
/// Packet mark bit: masquerade in postrouting (kube-proxy's value).
pub const MARK_MASQ: u32 = 0x4000;
/// Packet mark bit: drop in the filter chains (Local policy with endpoints elsewhere only).
pub const MARK_DROP: u32 = 0x8000;
/// Packet mark bit: reject in the filter chains (no usable endpoint).
pub const MARK_REJECT: u32 = 0x10000;

/// Source classes of docs/SERVICE-SEMANTICS.md, each with its own chain and override maps.
pub const CLASSES: [&str; 3] = ["node", "pod", "ext"];

/// Node-wide inputs of one family's skeleton (from `BackendConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skeleton {
    pub fam: Fam,
    pub cluster_cidrs: Vec<IpNet>,
    /// Node addresses; the family's loopback is always added.
    pub node_ips: Vec<IpAddr>,
    /// Addresses that accept nodePort traffic.
    pub nodeport_nets: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
    /// Per class (node, pod, ext): whether traffic to a clusterIP is masqueraded.
    pub clusterip_masq: [bool; 3],
    /// `--maglev-table-size`: the `mod` of the Maglev rules.
    pub maglev_table_size: u32,
}

impl Skeleton {
    /// An empty skeleton of `family` (tests, and a family the node has nothing of).
    pub fn empty(family: IpFamily) -> Skeleton {
        Skeleton {
            fam: fam(family),
            cluster_cidrs: Vec::new(),
            node_ips: Vec::new(),
            nodeport_nets: Vec::new(),
            service_cidrs: Vec::new(),
            clusterip_masq: [false; 3],
            maglev_table_size: crate::maglev::DEFAULT_TABLE_SIZE,
        }
    }

    /// The `family` part of the configured addresses; nodePort addresses default to the node's
    /// addresses and never include loopback (nodePorts on localhost are not supported).
    pub fn from_config(
        family: IpFamily,
        cluster_cidrs: &[IpNet],
        node_ips: &[IpAddr],
        nodeport_addresses: &[IpNet],
        service_cidrs: &[IpNet],
        clusterip_masq: [bool; 3],
        maglev_table_size: u32,
    ) -> Skeleton {
        let nets = |nets: &[IpNet]| -> Vec<IpNet> {
            nets.iter()
                .filter(|n| IpFamily::of(&n.addr()) == family)
                .map(IpNet::trunc)
                .collect()
        };
        let node: Vec<IpAddr> = node_ips
            .iter()
            .filter(|a| IpFamily::of(a) == family && !a.is_loopback())
            .copied()
            .collect();
        let nodeport_nets = if nodeport_addresses.is_empty() {
            node.iter().map(|a| IpNet::from(*a)).collect()
        } else {
            nets(nodeport_addresses)
                .into_iter()
                .filter(|n| !n.network().is_loopback())
                .collect()
        };
        Skeleton {
            fam: fam(family),
            cluster_cidrs: nets(cluster_cidrs),
            node_ips: node,
            nodeport_nets,
            service_cidrs: nets(service_cidrs),
            clusterip_masq,
            maglev_table_size,
        }
    }
}

/// Sets and maps whose elements the backend manages (flushed and refilled by a full sync); in
/// the specs `{addr}` is the family's address type and `{ip}` its address header.
const MANAGED_SETS: &[(&str, &str, &str)] = &[
    ("set", "cluster_cidrs", "type {addr}; flags interval;"),
    ("set", "node_srcs", "type {addr}; flags interval;"),
    ("set", "nodeport_ips", "type {addr}; flags interval;"),
    ("set", "service_cidrs", "type {addr}; flags interval;"),
    ("set", "cluster_ips", "type {addr};"),
    ("set", "hairpin", "type {addr} . {addr};"),
    (
        "map",
        "fe",
        "type {addr} . inet_proto . inet_service : mark;",
    ),
    (
        "map",
        "fe_node",
        "type {addr} . inet_proto . inet_service : mark;",
    ),
    (
        "map",
        "fe_pod",
        "type {addr} . inet_proto . inet_service : mark;",
    ),
    (
        "map",
        "fe_ext",
        "type {addr} . inet_proto . inet_service : mark;",
    ),
    ("map", "np", "type inet_proto . inet_service : mark;"),
    ("map", "np_node", "type inet_proto . inet_service : mark;"),
    ("map", "np_pod", "type inet_proto . inet_service : mark;"),
    ("map", "np_ext", "type inet_proto . inet_service : mark;"),
    (
        "set",
        "masq_node",
        "type {addr} . inet_proto . inet_service;",
    ),
    (
        "set",
        "masq_pod",
        "type {addr} . inet_proto . inet_service;",
    ),
    (
        "set",
        "masq_ext",
        "type {addr} . inet_proto . inet_service;",
    ),
    ("set", "npmasq_node", "type inet_proto . inet_service;"),
    ("set", "npmasq_pod", "type inet_proto . inet_service;"),
    ("set", "npmasq_ext", "type inet_proto . inet_service;"),
    ("map", "targets", "type mark : verdict;"),
    ("map", "aff_lookup", "type mark : verdict;"),
    ("map", "aff_record", "type mark : verdict;"),
    (
        "set",
        "fw_protected",
        "type {addr} . inet_proto . inet_service;",
    ),
    (
        "set",
        "fw_allowed",
        "type {addr} . inet_proto . inet_service . {addr}; flags interval;",
    ),
];

/// Base chains: (name, hook spec or "" for a regular chain).
const CHAINS: &[(&str, &str)] = &[
    (
        "nat_prerouting",
        "type nat hook prerouting priority dstnat; policy accept;",
    ),
    (
        "nat_output",
        "type nat hook output priority -100; policy accept;",
    ),
    ("from_node", ""),
    ("from_pod", ""),
    ("from_ext", ""),
    ("dispatch", ""),
    ("lc", ""),
    ("maglev", ""),
    ("empty_reject", ""),
    ("empty_drop", ""),
    (
        "nat_postrouting",
        "type nat hook postrouting priority srcnat; policy accept;",
    ),
    (
        "firewall",
        "type filter hook prerouting priority dstnat - 10; policy accept;",
    ),
    ("fw_check", ""),
    ("checks", ""),
    (
        "filter_input",
        "type filter hook input priority filter; policy accept;",
    ),
    (
        "filter_forward",
        "type filter hook forward priority filter; policy accept;",
    ),
    (
        "filter_output",
        "type filter hook output priority filter; policy accept;",
    ),
];

/// Commands that delete the tables of `families` if they exist (a crashed run's leftovers
/// included).
pub fn delete_tables(families: &[IpFamily]) -> String {
    families
        .iter()
        .map(|f| format!("add table {t}\ndelete table {t}\n", t = fam(*f).table))
        .collect()
}

/// A managed set's spec in family `f`.
fn spec(f: &Fam, spec: &str) -> String {
    spec.replace("{addr}", f.addr).replace("{ip}", f.ip)
}

/// Commands that create (or re-create in place) the skeleton and refill its configuration sets.
///
/// Idempotent on an existing table: sets are flushed, chains flushed and refilled. Affinity maps
/// (`aff_T`, `affp_T`) are left alone so that a periodic full resync keeps session affinity.
pub fn skeleton(s: &Skeleton) -> String {
    let f = &s.fam;
    let (table, ip) = (f.table, f.ip);
    let mut out = format!("add table {table}\n");
    for (kind, name, sp) in MANAGED_SETS {
        let _ = writeln!(out, "add {kind} {table} {name} {{ {} }}", spec(f, sp));
        let _ = writeln!(out, "flush {kind} {table} {name}");
    }
    for protocol in SLOT_PROTOCOLS {
        let name = lc_pick_map(protocol);
        let _ = writeln!(
            out,
            "add map {table} {name} {{ typeof ct mark . numgen inc mod 2 : {ip} daddr . {protocol} dport; }}"
        );
        let _ = writeln!(out, "flush map {table} {name}");
        let name = maglev_map(protocol);
        let _ = writeln!(
            out,
            "add map {table} {name} {{ typeof ct mark . numgen inc mod 2 : {ip} daddr . {protocol} dport; }}"
        );
        let _ = writeln!(out, "flush map {table} {name}");
        for bucket in 0..RR_BUCKETS {
            let name = slots_map(protocol, bucket);
            let _ = writeln!(
                out,
                "add map {table} {name} {{ typeof ct mark . numgen inc mod 2 : {ip} daddr . {protocol} dport; }}"
            );
            let _ = writeln!(out, "flush map {table} {name}");
        }
    }
    for n in 1..=RR_COUNTS {
        let name = rr_count_set(n);
        let _ = writeln!(out, "add set {table} {name} {{ type mark; }}");
        let _ = writeln!(out, "flush set {table} {name}");
    }
    for (name, hook) in CHAINS {
        let _ = writeln!(out, "add chain {table} {name} {{ {hook} }}");
        let _ = writeln!(out, "flush chain {table} {name}");
    }
    for bucket in 0..RR_BUCKETS {
        let name = bucket_chain(bucket);
        let _ = writeln!(out, "add chain {table} {name}");
        let _ = writeln!(out, "flush chain {table} {name}");
    }
    for (chain, rule) in base_rules(s) {
        let _ = writeln!(out, "add rule {table} {chain} {rule}");
    }
    for (chain, rule) in round_robin_rules(f) {
        let _ = writeln!(out, "add rule {table} {chain} {rule}");
    }
    config_elements(s, &mut out);
    out
}

fn config_elements(s: &Skeleton, out: &mut String) {
    let table = s.fam.table;
    let mut sets: Vec<(&str, Vec<String>)> = vec![
        (
            "cluster_cidrs",
            s.cluster_cidrs.iter().map(ToString::to_string).collect(),
        ),
        ("node_srcs", {
            let mut v: Vec<String> = s.node_ips.iter().map(ToString::to_string).collect();
            v.push(s.fam.loopback.into());
            v
        }),
        (
            "nodeport_ips",
            s.nodeport_nets.iter().map(ToString::to_string).collect(),
        ),
        (
            "service_cidrs",
            s.service_cidrs.iter().map(ToString::to_string).collect(),
        ),
    ];
    for (name, elems) in sets.iter_mut() {
        if !elems.is_empty() {
            let _ = writeln!(out, "add element {table} {name} {{ {} }}", elems.join(", "));
        }
    }
}

/// The rules of the base chains, in order.
fn base_rules(s: &Skeleton) -> Vec<(&'static str, String)> {
    let ip = s.fam.ip;
    let fe_key = format!("{ip} daddr . meta l4proto . th dport");
    let np_key = "meta l4proto . th dport";
    // The loadBalancerSourceRanges key takes the protocol from the IPv4 header, not from
    // `meta l4proto`: `fw_allowed` is an interval set with a concatenated key, and for a
    // host-endian part of such a key nft (1.0.6) adds `byteorder hton(size 2, len 1)` after the
    // one-byte `meta l4proto` (a no-op). Since "netfilter: nft_byteorder: remove multi-register
    // support" (stable 6.12.115, in Debian's 6.12.117+deb12) the kernel refuses a byteorder whose
    // len differs from its size with EOPNOTSUPP, so the whole ruleset failed to load. `ip
    // protocol` is a big-endian payload load (no byteorder) of the same byte: in an `ip` table
    // meta l4proto is the IPv4 protocol field, and the elements are encoded the same.
    let fw_key = format!("{ip} daddr . {} . th dport", s.fam.protocol);
    let masq = format!("meta mark set meta mark | {MARK_MASQ:#x}");
    let mut rules: Vec<(&'static str, String)> = vec![
        (
            "nat_prerouting",
            format!("{ip} saddr @node_srcs goto from_node"),
        ),
        (
            "nat_prerouting",
            format!("{ip} saddr @cluster_cidrs goto from_pod"),
        ),
        ("nat_prerouting", "goto from_ext".into()),
        ("nat_output", "goto from_node".into()),
    ];
    for (i, class) in CLASSES.iter().enumerate() {
        let chain: &'static str = match i {
            0 => "from_node",
            1 => "from_pod",
            _ => "from_ext",
        };
        rules.push((chain, format!("{fe_key} @masq_{class} {masq}")));
        if s.clusterip_masq[i] {
            rules.push((chain, format!("{ip} daddr @cluster_ips {masq}")));
        }
        rules.push((
            chain,
            format!("ct mark set {fe_key} map @fe_{class} goto dispatch"),
        ));
        rules.push((chain, format!("ct mark set {fe_key} map @fe goto dispatch")));
        rules.push((
            chain,
            format!("{ip} daddr @nodeport_ips {np_key} @npmasq_{class} {masq}"),
        ));
        rules.push((
            chain,
            format!("{ip} daddr @nodeport_ips ct mark set {np_key} map @np_{class} goto dispatch"),
        ));
        rules.push((
            chain,
            format!("{ip} daddr @nodeport_ips ct mark set {np_key} map @np goto dispatch"),
        ));
    }
    rules.extend(SLOT_PROTOCOLS.map(|p| {
        let map = lc_pick_map(p);
        let rule =
            format!("meta l4proto {p} dnat {ip} to ct mark . numgen inc mod {LC_SLOTS} map @{map}");
        ("lc", rule)
    }));
    rules.extend(SLOT_PROTOCOLS.map(|p| ("maglev", maglev_rule(s, p))));
    rules.extend([
        ("dispatch", "ct mark vmap @aff_lookup".to_string()),
        ("dispatch", "ct mark vmap @targets".to_string()),
        ("dispatch", bucket_dispatch()),
        (
            "empty_reject",
            format!("meta mark set meta mark | {MARK_REJECT:#x}"),
        ),
        ("empty_drop", format!("meta mark set meta mark | {MARK_DROP:#x}")),
        (
            "nat_postrouting",
            "ct status dnat ct mark vmap @aff_record".to_string(),
        ),
        (
            "nat_postrouting",
            format!(
                "meta mark & {MARK_MASQ:#x} == {MARK_MASQ:#x} meta mark set meta mark ^ {MARK_MASQ:#x} masquerade"
            ),
        ),
        (
            "nat_postrouting",
            format!("ct status dnat {ip} saddr . {ip} daddr @hairpin masquerade"),
        ),
        (
            "firewall",
            format!("ct state new {fw_key} @fw_protected jump fw_check"),
        ),
        ("fw_check", format!("{ip} saddr @node_srcs return")),
        (
            "fw_check",
            format!("{fw_key} . {ip} saddr @fw_allowed return"),
        ),
        ("fw_check", "drop".to_string()),
        (
            "checks",
            format!("meta mark & {MARK_DROP:#x} == {MARK_DROP:#x} drop"),
        ),
        (
            "checks",
            format!("meta mark & {MARK_REJECT:#x} == {MARK_REJECT:#x} meta l4proto tcp reject with tcp reset"),
        ),
        (
            "checks",
            format!("meta mark & {MARK_REJECT:#x} == {MARK_REJECT:#x} reject"),
        ),
        (
            "checks",
            format!("{ip} daddr @cluster_ips meta l4proto tcp reject with tcp reset"),
        ),
        ("checks", format!("{ip} daddr @cluster_ips reject")),
        ("checks", format!("{ip} daddr @service_cidrs drop")),
        ("filter_input", "ct state new jump checks".to_string()),
        ("filter_forward", "ct state new jump checks".to_string()),
        ("filter_output", "ct state new jump checks".to_string()),
    ]);
    rules
}

/// Endpoint counts whose round-robin rules are part of the skeleton (`rr_n1` ..): a target with
/// up to this many endpoints is a member of one `rr_nN` set, and a change of its endpoint count
/// moves it between two sets. A target with more has a `targets` element `goto rr_N_B`.
///
/// Why sets and not a `goto rr_N_B` verdict per target: adding a jump or goto element to a
/// verdict map makes the kernel validate the whole table at commit (every path from the base
/// chains through `@targets`). Measured at 20,000 Services on this kernel, one endpoint change
/// took 2.3 ms with the `targets` element re-added and 0.3 ms without it.
pub const RR_COUNTS: usize = 16;

/// The set of round-robin target ids with `n` endpoints (1..=[`RR_COUNTS`]).
pub fn rr_count_set(n: usize) -> &'static str {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    let names = NAMES.get_or_init(|| leak_names((1..=RR_COUNTS).map(|n| format!("rr_n{n}"))));
    names[n.clamp(1, RR_COUNTS) - 1]
}

/// The chain of counter bucket `bucket` that holds the round-robin rules for 1..=16 endpoints.
pub fn bucket_chain(bucket: u32) -> &'static str {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    let names = NAMES.get_or_init(|| leak_names((0..RR_BUCKETS).map(|b| format!("rrb_{b}"))));
    names[(bucket % RR_BUCKETS) as usize]
}

/// Names built once and kept for the life of the process (element and chain names are
/// `&'static str` throughout the backend).
fn leak_names(names: impl Iterator<Item = String>) -> Vec<&'static str> {
    names.map(|n| &*Box::leak(n.into_boxed_str())).collect()
}

/// The dispatch rule to the bucket chains: a static anonymous verdict map on the low bits of
/// the target id (the bucket), so that no per-target verdict element exists for them.
fn bucket_dispatch() -> String {
    const _: () = assert!(RR_BUCKETS.is_power_of_two());
    let arms: Vec<String> = (0..RR_BUCKETS)
        .map(|b| format!("{b} : goto {}", bucket_chain(b)))
        .collect();
    format!(
        "ct mark & {:#x} vmap {{ {} }}",
        RR_BUCKETS - 1,
        arms.join(", ")
    )
}

/// The rules of the bucket chains: per protocol, one rule per endpoint count, each with its own
/// `numgen` counter (shared only by the targets of one bucket with one count).
fn round_robin_rules(f: &Fam) -> Vec<(&'static str, String)> {
    let mut rules = Vec::new();
    for bucket in 0..RR_BUCKETS {
        for p in SLOT_PROTOCOLS {
            for n in 1..=RR_COUNTS {
                rules.push((
                    bucket_chain(bucket),
                    format!(
                        "meta l4proto {p} ct mark @{} dnat {} to ct mark . numgen inc mod {n} map @{}",
                        rr_count_set(n),
                        f.ip,
                        slots_map(p, bucket)
                    ),
                ));
            }
        }
    }
    rules
}

/// The round-robin chain over `n` slots for counter bucket `bucket`.
pub fn rr_chain(n: usize, bucket: u32, f: &Fam) -> (String, Vec<String>) {
    let (table, ip) = (f.table, f.ip);
    let name = format!("rr_{n}_{bucket}");
    let mut commands = vec![
        format!("add chain {table} {name}"),
        format!("flush chain {table} {name}"),
    ];
    for p in SLOT_PROTOCOLS {
        commands.push(format!(
            "add rule {table} {name} meta l4proto {p} dnat {ip} to ct mark . numgen inc mod {n} map @{}",
            slots_map(p, bucket)
        ));
    }
    (name, commands)
}

/// The protocols with slot maps, in the names nft uses.
pub const SLOT_PROTOCOLS: [&str; 3] = ["tcp", "udp", "sctp"];

/// The slot map of a protocol (`tcp`, `udp`, `sctp`) in counter bucket `bucket`:
/// `slots_<protocol>_<bucket>`.
///
/// One map per protocol because nft 1.0.6 cannot re-read a `typeof` map whose data is `th dport`
/// when it adds a rule to an existing table ("conflicting protocols"). One per bucket because a
/// rule that looks up a map makes the kernel walk all of the map's elements when it binds them
/// (`nf_tables_bind_set` checks every element of a map): measured on this kernel at 20,000
/// Services, adding an `rr_N_B` rule over one 80,000-element map took 5 ms of system time, over a
/// 5,000-element map (one bucket's share) under 1 ms. This matters when a target with more than
/// [`RR_COUNTS`] endpoints needs an `rr_N_B` chain its bucket does not have yet, and for the
/// bucket chains of a full sync.
pub fn slots_map(protocol: &str, bucket: u32) -> &'static str {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        leak_names(
            SLOT_PROTOCOLS
                .iter()
                .flat_map(|p| (0..RR_BUCKETS).map(move |b| format!("slots_{p}_{b}"))),
        )
    });
    let p = SLOT_PROTOCOLS
        .iter()
        .position(|x| *x == protocol)
        .unwrap_or(SLOT_PROTOCOLS.len() - 1);
    names[p * RR_BUCKETS as usize + (bucket % RR_BUCKETS) as usize]
}

/// The Maglev table map of a protocol (`tcp`, `udp`, `sctp`): `maglev_<protocol>`, target id .
/// slot -> endpoint. One per protocol like the slot maps; bound once, by the skeleton's rules.
pub fn maglev_map(protocol: &str) -> &'static str {
    match protocol {
        "tcp" => "maglev_tcp",
        "udp" => "maglev_udp",
        _ => "maglev_sctp",
    }
}

/// The Maglev rule of protocol `p`: the kernel's jhash of the flow's addresses and ports, scaled
/// into the table as `crate::maglev::flow_hash` and the eBPF programs compute it (same fields,
/// same seed), picks the slot of the target's table.
fn maglev_rule(s: &Skeleton, p: &str) -> String {
    let ip = s.fam.ip;
    format!(
        "meta l4proto {p} dnat {ip} to ct mark . jhash {ip} saddr . {ip} daddr . {p} sport . {p} dport \
         mod {} seed {:#x} map @{}",
        s.maglev_table_size,
        proxy_common::hash::FLOW_SEED,
        maglev_map(p)
    )
}

/// The least-connection pick map of a protocol (`tcp`, `udp`, `sctp`): `lc_pick_<protocol>`.
///
/// One per protocol, like the slot maps: a single map typed `th dport` (any protocol) makes nft
/// 1.0.6 fail every later transaction that re-reads the table ("conflicting protocols specified:
/// tcp vs. th"), so a full resync could not reload the table in place. A target's picks are
/// written to all three (its id keys them; only its own protocol's is read).
pub fn lc_pick_map(protocol: &str) -> &'static str {
    match protocol {
        "tcp" => "lc_pick_tcp",
        "udp" => "lc_pick_udp",
        _ => "lc_pick_sctp",
    }
}

/// Name of the affinity map and lookup chain for a timeout of `secs` seconds.
pub fn affinity_name(secs: u64) -> String {
    format!("aff_{secs}")
}

/// Name of the chain that records affinity for a timeout of `secs` seconds.
pub fn affinity_record_name(secs: u64) -> String {
    format!("rec_{secs}")
}

/// The affinity maps for one timeout, its lookup chain and its record chain.
///
/// Keyed by (target id, client address; [`Fam::affinity_client`]), `aff_T` holds the address of the endpoint the client
/// used last and `affp_T` its port. Two maps rather than one with `address . port` data: nft
/// 1.0.6 aborts on an `update` whose data concatenates an IPv6 address and a port ("Assertion
/// `dreg < ctx->reg_low' failed"), and both families keep one layout. Both are written together
/// with the same timeout; a lookup that misses either falls through to the normal balancing.
/// They are created with `add` (kept when they exist) so that a resync does not forget clients.
pub fn affinity_chains(secs: u64, f: &Fam) -> (String, Vec<String>) {
    let (table, ip) = (f.table, f.ip);
    let name = affinity_name(secs);
    let ports = format!("affp_{secs}");
    let rec = affinity_record_name(secs);
    let map = |name: &str, ty: &str| {
        format!(
            "add map {table} {name} {{ {ty}; size 1048576; timeout {secs}s; flags dynamic,timeout; }}"
        )
    };
    let key = format!("ct mark . {}", f.affinity_client);
    let commands = vec![
        map(&name, f.affinity_types.0),
        map(&ports, f.affinity_types.1),
        format!("add chain {table} {name}"),
        format!("flush chain {table} {name}"),
        format!(
            "add rule {table} {name} meta l4proto {{ tcp, udp, sctp }} dnat {ip} to {key} map @{name} : {key} map @{ports}"
        ),
        format!("add chain {table} {rec}"),
        format!("flush chain {table} {rec}"),
        format!(
            "add rule {table} {rec} update @{name} {{ {key} : {ip} daddr }} update @{ports} {{ {key} : th dport }}"
        ),
    ];
    (name, commands)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key `proxy trace` computes is the rule's: same seed, same modulus (the conformance
    /// suite's IPv6 session-affinity scenario finds the kernel's entry with it).
    #[test]
    fn the_ipv6_affinity_key_is_the_rules_hash() {
        let seed = format!("seed {AFFINITY_V6_SEED:#x}");
        assert!(
            V6.affinity_client.ends_with(&seed),
            "{}",
            V6.affinity_client
        );
        assert!(V6.affinity_client.contains(&format!("mod {}", u32::MAX)));
        for types in [V6.affinity_types.0, V6.affinity_types.1] {
            assert!(types.contains(V6.affinity_client), "{types}");
        }
        let a: std::net::Ipv6Addr = "fd00:10:244:c8::2".parse().unwrap();
        let b: std::net::Ipv6Addr = "fd00:10:244:c8::3".parse().unwrap();
        assert_ne!(affinity_v6_key(a), affinity_v6_key(b));
    }

    /// Every bucket chain has one rule per protocol and endpoint count, over its own bucket's
    /// slot map, and dispatch reaches every bucket through one static verdict map.
    #[test]
    fn bucket_chains_cover_every_protocol_and_count() {
        let rules = round_robin_rules(&V4);
        assert_eq!(
            rules.len(),
            RR_BUCKETS as usize * SLOT_PROTOCOLS.len() * RR_COUNTS
        );
        for (chain, rule) in &rules {
            let bucket = chain.trim_start_matches("rrb_");
            assert!(rule.ends_with(&format!("_{bucket}")), "{chain}: {rule}");
        }
        assert!(rules.iter().any(|(c, r)| *c == "rrb_7"
            && r == "meta l4proto udp ct mark @rr_n3 dnat ip to ct mark . numgen inc mod 3 map @slots_udp_7"));
        let dispatch = bucket_dispatch();
        assert!(dispatch.starts_with("ct mark & 0xf vmap { 0 : goto rrb_0, "));
        assert!(dispatch.ends_with("15 : goto rrb_15 }"));
        let skel = skeleton(&Skeleton::empty(IpFamily::V4));
        for n in 1..=RR_COUNTS {
            assert!(skel.contains(&format!("add set ip kpr rr_n{n} {{ type mark; }}")));
        }
    }

    /// A round-robin chain binds only its own bucket's slot maps (binding walks every element),
    /// and the skeleton creates every bucket's maps for every protocol.
    #[test]
    fn round_robin_chains_bind_their_own_buckets_slot_maps() {
        let (name, commands) = rr_chain(3, 5, &V6);
        assert_eq!(name, "rr_3_5");
        let rules: Vec<&String> = commands.iter().filter(|c| c.contains("map @")).collect();
        assert_eq!(rules.len(), SLOT_PROTOCOLS.len());
        for (rule, p) in rules.iter().zip(SLOT_PROTOCOLS) {
            assert!(rule.ends_with(&format!("map @slots_{p}_5")), "{rule}");
        }
        let skel = skeleton(&Skeleton::empty(IpFamily::V4));
        for p in SLOT_PROTOCOLS {
            for b in 0..RR_BUCKETS {
                assert!(skel.contains(&format!("add map ip kpr slots_{p}_{b} {{")));
            }
        }
        assert_eq!(slots_map("udp", RR_BUCKETS + 2), "slots_udp_2");
    }

    /// Kernels with "nft_byteorder: remove multi-register support" (6.12.115+) refuse the
    /// `byteorder` (size 2, len 1) that nft 1.0.6 adds after `meta l4proto` in the key of an
    /// interval set with a concatenation: such lookups take the protocol from `ip protocol`.
    #[test]
    fn interval_concatenation_lookups_use_no_meta_l4proto() {
        let concat_intervals: Vec<&str> = MANAGED_SETS
            .iter()
            .filter(|(_, _, spec)| spec.contains(" . ") && spec.contains("flags interval"))
            .map(|(_, name, _)| *name)
            .collect();
        assert!(concat_intervals.contains(&"fw_allowed"));
        for (chain, rule) in IpFamily::ALL
            .into_iter()
            .flat_map(|f| base_rules(&Skeleton::empty(f)))
        {
            for name in &concat_intervals {
                if rule.contains(&format!("@{name} ")) || rule.ends_with(&format!("@{name}")) {
                    assert!(
                        !rule.contains("meta l4proto"),
                        "{chain}: {rule} looks up interval set {name} with meta l4proto"
                    );
                }
            }
        }
    }
}
