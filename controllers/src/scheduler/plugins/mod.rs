//! The default plugins, one module each, as kube-scheduler v1.34 registers them. Every plugin is
//! pure over the [`Snapshot`](super::framework::Snapshot) and the Pod: no I/O, no clocks.

pub mod helper;
pub mod node_unschedulable;
pub mod node_name;
pub mod taint_toleration;
pub mod node_affinity;
pub mod node_ports;
pub mod node_resources_fit;
pub mod balanced_allocation;
pub mod image_locality;
pub mod volume_restrictions;
pub mod pod_topology_spread;
pub mod inter_pod_affinity;
pub mod default_preemption;
