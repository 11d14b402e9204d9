//! The EndpointSlice controller (kube-controller-manager v1.34's `endpointslice` controller): keeps
//! the EndpointSlices of every Service with a selector in step with its Pods.
//!
//! Runs on the shared runtime: handlers on the Service, Pod, Node and EndpointSlice informers queue
//! Service keys on one work queue named `endpoint_slice`; `--concurrency` workers (16) sync one
//! Service at a time. A Service change queues it; a Pod change queues the Services selecting the
//! Pod before and after ([`crate::endpoint::membership`]); a change of a slice managed here queues
//! its Service (by the `kubernetes.io/service-name` label); a Node that appears, goes away or
//! changes its zone queues the Services with Pods on it.
//!
//! A sync reads the caches, computes a [`plan::Plan`] with pure functions and applies it: creates,
//! then updates (with the resourceVersion read, so a stale cache gets 409 and a retry), then
//! deletes. A tracker remembers the generation of every slice written, and a sync whose cache has
//! not yet seen them waits (requeue) instead of planning from stale slices, as upstream's
//! EndpointSliceTracker does. A Service no longer in the cache gets its managed slices deleted here
//! (there may be no garbage collector), and a sweep deletes managed slices whose Service is gone
//! (by name and uid) at start and every minute. Must not touch slices managed by anyone else.
//!
//! Nodes are optional. Once the Node cache is synced, the plan is told for each Pod whether its
//! Node exists (and its zone): a Pod whose Node is missing is then left out unless the Service has
//! publishNotReadyAddresses, as upstream. Until then, and for good when Nodes may not be read
//! (403), nothing is known of Nodes: every Pod is kept, without a zone. The workers wait up to two
//! seconds for the Node listing before they start; when it comes later, every Service is synced
//! again (upstream instead retries the Service with backoff).

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};

use crate::endpoint::endpointutil::{Expect, Tracker};
use crate::endpoint::membership;
use crate::error::{Error, Result};
use crate::runtime::cache::{Indexed, Key};
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::{self, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{
    start_key_workers, wait_for_caches, AbortOnDrop, SyncKey, WorkersConfig,
};

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "endpoint_slice";

/// EndpointSlice cache index: key = `ns/service-name` of the slices managed here (others are not
/// indexed).
pub const SLICE_SERVICE: &str = "endpointslice-service";

/// How long the workers wait for the Node listing (zones) before they go on without it.
const NODES_WAIT: Duration = Duration::from_secs(2);

/// How soon a sync whose slice cache has not yet seen its own writes looks again.
const STALE_RETRY: Duration = Duration::from_millis(50);

/// How often managed slices whose Service is gone are looked for.
const ORPHAN_SWEEP: Duration = Duration::from_secs(60);

/// [`SLICE_SERVICE`] of a slice.
pub fn slice_index(s: &EndpointSlice) -> Vec<String> {
    if !plan::is_managed(s) {
        return Vec::new();
    }
    service_of(s).into_iter().collect()
}

/// The queue key (`ns/name`) of the Service a slice is labelled with.
fn service_of(s: &EndpointSlice) -> Option<String> {
    s.labels()
        .get(plan::LABEL_SERVICE_NAME)
        .map(|svc| format!("{}/{svc}", s.namespace().unwrap_or_default()))
}

/// The EndpointSlice controller's settings: concurrent syncs (the controller-manager's
/// `--concurrency`, default 16).
pub type Config = WorkersConfig<16>;

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    services: Arc<Indexed<Service>>,
    pods: Arc<Indexed<CachedPod>>,
    nodes: Arc<Indexed<Node>>,
    slices: Arc<Indexed<EndpointSlice>>,
    queue: Arc<WorkQueue<String>>,
    tracker: Tracker,
}

