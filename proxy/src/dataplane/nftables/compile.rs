//! Compiles one service port into the map elements of the `ip kpr` and `ip6 kpr` tables (pure,
//! no I/O).
//!
//! Owns: [`compile`], the elements one service port contributes (its frontends' elements, and
//! its targets, from which [`Compiled::each_target_element`] derives theirs). A *target* is one endpoint set
//! of one family with its empty verdict, algorithm and affinity; a service port has one target
//! per distinct route and family (usually one; two when externalTrafficPolicy Local splits
//! external sources from the rest, twice that for a dual-stack Service). Each family's addresses
//! of the port go to that family's table and translate to that family's endpoints only. The
//! routes per source class and the target ids come from `dataplane::rules`; the backend never
//! re-decides endpoints.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use crate::dataplane::rules::{
    class_index, class_routes, family_addrs, family_endpoints, ClassRoute, Tag, TargetIds,
};
use crate::model::{Algorithm, IpFamily, Protocol, ServicePort, ServicePortName};
use crate::selection::{
    cluster_ip_masquerade, DestKind, EmptyVerdict, NodeContext, SelectedEndpoints,
};
use crate::state::ProxyState;

use super::elements::{Element, Key, Value, Verdict};
use super::ruleset::{maglev_map, rr_count_set, slots_map, RR_COUNTS};
use crate::maglev::MaglevTable;
use std::sync::Arc;

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
    RoundRobin(IpFamily, usize, u32),
    /// `aff_T` / `rec_T`: session affinity with a timeout of T seconds.
    Affinity(IpFamily, u64),
}

/// One endpoint set as the dataplane balances over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The conntrack mark that names this target.
    pub id: u32,
    pub family: IpFamily,
    pub endpoints: Vec<SocketAddr>,
    pub empty: EmptyVerdict,
    pub algorithm: Algorithm,
    pub affinity_secs: Option<u64>,
    /// A Maglev target's table (from the selection), whose slots are its `maglev_*` elements.
    pub maglev: Option<Arc<MaglevTable>>,
}

/// Everything one service port contributes to the table.
///
/// Only the elements of its frontends are stored; those its targets imply (slots, round-robin
/// sets, verdicts, hairpin keys: four in five of all elements at 4 endpoints per Service) are
/// derived from `targets` when a diff or a full load needs them ([`Compiled::each_target_element`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    /// The elements of the port's addresses and ports (clusterIP, frontends, node ports,
    /// masquerade and firewall sets): keys another service port may claim too.
    pub frontends: Vec<Element>,
    pub targets: Vec<Target>,
    pub chains: Vec<ChainNeed>,
    /// The service port's protocol (the slot maps are per protocol).
    pub protocol: Protocol,
}

/// Whether an element's key may be claimed by other service ports too (so it is programmed
/// through the element table) or names one of this port's targets alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    Shared,
    Owned,
}

impl Compiled {
    /// Calls `f` with every element the targets imply.
    pub fn each_target_element(&self, mut f: impl FnMut(Element, Sharing)) {
        for t in &self.targets {
            target_elements(t, self.protocol, &mut f);
        }
    }

    /// The elements the targets imply, split into shared keys (deduplicated: two targets of one
    /// port often share endpoints) and owned ones.
    pub fn target_elements(&self) -> (Vec<Element>, Vec<Element>) {
        let (mut shared, mut owned) = (Vec::new(), Vec::new());
        self.each_target_element(|e, sharing| match sharing {
            Sharing::Shared => shared.push(e),
            Sharing::Owned => owned.push(e),
        });
        shared.sort();
        shared.dedup();
        (shared, owned)
    }
}

