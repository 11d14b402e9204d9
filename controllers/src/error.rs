//! The controllers crate's error type.

/// Errors of the control plane. Messages name the object and the field involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action} {object}: {source}")]
    Kube {
        /// What was being done ("creating EndpointSlice", ...).
        action: &'static str,
        /// `namespace/name` of the object.
        object: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// An object lacks a field the controller needs.
    #[error("{kind} {object}: field {field} is missing")]
    MissingField {
        /// Kind of the object.
        kind: &'static str,
        /// `namespace/name`.
        object: String,
        /// The dotted field path.
        field: &'static str,
    },
    /// The LoadBalancer pool could not be parsed or is exhausted.
    #[error("LoadBalancer pool {pool}: {reason}")]
    Pool {
        /// The pool as configured.
        pool: String,
        /// What is wrong.
        reason: String,
    },
    /// Leadership was lost while controllers were running.
    #[error("leader election lease {lease}: {reason}")]
    Leadership {
        /// `namespace/name` of the Lease.
        lease: String,
        /// What happened.
        reason: String,
    },
    /// A controller name given on the command line is unknown.
    #[error("controller {0:?} is unknown: expected endpointslice, endpoints or lb-ipam")]
    UnknownController(String),
}

impl Error {
    /// Wraps a kube error with the action and object it concerned.
    pub fn kube(action: &'static str, object: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action,
            object: object.into(),
            source: Box::new(source),
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
