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
//! Owns: this suite's model and control plane, and the Nodes of its runs; the rest is `common`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use controlplane::Options;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt as _};
use serde_json::{json, Value};

pub use crate::common::is_ready;
use crate::common::{watch::Model, Recorder, Suite};
pub use crate::common::{Cluster, Flavour};

/// kube-controller-manager's name for the controller under test; ours takes the same.
pub const CONTROLLERS: &str = "daemonset";
/// The label that ties a scenario's Nodes to its DaemonSet.
pub const SCENARIO_LABEL: &str = "ds-scenario";

/// One scenario's namespace, watched into [`State`].
pub type Run = crate::common::Run<State>;

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

impl Model for State {
    fn watch_error(&mut self, error: String) {
        self.errors.push(error);
    }
}

impl Suite for State {
    const WAIT: Duration = Duration::from_secs(60);

    /// The scheduler, one kwok node, and the DaemonSet controller.
    fn cluster(flavour: Flavour) -> anyhow::Result<Cluster> {
        let opts = Options {
            upstream_scheduler: true,
            // One node so kwok runs; no scenario's DaemonSet selects it.
            kwok_nodes: 1,
            ..Options::minimal(controlplane::run_dir(&format!(
                "daemonset-{}",
                flavour.tag()
            )))
        };
        Cluster::start(flavour, CONTROLLERS, opts, Vec::new(), |_| Ok(()))
    }

    fn watches(client: &Client, ns: &str) -> Recorder<State> {
        let mut rec = Recorder::new(State::default());
        rec.watch(Api::<Pod>::namespaced(client.clone(), ns), |s, e| match e {
            Event::Apply(p) | Event::InitApply(p) => s.apply_pod(p),
            Event::Delete(p) => {
                s.pods.remove(&p.name_any());
                s.pods_deleted.push(p.name_any());
                s.update_tracking();
            }
            Event::Init | Event::InitDone => {}
        })
        .watch(
            Api::<DaemonSet>::namespaced(client.clone(), ns),
            |s, e| match e {
                Event::Apply(d) | Event::InitApply(d) => {
                    drop(s.daemon_sets.insert(d.name_any(), d))
                }
                Event::Delete(d) => drop(s.daemon_sets.remove(&d.name_any())),
                Event::Init | Event::InitDone => {}
            },
        )
        .watch(Api::<CoreEvent>::namespaced(client.clone(), ns), |s, e| {
            if let Event::Apply(e) | Event::InitApply(e) = e {
                let reason = e.reason.clone().unwrap_or_default();
                if !s.events.contains(&reason) {
                    s.events.push(reason);
                }
            }
        });
        rec
    }

    fn describe(&self) -> String {
        State::describe(self)
    }
}

/// What only this suite's scenarios do.
impl Run {
    /// From now on, records the most of `nodes` seen at once without a serving Pod.
    pub fn track(&self, nodes: &[String]) {
        let mut s = self.lock();
        s.tracked = nodes.to_vec();
        s.max_unavailable = 0;
        s.max_per_node = 0;
        s.update_tracking();
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
