//! The node view plugins read: [`Resource`] amounts, a Pod with its computed requests
//! ([`PodInfo`]), a node with the Pods on it and their sums ([`NodeInfo`]), and the cycle's
//! immutable [`Snapshot`] of all nodes; plus the Pod request arithmetic kube-scheduler uses
//! (init containers, sidecars, overhead, pod-level resources, non-zero defaults) and Quantity
//! parsing.
//!
//! Owns only values and pure functions; the scheduler cache builds and updates them.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::helpers::containers::long_running;
pub use crate::helpers::quantity::{parse_milli, parse_value};

/// kube-scheduler's DefaultMilliCPURequest: what a container without a CPU request counts as
/// when spreading (NonZeroRequested), never when fitting.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// kube-scheduler's DefaultMemoryRequest (200 MiB), as above.
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
pub const PODS: &str = "pods";

/// Amounts of resources: CPU in millicores, memory and ephemeral storage in bytes, the number of
/// Pods, and every other (extended, hugepages) resource by name in its integer value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resource {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub allowed_pod_number: i64,
    pub scalar: BTreeMap<String, i64>,
}

impl Resource {
    /// From a ResourceList (requests, allocatable, overhead). Unparseable quantities count as 0
    /// and are reported by the caller that validates objects, not here.
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Resource {
        let mut r = Resource::default();
        for (name, q) in list.into_iter().flatten() {
            r.set(name, q);
        }
        r
    }

    fn set(&mut self, name: &str, q: &Quantity) {
        match name {
            CPU => self.milli_cpu = parse_milli(&q.0).unwrap_or(0),
            MEMORY => self.memory = parse_value(&q.0).unwrap_or(0),
            EPHEMERAL_STORAGE => self.ephemeral_storage = parse_value(&q.0).unwrap_or(0),
            PODS => self.allowed_pod_number = parse_value(&q.0).unwrap_or(0),
            _ => {
                self.scalar
                    .insert(name.to_string(), parse_value(&q.0).unwrap_or(0));
            }
        }
    }

    pub fn add(&mut self, other: &Resource) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        self.allowed_pod_number += other.allowed_pod_number;
        for (k, v) in &other.scalar {
            *self.scalar.entry(k.clone()).or_default() += v;
        }
    }

    pub fn sub(&mut self, other: &Resource) {
        self.milli_cpu -= other.milli_cpu;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        self.allowed_pod_number -= other.allowed_pod_number;
        for (k, v) in &other.scalar {
            *self.scalar.entry(k.clone()).or_default() -= v;
        }
    }

    /// Each amount becomes the larger of the two.
    pub fn max_with(&mut self, other: &Resource) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        self.allowed_pod_number = self.allowed_pod_number.max(other.allowed_pod_number);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }

    /// The amount of a resource by its API name.
    pub fn get(&self, name: &str) -> i64 {
        match name {
            CPU => self.milli_cpu,
            MEMORY => self.memory,
            EPHEMERAL_STORAGE => self.ephemeral_storage,
            PODS => self.allowed_pod_number,
            _ => self.scalar.get(name).copied().unwrap_or(0),
        }
    }
}

/// A Pod as the scheduler counts it.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub pod: Arc<Pod>,
    /// What the Pod requests when fitting (kube-scheduler's `resource.PodRequests`).
    pub requests: Resource,
    /// Millicores and bytes with [`DEFAULT_MILLI_CPU_REQUEST`] / [`DEFAULT_MEMORY_REQUEST`] for
    /// containers that request none (used for spreading scores only).
    pub non_zero_cpu: i64,
    pub non_zero_memory: i64,
    /// Has any pod affinity or anti-affinity term (required or preferred).
    pub has_affinity: bool,
    /// Has required pod anti-affinity terms.
    pub has_required_anti_affinity: bool,
    /// InterPodAffinity's parsed terms of this Pod, set by that plugin the first time it reads
    /// them (upstream's PodInfo carries them as `RequiredAffinityTerms` and its siblings). Typed
    /// by the plugin, so the framework does not depend on it; clones made after it is set share
    /// it, so each Pod object's selectors are parsed once rather than in every cycle.
    pub affinity_terms: OnceLock<Arc<dyn Any + Send + Sync>>,
}

