//! The scheduler's informer event handlers (upstream's pkg/scheduler/eventhandlers.go): Nodes
//! and bound Pods go into the cache, unbound Pods of this scheduler's profiles into the queue,
//! Namespaces' labels into the cache (for namespace selectors); each change that can make an
//! unschedulable Pod schedulable is a [`ClusterEvent`] for the queue (added or changed claims,
//! volumes, storage classes and CSINodes too: the volume plugins read them from the informers).
//!
//! Owns the filtering of updates (heartbeats and kubelet status writes change nothing for
//! scheduling and are dropped here); no API calls.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

use super::cache::Cache;
use super::framework::types::pod_requests;
use super::queue::ClusterEvent;
use super::scheduler::{node_name, terminal, uid, Scheduler};
use crate::runtime::informer::Informers;

/// Whether a node update can change a scheduling decision (labels, spec: taints and
/// unschedulable, allocatable, images); heartbeats and condition timestamps cannot.
fn node_changed(old: &Node, new: &Node) -> bool {
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || old.status.as_ref().map(|s| (&s.allocatable, &s.images))
            != new.status.as_ref().map(|s| (&s.allocatable, &s.images))
}

/// What an update of an assigned Pod changed, as the queue's events (upstream's
/// `PodSchedulingPropertiesChange` for an assigned Pod): its labels, a lowered or removed
/// resource request, and otherwise "other" (status, deletionTimestamp, ...).
fn assigned_pod_update_events(old: &Pod, new: &Pod) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    // Semantic equality: no labels and an empty map are the same.
    let labels = |p: &Pod| p.metadata.labels.clone().unwrap_or_default();
    if labels(old) != labels(new) {
        events.push(ClusterEvent::AssignedPodLabelUpdate);
    }
    if scaled_down(old, new) {
        events.push(ClusterEvent::AssignedPodScaleDown);
    }
    if events.is_empty() {
        events.push(ClusterEvent::AssignedPodOtherUpdate);
    }
    events
}

/// Upstream's extractPodScaleDown: some resource the old Pod requested is requested less, or no
/// more, by the new one.
fn scaled_down(old: &Pod, new: &Pod) -> bool {
    let (o, n) = (pod_requests(old, false), pod_requests(new, false));
    o.milli_cpu > n.milli_cpu
        || o.memory > n.memory
        || o.ephemeral_storage > n.ephemeral_storage
        || o.scalar
            .iter()
            .any(|(k, v)| n.scalar.get(k).is_none_or(|nv| nv < v))
}

/// A Pod the watch shows assigned: the cache takes this version, whatever changed (upstream's
/// addPodToCache / updatePodInCache: a bound Pod's startTime, phase, conditions and
/// deletionTimestamp matter to preemption's choices and to topology spread), and the events for
/// the queue are returned. `old` is the previous version when it was assigned too; a
/// re-delivery of the same version (a resync) changes nothing.
fn take_assigned_pod(cache: &mut Cache, old: Option<&Pod>, new: &Arc<Pod>) -> Vec<ClusterEvent> {
    let Some(old) = old else {
        cache.add_pod(new.clone());
        return vec![ClusterEvent::AssignedPodAdd];
    };
    let same_version = old.metadata.resource_version.is_some()
        && old.metadata.resource_version == new.metadata.resource_version;
    if same_version && cache.contains_pod(uid(new)) {
        return Vec::new();
    }
    cache.update_pod(new.clone());
    assigned_pod_update_events(old, new)
}

