//! The default plugins, one module each, as kube-scheduler v1.34 registers them. Every plugin is
//! pure over the [`Snapshot`](super::framework::Snapshot) and the Pod: no I/O, no clocks.

pub mod balanced_allocation;
pub mod default_preemption;
pub mod helper;
pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod pod_topology_spread;
pub mod taint_toleration;
pub mod volume_restrictions;
// The runtime's own: queue sort, gates, the binder (the one plugin that calls the API) and the
// guard for Pods whose volumes / claims need plugins this scheduler does not build.
pub mod default_binder;
pub mod priority_sort;
pub mod scheduling_gates;
pub mod unsupported_volumes;
