//! Conntrack housekeeping shared by the rule backends (iptables, nftables).
//!
//! Owns: removal of stale UDP/SCTP conntrack entries (docs/SERVICE-SEMANTICS.md: entries pointing
//! at an endpoint that went away, and entries of a Service that went from no endpoint to some,
//! which hold cached rejects), plus the conntrack event stream ([`events`]) and the
//! least-connection controller built on it ([`leastconn`]), and the conntrack sysctls kube-proxy
//! tunes at start ([`sysctls`]). TCP entries are never touched. Talks to
//! the kernel over ctnetlink ([`netlink`]) in the calling thread's network namespace.

pub mod events;
pub mod leastconn;
pub mod netlink;
pub mod sysctls;

use std::collections::BTreeSet;
use std::net::IpAddr;

use netlink::{CtEntry, CtSocket};

use crate::error::DataplaneError;
use crate::model::{Endpoint, IpFamily, Protocol, ServicePort, ServicePortName};
use crate::state::{ChangeSet, ProxyState};

/// Which entries to delete: every field that is set must match.
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
    /// The table this filter looks in.
    pub fn family(&self) -> IpFamily {
        if [self.orig_dst, self.reply_src]
            .iter()
            .flatten()
            .any(IpAddr::is_ipv6)
        {
            IpFamily::V6
        } else {
            IpFamily::V4
        }
    }

    /// Whether `e` is one of the entries this filter names.
    pub fn matches(&self, e: &CtEntry) -> bool {
        let (Some(orig), Some(reply)) = (e.orig, e.reply) else {
            return false;
        };
        e.protocol == self.protocol.number()
            && self.orig_dst.is_none_or(|ip| ip == orig.dst)
            && self.orig_dport.is_none_or(|p| p == orig.dport)
            && self.reply_src.is_none_or(|ip| ip == reply.src)
            && self.reply_sport.is_none_or(|p| p == reply.sport)
            && (!self.dst_nat || e.dst_nat())
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

/// Deletes every entry that one of `filters` names (one dump per address family); returns how
/// many were deleted. Entries that vanish meanwhile are not errors.
pub fn delete_matching(filters: &[CtFilter]) -> Result<usize, DataplaneError> {
    if filters.is_empty() {
        return Ok(0);
    }
    let families: BTreeSet<IpFamily> = filters.iter().map(CtFilter::family).collect();
    let mut socket = CtSocket::open()
        .map_err(|e| DataplaneError::io("opening a conntrack netlink socket", e))?;
    let mut deleted = 0;
    for family in families {
        let entries = socket
            .dump(family)
            .map_err(|e| DataplaneError::io("dumping the conntrack table", e))?;
        for entry in entries {
            if filters
                .iter()
                .any(|f| f.family() == family && f.matches(&entry))
                && socket
                    .delete(&entry)
                    .map_err(|e| DataplaneError::io("deleting a conntrack entry", e))?
            {
                deleted += 1;
            }
        }
    }
    Ok(deleted)
}

/// Removes the stale UDP/SCTP entries of `families` a sync left behind; returns how many were
/// deleted.
pub fn cleanup_stale(
    state: &ProxyState,
    changes: &ChangeSet,
    families: &[IpFamily],
) -> Result<usize, DataplaneError> {
    let mut filters = stale_filters(state, changes);
    filters.retain(|f| families.contains(&f.family()));
    delete_matching(&filters).inspect_err(|e| tracing::warn!("conntrack cleanup: {e}"))
}

#[cfg(test)]
mod tests {
    use super::netlink::Flow;
    use super::*;

    use crate::model::fixtures;

    fn spn(p: Protocol) -> ServicePortName {
        svc(p).name
    }

    fn svc(protocol: Protocol) -> ServicePort {
        let mut svc = fixtures::service_port("dns", "10.96.0.10");
        svc.name.protocol = protocol;
        ServicePort {
            port: 53,
            protocol,
            node_port: 30053,
            ..svc
        }
    }

    fn ep() -> Endpoint {
        Endpoint {
            port: 5353,
            node: None,
            ..fixtures::endpoint([10, 244, 1, 5].into(), "")
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
        let to_vip = f.iter().find(|f| f.orig_dst.is_some()).unwrap();
        let entry = |dst: &str, dport: u16, ep: &str, status: u32| CtEntry {
            protocol: 17,
            orig: Some(Flow {
                src: "10.244.9.9".parse().unwrap(),
                dst: dst.parse().unwrap(),
                sport: 40000,
                dport,
            }),
            reply: Some(Flow {
                src: ep.parse().unwrap(),
                dst: "10.244.9.9".parse().unwrap(),
                sport: 5353,
                dport: 40000,
            }),
            status,
            ..CtEntry::default()
        };
        let nat = CtEntry::DST_NAT;
        assert!(to_vip.matches(&entry("10.96.0.10", 53, "10.244.1.5", nat)));
        assert!(
            !to_vip.matches(&entry("10.96.0.10", 53, "10.244.1.5", 0)),
            "not translated"
        );
        assert!(
            !to_vip.matches(&entry("10.96.0.10", 53, "10.244.1.6", nat)),
            "other endpoint"
        );
        assert!(
            !to_vip.matches(&entry("10.96.0.11", 53, "10.244.1.5", nat)),
            "other Service"
        );
        let tcp = CtEntry {
            protocol: 6,
            ..entry("10.96.0.10", 53, "10.244.1.5", nat)
        };
        assert!(!to_vip.matches(&tcp));
        assert_eq!(to_vip.family(), IpFamily::V4);
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
