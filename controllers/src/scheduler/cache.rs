//! The scheduler cache, as kube-scheduler's: every node with the Pods bound to it and the Pods
//! this scheduler assumed (placed in memory on Reserve, before their binding is written), and the
//! incremental snapshot the scheduling cycle reads.
//!
//! - Assume on Reserve; forget when binding fails; finish binding when the Binding was written; an
//!   assumed Pod is confirmed when the watch shows it bound, and expired only if a TTL is set and
//!   its binding finished that long ago without the watch showing it (upstream v1.34 runs with no
//!   TTL: assumed Pods never expire, so the binary passes `None`).
//! - Nodes are listed in upstream's node-tree order: zones (region + zone labels) interleaved,
//!   each zone's nodes in the order they were added, so the round-robin start of Filter spreads
//!   over zones.
//! - The snapshot shares each node's `Arc<NodeInfo>` with the cache; a change clones only the
//!   node it touches (copy on write), and updating the snapshot replaces only the changed nodes.
//!
//! Owns in-memory state only; the informer handlers feed it and the scheduling loop reads it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::framework::{NodeInfo, PodInfo, Snapshot};

const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ZONE_LABEL_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
const REGION_LABEL_BETA: &str = "failure-domain.beta.kubernetes.io/region";

/// Upstream's utilnode.GetZoneKey: "region:\x00:zone", empty when the node has neither label.
pub fn zone_key(node: &Node) -> String {
    let labels = node.metadata.labels.as_ref();
    let get = |a: &str, b: &str| {
        labels
            .and_then(|l| l.get(a).or_else(|| l.get(b)))
            .cloned()
            .unwrap_or_default()
    };
    let zone = get(ZONE_LABEL, ZONE_LABEL_BETA);
    let region = get(REGION_LABEL, REGION_LABEL_BETA);
    if zone.is_empty() && region.is_empty() {
        return String::new();
    }
    format!("{region}:\x00:{zone}")
}

/// Node names by zone, listed zone-interleaved (upstream's nodeTree).
#[derive(Debug, Default)]
pub struct NodeTree {
    zones: Vec<(String, Vec<String>)>,
    zone_of: HashMap<String, String>,
}

impl NodeTree {
    pub fn add(&mut self, name: &str, zone: String) {
        if let Some(z) = self.zone_of.get(name) {
            if *z == zone {
                return;
            }
            self.remove(name);
        }
        self.zone_of.insert(name.to_string(), zone.clone());
        match self.zones.iter_mut().find(|(z, _)| *z == zone) {
            Some((_, names)) => names.push(name.to_string()),
            None => self.zones.push((zone, vec![name.to_string()])),
        }
    }

