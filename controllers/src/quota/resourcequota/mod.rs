//! The resource quota controller (kube-controller-manager v1.34's `resourcequota` controller,
//! `resourcequota-controller`): every ResourceQuota's `status.hard` mirrors its `spec.hard`, and
//! `status.used` holds, for each resource `spec.hard` names, what the namespace's objects
//! matching the quota's scopes use, as [`evaluate`] computes it.
//!
//! Owns `status` of ResourceQuotas, nothing else. The API server's ResourceQuota admission plugin
//! charges each creation to `status.used` as it admits it; this controller recomputes the usage
//! from the objects themselves:
//! - every `--resource-quota-sync-period` (5 m), every quota (upstream's `enqueueAll`);
//! - at once (the priority queue, upstream's `missingUsageQueue`) when a quota is new, its
//!   `spec.hard` changed or its status lacks a resource an evaluator tracks;
//! - when an object it counts goes away or stops being charged (upstream's replenishment): a Pod
//!   deleted, or turning Succeeded/Failed; a Service deleted or changing type to or from
//!   NodePort/LoadBalancer; a claim deleted or its allocated storage changing; any other counted
//!   object deleted. The namespace's quotas tracking that resource are resynced.
//!
//! Pods, Services and PersistentVolumeClaims come from the shared informers; every other
//! counted resource from a metadata-only watch of its own ([`counts`]), started the first time a
//! quota names it and resolved through discovery, custom resources included. A resource no
//! evaluator tracks (a misspelt name, `count/` of a resource the API server does not serve) is
//! left out of the computed usage: `status.used` keeps what it had for it (nothing, as
//! upstream), and the quota is otherwise synced.
//!
//! Two queues as upstream, `resourcequota_primary` and `resourcequota_priority`, each with
//! `--concurrent-resource-quota-syncs` (5) workers; a failed status update (a conflict with the
//! admission plugin's own write) is retried rate-limited. A quota synced again before the cache
//! shows the previous sync's status write is read through the runtime's written overlay
//! ([`Written`]), so a burst of replenishments does not end in conflicts with this controller's
//! own writes (upstream lives with those: each costs a failed update and a retry). No Events
//! (upstream records none).

pub mod counts;
pub mod evaluate;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ResourceQuota, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::{key_of, split_key, Informers, NAMESPACE};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_workers_of, wait_for_caches};
use crate::runtime::written::Written;

use counts::Counts;
use evaluate::{Evaluator, GroupResource, ResourceList};

/// The controller's name in logs (the name `--controllers` takes).
pub const NAME: &str = "resourcequota";

