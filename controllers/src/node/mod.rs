//! kube-controller-manager's controllers acting on Nodes and what they say about the Pods bound
//! to them: [`lifecycle`] (Node health from heartbeats and Leases, the condition taints, Pods
//! marked not Ready), [`ipam`] (pod CIDRs for Nodes), [`tainteviction`] (the NoExecute taint
//! manager) and [`ttl`] (the object cache TTL annotation kubelets read, from the cluster's size).
//!
//! Each is a pure plan over cached state plus a thin apply layer on the shared
//! [`crate::runtime`]; none imports a sibling (the layers test keeps it so).

pub mod ipam;
pub mod lifecycle;
pub mod tainteviction;
pub mod ttl;
