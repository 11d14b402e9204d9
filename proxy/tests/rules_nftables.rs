//! Kernel tests of the nftables backend: the rule backends' shared scenarios (the Service
//! semantics are the conformance suite's), plus the 20,000-Service load and the
//! one-change-touches-one-Service check. Every test builds its own namespaces (removed by
//! guards, also on panic); nothing runs in the machine's own network namespace.

mod rules_common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Instant;

use kpr_tests::{tcp_request, Cluster, ClusterSpec};
use proxy::dataplane::nftables::{NftablesDataplane, Op};
use proxy::dataplane::Dataplane;
use proxy::model::Protocol;
use proxy::state::{ChangeSet, ProxyState};
use rules_common::scenarios::SCENARIOS;
use rules_common::{addr, backend_config, endpoint, node_context, service, tally, Rig, TIMEOUT};

fn make(
    cfg: &proxy::dataplane::BackendConfig,
) -> Result<Box<dyn Dataplane>, proxy::error::DataplaneError> {
    Ok(Box::new(NftablesDataplane::new(cfg)?))
}

fn run_scenario(name: &str) {
    let (_, pods, f) = SCENARIOS
        .iter()
        .find(|s| s.0 == name)
        .unwrap_or_else(|| panic!("no scenario {name}"));
    let mut rig = Rig::new(*pods, make);
    f(&mut rig);
}

macro_rules! scenario_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test]
        fn $name() {
            run_scenario(stringify!($name));
        })*

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

const SERVICES: usize = 20_000;
const CHANGED: usize = 12_345;

fn cluster_ip(i: usize) -> String {
    format!("10.96.{}.{}", 100 + i / 256, i % 256)
}

/// 20,000 Services with 2 endpoints each; service CHANGED uses real pods 0 and 1.
fn big_state(cluster: &Cluster) -> ProxyState {
    let mut state = ProxyState::new(node_context());
    for i in 0..SERVICES {
        let svc = service(&format!("s{i}"), &cluster_ip(i), 80, Protocol::Tcp);
        let eps = if i == CHANGED {
            vec![
                endpoint(cluster.pods[0].ip, false),
                endpoint(cluster.pods[1].ip, false),
            ]
        } else {
            (0..2)
                .map(|k| {
                    let n = 2 * i + k;
                    endpoint(
                        Ipv4Addr::new(10, 245, (n / 256) as u8, (n % 256) as u8),
                        true,
                    )
                })
                .collect()
        };
        state.set_port(svc, eps);
    }
    state
}

#[test]
fn one_endpoint_change_among_20000_services_touches_only_that_service() {
    let cluster = Cluster::new(ClusterSpec::pods(3)).expect("cluster");
    let mut state = big_state(&cluster);
    let (full_time, inc_time, ops, id) = cluster
        .node
        .run(|| {
            let mut dp = NftablesDataplane::new(&backend_config()).expect("backend");
            let t = Instant::now();
            let stats = dp
                .sync(
                    &state,
                    &ChangeSet {
                        full: true,
                        ..Default::default()
                    },
                )
                .expect("full sync");
            let full_time = t.elapsed();
            assert!(stats.full);
            assert_eq!(stats.service_ports, SERVICES);
            // A new table: its elements went over netlink, several 4 MB batches of them.
            assert!(
                dp.netlink_elements() > 5 * SERVICES,
                "{}",
                dp.netlink_elements()
            );

            let spn = state
                .names()
                .find(|s| *s.name == format!("s{CHANGED}"))
                .unwrap()
                .clone();
            let svc = state.get(&spn).unwrap().service.clone();
            let eps = vec![
                endpoint(cluster.pods[0].ip, false),
                endpoint(cluster.pods[2].ip, false),
            ];
            state.set_port(svc.clone(), eps);
            let changes = ChangeSet {
                changed: BTreeSet::from([spn.clone()]),
                ..Default::default()
            };
            let t = Instant::now();
            let stats = dp.sync(&state, &changes).expect("incremental sync");
            let inc_time = t.elapsed();
            assert!(!stats.full);
            assert_eq!(stats.touched, 1);
            let ids = dp.target_ids(&spn);
            assert_eq!(ids.len(), 1, "one target for a plain clusterIP Service");
            let ops = dp.last_transaction_ops().to_vec();
            // More single changes (back and forth), to report a typical time, not the first.
            let mut times = vec![inc_time];
            for k in 0..6 {
                let pod = if k % 2 == 0 { 1 } else { 2 };
                let eps = vec![
                    endpoint(cluster.pods[0].ip, false),
                    endpoint(cluster.pods[pod].ip, false),
                ];
                state.set_port(svc.clone(), eps);
                let t = Instant::now();
                dp.sync(&state, &changes).expect("incremental sync");
                times.push(t.elapsed());
                assert_eq!(dp.last_transaction_ops().len(), 4);
            }
            times.sort();
            (full_time, times[times.len() / 2], ops, ids[0])
        })
        .expect("enter node netns");
    eprintln!(
        "nftables: full sync of {SERVICES} Services {full_time:?}; one endpoint change (median of 7) {inc_time:?} with {} ops: {ops:?}",
        ops.len()
    );
    // Endpoint pod1 -> pod2 in slot 1: the slot's value and the hairpin entries, nothing else.
    let pod1 = cluster.pods[1].ip.to_string();
    let pod2 = cluster.pods[2].ip.to_string();
    assert_eq!(ops.len(), 4, "{ops:?}");
    for op in &ops {
        let key = op.key().expect("only element operations");
        let mine =
            key.starts_with(&format!("{id} . ")) || key.contains(&pod1) || key.contains(&pod2);
        assert!(mine, "operation outside the changed Service: {op:?}");
        assert!(matches!(
            op,
            Op::AddElement { .. } | Op::DeleteElement { .. }
        ));
    }
    // The times are printed above, not asserted: timings belong to `cargo xtask bench`.
    // And the packets follow: the changed Service balances over pod0 and pod2 only.
    let t = tally((0..10).map(|_| {
        tcp_request(&cluster.podclient, addr(&cluster_ip(CHANGED), 80), TIMEOUT)
            .expect("request")
            .pod
    }));
    assert_eq!(
        t.keys().cloned().collect::<Vec<_>>(),
        vec!["pod0", "pod2"],
        "{t:?}"
    );
}