/// The elements one target implies: its slots and round-robin set (or its verdict), its
/// endpoints' hairpin keys and its affinity verdicts.
fn target_elements(t: &Target, protocol: Protocol, f: &mut impl FnMut(Element, Sharing)) {
    let el = |set, key, value| Element {
        family: t.family,
        set,
        key,
        value,
    };
    let (id, n) = (t.id, t.endpoints.len());
    let verdict = if n == 0 {
        Some(match t.empty {
            EmptyVerdict::Reject => Verdict::EmptyReject,
            EmptyVerdict::Drop => Verdict::EmptyDrop,
        })
    } else if t.algorithm == Algorithm::LeastConn {
        Some(Verdict::LeastConn)
    } else if let Some(table) = t.maglev.as_deref().filter(|t| !t.is_empty()) {
        // The whole table, slot by slot: a change of the endpoints rewrites only the slots that
        // moved (the element diff), about 1/N of them per endpoint.
        let map = maglev_map(protocol.lower());
        for (slot, ep) in (0u32..).zip(table.slots()) {
            let value = Value::Endpoint(ep.ip(), ep.port());
            f(el(map, Key::Slot(id, slot), Some(value)), Sharing::Owned);
        }
        Some(Verdict::Maglev)
    } else {
        // The slots of a round-robin target, dispatched by its `rr_nN` set (no verdict
        // element, see `RR_COUNTS`) or, above `RR_COUNTS` endpoints, by a `targets` verdict.
        let bucket = id % RR_BUCKETS;
        let slots = slots_map(protocol.lower(), bucket);
        for (slot, ep) in (0u32..).zip(&t.endpoints) {
            let value = Value::Endpoint(ep.ip(), ep.port());
            f(el(slots, Key::Slot(id, slot), Some(value)), Sharing::Owned);
        }
        if n <= RR_COUNTS {
            f(el(rr_count_set(n), Key::Target(id), None), Sharing::Owned);
            None
        } else {
            Some(Verdict::RoundRobin(n as u32, bucket))
        }
    };
    if let Some(v) = verdict {
        let value = Some(Value::Verdict(v));
        f(el("targets", Key::Target(id), value), Sharing::Owned);
    }
    for ep in &t.endpoints {
        f(el("hairpin", Key::Hairpin(ep.ip()), None), Sharing::Shared);
    }
    if let (Some(secs), true) = (t.affinity_secs, n > 0) {
        let lookup = Some(Value::Verdict(Verdict::AffinityLookup(secs)));
        f(el("aff_lookup", Key::Target(id), lookup), Sharing::Owned);
        let record = Some(Value::Verdict(Verdict::AffinityRecord(secs)));
        f(el("aff_record", Key::Target(id), record), Sharing::Owned);
    }
}

/// A destination of the service port.
#[derive(Debug, Clone, Copy)]
enum Frontend {
    Ip(IpAddr, DestKind),
    NodePort,
}

/// Compiles one service port for `families`. `ids` keeps target ids stable across syncs.
pub fn compile(
    state: &ProxyState,
    spn: &ServicePortName,
    ids: &mut TargetIds,
    families: &[IpFamily],
) -> Compiled {
    let Some(port) = state.get(spn) else {
        ids.retain(spn, &[]);
        return Compiled::default();
    };
    let (svc, sel) = (&*port.service, &port.selected);
    let mut b = Builder {
        svc,
        sel,
        ctx: &state.node,
        ids,
        spn,
        family: IpFamily::V4,
        out: Compiled {
            protocol: svc.protocol,
            ..Compiled::default()
        },
        targets: BTreeMap::new(),
    };
    let proto = svc.protocol;
    for &family in families {
        b.family = family;
        for ip in family_addrs(&svc.cluster_ips, family) {
            b.element("cluster_ips", Key::Addr(ip), None);
            b.frontend(Frontend::Ip(ip, DestKind::ClusterIp), proto, svc.port);
        }
        for ip in family_addrs(&svc.external_ips, family) {
            b.frontend(Frontend::Ip(ip, DestKind::ExternalIp), proto, svc.port);
        }
        for ip in family_addrs(&svc.load_balancer_ips, family) {
            b.frontend(Frontend::Ip(ip, DestKind::LoadBalancer), proto, svc.port);
            b.firewall(ip, proto, svc.port);
        }
        // The nodePort serves the families the Service has addresses of.
        if svc.node_port != 0 && svc.has_family(family) {
            b.frontend(Frontend::NodePort, proto, svc.node_port);
        }
    }
    b.finish()
}

