//! The controllers that feed the proxy: EndpointSlices ([`endpointslice`]) and legacy Endpoints
//! ([`endpoints`]) from Services and Pods, EndpointSlices mirroring custom Endpoints
//! ([`endpointslicemirroring`]), and LoadBalancer address allocation ([`lbipam`]).
//!
//! Each is a pure plan over cached state plus a thin apply layer, run on the shared
//! [`crate::runtime`] as the workload controllers are: handlers on the process's shared informers
//! (one Service, Pod, Node, EndpointSlice and Endpoints cache each, whatever runs) turn changes into
//! Service keys on the controller's work queue, and workers sync one Service at a time. They
//! import no workload controller and no sibling of their own group except through
//! [`endpointutil`] (what upstream keeps in `pkg/controller/util/endpoint`) and [`membership`]
//! (which Pods a Service selects, which Services select a Pod).

pub mod endpoints;
pub mod endpointslice;
pub mod endpointslicemirroring;
pub mod endpointutil;
pub mod lbipam;
pub mod membership;
