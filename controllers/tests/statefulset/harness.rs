//! The StatefulSet scenarios' harness: a reference control plane per controller manager
//! ([`Flavour`]): etcd, kube-apiserver, kwok nodes and either kube-controller-manager or our
//! `controller-manager`, both with `--controllers=statefulset,garbagecollector` (the garbage
//! collector removes a deleted set's Pods and the claims the retention policy gave away); one
//! namespace per scenario ([`Run`]) with a watch of its Pods, StatefulSets, claims, revisions and
//! Events ([`State`]). The scenarios' Pods name a kwok node (`spec.nodeName`), so no scheduler
//! runs and their unbound claims (no volume binder runs either) do not hold them back; the
//! harness is their kubelet ([`GATE`], [`Kubelet`]): it makes them Running and Ready and removes them once
//! deleted.
//!
//! Owns: this suite's model and control plane; the rest is `common`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use controlplane::Options;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolumeClaim, Pod};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt as _};

pub use crate::common::{is_ready as ready, Cluster, Flavour, Kubelet, GATE};
use crate::common::{watch::Model, Recorder, Suite};

/// kube-controller-manager's names for the controllers under test; ours takes the same.
pub const CONTROLLERS: &str = "statefulset,garbagecollector";
/// The kwok node the scenarios' Pods run on.
pub const NODE: &str = "kwok-node-0";

/// One scenario's namespace, watched into [`State`].
pub type Run = crate::common::Run<State>;

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

impl Model for State {
    fn watch_error(&mut self, error: String) {
        self.errors.push(error);
    }
}

impl Suite for State {
    const WAIT: Duration = Duration::from_secs(60);

    /// One kwok node and the StatefulSet controller and garbage collector (ours logging each
    /// StatefulSet sync at debug).
    fn cluster(flavour: Flavour) -> anyhow::Result<Cluster> {
        let opts = Options {
            kwok_nodes: 1,
            ..Options::minimal(controlplane::run_dir(&format!("sts-{}", flavour.tag())))
        };
        let env = vec![(
            "RUST_LOG".to_string(),
            "info,controllers::workload::statefulset=debug".to_string(),
        )];
        Cluster::start(flavour, CONTROLLERS, opts, env, |_| Ok(()))
    }

    fn watches(client: &Client, ns: &str) -> Recorder<State> {
        let kubelet = Kubelet::new(Api::namespaced(client.clone(), ns));
        let c = client;
        let mut rec = Recorder::new(State::default());
        rec.watch(Api::<Pod>::namespaced(c.clone(), ns), move |s, e| match e {
            Event::Apply(p) | Event::InitApply(p) => {
                kubelet.run(&p);
                s.apply_pod(p)
            }
            Event::Delete(p) => {
                s.pods.remove(&p.name_any());
                s.log.push(Seen::Deleted(p.name_any()));
            }
            Event::Init | Event::InitDone => {}
        })
        .watch(Api::<StatefulSet>::namespaced(c.clone(), ns), |s, e| {
            last_seen(&mut s.sets, e)
        })
        .watch(
            Api::<PersistentVolumeClaim>::namespaced(c.clone(), ns),
            |s, e| last_seen(&mut s.claims, e),
        )
        .watch(
            Api::<ControllerRevision>::namespaced(c.clone(), ns),
            |s, e| last_seen(&mut s.revisions, e),
        )
        .watch(Api::<CoreEvent>::namespaced(c.clone(), ns), |s, e| {
            if let Event::Apply(e) | Event::InitApply(e) = e {
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
        });
        rec
    }

    fn describe(&self) -> String {
        State::describe(self)
    }
}

/// Keeps `objects` as last seen.
fn last_seen<K: kube::Resource>(objects: &mut BTreeMap<String, K>, e: Event<K>) {
    match e {
        Event::Apply(o) | Event::InitApply(o) => drop(objects.insert(o.name_any(), o)),
        Event::Delete(o) => drop(objects.remove(&o.name_any())),
        Event::Init | Event::InitDone => {}
    }
}

/// What only this suite's scenarios do.
impl Run {
    /// The StatefulSets of this namespace.
    pub fn sets(&self) -> Api<StatefulSet> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}
