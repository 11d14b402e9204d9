//! Conntrack housekeeping shared by the rule backends (iptables, nftables).
//!
//! Owns: removal of stale UDP/SCTP conntrack entries (docs/SERVICE-SEMANTICS.md: entries pointing
//! at an endpoint that went away, and entries of a Service that went from no endpoint to some,
//! which hold cached rejects), plus the conntrack event stream ([`events`]) and the
//! least-connection controller built on it ([`leastconn`]). TCP entries are never touched. Runs the
//! `conntrack` CLI in the calling thread's network namespace.

pub mod events;
pub mod leastconn;

use std::net::IpAddr;
use std::process::Command;

use crate::error::DataplaneError;
use crate::model::{Endpoint, Protocol, ServicePort, ServicePortName};
use crate::state::{ChangeSet, ProxyState};

/// A `conntrack -D` filter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CtFilter {
    pub protocol: Protocol,
    /// Original destination address (a Service address).
    pub orig_dst: Option<IpAddr>,
    /// Original destination port.
    pub orig_dport: Option<u16>,
    /// Reply source: the endpoint the entry was translated to.
    pub reply_src: Option<IpAddr>,
    pub reply_sport: Option<u16>,
    /// Only entries whose destination was translated.
    pub dst_nat: bool,
}

impl CtFilter {
    /// The `conntrack -D` arguments of this filter.
    pub fn args(&self) -> Vec<String> {
        let v6 = [self.orig_dst, self.reply_src]
            .iter()
            .flatten()
            .any(IpAddr::is_ipv6);
        let mut a = vec![
            "-D".to_string(),
            "-f".into(),
            if v6 { "ipv6" } else { "ipv4" }.into(),
            "-p".into(),
            self.protocol.lower().into(),
        ];
        let mut push = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(flag.to_string());
                a.push(v);
            }
        };
        push("--orig-dst", self.orig_dst.map(|x| x.to_string()));
        push("--dport", self.orig_dport.map(|x| x.to_string()));
        push("--reply-src", self.reply_src.map(|x| x.to_string()));
        push("--reply-port-src", self.reply_sport.map(|x| x.to_string()));
        if self.dst_nat {
            a.push("--dst-nat".into());
        }
        a
    }
}

/// Whether conntrack entries of this protocol are cleaned (TCP never is).
fn cleaned(p: Protocol) -> bool {
    matches!(p, Protocol::Udp | Protocol::Sctp)
}

/// Every (address, port) a Service port can be reached at; nodePorts have no fixed address.
fn frontends(svc: &ServicePort) -> Vec<(Option<IpAddr>, u16)> {
    let mut out: Vec<(Option<IpAddr>, u16)> = svc
        .cluster_ips
        .iter()
        .chain(&svc.external_ips)
        .chain(&svc.load_balancer_ips)
        .map(|ip| (Some(*ip), svc.port))
        .collect();
    if svc.node_port != 0 {
        out.push((None, svc.node_port));
    }
    out
}

/// The filters that remove stale entries after a sync (pure).
pub fn stale_filters(state: &ProxyState, changes: &ChangeSet) -> Vec<CtFilter> {
    let mut out = Vec::new();
    for (spn, eps) in &changes.removed_endpoints {
        if cleaned(spn.protocol) {
            out.extend(removed_endpoint_filters(state.service(spn), spn, eps));
        }
    }
    for spn in &changes.became_reachable {
        let Some(svc) = state.service(spn) else {
            continue;
        };
        if !cleaned(svc.protocol) {
            continue;
        }
        for (ip, port) in frontends(svc) {
            out.push(CtFilter {
                protocol: svc.protocol,
                orig_dst: ip,
                orig_dport: Some(port),
                reply_src: None,
                reply_sport: None,
                dst_nat: false,
            });
        }
    }
    out.sort();
    out.dedup();
    out
}

fn removed_endpoint_filters(
    svc: Option<&ServicePort>,
    spn: &ServicePortName,
    eps: &[Endpoint],
) -> Vec<CtFilter> {
    let mut out = Vec::new();
    for ep in eps {
        let base = CtFilter {
            protocol: spn.protocol,
            orig_dst: None,
            orig_dport: None,
            reply_src: Some(ep.addr),
            reply_sport: Some(ep.port),
            dst_nat: true,
        };
        match svc {
            // The Service is still there: only its own flows towards the endpoint.
            Some(svc) => out.extend(frontends(svc).into_iter().map(|(ip, port)| CtFilter {
                orig_dst: ip,
                orig_dport: Some(port),
                ..base.clone()
            })),
            // The Service is gone: every translated flow towards the endpoint.
            None => out.push(base),
        }
    }
    out
}

