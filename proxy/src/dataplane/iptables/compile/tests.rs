//! The rules one service port compiles to, case by case, and the chain count at scale.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::*;
use crate::model::fixtures;
use crate::selection::NodeContext;

const NODE: &str = "node-a";

fn svc(name: &str, vip: &str) -> ServicePort {
    fixtures::service_port(name, vip)
}

fn ep(last: u8, node: &str) -> Endpoint {
    fixtures::endpoint(Ipv4Addr::new(10, 244, 1, last), node)
}

fn node() -> NodeContext {
    NodeContext {
        node_name: NODE.into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        node_ips: vec!["192.0.2.1".parse().unwrap()],
        masquerade_all: false,
        zone: None,
        maglev_table_size: Default::default(),
    }
}

fn state(ports: Vec<(ServicePort, Vec<Endpoint>)>) -> ProxyState {
    let mut state = ProxyState::new(node());
    for (svc, eps) in ports {
        state.set_port(svc, eps);
    }
    state
}

fn run(svc: ServicePort, eps: Vec<Endpoint>) -> Compiled {
    let spn = svc.name.clone();
    let state = state(vec![(svc, eps)]);
    compile(&state, &spn, &mut TargetIds::default(), IpFamily::V4)
}

const M: &str = "-d 10.96.0.10/32 -p tcp -m tcp --dport 80 ";

#[test]
fn a_cluster_ip_port_lives_in_its_bucket_with_the_frontend_on_every_rule() {
    let c = run(
        svc("web", "10.96.0.10"),
        vec![ep(1, NODE), ep(2, NODE), ep(3, "other")],
    );
    assert!(c.chains.is_empty(), "no chain of its own: {:?}", c.chains);
    let b = c.bucket.expect("bucketed");
    assert_eq!(b.bucket, bucket_of("default/web/TCP"));
    assert_eq!(
        c.services,
        vec![format!(
            "{M}-m comment --comment \"default/web/TCP cluster IP\" -j {}",
            bucket_chain(b.bucket)
        )]
    );
    assert_eq!(
        b.rules,
        vec![
            format!("{M}-j {MASQ_EXTERNAL}"),
            format!("{M}-m statistic --mode nth --every 3 --packet 0 -j DNAT --to-destination 10.244.1.1:8080"),
            format!("{M}-m statistic --mode nth --every 2 --packet 0 -j DNAT --to-destination 10.244.1.2:8080"),
            format!("{M}-j DNAT --to-destination 10.244.1.3:8080"),
        ]
    );
    assert_eq!(
        c.endpoint_ips
            .iter()
            .map(|a| match a {
                IpAddr::V4(a) => a.octets()[3],
                IpAddr::V6(_) => unreachable!("an IPv4 port"),
            })
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(
        c.cluster_ips,
        vec![IpAddr::from(Ipv4Addr::new(10, 96, 0, 10))]
    );
}

#[test]
fn twenty_thousand_cluster_ip_ports_use_at_most_the_bucket_chains() {
    let ports: Vec<(ServicePort, Vec<Endpoint>)> = (0..20_000u32)
        .map(|i| {
            let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i);
            let eps = (1..=4).map(|k| ep(k, NODE)).collect();
            (svc(&format!("svc-{i}"), &vip.to_string()), eps)
        })
        .collect();
    let state = state(ports);
    let mut ids = TargetIds::default();
    let mut chains = BTreeSet::new();
    for spn in state.names() {
        let c = compile(&state, spn, &mut ids, IpFamily::V4);
        assert!(c.chains.is_empty(), "{spn}: {:?}", c.chains);
        chains.insert(c.bucket.expect("bucketed").bucket);
    }
    assert_eq!(chains.len(), usize::from(BUCKETS));
}

#[test]
fn no_endpoint_marks_and_stops_nat_in_the_bucket() {
    let c = run(svc("web", "10.96.0.10"), vec![]);
    let rules = c.bucket.expect("bucketed").rules;
    assert_eq!(
        rules[1..],
        [
            format!("{M}-j MARK --or-mark {MARK_REJECT:#x}"),
            format!("{M}-j ACCEPT"),
        ]
    );
    assert!(c.endpoint_ips.is_empty());
}

