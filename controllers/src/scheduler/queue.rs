//! The scheduling queue, as kube-scheduler's PriorityQueue: the active queue ordered by the
//! profile's QueueSort plugin, the backoff queue (per-Pod exponential backoff from the initial to
//! the maximum backoff, 1 s and 10 s by default), and the unschedulable pool, from which Pods move
//! back when a cluster event happens that could make them schedulable (a node added or changed, an
//! assigned Pod deleted, ...) or after they have waited there for 5 minutes. Pods a PreEnqueue
//! plugin rejects (schedulingGates) wait, gated, until an update of theirs passes PreEnqueue.
//!
//! With the active queue empty, `pop` takes the unschedulable Pod whose backoff ends first
//! (upstream's SchedulerPopFromBackoffQ, on by default since v1.33).
//!
//! Events that happen while a Pod is being scheduled ("in flight") are remembered, so a Pod
//! rejected by a plugin interested in one of them goes to the backoff queue instead of waiting in
//! the unschedulable pool for an event that has already passed.
//!
//! Also the nominator: the Pods nominated to a node by preemption (`status.nominatedNodeName`),
//! which Filter counts as if they were on that node; and the preemptors whose victims are still
//! being patched and deleted (upstream's async preemption, on by default since v1.33: the
//! `preempting` set its DefaultPreemption PreEnqueue checks), held gated until those API calls
//! are over, so no Pod preempts twice for one need.
//!
//! Owns only queue state. [`QueueCore`] is synchronous and takes the time as an argument (tests
//! drive it); [`SchedulingQueue`] wraps it with a lock, the real clock and a wake-up for `pop`.
//! Which Pods enter the queue (ours, not yet bound) is the caller's decision.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::framework::{Code, PodInfo, PreEnqueuePlugin, QueueSortPlugin, QueuedPodInfo};

/// kube-scheduler's podMaxInUnschedulablePodsDuration: a Pod in the unschedulable pool longer
/// than this is moved back to be tried again even without an event.
pub const MAX_IN_UNSCHEDULABLE: Duration = Duration::from_secs(300);

/// A change in the cluster that may make unschedulable Pods schedulable. An update of an assigned
/// Pod is told apart by what changed, as upstream's `PodSchedulingPropertiesChange` does: its
/// labels, a lowered (or removed) resource request, or anything else (its status, its
/// deletionTimestamp, ...). One update may be several events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterEvent {
    NodeAdd,
    NodeUpdate,
    AssignedPodAdd,
    /// An assigned Pod's labels changed (upstream's UpdatePodLabel).
    AssignedPodLabelUpdate,
    /// An assigned Pod's resource requests went down (upstream's UpdatePodScaleDown).
    AssignedPodScaleDown,
    /// Any other update of an assigned Pod (upstream's general Pod/Update, "other").
    AssignedPodOtherUpdate,
    AssignedPodDelete,
    /// A PersistentVolumeClaim added or updated.
    PvcChange,
    /// A PersistentVolume added or updated.
    PvChange,
    /// A StorageClass added or updated.
    StorageClassChange,
    /// A CSINode added or updated.
    CsiNodeChange,
}

impl ClusterEvent {
    /// Whether any plugin this scheduler runs registers for the event. None registers for an
    /// assigned Pod's other updates (as upstream, where only plugins this scheduler does not run
    /// register a general Pod/Update): a kubelet's status writes move no Pod in the queue.
    pub fn may_requeue(self) -> bool {
        self != ClusterEvent::AssignedPodOtherUpdate
    }
}

