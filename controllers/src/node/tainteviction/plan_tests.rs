//! Upstream's taint_eviction_test.go tables (TestFilterNoExecuteTaints, TestCreatePod,
//! TestUpdatePod, TestCreateNode, TestUpdateNode, TestUpdateNodeWithMultipleTaints,
//! TestGetMinTolerationTime), restated over the pure decisions: what each case's Pod gets on its
//! Node, and what becomes of an eviction already waiting.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use serde_json::json;

use super::*;

/// Upstream's `createNoExecuteTaint(i)`: `testTaint<i>=test<i>:NoExecute`.
fn taint(i: u32) -> Taint {
    Taint {
        key: format!("testTaint{i}"),
        value: Some(format!("test{i}")),
        effect: "NoExecute".into(),
        time_added: None,
    }
}

/// Upstream's `addToleration(pod, i, seconds)`: tolerates taint `i`, for `seconds` (for ever when
/// negative).
fn tolerating(i: u32, seconds: i64) -> Toleration {
    Toleration {
        key: Some(format!("testTaint{i}")),
        value: Some(format!("test{i}")),
        effect: Some("NoExecute".into()),
        operator: None,
        toleration_seconds: (seconds >= 0).then_some(seconds),
    }
}

fn node(taints: serde_json::Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": "node1"}, "spec": {"taints": taints}}))
        .unwrap()
}

#[test]
fn only_no_execute_taints_count() {
    let n = node(json!([
        {"key": "one", "value": "one", "effect": "NoExecute"},
        {"key": "two", "value": "two", "effect": "NoSchedule"},
    ]));
    let got = no_execute_taints(&n);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, "one");
    assert!(no_execute_taints(&node(json!(null))).is_empty());
}

#[test]
fn a_pod_on_a_tainted_node_stays_for_its_shortest_toleration() {
    let secs = Duration::from_secs;
    let cases: &[(&str, Vec<Taint>, Vec<Toleration>, Verdict)] = &[
        ("untainted Node", vec![], vec![], Verdict::Stays),
        (
            "tainted Node, no toleration",
            vec![taint(1)],
            vec![],
            Verdict::Untolerated,
        ),
        (
            "finite toleration",
            vec![taint(1)],
            vec![tolerating(1, 100)],
            Verdict::TolerantFor(secs(100)),
        ),
        (
            "infinite toleration",
            vec![taint(1)],
            vec![tolerating(1, -1)],
            Verdict::Stays,
        ),
        (
            "infinite toleration of another taint",
            vec![taint(1)],
            vec![tolerating(2, -1)],
            Verdict::Untolerated,
        ),
        (
            "only one of two added taints tolerated",
            vec![taint(1), taint(2)],
            vec![tolerating(1, 100)],
            Verdict::Untolerated,
        ),
        (
            "two tolerations: evicted when the first runs out",
            vec![taint(1), taint(2)],
            vec![tolerating(1, 1), tolerating(2, 100)],
            Verdict::TolerantFor(secs(1)),
        ),
        (
            "one taint tolerated for ever, the other for a minute",
            vec![taint(1), taint(2)],
            vec![tolerating(1, -1), tolerating(2, 60)],
            Verdict::TolerantFor(secs(60)),
        ),
        (
            "tolerationSeconds zero: at once",
            vec![taint(1)],
            vec![tolerating(1, 0)],
            Verdict::TolerantFor(Duration::ZERO),
        ),
        (
            "negative tolerationSeconds: at once",
            vec![taint(1)],
            vec![Toleration {
                toleration_seconds: Some(-5),
                ..tolerating(1, 0)
            }],
            Verdict::TolerantFor(Duration::ZERO),
        ),
        (
            "Exists with an empty key tolerates every taint",
            vec![taint(1), taint(2)],
            vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            Verdict::Stays,
        ),
        (
            // The first toleration matching a taint is the one used, even when a later one
            // would allow longer (GetMatchingTolerations stops at the first).
            "the first matching toleration is the one used",
            vec![taint(1)],
            vec![tolerating(1, 10), tolerating(1, -1)],
            Verdict::TolerantFor(secs(10)),
        ),
    ];
    for (what, taints, tolerations, want) in cases {
        assert_eq!(verdict(taints, tolerations), *want, "{what}");
    }
}

#[test]
fn min_toleration_time_as_upstream() {
    let t = |s: Option<i64>| Toleration {
        toleration_seconds: s,
        ..Default::default()
    };
    let (one, ten, forever, neg) = (t(Some(1)), t(Some(10)), t(None), t(Some(-1)));
    let cases: &[(&[&Toleration], Option<Duration>)] = &[
        (&[], Some(Duration::ZERO)),
        (&[&forever], None),
        (&[&ten, &one], Some(Duration::from_secs(1))),
        (&[&forever, &ten], Some(Duration::from_secs(10))),
        (&[&ten, &neg], Some(Duration::ZERO)),
    ];
    for (used, want) in cases {
        assert_eq!(min_toleration_time(used), *want, "{used:?}");
    }
}

#[test]
fn a_waiting_eviction_keeps_its_time() {
    let now = Instant::now();
    let earlier = now - Duration::from_secs(5);
    let secs = Duration::from_secs;
    // Nothing waiting: scheduled from now.
    assert_eq!(
        step(Verdict::TolerantFor(secs(100)), None, now),
        Step::EvictAt {
            created_at: now,
            fire_at: now + secs(100)
        }
    );
    // "lengthening toleration shouldn't work": a 1 s eviction made 5 s ago stays as it is
    // when the toleration becomes 100 s.
    assert_eq!(
        step(Verdict::TolerantFor(secs(100)), Some(earlier), now),
        Step::Keep
    );
    // Made at this very moment: replaced, counted from when it was made.
    assert_eq!(
        step(Verdict::TolerantFor(secs(7)), Some(now), now),
        Step::EvictAt {
            created_at: now,
            fire_at: now + secs(7)
        }
    );
    // "removing toleration": evicted now, whatever was waiting.
    assert_eq!(
        step(Verdict::Untolerated, Some(earlier), now),
        Step::EvictNow
    );
    // Taint removed or tolerated for ever: the waiting eviction is cancelled.
    assert_eq!(step(Verdict::Stays, Some(earlier), now), Step::Cancel);
}

#[test]
fn only_changes_of_tolerations_node_or_no_execute_taints_matter() {
    let a = [tolerating(1, 10)];
    let b = [tolerating(1, 20)];
    assert!(pod_change_matters(None, Some(("n", &a))), "an added Pod");
    assert!(pod_change_matters(Some(("n", &a)), None), "a deleted Pod");
    assert!(!pod_change_matters(Some(("n", &a)), Some(("n", &a))));
    assert!(pod_change_matters(Some(("n", &a)), Some(("n", &b))));
    assert!(pod_change_matters(Some(("", &a)), Some(("n", &a))), "bound");

    let plain = node(json!([{"key": "x", "effect": "NoSchedule"}]));
    let other_schedule = node(json!([{"key": "y", "effect": "NoSchedule"}]));
    let tainted = node(json!([{"key": "x", "effect": "NoExecute"}]));
    assert!(!node_change_matters(Some(&plain), Some(&other_schedule)));
    assert!(node_change_matters(Some(&plain), Some(&tainted)));
    assert!(node_change_matters(Some(&tainted), Some(&plain)));
    assert!(node_change_matters(None, Some(&plain)));
    assert!(node_change_matters(Some(&plain), None));
}
