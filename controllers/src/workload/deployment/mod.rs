//! The Deployment controller (DEP-1..DEP-18), as kube-controller-manager v1.34's
//! `pkg/controller/deployment`: a Deployment owns ReplicaSets named `<deployment>-<hash>`, one per
//! Pod template, and moves replicas between them (RollingUpdate within maxSurge /
//! maxUnavailable, or Recreate), keeping revisions, history and the Progressing / Available
//! conditions that `kubectl rollout status` reads.
//!
//! This module is the thin part: event handlers that queue Deployment keys (DEP-2), the claim of
//! ReplicaSets (`getReplicaSetsForDeployment`, through [`crate::runtime::claim`]), the Pod map
//! (`getPodMapForDeployment`), and the apply layer that executes a [`plan::Plan`]. Every decision
//! is in [`plan`] (pure) and [`util`]. It writes Deployments (status, and the spec only for the
//! legacy rollback annotation), ReplicaSets and events; it never writes Pods, which are the
//! ReplicaSet controller's.

pub mod plan;
pub mod util;

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};

use crate::error::{Error, Result};
use crate::helpers::selector::Selector;
use crate::runtime::apierrors::{self, api_message, is_already_exists, is_not_found};
use crate::runtime::cache::Indexed;
use crate::runtime::claim::{self, claim_plan, recheck_owner, OwnerInfo, ORPHAN_NAMESPACE};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{key_of, split_key, Informers, CONTROLLER_UID, NAMESPACE};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller_with, WorkersConfig};

use crate::runtime::cached_pod::CachedPod;
use crate::runtime::written::Written;
use plan::{Action, Requeue};

/// The events' source component, as upstream names it.
pub const COMPONENT: &str = "deployment-controller";

/// After this many failed syncs in a row a key is dropped until its next event (upstream's
/// `maxRetries`; with the default backoff that is about 82 s of retrying).
const MAX_RETRIES: u32 = 15;

/// The Deployment controller's settings: `--concurrent-deployment-syncs`, Deployments synced at
/// once (upstream default 5).
pub type Config = WorkersConfig<5>;

/// The Deployment controller.
pub struct Controller {
    client: Client,
    config: Config,
    deployments: Arc<Indexed<Deployment>>,
    replica_sets: Arc<Indexed<ReplicaSet>>,
    pods: Arc<Indexed<CachedPod>>,
    queue: Arc<WorkQueue<String>>,
    events: Recorder,
    /// Our writes the caches have not shown yet.
    written_d: Written<Deployment>,
    written_rs: Written<ReplicaSet>,
}

fn controller_ref<K: Resource>(obj: &K) -> Option<&OwnerReference> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

fn object(d: &Deployment) -> String {
    format!(
        "Deployment {}/{}",
        d.namespace().unwrap_or_default(),
        d.name_any()
    )
}

fn selector_of(d: &Deployment) -> Result<Selector> {
    Selector::parse(d.spec.as_ref().map(|s| &s.selector)).map_err(|e| Error::Invalid {
        object: object(d),
        reason: format!("spec.selector is invalid: {e}"),
    })
}

/// Whether the error is a create refused because the namespace is being deleted: such a sync is
/// not retried (upstream forgets the key too).
fn namespace_terminating(e: &Error) -> bool {
    matches!(e, Error::Kube { source, .. } if apierrors::namespace_terminating(source))
}

