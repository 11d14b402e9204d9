//! Named cases for the ReplicaSet plan, each after the rule ID it proves.

use super::*;
use crate::runtime::cached_pod::CachedPod;
use serde_json::json;

const NOW: &str = "2026-01-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn rs_with(extra: serde_json::Value) -> ReplicaSet {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "rs-uid", "generation": 2,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                          "uid": "dep-uid", "controller": true}]},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web", "tier": "front"},
                                           "annotations": {"a": "b"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
        "status": {"replicas": 3, "observedGeneration": 2}
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn rs() -> ReplicaSet {
    rs_with(json!({}))
}

/// A Pod of the ReplicaSet: `ready_since` None = not ready.
fn pod_with(name: &str, ready_since: Option<&str>, extra: serde_json::Value) -> Arc<CachedPod> {
    let cond = crate::runtime::testing::ready_condition(ready_since);
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"app": "web", "tier": "front"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                                          "uid": "rs-uid", "controller": true}]},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx"}]},
        "status": {"phase": "Running", "conditions": [cond]}
    });
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn ready(name: &str) -> Arc<CachedPod> {
    pod_with(name, Some("2026-01-01T00:00:00Z"), json!({}))
}

fn names(pods: &[Arc<CachedPod>]) -> Vec<String> {
    pods.iter().map(|p| p.name_any()).collect()
}

