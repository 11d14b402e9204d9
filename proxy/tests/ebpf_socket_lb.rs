//! Kernel tests of the eBPF dataplane's socket-level load balancing: real programs attached to a
//! test cgroup, real client processes inside it, real echo servers in pod namespaces.
//!
//! Run as root: `cargo test -p proxy --features kpr-tests/root --test ebpf_socket_lb`.

mod ebpf_support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use ebpf_support::*;
use proxy::dataplane::ebpf::maps::{Table, CT, SERVICES, SLOTS};
use proxy::dataplane::ebpf::resize::footprints;
use proxy::dataplane::ebpf::MapSizes;
use proxy::dataplane::Dataplane;
use proxy::error::DataplaneError;
use proxy::model::{Algorithm, Protocol, ServicePortName};
use proxy::state::ProxyState;
use proxy_common::{CtKey, CtValue, ServiceKey, ServiceValue, SlotKey};

/// Not a test: the body of the client processes the tests spawn (see `ebpf_support::run_client`).
#[test]
#[ignore = "helper: runs only as a client process spawned by the other tests"]
fn client_process_entry() {
    let spec = std::env::var(CLIENT_ENV).expect("KPR_EBPF_CLIENT is set by the spawning test");
    run_client(&spec);
}

fn vip(port: u16) -> SocketAddr {
    SocketAddr::from((VIP, port))
}

/// One Service (clusterIP 10.96.0.10:80) over pods `idx`.
fn one_service(fx: &Fixture, idx: &[usize], algorithm: Algorithm) -> ProxyState {
    let n = name("web", Protocol::Tcp);
    let mut svc = service(&n, VIP, 80);
    svc.algorithm = algorithm;
    let mut state = ProxyState::default();
    state.set_port(svc, fx.endpoints(idx));
    state
}

#[test]
fn round_robin_is_exact_over_400_connections() {
    let mut fx = Fixture::new("rr", 4);
    let mut state = one_service(&fx, &[0, 1, 2, 3], Algorithm::RoundRobin);
    let stats = fx.sync(&mut state, &full());
    assert_eq!(stats.service_ports, 1);
    let lines = fx.client_lines(&format!("tcp {} 400", vip(80)));
    assert_eq!(lines.len(), 400, "{lines:?}");
    let pods: Vec<&str> = lines
        .iter()
        .map(|l| l.strip_prefix("pod ").unwrap_or_else(|| panic!("{l}")))
        .collect();
    // Exact rotation: every window of 4 successive connections covers the 4 pods.
    for w in pods.chunks(4) {
        let distinct: BTreeSet<&&str> = w.iter().collect();
        assert_eq!(distinct.len(), 4, "window {w:?}");
    }
    let counts = pod_counts(&lines);
    assert_eq!(counts.len(), 4);
    assert!(counts.values().all(|&c| c == 100), "{counts:?}");
    // The kernel counted the same: 100 connections per endpoint, none active any more.
    let live = fx.dp().live().counters().expect("counters");
    assert_eq!(live.len(), 4);
    for (addr, c) in &live {
        assert_eq!(c.total, 100, "{addr}");
        assert_eq!(c.active, 0, "{addr}: sock_release must give the count back");
    }
}

#[test]
fn least_connection_spreads_held_connections_within_one() {
    let mut fx = Fixture::new("lc", 4);
    let mut state = one_service(&fx, &[0, 1, 2, 3], Algorithm::LeastConn);
    fx.sync(&mut state, &full());
    let first = Held::start(&fx, vip(80), 6);
    let second = Held::start(&fx, vip(80), 5);
    let all: Vec<String> = first.pods.iter().chain(&second.pods).cloned().collect();
    let counts = pod_counts(&all.iter().map(|p| format!("pod {p}")).collect::<Vec<_>>());
    assert_eq!(counts.len(), 4, "{counts:?}");
    let (min, max) = (
        counts.values().min().unwrap(),
        counts.values().max().unwrap(),
    );
    assert!(max - min <= 1, "spread {counts:?}");
    let active = fx.dp().live_view().unwrap().active_connections();
    assert_eq!(active.values().sum::<u64>(), 11, "{active:?}");
    // Free the first client's 6: least-connection now fills the emptied endpoints first.
    first.release();
    std::thread::sleep(Duration::from_millis(100));
    let active = fx.dp().live_view().unwrap().active_connections();
    assert_eq!(active.values().sum::<u64>(), 5, "after release: {active:?}");
    let third = Held::start(&fx, vip(80), 7);
    let mut per_pod = pod_counts(
        &second
            .pods
            .iter()
            .map(|p| format!("pod {p}"))
            .collect::<Vec<_>>(),
    );
    for p in &third.pods {
        *per_pod.entry(p.clone()).or_default() += 1;
    }
    let (min, max) = (
        per_pod.values().min().unwrap(),
        per_pod.values().max().unwrap(),
    );
    assert!(max - min <= 1, "spread after refill {per_pod:?}");
    drop(third);
    drop(second);
}

