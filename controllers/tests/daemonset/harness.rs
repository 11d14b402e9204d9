//! The DaemonSet scenarios' harness: a reference control plane per controller manager
//! ([`Flavour`]): etcd, kube-apiserver, kube-scheduler (which binds the daemon Pods through their
//! node affinity), kwok (which runs the fake Nodes and makes their Pods Running and Ready) and
//! either kube-controller-manager or our `controller-manager`, both with
//! `--controllers=daemonset`; one namespace per scenario ([`Run`]) with a watch of its Pods,
//! DaemonSets and Events ([`State`]). Each scenario creates Nodes of its own, labelled
//! `ds-scenario=<scenario>`, and its DaemonSet selects only those, so the scenarios run side by
//! side on one control plane.
//!
//! The test stands in for the node lifecycle controller, which neither flavour runs: it lifts the
//! `node.kubernetes.io/not-ready:NoSchedule` taint the API server puts on every new Node.
//!
//! Owns: the control planes (stopped when the test binary exits), the Nodes and namespaces of its
//! runs. Every wait is bounded ([`WAIT`]) and fails with what was last seen.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use controlplane::Options;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client, ResourceExt as _};
use serde_json::{json, Value};

/// How long any one awaited state may take.
pub const WAIT: Duration = Duration::from_secs(60);
/// kube-controller-manager's name for the controller under test; ours takes the same.
pub const CONTROLLERS: &str = "daemonset";
/// The label that ties a scenario's Nodes to its DaemonSet.
pub const SCENARIO_LABEL: &str = "ds-scenario";

pub use crate::flavoured::{Cluster, Flavour};

/// This binary's control plane for `flavour`: the scheduler, one kwok node, and the DaemonSet
/// controller.
fn start(flavour: Flavour) -> anyhow::Result<Cluster> {
    let tag = match flavour {
        Flavour::Upstream => "daemonset-upstream",
        Flavour::Kpr => "daemonset-kpr",
    };
    let opts = Options {
        upstream_scheduler: true,
        // One node so kwok runs; no scenario's DaemonSet selects it.
        kwok_nodes: 1,
        ..Options::minimal(controlplane::run_dir(tag))
    };
    Cluster::start(flavour, CONTROLLERS, opts, Vec::new(), |_| Ok(()))
}

/// The control plane of `flavour` for this test binary, started on first use.
pub fn shared(flavour: Flavour) -> anyhow::Result<Arc<Cluster>> {
    Cluster::shared(flavour, start)
}

/// The node a daemon Pod is for: its nodeName, or the `metadata.name` of its node affinity.
pub fn target_node(p: &Pod) -> String {
    let spec = p.spec.as_ref();
    if let Some(n) = spec.and_then(|s| s.node_name.clone()) {
        return n;
    }
    spec.and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .and_then(|r| r.node_selector_terms.first())
        .and_then(|t| t.match_fields.as_ref())
        .and_then(|f| f.first())
        .and_then(|f| f.values.as_ref())
        .and_then(|v| v.first().cloned())
        .unwrap_or_default()
}

/// Ready condition True.
pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Running, Ready and not being deleted.
pub fn is_serving(p: &Pod) -> bool {
    is_ready(p) && p.metadata.deletion_timestamp.is_none()
}

/// A DaemonSet's status as (desired, current, misscheduled, ready, updated, available,
/// unavailable), and whether observedGeneration has caught up with the generation.
pub type Counts = (i32, i32, i32, i32, i32, i32, i32);

/// The DaemonSet's [`Counts`] once its status is current, else None.
pub fn counts(ds: &DaemonSet) -> Option<Counts> {
    let s = ds.status.as_ref()?;
    if s.observed_generation.unwrap_or(0) < ds.metadata.generation.unwrap_or(0) {
        return None;
    }
    Some((
        s.desired_number_scheduled,
        s.current_number_scheduled,
        s.number_misscheduled,
        s.number_ready,
        s.updated_number_scheduled.unwrap_or(0),
        s.number_available.unwrap_or(0),
        s.number_unavailable.unwrap_or(0),
    ))
}

/// What the watch of one namespace has seen.
#[derive(Debug, Default, Clone)]
pub struct State {
    /// Pods as last seen (deleted ones removed).
    pub pods: BTreeMap<String, Pod>,
    /// Every Pod ever seen, in order of first sight, with its node.
    pub pods_seen: Vec<(String, String)>,
    /// Pods seen deleted.
    pub pods_deleted: Vec<String>,
    /// DaemonSets as last seen.
    pub daemon_sets: BTreeMap<String, DaemonSet>,
    /// Event reasons, once each, in order of first sight.
    pub events: Vec<String>,
    /// The nodes whose availability is watched (see [`Run::track`]).
    pub tracked: Vec<String>,
    /// The most tracked nodes seen at once without a serving Pod.
    pub max_unavailable: usize,
    /// The most Pods seen at once for one tracked node (terminating ones included).
    pub max_per_node: usize,
    /// Watch errors.
    pub errors: Vec<String>,
}