impl PodInfo {
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        let requests = pod_requests(&pod, false);
        let non_zero = pod_requests(&pod, true);
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let has_pod_affinity = affinity.is_some_and(|a| {
            a.pod_affinity.as_ref().is_some_and(|p| {
                !p.required_during_scheduling_ignored_during_execution
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
                    || !p
                        .preferred_during_scheduling_ignored_during_execution
                        .as_deref()
                        .unwrap_or_default()
                        .is_empty()
            })
        });
        let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let required_anti = anti.is_some_and(|p| {
            !p.required_during_scheduling_ignored_during_execution
                .as_deref()
                .unwrap_or_default()
                .is_empty()
        });
        let preferred_anti = anti.is_some_and(|p| {
            !p.preferred_during_scheduling_ignored_during_execution
                .as_deref()
                .unwrap_or_default()
                .is_empty()
        });
        PodInfo {
            requests,
            non_zero_cpu: non_zero.milli_cpu,
            non_zero_memory: non_zero.memory,
            has_affinity: has_pod_affinity || required_anti || preferred_anti,
            has_required_anti_affinity: required_anti,
            affinity_terms: OnceLock::new(),
            pod,
        }
    }

    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn uid(&self) -> &str {
        self.pod.metadata.uid.as_deref().unwrap_or_default()
    }
}

/// A host port in use on a node: (host IP, protocol, port); an empty IP is "0.0.0.0".
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

/// A node and what is on it (bound and assumed Pods), with the sums plugins need.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    /// None while the cache has Pods for a node it has not seen (yet, or any more).
    pub node: Option<Arc<Node>>,
    pub pods: Vec<PodInfo>,
    /// Indexes into `pods` of those with any pod (anti-)affinity term.
    pub pods_with_affinity: Vec<usize>,
    /// Indexes into `pods` of those with required anti-affinity terms.
    pub pods_with_required_anti_affinity: Vec<usize>,
    pub allocatable: Resource,
    /// Sum of the Pods' [`PodInfo::requests`].
    pub requested: Resource,
    /// Sum of the Pods' non-zero CPU / memory.
    pub non_zero_requested: Resource,
    pub used_ports: Vec<HostPort>,
    /// Images on the node (from `status.images`): name -> (size in bytes, number of nodes that
    /// have it, filled in by the snapshot).
    pub image_states: HashMap<String, ImageState>,
    /// Bumped on every change; the snapshot copies only nodes whose generation moved.
    pub generation: u64,
}

/// One image on a node, with how many nodes in the snapshot have it (ImageLocality's spread).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageState {
    pub size: i64,
    pub num_nodes: usize,
}

impl NodeInfo {
    /// A node with no Pods.
    pub fn new(node: Arc<Node>) -> NodeInfo {
        let mut info = NodeInfo::default();
        info.set_node(node);
        info
    }

    pub fn name(&self) -> &str {
        self.node
            .as_ref()
            .and_then(|n| n.metadata.name.as_deref())
            .unwrap_or_default()
    }

    /// Replaces the node object (allocatable and images are re-read).
    pub fn set_node(&mut self, node: Arc<Node>) {
        let status = node.status.as_ref();
        self.allocatable = Resource::from_list(status.and_then(|s| s.allocatable.as_ref()));
        self.image_states = status
            .and_then(|s| s.images.as_ref())
            .into_iter()
            .flatten()
            .flat_map(|img| {
                let size = img.size_bytes.unwrap_or(0);
                img.names
                    .iter()
                    .flatten()
                    .map(move |n| (n.clone(), ImageState { size, num_nodes: 0 }))
            })
            .collect();
        self.node = Some(node);
        self.generation += 1;
    }