/// Registers the handlers on the informers (upstream's addAllEventHandlers).
pub(super) fn add_all_event_handlers(sched: &Arc<Scheduler>, informers: &Informers) {
    let s = sched.clone();
    informers
        .get::<Pod>()
        .on_change(Box::new(move |old, new| s.on_pod(old, new)));
    let s = sched.clone();
    informers
        .get::<Node>()
        .on_change(Box::new(move |old, new| s.on_node(old, new)));
    // Additions and updates only: upstream's volume plugins register no deletions.
    let s = sched.clone();
    informers
        .get::<PersistentVolumeClaim>()
        .on_change(Box::new(move |_, new| {
            s.on_storage_change(new.is_some(), ClusterEvent::PvcChange)
        }));
    let s = sched.clone();
    informers
        .get::<PersistentVolume>()
        .on_change(Box::new(move |_, new| {
            s.on_storage_change(new.is_some(), ClusterEvent::PvChange)
        }));
    let s = sched.clone();
    informers
        .get::<StorageClass>()
        .on_change(Box::new(move |_, new| {
            s.on_storage_change(new.is_some(), ClusterEvent::StorageClassChange)
        }));
    let s = sched.clone();
    informers
        .get::<CSINode>()
        .on_change(Box::new(move |_, new| {
            s.on_storage_change(new.is_some(), ClusterEvent::CsiNodeChange)
        }));
    let s = sched.clone();
    informers
        .get::<Namespace>()
        .on_change(Box::new(move |old, new| {
            let ns = new.or(old).expect("a change has an object");
            let name = ns.metadata.name.clone().unwrap_or_default();
            s.cache.lock().expect("cache lock").set_namespace(
                &name,
                new.map(|n| n.metadata.labels.clone().unwrap_or_default()),
            );
        }));
}

impl Scheduler {
    fn on_storage_change(&self, added_or_updated: bool, event: ClusterEvent) {
        if added_or_updated {
            self.queue.with(|q, now| q.on_event(event, now));
        }
    }

    fn on_node(&self, old: Option<&Arc<Node>>, new: Option<&Arc<Node>>) {
        match (old, new) {
            (_, None) => {
                let name = old
                    .and_then(|n| n.metadata.name.clone())
                    .unwrap_or_default();
                self.cache.lock().expect("cache lock").remove_node(&name);
            }
            (None, Some(n)) => {
                self.cache.lock().expect("cache lock").add_node(n.clone());
                self.queue
                    .with(|q, now| q.on_event(ClusterEvent::NodeAdd, now));
            }
            (Some(o), Some(n)) => {
                if !node_changed(o, n) {
                    return;
                }
                self.cache
                    .lock()
                    .expect("cache lock")
                    .update_node(n.clone());
                self.queue
                    .with(|q, now| q.on_event(ClusterEvent::NodeUpdate, now));
            }
        }
    }

    fn on_pod(&self, old: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>) {
        let was_assigned = old.is_some_and(|p| node_name(p).is_some() && !terminal(p));
        match new {
            Some(p) if node_name(p).is_some() && !terminal(p) => {
                let old = old.filter(|_| was_assigned).map(|o| o.as_ref());
                if old.is_none() {
                    self.queue.with(|q, _| q.delete(uid(p)));
                }
                let events = take_assigned_pod(&mut self.cache.lock().expect("cache lock"), old, p);
                if p.metadata.deletion_timestamp.is_some() {
                    // A preemption waiting for this victim is over (graceful deletion started).
                    self.queue.with(|q, _| q.victim_gone(uid(p)));
                }
                if events.iter().any(|e| e.may_requeue()) {
                    self.queue.with(|q, now| {
                        for e in events {
                            q.on_event(e, now);
                        }
                    });
                }
            }
            Some(p) if node_name(p).is_none() && !terminal(p) && self.ours(p) => {
                let p = p.clone();
                self.queue.with(|q, now| q.update(p, now));
            }
            _ => {
                let pod = new.or(old).expect("a change has an object");
                let key = uid(pod).to_string();
                let removed = {
                    let mut cache = self.cache.lock().expect("cache lock");
                    let had = cache.contains_pod(&key);
                    cache.remove_pod(&key);
                    had
                };
                self.queue.with(|q, now| {
                    q.delete(&key);
                    q.victim_gone(&key);
                    if removed {
                        q.on_event(ClusterEvent::AssignedPodDelete, now);
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The informer's view of assigned Pods reaching the cache: every update of a bound Pod is
    //! taken (its status and deletionTimestamp matter to preemption and topology spread), with
    //! the queue events upstream's `PodSchedulingPropertiesChange` gives it.

    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use k8s_openapi::api::core::v1::Node;
    use serde_json::{json, Value};

    use super::*;
    use crate::scheduler::framework::{CycleState, Snapshot, Status};
    use crate::scheduler::framework::{
        FilterPlugin, FilterRunner, NodeInfo, Plugin, PodInfo, PostFilterPlugin, PreFilterPlugin,
        StaticObjects,
    };
    use crate::scheduler::plugins::default_preemption::DefaultPreemption;
    use crate::scheduler::plugins::pod_topology_spread::PodTopologySpread;
    use crate::scheduler::queue::QueueCore;

    fn node(name: &str, cpu: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"node": name}},
                "status": {"allocatable": {"cpu": cpu, "pods": "110"}}
            }))
            .unwrap(),
        )
    }

