//! The disruption controller (kube-controller-manager v1.34's `disruption` controller,
//! `pkg/controller/disruption`): the status of every PodDisruptionBudget, which the API server's
//! eviction subresource (and so `kubectl drain`) reads to allow or refuse an eviction.
//!
//! Owns: `status` of PodDisruptionBudgets (expectedPods, desiredHealthy, currentHealthy,
//! disruptionsAllowed, disruptedPods, observedGeneration and the `DisruptionAllowed` condition,
//! reasons SufficientPods / InsufficientPods / SyncFailed), and resetting to False a running
//! Pod's `DisruptionTarget` condition that no deletion followed within 2 minutes. Must not touch
//! anything else: `unhealthyPodEvictionPolicy` is the API server's to apply at eviction time (it
//! compares currentHealthy with desiredHealthy, both written here).
//!
//! As upstream: a budget's Pods are those its selector matches in its namespace. An integer
//! `minAvailable` expects the Pods found; `maxUnavailable` and a percentage `minAvailable` expect
//! the sum of the scales of the Pods' controllers ([`finders`]: ReplicationController,
//! Deployment through its ReplicaSet, ReplicaSet, StatefulSet, or anything with a scale
//! subresource). Pods without a controller are then reported (Warning `UnmanagedPods`); a Pod
//! whose controller cannot be found fails the sync (Warning `CalculateExpectedPodCountFailed`),
//! and a failed sync writes `disruptionsAllowed: 0` with the condition's reason SyncFailed
//! (`failSafe`). No matching Pod: Normal `NoPods`. An eviction the API server recorded in
//! `disruptedPods` keeps its Pod out of currentHealthy until the Pod is seen deleting, or for 2
//! minutes (then Warning `NotDeleted` on the Pod, with upstream's wording, which names the PDB
//! `namespace/namespace`); the budget is synced again when the earliest entry expires (queue
//! `disruption_recheck`). A Pod matching several budgets gets Warning
//! `MultiplePodDisruptionBudgets` and wakes the first by name (upstream: an arbitrary one).
//!
//! Queues and workers as upstream: `disruption` (budgets), `disruption_recheck` and
//! `stale_pod_disruption` (Pods), one worker each; no flag sets them. Events' source component
//! is `controllermanager`, as upstream's recorder names it. Changes of the owning controllers
//! (a Deployment scaled) are not watched, as upstream: the next Pod change brings them in.

pub mod finders;
pub mod plan;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, ReplicationController};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::error::{Error, Result};
use crate::helpers::meta::controller_of;
use crate::helpers::selector::Selector;
use crate::runtime::apierrors::{api_message, is_conflict, is_not_found};
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{key_of, split_key, Informers, NAMESPACE};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_key_workers, run_workers_of, wait_for_caches, SyncKey};

use finders::{Caches, ControllerScale};
use plan::Counting;

/// The controller's name in `--controllers` and logs.
pub const NAME: &str = "disruption";

/// The source component of its Events (upstream's recorder says `controllermanager`).
pub const COMPONENT: &str = "controllermanager";

/// The queues, named as upstream's (their workqueue metrics carry the names).
pub const QUEUE: &str = "disruption";
pub const RECHECK_QUEUE: &str = "disruption_recheck";
pub const STALE_QUEUE: &str = "stale_pod_disruption";

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long a stale DisruptionTarget condition waits before its reset.
    pub stale_pod_disruption_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            stale_pod_disruption_timeout: plan::STALE_POD_DISRUPTION_TIMEOUT,
        }
    }
}

