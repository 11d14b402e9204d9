//! Which Pods a Service selects and which Services select a Pod, over the process's shared Pod and
//! Service caches (upstream's `GetPodServiceMemberships` and the selector listing of
//! `syncService`): the two indexes the endpoint controllers add to those caches and the lookups
//! they make through them.
//!
//! Owns the indexes, the lookups and the two handlers both endpoint controllers have on those
//! informers ([`queue_services_on_changes`]); no watch, no writes. A Pod change concerns the
//! Services that select it before and after the change (a relabelled Pod leaves its old Service
//! too), each once.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::endpoint::endpointutil;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::{self, Informer, Informers};
use crate::runtime::queue::WorkQueue;

/// Pod cache index: one key `ns/key=value` per label of the Pod.
pub const POD_LABEL: &str = "endpoint-pod-label";

/// Pod cache index: key = the Pod's `spec.nodeName`.
pub const POD_NODE: &str = "endpoint-pod-node";

/// Service cache index: one key `ns/key=value` per pair of the Service's (non-empty) selector.
pub const SERVICE_SELECTOR: &str = "endpoint-service-selector";

fn label_keys(ns: &str, labels: &BTreeMap<String, String>) -> Vec<String> {
    labels
        .iter()
        .map(|(k, v)| format!("{ns}/{k}={v}"))
        .collect()
}

/// [`POD_LABEL`] of a Pod.
pub fn pod_label_index(p: &CachedPod) -> Vec<String> {
    label_keys(&p.namespace().unwrap_or_default(), p.labels())
}

/// [`POD_NODE`] of a Pod.
pub fn pod_node_index(p: &CachedPod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .into_iter()
        .collect()
}

/// [`SERVICE_SELECTOR`] of a Service.
pub fn service_index(s: &Service) -> Vec<String> {
    endpointutil::service_selector(s)
        .map(|sel| label_keys(&s.namespace().unwrap_or_default(), sel))
        .unwrap_or_default()
}

/// The Service and Pod informers of `informers`, with the indexes above added (adding them again
/// for a second endpoint controller replaces them with the same).
pub fn register(informers: &Informers) -> (Arc<Informer<Service>>, Arc<Informer<CachedPod>>) {
    let services = informers.get::<Service>();
    services.add_index(SERVICE_SELECTOR, service_index);
    let pods = informers.get::<CachedPod>();
    pods.add_index(POD_LABEL, pod_label_index);
    pods.add_index(POD_NODE, pod_node_index);
    (services, pods)
}

/// The handlers both endpoint controllers have: a Service change queues the Service's key on
/// `queue` (EP-2), a Pod change the keys of the Services selecting the Pod before and after
/// (EP-3). The queue is held weakly, as the informers hold their controllers.
pub fn queue_services_on_changes(
    services: &Informer<Service>,
    pods: &Informer<CachedPod>,
    queue: &Arc<WorkQueue<String>>,
) {
    let q = Arc::downgrade(queue);
    services.on_change(Box::new(move |old, new| {
        if let (Some(q), Some(svc)) = (q.upgrade(), new.or(old)) {
            q.add(informer::key_of(svc.as_ref()));
        }
    }));
    let q = Arc::downgrade(queue);
    let cache = services.cache();
    pods.on_change(Box::new(move |old, new| {
        let Some(q) = q.upgrade() else { return };
        for key in services_for_change(&cache, old, new) {
            q.add(key);
        }
    }));
}

/// The Pods a Service selects (through the index of its first selector pair), by name.
pub fn pods_for(pods: &Indexed<CachedPod>, svc: &Service) -> Vec<Arc<CachedPod>> {
    let Some(sel) = endpointutil::service_selector(svc) else {
        return Vec::new();
    };
    let ns = svc.namespace().unwrap_or_default();
    let Some((k, v)) = sel.iter().next() else {
        return Vec::new();
    };
    let mut out: Vec<Arc<CachedPod>> = pods
        .index(POD_LABEL, &format!("{ns}/{k}={v}"))
        .into_iter()
        .filter(|p| endpointutil::selector_matches(sel, Some(p.labels())))
        .collect();
    out.sort_by_key(|p| p.name_any());
    out
}

