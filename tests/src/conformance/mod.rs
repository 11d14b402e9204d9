//! The conformance suite: ONE table of scenarios ([`scenarios::all`]) that runs unchanged against
//! every backend (userspace, nftables, iptables-nft, iptables-legacy, ebpf) through the real agent
//! (`proxy run`) in a fresh [`Cluster`] of network namespaces. A scenario is Services +
//! EndpointSlices plus steps: connections from a pod (`podclient`), the node itself, an endpoint
//! pod, or an external client (`client`), each with the expected outcome: which endpoints answer,
//! reject (RST/ICMP), drop (silence), and whether the endpoint saw the client's own address or the
//! node's (masquerade). `tests/tests/conformance.rs` generates one test per (backend, scenario),
//! named `<backend>::<scenario>`.
//!
//! For the eBPF backend, pod and node clients are processes inside the test cgroup the agent's
//! socket programs attach to (as on a real node where the programs sit on the root cgroup);
//! external clients are outside it and go through the tc program.
//!
//! Exceptions ([`exceptions::EXCEPTIONS`]) are `(backend, scenario, reason, what instead)`. They
//! are never skipped: the test either asserts the documented alternative outcome for one step, or,
//! when there is no meaningful alternative, runs the scenario and passes only if it indeed fails
//! (so a fixed backend forces the list to be updated). The list today:
//!
//! - userspace, every scenario: the endpoint sees a node address (the proxy opens its own
//!   connection), so every "client address preserved" expectation becomes "masqueraded";
//! - userspace, `external_traffic_local_none_here_drops` and `load_balancer_source_range_denies`:
//!   accepted then closed (EOF) instead of a dropped SYN;
//! - ebpf, `drop_unallocated_service_address`, `internal_traffic_local_none_here_drops`,
//!   `other_service_proxy_name_is_ignored`: a local connect() fails with EPERM instead of a drop;
//! - ebpf, `hairpin_is_masqueraded`: the pod is connected straight to itself (no NAT at all);
//! - ebpf on kernels without `bpf_sock_destroy` (before 6.5), `udp_flow_leaves_a_removed_endpoint`:
//!   a connected UDP socket keeps the endpoint it got at connect() until it reconnects;
//! - userspace and ebpf, `sctp`: not served (SCTP is not proxied / not translated).
//!
//! The SCTP rows need SCTP in the kernel: their tests are `#[ignore]`d and `cargo xtask vm`
//! runs them in the Debian kernels (`--include-ignored`); on a kernel without SCTP they fail.

pub mod exceptions;
pub mod family;
mod rig;
pub mod scenarios;
pub mod trace;

use std::fmt;

pub use exceptions::{Exception, Instead, EXCEPTIONS};
pub use family::Family;
pub use rig::Rig;

/// A backend under test: the agent's `--backend` (and `--iptables-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Userspace,
    Nftables,
    IptablesNft,
    IptablesLegacy,
    Ebpf,
}

impl Backend {
    /// The name tests and the exception list use (also the test module name).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Userspace => "userspace",
            Backend::Nftables => "nftables",
            Backend::IptablesNft => "iptables_nft",
            Backend::IptablesLegacy => "iptables_legacy",
            Backend::Ebpf => "ebpf",
        }
    }

    /// `proxy run` flags selecting this backend.
    pub fn agent_args(self) -> Vec<&'static str> {
        match self {
            Backend::Userspace => vec!["userspace"],
            Backend::Nftables => vec!["nftables"],
            Backend::IptablesNft => vec!["iptables", "--iptables-mode", "nft"],
            Backend::IptablesLegacy => vec!["iptables", "--iptables-mode", "legacy"],
            Backend::Ebpf => vec!["ebpf"],
        }
    }
}

