//! Compiles one service port into the map elements of the `ip kpr` table (pure, no I/O).
//!
//! Owns: [`compile`], the target-id allocator [`TargetIds`] and the representative sources used to
//! ask `selection::route` what each source class gets. A *target* is one endpoint set with its
//! empty verdict, algorithm and affinity; a service port has one target per distinct route
//! (usually one; two when externalTrafficPolicy Local splits external sources from the rest).
//! The backend never re-decides endpoints: it compiles the routes `selection` returns.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use crate::dataplane::ProxyState;
use crate::model::{Algorithm, Endpoint, Protocol, ServicePort, ServicePortName};
use crate::selection::{route, DestKind, EmptyVerdict, NodeContext, SelectedEndpoints, SourceKind};

use super::ruleset::{rr_count_set, CLASSES, RR_COUNTS};

/// One element of one set or map. Its strings are shared: the element table and the compiled
/// service port that programmed it hold the same ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub set: &'static str,
    pub key: Arc<str>,
    pub value: Option<Arc<str>>,
}

/// Round-robin counters per endpoint count. A `numgen inc` counter belongs to its rule, so all
/// targets that share an `rr_N_B` chain share one counter: a target sees successive endpoints
/// only while no other target of its chain takes connections in between. Spreading targets over
/// buckets (by id) keeps that sharing rare without one chain per Service, which is the layout
/// whose load time grows with the square of the chain count.
pub const RR_BUCKETS: u32 = 16;

/// A chain the elements jump to, created on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainNeed {
    /// `rr_N_B`: round-robin over N slots, counter bucket B (see [`RR_BUCKETS`]).
    RoundRobin(usize, u32),
    /// `aff_T` / `rec_T`: session affinity with a timeout of T seconds.
    Affinity(u64),
}

/// One endpoint set as the dataplane balances over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The conntrack mark that names this target.
    pub id: u32,
    pub endpoints: Vec<SocketAddrV4>,
    pub empty: EmptyVerdict,
    pub algorithm: Algorithm,
    pub affinity_secs: Option<u64>,
}

/// Everything one service port contributes to the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    pub elements: Vec<Element>,
    pub targets: Vec<Target>,
    pub chains: Vec<ChainNeed>,
}

/// Which route a target serves; with the endpoint content it identifies a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tag {
    Cluster(bool),
    External(bool),
}

/// Hands out conntrack-mark target ids, stable across syncs for an unchanged route.
///
/// Ids are never reused: affinity map entries are keyed by id, so a reused id could send a
/// client to another Service's endpoint. A target with affinity that loses an endpoint gets a
/// new id, which orphans its affinity entries (they expire) instead of pinning clients to an
/// endpoint that is gone.
#[derive(Debug, Clone)]
pub struct TargetIds {
    next: u32,
    /// Per service port, its routes' (tag, id, endpoints): one to four, so a Vec (an ordered map
    /// allocates a whole node for one entry).
    by_port: HashMap<ServicePortName, Vec<(Tag, u32, Vec<SocketAddrV4>)>>,
}

impl Default for TargetIds {
    fn default() -> Self {
        TargetIds {
            next: 1,
            by_port: HashMap::new(),
        }
    }
}

impl TargetIds {
    /// The id of route `tag` of `spn`: the previous one unless the route is new, or it has
    /// affinity and lost an endpoint.
    pub fn get(
        &mut self,
        spn: &ServicePortName,
        tag: Tag,
        endpoints: &[SocketAddrV4],
        affinity: bool,
    ) -> u32 {
        let routes = self.by_port.entry(spn.clone()).or_default();
        let at = routes.iter().position(|r| r.0 == tag);
        if let Some((_, id, old)) = at.map(|i| &mut routes[i]) {
            let lost_one = old.iter().any(|e| !endpoints.contains(e));
            if !(affinity && lost_one) {
                if old.as_slice() != endpoints {
                    *old = endpoints.to_vec();
                }
                return *id;
            }
        }
        let id = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        let route = (tag, id, endpoints.to_vec());
        match at {
            Some(i) => routes[i] = route,
            None => {
                routes.push(route);
                routes.shrink_to_fit();
            }
        }
        id
    }