#[test]
fn a_new_instance_takes_over_a_crashed_runs_table_and_cleanup_removes_it() {
    let cluster = Cluster::new(ClusterSpec::pods(1)).expect("cluster");
    let mut state = ProxyState::new(node_context());
    let svc = service("x", "10.96.0.90", 80, Protocol::Tcp);
    let eps = vec![endpoint(cluster.pods[0].ip, false)];
    state.set_port(svc, eps);
    let full = ChangeSet {
        full: true,
        ..Default::default()
    };
    let listed = cluster
        .node
        .run(|| {
            // A first run programs the node and "crashes" (is dropped without cleanup).
            let mut first = NftablesDataplane::new(&backend_config()).unwrap();
            first.sync(&state, &full).expect("first run");
            drop(first);
            let mut second = NftablesDataplane::new(&backend_config()).unwrap();
            second
                .sync(&state, &full)
                .expect("second run over leftovers");
            let before = std::process::Command::new("nft")
                .args(["list", "tables"])
                .output()
                .unwrap();
            second.cleanup().expect("cleanup");
            second.cleanup().expect("cleanup is idempotent");
            let after = std::process::Command::new("nft")
                .args(["list", "tables"])
                .output()
                .unwrap();
            (
                String::from_utf8_lossy(&before.stdout).into_owned(),
                String::from_utf8_lossy(&after.stdout).into_owned(),
            )
        })
        .unwrap();
    assert!(listed.0.contains("table ip kpr"), "{listed:?}");
    assert!(!listed.1.contains("kpr"), "left behind: {listed:?}");
    let e = tcp_request(
        &cluster.podclient,
        addr("10.96.0.90", 80),
        rules_common::DROP_WAIT,
    );
    assert!(e.is_err(), "still translated after cleanup: {e:?}");
}

