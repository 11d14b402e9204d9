//! The EndpointSlice mirroring controller (kube-controller-manager v1.34's
//! `endpointslice-mirroring-controller`, `pkg/controller/endpointslicemirroring`): EndpointSlices
//! mirroring the custom Endpoints of Services without a selector.
//!
//! Owns: the slices labelled `endpointslice.kubernetes.io/managed-by:
//! endpointslicemirroring-controller.k8s.io` (created here, owned by their Endpoints, named
//! `<endpoints>-<random>`); never touches another slice. An Endpoints object is mirrored while it
//! is not labelled `endpointslice.kubernetes.io/skip-mirror: "true"` (upstream's Endpoints
//! controller labels its own so; kpr's does not, its Services having a selector, which is enough) and carries no leader-election annotation, and while
//! its Service exists without a selector; otherwise (and when the Endpoints is gone) its mirrored
//! slices are deleted. What the slices hold is [`plan`]'s.
//!
//! Queueing, as upstream: an Endpoints change queues it (when mirrored before or after); a Service
//! added or deleted without a selector, or whose selector appeared or went, queues its Endpoints;
//! a change of a mirrored slice queues its Endpoints after `--mirroring-endpointslice-updates-
//! batch-period` (default 0). The work queue `endpoint_slice_mirroring`, retried after 1 s doubling
//! up to 100 s, `--mirroring-concurrent-service-endpoint-syncs` workers (default 5), at most
//! `--mirroring-max-endpoints-per-subset` endpoints per subset (default 1000). Slices written but
//! not yet seen by the cache hold the next sync back (the shared
//! [`crate::endpoint::endpointutil::Tracker`], upstream's `EndpointSliceTracker`). Warning Events
//! `InvalidIPAddress` and `TooManyAddressesToMirror` on the Endpoints, from
//! `endpoint-slice-mirroring-controller`, as upstream.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::endpoint::endpointutil::{Expect, Tracker};
use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::{Indexed, Key};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{self, Informers};
use crate::runtime::queue::{Bucket, ItemBackoff, RateLimiter, WorkQueue};
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs.
pub const NAME: &str = "endpointslice-mirroring-controller";

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "endpoint_slice_mirroring";

/// The Events' source component, as upstream.
pub const EVENT_COMPONENT: &str = "endpoint-slice-mirroring-controller";

/// EndpointSlice cache index of mirrored slices: key = `ns/endpoints-name`.
pub const MIRRORED: &str = "endpointslicemirroring-endpoints";

/// How soon a sync whose slice cache has not yet seen its own writes looks again.
const STALE_RETRY: Duration = Duration::from_millis(50);

/// The mirroring controller's settings (kube-controller-manager's `--mirroring-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `--mirroring-concurrent-service-endpoint-syncs` (default 5).
    pub workers: usize,
    /// `--mirroring-max-endpoints-per-subset` (default 1000).
    pub max_endpoints_per_subset: usize,
    /// `--mirroring-endpointslice-updates-batch-period` (default 0).
    pub batch_period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 5,
            max_endpoints_per_subset: 1000,
            batch_period: Duration::ZERO,
        }
    }
}

/// [`MIRRORED`] of a slice.
fn mirrored_index(s: &EndpointSlice) -> Vec<String> {
    if !plan::is_mirrored(s) {
        return Vec::new();
    }
    endpoints_of(s).into_iter().collect()
}

/// The queue key (`ns/name`) of the Endpoints a slice is labelled with.
fn endpoints_of(s: &EndpointSlice) -> Option<String> {
    s.labels()
        .get(plan::LABEL_SERVICE_NAME)
        .filter(|n| !n.is_empty())
        .map(|n| format!("{}/{n}", s.namespace().unwrap_or_default()))
}

/// Whether a Service has a selector (the API server stores an empty one as none).
fn has_selector(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|s| !s.is_empty())
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    endpoints: Arc<Indexed<Endpoints>>,
    services: Arc<Indexed<Service>>,
    slices: Arc<Indexed<EndpointSlice>>,
    queue: Arc<WorkQueue<String>>,
    tracker: Tracker,
    recorder: Recorder,
}

