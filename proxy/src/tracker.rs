//! The change tracker: Kubernetes objects in, [`ProxyState`] and [`ChangeSet`] out.
//!
//! Owns the per-object view (Services and EndpointSlices by namespace/name, as the sources
//! converted them), the set of Services touched since the last sync, and the state last handed to
//! the dataplane. Sources send [`ServiceEntry`] / [`SliceEntry`] values, which the
//! `apply_*_entry`/`delete_*`/`replace_*` methods take (the `apply_service` / `apply_slice` forms
//! converting a Kubernetes object are for callers that hold one); the sync runner calls
//! [`Tracker::take_changes`]. Work per sync is proportional to the Services touched, not to the
//! cluster size.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub use crate::convert::ObjectKey;
use crate::convert::{ServiceEntry, SliceEntry, SliceInfo};
use crate::error::InvalidObject;
use crate::model::{merge_endpoints, Algorithm, Endpoint, Protocol, ServicePort, ServicePortName};
use crate::selection::NodeContext;
use crate::state::{ChangeSet, PortState, ProxyState};

/// A pass that wrote at least this many service ports, and at least half the state, rebuilds
/// the state's map full ([`ProxyState::compact`]); below it the saving is not worth the copy.
const COMPACT_AFTER: usize = 1024;

/// What a [`Tracker::take_changes`] pass collects before it becomes a [`ChangeSet`]: names in
/// vectors, made ordered sets once at the end. A B-tree filled one name at a time in order is a
/// little over half full (each split leaves 6 of a node's 11 slots in the left node), while one
/// built from all its names at once is full: at the first sync of 100,000 service ports the two
/// sets took nearly twice the memory they need (docs/BENCHMARKS.md).
#[derive(Default)]
struct Collected {
    changed: Vec<ServicePortName>,
    became_reachable: Vec<ServicePortName>,
    removed_endpoints: BTreeMap<ServicePortName, Vec<Endpoint>>,
}

/// A Service's slice names, sorted. Most Services have one slice, whose name is kept inline:
/// a vector of one name is an allocation of four (6 MB at 100,000 Services), and an ordered set
/// a whole tree node.
#[derive(Debug)]
enum SliceNames {
    One(Arc<str>),
    Many(Vec<Arc<str>>),
}

impl Default for SliceNames {
    fn default() -> Self {
        SliceNames::Many(Vec::new())
    }
}

impl SliceNames {
    fn as_slice(&self) -> &[Arc<str>] {
        match self {
            SliceNames::One(name) => std::slice::from_ref(name),
            SliceNames::Many(names) => names,
        }
    }

    fn insert(&mut self, name: &Arc<str>) {
        let mut names = match std::mem::take(self) {
            SliceNames::Many(names) if names.is_empty() => {
                *self = SliceNames::One(name.clone());
                return;
            }
            SliceNames::One(one) => vec![one],
            SliceNames::Many(names) => names,
        };
        if let Err(at) = names.binary_search(name) {
            names.insert(at, name.clone());
        }
        *self = SliceNames::Many(names);
    }

    /// Removes `name`; true when no name is left.
    fn remove(&mut self, name: &str) -> bool {
        match self {
            SliceNames::One(one) if **one == *name => *self = SliceNames::default(),
            SliceNames::One(_) => {}
            SliceNames::Many(names) => {
                if let Ok(at) = names.binary_search_by(|n| (**n).cmp(name)) {
                    names.remove(at);
                }
                if names.len() == 1 {
                    *self = SliceNames::One(names.remove(0));
                }
            }
        }
        self.as_slice().is_empty()
    }
}

/// Tracks Services and EndpointSlices and computes what changed between syncs.
#[derive(Debug)]
pub struct Tracker {
    default_algorithm: Algorithm,
    /// Each Service's proxied ports, shared with the state.
    services: HashMap<ObjectKey, Box<[Arc<ServicePort>]>>,
    slices: HashMap<ObjectKey, SliceInfo>,
    /// Each Service's slice names, sorted.
    slices_by_service: HashMap<ObjectKey, SliceNames>,
    /// Problems per object (`Service ns/name`, `EndpointSlice ns/name`, or a source's own key).
    errors: BTreeMap<String, Vec<InvalidObject>>,
    dirty: BTreeSet<ObjectKey>,
    state: ProxyState,
    needs_full: bool,
    /// The node's zone changed: every port's selection is made again at the next sync.
    node_changed: bool,
}

