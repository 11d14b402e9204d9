//! The DaemonSet controller (kube-controller-manager v1.34's `daemonset` controller, DS-1..DS-9):
//! one Pod per eligible node, placed by the default scheduler through a required node affinity on
//! the node's name, replaced by RollingUpdate (maxUnavailable or maxSurge) or OnDelete, with the
//! DaemonSet's templates kept as ControllerRevisions.
//!
//! Owns: creating and deleting the Pods a DaemonSet controls, adopting matching orphan Pods and
//! ControllerRevisions and releasing owned ones that no longer match, creating, relabelling,
//! renumbering and deleting the DaemonSet's ControllerRevisions, and the DaemonSet status
//! subresource (counts, observedGeneration, collisionCount). Must not touch: Nodes, Pods or
//! revisions controlled by anything else, a DaemonSet's spec or metadata, or anything of a
//! DaemonSet being deleted (the garbage collector removes its Pods and revisions, DS-8).
//!
//! Runs on the shared runtime (DS-2): the DaemonSet, ControllerRevision, Pod and Node informers
//! with upstream's handlers; one work queue `daemonset` and one `daemonset-node-updates` (a Node
//! added, or with changed labels or taints, queues the DaemonSets whose eligibility on it changed),
//! `--concurrent-daemonset-syncs` workers each (2). A sync (DS-3) constructs the history, then,
//! once the expectations of earlier syncs are met, plans with [`plan`] over the caches and applies
//! (`manage`: creations in slow-start batches, concurrent deletions; then the rolling update;
//! then history cleanup), and finally writes the status. Failed daemon Pods are deleted with a
//! per-node exponential backoff (1 s doubling to 15 min, as upstream).
//!
//! Events, as upstream records them on the DaemonSet (source `daemonset-controller`):
//! SuccessfulCreate / FailedCreate / SuccessfulDelete / FailedDelete per Pod (recorded by
//! [`crate::runtime::pod_control`], upstream's `RealPodControl`, which also keeps the
//! expectations),
//! FailedDaemonPod and SucceededDaemonPod for terminated daemon Pods, SelectingAll for an empty
//! selector.
//!
//! Differences from kube-controller-manager (docs/WORKLOADS.md): the revision hash is computed
//! over the template's JSON, not Go's in-memory dump of it, so revision names differ for the
//! same template (a revision written by either controller is still recognised by the other's
//! template comparison here); nodes are visited in name order where upstream iterates a Go map;
//! a deleted Node queues the DaemonSets that had Pods for it (upstream waits for the Pod GC).

pub mod plan;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use crate::helpers::meta::ObjectName as _;
use crate::runtime::apierrors::is_already_exists;
use crate::runtime::cache::Indexed;
use crate::runtime::claim::{self, OwnerInfo, ORPHAN_NAMESPACE};
use crate::runtime::events::Recorder;
use crate::runtime::informer::{self, EventHandlers, Informers, CONTROLLER_UID, NAMESPACE};
use crate::runtime::pod_control::{Deleted, Owner, PodControl};
use crate::runtime::pods;
use crate::runtime::queue::{WorkQueue, STATUS_COALESCE};
use crate::runtime::workers::{
    run_key_workers, run_workers_of, wait_for_caches, BurstConfig, SyncKey,
};

use crate::runtime::cached_pod::CachedPod;
use plan::{Clock, Eligibility, FailedPodsBackoff, NodeChanges};

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "daemonset";
/// The node-update queue's name, as upstream.
pub const NODE_QUEUE_NAME: &str = "daemonset-node-updates";

/// The events' source component, as upstream names it.
pub const COMPONENT: &str = "daemonset-controller";

/// Pod cache index: key = the node a Pod controlled by a DaemonSet is for ([`plan::target_node_name`]:
/// its nodeName, or the node of its `metadata.name` affinity while pending).
pub const DAEMON_POD_NODE: &str = "daemonset-pod-node";

/// How often the failed-Pod backoff forgets stale entries (upstream's `BackoffGCInterval`).
const BACKOFF_GC_INTERVAL: Duration = Duration::from_secs(60);