impl Backend {
    /// `proxy trace` flags reading this backend's state.
    pub fn trace_args(self) -> Vec<&'static str> {
        match self {
            Backend::Userspace => vec!["--backend", "userspace"],
            Backend::Nftables => vec!["--backend", "nftables"],
            Backend::IptablesNft => vec!["--backend", "iptables", "--iptables-mode", "nft"],
            Backend::IptablesLegacy => vec!["--backend", "iptables", "--iptables-mode", "legacy"],
            Backend::Ebpf => vec!["--backend", "ebpf"],
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a connection starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// The `podclient` namespace: a pod source that is not an endpoint.
    Pod,
    /// The node namespace itself.
    Node,
    /// The `client` namespace: an external source (192.0.2.100).
    External,
    /// Endpoint pod `i` (hairpin when it reaches itself).
    Endpoint(usize),
}

/// What the endpoint must see as the connection's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    /// The client's own address.
    Preserved,
    /// One of the node's addresses (masqueraded).
    Masqueraded,
    /// Not checked.
    Any,
}

/// The expected outcome of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Every request answered by one of `pods`; with `all_seen`, by each of them at least once.
    Served {
        pods: &'static [&'static str],
        all_seen: bool,
        src: Src,
    },
    /// Every request answered; each of `pods` answers count/len (+-1) of them.
    Exact(&'static [&'static str]),
    /// Every request answered by one of `pods`, each answering between `min` and `max` of them
    /// (how even a balancer stays when it is not paced).
    Spread {
        pods: &'static [&'static str],
        min: usize,
        max: usize,
    },
    /// Every request answered, all by one endpoint.
    Sticky,
    /// Actively rejected (refused, reset or unreachable), never answered.
    Reject,
    /// Silently dropped: every request times out.
    Drop,
    /// Not answered by any endpoint (rejected or dropped, either is fine).
    NotServed,
    /// Every request fails with this error (probe's `error <kind>` text, prefix match); for
    /// documented exceptions only.
    Error(&'static str),
}

/// The protocol of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    /// Needs SCTP in the kernel (see [`needs_sctp`]).
    Sctp,
}

impl Proto {
    /// `probe`'s name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

/// `count` sequential connections (TCP, SCTP) or UDP requests from `from` to `to`.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub from: From,
    pub proto: Proto,
    pub to: &'static str,
    pub count: usize,
    /// Milliseconds between two connections (0: back to back).
    pub every_ms: u64,
    pub expect: Expect,
}

/// One step of a scenario.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    Probe(Probe),
    /// Opens `count` TCP connections and holds them until the scenario ends; each must be
    /// answered by one of `pods`.
    Hold {
        from: From,
        to: &'static str,
        count: usize,
        pods: &'static [&'static str],
    },
    /// Opens `count` TCP connections back to back, with no pause, and holds them until the
    /// scenario ends; each of `pods` must hold between `min` and `max` of them.
    Burst {
        from: From,
        to: &'static str,
        count: usize,
        pods: &'static [&'static str],
        min: usize,
        max: usize,
    },
    /// Replaces the manifests and waits until `/state` shows `endpoints` endpoints for `service`.
    Update {
        manifests: fn() -> String,
        service: &'static str,
        endpoints: usize,
    },
    /// `/state` lists exactly these service ports with exactly these endpoint addresses.
    State(&'static [(&'static str, &'static [&'static str])]),
    /// `GET /` of `to` answers with this status and a body containing `body`.
    Http {
        from: From,
        to: &'static str,
        status: u16,
        body: &'static str,
    },
    /// One UDP flow (one connected socket) across an update of the Service's endpoints.
    UdpFlow(UdpFlow),
}

/// A UDP flow that keeps sending while the endpoints change: `before` is what its first
/// requests get, then `update` is applied (as [`Step::Update`]), and the flow's last requests
/// must get `after` (not the endpoint that went away, and never silence: stale conntrack entries
/// must not black-hole it).
#[derive(Debug, Clone, Copy)]
pub struct UdpFlow {
    pub from: From,
    pub to: &'static str,
    pub before: Expect,
    pub update: fn() -> String,
    pub service: &'static str,
    pub endpoints: usize,
    pub after: Expect,
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub manifests: fn() -> String,
    pub steps: Vec<Step>,
}

