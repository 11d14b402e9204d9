//! The EndpointSlice controller's event handlers: which Service keys a Service, Pod, Node or
//! EndpointSlice change queues. Events go through the informers' own dispatch; the client is never
//! used (nothing syncs).

use super::*;
use kube::runtime::watcher::Event;
use serde_json::json;

use crate::runtime::informer::Informer;
use crate::runtime::testing::{drain_sorted, obj, offline};

struct World {
    controller: Arc<Controller>,
    services: Arc<Informer<Service>>,
    pods: Arc<Informer<CachedPod>>,
    nodes: Arc<Informer<Node>>,
    slices: Arc<Informer<EndpointSlice>>,
    _informers: Arc<Informers>,
}

fn world() -> World {
    let (controller, informers) = offline(|c, i| Controller::new(c, i, Config::default()));
    World {
        controller,
        services: informers.get::<Service>(),
        pods: informers.get::<CachedPod>(),
        nodes: informers.get::<Node>(),
        slices: informers.get::<EndpointSlice>(),
        _informers: informers,
    }
}

fn svc(name: &str, app: &str) -> Service {
    obj(
        json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
               "spec": {"selector": {"app": app}}}),
    )
}

fn pod(name: &str, rv: &str, app: &str, node: &str) -> CachedPod {
    obj(
        json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                            "labels": {"app": app}},
               "spec": {"nodeName": node, "containers": []}}),
    )
}

fn node(name: &str, rv: &str, zone: &str) -> Node {
    obj(json!({"metadata": {"name": name, "resourceVersion": rv,
                            "labels": {plan::LABEL_ZONE: zone}}}))
}

fn slice(name: &str, service: &str, managed_by: &str) -> EndpointSlice {
    obj(json!({"metadata": {"name": name, "namespace": "ns",
                            "labels": {plan::LABEL_SERVICE_NAME: service,
                                       plan::LABEL_MANAGED_BY: managed_by}},
               "addressType": "IPv4", "endpoints": []}))
}

impl World {
    async fn queued(&self) -> Vec<String> {
        drain_sorted(&self.controller.queue).await
    }
}

#[tokio::test]
async fn service_pod_node_and_slice_changes_queue_the_services_they_concern() {
    let w = world();
    w.services.dispatch(&Event::Apply(svc("web", "web")));
    w.services.dispatch(&Event::Apply(svc("db", "db")));
    assert_eq!(w.queued().await, ["ns/db", "ns/web"], "a Service change");

    w.pods.dispatch(&Event::Apply(pod("a", "1", "web", "n1")));
    assert_eq!(w.queued().await, ["ns/web"], "a new Pod: its Service");
    w.pods.dispatch(&Event::Apply(pod("a", "2", "db", "n1")));
    assert_eq!(
        w.queued().await,
        ["ns/db", "ns/web"],
        "a relabelled Pod: the Services before and after"
    );
    w.pods
        .dispatch(&Event::Apply(pod("lone", "1", "nothing", "n1")));
    assert!(w.queued().await.is_empty(), "a Pod no Service selects");

    w.nodes.dispatch(&Event::Apply(node("n1", "1", "z1")));
    assert_eq!(
        w.queued().await,
        ["ns/db"],
        "a new Node: Services of its Pods"
    );
    w.nodes.dispatch(&Event::Apply(node("n1", "2", "z1")));
    assert!(
        w.queued().await.is_empty(),
        "a Node change that keeps its zone"
    );
    w.nodes.dispatch(&Event::Apply(node("n1", "3", "z2")));
    assert_eq!(w.queued().await, ["ns/db"], "a Node changing zone");
    w.nodes.dispatch(&Event::Delete(node("n1", "4", "z2")));
    assert_eq!(w.queued().await, ["ns/db"], "a Node going away");

    w.slices
        .dispatch(&Event::Apply(slice("web-x", "web", plan::MANAGED_BY)));
    assert_eq!(w.queued().await, ["ns/web"], "a managed slice: its Service");
    w.slices
        .dispatch(&Event::Apply(slice("web-y", "web", "someone-else")));
    assert!(w.queued().await.is_empty(), "a slice managed by another");
    w.slices
        .dispatch(&Event::Apply(slice("web-x", "web", "someone-else")));
    assert_eq!(
        w.queued().await,
        ["ns/web"],
        "a slice that stopped being managed here"
    );

    w.services.dispatch(&Event::Delete(svc("web", "web")));
    assert_eq!(w.queued().await, ["ns/web"], "a deleted Service");
}

#[test]
fn only_managed_slices_are_indexed_by_service() {
    assert_eq!(
        slice_index(&slice("web-x", "web", plan::MANAGED_BY)),
        ["ns/web"]
    );
    assert!(slice_index(&slice("web-y", "web", "someone-else")).is_empty());
}

#[test]
fn the_tracker_holds_a_service_until_the_cache_shows_its_writes() {
    let slices = Indexed::new(slice_index);
    let tracker = Tracker::default();
    let key: Key = ("ns".into(), "web".into());
    assert!(!tracker.stale(&key, &slices), "nothing written");
    tracker.expect(&key, "web-x".into(), Expect::Generation(2));
    tracker.expect(&key, "web-old".into(), Expect::Gone);
    let mut s = slice("web-old", "web", plan::MANAGED_BY);
    slices.apply(&Event::Apply(s.clone()));
    assert!(tracker.stale(&key, &slices), "neither write seen");
    s.metadata.name = Some("web-x".into());
    s.metadata.generation = Some(1);
    slices.apply(&Event::Apply(s.clone()));
    slices.apply(&Event::Delete(slice("web-old", "web", plan::MANAGED_BY)));
    assert!(tracker.stale(&key, &slices), "an older generation");
    s.metadata.generation = Some(2);
    slices.apply(&Event::Apply(s));
    assert!(!tracker.stale(&key, &slices), "both writes seen");
}