impl State {
    /// The nodes with a serving Pod, sorted.
    pub fn serving_nodes(&self) -> Vec<String> {
        let set: BTreeSet<String> = self
            .pods
            .values()
            .filter(|p| is_serving(p))
            .map(target_node)
            .collect();
        set.into_iter().collect()
    }

    /// The Pods for `node` (terminating ones included).
    pub fn pods_on(&self, node: &str) -> Vec<&Pod> {
        self.pods
            .values()
            .filter(|p| target_node(p) == node)
            .collect()
    }

    /// The DaemonSet's counts once its status is current.
    pub fn counts(&self, ds: &str) -> Option<Counts> {
        self.daemon_sets.get(ds).and_then(counts)
    }

    fn apply_pod(&mut self, p: Pod) {
        let name = p.name_any();
        if !self.pods.contains_key(&name) && !self.pods_seen.iter().any(|(n, _)| *n == name) {
            self.pods_seen.push((name.clone(), target_node(&p)));
        }
        self.pods.insert(name, p);
        self.update_tracking();
    }

    fn update_tracking(&mut self) {
        if self.tracked.is_empty() {
            return;
        }
        let serving: BTreeSet<String> = self.serving_nodes().into_iter().collect();
        let down = self
            .tracked
            .iter()
            .filter(|n| !serving.contains(*n))
            .count();
        self.max_unavailable = self.max_unavailable.max(down);
        for n in &self.tracked {
            let here = self.pods.values().filter(|p| target_node(p) == *n).count();
            self.max_per_node = self.max_per_node.max(here);
        }
    }

    /// A summary for failure messages.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (name, ds) in &self.daemon_sets {
            out += &format!(
                "  DaemonSet {name}: generation {:?} status {:?}\n",
                ds.metadata.generation, ds.status
            );
        }
        for (name, p) in &self.pods {
            out += &format!(
                "  Pod {name} for {}: bound {:?} ready {} deleting {} hash {:?}\n",
                target_node(p),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                is_ready(p),
                p.metadata.deletion_timestamp.is_some(),
                p.labels().get("controller-revision-hash")
            );
        }
        out += &format!("  events: {:?}\n", self.events);
        if !self.errors.is_empty() {
            out += &format!("  watch errors: {:?}\n", self.errors);
        }
        out
    }
}

// One stream item; short-lived, so the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Change {
    Pod(Event<Pod>),
    DaemonSet(Event<DaemonSet>),
    Event(Event<CoreEvent>),
    Error(String),
}

