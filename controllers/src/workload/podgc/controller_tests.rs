//! podgc's metrics under upstream's names and labels.

use super::*;

#[test]
fn deletions_are_counted_under_upstreams_names() {
    let pod: CachedPod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "metrics-ns"}}))
    .unwrap();
    count(&metrics().deleting, &pod, Reason::Orphaned);
    count(&metrics().deleting, &pod, Reason::Orphaned);
    count(&metrics().errors, &pod, Reason::Terminated);
    let text = crate::runtime::metrics::encode();
    assert!(
        text.contains(
            "pod_gc_collector_force_delete_pods_total{namespace=\"metrics-ns\",reason=\"orphaned\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "pod_gc_collector_force_delete_pod_errors_total{namespace=\"metrics-ns\",reason=\"terminated\"} 1"
        ),
        "{text}"
    );
}