impl Controller {
    /// Builds the controller on the shared informers: registers its index and its handlers on
    /// the Deployment, ReplicaSet and Pod informers (call before the informers start).
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let d_inf = informers.get::<Deployment>();
        let rs_inf = informers.get::<ReplicaSet>();
        let pod_inf = informers.get::<CachedPod>();
        claim::add_orphan_index(&rs_inf);
        let c = Arc::new(Controller {
            events: Recorder::new(client.clone(), COMPONENT),
            client,
            config,
            deployments: d_inf.cache(),
            replica_sets: rs_inf.cache(),
            pods: pod_inf.cache(),
            queue: WorkQueue::new("deployment"),
            written_d: Written::new(),
            written_rs: Written::new(),
        });
        let h = c.clone();
        d_inf.on_change(Box::new(move |old, new| {
            if let Some(d) = new.or(old) {
                h.written_d
                    .forget(&d.namespace().unwrap_or_default(), &d.name_any());
                h.enqueue(d);
            }
        }));
        let h = c.clone();
        rs_inf.on_change(Box::new(move |old, new| {
            if let Some(rs) = new.or(old) {
                h.written_rs
                    .forget(&rs.namespace().unwrap_or_default(), &rs.name_any());
            }
            h.on_replica_set(old, new)
        }));
        let h = c.clone();
        pod_inf.on_change(Box::new(move |old, new| {
            if let (Some(pod), None) = (old, new) {
                h.on_pod_deleted(pod);
            }
        }));
        c
    }

    /// Waits for the caches, then runs the workers until the queue shuts down.
    pub async fn run(self: Arc<Self>) {
        run_controller_with(
            &self,
            "deployment",
            &[&*self.deployments, &*self.replica_sets, &*self.pods],
            &self.queue,
            self.config.workers,
            |this, key: String| async move { this.sync_handled(key).await },
        )
        .await;
    }

    /// The work queue (tests and the manager's shutdown).
    pub fn queue(&self) -> &Arc<WorkQueue<String>> {
        &self.queue
    }

    fn enqueue(&self, d: &Deployment) {
        self.queue.add(key_of(d));
    }

    // --- handlers (DEP-2) ---------------------------------------------------------------------

    /// `resolveControllerRef`: the Deployment a controller reference names, if it still is that
    /// one (same uid).
    fn resolve(&self, namespace: &str, r: &OwnerReference) -> Option<Arc<Deployment>> {
        crate::runtime::claim::resolve_controller_ref(&self.deployments, namespace, r)
    }

    /// `getDeploymentsForReplicaSet`: Deployments whose (non-empty) selector matches an orphan.
    fn deployments_for_orphan(&self, rs: &ReplicaSet) -> Vec<Arc<Deployment>> {
        if rs.metadata.labels.as_ref().is_none_or(|l| l.is_empty()) {
            return Vec::new();
        }
        let ns = rs.namespace().unwrap_or_default();
        self.deployments
            .index(NAMESPACE, &ns)
            .into_iter()
            .filter(|d| {
                selector_of(d)
                    .is_ok_and(|s| !s.is_everything() && s.matches(rs.metadata.labels.as_ref()))
            })
            .collect()
    }

    fn on_replica_set(&self, old: Option<&Arc<ReplicaSet>>, new: Option<&Arc<ReplicaSet>>) {
        match (old, new) {
            (None, Some(rs)) => {
                if rs.metadata.deletion_timestamp.is_some() {
                    // Already being deleted (seen first after a restart): as a deletion.
                    return self.on_replica_set(Some(rs), None);
                }
                let ns = rs.namespace().unwrap_or_default();
                match controller_ref(rs.as_ref()) {
                    Some(r) => {
                        if let Some(d) = self.resolve(&ns, r) {
                            self.enqueue(&d);
                        }
                    }
                    None => {
                        for d in self.deployments_for_orphan(rs) {
                            self.enqueue(&d);
                        }
                    }
                }
            }
            (Some(old), Some(cur)) => {
                if old.metadata.resource_version == cur.metadata.resource_version {
                    return;
                }
                let ns = cur.namespace().unwrap_or_default();
                let cur_ref = controller_ref(cur.as_ref());
                let old_ref = controller_ref(old.as_ref());
                let ref_changed = cur_ref != old_ref;
                if ref_changed {
                    if let Some(d) = old_ref.and_then(|r| self.resolve(&ns, r)) {
                        self.enqueue(&d);
                    }
                }
                if let Some(r) = cur_ref {
                    if let Some(d) = self.resolve(&ns, r) {
                        self.enqueue(&d);
                    }
                    return;
                }
                if ref_changed || old.metadata.labels != cur.metadata.labels {
                    for d in self.deployments_for_orphan(cur) {
                        self.enqueue(&d);
                    }
                }
            }
            (Some(rs), None) => {
                let ns = rs.namespace().unwrap_or_default();
                if let Some(d) = controller_ref(rs.as_ref()).and_then(|r| self.resolve(&ns, r)) {
                    self.enqueue(&d);
                }
            }
            (None, None) => {}
        }
    }

    /// `deletePod`: a Recreate Deployment is synced when its last Pod is gone (it waits for that
    /// before creating the new ReplicaSet's Pods). Upstream lists the ReplicaSets from the API
    /// server here; the cache answers the same question without a request.
    fn on_pod_deleted(&self, pod: &CachedPod) {
        let ns = pod.namespace().unwrap_or_default();
        let Some(r) = controller_ref(pod).filter(|r| r.kind == "ReplicaSet") else {
            return;
        };
        let Some(rs) = self
            .replica_sets
            .get(&ns, &r.name)
            .filter(|rs| rs.metadata.uid.as_deref() == Some(r.uid.as_str()))
        else {
            return;
        };
        let Some(d) = controller_ref(rs.as_ref()).and_then(|r| self.resolve(&ns, r)) else {
            return;
        };
        if util::strategy_type(&d) != "Recreate" {
            return;
        }
        let Ok(selector) = selector_of(&d) else {
            return;
        };
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let owned: Vec<Arc<ReplicaSet>> = self
            .replica_sets
            .index(CONTROLLER_UID, &uid)
            .into_iter()
            .filter(|rs| selector.matches(rs.metadata.labels.as_ref()))
            .collect();
        if self
            .pod_map(&d, &selector, &owned)
            .values()
            .all(Vec::is_empty)
        {
            self.enqueue(&d);
        }
    }

    // --- sync (DEP-3) -------------------------------------------------------------------------

    /// One sync, with upstream's error policy: a namespace being deleted is not retried, and a
    /// key that failed `MAX_RETRIES` times in a row is dropped until its next event.
    async fn sync_handled(&self, key: String) -> Result<()> {
        match self.sync(&key).await {
            Ok(()) => Ok(()),
            Err(e) if namespace_terminating(&e) => Ok(()),
            Err(e) if self.queue.num_requeues(&key) >= MAX_RETRIES => {
                tracing::warn!(deployment = %key, "dropping deployment out of the queue: {e}");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `syncDeployment`.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let cached = self.deployments.get(ns, name);
        let Some(d) = self.written_d.fresh(ns, name, cached) else {
            // Deleted: the garbage collector removes its ReplicaSets (DEP-17).
            return Ok(());
        };
        if let Some(plan) = plan::selecting_all(&d) {
            return self.apply(key, &d, plan).await;
        }
        let selector = selector_of(&d)?;
        let rss = self.claim_replica_sets(&d, &selector).await?;
        let pods = self.pod_map(&d, &selector, &rss);
        let plan = {
            let lookup = |rs_name: &str| {
                let cached = self.replica_sets.get(ns, rs_name);
                self.written_rs.fresh(ns, rs_name, cached)
            };
            plan::plan(&plan::Input {
                deployment: &d,
                replica_sets: &rss,
                pods: &pods,
                replica_set_named: &lookup,
                now: Timestamp::now(),
            })
        };
        self.apply(key, &d, plan).await
    }

    /// `getReplicaSetsForDeployment`: the ReplicaSets the Deployment controls after adopting
    /// matching orphans and releasing its own that no longer match (CTL-7). Only the namespace's
    /// orphans and the Deployment's own ReplicaSets are candidates: the claim never touches
    /// others, so reading them would change nothing.
    async fn claim_replica_sets(
        &self,
        d: &Arc<Deployment>,
        selector: &Selector,
    ) -> Result<Vec<Arc<ReplicaSet>>> {
        let ns = d.namespace().unwrap_or_default();
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let mut candidates: Vec<Arc<ReplicaSet>> = self
            .replica_sets
            .index(CONTROLLER_UID, &uid)
            .into_iter()
            .chain(self.replica_sets.index(ORPHAN_NAMESPACE, &ns))
            .filter_map(|rs| {
                let name = rs.name_any();
                self.written_rs.fresh(&ns, &name, Some(rs))
            })
            .collect();
        candidates.extend(self.written_rs.created(
            &ns,
            |name| self.replica_sets.get(&ns, name).is_some(),
            |rs| util::controlled_by(rs, &uid),
        ));
        let deleting = d.metadata.deletion_timestamp.is_some();
        let plan = claim_plan(&uid, selector, deleting, candidates);
        if plan.adopt.is_empty() && plan.release.is_empty() {
            return Ok(plan.owned);
        }
        let owner = OwnerInfo::of(d.as_ref());
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let d_api: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
        let name = d.name_any();
        let recheck_for = owner.clone();
        claim::claim(&api, &owner, plan, || async move {
            match d_api.get_opt(&name).await {
                Ok(fresh) => recheck_owner(&recheck_for, fresh.as_ref()),
                Err(e) => Err(Error::kube(
                    "re-reading",
                    format!("Deployment {ns}/{name}"),
                    e,
                )),
            }
        })
        .await
    }

    /// `getPodMapForDeployment`: the Deployment's Pods (by its selector) grouped by the uid of
    /// the claimed ReplicaSet controlling them; every ReplicaSet has an entry.
    fn pod_map(
        &self,
        d: &Deployment,
        selector: &Selector,
        rss: &[Arc<ReplicaSet>],
    ) -> HashMap<String, Vec<Arc<CachedPod>>> {
        let ns = d.namespace();
        rss.iter()
            .filter_map(|rs| rs.metadata.uid.clone())
            .map(|uid| {
                let pods = self
                    .pods
                    .index(CONTROLLER_UID, &uid)
                    .into_iter()
                    .filter(|p| p.namespace() == ns && selector.matches(p.metadata.labels.as_ref()))
                    .collect();
                (uid, pods)
            })
            .collect()
    }

    // --- apply --------------------------------------------------------------------------------

    /// Executes a plan's actions in order, stopping at the first failure (the key is retried),
    /// then schedules the progress-deadline check.
    async fn apply(&self, key: &str, d: &Deployment, plan: plan::Plan) -> Result<()> {
        let mut run = Apply {
            ctl: self,
            d_ref: d.object_ref(&()),
            ns: d.namespace().unwrap_or_default(),
            rs_api: Api::namespaced(self.client.clone(), &d.namespace().unwrap_or_default()),
            d_api: Api::namespaced(self.client.clone(), &d.namespace().unwrap_or_default()),
            latest_rs: HashMap::new(),
            d_rv: None,
        };
        for action in plan.actions {
            run.action(action).await?;
        }
        if let Some(e) = plan.error {
            return Err(Error::Invalid {
                object: object(d),
                reason: e,
            });
        }
        match plan.requeue {
            Some(Requeue::After(after)) => self.queue.add_after(key.to_string(), after),
            Some(Requeue::RateLimited) => self.queue.add_rate_limited(key.to_string()),
            None => {}
        }
        Ok(())
    }
}

/// The state of one plan's execution: each object is written with the resourceVersion its
/// previous write in this sync returned.
struct Apply<'a> {
    ctl: &'a Controller,
    d_ref: k8s_openapi::api::core::v1::ObjectReference,
    ns: String,
    rs_api: Api<ReplicaSet>,
    d_api: Api<Deployment>,
    latest_rs: HashMap<String, ReplicaSet>,
    d_rv: Option<String>,
}

