//! `proxy trace` for the userspace backend, in its two halves: what the kernel does with a new
//! connection (the `kpr-userspace` table as `nft -j list table` prints it: reject, drop,
//! redirect to the agent's TCP listener or a Service port's UDP socket, or untouched), and what
//! the listener then decides (the agent's `GET /trace`: the Service port the original destination
//! resolves to, the loadBalancerSourceRanges check, the endpoints `selection::route` gives this
//! source, and the endpoint the balancer's state picks next: the client's affinity entry, the
//! round-robin cursor, the least-loaded endpoint, or the Maglev slot of a given source port).

use std::net::SocketAddr;

use serde_json::Value;

use super::rules;
use super::table::Table;
use super::tcp::{lb_source_allowed, Shared};
use crate::dataplane::{TraceQuery, TraceView};
use crate::model::{IpFamily, Protocol};
use crate::nft::snapshot::TableSnapshot;
use crate::selection::{route, DestKind, EmptyVerdict};

/// The table this backend keeps for `family`, read back in this network namespace.
pub fn read_table(family: IpFamily) -> Result<TableSnapshot, crate::error::DataplaneError> {
    let mut t = crate::nft::snapshot::read(rules::nft_family(family).0, rules::TABLE)?;
    t.family = Some(family);
    Ok(t)
}

/// What the `kpr-userspace` table does with the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelVerdict {
    /// Redirected to the agent (TCP listener, or this UDP port).
    Redirect(String),
    Reject(String),
    Drop(String),
    Untouched,
}

/// Walks `filter_services` then `redirect_services` of the table for a new connection.
pub fn kernel(t: &TableSnapshot, q: &TraceQuery, steps: &mut Vec<String>) -> KernelVerdict {
    let proto = q.proto.lower();
    let (dst, port) = (q.dst.to_string(), u64::from(q.port));
    let fe: [Value; 3] = [dst.clone().into(), proto.into(), port.into()];
    let np: [Value; 2] = [proto.into(), port.into()];
    let reset = if q.proto == Protocol::Tcp {
        "tcp reset"
    } else {
        "icmp port unreachable"
    };
    if t.has_key("svc_reject", &fe) {
        steps.push(format!(
            "filter_services: {dst} . {proto} . {port} in @svc_reject: reject with {reset}"
        ));
        return KernelVerdict::Reject("the Service has no usable endpoint".into());
    }
    if t.has_key("svc_drop", &fe) {
        steps.push(format!(
            "filter_services: {dst} . {proto} . {port} in @svc_drop: drop"
        ));
        return KernelVerdict::Drop(
            "no usable endpoint for this source (traffic policy Local)".into(),
        );
    }
    let on_np = t.has_addr("np_ips", q.dst);
    if on_np && t.has_key("np_reject", &np) {
        steps.push(format!(
            "filter_services: {dst} in @np_ips, {proto} . {port} in @np_reject: reject with {reset}"
        ));
        return KernelVerdict::Reject("the Service has no usable endpoint".into());
    }
    if on_np && t.has_key("np_drop", &np) {
        steps.push(format!(
            "filter_services: {dst} in @np_ips, {proto} . {port} in @np_drop: drop"
        ));
        return KernelVerdict::Drop(
            "no usable endpoint for this source (traffic policy Local)".into(),
        );
    }
    let cluster_ip = t.has_addr("cluster_ips", q.dst);
    if cluster_ip && !t.has_key("svc_ports", &fe) {
        steps.push(format!(
            "filter_services: {dst} in @cluster_ips, {proto} . {port} not in @svc_ports: reject \
             with {reset}"
        ));
        return KernelVerdict::Reject("a clusterIP port the Service does not have".into());
    }
    if !cluster_ip && t.has_addr("service_cidrs", q.dst) {
        steps.push(format!(
            "filter_services: {dst} in @service_cidrs, not in @cluster_ips: drop"
        ));
        return KernelVerdict::Drop("an unallocated address of the Service CIDR".into());
    }
    let key: [Value; 2] = [dst.clone().into(), port.into()];
    let to = match q.proto {
        Protocol::Tcp if t.has_key("svc_tcp", &key) => {
            Some(("@svc_tcp", "the TCP listener".into()))
        }
        Protocol::Udp => t
            .lookup("svc_udp", &key)
            .and_then(Value::as_u64)
            .map(|p| ("@svc_udp", format!("the Service port's UDP socket :{p}"))),
        _ => None,
    };
    let to = to.or_else(|| {
        if !on_np {
            return None;
        }
        match q.proto {
            Protocol::Tcp if t.has_key("np_tcp", &[port.into()]) => {
                Some(("@np_ips, @np_tcp", "the TCP listener".into()))
            }
            Protocol::Udp => t
                .lookup("np_udp", &[port.into()])
                .and_then(Value::as_u64)
                .map(|p| {
                    (
                        "@np_ips, @np_udp",
                        format!("the nodePort's UDP socket :{p}"),
                    )
                }),
            _ => None,
        }
    });
    match to {
        Some((sets, listener)) => {
            steps.push(format!(
                "redirect_services: {dst} . {port} in {sets}: redirect to {listener}"
            ));
            KernelVerdict::Redirect(listener)
        }
        None => {
            steps.push(format!("{dst} . {proto} . {port}: in no set of the table"));
            KernelVerdict::Untouched
        }
    }
}