#[test]
fn affinity_checks_every_endpoint_before_round_robin_records_the_choice() {
    let mut s = svc("web", "10.96.0.10");
    s.affinity = Some(Duration::from_secs(60));
    let c = run(s, vec![ep(1, NODE), ep(2, NODE)]);
    let rules = c.bucket.expect("bucketed").rules;
    let list = |last: u8| {
        affinity_list(
            "default/web/TCP",
            SocketAddr::new(Ipv4Addr::new(10, 244, 1, last).into(), 8080),
        )
    };
    assert_eq!(
        rules[1..],
        [
            format!("{M}-m recent --name {} --rcheck --seconds 60 --reap -j DNAT --to-destination 10.244.1.1:8080", list(1)),
            format!("{M}-m recent --name {} --rcheck --seconds 60 --reap -j DNAT --to-destination 10.244.1.2:8080", list(2)),
            format!("{M}-m statistic --mode nth --every 2 --packet 0 -m recent --name {} --set -j DNAT --to-destination 10.244.1.1:8080", list(1)),
            format!("{M}-m recent --name {} --set -j DNAT --to-destination 10.244.1.2:8080", list(2)),
        ]
    );
}

#[test]
fn a_node_port_shares_one_chain_with_the_cluster_ip_and_masquerades_inline() {
    let mut s = svc("web", "10.96.0.10");
    s.node_port = 30080;
    let c = run(s, vec![ep(1, NODE), ep(2, NODE)]);
    assert!(c.bucket.is_none());
    assert_eq!(c.chains.len(), 1, "{:?}", c.chains);
    let (chain, rules) = c.chains.iter().next().unwrap();
    assert!(chain.starts_with("KPR-SVC-"), "{chain}");
    assert_eq!(
        rules,
        &vec![
            "-p tcp -m statistic --mode nth --every 2 --packet 0 -j DNAT --to-destination 10.244.1.1:8080".to_string(),
            "-p tcp -j DNAT --to-destination 10.244.1.2:8080".to_string(),
        ]
    );
    assert_eq!(
        c.services,
        vec![
            format!("{M}-j {MASQ_EXTERNAL}"),
            format!("{M}-m comment --comment \"default/web/TCP cluster IP\" -j {chain}"),
        ]
    );
    let np = "-p tcp -m tcp --dport 30080 ";
    assert_eq!(
        c.nodeports,
        vec![
            format!("{np}-j {MARK_MASQ_CHAIN}"),
            format!("{np}-m comment --comment \"default/web/TCP node port\" -j {chain}"),
        ]
    );
}

#[test]
fn external_traffic_local_routes_each_source_class_in_its_own_chain() {
    let mut s = svc("web", "10.96.0.10");
    s.node_port = 30080;
    s.external_local = true;
    let c = run(s, vec![ep(1, NODE), ep(2, "other")]);
    let ext: Vec<&String> = c
        .chains
        .keys()
        .filter(|k| k.starts_with("KPR-EXT-"))
        .collect();
    assert_eq!(ext.len(), 1, "{:?}", c.chains.keys());
    let rules = &c.chains[ext[0]];
    // node: masquerade, cluster endpoints; pod: cluster endpoints; external: local only.
    assert!(
        rules[0].starts_with("-m addrtype --src-type LOCAL -j KPR-MARK-MASQ"),
        "{rules:?}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r.starts_with("-s 10.244.0.0/16 -j KPR-SVC-")),
        "{rules:?}"
    );
    let last = rules.last().unwrap();
    assert!(
        last.starts_with("-j KPR-SVC-") && !rules[1].ends_with(last.trim_start_matches("-j ")),
        "{rules:?}"
    );
    assert_eq!(
        c.chains.len(),
        3,
        "EXT + cluster route + local route: {:?}",
        c.chains.keys()
    );
    assert_eq!(c.nodeports.len(), 1, "{:?}", c.nodeports);
}

#[test]
fn source_ranges_guard_the_lb_ip_and_return_when_allowed() {
    let mut s = svc("web", "10.96.0.10");
    s.load_balancer_ips = vec!["198.51.100.10".parse().unwrap()];
    s.source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
    let c = run(s, vec![ep(1, NODE)]);
    let fw: Vec<(&String, &Vec<String>)> = c
        .chains
        .iter()
        .filter(|(k, _)| k.starts_with("KPR-FW-"))
        .collect();
    assert_eq!(fw.len(), 1);
    let (fw_chain, rules) = fw[0];
    assert_eq!(
        rules,
        &vec![
            "-s 203.0.113.0/24 -j RETURN".to_string(),
            "-s 198.51.100.10/32 -j RETURN".to_string(),
            "-m addrtype --src-type LOCAL -j RETURN".to_string(),
            format!("-j MARK --or-mark {MARK_DROP:#x}"),
            "-j ACCEPT".to_string(),
        ]
    );
    let lb = "-d 198.51.100.10/32 -p tcp -m tcp --dport 80 ";
    let lb_rules: Vec<&String> = c.services.iter().filter(|r| r.starts_with(lb)).collect();
    assert_eq!(lb_rules[0], &format!("{lb}-j {fw_chain}"));
    assert_eq!(lb_rules[1], &format!("{lb}-j {MARK_MASQ_CHAIN}"));
    assert!(lb_rules[2].contains("-j KPR-SVC-"), "{lb_rules:?}");
}

