//! The taint eviction controller (kube-controller-manager v1.34's `taint-eviction-controller`,
//! `pkg/controller/tainteviction`): a Pod bound to a Node with NoExecute taints it does not
//! tolerate is deleted at once; one tolerating them all is deleted when the shortest
//! `tolerationSeconds` among the tolerations used runs out (never, when none has one); a taint
//! removed, a toleration added or the Pod deleted cancels the pending eviction. Before deleting,
//! the Pod gets the `DisruptionTarget` condition (reason `DeletionByTaintManager`), as v1.34 does.
//! Events, on the Pod, reason `TaintManagerEviction`: "Marking for deletion Pod ns/name" when
//! an eviction runs, "Cancelling deletion of Pod ns/name" when a waiting one is cancelled.
//!
//! Owns: deleting Pods for their Node's NoExecute taints (and that condition). Must not touch
//! anything else (the taints themselves are the node lifecycle controller's, or the user's).
//!
//! As upstream: Node changes (of their NoExecute taints) and Pod changes (of their tolerations or
//! Node) go to two work queues, `noexec_taint_node` and `noexec_taint_pod`, drained by
//! [`UPDATE_WORKERS`] workers each; a Node's and its Pods' items are handled under one of
//! [`UPDATE_WORKERS`] locks chosen by the Node's name, as upstream hands them to one worker
//! chosen by it, so a Pod's look and its Node's never interleave. Decisions are [`plan`]'s; the
//! timers are [`evictions`]'. Differs from upstream: a Pod item reads its Node's taints from the
//! Node cache, where upstream keeps a map of them written by its Node worker (the cache is at
//! least as new); a deletion stops retrying when the Pod is gone (upstream tries five times).

pub mod evictions;
pub mod plan;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Taint, Toleration};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::{node_index, CachedPod, NODE_INDEX};
use crate::runtime::events::Recorder;
use crate::runtime::informer::Informers;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_workers_of, wait_for_caches};

use evictions::Evictions;
use plan::Step;

/// The controller's name: its `--controllers` name, its Events' source and its logs'.
pub const NAME: &str = "taint-eviction-controller";

/// The Node queue's name, as upstream.
pub const NODE_QUEUE: &str = "noexec_taint_node";

/// The Pod queue's name, as upstream.
pub const POD_QUEUE: &str = "noexec_taint_pod";

/// Workers per queue and locks by Node name (upstream's `UpdateWorkerSize`; no flag sets it).
pub const UPDATE_WORKERS: usize = 8;

/// The Event reason of both of its Events.
pub const EVENT_REASON: &str = "TaintManagerEviction";

/// The condition it sets before deleting (`v1.DisruptionTarget`) and its reason and message.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const DISRUPTION_REASON: &str = "DeletionByTaintManager";
pub const DISRUPTION_MESSAGE: &str = "Taint manager: deleting due to NoExecute taint";

/// Tries of an eviction (upstream's `retries`), 10 ms apart.
const RETRIES: usize = 5;

fn tolerations_of(p: &CachedPod) -> &[Toleration] {
    p.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// The controller's settings.
#[derive(Clone, Default)]
pub struct Config {}

/// A Pod change to look at: the Pod and the Node it was on when queued.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodItem {
    pub namespace: String,
    pub name: String,
    pub node: String,
}

/// The running controller.
pub struct Controller {
    client: Client,
    recorder: Recorder,
    pods: Arc<Indexed<CachedPod>>,
    nodes: Arc<Indexed<Node>>,
    node_queue: Arc<WorkQueue<String>>,
    pod_queue: Arc<WorkQueue<PodItem>>,
    evictions: Arc<Evictions>,
    /// A Node's items and its Pods' are handled under the lock its name hashes to.
    shards: Vec<Mutex<()>>,
}