#[test]
fn session_affinity_sticks_to_one_endpoint() {
    let mut fx = Fixture::new("aff", 4);
    let mut state = one_service(&fx, &[0, 1, 2, 3], Algorithm::RoundRobin);
    let n = name("web", Protocol::Tcp);
    edit_service(&mut state, &n, |svc| {
        svc.affinity = Some(Duration::from_secs(10800))
    });
    fx.sync(&mut state, &full());
    let lines = fx.client_lines(&format!("tcp {} 40", vip(80)));
    let counts = pod_counts(&lines);
    assert_eq!(
        counts.len(),
        1,
        "all 40 connections on one endpoint: {counts:?}"
    );
    assert_eq!(counts.values().sum::<usize>(), 40);
    // Without affinity the same client spreads again.
    edit_service(&mut state, &n, |svc| svc.affinity = None);
    fx.sync(&mut state, &changed(&[&n]));
    let counts = pod_counts(&fx.client_lines(&format!("tcp {} 40", vip(80))));
    assert_eq!(counts.len(), 4, "{counts:?}");
}

#[test]
fn service_without_endpoints_is_refused_at_once() {
    let mut fx = Fixture::new("none", 1);
    let mut state = one_service(&fx, &[], Algorithm::RoundRobin);
    fx.sync(&mut state, &full());
    let lines = fx.client_lines(&format!("tcp {} 3", vip(80)));
    assert_eq!(lines.len(), 3);
    for l in &lines {
        let mut w = l.split_whitespace();
        assert_eq!(w.next(), Some("err"), "{l}");
        assert_eq!(
            w.next(),
            Some("Refused"),
            "connect() must fail with ECONNREFUSED: {l}"
        );
        let ms: u128 = w.next().unwrap().parse().unwrap();
        assert!(ms < 100, "refusal took {ms} ms: {l}");
    }
    // A port the Service does not expose on its clusterIP is refused as well, at once.
    let lines = fx.client_lines(&format!("tcp {} 1", vip(81)));
    assert!(lines[0].starts_with("err Refused "), "{lines:?}");
    // An address of the service range that belongs to no Service fails at once (EPERM: a socket
    // program cannot drop silently).
    let lines = fx.client_lines("tcp 10.96.5.5:80 1");
    assert!(
        lines[0].starts_with("err Other(\"Operation not permitted"),
        "{lines:?}"
    );
}

