//! The desired state the core hands every dataplane, and what changed since the last sync.
//!
//! Owns [`ProxyState`] (one [`PortState`] per service port: the port, its endpoints and their
//! selection, kept together so no backend joins parallel maps), [`ChangeSet`], [`SyncStats`] and
//! the [`LiveView`] a backend reports. It sits between `selection` (which it calls when a port is
//! set) and everything that consumes the state: the tracker builds it; sync, status, health
//! checks, conntrack cleanup and the dataplanes read it. It must not import any of them.

use std::collections::{btree_map, BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Endpoint, ServicePort, ServicePortName};
use crate::selection::{select_in, with_maglev, NodeContext, SelectedEndpoints};

/// One service port as the dataplanes program it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortState {
    /// The port as its Service defines it; shared with the tracker's per-Service view.
    pub service: Arc<ServicePort>,
    /// Every endpoint of the port, as the slices list them (deduplicated, sorted). Shared with
    /// the slice it came from when the Service has one slice of this one port, and with
    /// `selected.cluster` and `selected.external` when the selection keeps them all: the common
    /// case keeps one list of a port's endpoints, not one per holder.
    pub endpoints: Arc<[Endpoint]>,
    /// The endpoints each kind of traffic may use, computed once by `selection::select` (with
    /// a Maglev Service port's tables).
    pub selected: SelectedEndpoints,
}

impl PortState {
    /// The port with its endpoints, selected for `node`.
    pub fn new(
        service: Arc<ServicePort>,
        endpoints: impl Into<Arc<[Endpoint]>>,
        node: &NodeContext,
    ) -> Self {
        let endpoints: Arc<[Endpoint]> = endpoints.into();
        let mut selected = select_in(&service, &endpoints, &node.node_name, node.zone.as_deref());
        for set in [&mut selected.cluster, &mut selected.external] {
            if !Arc::ptr_eq(set, &endpoints) && **set == *endpoints {
                *set = endpoints.clone();
            }
        }
        let selected = with_maglev(&service, selected, node.maglev_table_size);
        PortState {
            service,
            endpoints,
            selected,
        }
    }
}

/// The complete desired state, as the core hands it to a backend.
#[derive(Debug, Clone, Default)]
pub struct ProxyState {
    ports: BTreeMap<ServicePortName, PortState>,
    pub node: NodeContext,
}

impl ProxyState {
    /// An empty state for this node.
    pub fn new(node: NodeContext) -> Self {
        ProxyState {
            ports: BTreeMap::new(),
            node,
        }
    }

    /// One service port, if it is proxied.
    pub fn get(&self, name: &ServicePortName) -> Option<&PortState> {
        self.ports.get(name)
    }

    /// The port's Service definition, if it is proxied.
    pub fn service(&self, name: &ServicePortName) -> Option<&ServicePort> {
        self.ports.get(name).map(|p| &*p.service)
    }

    pub fn contains(&self, name: &ServicePortName) -> bool {
        self.ports.contains_key(name)
    }

    /// Every service port, in name order.
    pub fn iter(&self) -> btree_map::Iter<'_, ServicePortName, PortState> {
        self.ports.iter()
    }

    /// Every service port's name, in order.
    pub fn names(&self) -> impl Iterator<Item = &ServicePortName> {
        self.ports.keys()
    }

    /// The names of the ports of the Service `namespace/name`, in order: a range of the map,
    /// whose names sort by namespace, then Service.
    pub fn ports_of(&self, namespace: &Arc<str>, name: &Arc<str>) -> Vec<ServicePortName> {
        let first = ServicePortName::new(
            namespace.clone(),
            name.clone(),
            "",
            crate::model::Protocol::Tcp,
        );
        self.ports
            .range(first..)
            .map(|(n, _)| n)
            .take_while(|n| n.namespace == *namespace && n.name == *name)
            .cloned()
            .collect()
    }

    /// The number of service ports.
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// Sets one service port (its name is the port's own), replacing what it had.
    pub fn insert(&mut self, port: PortState) -> Option<PortState> {
        self.ports.insert(port.service.name.clone(), port)
    }

    /// Sets a service port and its endpoints, selected for this state's node.
    pub fn set_port(
        &mut self,
        service: impl Into<Arc<ServicePort>>,
        endpoints: impl Into<Arc<[Endpoint]>>,
    ) -> Option<PortState> {
        let port = PortState::new(service.into(), endpoints, &self.node);
        self.insert(port)
    }

    pub fn remove(&mut self, name: &ServicePortName) -> Option<PortState> {
        self.ports.remove(name)
    }

    /// Rebuilds the map with its nodes full. Ports inserted in name order (as the tracker
    /// refreshes Services) leave each node a little over half full: a B-tree node splits with 6
    /// of its 11 slots on the left and the right side filled next. Built at once from the sorted
    /// entries, nodes are full: about 40 % less memory for the map after a first listing.
    pub fn compact(&mut self) {
        self.ports = std::mem::take(&mut self.ports).into_iter().collect();
    }
}

