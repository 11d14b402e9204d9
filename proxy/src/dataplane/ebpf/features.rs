//! Probing the running kernel for what the eBPF backend needs, so a failed start names the
//! missing feature (program type, map type, helper) instead of only the errno of a load.
//!
//! Owns only probing and wording; loading and attaching live in `attach`/`tc`.

use aya::maps::MapType;
use aya::programs::ProgramType;
use aya::sys::{is_helper_supported, is_map_supported, is_program_supported, BpfHelper};

/// One requirement and what the kernel said about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// What is needed, as a user would search for it (e.g. `cgroup/connect4 programs`).
    pub feature: &'static str,
    /// The first Linux version that has it.
    pub since: &'static str,
    /// Some(true) present, Some(false) missing, None: the probe itself failed.
    pub present: Option<bool>,
}

fn program(feature: &'static str, since: &'static str, t: ProgramType) -> Probe {
    Probe {
        feature,
        since,
        present: is_program_supported(t).ok(),
    }
}

fn map(feature: &'static str, since: &'static str, t: MapType) -> Probe {
    Probe {
        feature,
        since,
        present: is_map_supported(t).ok(),
    }
}

fn helper(feature: &'static str, since: &'static str, t: ProgramType, h: BpfHelper) -> Probe {
    Probe {
        feature,
        since,
        present: is_helper_supported(t, h).ok(),
    }
}

/// Probes every kernel feature the backend's programs use.
pub fn probe() -> Vec<Probe> {
    let sock_addr = ProgramType::CgroupSockAddr;
    vec![
        program(
            "cgroup sock_addr programs (connect4/sendmsg4/recvmsg4/getpeername4)",
            "4.17",
            sock_addr,
        ),
        program(
            "cgroup sock programs (sock_release)",
            "5.9",
            ProgramType::CgroupSock,
        ),
        program(
            "tc classifier programs",
            "4.1",
            ProgramType::SchedClassifier,
        ),
        map("hash maps", "3.19", MapType::Hash),
        map("LRU hash maps", "4.10", MapType::LruHash),
        map("ring buffers (program logs)", "5.8", MapType::RingBuf),
        helper(
            "bpf_get_socket_cookie in cgroup sock_addr programs",
            "5.7",
            sock_addr,
            BpfHelper::BPF_FUNC_get_socket_cookie,
        ),
        helper(
            "bpf_get_netns_cookie in cgroup sock_addr programs",
            "5.7",
            sock_addr,
            BpfHelper::BPF_FUNC_get_netns_cookie,
        ),
        helper(
            "bpf_set_retval in cgroup programs (ECONNREFUSED for Services without endpoints)",
            "5.18",
            sock_addr,
            BpfHelper::BPF_FUNC_set_retval,
        ),
    ]
}

/// The missing features of `probes`, one sentence (None when nothing is known missing).
pub fn describe_missing(probes: &[Probe]) -> Option<String> {
    let missing: Vec<String> = probes
        .iter()
        .filter(|p| p.present == Some(false))
        .map(|p| format!("{} (Linux {}+)", p.feature, p.since))
        .collect();
    (!missing.is_empty()).then(|| format!("this kernel lacks: {}", missing.join("; ")))
}

/// What the running kernel lacks for the backend, if anything.
pub fn missing() -> Option<String> {
    describe_missing(&probe())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_features_are_named_with_their_kernel_version() {
        let probes = vec![
            Probe {
                feature: "a",
                since: "5.1",
                present: Some(true),
            },
            Probe {
                feature: "b",
                since: "5.18",
                present: Some(false),
            },
            Probe {
                feature: "c",
                since: "6.6",
                present: None,
            },
        ];
        assert_eq!(
            describe_missing(&probes).as_deref(),
            Some("this kernel lacks: b (Linux 5.18+)")
        );
        assert_eq!(describe_missing(&probes[..1]), None);
    }

    kpr_tests::needs_root! {
        /// The development machine (6.x) has everything; a probe that wrongly reports something
        /// missing would make every start failure blame the kernel.
        #[test]
        fn this_kernel_has_every_feature() {
            let probes = probe();
            assert!(probes.iter().all(|p| p.present == Some(true)), "{probes:?}");
        }
    }
}