    /// A Pod bound to `node`, version `rv`, with `extra` merged in.
    fn bound(name: &str, node: &str, rv: u32, extra: Value) -> Arc<Pod> {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "resourceVersion": rv.to_string()},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]}
        });
        json_patch::merge(&mut p, &extra);
        Arc::new(serde_json::from_value(p).unwrap())
    }

    /// What a kubelet writes right after the Pod starts.
    fn running_since(t: &str) -> Value {
        json!({"status": {"phase": "Running", "startTime": t,
                          "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn cached<'a>(snap: &'a Snapshot, node: &str, name: &str) -> &'a Pod {
        &snap
            .get(node)
            .unwrap()
            .pods
            .iter()
            .find(|p| p.pod.metadata.name.as_deref() == Some(name))
            .unwrap()
            .pod
    }

    fn snapshot_of(cache: &mut Cache) -> Snapshot {
        let mut snap = Snapshot::default();
        cache.update_snapshot(&mut snap);
        snap
    }

    #[test]
    fn every_update_of_an_assigned_pod_reaches_the_cache_with_its_events() {
        use ClusterEvent::*;
        let mut cache = Cache::new(None);
        cache.add_node(node("n1", "4"));
        let v1 = bound("p", "n1", 1, json!({"metadata": {"labels": {"app": "a"}}}));
        assert_eq!(take_assigned_pod(&mut cache, None, &v1), [AssignedPodAdd]);
        type Case = (&'static str, Value, Vec<ClusterEvent>);
        let cases: Vec<Case> = vec![
            (
                "status written by the kubelet: startTime, phase, conditions",
                running_since("2024-01-03T00:00:00Z"),
                vec![AssignedPodOtherUpdate],
            ),
            (
                "deletionTimestamp set (a finalizer keeps the Pod)",
                json!({"metadata": {"deletionTimestamp": "2024-01-05T00:00:00Z"}}),
                vec![AssignedPodOtherUpdate],
            ),
            (
                "labels changed",
                json!({"metadata": {"labels": {"app": "b"}}}),
                vec![AssignedPodLabelUpdate],
            ),
            (
                "a request lowered, and the labels",
                json!({"metadata": {"labels": {"app": "c"}},
                       "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}),
                vec![AssignedPodLabelUpdate],
            ),
            (
                "a request lowered (resized)",
                json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}}),
                vec![AssignedPodScaleDown],
            ),
        ];
        let mut old = v1;
        let mut rv = 1;
        for (name, patch, want) in cases {
            rv += 1;
            let mut p = serde_json::to_value(old.as_ref()).unwrap();
            json_patch::merge(&mut p, &patch);
            p["metadata"]["resourceVersion"] = json!(rv.to_string());
            let new: Arc<Pod> = Arc::new(serde_json::from_value(p).unwrap());
            assert_eq!(
                take_assigned_pod(&mut cache, Some(old.as_ref()), &new),
                want,
                "{name}"
            );
            let snap = snapshot_of(&mut cache);
            assert_eq!(
                cached(&snap, "n1", "p"),
                new.as_ref(),
                "{name}: the cache's copy"
            );
            old = new;
        }
        assert_eq!(
            take_assigned_pod(&mut cache, Some(old.as_ref()), &old.clone()),
            Vec::<ClusterEvent>::new(),
            "the same version again (a resync) changes nothing"
        );
    }

    #[test]
    fn status_updates_of_assigned_pods_move_nothing_in_the_queue() {
        use crate::scheduler::plugins::priority_sort::PrioritySort;
        let mut q = QueueCore::new(
            Arc::new(PrioritySort),
            HashMap::new(),
            super::super::queue::Backoff::default(),
        );
        let t0 = Instant::now();
        let waiting = |name: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default", "uid": name},
                    "spec": {"containers": []}
                }))
                .unwrap(),
            )
        };
        for (name, plugin) in [
            ("fit", "NodeResourcesFit"),
            ("spread", "PodTopologySpread"),
            ("ports", "NodePorts"),
        ] {
            q.add(waiting(name), t0);
            let mut info = q.pop().unwrap();
            info.unschedulable_plugins = [plugin].into_iter().collect();
            q.add_unschedulable(info, t0);
        }
        let later = t0 + Duration::from_secs(60);
        let location = |q: &QueueCore, n: &str| q.location(n);
        use super::super::queue::Location::*;
        q.on_event(ClusterEvent::AssignedPodOtherUpdate, later);
        for n in ["fit", "spread", "ports"] {
            assert_eq!(location(&q, n), Some(Unschedulable), "other update: {n}");
        }
        q.on_event(ClusterEvent::AssignedPodLabelUpdate, later);
        assert_eq!(location(&q, "spread"), Some(Active), "labels wake spread");
        assert_eq!(location(&q, "fit"), Some(Unschedulable), "labels: fit");
        q.on_event(ClusterEvent::AssignedPodScaleDown, later);
        assert_eq!(
            location(&q, "fit"),
            Some(Active),
            "a lowered request wakes fit"
        );
        assert_eq!(
            location(&q, "ports"),
            Some(Unschedulable),
            "scale down: ports"
        );
        q.on_event(ClusterEvent::AssignedPodDelete, later);
        assert_eq!(
            location(&q, "ports"),
            Some(Active),
            "a deletion wakes ports"
        );
    }

    /// CPU only, as NodeResourcesFit decides it.
    struct CpuFit;
    impl Plugin for CpuFit {
        fn name(&self) -> &'static str {
            "NodeResourcesFit"
        }
    }
    impl FilterPlugin for CpuFit {
        fn filter(&self, _: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
            if node.requested.milli_cpu + pod_requests(pod, false).milli_cpu
                > node.allocatable.milli_cpu
            {
                Status::unschedulable("Insufficient cpu")
            } else {
                Status::success()
            }
        }
    }
    impl FilterRunner for CpuFit {
        fn run_filters(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
            self.filter(state, pod, node)
        }
        fn remove_pod(&self, _: &mut CycleState, _: &Pod, _: &PodInfo, _: &NodeInfo) -> Status {
            Status::success()
        }
        fn add_pod(&self, _: &mut CycleState, _: &Pod, _: &PodInfo, _: &NodeInfo) -> Status {
            Status::success()
        }
    }

    fn cpu_pod(name: &str, node: &str, cpu: &str, priority: i32) -> Arc<Pod> {
        bound(
            name,
            node,
            1,
            json!({"spec": {"priority": priority,
                   "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}),
        )
    }

    /// Binds `pods` as the watch first shows them (no status), then gives each the status a
    /// kubelet writes: the start time given.
    fn bind_then_start(cache: &mut Cache, pods: &[(Arc<Pod>, &str)]) {
        for (p, _) in pods {
            take_assigned_pod(cache, None, p);
        }
        for (p, t) in pods {
            let mut v = serde_json::to_value(p.as_ref()).unwrap();
            json_patch::merge(&mut v, &running_since(t));
            v["metadata"]["resourceVersion"] = json!("2");
            let started: Arc<Pod> = Arc::new(serde_json::from_value(v).unwrap());
            take_assigned_pod(cache, Some(p.as_ref()), &started);
        }
    }

    fn preempt(snap: &Snapshot, preemptor: &Pod) -> (String, Vec<String>) {
        let args = crate::scheduler::plugin_args::decode(None, "args").unwrap();
        let pl =
            DefaultPreemption::new(args, Arc::new(StaticObjects::default())).with_offset(|_| 0);
        let filtered: HashMap<String, Status> = snap
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name().to_string(),
                    CpuFit.filter(&CycleState::new(), preemptor, n),
                )
            })
            .collect();
        let (r, st) = pl.post_filter(&CycleState::new(), preemptor, snap, &filtered, &CpuFit);
        assert!(st.is_success(), "{st}");
        let r = r.unwrap();
        let victims = r
            .victims
            .iter()
            .map(|v| v.metadata.name.clone().unwrap())
            .collect();
        (r.nominated_node, victims)
    }

    #[test]
    fn preemption_sees_start_times_written_after_binding() {
        // Issue 37, case 1: two victims of one priority per node, started on different days per
        // node; upstream picks the node whose earliest-started victim started latest.
        let mut cache = Cache::new(None);
        for n in ["machine1", "machine2", "machine3"] {
            cache.add_node(node(n, "2"));
        }
        let pods: Vec<(Arc<Pod>, &str)> = vec![
            (cpu_pod("m1-a", "machine1", "1", 10), "2024-01-03T00:00:00Z"),
            (cpu_pod("m1-b", "machine1", "1", 10), "2024-01-03T01:00:00Z"),
            (cpu_pod("m2-a", "machine2", "1", 10), "2024-01-04T00:00:00Z"),
            (cpu_pod("m2-b", "machine2", "1", 10), "2024-01-04T01:00:00Z"),
            (cpu_pod("m3-a", "machine3", "1", 10), "2024-01-02T00:00:00Z"),
            (cpu_pod("m3-b", "machine3", "1", 10), "2024-01-02T01:00:00Z"),
        ];
        bind_then_start(&mut cache, &pods);
        let snap = snapshot_of(&mut cache);
        let preemptor = cpu_pod("p", "", "2", 100);
        let (chosen, mut victims) = preempt(&snap, &preemptor);
        victims.sort();
        assert_eq!(
            (chosen.as_str(), victims),
            ("machine2", vec!["m2-a".into(), "m2-b".into()])
        );

        // Case 2: of two equal-priority small Pods the earlier-started one is the more important
        // and is reprieved first; the later-started one goes with the medium Pod.
        let mut cache = Cache::new(None);
        cache.add_node(node("node1", "10"));
        let pods: Vec<(Arc<Pod>, &str)> = vec![
            (cpu_pod("a", "node1", "1", 10), "2024-01-02T00:00:00Z"),
            (cpu_pod("b", "node1", "1", 10), "2024-01-01T00:00:00Z"),
            (cpu_pod("c", "node1", "4", 50), "2024-01-01T00:00:00Z"),
            (cpu_pod("d", "node1", "1", 100), "2024-01-01T00:00:00Z"),
        ];
        bind_then_start(&mut cache, &pods);
        let snap = snapshot_of(&mut cache);
        let preemptor = cpu_pod("p", "", "8", 100);
        assert_eq!(
            preempt(&snap, &preemptor),
            ("node1".into(), vec!["c".into(), "a".into()])
        );
    }

    #[test]
    fn topology_spread_skips_pods_that_turn_terminating_after_binding() {
        // Issue 37, case 3: node-a's only match is terminating (a finalizer keeps it), node-b
        // has one running match: with maxSkew 1 only node-a fits.
        let mut cache = Cache::new(None);
        cache.add_node(node("node-a", "4"));
        cache.add_node(node("node-b", "4"));
        let foo = json!({"metadata": {"labels": {"foo": "bar"}}});
        let t = bound("t", "node-a", 1, foo.clone());
        take_assigned_pod(&mut cache, None, &t);
        take_assigned_pod(&mut cache, None, &bound("r", "node-b", 1, foo.clone()));
        let mut terminating = foo;
        json_patch::merge(
            &mut terminating,
            &json!({"metadata": {"deletionTimestamp": "2024-01-05T00:00:00Z",
                                 "finalizers": ["example.com/keep"]}}),
        );
        take_assigned_pod(
            &mut cache,
            Some(t.as_ref()),
            &bound("t", "node-a", 2, terminating),
        );
        let snap = snapshot_of(&mut cache);
        let incoming: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-p",
                         "labels": {"foo": "bar"}},
            "spec": {"containers": [{"name": "c"}], "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "node", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"foo": "bar"}}}]}
        }))
        .unwrap();
        let args = crate::scheduler::plugin_args::decode(None, "args").unwrap();
        let pl = PodTopologySpread::new(args, Arc::new(StaticObjects::default()));
        let mut state = CycleState::new();
        let (_, st) = pl.pre_filter(&mut state, &incoming, &snap);
        assert!(st.is_success(), "{st}");
        let fits: Vec<(String, bool)> = snap
            .nodes
            .iter()
            .map(|n| {
                let st = pl.filter(&state, &incoming, n);
                (n.name().to_string(), st.is_success())
            })
            .collect();
        assert_eq!(
            fits,
            [("node-a".to_string(), true), ("node-b".to_string(), false)]
        );
    }
}
