//! The DaemonSet controller's event handlers (DS-2, CTL-8): which keys a DaemonSet, Pod,
//! ControllerRevision or Node change queues and which expectations it observes. Events go through
//! the informers' own dispatch; the client is never used (nothing syncs).

use super::*;
use kube::runtime::watcher::Event;
use serde_json::{json, Value};

use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::Informer;
use crate::runtime::testing::{drain_sorted, obj, offline, owned_pod};

struct World {
    controller: Arc<Controller>,
    daemon_sets: Arc<Informer<DaemonSet>>,
    pods: Arc<Informer<CachedPod>>,
    revisions: Arc<Informer<ControllerRevision>>,
    nodes: Arc<Informer<Node>>,
    _informers: Arc<Informers>,
}

fn world() -> World {
    let (controller, informers) = offline(|c, i| Controller::new(c, i, Config::default()));
    let w = World {
        controller,
        daemon_sets: informers.get::<DaemonSet>(),
        pods: informers.get::<CachedPod>(),
        revisions: informers.get::<ControllerRevision>(),
        nodes: informers.get::<Node>(),
        _informers: informers,
    };
    for (name, uid, app) in [
        ("agent", "uid-agent", "agent"),
        ("logs", "uid-logs", "logs"),
    ] {
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"app": app}},
                     "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": []}}}
        }))
        .unwrap();
        w.daemon_sets.dispatch(&Event::Apply(ds));
    }
    w
}

/// A Pod labelled `app`, controlled by DaemonSet `owner` (name, uid) when given, bound to `node`.
fn pod(name: &str, rv: &str, app: &str, owner: Option<(&str, &str)>, node: &str) -> CachedPod {
    let mut v = owned_pod(
        name,
        rv,
        json!({"app": app}),
        ("apps/v1", "DaemonSet"),
        owner,
    );
    v["spec"] = json!({"nodeName": node, "containers": []});
    obj(v)
}

fn node(name: &str, rv: &str, extra: Value) -> Node {
    let mut v = json!({"metadata": {"name": name, "resourceVersion": rv}});
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

impl World {
    async fn queued(&self) -> Vec<String> {
        drain_sorted(&self.controller.queue).await
    }

    async fn node_updates(&self) -> Vec<String> {
        drain_sorted(&self.controller.node_queue).await
    }
}

#[tokio::test]
async fn ds2_pod_events_queue_the_owner_and_observe_expectations() {
    let w = world();
    let c = &w.controller;
    w.queued().await;
    c.pod_control.expect("ns/agent", 1, &["ns/old".into()]);

    w.pods.dispatch(&Event::Apply(pod(
        "a",
        "1",
        "agent",
        Some(("agent", "uid-agent")),
        "n1",
    )));
    assert_eq!(
        w.queued().await,
        ["ns/agent"],
        "DS-2 a created daemon Pod queues its DaemonSet"
    );
    assert_eq!(
        c.pod_control.expectations().pending("ns/agent"),
        Some((0, 1)),
        "CTL-8 the creation is observed"
    );

    w.pods.dispatch(&Event::Apply(pod(
        "old",
        "1",
        "agent",
        Some(("agent", "uid-agent")),
        "n2",
    )));
    w.pods.dispatch(&Event::Delete(pod(
        "old",
        "2",
        "agent",
        Some(("agent", "uid-agent")),
        "n2",
    )));
    assert_eq!(w.queued().await, ["ns/agent"]);
    assert!(
        c.pod_control.expectations().satisfied("ns/agent"),
        "CTL-8 the expected deletion is observed"
    );

    w.pods.dispatch(&Event::Apply(pod(
        "stranger",
        "1",
        "agent",
        Some(("agent", "other-uid")),
        "n1",
    )));
    assert!(
        w.queued().await.is_empty(),
        "DS-2 a Pod of a re-created DaemonSet (other uid) queues nothing"
    );

    w.pods
        .dispatch(&Event::Apply(pod("orphan", "1", "logs", None, "n1")));
    assert_eq!(
        w.queued().await,
        ["ns/logs"],
        "DS-2 an orphan queues the DaemonSets selecting it"
    );

    w.pods
        .dispatch(&Event::Apply(pod("orphan", "1", "logs", None, "n1")));
    assert!(
        w.queued().await.is_empty(),
        "DS-2 an update with the same resourceVersion is ignored"
    );
}

#[tokio::test]
async fn ds2_revision_events_queue_the_owner_or_the_selecting_daemon_sets() {
    let w = world();
    w.queued().await;
    let revision = |name: &str, rv: &str, owner: Option<&str>| -> ControllerRevision {
        let mut v = json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                                        "labels": {"app": "agent"}}, "revision": 1});
        if let Some(uid) = owner {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "agent", "uid": uid, "controller": true}]);
        }
        serde_json::from_value(v).unwrap()
    };
    w.revisions
        .dispatch(&Event::Apply(revision("agent-1", "1", Some("uid-agent"))));
    assert!(
        w.queued().await.is_empty(),
        "DS-2 an added owned revision queues nothing (upstream)"
    );
    w.revisions
        .dispatch(&Event::Apply(revision("agent-1", "2", Some("uid-agent"))));
    assert_eq!(
        w.queued().await,
        ["ns/agent"],
        "DS-2 an updated owned revision queues its owner"
    );
    w.revisions
        .dispatch(&Event::Apply(revision("loose", "1", None)));
    assert_eq!(
        w.queued().await,
        ["ns/agent"],
        "DS-2 an orphan revision queues the selecting DaemonSet"
    );
    w.revisions
        .dispatch(&Event::Delete(revision("agent-1", "3", Some("uid-agent"))));
    assert_eq!(
        w.queued().await,
        ["ns/agent"],
        "DS-2 a deleted owned revision queues its owner"
    );
}

#[tokio::test]
async fn ds2_node_events_queue_node_updates_and_the_affected_daemon_sets() {
    let w = world();
    let c = &w.controller;
    w.queued().await;
    w.nodes.dispatch(&Event::Apply(node("n1", "1", json!({}))));
    assert_eq!(
        w.node_updates().await,
        ["n1"],
        "DS-2 an added node is looked at"
    );
    w.nodes.dispatch(&Event::Apply(node(
        "n1",
        "2",
        json!({"status": {"phase": "Running"}}),
    )));
    assert!(
        w.node_updates().await.is_empty(),
        "DS-2 a status-only change is ignored"
    );

    // agent has its Pod on n1, logs has none.
    w.pods.dispatch(&Event::Apply(pod(
        "a",
        "1",
        "agent",
        Some(("agent", "uid-agent")),
        "n1",
    )));
    w.queued().await;
    c.sync_node_update("n1");
    assert_eq!(
        w.queued().await,
        ["ns/logs"],
        "DS-2 only the DaemonSet without a Pod on the eligible node"
    );

    w.nodes.dispatch(&Event::Apply(node(
        "n1",
        "3",
        json!({"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}}),
    )));
    assert_eq!(
        w.node_updates().await,
        ["n1"],
        "DS-2 a taint change is looked at"
    );
    c.sync_node_update("n1");
    assert_eq!(
        w.queued().await,
        ["ns/agent"],
        "DS-2 NoExecute: the DaemonSet with a Pod there"
    );

    w.nodes.dispatch(&Event::Delete(node("n1", "4", json!({}))));
    assert_eq!(
        w.queued().await,
        ["ns/agent"],
        "DS-2 a deleted node queues the DaemonSets with Pods for it"
    );
}
