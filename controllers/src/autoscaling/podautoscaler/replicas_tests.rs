//! Upstream's replica calculator table (`replica_calculator_test.go`), restated: Pods of two
//! containers each, both requesting `request` and each using `level` of CPU (so a Pod requests
//! and uses twice those); Pods are Running and Ready, started long before the CPU
//! initialisation period unless a case says otherwise ("hot": started now). The calculator runs
//! with upstream's test settings (tolerance 0.1, initialisation period 2 min, readiness delay
//! 10 s).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;

const NOW: i64 = 1_750_000_000;

#[derive(Clone, Copy, PartialEq)]
enum Pod {
    /// Running, Ready, started long ago.
    Cool,
    /// Running, Ready, started now (within the CPU initialisation period).
    Hot,
    /// Running, not Ready.
    Unready,
    /// Running, not Ready, started now.
    HotUnready,
    /// Failed.
    Failed,
    /// Pending.
    Pending,
    /// Being deleted (still Running).
    Deleting,
}

struct Case {
    name: &'static str,
    current: i32,
    pods: Vec<Pod>,
    /// Millicores requested per container, one per Pod.
    requests: Vec<i64>,
    /// Millicores used per container, for the first Pods (the rest have no metric).
    levels: Vec<i64>,
    target: i32,
    expected: i32,
    utilization: i32,
    raw: i64,
}

fn pod(i: usize, kind: Pod, request: i64) -> CachedPod {
    let long_ago = "2000-01-01T00:00:00Z";
    let now = Timestamp::from_second(NOW).unwrap().to_string();
    let start = match kind {
        Pod::Hot | Pod::HotUnready => now.as_str(),
        _ => long_ago,
    };
    let ready = match kind {
        Pod::Unready | Pod::HotUnready | Pod::Failed | Pod::Pending => "False",
        _ => "True",
    };
    let phase = match kind {
        Pod::Failed => "Failed",
        Pod::Pending => "Pending",
        _ => "Running",
    };
    let requests = json!({"requests": {"cpu": format!("{request}m"), "memory": "1Gi"}});
    let mut p = json!({
        "metadata": {"name": format!("test-pod-{i}"), "namespace": "ns", "labels": {"name": "test-pod"}},
        "spec": {"containers": [
            {"name": "container1", "resources": requests},
            {"name": "container2", "resources": requests}
        ]},
        "status": {
            "phase": phase,
            "startTime": start,
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": long_ago}]
        }
    });
    if kind == Pod::Deleting {
        p["metadata"]["deletionTimestamp"] = json!(now);
    }
    serde_json::from_value(p).unwrap()
}

fn readiness() -> Readiness {
    Readiness {
        cpu_initialization_period: Duration::from_secs(120),
        initial_readiness_delay: Duration::from_secs(10),
        now: Timestamp::from_second(NOW).unwrap(),
    }
}

fn metrics_of(levels: &[i64]) -> PodMetrics {
    levels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            (
                format!("test-pod-{i}"),
                PodMetric {
                    value: 2 * l,
                    // Sampled long ago: within a hot Pod's first window, so not representative.
                    timestamp: Timestamp::from_second(946_684_800).unwrap(),
                    window: Duration::from_secs(60),
                },
            )
        })
        .collect()
}

