//! The namespace controller's decisions, over upstream's `namespaced_resources_deleter_test.go`
//! (TestFinalizeNamespaceFunc, the estimates and remaining-content outcomes its
//! TestSyncNamespaceThatIsTerminating and TestDeleteEncounters404 drive) in this project's words.

use serde_json::json;

use super::*;

fn pod(phase: &str, grace: Option<i64>) -> Pod {
    let mut v = json!({"metadata": {"name": "p"}, "spec": {"containers": []}, "status": {}});
    if !phase.is_empty() {
        v["status"]["phase"] = json!(phase);
    }
    if let Some(g) = grace {
        v["spec"]["terminationGracePeriodSeconds"] = json!(g);
    }
    serde_json::from_value(v).unwrap()
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

#[test]
fn the_pods_estimate_is_the_longest_grace_period_of_pods_still_running() {
    assert_eq!(pods_estimate(&[]), 0);
    let pods = [
        pod("Running", Some(30)),
        pod("Pending", Some(45)),
        pod("", None),
        // Finished Pods take no time to end.
        pod("Succeeded", Some(600)),
        pod("Failed", Some(600)),
    ];
    assert_eq!(pods_estimate(&pods), 45);
    assert_eq!(pods_estimate(&[pod("Running", None)]), 0);
}

#[test]
fn an_estimate_counts_from_the_namespace_deletion() {
    assert_eq!(bounded_estimate(30, at(100), at(100)), 30);
    assert_eq!(bounded_estimate(30, at(100), at(129)), 30);
    assert_eq!(bounded_estimate(30, at(100), at(130)), 0);
    assert_eq!(bounded_estimate(0, at(100), at(100)), 0);
}

fn gvr() -> Gvr {
    Gvr::new("example.com", "v1", "widgets")
}

#[test]
fn nothing_remaining_is_done_whatever_the_estimate() {
    let (d, err) = after_deletion(&gvr(), "ns", 30, Some(&[]));
    assert_eq!(d, GvrDeletion::default());
    assert_eq!(err, None);
}

#[test]
fn a_resource_that_cannot_be_listed_keeps_only_its_estimate() {
    let (d, err) = after_deletion(&gvr(), "ns", 30, None);
    assert_eq!((d.estimate, d.remaining, err), (30, 0, None));
}

#[test]
fn objects_remaining_within_an_estimate_are_expected() {
    let items = vec![vec![], vec!["a".to_string()]];
    let (d, err) = after_deletion(&Gvr::pods(), "ns", 30, Some(&items));
    assert_eq!(err, None);
    assert_eq!(d.estimate, 30);
    assert_eq!(d.remaining, 2);
    assert_eq!(d.finalizers, [("a".to_string(), 1)].into());
}

#[test]
fn objects_held_by_finalizers_wait_fifteen_seconds() {
    let items = vec![
        vec!["example.com/hold".to_string()],
        vec!["example.com/hold".to_string(), "other".to_string()],
    ];
    let (d, err) = after_deletion(&gvr(), "ns", 0, Some(&items));
    assert_eq!(err, None);
    assert_eq!(d.estimate, FINALIZER_ESTIMATE_SECONDS);
    assert_eq!(d.remaining, 2);
    assert_eq!(
        d.finalizers,
        [
            ("example.com/hold".to_string(), 2),
            ("other".to_string(), 1)
        ]
        .into()
    );
}

#[test]
fn objects_remaining_with_no_reason_are_an_error() {
    let items = vec![vec![]];
    let (d, err) = after_deletion(&gvr(), "ns", 0, Some(&items));
    assert_eq!((d.estimate, d.remaining), (0, 1));
    assert_eq!(
        err.as_deref(),
        Some("unexpected items still remain in namespace: ns for gvr: {example.com v1 widgets}")
    );
    let (_, err) = after_deletion(&Gvr::pods(), "ns", 0, Some(&items));
    assert_eq!(
        err.as_deref(),
        Some("unexpected items still remain in namespace: ns for gvr: { v1 pods}")
    );
}

#[test]
fn totals_add_up_and_the_round_estimate_is_the_largest() {
    let mut totals = ContentTotals::default();
    let mut estimate = 0;
    let held = GvrDeletion {
        estimate: 15,
        remaining: 2,
        finalizers: [("f".to_string(), 2)].into(),
    };
    let pods = GvrDeletion {
        estimate: 30,
        remaining: 1,
        finalizers: [("f".to_string(), 1), ("g".to_string(), 0)].into(),
    };
    add_to_totals(&mut totals, &mut estimate, &gvr(), &held);
    add_to_totals(&mut totals, &mut estimate, &Gvr::pods(), &pods);
    add_to_totals(
        &mut totals,
        &mut estimate,
        &Gvr::new("", "v1", "configmaps"),
        &GvrDeletion::default(),
    );
    assert_eq!(estimate, 30);
    assert_eq!(totals.remaining, [(gvr(), 2), (Gvr::pods(), 1)].into());
    assert_eq!(totals.finalizers, [("f".to_string(), 3)].into());
}

#[test]
fn content_remaining_is_looked_at_after_half_its_estimate_and_a_second() {
    assert_eq!(requeue_after(15), Duration::from_secs(8));
    assert_eq!(requeue_after(30), Duration::from_secs(16));
    assert_eq!(requeue_after(1), Duration::from_secs(1));
}

#[test]
fn finalizing_removes_only_the_token() {
    let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        without_finalizer(&f(&["kubernetes", "other"]), FINALIZER_KUBERNETES),
        f(&["other"])
    );
    assert_eq!(
        without_finalizer(&f(&["kubernetes"]), FINALIZER_KUBERNETES),
        Vec::<String>::new()
    );
    // Upstream goes through a sorted set.
    assert_eq!(
        without_finalizer(&f(&["z", "kubernetes", "a", "z"]), FINALIZER_KUBERNETES),
        f(&["a", "z"])
    );
}

#[test]
fn the_pods_error_names_the_namespace() {
    assert_eq!(
        pods_error("ns", "boom"),
        "failed to delete pods for namespace: ns, err: boom"
    );
}