/// One scenario's namespace with its watch.
pub struct Run {
    pub cluster: Arc<Cluster>,
    pub ns: String,
    pub client: Client,
    /// Node name prefix and label value of this scenario.
    pub tag: String,
    state: Arc<Mutex<State>>,
    changed: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Run {
    /// A fresh namespace `<tag>-<n>` on the `flavour`'s control plane, watched.
    pub async fn new(flavour: Flavour, tag: &str) -> anyhow::Result<Run> {
        let cluster = shared(flavour)?;
        let ns = tokio::task::block_in_place(|| cluster.cp().test_namespace(tag))?;
        let client = controlplane::client_from(&cluster.kubeconfig).await?;
        let state = Arc::new(Mutex::new(State::default()));
        let changed = tokio::sync::watch::channel(0u64).0;
        let task = Self::watch(client.clone(), &ns, state.clone(), changed.clone()).await?;
        Ok(Run {
            cluster,
            ns,
            client,
            tag: tag.to_string(),
            state,
            changed,
            task,
        })
    }

    async fn watch(
        client: Client,
        ns: &str,
        state: Arc<Mutex<State>>,
        changed: tokio::sync::watch::Sender<u64>,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        fn stream<K>(
            api: Api<K>,
            wrap: fn(Event<K>) -> Change,
        ) -> futures::stream::BoxStream<'static, Change>
        where
            K: kube::Resource<DynamicType = ()>
                + Clone
                + std::fmt::Debug
                + serde::de::DeserializeOwned
                + Send
                + 'static,
        {
            watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .map_ok(wrap)
                .map(|r| r.unwrap_or_else(|e| Change::Error(e.to_string())))
                .boxed()
        }
        let mut changes = futures::stream::select_all([
            stream(Api::<Pod>::namespaced(client.clone(), ns), Change::Pod),
            stream(
                Api::<DaemonSet>::namespaced(client.clone(), ns),
                Change::DaemonSet,
            ),
            stream(Api::<CoreEvent>::namespaced(client, ns), Change::Event),
        ]);
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut synced_tx = Some(synced_tx);
            let mut inits = 0;
            let mut counter = 0u64;
            while let Some(change) = changes.next().await {
                {
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    match change {
                        Change::Pod(Event::Apply(p) | Event::InitApply(p)) => s.apply_pod(p),
                        Change::Pod(Event::Delete(p)) => {
                            s.pods.remove(&p.name_any());
                            s.pods_deleted.push(p.name_any());
                            s.update_tracking();
                        }
                        Change::DaemonSet(Event::Apply(d) | Event::InitApply(d)) => {
                            s.daemon_sets.insert(d.name_any(), d);
                        }
                        Change::DaemonSet(Event::Delete(d)) => {
                            s.daemon_sets.remove(&d.name_any());
                        }
                        Change::Event(Event::Apply(e) | Event::InitApply(e)) => {
                            let reason = e.reason.clone().unwrap_or_default();
                            if !s.events.contains(&reason) {
                                s.events.push(reason);
                            }
                        }
                        Change::Pod(Event::InitDone)
                        | Change::DaemonSet(Event::InitDone)
                        | Change::Event(Event::InitDone) => {
                            inits += 1;
                            if inits == 3 {
                                if let Some(tx) = synced_tx.take() {
                                    let _ = tx.send(());
                                }
                            }
                        }
                        Change::Error(e) => s.errors.push(e),
                        _ => {}
                    }
                }
                counter += 1;
                changed.send_replace(counter);
            }
        });
        tokio::time::timeout(WAIT, synced_rx)
            .await
            .context("the namespace's watches did not list in time")?
            .context("the watch task ended")?;
        Ok(task)
    }

    /// From now on, records the most of `nodes` seen at once without a serving Pod.
    pub fn track(&self, nodes: &[String]) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.tracked = nodes.to_vec();
        s.max_unavailable = 0;
        s.max_per_node = 0;
        s.update_tracking();
    }

    /// Waits until `check` returns `Some` (re-checked on every change, at least every 250 ms),
    /// at most [`WAIT`]; the error shows the namespace as last seen and the manager's log.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        check: impl FnMut(&State) -> Option<T>,
    ) -> anyhow::Result<T> {
        crate::flavoured::wait_for(
            &self.cluster,
            &self.ns,
            &self.state,
            &self.changed,
            WAIT,
            what,
            State::describe,
            check,
        )
        .await
    }

    /// The name of this scenario's node `i`.
    pub fn node_name(&self, i: usize) -> String {
        format!("{}-{i}", self.tag)
    }

    /// Creates the kwok Node `<tag>-<i>` with the scenario label, `labels` and `taints`, then
    /// lifts the not-ready taint the API server added (the node lifecycle controller's part).
    pub async fn add_node(&self, i: usize, labels: Value, taints: Value) -> anyhow::Result<()> {
        let name = self.node_name(i);
        let mut all_labels = json!({"kubernetes.io/hostname": name, "type": "kwok",
            SCENARIO_LABEL: self.tag});
        json_patch::merge(&mut all_labels, &labels);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": all_labels,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                       "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}
        }))?;
        let api: Api<Node> = Api::all(self.client.clone());
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {name}"))?;
        self.set_taints(i, taints).await
    }

    /// Replaces node `i`'s taints.
    pub async fn set_taints(&self, i: usize, taints: Value) -> anyhow::Result<()> {
        let name = self.node_name(i);
        let api: Api<Node> = Api::all(self.client.clone());
        let taints = if taints.as_array().is_some_and(|a| a.is_empty()) {
            Value::Null
        } else {
            taints
        };
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": taints}})),
        )
        .await
        .with_context(|| format!("setting the taints of Node {name}"))?;
        Ok(())
    }

    /// Merge-patches node `i`'s labels (null removes one).
    pub async fn label_node(&self, i: usize, labels: Value) -> anyhow::Result<()> {
        let name = self.node_name(i);
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": labels}})),
        )
        .await
        .with_context(|| format!("labelling Node {name}"))?;
        Ok(())
    }

    /// Creates a DaemonSet `name` selecting `app=<name>` Pods on this scenario's nodes; `spec`
    /// is merged into the default spec.
    pub async fn create_daemon_set(&self, name: &str, spec: Value) -> anyhow::Result<()> {
        let mut v = json!({
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"nodeSelector": {SCENARIO_LABEL: self.tag},
                             "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]}
                }
            }
        });
        json_patch::merge(&mut v, &json!({ "spec": spec }));
        let ds: DaemonSet = serde_json::from_value(v)?;
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &self.ns);
        api.create(&PostParams::default(), &ds)
            .await
            .with_context(|| format!("creating DaemonSet {name} in {}", self.ns))?;
        Ok(())
    }

    /// Merge-patches a DaemonSet's spec.
    pub async fn patch_daemon_set(&self, name: &str, spec: Value) -> anyhow::Result<()> {
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &self.ns);
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .with_context(|| format!("patching DaemonSet {name}"))?;
        Ok(())
    }

    /// Deletes a Pod.
    pub async fn delete_pod(&self, name: &str) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        api.delete(name, &Default::default())
            .await
            .with_context(|| format!("deleting Pod {name}"))?;
        Ok(())
    }

    /// The namespace's ControllerRevisions' revision numbers, sorted.
    pub async fn revision_numbers(&self) -> anyhow::Result<Vec<i64>> {
        let api: Api<k8s_openapi::api::apps::v1::ControllerRevision> =
            Api::namespaced(self.client.clone(), &self.ns);
        let mut revs: Vec<i64> = api
            .list(&Default::default())
            .await
            .context("listing ControllerRevisions")?
            .items
            .into_iter()
            .map(|r| r.revision)
            .collect();
        revs.sort();
        Ok(revs)
    }
}
