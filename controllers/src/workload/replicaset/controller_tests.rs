//! The ReplicaSet controller's event handlers (RS-2, CTL-8): which keys a Pod or ReplicaSet
//! change queues and which expectations it observes. Events go through the informers' own
//! dispatch; the client is never used (nothing syncs).

use super::*;
use crate::runtime::expectations::Expectations;
use kube::runtime::watcher::Event;
use serde_json::json;
use std::time::Duration;

use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::Informer;
use crate::runtime::testing::{drain_sorted, offline, owned_pod};

struct World {
    controller: Arc<Controller>,
    replica_sets: Arc<Informer<ReplicaSet>>,
    pods: Arc<Informer<CachedPod>>,
    _informers: Arc<Informers>,
}

fn world() -> World {
    let (controller, informers) = offline(|c, i| Controller::new(c, i, Config::default()));
    let w = World {
        controller,
        replica_sets: informers.get::<ReplicaSet>(),
        pods: informers.get::<CachedPod>(),
        _informers: informers,
    };
    for (name, uid, selector) in [
        ("web", "uid-web", json!({"matchLabels": {"app": "web"}})),
        ("web2", "uid-web2", json!({"matchLabels": {"app": "web"}})),
        ("everything", "uid-all", json!({})),
        ("db", "uid-db", json!({"matchLabels": {"app": "db"}})),
    ] {
        w.replica_sets
            .dispatch(&Event::Apply(replica_set(name, uid, selector, 0)));
    }
    w
}

fn replica_set(name: &str, uid: &str, selector: serde_json::Value, min_ready: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"replicas": 1, "selector": selector, "minReadySeconds": min_ready,
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}}
    }))
    .unwrap()
}

