//! Endpoint selection: the one place that decides which endpoints a connection may use.
//!
//! Implements "Choosing endpoints" and the masquerade rules of docs/SERVICE-SEMANTICS.md. Every
//! backend compiles the output of [`select`] and asks [`route`] per connection where it decides at
//! connect time, or [`route_for`] per class of source where it programs rules for each class; no
//! backend re-decides which endpoint is usable.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::maglev::{MaglevTable, MaglevTables, TableSize};
use crate::model::{Algorithm, Endpoint, IpFamily, Name, ServicePort};

/// What the node knows about itself, needed to classify sources and endpoints.
#[derive(Debug, Clone, Default)]
pub struct NodeContext {
    /// `--hostname-override` (or the host name): endpoints whose `nodeName` equals it are local.
    pub node_name: String,
    /// `--cluster-cidr`: sources inside are pod sources.
    pub cluster_cidrs: Vec<IpNet>,
    /// The node's own addresses: sources equal to one are node sources.
    pub node_ips: Vec<IpAddr>,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// The node's `topology.kubernetes.io/zone` label, for endpoints hinted by zone.
    pub zone: Option<String>,
    /// `--maglev-table-size`: the slots of every Maglev table (Services balanced with maglev).
    pub maglev_table_size: TableSize,
}

impl NodeContext {
    /// Classifies a source address as pod, node or external.
    pub fn source_kind(&self, src: IpAddr) -> SourceKind {
        if self.node_ips.contains(&src) || src.is_loopback() {
            SourceKind::Node
        } else if self.cluster_cidrs.iter().any(|c| c.contains(&src)) {
            SourceKind::Pod
        } else {
            SourceKind::External
        }
    }

    /// The source classes this node tells apart: node and external always, pod sources only when
    /// `--cluster-cidr` names the pod network.
    pub fn source_kinds(&self) -> impl Iterator<Item = SourceKind> + '_ {
        [SourceKind::Node, SourceKind::Pod, SourceKind::External]
            .into_iter()
            .filter(|k| *k != SourceKind::Pod || !self.cluster_cidrs.is_empty())
    }
}

/// Where a connection comes from (docs/SERVICE-SEMANTICS.md vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    Pod,
    Node,
    External,
}

/// Which kind of Service address a connection was made to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DestKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl DestKind {
    /// nodePort, externalIP and LoadBalancer IP are "external" destinations.
    pub fn is_external(self) -> bool {
        !matches!(self, DestKind::ClusterIp)
    }
}

/// What happens to a new connection when its endpoint set is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmptyVerdict {
    /// No usable endpoint anywhere: actively refuse (TCP reset / ICMP unreachable).
    Reject,
    /// A Local policy with usable endpoints on other nodes only: silently drop.
    Drop,
}

/// The endpoints of one Service port, split by the traffic that may use them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectedEndpoints {
    /// For cluster traffic (clusterIP, and external destinations reached from pod or node sources
    /// when the short-circuit applies). Honours internalTrafficPolicy.
    /// Shared with `external` (and with the tracker's list of all endpoints) when equal, which is
    /// the common case: a Service port's endpoints are kept once, not once per kind of traffic.
    pub cluster: Arc<[Endpoint]>,
    /// For external traffic from external sources. Honours externalTrafficPolicy.
    pub external: Arc<[Endpoint]>,
    /// Ready endpoints on this node per family (IPv4, IPv6): the healthCheckNodePort answer,
    /// which each family gives for its own endpoints as kube-proxy's per-family servers do.
    pub local_ready: [u32; 2],
    /// Whether any endpoint anywhere is usable (ready, or serving and terminating).
    pub any_usable: bool,
    /// A Maglev Service port's lookup tables (cluster and external set, per family), built once
    /// here for every backend (see [`with_maglev`]). Not part of `/state`: `proxy inspect`
    /// shows their slot counts instead.
    #[serde(skip)]
    pub maglev: Option<Arc<MaglevTables>>,
}