#[test]
fn one_changed_endpoint_rewrites_only_that_service() {
    let mut fx = Fixture::new("incr", 4);
    let a = name("a", Protocol::Tcp);
    let b = name("b", Protocol::Tcp);
    let vip_b = std::net::Ipv4Addr::new(10, 96, 0, 11);
    let mut state = ProxyState::default();
    state.set_port(service(&a, VIP, 80), fx.endpoints(&[0, 1]));
    state.set_port(service(&b, vip_b, 80), fx.endpoints(&[2, 3]));
    fx.sync(&mut state, &full());
    let maps = maps_dir(fx.dp().bpffs_path());
    let services: Table<ServiceKey, ServiceValue> = Table::from_pin(&maps, SERVICES).unwrap();
    let slots: Table<SlotKey, u32> = Table::from_pin(&maps, SLOTS).unwrap();
    let set_a = fx.dp().set_ids(&a)[0];
    let set_b = fx.dp().set_ids(&b)[0];
    let b_before: Vec<_> = services
        .entries()
        .unwrap()
        .into_iter()
        .filter(|(_, v)| v.set_id == set_b)
        .collect();
    let slots_before = slots.entries().unwrap();

    // Pod 1 of service a is replaced by pod 2 (a new endpoint for a, shared with b).
    set_endpoints(&mut state, &a, fx.endpoints(&[0, 2]));
    let stats = fx.sync(&mut state, &changed(&[&a]));
    assert_eq!(stats.touched, 1);
    // slot 1 of a's set rewritten, pod 1's backend and counters deleted; pod 2's backend is
    // shared with b (no new backend), a's frontend keeps its value (same count).
    assert_eq!(stats.operations, 3, "{stats:?}");
    assert_eq!(fx.dp().set_ids(&a), vec![set_a]);
    assert_eq!(fx.dp().set_ids(&b), vec![set_b]);
    let b_after: Vec<_> = services
        .entries()
        .unwrap()
        .into_iter()
        .filter(|(_, v)| v.set_id == set_b)
        .collect();
    assert_eq!(b_before, b_after);
    let slots_after = slots.entries().unwrap();
    let unchanged_b = |s: &Vec<(SlotKey, u32)>| -> BTreeSet<(u32, u32, u32)> {
        s.iter()
            .filter(|(k, _)| k.set_id == set_b)
            .map(|(k, v)| (k.set_id, k.slot, *v))
            .collect()
    };
    assert_eq!(unchanged_b(&slots_before), unchanged_b(&slots_after));
    // Traffic to a now reaches pods 0 and 2 only.
    let counts = pod_counts(&fx.client_lines(&format!("tcp {} 8", vip(80))));
    let expected: BTreeSet<String> = [0, 2]
        .iter()
        .map(|&i| fx.cluster.pods[i].name.clone())
        .collect();
    assert_eq!(counts.keys().cloned().collect::<BTreeSet<_>>(), expected);
    // A full resync of an unchanged state writes nothing.
    let stats = fx.sync(&mut state, &full());
    assert_eq!(stats.operations, 0, "{stats:?}");
}

#[test]
fn unconnected_udp_replies_come_from_the_service_address() {
    let mut fx = Fixture::new("udp", 2);
    let n = name("dns", Protocol::Udp);
    let mut state = ProxyState::default();
    let mut eps = fx.endpoints(&[0, 1]);
    for e in &mut eps {
        e.port = kpr_tests::cluster::ECHO_PORT;
    }
    state.set_port(service(&n, VIP, 53), eps);
    fx.sync(&mut state, &full());
    let lines = fx.client_lines(&format!("udp {} 6", vip(53)));
    assert_eq!(lines.len(), 6, "{lines:?}");
    let pods: BTreeSet<&str> = lines
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        pods.len(),
        1,
        "one unconnected socket keeps its backend: {lines:?}"
    );
    for l in &lines {
        assert!(
            l.ends_with(&format!("from {}", vip(53))),
            "recvmsg must show the service: {l}"
        );
    }
}

#[test]
fn getpeername_shows_the_service_address() {
    let mut fx = Fixture::new("peer", 1);
    assert!(fx.dp().logs_drained(), "the aya-log ring buffer is drained");
    let mut state = one_service(&fx, &[0], Algorithm::RoundRobin);
    fx.sync(&mut state, &full());
    let lines = fx.client_lines(&format!("peer {}", vip(80)));
    assert_eq!(lines, vec![format!("peer {}", vip(80))]);
}

