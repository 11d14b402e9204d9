//! Upstream's evaluator and controller tables (pods, services, claims, scopes, the status
//! arithmetic), restated: each case names the object, the resources asked and the usage expected.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ResourceQuota, Service};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::evaluate::*;
use crate::runtime::cached_pod::CachedPod;

/// A table row: the case's name, the object, and the usage it must give (resource, quantity).
type Case<'a, R> = (&'a str, Value, Vec<(R, &'a str)>);

fn pod(v: Value) -> CachedPod {
    serde_json::from_value(v).unwrap()
}

fn container(requests: Value, limits: Value) -> Value {
    json!({"name": "c", "resources": {"requests": requests, "limits": limits}})
}

fn printed(list: &ResourceList) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

fn want(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

fn now() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

#[test]
fn evaluators_claim_the_resource_names_upstream_gives_them() {
    for (name, want) in [
        ("pods", Some(Evaluator::Pods)),
        ("count/pods", Some(Evaluator::Pods)),
        ("cpu", Some(Evaluator::Pods)),
        ("requests.memory", Some(Evaluator::Pods)),
        ("limits.ephemeral-storage", Some(Evaluator::Pods)),
        ("hugepages-2Mi", Some(Evaluator::Pods)),
        ("requests.hugepages-1Gi", Some(Evaluator::Pods)),
        ("requests.example.com/gpu", Some(Evaluator::Pods)),
        // Extended resources are quota'd by request only; a native name with a slash is not one.
        ("limits.example.com/gpu", None),
        ("services", Some(Evaluator::Services)),
        ("services.nodeports", Some(Evaluator::Services)),
        ("count/services", Some(Evaluator::Services)),
        ("persistentvolumeclaims", Some(Evaluator::Claims)),
        ("requests.storage", Some(Evaluator::Claims)),
        ("count/persistentvolumeclaims", Some(Evaluator::Claims)),
        (
            "gold.storageclass.storage.k8s.io/requests.storage",
            Some(Evaluator::Claims),
        ),
        (
            "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
            Some(Evaluator::Claims),
        ),
        (
            "configmaps",
            Some(Evaluator::Count(GroupResource::core("configmaps"))),
        ),
        (
            "count/configmaps",
            Some(Evaluator::Count(GroupResource::core("configmaps"))),
        ),
        (
            "secrets",
            Some(Evaluator::Count(GroupResource::core("secrets"))),
        ),
        (
            "count/deployments.apps",
            Some(Evaluator::Count(GroupResource {
                group: "apps".into(),
                resource: "deployments".into(),
            })),
        ),
        (
            "count/widgets.example.com",
            Some(Evaluator::Count(GroupResource {
                group: "example.com".into(),
                resource: "widgets".into(),
            })),
        ),
        // Events are never counted; an unknown plain name belongs to no evaluator.
        ("count/events", None),
        ("foo", None),
        ("storage", None),
    ] {
        assert_eq!(Evaluator::of(name), want, "{name}");
    }
    assert_eq!(
        GroupResource {
            group: "apps".into(),
            resource: "deployments".into()
        }
        .count_name(),
        "count/deployments.apps"
    );
}

#[test]
fn pod_usage_sums_containers_and_takes_the_larger_init_container() {
    // upstream TestPodEvaluatorUsage, case by case.
    let cases: Vec<Case<&str>> = vec![
        (
            "init container CPU",
            json!({"spec": {"initContainers": [container(json!({"cpu": "1m"}), json!({"cpu": "2m"}))],
                "containers": []}}),
            vec![
                ("requests.cpu", "1m"),
                ("limits.cpu", "2m"),
                ("pods", "1"),
                ("count/pods", "1"),
                ("cpu", "1m"),
            ],
        ),
        (
            "init container memory and ephemeral storage",
            json!({"spec": {"initContainers": [container(
                json!({"memory": "1m", "ephemeral-storage": "32Mi"}),
                json!({"memory": "2m", "ephemeral-storage": "64Mi"}))], "containers": []}}),
            vec![
                ("requests.memory", "1m"),
                ("limits.memory", "2m"),
                ("memory", "1m"),
                ("requests.ephemeral-storage", "32Mi"),
                ("limits.ephemeral-storage", "64Mi"),
                ("ephemeral-storage", "32Mi"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
        (
            "huge pages and an extended resource",
            json!({"spec": {"containers": [container(
                json!({"hugepages-1Gi": "2Gi", "example.com/dongle": "3"}),
                json!({"hugepages-1Gi": "2Gi", "example.com/dongle": "3"}))]}}),
            vec![
                ("hugepages-1Gi", "2Gi"),
                ("requests.hugepages-1Gi", "2Gi"),
                ("requests.example.com/dongle", "3"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
        (
            "the larger of the init containers and the containers' sum",
            json!({"spec": {
            "initContainers": [
                container(json!({"cpu": "2", "memory": "100M"}), json!({"cpu": "4", "memory": "200M"})),
                container(json!({"cpu": "1", "memory": "50M"}), json!({"cpu": "2", "memory": "100M"})),
            ],
            "containers": [
                container(json!({"cpu": "1", "memory": "50M"}), json!({"cpu": "2", "memory": "100M"})),
                container(json!({"cpu": "500m", "memory": "100M"}), json!({"cpu": "1", "memory": "200M"})),
            ]}}),
            vec![
                ("requests.cpu", "2"),
                ("limits.cpu", "4"),
                ("cpu", "2"),
                ("requests.memory", "150M"),
                ("limits.memory", "300M"),
                ("memory", "150M"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
        (
            "overhead: every resource to requests, to limits only where one is set",
            json!({"spec": {"overhead": {"cpu": "1", "memory": "10M"},
                "containers": [container(json!({"cpu": "1", "memory": "50M"}), json!({"cpu": "2"}))]}}),
            vec![
                ("requests.cpu", "2"),
                ("cpu", "2"),
                ("limits.cpu", "3"),
                ("requests.memory", "60M"),
                ("memory", "60M"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
        (
            "a sidecar adds to the containers and to later init containers",
            json!({"spec": {
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                    container(json!({"cpu": "2"}), json!({})),
                ],
                "containers": [container(json!({"cpu": "1"}), json!({}))]}}),
            vec![
                ("requests.cpu", "3"),
                ("cpu", "3"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
        (
            "an in-place resize: the larger of spec and actuated",
            json!({"spec": {"containers": [container(json!({"cpu": "1"}), json!({"cpu": "2"}))]},
                "status": {"containerStatuses": [{"name": "c", "resources":
                    {"requests": {"cpu": "1500m"}, "limits": {"cpu": "2"}}}]}}),
            vec![
                ("requests.cpu", "1500m"),
                ("cpu", "1500m"),
                ("limits.cpu", "2"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
        (
            "Pod-level resources replace the containers' CPU and memory",
            json!({"spec": {"resources": {"requests": {"cpu": "4"}, "limits": {"memory": "1Gi"}},
                "containers": [container(json!({"cpu": "1"}), json!({"memory": "100Mi"}))]}}),
            vec![
                ("requests.cpu", "4"),
                ("cpu", "4"),
                ("limits.memory", "1Gi"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
        (
            "a terminal Pod counts only in count/pods",
            json!({"spec": {"containers": [container(json!({"cpu": "1"}), json!({}))]},
                "status": {"phase": "Succeeded"}}),
            vec![("count/pods", "1")],
        ),
        (
            "a Pod terminating past its grace period counts only in count/pods",
            json!({"metadata": {"deletionTimestamp": "2025-12-31T23:59:00Z", "deletionGracePeriodSeconds": 30},
                "spec": {"containers": [container(json!({"cpu": "1"}), json!({}))]}}),
            vec![("count/pods", "1")],
        ),
        (
            "a Pod still within its grace period counts",
            json!({"metadata": {"deletionTimestamp": "2025-12-31T23:59:50Z", "deletionGracePeriodSeconds": 30},
                "spec": {"containers": [container(json!({"cpu": "1"}), json!({}))]}}),
            vec![
                ("requests.cpu", "1"),
                ("cpu", "1"),
                ("pods", "1"),
                ("count/pods", "1"),
            ],
        ),
    ];
    for (what, p, expected) in cases {
        assert_eq!(
            printed(&pod_usage(&pod(p), now())),
            want(&expected),
            "{what}"
        );
    }
}

fn scope(scope: &str, operator: &str, values: &[&str]) -> ScopeRequirement {
    ScopeRequirement {
        scope: scope.into(),
        operator: operator.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

#[test]
fn pods_match_scopes_as_upstream() {
    let best_effort = pod(json!({"spec": {"containers": [{"name": "c"}]}}));
    let burstable =
        pod(json!({"spec": {"containers": [container(json!({"cpu": "1"}), json!({}))]}}));
    let qos_from_status = pod(json!({"spec": {"containers": [{"name": "c"}]},
        "status": {"qosClass": "Burstable"}}));
    let zero_request =
        pod(json!({"spec": {"containers": [container(json!({"cpu": "0"}), json!({}))]}}));
    let deadline = pod(json!({"spec": {"activeDeadlineSeconds": 60, "containers": []}}));
    let high = pod(json!({"spec": {"priorityClassName": "high", "containers": []}}));
    let cross = pod(
        json!({"spec": {"containers": [], "affinity": {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm":
            {"topologyKey": "zone", "namespaceSelector": {}}}]}}}}),
    );
    let same_ns = pod(
        json!({"spec": {"containers": [], "affinity": {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}}}}),
    );
    let cases = [
        (
            "BestEffort",
            &best_effort,
            scope("BestEffort", "Exists", &[]),
            true,
        ),
        (
            "BestEffort",
            &burstable,
            scope("BestEffort", "Exists", &[]),
            false,
        ),
        (
            "NotBestEffort",
            &burstable,
            scope("NotBestEffort", "Exists", &[]),
            true,
        ),
        (
            "qosClass wins",
            &qos_from_status,
            scope("BestEffort", "Exists", &[]),
            false,
        ),
        (
            "zero request",
            &zero_request,
            scope("BestEffort", "Exists", &[]),
            true,
        ),
        (
            "Terminating",
            &deadline,
            scope("Terminating", "Exists", &[]),
            true,
        ),
        (
            "Terminating",
            &best_effort,
            scope("Terminating", "Exists", &[]),
            false,
        ),
        (
            "NotTerminating",
            &best_effort,
            scope("NotTerminating", "Exists", &[]),
            true,
        ),
        (
            "PriorityClass In",
            &high,
            scope("PriorityClass", "In", &["high", "x"]),
            true,
        ),
        (
            "PriorityClass In",
            &best_effort,
            scope("PriorityClass", "In", &["high"]),
            false,
        ),
        (
            "PriorityClass NotIn",
            &high,
            scope("PriorityClass", "NotIn", &["high"]),
            false,
        ),
        (
            "PriorityClass NotIn, none",
            &best_effort,
            scope("PriorityClass", "NotIn", &["high"]),
            true,
        ),
        (
            "PriorityClass Exists",
            &high,
            scope("PriorityClass", "Exists", &[]),
            true,
        ),
        (
            "PriorityClass DoesNotExist",
            &high,
            scope("PriorityClass", "DoesNotExist", &[]),
            false,
        ),
        (
            "PriorityClass DoesNotExist",
            &best_effort,
            scope("PriorityClass", "DoesNotExist", &[]),
            true,
        ),
        (
            "cross-namespace",
            &cross,
            scope("CrossNamespacePodAffinity", "Exists", &[]),
            true,
        ),
        (
            "same namespace",
            &same_ns,
            scope("CrossNamespacePodAffinity", "Exists", &[]),
            false,
        ),
        (
            "unknown scope",
            &best_effort,
            scope("Nonsense", "Exists", &[]),
            false,
        ),
    ];
    for (what, p, req, expected) in cases {
        assert_eq!(pod_matches_scope(&req, p), expected, "{what}");
    }
}

fn service(v: Value) -> Service {
    serde_json::from_value(v).unwrap()
}

#[test]
fn service_usage_counts_load_balancers_and_node_ports() {
    // upstream TestServiceEvaluatorUsage.
    let cases = [
        (
            "ClusterIP",
            json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
            ("0", "0"),
        ),
        (
            "NodePort, two ports",
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 81}]}}),
            ("0", "2"),
        ),
        (
            "LoadBalancer",
            json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            ("1", "1"),
        ),
        (
            "LoadBalancer without node ports, one given",
            json!({"spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                "ports": [{"port": 80, "nodePort": 30001}, {"port": 81}]}}),
            ("1", "1"),
        ),
        (
            "ExternalName",
            json!({"spec": {"type": "ExternalName", "externalName": "x"}}),
            ("0", "0"),
        ),
    ];
    for (what, svc, (lbs, nodeports)) in cases {
        assert_eq!(
            printed(&service_usage(&service(svc))),
            want(&[
                ("count/services", "1"),
                ("services", "1"),
                ("services.loadbalancers", lbs),
                ("services.nodeports", nodeports),
            ]),
            "{what}"
        );
    }
}

fn claim(v: Value) -> PersistentVolumeClaim {
    serde_json::from_value(v).unwrap()
}

#[test]
fn claim_usage_charges_storage_to_its_class() {
    // upstream TestPersistentVolumeClaimEvaluatorUsage.
    let gold = "gold.storageclass.storage.k8s.io/";
    let cases: Vec<Case<String>> = vec![
        (
            "no class",
            json!({"spec": {"resources": {"requests": {"storage": "10Gi"}}}}),
            vec![("requests.storage".into(), "10Gi")],
        ),
        (
            "storageClassName",
            json!({"spec": {"storageClassName": "gold", "resources": {"requests": {"storage": "10Gi"}}}}),
            vec![
                ("requests.storage".into(), "10Gi"),
                (format!("{gold}requests.storage"), "10Gi"),
                (format!("{gold}persistentvolumeclaims"), "1"),
            ],
        ),
        (
            "the beta annotation wins",
            json!({"metadata": {"annotations": {"volume.beta.kubernetes.io/storage-class": "gold"}},
                "spec": {"storageClassName": "silver", "resources": {"requests": {"storage": "1Gi"}}}}),
            vec![
                ("requests.storage".into(), "1Gi"),
                (format!("{gold}requests.storage"), "1Gi"),
                (format!("{gold}persistentvolumeclaims"), "1"),
            ],
        ),
        (
            "a fractional request is rounded up to whole bytes",
            json!({"spec": {"resources": {"requests": {"storage": "1500m"}}}}),
            vec![("requests.storage".into(), "2")],
        ),
        (
            "allocated storage larger than the request",
            json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}},
                "status": {"allocatedResources": {"storage": "2Gi"}}}),
            vec![("requests.storage".into(), "2Gi")],
        ),
        ("no request", json!({"spec": {}}), vec![]),
    ];
    for (what, c, extra) in cases {
        let mut expected = vec![
            ("persistentvolumeclaims".to_string(), "1"),
            ("count/persistentvolumeclaims".to_string(), "1"),
        ];
        expected.extend(extra);
        let expected: Vec<(&str, &str)> = expected.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(printed(&claim_usage(&claim(c))), want(&expected), "{what}");
    }
    let before = claim(json!({"status": {"allocatedResources": {"storage": "1Gi"}}}));
    let after = claim(json!({"status": {"allocatedResources": {"storage": "2Gi"}}}));
    assert!(claim_needs_replenish(&before, &after));
    assert!(!claim_needs_replenish(&before, &before));
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn usage_sums_matching_items_from_zero_and_keeps_to_the_resources_asked() {
    let pods = [
        pod(
            json!({"spec": {"containers": [container(json!({"cpu": "100m", "memory": "1Gi"}), json!({}))]}}),
        ),
        pod(json!({"spec": {"activeDeadlineSeconds": 5,
            "containers": [container(json!({"cpu": "200m"}), json!({}))]}})),
        pod(json!({"spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Failed"}})),
    ];
    let resources = names(&["pods", "requests.cpu", "requests.memory", "count/pods"]);
    let all = usage_of(
        &resources,
        &[],
        pods.iter(),
        |s, p| pod_matches_scope(s, p),
        |p| pod_usage(p, now()),
    );
    assert_eq!(
        printed(&all),
        want(&[
            ("count/pods", "3"),
            ("pods", "2"),
            ("requests.cpu", "300m"),
            ("requests.memory", "1Gi"),
        ])
    );
    let terminating = usage_of(
        &resources,
        &[scope("Terminating", "Exists", &[])],
        pods.iter(),
        |s, p| pod_matches_scope(s, p),
        |p| pod_usage(p, now()),
    );
    assert_eq!(
        printed(&terminating),
        want(&[
            ("count/pods", "1"),
            ("pods", "1"),
            ("requests.cpu", "200m"),
            ("requests.memory", "0"),
        ])
    );
}

fn quota(v: Value) -> ResourceQuota {
    serde_json::from_value(v).unwrap()
}

#[test]
fn the_status_mirrors_hard_and_replaces_what_was_computed() {
    // upstream TestSyncResourceQuota's shapes.
    let q = quota(json!({"spec": {"hard": {"pods": "5", "cpu": "4", "foo": "3"}}}));
    let usage: ResourceList = [
        (
            "pods".to_string(),
            crate::helpers::quantity::Quantity::from_int(2),
        ),
        (
            "cpu".to_string(),
            crate::helpers::quantity::Quantity::parse("1500m").unwrap(),
        ),
    ]
    .into();
    let status = next_status(&q, &usage).expect("a first sync writes");
    let used = status.used.unwrap();
    assert_eq!(used["pods"].0, "2");
    assert_eq!(used["cpu"].0, "1500m");
    assert!(
        !used.contains_key("foo"),
        "no evaluator tracks foo: not reported"
    );
    assert_eq!(status.hard.unwrap()["foo"].0, "3");

    // The same usage again: nothing to write; equal values in another form are equal.
    let synced = quota(
        json!({"spec": {"hard": {"pods": "5", "cpu": "4", "foo": "3"}},
        "status": {"hard": {"pods": "5", "cpu": "4000m", "foo": "3"}, "used": {"pods": "2", "cpu": "1.5"}}}),
    );
    assert!(next_status(&synced, &usage).is_none());

    // A value admission wrote for an untracked resource is kept; one for a resource no longer
    // in spec.hard is dropped.
    let admitted = quota(json!({"spec": {"hard": {"pods": "5", "foo": "3"}},
        "status": {"hard": {"pods": "5", "foo": "3", "cpu": "4"}, "used": {"pods": "1", "foo": "1", "cpu": "1"}}}));
    let status = next_status(&admitted, &usage).unwrap();
    let used = status.used.unwrap();
    assert_eq!(
        used.iter()
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
            .collect::<Vec<_>>(),
        [("foo", "1"), ("pods", "2")]
    );
}

#[test]
fn a_quota_is_synced_first_when_its_status_lags_its_spec() {
    let tracked = |n: &str| Evaluator::of(n).is_some();
    let fresh = quota(json!({"spec": {"hard": {"pods": "1"}}}));
    assert!(needs_priority(&fresh, tracked));
    let missing = quota(json!({"spec": {"hard": {"pods": "1"}},
        "status": {"hard": {"pods": "1"}, "used": {}}}));
    assert!(needs_priority(&missing, tracked));
    let untracked = quota(json!({"spec": {"hard": {"foo": "1"}},
        "status": {"hard": {"foo": "1"}, "used": {}}}));
    assert!(!needs_priority(&untracked, tracked));
    let synced = quota(json!({"spec": {"hard": {"pods": "1"}},
        "status": {"hard": {"pods": "1"}, "used": {"pods": "0"}}}));
    assert!(!needs_priority(&synced, tracked));
}

#[test]
fn scope_requirements_are_the_scopes_then_the_selector() {
    let q = quota(
        json!({"spec": {"scopes": ["BestEffort"], "scopeSelector": {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}}),
    );
    assert_eq!(
        scope_requirements(&q),
        [
            scope("BestEffort", "Exists", &[]),
            scope("PriorityClass", "In", &["high"])
        ]
    );
}
