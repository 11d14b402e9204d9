//! The controllers that feed the proxy: EndpointSlices ([`endpointslice`]) and legacy Endpoints
//! ([`endpoints`]) from Services and Pods, and LoadBalancer address allocation ([`lbipam`]).
//!
//! Each is a pure plan over cached state plus a thin apply layer, run on the shared
//! [`crate::runtime`]. They import no workload controller and no sibling of their own group except
//! through [`endpointutil`], what upstream keeps in `pkg/controller/util/endpoint`.

pub mod endpoints;
pub mod endpointslice;
pub mod endpointutil;
pub mod inputs;
pub mod lbipam;
