//! The control plane that feeds the proxy: the EndpointSlice controller, the legacy Endpoints
//! controller, the LoadBalancer IP allocator, Lease-based leader election and the
//! `controller-manager` that runs them. Workload controllers grow here later, following
//! kube-controller-manager's algorithms.
//!
//! Every controller has the same split: pure planning functions (unit-tested, in `plan` modules or
//! `podutil`) and a thin layer applying the plan through kube-rs.

pub mod cache;
pub mod endpoints;
pub mod endpointslice;
pub mod error;
pub mod inputs;
pub mod lbipam;
pub mod leader;
pub mod manager;
pub mod podutil;

pub use error::{Error, Result};