/// Why a sync failed: a conflict is retried as is; anything else goes through `failSafe`.
enum SyncError {
    Conflict(kube::Error),
    Failed(String),
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    recorder: Recorder,
    pdbs: Arc<Indexed<PodDisruptionBudget>>,
    pods: Arc<Indexed<CachedPod>>,
    caches: Caches,
    queue: Arc<WorkQueue<String>>,
    recheck: Arc<WorkQueue<String>>,
    stale: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the handlers on the shared Pod and PodDisruptionBudget informers and takes the
    /// caches of the four controller kinds.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let pod_informer = informers.get::<CachedPod>();
        let pdb_informer = informers.get::<PodDisruptionBudget>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), COMPONENT),
            client,
            config,
            pdbs: pdb_informer.cache(),
            pods: pod_informer.cache(),
            caches: Caches {
                rcs: informers.get::<ReplicationController>().cache(),
                rss: informers.get::<ReplicaSet>().cache(),
                deployments: informers.get::<Deployment>().cache(),
                statefulsets: informers.get::<StatefulSet>().cache(),
            },
            queue: WorkQueue::new(QUEUE),
            recheck: WorkQueue::new(RECHECK_QUEUE),
            stale: WorkQueue::new(STALE_QUEUE),
        });
        pdb_informer.on_change_of(&this, Self::pdb_changed);
        pod_informer.on_change_of(&this, Self::pod_changed);
        this
    }

    fn pdb_changed(
        &self,
        old: Option<&Arc<PodDisruptionBudget>>,
        new: Option<&Arc<PodDisruptionBudget>>,
    ) {
        if let Some(pdb) = new.or(old) {
            self.queue.add(key_of(pdb.as_ref()));
        }
    }

    fn pod_changed(&self, old: Option<&Arc<CachedPod>>, new: Option<&Arc<CachedPod>>) {
        let Some(pod) = new.or(old) else { return };
        if let Some(pdb) = self.pdb_for_pod(pod) {
            self.queue.add(pdb);
        }
        if new.is_some() {
            let now = Timestamp::now();
            if let Some(after) =
                plan::stale_disruption_in(pod, now, self.config.stale_pod_disruption_timeout)
            {
                self.stale.add_after(key_of(pod.as_ref()), after);
            }
        }
    }

    /// `getPdbForPod`: the key of the budget a Pod change wakes (the first by name of those
    /// selecting it; the others are named in a Warning on the Pod).
    fn pdb_for_pod(&self, pod: &CachedPod) -> Option<String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut matching: Vec<Arc<PodDisruptionBudget>> = self
            .pdbs
            .index(NAMESPACE, ns)
            .into_iter()
            .filter(|pdb| {
                let sel = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
                // An invalid selector matches nothing; a missing one matches nothing either.
                Selector::parse(sel).is_ok_and(|s| s.matches(pod.metadata.labels.as_ref()))
            })
            .collect();
        matching.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let first = matching.first()?;
        let first_name = first.metadata.name.clone().unwrap_or_default();
        if matching.len() > 1 {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let msg = format!(
                "Pod {ns:?}/{name:?} matches multiple PodDisruptionBudgets.  Chose {first_name:?} arbitrarily."
            );
            tracing::info!(controller = NAME, "{msg}");
            self.recorder
                .publish(&pod_ref(pod), true, "MultiplePodDisruptionBudgets", msg);
        }
        Some(format!("{ns}/{first_name}"))
    }

    /// Waits for the caches, then runs one worker per queue.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(
            NAME,
            &[
                &*self.pods,
                &*self.pdbs,
                &*self.caches.rcs,
                &*self.caches.rss,
                &*self.caches.deployments,
                &*self.caches.statefulsets,
            ],
        )
        .await;
        tracing::info!(controller = NAME, "controller started");
        let main = run_key_workers(&self, &self.queue, 1);
        // The recheck queue only moves a budget back to the main queue when its time comes.
        let recheck = run_workers_of(&self, &self.recheck, 1, |c, key| async move {
            c.queue.add_rate_limited(key);
            Ok(())
        });
        let stale = run_workers_of(&self, &self.stale, 1, |c, key| async move {
            c.sync_stale_pod_disruption(&key).await
        });
        futures::join!(main, recheck, stale);
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
        self.recheck.shut_down();
        self.stale.shut_down();
    }
}