#[test]
fn an_incompatible_leftover_table_is_replaced() {
    let cluster = Cluster::new(ClusterSpec::pods(1)).expect("cluster");
    let mut state = ProxyState::new(node_context());
    let svc = service("y", "10.96.0.91", 80, Protocol::Tcp);
    let eps = vec![endpoint(cluster.pods[0].ip, false)];
    state.set_port(svc, eps);
    cluster
        .node
        .run(|| {
            // A table of the same name whose `fe` has another type (an older layout, say).
            let out = std::process::Command::new("nft")
                .args(["add table ip kpr; add set ip kpr fe { type ipv4_addr; }"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let mut dp = NftablesDataplane::new(&backend_config()).unwrap();
            dp.sync(
                &state,
                &ChangeSet {
                    full: true,
                    ..Default::default()
                },
            )
            .expect("full sync replaces the incompatible table");
        })
        .unwrap();
    let r = tcp_request(&cluster.podclient, addr("10.96.0.91", 80), TIMEOUT).expect("served");
    assert_eq!(r.pod, "pod0");
}

/// Service ports of every kind the tables hold elements for, in both families: plain, NodePort
/// with the Local policy, UDP with externalIPs and a source-ranged load balancer, SCTP, session
/// affinity, least-connection, more endpoints than the round-robin sets cover, none at all,
/// IPv6 and dual-stack.
fn varied_state() -> ProxyState {
    use proxy::model::{Algorithm, Endpoint};
    let ep = |ip: &str, remote: bool| Endpoint {
        addr: ip.parse().unwrap(),
        ..endpoint(Ipv4Addr::LOCALHOST, remote)
    };
    let mut state = ProxyState::new(node_context());
    let plain = service("plain", "10.96.1.1", 80, Protocol::Tcp);
    state.set_port(plain, vec![ep("10.244.1.1", false), ep("10.244.1.2", true)]);
    let mut np = service("np", "10.96.1.2", 8080, Protocol::Tcp);
    (np.node_port, np.external_local) = (30080, true);
    state.set_port(np, vec![ep("10.244.1.3", false), ep("10.244.1.4", true)]);
    let mut lb = service("lb", "10.96.1.3", 53, Protocol::Udp);
    lb.external_ips = vec!["203.0.113.5".parse().unwrap()];
    lb.load_balancer_ips = vec!["192.0.2.10".parse().unwrap()];
    lb.source_ranges = vec!["198.51.100.0/24".parse().unwrap()];
    state.set_port(lb, vec![ep("10.244.1.5", false)]);
    let sctp = service("sctp", "10.96.1.4", 9999, Protocol::Sctp);
    state.set_port(sctp, vec![ep("10.244.1.6", false)]);
    let mut aff = service("aff", "10.96.1.5", 80, Protocol::Tcp);
    aff.affinity = Some(std::time::Duration::from_secs(10800));
    state.set_port(aff, vec![ep("10.244.1.7", false), ep("10.244.1.8", false)]);
    let mut lc = service("lc", "10.96.1.6", 80, Protocol::Tcp);
    lc.algorithm = Algorithm::LeastConn;
    state.set_port(lc, vec![ep("10.244.1.9", false), ep("10.244.1.10", false)]);
    let wide = service("wide", "10.96.1.7", 80, Protocol::Tcp);
    let many: Vec<_> = (0..20)
        .map(|i| ep(&format!("10.244.2.{i}"), false))
        .collect();
    state.set_port(wide, many);
    state.set_port(service("empty", "10.96.1.8", 80, Protocol::Tcp), vec![]);
    let mut v6 = service("v6", "fd00:10:96::5", 443, Protocol::Tcp);
    v6.node_port = 30443;
    state.set_port(
        v6,
        vec![ep("fd00:10:244::1", false), ep("fd00:10:244::2", true)],
    );
    let mut dual = service("dual", "10.96.1.10", 80, Protocol::Tcp);
    dual.cluster_ips.push("fd00:10:96::10".parse().unwrap());
    let eps = vec![ep("10.244.1.11", false), ep("fd00:10:244::3", false)];
    state.set_port(dual, eps);
    let mut aff6 = service("aff6", "fd00:10:96::6", 80, Protocol::Udp);
    aff6.affinity = Some(std::time::Duration::from_secs(60));
    state.set_port(aff6, vec![ep("fd00:10:244::4", false)]);
    let mut lc6 = service("lc6", "fd00:10:96::7", 53, Protocol::Udp);
    lc6.algorithm = Algorithm::LeastConn;
    state.set_port(lc6, vec![ep("fd00:10:244::5", false)]);
    state
}

/// `nft -j list ruleset` with every set's elements sorted (a hash set lists them in its own
/// order) and handles removed.
fn listing() -> serde_json::Value {
    fn normalise(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("handle");
                if let Some(serde_json::Value::Array(elems)) = m.get_mut("elem") {
                    elems.sort_by_key(|e| e.to_string());
                }
                m.values_mut().for_each(normalise);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(normalise),
            _ => {}
        }
    }
    let out = std::process::Command::new("nft")
        .args(["-j", "list", "ruleset"])
        .output()
        .expect("nft");
    assert!(out.status.success(), "{out:?}");
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nft's JSON");
    normalise(&mut v);
    v
}

#[test]
fn new_tables_loaded_over_netlink_equal_the_same_load_as_text() {
    let state = varied_state();
    let full = ChangeSet {
        full: true,
        ..Default::default()
    };
    let fresh = kpr_tests::Netns::new("nl-fresh").expect("netns");
    let (netlink, over_netlink) = fresh
        .run(|| {
            let mut dp = NftablesDataplane::new(&backend_config()).expect("backend");
            dp.sync(&state, &full).expect("full sync");
            let loaded = (dp.netlink_elements(), listing());
            // A later full resync reloads the same tables in place (keeping affinity clients),
            // and ends with the same tables.
            dp.sync(&state, &full).expect("second full sync");
            assert_eq!(
                dp.tables_replaced(),
                0,
                "the full resync replaced the tables"
            );
            assert!(listing() == loaded.1, "the full resync changed the tables");
            loaded
        })
        .expect("enter netns");
    let text = kpr_tests::Netns::new("nl-text").expect("netns");
    let (none, as_text) = text
        .run(|| {
            // Tables that exist are reloaded in place as one text transaction.
            let out = std::process::Command::new("nft")
                .args(["add table ip kpr; add table ip6 kpr"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let mut dp = NftablesDataplane::new(&backend_config()).expect("backend");
            dp.sync(&state, &full).expect("full sync");
            (dp.netlink_elements(), listing())
        })
        .expect("enter netns");
    assert!(netlink > 30, "only {netlink} elements went over netlink");
    assert_eq!(none, 0, "existing tables must be reloaded as text");
    let rendered = over_netlink.to_string();
    for part in [
        "10.244.2.19",
        "fd00:10:244::2",
        "rr_20_",
        "aff_10800",
        "198.51.100.0",
    ] {
        assert!(rendered.contains(part), "{part} missing from {rendered}");
    }
    assert!(
        over_netlink == as_text,
        "the tables differ:\nover netlink: {over_netlink:#}\nas text: {as_text:#}"
    );
}