/// What changed since the previous sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSet {
    /// Service ports whose ServicePort or endpoints differ from the previous sync (added, changed
    /// or removed: a removed one is absent from the [`ProxyState`]).
    pub changed: BTreeSet<ServicePortName>,
    /// Rebuild everything (start-up, recovery after an error, periodic full resync).
    pub full: bool,
    /// Endpoints that were usable in the previous sync and are not any more, per service port.
    /// UDP/SCTP conntrack entries towards them must be removed.
    pub removed_endpoints: BTreeMap<ServicePortName, Vec<Endpoint>>,
    /// UDP and SCTP service ports that went from no usable endpoint to some: stale conntrack
    /// entries towards their service addresses (cached rejects) must be removed. Only those
    /// protocols ([`crate::model::Protocol::conntrack_cleaned`]): at an agent's start every port becomes
    /// reachable, and a set of every TCP port too was 6 MB at 100,000 Services for nothing.
    pub became_reachable: BTreeSet<ServicePortName>,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && !self.full
    }
}

/// What one sync did, for logs, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncStats {
    pub full: bool,
    /// Service ports programmed in total after the sync.
    pub service_ports: usize,
    /// Service ports touched by this sync.
    pub touched: usize,
    /// Backend-specific count of dataplane operations (rules, map elements, map updates).
    pub operations: usize,
    /// Sockets connected to endpoints that left, destroyed by this sync (ebpf backend on Linux
    /// 6.5+; other backends move flows by deleting conntrack entries instead).
    #[serde(default)]
    pub sockets_destroyed: SocketsDestroyed,
}

/// Sockets destroyed, by protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketsDestroyed {
    pub tcp: u64,
    pub udp: u64,
}

/// Live per-endpoint numbers a backend can report (least-connection counters).
pub trait LiveView: Send + Sync {
    /// Active connections per endpoint address, as this node's dataplane counts them.
    fn active_connections(&self) -> BTreeMap<SocketAddr, u64>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::service_port;
    use crate::model::Protocol;

    #[test]
    fn compact_keeps_every_port_in_order() {
        let mut state = ProxyState::default();
        for i in 0..2000 {
            state.set_port(service_port(&format!("s{i:04}"), "10.96.0.10"), Vec::new());
        }
        let before: Vec<PortState> = state.iter().map(|(_, p)| p.clone()).collect();
        state.compact();
        let after: Vec<PortState> = state.iter().map(|(_, p)| p.clone()).collect();
        assert_eq!(before, after);
        assert!(state.contains(&before[1234].service.name));
    }

    #[test]
    fn ports_of_lists_one_services_ports_only() {
        let mut state = ProxyState::default();
        let port = |svc: &str, ns: &str, port_name: &str, protocol| {
            let mut sp = service_port(svc, "10.96.0.10");
            sp.name.namespace = ns.into();
            sp.name.port_name = port_name.into();
            sp.name.protocol = protocol;
            sp
        };
        for sp in [
            port("web", "default", "", Protocol::Udp),
            port("web", "default", "http", Protocol::Tcp),
            port("web", "default", "dns", Protocol::Udp),
            port("web2", "default", "", Protocol::Tcp),
            port("we", "default", "x", Protocol::Tcp),
            port("web", "other", "", Protocol::Tcp),
        ] {
            state.set_port(sp, Vec::new());
        }
        let names: Vec<String> = state
            .ports_of(&"default".into(), &"web".into())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            names,
            [
                "default/web/UDP",
                "default/web:dns/UDP",
                "default/web:http/TCP"
            ]
        );
        assert!(state.ports_of(&"default".into(), &"nope".into()).is_empty());
    }
}