/// Whether a rejection by `plugin` could be undone by `event` (a simplified form of upstream's
/// per-plugin EventsToRegister; plugins this table does not know are interested in every event
/// that [`ClusterEvent::may_requeue`]).
pub fn plugin_interested(plugin: &str, event: ClusterEvent) -> bool {
    use ClusterEvent::*;
    if !event.may_requeue() {
        return false;
    }
    match plugin {
        "NodeUnschedulable" | "NodeName" | "TaintToleration" | "NodeAffinity" | "ImageLocality" => {
            matches!(event, NodeAdd | NodeUpdate)
        }
        // Upstream: Pod/Delete (and, for NodeResourcesFit, Pod/UpdatePodScaleDown).
        "NodePorts" | "VolumeRestrictions" => {
            matches!(event, NodeAdd | NodeUpdate | AssignedPodDelete)
        }
        "NodeResourcesFit" => {
            matches!(
                event,
                NodeAdd | NodeUpdate | AssignedPodDelete | AssignedPodScaleDown
            )
        }
        // Upstream: Pod/Add|UpdatePodLabel|Delete and Node/Add|Update.
        "InterPodAffinity" | "PodTopologySpread" => matches!(
            event,
            NodeAdd | NodeUpdate | AssignedPodAdd | AssignedPodLabelUpdate | AssignedPodDelete
        ),
        // Upstream: PVC, PV, StorageClass and CSINode Add|Update, Node Add|Update (and
        // CSIDriver / CSIStorageCapacity, which nothing here reads).
        "VolumeBinding" => matches!(
            event,
            NodeAdd | NodeUpdate | PvcChange | PvChange | StorageClassChange | CsiNodeChange
        ),
        // Upstream: PVC and PV Add|Update, StorageClass Add, Node Add|Update.
        "VolumeZone" => matches!(
            event,
            NodeAdd | NodeUpdate | PvcChange | PvChange | StorageClassChange
        ),
        // Upstream: CSINode Add|Update, Pod Delete, PVC Add (and VolumeAttachment Delete).
        "NodeVolumeLimits" => matches!(
            event,
            NodeAdd | NodeUpdate | CsiNodeChange | PvcChange | AssignedPodDelete
        ),
        // Resource claims this scheduler cannot handle stay unschedulable whatever the cluster
        // does (a Pod update or the 5-minute flush retries them).
        "DynamicResources" => false,
        _ => true,
    }
}

/// Where a Pod is in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Active,
    Backoff,
    Unschedulable,
    /// Rejected by PreEnqueue (in the unschedulable pool, as upstream, but not moved by events).
    Gated,
}

#[derive(Debug, Clone)]
struct Entry {
    info: QueuedPodInfo,
    /// When the Pod was last rejected (backoff and the unschedulable timeout count from here).
    last_failure: Option<Instant>,
    /// The PreEnqueue plugin that rejected it, while gated.
    gated_by: Option<&'static str>,
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// A binary heap of entries with removal by UID.
#[derive(Default)]
struct Heap {
    items: Vec<Entry>,
    pos: HashMap<String, usize>,
}

impl Heap {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn contains(&self, uid: &str) -> bool {
        self.pos.contains_key(uid)
    }

    fn peek(&self) -> Option<&Entry> {
        self.items.first()
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.items.swap(a, b);
        self.pos.insert(uid(&self.items[a].info.pod).to_string(), a);
        self.pos.insert(uid(&self.items[b].info.pod).to_string(), b);
    }

    fn up(&mut self, mut i: usize, less: &dyn Fn(&Entry, &Entry) -> bool) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if !less(&self.items[i], &self.items[parent]) {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn down(&mut self, mut i: usize, less: &dyn Fn(&Entry, &Entry) -> bool) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < self.items.len() && less(&self.items[l], &self.items[best]) {
                best = l;
            }
            if r < self.items.len() && less(&self.items[r], &self.items[best]) {
                best = r;
            }
            if best == i {
                break;
            }
            self.swap(i, best);
            i = best;
        }
    }

    /// Adds or replaces (by UID) an entry.
    fn push(&mut self, e: Entry, less: &dyn Fn(&Entry, &Entry) -> bool) {
        let key = uid(&e.info.pod).to_string();
        if let Some(&i) = self.pos.get(&key) {
            self.items[i] = e;
            self.up(i, less);
            let i = self.pos[&key];
            self.down(i, less);
            return;
        }
        self.items.push(e);
        let i = self.items.len() - 1;
        self.pos.insert(key, i);
        self.up(i, less);
    }

    fn remove(&mut self, key: &str, less: &dyn Fn(&Entry, &Entry) -> bool) -> Option<Entry> {
        let i = *self.pos.get(key)?;
        let last = self.items.len() - 1;
        if i != last {
            self.swap(i, last);
        }
        let e = self.items.pop().expect("non-empty");
        self.pos.remove(key);
        if i < self.items.len() {
            let moved = uid(&self.items[i].info.pod).to_string();
            self.up(i, less);
            let j = self.pos[&moved];
            self.down(j, less);
        }
        Some(e)
    }