    /// Forgets the ids of a service port's routes that are not in `keep`.
    pub fn retain(&mut self, spn: &ServicePortName, keep: &[Tag]) {
        if let Some(m) = self.by_port.get_mut(spn) {
            m.retain(|(tag, _, _)| keep.contains(tag));
            if m.is_empty() {
                self.by_port.remove(spn);
            }
        }
    }
}

/// One source address per class, to ask `route` what that class of source gets.
#[derive(Debug, Clone)]
pub struct Representatives(pub [Option<IpAddr>; 3]);

impl Representatives {
    /// Picks addresses that `NodeContext::source_kind` classifies as node, pod and external.
    pub fn new(ctx: &NodeContext) -> Representatives {
        let want = [SourceKind::Node, SourceKind::Pod, SourceKind::External];
        let mut candidates: Vec<IpAddr> = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        for net in &ctx.cluster_cidrs {
            if let ipnet::IpNet::V4(n) = net {
                candidates.extend(n.hosts().next().map(IpAddr::V4));
            }
        }
        candidates.extend(
            [
                "192.0.2.1",
                "198.51.100.1",
                "203.0.113.1",
                "100.64.0.1",
                "8.8.8.8",
            ]
            .iter()
            .filter_map(|s| s.parse::<IpAddr>().ok()),
        );
        let mut reps = [None; 3];
        for (i, kind) in want.iter().enumerate() {
            reps[i] = candidates
                .iter()
                .copied()
                .find(|c| ctx.source_kind(*c) == *kind);
        }
        Representatives(reps)
    }
}

/// A destination of the service port.
#[derive(Debug, Clone, Copy)]
enum Frontend {
    Ip(Ipv4Addr, DestKind),
    NodePort,
}

fn v4_endpoints(eps: &[Endpoint]) -> Vec<SocketAddrV4> {
    eps.iter()
        .filter_map(|e| match e.addr {
            IpAddr::V4(a) => Some(SocketAddrV4::new(a, e.port)),
            IpAddr::V6(_) => None,
        })
        .collect()
}

fn v4(addrs: &[IpAddr]) -> impl Iterator<Item = Ipv4Addr> + '_ {
    addrs.iter().filter_map(|a| match a {
        IpAddr::V4(a) => Some(*a),
        IpAddr::V6(_) => None,
    })
}

/// Whether the port has an IPv4 address to program (IPv6 is not implemented by this backend).
pub fn is_ipv4(svc: &ServicePort) -> bool {
    v4(&svc.cluster_ips).next().is_some()
        || v4(&svc.external_ips).next().is_some()
        || v4(&svc.load_balancer_ips).next().is_some()
}

/// Compiles one service port. `ids` keeps target ids stable across syncs.
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
    let mut b = Builder {
        svc,
        sel,
        ctx: &state.node,
        reps,
        ids,
        spn,
        out: Compiled::default(),
        targets: BTreeMap::new(),
    };
    let proto = svc.protocol;
    for ip in v4(&svc.cluster_ips) {
        b.element("cluster_ips", ip.to_string(), None);
        b.frontend(Frontend::Ip(ip, DestKind::ClusterIp), proto, svc.port);
    }
    for ip in v4(&svc.external_ips) {
        b.frontend(Frontend::Ip(ip, DestKind::ExternalIp), proto, svc.port);
    }
    for ip in v4(&svc.load_balancer_ips) {
        b.frontend(Frontend::Ip(ip, DestKind::LoadBalancer), proto, svc.port);
        b.firewall(ip, proto, svc.port);
    }
    if svc.node_port != 0 && is_ipv4(svc) {
        b.frontend(Frontend::NodePort, proto, svc.node_port);
    }
    b.finish()
}

