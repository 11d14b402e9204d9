//! The scheduler: kube-scheduler's scheduling framework (extension points as traits, a cache of
//! nodes with assumed Pods, a scheduling queue) and its default plugins, run by the `scheduler`
//! binary as a drop-in for kube-scheduler.
//!
//! Owns Pod placement only: it binds Pods whose `schedulerName` is one of its profiles and never
//! writes any other object except the Pod's PodScheduled condition, Events and (for preemption) the
//! victims' deletion and the preemptor's `status.nominatedNodeName`.
//!
//! Files follow kube-scheduler's (pkg/scheduler): [`scheduler`] (scheduler.go),
//! [`eventhandlers`], [`schedule_one`], [`preemption`] (the API side of
//! framework/preemption), [`framework`] (the plugin contract) with [`framework::runtime`]
//! (framework/runtime), [`plugins`], [`queue`] and [`cache`] (backend/), [`config`] and
//! [`plugin_args`] (apis/config: the file, the typed plugin args with their defaults and
//! validation) and [`registry`] (the in-tree registry). docs/SCHEDULER.md draws the data flow.

pub mod cache;
pub mod config;
pub mod eventhandlers;
pub mod framework;
pub mod metrics;
pub mod plugin_args;
pub mod plugins;
pub mod preemption;
pub mod queue;
pub mod registry;
pub mod schedule_one;
// Named as upstream's pkg/scheduler/scheduler.go, which a reader of kube-scheduler looks for.
#[allow(clippy::module_inception)]
pub mod scheduler;
