//! `proxy trace` for the nftables backend: the path a new connection from a source to a destination
//! takes through the `ip kpr` / `ip6 kpr` table as it is in the kernel (read with `nft -j list
//! table` in the caller's network namespace, so it works while the agent is down).
//!
//! Owns the evaluation of the layout `ruleset` describes, step by step: the source class by set
//! (`node_srcs`, `cluster_cidrs`), the loadBalancerSourceRanges check (`fw_protected`,
//! `fw_allowed`), the masquerade sets, the frontend maps (`fe_<class>`, `fe`, and for node ports
//! `nodeport_ips` then `np_<class>`, `np`) that give the target id, then `aff_lookup` (and the
//! client's affinity entry), `targets` (empty verdicts, least-connection, large round-robin) or
//! the bucket's `rr_nN` set, and the slots the dnat picks from; a destination no map knows is
//! checked against `cluster_ips` (reject) and `service_cidrs` (drop). Which slot `numgen` picks
//! next is the kernel's counter, so the result is the endpoint set, or the one endpoint when
//! there is a single slot or an affinity entry.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

pub use crate::nft::snapshot::TableSnapshot;

use super::compile::RR_BUCKETS;
use super::ruleset::{self, CLASSES, LC_SLOTS, RR_COUNTS};
use crate::error::DataplaneError;
use crate::model::{IpFamily, Protocol};

/// Reads `family`'s kpr table in this network namespace.
pub fn read_table(family: IpFamily) -> Result<TableSnapshot, DataplaneError> {
    let f = ruleset::fam(family);
    let (nf, name) = f
        .table
        .split_once(' ')
        .unwrap_or((f.table, ruleset::TABLE_NAME));
    let mut t = crate::nft::snapshot::read(nf, name)?;
    t.family = Some(family);
    Ok(t)
}

/// What a trace asks: a new connection from `src` to `dst:port/proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub port: u16,
    pub proto: Protocol,
}

/// Where the connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Translated to one of these endpoints (one when a single slot or affinity decides).
    Dnat {
        endpoints: Vec<SocketAddr>,
        how: String,
    },
    /// Rejected (TCP reset / ICMP unreachable).
    Reject(String),
    /// Dropped.
    Drop(String),
    /// Not a Service address this table translates: the packet goes on untouched.
    Untouched,
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decision::Dnat { endpoints, how } => {
                let list: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
                if endpoints.len() == 1 {
                    write!(f, "dnat to {} ({how})", list[0])
                } else {
                    write!(f, "dnat to one of {} ({how})", list.join(", "))
                }
            }
            Decision::Reject(why) => write!(f, "reject ({why})"),
            Decision::Drop(why) => write!(f, "drop ({why})"),
            Decision::Untouched => write!(f, "untouched: not a Service address of this table"),
        }
    }
}

/// The steps taken and the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub steps: Vec<String>,
    pub decision: Decision,
    /// Whether postrouting masquerades the connection.
    pub masquerade: bool,
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn endpoint(v: &Value) -> Option<SocketAddr> {
    let parts = v.get("concat")?.as_array()?;
    let addr: IpAddr = parts.first()?.as_str()?.parse().ok()?;
    let port = u16::try_from(parts.get(1)?.as_u64()?).ok()?;
    Some(SocketAddr::new(addr, port))
}

/// The endpoints in `map` under `mark . 0..n`.
fn slots(
    t: &TableSnapshot,
    map: &str,
    mark: u64,
    n: usize,
    steps: &mut Vec<String>,
) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for i in 0..n {
        match t
            .lookup(map, &[mark.into(), (i as u64).into()])
            .and_then(endpoint)
        {
            Some(ep) => {
                steps.push(format!("    @{map} [{mark} . {i}] -> {ep}"));
                out.push(ep);
            }
            None => steps.push(format!("    @{map} [{mark} . {i}] missing")),
        }
    }
    out
}

fn dnat(mut endpoints: Vec<SocketAddr>, how: String) -> Decision {
    endpoints.dedup();
    if endpoints.is_empty() {
        return Decision::Drop(format!("{how}: no slot holds an endpoint"));
    }
    Decision::Dnat { endpoints, how }
}