    pub fn add_pod(&mut self, info: PodInfo) {
        self.requested.add(&info.requests);
        self.non_zero_requested.milli_cpu += info.non_zero_cpu;
        self.non_zero_requested.memory += info.non_zero_memory;
        self.used_ports.extend(host_ports(&info.pod));
        let i = self.pods.len();
        if info.has_affinity {
            self.pods_with_affinity.push(i);
        }
        if info.has_required_anti_affinity {
            self.pods_with_required_anti_affinity.push(i);
        }
        self.pods.push(info);
        self.generation += 1;
    }

    /// Removes the Pod with this UID; false when it is not on the node.
    pub fn remove_pod(&mut self, uid: &str) -> bool {
        let Some(i) = self.pods.iter().position(|p| p.uid() == uid) else {
            return false;
        };
        let info = self.pods.swap_remove(i);
        self.requested.sub(&info.requests);
        self.non_zero_requested.milli_cpu -= info.non_zero_cpu;
        self.non_zero_requested.memory -= info.non_zero_memory;
        for port in host_ports(&info.pod) {
            if let Some(j) = self.used_ports.iter().position(|p| *p == port) {
                self.used_ports.swap_remove(j);
            }
        }
        self.reindex();
        self.generation += 1;
        true
    }

    fn reindex(&mut self) {
        self.pods_with_affinity.clear();
        self.pods_with_required_anti_affinity.clear();
        for (i, p) in self.pods.iter().enumerate() {
            if p.has_affinity {
                self.pods_with_affinity.push(i);
            }
            if p.has_required_anti_affinity {
                self.pods_with_required_anti_affinity.push(i);
            }
        }
    }
}

/// The cycle's view of the cluster: every node (in the order the scheduler walks them) and the
/// labels of every namespace (for affinity terms with a namespaceSelector). Immutable during a
/// cycle; the scheduler cache produces a new one (sharing unchanged nodes) before each.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub nodes: Vec<Arc<NodeInfo>>,
    pub index: HashMap<String, usize>,
    /// Indexes into `nodes` of those with at least one Pod with affinity terms.
    pub have_pods_with_affinity: Vec<usize>,
    /// Indexes into `nodes` of those with at least one Pod with required anti-affinity.
    pub have_pods_with_required_anti_affinity: Vec<usize>,
    pub namespace_labels: HashMap<String, BTreeMap<String, String>>,
}

impl Snapshot {
    /// A snapshot of these nodes (tests and the cache): indexes and image spread computed.
    pub fn new(
        nodes: Vec<NodeInfo>,
        namespace_labels: HashMap<String, BTreeMap<String, String>>,
    ) -> Snapshot {
        let mut image_nodes: HashMap<String, usize> = HashMap::new();
        for n in &nodes {
            for name in n.image_states.keys() {
                *image_nodes.entry(name.clone()).or_default() += 1;
            }
        }
        let nodes: Vec<Arc<NodeInfo>> = nodes
            .into_iter()
            .map(|mut n| {
                for (name, st) in n.image_states.iter_mut() {
                    st.num_nodes = image_nodes.get(name).copied().unwrap_or(0);
                }
                Arc::new(n)
            })
            .collect();
        Snapshot::from_arcs(nodes, namespace_labels)
    }

    /// As [`Snapshot::new`] for nodes already shared (image spread as they carry it).
    pub fn from_arcs(
        nodes: Vec<Arc<NodeInfo>>,
        namespace_labels: HashMap<String, BTreeMap<String, String>>,
    ) -> Snapshot {
        let index = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name().to_string(), i))
            .collect();
        let have_pods_with_affinity = (0..nodes.len())
            .filter(|&i| !nodes[i].pods_with_affinity.is_empty())
            .collect();
        let have_pods_with_required_anti_affinity = (0..nodes.len())
            .filter(|&i| !nodes[i].pods_with_required_anti_affinity.is_empty())
            .collect();
        Snapshot {
            nodes,
            index,
            have_pods_with_affinity,
            have_pods_with_required_anti_affinity,
            namespace_labels,
        }
    }

    pub fn get(&self, node: &str) -> Option<&Arc<NodeInfo>> {
        self.index.get(node).map(|&i| &self.nodes[i])
    }
}

