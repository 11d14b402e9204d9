//! The legacy Endpoints controller (kube-controller-manager v1.34's `endpoints` controller,
//! EP-1..EP-6): one Endpoints object per Service with a selector, named after the Service, kept in
//! step with its Pods; deleted with the Service.
//!
//! Runs on the shared runtime: handlers on the Service, Pod and Endpoints informers queue Service
//! keys on one work queue named `endpoint`; `--concurrency` workers (16) sync one Service at a
//! time. A Service change queues it (EP-2); a Pod change queues the Services selecting the Pod
//! before and after (EP-3, [`crate::endpoint::membership`]); a change of an Endpoints object
//! queues the Service of the same name when there is one (EP-1: the object has no ownerReference,
//! as upstream; an Endpoints object written for a Service still to come is left alone).
//!
//! A sync plans with [`plan`] over the caches and writes with the cached resourceVersion: a stale
//! cache gets 409 and a retry. A Service no longer in the cache gets its Endpoints deleted (EP-5),
//! and Endpoints left without a Service while no controller ran are queued so at start
//! (`checkLeftoverEndpoints`).
//!
//! Its own writes are read back through the runtime's written overlay until the Endpoints cache
//! shows them. Besides saving a conflict round trip, that closes a race the API server opens: it
//! deletes a Service's Endpoints together with the Service, and the two deletions reach the
//! Endpoints and Service caches in either order. A sync between them (the Service still cached,
//! its Endpoints gone) creates them again; the Service's own deletion then finds the cache without
//! that create and, without the overlay, would leave the new object behind for good (no Service
//! queues it again). Upstream deletes by name unconditionally instead, one more request per
//! Service deleted.

pub mod plan;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};

use crate::endpoint::membership;
use crate::error::{Error, Result};
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::{self, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{start_key_workers, wait_for_caches, SyncKey, WorkersConfig};
use crate::runtime::written::Written;

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "endpoint";

/// The Endpoints controller's settings: concurrent syncs (the controller-manager's
/// `--concurrency`, default 16).
pub type Config = WorkersConfig<16>;

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    services: Arc<Indexed<Service>>,
    pods: Arc<Indexed<CachedPod>>,
    endpoints: Arc<Indexed<Endpoints>>,
    /// Our writes the Endpoints cache has not shown yet.
    written: Written<Endpoints>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's indexes and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let (svc_informer, pod_informer) = membership::register(informers);
        let ep_informer = informers.get::<Endpoints>();
        let this = Arc::new(Controller {
            client,
            config,
            services: svc_informer.cache(),
            pods: pod_informer.cache(),
            endpoints: ep_informer.cache(),
            written: Written::new(),
            queue: crate::endpoint::endpointutil::work_queue(QUEUE_NAME),
        });
        membership::queue_services_on_changes(&svc_informer, &pod_informer, &this.queue);
        ep_informer.on_change_of(&this, Controller::on_endpoints);
        this
    }

    /// Waits for the Service, Pod and Endpoints caches, queues the leftovers, then runs the workers
    /// until the queue shuts down.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(
            "endpoints",
            &[&*self.services, &*self.pods, &*self.endpoints],
        )
        .await;
        for key in leftovers(&self.endpoints, &self.services) {
            self.queue.add(key);
        }
        start_key_workers(&self, "endpoints", &self.queue, self.config.workers).await;
    }

    /// Stops the workers (the queue stops handing out keys).
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    // ---- handlers ----

    fn on_endpoints(&self, old: Option<&Arc<Endpoints>>, new: Option<&Arc<Endpoints>>) {
        let Some(ep) = new.or(old) else { return };
        let (ns, name) = (ep.namespace().unwrap_or_default(), ep.name_any());
        self.written.forget(&ns, &name);
        if self.services.get(&ns, &name).is_some() {
            self.queue.add(informer::key_of(ep.as_ref()));
        }
    }

    // ---- sync ----
}

impl SyncKey for Controller {
    /// Computes and writes the Endpoints of the Service `key` (EP-4), or deletes them when the
    /// Service is gone (EP-5).
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let existing = self.written.fresh(ns, name, self.endpoints.get(ns, name));
        let Some(svc) = self.services.get(ns, name) else {
            return match existing {
                Some(ep) => self.delete_leftover(&ep).await,
                None => Ok(()),
            };
        };
        if svc.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let pods = membership::pods_for(&self.pods, &svc);
        let Some(desired) = plan::desired(&svc, &pods) else {
            return Ok(());
        };
        let Some(write) = plan::plan(desired, existing.as_deref()) else {
            return Ok(());
        };
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), ns);
        let sent = existing.and_then(|ep| ep.metadata.resource_version.clone());
        let written = match sent {
            Some(_) => api
                .replace(name, &PostParams::default(), &write)
                .await
                .map_err(|e| Error::kube("updating Endpoints", key, e))?,
            None => api
                .create(&PostParams::default(), &write)
                .await
                .map_err(|e| Error::kube("creating Endpoints", key, e))?,
        };
        self.written.record(sent, written);
        Ok(())
    }
}

impl Controller {
    /// Deletes the Endpoints of a Service that is gone (only that object: the uid precondition
    /// spares one written since the cache saw it).
    async fn delete_leftover(&self, ep: &Endpoints) -> Result<()> {
        let ns = ep.namespace().unwrap_or_default();
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &ns);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: ep.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&ep.name_any(), &dp).await {
            Ok(_) => {
                tracing::info!(
                    "endpoints: deleted Endpoints {ns}/{} of a Service that is gone",
                    ep.name_any()
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(
                "deleting Endpoints of a deleted Service",
                informer::key_of(ep),
                e,
            )),
        }
    }
}

/// The keys of the Endpoints objects that have no Service.
pub fn leftovers(endpoints: &Indexed<Endpoints>, services: &Indexed<Service>) -> Vec<String> {
    endpoints
        .all()
        .iter()
        .filter(|ep| {
            services
                .get(&ep.namespace().unwrap_or_default(), &ep.name_any())
                .is_none()
        })
        .map(|ep| informer::key_of(ep.as_ref()))
        .collect()
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
