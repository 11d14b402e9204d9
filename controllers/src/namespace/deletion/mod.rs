//! The namespace controller (kube-controller-manager v1.34's `namespace-controller`,
//! `pkg/controller/namespace` and its `deletion/namespaced_resources_deleter.go`): empties a
//! namespace being deleted and then releases it by removing the `kubernetes` finalizer from its
//! `spec.finalizers` through the `finalize` subresource, after which the API server deletes it.
//!
//! A namespace is looked at 5 s after each add or update that shows a deletionTimestamp (time for
//! every API server to refuse new objects there), and again every `--namespace-sync-period` (5
//! min, the informer resync upstream). A sync reads the namespace from the API server, sets
//! phase Terminating if needed, discovers every namespaced resource supporting `delete`
//! (aggregated discovery, custom resources and aggregated APIs included; [`discovery`]), deletes
//! the Pods first and, once none remains, every other resource: a `deletecollection` where
//! discovery offers it, else a list and a delete per object (background propagation, so the
//! garbage collector adds no orphan finalizer). It then lists what remains: Pods still ending
//! within their grace period and objects held by finalizers make it look again after half the
//! estimate plus a second ([`plan`]); the five conditions ([`conditions`]) say what failed and
//! what remains. Errors are retried with the namespace queue's backoff (5 ms doubling to 60 s).
//!
//! Owns: deleting the content of namespaces with a deletionTimestamp, their status phase and
//! conditions, and the removal of its finalizer token. Must not touch: namespaces not being
//! deleted, finalizers other than its token (on the namespace or on its content).

pub mod conditions;
pub mod discovery;
pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::ApiResource;
use kube::{Api, Client, Resource as _};

use crate::error::{Error, Result};
use crate::runtime::apierrors::{self, has_code, is_conflict, is_not_found};
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::queue::{Bucket, ItemBackoff, RateLimiter, WorkQueue};
use crate::runtime::workers::{wait_for_caches, AbortOnDrop};

use conditions::{ConditionUpdater, ContentTotals};
use discovery::{Discovered, Gvr, Resource};

/// The controller's name in logs.
pub const NAME: &str = "namespace";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "namespace";

/// How long after an event a deleting namespace is looked at (upstream's
/// `namespaceDeletionGracePeriod`).
pub const DELETION_GRACE: Duration = Duration::from_secs(5);

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Namespaces synced at once (`--concurrent-namespace-syncs`, 10).
    pub workers: usize,
    /// Every deleting namespace is looked at again this often (`--namespace-sync-period`, 5 min).
    pub sync_period: Duration,
    /// The delay after an event.
    pub deletion_grace: Duration,
    /// The finalizer this controller removes (`kubernetes`).
    pub finalizer_token: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 10,
            sync_period: Duration::from_secs(300),
            deletion_grace: DELETION_GRACE,
            finalizer_token: plan::FINALIZER_KUBERNETES.to_string(),
        }
    }
}

/// What a sync ended with, besides an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing more to do for now.
    Done,
    /// Content remains, expected to be gone in about this many seconds
    /// (upstream's `ResourcesRemainingError`).
    Remaining(i64),
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    namespaces: Arc<Indexed<Namespace>>,
    queue: Arc<WorkQueue<String>>,
}

/// Whether a namespace carries a deletionTimestamp.
fn deleting(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
}

/// `apierrors.IsMethodNotSupported`: 405.
fn is_method_not_supported(e: &kube::Error) -> bool {
    has_code(e, 405)
}

