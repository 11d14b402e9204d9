//! kube-controller-manager's dynamic resource allocation controllers (upstream's
//! `pkg/controller/resourceclaim`), each a module of its own on the shared [`crate::runtime`]:
//!
//! - [`resourceclaim`]: `resourceclaim-controller`, the ResourceClaims Pods' templates call for,
//!   their reservations and their clean-up.
//!
//! What they do and how they differ from upstream is in docs/WORKLOADS.md.

pub mod resourceclaim;