struct Builder<'a> {
    svc: &'a ServicePort,
    sel: &'a SelectedEndpoints,
    ctx: &'a NodeContext,
    reps: &'a Representatives,
    ids: &'a mut TargetIds,
    spn: &'a ServicePortName,
    out: Compiled,
    targets: BTreeMap<Tag, Target>,
}

impl Builder<'_> {
    fn element(&mut self, set: &'static str, key: String, value: Option<String>) {
        self.out.elements.push(Element {
            set,
            key: key.into(),
            value: value.map(Into::into),
        });
    }

    /// The target id a source class gets for a destination, and whether it is masqueraded.
    fn route_for(&mut self, class: usize, dest: DestKind) -> Option<(u32, bool)> {
        let src = self.reps.0[class]?;
        let r = route(self.svc, self.sel, self.ctx, src, dest);
        let local = r.empty == EmptyVerdict::Drop;
        let tag = if r.endpoints == &*self.sel.cluster {
            Tag::Cluster(local)
        } else {
            Tag::External(local)
        };
        if let Some(t) = self.targets.get(&tag) {
            return Some((t.id, r.masquerade));
        }
        let endpoints = v4_endpoints(r.endpoints);
        let affinity_secs = self.svc.affinity.map(|d| d.as_secs().max(1));
        let id = self
            .ids
            .get(self.spn, tag, &endpoints, affinity_secs.is_some());
        self.targets.insert(
            tag,
            Target {
                id,
                endpoints,
                empty: r.empty,
                algorithm: self.svc.algorithm,
                affinity_secs,
            },
        );
        Some((id, r.masquerade))
    }

    fn frontend(&mut self, fe: Frontend, proto: Protocol, port: u16) {
        let (dest, key, prefix) = match fe {
            Frontend::Ip(ip, dest) => (dest, format!("{ip} . {} . {port}", proto.lower()), "fe"),
            Frontend::NodePort => (
                DestKind::NodePort,
                format!("{} . {port}", proto.lower()),
                "np",
            ),
        };
        let routes: Vec<(usize, u32, bool)> = (0..CLASSES.len())
            .filter_map(|c| self.route_for(c, dest).map(|(id, m)| (c, id, m)))
            .collect();
        // The common map holds the pod class's target (or the first class that exists); the
        // per-class maps hold only the classes that differ from it.
        let Some(&(_, common, _)) = routes.iter().find(|r| r.0 == 1).or(routes.first()) else {
            return;
        };
        self.element(prefix, key.clone(), Some(common.to_string()));
        for &(class, id, masq) in &routes {
            if id != common {
                self.element(
                    override_map(prefix, class),
                    key.clone(),
                    Some(id.to_string()),
                );
            }
            // clusterIP masquerade is node-wide per class and lives in the base rules.
            if masq && dest != DestKind::ClusterIp {
                self.element(masq_set(prefix, class), key.clone(), None);
            }
        }
    }

    fn firewall(&mut self, ip: Ipv4Addr, proto: Protocol, port: u16) {
        let ranges: Vec<String> = self
            .svc
            .source_ranges
            .iter()
            .filter_map(|n| match n {
                ipnet::IpNet::V4(n) => Some(n.trunc().to_string()),
                ipnet::IpNet::V6(_) => None,
            })
            .collect();
        if self.svc.source_ranges.is_empty() {
            return;
        }
        let key = format!("{ip} . {} . {port}", proto.lower());
        self.element("fw_protected", key.clone(), None);
        self.element("fw_allowed", format!("{key} . {ip}"), None);
        for r in ranges {
            self.element("fw_allowed", format!("{key} . {r}"), None);
        }
    }

    fn finish(mut self) -> Compiled {
        let tags: Vec<Tag> = self.targets.keys().copied().collect();
        self.ids.retain(self.spn, &tags);
        let targets: Vec<Target> = std::mem::take(&mut self.targets).into_values().collect();
        for t in &targets {
            self.target_elements(t);
        }
        self.out.targets = targets;
        self.out.chains.sort();
        self.out.chains.dedup();
        self.out.elements.sort();
        self.out.elements.dedup();
        // Kept until the service port changes again: no spare capacity.
        self.out.elements.shrink_to_fit();
        self.out.chains.shrink_to_fit();
        self.out
    }

    /// The slots of a round-robin target and how it is dispatched: by its `rr_nN` set (no
    /// verdict element, see `RR_COUNTS`) or, above `RR_COUNTS` endpoints, by the returned
    /// `targets` verdict.
    fn round_robin_elements(&mut self, t: &Target) -> Option<String> {
        let (id, n) = (t.id, t.endpoints.len());
        let bucket = id % RR_BUCKETS;
        for (slot, ep) in t.endpoints.iter().enumerate() {
            self.element(
                super::ruleset::slots_map(self.svc.protocol.lower(), bucket),
                format!("{id} . {slot}"),
                Some(format!("{} . {}", ep.ip(), ep.port())),
            );
        }
        if n <= RR_COUNTS {
            self.element(rr_count_set(n), id.to_string(), None);
            return None;
        }
        self.out.chains.push(ChainNeed::RoundRobin(n, bucket));
        Some(format!("goto rr_{n}_{bucket}"))
    }

    fn target_elements(&mut self, t: &Target) {
        let id = t.id;
        let verdict = if t.endpoints.is_empty() {
            Some(match t.empty {
                EmptyVerdict::Reject => "goto empty_reject".to_string(),
                EmptyVerdict::Drop => "goto empty_drop".to_string(),
            })
        } else if t.algorithm == Algorithm::LeastConn {
            Some("goto lc".to_string())
        } else {
            self.round_robin_elements(t)
        };
        if let Some(verdict) = verdict {
            self.element("targets", id.to_string(), Some(verdict));
        }
        for ep in &t.endpoints {
            self.element("hairpin", format!("{0} . {0}", ep.ip()), None);
        }
        if let (Some(secs), false) = (t.affinity_secs, t.endpoints.is_empty()) {
            self.out.chains.push(ChainNeed::Affinity(secs));
            self.element(
                "aff_lookup",
                id.to_string(),
                Some(format!("jump {}", super::ruleset::affinity_name(secs))),
            );
            self.element(
                "aff_record",
                id.to_string(),
                Some(format!(
                    "jump {}",
                    super::ruleset::affinity_record_name(secs)
                )),
            );
        }
    }
}