impl Scenario {
    pub fn new(name: &'static str, manifests: fn() -> String) -> Scenario {
        Scenario {
            name,
            manifests,
            steps: Vec::new(),
        }
    }

    pub fn steps(mut self, steps: Vec<Step>) -> Scenario {
        self.steps = steps;
        self
    }
}

/// The scenario called `name`.
pub fn scenario(name: &str) -> Option<Scenario> {
    scenarios::all().into_iter().find(|s| s.name == name)
}

/// Whether the scenario sends SCTP (its tests are `#[ignore]`d, and run where the kernel has
/// SCTP: `cargo xtask vm` runs them in the Debian kernels with `--include-ignored`).
pub fn needs_sctp(sc: &Scenario) -> bool {
    sc.steps
        .iter()
        .any(|s| matches!(s, Step::Probe(p) if p.proto == Proto::Sctp))
}

/// Runs `scenario` on `backend` in IPv4, honouring the exception list; panics with what went
/// wrong.
pub fn run(backend: Backend, name: &str) {
    run_in(backend, Family::V4, name)
}

/// The same in IPv6: the table's addresses mapped onto the dual-stack cluster's IPv6 plan
/// ([`family`]).
pub fn run_v6(backend: Backend, name: &str) {
    run_in(backend, Family::V6, name)
}

/// The same with dual-stack Services, every connection step over both families.
pub fn run_dual(backend: Backend, name: &str) {
    run_in(backend, Family::Dual, name)
}

fn run_in(backend: Backend, family: Family, name: &str) {
    let case = match family {
        Family::V4 => format!("{backend}::{name}"),
        Family::V6 => format!("{backend}_v6::{name}"),
        Family::Dual => format!("{backend}_dual::{name}"),
    };
    let Some(mut sc) = scenario(name) else {
        panic!("no conformance scenario named {name}");
    };
    if needs_sctp(&sc) && !crate::client::sctp_supported() {
        panic!(
            "{case} sends SCTP, which this kernel does not have (socket(IPPROTO_SCTP) \
             fails): run it in a VM (`cargo xtask vm --suite conformance -- sctp`)"
        );
    }
    let found = exceptions::find(backend, name);
    for e in &found {
        eprintln!("conformance exception {case}: {}", e.reason);
        apply(&mut sc, e);
    }
    let must_fail = found.iter().any(|e| e.instead == Instead::Fails);
    let cluster = rig::cluster(family).unwrap_or_else(|e| panic!("{case}: cluster: {e}"));
    let rig = Rig::start(&cluster, backend, family, &sc).unwrap_or_else(|e| panic!("{case}: {e}"));
    let result = rig.run(&sc);
    match (must_fail, result) {
        (true, Ok(())) => {
            panic!("{case} now passes: remove it from the conformance exception list")
        }
        (true, Err(e)) => eprintln!("{case} fails as documented: {e}"),
        (false, Ok(())) => {}
        (false, Err(e)) => panic!("{case}: {e}\n--- agent log (tail) ---\n{}", rig.log_tail()),
    }
}

/// Rewrites the scenario's expectations as the exception documents.
fn apply(sc: &mut Scenario, e: &Exception) {
    match e.instead {
        Instead::Step(i, expect) => match sc.steps.get_mut(i) {
            Some(Step::Probe(p)) => p.expect = expect,
            Some(Step::UdpFlow(f)) => f.after = expect,
            other => panic!("exception {e:?}: step {i} is neither a probe nor a flow: {other:?}"),
        },
        Instead::SourceIsNode => {
            for step in &mut sc.steps {
                if let Step::Probe(Probe {
                    expect: Expect::Served { src, .. },
                    ..
                }) = step
                {
                    if *src == Src::Preserved {
                        *src = Src::Masqueraded;
                    }
                }
            }
        }
        Instead::Fails => {}
    }
}