impl SelectedEndpoints {
    /// The Maglev table of `endpoints` (one of this selection's sets, as a [`Route`] names it)
    /// in `family`; `None` unless the Service port is balanced with Maglev.
    pub fn maglev_table(
        &self,
        endpoints: &[Endpoint],
        family: IpFamily,
    ) -> Option<&Arc<MaglevTable>> {
        let tables = self.maglev.as_deref()?;
        let set = if std::ptr::eq(endpoints, &*self.cluster) || endpoints == &*self.cluster {
            &tables.cluster
        } else {
            &tables.external
        };
        Some(set.of(family))
    }

    /// The verdict for an empty endpoint set under a policy that is Local or not.
    pub fn empty_verdict(&self, local_policy: bool) -> EmptyVerdict {
        if local_policy && self.any_usable {
            EmptyVerdict::Drop
        } else {
            EmptyVerdict::Reject
        }
    }
}

/// Ready endpoints if there are any; otherwise those that are serving and terminating.
pub fn usable(endpoints: &[Endpoint]) -> Vec<Endpoint> {
    let ready: Vec<Endpoint> = endpoints.iter().filter(|e| e.ready).cloned().collect();
    if !ready.is_empty() {
        return ready;
    }
    endpoints
        .iter()
        .filter(|e| e.serving && e.terminating)
        .cloned()
        .collect()
}

/// Splits a Service port's endpoints into the sets each kind of traffic may use, without
/// topology (see [`select_in`]).
pub fn select(svc: &ServicePort, endpoints: &[Endpoint], node_name: &str) -> SelectedEndpoints {
    select_in(svc, endpoints, node_name, None)
}

/// How topology hints narrow the cluster endpoints on this node, as kube-proxy decides it from
/// the hints alone (the EndpointSlice controller writes them only for Services that ask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    SameNode,
    SameZone,
}

impl Topology {
    /// The hints of this kind an endpoint carries.
    fn hints(self, e: &Endpoint) -> &[Name] {
        match self {
            Topology::SameNode => e.node_hints(),
            Topology::SameZone => e.zone_hints(),
        }
    }
}

/// Hints are used only when every ready endpoint has one of the kind and at least one is for
/// here (this node, else this node's zone); otherwise all of them are ignored. Returns the mode
/// and the name (node or zone) endpoints must be hinted for.
fn topology<'a>(
    endpoints: &[Endpoint],
    node_name: &'a str,
    zone: Option<&'a str>,
) -> Option<(Topology, &'a str)> {
    let ready = || endpoints.iter().filter(|e| e.ready);
    ready().next()?;
    let candidates = [
        (Topology::SameNode, Some(node_name)),
        (Topology::SameZone, zone),
    ];
    candidates.into_iter().find_map(|(t, here)| {
        let here = here?;
        (ready().all(|e| !t.hints(e).is_empty()) && ready().any(|e| hinted_for(t.hints(e), here)))
            .then_some((t, here))
    })
}

fn hinted_for(hints: &[Name], here: &str) -> bool {
    hints.iter().any(|h| &**h == here)
}

/// Splits a Service port's endpoints into the sets each kind of traffic may use, on the node
/// `node_name` in `zone`. Topology hints narrow the cluster endpoints (those cluster traffic and
/// eTP Cluster external traffic use); Local traffic policies use local endpoints whatever the
/// hints say.
pub fn select_in(
    svc: &ServicePort,
    endpoints: &[Endpoint],
    node_name: &str,
    zone: Option<&str>,
) -> SelectedEndpoints {
    let usable_anywhere: Arc<[Endpoint]> = usable(endpoints).into();
    let all: Arc<[Endpoint]> = match topology(endpoints, node_name, zone) {
        None => usable_anywhere.clone(),
        Some((t, here)) => endpoints
            .iter()
            .filter(|e| e.ready && hinted_for(t.hints(e), here))
            .cloned()
            .collect(),
    };
    let local_eps: Vec<Endpoint> = endpoints
        .iter()
        .filter(|e| e.is_local(node_name))
        .cloned()
        .collect();
    let local: Arc<[Endpoint]> = usable(&local_eps).into();
    let cluster = if svc.internal_local {
        local.clone()
    } else {
        all.clone()
    };
    let external = if svc.external_local { local } else { all };
    SelectedEndpoints {
        cluster,
        external,
        local_ready: [false, true].map(|v6| {
            local_eps
                .iter()
                .filter(|e| e.ready && e.addr.is_ipv6() == v6)
                .count() as u32
        }),
        any_usable: !usable_anywhere.is_empty(),
        maglev: None,
    }
}

