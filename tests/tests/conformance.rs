//! The conformance suite: every scenario of `kpr_tests::conformance::scenarios` against every
//! backend, one test per (backend, scenario), named `<backend>::<scenario>`:
//! `cargo test -p kpr-tests --features root --test conformance nftables::` runs one backend,
//! `... ::round_robin` one scenario everywhere. Exceptions: `kpr_tests::conformance::EXCEPTIONS`.
//! Needs root and the `proxy` and `probe` binaries (`cargo build -p proxy -p kpr-tests --bins`).

use kpr_tests::conformance::{needs_sctp, run, run_dual, run_v6, scenarios, Backend};

/// One module per backend, one test per scenario; the scenarios after `sctp:` need SCTP in the
/// kernel (this machine kind's has none) and are ignored unless `--include-ignored` (which
/// `cargo xtask vm` passes: the Debian kernels have SCTP).
macro_rules! backend {
    ($module:ident, $backend:expr; $($scenario:ident),*; sctp: $($sctp:ident),*) => {
        mod $module {
            use super::*;
            $(
                #[test]
                fn $scenario() {
                    run($backend, stringify!($scenario));
                }
            )*
            $(
                #[test]
                #[ignore = "needs SCTP in the kernel: cargo xtask vm runs it"]
                fn $sctp() {
                    run($backend, stringify!($sctp));
                }
            )*
        }
    };
}

/// The same scenarios in IPv6 and with dual-stack Services (`kpr_tests::conformance::family`),
/// for the backends that serve IPv6; the SCTP rows are left to the VM runs.
macro_rules! backend_v6 {
    ($module:ident, $run:ident, $backend:expr; $($scenario:ident),*) => {
        mod $module {
            use super::*;
            $(
                #[test]
                fn $scenario() {
                    $run($backend, stringify!($scenario));
                }
            )*
        }
    };
}

macro_rules! suite {
    ($($scenario:ident),* $(,)?; sctp: $($sctp:ident),* $(,)?) => {
        backend!(userspace, Backend::Userspace; $($scenario),*; sctp: $($sctp),*);
        backend!(nftables, Backend::Nftables; $($scenario),*; sctp: $($sctp),*);
        backend!(iptables_nft, Backend::IptablesNft; $($scenario),*; sctp: $($sctp),*);
        backend!(iptables_legacy, Backend::IptablesLegacy; $($scenario),*; sctp: $($sctp),*);
        backend!(ebpf, Backend::Ebpf; $($scenario),*; sctp: $($sctp),*);
        backend_v6!(userspace_v6, run_v6, Backend::Userspace; $($scenario),*);
        backend_v6!(userspace_dual, run_dual, Backend::Userspace; $($scenario),*);
        backend_v6!(nftables_v6, run_v6, Backend::Nftables; $($scenario),*);
        backend_v6!(nftables_dual, run_dual, Backend::Nftables; $($scenario),*);
        backend_v6!(iptables_nft_v6, run_v6, Backend::IptablesNft; $($scenario),*);
        backend_v6!(iptables_legacy_v6, run_v6, Backend::IptablesLegacy; $($scenario),*);
        backend_v6!(iptables_nft_dual, run_dual, Backend::IptablesNft; $($scenario),*);
        backend_v6!(iptables_legacy_dual, run_dual, Backend::IptablesLegacy; $($scenario),*);
        backend_v6!(ebpf_v6, run_v6, Backend::Ebpf; $($scenario),*);
        backend_v6!(ebpf_dual, run_dual, Backend::Ebpf; $($scenario),*);

        /// Every row of the table has its tests (and nothing else does); exactly the SCTP rows
        /// are the ignored ones.
        #[test]
        fn every_scenario_of_the_table_is_generated() {
            let mut generated = vec![$(stringify!($scenario)),*];
            let mut table: Vec<&str> = scenarios::all().iter().filter(|s| !needs_sctp(s)).map(|s| s.name).collect();
            generated.sort();
            table.sort();
            assert_eq!(generated, table);
            let mut sctp = vec![$(stringify!($sctp)),*];
            let mut table: Vec<&str> = scenarios::all().iter().filter(|s| needs_sctp(s)).map(|s| s.name).collect();
            sctp.sort();
            table.sort();
            assert_eq!(sctp, table);
        }
    };
}

suite!(
    cluster_ip_from_pod,
    cluster_ip_from_node,
    node_port_from_external,
    node_port_from_node,
    node_port_only_on_nodeport_addresses,
    external_ip,
    load_balancer_ip,
    load_balancer_source_range_allows,
    load_balancer_source_range_denies,
    not_ready_endpoints_are_not_used,
    ready_preferred_over_terminating,
    terminating_fallback,
    internal_traffic_local,
    internal_traffic_local_none_here_drops,
    external_traffic_local,
    external_traffic_local_terminating_fallback,
    external_traffic_local_none_here_drops,
    external_traffic_local_pod_short_circuit,
    reject_without_endpoints,
    reject_with_only_not_ready_endpoints,
    udp_without_endpoints_is_rejected,
    drop_unallocated_service_address,
    port_not_exposed_is_rejected,
    protocol_matched_exactly,
    round_robin,
    least_connection,
    least_connection_burst,
    least_connection_short_connections,
    topology_zone_hints,
    session_affinity,
    udp,
    hairpin_is_masqueraded,
    pod_to_service_keeps_source,
    state_is_the_same_for_every_backend,
    other_service_proxy_name_is_ignored,
    bad_input_does_not_stop_other_services,
    udp_flow_leaves_a_removed_endpoint,
    udp_flow_reaches_endpoints_that_appear,
    health_check_node_port,
    headless_and_external_name_are_ignored;
    sctp: sctp,
);

/// Every exception names a real scenario and carries a reason.
#[test]
fn exceptions_name_real_scenarios() {
    for e in kpr_tests::conformance::EXCEPTIONS {
        assert!(
            e.scenario == "*" || kpr_tests::conformance::scenario(e.scenario).is_some(),
            "{e:?}"
        );
        assert!(!e.reason.is_empty(), "{e:?}");
    }
}