impl Controller {
    /// Registers the controller's index and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let ep_informer = informers.get::<Endpoints>();
        let svc_informer = informers.get::<Service>();
        let slice_informer = informers.get::<EndpointSlice>();
        slice_informer.add_index(MIRRORED, mirrored_index);
        let queue = WorkQueue::with_limiter(
            QUEUE_NAME,
            RateLimiter::new(
                ItemBackoff::new(Duration::from_secs(1), Duration::from_secs(100)),
                Bucket::new(10.0, 100),
            ),
        );
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), EVENT_COMPONENT),
            client,
            config,
            endpoints: ep_informer.cache(),
            services: svc_informer.cache(),
            slices: slice_informer.cache(),
            queue,
            tracker: Tracker::default(),
        });
        ep_informer.on_change_of(&this, Controller::on_endpoints);
        svc_informer.on_change_of(&this, Controller::on_service);
        slice_informer.on_change_of(&this, Controller::on_slice);
        this
    }

    fn on_endpoints(&self, old: Option<&Arc<Endpoints>>, new: Option<&Arc<Endpoints>>) {
        let mirrored = |e: Option<&Arc<Endpoints>>| e.is_some_and(|e| plan::should_mirror(e));
        if mirrored(old) || mirrored(new) {
            if let Some(e) = new.or(old) {
                self.queue.add(informer::key_of(&**e));
            }
        }
    }

    fn on_service(&self, old: Option<&Arc<Service>>, new: Option<&Arc<Service>>) {
        let queue = match (old, new) {
            (None, Some(s)) | (Some(s), None) => !has_selector(s),
            (Some(o), Some(n)) => has_selector(o) != has_selector(n),
            (None, None) => false,
        };
        if queue {
            if let Some(s) = new.or(old) {
                self.queue.add(informer::key_of(&**s));
            }
        }
    }

    fn on_slice(&self, old: Option<&Arc<EndpointSlice>>, new: Option<&Arc<EndpointSlice>>) {
        let mut keys: Vec<String> = Vec::new();
        let both = old.is_some() && new.is_some();
        // A slice relabelled to another Endpoints concerns both; one that stopped (or started)
        // being mirrored concerns its Endpoints too.
        let relabelled = both && old.map(|o| endpoints_of(o)) != new.map(|n| endpoints_of(n));
        let managed_changed =
            both && old.map(|o| plan::is_mirrored(o)) != new.map(|n| plan::is_mirrored(n));
        for s in old.into_iter().chain(new) {
            if plan::is_mirrored(s) || relabelled || managed_changed {
                keys.extend(endpoints_of(s));
            }
        }
        keys.dedup();
        for k in keys {
            if self.config.batch_period.is_zero() {
                self.queue.add(k);
            } else {
                self.queue.add_after(k, self.config.batch_period);
            }
        }
    }

    /// Waits for the Endpoints, Service and EndpointSlice caches, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        let workers = self.config.workers;
        run_controller(
            &self,
            QUEUE_NAME,
            &[&*self.endpoints, &*self.services, &*self.slices],
            &self.queue,
            workers,
        )
        .await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    async fn delete_mirrored(&self, key: &Key, slices: &[Arc<EndpointSlice>]) -> Result<()> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &key.0);
        for s in slices {
            let name = s.name_any();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if apierrors::is_not_found(&e) => {}
                Err(e) => {
                    return Err(Error::kube(
                        "deleting mirrored EndpointSlice",
                        format!("{}/{name}", key.0),
                        e,
                    ))
                }
            }
            self.tracker.expect(key, name, Expect::Gone);
        }
        Ok(())
    }

    fn record(&self, ep: &Endpoints, reason: &str, message: String) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Endpoints".into()),
            namespace: ep.namespace(),
            name: Some(ep.name_any()),
            uid: ep.uid(),
            resource_version: ep.resource_version(),
            ..Default::default()
        };
        self.recorder.publish(&reference, true, reason, message);
    }

    async fn apply(&self, key: &Key, ep: &Endpoints, plan: plan::Plan) -> Result<()> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &key.0);
        let obj = |name: &str| format!("{}/{name}", key.0);
        if ep.metadata.deletion_timestamp.is_none() {
            for slice in plan.create {
                match api.create(&PostParams::default(), &slice).await {
                    Ok(created) => self.tracker.expect(
                        key,
                        created.name_any(),
                        Expect::Generation(created.metadata.generation.unwrap_or(0)),
                    ),
                    Err(e) if apierrors::namespace_terminating(&e) => return Ok(()),
                    Err(e) => {
                        return Err(Error::kube(
                            "creating EndpointSlice for Endpoints",
                            obj(&key.1),
                            e,
                        ))
                    }
                }
            }
        }
        for slice in plan.update {
            let name = slice.name_any();
            let updated = api
                .replace(&name, &PostParams::default(), &slice)
                .await
                .map_err(|e| Error::kube("updating mirrored EndpointSlice", obj(&name), e))?;
            self.tracker.expect(
                key,
                name,
                Expect::Generation(updated.metadata.generation.unwrap_or(0)),
            );
        }
        self.delete_mirrored(key, &plan.delete).await
    }
}

impl SyncKey for Controller {
    /// Upstream's `syncEndpoints`.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let ep_key: Key = (ns.to_string(), name.to_string());
        let existing = self.slices.index(MIRRORED, key);
        let ep = self.endpoints.get(ns, name);
        let svc = self.services.get(ns, name);
        let mirror = match (&ep, &svc) {
            (Some(ep), Some(svc)) => plan::should_mirror(ep) && !has_selector(svc),
            _ => false,
        };
        let Some(ep) = ep.filter(|_| mirror) else {
            return self.delete_mirrored(&ep_key, &existing).await;
        };
        if self.tracker.stale(&ep_key, &self.slices) {
            self.queue.add_after(key.to_string(), STALE_RETRY);
            return Ok(());
        }
        let plan = plan::plan(&ep, &existing, self.config.max_endpoints_per_subset);
        if plan.invalid > 0 {
            self.record(
                &ep,
                "InvalidIPAddress",
                format!(
                    "Skipped {} invalid IP addresses when mirroring to EndpointSlices",
                    plan.invalid
                ),
            );
        }
        if plan.skipped > plan.invalid {
            self.record(
                &ep,
                "TooManyAddressesToMirror",
                format!(
                    "A max of {} addresses can be mirrored to EndpointSlices per Endpoints subset. {} addresses were skipped",
                    self.config.max_endpoints_per_subset, plan.skipped
                ),
            );
        }
        if plan.is_empty() {
            return Ok(());
        }
        self.apply(&ep_key, &ep, plan).await
    }
}