    fn pop(&mut self, less: &dyn Fn(&Entry, &Entry) -> bool) -> Option<Entry> {
        let key = uid(&self.peek()?.info.pod).to_string();
        self.remove(&key, less)
    }

    fn get(&self, key: &str) -> Option<&Entry> {
        self.pos.get(key).map(|&i| &self.items[i])
    }
}

/// Queue timing, as KubeSchedulerConfiguration's podInitialBackoffSeconds / podMaxBackoffSeconds.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// Upstream's calculateBackoffDuration: initial * 2^(attempts-1), at most max.
    pub fn duration(&self, attempts: u32) -> Duration {
        let mut d = self.initial;
        for _ in 1..attempts {
            d = d.saturating_mul(2);
            if d > self.max {
                return self.max;
            }
        }
        d.min(self.max)
    }
}

/// How many Pods wait where (scheduler_pending_pods{queue}).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    pub active: usize,
    pub backoff: usize,
    pub unschedulable: usize,
    pub gated: usize,
}

/// The queue's state, without locking or clock.
pub struct QueueCore {
    sort: Arc<dyn QueueSortPlugin>,
    /// PreEnqueue plugins by profile (schedulerName).
    pre_enqueue: HashMap<String, Vec<Arc<dyn PreEnqueuePlugin>>>,
    backoff: Backoff,
    active: Heap,
    backoff_q: Heap,
    unschedulable: HashMap<String, Entry>,
    /// Pods popped and not yet `done`, with the event sequence number at pop.
    in_flight: HashMap<String, u64>,
    /// Events since the oldest in-flight Pod was popped.
    events: VecDeque<(u64, ClusterEvent)>,
    /// Pod updates seen while the Pod was in flight.
    updated_in_flight: BTreeSet<String>,
    seq: u64,
    nominated: HashMap<String, (String, PodInfo)>,
    nominated_by_node: HashMap<String, Vec<String>>,
    /// Preemptors whose victims' API calls are under way (upstream's Evaluator.preempting).
    preempting: BTreeSet<String>,
    /// The last victim of each preemptor whose other victims are done, by the victim's UID
    /// (upstream's lastVictimsPendingPreemption): the preemptor stays gated until the watch
    /// shows that victim deleted or terminating.
    last_victims: HashMap<String, String>,
}

/// The gate that holds a preemptor while its preemption's API calls run (upstream's
/// DefaultPreemption PreEnqueue: "waiting for the preemption for this pod to be finished").
pub const PREEMPTION_GATE: &str = "DefaultPreemption";

impl QueueCore {
    pub fn new(
        sort: Arc<dyn QueueSortPlugin>,
        pre_enqueue: HashMap<String, Vec<Arc<dyn PreEnqueuePlugin>>>,
        backoff: Backoff,
    ) -> QueueCore {
        QueueCore {
            sort,
            pre_enqueue,
            backoff,
            active: Heap::default(),
            backoff_q: Heap::default(),
            unschedulable: HashMap::new(),
            in_flight: HashMap::new(),
            events: VecDeque::new(),
            updated_in_flight: BTreeSet::new(),
            seq: 0,
            nominated: HashMap::new(),
            nominated_by_node: HashMap::new(),
            preempting: BTreeSet::new(),
            last_victims: HashMap::new(),
        }
    }

    fn backoff_expiry(&self, e: &Entry) -> Instant {
        let base = e.last_failure.unwrap_or(e.info.timestamp);
        base + self.backoff.duration(e.info.attempts)
    }

    fn with_active<R>(
        &mut self,
        f: impl FnOnce(&mut Heap, &dyn Fn(&Entry, &Entry) -> bool) -> R,
    ) -> R {
        let sort = self.sort.clone();
        let less = move |a: &Entry, b: &Entry| sort.less(&a.info, &b.info);
        f(&mut self.active, &less)
    }