/// A Pod: `owner` = (name, uid) of its controlling ReplicaSet.
fn pod(name: &str, rv: &str, owner: Option<(&str, &str)>, extra: serde_json::Value) -> CachedPod {
    let mut v = owned_pod(
        name,
        rv,
        json!({"app": "web"}),
        ("apps/v1", "ReplicaSet"),
        owner,
    );
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

impl World {
    /// The keys queued so far (drained).
    async fn queued(&self) -> Vec<String> {
        drain_sorted(&self.controller.queue).await
    }

    /// As [`queued`](Self::queued), after the status coalescing window has passed.
    async fn queued_settled(&self) -> Vec<String> {
        tokio::time::sleep(super::STATUS_COALESCE + Duration::from_millis(100)).await;
        self.queued().await
    }

    fn pending(&self, key: &str) -> Option<(i64, i64)> {
        self.controller.pod_control.expectations().pending(key)
    }
}

#[tokio::test]
async fn rs2_pod_events_queue_their_replica_sets_and_observe_expectations() {
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
    struct Case {
        name: &'static str,
        before: Vec<CachedPod>,
        event: Event<CachedPod>,
        expect: fn(&Expectations),
        queued: Vec<&'static str>,
        pending: Option<(i64, i64)>,
    }
    let cases = [
        Case {
            name: "CTL-8 a created Pod of the ReplicaSet is one observed creation",
            before: vec![],
            event: Event::Apply(pod("p", "1", Some(("web", "uid-web")), json!({}))),
            expect: |e| e.expect_creations("ns/web", 2),
            queued: vec!["ns/web"],
            pending: Some((1, 0)),
        },
        Case {
            name: "CTL-8 a Pod naming a ReplicaSet by an old uid is not observed",
            before: vec![],
            event: Event::Apply(pod("p", "1", Some(("web", "uid-old")), json!({}))),
            expect: |e| e.expect_creations("ns/web", 2),
            queued: vec![],
            pending: Some((2, 0)),
        },
        Case {
            name: "CTL-8 a Pod first seen terminating is a deletion, not a creation",
            before: vec![],
            event: Event::Apply(pod("p", "1", Some(("web", "uid-web")), deleting.clone())),
            expect: |e| e.expect_deletions("ns/web", &["ns/p".to_string()]),
            queued: vec!["ns/web"],
            pending: Some((0, 0)),
        },
        Case {
            name: "RS-2 an orphan wakes every ReplicaSet selecting it (not an empty selector)",
            before: vec![],
            event: Event::Apply(pod("p", "1", None, json!({}))),
            expect: |e| e.expect_creations("ns/web", 1),
            queued: vec!["ns/web", "ns/web2"],
            pending: Some((1, 0)),
        },
        Case {
            name: "RS-2 an update with the same resourceVersion is ignored",
            before: vec![pod("p", "1", Some(("web", "uid-web")), json!({}))],
            event: Event::Apply(pod("p", "1", Some(("web", "uid-web")), json!({}))),
            expect: |_| {},
            queued: vec![],
            pending: None,
        },
        Case {
            name: "RS-2 a changed controller reference wakes the old and the new owner",
            before: vec![pod("p", "1", Some(("web", "uid-web")), json!({}))],
            event: Event::Apply(pod("p", "2", Some(("web2", "uid-web2")), json!({}))),
            expect: |_| {},
            queued: vec!["ns/web", "ns/web2"],
            pending: None,
        },
        Case {
            name: "RS-2 a released Pod wakes its old owner and the ReplicaSets selecting it",
            before: vec![pod("p", "1", Some(("db", "uid-db")), json!({}))],
            event: Event::Apply(pod("p", "2", None, json!({}))),
            expect: |_| {},
            queued: vec!["ns/db", "ns/web", "ns/web2"],
            pending: None,
        },
        Case {
            name: "RS-2 a status change of an owned Pod wakes its owner only (coalesced)",
            before: vec![pod("p", "1", Some(("web", "uid-web")), json!({}))],
            event: Event::Apply(pod(
                "p",
                "2",
                Some(("web", "uid-web")),
                json!({"status": {"phase": "Running"}}),
            )),
            expect: |_| {},
            queued: vec!["ns/web"],
            pending: None,
        },
        Case {
            name: "CTL-8 a graceful deletion is observed when the deletionTimestamp appears",
            before: vec![pod("p", "1", Some(("web", "uid-web")), json!({}))],
            event: Event::Apply(pod("p", "2", Some(("web", "uid-web")), deleting.clone())),
            expect: |e| e.expect_deletions("ns/web", &["ns/p".to_string()]),
            queued: vec!["ns/web"],
            pending: Some((0, 0)),
        },
        Case {
            name: "CTL-8 a deletion of a Pod not expected to go does not count",
            before: vec![pod("other", "1", Some(("web", "uid-web")), json!({}))],
            event: Event::Delete(pod("other", "1", Some(("web", "uid-web")), json!({}))),
            expect: |e| e.expect_deletions("ns/web", &["ns/p".to_string()]),
            queued: vec!["ns/web"],
            pending: Some((0, 1)),
        },
        Case {
            name: "CTL-8 a deleted Pod is an observed deletion",
            before: vec![pod("p", "1", Some(("web", "uid-web")), json!({}))],
            event: Event::Delete(pod("p", "1", Some(("web", "uid-web")), json!({}))),
            expect: |e| e.expect_deletions("ns/web", &["ns/p".to_string()]),
            queued: vec!["ns/web"],
            pending: Some((0, 0)),
        },
        Case {
            name: "RS-2 an orphan's deletion wakes nobody",
            before: vec![pod("p", "1", None, json!({}))],
            event: Event::Delete(pod("p", "1", None, json!({}))),
            expect: |_| {},
            queued: vec![],
            pending: None,
        },
    ];
    for c in cases {
        let w = world();
        for p in c.before {
            w.pods.dispatch(&Event::Apply(p));
        }
        w.queued().await;
        (c.expect)(w.controller.pod_control.expectations());
        w.pods.dispatch(&c.event);
        assert_eq!(w.queued_settled().await, c.queued, "{}", c.name);
        assert_eq!(w.pending("ns/web"), c.pending, "{}", c.name);
    }
}

#[tokio::test]
async fn rs2_replica_set_events() {
    let w = world();
    w.queued().await;
    w.controller
        .pod_control
        .expectations()
        .expect_creations("ns/web", 3);
    w.replica_sets.dispatch(&Event::Apply(replica_set(
        "web",
        "uid-web",
        json!({"matchLabels": {"app": "web"}}),
        0,
    )));
    assert_eq!(
        w.queued().await,
        ["ns/web"],
        "RS-2 an update queues the ReplicaSet"
    );
    assert_eq!(w.pending("ns/web"), Some((3, 0)));
    w.replica_sets.dispatch(&Event::Apply(replica_set(
        "web",
        "uid-recreated",
        json!({"matchLabels": {"app": "web"}}),
        0,
    )));
    assert_eq!(w.queued().await, ["ns/web"]);
    assert_eq!(
        w.pending("ns/web"),
        None,
        "CTL-8 a ReplicaSet re-created under the same name starts without expectations"
    );
    w.controller
        .pod_control
        .expectations()
        .expect_creations("ns/web", 3);
    w.replica_sets.dispatch(&Event::Delete(replica_set(
        "web",
        "uid-recreated",
        json!({}),
        0,
    )));
    assert_eq!(w.queued().await, ["ns/web"]);
    assert_eq!(
        w.pending("ns/web"),
        None,
        "CTL-8 a deleted ReplicaSet's expectations are dropped"
    );
}

#[tokio::test]
async fn rs3_pod_turning_ready_requeues_after_min_ready_seconds() {
    let w = world();
    w.replica_sets.dispatch(&Event::Apply(replica_set(
        "slow",
        "uid-slow",
        json!({"matchLabels": {"app": "slow"}}),
        1,
    )));
    let owner = Some(("slow", "uid-slow"));
    w.pods
        .dispatch(&Event::Apply(pod("p", "1", owner, json!({}))));
    w.queued().await;
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    w.pods
        .dispatch(&Event::Apply(pod("p", "2", owner, ready.clone())));
    assert!(
        w.queued().await.is_empty(),
        "a Pod turning Ready needs no Pod created: its sync waits for the coalescing window"
    );
    assert_eq!(
        w.queued_settled().await,
        ["ns/slow"],
        "RS-2 after the coalescing window"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        w.queued().await,
        ["ns/slow"],
        "RS-3 and again after minReadySeconds, when the Pod is available"
    );
}

#[test]
fn indexes() {
    let orphan = pod(
        "o",
        "1",
        None,
        json!({"metadata": {"labels": {"pod-template-hash": "abc"}}}),
    );
    let owned = pod("p", "1", Some(("web", "uid-web")), json!({}));
    assert_eq!(
        claim::orphan_namespace(&orphan),
        ["ns"],
        "CTL-7 orphans indexed by namespace"
    );
    assert!(claim::orphan_namespace(&owned).is_empty());
    assert_eq!(
        template_hash(&orphan),
        ["ns/abc"],
        "RS-7 Pods indexed by template hash"
    );
    assert!(template_hash(&owned).is_empty());
}

#[test]
fn rs3_status_patch_names_every_field_and_the_uid() {
    let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "rs-uid"}}))
    .unwrap();
    let status = k8s_openapi::api::apps::v1::ReplicaSetStatus {
        replicas: 3,
        ready_replicas: Some(2),
        observed_generation: Some(4),
        ..Default::default()
    };
    let patch = super::status_patch(&rs, &status, STATUS_FIELDS);
    assert_eq!(
        patch,
        serde_json::json!({
            "metadata": {"uid": "rs-uid"},
            "status": {"replicas": 3, "readyReplicas": 2, "observedGeneration": 4,
                "availableReplicas": null, "fullyLabeledReplicas": null, "conditions": null,
                "terminatingReplicas": null}
        }),
        "RS-3 a field that went away is cleared, a re-created ReplicaSet refuses the patch"
    );
}
