//! The Endpoints controller's event handlers (EP-1..EP-3) and its leftover check (EP-5). Events
//! go through the informers' own dispatch; the client is never used (nothing syncs).

use super::*;
use kube::runtime::watcher::Event;
use serde_json::json;

use crate::runtime::informer::Informer;
use crate::runtime::testing::{drain_sorted, obj, offline};

struct World {
    controller: Arc<Controller>,
    services: Arc<Informer<Service>>,
    pods: Arc<Informer<CachedPod>>,
    endpoints: Arc<Informer<Endpoints>>,
    _informers: Arc<Informers>,
}

fn world() -> World {
    let (controller, informers) = offline(|c, i| Controller::new(c, i, Config::default()));
    World {
        controller,
        services: informers.get::<Service>(),
        pods: informers.get::<CachedPod>(),
        endpoints: informers.get::<Endpoints>(),
        _informers: informers,
    }
}

fn svc(name: &str, app: &str) -> Service {
    obj(json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"selector": {"app": app}}}))
}

fn pod(name: &str, rv: &str, app: &str) -> CachedPod {
    obj(
        json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                            "labels": {"app": app}},
               "spec": {"containers": []}}),
    )
}

fn endpoints(name: &str) -> Endpoints {
    obj(json!({"metadata": {"name": name, "namespace": "ns"}}))
}

impl World {
    async fn queued(&self) -> Vec<String> {
        drain_sorted(&self.controller.queue).await
    }
}

#[tokio::test]
async fn ep1_to_ep3_service_pod_and_endpoints_changes_queue_the_service() {
    let w = world();
    w.services.dispatch(&Event::Apply(svc("web", "web")));
    w.services.dispatch(&Event::Apply(svc("db", "db")));
    assert_eq!(
        w.queued().await,
        ["ns/db", "ns/web"],
        "EP-2 a Service change"
    );

    w.pods.dispatch(&Event::Apply(pod("a", "1", "web")));
    assert_eq!(w.queued().await, ["ns/web"], "EP-3 a new Pod");
    w.pods.dispatch(&Event::Apply(pod("a", "2", "db")));
    assert_eq!(
        w.queued().await,
        ["ns/db", "ns/web"],
        "EP-3 a relabelled Pod: the Services before and after"
    );
    w.pods.dispatch(&Event::Delete(pod("a", "3", "db")));
    assert_eq!(w.queued().await, ["ns/db"], "EP-3 a deleted Pod");

    w.endpoints.dispatch(&Event::Apply(endpoints("web")));
    assert_eq!(w.queued().await, ["ns/web"], "EP-1 its Endpoints changed");
    w.endpoints.dispatch(&Event::Delete(endpoints("web")));
    assert_eq!(w.queued().await, ["ns/web"], "EP-1 its Endpoints deleted");
    w.endpoints.dispatch(&Event::Apply(endpoints("later")));
    assert!(
        w.queued().await.is_empty(),
        "Endpoints written before their Service are left alone"
    );

    w.services.dispatch(&Event::Delete(svc("web", "web")));
    assert_eq!(w.queued().await, ["ns/web"], "EP-5 a deleted Service");
}

#[test]
fn ep5_leftovers_are_the_endpoints_without_a_service() {
    let services = Indexed::new(|_: &Service| Vec::new());
    let eps = Indexed::new(|_: &Endpoints| Vec::new());
    services.apply(&Event::Apply(svc("web", "web")));
    eps.apply(&Event::Apply(endpoints("web")));
    eps.apply(&Event::Apply(endpoints("gone")));
    assert_eq!(leftovers(&eps, &services), ["ns/gone"]);
}
