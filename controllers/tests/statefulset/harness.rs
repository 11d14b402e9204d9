//! The StatefulSet scenarios' harness: a reference control plane per controller manager
//! ([`Flavour`]): etcd, kube-apiserver, kwok nodes and either kube-controller-manager or our
//! `controller-manager`, both with `--controllers=statefulset,garbagecollector` (the garbage
//! collector removes a deleted set's Pods and the claims the retention policy gave away); one
//! namespace per scenario ([`Run`]) with a watch of its Pods, StatefulSets, claims, revisions and
//! Events ([`State`]). The scenarios' Pods name a kwok node (`spec.nodeName`), so no scheduler
//! runs and their unbound claims (no volume binder runs either) do not hold them back; the
//! harness is their kubelet ([`GATE`]): it makes them Running and Ready and removes them once
//! deleted.
//!
//! Owns: the control planes (stopped when the test binary exits) and the namespaces of its runs.
//! Every wait is bounded ([`WAIT`]) and fails with what was last seen.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use controlplane::Options;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolumeClaim, Pod};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client, ResourceExt as _};

/// How long any one awaited state may take.
pub const WAIT: Duration = Duration::from_secs(60);
/// kube-controller-manager's names for the controllers under test; ours takes the same.
pub const CONTROLLERS: &str = "statefulset,garbagecollector";
/// The kwok node the scenarios' Pods run on.
pub const NODE: &str = "kwok-node-0";

pub use crate::flavoured::{Cluster, Flavour};

/// This binary's control plane for `flavour`: one kwok node and the StatefulSet controller and
/// garbage collector (ours logging each StatefulSet sync at debug).
fn start(flavour: Flavour) -> anyhow::Result<Cluster> {
    let tag = match flavour {
        Flavour::Upstream => "sts-upstream",
        Flavour::Kpr => "sts-kpr",
    };
    let opts = Options {
        kwok_nodes: 1,
        ..Options::minimal(controlplane::run_dir(tag))
    };
    let env = vec![(
        "RUST_LOG".to_string(),
        "info,controllers::workload::statefulset=debug".to_string(),
    )];
    Cluster::start(flavour, CONTROLLERS, opts, env, |_| Ok(()))
}

/// The control plane of `flavour` for this test binary, started on first use.
pub fn shared(flavour: Flavour) -> anyhow::Result<Arc<Cluster>> {
    Cluster::shared(flavour, start)
}

