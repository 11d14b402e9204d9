//! Root test: `proxy run` sets the conntrack sysctls of its own network namespace as kube-proxy
//! does, from the `--conntrack-*` flags and from a KubeProxyConfiguration's `conntrack` section
//! (`--config`), and leaves the host's alone: the timeouts are per network namespace, and
//! nf_conntrack_max, host-wide, cannot be changed from a test namespace (the agent says so and
//! goes on). Every agent runs in a namespace this test creates.

use std::fs;
use std::path::Path;
use std::process::Command;

use kpr_tests::agent::{Agent, AgentOptions};
use kpr_tests::netns::{unique_prefix, Netns};

const NETFILTER: &str = "/proc/sys/net/netfilter";
const TIMEOUTS: [&str; 4] = [
    "nf_conntrack_tcp_timeout_established",
    "nf_conntrack_tcp_timeout_close_wait",
    "nf_conntrack_udp_timeout",
    "nf_conntrack_udp_timeout_stream",
];

fn read(name: &str) -> u64 {
    let path = Path::new(NETFILTER).join(name);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.trim().parse().unwrap()
}

/// The sysctl as seen from inside `ns` (a thread in the namespace opens the file).
fn read_in(ns: &Netns, name: &str) -> u64 {
    ns.run(|| read(name)).unwrap()
}

/// The conntrack sysctls exist once nf_conntrack is loaded; load it if this machine has not yet.
fn nf_conntrack_loaded() {
    if !Path::new(NETFILTER).join("nf_conntrack_max").exists() {
        let status = Command::new("modprobe").arg("nf_conntrack").status();
        assert!(
            Path::new(NETFILTER).join("nf_conntrack_max").exists(),
            "nf_conntrack is not loaded and `modprobe nf_conntrack` did not load it ({status:?}): \
             this test needs it"
        );
    }
}

fn host_values() -> Vec<u64> {
    std::iter::once("nf_conntrack_max")
        .chain(TIMEOUTS)
        .map(read)
        .collect()
}

#[test]
fn flags_set_the_timeouts_of_the_agents_namespace_only() {
    nf_conntrack_loaded();
    let host = host_values();
    let ns = Netns::new("ctflags").unwrap();
    // Values no kernel defaults to; nf_conntrack_max asked above the host's, so it must be written
    // and cannot be from here.
    let wanted = [7777u64, 77, 31, 133];
    let opts = AgentOptions::backend("nftables")
        .arg("--conntrack-tcp-timeout-established=7777s")
        .arg("--conntrack-tcp-timeout-close-wait=1m17s")
        .arg("--conntrack-udp-timeout=31s")
        .arg("--conntrack-udp-timeout-stream=133s")
        .arg("--conntrack-max-per-core=1")
        .arg(format!("--conntrack-min={}", host[0] + 4096));
    let agent = Agent::start(&ns, &opts, &[]).unwrap();
    for (name, want) in TIMEOUTS.iter().zip(wanted) {
        assert_eq!(read_in(&ns, name), want, "{name} in the agent's namespace");
    }
    let log = agent.log();
    assert!(
        log.contains("could not set /proc/sys/net/netfilter/nf_conntrack_max"),
        "nf_conntrack_max is the host's: skipped with a warning\n{log}"
    );
    assert!(
        log.contains(
            "conntrack: set /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait to 77"
        ),
        "{log}"
    );
    drop(agent);
    assert_eq!(
        host_values(),
        host,
        "the host's conntrack sysctls are untouched"
    );
}

#[test]
fn a_kube_proxy_configuration_sets_them_too() {
    nf_conntrack_loaded();
    let host = host_values();
    let ns = Netns::new("ctconf").unwrap();
    let file = std::env::temp_dir().join(format!("{}-kube-proxy.conf", unique_prefix()));
    fs::write(
        &file,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
         kind: KubeProxyConfiguration\n\
         mode: nftables\n\
         nodePortAddresses: [all]\n\
         conntrack:\n  \
           maxPerCore: 0\n  \
           min: null\n  \
           tcpEstablishedTimeout: 2h0m0s\n  \
           tcpCloseWaitTimeout: 1m10s\n  \
           udpTimeout: 45s\n  \
           udpStreamTimeout: 3m0s\n",
    )
    .unwrap();
    let opts = AgentOptions::backend("nftables").arg(format!("--config={}", file.display()));
    let agent = Agent::start(&ns, &opts, &[]);
    fs::remove_file(&file).unwrap();
    let agent = agent.unwrap();
    for (name, want) in TIMEOUTS.iter().zip([7200u64, 70, 45, 180]) {
        assert_eq!(read_in(&ns, name), want, "{name} in the agent's namespace");
    }
    let log = agent.log();
    assert!(
        log.contains("settings read from the KubeProxyConfiguration file"),
        "{log}"
    );
    assert!(
        !log.contains("nf_conntrack_max"),
        "maxPerCore 0 leaves nf_conntrack_max alone\n{log}"
    );
    drop(agent);
    assert_eq!(
        host_values(),
        host,
        "the host's conntrack sysctls are untouched"
    );
}
