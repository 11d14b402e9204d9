//! A sync's decisions, as upstream's controller tests check them (`horizontal_test.go`): the
//! conditions, Events and rescale for a scale-up, for a cluster without the resource metrics API,
//! for a target that cannot be read, for replica counts out of [min, max], and for metric
//! sources this controller does not read.

use serde_json::json;

use super::*;

const NOW: i64 = 1_750_000_000;

fn now() -> Timestamp {
    Timestamp::from_second(NOW).unwrap()
}

fn settings() -> Settings {
    Settings {
        tolerance: 0.1,
        downscale_stabilization: Duration::from_secs(300),
        cpu_initialization_period: Duration::from_secs(300),
        initial_readiness_delay: Duration::from_secs(30),
    }
}

fn hpa(metrics: serde_json::Value, min: i32, max: i32) -> HorizontalPodAutoscaler {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": min, "maxReplicas": max, "metrics": metrics
        }
    }))
    .unwrap()
}

fn cpu_utilization(target: i32) -> serde_json::Value {
    json!([{"type": "Resource", "resource": {"name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": target}}}])
}

fn pods(n: usize) -> Vec<CachedPod> {
    (0..n)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("web-{i}"), "namespace": "ns", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]},
                "status": {"phase": "Running", "startTime": "2000-01-01T00:00:00Z",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2000-01-01T00:00:00Z"}]}
            }))
            .unwrap()
        })
        .collect()
}

fn usage(n: usize, milli: i64) -> PodMetricsList {
    serde_json::from_value(json!({"items": (0..n).map(|i| json!({
        "metadata": {"name": format!("web-{i}"), "namespace": "ns"},
        "timestamp": "2025-06-15T00:00:00Z", "window": "30s",
        "containers": [{"name": "c", "usage": {"cpu": format!("{milli}m")}}]
    })).collect::<Vec<_>>()}))
    .unwrap()
}

fn condition<'a>(s: &'a HorizontalPodAutoscalerStatus, t: &str) -> (&'a str, &'a str, &'a str) {
    let c = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition"));
    (
        c.status.as_str(),
        c.reason.as_deref().unwrap_or_default(),
        c.message.as_deref().unwrap_or_default(),
    )
}

fn run(
    h: &HorizontalPodAutoscaler,
    replicas: i32,
    pods: &[CachedPod],
    metrics: Result<PodMetricsList, String>,
) -> Outcome {
    let view = ScaleView {
        replicas,
        selector: "app=web".to_string(),
    };
    let refs: Vec<&CachedPod> = pods.iter().collect();
    let selecting = |_: &[&CachedPod]| vec!["ns/web".to_string()];
    let inputs = Inputs {
        pods: &refs,
        metrics: Some(&metrics),
        selecting: &selecting,
    };
    plan(
        h,
        &view,
        &inputs,
        &mut History::default(),
        &settings(),
        now(),
    )
}

#[test]
fn a_busy_target_scales_up_with_upstreams_conditions_and_event() {
    let h = hpa(cpu_utilization(50), 1, 10);
    let mut out = run(&h, 2, &pods(2), Ok(usage(2, 100)));
    assert_eq!(
        out.rescale,
        Some(Rescale {
            current: 2,
            desired: 4,
            reason: "cpu resource utilization (percentage of request) above target".to_string()
        })
    );
    assert_eq!(
        condition(&out.status, "ScalingActive"),
        ("True", "ValidMetricFound", "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)")
    );
    assert_eq!(
        condition(&out.status, "ScalingLimited").1,
        "DesiredWithinRange"
    );
    let m = &out.status.current_metrics.as_ref().unwrap()[0];
    let current = &m.resource.as_ref().unwrap().current;
    assert_eq!(current.average_utilization, Some(100));
    assert_eq!(current.average_value.as_ref().unwrap().0, "100m");
    rescaled(
        &h,
        &mut out,
        Ok(()),
        &mut History::default(),
        &settings(),
        now(),
    );
    assert_eq!(out.status.desired_replicas, 4);
    assert!(out.status.last_scale_time.is_some());
    assert_eq!(
        condition(&out.status, "AbleToScale"),
        (
            "True",
            "SucceededRescale",
            "the HPA controller was able to update the target scale to 4"
        )
    );
    assert_eq!(
        out.events,
        vec![PlannedEvent {
            warning: false,
            reason: "SuccessfulRescale".to_string(),
            message:
                "New size: 4; reason: cpu resource utilization (percentage of request) above target"
                    .to_string()
        }]
    );
}