struct Builder<'a> {
    svc: &'a ServicePort,
    sel: &'a SelectedEndpoints,
    ctx: &'a NodeContext,
    ids: &'a mut TargetIds,
    spn: &'a ServicePortName,
    /// The family being compiled: its elements go to its table.
    family: IpFamily,
    out: Compiled,
    targets: BTreeMap<(Tag, IpFamily), Target>,
}

impl Builder<'_> {
    fn element(&mut self, set: &'static str, key: Key, value: Option<Value>) {
        self.out.frontends.push(Element {
            family: self.family,
            set,
            key,
            value,
        });
    }

    /// The id of the target a route names, created on first use.
    fn target_of(&mut self, r: &ClassRoute<'_>) -> u32 {
        let key = (r.tag, self.family);
        if let Some(t) = self.targets.get(&key) {
            return t.id;
        }
        let endpoints = family_endpoints(r.endpoints, self.family);
        let affinity_secs = self.svc.affinity.map(|d| d.as_secs().max(1));
        let id = self
            .ids
            .get(self.spn, key, &endpoints, affinity_secs.is_some());
        self.targets.insert(
            key,
            Target {
                id,
                family: self.family,
                endpoints,
                empty: r.empty,
                algorithm: self.svc.algorithm,
                affinity_secs,
                maglev: self.sel.maglev_table(r.endpoints, self.family).cloned(),
            },
        );
        id
    }

    fn frontend(&mut self, fe: Frontend, proto: Protocol, port: u16) {
        let (dest, key, prefix) = match fe {
            Frontend::Ip(ip, dest) => (dest, Key::AddrPort(ip, proto, port), "fe"),
            Frontend::NodePort => (DestKind::NodePort, Key::ProtoPort(proto, port), "np"),
        };
        let (svc, sel, ctx) = (self.svc, self.sel, self.ctx);
        let routes: Vec<(usize, u32, bool)> = class_routes(svc, sel, ctx, dest)
            .iter()
            .map(|r| (r.class, self.target_of(r), r.masquerade))
            .collect();
        // The common map holds the pod class's target (or the first class that exists); the
        // per-class maps hold only the classes that differ from it.
        let Some(&(_, common, _)) = routes.iter().find(|r| r.0 == 1).or(routes.first()) else {
            return;
        };
        self.element(prefix, key.clone(), Some(Value::Target(common)));
        for &(class, id, masq) in &routes {
            if id != common {
                let value = Some(Value::Target(id));
                self.element(override_map(prefix, class), key.clone(), value);
            }
            // clusterIP masquerade is node-wide per class and lives in the base rules.
            if masq && dest != DestKind::ClusterIp {
                self.element(masq_set(prefix, class), key.clone(), None);
            }
        }
    }

    fn firewall(&mut self, ip: IpAddr, proto: Protocol, port: u16) {
        let ranges: Vec<String> = self
            .svc
            .source_ranges
            .iter()
            .filter(|n| IpFamily::of(&n.addr()) == self.family)
            .map(|n| n.trunc().to_string())
            .collect();
        if self.svc.source_ranges.is_empty() {
            return;
        }
        self.element("fw_protected", Key::AddrPort(ip, proto, port), None);
        for source in std::iter::once(ip.to_string()).chain(ranges) {
            let key = Key::Allowed(Box::new((ip, proto, port, source)));
            self.element("fw_allowed", key, None);
        }
    }

    fn finish(mut self) -> Compiled {
        let keys: Vec<(Tag, IpFamily)> = self.targets.keys().copied().collect();
        self.ids.retain(self.spn, &keys);
        let targets: Vec<Target> = std::mem::take(&mut self.targets).into_values().collect();
        for t in targets.iter().filter(|t| !t.endpoints.is_empty()) {
            let n = t.endpoints.len();
            if t.algorithm != Algorithm::LeastConn && t.maglev.is_none() && n > RR_COUNTS {
                let need = ChainNeed::RoundRobin(t.family, n, t.id % RR_BUCKETS);
                self.out.chains.push(need);
            }
            if let Some(secs) = t.affinity_secs {
                self.out.chains.push(ChainNeed::Affinity(t.family, secs));
            }
        }
        self.out.targets = targets;
        self.out.chains.sort();
        self.out.chains.dedup();
        self.out.frontends.sort();
        self.out.frontends.dedup();
        // Kept until the service port changes again: no spare capacity.
        self.out.frontends.shrink_to_fit();
        self.out.chains.shrink_to_fit();
        self.out
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

/// Whether traffic from each class (node, pod, ext) to a clusterIP is masqueraded: decided by
/// the node context and the source class only, so it is compiled once into the base rules
/// instead of once per Service.
pub fn clusterip_masq(ctx: &NodeContext) -> [bool; 3] {
    let mut out = [false; 3];
    for source in ctx.source_kinds() {
        out[class_index(source)] = cluster_ip_masquerade(ctx, source);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures;
    use crate::model::Endpoint;

    fn spn(name: &str) -> ServicePortName {
        ServicePortName::new("ns", name, "", Protocol::Tcp)
    }

    fn svc(name: &str) -> ServicePort {
        ServicePort {
            name: spn(name),
            ..fixtures::service_port(name, "10.96.0.10")
        }
    }

    fn ep(last: u8, node: &str) -> Endpoint {
        fixtures::endpoint(std::net::Ipv4Addr::new(10, 244, last, 2), node)
    }

    fn state(svc: ServicePort, eps: Vec<Endpoint>) -> ProxyState {
        let mut s = ProxyState::default();
        s.node.node_name = "me".into();
        s.node.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
        s.node.node_ips = vec!["192.0.2.1".parse().unwrap()];
        s.set_port(svc, eps);
        s
    }

    /// The frontends' elements and those the targets imply.
    fn all(c: &Compiled) -> Vec<Element> {
        let mut all = c.frontends.clone();
        c.each_target_element(|e, _| all.push(e));
        all
    }

    fn sets(c: &Compiled) -> Vec<(&'static str, String, Option<String>)> {
        all(c)
            .iter()
            .map(|e| (e.set, e.key.to_string(), e.value.map(|v| v.to_string())))
            .collect()
    }

    #[test]
    fn cluster_ip_compiles_to_one_target_with_slots_and_no_per_service_masquerade() {
        let st = state(svc("a"), vec![ep(1, "me"), ep(2, "other")]);
        let c = compile(&st, &spn("a"), &mut TargetIds::default(), &IpFamily::ALL);
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
            compile(&st, &spn("a"), ids, &IpFamily::ALL)
        };
        let three = compiled(&eps, &mut ids);
        let two = compiled(&eps[..2], &mut ids);
        assert_eq!(three.targets[0].id, two.targets[0].id);
        assert!(three.chains.is_empty() && two.chains.is_empty());
        let (three, two) = (all(&three), all(&two));
        let changed: Vec<&Element> = three
            .iter()
            .filter(|e| !two.contains(e))
            .chain(two.iter().filter(|e| !three.contains(e)))
            .collect();
        let verdict_maps = ["targets", "aff_lookup", "aff_record"];
        assert!(
            !changed.iter().any(|e| verdict_maps.contains(&e.set)),
            "no verdict element changes: {changed:?}"
        );
        assert!(
            changed.iter().any(|e| e.set == "rr_n3") && changed.iter().any(|e| e.set == "rr_n2")
        );
    }

    #[test]
    fn many_endpoints_get_a_chain_of_their_own_count() {
        let eps: Vec<Endpoint> = (1..=(RR_COUNTS as u8 + 1)).map(|n| ep(n, "me")).collect();
        let st = state(svc("a"), eps);
        let c = compile(&st, &spn("a"), &mut TargetIds::default(), &IpFamily::ALL);
        let id = c.targets[0].id;
        let n = RR_COUNTS + 1;
        assert_eq!(
            c.chains,
            vec![ChainNeed::RoundRobin(IpFamily::V4, n, id % RR_BUCKETS)]
        );
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
        let c = compile(&st, &spn("b"), &mut TargetIds::default(), &IpFamily::ALL);
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
        let c = compile(&st, &spn("c"), &mut TargetIds::default(), &IpFamily::ALL);
        assert_eq!(c.targets[0].empty, EmptyVerdict::Reject);
        assert!(sets(&c)
            .iter()
            .any(|(_, _, v)| v.as_deref() == Some("goto empty_reject")));

        let mut s = svc("d");
        s.internal_local = true;
        let st = state(s, vec![ep(2, "other")]);
        let c = compile(&st, &spn("d"), &mut TargetIds::default(), &IpFamily::ALL);
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
        let e = sets(&compile(
            &st,
            &spn("e"),
            &mut TargetIds::default(),
            &IpFamily::ALL,
        ));
        let key = "203.0.113.10 . tcp . 80";
        assert!(e.contains(&("fw_protected", key.into(), None)));
        assert!(e.contains(&("fw_allowed", format!("{key} . 198.51.100.0/24"), None)));
        assert!(e.contains(&("fw_allowed", format!("{key} . 203.0.113.10"), None)));
    }

    #[test]
    fn a_maglev_target_is_its_table_slot_by_slot() {
        let mut s = svc("m");
        s.algorithm = Algorithm::Maglev;
        let eps: Vec<Endpoint> = (1..=3).map(|n| ep(n, "me")).collect();
        let c = compile(
            &state(s.clone(), eps.clone()),
            &spn("m"),
            &mut TargetIds::default(),
            &IpFamily::ALL,
        );
        let id = c.targets[0].id;
        let table = c.targets[0]
            .maglev
            .clone()
            .expect("a Maglev target has its table");
        let elements = all(&c);
        let slots: std::collections::HashSet<&Element> =
            elements.iter().filter(|e| e.set == "maglev_tcp").collect();
        assert_eq!(slots.len(), 16381);
        for (slot, ep) in (0u32..).zip(table.slots()) {
            assert!(slots.contains(&Element {
                family: IpFamily::V4,
                set: "maglev_tcp",
                key: Key::Slot(id, slot),
                value: Some(Value::Endpoint(ep.ip(), ep.port())),
            }));
        }
        assert!(sets(&c).contains(&("targets", id.to_string(), Some("goto maglev".into()))));
        assert!(c.chains.is_empty());
        // One endpoint less: its slots move, and few others.
        let mut ids = TargetIds::default();
        let before = all(&compile(
            &state(s.clone(), eps.clone()),
            &spn("m"),
            &mut ids,
            &IpFamily::ALL,
        ));
        let after = all(&compile(
            &state(s, eps[..2].to_vec()),
            &spn("m"),
            &mut ids,
            &IpFamily::ALL,
        ));
        let before: std::collections::HashSet<&Element> = before.iter().collect();
        let changed = after
            .iter()
            .filter(|e| e.set == "maglev_tcp" && !before.contains(e))
            .count();
        let held = table.slot_counts()[2].1 as usize;
        assert!(
            changed >= held && changed <= held + 16381 / 100,
            "{changed} slots changed, {held} held by the removed endpoint"
        );
    }

    #[test]
    fn affinity_target_gets_a_new_id_only_when_it_loses_an_endpoint() {
        let mut s = svc("f");
        s.affinity = Some(std::time::Duration::from_secs(30));
        let mut ids = TargetIds::default();
        let id = |eps: Vec<Endpoint>, ids: &mut TargetIds| {
            let st = state(s.clone(), eps);
            compile(&st, &spn("f"), ids, &IpFamily::ALL).targets[0].id
        };
        let a = id(vec![ep(1, "me")], &mut ids);
        let b = id(vec![ep(1, "me"), ep(2, "me")], &mut ids);
        assert_eq!(a, b, "an added endpoint keeps existing clients' affinity");
        let c = id(vec![ep(2, "me")], &mut ids);
        assert_ne!(b, c, "a removed endpoint orphans the affinity entries");
    }
}
