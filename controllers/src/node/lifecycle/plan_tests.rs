use super::*;
use serde_json::json;
use std::time::{Duration, Instant};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn node(v: serde_json::Value) -> Node {
    serde_json::from_value(v).unwrap()
}

const GRACE: Grace = Grace {
    startup: Duration::from_secs(60),
    monitor: Duration::from_secs(50),
};

fn ready_node(status: &str, heartbeat: &str) -> Node {
    node(json!({
        "metadata": {"name": "n", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"conditions": [
            {"type": "Ready", "status": status, "lastHeartbeatTime": heartbeat,
             "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "KubeletReady"},
            {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat,
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "NetworkUnavailable", "status": "False",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]}
    }))
}

/// `TestMonitorNodeHealthUpdateStatus`'s shape: a Node first seen is given until the grace
/// period from now; quiet past it, Ready and the pressure conditions become Unknown
/// (NetworkUnavailable stays), the missing ones added as never updated.
#[test]
fn a_quiet_node_goes_unknown_after_the_grace_period() {
    let n = ready_node("True", "2026-01-01T00:00:10Z");
    let t0 = ts("2026-01-01T00:01:00Z");
    let first = check_health(None, &n, None, t0, GRACE);
    assert_eq!(first.health.probe, t0, "first seen: now");
    assert_eq!(first.write, None);
    let t1 = ts("2026-01-01T00:01:50Z");
    let same = check_health(Some(&first.health), &n, None, t1, GRACE);
    assert_eq!(same.write, None, "exactly the grace period: not yet");
    let t2 = ts("2026-01-01T00:01:51Z");
    let late = check_health(Some(&same.health), &n, None, t2, GRACE);
    let conditions = late.write.expect("written");
    let by_type = |t: &str| conditions.iter().find(|c| c.type_ == t).unwrap().clone();
    let ready = by_type("Ready");
    assert_eq!(ready.status, "Unknown");
    assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(
        ready.message.as_deref(),
        Some("Kubelet stopped posting node status.")
    );
    assert_eq!(ready.last_transition_time.unwrap().0, t2);
    assert_eq!(
        ready.last_heartbeat_time.unwrap().0,
        ts("2026-01-01T00:00:10Z")
    );
    assert_eq!(by_type("MemoryPressure").status, "Unknown");
    assert_eq!(by_type("NetworkUnavailable").status, "False");
    let never = by_type("DiskPressure");
    assert_eq!(never.reason.as_deref(), Some("NodeStatusNeverUpdated"));
    assert_eq!(
        never.message.as_deref(),
        Some("Kubelet never posted node status.")
    );
    assert_eq!(
        never.last_heartbeat_time.unwrap().0,
        ts("2026-01-01T00:00:00Z")
    );
    assert_eq!(by_type("PIDPressure").status, "Unknown");
    assert_eq!(late.current_ready.unwrap().status, "Unknown");
    assert_eq!(late.observed_ready.status, "True");
}

#[test]
fn an_unknown_node_is_not_written_again() {
    let n = ready_node("Unknown", "2026-01-01T00:00:10Z");
    let first = check_health(None, &n, None, ts("2026-01-01T00:01:00Z"), GRACE);
    let later = check_health(
        Some(&first.health),
        &n,
        None,
        ts("2026-01-01T00:05:00Z"),
        GRACE,
    );
    assert_eq!(later.write, None, "Ready is Unknown already");
    assert_eq!(later.current_ready.unwrap().status, "Unknown");
}

#[test]
fn a_new_heartbeat_or_lease_renewal_resets_the_probe() {
    let t0 = ts("2026-01-01T00:01:00Z");
    let first = check_health(
        None,
        &ready_node("True", "2026-01-01T00:00:10Z"),
        None,
        t0,
        GRACE,
    );
    let t1 = ts("2026-01-01T00:01:40Z");
    let beat = check_health(
        Some(&first.health),
        &ready_node("True", "2026-01-01T00:01:30Z"),
        None,
        t1,
        GRACE,
    );
    assert_eq!(beat.health.probe, t1);
    assert_eq!(
        beat.health.ready_transition, t0,
        "same transition time: kept"
    );
    // Heartbeats stop; the Lease is renewed: healthy.
    let n = ready_node("True", "2026-01-01T00:01:30Z");
    let renew = |s: &str| Some(Some(ts(s)));
    let t2 = ts("2026-01-01T00:02:00Z");
    let l1 = check_health(
        Some(&beat.health),
        &n,
        renew("2026-01-01T00:01:59Z"),
        t2,
        GRACE,
    );
    assert_eq!(l1.health.probe, t2);
    let t3 = ts("2026-01-01T00:02:45Z");
    let l2 = check_health(
        Some(&l1.health),
        &n,
        renew("2026-01-01T00:02:40Z"),
        t3,
        GRACE,
    );
    assert_eq!((l2.health.probe, l2.write.is_none()), (t3, true));
    // The same renewal seen again is no heartbeat: quiet past the grace period.
    let t4 = ts("2026-01-01T00:03:36Z");
    let l3 = check_health(
        Some(&l2.health),
        &n,
        renew("2026-01-01T00:02:40Z"),
        t4,
        GRACE,
    );
    assert_eq!(l3.health.probe, t3);
    assert!(l3.write.is_some());
}

#[test]
fn a_node_that_never_reported_gets_the_startup_grace_from_its_creation() {
    let n = node(json!({"metadata": {"name": "n", "creationTimestamp": "2026-01-01T00:00:00Z"}}));
    let early = check_health(None, &n, None, ts("2026-01-01T00:00:59Z"), GRACE);
    assert_eq!(early.write, None);
    assert_eq!(early.current_ready, None);
    assert_eq!(early.health.probe, ts("2026-01-01T00:00:00Z"));
    let late = check_health(
        Some(&early.health),
        &n,
        None,
        ts("2026-01-01T00:01:01Z"),
        GRACE,
    );
    let conditions = late.write.unwrap();
    assert_eq!(conditions.len(), 4);
    assert!(conditions
        .iter()
        .all(|c| c.status == "Unknown" && c.reason.as_deref() == Some("NodeStatusNeverUpdated")));
    // A Lease alone keeps it healthy (no Ready condition: nothing written).
    let leased = check_health(
        Some(&early.health),
        &n,
        Some(Some(ts("2026-01-01T00:01:00Z"))),
        ts("2026-01-01T00:01:01Z"),
        GRACE,
    );
    assert_eq!(leased.write, None);
}

/// `TestTaintsNodeByCondition`.
#[test]
fn no_schedule_taints_follow_conditions_and_unschedulable() {
    let n = node(json!({
        "metadata": {"name": "n"},
        "spec": {"unschedulable": true, "taints": [
            {"key": TAINT_DISK_PRESSURE, "effect": "NoSchedule"},
            {"key": TAINT_NOT_READY, "effect": "NoExecute"},
            {"key": "user", "effect": "NoSchedule"}
        ]},
        "status": {"conditions": [
            {"type": "Ready", "status": "False"},
            {"type": "MemoryPressure", "status": "True"},
            {"type": "DiskPressure", "status": "False"},
            {"type": "PIDPressure", "status": "True"},
            {"type": "NetworkUnavailable", "status": "True"}
        ]}
    }));
    let (add, remove) = no_schedule_taints(&n);
    let keys = |v: &[Taint]| v.iter().map(|t| t.key.clone()).collect::<Vec<_>>();
    assert_eq!(
        keys(&add),
        [
            TAINT_NOT_READY,
            TAINT_MEMORY_PRESSURE,
            TAINT_PID_PRESSURE,
            TAINT_NETWORK_UNAVAILABLE,
            TAINT_UNSCHEDULABLE
        ]
    );
    assert!(add.iter().all(|t| t.effect == "NoSchedule"));
    assert_eq!(
        keys(&remove),
        [TAINT_DISK_PRESSURE],
        "the user's taint is left alone"
    );
    let unknown = ready_node("Unknown", "2026-01-01T00:00:00Z");
    assert_eq!(keys(&no_schedule_taints(&unknown).0), [TAINT_UNREACHABLE]);
}

#[test]
fn swapping_taints_adds_updates_and_removes_by_key_and_effect() {
    let mut t = taint(TAINT_UNREACHABLE, "NoExecute");
    t.time_added = Some(Time(ts("2026-01-01T00:00:00Z")));
    let current = vec![
        taint(TAINT_NOT_READY, "NoExecute"),
        taint("x", "NoSchedule"),
    ];
    let out = swapped_taints(
        &current,
        std::slice::from_ref(&t),
        &[taint(TAINT_NOT_READY, "NoExecute")],
    )
    .unwrap();
    assert_eq!(out, vec![taint("x", "NoSchedule"), t.clone()]);
    assert_eq!(
        swapped_taints(&out, std::slice::from_ref(&t), &[]),
        None,
        "same taint: no change"
    );
    let mut newer = t.clone();
    newer.time_added = Some(Time(ts("2026-01-01T00:01:00Z")));
    assert!(
        swapped_taints(&out, &[newer], &[]).is_some(),
        "a new timeAdded updates it"
    );
    assert_eq!(
        swapped_taints(&out, &[], &[taint(TAINT_NOT_READY, "NoExecute")]),
        None
    );
}

#[test]
fn beta_labels_follow_the_stable_ones() {
    let n = node(json!({"metadata": {"name": "n", "labels": {
        "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/arch": "arm64"}}}));
    let want: BTreeMap<String, String> = [
        ("beta.kubernetes.io/arch".to_string(), "amd64".to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
    ]
    .into();
    assert_eq!(labels_to_reconcile(&n), want);
    assert!(labels_to_reconcile(&node(json!({"metadata": {"name": "n"}}))).is_empty());
}

#[test]
fn zone_keys_prefer_the_beta_labels() {
    assert_eq!(zone_key(&node(json!({"metadata": {"name": "n"}}))), "");
    let n = node(json!({"metadata": {"name": "n", "labels": {
        "topology.kubernetes.io/zone": "z1", "failure-domain.beta.kubernetes.io/zone": "z0",
        "topology.kubernetes.io/region": "r"}}}));
    assert_eq!(zone_key(&n), "r:\u{0}:z0");
}

const RATES: Rates = Rates {
    eviction: 0.1,
    secondary_eviction: 0.01,
    large_cluster_threshold: 50,
    unhealthy_zone_threshold: 0.55,
};

fn statuses(ready: usize, not_ready: usize) -> Vec<Option<String>> {
    let mut v = vec![Some("True".to_string()); ready];
    v.extend(std::iter::repeat_n(Some("Unknown".to_string()), not_ready));
    v
}

/// `TestComputeZoneState`-style cases.
#[test]
fn zone_states_from_ready_counts() {
    assert_eq!(RATES.zone_state(&statuses(3, 0)), (0, ZoneState::Normal));
    assert_eq!(
        RATES.zone_state(&statuses(0, 2)),
        (2, ZoneState::FullDisruption)
    );
    assert_eq!(RATES.zone_state(&[None]), (1, ZoneState::FullDisruption));
    assert_eq!(
        RATES.zone_state(&statuses(1, 2)),
        (2, ZoneState::Normal),
        "at most 2: normal"
    );
    assert_eq!(
        RATES.zone_state(&statuses(2, 3)),
        (3, ZoneState::PartialDisruption)
    );
    assert_eq!(
        RATES.zone_state(&statuses(3, 3)),
        (3, ZoneState::Normal),
        "50% < 55%"
    );
    assert_eq!(RATES.qps(ZoneState::PartialDisruption, 50), Some(0.0));
    assert_eq!(RATES.qps(ZoneState::PartialDisruption, 51), Some(0.01));
    assert_eq!(RATES.qps(ZoneState::FullDisruption, 3), Some(0.1));
}

#[test]
fn disruption_modes_enter_and_leave() {
    let mut zones = Zones::default();
    let one = |r, n| BTreeMap::from([("".to_string(), statuses(r, n))]);
    let d = zones.handle(&one(3, 0), &RATES);
    assert_eq!(d.rates, vec![("".to_string(), 0.1)], "initial to normal");
    assert_eq!(zones.handle(&one(3, 0), &RATES), Disruption::default());
    let d = zones.handle(&one(0, 3), &RATES);
    assert!(d.entered_full);
    assert_eq!(
        d.rates,
        vec![("".to_string(), 0.0)],
        "all zones down: stop tainting"
    );
    assert_eq!(
        zones.handle(&one(0, 3), &RATES),
        Disruption::default(),
        "still down"
    );
    let d = zones.handle(&one(1, 2), &RATES);
    assert!(d.left_full);
    assert_eq!(d.rates, vec![("".to_string(), 0.1)]);
    // Two zones, one fully down: that one keeps the normal rate.
    let two = BTreeMap::from([
        ("a".to_string(), statuses(0, 2)),
        ("b".to_string(), statuses(2, 0)),
    ]);
    let d = zones.handle(&two, &RATES);
    assert!(!d.entered_full && !d.left_full);
    assert_eq!(
        d.rates,
        vec![("a".to_string(), 0.1), ("b".to_string(), 0.1)],
        "new zones, the empty one gone"
    );
    assert_eq!(zones.states.len(), 2);
}

#[test]
fn the_taint_queue_is_rate_limited_and_remembers_nodes() {
    let t0 = Instant::now();
    let mut q = TaintQueue::new(1.0, t0);
    assert!(q.add("a", t0));
    assert!(q.add("b", t0));
    assert!(!q.add("a", t0), "known");
    assert_eq!(q.take_due(t0), ["a"], "burst of one");
    assert_eq!(
        q.take_due(t0 + Duration::from_millis(500)),
        Vec::<String>::new()
    );
    assert_eq!(q.take_due(t0 + Duration::from_millis(1000)), ["b"]);
    assert!(!q.add("a", t0), "handled but not removed: not again");
    assert!(q.remove("a"));
    assert!(q.add("a", t0 + Duration::from_secs(2)));
    q.set_rate(0.0, t0 + Duration::from_secs(2));
    assert!(
        q.take_due(t0 + Duration::from_secs(10)).is_empty(),
        "rate 0: never"
    );
    // SwapLimiter: the old limiter accepted nothing, so the new one starts drained.
    q.set_rate(1.0, t0 + Duration::from_secs(10));
    assert!(q.take_due(t0 + Duration::from_secs(10)).is_empty());
    assert_eq!(q.take_due(t0 + Duration::from_secs(11)), ["a"]);
}

#[test]
fn the_no_execute_decision() {
    let unknown_with_not_ready = node(json!({"metadata": {"name": "n"},
        "spec": {"taints": [{"key": TAINT_NOT_READY, "effect": "NoExecute"}]}}));
    assert_eq!(
        eviction(&unknown_with_not_ready, "Unknown"),
        Eviction::SwapNow {
            add: TAINT_UNREACHABLE,
            remove: TAINT_NOT_READY
        }
    );
    assert_eq!(
        eviction(&unknown_with_not_ready, "False"),
        Eviction::Queue {
            forget_first: false
        }
    );
    assert_eq!(
        eviction(&node(json!({"metadata": {"name": "n"}})), "False"),
        Eviction::Queue { forget_first: true }
    );
    assert_eq!(
        eviction(&unknown_with_not_ready, "True"),
        Eviction::Reachable
    );
    assert_eq!(no_execute_swap("True"), None);
}

#[test]
fn pods_are_marked_not_ready_once() {
    let now = ts("2026-01-01T00:00:00Z");
    let patch = pod_not_ready_patch(Some("u"), Some("True"), now).unwrap();
    assert_eq!(patch["status"]["conditions"][0]["status"], "False");
    assert_eq!(patch["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(patch["metadata"]["uid"], "u");
    assert_eq!(pod_not_ready_patch(Some("u"), Some("False"), now), None);
    assert_eq!(
        pod_not_ready_patch(Some("u"), None, now),
        None,
        "no Ready condition"
    );
}

/// The time the Lease watch was blind does not count against a node: its probe moves to when the
/// watch came back, and a probe seen after that stays.
#[test]
fn a_blind_lease_watch_moves_the_probe_to_its_recovery() {
    let at = |s: i64| Timestamp::from_second(s).unwrap();
    let saved = Health {
        probe: at(1_000),
        ready_transition: at(900),
        ready: None,
        lease: None,
    };
    assert_eq!(
        probe_after_blindness(Some(&saved), Some(at(1_070)))
            .unwrap()
            .probe,
        at(1_070)
    );
    assert_eq!(
        probe_after_blindness(Some(&saved), Some(at(990)))
            .unwrap()
            .probe,
        at(1_000),
        "a recovery before the last probe changes nothing"
    );
    assert_eq!(
        probe_after_blindness(Some(&saved), None).unwrap().probe,
        at(1_000)
    );
    assert!(probe_after_blindness(None, Some(at(1_070))).is_none());
}