    pub fn remove(&mut self, name: &str) {
        let Some(zone) = self.zone_of.remove(name) else {
            return;
        };
        if let Some(i) = self.zones.iter().position(|(z, _)| *z == zone) {
            self.zones[i].1.retain(|n| n != name);
            if self.zones[i].1.is_empty() {
                self.zones.remove(i);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.zone_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.zone_of.is_empty()
    }

    /// Round robin over zones: the first node of each zone, then the second of each, ...
    pub fn list(&self) -> Vec<&str> {
        let mut out = Vec::with_capacity(self.len());
        let mut i = 0;
        while out.len() < self.len() {
            for (_, names) in &self.zones {
                if let Some(n) = names.get(i) {
                    out.push(n.as_str());
                }
            }
            i += 1;
        }
        out
    }
}

#[derive(Debug, Clone)]
struct PodState {
    node: String,
    assumed: bool,
    binding_finished: bool,
    deadline: Option<Instant>,
}

/// What the cache refused to do (the scheduler logs it; upstream returns the same errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("pod {0} is already in the cache, so can't be assumed")]
    AlreadyCached(String),
    #[error("pod {0} has no nodeName to be assumed on")]
    NoNode(String),
    #[error("pod {0} wasn't assumed so cannot be forgotten")]
    NotAssumed(String),
}

/// Nodes, bound Pods and assumed Pods.
#[derive(Default)]
pub struct Cache {
    nodes: HashMap<String, Arc<NodeInfo>>,
    tree: NodeTree,
    pods: HashMap<String, PodState>,
    ttl: Option<Duration>,
    /// Nodes changed since the last snapshot update.
    dirty: HashSet<String>,
    /// Nodes added or removed (the snapshot's list and index are rebuilt).
    list_changed: bool,
    /// Some node's images changed (the image spread is recomputed).
    images_changed: bool,
    namespaces: HashMap<String, BTreeMap<String, String>>,
    namespaces_changed: bool,
}

fn key(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

impl Cache {
    /// An empty cache; `ttl` is how long an assumed Pod whose binding finished may stay
    /// unconfirmed (None: forever, as upstream v1.34).
    pub fn new(ttl: Option<Duration>) -> Cache {
        Cache {
            ttl,
            ..Cache::default()
        }
    }

    fn node_mut(&mut self, name: &str) -> &mut NodeInfo {
        self.dirty.insert(name.to_string());
        Arc::make_mut(self.nodes.entry(name.to_string()).or_default())
    }

    /// Drops a node entry that has neither a node object nor Pods.
    fn gc_node(&mut self, name: &str) {
        if self
            .nodes
            .get(name)
            .is_some_and(|n| n.node.is_none() && n.pods.is_empty())
        {
            self.nodes.remove(name);
        }
    }

    pub fn add_node(&mut self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let zone = zone_key(&node);
        let info = self.node_mut(&name);
        let was_listed = info.node.is_some();
        let images_before: Vec<String> = info.image_states.keys().cloned().collect();
        info.set_node(node);
        let images_changed = images_before.len() != info.image_states.len()
            || images_before
                .iter()
                .any(|i| !info.image_states.contains_key(i));
        self.images_changed |= images_changed;
        self.list_changed |= !was_listed;
        // A new node, or a zone change, reorders the list.
        self.list_changed |= self.tree.zone_of.get(&name) != Some(&zone);
        self.tree.add(&name, zone);
    }

    pub fn update_node(&mut self, node: Arc<Node>) {
        self.add_node(node);
    }

    pub fn remove_node(&mut self, name: &str) {
        if !self.nodes.contains_key(name) {
            return;
        }
        let info = self.node_mut(name);
        info.node = None;
        info.image_states.clear();
        info.generation += 1;
        self.tree.remove(name);
        self.list_changed = true;
        self.images_changed = true;
        self.gc_node(name);
    }

    fn add_to_node(&mut self, pod: Arc<Pod>, node: &str) {
        self.node_mut(node).add_pod(PodInfo::new(pod));
    }

    fn remove_from_node(&mut self, uid: &str, node: &str) {
        if self.nodes.contains_key(node) {
            self.node_mut(node).remove_pod(uid);
            self.gc_node(node);
        }
    }

    /// Places `pod` on `node` before it is bound (upstream assumes a copy with `spec.nodeName`
    /// set; the cache keeps the node name beside the Pod instead of copying it).
    pub fn assume(&mut self, pod: Arc<Pod>, node: &str) -> Result<(), CacheError> {
        let k = key(&pod);
        if self.pods.contains_key(&k) {
            return Err(CacheError::AlreadyCached(pod_name(&pod)));
        }
        if node.is_empty() {
            return Err(CacheError::NoNode(pod_name(&pod)));
        }
        let node = node.to_string();
        self.add_to_node(pod, &node);
        self.pods.insert(
            k,
            PodState {
                node,
                assumed: true,
                binding_finished: false,
                deadline: None,
            },
        );
        Ok(())
    }

    /// The Binding was written: the assumed Pod may now expire (when a TTL is set).
    pub fn finish_binding(&mut self, uid: &str, now: Instant) {
        let ttl = self.ttl;
        if let Some(st) = self.pods.get_mut(uid).filter(|s| s.assumed) {
            st.binding_finished = true;
            st.deadline = ttl.map(|t| now + t);
        }
    }

    /// Undoes `assume` (binding failed, or a later plugin rejected the Pod).
    pub fn forget(&mut self, uid: &str) -> Result<(), CacheError> {
        match self.pods.get(uid) {
            Some(st) if st.assumed => {
                let node = st.node.clone();
                self.pods.remove(uid);
                self.remove_from_node(uid, &node);
                Ok(())
            }
            _ => Err(CacheError::NotAssumed(uid.to_string())),
        }
    }

    pub fn is_assumed(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|s| s.assumed)
    }

    /// Whether the Pod is in the cache (bound or assumed).
    pub fn contains_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// A bound Pod seen by the watch (confirms an assumed one, moving it if it was bound
    /// elsewhere than assumed).
    pub fn add_pod(&mut self, pod: Arc<Pod>) {
        let Some(node) = node_name(&pod).map(str::to_string) else {
            return;
        };
        let k = key(&pod);
        if let Some(st) = self.pods.get(&k).cloned() {
            // Assumed (or a re-delivered add): replace with the API's version.
            self.remove_from_node(&k, &st.node);
        }
        self.add_to_node(pod, &node);
        self.pods.insert(
            k,
            PodState {
                node,
                assumed: false,
                binding_finished: false,
                deadline: None,
            },
        );
    }

    pub fn update_pod(&mut self, pod: Arc<Pod>) {
        self.add_pod(pod);
    }

    pub fn remove_pod(&mut self, uid: &str) {
        if let Some(st) = self.pods.remove(uid) {
            self.remove_from_node(uid, &st.node);
        }
    }

    /// Drops assumed Pods whose binding finished more than the TTL ago without the watch
    /// confirming them; returns their UIDs.
    pub fn cleanup_expired(&mut self, now: Instant) -> Vec<String> {
        let expired: Vec<(String, String)> = self
            .pods
            .iter()
            .filter(|(_, s)| {
                s.assumed && s.binding_finished && s.deadline.is_some_and(|d| now >= d)
            })
            .map(|(k, s)| (k.clone(), s.node.clone()))
            .collect();
        for (k, node) in &expired {
            self.pods.remove(k);
            self.remove_from_node(k, node);
        }
        expired.into_iter().map(|(k, _)| k).collect()
    }

    pub fn set_namespace(&mut self, name: &str, labels: Option<BTreeMap<String, String>>) {
        match labels {
            Some(l) => {
                if self.namespaces.get(name) != Some(&l) {
                    self.namespaces.insert(name.to_string(), l);
                    self.namespaces_changed = true;
                }
            }
            None => {
                self.namespaces_changed |= self.namespaces.remove(name).is_some();
            }
        }
    }

    pub fn node_count(&self) -> usize {
        self.tree.len()
    }

    /// The node entry (tests and the debugger's view).
    pub fn node(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.nodes.get(name)
    }

    fn recompute_image_spread(&mut self) {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for n in self.nodes.values().filter(|n| n.node.is_some()) {
            for img in n.image_states.keys() {
                *counts.entry(img.as_str()).or_default() += 1;
            }
        }
        let counts: HashMap<String, usize> = counts
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let stale: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| {
                n.image_states
                    .iter()
                    .any(|(img, st)| counts.get(img).copied().unwrap_or(0) != st.num_nodes)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for name in stale {
            let info = self.node_mut(&name);
            for (img, st) in info.image_states.iter_mut() {
                st.num_nodes = counts.get(img).copied().unwrap_or(0);
            }
        }
    }

    /// Brings `snap` up to date with the cache, replacing only what changed since the last call.
    pub fn update_snapshot(&mut self, snap: &mut Snapshot) {
        if self.images_changed {
            self.recompute_image_spread();
            self.images_changed = false;
        }
        if self.namespaces_changed || snap.namespace_labels.len() != self.namespaces.len() {
            snap.namespace_labels = self.namespaces.clone();
            self.namespaces_changed = false;
        }
        let dirty = std::mem::take(&mut self.dirty);
        if self.list_changed || snap.nodes.len() != self.tree.len() {
            self.list_changed = false;
            let nodes: Vec<Arc<NodeInfo>> = self
                .tree
                .list()
                .into_iter()
                .filter_map(|n| self.nodes.get(n).cloned())
                .collect();
            let labels = std::mem::take(&mut snap.namespace_labels);
            *snap = Snapshot::from_arcs(nodes, labels);
            return;
        }
        if dirty.is_empty() {
            return;
        }
        let mut affinity_changed = false;
        for name in &dirty {
            let (Some(&i), Some(info)) = (snap.index.get(name), self.nodes.get(name)) else {
                continue;
            };
            let old = &snap.nodes[i];
            affinity_changed |= old.pods_with_affinity.is_empty()
                != info.pods_with_affinity.is_empty()
                || old.pods_with_required_anti_affinity.is_empty()
                    != info.pods_with_required_anti_affinity.is_empty();
            snap.nodes[i] = info.clone();
        }
        if affinity_changed {
            snap.have_pods_with_affinity = (0..snap.nodes.len())
                .filter(|&i| !snap.nodes[i].pods_with_affinity.is_empty())
                .collect();
            snap.have_pods_with_required_anti_affinity = (0..snap.nodes.len())
                .filter(|&i| !snap.nodes[i].pods_with_required_anti_affinity.is_empty())
                .collect();
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