/// Evaluates a new connection against one family's table.
pub fn trace(t: &TableSnapshot, req: &TraceRequest) -> Trace {
    let mut steps = Vec::new();
    let proto = proto_name(req.proto);
    let (src, dst) = (req.src.to_string(), req.dst.to_string());
    let fe_key: [Value; 3] = [dst.clone().into(), proto.into(), u64::from(req.port).into()];
    let np_key: [Value; 2] = [proto.into(), u64::from(req.port).into()];

    // filter prerouting (dstnat - 10): loadBalancerSourceRanges.
    if t.has_key("fw_protected", &fe_key) {
        let allowed_key: Vec<Value> = fe_key.iter().cloned().chain([src.clone().into()]).collect();
        if t.has_addr("node_srcs", req.src) {
            steps.push(format!(
                "firewall: {dst} . {proto} . {} in @fw_protected; the source is the node's (@node_srcs): allowed",
                req.port
            ));
        } else if t.has_key("fw_allowed", &allowed_key) {
            steps.push(format!(
                "firewall: in @fw_protected; {src} in its loadBalancerSourceRanges (@fw_allowed): allowed"
            ));
        } else {
            steps.push(format!(
                "firewall: {dst} . {proto} . {} in @fw_protected; {src} in none of its \
                 loadBalancerSourceRanges (@fw_allowed)",
                req.port
            ));
            return Trace {
                steps,
                decision: Decision::Drop("loadBalancerSourceRanges".into()),
                masquerade: false,
            };
        }
    }

    // nat prerouting / output: the source class.
    let class = if t.has_addr("node_srcs", req.src) {
        steps.push(format!("nat: {src} in @node_srcs -> from_node"));
        0
    } else if t.has_addr("cluster_cidrs", req.src) {
        steps.push(format!(
            "nat prerouting: {src} in @cluster_cidrs -> from_pod"
        ));
        1
    } else {
        steps.push(format!(
            "nat prerouting: {src} in neither @node_srcs nor @cluster_cidrs -> from_ext"
        ));
        2
    };
    let cls = CLASSES[class];
    let chain = format!("from_{cls}");
    let mut masquerade = false;
    let masq_set = format!("masq_{cls}");
    if t.has_key(&masq_set, &fe_key) {
        steps.push(format!(
            "{chain}: {dst} . {proto} . {} in @{masq_set}: masquerade mark",
            req.port
        ));
        masquerade = true;
    }
    if t.chain_uses(&chain, "cluster_ips") && t.has_addr("cluster_ips", req.dst) {
        steps.push(format!(
            "{chain}: {dst} in @cluster_ips (clusterIP masquerade): masquerade mark"
        ));
        masquerade = true;
    }
    let mut mark = None;
    for map in [format!("fe_{cls}"), "fe".to_string()] {
        if let Some(m) = t.lookup(&map, &fe_key).and_then(Value::as_u64) {
            steps.push(format!(
                "{chain}: {dst} . {proto} . {} in @{map} -> ct mark {m}, goto dispatch",
                req.port
            ));
            mark = Some(m);
            break;
        }
    }
    if mark.is_none() && t.has_addr("nodeport_ips", req.dst) {
        let npmasq = format!("npmasq_{cls}");
        if t.has_key(&npmasq, &np_key) {
            steps.push(format!(
                "{chain}: {dst} in @nodeport_ips, {proto} . {} in @{npmasq}: masquerade mark",
                req.port
            ));
            masquerade = true;
        }
        for map in [format!("np_{cls}"), "np".to_string()] {
            if let Some(m) = t.lookup(&map, &np_key).and_then(Value::as_u64) {
                steps.push(format!(
                    "{chain}: {dst} in @nodeport_ips, {proto} . {} in @{map} -> ct mark {m}, goto dispatch",
                    req.port
                ));
                mark = Some(m);
                break;
            }
        }
    }
    let Some(mark) = mark else {
        steps.push(format!(
            "{chain}: {dst} . {proto} . {} in no frontend map",
            req.port
        ));
        let decision = if t.has_addr("cluster_ips", req.dst) {
            steps.push(format!(
                "checks: {dst} in @cluster_ips (a port the Service does not expose)"
            ));
            Decision::Reject("a clusterIP port the Service does not have".into())
        } else if t.has_addr("service_cidrs", req.dst) {
            steps.push(format!(
                "checks: {dst} in @service_cidrs (no Service has this address)"
            ));
            Decision::Drop("an unallocated address of the Service CIDR".into())
        } else {
            Decision::Untouched
        };
        return Trace {
            steps,
            decision,
            masquerade: false,
        };
    };

    // dispatch.
    let key = [Value::from(mark)];
    if let Some(verdict) = t.lookup("aff_lookup", &key) {
        let target = verdict_target(verdict).unwrap_or_default();
        steps.push(format!(
            "dispatch: ct mark {mark} in @aff_lookup -> jump {target}"
        ));
        // IPv6 entries are keyed by a hash of the client's address (ruleset::V6).
        let (client_key, shown) = match req.src {
            IpAddr::V4(_) => (Value::from(src.clone()), src.clone()),
            IpAddr::V6(a) => {
                let h = ruleset::affinity_v6_key(a);
                (Value::from(h), format!("{h} (jhash of {src})"))
            }
        };
        let client = [Value::from(mark), client_key];
        let ports = target.replacen("aff_", "affp_", 1);
        let hit = t
            .lookup(&target, &client)
            .and_then(|v| v.as_str()?.parse::<IpAddr>().ok())
            .zip(
                t.lookup(&ports, &client)
                    .and_then(|v| u16::try_from(v.as_u64()?).ok()),
            );
        match hit {
            Some((addr, port)) => {
                let ep = SocketAddr::new(addr, port);
                steps.push(format!(
                    "{target}: [{mark} . {shown}] -> {ep} (this client's affinity entry)"
                ));
                return Trace {
                    steps,
                    decision: Decision::Dnat {
                        endpoints: vec![ep],
                        how: "session affinity".into(),
                    },
                    masquerade,
                };
            }
            None => steps.push(format!(
                "{target}: no entry for [{mark} . {shown}]: balanced as below"
            )),
        }
    }
    if let Some(verdict) = t.lookup("targets", &key) {
        let target = verdict_target(verdict).unwrap_or_default();
        steps.push(format!(
            "dispatch: ct mark {mark} in @targets -> goto {target}"
        ));
        let decision = match target.as_str() {
            "empty_reject" => Decision::Reject("the Service has no usable endpoint".into()),
            "empty_drop" => {
                Decision::Drop("externalTrafficPolicy Local: no endpoint on this node".into())
            }
            "lc" => {
                let map = ruleset::lc_pick_map(proto);
                let eps = slots(t, map, mark, LC_SLOTS, &mut steps);
                dnat(
                    eps,
                    "least connections: the endpoints tied for the fewest".into(),
                )
            }
            rr => match parse_rr_chain(rr) {
                Some((n, bucket)) => {
                    let map = ruleset::slots_map(proto, bucket);
                    let eps = slots(t, map, mark, n, &mut steps);
                    dnat(eps, format!("round robin over {n} slots"))
                }
                None => Decision::Drop(format!("unknown verdict {rr}")),
            },
        };
        return Trace {
            steps,
            decision,
            masquerade,
        };
    }
    let bucket = (mark as u32) & (RR_BUCKETS - 1);
    let n = (1..=RR_COUNTS).find(|&n| t.has_key(ruleset::rr_count_set(n), &key));
    let Some(n) = n else {
        steps.push(format!(
            "dispatch: ct mark {mark} in no @rr_nN set: nothing translates it"
        ));
        return Trace {
            steps,
            decision: Decision::Drop("the target has no round-robin slots".into()),
            masquerade,
        };
    };
    let map = ruleset::slots_map(proto, bucket);
    steps.push(format!(
        "dispatch: ct mark & {:#x} = {bucket} -> {}: ct mark in @{} -> dnat from @{map}",
        RR_BUCKETS - 1,
        ruleset::bucket_chain(bucket),
        ruleset::rr_count_set(n)
    ));
    let eps = slots(t, map, mark, n, &mut steps);
    let how = if n == 1 {
        "its only endpoint".to_string()
    } else {
        format!("round robin over {n} slots")
    };
    Trace {
        steps,
        decision: dnat(eps, how),
        masquerade,
    }
}

/// `rr_N_B` -> (N, B).
fn parse_rr_chain(name: &str) -> Option<(usize, u32)> {
    let rest = name.strip_prefix("rr_")?;
    let (n, b) = rest.split_once('_')?;
    Some((n.parse().ok()?, b.parse().ok()?))
}

/// The chain a verdict element names (`{"goto": {"target": "lc"}}`).
fn verdict_target(v: &Value) -> Option<String> {
    ["goto", "jump"]
        .iter()
        .find_map(|k| v.get(k)?.get("target")?.as_str().map(str::to_string))
}

/// The trace as `proxy trace` prints it.
pub fn render(req: &TraceRequest, t: &Trace) -> String {
    let mut out = format!(
        "{} -> {}/{}  nftables\n",
        req.src,
        SocketAddr::new(req.dst, req.port),
        proto_name(req.proto)
    );
    for s in &t.steps {
        let _ = writeln!(out, "{s}");
    }
    if t.masquerade && matches!(t.decision, Decision::Dnat { .. }) {
        let _ = writeln!(
            out,
            "nat postrouting: masquerade mark set: the source is masqueraded"
        );
    }
    let _ = writeln!(out, "decision: {}", t.decision);
    out
}

#[cfg(test)]
mod tests;
