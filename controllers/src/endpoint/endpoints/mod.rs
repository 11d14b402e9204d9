//! The legacy Endpoints controller (EP-1..EP-5): one Endpoints object per Service with a selector,
//! named after the Service, kept in step with its Pods; deleted with the Service.
//!
//! Shape: `Controller::for_stream(services).reconcile_on(pod triggers + Endpoints changes)`. The
//! Endpoints object has no ownerReference (as upstream), so its changes map to the Service of the
//! same name. Writes carry the cached resourceVersion: a stale cache gets 409 and a retry.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

use crate::endpoint::inputs::{self, Inputs};
use crate::error::{Error, Result};
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;

/// Shared by every reconcile.
pub struct Context {
    client: Client,
    pods: Arc<Indexed<CachedPod>>,
    endpoints: Arc<Indexed<Endpoints>>,
}

/// Runs the controller until its streams end (normally: forever).
pub async fn run(client: Client, concurrency: u16) {
    let Inputs {
        reader,
        services,
        pods,
        service_stream,
        pod_triggers,
        deleted,
    } = inputs::inputs(&client);
    let endpoints = Indexed::new(|_: &Endpoints| Vec::new());
    let cache = endpoints.clone();
    let ep_triggers = watcher::watcher(
        Api::<Endpoints>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .filter_map(move |ev| {
        let out = ev.ok().map(|ev| {
            cache.apply(&ev);
            let names: Vec<ObjectRef<Service>> = match &ev {
                watcher::Event::Apply(e) | watcher::Event::Delete(e) => {
                    vec![ObjectRef::new(&e.name_any()).within(&e.namespace().unwrap_or_default())]
                }
                _ => Vec::new(),
            };
            futures::stream::iter(names)
        });
        futures::future::ready(out)
    })
    .flatten();
    let ctx = Arc::new(Context {
        client: client.clone(),
        pods,
        endpoints,
    });
    tokio::spawn(cleanup_deleted(client.clone(), deleted));
    tokio::spawn(sweep_leftovers(client, services, ctx.endpoints.clone()));
    Controller::for_stream(service_stream, reader)
        .reconcile_on(pod_triggers)
        .reconcile_on(ep_triggers)
        .with_config(controller::Config::default().concurrency(concurrency))
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!("endpoints controller: {e}");
            }
            futures::future::ready(())
        })
        .await;
}

/// Computes and writes the Endpoints of one Service.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    ctx.pods.wait_ready().await;
    ctx.endpoints.wait_ready().await;
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = svc.namespace().unwrap_or_default();
    let pods = inputs::pods_for(&ctx.pods, &svc);
    let Some(desired) = plan::desired(&svc, &pods) else {
        return Ok(Action::await_change());
    };
    let existing = ctx.endpoints.get(&ns, &svc.name_any());
    let Some(write) = plan::plan(desired, existing.as_deref()) else {
        return Ok(Action::await_change());
    };
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &ns);
    let object = format!("{ns}/{}", svc.name_any());
    match existing {
        Some(_) => api
            .replace(&svc.name_any(), &PostParams::default(), &write)
            .await
            .map_err(|e| Error::kube("updating Endpoints", object, e))?,
        None => api
            .create(&PostParams::default(), &write)
            .await
            .map_err(|e| Error::kube("creating Endpoints", object, e))?,
    };
    Ok(Action::await_change())
}

/// Deletes the Endpoints of Services that went away.
async fn cleanup_deleted(
    client: Client,
    mut deleted: tokio::sync::mpsc::UnboundedReceiver<Service>,
) {
    while let Some(svc) = deleted.recv().await {
        let Some(_) = crate::endpoint::endpointutil::service_selector(&svc) else {
            continue;
        };
        let ns = svc.namespace().unwrap_or_default();
        let api: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
        match api.delete(&svc.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(
                "deleting Endpoints {ns}/{} of a deleted Service: {e}",
                svc.name_any()
            ),
        }
    }
}

/// Deletes Endpoints objects that have no Service (left over from Services deleted while no
/// controller ran), once the caches are complete, as upstream's `checkLeftoverEndpoints` does.
async fn sweep_leftovers(
    client: Client,
    services: Arc<Indexed<Service>>,
    endpoints: Arc<Indexed<Endpoints>>,
) {
    services.wait_ready().await;
    endpoints.wait_ready().await;
    for ep in endpoints.all() {
        let ns = ep.namespace().unwrap_or_default();
        if services.get(&ns, &ep.name_any()).is_some() {
            continue;
        }
        let api: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: ep.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&ep.name_any(), &dp).await {
            Ok(_) => tracing::info!(
                "endpoints: deleted leftover Endpoints {ns}/{}",
                ep.name_any()
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(
                "endpoints: deleting leftover Endpoints {ns}/{}: {e}",
                ep.name_any()
            ),
        }
    }
}

/// Requeues a failed reconcile after a second.
pub fn error_policy(svc: Arc<Service>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::info!(
        "endpoints: Service {}/{}: {err}",
        svc.namespace().unwrap_or_default(),
        svc.name_any()
    );
    Action::requeue(Duration::from_secs(1))
}
