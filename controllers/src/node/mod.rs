//! kube-controller-manager's controllers acting on what Nodes say about the Pods bound to them:
//! [`tainteviction`] (the NoExecute taint manager) and [`ttl`] (the object cache TTL annotation
//! kubelets read, from the cluster's size).
//!
//! Each is a pure plan over cached state plus a thin apply layer on the shared
//! [`crate::runtime`]; none imports a sibling (the layers test keeps it so).

pub mod tainteviction;
pub mod ttl;