impl Controller {
    /// Registers the controller's handlers on the shared Pod and Node informers.
    pub fn new(client: Client, informers: &Informers, _config: Config) -> Arc<Controller> {
        let pod_informer = informers.get::<CachedPod>();
        pod_informer.add_index(NODE_INDEX, node_index);
        let node_informer = informers.get::<Node>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), NAME),
            client,
            pods: pod_informer.cache(),
            nodes: node_informer.cache(),
            node_queue: WorkQueue::new(NODE_QUEUE),
            pod_queue: WorkQueue::new(POD_QUEUE),
            evictions: Arc::default(),
            shards: (0..UPDATE_WORKERS).map(|_| Mutex::new(())).collect(),
        });
        pod_informer.on_change_of(&this, Self::pod_updated);
        node_informer.on_change_of(&this, Self::node_updated);
        this
    }

    /// `PodUpdated`: a Pod added or deleted, or its tolerations or Node changed.
    fn pod_updated(&self, old: Option<&Arc<CachedPod>>, new: Option<&Arc<CachedPod>>) {
        fn view(p: &Arc<CachedPod>) -> (&str, &[Toleration]) {
            (p.node_name().unwrap_or_default(), tolerations_of(p))
        }
        if !plan::pod_change_matters(old.map(view), new.map(view)) {
            return;
        }
        let Some(p) = new.or(old) else { return };
        self.pod_queue.add(PodItem {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            node: p.node_name().unwrap_or_default().to_string(),
        });
    }

    /// `NodeUpdated`: a Node added or deleted, or its NoExecute taints changed.
    fn node_updated(&self, old: Option<&Arc<Node>>, new: Option<&Arc<Node>>) {
        if !plan::node_change_matters(old.map(|n| &**n), new.map(|n| &**n)) {
            return;
        }
        if let Some(name) = new.or(old).and_then(|n| n.metadata.name.clone()) {
            self.node_queue.add(name);
        }
    }

    /// Waits for the caches, then runs the workers of both queues.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(NAME, &[&*self.pods, &*self.nodes]).await;
        tracing::info!(controller = NAME, "controller started");
        let nodes = run_workers_of(
            &self,
            &self.node_queue,
            UPDATE_WORKERS,
            |c, node| async move {
                c.handle_node(&node);
                Ok(())
            },
        );
        let pods = run_workers_of(
            &self,
            &self.pod_queue,
            UPDATE_WORKERS,
            |c, item| async move {
                c.handle_pod(&item);
                Ok(())
            },
        );
        futures::join!(nodes, pods);
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.node_queue.shut_down();
        self.pod_queue.shut_down();
    }

    /// Whether an eviction is pending for the Pod `namespace/name` (for tests).
    pub fn eviction_pending(&self, key: &str) -> bool {
        self.evictions.is_pending(key)
    }

    fn shard(&self, node: &str) -> std::sync::MutexGuard<'_, ()> {
        let mut h = DefaultHasher::new();
        node.hash(&mut h);
        let i = (h.finish() % self.shards.len() as u64) as usize;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The Node's NoExecute taints (none when the Node is gone).
    fn taints_of(&self, node: &str) -> Vec<Taint> {
        self.nodes
            .get("", node)
            .map(|n| plan::no_execute_taints(&n))
            .unwrap_or_default()
    }

    /// `handlePodUpdate`.
    fn handle_pod(self: &Arc<Self>, item: &PodItem) {
        let key = format!("{}/{}", item.namespace, item.name);
        let _shard = self.shard(&item.node);
        let Some(pod) = self.pods.get(&item.namespace, &item.name) else {
            self.cancel_with_event(&item.namespace, &item.name);
            return;
        };
        // Items are sharded by the Node they were queued with: an item for another Node than
        // the Pod's now is not this shard's to handle (the Pod's newer item is).
        let node = pod.node_name().unwrap_or_default();
        if node != item.node || node.is_empty() {
            return;
        }
        let taints = self.taints_of(node);
        // Untainted (or gone) Node: whatever was pending was cancelled when the taints went.
        if taints.is_empty() {
            return;
        }
        tracing::debug!(controller = NAME, pod = %key, node, "pod update");
        self.process_pod_on_node(
            &item.namespace,
            &item.name,
            tolerations_of(&pod),
            &taints,
            Instant::now(),
        );
    }

    /// `handleNodeUpdate`.
    fn handle_node(self: &Arc<Self>, node: &str) {
        let _shard = self.shard(node);
        let taints = self.taints_of(node);
        let pods = self.pods.index(NODE_INDEX, node);
        if pods.is_empty() {
            return;
        }
        if taints.is_empty() {
            tracing::debug!(
                controller = NAME,
                node,
                "no NoExecute taints: cancelling evictions"
            );
            for p in &pods {
                let (ns, name) = (p.metadata.namespace.as_deref(), p.metadata.name.as_deref());
                self.cancel_with_event(ns.unwrap_or_default(), name.unwrap_or_default());
            }
            return;
        }
        let now = Instant::now();
        for p in &pods {
            self.process_pod_on_node(
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default(),
                tolerations_of(p),
                &taints,
                now,
            );
        }
    }

    /// `processPodOnNode`: what the Pod's tolerations make of the taints, applied to its pending
    /// eviction.
    fn process_pod_on_node(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        tolerations: &[Toleration],
        taints: &[Taint],
        now: Instant,
    ) {
        let key = format!("{namespace}/{name}");
        let verdict = plan::verdict(taints, tolerations);
        match plan::step(verdict, self.evictions.waiting_since(&key), now) {
            Step::Keep => {}
            Step::Cancel => self.cancel_with_event(namespace, name),
            Step::EvictNow => {
                tracing::debug!(controller = NAME, pod = %key, "not every taint is tolerated");
                self.cancel_with_event(namespace, name);
                self.schedule(namespace, name, now, now);
            }
            Step::EvictAt {
                created_at,
                fire_at,
            } => {
                self.cancel_with_event(namespace, name);
                self.schedule(namespace, name, created_at, fire_at);
            }
        }
    }

    /// Cancels the Pod's waiting eviction, with the Event saying so (`cancelWorkWithEvent`).
    fn cancel_with_event(&self, namespace: &str, name: &str) {
        if self.evictions.cancel(&format!("{namespace}/{name}")) {
            self.recorder.publish(
                &pod_ref(namespace, name),
                false,
                EVENT_REASON,
                format!("Cancelling deletion of Pod {namespace}/{name}"),
            );
        }
    }

    fn schedule(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        created_at: Instant,
        fire_at: Instant,
    ) {
        let key = format!("{namespace}/{name}");
        let this = Arc::downgrade(self);
        let (ns, n, k) = (namespace.to_string(), name.to_string(), key.clone());
        self.evictions
            .add(&key, created_at, fire_at, move |id| async move {
                let Some(this) = this.upgrade() else { return };
                this.evict(&ns, &n).await;
                this.evictions.finish(&k, id);
            });
    }

    /// `deletePodHandler`: the Event, then the condition and the deletion, tried
    /// [`RETRIES`] times.
    async fn evict(&self, namespace: &str, name: &str) {
        tracing::info!(controller = NAME, pod = %format!("{namespace}/{name}"), "deleting pod");
        self.recorder.publish(
            &pod_ref(namespace, name),
            false,
            EVENT_REASON,
            format!("Marking for deletion Pod {namespace}/{name}"),
        );
        let mut last = None;
        for _ in 0..RETRIES {
            match self.add_condition_and_delete(namespace, name).await {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(e) = last {
            tracing::error!(controller = NAME, "timed worker failed: {e}");
        }
    }

    /// `addConditionAndDeletePod`: the Pod read afresh; the DisruptionTarget condition patched
    /// into its status (with its uid as a precondition) unless it is there already; then deleted.
    async fn add_condition_and_delete(&self, namespace: &str, name: &str) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let object = || format!("Pod {namespace}/{name}");
        let Some(pod) = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube("reading", object(), e))?
        else {
            return Ok(()); // Gone already: nothing to evict.
        };
        if let Some(condition) = disruption_condition(&pod, Timestamp::now()) {
            let patch = json!({
                "metadata": {"uid": pod.metadata.uid},
                "status": {"conditions": [condition]},
            });
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map_err(|e| Error::kube("patching the status of", object(), e))?;
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if apierrors::is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube("deleting", object(), e)),
        }
    }
}