    fn with_backoff<R>(
        &mut self,
        f: impl FnOnce(&mut Heap, &dyn Fn(&Entry, &Entry) -> bool) -> R,
    ) -> R {
        let backoff = self.backoff;
        let expiry = move |e: &Entry| {
            e.last_failure.unwrap_or(e.info.timestamp) + backoff.duration(e.info.attempts)
        };
        let less = move |a: &Entry, b: &Entry| expiry(a) < expiry(b);
        f(&mut self.backoff_q, &less)
    }

    /// Where the Pod with this UID waits, if it does.
    pub fn location(&self, uid: &str) -> Option<Location> {
        if self.active.contains(uid) {
            Some(Location::Active)
        } else if self.backoff_q.contains(uid) {
            Some(Location::Backoff)
        } else {
            self.unschedulable.get(uid).map(|e| {
                if e.gated_by.is_some() {
                    Location::Gated
                } else {
                    Location::Unschedulable
                }
            })
        }
    }

    pub fn pending(&self) -> Pending {
        let gated = self
            .unschedulable
            .values()
            .filter(|e| e.gated_by.is_some())
            .count();
        Pending {
            active: self.active.len(),
            backoff: self.backoff_q.len(),
            unschedulable: self.unschedulable.len() - gated,
            gated,
        }
    }

