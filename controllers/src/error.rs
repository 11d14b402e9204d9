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
    /// A controller was selected without a setting it cannot run without (the flag is named).
    #[error("controller {controller} needs {flag}: {what}")]
    MissingSetting {
        /// The controller's name.
        controller: &'static str,
        /// The command-line flag that gives the setting.
        flag: &'static str,
        /// What the setting is.
        what: &'static str,
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
    #[error("controller {name:?} is unknown: expected one of {known}")]
    UnknownController {
        /// The name given.
        name: String,
        /// The names the manager knows, comma-separated.
        known: String,
    },
    /// A controller could not start or stopped.
    #[error("controller {name}: {source}")]
    Controller {
        /// The controller's `--controllers` name.
        name: &'static str,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// An owner may not adopt (it is gone, re-created or being deleted).
    #[error("{owner} may not adopt: {reason}")]
    Adoption {
        /// `Kind name` of the owner.
        owner: String,
        /// Why not.
        reason: String,
    },
    /// An object is invalid for its controller (the field is named in the message).
    #[error("{object}: {reason}")]
    Invalid {
        /// `Kind ns/name`.
        object: String,
        /// What is wrong, naming the field.
        reason: String,
    },
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