#[test]
fn manage_replicas() {
    let three = || vec![ready("a"), ready("b"), ready("c")];
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T11:00:00Z"}});
    struct Case {
        name: &'static str,
        rs: ReplicaSet,
        active: Vec<Arc<CachedPod>>,
        satisfied: bool,
        burst: usize,
        want: Result<usize, Vec<&'static str>>,
    }
    let cases = [
        Case {
            name: "RS-4 count matches: nothing",
            rs: rs(),
            active: three(),
            satisfied: true,
            burst: BURST_REPLICAS,
            want: Ok(0),
        },
        Case {
            name: "RS-4 scale up creates the difference",
            rs: rs_with(json!({"spec": {"replicas": 10}})),
            active: three(),
            satisfied: true,
            burst: BURST_REPLICAS,
            want: Ok(7),
        },
        Case {
            name: "CTL-9 creations capped at burstReplicas",
            rs: rs_with(json!({"spec": {"replicas": 1000}})),
            active: three(),
            satisfied: true,
            burst: BURST_REPLICAS,
            want: Ok(500),
        },
        Case {
            name: "RS-3 expectations pending: nothing",
            rs: rs_with(json!({"spec": {"replicas": 10}})),
            active: three(),
            satisfied: false,
            burst: BURST_REPLICAS,
            want: Ok(0),
        },
        Case {
            name: "RS-3 ReplicaSet being deleted: not managed",
            rs: rs_with(json!({"spec": {"replicas": 10}, "metadata": deleting["metadata"]})),
            active: three(),
            satisfied: true,
            burst: BURST_REPLICAS,
            want: Ok(0),
        },
        Case {
            name: "RS-4 spec.replicas missing defaults to 1",
            rs: rs_with(json!({"spec": {"replicas": null}})),
            active: vec![],
            satisfied: true,
            burst: BURST_REPLICAS,
            want: Ok(1),
        },
        Case {
            name: "RS-4 scale down deletes the difference, ranked (not ready first)",
            rs: rs_with(json!({"spec": {"replicas": 2}})),
            active: vec![ready("a"), pod_with("b", None, json!({})), ready("c")],
            satisfied: true,
            burst: BURST_REPLICAS,
            want: Err(vec!["b"]),
        },
        Case {
            name: "CTL-9 deletions capped at burstReplicas",
            rs: rs_with(json!({"spec": {"replicas": 0}})),
            active: vec![ready("a"), pod_with("b", None, json!({})), ready("c")],
            satisfied: true,
            burst: 1,
            want: Err(vec!["b"]),
        },
        Case {
            name: "RS-5 scale to zero deletes all, unsorted",
            rs: rs_with(json!({"spec": {"replicas": 0}})),
            active: vec![ready("a"), pod_with("b", None, json!({})), ready("c")],
            satisfied: true,
            burst: BURST_REPLICAS,
            want: Err(vec!["a", "b", "c"]),
        },
    ];
    for c in cases {
        let got = manage(&c.rs, &c.active, &c.active, c.satisfied, c.burst, now());
        match (got, c.want) {
            (Manage::Nothing, Ok(0)) => {}
            (Manage::Create(n), Ok(want)) => assert_eq!(n, want, "{}", c.name),
            (Manage::Delete(pods), Err(want)) => assert_eq!(names(&pods), want, "{}", c.name),
            (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
        }
    }
}

#[test]
fn scale_down_ranks_against_sibling_pods() {
    // RS-7: a Pod sharing its node with a sibling ReplicaSet's Pod (same Deployment) is doubled
    // up and goes first; without the sibling the newer Pod would go first.
    let rs = rs_with(json!({"spec": {"replicas": 1}}));
    let a = pod_with(
        "a",
        Some("2026-01-01T00:00:00Z"),
        json!({"spec": {"nodeName": "n1"}}),
    );
    let b = pod_with(
        "b",
        Some("2026-01-01T00:00:00Z"),
        json!({"metadata": {"creationTimestamp": "2026-01-01T11:59:00Z"}, "spec": {"nodeName": "n2"}}),
    );
    let sibling_rs = Arc::new(rs_with(
        json!({"metadata": {"name": "web-old", "uid": "old-uid"},
               "spec": {"selector": {"matchLabels": {"app": "old"}}}}),
    ));
    let sibling_pod = pod_with(
        "old-1",
        Some("2026-01-01T00:00:00Z"),
        json!({"metadata": {"labels": {"app": "old"}}, "spec": {"nodeName": "n1"}}),
    );
    let all = vec![a.clone(), b.clone(), sibling_pod.clone()];
    let active = vec![a, b];
    let cases = [
        (
            "RS-6 without siblings: newer Pod first",
            vec![Arc::new(rs.clone())],
            "b",
        ),
        (
            "RS-7 with a sibling on n1: doubled-up Pod first",
            vec![Arc::new(rs.clone()), sibling_rs],
            "a",
        ),
    ];
    for (name, siblings, want) in cases {
        let related = related_pods(REPLICA_SET, &siblings, |_| all.clone());
        let Manage::Delete(got) = manage(&rs, &active, &related, true, BURST_REPLICAS, now())
        else {
            panic!("{name}: expected a deletion");
        };
        assert_eq!(names(&got), [want], "{name}");
    }
}

#[test]
fn related_pods_dedup_and_invalid_selectors() {
    let own = Arc::new(rs());
    let broken = Arc::new(rs_with(json!({"metadata": {"name": "broken"},
        "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}})));
    let other_ns = pod_with(
        "elsewhere",
        None,
        json!({"metadata": {"namespace": "other"}}),
    );
    let unrelated = pod_with("db", None, json!({"metadata": {"labels": {"app": "db"}}}));
    let pods = vec![ready("a"), ready("b"), other_ns, unrelated];
    let cases = [
        ("RS-7 own selector", vec![own.clone()], vec!["a", "b"]),
        (
            "RS-7 a Pod matched by two siblings counts once",
            vec![own.clone(), own.clone()],
            vec!["a", "b"],
        ),
        (
            "RS-7 a sibling with an invalid selector matches nothing",
            vec![broken],
            vec![],
        ),
    ];
    for (name, siblings, want) in cases {
        assert_eq!(
            names(&related_pods(REPLICA_SET, &siblings, |_| pods.clone())),
            want,
            "{name}"
        );
    }
}

#[test]
fn candidates_are_owned_or_orphans() {
    let pods = vec![
        ready("owned"),
        pod_with(
            "orphan",
            None,
            json!({"metadata": {"ownerReferences": null}}),
        ),
        pod_with(
            "theirs",
            None,
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "other", "uid": "other-uid", "controller": true}]}}),
        ),
        pod_with(
            "same-uid-other-name",
            None,
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "other", "uid": "rs-uid", "controller": true}]}}),
        ),
        pod_with(
            "non-controller-ref",
            None,
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "x", "uid": "x"}]}}),
        ),
        pod_with(
            "other-ns",
            None,
            json!({"metadata": {"namespace": "other"}}),
        ),
    ];
    assert_eq!(
        names(&candidates(REPLICA_SET, &rs(), pods)),
        ["non-controller-ref", "orphan", "owned"],
        "CTL-7 candidates: controlled by this ReplicaSet (kind, name, uid) or without controller"
    );
}

