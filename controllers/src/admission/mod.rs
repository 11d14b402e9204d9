//! kube-controller-manager's admissionregistration.k8s.io controllers:
//! [`validatingadmissionpolicystatus`] (the `validatingadmissionpolicy-status-controller`).
//!
//! Each is a pure plan over cached state plus a thin apply layer on the shared
//! [`crate::runtime`]; none imports a sibling (the layers test keeps it so).

pub mod validatingadmissionpolicystatus;