/// The DaemonSet controller's settings: concurrent syncs (`--concurrent-daemonset-syncs`,
/// default 2), and as many node-update workers; creations or deletions per sync (upstream's
/// `BurstReplicas`, 250).
pub type Config = BurstConfig<2, { plan::BURST_REPLICAS }>;

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    daemon_sets: Arc<Indexed<DaemonSet>>,
    revisions: Arc<Indexed<ControllerRevision>>,
    pods: Arc<Indexed<CachedPod>>,
    nodes: Arc<Indexed<Node>>,
    queue: Arc<WorkQueue<String>>,
    node_queue: Arc<WorkQueue<String>>,
    /// Creates and deletes the daemon Pods; holds the expectations.
    pod_control: PodControl,
    backoff: Mutex<FailedPodsBackoff>,
    events: Recorder,
}

use crate::helpers::meta::controller_of_object as controller_of;

fn daemon_pod_node(p: &CachedPod) -> Vec<String> {
    if controller_of(p).is_none_or(|r| r.kind != "DaemonSet") {
        return Vec::new();
    }
    plan::target_node_name(p).into_iter().collect()
}

/// `pods` (the cache's) with this controller's creations the cache does not show yet, in name
/// order.
fn with_unseen(pods: &mut Vec<Arc<CachedPod>>, unseen: Vec<Arc<CachedPod>>) {
    let known: HashSet<String> = pods.iter().map(|p| p.name_any()).collect();
    pods.extend(
        unseen
            .into_iter()
            .filter(|p| !known.contains(&p.name_any())),
    );
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
}

fn node_name(n: &Node) -> &str {
    n.metadata.name.as_deref().unwrap_or_default()
}

