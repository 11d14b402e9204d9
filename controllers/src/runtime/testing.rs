//! What the controllers' handler tests share (test builds only): a controller registered on
//! informers whose client is never contacted (the tests feed the informers through their own
//! dispatch and read what the handlers queued), draining a work queue, and the JSON of an object
//! controlled by an owner.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::Client;
use serde_json::{json, Value};

use crate::runtime::informer::Informers;
use crate::runtime::queue::{Item, WorkQueue};

/// A client of an address nothing listens on: handler tests never sync, so it is never used.
pub fn offline_client() -> Client {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    Client::try_from(config).unwrap()
}

/// A controller built by `new` on fresh informers of an [`offline_client`], and the informers
/// (kept alive by the caller for as long as it dispatches to them).
pub fn offline<C>(new: impl FnOnce(Client, &Arc<Informers>) -> Arc<C>) -> (Arc<C>, Arc<Informers>) {
    let client = offline_client();
    let informers = Informers::new(client.clone());
    (new(client, &informers), informers)
}

/// The items queued so far, in queue order (the queue is drained and each item marked done).
pub async fn drain<T: Item>(q: &WorkQueue<T>) -> Vec<T> {
    let mut out = Vec::new();
    while !q.is_empty() {
        let k = q.get().await.unwrap();
        q.done(&k);
        out.push(k);
    }
    out
}

/// The keys queued so far, sorted (the queue is drained).
pub async fn drain_sorted(q: &WorkQueue<String>) -> Vec<String> {
    let mut keys = drain(q).await;
    keys.sort();
    keys
}

/// An object of JSON `v`.
pub fn obj<K: serde::de::DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).unwrap()
}

/// An `ownerReferences` list of one controller reference.
pub fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}])
}

/// The JSON of a Pod `name` in namespace `ns` (uid `uid-<name>`, resourceVersion `rv`, `labels`),
/// controlled by `owner` (name, uid) of `api_version` `kind` when given.
pub fn owned_pod(
    name: &str,
    rv: &str,
    labels: Value,
    (api_version, kind): (&str, &str),
    owner: Option<(&str, &str)>,
) -> Value {
    let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                                    "resourceVersion": rv, "labels": labels}});
    if let Some((n, uid)) = owner {
        v["metadata"]["ownerReferences"] = controller_ref(api_version, kind, n, uid);
    }
    v
}

/// A Pod's Ready condition: True since `ready_since`, or False when `None`.
pub fn ready_condition(ready_since: Option<&str>) -> Value {
    match ready_since {
        Some(t) => json!({"type": "Ready", "status": "True", "lastTransitionTime": t}),
        None => json!({"type": "Ready", "status": "False"}),
    }
}

/// Sets the image of the template's first container (`kubectl set image`).
pub fn set_template_image(template: &mut PodTemplateSpec, image: &str) {
    template.spec.as_mut().unwrap().containers[0].image = Some(image.into());
}