#[test]
fn without_the_metrics_api_nothing_scales_and_the_condition_says_why() {
    let h = hpa(cpu_utilization(50), 1, 10);
    let missing = "unable to fetch metrics from resource metrics API: the server could not find the requested resource (get pods.metrics.k8s.io)";
    let out = run(&h, 2, &pods(2), Err(missing.to_string()));
    assert_eq!(out.rescale, None);
    let e =
        format!("failed to get cpu utilization: unable to get metrics for resource cpu: {missing}");
    assert_eq!(
        condition(&out.status, "ScalingActive"),
        (
            "False",
            "FailedGetResourceMetric",
            format!("the HPA was unable to compute the replica count: {e}").as_str()
        )
    );
    let reasons: Vec<&str> = out.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(
        reasons,
        ["FailedGetResourceMetric", "FailedComputeMetricsReplicas"]
    );
    assert_eq!(out.events[0].message, e);
    assert_eq!(
        out.events[1].message,
        format!("invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value: {e}")
    );
    assert_eq!(out.status.current_replicas, Some(2));
}

#[test]
fn an_unreadable_target_is_failed_get_scale() {
    let h = hpa(cpu_utilization(50), 1, 10);
    let out = failed_get_scale(&h, "deployments.apps \"web\" not found", now());
    assert_eq!(
        condition(&out.status, "AbleToScale"),
        ("False", "FailedGetScale", "the HPA controller was unable to get the target's current scale: deployments.apps \"web\" not found")
    );
    assert_eq!(out.events[0].reason, "FailedGetScale");
}

#[test]
fn counts_outside_min_and_max_are_brought_back_without_metrics() {
    let h = hpa(cpu_utilization(50), 2, 5);
    let out = run(&h, 8, &pods(0), Err("unused".to_string()));
    assert_eq!(
        out.rescale.as_ref().map(|r| (r.desired, r.reason.as_str())),
        Some((5, "Current number of replicas above Spec.MaxReplicas"))
    );
    let out = run(&h, 1, &pods(0), Err("unused".to_string()));
    assert_eq!(out.rescale.as_ref().map(|r| r.desired), Some(2));
    let out = run(&h, 0, &pods(0), Err("unused".to_string()));
    assert_eq!(out.rescale, None);
    assert_eq!(condition(&out.status, "ScalingActive").1, "ScalingDisabled");
    assert!(!needs_metrics(
        &h,
        &ScaleView {
            replicas: 8,
            selector: String::new()
        }
    ));
    assert!(needs_metrics(
        &h,
        &ScaleView {
            replicas: 3,
            selector: String::new()
        }
    ));
}

#[test]
fn custom_and_external_metrics_name_the_field() {
    let h = hpa(
        json!([{"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "1"}}}]),
        1,
        10,
    );
    let out = run(&h, 2, &pods(2), Ok(usage(2, 100)));
    let (status, reason, message) = condition(&out.status, "ScalingActive");
    assert_eq!((status, reason), ("False", "FailedGetPodsMetric"));
    assert!(message.contains("spec.metrics[0].pods"), "{message}");
}

#[test]
fn the_highest_proposal_wins_and_a_failed_metric_blocks_only_scale_down() {
    // cpu proposes 4; memory is missing from the metrics: the scale-up goes ahead.
    let two = json!([
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
        {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "1Gi"}}}
    ]);
    let h = hpa(two, 1, 10);
    let out = run(&h, 2, &pods(2), Ok(usage(2, 100)));
    assert_eq!(out.rescale.as_ref().map(|r| r.desired), Some(4));
    assert!(out
        .error
        .as_deref()
        .unwrap()
        .starts_with("invalid metrics (1 invalid out of 2)"));
    // cpu proposes a scale-down: with a failed metric, nothing happens.
    let out = run(&h, 4, &pods(4), Ok(usage(4, 10)));
    assert_eq!(out.rescale, None);
    assert_eq!(
        condition(&out.status, "ScalingActive").1,
        "FailedGetResourceMetric"
    );
}

#[test]
fn a_missing_or_ambiguous_selector_is_invalid() {
    let h = hpa(cpu_utilization(50), 1, 10);
    let refs: Vec<&CachedPod> = Vec::new();
    let one = |_: &[&CachedPod]| vec!["ns/web".to_string()];
    let metrics = Ok(usage(1, 1));
    let inputs = Inputs {
        pods: &refs,
        metrics: Some(&metrics),
        selecting: &one,
    };
    let view = ScaleView {
        replicas: 2,
        selector: String::new(),
    };
    let out = plan(
        &h,
        &view,
        &inputs,
        &mut History::default(),
        &settings(),
        now(),
    );
    assert_eq!(condition(&out.status, "ScalingActive").1, "InvalidSelector");
    assert_eq!(out.events[0].reason, "SelectorRequired");
    let two = |_: &[&CachedPod]| vec!["ns/a".to_string(), "ns/web".to_string()];
    let inputs = Inputs {
        pods: &refs,
        metrics: Some(&metrics),
        selecting: &two,
    };
    let view = ScaleView {
        replicas: 2,
        selector: "app=web".to_string(),
    };
    let out = plan(
        &h,
        &view,
        &inputs,
        &mut History::default(),
        &settings(),
        now(),
    );
    assert_eq!(
        condition(&out.status, "ScalingActive"),
        (
            "False",
            "AmbiguousSelector",
            "pods by selector app=web are controlled by multiple HPAs: [ns/a ns/web]"
        )
    );
}