#[test]
fn least_connection_marks_the_target_and_jumps_to_its_pick_chain() {
    let mut s = svc("web", "10.96.0.10");
    s.algorithm = Algorithm::LeastConn;
    let c = run(s, vec![ep(1, NODE), ep(2, NODE)]);
    assert!(
        c.bucket.is_none(),
        "least-connection ports are not bucketed"
    );
    assert_eq!(c.lc.len(), 1);
    let t = &c.lc[0];
    let svc_rules = &c.chains[c.chains.keys().find(|k| k.starts_with("KPR-SVC-")).unwrap()];
    assert_eq!(
        svc_rules,
        &vec![
            format!("-p tcp -j CONNMARK --set-xmark {:#x}/0xffffffff", t.id),
            format!("-p tcp -j {}", t.chain),
        ]
    );
    assert_eq!(c.chains[&t.chain], Vec::<String>::new());
    let picks = [1, 2, 3].map(|n| SocketAddr::new(Ipv4Addr::new(10, 244, 1, n).into(), 8080));
    assert_eq!(
        t.pick_rules(&picks[..1]),
        [format!(
            "-A {} -p tcp -j DNAT --to-destination 10.244.1.1:8080",
            t.chain
        )]
    );
    assert_eq!(
        t.pick_rules(&picks),
        [
            format!(
                "-A {} -p tcp -m statistic --mode nth --every 3 --packet 0 -j DNAT \
                 --to-destination 10.244.1.1:8080",
                t.chain
            ),
            format!(
                "-A {} -p tcp -m statistic --mode nth --every 2 --packet 0 -j DNAT \
                 --to-destination 10.244.1.2:8080",
                t.chain
            ),
            format!(
                "-A {} -p tcp -j DNAT --to-destination 10.244.1.3:8080",
                t.chain
            ),
        ]
    );
}

#[test]
fn masquerade_all_marks_every_source_in_the_bucket() {
    let s = svc("web", "10.96.0.10");
    let spn = s.name.clone();
    let mut st = state(vec![(s, vec![ep(1, NODE)])]);
    st.node.masquerade_all = true;
    let c = compile(&st, &spn, &mut TargetIds::default(), IpFamily::V4);
    assert_eq!(
        c.bucket.expect("bucketed").rules[0],
        format!("{M}-j {MARK_MASQ_CHAIN}")
    );
}

#[test]
fn each_family_compiles_its_own_addresses_and_endpoints() {
    let mut s = svc("web", "10.96.0.10");
    s.cluster_ips.push("fd00:10:96::10".parse().unwrap());
    s.node_port = 30080;
    let spn = s.name.clone();
    let mut v6 = ep(1, NODE);
    v6.addr = "fd00:10:244:1::2".parse().unwrap();
    let st = state(vec![(s, vec![ep(2, NODE), v6])]);
    let mut ids = TargetIds::default();
    let c4 = compile(&st, &spn, &mut ids, IpFamily::V4);
    let c6 = compile(&st, &spn, &mut ids, IpFamily::V6);
    assert_eq!(
        c4.cluster_ips,
        vec![IpAddr::from(Ipv4Addr::new(10, 96, 0, 10))]
    );
    assert_eq!(
        c6.cluster_ips,
        vec!["fd00:10:96::10".parse::<IpAddr>().unwrap()]
    );
    let all = |c: &Compiled| {
        c.chains
            .values()
            .flatten()
            .chain(&c.services)
            .chain(&c.nodeports)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (r4, r6) = (all(&c4), all(&c6));
    assert!(r4.contains("--to-destination 10.244.1.2:8080"), "{r4}");
    assert!(!r4.contains("fd00"), "{r4}");
    assert!(
        r6.contains("-d fd00:10:96::10/128 -p tcp"),
        "the IPv6 clusterIP: {r6}"
    );
    assert!(
        r6.contains("--to-destination [fd00:10:244:1::2]:8080"),
        "{r6}"
    );
    assert!(!r6.contains("10.244.1.2"), "{r6}");
    assert!(!c6.nodeports.is_empty(), "the nodePort serves IPv6 too");
    assert_eq!(
        c6.endpoint_ips.iter().collect::<Vec<_>>(),
        [&"fd00:10:244:1::2".parse::<IpAddr>().unwrap()]
    );
}

/// `-m mark --mark V/M` of a rule, if it has one.
fn mark_match(rule: &str) -> Option<(u32, u32)> {
    let w: Vec<&str> = rule.split_whitespace().collect();
    let i = w.iter().position(|x| *x == "--mark")?;
    let (v, m) = w[i + 1].split_once('/')?;
    let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    Some((hex(v), hex(m)))
}

/// A rule's mark match and the chain it jumps to.
type ParsedRule<'a> = (Option<(u32, u32)>, &'a str);