/// A dual-stack (AF_INET6, not V6ONLY) socket that reaches an IPv4 Service through its v4-mapped
/// address (`::ffff:10.96.0.10`, what Java and other dual-stack clients do) runs connect6, which
/// translates it as IPv4 and gives it the backend's v4-mapped address; getpeername6 shows the
/// mapped service address again.
#[test]
fn a_dual_stack_socket_reaches_an_ipv4_service_through_its_v4_mapped_address() {
    let mut fx = Fixture::new("mapped", 2);
    let mut state = one_service(&fx, &[0, 1], Algorithm::RoundRobin);
    fx.sync(&mut state, &full());
    let mapped = SocketAddr::from((VIP.to_ipv6_mapped(), 80));
    let lines = fx.client_lines(&format!("tcp {mapped} 4"));
    let counts = pod_counts(&lines);
    assert_eq!(counts.values().sum::<usize>(), 4, "{lines:?}");
    assert_eq!(
        counts.len(),
        2,
        "round-robin over both endpoints: {lines:?}"
    );
    let lines = fx.client_lines(&format!("peer {mapped}"));
    assert_eq!(lines, vec![format!("peer {mapped}")]);
}

/// Four pods behind one round-robin Service, programmed, and 3 connections made through it:
/// the fixture, its state, the port's name and its backend set ids.
fn serving_three_of_four(tag: &str) -> (Fixture, ProxyState, ServicePortName, Vec<u32>) {
    let mut fx = Fixture::new(tag, 4);
    let mut state = one_service(&fx, &[0, 1, 2, 3], Algorithm::RoundRobin);
    fx.sync(&mut state, &full());
    let n = name("web", Protocol::Tcp);
    let set = fx.dp().set_ids(&n);
    assert_eq!(
        pod_counts(&fx.client_lines(&format!("tcp {} 3", vip(80)))).len(),
        3
    );
    (fx, state, n, set)
}

#[test]
fn restart_reuses_pins_and_keeps_balancing_state() {
    let (mut fx, mut state, n, set) = serving_three_of_four("restart");
    // The agent goes away without cleanup: pinned links keep translating.
    drop(fx.dp.take());
    let counts = pod_counts(&fx.client_lines(&format!("tcp {} 4", vip(80))));
    assert_eq!(counts.len(), 4, "still balanced with no agent: {counts:?}");
    // A new agent recovers the ids and the cursor: 7 connections so far, so the next 4
    // continue the rotation and the totals stay exact.
    fx.restart();
    fx.sync(&mut state, &full());
    assert_eq!(fx.dp().set_ids(&n), set);
    let _ = fx.client_lines(&format!("tcp {} 5", vip(80)));
    let live = fx.dp().live().counters().unwrap();
    let totals: Vec<u64> = live.values().map(|c| c.total).collect();
    assert_eq!(totals, vec![3, 3, 3, 3], "{live:?}");
}

#[test]
fn restart_with_other_map_sizes_resizes_them_keeping_every_entry() {
    let (mut fx, mut state, n, set) = serving_three_of_four("resize");
    let dir = fx.dp().bpffs_path().join("maps");
    // A flow the tc program tracked (the test writes it: this dataplane has no tc path).
    let flow = CtKey {
        sport: 4242,
        ..CtKey::default()
    };
    Table::<CtKey, CtValue>::from_pin(&dir, CT)
        .unwrap()
        .put(flow, CtValue::default(), &"test".into(), &mut 0)
        .unwrap();
    let before = footprints(&dir);
    let ct_before = before.iter().find(|f| f.name == CT).unwrap().clone();
    assert_eq!(ct_before.max_entries, MapSizes::default().conntrack);

    drop(fx.dp.take());
    let sizes = MapSizes {
        services: 1024,
        backend_slots: 4096,
        backends: 4096,
        affinity: 1024,
        sockets: 2048,
        flows: 2048,
        conntrack: 8192,
        source_ranges: 1024,
        // An agent in snat mode sizes KPR_DSR 1.
        dsr_flows: 1,
    };
    fx.restart_with(sizes);
    let after = footprints(&dir);
    for f in &after {
        if let Some(want) = sizes.of(f.name) {
            assert_eq!(f.max_entries, want, "{} resized", f.name);
        }
    }
    for (b, a) in before.iter().zip(&after) {
        eprintln!(
            "{}: {} entries {:?} bytes -> {} entries {:?} bytes",
            b.name, b.max_entries, b.kernel_bytes, a.max_entries, a.kernel_bytes
        );
    }
    let ct_after = after.iter().find(|f| f.name == CT).unwrap();
    assert!(
        ct_after.kernel_bytes.unwrap() < ct_before.kernel_bytes.unwrap(),
        "a smaller preallocated LRU map costs less kernel memory: {ct_before:?} -> {ct_after:?}"
    );
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("_RESIZING"))
        .collect();
    assert!(leftovers.is_empty(), "set-aside pins left: {leftovers:?}");
    assert!(
        Table::<CtKey, CtValue>::from_pin(&dir, CT)
            .unwrap()
            .get(&flow)
            .unwrap()
            .is_some(),
        "the tracked flow was carried over"
    );
    // Frontends, sets, backends, counters and the round-robin cursor were carried over: the
    // agent finds its ids again, and 5 more connections continue the rotation (3 + 5 = 2 each).
    fx.sync(&mut state, &full());
    assert_eq!(fx.dp().set_ids(&n), set);
    let _ = fx.client_lines(&format!("tcp {} 5", vip(80)));
    let live = fx.dp().live().counters().unwrap();
    let totals: Vec<u64> = live.values().map(|c| c.total).collect();
    assert_eq!(totals, vec![2, 2, 2, 2], "{live:?}");
}