impl Apply<'_> {
    async fn action(&mut self, action: Action) -> Result<()> {
        let pp = PostParams::default();
        match action {
            Action::CreateReplicaSet { rs, deployment } => {
                let name = rs.name_any();
                match self.rs_api.create(&pp, &rs).await {
                    Ok(created) => {
                        self.ctl.written_rs.record(None, created.clone());
                        self.latest_rs.insert(name, created);
                    }
                    Err(e) => {
                        let object = format!("ReplicaSet {}/{name}", self.ns);
                        // AlreadyExists: the cache had not seen it yet; the next sync finds it
                        // there (as this Deployment's, or as a hash collision).
                        if !is_already_exists(&e) && !apierrors::namespace_terminating(&e) {
                            let mut d = *deployment;
                            self.with_d_rv(&mut d);
                            let msg = api_message(&e);
                            for a in plan::create_failed(&d, &name, &msg, Timestamp::now()) {
                                Box::pin(self.action(a)).await?;
                            }
                        }
                        return Err(Error::kube("creating", object, e));
                    }
                }
            }
            Action::UpdateReplicaSet(rs) => {
                let mut rs = *rs;
                let name = rs.name_any();
                if let Some(latest) = self.latest_rs.get(&name) {
                    rs.metadata.resource_version = latest.metadata.resource_version.clone();
                    rs.metadata.uid = latest.metadata.uid.clone();
                    rs.metadata.creation_timestamp = latest.metadata.creation_timestamp.clone();
                }
                match self.rs_api.replace(&name, &pp, &rs).await {
                    Ok(updated) => {
                        let sent = rs.metadata.resource_version.clone();
                        self.ctl.written_rs.record(sent, updated.clone());
                        self.latest_rs.insert(name, updated);
                    }
                    Err(e) => {
                        return Err(Error::kube(
                            "updating",
                            format!("ReplicaSet {}/{name}", self.ns),
                            e,
                        ))
                    }
                }
            }
            Action::DeleteReplicaSet { name } => {
                if let Err(e) = self.rs_api.delete(&name, &DeleteParams::default()).await {
                    if !is_not_found(&e) {
                        return Err(Error::kube(
                            "deleting",
                            format!("ReplicaSet {}/{name}", self.ns),
                            e,
                        ));
                    }
                }
            }
            Action::UpdateStatus {
                deployment,
                best_effort,
            } => {
                let mut d = *deployment;
                self.with_d_rv(&mut d);
                let name = d.name_any();
                match self.d_api.replace_status(&name, &pp, &d).await {
                    Ok(updated) => self.wrote_deployment(&d, updated),
                    Err(e) if best_effort => {
                        tracing::debug!("updating status of {}: {e}", object(&d));
                    }
                    Err(e) => return Err(Error::kube("updating status of", object(&d), e)),
                }
            }
            Action::UpdateDeployment(deployment) => {
                let mut d = *deployment;
                self.with_d_rv(&mut d);
                let name = d.name_any();
                match self.d_api.replace(&name, &pp, &d).await {
                    Ok(updated) => self.wrote_deployment(&d, updated),
                    Err(e) => return Err(Error::kube("updating", object(&d), e)),
                }
            }
            Action::Event {
                warning,
                reason,
                message,
            } => self
                .ctl
                .events
                .publish(&self.d_ref, warning, reason, message),
        }
        Ok(())
    }

    fn wrote_deployment(&mut self, sent: &Deployment, updated: Deployment) {
        self.d_rv = updated.metadata.resource_version.clone();
        let sent_rv = sent.metadata.resource_version.clone();
        self.ctl.written_d.record(sent_rv, updated);
    }

    fn with_d_rv(&self, d: &mut Deployment) {
        if let Some(rv) = &self.d_rv {
            d.metadata.resource_version = Some(rv.clone());
        }
    }
}

#[cfg(test)]
#[path = "handler_tests.rs"]
mod tests;
