//! kube-controller-manager's controllers giving every namespace what its Pods need to reach the
//! API server (SIG Auth's part of the controller manager): [`serviceaccount`] (the `default`
//! ServiceAccount) and [`rootcacertpublisher`] (the `kube-root-ca.crt` ConfigMap the API server's
//! projected token volumes read the CA from) and [`clusterroleaggregation`] (the rules of
//! aggregated ClusterRoles such as `admin`, `edit` and `view`), and the CertificateSigningRequest
//! controllers kubelets get their certificates through: [`csrapproving`], [`csrsigning`] and
//! [`csrcleaner`]; the bootstrap token controllers [`bootstrapsigner`] and [`tokencleaner`];
//! and the legacy (Secret) service-account token controllers [`serviceaccounttoken`] and
//! [`legacytokencleaner`].
//!
//! Each is a small controller on the shared [`crate::runtime`]; none imports a sibling (the
//! layers test keeps it so).

pub mod bootstrapsigner;
pub mod clusterroleaggregation;
pub mod csrapproving;
pub mod csrcleaner;
pub mod csrsigning;
pub mod legacytokencleaner;
pub mod rootcacertpublisher;
pub mod serviceaccount;
pub mod serviceaccounttoken;
pub mod tokencleaner;