fn condition(status: &ReplicaSetStatus) -> Option<(String, Option<String>, Option<String>)> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == REPLICA_FAILURE)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[test]
fn status_counts() {
    let pods = vec![
        pod_with("available", Some("2026-01-01T11:00:00Z"), json!({})),
        pod_with("ready-recently", Some("2026-01-01T11:59:55Z"), json!({})),
        pod_with("not-ready", None, json!({})),
        pod_with(
            "partly-labeled",
            Some("2026-01-01T11:00:00Z"),
            json!({"metadata": {"labels": {"tier": null}}}),
        ),
    ];
    // (name, minReadySeconds, replicas, fullyLabeled, ready, available)
    let cases = [
        ("RS-3 status without minReadySeconds", 0, (4, 3, 3, 3)),
        (
            "RS-3 availableReplicas waits minReadySeconds",
            30,
            (4, 3, 3, 2),
        ),
    ];
    for (name, min_ready, (replicas, fully, ready, available)) in cases {
        let rs = rs_with(json!({"spec": {"minReadySeconds": min_ready}}));
        let s = calculate_status(&rs, &pods, None, now());
        assert_eq!(
            (
                s.replicas,
                s.fully_labeled_replicas,
                s.ready_replicas,
                s.available_replicas
            ),
            (replicas, Some(fully), Some(ready), Some(available)),
            "{name}"
        );
        assert_eq!(s.terminating_replicas, None, "{name}: v1.34 gate off");
        assert_eq!(s.observed_generation, Some(2), "{name}: left as it was");
    }
}

#[test]
fn replica_failure_condition() {
    let existing = json!({"status": {"conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "old"},
        {"type": "Other", "status": "True"}]}});
    let two = vec![ready("a"), ready("b")];
    let four = vec![ready("a"), ready("b"), ready("c"), ready("d")];
    let t = |s: &str| s.to_string();
    let cases = [
        (
            "RS-4 create error sets FailedCreate",
            rs(),
            two.clone(),
            Some("quota exceeded"),
            Some((
                t("True"),
                Some(t("FailedCreate")),
                Some(t("quota exceeded")),
            )),
        ),
        (
            "RS-4 delete error sets FailedDelete",
            rs(),
            four.clone(),
            Some("unable to delete pods: boom"),
            Some((
                t("True"),
                Some(t("FailedDelete")),
                Some(t("unable to delete pods: boom")),
            )),
        ),
        (
            "RS-4 an existing condition is kept as it was",
            rs_with(existing.clone()),
            four.clone(),
            Some("new"),
            Some((t("True"), Some(t("FailedCreate")), Some(t("old")))),
        ),
        (
            "RS-4 success clears the condition",
            rs_with(existing.clone()),
            two.clone(),
            None,
            None,
        ),
    ];
    for (name, rs, active, err, want) in cases {
        let s = calculate_status(&rs, &active, err, now());
        assert_eq!(condition(&s), want, "{name}");
    }
    let s = calculate_status(&rs_with(existing), &two, None, now());
    assert_eq!(
        s.conditions.unwrap().len(),
        1,
        "RS-4 other conditions survive the clearing"
    );
    let s = calculate_status(&rs(), &two, Some("x"), now());
    assert_eq!(
        s.conditions.unwrap()[0].last_transition_time,
        Some(Time(now())),
        "RS-4 condition stamped with the sync time"
    );
    let cleared = calculate_status(
        &rs_with(json!({"status": {"conditions": [{"type": "ReplicaFailure", "status": "True"}]}})),
        &two,
        None,
        now(),
    );
    assert_eq!(
        cleared.conditions, None,
        "RS-4 no conditions left: the list is dropped"
    );
}