impl Controller {
    /// Registers the controller's handler on the shared Namespace informer.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let informer = informers.get::<Namespace>();
        // Upstream's nsControllerRateLimiter: retries at least every minute.
        let limiter = RateLimiter::new(
            ItemBackoff::new(Duration::from_millis(5), Duration::from_secs(60)),
            Bucket::new(10.0, 100),
        );
        let this = Arc::new(Controller {
            client,
            config,
            namespaces: informer.cache(),
            queue: WorkQueue::with_limiter(QUEUE_NAME, limiter),
        });
        informer.on_change_of(&this, |c, _, new| {
            if let Some(ns) = new.filter(|ns| deleting(ns)) {
                c.enqueue(ns);
            }
        });
        this
    }

    fn enqueue(&self, ns: &Namespace) {
        if let Some(name) = ns.metadata.name.clone() {
            self.queue.add_after(name, self.config.deletion_grace);
        }
    }

    /// Waits for the cache, then runs the workers and the periodic resync.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(NAME, &[&*self.namespaces]).await;
        tracing::info!(
            controller = NAME,
            workers = self.config.workers,
            "controller started"
        );
        let mut tasks = Vec::new();
        let resync = self.clone();
        tasks.push(tokio::spawn(async move { resync.resync().await }));
        for _ in 0..self.config.workers.max(1) {
            let this = self.clone();
            tasks.push(tokio::spawn(async move { this.worker().await }));
        }
        // Dropping this future (leadership lost) stops the workers.
        let _abort = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
        for t in tasks {
            let _ = t.await;
        }
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    /// The informer resync of upstream: every sync period, each deleting namespace is handled as
    /// an update.
    async fn resync(&self) {
        let mut tick = tokio::time::interval(self.config.sync_period);
        tick.tick().await;
        loop {
            tick.tick().await;
            for ns in self.namespaces.all() {
                if deleting(&ns) {
                    self.enqueue(&ns);
                }
            }
        }
    }

    /// One worker: content remaining is looked at again after its estimate (not counted as a
    /// failure), an error is retried with backoff, success forgets the backoff.
    async fn worker(&self) {
        while let Some(name) = self.queue.get().await {
            let outcome = std::panic::AssertUnwindSafe(self.sync(&name));
            match futures::FutureExt::catch_unwind(outcome).await {
                Ok(Ok(Outcome::Done)) => self.queue.forget(&name),
                Ok(Ok(Outcome::Remaining(estimate))) => {
                    let after = plan::requeue_after(estimate);
                    tracing::debug!(namespace = %name, ?after, "content remaining in namespace");
                    self.queue.add_after(name.clone(), after);
                }
                Ok(Err(e)) => {
                    tracing::warn!(namespace = %name, "deletion of namespace failed: {e}");
                    self.queue.add_rate_limited(name.clone());
                }
                Err(_) => {
                    tracing::error!(namespace = %name, "namespace sync panicked, retrying");
                    self.queue.add_rate_limited(name.clone());
                }
            }
            self.queue.done(&name);
        }
    }

    /// Upstream's `Delete`: empties namespace `name` if it is being deleted, then removes the
    /// finalizer token.
    pub async fn sync(&self, name: &str) -> Result<Outcome> {
        if self.namespaces.get("", name).is_none() {
            tracing::info!(namespace = name, "namespace has been deleted");
            return Ok(Outcome::Done);
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        // Several controllers edit a terminating namespace: read the latest.
        let got = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube("reading", format!("namespace {name}"), e))?;
        let ns = match got {
            Some(ns) if deleting(&ns) => ns,
            _ => return Ok(Outcome::Done),
        };
        let ns = match self.retry_on_conflict(ns, Self::ensure_terminating).await {
            Ok(ns) => ns,
            Err(Retry::Kube(e)) if is_not_found(&e) => return Ok(Outcome::Done),
            Err(e) => return Err(e.into_error("updating the phase of", name)),
        };
        if !deleting(&ns)
            || ns
                .spec
                .as_ref()
                .and_then(|s| s.finalizers.as_ref())
                .is_none_or(Vec::is_empty)
        {
            return Ok(Outcome::Done);
        }
        let (estimate, errors) = self.delete_all_content(ns.clone()).await;
        if !errors.is_empty() {
            return Err(Error::Invalid {
                object: format!("namespace {name}"),
                reason: aggregate(&errors),
            });
        }
        if estimate > 0 {
            return Ok(Outcome::Remaining(estimate));
        }
        match self.retry_on_conflict(ns, Self::finalize).await {
            Ok(_) => Ok(Outcome::Done),
            // Another controller with the same token finished the namespace.
            Err(Retry::Kube(e)) if is_not_found(&e) => Ok(Outcome::Done),
            Err(e) => Err(e.into_error("finalizing", name)),
        }
    }

    /// Runs `write` on the namespace, re-reading it after each conflict (an error if its UID
    /// changed meanwhile).
    async fn retry_on_conflict<F>(
        &self,
        mut ns: Namespace,
        write: F,
    ) -> std::result::Result<Namespace, Retry>
    where
        F: for<'b> Fn(&'b Self, &'b Namespace) -> BoxFuture<'b, kube::Result<Namespace>>,
    {
        let api: Api<Namespace> = Api::all(self.client.clone());
        loop {
            match write(self, &ns).await {
                Ok(n) => return Ok(n),
                Err(e) if is_conflict(&e) => {
                    let name = ns.metadata.name.clone().unwrap_or_default();
                    let latest = api.get(&name).await.map_err(Retry::Kube)?;
                    if latest.metadata.uid != ns.metadata.uid {
                        return Err(Retry::UidChanged);
                    }
                    ns = latest;
                }
                Err(e) => return Err(Retry::Kube(e)),
            }
        }
    }

    /// Phase Terminating on a deleting namespace (the API server sets it; this covers one that
    /// did not).
    fn ensure_terminating<'b>(
        &'b self,
        ns: &'b Namespace,
    ) -> BoxFuture<'b, kube::Result<Namespace>> {
        Box::pin(async move {
            let phase = ns.status.as_ref().and_then(|s| s.phase.as_deref());
            if !deleting(ns) || phase == Some("Terminating") {
                return Ok(ns.clone());
            }
            let mut updated = ns.clone();
            updated.status.get_or_insert_with(Default::default).phase = Some("Terminating".into());
            let api: Api<Namespace> = Api::all(self.client.clone());
            api.replace_status(
                ns.metadata.name.as_deref().unwrap_or_default(),
                &PostParams::default(),
                &updated,
            )
            .await
        })
    }

    /// Removes the token from `spec.finalizers` through the `finalize` subresource.
    fn finalize<'b>(&'b self, ns: &'b Namespace) -> BoxFuture<'b, kube::Result<Namespace>> {
        Box::pin(async move {
            let mut released = ns.clone();
            let spec = released.spec.get_or_insert_with(Default::default);
            spec.finalizers = Some(plan::without_finalizer(
                spec.finalizers.as_deref().unwrap_or_default(),
                &self.config.finalizer_token,
            ));
            let api: Api<Namespace> = Api::all(self.client.clone());
            let name = ns.metadata.name.as_deref().unwrap_or_default();
            match api
                .replace_subresource("finalize", name, &PostParams::default(), &released)
                .await
            {
                // Removed already.
                Err(e) if is_not_found(&e) => Ok(released),
                other => other,
            }
        })
    }

    /// Aggregated discovery (`/api` and `/apis`): the namespaced resources at their preferred
    /// versions, or the error of a failed request.
    async fn discover(&self) -> std::result::Result<Discovered, String> {
        let core = self
            .client
            .list_core_api_versions_aggregated()
            .await
            .map_err(|e| apierrors::api_message(&e))?;
        let apis = self
            .client
            .list_api_groups_aggregated()
            .await
            .map_err(|e| apierrors::api_message(&e))?;
        Ok(discovery::preferred_namespaced(&[core, apis]))
    }

    /// Upstream's `deleteAllContent`: the round's estimate and its errors; writes the conditions.
    async fn delete_all_content(&self, mut ns: Namespace) -> (i64, Vec<String>) {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let deleted_at = ns
            .metadata
            .deletion_timestamp
            .as_ref()
            .map_or_else(Timestamp::now, |t| t.0);
        let mut errors = Vec::new();
        let mut updater = ConditionUpdater::default();
        // Discovery errors are not fatal: what was discovered is still deleted.
        let discovered = match self.discover().await {
            Ok(d) => {
                if let Some(e) = d.error() {
                    updater.discovery_failed(&e, Some(d.failed.len()));
                    errors.push(e);
                }
                d
            }
            Err(e) => {
                updater.discovery_failed(&e, None);
                errors.push(e);
                Discovered::default()
            }
        };
        let deletable = discovery::supporting(&discovered.lists, &["delete"]);
        let resources = match discovery::group_version_resources(&deletable) {
            Ok(r) => r,
            Err(e) => {
                updater.group_version_failed(&e);
                errors.push(e);
                Default::default()
            }
        };
        let mut totals = ContentTotals::default();
        let mut estimate = 0;
        let pods = Gvr::pods();
        // Pods go first: nothing else is deleted while one remains.
        if let Some(r) = resources.get(&pods) {
            let (d, err) = self.delete_resource(&pods, r, &name, deleted_at).await;
            if let Some(e) = err {
                let e = plan::pods_error(&name, &e);
                updater.delete_content_failed(&e);
                errors.push(e);
            }
            plan::add_to_totals(&mut totals, &mut estimate, &pods, &d);
            if d.remaining > 0 {
                tracing::debug!(namespace = %name, "pods still remain, delaying deletion of other resources");
                self.write_conditions(&mut ns, &updater).await;
                return (estimate, errors);
            }
        }
        for (gvr, r) in resources.iter().filter(|(g, _)| **g != pods) {
            let (d, err) = self.delete_resource(gvr, r, &name, deleted_at).await;
            if let Some(e) = err {
                updater.delete_content_failed(&e);
                errors.push(e);
            }
            plan::add_to_totals(&mut totals, &mut estimate, gvr, &d);
        }
        updater.content_totals(&totals);
        // Always: a condition that stopped failing must say so.
        self.write_conditions(&mut ns, &updater).await;
        (estimate, errors)
    }

    /// The round's conditions, written when they changed (a failed write is only logged, as
    /// upstream: the next round writes them again).
    async fn write_conditions(&self, ns: &mut Namespace, updater: &ConditionUpdater) {
        let status = ns.status.get_or_insert_with(Default::default);
        if !updater.update(status, Timestamp::now()) {
            return;
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let name = ns.metadata.name.clone().unwrap_or_default();
        if let Err(e) = api.replace_status(&name, &PostParams::default(), ns).await {
            tracing::warn!(namespace = %name, "couldn't update status condition for namespace: {e}");
        }
    }

    /// `deletecollection` of a resource in a namespace; the deleted objects the server returns
    /// are not read.
    async fn delete_collection(&self, gvr: &Gvr, ns: &str, dp: &DeleteParams) -> kube::Result<()> {
        let url = DynamicObject::url_path(&api_resource(gvr), Some(ns));
        let req = kube::core::Request::new(url)
            .delete_collection(dp, &ListParams::default())
            .map_err(kube::Error::BuildRequest)?;
        self.client.request_text(req).await.map(|_| ())
    }

    /// Upstream's `deleteAllContentForGroupVersionResource`: estimates, deletes (collection or
    /// one by one), then lists what remains.
    async fn delete_resource(
        &self,
        gvr: &Gvr,
        r: &Resource,
        ns: &str,
        deleted_at: Timestamp,
    ) -> (plan::GvrDeletion, Option<String>) {
        let no_estimate = plan::GvrDeletion::default();
        let estimate = if *gvr == Gvr::pods() {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match pods.list(&ListParams::default()).await {
                Ok(list) => plan::bounded_estimate(
                    plan::pods_estimate(&list.items),
                    deleted_at,
                    Timestamp::now(),
                ),
                Err(e) => return (no_estimate, Some(apierrors::api_message(&e))),
            }
        } else {
            0
        };
        let with_estimate = plan::GvrDeletion {
            estimate,
            ..Default::default()
        };
        let api = dynamic_api(&self.client, gvr, ns);
        let dp = DeleteParams::background();
        let collected = if r.supports("deletecollection") {
            match self.delete_collection(gvr, ns, &dp).await {
                Ok(_) => true,
                Err(e) if is_method_not_supported(&e) || is_not_found(&e) => false,
                Err(e) => return (with_estimate, Some(apierrors::api_message(&e))),
            }
        } else {
            false
        };
        if !collected {
            match list_names(&api, r).await {
                Ok(Some(items)) => {
                    for (name, _) in items {
                        match api.delete(&name, &dp).await {
                            Ok(_) => {}
                            Err(e) if is_not_found(&e) || is_method_not_supported(&e) => {}
                            Err(e) => return (with_estimate, Some(apierrors::api_message(&e))),
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => return (with_estimate, Some(apierrors::api_message(&e))),
            }
        }
        match list_names(&api, r).await {
            Ok(remaining) => {
                let finalizers: Option<Vec<Vec<String>>> =
                    remaining.map(|items| items.into_iter().map(|(_, f)| f).collect());
                plan::after_deletion(gvr, ns, estimate, finalizers.as_deref())
            }
            Err(e) => (with_estimate, Some(apierrors::api_message(&e))),
        }
    }
}

/// Why a namespace write retried on conflict failed.
#[derive(Debug)]
enum Retry {
    /// The API call failed.
    Kube(kube::Error),
    /// The namespace was deleted and created again meanwhile.
    UidChanged,
}

impl Retry {
    fn into_error(self, action: &'static str, name: &str) -> Error {
        match self {
            Retry::Kube(e) => Error::kube(action, format!("namespace {name}"), e),
            Retry::UidChanged => Error::Invalid {
                object: format!("namespace {name}"),
                reason: "namespace uid has changed across retries".into(),
            },
        }
    }
}

/// The kube-rs description of a resource (no kind: only its path is used).
fn api_resource(gvr: &Gvr) -> ApiResource {
    gvr.api_resource("")
}

/// A client of one resource in one namespace (lists read as metadata only).
fn dynamic_api(client: &Client, gvr: &Gvr, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &api_resource(gvr))
}

/// The objects of a resource (name, finalizers), as metadata; None when it cannot be listed.
async fn list_names(
    api: &Api<DynamicObject>,
    r: &Resource,
) -> kube::Result<Option<Vec<(String, Vec<String>)>>> {
    if !r.supports("list") {
        return Ok(None);
    }
    match api.list_metadata(&ListParams::default()).await {
        Ok(list) => Ok(Some(
            list.items
                .into_iter()
                .map(|o| {
                    (
                        o.metadata.name.unwrap_or_default(),
                        o.metadata.finalizers.unwrap_or_default(),
                    )
                })
                .collect(),
        )),
        Err(e) if is_method_not_supported(&e) || is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `utilerrors.NewAggregate(errs).Error()`: one message alone, several in brackets.
fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}