/// The chain a rule jumps to.
fn jump(rule: &str) -> &str {
    rule.rsplit("-j ")
        .next()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
}

#[test]
fn maglev_dispatches_every_slot_to_its_tables_endpoint_and_keeps_the_masquerade_bit() {
    let mut s = svc("web", "10.96.0.10");
    s.algorithm = Algorithm::Maglev;
    let eps: Vec<Endpoint> = (1..=5).map(|k| ep(k, NODE)).collect();
    let state = state(vec![(s, eps)]);
    let spn = state.names().next().unwrap().clone();
    let c = compile(&state, &spn, &mut TargetIds::default(), IpFamily::V4);
    let port = state.get(&spn).unwrap();
    let table = port
        .selected
        .maglev_table(&port.selected.cluster, IpFamily::V4)
        .unwrap()
        .clone();
    let rules = c
        .bucket
        .expect("a ClusterIP-only port stays in its bucket")
        .rules;
    let hmark =
        "-j HMARK --hmark-tuple src,dst,sport,dport,proto --hmark-mod 16381 --hmark-rnd 0x6b70726d";
    assert_eq!(
        rules[1..],
        [
            format!("{M}-m mark --mark 0x4000/0x4000 {hmark} --hmark-offset 0x4000"),
            format!("{M}-m mark ! --mark 0x4000/0x4000 {hmark}"),
            format!("{M}-j {}", jump(&rules[3])),
        ]
    );
    let dispatch = &c.chains[jump(&rules[3])];
    assert_eq!(dispatch.len(), 64, "one block chain per 256 slots");
    // Each chain's rules as (mark match, jump), parsed once.
    let parsed: BTreeMap<&str, Vec<ParsedRule>> = c
        .chains
        .iter()
        .map(|(name, rules)| {
            let rules = rules.iter().map(|r| (mark_match(r), jump(r))).collect();
            (name.as_str(), rules)
        })
        .collect();
    let mut total = 0;
    for slot in 0..16381u32 {
        for masq in [0, MARK_MASQ] {
            let mark = slot + masq;
            let first = |chain: &str| -> &str {
                parsed[chain]
                    .iter()
                    .find(|(mm, _)| mm.is_none_or(|(v, m)| mark & m == v))
                    .map(|(_, j)| *j)
                    .unwrap_or_else(|| panic!("slot {slot}: no rule of {chain} matches"))
            };
            let block = first(jump(&rules[3]));
            let ep_chain = &c.chains[first(block)];
            // Clearing the slot bits keeps the masquerade bit (and any bit above it).
            assert_eq!(ep_chain[0], "-j MARK --and-mark 0xffffc000");
            assert_eq!(mark & 0xffff_c000, masq);
            let want = table.at(slot).unwrap();
            assert_eq!(
                ep_chain[1],
                format!("-p tcp -j DNAT --to-destination {want}"),
                "slot {slot}"
            );
        }
    }
    for (name, rules) in &c.chains {
        if name.starts_with("KPR-MGB-") {
            total += rules.len();
        }
    }
    // Every endpoint but each block's most common one needs rules: about M x (1 - 1/N).
    println!("5 endpoints, 16381 slots: {total} block rules");
    assert!(total < 16381 * 4 / 5 + 64, "{total} block rules");
    assert_eq!(
        c.chains
            .keys()
            .filter(|k| k.starts_with("KPR-MGE-"))
            .count(),
        5
    );
}