/// The work-queue keys (`namespace/name`) of the Services selecting a Pod.
pub fn services_for(services: &Indexed<Service>, pod: &CachedPod) -> HashSet<String> {
    let mut out = HashSet::new();
    for ix in pod_label_index(pod) {
        for svc in services.index(SERVICE_SELECTOR, &ix) {
            if endpointutil::service_selector(&svc)
                .is_some_and(|sel| endpointutil::selector_matches(sel, Some(pod.labels())))
            {
                out.insert(informer::key_of(svc.as_ref()));
            }
        }
    }
    out
}

/// The keys of the Services a Pod change concerns: those selecting the Pod before or after it.
pub fn services_for_change(
    services: &Indexed<Service>,
    old: Option<&Arc<CachedPod>>,
    new: Option<&Arc<CachedPod>>,
) -> HashSet<String> {
    let mut keys = HashSet::new();
    for p in old.into_iter().chain(new) {
        keys.extend(services_for(services, p));
    }
    keys
}

/// The keys of the Services selecting any Pod on the Node `node`.
pub fn services_on_node(
    services: &Indexed<Service>,
    pods: &Indexed<CachedPod>,
    node: &str,
) -> HashSet<String> {
    let mut keys = HashSet::new();
    for pod in pods.index(POD_NODE, node) {
        keys.extend(services_for(services, &pod));
    }
    keys
}

/// The keys of every Service with a selector (the ones the endpoint controllers write for).
pub fn selecting_services(services: &Indexed<Service>) -> Vec<String> {
    services
        .all()
        .iter()
        .filter(|s| endpointutil::service_selector(s).is_some())
        .map(|s| informer::key_of(s.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn pod(name: &str, node: &str, labels: serde_json::Value) -> CachedPod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"nodeName": node, "containers": []}
        }))
        .unwrap()
    }

    fn svc(name: &str, selector: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"selector": selector}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn lookups_go_both_ways_and_a_relabelled_pod_concerns_old_and_new_services() {
        // The client is never used: events go through the informers' own dispatch.
        let informers = Informers::new(crate::runtime::testing::offline_client());
        let (svc_inf, pod_inf) = register(&informers);
        for s in [
            svc("web", json!({"app": "web"})),
            svc("web-canary", json!({"app": "web", "track": "canary"})),
            svc("db", json!({"app": "db"})),
            svc("none", json!({})),
        ] {
            svc_inf.dispatch(&Event::Apply(s));
        }
        let a = pod("a", "n1", json!({"app": "web", "track": "canary"}));
        let b = pod("b", "n2", json!({"app": "web"}));
        pod_inf.dispatch(&Event::Apply(a.clone()));
        pod_inf.dispatch(&Event::Apply(b.clone()));
        let (services, pods) = (svc_inf.cache(), pod_inf.cache());

        let names = |v: Vec<Arc<CachedPod>>| v.iter().map(|p| p.name_any()).collect::<Vec<_>>();
        assert_eq!(
            names(pods_for(&pods, &svc("web", json!({"app": "web"})))),
            ["a", "b"]
        );
        let canary = svc("web-canary", json!({"app": "web", "track": "canary"}));
        assert_eq!(names(pods_for(&pods, &canary)), ["a"]);
        assert!(pods_for(&pods, &svc("none", json!({}))).is_empty());

        let sorted = |s: HashSet<String>| {
            let mut v: Vec<_> = s.into_iter().collect();
            v.sort();
            v
        };
        assert_eq!(
            sorted(services_for(&services, &a)),
            ["ns/web", "ns/web-canary"]
        );
        let relabelled = Arc::new(pod("a", "n1", json!({"app": "db"})));
        assert_eq!(
            sorted(services_for_change(
                &services,
                Some(&Arc::new(a)),
                Some(&relabelled)
            )),
            ["ns/db", "ns/web", "ns/web-canary"]
        );
        assert_eq!(sorted(services_on_node(&services, &pods, "n2")), ["ns/web"]);
        let mut all = selecting_services(&services);
        all.sort();
        assert_eq!(all, ["ns/db", "ns/web", "ns/web-canary"]);
    }
}