#[test]
fn cleanup_detaches_and_unpins_everything() {
    let mut fx = Fixture::new("clean", 1);
    let mut state = one_service(&fx, &[0], Algorithm::RoundRobin);
    fx.sync(&mut state, &full());
    let root = fx.dp().bpffs_path().to_path_buf();
    assert!(root.join("links/connect4").exists());
    fx.dp().cleanup().expect("cleanup");
    assert!(!root.exists(), "{} still exists", root.display());
    let lines = fx.client_lines(&format!("tcp {} 1", vip(80)));
    assert!(
        lines[0].starts_with("err"),
        "no translation after cleanup: {lines:?}"
    );
}

#[test]
fn a_full_map_is_an_error_naming_the_service() {
    // Each Service takes 2 entries of KPR_SERVICES (its frontend and its clusterIP marker).
    let sizes = MapSizes {
        services: 4,
        ..MapSizes::default()
    };
    let mut fx = Fixture::with_sizes("full", 1, sizes);
    let mut state = ProxyState::default();
    for i in 0..3u8 {
        let n = name(&format!("s{i}"), Protocol::Tcp);
        state.set_port(
            service(&n, std::net::Ipv4Addr::new(10, 96, 1, i), 80),
            fx.endpoints(&[0]),
        );
    }
    state.node = fx.cfg.node.clone();
    let err = fx
        .dp()
        .sync(&state, &full())
        .expect_err("3 services do not fit in 4 entries");
    match err {
        DataplaneError::MapFull {
            map,
            capacity,
            object,
        } => {
            assert_eq!(capacity, 4);
            assert!(map == "KPR_SERVICES" || map == "KPR_RR", "{map}");
            assert!(object.contains("default/s2"), "{object}");
        }
        other => panic!("expected MapFull, got {other}"),
    }
}

/// `n` Services `bulk-<i>` (clusterIPs 10.97.x.y:80) over pods 0 and 1 (pod 2 for every 7th).
fn bulk_state(fx: &Fixture, n: usize) -> ProxyState {
    let mut state = ProxyState::default();
    for i in 0..n {
        let svc_name = name(&format!("bulk-{i}"), Protocol::Tcp);
        let ip = std::net::Ipv4Addr::new(10, 97, (i / 250) as u8, (i % 250 + 1) as u8);
        let pods: &[usize] = if i % 7 == 0 { &[0, 1, 2] } else { &[0, 1] };
        state.set_port(service(&svc_name, ip, 80), fx.endpoints(pods));
    }
    state
}

fn bulk_ip(i: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 97, (i / 250) as u8, (i % 250 + 1) as u8)
}

#[test]
fn a_full_sync_of_thousands_of_services_uses_batch_operations() {
    const N: usize = 3000;
    let mut fx = Fixture::new("batch", 3);
    let (stats, batch) = full_sync_programs_every_service(&mut fx, N);
    // Thousands of entries went in a handful of batch syscalls (one per map written), none alone.
    assert_eq!(batch.singles, 0, "{batch:?}");
    assert!(
        (1..=10).contains(&batch.batches),
        "{batch:?} for {} writes",
        stats.operations
    );
}

