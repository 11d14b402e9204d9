//! The documented exceptions: where a backend cannot honour a scenario, what it does instead.
//! Each entry is tested (see the module docs of [`super`]); none is skipped. `scenario: "*"`
//! applies to every scenario of the backend.

use super::{Backend, Expect, Src};

/// What the test asserts instead of the scenario as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instead {
    /// Step `i` (a probe) must have this outcome instead.
    Step(usize, Expect),
    /// Every probe that expects the client's own address to reach the endpoint expects a node
    /// address instead ([`Src::Preserved`] becomes [`Src::Masqueraded`]).
    SourceIsNode,
    /// No meaningful alternative: the scenario must fail (and the failure is printed).
    Fails,
}

/// One exception.
#[derive(Debug, Clone, Copy)]
pub struct Exception {
    pub backend: Backend,
    pub scenario: &'static str,
    pub reason: &'static str,
    pub instead: Instead,
    /// Applies only where this says so (a kernel feature the backend would use is missing).
    pub only_if: Option<fn() -> bool>,
}

const fn exception(
    backend: Backend,
    scenario: &'static str,
    reason: &'static str,
    instead: Instead,
) -> Exception {
    Exception {
        backend,
        scenario,
        reason,
        instead,
        only_if: None,
    }
}

impl Exception {
    const fn only_if(mut self, condition: fn() -> bool) -> Exception {
        self.only_if = Some(condition);
        self
    }
}

/// Whether the running kernel lacks the `bpf_sock_destroy` kfunc (Linux 6.5+) the ebpf backend
/// destroys stale sockets with: its name is then absent from the kernel's BTF strings.
pub fn kernel_lacks_sock_destroy() -> bool {
    !std::fs::read("/sys/kernel/btf/vmlinux")
        .is_ok_and(|btf| btf.windows(17).any(|w| w == b"bpf_sock_destroy\0"))
}

/// eBPF: where a packet would be dropped, a local client's connect() is refused instead.
const fn eperm(scenario: &'static str) -> Exception {
    exception(
        Backend::Ebpf,
        scenario,
        "the socket program (cgroup/connect4) decides at connect(): it can only refuse the call, \
         so a local client gets EPERM at once instead of a silently dropped SYN",
        Instead::Step(0, Expect::Error("other: Operation not permitted")),
    )
}

const USERSPACE_SOURCE_RANGE: &str = "a userspace proxy accepts the connection before it checks \
    the source range; a source outside it (external or a pod) gets the connection closed (EOF) \
    instead of a dropped SYN";

/// The list (also in docs/ARCHITECTURE.md, "Conformance exceptions").
pub const EXCEPTIONS: &[Exception] = &[
    exception(
        Backend::Userspace,
        "*",
        "a userspace proxy opens its own connection to the endpoint, so the endpoint always sees \
         a node address, never the client's",
        Instead::SourceIsNode,
    ),
    exception(
        Backend::Userspace,
        "external_traffic_local_none_here_drops",
        "a userspace proxy accepts the connection before it can choose an endpoint; with none \
         usable it closes it (EOF) instead of dropping the SYN",
        Instead::Step(0, Expect::Error("closed")),
    ),
    exception(
        Backend::Userspace,
        "load_balancer_source_range_denies",
        USERSPACE_SOURCE_RANGE,
        Instead::Step(0, Expect::Error("closed")),
    ),
    exception(
        Backend::Userspace,
        "load_balancer_source_range_denies",
        USERSPACE_SOURCE_RANGE,
        Instead::Step(2, Expect::Error("closed")),
    ),
    exception(
        Backend::Userspace,
        "sctp",
        "the userspace backend does not proxy SCTP (it logs an error naming the port): nothing \
         answers",
        Instead::Step(0, Expect::NotServed),
    ),
    exception(
        Backend::Ebpf,
        "sctp",
        "SCTP is not translated: the kernel's SCTP connect() runs no cgroup connect4 program \
         (seen on Debian 6.1: a connect() to the clusterIP goes out unchanged and times out), \
         and the tc program handles TCP and UDP only",
        Instead::Step(0, Expect::NotServed),
    ),
    eperm("drop_unallocated_service_address"),
    eperm("internal_traffic_local_none_here_drops"),
    eperm("other_service_proxy_name_is_ignored"),
    exception(
        Backend::Ebpf,
        "udp_flow_leaves_a_removed_endpoint",
        "on a kernel without the bpf_sock_destroy kfunc (before 6.5: the VM matrix's 6.1): a \
         connected UDP socket is translated once, at connect(): there is no conntrack entry to \
         delete, and the kernel runs no socket program for its later datagrams, so it keeps \
         talking to the endpoint it got (here that pod still answers) until the client \
         reconnects. From 6.5 the agent destroys the socket and the client's reconnect is \
         balanced again (the scenario holds as written)",
        Instead::Step(
            0,
            Expect::Served {
                pods: &["pod0"],
                all_seen: true,
                src: Src::Any,
            },
        ),
    )
    .only_if(kernel_lacks_sock_destroy),
    exception(
        Backend::Ebpf,
        "hairpin_is_masqueraded",
        "socket-level balancing connects the pod straight to its own address: the endpoint sees \
         itself as the source (no NAT at all, so nothing to masquerade) and the reply path works",
        Instead::Step(
            0,
            Expect::Served {
                pods: &["pod0"],
                all_seen: true,
                src: Src::Preserved,
            },
        ),
    ),
];

/// The exceptions for this pair (the backend's `"*"` entries first).
pub fn find(backend: Backend, scenario: &str) -> Vec<&'static Exception> {
    EXCEPTIONS
        .iter()
        .filter(|e| e.backend == backend && (e.scenario == "*" || e.scenario == scenario))
        .filter(|e| e.only_if.is_none_or(|applies| applies()))
        .collect()
}