impl Cluster {
    /// The controller manager's log lines mentioning `needle` (a namespace).
    pub fn manager_log_about(&self, needle: &str) -> String {
        std::fs::read_to_string(self.manager_log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The Pod annotation that makes kwok leave a Pod alone (the control plane's kwok runs with
/// `--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom`). kwok deletes a
/// terminating Pod by name, and may do so twice: the second call can hit the Pod the controller
/// created in its place a moment before. The scenarios' Pods carry this annotation and the
/// harness is their kubelet ([`Kubelet`]), deleting by uid.
pub const GATE: (&str, &str) = ("kwok.x-k8s.io/status", "custom");

/// The test's kubelet for gated Pods: a new Pod is made Running and Ready at once; a
/// terminating one is removed (grace period 0) with its uid as precondition. Each once per uid.
struct Kubelet {
    pods: Api<Pod>,
    started: Arc<Mutex<std::collections::BTreeSet<String>>>,
    stopped: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

impl Kubelet {
    fn act(&self, p: &Pod) {
        if p.annotations().get(GATE.0).map(String::as_str) != Some(GATE.1) {
            return;
        }
        let (name, uid) = (p.name_any(), p.uid().unwrap_or_default());
        let pods = self.pods.clone();
        if p.metadata.deletion_timestamp.is_some() {
            if !self
                .stopped
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.clone())
            {
                return;
            }
            tokio::spawn(async move {
                let dp = kube::api::DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                let _ = pods.delete(&name, &dp).await;
            });
        } else if !ready(p)
            && self
                .started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.clone())
        {
            tokio::spawn(async move {
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let status = serde_json::json!({
                    "metadata": {"uid": uid},
                    "status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}
                });
                let _ = pods
                    .patch_status(
                        &name,
                        &Default::default(),
                        &kube::api::Patch::Merge(&status),
                    )
                    .await;
            });
        }
    }
}

/// A Pod transition as the watch delivered it (in the API server's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A Pod of this name and a new uid appeared.
    Created(String),
    /// The Pod turned Ready (first time for its uid).
    Ready(String),
    /// The Pod got a deletionTimestamp.
    Terminating(String),
    /// The Pod is gone.
    Deleted(String),
}

/// What the watch of one namespace has seen.
#[derive(Debug, Default, Clone)]
pub struct State {
    /// Pods as last seen (deleted ones removed).
    pub pods: BTreeMap<String, Pod>,
    /// Pod transitions, in watch order.
    pub log: Vec<Seen>,
    /// Per Pod name, the resourceVersion its current uid was first seen at (its creation, since
    /// the watch starts before any Pod exists).
    pub created_rv: BTreeMap<String, u64>,
    /// Uids already seen Ready or terminating (each transition is logged once per uid).
    seen_ready: Vec<String>,
    seen_terminating: Vec<String>,
    /// StatefulSets as last seen.
    pub sets: BTreeMap<String, StatefulSet>,
    /// Claims as last seen.
    pub claims: BTreeMap<String, PersistentVolumeClaim>,
    /// Revisions as last seen.
    pub revisions: BTreeMap<String, ControllerRevision>,
    /// Event reasons per involved object kind/name, in order of first sight.
    pub events: BTreeMap<String, Vec<String>>,
    /// Watch errors.
    pub errors: Vec<String>,
}

/// An object's resourceVersion as a number (etcd's revision: comparable across kinds).
pub fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The Ready condition is True.
pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl State {
    fn apply_pod(&mut self, p: Pod) {
        let name = p.name_any();
        let uid = p.uid().unwrap_or_default();
        if self.pods.get(&name).and_then(|o| o.uid()) != Some(uid.clone()) {
            self.log.push(Seen::Created(name.clone()));
            self.created_rv.insert(name.clone(), rv(&p));
        }
        if ready(&p) && !self.seen_ready.contains(&uid) {
            self.seen_ready.push(uid.clone());
            self.log.push(Seen::Ready(name.clone()));
        }
        if p.metadata.deletion_timestamp.is_some() && !self.seen_terminating.contains(&uid) {
            self.seen_terminating.push(uid);
            self.log.push(Seen::Terminating(name.clone()));
        }
        self.pods.insert(name, p);
    }

    /// Where in the log `ev` first occurs.
    pub fn position(&self, ev: &Seen) -> Option<usize> {
        self.log.iter().position(|e| e == ev)
    }

    /// The set `name`'s status.
    pub fn status(&self, name: &str) -> k8s_openapi::api::apps::v1::StatefulSetStatus {
        self.sets
            .get(name)
            .and_then(|s| s.status.clone())
            .unwrap_or_default()
    }

    /// A summary for failure messages.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (name, s) in &self.sets {
            out += &format!(
                "  StatefulSet {name} (generation {:?}): {:?}\n",
                s.metadata.generation, s.status
            );
        }
        for (name, p) in &self.pods {
            out += &format!(
                "  Pod {name}: revision {:?} ready {} deleting {}\n",
                p.labels().get("controller-revision-hash"),
                ready(p),
                p.metadata.deletion_timestamp.is_some()
            );
        }
        out += &format!("  claims: {:?}\n", self.claims.keys().collect::<Vec<_>>());
        out += &format!("  pod log: {:?}\n", self.log);
        for (obj, reasons) in &self.events {
            out += &format!("  events of {obj}: {reasons:?}\n");
        }
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
    Set(Event<StatefulSet>),
    Claim(Event<PersistentVolumeClaim>),
    Revision(Event<ControllerRevision>),
    Event(Event<CoreEvent>),
    Error(String),
}

/// One scenario's namespace with its watch.
pub struct Run {
    pub cluster: Arc<Cluster>,
    pub ns: String,
    pub client: Client,
    state: Arc<Mutex<State>>,
    changed: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const STREAMS: usize = 5;

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
        let c = &client;
        let mut changes = futures::stream::select_all([
            stream(Api::<Pod>::namespaced(c.clone(), ns), Change::Pod),
            stream(Api::<StatefulSet>::namespaced(c.clone(), ns), Change::Set),
            stream(
                Api::<PersistentVolumeClaim>::namespaced(c.clone(), ns),
                Change::Claim,
            ),
            stream(
                Api::<ControllerRevision>::namespaced(c.clone(), ns),
                Change::Revision,
            ),
            stream(Api::<CoreEvent>::namespaced(c.clone(), ns), Change::Event),
        ]);
        let kubelet = Kubelet {
            pods: Api::namespaced(client.clone(), ns),
            started: Default::default(),
            stopped: Default::default(),
        };
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut synced_tx = Some(synced_tx);
            let mut inits = 0;
            let mut counter = 0u64;
            while let Some(change) = changes.next().await {
                {
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    match change {
                        Change::Pod(Event::Apply(p) | Event::InitApply(p)) => {
                            kubelet.act(&p);
                            s.apply_pod(p)
                        }
                        Change::Pod(Event::Delete(p)) => {
                            s.pods.remove(&p.name_any());
                            s.log.push(Seen::Deleted(p.name_any()));
                        }
                        Change::Set(Event::Apply(o) | Event::InitApply(o)) => {
                            s.sets.insert(o.name_any(), o);
                        }
                        Change::Set(Event::Delete(o)) => {
                            s.sets.remove(&o.name_any());
                        }
                        Change::Claim(Event::Apply(o) | Event::InitApply(o)) => {
                            s.claims.insert(o.name_any(), o);
                        }
                        Change::Claim(Event::Delete(o)) => {
                            s.claims.remove(&o.name_any());
                        }
                        Change::Revision(Event::Apply(o) | Event::InitApply(o)) => {
                            s.revisions.insert(o.name_any(), o);
                        }
                        Change::Revision(Event::Delete(o)) => {
                            s.revisions.remove(&o.name_any());
                        }
                        Change::Event(Event::Apply(e) | Event::InitApply(e)) => {
                            let obj = format!(
                                "{}/{}",
                                e.involved_object.kind.clone().unwrap_or_default(),
                                e.involved_object.name.clone().unwrap_or_default()
                            );
                            let reason = e.reason.clone().unwrap_or_default();
                            let list = s.events.entry(obj).or_default();
                            if !list.contains(&reason) {
                                list.push(reason);
                            }
                        }
                        Change::Pod(Event::InitDone)
                        | Change::Set(Event::InitDone)
                        | Change::Claim(Event::InitDone)
                        | Change::Revision(Event::InitDone)
                        | Change::Event(Event::InitDone) => {
                            inits += 1;
                            if inits == STREAMS {
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

    /// The StatefulSets of this namespace.
    pub fn sets(&self) -> Api<StatefulSet> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}