/// More writes than one chunk (`BATCH_CHUNK`): flushed in several batches as the sync goes,
/// with the same outcome.
#[test]
fn a_full_sync_larger_than_a_batch_chunk_is_flushed_in_chunks() {
    let n = proxy::dataplane::ebpf::BATCH_CHUNK / 4;
    let mut fx = Fixture::new("chunks", 3);
    let (stats, batch) = full_sync_programs_every_service(&mut fx, n);
    assert!(
        stats.operations > proxy::dataplane::ebpf::BATCH_CHUNK,
        "{stats:?}"
    );
    assert_eq!(batch.singles, 0, "{batch:?}");
    // At least two chunks, each a batch per map written (frontends, slots, backends...).
    assert!(
        batch.batches > 5,
        "{batch:?} for {} writes",
        stats.operations
    );
}

/// A full sync of `n` bulk Services, checked entry by entry in the maps and by traffic to the
/// first and the last; its stats and how it reached the kernel.
fn full_sync_programs_every_service(
    fx: &mut Fixture,
    n: usize,
) -> (proxy::state::SyncStats, proxy::dataplane::ebpf::BatchStats) {
    let mut state = bulk_state(fx, n);
    let stats = fx.sync(&mut state, &full());
    assert_eq!(stats.service_ports, n);
    let batch = fx.dp().last_batch();
    assert!(stats.operations > 2 * n, "{stats:?}");
    // Every Service is in the maps: frontend -> set with its count -> slots -> known backends.
    let maps = maps_dir(fx.dp().bpffs_path());
    let services: Table<ServiceKey, ServiceValue> = Table::from_pin(&maps, SERVICES).unwrap();
    let slots: Table<SlotKey, u32> = Table::from_pin(&maps, SLOTS).unwrap();
    let backends: Table<u32, proxy_common::Backend> =
        Table::from_pin(&maps, proxy::dataplane::ebpf::maps::BACKENDS).unwrap();
    let slot_map: std::collections::HashMap<SlotKey, u32> =
        slots.entries().unwrap().into_iter().collect();
    let backend_ids: BTreeSet<u32> = backends
        .entries()
        .unwrap()
        .iter()
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(backend_ids.len(), 3, "one backend per distinct endpoint");
    // Reading back (batch lookups, 4,096 entries a syscall) sees every entry exactly once.
    let frontends = services.entries().unwrap();
    assert_eq!(
        frontends.len(),
        2 * n,
        "n frontends and n clusterIP markers"
    );
    let distinct: BTreeSet<_> = frontends.iter().map(|(k, _)| (k.addr, k.port)).collect();
    assert_eq!(distinct.len(), 2 * n);
    let slot_count: usize = (0..n).map(|i| if i % 7 == 0 { 3 } else { 2 }).sum();
    assert_eq!(slot_map.len(), slot_count);
    for i in 0..n {
        let key =
            proxy::dataplane::ebpf::compile::service_key(bulk_ip(i).into(), 80, Protocol::Tcp);
        let value = services
            .get(&key)
            .unwrap()
            .unwrap_or_else(|| panic!("bulk-{i}"));
        let expected = if i % 7 == 0 { 3 } else { 2 };
        assert_eq!(value.count, expected, "bulk-{i}");
        for slot in 0..value.count {
            let key = SlotKey {
                set_id: value.set_id,
                slot,
            };
            let id = slot_map
                .get(&key)
                .unwrap_or_else(|| panic!("bulk-{i} slot {slot}"));
            assert!(backend_ids.contains(id), "bulk-{i} slot {slot} -> {id}");
        }
    }
    // And traffic through the first and the last Service reaches the endpoints.
    for i in [0, n - 1] {
        let lines = fx.client_lines(&format!("tcp {}:80 6", bulk_ip(i)));
        let counts = pod_counts(&lines);
        assert_eq!(counts.values().sum::<usize>(), 6, "bulk-{i}: {lines:?}");
    }
    (stats, batch)
}