fn run(c: &Case) {
    let pods: Vec<CachedPod> = c
        .pods
        .iter()
        .zip(&c.requests)
        .enumerate()
        .map(|(i, (k, r))| pod(i, *k, *r))
        .collect();
    let refs: Vec<&CachedPod> = pods.iter().collect();
    let got = resource_replicas(
        c.current,
        c.target,
        "cpu",
        "",
        Tolerances::both(0.1),
        &refs,
        metrics_of(&c.levels),
        &readiness(),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    assert_eq!(
        (got.replicas, got.utilization, got.raw_average),
        (c.expected, c.utilization, c.raw),
        "{}",
        c.name
    );
}

fn cool(n: usize) -> Vec<Pod> {
    vec![Pod::Cool; n]
}

#[test]
fn upstream_resource_utilization_table() {
    use Pod::*;
    let cases = vec![
        Case {
            name: "scale up",
            current: 3,
            pods: cool(3),
            requests: vec![1000; 3],
            levels: vec![300, 500, 700],
            target: 30,
            expected: 5,
            utilization: 50,
            raw: 1000,
        },
        Case {
            name: "scale up, an unready Pod scales less",
            current: 3,
            pods: vec![Unready, Cool, Cool],
            requests: vec![1000; 3],
            levels: vec![300, 500, 700],
            target: 30,
            expected: 4,
            utilization: 60,
            raw: 1200,
        },
        Case {
            name: "scale up, a hot Pod scales less",
            current: 3,
            pods: vec![Hot, Cool, Cool],
            requests: vec![1000; 3],
            levels: vec![300, 500, 700],
            target: 30,
            expected: 4,
            utilization: 60,
            raw: 1200,
        },
        Case {
            name: "scale up ignores Failed Pods",
            current: 2,
            pods: vec![Cool, Cool, Failed, Failed],
            requests: vec![1000; 4],
            levels: vec![500, 700],
            target: 30,
            expected: 4,
            utilization: 60,
            raw: 1200,
        },
        Case {
            name: "scale up ignores Pods being deleted",
            current: 2,
            pods: vec![Cool, Cool, Deleting, Deleting],
            requests: vec![1000; 4],
            levels: vec![500, 700],
            target: 30,
            expected: 4,
            utilization: 60,
            raw: 1200,
        },
        Case {
            name: "scale down",
            current: 5,
            pods: cool(5),
            requests: vec![1000; 5],
            levels: vec![100, 300, 500, 250, 250],
            target: 50,
            expected: 3,
            utilization: 28,
            raw: 560,
        },
        Case {
            name: "scale down excludes unready Pods",
            current: 5,
            pods: vec![Cool, Cool, Cool, Unready, Unready],
            requests: vec![1000; 5],
            levels: vec![100, 300, 500, 250, 250],
            target: 50,
            expected: 2,
            utilization: 30,
            raw: 600,
        },
        Case {
            name: "scale down excludes Pending Pods",
            current: 5,
            pods: vec![Cool, Pending, Pending, Pending, Pending],
            requests: vec![1000; 5],
            levels: vec![100],
            target: 50,
            expected: 1,
            utilization: 10,
            raw: 200,
        },
        Case {
            name: "scale down ignores hot Pods",
            current: 5,
            pods: vec![Cool, Cool, Cool, Hot, Hot],
            requests: vec![1000; 5],
            levels: vec![100, 300, 500, 250, 250],
            target: 50,
            expected: 2,
            utilization: 30,
            raw: 600,
        },
        Case {
            name: "scale down ignores Failed Pods",
            current: 5,
            pods: vec![Cool, Cool, Cool, Cool, Cool, Failed, Failed],
            requests: vec![1000; 7],
            levels: vec![100, 300, 500, 250, 250],
            target: 50,
            expected: 3,
            utilization: 28,
            raw: 560,
        },
        Case {
            name: "within the tolerance",
            current: 3,
            pods: cool(3),
            requests: vec![900, 1000, 1100],
            levels: vec![1010, 1030, 1020],
            target: 100,
            expected: 3,
            utilization: 102,
            raw: 2040,
        },
        Case {
            name: "missing metrics",
            current: 4,
            pods: cool(4),
            requests: vec![1000; 4],
            levels: vec![400, 95],
            target: 100,
            expected: 3,
            utilization: 24,
            raw: 495,
        },
        Case {
            name: "missing metrics, no change (equal)",
            current: 2,
            pods: cool(2),
            requests: vec![1000; 2],
            levels: vec![1000],
            target: 100,
            expected: 2,
            utilization: 100,
            raw: 2000,
        },
        Case {
            name: "missing metrics, no change (above)",
            current: 2,
            pods: cool(2),
            requests: vec![1000; 2],
            levels: vec![1900],
            target: 100,
            expected: 2,
            utilization: 190,
            raw: 3800,
        },
        Case {
            name: "missing metrics, no change (below)",
            current: 2,
            pods: cool(2),
            requests: vec![1000; 2],
            levels: vec![600],
            target: 100,
            expected: 2,
            utilization: 60,
            raw: 1200,
        },
        Case {
            name: "missing metrics and an unready Pod: no change",
            current: 3,
            pods: vec![Unready, Cool, Cool],
            requests: vec![1000; 3],
            levels: vec![100, 450],
            target: 50,
            expected: 3,
            utilization: 45,
            raw: 900,
        },
        Case {
            name: "missing metrics and a hot Pod: no change",
            current: 3,
            pods: vec![Hot, Cool, Cool],
            requests: vec![1000; 3],
            levels: vec![100, 450],
            target: 50,
            expected: 3,
            utilization: 45,
            raw: 900,
        },
        Case {
            name: "missing metrics and an unready Pod: scale up",
            current: 3,
            pods: vec![Unready, Cool, Cool],
            requests: vec![1000; 3],
            levels: vec![100, 2000],
            target: 50,
            expected: 4,
            utilization: 200,
            raw: 4000,
        },
        Case {
            name: "missing metrics and a hot unready Pod: scale up",
            current: 3,
            pods: vec![HotUnready, Cool, Cool],
            requests: vec![1000; 3],
            levels: vec![100, 2000],
            target: 50,
            expected: 4,
            utilization: 200,
            raw: 4000,
        },
        Case {
            name: "missing metrics and an unready Pod: scale down",
            current: 4,
            pods: vec![Unready, Cool, Cool, Cool],
            requests: vec![1000; 4],
            levels: vec![100, 100, 100],
            target: 50,
            expected: 3,
            utilization: 10,
            raw: 200,
        },
        Case {
            name: "missing metrics, scale down with a target over 100 %",
            current: 4,
            pods: vec![Unready, Cool, Cool, Cool],
            requests: vec![1000, 1000, 2000, 2000],
            levels: vec![200, 100, 100],
            target: 300,
            expected: 2,
            utilization: 6,
            raw: 200,
        },
    ];
    for c in &cases {
        run(c);
    }
}

#[test]
fn errors_name_what_is_missing() {
    let r = readiness();
    let pods = [pod(0, Pod::Cool, 1000)];
    let refs: Vec<&CachedPod> = pods.iter().collect();
    let t = Tolerances::both(0.1);
    let e = resource_replicas(1, 50, "cpu", "", t, &[], metrics_of(&[100]), &r).unwrap_err();
    assert_eq!(
        e,
        "no pods returned by selector while calculating replica count"
    );
    let e = resource_replicas(1, 50, "cpu", "", t, &refs, PodMetrics::new(), &r).unwrap_err();
    assert_eq!(
        e,
        "did not receive metrics for targeted pods (pods might be unready)"
    );
    let e = resource_replicas(1, 50, "storage", "", t, &refs, metrics_of(&[100]), &r).unwrap_err();
    assert_eq!(
        e,
        "missing request for storage in container container1 of Pod test-pod-0"
    );
    // Metrics of Pods that are not the target's: nothing to compare.
    let mut strangers = metrics_of(&[100]);
    let m = strangers.remove("test-pod-0").unwrap();
    strangers.insert("other".to_string(), m);
    let e =
        utilization_ratio(&strangers, &pod_requests(&refs, "", "cpu").unwrap(), 50).unwrap_err();
    assert_eq!(e, "no metrics returned matched known pods");
}

#[test]
fn memory_is_never_subject_to_cpu_readiness() {
    // An unready, hot Pod's memory counts (upstream applies the readiness rules to CPU only).
    let pods = [pod(0, Pod::HotUnready, 1000), pod(1, Pod::Cool, 1000)];
    let refs: Vec<&CachedPod> = pods.iter().collect();
    let mut metrics = PodMetrics::new();
    for name in ["test-pod-0", "test-pod-1"] {
        metrics.insert(
            name.to_string(),
            PodMetric {
                value: 1024 * 1024 * 1024 * 1000, // 1Gi of the 2Gi requested
                timestamp: Timestamp::from_second(NOW).unwrap(),
                window: Duration::from_secs(60),
            },
        );
    }
    let got = resource_replicas(
        2,
        25,
        "memory",
        "",
        Tolerances::both(0.1),
        &refs,
        metrics,
        &readiness(),
    )
    .unwrap();
    assert_eq!((got.replicas, got.utilization), (4, 50));
}

#[test]
fn average_value_targets() {
    // Upstream's plain-metric cases: the average against the target value.
    let r = readiness();
    let pods: Vec<CachedPod> = (0..3).map(|i| pod(i, Pod::Cool, 1000)).collect();
    let refs: Vec<&CachedPod> = pods.iter().collect();
    let t = Tolerances::both(0.1);
    // 2 × (300, 500, 700) = average 1000m against 500m: twice the Pods.
    let up =
        raw_resource_replicas(3, 500, "cpu", t, &refs, metrics_of(&[300, 500, 700]), &r).unwrap();
    assert_eq!((up.replicas, up.average), (6, 1000));
    // Within the tolerance: no change.
    let same =
        raw_resource_replicas(3, 950, "cpu", t, &refs, metrics_of(&[300, 500, 700]), &r).unwrap();
    assert_eq!((same.replicas, same.average), (3, 1000));
    // A missing Pod on a scale-down counts as using the target.
    let down =
        raw_resource_replicas(3, 2000, "cpu", t, &refs, metrics_of(&[100, 100]), &r).unwrap();
    assert_eq!((down.replicas, down.average), (2, 200));
}

#[test]
fn pod_level_requests_and_sidecars() {
    let p: CachedPod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}},
                {"name": "init", "resources": {"requests": {"cpu": "1"}}}
            ]
        }
    }))
    .unwrap();
    assert_eq!(pod_requests(&[&p], "", "cpu").unwrap()["p"], 150);
    assert_eq!(pod_requests(&[&p], "side", "cpu").unwrap()["p"], 50);
    let mut pl = p.clone();
    pl.spec.as_mut().unwrap().resources =
        serde_json::from_value(json!({"requests": {"cpu": "2"}})).unwrap();
    assert_eq!(pod_requests(&[&pl], "", "cpu").unwrap()["p"], 2000);
    // A named container takes precedence over the Pod-level requests.
    assert_eq!(pod_requests(&[&pl], "a", "cpu").unwrap()["p"], 100);
    assert_eq!(
        pod_requests(&[&pl], "", "memory").unwrap_err(),
        "missing pod-level request for memory in Pod p"
    );
}