impl Controller {
    /// Registers the controller's indexes and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let (svc_informer, pod_informer) = membership::register(informers);
        let node_informer = informers.get::<Node>();
        let slice_informer = informers.get::<EndpointSlice>();
        slice_informer.add_index(SLICE_SERVICE, slice_index);
        let this = Arc::new(Controller {
            client,
            config,
            services: svc_informer.cache(),
            pods: pod_informer.cache(),
            nodes: node_informer.cache(),
            slices: slice_informer.cache(),
            queue: crate::endpoint::endpointutil::work_queue(QUEUE_NAME),
            tracker: Tracker::default(),
        });
        membership::queue_services_on_changes(&svc_informer, &pod_informer, &this.queue);
        node_informer.on_change_of(&this, Controller::on_node);
        slice_informer.on_change_of(&this, Controller::on_slice);
        this
    }

    /// Waits for the Service, Pod and EndpointSlice caches (and briefly for the Nodes), then runs
    /// the workers and the orphan sweep until the queue shuts down.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(
            "endpointslice",
            &[&*self.services, &*self.pods, &*self.slices],
        )
        .await;
        let mut background = vec![tokio::spawn(self.clone().sweep_orphans()).abort_handle()];
        if tokio::time::timeout(NODES_WAIT, self.nodes.wait_ready())
            .await
            .is_err()
        {
            tracing::warn!("endpointslice: Nodes not listed within {NODES_WAIT:?}: endpoints get no zone (and Pods on missing Nodes are kept) until they are");
            let this = self.clone();
            let late = async move {
                this.nodes.wait_ready().await;
                for key in membership::selecting_services(&this.services) {
                    this.queue.add(key);
                }
            };
            background.push(tokio::spawn(late.boxed()).abort_handle());
        }
        // Dropping this future (leadership lost) stops the sweep too.
        let _background = AbortOnDrop(background);
        start_key_workers(&self, "endpointslice", &self.queue, self.config.workers).await;
    }

    /// Stops the workers (the queue stops handing out keys).
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    // ---- handlers ----

    fn on_node(&self, old: Option<&Arc<Node>>, new: Option<&Arc<Node>>) {
        let zone =
            |n: Option<&Arc<Node>>| n.and_then(|n| n.labels().get(plan::LABEL_ZONE).cloned());
        if old.is_some() == new.is_some() && zone(old) == zone(new) {
            return;
        }
        let Some(name) = new.or(old).map(|n| n.name_any()) else {
            return;
        };
        for key in membership::services_on_node(&self.services, &self.pods, &name) {
            self.queue.add(key);
        }
    }

    fn on_slice(&self, old: Option<&Arc<EndpointSlice>>, new: Option<&Arc<EndpointSlice>>) {
        // A slice that stopped (or started) being managed here concerns its Service too.
        for slice in old.into_iter().chain(new) {
            if plan::is_managed(slice) {
                if let Some(key) = service_of(slice) {
                    self.queue.add(key);
                }
            }
        }
    }

    // ---- sync ----
}

impl SyncKey for Controller {
    /// Plans and applies the slices of the Service `key`.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let svc_key: Key = (ns.to_string(), name.to_string());
        let existing = self.slices.index(SLICE_SERVICE, key);
        let Some(svc) = self.services.get(ns, name) else {
            return self
                .delete_slices_of_gone_service(&svc_key, &existing)
                .await;
        };
        if svc.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        if self.tracker.stale(&svc_key, &self.slices) {
            self.queue.add_after(key.to_string(), STALE_RETRY);
            return Ok(());
        }
        let pods = membership::pods_for(&self.pods, &svc);
        let node_of = |node: &str| node_info(&self.nodes, node);
        let plan = plan::plan_with_nodes(&svc, &pods, &existing, &node_of);
        if !plan.is_empty() {
            self.apply(&svc_key, plan).await?;
        }
        Ok(())
    }
}

