//! The ReplicationController flavor: the conversion the plan reads, the kind its Pods' controller
//! references carry, the status it writes, and the handlers' routing by kind (a Pod of a
//! ReplicaSet named like a ReplicationController never wakes the ReplicationController).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ReplicationControllerStatus;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::runtime::cached_pod::CachedPod;

fn rc(extra: serde_json::Value) -> ReplicationController {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-rc", "generation": 3},
        "spec": {"replicas": 2, "minReadySeconds": 4, "selector": {"app": "web"},
                 "template": {"metadata": {"labels": {"app": "web", "tier": "a"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn pod(name: &str, owner_kind: Option<&str>, extra: serde_json::Value) -> Arc<CachedPod> {
    let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                                    "resourceVersion": "1", "labels": {"app": "web"}},
                       "status": {"phase": "Running"}});
    if let Some(kind) = owner_kind {
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": kind,
            "name": "web", "uid": "uid-rc", "controller": true}]);
    }
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

#[test]
fn conversion_keeps_spec_status_and_conditions() {
    let rc = rc(
        json!({"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 0,
        "fullyLabeledReplicas": 1, "observedGeneration": 2,
        "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                        "message": "quota", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    );
    let rs = to_replica_set(&rc);
    assert_eq!(rs.metadata, rc.metadata, "metadata as it is");
    let spec = rs.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(spec.min_ready_seconds, Some(4));
    assert_eq!(
        serde_json::to_value(&spec.selector).unwrap(),
        json!({"matchLabels": {"app": "web"}}),
        "the selector map is matchLabels"
    );
    assert_eq!(spec.template, rc.spec.as_ref().unwrap().template);
    // The status round-trips: what the plan reads is what the RC says, field for field.
    let back: ReplicationControllerStatus =
        serde_json::from_value(serde_json::to_value(rs.status.as_ref().unwrap()).unwrap()).unwrap();
    assert_eq!(Some(back), rc.status);
    assert_eq!(plan::desired_replicas(&rs), 2);
    assert_eq!(plan::min_ready_seconds(&rs), 4);
}

#[test]
fn candidates_are_the_pods_controlled_by_this_replication_controller_and_orphans() {
    let rs = to_replica_set(&rc(json!({})));
    let pods = vec![
        pod("a-rc", Some("ReplicationController"), json!({})),
        pod("b-orphan", None, json!({})),
        // Same name and uid, other kind: upstream's FilterPodsByOwner compares the kind too.
        pod("c-rs", Some("ReplicaSet"), json!({})),
    ];
    let names: Vec<_> = plan::candidates(REPLICATION_CONTROLLER, &rs, pods)
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["a-rc", "b-orphan"]);
}

#[test]
fn created_pods_name_the_replication_controller_as_their_controller() {
    let rs = to_replica_set(&rc(json!({})));
    let p = plan::pod_from_template(REPLICATION_CONTROLLER, &rs).unwrap();
    assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(
        serde_json::to_value(p.metadata.owner_references.unwrap()).unwrap(),
        json!([{"apiVersion": "v1", "kind": "ReplicationController", "name": "web",
                "uid": "uid-rc", "controller": true, "blockOwnerDeletion": true}])
    );
    let err = plan::pod_from_template(
        REPLICATION_CONTROLLER,
        &to_replica_set(&rc(
            json!({"spec": {"template": {"metadata": {"labels": null}}}}),
        )),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ReplicationController ns/web")
            && err.contains("spec.template.metadata.labels"),
        "an error names the ReplicationController and the field: {err}"
    );
}

#[test]
fn status_as_upstream_writes_it_for_a_replication_controller() {
    let now: Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
    let rs = to_replica_set(&rc(json!({"spec": {"minReadySeconds": 0}})));
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let active = vec![
        pod("a", Some("ReplicationController"), ready.clone()),
        // Missing the template's `tier` label: counted, not fully labeled.
        pod("b", Some("ReplicationController"), json!({})),
    ];

    struct Case {
        name: &'static str,
        replicas: i32,
        error: Option<&'static str>,
        reason: Option<&'static str>,
    }
    for c in [
        Case {
            name: "too few, creation failed: ReplicaFailure FailedCreate",
            replicas: 3,
            error: Some("forbidden: exceeded quota"),
            reason: Some("FailedCreate"),
        },
        Case {
            name: "too many, deletion failed: ReplicaFailure FailedDelete",
            replicas: 1,
            error: Some("unable to delete pods: boom"),
            reason: Some("FailedDelete"),
        },
        Case {
            name: "no error: no condition",
            replicas: 2,
            error: None,
            reason: None,
        },
    ] {
        let mut rs = rs.clone();
        rs.spec.as_mut().unwrap().replicas = Some(c.replicas);
        let status = plan::calculate_status(&rs, &active, c.error, now);
        let patch = super::super::status_patch(&rs, &status, STATUS_FIELDS);
        let written: ReplicationControllerStatus =
            serde_json::from_value(patch["status"].clone()).expect(c.name);
        assert_eq!(written.replicas, 2, "{}", c.name);
        assert_eq!(written.fully_labeled_replicas, Some(0), "{}", c.name);
        assert_eq!(written.ready_replicas, Some(1), "{}", c.name);
        assert_eq!(written.available_replicas, Some(1), "{}", c.name);
        assert!(
            patch["status"].get("terminatingReplicas").is_none(),
            "{}: a ReplicationController's status has no terminatingReplicas",
            c.name
        );
        let conditions = written.conditions.unwrap_or_default();
        match c.reason {
            Some(reason) => {
                assert_eq!(conditions.len(), 1, "{}", c.name);
                assert_eq!(conditions[0].type_, plan::REPLICA_FAILURE);
                assert_eq!(conditions[0].status, "True");
                assert_eq!(conditions[0].reason.as_deref(), Some(reason), "{}", c.name);
                assert_eq!(conditions[0].message.as_deref(), c.error);
            }
            None => assert!(conditions.is_empty(), "{}", c.name),
        }
    }
    // A sync without error removes the condition an earlier one set.
    let failed = to_replica_set(&rc(json!({"status": {"replicas": 2, "conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}]}})));
    let status = plan::calculate_status(&failed, &active, None, now);
    assert_eq!(status.conditions, None);
}

#[tokio::test]
async fn pod_events_wake_the_replication_controller_of_their_kind_only() {
    let (controller, informers) =
        crate::runtime::testing::offline(|c, i| new(c, i, Config::default()));
    informers
        .get::<ReplicationController>()
        .dispatch(&Event::Apply(rc(json!({}))));
    let pods = informers.get::<CachedPod>();
    let drain = || crate::runtime::testing::drain(&controller.queue);
    assert_eq!(drain().await, ["ns/web"], "the RC itself is queued");

    controller
        .pod_control
        .expectations()
        .expect_creations("ns/web", 1);
    pods.dispatch(&Event::Apply(
        pod("rs-pod", Some("ReplicaSet"), json!({}))
            .as_ref()
            .clone(),
    ));
    // An RS-owned Pod is neither an orphan nor this RC's: nothing queued, nothing observed.
    assert!(drain().await.is_empty());
    assert_eq!(
        controller.pod_control.expectations().pending("ns/web"),
        Some((1, 0))
    );

    pods.dispatch(&Event::Apply(
        pod("rc-pod", Some("ReplicationController"), json!({}))
            .as_ref()
            .clone(),
    ));
    assert_eq!(drain().await, ["ns/web"]);
    assert!(controller.pod_control.expectations().satisfied("ns/web"));

    pods.dispatch(&Event::Apply(
        pod("orphan", None, json!({})).as_ref().clone(),
    ));
    assert_eq!(
        drain().await,
        ["ns/web"],
        "an orphan wakes the RC selecting it"
    );
}