impl SyncKey for Controller {
    /// Syncs the budget `ns/name` (upstream's `sync`).
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(pdb) = self.pdbs.get(ns, name) else {
            return Ok(());
        };
        match self.try_sync(&pdb).await {
            Ok(()) => Ok(()),
            Err(SyncError::Conflict(e)) => Err(Error::kube(
                "updating the status of",
                format!("PodDisruptionBudget {key}"),
                e,
            )),
            Err(SyncError::Failed(msg)) => {
                tracing::error!(controller = NAME, pdb = key, "failed to sync PDB: {msg}");
                let mut failed = (*pdb).clone();
                failed.status = Some(plan::fail_safe_status(&pdb, &msg, Timestamp::now()));
                self.write_status(&failed).await.map_err(|e| {
                    Error::kube(
                        "updating the status of",
                        format!("PodDisruptionBudget {key}"),
                        e,
                    )
                })
            }
        }
    }
}

impl Controller {
    /// `trySync`.
    async fn try_sync(&self, pdb: &PodDisruptionBudget) -> std::result::Result<(), SyncError> {
        let ns = pdb.metadata.namespace.as_deref().unwrap_or_default();
        let spec = pdb.spec.clone().unwrap_or_default();
        let selector = match Selector::parse(spec.selector.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                self.event(pdb, true, "NoPods", format!("Failed to get pods: {e}"));
                return Err(SyncError::Failed(e));
            }
        };
        let mut pods: Vec<Arc<CachedPod>> = self
            .pods
            .index(NAMESPACE, ns)
            .into_iter()
            .filter(|p| selector.matches(p.metadata.labels.as_ref()))
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let pods: Vec<&CachedPod> = pods.iter().map(|p| p.as_ref()).collect();
        if pods.is_empty() {
            self.event(pdb, false, "NoPods", "No matching pods found".into());
        }

        let (expected, desired) = match self.expected_pod_count(pdb, &pods).await {
            Ok(v) => v,
            Err(e) => {
                self.event(
                    pdb,
                    true,
                    "CalculateExpectedPodCountFailed",
                    format!("Failed to calculate the number of expected pods: {e}"),
                );
                return Err(SyncError::Failed(e));
            }
        };

