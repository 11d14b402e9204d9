//! Conntrack housekeeping shared by the rule backends (iptables, nftables) and the userspace
//! backend (its UDP redirects).
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
    /// Entries answered from one of these (the Service's serving endpoints) are kept: they are
    /// live flows, translated by the rules as they are, not stale ones.
    pub keep_reply_srcs: Vec<IpAddr>,
    /// Entries answered from one of these ports are kept (the userspace backend's live
    /// listeners).
    pub keep_reply_sports: Vec<u16>,
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
            && !self.keep_reply_srcs.contains(&reply.src)
            && !self.keep_reply_sports.contains(&reply.sport)
    }
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
        if spn.protocol.conntrack_cleaned() {
            out.extend(removed_endpoint_filters(state.service(spn), spn, eps));
        }
    }
    // A port that became reachable: its addresses' entries not answered by a serving endpoint
    // (cached rejects, or flows to endpoints gone meanwhile), as kube-proxy's
    // CleanStaleEntries. Entries that a serving endpoint answers stay: at an agent's start
    // every port "becomes reachable", and deleting a live flow's entry between its request and
    // its reply loses the reply (it comes back from the endpoint's address, no longer
    // translated, and the client's connected socket drops it).
    for spn in &changes.became_reachable {
        let Some(port) = state.get(spn) else {
            continue;
        };
        let svc = &port.service;
        if !svc.protocol.conntrack_cleaned() {
            continue;
        }
        let mut serving: Vec<IpAddr> = port
            .endpoints
            .iter()
            .filter(|e| e.serving)
            .map(|e| e.addr)
            .collect();
        serving.sort();
        serving.dedup();
        for (ip, port) in frontends(svc) {
            out.push(CtFilter {
                protocol: svc.protocol,
                orig_dst: ip,
                orig_dport: Some(port),
                reply_src: None,
                reply_sport: None,
                dst_nat: false,
                keep_reply_srcs: serving.clone(),
                keep_reply_sports: Vec::new(),
            });
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The userspace backend's: UDP entries of every UDP Service address not answered from a port
/// one of `listeners` holds. A client that keeps its socket across an agent restart keeps its
/// entry: one redirected to the old process's port, now closed, or, when it sent while no
/// agent ran, one not translated at all; either way its datagrams miss the new sockets until
/// the entry expires, which it never does while the client keeps sending (measured: a UDP flow
/// unanswered for 21 s after a restart).
pub fn redirected_elsewhere(state: &ProxyState, listeners: &[u16]) -> Vec<CtFilter> {
    let mut keep = listeners.to_vec();
    keep.sort();
    keep.dedup();
    let mut out: Vec<CtFilter> = state
        .iter()
        .map(|(_, p)| &*p.service)
        .filter(|svc| svc.protocol == Protocol::Udp)
        .flat_map(frontends)
        .map(|(ip, port)| CtFilter {
            protocol: Protocol::Udp,
            orig_dst: ip,
            orig_dport: Some(port),
            reply_src: None,
            reply_sport: None,
            dst_nat: false,
            keep_reply_srcs: Vec::new(),
            keep_reply_sports: keep.clone(),
        })
        .collect();
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
            keep_reply_srcs: Vec::new(),
            keep_reply_sports: Vec::new(),
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

    /// A UDP entry from a client at 10.244.9.9:40000 to `dst:dport`, answered by
    /// `reply_src:5353`.
    fn udp_entry(dst: &str, dport: u16, reply_src: &str, status: u32) -> CtEntry {
        CtEntry {
            protocol: 17,
            orig: Some(Flow {
                src: "10.244.9.9".parse().unwrap(),
                dst: dst.parse().unwrap(),
                sport: 40000,
                dport,
            }),
            reply: Some(Flow {
                src: reply_src.parse().unwrap(),
                dst: "10.244.9.9".parse().unwrap(),
                sport: 5353,
                dport: 40000,
            }),
            status,
            ..CtEntry::default()
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
        let entry = udp_entry;
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

    /// An agent's start makes every port "become reachable": the live flows its serving
    /// endpoints answer must survive it (a reply in flight would be lost), while cached rejects
    /// (answered by the Service address itself) and flows to a gone endpoint go.
    #[test]
    fn became_reachable_keeps_flows_answered_by_a_serving_endpoint() {
        let mut state = ProxyState::default();
        let terminating = Endpoint {
            serving: false,
            ..fixtures::endpoint([10, 244, 1, 6].into(), "")
        };
        state.set_port(svc(Protocol::Udp), vec![ep(), terminating]);
        let changes = ChangeSet {
            became_reachable: BTreeSet::from([spn(Protocol::Udp)]),
            ..Default::default()
        };
        let f = stale_filters(&state, &changes);
        let to_vip = f.iter().find(|f| f.orig_dst.is_some()).unwrap();
        let entry = |reply_src: &str, status: u32| udp_entry("10.96.0.10", 53, reply_src, status);
        assert!(
            !to_vip.matches(&entry("10.244.1.5", CtEntry::DST_NAT)),
            "live flow"
        );
        assert!(to_vip.matches(&entry("10.96.0.10", 0)), "cached reject");
        assert!(
            to_vip.matches(&entry("10.244.1.6", CtEntry::DST_NAT)),
            "towards an endpoint that is not serving"
        );
    }
}
