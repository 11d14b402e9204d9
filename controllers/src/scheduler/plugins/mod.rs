//! The default plugins, one module each, as kube-scheduler v1.34 registers them. Every plugin is
//! pure over the [`Snapshot`](super::framework::Snapshot), the Pod and the cluster objects it
//! reads (no I/O, no clocks), except at PreBind / Bind (VolumeBinding, DefaultBinder).

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
pub mod node_volume_limits;
pub mod pod_topology_spread;
pub mod taint_toleration;
pub mod volume_binding;
pub mod volume_restrictions;
pub mod volume_util;
pub mod volume_zone;
// The runtime's own: queue sort, gates, the binder (with VolumeBinding's PreBind, the plugins
// that call the API) and the guard for Pods whose resource claims need DynamicResources, which
// this scheduler does not build.
pub mod default_binder;
pub mod priority_sort;
pub mod scheduling_gates;
pub mod unsupported_resource_claims;
