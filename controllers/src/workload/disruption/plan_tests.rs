//! The disruption controller's arithmetic over upstream's test tables (`disruption_test.go`:
//! TestUnavailable, TestIntegerMaxUnavailable(WithScaling), TestPercentageMaxUnavailable,
//! TestReplicationController / TestStatefulSetController's percentages, TestTwoControllers,
//! TestUpdateDisruptedPods, TestBasicFinderFunctions' expiry, TestStalePodDisruption), in this
//! project's words.

use serde_json::json;

use super::*;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn pod(name: &str, ready: bool) -> CachedPod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .unwrap()
}

fn deleting(mut p: CachedPod) -> CachedPod {
    p.metadata.deletion_timestamp = Some(Time(at(0)));
    p
}

fn spec(v: serde_json::Value) -> PodDisruptionBudgetSpec {
    serde_json::from_value(v).unwrap()
}

fn pdb(generation: i64, status: serde_json::Value) -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "metadata": {"name": "b", "namespace": "ns", "generation": generation},
        "spec": {"minAvailable": 1},
        "status": status,
    }))
    .unwrap()
}

#[test]
fn expected_and_desired_follow_min_available_and_max_unavailable() {
    // (spec, Pods found, sum of scales) -> (expectedPods, desiredHealthy)
    type Case = (&'static str, serde_json::Value, usize, i32, (i32, i32));
    let cases: &[Case] = &[
        // An integer minAvailable counts the Pods found and ignores controllers.
        (
            "minAvailable 3 of 4 Pods",
            json!({"minAvailable": 3}),
            4,
            0,
            (4, 3),
        ),
        (
            "minAvailable above the Pods",
            json!({"minAvailable": 5}),
            2,
            9,
            (2, 5),
        ),
        // Percentages of the controllers' scale round up.
        (
            "34% of an RC of 3",
            json!({"minAvailable": "34%"}),
            3,
            3,
            (3, 2),
        ),
        (
            "28% of 11 + 11",
            json!({"minAvailable": "28%"}),
            0,
            22,
            (22, 7),
        ),
        ("100% of 4", json!({"minAvailable": "100%"}), 4, 4, (4, 4)),
        ("0% of 4", json!({"minAvailable": "0%"}), 4, 4, (4, 0)),
        // maxUnavailable: scale minus the (rounded up) unavailable count, never below 0.
        (
            "maxUnavailable 1 of 2",
            json!({"maxUnavailable": 1}),
            2,
            2,
            (2, 1),
        ),
        (
            "maxUnavailable 2 of 7",
            json!({"maxUnavailable": 2}),
            5,
            7,
            (7, 5),
        ),
        (
            "maxUnavailable 2 of 5 (scaled down)",
            json!({"maxUnavailable": 2}),
            5,
            5,
            (5, 3),
        ),
        (
            "maxUnavailable 30% of 7",
            json!({"maxUnavailable": "30%"}),
            7,
            7,
            (7, 4),
        ),
        (
            "maxUnavailable 50% of 3",
            json!({"maxUnavailable": "50%"}),
            3,
            3,
            (3, 1),
        ),
        (
            "maxUnavailable 5 of 3",
            json!({"maxUnavailable": 5}),
            3,
            3,
            (3, 0),
        ),
        (
            "maxUnavailable 0 of 3",
            json!({"maxUnavailable": 0}),
            3,
            3,
            (3, 3),
        ),
        (
            "maxUnavailable of no scale",
            json!({"maxUnavailable": "10%"}),
            0,
            0,
            (0, 0),
        ),
    ];
    for (what, s, pods, scale, want) in cases {
        let s = spec(s.clone());
        assert_eq!(expected_and_desired(&s, *pods, *scale), Ok(*want), "{what}");
    }
    assert_eq!(
        counting(&spec(json!({"minAvailable": 2}))),
        Counting::ByPods { desired_healthy: 2 }
    );
    assert_eq!(
        counting(&spec(json!({"minAvailable": "50%"}))),
        Counting::ByScale
    );
    assert_eq!(
        counting(&spec(json!({"maxUnavailable": 1}))),
        Counting::ByScale
    );
    assert_eq!(counting(&spec(json!({}))), Counting::Nothing);
    let bad = expected_and_desired(&spec(json!({"maxUnavailable": "half"})), 1, 1).unwrap_err();
    assert!(bad.contains("half"), "{bad}");
}

#[test]
fn disruptions_allowed_is_healthy_beyond_desired_and_zero_without_expected_pods() {
    // (current, desired, expected) -> allowed
    for (current, desired, expected, want) in [
        (4, 3, 4, 1),
        (3, 3, 4, 0),
        (2, 3, 4, 0),
        (5, 3, 7, 2),
        (3, 0, 0, 0), // no expected Pods: safe until the first sync that sees them
        (0, 0, 0, 0),
    ] {
        assert_eq!(
            disruptions_allowed(current, desired, expected),
            want,
            "{current} {desired} {expected}"
        );
    }
}

#[test]
fn healthy_pods_are_ready_not_deleting_and_not_recently_evicted() {
    let pods = [
        pod("ready", true),
        pod("unready", false),
        deleting(pod("going", true)),
        pod("evicted-now", true),
        pod("evicted-long-ago", true),
    ];
    let refs: Vec<&CachedPod> = pods.iter().collect();
    let now = at(1000);
    let disrupted = BTreeMap::from([
        ("evicted-now".to_string(), Time(at(990))),
        ("evicted-long-ago".to_string(), Time(at(1000 - 121))),
    ]);
    assert_eq!(
        count_healthy(&refs, &disrupted, now),
        2,
        "ready + the expired eviction"
    );
    assert_eq!(count_healthy(&refs, &BTreeMap::new(), now), 3);
}

#[test]
fn disrupted_pods_are_kept_until_deleted_or_two_minutes_old() {
    let pods = [
        pod("fresh", true),
        pod("older", true),
        pod("expired", true),
        deleting(pod("deleting", true)),
        pod("not-listed", true),
    ];
    let refs: Vec<&CachedPod> = pods.iter().collect();
    let now = at(1000);
    let previous = BTreeMap::from([
        ("fresh".to_string(), Time(at(990))),
        ("older".to_string(), Time(at(950))),
        ("expired".to_string(), Time(at(1000 - 121))),
        ("deleting".to_string(), Time(at(990))),
        ("gone".to_string(), Time(at(990))),
    ]);
    let got = disrupted_pod_map(&refs, Some(&previous), now);
    assert_eq!(
        got.pods.keys().map(String::as_str).collect::<Vec<_>>(),
        ["fresh", "older"]
    );
    assert_eq!(got.recheck, Some(at(950 + 120)), "the earliest expiry");
    assert_eq!(got.not_deleted, ["expired"]);
    // Exactly at its expiry an entry is still kept (upstream drops it only once it is past).
    let edge = BTreeMap::from([("fresh".to_string(), Time(at(880)))]);
    assert_eq!(disrupted_pod_map(&refs, Some(&edge), now).pods.len(), 1);
    assert_eq!(disrupted_pod_map(&refs, None, now), Disrupted::default());
}

#[test]
fn status_is_written_only_when_it_changes_and_sets_the_condition() {
    let now = at(0);
    let counts = Counts {
        current_healthy: 3,
        desired_healthy: 2,
        expected: 3,
    };
    // A new budget: every field plus the condition, observedGeneration the generation.
    let fresh = new_status(&pdb(2, json!({})), counts, BTreeMap::new(), now).unwrap();
    assert_eq!(
        (
            fresh.expected_pods,
            fresh.desired_healthy,
            fresh.current_healthy,
            fresh.disruptions_allowed
        ),
        (3, 2, 3, 1)
    );
    assert_eq!(fresh.observed_generation, Some(2));
    assert_eq!(fresh.disrupted_pods, None, "an empty map is left out");
    let c = &fresh.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("DisruptionAllowed", "True", "SufficientPods")
    );
    assert_eq!(c.observed_generation, Some(2));

    // Written as is: nothing to do.
    let mut written = pdb(2, json!({}));
    written.status = Some(fresh.clone());
    assert_eq!(new_status(&written, counts, BTreeMap::new(), at(5)), None);
    // A new generation alone is written.
    written.metadata.generation = Some(3);
    let bumped = new_status(&written, counts, BTreeMap::new(), at(5)).unwrap();
    assert_eq!(bumped.observed_generation, Some(3));
    written.metadata.generation = Some(2);

    // Down to no disruption: False, InsufficientPods, a new transition time.
    let short = Counts {
        current_healthy: 2,
        ..counts
    };
    let down = new_status(&written, short, BTreeMap::new(), at(60)).unwrap();
    let c = &down.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (
            down.disruptions_allowed,
            c.status.as_str(),
            c.reason.as_str()
        ),
        (0, "False", "InsufficientPods")
    );
    assert_eq!(c.last_transition_time, Time(at(60)));

    // A condition saying the wrong thing is corrected even when the counts are right.
    let mut wrong = written.clone();
    wrong.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason = "SyncFailed".into();
    wrong.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    let fixed = new_status(&wrong, counts, BTreeMap::new(), at(70)).unwrap();
    assert_eq!(fixed.conditions.unwrap()[0].reason, "SufficientPods");

    // A disrupted Pod is part of the status.
    let d = BTreeMap::from([("p".to_string(), Time(at(1)))]);
    let with_d = new_status(&written, counts, d.clone(), at(2)).unwrap();
    assert_eq!(with_d.disrupted_pods, Some(d));
}