impl Controller {
    /// Registers the controller's indexes and handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let ds_informer = informers.get::<DaemonSet>();
        let cr_informer = informers.get::<ControllerRevision>();
        let pod_informer = informers.get::<CachedPod>();
        let node_informer = informers.get::<Node>();
        claim::add_orphan_index(&pod_informer);
        pod_informer.add_index(DAEMON_POD_NODE, daemon_pod_node);
        let events = Recorder::new(client.clone(), COMPONENT);
        let this = Arc::new(Controller {
            pod_control: PodControl::new(client.clone(), events.clone()).reading_own_creations(),
            events,
            client,
            config,
            daemon_sets: ds_informer.cache(),
            revisions: cr_informer.cache(),
            pods: pod_informer.cache(),
            nodes: node_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            node_queue: WorkQueue::new(NODE_QUEUE_NAME),
            backoff: Mutex::new(FailedPodsBackoff::new(
                plan::FAILED_POD_BACKOFF_INITIAL,
                plan::FAILED_POD_BACKOFF_MAX,
            )),
        });
        ds_informer.on_change_of(&this, Controller::on_daemon_set);
        cr_informer.on_change_of(&this, Controller::on_revision);
        pod_informer.on_events_of(
            &this,
            EventHandlers {
                added: Controller::pod_added,
                updated: Controller::pod_updated,
                deleted: Controller::pod_deleted,
            },
        );
        node_informer.on_change_of(&this, Controller::on_node);
        this
    }

    /// Waits for the caches, then runs the DaemonSet and node-update workers until the queues
    /// shut down.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(
            "daemonset",
            &[
                &*self.pods,
                &*self.nodes,
                &*self.revisions,
                &*self.daemon_sets,
            ],
        )
        .await;
        tracing::info!(
            workers = self.config.workers,
            "daemonset controller started"
        );
        let syncs = run_key_workers(&self, &self.queue, self.config.workers);
        let node_syncs = run_workers_of(
            &self,
            &self.node_queue,
            self.config.workers,
            |this, node: String| async move {
                this.sync_node_update(&node);
                Ok(())
            },
        );
        let weak = Arc::downgrade(&self);
        let gc = async move {
            loop {
                tokio::time::sleep(BACKOFF_GC_INTERVAL).await;
                let Some(this) = weak.upgrade() else { return };
                this.backoff
                    .lock()
                    .expect("backoff lock")
                    .gc(std::time::Instant::now());
            }
        };
        tokio::select! {
            _ = futures::future::join(syncs, node_syncs) => {}
            _ = gc => {}
        }
    }

    /// Stops the workers (the queues stop handing out keys).
    pub fn shut_down(&self) {
        self.queue.shut_down();
        self.node_queue.shut_down();
    }

    // ---- handlers ----

    fn enqueue(&self, ds: &DaemonSet) {
        self.queue.add(informer::key_of(ds));
    }

    fn on_daemon_set(&self, old: Option<&Arc<DaemonSet>>, new: Option<&Arc<DaemonSet>>) {
        match (old, new) {
            (_, Some(cur)) => {
                if let Some(old) = old {
                    if old.metadata.uid != cur.metadata.uid {
                        self.daemon_set_deleted(old);
                    }
                }
                self.enqueue(cur);
            }
            (Some(gone), None) => self.daemon_set_deleted(gone),
            (None, None) => {}
        }
    }

    fn daemon_set_deleted(&self, ds: &DaemonSet) {
        let key = informer::key_of(ds);
        self.pod_control.forget(&key);
        self.queue.add(key);
    }

    fn resolve(&self, ns: &str, r: &OwnerReference) -> Option<Arc<DaemonSet>> {
        claim::resolve_controller_ref(&self.daemon_sets, ns, r)
    }

    /// The DaemonSets of the namespace whose non-empty selector matches `labels`
    /// (`GetPodDaemonSets`, `GetHistoryDaemonSets`).
    fn selecting(
        &self,
        ns: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Vec<Arc<DaemonSet>> {
        let found: Vec<_> = self
            .daemon_sets
            .index(NAMESPACE, ns)
            .into_iter()
            .filter(|ds| plan::selector(ds).is_ok_and(|s| !s.is_everything() && s.matches(labels)))
            .collect();
        if found.len() > 1 {
            tracing::warn!(
                namespace = ns,
                ?labels,
                "more than one DaemonSet selects these labels"
            );
        }
        found
    }

    fn on_revision(
        &self,
        old: Option<&Arc<ControllerRevision>>,
        new: Option<&Arc<ControllerRevision>>,
    ) {
        match (old, new) {
            (None, Some(cr)) => {
                let ns = cr.namespace().unwrap_or_default();
                if cr.metadata.deletion_timestamp.is_some() {
                    self.revision_deleted(cr);
                } else if controller_of(cr.as_ref()).is_none() {
                    for ds in self.selecting(&ns, cr.metadata.labels.as_ref()) {
                        self.enqueue(&ds);
                    }
                }
            }
            (Some(old), Some(cur)) => {
                if old.metadata.resource_version == cur.metadata.resource_version {
                    return;
                }
                let ns = cur.namespace().unwrap_or_default();
                let (cur_ref, old_ref) = (controller_of(cur.as_ref()), controller_of(old.as_ref()));
                let ref_changed = cur_ref != old_ref;
                if ref_changed {
                    if let Some(ds) = old_ref.and_then(|r| self.resolve(&ns, r)) {
                        self.enqueue(&ds);
                    }
                }
                if let Some(r) = cur_ref {
                    if let Some(ds) = self.resolve(&ns, r) {
                        self.enqueue(&ds);
                    }
                    return;
                }
                if ref_changed || old.metadata.labels != cur.metadata.labels {
                    for ds in self.selecting(&ns, cur.metadata.labels.as_ref()) {
                        self.enqueue(&ds);
                    }
                }
            }
            (Some(gone), None) => self.revision_deleted(gone),
            (None, None) => {}
        }
    }

    fn revision_deleted(&self, cr: &ControllerRevision) {
        let ns = cr.namespace().unwrap_or_default();
        if let Some(ds) = controller_of(cr).and_then(|r| self.resolve(&ns, r)) {
            self.enqueue(&ds);
        }
    }

    fn pod_added(&self, pod: &CachedPod) {
        // Through the pod control: a creation its answer observed is not counted again.
        if !claim::pod_added(&self.daemon_sets, &self.pod_control, &self.queue, pod) {
            return;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        for ds in self.selecting(ns, pod.metadata.labels.as_ref()) {
            self.enqueue(&ds);
        }
    }

    fn pod_updated(&self, old: &CachedPod, cur: &CachedPod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            return;
        }
        if cur.metadata.deletion_timestamp.is_some() {
            self.pod_deleted(cur);
            return;
        }
        let ns = cur.metadata.namespace.as_deref().unwrap_or_default();
        let (cur_ref, old_ref) = (controller_of(cur), controller_of(old));
        let ref_changed = cur_ref != old_ref;
        if ref_changed {
            if let Some(ds) = old_ref.and_then(|r| self.resolve(ns, r)) {
                self.enqueue(&ds);
            }
        }
        if let Some(r) = cur_ref {
            if let Some(ds) = self.resolve(ns, r) {
                let labels_changed = old.metadata.labels != cur.metadata.labels;
                if ref_changed
                    || labels_changed
                    || pods::is_pod_active(old) != pods::is_pod_active(cur)
                {
                    self.enqueue(&ds);
                } else {
                    // Only the status counts move (bound, Running, Ready): one sync, and one
                    // status write, for the Pods that change together.
                    self.queue
                        .add_coalesced(informer::key_of(ds.as_ref()), STATUS_COALESCE);
                }
                let min_ready = plan::min_ready_seconds(&ds);
                if let Some(after) = pods::available_after(old, cur, min_ready) {
                    let after = after + Duration::from_secs(1);
                    self.queue.add_after(informer::key_of(ds.as_ref()), after);
                }
            }
            return;
        }
        if ref_changed || old.metadata.labels != cur.metadata.labels {
            for ds in self.selecting(ns, cur.metadata.labels.as_ref()) {
                self.enqueue(&ds);
            }
        }
    }

    fn pod_deleted(&self, pod: &CachedPod) {
        // Through the pod control: it keeps the creations the watch has not shown yet.
        claim::pod_deleted(&self.daemon_sets, &self.pod_control, &self.queue, pod);
    }

    fn on_node(&self, old: Option<&Arc<Node>>, new: Option<&Arc<Node>>) {
        match (old, new) {
            (None, Some(n)) => self.node_queue.add(node_name(n).to_string()),
            (Some(o), Some(n)) => {
                if plan::node_change_matters(o, n) {
                    self.node_queue.add(node_name(n).to_string());
                }
            }
            // Upstream has no Node deletion handler and waits for the Pod GC to remove the
            // node's Pods; queueing the DaemonSets with Pods for it updates their status now.
            (Some(gone), None) => {
                for p in self.pods.index(DAEMON_POD_NODE, node_name(gone)) {
                    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                    if let Some(ds) = controller_of(p.as_ref()).and_then(|r| self.resolve(ns, r)) {
                        self.enqueue(&ds);
                    }
                }
            }
            (None, None) => {}
        }
    }

    /// `syncNodeUpdate`: queues every DaemonSet that should now get a Pod on the node and has
    /// none there, should no longer keep its Pod there, or has one there while it counts
    /// misscheduled Pods (the count may have to fall).
    fn sync_node_update(&self, name: &str) {
        let Some(node) = self.nodes.get("", name) else {
            return;
        };
        let mut scheduled: HashSet<(String, String)> = HashSet::new();
        for p in self.pods.index(DAEMON_POD_NODE, name) {
            let bound = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name);
            if let (true, Some(r)) = (bound, controller_of(p.as_ref())) {
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                scheduled.insert((ns, r.name.clone()));
            }
        }
        for ds in self.daemon_sets.all() {
            let has = scheduled.contains(&(ds.namespace().unwrap_or_default(), ds.name_any()));
            if plan::node_update_needs_sync(&ds, &Eligibility::of(&ds), &node, has) {
                self.enqueue(&ds);
            }
        }
    }

    // ---- sync ----

    /// The nodes in name order.
    fn node_list(&self) -> Vec<Arc<Node>> {
        let mut nodes = self.nodes.all();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        nodes
    }
}