/// Runs one `conntrack -D`; returns how many entries it deleted.
pub fn delete(filter: &CtFilter) -> Result<usize, DataplaneError> {
    let args = filter.args();
    let out = Command::new("conntrack")
        .args(&args)
        .output()
        .map_err(|e| DataplaneError::io("running conntrack -D (is conntrack installed?)", e))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // "conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted." (exit 1 for 0)
    let deleted = stderr
        .split(": ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<usize>().ok());
    match deleted {
        Some(n) if stderr.contains("have been deleted") => Ok(n),
        _ => Err(DataplaneError::Command {
            command: format!("conntrack {}", args.join(" ")),
            detail: stderr.trim().to_string(),
        }),
    }
}

/// Removes the stale UDP/SCTP entries a sync left behind; returns how many were deleted.
pub fn cleanup_stale(state: &ProxyState, changes: &ChangeSet) -> Result<usize, DataplaneError> {
    let mut total = 0;
    let mut first_err = None;
    for f in stale_filters(state, changes) {
        match delete(&f) {
            Ok(n) => total += n,
            Err(e) => {
                tracing::warn!("conntrack cleanup: {e}");
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn spn(p: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: "dns".into(),
            port_name: "".into(),
            protocol: p,
        }
    }

    fn svc(p: Protocol) -> ServicePort {
        ServicePort {
            name: spn(p),
            cluster_ips: vec!["10.96.0.10".parse().unwrap()],
            port: 53,
            protocol: p,
            node_port: 30053,
            external_ips: vec![],
            load_balancer_ips: vec![],
            source_ranges: vec![],
            affinity: None,
            external_local: false,
            internal_local: false,
            health_check_node_port: 0,
            algorithm: Default::default(),
        }
    }

    fn ep() -> Endpoint {
        Endpoint {
            addr: "10.244.1.5".parse().unwrap(),
            port: 5353,
            node: None,
            zone: None,
            ready: true,
            serving: true,
            terminating: false,
            hints: None,
        }
    }

    #[test]
    fn removed_udp_endpoint_is_cleaned_per_frontend_and_tcp_never() {
        let mut state = ProxyState::default();
        for p in [Protocol::Udp, Protocol::Tcp] {
            state.set_port(svc(p), Vec::new());
        }
        let mut changes = ChangeSet::default();
        changes
            .removed_endpoints
            .insert(spn(Protocol::Udp), vec![ep()]);
        changes
            .removed_endpoints
            .insert(spn(Protocol::Tcp), vec![ep()]);
        let f = stale_filters(&state, &changes);
        assert_eq!(f.len(), 2, "clusterIP and nodePort: {f:?}");
        assert!(f.iter().all(|f| f.protocol == Protocol::Udp));
        let args = f
            .iter()
            .find(|f| f.orig_dst.is_some())
            .unwrap()
            .args()
            .join(" ");
        assert_eq!(
            args,
            "-D -f ipv4 -p udp --orig-dst 10.96.0.10 --dport 53 --reply-src 10.244.1.5 \
             --reply-port-src 5353 --dst-nat"
        );
    }

    #[test]
    fn endpoint_of_a_deleted_service_is_cleaned_by_endpoint_alone() {
        let mut changes = ChangeSet::default();
        changes
            .removed_endpoints
            .insert(spn(Protocol::Udp), vec![ep()]);
        let f = stale_filters(&ProxyState::default(), &changes);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].orig_dst, None);
        assert!(f[0].dst_nat);
    }

    #[test]
    fn became_reachable_cleans_the_service_addresses() {
        let mut state = ProxyState::default();
        state.set_port(svc(Protocol::Udp), Vec::new());
        let changes = ChangeSet {
            became_reachable: BTreeSet::from([spn(Protocol::Udp)]),
            ..Default::default()
        };
        let f = stale_filters(&state, &changes);
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|f| f.reply_src.is_none()));
    }
}