        let now = Timestamp::now();
        let previous = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref());
        let disrupted = plan::disrupted_pod_map(&pods, previous, now);
        for pod in &disrupted.not_deleted {
            tracing::info!(
                controller = NAME,
                pod,
                "pod was expected to be deleted but it wasn't"
            );
            // Upstream's message names the budget by its namespace twice; kept word for word.
            self.recorder.publish(
                &ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: Some(ns.into()),
                    name: Some(pod.clone()),
                    uid: pods
                        .iter()
                        .find(|p| p.metadata.name.as_deref() == Some(pod))
                        .and_then(|p| p.metadata.uid.clone()),
                    ..Default::default()
                },
                true,
                "NotDeleted",
                format!("Pod was expected by PDB {ns}/{ns} to be deleted but it wasn't"),
            );
        }
        let current_healthy = plan::count_healthy(&pods, &disrupted.pods, now);
        let counts = plan::Counts {
            current_healthy,
            desired_healthy: desired,
            expected,
        };
        if let Some(status) = plan::new_status(pdb, counts, disrupted.pods, now) {
            let mut updated = pdb.clone();
            updated.status = Some(status);
            match self.write_status(&updated).await {
                Ok(()) => {}
                Err(e) if is_conflict(&e) => return Err(SyncError::Conflict(e)),
                Err(e) => return Err(SyncError::Failed(api_message(&e))),
            }
        }
        if let Some(at) = disrupted.recheck {
            let after = Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO);
            self.recheck.add_after(key_of(pdb), after);
        }
        Ok(())
    }

    /// `getExpectedPodCount`: `(expectedPods, desiredHealthy)`.
    async fn expected_pod_count(
        &self,
        pdb: &PodDisruptionBudget,
        pods: &[&CachedPod],
    ) -> std::result::Result<(i32, i32), String> {
        let spec = pdb.spec.clone().unwrap_or_default();
        let scale = match plan::counting(&spec) {
            Counting::ByScale => {
                let (scale, unmanaged) = self.expected_scale(pods).await?;
                if !unmanaged.is_empty() {
                    tracing::debug!(controller = NAME, ?unmanaged, "unmanaged pods");
                    let sel = plan::go_selector_string(spec.selector.as_ref());
                    self.event(
                        pdb,
                        true,
                        "UnmanagedPods",
                        format!(
                            "Pods selected by this PodDisruptionBudget (selector: {sel}) were found \
                             to be unmanaged. As a result, the status of the PDB cannot be calculated \
                             correctly, which may result in undefined behavior. To account for these \
                             pods please set \".spec.minAvailable\" field of the PDB to an integer value."
                        ),
                    );
                }
                scale
            }
            Counting::ByPods { .. } | Counting::Nothing => 0,
        };
        plan::expected_and_desired(&spec, pods.len(), scale)
    }

    /// `getExpectedScale`: the sum of the scales of the Pods' controllers (each counted once)
    /// and the names of the Pods that have none.
    async fn expected_scale(
        &self,
        pods: &[&CachedPod],
    ) -> std::result::Result<(i32, Vec<String>), String> {
        let mut scales: BTreeMap<String, i32> = BTreeMap::new();
        let mut unmanaged = Vec::new();
        // Controller references looked up already (a Deployment's Pods name its ReplicaSets,
        // whose scale is the Deployment's: counted once by the Deployment's uid).
        let mut seen = HashSet::new();
        for pod in pods {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let Some(r) = controller_of(&pod.metadata) else {
                unmanaged.push(name);
                continue;
            };
            if !seen.insert(r.uid.clone()) {
                continue;
            }
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let found = match finders::find_cached(&self.caches, r, ns)? {
                Some(found) => Some(found),
                None => finders::find_by_scale(&self.client, r, ns).await?,
            };
            let Some(ControllerScale { uid, scale }) = found else {
                return Err(format!("found no controllers for pod {name:?}"));
            };
            scales.insert(uid, scale);
        }
        Ok((scales.values().sum(), unmanaged))
    }

    /// `writePdbStatus`: an update of the status subresource (the cached resourceVersion is the
    /// precondition; a conflict is retried with the newer budget).
    async fn write_status(
        &self,
        pdb: &PodDisruptionBudget,
    ) -> std::result::Result<(), kube::Error> {
        let ns = pdb.metadata.namespace.as_deref().unwrap_or_default();
        let name = pdb.metadata.name.as_deref().unwrap_or_default();
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), ns);
        api.replace_status(name, &PostParams::default(), pdb)
            .await?;
        Ok(())
    }

    /// `syncStalePodDisruption`: a Pod whose DisruptionTarget condition is stale gets it set to
    /// False (as `UpdatePodCondition` writes it: the type, the status, a new transition time);
    /// one not stale yet is looked at again when it will be.
    async fn sync_stale_pod_disruption(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(pod) = self.pods.get(ns, name) else {
            return Ok(());
        };
        let now = Timestamp::now();
        let Some(after) =
            plan::stale_disruption_in(&pod, now, self.config.stale_pod_disruption_timeout)
        else {
            return Ok(());
        };
        if !after.is_zero() {
            self.stale.add_after(key.to_string(), after);
            return Ok(());
        }
        let patch = json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "status": {"conditions": [{
                "type": plan::DISRUPTION_TARGET,
                "status": "False",
                "lastTransitionTime": now,
                "reason": null,
                "message": null,
                "lastProbeTime": null,
            }]},
        });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {
                tracing::info!(
                    controller = NAME,
                    pod = key,
                    "reset stale DisruptionTarget condition to False"
                );
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(
                "resetting the DisruptionTarget condition of",
                format!("Pod {key}"),
                e,
            )),
        }
    }

    fn event(&self, pdb: &PodDisruptionBudget, warning: bool, reason: &str, message: String) {
        self.recorder
            .publish(&pdb_ref(pdb), warning, reason, message);
    }
}

fn pdb_ref(pdb: &PodDisruptionBudget) -> ObjectReference {
    ObjectReference {
        api_version: Some("policy/v1".into()),
        kind: Some("PodDisruptionBudget".into()),
        namespace: pdb.metadata.namespace.clone(),
        name: pdb.metadata.name.clone(),
        uid: pdb.metadata.uid.clone(),
        resource_version: pdb.metadata.resource_version.clone(),
        ..Default::default()
    }
}

fn pod_ref(pod: &CachedPod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        ..Default::default()
    }
}