impl Tracker {
    pub fn new(default_algorithm: Algorithm, node: NodeContext) -> Self {
        Tracker {
            default_algorithm,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            errors: BTreeMap::new(),
            dirty: BTreeSet::new(),
            state: ProxyState::new(node),
            needs_full: true,
            node_changed: false,
        }
    }

    /// The state as of the last [`Tracker::take_changes`].
    pub fn state(&self) -> &ProxyState {
        &self.state
    }

    /// Every current problem with an input object.
    pub fn errors(&self) -> impl Iterator<Item = &InvalidObject> {
        self.errors.values().flatten()
    }

    /// Whether anything changed since the last sync.
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty() || self.needs_full || self.node_changed
    }

    /// The node's zone (its `topology.kubernetes.io/zone` label), which topology hints are
    /// matched against.
    pub fn set_node_zone(&mut self, zone: Option<String>) {
        if self.state.node.zone != zone {
            tracing::info!(zone = ?zone, "node zone changed; selecting endpoints again");
            self.state.node.zone = zone;
            self.node_changed = true;
        }
    }

    /// Asks for a full resync at the next sync (start-up, after a failed sync).
    pub fn request_full(&mut self) {
        self.needs_full = true;
    }

    fn set_errors(&mut self, key: String, errs: Vec<InvalidObject>) {
        if self.errors.get(&key).is_some_and(|old| *old == errs) {
            return;
        }
        for e in &errs {
            tracing::warn!("{e}");
        }
        if errs.is_empty() {
            self.errors.remove(&key);
        } else {
            self.errors.insert(key, errs);
        }
    }

    /// Records problems a source found outside any one object (an unparseable file).
    pub fn set_source_errors(&mut self, source_key: &str, errs: Vec<InvalidObject>) {
        self.set_errors(format!("source {source_key}"), errs);
    }

    /// Converts and applies one Service.
    pub fn apply_service(&mut self, svc: &Service) {
        self.apply_service_entry(ServiceEntry::new(svc, self.default_algorithm));
    }

    /// Applies one Service as a source converted it.
    pub fn apply_service_entry(&mut self, entry: ServiceEntry) {
        let ServiceEntry {
            key,
            ports,
            errors,
            skipped,
        } = entry;
        self.set_errors(format!("Service {}/{}", key.0, key.1), errors);
        if let Some(why) = skipped {
            tracing::debug!(service = %format!("{}/{}", key.0, key.1), "not proxied: {why}");
        }
        let same = self.services.get(&key).is_some_and(|old| {
            old.len() == ports.len() && old.iter().zip(&ports).all(|(a, b)| **a == **b)
        });
        if !same {
            self.services.insert(key.clone(), ports);
            self.dirty.insert(key);
        }
    }

    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key: ObjectKey = (namespace.into(), name.into());
        self.errors.remove(&format!("Service {namespace}/{name}"));
        if self.services.remove(&key).is_some() {
            self.dirty.insert(key);
        }
    }

    /// Converts and applies one EndpointSlice.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        self.apply_slice_entry(SliceEntry::new(slice));
    }

    /// Applies one EndpointSlice as a source converted it.
    pub fn apply_slice_entry(&mut self, entry: SliceEntry) {
        let SliceEntry { key, info, errors } = entry;
        self.set_errors(format!("EndpointSlice {}/{}", key.0, key.1), errors);
        match info {
            Some(info) => {
                if self.slices.get(&key) == Some(&info) {
                    return;
                }
                self.unlink_slice(&key);
                let svc_key = (info.namespace.clone(), info.service.clone());
                self.slices_by_service
                    .entry(svc_key.clone())
                    .or_default()
                    .insert(&key.1);
                self.slices.insert(key, info);
                self.dirty.insert(svc_key);
            }
            None => self.unlink_slice(&key),
        }
    }

    pub fn delete_slice(&mut self, namespace: &str, name: &str) {
        let key: ObjectKey = (namespace.into(), name.into());
        self.errors
            .remove(&format!("EndpointSlice {namespace}/{name}"));
        self.unlink_slice(&key);
    }

    fn unlink_slice(&mut self, key: &ObjectKey) {
        if let Some(old) = self.slices.remove(key) {
            let svc_key = (old.namespace, old.service);
            if let Some(names) = self.slices_by_service.get_mut(&svc_key) {
                if names.remove(&key.1) {
                    self.slices_by_service.remove(&svc_key);
                }
            }
            self.dirty.insert(svc_key);
        }
    }

    /// Replaces everything with a complete listing (a relist or a reloaded directory): objects not
    /// in it are deleted, so deletes missed during a watch outage are not lost.
    pub fn replace_all(&mut self, services: &[Service], slices: &[EndpointSlice]) {
        let alg = self.default_algorithm;
        self.replace_services(services.iter().map(|s| ServiceEntry::new(s, alg)).collect());
        self.replace_slices(slices.iter().map(SliceEntry::new).collect());
    }

    /// Replaces all Services with a complete listing, deleting those it lacks.
    pub fn replace_services(&mut self, services: Vec<ServiceEntry>) {
        let keep: HashSet<&ObjectKey> = services.iter().map(|s| &s.key).collect();
        let gone: Vec<ObjectKey> = self
            .services
            .keys()
            .filter(|k| !keep.contains(k))
            .cloned()
            .collect();
        drop(keep);
        for (ns, name) in gone {
            self.delete_service(&ns, &name);
        }
        for s in services {
            self.apply_service_entry(s);
        }
    }

    /// Replaces all EndpointSlices with a complete listing, deleting those it lacks.
    pub fn replace_slices(&mut self, slices: Vec<SliceEntry>) {
        let keep: HashSet<&ObjectKey> = slices.iter().map(|s| &s.key).collect();
        let gone: Vec<ObjectKey> = self
            .slices
            .keys()
            .filter(|k| !keep.contains(k))
            .cloned()
            .collect();
        drop(keep);
        for (ns, name) in gone {
            self.delete_slice(&ns, &name);
        }
        for s in slices {
            self.apply_slice_entry(s);
        }
    }

    /// The endpoints of one service port, merged over the Service's slices ([`merge_endpoints`]).
    /// A Service with one slice of this one port (the common case) gets the slice's own list.
    fn endpoints_for(&self, svc_key: &ObjectKey, sp: &ServicePort) -> Arc<[Endpoint]> {
        let slices: Vec<&SliceInfo> = self
            .slices_by_service
            .get(svc_key)
            .into_iter()
            .flat_map(SliceNames::as_slice)
            .filter_map(|name| self.slices.get(&(svc_key.0.clone(), name.clone())))
            .collect();
        let of_port =
            |pname: &str, proto: Protocol| pname == &*sp.name.port_name && proto == sp.protocol;
        let of_family = |e: &Endpoint| {
            sp.cluster_ips
                .iter()
                .any(|ip| ip.is_ipv4() == e.addr.is_ipv4())
        };
        if let [slice] = slices.as_slice() {
            if let [(pname, proto, _)] = &*slice.ports {
                if of_port(pname, *proto) && slice.endpoints.iter().all(of_family) {
                    return slice.endpoints.clone();
                }
            }
        }
        let mut eps = Vec::new();
        for slice in slices {
            for &(ref pname, proto, port) in slice.ports.iter() {
                if of_port(pname, proto) {
                    eps.extend(
                        slice
                            .endpoints
                            .iter()
                            .filter(|e| of_family(e))
                            .map(|e| Endpoint { port, ..e.clone() }),
                    );
                }
            }
        }
        merge_endpoints(eps).into()
    }

    /// Brings the state up to date with everything applied since the last call and says what
    /// changed. A full change set is returned the first time and after [`Tracker::request_full`].
    pub fn take_changes(&mut self) -> ChangeSet {
        let full = std::mem::take(&mut self.needs_full);
        let mut dirty = std::mem::take(&mut self.dirty);
        let reselect = std::mem::take(&mut self.node_changed);
        if reselect {
            dirty.extend(self.services.keys().cloned());
        }
        let mut collected = Collected::default();
        for svc_key in dirty {
            self.refresh_service(&svc_key, &mut collected, reselect);
        }
        // Most of the state written in this pass (the first listing, a relist after an
        // outage): written in name order, so rebuilt full (see `ProxyState::compact`).
        let written = collected.changed.len();
        if written >= COMPACT_AFTER && written * 2 >= self.state.len() {
            self.state.compact();
        }
        ChangeSet {
            full,
            changed: collected.changed.into_iter().collect(),
            removed_endpoints: collected.removed_endpoints,
            became_reachable: collected.became_reachable.into_iter().collect(),
        }
    }

    /// With `reselect`, ports whose Service and endpoints are unchanged are selected again too
    /// (the node changed).
    fn refresh_service(&mut self, svc_key: &ObjectKey, changes: &mut Collected, reselect: bool) {
        let new_ports: Vec<Arc<ServicePort>> = self
            .services
            .get(svc_key)
            .map(|p| p.to_vec())
            .unwrap_or_default();
        // The state holds exactly the ports the last refresh of this Service gave it.
        let old_names = self.state.ports_of(&svc_key.0, &svc_key.1);
        let new_names: Vec<ServicePortName> = new_ports.iter().map(|p| p.name.clone()).collect();
        for name in old_names.iter().filter(|n| !new_names.contains(n)) {
            if let Some(old) = self.state.remove(name) {
                let gone: Vec<Endpoint> = old
                    .selected
                    .cluster
                    .iter()
                    .chain(old.selected.external.iter())
                    .cloned()
                    .collect();
                record_removed(changes, name, gone);
            }
            changes.changed.push(name.clone());
        }
        for sp in new_ports {
            let eps = self.endpoints_for(svc_key, &sp);
            self.update_port(sp, eps, changes, reselect);
        }
    }

    fn update_port(
        &mut self,
        sp: Arc<ServicePort>,
        eps: Arc<[Endpoint]>,
        changes: &mut Collected,
        reselect: bool,
    ) {
        let name = sp.name.clone();
        let old = self.state.get(&name);
        if !reselect
            && old.is_some_and(|o| {
                o.service == sp && (Arc::ptr_eq(&o.endpoints, &eps) || *o.endpoints == *eps)
            })
        {
            return;
        }
        let port = PortState::new(sp, eps, &self.state.node);
        if reselect && old.is_some_and(|o| *o == port) {
            return;
        }
        let was_reachable = old.is_some_and(|o| o.selected.any_usable);
        if let Some(old) = old {
            let now: BTreeSet<_> = port
                .selected
                .cluster
                .iter()
                .chain(port.selected.external.iter())
                .map(Endpoint::socket_addr)
                .collect();
            let gone: Vec<Endpoint> = old
                .selected
                .cluster
                .iter()
                .chain(old.selected.external.iter())
                .filter(|e| !now.contains(&e.socket_addr()))
                .cloned()
                .collect();
            record_removed(changes, &name, gone);
        }
        if !was_reachable && port.selected.any_usable && name.protocol.conntrack_cleaned() {
            changes.became_reachable.push(name.clone());
        }
        self.state.insert(port);
        changes.changed.push(name);
    }
}

fn record_removed(changes: &mut Collected, name: &ServicePortName, mut gone: Vec<Endpoint>) {
    gone.sort();
    gone.dedup_by_key(|e| e.socket_addr());
    if !gone.is_empty() {
        changes
            .removed_endpoints
            .entry(name.clone())
            .or_default()
            .extend(gone);
    }
}

#[cfg(test)]
mod tests;
