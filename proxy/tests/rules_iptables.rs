//! Kernel tests of the iptables backend in both modes (iptables-nft and iptables-legacy): the
//! rule backends' shared scenarios (the Service semantics are the conformance suite's), partial
//! restores, stale-chain grace and cleanup. Every test builds its own namespaces (removed by
//! guards, also on panic).

mod rules_common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kpr_tests::{tcp_request, Cluster, ClusterSpec};
use proxy::dataplane::iptables::IptablesDataplane;
use proxy::dataplane::{BackendConfig, Dataplane};
use proxy::error::DataplaneError;
use proxy::model::Protocol;
use proxy::state::{ChangeSet, ProxyState};
use rules_common::scenarios::SCENARIOS;
use rules_common::{addr, backend_config, endpoint, node_context, service, tally, Rig, TIMEOUT};

fn with_mode(cfg: &BackendConfig, mode: &str) -> Result<Box<dyn Dataplane>, DataplaneError> {
    let mut cfg = cfg.clone();
    cfg.iptables_mode = Some(mode.into());
    Ok(Box::new(IptablesDataplane::new(&cfg)?))
}

fn make_nft(cfg: &BackendConfig) -> Result<Box<dyn Dataplane>, DataplaneError> {
    with_mode(cfg, "nft")
}

fn make_legacy(cfg: &BackendConfig) -> Result<Box<dyn Dataplane>, DataplaneError> {
    with_mode(cfg, "legacy")
}

fn run_scenario(name: &str, make: rules_common::MakeBackend) {
    let (_, pods, f) = SCENARIOS
        .iter()
        .find(|s| s.0 == name)
        .unwrap_or_else(|| panic!("no scenario {name}"));
    let mut rig = Rig::new(*pods, make);
    f(&mut rig);
}

macro_rules! scenario_tests {
    ($($name:ident),* $(,)?) => {
        mod nft {
            $(#[test]
            fn $name() {
                super::run_scenario(stringify!($name), super::make_nft);
            })*
        }
        mod legacy {
            $(#[test]
            fn $name() {
                super::run_scenario(stringify!($name), super::make_legacy);
            })*
        }

        #[test]
        fn every_scenario_has_a_test() {
            let tested: BTreeSet<&str> = [$(stringify!($name)),*].into_iter().collect();
            let all: BTreeSet<&str> = SCENARIOS.iter().map(|s| s.0).collect();
            assert_eq!(tested, all);
        }
    };
}

scenario_tests!(
    udp_conntrack_cleanup,
    udp_flow_survives_an_agent_start,
    cleanup_and_leftovers,
    interleaved_services_each_round_robin,
    round_robin_over_many_then_few_endpoints,
);

fn state_with(services: &[(String, String, Vec<proxy::model::Endpoint>)]) -> ProxyState {
    let mut state = ProxyState::new(node_context());
    for (name, ip, eps) in services {
        state.set_port(service(name, ip, 80, Protocol::Tcp), eps.clone());
    }
    state
}

