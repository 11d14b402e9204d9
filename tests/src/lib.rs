//! Integration test harness for kpr: real network namespaces joined by veth pairs, in-process echo
//! servers and clients, manifest builders, and a guard that runs the `proxy` agent inside a node
//! namespace.
//!
//! Owns: every namespace, temp directory and process it creates, and removes them all in `Drop`
//! (also when a test panics). It never touches the machine's own network namespace.

pub mod agent;
pub mod cgroup;
pub mod client;
pub mod cluster;
pub mod echo;
pub mod manifest;
pub mod netns;
pub mod probe;

pub use agent::{Agent, AgentOptions, EndpointState, ServiceState, State};
pub use cgroup::Cgroup;
pub use client::{
    http_get, tcp_hold, tcp_request, udp_request, udp_session, ClientError, HeldConn, Reply,
    UdpSession,
};
pub use cluster::{Cluster, ClusterSpec, Pod, Topology};
pub use echo::EchoServer;
pub use manifest::{yaml, Endpoint, EndpointSlice, Manifest, Service};
pub use netns::Netns;
pub use probe::{probe_command, run_probe, ProbeLine, ProbeOutput};

/// A failure of the harness itself (not of the system under test).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("command `{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("entering netns {netns}: {message}")]
    Setns { netns: String, message: String },
    #[error("agent: {0}")]
    Agent(String),
}
