//! Small, pure Kubernetes helpers that every controller and the scheduler may use, as upstream keeps
//! them in apimachinery and component-helpers: label selectors, owner references, int-or-percent,
//! Pod readiness and phase, CertificateSigningRequests, node affinity and taint matching, hashing, resource quantities, a
//! clock, a Pod's long-running containers, group/version/resources and the aggregated discovery
//! documents.
//!
//! No I/O, no caches, no controller: every function takes the objects it needs. The runtime and
//! every controller may import this module; it imports neither (the layers test keeps it so).

pub mod bootstraptoken;
pub mod clock;
pub mod containers;
pub mod csr;
pub mod discovery;
pub mod duration;
pub mod hash;
pub mod intstr;
pub mod job;
pub mod meta;
pub mod nodeaffinity;
pub mod quantity;
pub mod selector;
pub mod taints;