/// Adds the Maglev tables of a Maglev Service port's sets (built once per change of the port,
/// for every backend), of `size` slots; other algorithms keep none.
pub fn with_maglev(
    svc: &ServicePort,
    mut sel: SelectedEndpoints,
    size: TableSize,
) -> SelectedEndpoints {
    sel.maglev = (svc.algorithm == Algorithm::Maglev)
        .then(|| Arc::new(MaglevTables::new(&sel.cluster, &sel.external, size)));
    sel
}

/// The decision for one new connection: which endpoints, what to do if none, whether to SNAT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route<'a> {
    pub endpoints: &'a [Endpoint],
    pub empty: EmptyVerdict,
    pub masquerade: bool,
}

/// Decides the endpoint set and masquerade for a connection from `src` to a `dest` of `svc`.
///
/// docs/SERVICE-SEMANTICS.md: external destinations under eTP Local serve external sources from
/// local endpoints only and keep the client address; pod and node sources are short-circuited to
/// the cluster endpoints. Traffic to external destinations under eTP Cluster and node-originated
/// traffic to external destinations are masqueraded, as is traffic from outside the cluster CIDR to
/// a clusterIP when `--cluster-cidr` is known (kube-proxy's rule); hairpin is decided per endpoint
/// by [`is_hairpin`].
pub fn route<'a>(
    svc: &ServicePort,
    sel: &'a SelectedEndpoints,
    ctx: &NodeContext,
    src: IpAddr,
    dest: DestKind,
) -> Route<'a> {
    route_for(svc, sel, ctx, ctx.source_kind(src), dest)
}

/// [`route`] for a whole class of sources: what the rule backends program per class, without a
/// source address to classify.
pub fn route_for<'a>(
    svc: &ServicePort,
    sel: &'a SelectedEndpoints,
    ctx: &NodeContext,
    source: SourceKind,
    dest: DestKind,
) -> Route<'a> {
    let (endpoints, local_policy) = if !dest.is_external() {
        (&sel.cluster, svc.internal_local)
    } else if svc.external_local && source == SourceKind::External {
        (&sel.external, true)
    } else if svc.external_local {
        (&sel.cluster, svc.internal_local)
    } else {
        (&sel.external, false)
    };
    let masquerade = if dest.is_external() {
        ctx.masquerade_all || !svc.external_local || source == SourceKind::Node
    } else {
        cluster_ip_masquerade(ctx, source)
    };
    Route {
        endpoints,
        empty: sel.empty_verdict(local_policy),
        masquerade,
    }
}

/// Whether a connection from `source` to a clusterIP is masqueraded. It depends on the node and
/// the source class only, never on the Service, so a rule backend can decide it once for all.
pub fn cluster_ip_masquerade(ctx: &NodeContext, source: SourceKind) -> bool {
    ctx.masquerade_all || (source == SourceKind::External && !ctx.cluster_cidrs.is_empty())
}

/// An endpoint reaching itself through its own Service must be masqueraded.
pub fn is_hairpin(src: IpAddr, endpoint: &Endpoint) -> bool {
    src == endpoint.addr
}

#[cfg(test)]
mod tests;