#[test]
fn an_incremental_change_after_a_batched_full_sync_touches_only_its_entries() {
    const N: usize = 2000;
    let mut fx = Fixture::new("batchincr", 3);
    let mut state = bulk_state(&fx, N);
    fx.sync(&mut state, &full());
    let before = fx.dp().last_batch();
    assert!(before.batches > 0, "{before:?}");
    let maps = maps_dir(fx.dp().bpffs_path());
    let services: Table<ServiceKey, ServiceValue> = Table::from_pin(&maps, SERVICES).unwrap();
    let slots: Table<SlotKey, u32> = Table::from_pin(&maps, SLOTS).unwrap();
    let services_before = services.entries().unwrap();
    let slots_before = slots.entries().unwrap();

    // bulk-5 (pods 0, 1) gets pod 2 as well: one new slot, then its frontend's count.
    let changed_name = name("bulk-5", Protocol::Tcp);
    let set = fx.dp().set_ids(&changed_name)[0];
    set_endpoints(&mut state, &changed_name, fx.endpoints(&[0, 1, 2]));
    let stats = fx.sync(&mut state, &changed(&[&changed_name]));
    assert_eq!(stats.touched, 1);
    assert_eq!(stats.operations, 2, "{stats:?}");
    assert_eq!(
        fx.dp().last_batch(),
        before,
        "no batch for an incremental sync"
    );
    let others = |entries: Vec<(ServiceKey, ServiceValue)>| -> Vec<(ServiceKey, ServiceValue)> {
        let mut v: Vec<_> = entries
            .into_iter()
            .filter(|(_, v)| v.set_id != set)
            .collect();
        v.sort_by_key(|(k, _)| (k.addr, k.port, k.proto, k.scope));
        v
    };
    assert_eq!(others(services_before), others(services.entries().unwrap()));
    let mut slots_after = slots.entries().unwrap();
    let added: Vec<_> = slots_after
        .iter()
        .filter(|e| !slots_before.contains(e))
        .copied()
        .collect();
    assert_eq!(added.len(), 1, "{added:?}");
    assert_eq!((added[0].0.set_id, added[0].0.slot), (set, 2));
    slots_after.retain(|e| *e != added[0]);
    let mut slots_before = slots_before;
    slots_before.sort_by_key(|(k, _)| (k.set_id, k.slot));
    slots_after.sort_by_key(|(k, _)| (k.set_id, k.slot));
    assert_eq!(slots_before, slots_after);
    let key = proxy::dataplane::ebpf::compile::service_key(bulk_ip(5).into(), 80, Protocol::Tcp);
    assert_eq!(services.get(&key).unwrap().map(|v| v.count), Some(3));
}

#[test]
fn an_address_freed_and_taken_in_one_full_sync_keeps_the_new_owner() {
    let mut fx = Fixture::new("takeover", 2);
    // "z-old" sorts after "b-new": the removal must still come first.
    let old = name("z-old", Protocol::Tcp);
    let new = name("b-new", Protocol::Tcp);
    let mut state = ProxyState::default();
    state.set_port(service(&old, VIP, 80), fx.endpoints(&[0]));
    fx.sync(&mut state, &full());
    state.remove(&old);
    state.set_port(service(&new, VIP, 80), fx.endpoints(&[1]));
    let stats = fx.sync(&mut state, &full());
    assert_eq!((stats.service_ports, stats.touched), (1, 2), "{stats:?}");
    let maps = maps_dir(fx.dp().bpffs_path());
    let services: Table<ServiceKey, ServiceValue> = Table::from_pin(&maps, SERVICES).unwrap();
    let key = proxy::dataplane::ebpf::compile::service_key(VIP.into(), 80, Protocol::Tcp);
    let value = services.get(&key).unwrap().expect("b-new's frontend");
    assert_eq!(value.set_id, fx.dp().set_ids(&new)[0]);
    let counts = pod_counts(&fx.client_lines(&format!("tcp {} 2", vip(80))));
    assert_eq!(counts.get(&fx.cluster.pods[1].name), Some(&2), "{counts:?}");
}
