//! kube-controller-manager's workload controllers: [`replicaset`] (with the ReplicationController
//! controller, [`replicaset::replication`]), [`deployment`], [`statefulset`], [`daemonset`],
//! [`job`], [`cronjob`], [`ttlafterfinished`], [`podgc`], [`disruption`] (PodDisruptionBudget
//! status) and the [`garbagecollector`].
//!
//! Each is a pure plan over cached state plus a thin apply layer on the shared
//! [`crate::runtime`]; none imports a sibling (the layers test keeps it so): what two of them share
//! lives in [`crate::runtime`] or [`crate::helpers`].

pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod garbagecollector;
pub mod job;
pub mod podgc;
pub mod replicaset;
pub mod statefulset;
pub mod ttlafterfinished;
