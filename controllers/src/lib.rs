//! The control plane around the proxy, following kube-controller-manager's and kube-scheduler's
//! algorithms, laid out by layer:
//!
//! - [`runtime`]: the machinery every controller runs on (shared informers and their indexed
//!   caches, the rate-limited work queue and workers, expectations, pod control, Events, the
//!   controller-ref manager, ControllerRevision history, leader election, the client rate limit);
//! - [`helpers`]: small pure Kubernetes helpers (selectors, owner references, int-or-percent, Pod
//!   readiness, node affinity and taints, hashing, a clock), as apimachinery and component-helpers;
//! - [`endpoint`]: the controllers that feed the proxy (EndpointSlice, Endpoints, LoadBalancer IPAM);
//! - [`workload`]: ReplicaSet (and ReplicationController on the same base), Deployment,
//!   StatefulSet, DaemonSet, Job, CronJob, ttl-after-finished, the Pod garbage collector and the
//!   garbage collector;
//! - [`auth`]: what every namespace gets for its Pods to reach the API server (the `default`
//!   ServiceAccount, the `kube-root-ca.crt` ConfigMap);
//! - [`node`]: what Nodes decide for the Pods bound to them (NoExecute taint eviction);
//! - [`quota`]: ResourceQuota usage (the resourcequota controller);
//! - [`dra`]: dynamic resource allocation (the resourceclaim controller);
//! - [`manager`]: the descriptor table of controllers and the `controller-manager` that runs the
//!   selected ones;
//! - [`scheduler`]: kube-scheduler's framework and default plugins, run by the `scheduler` binary.
//!
//! Every controller has the same split: a pure plan over cached state (unit-tested) and a thin layer
//! applying it through kube-rs. Layers point downward (controllers -> runtime -> helpers); no
//! controller imports a sibling; `controllers/tests/layers.rs` keeps it so.

pub mod admission;
pub mod auth;
pub mod autoscaling;
pub mod dra;
pub mod endpoint;
pub mod error;
pub mod helpers;
pub mod manager;
pub mod namespace;
pub mod networking;
pub mod node;
pub mod quota;
pub mod runtime;
pub mod scheduler;
pub mod volume;
pub mod workload;

pub use error::{Error, Result};