/// How long a sync waits for a newly started count watch's first listing.
const COUNT_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--concurrent-resource-quota-syncs` (5): workers per queue.
    pub workers: usize,
    /// `--resource-quota-sync-period` (5 m): the full recalculation's period.
    pub resync_period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 5,
            resync_period: Duration::from_secs(300),
        }
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    quotas: Arc<Indexed<ResourceQuota>>,
    pods: Arc<Indexed<CachedPod>>,
    services: Arc<Indexed<Service>>,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    counts: OnceLock<Counts>,
    /// Status writes not yet seen in the quota cache.
    written: Written<ResourceQuota>,
    /// The full recalculations and replenishments.
    queue: Arc<WorkQueue<String>>,
    /// Quotas whose status lacks what their spec asks (synced first).
    priority: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers its handlers on the shared ResourceQuota, Pod, Service and
    /// PersistentVolumeClaim informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let quotas = informers.get::<ResourceQuota>();
        let pods = informers.get::<CachedPod>();
        let services = informers.get::<Service>();
        let claims = informers.get::<PersistentVolumeClaim>();
        let c = Arc::new(Controller {
            client: client.clone(),
            config,
            quotas: quotas.cache(),
            pods: pods.cache(),
            services: services.cache(),
            claims: claims.cache(),
            counts: OnceLock::new(),
            written: Written::new(),
            queue: WorkQueue::new("resourcequota_primary"),
            priority: WorkQueue::new("resourcequota_priority"),
        });
        let weak: Weak<Controller> = Arc::downgrade(&c);
        let on_gone: counts::OnGone = Arc::new(move |gr: &GroupResource, ns: &str| {
            if let Some(c) = weak.upgrade() {
                c.replenish(ns, &Evaluator::Count(gr.clone()));
            }
        });
        let _ = c.counts.set(Counts::new(client, on_gone));
        quotas.on_change_of(&c, Controller::quota_changed);
        pods.on_change_of(&c, Controller::pod_changed);
        services.on_change_of(&c, Controller::service_changed);
        claims.on_change_of(&c, Controller::claim_changed);
        c
    }

    fn counts(&self) -> &Counts {
        self.counts.get().expect("set at construction")
    }

    /// Waits for the caches, then queues every quota every resync period and runs the workers of
    /// both queues.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(
            NAME,
            &[&*self.quotas, &*self.pods, &*self.services, &*self.claims],
        )
        .await;
        tracing::info!(
            controller = NAME,
            workers = self.config.workers,
            resync = ?self.config.resync_period,
            "controller started"
        );
        let resync = {
            let c = self.clone();
            async move {
                loop {
                    tokio::time::sleep(c.config.resync_period).await;
                    c.enqueue_all();
                }
            }
        };
        let sync = |c: Arc<Controller>, key: String| async move { c.sync(&key).await };
        tokio::join!(
            resync,
            run_workers_of(&self, &self.queue, self.config.workers, sync),
            run_workers_of(&self, &self.priority, self.config.workers, sync),
        );
    }

    /// Stops both queues.
    pub fn shut_down(&self) {
        self.queue.shut_down();
        self.priority.shut_down();
    }

    /// Every quota into the primary queue (the full recalculation).
    pub fn enqueue_all(&self) {
        for q in self.quotas.all() {
            self.queue.add(key_of(&*q));
        }
    }

    /// Whether an evaluator tracks `name` (for a count, whether its resource is counted now or
    /// may be: discovery is only read at sync).
    fn tracked(name: &str) -> bool {
        Evaluator::of(name).is_some()
    }

    /// upstream's `addQuota`: to the priority queue when its status lags its spec, else to the
    /// primary queue.
    fn add_quota(&self, quota: &ResourceQuota) {
        let key = key_of(quota);
        if evaluate::needs_priority(quota, Controller::tracked) {
            self.priority.add(key);
        } else {
            self.queue.add(key);
        }
    }

    fn quota_changed(&self, old: Option<&Arc<ResourceQuota>>, new: Option<&Arc<ResourceQuota>>) {
        if let Some(q) = new.or(old) {
            let m = &q.metadata;
            self.written.forget(
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
            );
        }
        match (old, new) {
            (None, Some(q)) => self.add_quota(q),
            // Only a change of spec.hard: status changes are this controller's (or admission's).
            (Some(o), Some(n)) => {
                let hard = |q: &ResourceQuota| {
                    evaluate::parse_list(q.spec.as_ref().and_then(|s| s.hard.as_ref()))
                };
                if hard(o) != hard(n) {
                    self.add_quota(n);
                }
            }
            // A deleted quota has no status to write; the namespace's quotas counting quotas
            // are replenished.
            (Some(o), None) => {
                if let Some(ns) = o.metadata.namespace.as_deref() {
                    self.replenish(ns, &Evaluator::Count(GroupResource::core("resourcequotas")));
                }
            }
            (None, None) => {}
        }
    }

    fn pod_changed(&self, old: Option<&Arc<CachedPod>>, new: Option<&Arc<CachedPod>>) {
        let now = Timestamp::now();
        let (ns, replenish) = match (old, new) {
            (Some(o), Some(n)) => (
                n.metadata.namespace.clone(),
                evaluate::pod_charged(o, now) && !evaluate::pod_charged(n, now),
            ),
            (Some(o), None) => (o.metadata.namespace.clone(), true),
            _ => (None, false),
        };
        if replenish {
            self.replenish(&ns.unwrap_or_default(), &Evaluator::Pods);
        }
    }

    fn service_changed(&self, old: Option<&Arc<Service>>, new: Option<&Arc<Service>>) {
        let (ns, replenish) = match (old, new) {
            (Some(o), Some(n)) => (
                n.metadata.namespace.clone(),
                evaluate::service_quota_type(o) != evaluate::service_quota_type(n),
            ),
            (Some(o), None) => (o.metadata.namespace.clone(), true),
            _ => (None, false),
        };
        if replenish {
            self.replenish(&ns.unwrap_or_default(), &Evaluator::Services);
        }
    }

    fn claim_changed(
        &self,
        old: Option<&Arc<PersistentVolumeClaim>>,
        new: Option<&Arc<PersistentVolumeClaim>>,
    ) {
        let (ns, replenish) = match (old, new) {
            (Some(o), Some(n)) => (
                n.metadata.namespace.clone(),
                evaluate::claim_needs_replenish(o, n),
            ),
            (Some(o), None) => (o.metadata.namespace.clone(), true),
            _ => (None, false),
        };
        if replenish {
            self.replenish(&ns.unwrap_or_default(), &Evaluator::Claims);
        }
    }

    /// Queues the quotas of `namespace` whose `status.hard` names a resource `evaluator` tracks
    /// (upstream's `replenishQuota`).
    fn replenish(&self, namespace: &str, evaluator: &Evaluator) {
        for q in self.quotas.index(NAMESPACE, namespace) {
            let tracks = q
                .status
                .as_ref()
                .and_then(|s| s.hard.as_ref())
                .is_some_and(|h| h.keys().any(|name| evaluator.tracks(name)));
            if tracks {
                self.queue.add(key_of(&*q));
            }
        }
    }

    /// How many objects of `gr` `namespace` holds, or None when the API server serves no such
    /// countable resource. The quotas themselves come from this controller's own cache, as
    /// upstream counts them from the informer it syncs from: a separate watch could still lack
    /// the quota being synced, and a new quota would record itself uncounted until the next full
    /// recalculation (nothing else resyncs it).
    async fn object_count(&self, gr: &GroupResource, namespace: &str) -> Result<Option<i64>> {
        if *gr == GroupResource::core("resourcequotas") {
            return Ok(Some(self.quotas.index(NAMESPACE, namespace).len() as i64));
        }
        let counter = self
            .counts()
            .counter(gr)
            .await
            .map_err(|e| Error::kube("discovering", format!("the resource {gr}"), e))?;
        let Some(counter) = counter else {
            return Ok(None);
        };
        if !counter.wait_synced(COUNT_SYNC_TIMEOUT).await {
            return Err(Error::Invalid {
                object: format!("the count of {gr}"),
                reason: "its watch has not listed it yet".into(),
            });
        }
        Ok(Some(counter.count(namespace) as i64))
    }

    /// The usage of the resources of `hard` some evaluator tracks, by evaluator
    /// (`CalculateUsage`). Count resources the API server does not serve are left out.
    async fn usage(&self, quota: &ResourceQuota, namespace: &str) -> Result<ResourceList> {
        let hard = evaluate::parse_list(quota.spec.as_ref().and_then(|s| s.hard.as_ref()));
        let mut by_evaluator: BTreeMap<Evaluator, BTreeSet<String>> = BTreeMap::new();
        for name in hard.keys() {
            if let Some(e) = Evaluator::of(name) {
                by_evaluator.entry(e).or_default().insert(name.clone());
            }
        }
        let scopes = evaluate::scope_requirements(quota);
        let mut usage = ResourceList::new();
        for (evaluator, resources) in by_evaluator {
            let part = match &evaluator {
                Evaluator::Pods => {
                    let now = Timestamp::now();
                    evaluate::usage_of(
                        &resources,
                        &scopes,
                        self.pods.index(NAMESPACE, namespace),
                        |s, p| evaluate::pod_matches_scope(s, p),
                        |p| evaluate::pod_usage(p, now),
                    )
                }
                Evaluator::Services => evaluate::usage_of(
                    &resources,
                    &scopes,
                    self.services.index(NAMESPACE, namespace),
                    no_scope,
                    |s| evaluate::service_usage(s),
                ),
                Evaluator::Claims => evaluate::usage_of(
                    &resources,
                    &scopes,
                    self.claims.index(NAMESPACE, namespace),
                    no_scope,
                    |c| evaluate::claim_usage(c),
                ),
                Evaluator::Count(gr) => {
                    let Some(n) = self.object_count(gr, namespace).await? else {
                        tracing::debug!(resource = %gr, "resourcequota: not a countable resource");
                        continue;
                    };
                    evaluate::usage_of(
                        &resources,
                        &scopes,
                        std::iter::once(()).filter(|_| n > 0),
                        no_scope,
                        |_| count_usage(&resources, n),
                    )
                }
            };
            usage.extend(part);
        }
        Ok(usage)
    }

    /// Recomputes one quota and writes its status when it changed (`syncResourceQuota`).
    pub async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(quota) = self.written.fresh(ns, name, self.quotas.get(ns, name)) else {
            return Ok(());
        };
        let usage = self.usage(&quota, ns).await?;
        let Some(status) = evaluate::next_status(&quota, &usage) else {
            return Ok(());
        };
        let mut updated = (*quota).clone();
        updated.status = Some(status);
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), ns);
        let written = api
            .replace_status(name, &PostParams::default(), &updated)
            .await
            .map_err(|e| {
                Error::kube("updating the status of", format!("ResourceQuota {key}"), e)
            })?;
        self.written
            .record(quota.metadata.resource_version.clone(), written);
        Ok(())
    }

    /// The resources counted through watches of their own so far.
    pub fn counted(&self) -> BTreeSet<GroupResource> {
        self.counts().watched()
    }
}

/// The scope function of every evaluator but the Pods': no scope matches.
fn no_scope<T>(_: &evaluate::ScopeRequirement, _: &T) -> bool {
    false
}

#[cfg(test)]
#[path = "evaluate_tests.rs"]
mod evaluate_tests;

/// `n` objects of each of `resources` (an object count's usage).
fn count_usage(resources: &BTreeSet<String>, n: i64) -> ResourceList {
    resources
        .iter()
        .map(|r| (r.clone(), crate::helpers::quantity::Quantity::from_int(n)))
        .collect()
}
