//! Integration test harness for kpr: real network namespaces joined by veth pairs, in-process echo
//! servers and clients, manifest builders, and a guard that runs the `proxy` agent inside a node
//! namespace.
//!
//! Owns: every namespace, temp directory and process it creates, and removes them all in `Drop`
//! (also when a test panics). It never touches the machine's own network namespace.
//!
//! ```no_run
//! use std::time::Duration;
//! use kpr_tests::{tcp_request, yaml, Agent, AgentOptions, Cluster, ClusterSpec, EndpointSlice, Service};
//!
//! let cluster = Cluster::new(ClusterSpec::pods(2))?; // node, client, podclient, pod0, pod1
//! let svc = Service::new("web").cluster_ip("10.96.0.10").tcp(80, 8080).named("http");
//! let slice = EndpointSlice::for_service(&svc).ready_all(cluster.pod_ips());
//! let files = [("web.yaml", yaml(&[&svc, &slice]))];
//! let agent = Agent::start(&cluster.node, &AgentOptions::backend("nftables"), &files)?;
//! let reply = tcp_request(&cluster.client, "10.96.0.10:80".parse()?, Duration::from_secs(2))?;
//! println!("{} answered, and saw the client as {}", reply.pod, reply.peer);
//! let state = agent.state()?; // GET /state
//! assert!(state.service("default/web:http/TCP").is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Modules: [`netns`] (one namespace), [`cluster`] (the topology and addresses), [`echo`] (the
//! pods' servers), [`client`] (in-process clients), [`probe`] (clients as processes), [`cgroup`]
//! (a test cgroup for the eBPF backend), [`manifest`] (Service and EndpointSlice builders),
//! [`agent`] (the `proxy run` guard and `/state`).

pub mod agent;
pub mod cgroup;
pub mod client;
pub mod cluster;
pub mod conformance;
pub mod echo;
pub mod manifest;
pub mod netns;
pub mod probe;
pub mod remote;

pub use agent::{proxy_stdout, Agent, AgentOptions, EndpointState, ServiceState, State};
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

/// Unit tests inside a library that need root (a network namespace, netfilter, eBPF): written
/// inside `kpr_tests::needs_root! { ... }` (a crate with kpr-tests as a dependency; kpr-tests
/// itself uses `#[cfg_attr(not(feature = "root"), ignore = ...)]`), they run when the
/// `kpr-tests/root` test gate is open (`cargo xtask test`) and are ignored, with that reason,
/// in a plain `cargo test`. Test targets that need root require the gate instead
/// (`required-features`). README, "The two commands".
#[cfg(feature = "root")]
#[macro_export]
macro_rules! needs_root {
    ($($(#[$meta:meta])* fn $name:ident() $body:block)*) => {
        $($(#[$meta])* fn $name() $body)*
    };
}

/// Unit tests that need root, ignored: the `kpr-tests/root` test gate is closed (see the other
/// definition).
#[cfg(not(feature = "root"))]
#[macro_export]
macro_rules! needs_root {
    ($($(#[$meta:meta])* fn $name:ident() $body:block)*) => {
        $(
            $(#[$meta])*
            #[ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"]
            fn $name() $body
        )*
    };
}