/// The listener's half, from the agent's own state (`GET /trace`).
pub fn listener(shared: &Shared, q: &TraceQuery) -> TraceView {
    let table: std::sync::RwLockReadGuard<'_, Table> = shared.table.read().expect("table lock");
    let dst = SocketAddr::new(q.dst, q.port);
    let mut steps = Vec::new();
    let Some((entry, kind)) = table.resolve(dst, q.proto) else {
        return TraceView {
            steps: vec![format!(
                "listener: {dst}/{} is no Service destination of the agent's table",
                q.proto.lower()
            )],
            decision: "untouched: not a Service address of this agent".into(),
            endpoints: Vec::new(),
        };
    };
    drop(table);
    let svc = &entry.svc;
    steps.push(format!(
        "listener: original destination {dst} -> {} ({})",
        svc.name,
        kind_name(kind)
    ));
    if kind == DestKind::LoadBalancer
        && !lb_source_allowed(&svc.source_ranges, &shared.node, q.src, q.dst)
    {
        steps.push(format!(
            "listener: {} is in none of the loadBalancerSourceRanges: the connection is closed",
            q.src
        ));
        return TraceView {
            steps,
            decision: "close (loadBalancerSourceRanges: the listener accepts, then closes it)"
                .into(),
            endpoints: Vec::new(),
        };
    }
    let r = route(svc, &entry.sel, &shared.node, q.src, kind);
    let family = IpFamily::of(&q.src);
    let candidates: Vec<SocketAddr> = r
        .endpoints
        .iter()
        .map(|e| e.socket_addr())
        .filter(|a| IpFamily::of(&a.ip()) == family)
        .collect();
    let list: Vec<String> = candidates.iter().map(ToString::to_string).collect();
    steps.push(format!(
        "listener: source class {:?}: candidates [{}] ({} balancing{})",
        shared.node.source_kind(q.src),
        list.join(", "),
        svc.algorithm,
        svc.affinity
            .map(|t| format!(", ClientIP affinity {}s", t.as_secs()))
            .unwrap_or_default()
    ));
    if candidates.is_empty() {
        // The listener has accepted the connection by now: it resets it, or closes it where
        // the rule backends would drop the SYN.
        let decision = match r.empty {
            EmptyVerdict::Reject => "reject (no usable endpoint: the listener resets it)",
            EmptyVerdict::Drop => {
                "close (no usable endpoint for this source, traffic policy Local: the listener \
                 accepts, then closes it)"
            }
        };
        return TraceView {
            steps,
            decision: decision.into(),
            endpoints: Vec::new(),
        };
    }
    let maglev = entry.sel.maglev_table(r.endpoints, family);
    let (pick, how) = shared.balancer.peek(
        svc,
        r.endpoints,
        maglev.map(|t| &**t),
        q.src,
        q.src_port,
        dst,
    );
    steps.push(format!("balancer: {how}"));
    let decision = match pick {
        Some(ep) => format!(
            "proxied to {ep} (the listener's next pick of [{}]: {how})",
            list.join(", ")
        ),
        None => format!("proxied to one of {} ({how})", list.join(", ")),
    };
    TraceView {
        steps,
        decision,
        endpoints: pick.map_or(candidates, |p| vec![p]),
    }
}

fn kind_name(kind: DestKind) -> &'static str {
    match kind {
        DestKind::ClusterIp => "clusterIP",
        DestKind::NodePort => "nodePort",
        DestKind::ExternalIp => "externalIP",
        DestKind::LoadBalancer => "LoadBalancer IP",
    }
}

/// The kernel's half of the trace as `proxy trace` prints it, before the agent's.
pub fn render_kernel(q: &TraceQuery, steps: &[String]) -> String {
    let mut out = format!(
        "{} -> {}/{}  userspace (table {} {})\n",
        q.src,
        SocketAddr::new(q.dst, q.port),
        q.proto.lower(),
        rules::nft_family(IpFamily::of(&q.dst)).0,
        rules::TABLE
    );
    for s in steps {
        out.push_str(s);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