/// The DisruptionTarget condition to write into `pod`'s status, `None` when it is there already
/// with the same status, reason and message (`UpdatePodCondition`: the transition time changes
/// only with the status).
pub fn disruption_condition(pod: &Pod, now: Timestamp) -> Option<serde_json::Value> {
    let existing = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == DISRUPTION_TARGET));
    let transition = match existing {
        Some(c)
            if c.status == "True"
                && c.reason.as_deref() == Some(DISRUPTION_REASON)
                && c.message.as_deref() == Some(DISRUPTION_MESSAGE) =>
        {
            return None
        }
        Some(c) if c.status == "True" => c.last_transition_time.as_ref().map_or(now, |t| t.0),
        _ => now,
    };
    Some(json!({
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": DISRUPTION_REASON,
        "message": DISRUPTION_MESSAGE,
        "lastTransitionTime": transition,
    }))
}

/// The Events' object: the Pod by namespace and name (upstream sets no uid).
fn pod_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_condition_is_written_once_and_keeps_its_transition_time() {
        let now: Timestamp = "2026-12-02T10:00:00Z".parse().unwrap();
        let pod = |conditions: serde_json::Value| -> Pod {
            serde_json::from_value(
                json!({"metadata": {"name": "p"}, "status": {"conditions": conditions}}),
            )
            .unwrap()
        };
        let fresh = disruption_condition(&pod(json!([])), now).unwrap();
        assert_eq!(fresh["reason"], DISRUPTION_REASON);
        assert_eq!(fresh["lastTransitionTime"], "2026-12-02T10:00:00Z");
        let ours = pod(json!([{"type": DISRUPTION_TARGET, "status": "True",
            "reason": DISRUPTION_REASON, "message": DISRUPTION_MESSAGE,
            "lastTransitionTime": "2026-12-02T09:00:00Z"}]));
        assert_eq!(disruption_condition(&ours, now), None, "already there");
        let other = pod(json!([{"type": DISRUPTION_TARGET, "status": "True",
            "reason": "PreemptionByScheduler", "lastTransitionTime": "2026-12-02T09:00:00Z"}]));
        assert_eq!(
            disruption_condition(&other, now).unwrap()["lastTransitionTime"],
            "2026-12-02T09:00:00Z",
            "same status: the transition time stays"
        );
        let falsy = pod(json!([{"type": DISRUPTION_TARGET, "status": "False",
            "lastTransitionTime": "2026-12-02T09:00:00Z"}]));
        assert_eq!(
            disruption_condition(&falsy, now).unwrap()["lastTransitionTime"],
            "2026-12-02T10:00:00Z"
        );
    }
}