/// 2,000 Services; one endpoint change rewrites only that Service's bucket chain and the hairpin
/// chains of the endpoint addresses that came and went; the hairpin chain nobody needs any more
/// is flushed now and deleted only after the grace period.
#[test]
fn partial_restore_touches_only_the_changed_service_and_stale_chains_wait() {
    use proxy::dataplane::iptables::{compile, hairpin};
    const N: usize = 2000;
    const CHANGED: usize = 1234;
    let cluster = Cluster::new(ClusterSpec::pods(3)).expect("cluster");
    let ip = |i: usize| format!("10.96.{}.{}", 100 + i / 256, i % 256);
    let mut services: Vec<(String, String, Vec<proxy::model::Endpoint>)> = (0..N)
        .map(|i| {
            let eps = if i == CHANGED {
                vec![
                    endpoint(cluster.pods[0].ip, false),
                    endpoint(cluster.pods[1].ip, false),
                ]
            } else {
                vec![endpoint(
                    std::net::Ipv4Addr::new(10, 245, (i / 256) as u8, (i % 256) as u8),
                    true,
                )]
            };
            (format!("s{i}"), ip(i), eps)
        })
        .collect();
    let state = state_with(&services);
    services[CHANGED].2 = vec![
        endpoint(cluster.pods[0].ip, false),
        endpoint(cluster.pods[2].ip, false),
    ];
    let state2 = state_with(&services);
    let spn = state2
        .names()
        .find(|s| *s.name == format!("s{CHANGED}"))
        .unwrap()
        .clone();
    let (full_time, inc_time, restore, stale, after_grace) = cluster
        .node
        .run(|| {
            let mut cfg = backend_config();
            cfg.iptables_mode = Some("nft".into());
            let mut dp = IptablesDataplane::new(&cfg).unwrap();
            dp.set_stale_grace(Duration::from_millis(300));
            let t = Instant::now();
            dp.sync(
                &state,
                &ChangeSet {
                    full: true,
                    ..Default::default()
                },
            )
            .expect("full");
            let full_time = t.elapsed();
            let changes = ChangeSet {
                changed: BTreeSet::from([spn.clone()]),
                ..Default::default()
            };
            let t = Instant::now();
            let stats = dp.sync(&state2, &changes).expect("incremental");
            let inc_time = t.elapsed();
            assert!(!stats.full);
            let restore = dp.last_restore().to_string();
            let stale = dp.stale_chains();
            std::thread::sleep(Duration::from_millis(350));
            dp.sync(&state2, &ChangeSet::default()).expect("periodic");
            let after = dp.last_restore().to_string();
            assert!(dp.stale_chains().is_empty());
            (full_time, inc_time, restore, stale, after)
        })
        .unwrap();
    eprintln!(
        "iptables-nft: full sync of {N} Services {full_time:?}, one change {inc_time:?}:\n{restore}"
    );
    let slash24 = |a: std::net::Ipv4Addr| {
        hairpin::chain(std::net::Ipv4Addr::from(u32::from(a) & 0xffff_ff00).into())
    };
    let bucket = compile::bucket_chain(compile::bucket_of(&spn.to_string()));
    let gone = slash24(cluster.pods[1].ip);
    let came = slash24(cluster.pods[2].ip);
    let declared: BTreeSet<&str> = restore
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        declared,
        BTreeSet::from([bucket.as_str(), gone.as_str(), came.as_str()]),
        "{restore}"
    );
    assert_eq!(stale, vec![gone.clone()]);
    assert!(!restore.contains("-X"), "deleted before the grace period");
    assert!(after_grace.contains(&format!("-X {gone}")), "{after_grace}");
    let changed_vip = format!("-d {}/32 ", ip(CHANGED));
    for l in restore
        .lines()
        .filter(|l| l.starts_with("-A") || l.starts_with("-D"))
    {
        let chain = l.split(' ').nth(1).unwrap();
        assert!(
            chain == bucket || chain == came || chain == hairpin::HAIRPIN,
            "unexpected rule {l}"
        );
    }
    // The bucket is rewritten whole, but it holds only a few of the 2,000 Services.
    let bucket_rules = restore
        .lines()
        .filter(|l| l.starts_with(&format!("-A {bucket} ")))
        .count();
    assert!(bucket_rules < 60, "{bucket_rules} rules in {bucket}");
    assert!(restore.contains(&changed_vip), "{restore}");
    let t = tally((0..10).map(|_| {
        tcp_request(&cluster.podclient, addr(&ip(CHANGED), 80), TIMEOUT)
            .expect("request")
            .pod
    }));
    assert_eq!(
        t.keys().cloned().collect::<Vec<_>>(),
        vec!["pod0", "pod2"],
        "{t:?}"
    );
}

/// A second instance over a crashed one's chains takes over; cleanup leaves no KPR- chain and
/// no jump in either table, and never touches chains that are not ours.
#[test]
fn cleanup_removes_every_kpr_chain_and_keeps_foreign_ones() {
    let cluster = Cluster::new(ClusterSpec::pods(1)).expect("cluster");
    let services = vec![(
        "x".to_string(),
        "10.96.0.95".to_string(),
        vec![endpoint(cluster.pods[0].ip, false)],
    )];
    let state = state_with(&services);
    let full = ChangeSet {
        full: true,
        ..Default::default()
    };
    let (before, after) = cluster
        .node
        .run(|| {
            let save = || {
                let o = std::process::Command::new("iptables-nft-save")
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&o.stdout).into_owned()
            };
            let foreign = std::process::Command::new("iptables-nft")
                .args(["-t", "nat", "-N", "KUBE-SERVICES"])
                .status()
                .unwrap();
            assert!(foreign.success());
            let mut cfg = backend_config();
            cfg.iptables_mode = Some("nft".into());
            let mut first = IptablesDataplane::new(&cfg).unwrap();
            first.sync(&state, &full).expect("first run");
            // Leftover of the crashed run: a chain the next run does not need.
            let leftover = std::process::Command::new("iptables-nft")
                .args(["-t", "nat", "-N", "KPR-SEP-LEFTOVER"])
                .status()
                .unwrap();
            assert!(leftover.success());
            drop(first);
            let mut second = IptablesDataplane::new(&cfg).unwrap();
            second.sync(&state, &full).expect("second run");
            let before = save();
            second.cleanup().expect("cleanup");
            (before, save())
        })
        .unwrap();
    assert!(before.contains("-j KPR-SERVICES"), "{before}");
    assert!(
        !before.contains("KPR-SEP-LEFTOVER"),
        "leftover kept: {before}"
    );
    assert_eq!(
        before.matches("-A PREROUTING").count(),
        1,
        "jump added twice: {before}"
    );
    assert!(!after.contains("KPR-"), "left behind: {after}");
    assert!(
        after.contains(":KUBE-SERVICES"),
        "foreign chain removed: {after}"
    );
}