/// The host ports a Pod's containers ask for (hostPort > 0), as kube-scheduler's NodePorts counts
/// them (init containers with restartPolicy Always included).
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    long_running(&spec.containers, spec.init_containers.as_ref())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|&hp| hp > 0)?;
            let ip = match p.host_ip.as_deref() {
                None | Some("") => "0.0.0.0".to_string(),
                Some(ip) => ip.to_string(),
            };
            Some(HostPort {
                ip,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                port,
            })
        })
        .collect()
}

fn container_requests(c: &Container, non_zero: bool) -> Resource {
    let mut r = Resource::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
    if non_zero {
        let reqs = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        if !reqs.is_some_and(|l| l.contains_key(CPU)) {
            r.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
        }
        if !reqs.is_some_and(|l| l.contains_key(MEMORY)) {
            r.memory = DEFAULT_MEMORY_REQUEST;
        }
    }
    r
}

/// What a Pod requests, as kube-scheduler v1.34 computes it: the sum of its containers, at least
/// the largest init container (each counted with the restartable init containers started before
/// it), plus restartable init containers (sidecars), plus `spec.overhead`; pod-level
/// `spec.resources.requests` (PodLevelResources, beta and on in v1.34) replace the CPU / memory
/// they name. With `non_zero`, containers that request no CPU / memory count the defaults.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resource {
    let Some(spec) = pod.spec.as_ref() else {
        return Resource::default();
    };
    let mut reqs = Resource::default();
    for c in &spec.containers {
        reqs.add(&container_requests(c, non_zero));
    }
    let mut sidecars = Resource::default();
    let mut init_max = Resource::default();
    for c in spec.init_containers.iter().flatten() {
        let creq = container_requests(c, non_zero);
        let effective = if c.restart_policy.as_deref() == Some("Always") {
            reqs.add(&creq);
            sidecars.add(&creq);
            sidecars.clone()
        } else {
            let mut tmp = creq;
            tmp.add(&sidecars);
            tmp
        };
        init_max.max_with(&effective);
    }
    reqs.max_with(&init_max);
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        if let Some(q) = pod_level.get(CPU) {
            reqs.milli_cpu = parse_milli(&q.0).unwrap_or(reqs.milli_cpu);
        }
        if let Some(q) = pod_level.get(MEMORY) {
            reqs.memory = parse_value(&q.0).unwrap_or(reqs.memory);
        }
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        reqs.add(&Resource::from_list(Some(overhead)));
    }
    reqs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn pod_requests_count_init_containers_sidecars_and_overhead() {
        let p = pod(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m"}}}
            ],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}},
                {"name": "init", "resources": {"requests": {"cpu": "1", "memory": "10Mi"}}}
            ],
            "overhead": {"cpu": "10m"}
        }));
        let r = pod_requests(&p, false);
        // containers 300m + sidecar 50m = 350m; init 1000m + sidecar 50m = 1050m is larger.
        assert_eq!(r.milli_cpu, 1050 + 10);
        assert_eq!(r.memory, 100 << 20);
        let nz = pod_requests(&p, true);
        // b has no memory request: counts 200 MiB; the sidecar has none either.
        assert_eq!(nz.memory, (100 << 20) + 2 * DEFAULT_MEMORY_REQUEST);
    }

    #[test]
    fn node_info_sums_follow_adds_and_removes() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}
        }))
        .unwrap();
        let mut info = NodeInfo::new(Arc::new(node));
        assert_eq!(info.allocatable.milli_cpu, 4000);
        assert_eq!(info.allocatable.allowed_pod_number, 110);
        let p = pod(
            json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080}],
            "resources": {"requests": {"cpu": "250m"}}}]}),
        );
        info.add_pod(PodInfo::new(Arc::new(p)));
        assert_eq!(info.requested.milli_cpu, 250);
        assert_eq!(info.non_zero_requested.memory, DEFAULT_MEMORY_REQUEST);
        assert_eq!(info.used_ports.len(), 1);
        assert!(info.remove_pod("u"));
        assert_eq!(info.requested, Resource::default());
        assert!(info.used_ports.is_empty());
        assert!(!info.remove_pod("u"));
    }
}
