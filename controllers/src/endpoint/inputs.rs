//! The watched inputs shared in shape by the endpoint controllers: Services (reflector store for the
//! `Controller` plus a selector index), Pods (label index) and the Pod -> Service triggers.
//!
//! Every cache is updated inside the watch stream before the trigger it causes is emitted, so a
//! reconcile never runs on a cache older than its trigger. A Pod change triggers the Services that
//! select it before and after the change (a relabelled Pod leaves its old Service too).

use std::collections::HashSet;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;

use crate::endpoint::endpointutil;
use crate::runtime::cache::{Change, Indexed};
use crate::runtime::cached_pod::CachedPod;

/// What a controller over Services and Pods starts from.
pub struct Inputs {
    /// The Controller's store of Services.
    pub reader: Store<Service>,
    /// Services indexed by `ns/key=value` of their selector.
    pub services: Arc<Indexed<Service>>,
    /// Pods indexed by `ns/key=value` of their labels.
    pub pods: Arc<Indexed<CachedPod>>,
    /// The Service watch stream (drive it with `Controller::for_stream`).
    pub service_stream: BoxStream<'static, Result<Service, watcher::Error>>,
    /// Services to reconcile because a Pod changed (drive it with `Controller::reconcile_on`).
    pub pod_triggers: BoxStream<'static, ObjectRef<Service>>,
    /// Services that were deleted (their dependents need cleaning up: there is no garbage collector
    /// in every environment this runs in).
    pub deleted: mpsc::UnboundedReceiver<Service>,
}

fn label_keys(ns: &str, labels: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    labels
        .iter()
        .map(|(k, v)| format!("{ns}/{k}={v}"))
        .collect()
}

/// Index of a Pod: one key per label, plus `node:NAME` for its node.
pub fn pod_index(p: &CachedPod) -> Vec<String> {
    let mut keys = label_keys(&p.namespace().unwrap_or_default(), p.labels());
    if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        keys.push(format!("node:{node}"));
    }
    keys
}

/// Index of a Service: one key per selector pair.
pub fn service_index(s: &Service) -> Vec<String> {
    endpointutil::service_selector(s)
        .map(|sel| label_keys(&s.namespace().unwrap_or_default(), sel))
        .unwrap_or_default()
}

/// The Pods a Service selects (through the index of its first selector pair).
pub fn pods_for(pods: &Indexed<CachedPod>, svc: &Service) -> Vec<Arc<CachedPod>> {
    let Some(sel) = endpointutil::service_selector(svc) else {
        return Vec::new();
    };
    let ns = svc.namespace().unwrap_or_default();
    let Some((k, v)) = sel.iter().next() else {
        return Vec::new();
    };
    let mut out: Vec<Arc<CachedPod>> = pods
        .by_index(&format!("{ns}/{k}={v}"))
        .into_iter()
        .filter(|p| endpointutil::selector_matches(sel, Some(p.labels())))
        .collect();
    out.sort_by_key(|p| p.name_any());
    out
}

/// The Services selecting a Pod.
pub fn services_for(services: &Indexed<Service>, pod: &CachedPod) -> HashSet<ObjectRef<Service>> {
    let mut out = HashSet::new();
    for ix in label_keys(&pod.namespace().unwrap_or_default(), pod.labels()) {
        for svc in services.by_index(&ix) {
            if endpointutil::service_selector(&svc)
                .is_some_and(|sel| endpointutil::selector_matches(sel, Some(pod.labels())))
            {
                out.insert(ObjectRef::from_obj(svc.as_ref()));
            }
        }
    }
    out
}

fn pod_change_triggers(
    services: &Indexed<Service>,
    change: Change<CachedPod>,
) -> Vec<ObjectRef<Service>> {
    match change {
        Change::One { old, new } => {
            let mut refs = HashSet::new();
            for p in old.iter().chain(new.iter()) {
                refs.extend(services_for(services, p));
            }
            refs.into_iter().collect()
        }
        Change::Relisted => services
            .all()
            .iter()
            .filter(|s| endpointutil::service_selector(s).is_some())
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect(),
        Change::Nothing => Vec::new(),
    }
}

/// Starts the Service and Pod watches (lazily: nothing happens until the streams are polled).
pub fn inputs(client: &Client) -> Inputs {
    let (reader, writer) = reflector::store();
    let services = Indexed::new(service_index);
    let pods = Indexed::new(pod_index);
    let (deleted_tx, deleted) = mpsc::unbounded_channel();
    let svc_cache = services.clone();
    let service_stream = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .map_ok(move |ev| {
        if let Event::Delete(s) = &ev {
            let _ = deleted_tx.send(s.clone());
        }
        svc_cache.apply(&ev);
        ev
    })
    .touched_objects()
    .boxed();
    let (pod_cache, svc_cache) = (pods.clone(), services.clone());
    let pod_triggers = watcher(
        Api::<CachedPod>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .filter_map(move |ev| {
        let refs = match ev {
            Ok(ev) => pod_change_triggers(&svc_cache, pod_cache.apply(&ev)),
            Err(e) => {
                tracing::warn!("pod watch: {e}");
                Vec::new()
            }
        };
        futures::future::ready(Some(futures::stream::iter(refs)))
    })
    .flatten()
    .boxed();
    Inputs {
        reader,
        services,
        pods,
        service_stream,
        pod_triggers,
        deleted,
    }
}

fn watcher<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, cfg)
}
