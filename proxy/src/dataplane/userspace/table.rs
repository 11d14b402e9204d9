//! The userspace backend's lookup table: which Service port (and which kind of destination) an
//! original destination address belongs to, with the endpoints the core selected for it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::model::{Protocol, ServicePort, ServicePortName};
use crate::selection::{DestKind, SelectedEndpoints};
use crate::state::ProxyState;

/// One service port as the listeners need it.
#[derive(Debug)]
pub struct Entry {
    pub svc: Arc<ServicePort>,
    pub sel: SelectedEndpoints,
}

type DestKey = (IpAddr, u16, Protocol);

/// Original destination -> service port.
#[derive(Debug, Default)]
pub struct Table {
    entries: HashMap<ServicePortName, Arc<Entry>>,
    by_dest: HashMap<DestKey, (ServicePortName, DestKind)>,
    nodeports: HashMap<(u16, Protocol), ServicePortName>,
    dests_of: HashMap<ServicePortName, Vec<DestKey>>,
    /// The nodePort key each service port holds (so an update never scans `nodeports`).
    nodeport_of: HashMap<ServicePortName, (u16, Protocol)>,
    /// Node addresses that accept nodePort traffic.
    pub nodeport_ips: Vec<IpAddr>,
}

/// Every (address, kind) a service port is reachable at, except nodePorts.
pub fn destinations(sp: &ServicePort) -> Vec<(IpAddr, DestKind)> {
    let mut d: Vec<(IpAddr, DestKind)> = sp
        .cluster_ips
        .iter()
        .map(|ip| (*ip, DestKind::ClusterIp))
        .collect();
    d.extend(sp.external_ips.iter().map(|ip| (*ip, DestKind::ExternalIp)));
    d.extend(
        sp.load_balancer_ips
            .iter()
            .map(|ip| (*ip, DestKind::LoadBalancer)),
    );
    d
}

impl Table {
    /// Replaces the entries of `name` with what the state says now (or removes them).
    pub fn update(&mut self, state: &ProxyState, name: &ServicePortName) {
        for key in self.dests_of.remove(name).unwrap_or_default() {
            self.by_dest.remove(&key);
        }
        if let Some(key) = self.nodeport_of.remove(name) {
            if self.nodeports.get(&key) == Some(name) {
                self.nodeports.remove(&key);
            }
        }
        self.entries.remove(name);
        let Some(port) = state.get(name) else {
            return;
        };
        let (sp, sel) = (&port.service, &port.selected);
        let mut keys = Vec::new();
        for (ip, kind) in destinations(sp) {
            let key = (ip, sp.port, sp.protocol);
            self.by_dest.insert(key, (name.clone(), kind));
            keys.push(key);
        }
        if sp.node_port != 0 {
            let key = (sp.node_port, sp.protocol);
            self.nodeports.insert(key, name.clone());
            self.nodeport_of.insert(name.clone(), key);
        }
        self.dests_of.insert(name.clone(), keys);
        self.entries.insert(
            name.clone(),
            Arc::new(Entry {
                svc: sp.clone(),
                sel: sel.clone(),
            }),
        );
    }

    /// Drops everything (full resync).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_dest.clear();
        self.nodeports.clear();
        self.dests_of.clear();
        self.nodeport_of.clear();
    }

    /// The service port an original destination belongs to.
    pub fn resolve(&self, dst: SocketAddr, proto: Protocol) -> Option<(Arc<Entry>, DestKind)> {
        if let Some((name, kind)) = self.by_dest.get(&(dst.ip(), dst.port(), proto)) {
            return self.entries.get(name).map(|e| (e.clone(), *kind));
        }
        let name = self.nodeports.get(&(dst.port(), proto))?;
        if !self.nodeport_ips.contains(&dst.ip()) && !dst.ip().is_loopback() {
            return None;
        }
        self.entries
            .get(name)
            .map(|e| (e.clone(), DestKind::NodePort))
    }

    /// The entry of a service port by name.
    pub fn get(&self, name: &ServicePortName) -> Option<Arc<Entry>> {
        self.entries.get(name).cloned()
    }
}