fn override_map(prefix: &str, class: usize) -> &'static str {
    match (prefix, class) {
        ("fe", 0) => "fe_node",
        ("fe", 1) => "fe_pod",
        ("fe", _) => "fe_ext",
        (_, 0) => "np_node",
        (_, 1) => "np_pod",
        _ => "np_ext",
    }
}

fn masq_set(prefix: &str, class: usize) -> &'static str {
    match (prefix, class) {
        ("fe", 0) => "masq_node",
        ("fe", 1) => "masq_pod",
        ("fe", _) => "masq_ext",
        (_, 0) => "npmasq_node",
        (_, 1) => "npmasq_pod",
        _ => "npmasq_ext",
    }
}

/// Whether traffic from each class (node, pod, ext) to a clusterIP is masqueraded.
///
/// `route` decides clusterIP masquerade from the node context and source class only, so it is
/// compiled once into the base rules instead of once per Service.
pub fn clusterip_masq(ctx: &NodeContext, reps: &Representatives) -> [bool; 3] {
    let svc = ServicePort {
        name: ServicePortName {
            namespace: "".into(),
            name: "".into(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
        },
        cluster_ips: Vec::new(),
        port: 1,
        protocol: Protocol::Tcp,
        node_port: 0,
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        source_ranges: Vec::new(),
        affinity: None,
        external_local: false,
        internal_local: false,
        health_check_node_port: 0,
        algorithm: Algorithm::RoundRobin,
    };
    let sel = SelectedEndpoints::default();
    let mut out = [false; 3];
    for (i, o) in out.iter_mut().enumerate() {
        if let Some(src) = reps.0[i] {
            *o = route(&svc, &sel, ctx, src, DestKind::ClusterIp).masquerade;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures;
    use crate::selection::select;

    fn spn(name: &str) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
        }
    }

    fn svc(name: &str) -> ServicePort {
        ServicePort {
            name: spn(name),
            ..fixtures::service_port(name, "10.96.0.10")
        }
    }

    fn ep(last: u8, node: &str) -> Endpoint {
        fixtures::endpoint(Ipv4Addr::new(10, 244, last, 2), node)
    }

    fn state(svc: ServicePort, eps: Vec<Endpoint>) -> ProxyState {
        let mut s = ProxyState::default();
        s.node.node_name = "me".into();
        s.node.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
        s.node.node_ips = vec!["192.0.2.1".parse().unwrap()];
        let n = svc.name.clone();
        s.selected.insert(n.clone(), select(&svc, &eps, "me"));
        s.endpoints.insert(n.clone(), eps.into());
        s.services.insert(n, svc.into());
        s
    }

    fn sets(c: &Compiled) -> Vec<(&'static str, String, Option<String>)> {
        c.elements
            .iter()
            .map(|e| {
                (
                    e.set,
                    e.key.to_string(),
                    e.value.as_deref().map(str::to_string),
                )
            })
            .collect()
    }

    #[test]
    fn cluster_ip_compiles_to_one_target_with_slots_and_no_per_service_masquerade() {
        let st = state(svc("a"), vec![ep(1, "me"), ep(2, "other")]);
        let reps = Representatives::new(&st.node);
        let c = compile(&st, &spn("a"), &reps, &mut TargetIds::default());
        assert_eq!(c.targets.len(), 1);
        let id = c.targets[0].id;
        let e = sets(&c);
        assert!(e.contains(&("fe", "10.96.0.10 . tcp . 80".into(), Some(id.to_string()))));
        assert!(e.contains(&(
            super::super::ruleset::slots_map("tcp", id % RR_BUCKETS),
            format!("{id} . 1"),
            Some("10.244.2.2 . 8080".into())
        )));
        assert!(e.contains(&("rr_n2", id.to_string(), None)));
        assert!(
            !e.iter().any(|(s, _, _)| *s == "targets"),
            "a round-robin target with few endpoints has no verdict element"
        );
        assert!(!e
            .iter()
            .any(|(s, _, _)| s.starts_with("masq_") || s.starts_with("fe_")));
    }

    #[test]
    fn an_endpoint_count_change_moves_the_target_between_count_sets_only() {
        let eps: Vec<Endpoint> = (1..=3).map(|n| ep(n, "me")).collect();
        let mut ids = TargetIds::default();
        let compiled = |eps: &[Endpoint], ids: &mut TargetIds| {
            let st = state(svc("a"), eps.to_vec());
            let reps = Representatives::new(&st.node);
            compile(&st, &spn("a"), &reps, ids)
        };
        let three = compiled(&eps, &mut ids);
        let two = compiled(&eps[..2], &mut ids);
        assert_eq!(three.targets[0].id, two.targets[0].id);
        let changed: Vec<&Element> = three
            .elements
            .iter()
            .filter(|e| !two.elements.contains(e))
            .chain(two.elements.iter().filter(|e| !three.elements.contains(e)))
            .collect();
        let verdict_maps = ["targets", "aff_lookup", "aff_record"];
        assert!(
            !changed.iter().any(|e| verdict_maps.contains(&e.set)),
            "no verdict element changes: {changed:?}"
        );
        assert!(
            changed.iter().any(|e| e.set == "rr_n3") && changed.iter().any(|e| e.set == "rr_n2")
        );
        assert!(three.chains.is_empty() && two.chains.is_empty());
    }

    #[test]
    fn many_endpoints_get_a_chain_of_their_own_count() {
        let eps: Vec<Endpoint> = (1..=(RR_COUNTS as u8 + 1)).map(|n| ep(n, "me")).collect();
        let st = state(svc("a"), eps);
        let reps = Representatives::new(&st.node);
        let c = compile(&st, &spn("a"), &reps, &mut TargetIds::default());
        let id = c.targets[0].id;
        let n = RR_COUNTS + 1;
        assert_eq!(c.chains, vec![ChainNeed::RoundRobin(n, id % RR_BUCKETS)]);
        assert!(sets(&c).contains(&(
            "targets",
            id.to_string(),
            Some(format!("goto rr_{n}_{}", id % RR_BUCKETS))
        )));
    }

    #[test]
    fn external_local_splits_external_sources_and_keeps_their_address() {
        let mut s = svc("b");
        s.node_port = 30080;
        s.external_local = true;
        let st = state(s, vec![ep(1, "me"), ep(2, "other")]);
        let reps = Representatives::new(&st.node);
        let c = compile(&st, &spn("b"), &reps, &mut TargetIds::default());
        assert_eq!(c.targets.len(), 2, "cluster and external routes");
        let local = c.targets.iter().find(|t| t.endpoints.len() == 1).unwrap();
        let e = sets(&c);
        // External sources get the local endpoint only; pods and the node are short-circuited.
        assert!(e.contains(&("np_ext", "tcp . 30080".into(), Some(local.id.to_string()))));
        assert!(
            !e.iter().any(|(s, _, _)| *s == "npmasq_ext"),
            "eTP Local keeps the client address"
        );
        assert!(
            e.iter()
                .any(|(s, k, _)| *s == "npmasq_node" && k == "tcp . 30080"),
            "node sources are masqueraded"
        );
    }

    #[test]
    fn no_endpoints_rejects_and_local_policy_elsewhere_drops() {
        let st = state(svc("c"), vec![]);
        let reps = Representatives::new(&st.node);
        let c = compile(&st, &spn("c"), &reps, &mut TargetIds::default());
        assert_eq!(c.targets[0].empty, EmptyVerdict::Reject);
        assert!(sets(&c)
            .iter()
            .any(|(_, _, v)| v.as_deref() == Some("goto empty_reject")));

        let mut s = svc("d");
        s.internal_local = true;
        let st = state(s, vec![ep(2, "other")]);
        let c = compile(&st, &spn("d"), &reps, &mut TargetIds::default());
        assert!(sets(&c)
            .iter()
            .any(|(_, _, v)| v.as_deref() == Some("goto empty_drop")));
    }

    #[test]
    fn source_ranges_protect_the_load_balancer_ip() {
        let mut s = svc("e");
        s.load_balancer_ips = vec!["203.0.113.10".parse().unwrap()];
        s.source_ranges = vec!["198.51.100.0/24".parse().unwrap()];
        let st = state(s, vec![ep(1, "me")]);
        let reps = Representatives::new(&st.node);
        let e = sets(&compile(&st, &spn("e"), &reps, &mut TargetIds::default()));
        let key = "203.0.113.10 . tcp . 80";
        assert!(e.contains(&("fw_protected", key.into(), None)));
        assert!(e.contains(&("fw_allowed", format!("{key} . 198.51.100.0/24"), None)));
        assert!(e.contains(&("fw_allowed", format!("{key} . 203.0.113.10"), None)));
    }

    #[test]
    fn affinity_target_gets_a_new_id_only_when_it_loses_an_endpoint() {
        let mut s = svc("f");
        s.affinity = Some(std::time::Duration::from_secs(30));
        let mut ids = TargetIds::default();
        let id = |eps: Vec<Endpoint>, ids: &mut TargetIds| {
            let st = state(s.clone(), eps);
            let reps = Representatives::new(&st.node);
            compile(&st, &spn("f"), &reps, ids).targets[0].id
        };
        let a = id(vec![ep(1, "me")], &mut ids);
        let b = id(vec![ep(1, "me"), ep(2, "me")], &mut ids);
        assert_eq!(a, b, "an added endpoint keeps existing clients' affinity");
        let c = id(vec![ep(2, "me")], &mut ids);
        assert_ne!(b, c, "a removed endpoint orphans the affinity entries");
    }
}