impl Controller {
    /// Deletes the managed slices of a Service that is no longer in the cache.
    async fn delete_slices_of_gone_service(
        &self,
        svc: &Key,
        slices: &[Arc<EndpointSlice>],
    ) -> Result<()> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &svc.0);
        for slice in slices {
            delete_slice(&api, slice).await?;
            self.tracker.expect(svc, slice.name_any(), Expect::Gone);
        }
        Ok(())
    }

    /// Deletes slices left behind by Services deleted while no controller ran: at start, and then
    /// every minute.
    async fn sweep_orphans(self: Arc<Self>) {
        loop {
            for slice in orphans(&self.slices.all(), &self.services) {
                let api: Api<EndpointSlice> =
                    Api::namespaced(self.client.clone(), &slice.namespace().unwrap_or_default());
                match delete_slice(&api, &slice).await {
                    Ok(()) => tracing::info!(
                        "endpointslice: deleted orphaned slice {}/{}",
                        slice.namespace().unwrap_or_default(),
                        slice.name_any()
                    ),
                    Err(e) => tracing::warn!("endpointslice: orphan sweep: {e}"),
                }
            }
            tokio::time::sleep(ORPHAN_SWEEP).await;
        }
    }

    /// Applies a plan: creates first, then updates, then deletes (endpoints are never missing in
    /// between).
    async fn apply(&self, key: &Key, plan: plan::Plan) -> Result<()> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &key.0);
        let obj = |name: &str| format!("{}/{name}", key.0);
        for slice in plan.create {
            let created = api
                .create(&PostParams::default(), &slice)
                .await
                .map_err(|e| Error::kube("creating EndpointSlice for Service", obj(&key.1), e))?;
            self.tracker.expect(
                key,
                created.name_any(),
                Expect::Generation(created.metadata.generation.unwrap_or(0)),
            );
        }
        for slice in plan.update {
            let name = slice.name_any();
            let updated = api
                .replace(&name, &PostParams::default(), &slice)
                .await
                .map_err(|e| Error::kube("updating EndpointSlice", obj(&name), e))?;
            self.tracker.expect(
                key,
                name,
                Expect::Generation(updated.metadata.generation.unwrap_or(0)),
            );
        }
        for slice in plan.delete {
            delete_slice(&api, &slice).await?;
            self.tracker.expect(key, slice.name_any(), Expect::Gone);
        }
        Ok(())
    }
}

/// What is known of a Node: nothing before the cache is synced (or when Nodes are forbidden),
/// else whether it exists and its zone.
fn node_info(nodes: &Indexed<Node>, name: &str) -> plan::NodeInfo {
    if !nodes.is_ready() {
        return plan::NodeInfo::Unreadable;
    }
    match nodes.get("", name) {
        Some(n) => plan::NodeInfo::Known {
            zone: n.labels().get(plan::LABEL_ZONE).cloned(),
        },
        // Upstream's reconciler leaves such a Pod out (unless publishNotReadyAddresses).
        None => plan::NodeInfo::Missing,
    }
}

async fn delete_slice(api: &Api<EndpointSlice>, slice: &EndpointSlice) -> Result<()> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: slice.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&slice.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(
            "deleting EndpointSlice",
            format!(
                "{}/{}",
                slice.namespace().unwrap_or_default(),
                slice.name_any()
            ),
            e,
        )),
    }
}

/// The managed slices whose Service (by name and uid) is not in `services`.
pub fn orphans(
    slices: &[Arc<EndpointSlice>],
    services: &Indexed<Service>,
) -> Vec<Arc<EndpointSlice>> {
    slices
        .iter()
        .filter(|s| plan::is_managed(s))
        .filter(|s| {
            let ns = s.namespace().unwrap_or_default();
            let owner = s
                .labels()
                .get(plan::LABEL_SERVICE_NAME)
                .and_then(|name| services.get(&ns, name));
            let owner_uid = s
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone());
            owner.is_none_or(|svc| svc.uid() != owner_uid)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
