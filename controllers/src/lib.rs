//! The control plane around the proxy: the EndpointSlice controller, the legacy Endpoints
//! controller, the LoadBalancer IP allocator, the workload controllers (ReplicaSet, Deployment,
//! garbage collector, StatefulSet, DaemonSet, Job, CronJob, ttl-after-finished, with the
//! ControllerRevision [`history`] StatefulSet and DaemonSet share), Lease-based leader election
//! and the `controller-manager` that runs them, following kube-controller-manager's algorithms;
//! and the [`scheduler`] (kube-scheduler's framework and default plugins) run by the `scheduler`
//! binary.
//!
//! Every controller has the same split: pure planning functions over cached state (unit-tested, in
//! `plan` modules or `podutil`) and a thin layer applying the plan through kube-rs. The workload
//! controllers share one runtime ([`runtime`]): one watch per resource kind, indexed caches, a
//! rate-limited work queue with N workers, expectations, slow-start batches and the controller-ref
//! manager.

pub mod cache;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod endpoints;
pub mod endpointslice;
pub mod error;
pub mod garbagecollector;
pub mod history;
pub mod inputs;
pub mod job;
pub mod lbipam;
pub mod leader;
pub mod manager;
pub mod podutil;
pub mod process;
pub mod ratelimit;
pub mod replicaset;
pub mod runtime;
pub mod scheduler;
pub mod selector;
pub mod statefulset;

pub use error::{Error, Result};
