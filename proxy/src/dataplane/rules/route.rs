//! The route description of one service port that both rule backends render: the route each
//! class of source gets at each kind of destination, the targets those routes name and the
//! stable ids that mark them in conntrack, and the addresses of one family they program.
//!
//! Owns [`class_routes`], [`Tag`], [`TargetIds`] and the family filters. It must not know about
//! either backend's layout (chains, sets, maps).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use crate::model::{Endpoint, IpFamily, ServicePort, ServicePortName};
use crate::selection::SourceKind;
use crate::selection::{route_for, DestKind, EmptyVerdict, NodeContext, SelectedEndpoints};

/// The source classes in the order both backends index their per-class rules by.
pub const SOURCE_CLASSES: [SourceKind; 3] =
    [SourceKind::Node, SourceKind::Pod, SourceKind::External];

/// The index of `source` in [`SOURCE_CLASSES`].
pub fn class_index(source: SourceKind) -> usize {
    SOURCE_CLASSES
        .iter()
        .position(|k| *k == source)
        .expect("every source kind is a class")
}

/// Which route a target serves (cluster or external endpoint set, and whether an empty set
/// drops rather than rejects); with the endpoints it identifies a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tag {
    Cluster(bool),
    External(bool),
}

/// What one class of source gets at one kind of destination of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassRoute<'a> {
    /// Index into [`SOURCE_CLASSES`].
    pub class: usize,
    pub tag: Tag,
    pub endpoints: &'a [Endpoint],
    pub empty: EmptyVerdict,
    pub masquerade: bool,
}

/// The route of every source class this node tells apart, for connections to `dest`.
pub fn class_routes<'a>(
    svc: &ServicePort,
    sel: &'a SelectedEndpoints,
    ctx: &NodeContext,
    dest: DestKind,
) -> Vec<ClassRoute<'a>> {
    ctx.source_kinds()
        .map(|source| {
            let r = route_for(svc, sel, ctx, source, dest);
            let local = r.empty == EmptyVerdict::Drop;
            let tag = if std::ptr::eq(r.endpoints, &*sel.cluster) || r.endpoints == &*sel.cluster {
                Tag::Cluster(local)
            } else {
                Tag::External(local)
            };
            ClassRoute {
                class: class_index(source),
                tag,
                endpoints: r.endpoints,
                empty: r.empty,
                masquerade: r.masquerade,
            }
        })
        .collect()
}

/// One route's target: (tag, family), its id and, with affinity, its endpoints.
type TargetRoute = ((Tag, IpFamily), u32, Vec<SocketAddr>);

/// Hands out conntrack-mark target ids, stable across syncs for an unchanged route.
///
/// Ids are never reused: affinity entries are keyed by id, so a reused id could send a client to
/// another Service's endpoint. A target with affinity that loses an endpoint gets a new id, which
/// orphans its affinity entries (they expire) instead of pinning clients to an endpoint that is
/// gone.
#[derive(Debug, Clone)]
pub struct TargetIds {
    next: u32,
    /// Per service port, its routes' ((tag, family), id, endpoints): one to four per family, so a
    /// Vec (an ordered map allocates a whole node for one entry).
    by_port: HashMap<ServicePortName, Vec<TargetRoute>>,
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
    /// Ids from `first` on (another instance's ids stay below it).
    pub fn starting_at(first: u32) -> Self {
        TargetIds {
            next: first.max(1),
            by_port: HashMap::new(),
        }
    }

    /// The id of route `tag` of `spn` in `family`: the previous one unless the route is new, or
    /// it has affinity and lost an endpoint. Ids are unique across families.
    pub fn get(
        &mut self,
        spn: &ServicePortName,
        (tag, family): (Tag, IpFamily),
        endpoints: &[SocketAddr],
        affinity: bool,
    ) -> u32 {
        let tag = (tag, family);
        let routes = self.by_port.entry(spn.clone()).or_default();
        let at = routes.iter().position(|r| r.0 == tag);
        // Only a route with affinity keeps its endpoints (to see one lost): at 100,000 Services
        // a copy of every route's endpoints was 15 MB.
        let kept = if affinity { endpoints } else { &[] };
        if let Some((_, id, old)) = at.map(|i| &mut routes[i]) {
            let lost_one = old.iter().any(|e| !endpoints.contains(e));
            if !(affinity && lost_one) {
                if old.as_slice() != kept {
                    *old = kept.to_vec();
                }
                return *id;
            }
        }
        let id = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        let route = (tag, id, kept.to_vec());
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
    pub fn retain(&mut self, spn: &ServicePortName, keep: &[(Tag, IpFamily)]) {
        if let Some(m) = self.by_port.get_mut(spn) {
            m.retain(|(tag, _, _)| keep.contains(tag));
            if m.is_empty() {
                self.by_port.remove(spn);
            }
        }
    }
}

/// The endpoints of `family` among `eps`, as the addresses a rule translates to.
pub fn family_endpoints(eps: &[Endpoint], family: IpFamily) -> Vec<SocketAddr> {
    eps.iter()
        .filter(|e| IpFamily::of(&e.addr) == family)
        .map(|e| SocketAddr::new(e.addr, e.port))
        .collect()
}

/// The addresses of `family` among `addrs`.
pub fn family_addrs(addrs: &[IpAddr], family: IpFamily) -> impl Iterator<Item = IpAddr> + '_ {
    addrs
        .iter()
        .copied()
        .filter(move |a| IpFamily::of(a) == family)
}
