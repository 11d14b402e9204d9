//! kube-controller-manager's networking.k8s.io controllers: [`servicecidrs`] (the
//! `service-cidr-controller`: the ServiceCIDR finalizer and Ready condition).
//!
//! Each is a pure plan over cached state plus a thin apply layer on the shared
//! [`crate::runtime`]; none imports a sibling (the layers test keeps it so).

pub mod servicecidrs;