#[test]
fn a_failed_sync_allows_nothing_and_says_why() {
    let before = pdb(
        4,
        json!({"observedGeneration": 3, "expectedPods": 3, "desiredHealthy": 2, "currentHealthy": 3,
               "disruptionsAllowed": 1, "conditions": [{"type": "DisruptionAllowed", "status": "True",
               "reason": "SufficientPods", "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"}]}),
    );
    let s = fail_safe_status(&before, "found no controllers for pod \"p\"", at(9));
    assert_eq!(
        (s.disruptions_allowed, s.expected_pods, s.current_healthy),
        (0, 3, 3)
    );
    assert_eq!(
        s.observed_generation,
        Some(3),
        "the generation the status last observed"
    );
    let c = &s.conditions.unwrap()[0];
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SyncFailed")
    );
    assert_eq!(c.message, "found no controllers for pod \"p\"");
    assert_eq!(c.observed_generation, Some(3));
    assert_eq!(c.last_transition_time, Time(at(9)));
}

#[test]
fn set_condition_keeps_the_transition_time_while_the_status_holds() {
    let cond = |status: &str, reason: &str, t: i64| Condition {
        type_: DISRUPTION_ALLOWED.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: Time(at(t)),
    };
    let mut cs = vec![cond("False", "InsufficientPods", 0)];
    set_condition(&mut cs, cond("False", "SyncFailed", 10));
    assert_eq!(
        (cs[0].reason.as_str(), cs[0].last_transition_time.clone()),
        ("SyncFailed", Time(at(0)))
    );
    set_condition(&mut cs, cond("True", "SufficientPods", 20));
    assert_eq!(
        (cs[0].status.as_str(), cs[0].last_transition_time.clone()),
        ("True", Time(at(20)))
    );
    assert_eq!(cs.len(), 1);
}

