//! `proxy trace` agrees with the traffic, per backend: `kpr_tests::conformance::trace` runs the
//! traced scenarios of the conformance table (round robin, NodePort, a single endpoint, session
//! affinity, no endpoints, an unexposed port, an unallocated address, loadBalancerSourceRanges,
//! externalTrafficPolicy Local) in one cluster per backend, tracing each connection step in the
//! node's namespace before running it. The eBPF backend's trace is checked against its traffic
//! by `proxy/tests/ebpf_agent.rs` (socket and tc paths, affinity by network namespace).
//! Needs root and the `proxy` and `probe` binaries (`cargo build -p proxy -p kpr-tests --bins`).

use kpr_tests::conformance::{trace, Backend};

#[test]
fn userspace() {
    trace::run(Backend::Userspace);
}

#[test]
fn nftables() {
    trace::run(Backend::Nftables);
}

#[test]
fn iptables_nft() {
    trace::run(Backend::IptablesNft);
}

#[test]
fn iptables_legacy() {
    trace::run(Backend::IptablesLegacy);
}
