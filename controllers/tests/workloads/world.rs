//! What the watches on one namespace have shown: the Deployments, ReplicaSets and Pods as last
//! seen, plus everything the scenarios compare or check that only a watch sees: the sequence of
//! ReplicaSet sizes per Deployment, Pod creations, deletion milestones ordered by resourceVersion,
//! and surge/availability bounds checked at every observed state.
//!
//! Owns: the model and the watches feeding it ([`watches`]). It never writes to the API server
//! except as the kubelet of gated Pods (`common::kubelet`): a gated Pod that is being deleted is
//! removed with grace period 0, as a kubelet does once its containers stopped, because kwok leaves
//! such Pods alone.
//!
//! Objects belong to a Deployment by name (`<deployment>-<hash>` for ReplicaSets,
//! `<deployment>-<hash>-<suffix>` for Pods), so the scenarios' Deployment names carry no dash.
//! Names, not ownerReferences: they survive orphaning and releasing, and a Pod can be placed before
//! the watch on ReplicaSets has delivered its owner (the three watches are separate streams).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use kube::{Api, Client, Resource, ResourceExt as _};

pub use crate::common::kubelet::{is_gated, is_ready, ready_since};
use crate::common::{watch::Model, Kubelet, Recorder};

/// The Deployment an object of the scenarios belongs to, by its name (module doc).
pub fn deployment_of(name: &str) -> &str {
    name.split('-').next().unwrap_or(name)
}

/// The Deployment a ReplicaSet name belongs to, if it has the `<deployment>-<hash>` shape.
fn deployment_of_rs(name: &str) -> Option<&str> {
    let (d, hash) = name.split_once('-')?;
    (!hash.contains('-')).then_some(d)
}

/// The name of the ReplicaSet controlling a Pod (its controller ownerReference).
pub fn controller_rs(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "ReplicaSet")
        .map(|r| r.name.as_str())
}

/// Not Succeeded, not Failed, not being deleted: the Pods a ReplicaSet counts.
pub fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Ready for at least `min_ready_seconds` at `now` (upstream's `IsPodAvailable`, which uses a
/// strict `Before`; this is the lenient side, so a bound check never fails on a rounding edge).
pub fn is_available(pod: &Pod, min_ready_seconds: i64, now: Timestamp) -> bool {
    match ready_since(pod) {
        Some(_) if min_ready_seconds == 0 => true,
        Some(t) => t.as_second() + min_ready_seconds <= now.as_second(),
        None => false,
    }
}

/// Limits a rolling update must respect at every observed state, counted as the Deployment
/// controller counts them.
///
/// The surge limit is over the ReplicaSets' sizes (`spec.replicas`), which is what the controller
/// bounds: it scales the new ReplicaSet up as soon as it has written an old one's smaller size,
/// without waiting for that ReplicaSet's controller to delete the Pods. Pods above their
/// ReplicaSet's size are such deletions in flight; counting them would fail kube-controller-manager
/// as well (observed: 14 Pods against a limit of 13 for an instant, with sizes 8 + 5). Availability
/// is counted over Pods, active (not terminating) and available for `min_ready_seconds`.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// spec.replicas + maxSurge: the most the ReplicaSets' sizes may add up to.
    pub max_total: usize,
    /// spec.replicas - maxUnavailable.
    pub min_available: usize,
    pub min_ready_seconds: i64,
}

/// One step of a deletion, ordered by the etcd revision of the write that made it.
#[derive(Debug, Clone)]
pub struct Milestone {
    pub revision: u64,
    pub kind: &'static str,
    pub name: String,
    pub what: String,
}

/// The model.
#[derive(Default)]
pub struct State {
    pub deployments: BTreeMap<String, Deployment>,
    pub replicasets: BTreeMap<String, ReplicaSet>,
    pub pods: BTreeMap<String, Pod>,
    /// ReplicaSet name -> `rs<n>`, n counting a Deployment's ReplicaSets in order of appearance:
    /// the name to compare by, since the hash in the real name is not (docs/WORKLOADS.md).
    pub roles: BTreeMap<String, String>,
    /// Per Deployment, every distinct `[(role, spec.replicas)]` seen, in order.
    pub sizes: BTreeMap<String, Vec<Vec<(String, i32)>>>,
    /// Names of Pods that appeared, in watch order.
    pub pods_added: Vec<String>,
    pub milestones: Vec<Milestone>,
    pub bounds: BTreeMap<String, Bounds>,
    /// Broken bounds, each with the state that broke them.
    pub violations: Vec<String>,
    /// How many events the recorder applied (a change counter for settling).
    pub events: u64,
    /// Watch errors (reconnects); shown when a wait times out.
    pub watch_errors: Vec<String>,
}

