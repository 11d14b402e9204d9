//! The scheduler's informer event handlers (upstream's pkg/scheduler/eventhandlers.go): Nodes
//! and bound Pods go into the cache, unbound Pods of this scheduler's profiles into the queue,
//! Namespaces' labels into the cache (for namespace selectors); each change that can make an
//! unschedulable Pod schedulable is a [`ClusterEvent`] for the queue.
//!
//! Owns the filtering of updates (heartbeats and kubelet status writes change nothing for
//! scheduling and are dropped here); no API calls.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

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

/// Whether a bound Pod's update can change a scheduling decision (labels, spec: resources on
/// resize; status updates from the kubelet cannot).
fn assigned_pod_changed(old: &Pod, new: &Pod) -> bool {
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || old.metadata.namespace != new.metadata.namespace
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
                let first = !was_assigned;
                if first {
                    self.queue.with(|q, _| q.delete(uid(p)));
                }
                let changed = first || old.is_none_or(|o| assigned_pod_changed(o, p));
                let in_cache = self.cache.lock().expect("cache lock").contains_pod(uid(p));
                if changed || !in_cache {
                    self.cache.lock().expect("cache lock").add_pod(p.clone());
                    let ev = if first {
                        ClusterEvent::AssignedPodAdd
                    } else {
                        ClusterEvent::AssignedPodUpdate
                    };
                    self.queue.with(|q, now| q.on_event(ev, now));
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
                    if removed {
                        q.on_event(ClusterEvent::AssignedPodDelete, now);
                    }
                });
            }
        }
    }
}