impl SyncKey for Controller {
    /// One sync of the DaemonSet `key` (DS-3).
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let Some(ds) = self.daemon_sets.get(ns, name) else {
            self.pod_control.forget(key);
            return Ok(());
        };
        let nodes = self.node_list();
        if plan::selects_everything(&ds) {
            self.events.publish(
                &ds.object_ref(&()),
                true,
                plan::SELECTING_ALL,
                "This daemon set is selecting all pods. A non-empty selector is required.".into(),
            );
            return Ok(());
        }
        // The Pods and revisions of a DaemonSet being deleted may already be gone or orphaned:
        // no status can be computed reliably, and nothing is acted on (DS-8).
        if ds.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let selector = match plan::selector(&ds) {
            Ok(s) => s,
            Err(e) => {
                // Nothing can be done until the DaemonSet changes.
                tracing::error!("{e}");
                return Ok(());
            }
        };
        let (current, old) = self.construct_history(&ds, &selector).await?;
        let hash = plan::revision_hash_label(&current);
        let eligibility = Eligibility::of(&ds);
        // Asked before the Pods are read, as upstream does: expectations met now mean every Pod
        // this DaemonSet created is already in the cache; asked after, they could have been met
        // by Pods that arrived after the read, and manage would create them a second time.
        let satisfied = self.pod_control.expectations().satisfied(key);
        // This controller's creations the watch has not shown yet, read before the cache
        // (runtime::unseen_creations): with them, the plan sees every Pod it made.
        let unseen = self.pod_control.unseen_creations(key);
        let mut claimed = self.claim_pods(&ds, &selector).await?;
        with_unseen(&mut claimed, unseen);