impl State {
    /// A Deployment's ReplicaSets (by name), in role order.
    pub fn replicasets_of(&self, d: &str) -> Vec<&ReplicaSet> {
        let mut rss: Vec<&ReplicaSet> = self
            .replicasets
            .values()
            .filter(|rs| deployment_of_rs(&rs.name_any()) == Some(d))
            .collect();
        rss.sort_by_key(|rs| self.role_number(&rs.name_any()));
        rss
    }

    fn role_number(&self, rs: &str) -> usize {
        self.roles
            .get(rs)
            .and_then(|r| r.strip_prefix("rs"))
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX)
    }

    /// `rs<n>` for a ReplicaSet name (the name itself if never seen).
    pub fn role(&self, rs: &str) -> String {
        self.roles
            .get(rs)
            .cloned()
            .unwrap_or_else(|| rs.to_string())
    }

    /// Active Pods controlled by ReplicaSet `rs`.
    pub fn active_pods_of_rs(&self, rs: &str) -> Vec<&Pod> {
        self.pods
            .values()
            .filter(|p| controller_rs(p) == Some(rs) && is_active(p))
            .collect()
    }

    /// Active Pods controlled by any ReplicaSet of Deployment `d`.
    pub fn active_pods_of(&self, d: &str) -> Vec<&Pod> {
        self.pods
            .values()
            .filter(|p| controller_rs(p).and_then(deployment_of_rs) == Some(d) && is_active(p))
            .collect()
    }

    /// Every Pod named after Deployment `d`, whatever its owner or state.
    pub fn pods_named_after(&self, d: &str) -> Vec<&Pod> {
        self.pods
            .values()
            .filter(|p| deployment_of(&p.name_any()) == d)
            .collect()
    }

    /// `rs1=8 rs2=5`: a Deployment's current ReplicaSet sizes.
    pub fn sizes_now(&self, d: &str) -> Vec<(String, i32)> {
        self.replicasets_of(d)
            .iter()
            .map(|rs| (self.role(&rs.name_any()), spec_replicas(rs)))
            .collect()
    }

    /// A Deployment, its ReplicaSets and Pods in a few lines: what a failed wait shows.
    pub fn describe(&self, d: &str) -> String {
        let mut out = String::new();
        match self.deployments.get(d) {
            Some(dep) => {
                let s = dep.status.clone().unwrap_or_default();
                out.push_str(&format!(
                    "Deployment {d}: generation {:?} observed {:?}, spec.replicas {:?}, status replicas {:?} updated {:?} ready {:?} available {:?}, conditions {}\n",
                    dep.metadata.generation,
                    s.observed_generation,
                    dep.spec.as_ref().and_then(|s| s.replicas),
                    s.replicas,
                    s.updated_replicas,
                    s.ready_replicas,
                    s.available_replicas,
                    conditions_line(dep),
                ));
            }
            None => out.push_str(&format!("Deployment {d}: absent\n")),
        }
        for rs in self.replicasets_of(d) {
            let name = rs.name_any();
            let s = rs.status.clone().unwrap_or_default();
            out.push_str(&format!(
                "  ReplicaSet {} ({}): spec {} generation {:?} observed {:?}, status replicas {} ready {:?} available {:?}, {} active Pods, owners {:?}, finalizers {:?}\n",
                name,
                self.role(&name),
                spec_replicas(rs),
                rs.metadata.generation,
                s.observed_generation,
                s.replicas,
                s.ready_replicas,
                s.available_replicas,
                self.active_pods_of_rs(&name).len(),
                owner_kinds(&rs.metadata),
                rs.finalizers(),
            ));
        }
        for p in self.pods_named_after(d) {
            out.push_str(&format!(
                "    Pod {}: node {:?}, phase {:?}, ready {}, deleting {}, gated {}, owner {:?}\n",
                p.name_any(),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.status.as_ref().and_then(|s| s.phase.clone()),
                is_ready(p),
                p.metadata.deletion_timestamp.is_some(),
                is_gated(p),
                controller_rs(p),
            ));
        }
        if !self.watch_errors.is_empty() {
            out.push_str(&format!("  watch errors: {:?}\n", self.watch_errors));
        }
        out
    }

    fn apply_rs(&mut self, rs: ReplicaSet) {
        let name = rs.name_any();
        let old = self.replicasets.insert(name.clone(), rs.clone());
        if !self.roles.contains_key(&name) {
            if let Some(d) = deployment_of_rs(&name) {
                let n = self
                    .roles
                    .keys()
                    .filter(|k| deployment_of_rs(k) == Some(d))
                    .count();
                self.roles.insert(name.clone(), format!("rs{}", n + 1));
            }
        }
        self.note_deleting(
            "ReplicaSet",
            &rs.metadata,
            old.as_ref().map(|o| &o.metadata),
        );
        self.note_released(
            "ReplicaSet",
            &rs.metadata,
            old.as_ref().map(|o| &o.metadata),
        );
        if let Some(d) = deployment_of_rs(&name).map(str::to_string) {
            self.note_sizes(&d);
        }
    }

    fn note_sizes(&mut self, d: &str) {
        let now = self.sizes_now(d);
        let seq = self.sizes.entry(d.to_string()).or_default();
        if seq.last() != Some(&now) && !now.is_empty() {
            seq.push(now);
        }
    }

    fn apply_pod(&mut self, pod: Pod) {
        let name = pod.name_any();
        let old = self.pods.insert(name.clone(), pod.clone());
        if old.is_none() {
            self.pods_added.push(name);
        }
        self.note_deleting("Pod", &pod.metadata, old.as_ref().map(|o| &o.metadata));
        self.note_released("Pod", &pod.metadata, old.as_ref().map(|o| &o.metadata));
    }

    fn apply_deployment(&mut self, d: Deployment) {
        let old = self.deployments.insert(d.name_any(), d.clone());
        self.note_deleting("Deployment", &d.metadata, old.as_ref().map(|o| &o.metadata));
    }

    fn note_deleting(&mut self, kind: &'static str, new: &Meta, old: Option<&Meta>) {
        let was = old.is_some_and(|o| o.deletion_timestamp.is_some());
        if new.deletion_timestamp.is_some() && !was {
            let finalizers = new.finalizers.clone().unwrap_or_default();
            self.milestone(kind, new, format!("deleting {finalizers:?}"));
        }
    }

    /// A controller ownerReference that went away without the object going.
    fn note_released(&mut self, kind: &'static str, new: &Meta, old: Option<&Meta>) {
        let had = old.is_some_and(|o| controller_kind(o).is_some());
        if had && controller_kind(new).is_none() {
            self.milestone(kind, new, "released".into());
        }
    }

    fn milestone(&mut self, kind: &'static str, meta: &Meta, what: String) {
        self.milestones.push(Milestone {
            revision: revision(meta),
            kind,
            name: meta.name.clone().unwrap_or_default(),
            what,
        });
    }

    fn delete<K: Resource<DynamicType = ()> + Clone>(
        &mut self,
        kind: &'static str,
        obj: &K,
    ) -> Option<()> {
        let name = obj.meta().name.clone()?;
        let removed = match kind {
            "Deployment" => self.deployments.remove(&name).is_some(),
            "ReplicaSet" => self.replicasets.remove(&name).is_some(),
            _ => self.pods.remove(&name).is_some(),
        };
        if removed {
            self.milestone(kind, obj.meta(), "gone".into());
        }
        if kind == "ReplicaSet" {
            if let Some(d) = deployment_of_rs(&name).map(str::to_string) {
                self.note_sizes(&d);
            }
        }
        Some(())
    }

    /// Checks every Deployment with [`Bounds`] against the current Pods.
    fn check_bounds(&mut self, now: Timestamp) {
        let mut broken = Vec::new();
        for (d, b) in &self.bounds {
            let pods = self.active_pods_of(d);
            let sized: usize = self
                .replicasets_of(d)
                .iter()
                .map(|rs| usize::try_from(spec_replicas(rs)).unwrap_or(0))
                .sum();
            let available = pods
                .iter()
                .filter(|p| is_available(p, b.min_ready_seconds, now))
                .count();
            if sized > b.max_total || available < b.min_available {
                broken.push(format!(
                    "{d}: ReplicaSet sizes add up to {sized} (at most {}; {} Pods), {available} available (at least {}) at event {}: {:?}\n{}",
                    b.max_total,
                    pods.len(),
                    b.min_available,
                    self.events,
                    self.sizes_now(d),
                    self.describe(d)
                ));
            }
        }
        self.violations.extend(broken);
    }
}

type Meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The etcd revision of the write an object (or a DELETED event) carries: the API server's
/// resourceVersions are etcd revisions, one sequence over every kind, which is what orders writes
/// seen on different watches. A resourceVersion that is not a number sorts last.
fn revision(meta: &Meta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(u64::MAX)
}

fn controller_kind(meta: &Meta) -> Option<&str> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.kind.as_str())
}

/// The kinds of an object's owners, sorted.
pub fn owner_kinds(meta: &Meta) -> Vec<String> {
    let mut kinds: Vec<String> = meta
        .owner_references
        .iter()
        .flatten()
        .map(|r| r.kind.clone())
        .collect();
    kinds.sort();
    kinds
}

pub fn spec_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub fn conditions_line(d: &Deployment) -> String {
    d.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .map(|c| {
            format!(
                "{}={}({})",
                c.type_,
                c.status,
                c.reason.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Model for State {
    fn watch_error(&mut self, error: String) {
        self.watch_errors.push(error);
    }

    /// Counts the event (see [`State::events`]) and checks every [`Bounds`] at this state.
    fn after_event(&mut self) {
        self.events += 1;
        self.check_bounds(Timestamp::now());
    }
}

/// A fresh model of `ns` with the watches of its Deployments, ReplicaSets and Pods; finishes
/// the deletion of gated Pods (module doc).
pub fn watches(client: &Client, ns: &str) -> Recorder<State> {
    let kubelet = Kubelet::new(Api::namespaced(client.clone(), ns));
    let mut rec = Recorder::new(State::default());
    rec.watch(
        Api::<Deployment>::namespaced(client.clone(), ns),
        relisting("Deployment", State::apply_deployment),
    )
    .watch(
        Api::<ReplicaSet>::namespaced(client.clone(), ns),
        relisting("ReplicaSet", State::apply_rs),
    );
    let mut on_pod = relisting("Pod", State::apply_pod);
    rec.watch(Api::<Pod>::namespaced(client.clone(), ns), move |s, e| {
        if let Event::Apply(p) | Event::InitApply(p) = &e {
            kubelet.finish_terminating(p);
        }
        on_pod(s, e)
    });
    rec
}

/// Applies the events of one kind with `apply` (see [`on_event`]).
fn relisting<K: Resource<DynamicType = ()> + Clone + 'static>(
    kind: &'static str,
    apply: fn(&mut State, K),
) -> impl FnMut(&mut State, Event<K>) + Send + 'static {
    let mut relist = BTreeSet::new();
    move |s, e| on_event(s, e, &mut relist, kind, apply)
}

/// Applies one watch event; a relist (Init .. InitDone) drops the objects it no longer lists.
fn on_event<K: Resource<DynamicType = ()> + Clone>(
    s: &mut State,
    e: Event<K>,
    relist: &mut BTreeSet<String>,
    kind: &'static str,
    apply: impl Fn(&mut State, K),
) {
    match e {
        Event::Init => relist.clear(),
        Event::InitApply(obj) => {
            relist.insert(obj.meta().name.clone().unwrap_or_default());
            apply(s, obj);
        }
        Event::InitDone => {
            let names: Vec<String> = match kind {
                "Deployment" => s.deployments.keys().cloned().collect(),
                "ReplicaSet" => s.replicasets.keys().cloned().collect(),
                _ => s.pods.keys().cloned().collect(),
            };
            for name in names.into_iter().filter(|n| !relist.contains(n)) {
                match kind {
                    "Deployment" => drop(s.deployments.remove(&name)),
                    "ReplicaSet" => drop(s.replicasets.remove(&name)),
                    _ => drop(s.pods.remove(&name)),
                }
            }
        }
        Event::Apply(obj) => apply(s, obj),
        Event::Delete(obj) => {
            s.delete(kind, &obj);
        }
    }
}
