//! kube-controller-manager's controllers giving every namespace what its Pods need to reach the
//! API server (SIG Auth's part of the controller manager): [`serviceaccount`] (the `default`
//! ServiceAccount) and [`rootcacertpublisher`] (the `kube-root-ca.crt` ConfigMap the API server's
//! projected token volumes read the CA from).
//!
//! Each is a small controller on the shared [`crate::runtime`]; none imports a sibling (the
//! layers test keeps it so).

pub mod rootcacertpublisher;
pub mod serviceaccount;
