//! The StatefulSet controller's event handlers: which keys a Pod or set change queues, which
//! expectations it observes, and the member index. Events go through the informers' own
//! dispatch; the client is never used (nothing syncs).

use super::*;
use kube::runtime::watcher::Event;
use serde_json::json;

use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::Informer;
use crate::runtime::testing::{drain_sorted, offline, owned_pod};

struct World {
    controller: Arc<Controller>,
    sets: Arc<Informer<StatefulSet>>,
    pods: Arc<Informer<CachedPod>>,
    _informers: Arc<Informers>,
}

fn set(name: &str, uid: &str, selector: Value, min_ready: i32) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"replicas": 1, "selector": selector, "minReadySeconds": min_ready,
                 "serviceName": "svc",
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}}
    }))
    .unwrap()
}

fn world() -> World {
    let (controller, informers) = offline(|c, i| Controller::new(c, i, Config::default()));
    let w = World {
        controller,
        sets: informers.get::<StatefulSet>(),
        pods: informers.get::<CachedPod>(),
        _informers: informers,
    };
    for (name, uid, selector, min_ready) in [
        ("web", "uid-web", json!({"matchLabels": {"app": "web"}}), 0),
        (
            "slow",
            "uid-slow",
            json!({"matchLabels": {"app": "slow"}}),
            5,
        ),
        ("everything", "uid-all", json!({}), 0),
    ] {
        w.sets
            .dispatch(&Event::Apply(set(name, uid, selector, min_ready)));
    }
    w
}

/// A Pod: `owner` = (name, uid) of its controlling set; `extra` merged into it.
fn pod(name: &str, rv: &str, owner: Option<(&str, &str)>, extra: Value) -> CachedPod {
    let mut v = owned_pod(
        name,
        rv,
        json!({"app": "web"}),
        ("apps/v1", "StatefulSet"),
        owner,
    );
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn ready(ready: bool) -> Value {
    json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
}

impl World {
    /// The keys queued so far (drained).
    async fn queued(&self) -> Vec<String> {
        drain_sorted(&self.controller.queue).await
    }
}

#[tokio::test]
async fn pod_events_queue_the_owner_and_orphans_wake_every_selecting_set() {
    let w = world();
    w.queued().await;
    let web = Some(("web", "uid-web"));
    type Step = Box<dyn Fn(&World)>;
    let cases: Vec<(&str, Step, Vec<&str>)> = vec![
        (
            "a created Pod queues its controller",
            Box::new(move |w| {
                w.pods
                    .dispatch(&Event::Apply(pod("web-0", "1", web, json!({}))))
            }),
            vec!["ns/web"],
        ),
        (
            "a Pod whose controller reference names another uid queues nothing",
            Box::new(|w| {
                let p = pod("web-9", "1", Some(("web", "other-uid")), json!({}));
                w.pods.dispatch(&Event::Apply(p))
            }),
            vec![],
        ),
        (
            "an orphan queues every set with a non-empty selector matching it",
            Box::new(|w| {
                w.pods
                    .dispatch(&Event::Apply(pod("web-5", "1", None, json!({}))))
            }),
            vec!["ns/web"],
        ),
        (
            "an update with the same resourceVersion queues nothing",
            Box::new(move |w| {
                w.pods
                    .dispatch(&Event::Apply(pod("web-0", "1", web, json!({}))))
            }),
            vec![],
        ),
        (
            "a status change queues the owner",
            Box::new(move |w| {
                w.pods
                    .dispatch(&Event::Apply(pod("web-0", "2", web, ready(true))))
            }),
            vec!["ns/web"],
        ),
        (
            "a released Pod queues its former owner",
            Box::new(|w| {
                w.pods
                    .dispatch(&Event::Apply(pod("web-0", "3", None, ready(true))))
            }),
            vec!["ns/web"],
        ),
        (
            "a deleted orphan queues nothing",
            Box::new(|w| {
                w.pods
                    .dispatch(&Event::Delete(pod("web-5", "1", None, json!({}))))
            }),
            vec![],
        ),
        (
            "a deleted Pod queues its owner",
            Box::new(move |w| {
                let p = pod("web-1", "1", web, json!({}));
                w.pods.dispatch(&Event::Apply(p.clone()));
                w.pods.dispatch(&Event::Delete(p));
            }),
            vec!["ns/web"],
        ),
    ];
    for (name, step, want) in cases {
        step(&w);
        assert_eq!(w.queued().await, want, "{name}");
    }
}

#[tokio::test]
async fn expectations_observe_creations_and_deletions_of_the_sets_pods() {
    let w = world();
    let c = &w.controller;
    c.expectations
        .expect_deletions("ns/web", &["ns/web-1".to_string()]);
    c.expectations.raise("ns/web", 1, 0);
    assert!(!c.expectations.satisfied("ns/web"));
    let web = Some(("web", "uid-web"));
    w.pods
        .dispatch(&Event::Apply(pod("web-0", "1", web, json!({}))));
    assert_eq!(
        c.expectations.pending("ns/web"),
        Some((0, 1)),
        "creation seen"
    );
    w.pods
        .dispatch(&Event::Apply(pod("web-1", "1", web, json!({}))));
    let terminating = json!({"metadata": {"deletionTimestamp": "2020-01-01T00:00:00Z"}});
    w.pods
        .dispatch(&Event::Apply(pod("web-1", "2", web, terminating)));
    assert!(
        c.expectations.satisfied("ns/web"),
        "a deletion counts once the Pod terminates"
    );
    w.queued().await;
}

#[tokio::test]
async fn a_pod_turning_ready_requeues_a_min_ready_set_after_min_ready_seconds() {
    let w = world();
    let slow = Some(("slow", "uid-slow"));
    let mut p = pod("slow-0", "1", slow, ready(false));
    p.metadata.labels = Some([("app".to_string(), "slow".to_string())].into());
    w.pods.dispatch(&Event::Apply(p.clone()));
    w.queued().await;
    let mut q = p.clone();
    q.metadata.resource_version = Some("2".into());
    q.status = pod("x", "1", None, ready(true)).status;
    w.pods.dispatch(&Event::Apply(q));
    assert_eq!(w.queued().await, ["ns/slow"], "at once");
    assert_eq!(
        w.controller.queue.len(),
        0,
        "the delayed add is not due yet (5 s)"
    );
}

#[test]
fn member_index_groups_pods_by_parent_name() {
    let cases = [
        ("web-0", Some("ns/web")),
        ("my-web-12", Some("ns/my-web")),
        ("web", None),
        ("web-x", None),
    ];
    for (name, want) in cases {
        let p = pod(name, "1", None, json!({}));
        assert_eq!(member_index(&p).first().map(String::as_str), want, "{name}");
    }
}

#[test]
fn status_patch_writes_every_field_as_go_encodes_it() {
    let s = set("web", "uid-web", json!({}), 0);
    let st: StatefulSetStatus = serde_json::from_value(json!({
        "replicas": 2, "readyReplicas": 0, "currentReplicas": 2, "updatedReplicas": 2,
        "availableReplicas": 0, "currentRevision": "web-a", "updateRevision": "web-a",
        "collisionCount": 0, "observedGeneration": 3
    }))
    .unwrap();
    assert_eq!(
        status_patch(&s, &st),
        json!({"metadata": {"uid": "uid-web"}, "status": {
            "observedGeneration": 3, "replicas": 2, "readyReplicas": null,
            "currentReplicas": 2, "updatedReplicas": 2, "availableReplicas": 0,
            "currentRevision": "web-a", "updateRevision": "web-a", "collisionCount": 0,
            "conditions": null}})
    );
}