    fn run_pre_enqueue(&self, pod: &Pod) -> Option<&'static str> {
        if self.preempting.contains(uid(pod)) {
            return Some(PREEMPTION_GATE);
        }
        let profile = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or("default-scheduler");
        for p in self.pre_enqueue.get(profile).into_iter().flatten() {
            let status = p.pre_enqueue(pod);
            if status.code != Code::Success {
                return Some(p.name());
            }
        }
        None
    }

    /// A new Pod to schedule (or one seen again after a relist): to the active queue, or gated.
    pub fn add(&mut self, pod: Arc<Pod>, now: Instant) {
        let key = uid(&pod).to_string();
        self.update_nominated(&pod);
        if self.in_flight.contains_key(&key) || self.location(&key).is_some() {
            self.update(pod, now);
            return;
        }
        let entry = Entry {
            info: QueuedPodInfo {
                pod,
                timestamp: now,
                attempts: 0,
                unschedulable_plugins: BTreeSet::new(),
            },
            last_failure: None,
            gated_by: None,
        };
        self.enqueue_or_gate(entry);
    }

    fn enqueue_or_gate(&mut self, mut entry: Entry) {
        if let Some(gate) = self.run_pre_enqueue(&entry.info.pod) {
            entry.gated_by = Some(gate);
            self.unschedulable
                .insert(uid(&entry.info.pod).to_string(), entry);
            return;
        }
        entry.gated_by = None;
        self.with_active(|h, less| h.push(entry, less));
    }

    /// The Pod changed (still ours, still unbound).
    pub fn update(&mut self, pod: Arc<Pod>, now: Instant) {
        let key = uid(&pod).to_string();
        self.update_nominated(&pod);
        if self.in_flight.contains_key(&key) {
            // Requeued from the informer's latest version when its cycle ends.
            self.updated_in_flight.insert(key);
            return;
        }
        if let Some(mut e) = self.active.get(&key).cloned() {
            e.info.pod = pod;
            self.with_active(|h, less| h.push(e, less));
            return;
        }
        if let Some(mut e) = self.backoff_q.get(&key).cloned() {
            e.info.pod = pod;
            self.with_backoff(|h, less| h.push(e, less));
            return;
        }
        if let Some(mut e) = self.unschedulable.remove(&key) {
            let old = e.info.pod.clone();
            e.info.pod = pod;
            if e.gated_by.is_some() {
                self.enqueue_or_gate(e);
                return;
            }
            if !scheduling_relevant_change(&old, &e.info.pod) {
                self.unschedulable.insert(key, e);
                return;
            }
            self.requeue(e, now);
            return;
        }
        self.add(pod, now);
    }

    /// The Pod is gone, or bound, or no longer ours.
    pub fn delete(&mut self, uid: &str) {
        self.with_active(|h, less| h.remove(uid, less));
        self.with_backoff(|h, less| h.remove(uid, less));
        self.unschedulable.remove(uid);
        self.delete_nominated(uid);
        self.preempting.remove(uid);
        self.last_victims.retain(|_, p| p != uid);
    }

    /// The Pod's preemption starts its API calls: until [`QueueCore::end_preemption`] it cannot
    /// enter the active queue (upstream's prepareCandidateAsync adding it to `preempting`).
    pub fn begin_preemption(&mut self, uid: &str) {
        self.preempting.insert(uid.to_string());
    }

    /// The preemptor's other victims are done and `victim` is being deleted: the preemption
    /// ends when the watch shows that victim deleted or terminating ([`QueueCore::victim_gone`]),
    /// so the preemptor is not retried while the cache still holds it (upstream v1.35's
    /// lastVictimsPendingPreemption; v1.34 lifts the gate before the call, a window in which any
    /// other Pod's deletion let the preemptor through to preempt that victim a second time).
    pub fn await_last_victim(&mut self, preemptor: &str, victim: &str) {
        if self.preempting.contains(preemptor) {
            self.last_victims
                .insert(victim.to_string(), preemptor.to_string());
        }
    }

    /// The watch shows this assigned Pod deleted or terminating: if it was a preemptor's last
    /// victim, that preemption is over (call before the event's [`QueueCore::on_event`], which
    /// then moves the preemptor).
    pub fn victim_gone(&mut self, victim: &str) {
        if let Some(p) = self.last_victims.remove(victim) {
            self.end_preemption(&p);
        }
    }

    /// The preemption is over: a Pod held by the gate waits in the unschedulable pool again, for
    /// an event its rejecting plugins care about.
    pub fn end_preemption(&mut self, uid: &str) {
        self.last_victims.retain(|_, p| p != uid);
        if !self.preempting.remove(uid) {
            return;
        }
        if let Some(e) = self.unschedulable.get_mut(uid) {
            if e.gated_by == Some(PREEMPTION_GATE) {
                e.gated_by = None;
            }
        }
    }

    /// Moves the Pod to the active queue now if it waits in the backoff queue or the
    /// unschedulable pool (upstream's Activate; a gated Pod stays gated).
    pub fn activate(&mut self, uid: &str, _now: Instant) {
        let gated = self.unschedulable.get(uid).map(|e| e.gated_by.is_some());
        let e = match gated {
            Some(false) => self.unschedulable.remove(uid),
            Some(true) => None,
            None => self.with_backoff(|h, less| h.remove(uid, less)),
        };
        if let Some(e) = e {
            self.enqueue_or_gate(e);
        }
    }

    /// Whether the Pod's preemption is still making its API calls.
    pub fn is_preempting(&self, uid: &str) -> bool {
        self.preempting.contains(uid)
    }

    fn requeue(&mut self, mut e: Entry, now: Instant) {
        let key = uid(&e.info.pod).to_string();
        if self.preempting.contains(&key) {
            // Upstream runs PreEnqueue on the way to the backoff queue too: a preemptor moved
            // while its victims go waits gated, not in backoff (from where pop could take it).
            e.gated_by = Some(PREEMPTION_GATE);
            self.unschedulable.insert(key, e);
            return;
        }
        if e.last_failure.is_some() && self.backoff_expiry(&e) > now {
            self.with_backoff(|h, less| h.push(e, less));
        } else {
            self.enqueue_or_gate(e);
        }
    }

    /// The next Pod to schedule, now in flight. With the active queue empty, the Pod whose
    /// backoff ends first is taken from the backoff queue, if it was rejected by a plugin (not an
    /// error) and passes PreEnqueue: upstream's SchedulerPopFromBackoffQ (on by default since
    /// v1.33) keeps an idle scheduler from waiting out backoffs.
    pub fn pop(&mut self) -> Option<QueuedPodInfo> {
        let mut e = match self.with_active(|h, less| h.pop(less)) {
            Some(e) => e,
            None => self.pop_backoff()?,
        };
        e.info.attempts += 1;
        let key = uid(&e.info.pod).to_string();
        self.in_flight.insert(key, self.seq);
        Some(e.info)
    }

    /// The unschedulable (not errored) Pod in the backoff queue whose backoff ends first, among
    /// those PreEnqueue lets through (upstream's popBackoff, which leaves the error backoff
    /// queue alone).
    fn pop_backoff(&mut self) -> Option<Entry> {
        let key = self
            .backoff_q
            .items
            .iter()
            .filter(|e| !e.info.unschedulable_plugins.is_empty())
            .filter(|e| self.run_pre_enqueue(&e.info.pod).is_none())
            .min_by_key(|e| self.backoff_expiry(e))
            .map(|e| uid(&e.info.pod).to_string())?;
        self.with_backoff(|h, less| h.remove(&key, less))
    }

    /// The Pod's scheduling (and binding) is over: stop recording events for it.
    pub fn done(&mut self, uid: &str) {
        self.in_flight.remove(uid);
        self.updated_in_flight.remove(uid);
        let oldest = self.in_flight.values().min().copied();
        match oldest {
            None => self.events.clear(),
            Some(o) => {
                while self.events.front().is_some_and(|(s, _)| *s <= o) {
                    self.events.pop_front();
                }
            }
        }
    }

    /// A Pod whose attempt failed, with the plugins that rejected it (empty for an error) and the
    /// latest version of the Pod: to the unschedulable pool, or to the backoff queue when an event
    /// that could help happened while it was in flight (or when it failed with an error).
    pub fn add_unschedulable(&mut self, mut info: QueuedPodInfo, now: Instant) {
        let key = uid(&info.pod).to_string();
        if self.location(&key).is_some() {
            self.done(&key);
            return;
        }
        let since = self.in_flight.get(&key).copied();
        let updated = self.updated_in_flight.contains(&key);
        let event_helped = since.is_some_and(|s| {
            self.events.iter().any(|(seq, ev)| {
                *seq > s
                    && info
                        .unschedulable_plugins
                        .iter()
                        .any(|p| plugin_interested(p, *ev))
            })
        });
        self.done(&key);
        info.timestamp = now;
        let e = Entry {
            info,
            last_failure: Some(now),
            gated_by: None,
        };
        if e.info.unschedulable_plugins.is_empty() || event_helped || updated {
            self.requeue(e, now);
        } else {
            self.unschedulable.insert(key, e);
        }
    }

    /// A cluster event: unschedulable Pods a rejecting plugin of which cares move to the backoff
    /// or active queue (upstream's MoveAllToActiveOrBackoffQueue with the plugins' hints).
    pub fn on_event(&mut self, event: ClusterEvent, now: Instant) {
        if !event.may_requeue() {
            return;
        }
        self.seq += 1;
        if !self.in_flight.is_empty() {
            self.events.push_back((self.seq, event));
        }
        let moved: Vec<String> = self
            .unschedulable
            .iter()
            .filter(|(_, e)| {
                e.gated_by.is_none()
                    && (e.info.unschedulable_plugins.is_empty()
                        || e.info
                            .unschedulable_plugins
                            .iter()
                            .any(|p| plugin_interested(p, event)))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in moved {
            let e = self.unschedulable.remove(&k).expect("listed");
            self.requeue(e, now);
        }
    }

    /// Moves Pods whose backoff has expired to the active queue (upstream runs this every second).
    pub fn flush_backoff(&mut self, now: Instant) {
        while let Some(e) = self.backoff_q.peek() {
            if self.backoff_expiry(e) > now {
                break;
            }
            let e = self.with_backoff(|h, less| h.pop(less)).expect("peeked");
            self.enqueue_or_gate(e);
        }
    }

    /// Moves Pods that waited in the unschedulable pool longer than [`MAX_IN_UNSCHEDULABLE`]
    /// (upstream runs this every 30 seconds).
    pub fn flush_unschedulable(&mut self, now: Instant) {
        let old: Vec<String> = self
            .unschedulable
            .iter()
            .filter(|(_, e)| {
                e.gated_by.is_none()
                    && e.last_failure
                        .is_some_and(|t| now.duration_since(t) > MAX_IN_UNSCHEDULABLE)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in old {
            let e = self.unschedulable.remove(&k).expect("listed");
            self.requeue(e, now);
        }
    }

    /// When the earliest Pod in the backoff queue is due.
    pub fn next_backoff_expiry(&self) -> Option<Instant> {
        self.backoff_q.peek().map(|e| self.backoff_expiry(e))
    }

    /// A Pod's own `status.nominatedNodeName` (re)nominates it; an update without one keeps the
    /// nomination this scheduler made (its status write may not be observed yet), as upstream's
    /// nominator does. Nominations end when the Pod is deleted, bound or scheduled.
    fn update_nominated(&mut self, pod: &Arc<Pod>) {
        let node = pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty());
        let key = uid(pod);
        if let Some(n) = node {
            self.add_nominated(pod.clone(), n);
        } else if let Some((n, _)) = self.nominated.get(key) {
            let n = n.clone();
            self.add_nominated(pod.clone(), &n);
        }
    }

    /// Records that `pod` is nominated to run on `node` (preemption's result, or its status).
    pub fn add_nominated(&mut self, pod: Arc<Pod>, node: &str) {
        let key = uid(&pod).to_string();
        self.delete_nominated(&key);
        self.nominated_by_node
            .entry(node.to_string())
            .or_default()
            .push(key.clone());
        self.nominated
            .insert(key, (node.to_string(), PodInfo::new(pod)));
    }

    /// The node the Pod with this UID is nominated to, by its status or by this scheduler's
    /// preemption (whose status write may not be observed yet).
    pub fn nominated_node(&self, uid: &str) -> Option<&str> {
        self.nominated.get(uid).map(|(n, _)| n.as_str())
    }

    /// Forgets the nomination of the Pod with this UID.
    pub fn delete_nominated(&mut self, uid: &str) {
        if let Some((node, _)) = self.nominated.remove(uid) {
            if let Some(v) = self.nominated_by_node.get_mut(&node) {
                v.retain(|u| u != uid);
                if v.is_empty() {
                    self.nominated_by_node.remove(&node);
                }
            }
        }
    }

    /// The Pods nominated to `node`.
    pub fn nominated_for(&self, node: &str) -> Vec<PodInfo> {
        self.nominated_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|u| self.nominated.get(u).map(|(_, p)| p.clone()))
            .collect()
    }

    /// Whether any Pod is nominated anywhere (Filter skips the nominated-Pods pass when not).
    pub fn has_nominated(&self) -> bool {
        !self.nominated.is_empty()
    }

    /// The nominations, node -> Pods (a copy for one scheduling cycle).
    pub fn nominations(&self) -> HashMap<String, Vec<PodInfo>> {
        self.nominated_by_node
            .keys()
            .map(|n| (n.clone(), self.nominated_for(n)))
            .collect()
    }
}

/// Whether an update of an unschedulable Pod may change its scheduling (upstream moves a Pod on
/// any update except to its status, resourceVersion, generation, managedFields and
/// finalizers-only changes; compared here on spec, labels and annotations).
fn scheduling_relevant_change(old: &Pod, new: &Pod) -> bool {
    old.spec != new.spec
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
}

/// The queue shared by the informer handlers and the scheduling loop.
pub struct SchedulingQueue {
    core: Mutex<QueueCore>,
    wake: tokio::sync::Notify,
    closed: std::sync::atomic::AtomicBool,
}

impl SchedulingQueue {
    pub fn new(core: QueueCore) -> Arc<SchedulingQueue> {
        Arc::new(SchedulingQueue {
            core: Mutex::new(core),
            wake: tokio::sync::Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Runs `f` on the queue's state under its lock and wakes `pop` afterwards.
    pub fn with<R>(&self, f: impl FnOnce(&mut QueueCore, Instant) -> R) -> R {
        let r = {
            let mut core = self.core.lock().expect("queue lock");
            f(&mut core, Instant::now())
        };
        self.wake.notify_one();
        r
    }

    /// The next Pod to schedule; waits for one. None once closed.
    pub async fn pop(&self) -> Option<QueuedPodInfo> {
        loop {
            let notified = self.wake.notified();
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                return None;
            }
            if let Some(p) = self.core.lock().expect("queue lock").pop() {
                return Some(p);
            }
            notified.await;
        }
    }

    /// Wakes `pop` for good.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.wake.notify_waiters();
        self.wake.notify_one();
    }

    /// Flushes the backoff queue every second and the unschedulable pool every 30 seconds, as
    /// upstream's queue goroutines do; returns when closed.
    pub async fn run_flushes(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n = 0u64;
        while !self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            tick.tick().await;
            n += 1;
            self.with(|q, now| {
                q.flush_backoff(now);
                if n.is_multiple_of(30) {
                    q.flush_unschedulable(now);
                }
            });
        }
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