        if !satisfied {
            // Only the status; observedGeneration stays, this generation was not acted on.
            let pods = self.daemon_pods(&ds, &selector, &claimed);
            return self
                .update_status(&ds, &eligibility, &nodes, &pods, &hash, false)
                .await;
        }
        let result = self
            .update_daemon_set(
                &ds,
                &selector,
                &eligibility,
                &nodes,
                &claimed,
                &hash,
                key,
                &old,
            )
            .await;
        let pods = self.daemon_pods(&ds, &selector, &claimed);
        let status = self
            .update_status(&ds, &eligibility, &nodes, &pods, &hash, true)
            .await;
        match (result, status) {
            (Err(e), Err(s)) => {
                tracing::error!(ds = %ds.object_name(), "updating status: {s}");
                Err(e)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
            _ => Ok(()),
        }
    }
}

impl Controller {
    /// `manage`, then the rolling update when the strategy is RollingUpdate and manage's own
    /// creations and deletions are observed, then history cleanup.
    #[allow(clippy::too_many_arguments)]
    async fn update_daemon_set(
        &self,
        ds: &DaemonSet,
        selector: &crate::helpers::selector::Selector,
        eligibility: &Eligibility,
        nodes: &[Arc<Node>],
        claimed: &[Arc<CachedPod>],
        hash: &str,
        key: &str,
        old: &[Arc<ControllerRevision>],
    ) -> Result<()> {
        let node_pods = plan::nodes_to_daemon_pods(claimed, false);
        let changes = {
            let mut backoff = self.backoff.lock().expect("backoff lock");
            plan::manage(
                ds,
                eligibility,
                nodes,
                &node_pods,
                hash,
                &mut backoff,
                Clock::now(),
            )
        };
        self.sync_nodes(ds, key, changes, hash).await?;

        if self.pod_control.expectations().satisfied(key)
            && plan::strategy_type(ds) == "RollingUpdate"
        {
            let pods = self.daemon_pods(ds, selector, claimed);
            let node_pods = plan::nodes_to_daemon_pods(&pods, false);
            let changes = plan::rolling_update(
                ds,
                eligibility,
                nodes,
                node_pods,
                hash,
                k8s_openapi::jiff::Timestamp::now(),
            )?;
            self.sync_nodes(ds, key, changes, hash).await?;
        }

        let pods = self.daemon_pods(ds, selector, claimed);
        let ns = ds.namespace().unwrap_or_default();
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        for name in plan::histories_to_delete(ds, old, &pods) {
            if let Some(cr) = old.iter().find(|c| c.name_any() == name) {
                crate::runtime::history::delete(&api, cr).await?;
            }
        }
        Ok(())
    }