#[test]
fn status_update_needed() {
    let three = vec![ready("a"), ready("b"), ready("c")];
    let steady = rs_with(json!({"status": {"replicas": 3, "fullyLabeledReplicas": 3,
        "readyReplicas": 3, "availableReplicas": 3, "observedGeneration": 2}}));
    let cases = [
        (
            "RS-3 steady state: no write",
            steady.clone(),
            three.clone(),
            None,
            false,
        ),
        (
            "RS-3 new generation: write observedGeneration",
            rs_with(
                json!({"metadata": {"generation": 3}, "status": {"replicas": 3,
                "fullyLabeledReplicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                "observedGeneration": 2}}),
            ),
            three.clone(),
            None,
            true,
        ),
        (
            "RS-3 a Pod went away: write",
            steady.clone(),
            three[..2].to_vec(),
            None,
            true,
        ),
        (
            "RS-3 a failure condition appears: write",
            steady.clone(),
            three.clone(),
            Some("boom"),
            true,
        ),
    ];
    for (name, rs, active, err, want) in cases {
        let new = calculate_status(&rs, &active, err, now());
        assert_eq!(needs_status_update(&rs, &new), want, "{name}");
    }
    let rs = rs_with(json!({"metadata": {"generation": 7}}));
    let written = status_to_write(&rs, calculate_status(&rs, &three, None, now()));
    assert_eq!(
        written.observed_generation,
        Some(7),
        "RS-3 observedGeneration = the generation acted on"
    );
}

#[test]
fn min_ready_seconds_requeue() {
    let with_status = |min: i32, ready: i32, available: i32| {
        rs_with(json!({"spec": {"minReadySeconds": min},
            "status": {"readyReplicas": ready, "availableReplicas": available}}))
    };
    let pods = vec![
        pod_with("old", Some("2026-01-01T11:00:00Z"), json!({})),
        pod_with("new", Some("2026-01-01T11:59:50Z"), json!({})),
    ];
    let cases = [
        (
            "RS-3 no minReadySeconds: no requeue",
            with_status(0, 2, 1),
            None,
        ),
        (
            "RS-3 all available: no requeue",
            with_status(30, 2, 2),
            None,
        ),
        (
            "RS-3 requeue when the next ready Pod turns available",
            with_status(30, 2, 1),
            Some(Duration::from_secs(20)),
        ),
        (
            "RS-3 no Pod to wait for: requeue after minReadySeconds",
            with_status(5, 2, 1),
            Some(Duration::from_secs(5)),
        ),
    ];
    for (name, rs, want) in cases {
        assert_eq!(requeue_after(&rs, &pods, now(), now()), want, "{name}");
    }
}

#[test]
fn pods_from_the_template() {
    let rs = rs_with(
        json!({"spec": {"template": {"metadata": {"name": "ignored", "finalizers": ["f/x"]}}}}),
    );
    let p = pod_from_template(REPLICA_SET, &rs).unwrap();
    assert_eq!(
        p.metadata.generate_name.as_deref(),
        Some("web-"),
        "RS-1 generateName"
    );
    assert_eq!(
        p.metadata.name, None,
        "RS-1 the template's name is not used"
    );
    assert_eq!(p.metadata.namespace, None);
    assert_eq!(
        p.metadata.labels.as_ref().unwrap()["tier"],
        "front",
        "RS-1 template labels"
    );
    assert_eq!(p.metadata.annotations.as_ref().unwrap()["a"], "b");
    assert_eq!(p.metadata.finalizers, Some(vec!["f/x".to_string()]));
    let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        (
            "apps/v1",
            "ReplicaSet",
            "web",
            "rs-uid",
            Some(true),
            Some(true)
        ),
        "CTL-6 controller reference with blockOwnerDeletion"
    );
    assert_eq!(
        p.spec.unwrap().containers[0].image.as_deref(),
        Some("nginx")
    );

    let long = "x".repeat(253);
    let rs = rs_with(json!({"metadata": {"name": long}}));
    assert_eq!(
        pod_from_template(REPLICA_SET, &rs)
            .unwrap()
            .metadata
            .generate_name,
        Some(long),
        "RS-1 a name too long for the dash is used bare"
    );

    let cases = [
        (
            "no labels",
            json!({"spec": {"template": {"metadata": {"labels": null}}}}),
            "spec.template.metadata.labels",
        ),
        (
            "no spec",
            json!({"spec": {"template": {"spec": null}}}),
            "spec.template.spec",
        ),
    ];
    for (name, extra, field) in cases {
        let err = pod_from_template(REPLICA_SET, &rs_with(extra))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(field) && err.contains("ReplicaSet ns/web"),
            "{name}: {err}"
        );
    }
}

#[test]
fn invalid_selector_names_the_field() {
    let rs = rs_with(json!({"spec": {"selector": {"matchExpressions": [
        {"key": "app", "operator": "Gt", "values": ["1"]}]}}}));
    let err = selector(REPLICA_SET, &rs).unwrap_err().to_string();
    assert!(
        err.contains("ReplicaSet ns/web") && err.contains("spec.selector.matchExpressions[0]"),
        "{err}"
    );
}

/// One ReplicaSet scaled from `from` to `to` Pods, stepped the way that costs most writes: the
/// controller syncs after every single Pod the watch shows, while the rest of the burst is still
/// on its way. Returns the status writes (their `replicas`).
fn burst_status_writes(from: usize, to: i32) -> Vec<i32> {
    use crate::runtime::expectations::Expectations;
    let key = "ns/web";
    let mut rs = rs_with(
        json!({"spec": {"replicas": to}, "metadata": {"generation": 2},
                               "status": {"replicas": from, "observedGeneration": 1}}),
    );
    let mut cache: Vec<Arc<CachedPod>> = (0..from).map(|i| ready(&format!("p{i}"))).collect();
    // Created or deleted at the API, not yet shown by the watch.
    let mut in_flight: Vec<(bool, Arc<CachedPod>)> = Vec::new();
    let expectations = Expectations::new();
    let mut writes = Vec::new();
    let mut created = 0;
    for _ in 0..10_000 {
        // One sync (RS-3).
        let satisfied = expectations.satisfied(key);
        let action = manage(&rs, &cache, &[], satisfied, BURST_REPLICAS, now());
        let acted = !matches!(action, Manage::Nothing);
        match action {
            Manage::Nothing => {}
            Manage::Create(n) => {
                expectations.expect_creations(key, n);
                for _ in 0..n {
                    created += 1;
                    in_flight.push((true, ready(&format!("new{created}"))));
                }
            }
            Manage::Delete(victims) => {
                let keys: Vec<String> = victims
                    .iter()
                    .map(|p| format!("ns/{}", p.name_any()))
                    .collect();
                expectations.expect_deletions(key, &keys);
                in_flight.extend(victims.into_iter().map(|p| (false, p)));
            }
        }
        let computed = calculate_status(&rs, &cache, None, now());
        let wrote = match status_write(&rs, computed, satisfied) {
            Some(s) => {
                writes.push(s.replicas);
                rs.status = Some(s);
                true
            }
            None => false,
        };
        // The watch shows one Pod of the burst, which queues the ReplicaSet again.
        if in_flight.is_empty() {
            if !acted && !wrote {
                return writes;
            }
            continue;
        }
        let (create, p) = in_flight.remove(0);
        if create {
            expectations.creation_observed(key);
            cache.push(p);
        } else {
            expectations.deletion_observed(key, &format!("ns/{}", p.name_any()));
            cache.retain(|c| c.name_any() != p.name_any());
        }
    }
    panic!("no steady state: {writes:?}");
}

#[test]
fn ctl8_a_burst_writes_the_status_once_per_batch() {
    // Issue 37: kube-controller-manager wrote 4 statuses for 1,200 -> 0 and for 0 -> 1,200
    // (batches of 500, 500, 200 and the end), kpr 46 and 9.
    assert_eq!(
        burst_status_writes(1200, 0),
        [1200, 700, 200, 0],
        "1,200 -> 0"
    );
    assert_eq!(
        burst_status_writes(0, 1200),
        [0, 500, 1000, 1200],
        "0 -> 1,200"
    );
    assert_eq!(burst_status_writes(3, 1), [3, 1], "a small scale-down");
}

#[test]
fn ctl8_no_status_write_while_expectations_are_pending() {
    let rs = rs_with(json!({"spec": {"replicas": 1}}));
    let two = vec![ready("a"), ready("b")];
    let computed = calculate_status(&rs, &two, None, now());
    assert_eq!(
        status_write(&rs, computed.clone(), false),
        None,
        "mid-burst: deferred to the sync that sees the whole burst"
    );
    assert_eq!(
        status_write(&rs, computed, true).map(|s| (s.replicas, s.observed_generation)),
        Some((2, Some(2)))
    );
    let mut rs = rs;
    rs.status = status_write(&rs, calculate_status(&rs, &two, None, now()), true);
    let same = calculate_status(&rs, &two, None, now());
    assert_eq!(status_write(&rs, same, true), None, "unchanged: nothing");
}
