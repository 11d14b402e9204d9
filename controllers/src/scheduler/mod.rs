//! The scheduler: kube-scheduler's scheduling framework (extension points as traits, a cache of
//! nodes with assumed Pods, a scheduling queue) and its default plugins, run by the `scheduler`
//! binary as a drop-in for kube-scheduler.
//!
//! Owns Pod placement only: it binds Pods whose `schedulerName` is one of its profiles and never
//! writes any other object except the Pod's PodScheduled condition, Events and (for preemption) the
//! victims' deletion and the preemptor's `status.nominatedNodeName`.

pub mod cache;
pub mod config;
pub mod framework;
pub mod framework_runner;
pub mod metrics;
pub mod plugins;
pub mod queue;
pub mod registry;
pub mod run;
