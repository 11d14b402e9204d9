//! The proxy library's error types.

use std::path::PathBuf;

/// An object (or part of one) that could not be used, with where and why.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{}{kind} {object}: {field}: {message}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
pub struct InvalidObject {
    /// The manifest file the object came from, when it came from a file.
    pub file: Option<PathBuf>,
    /// `Service`, `EndpointSlice`, or `document` for something unparseable.
    pub kind: String,
    /// `namespace/name`, or `#N` (document index) when the name is unknown.
    pub object: String,
    /// The field path, e.g. `spec.ports[1].port`.
    pub field: String,
    pub message: String,
}

/// Errors of a dataplane backend.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("{command} failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{backend} backend does not support {feature}")]
    Unsupported {
        backend: &'static str,
        feature: String,
    },
    #[error("{map} is full ({capacity} entries): {object} was not programmed")]
    MapFull {
        map: String,
        capacity: u32,
        object: String,
    },
    #[error("kernel feature missing: {0}")]
    MissingKernelFeature(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A `--backend` value that names no backend.
    #[error("unknown backend {0:?}: the backends are userspace, nftables, iptables and ebpf")]
    UnknownBackend(String),
    /// A flag's value the backend cannot use.
    #[error("{flag}: {detail}")]
    InvalidFlag { flag: &'static str, detail: String },
    /// A tool the backend runs is missing or does not work (the agent may try another backend).
    #[error("{tool} is not usable: {detail}")]
    ToolUnavailable { tool: String, detail: String },
    #[error("{0}")]
    Other(String),
}

impl DataplaneError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DataplaneError::Io {
            context: context.into(),
            source,
        }
    }
}