    /// `getDaemonPods`: the DaemonSet's Pods and the orphans its selector matches, claimed (CTL-7).
    async fn claim_pods(
        &self,
        ds: &Arc<DaemonSet>,
        selector: &crate::helpers::selector::Selector,
    ) -> Result<Vec<Arc<CachedPod>>> {
        let ns = ds.namespace().unwrap_or_default();
        let uid = ds.uid().unwrap_or_default();
        let mut candidates = self.pods.index(CONTROLLER_UID, &uid);
        candidates.extend(self.pods.index(ORPHAN_NAMESPACE, &ns));
        let plan = claim::claim_plan(&uid, selector, false, candidates);
        let owner = OwnerInfo::of(ds.as_ref());
        let ds_api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &ns);
        let pod_api: Api<CachedPod> = Api::namespaced(self.client.clone(), &ns);
        let recheck = || claim::reread_owner(&ds_api, &owner, ds.object_name());
        let mut claimed = claim::claim(&pod_api, &owner, plan, recheck).await?;
        claimed.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(claimed)
    }

    /// The DaemonSet's Pods as the cache has them now (after this sync's own changes were
    /// possibly observed), plus those this sync adopted and the cache does not show as ours yet.
    fn daemon_pods(
        &self,
        ds: &DaemonSet,
        selector: &crate::helpers::selector::Selector,
        claimed: &[Arc<CachedPod>],
    ) -> Vec<Arc<CachedPod>> {
        let uid = ds.uid().unwrap_or_default();
        let unseen = self.pod_control.unseen_creations(&informer::key_of(ds));
        let mut pods: Vec<Arc<CachedPod>> = self
            .pods
            .index(CONTROLLER_UID, &uid)
            .into_iter()
            .filter(|p| selector.matches(p.metadata.labels.as_ref()))
            .collect();
        let known: HashSet<String> = pods.iter().map(|p| p.name_any()).collect();
        pods.extend(
            claimed
                .iter()
                .filter(|p| !known.contains(&p.name_any()))
                .filter(|p| {
                    self.pods
                        .get(&p.namespace().unwrap_or_default(), &p.name_any())
                        .is_some()
                })
                .cloned(),
        );
        with_unseen(&mut pods, unseen);
        pods
    }

    /// `syncNodes` (DS-5): records the plan's events, expects the creations and deletions, creates
    /// Pods on `create_on` in slow-start batches and deletes `delete` concurrently, at most
    /// `burst_replicas` of each; the first error is returned after all were tried.
    async fn sync_nodes(
        &self,
        ds: &DaemonSet,
        key: &str,
        changes: NodeChanges,
        hash: &str,
    ) -> Result<()> {
        let ds_ref = ds.object_ref(&());
        for e in changes.events {
            self.events.publish(&ds_ref, e.warning, e.reason, e.message);
        }
        if let Some(after) = changes.requeue_after {
            self.queue.add_after(key.to_string(), after);
        }
        let burst = self.config.burst_replicas;
        let more = changes.create_on.len() > burst;
        let create_on: Vec<String> = changes.create_on.into_iter().take(burst).collect();
        let delete: Vec<String> = changes.delete.into_iter().take(burst).collect();
        if create_on.is_empty() && delete.is_empty() {
            return Ok(());
        }
        let owner = Owner {
            key: key.to_string(),
            ..Owner::of(ds, ds.object_name())
        };
        let delete_keys: Vec<String> = delete
            .iter()
            .map(|n| format!("{}/{n}", owner.namespace))
            .collect();
        self.pod_control.expect(key, create_on.len(), &delete_keys);
        let mut first_err: Option<Error> = None;

        if !create_on.is_empty() {
            tracing::debug!(ds = %owner.object, nodes = ?create_on, "creating daemon pods");
            let template =
                plan::create_pod_template(&plan::template(ds), plan::template_generation(ds), hash);
            let created = self
                .pod_control
                .create_pods(&owner, create_on.len(), |i| {
                    plan::new_daemon_pod(ds, &template, &create_on[i])
                })
                .await;
            first_err = created.error;
        }

        if !delete.is_empty() {
            tracing::debug!(ds = %owner.object, pods = ?delete, "deleting daemon pods");
            for d in self.pod_control.delete_pods(&owner, &delete).await {
                if let Deleted::Failed(e) = d {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => {
                // More to create than one burst: the next sync need not wait for the watch to
                // show this one's Pods (it reads them back), so it is queued now.
                if more {
                    self.queue.add(key.to_string());
                }
                Ok(())
            }
        }
    }

    /// `updateDaemonSetStatus`: writes the counts (and with `observed` the generation acted on)
    /// through the status subresource unless nothing changed, and looks again after
    /// minReadySeconds while ready Pods are not yet available.
    async fn update_status(
        &self,
        ds: &DaemonSet,
        eligibility: &Eligibility,
        nodes: &[Arc<Node>],
        pods: &[Arc<CachedPod>],
        hash: &str,
        observed: bool,
    ) -> Result<()> {
        let node_pods = plan::nodes_to_daemon_pods(pods, false);
        let status = plan::calculate_status(
            ds,
            eligibility,
            nodes,
            &node_pods,
            hash,
            k8s_openapi::jiff::Timestamp::now(),
        );
        if plan::needs_status_update(ds, &status, observed) {
            let mut patch_status = json!({
                "desiredNumberScheduled": status.desired_number_scheduled,
                "currentNumberScheduled": status.current_number_scheduled,
                "numberMisscheduled": status.number_misscheduled,
                "numberReady": status.number_ready,
                "updatedNumberScheduled": status.updated_number_scheduled,
                "numberAvailable": status.number_available,
                "numberUnavailable": status.number_unavailable,
            });
            if observed {
                patch_status["observedGeneration"] = json!(ds.metadata.generation.unwrap_or(0));
            }
            let patch = json!({"metadata": {"uid": ds.metadata.uid}, "status": patch_status});
            let api: Api<DaemonSet> =
                Api::namespaced(self.client.clone(), &ds.namespace().unwrap_or_default());
            api.patch_status(
                &ds.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| Error::kube("writing status of", ds.object_name(), e))?;
        }
        if let Some(after) = plan::status_requeue(ds, &status) {
            self.queue.add_after(informer::key_of(ds), after);
        }
        Ok(())
    }

    // ---- history ----

    /// `controlledHistories`: the namespace's revisions controlled by the DaemonSet or orphaned
    /// and matching its selector, claimed.
    async fn claim_revisions(
        &self,
        ds: &Arc<DaemonSet>,
        selector: &crate::helpers::selector::Selector,
    ) -> Result<Vec<Arc<ControllerRevision>>> {
        let ns = ds.namespace().unwrap_or_default();
        let uid = ds.uid().unwrap_or_default();
        let candidates = self.revisions.index(NAMESPACE, &ns);
        let plan = claim::claim_plan(&uid, selector, false, candidates);
        let owner = OwnerInfo::of(ds.as_ref());
        let ds_api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &ns);
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let recheck = || claim::reread_owner(&ds_api, &owner, ds.object_name());
        claim::claim(&api, &owner, plan, recheck).await
    }

    /// `constructHistory` (DS-3): the current revision (created, de-duplicated or renumbered as
    /// needed) and the old ones. Revisions without the hash label get their name as hash.
    async fn construct_history(
        &self,
        ds: &Arc<DaemonSet>,
        selector: &crate::helpers::selector::Selector,
    ) -> Result<(Arc<ControllerRevision>, Vec<Arc<ControllerRevision>>)> {
        let ns = ds.namespace().unwrap_or_default();
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let mut histories = Vec::new();
        for h in self.claim_revisions(ds, selector).await? {
            if h.labels().contains_key(plan::REVISION_HASH_LABEL) {
                histories.push(h);
                continue;
            }
            let patch = json!({"metadata": {"labels": {plan::REVISION_HASH_LABEL: h.name_any()}}});
            let updated = api
                .patch(
                    &h.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| {
                    Error::kube(
                        "labelling ControllerRevision",
                        format!("{ns}/{}", h.name_any()),
                        e,
                    )
                })?;
            histories.push(Arc::new(updated));
        }
        let (current, old) = plan::split_histories(ds, &histories);
        let next = plan::max_revision(&old) + 1;
        let current = match plan::dedup_keep(&current) {
            None => Arc::new(self.snapshot(ds, next).await?),
            Some(keep) => {
                if current.len() > 1 {
                    self.dedup(ds, selector, &keep, &current).await?;
                }
                if keep.revision < next {
                    crate::runtime::history::renumber(&api, &keep, next).await?;
                }
                keep
            }
        };
        Ok((current, old))
    }

    /// `dedupCurHistories`: relabels the Pods carrying another current revision's hash with the
    /// kept one's, then deletes the duplicates.
    async fn dedup(
        &self,
        ds: &Arc<DaemonSet>,
        selector: &crate::helpers::selector::Selector,
        keep: &Arc<ControllerRevision>,
        current: &[Arc<ControllerRevision>],
    ) -> Result<()> {
        let ns = ds.namespace().unwrap_or_default();
        let hash = plan::revision_hash_label(keep);
        let pod_api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        for p in self.claim_pods(ds, selector).await? {
            if p.labels().get(plan::REVISION_HASH_LABEL) == Some(&hash) {
                continue;
            }
            let patch = json!({"metadata": {"labels": {plan::REVISION_HASH_LABEL: hash}}});
            pod_api
                .patch(
                    &p.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| Error::kube("relabelling Pod", pods::pod_key(&p), e))?;
        }
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        for c in current.iter().filter(|c| c.name_any() != keep.name_any()) {
            crate::runtime::history::delete(&api, c).await?;
        }
        Ok(())
    }

    /// `snapshot`: creates the revision of the current template. A revision of that name with
    /// another template is a hash collision: the DaemonSet's collisionCount is raised (when the
    /// cached one was current) and the sync fails, so the next one uses a new name.
    async fn snapshot(&self, ds: &Arc<DaemonSet>, revision: i64) -> Result<ControllerRevision> {
        let ns = ds.namespace().unwrap_or_default();
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let hash = plan::revision_hash(ds);
        let cr = plan::new_revision(ds, &hash, revision);
        let name = cr.name_any();
        let err = match api.create(&PostParams::default(), &cr).await {
            Ok(created) => return Ok(created),
            Err(e) if is_already_exists(&e) => e,
            Err(e) => {
                return Err(Error::kube(
                    "creating ControllerRevision",
                    format!("{ns}/{name}"),
                    e,
                ))
            }
        };
        let existing = api
            .get(&name)
            .await
            .map_err(|e| Error::kube("reading ControllerRevision", format!("{ns}/{name}"), e))?;
        if plan::revision_matches(ds, &existing) {
            return Ok(existing);
        }
        let ds_api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &ns);
        let fresh = ds_api
            .get(&ds.name_any())
            .await
            .map_err(|e| Error::kube("reading", ds.object_name(), e))?;
        let count = |d: &DaemonSet| d.status.as_ref().and_then(|s| s.collision_count);
        if count(&fresh) != count(ds) {
            return Err(Error::Invalid {
                object: ds.object_name(),
                reason: format!(
                    "status.collisionCount: stale ({:?}, current {:?}); retrying once the cache has it",
                    count(ds),
                    count(&fresh)
                ),
            });
        }
        let bumped = count(&fresh).unwrap_or(0) + 1;
        let patch = json!({
            "metadata": {"uid": fresh.metadata.uid, "resourceVersion": fresh.metadata.resource_version},
            "status": {"collisionCount": bumped},
        });
        ds_api
            .patch_status(
                &ds.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| Error::kube("raising collisionCount of", ds.object_name(), e))?;
        tracing::info!(ds = %ds.object_name(), collision_count = bumped, "hash collision, collisionCount raised");
        Err(Error::kube(
            "creating ControllerRevision",
            format!("{ns}/{name}"),
            err,
        ))
    }
}

#[cfg(test)]
#[path = "handler_tests.rs"]
mod handler_tests;