#[test]
fn stale_disruption_target_conditions() {
    let timeout = STALE_POD_DISRUPTION_TIMEOUT;
    let with = |cond: serde_json::Value, phase: &str, deleting_too: bool| -> CachedPod {
        let mut p: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "status": {"phase": phase, "conditions": [cond]},
        }))
        .unwrap();
        if deleting_too {
            p.metadata.deletion_timestamp = Some(Time(at(0)));
        }
        p
    };
    let target = |status: &str, reason: &str, t: i64| {
        json!({"type": "DisruptionTarget", "status": status, "reason": reason,
               "lastTransitionTime": at(t).to_string()})
    };
    let now = at(100);
    // (what, Pod, wait before the reset)
    let cases = [
        (
            "fresh: waits the rest of 2 minutes",
            with(
                target("True", "EvictionByEvictionAPI", 70),
                "Running",
                false,
            ),
            Some(Duration::from_secs(90)),
        ),
        (
            "old: reset now",
            with(
                target("True", "EvictionByEvictionAPI", -100),
                "Running",
                false,
            ),
            Some(Duration::ZERO),
        ),
        (
            "deleting: not stale",
            with(
                target("True", "EvictionByEvictionAPI", -100),
                "Running",
                true,
            ),
            None,
        ),
        (
            "terminal: not stale",
            with(
                target("True", "EvictionByEvictionAPI", -100),
                "Failed",
                false,
            ),
            None,
        ),
        (
            "the kubelet's: never stale",
            with(
                target("True", "TerminationByKubelet", -100),
                "Running",
                false,
            ),
            None,
        ),
        (
            "False already",
            with(target("False", "", -100), "Running", false),
            None,
        ),
        (
            "no such condition",
            with(json!({"type": "Ready", "status": "True"}), "Running", false),
            None,
        ),
    ];
    for (what, p, want) in cases {
        assert_eq!(stale_disruption_in(&p, now, timeout), want, "{what}");
    }
}

#[test]
fn selectors_print_as_go_does() {
    let sel: LabelSelector = serde_json::from_value(json!({
        "matchLabels": {"b": "2", "a": "1"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]},
                             {"key": "z", "operator": "Exists"}],
    }))
    .unwrap();
    assert_eq!(
        go_selector_string(Some(&sel)),
        "&LabelSelector{MatchLabels:map[string]string{a: 1,b: 2,},MatchExpressions:[]LabelSelectorRequirement{\
         LabelSelectorRequirement{Key:tier,Operator:In,Values:[x y],},\
         LabelSelectorRequirement{Key:z,Operator:Exists,Values:[],},},}"
    );
    assert_eq!(go_selector_string(None), "nil");
}
